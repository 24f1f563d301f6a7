use super::workloads::WorkloadBadge;
use crate::api::{self, UiError};
use crate::components::{Authenticated, Empty, Loading, Problem, is_admin};
use crate::components::{Columns, Panel, alert, list_table};
use crate::components::{Topic, refresher};
use leptos::prelude::*;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tessera_domain::account::SetupChecklist;
use tessera_domain::alloc::{AllocState, AllocationView, Approver, QuotaView};
use tessera_domain::billing::{BudgetView, UsageReport};
use tessera_domain::cluster::ClusterSummary;
use tessera_domain::tenancy::{Page, PageRequest};
use tessera_domain::workload::WorkloadView;

/// How often the dashboard re-reads the cluster summary once hydrated.
const REFRESH: Duration = Duration::from_secs(10);
/// How many of the caller's teams get a quota card.
const QUOTA_TEAMS: u32 = 5;
/// Budget alert level from which the dashboard warns.
const ALERT_FROM: u8 = 80;
/// How many waiting approvals the panel links to.
const APPROVALS_SHOWN: usize = 5;
/// How many of the caller's live notebooks the dashboard lists.
const NOTEBOOKS_SHOWN: u32 = 5;
/// How many finished jobs the dashboard lists.
const RECENT_JOBS: usize = 10;

#[component]
pub fn DashboardPage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the nodes page (see the comment there).
    let mine = my_allocations();
    let quotas = Resource::new(|| (), |_| team_quotas());
    let dismiss = ServerAction::<api::DismissSetup>::new();
    let setup = Resource::new(
        move || dismiss.version().get(),
        |_| api::get_setup_checklist(),
    );
    let jobs = my_jobs();
    let free = Resource::new(|| (), |_| api::free_now());
    let notebooks = Resource::new(
        || (),
        |_| {
            api::list_workloads(
                Some("notebook".to_owned()),
                None,
                None,
                true,
                true,
                PageRequest::new(0, NOTEBOOKS_SHOWN),
            )
        },
    );
    let usage = reloaded(&[Topic::Work], api::own_usage);
    let oversight = reloaded(&[Topic::Work, Topic::Nodes], load_oversight);
    view! {
        <Authenticated>
            <h1>"Dashboard"</h1>
            <SetupPanel setup dismiss />
            <BudgetAlerts quotas />
            <div class="panels">
                <MyWorkPanel mine jobs />
                <OversightPanels oversight />
                <RecentJobsPanel jobs />
                <NotebooksPanel notebooks />
                <FreeNowPanel free />
                <ClusterPanel />
                <MyUsagePanel usage />
                <QuotaPanels quotas />
            </div>
        </Authenticated>
    }
}

/// A platform admin's first-run checklist, until every step is done or they put it away.
/// Anyone else gets nothing (the call is refused for them).
#[component]
fn SetupPanel(
    setup: Resource<Result<SetupChecklist, UiError>>,
    dismiss: ServerAction<api::DismissSetup>,
) -> impl IntoView {
    view! {
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                let Ok(list) = setup.await else { return ().into_any() };
                if !list.shows() {
                    return ().into_any();
                }
                let left = list.steps.iter().filter(|s| !s.done).count();
                let steps = list
                    .steps
                    .into_iter()
                    .map(|s| {
                        let class = if s.done { "done" } else { "todo" };
                        view! {
                            <li class=class data-testid="setup-step" data-key=s.key.clone() data-done=s.done.to_string()>
                                <span class="tick" aria-hidden="true">{if s.done { "✓" } else { "○" }}</span>
                                <a href=s.href>{s.title}</a>
                                <span class="sr-only">{if s.done { " (done)" } else { " (to do)" }}</span>
                                <p class="hint">{s.hint}</p>
                            </li>
                        }
                    })
                    .collect_view();
                view! {
                    <section class="card wide setup" aria-labelledby="setup-title" data-testid="setup-checklist">
                        <h2 id="setup-title">"Set up Tessera"</h2>
                        <p>
                            {format!(
                                "{} left before researchers can request GPUs and see them on the bill.",
                                tessera_domain::text::count(left as u64, "step", "steps"),
                            )}
                        </p>
                        <ol class="checklist">{steps}</ol>
                        <ActionForm action=dismiss>
                            <button type="submit" class="link" data-testid="dismiss-setup">
                                "Hide this checklist"
                            </button>
                        </ActionForm>
                    </section>
                }
                    .into_any()
            })}
        </Transition>
    }
}

/// Nodes, GPUs and MIG instances across the cluster; refreshes itself while open.
#[component]
fn ClusterPanel() -> impl IntoView {
    let summary = reloaded(&[Topic::Work, Topic::Nodes], api::get_cluster_summary);
    view! {
        <Panel title="Cluster" testid="cluster-summary" class="cluster" links=&[]>
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    match summary.await {
                        Ok(s) if s.nodes_total == 0 => view! { <NoNodes /> }.into_any(),
                        Ok(s) => view! { <ClusterFacts s /> }.into_any(),
                        Err(e) => view! { <Problem error=e.error /> }.into_any(),
                    }
                })}
            </Transition>
        </Panel>
    }
}

#[component]
fn NoNodes() -> impl IntoView {
    view! {
        <Empty>
            <p>
                "No nodes yet — an admin can create a join token and start "
                <code>"tessera-agent"</code> " on a GPU host."
            </p>
            {is_admin()
                .then(|| view! { <a href="/admin/join-tokens">"Create a join token →"</a> })}
        </Empty>
    }
}

#[component]
fn ClusterFacts(s: ClusterSummary) -> impl IntoView {
    let models = s
        .gpus_by_model
        .iter()
        .map(|(model, n)| {
            view! {
                <li data-testid="gpu-model">
                    <span class="count">{*n} "×"</span>
                    " "
                    {model.clone()}
                </li>
            }
        })
        .collect_view();
    let offline = s.nodes_total - s.nodes_online;
    view! {
        <dl class="facts">
            <dt>"Nodes online"</dt>
            <dd data-testid="nodes-online">
                <strong>{s.nodes_online}</strong>
                " / "
                {s.nodes_total}
                {(offline > 0)
                    .then(|| view! { <span class="badge warn">{offline} " offline"</span> })}
            </dd>
            <dt>"GPUs"</dt>
            <dd data-testid="gpus-total">
                <strong>{s.gpus_total}</strong>
            </dd>
            <dt>"MIG"</dt>
            <dd>{s.mig_enabled_gpus} " on · " {s.mig_disabled_gpus} " off"</dd>
            <dt>"MIG instances"</dt>
            <dd data-testid="instances">
                <span data-testid="instances-in-use" title="Held by allocations">
                    {s.instances_in_use}
                    " in use"
                </span>
                {(s.instances_held_idle > 0)
                    .then(|| {
                        view! {
                            " "
                            <span
                                class="badge warn"
                                data-testid="instances-idle"
                                title="Held by an allocation, but no process runs on it"
                            >
                                {s.instances_held_idle}
                                " idle"
                            </span>
                        }
                    })} " · " {s.instances_free} " free"
            </dd>
        </dl>
        <ul class="models" aria-label="GPUs by model">
            {models}
        </ul>
        <a href="/nodes">"See nodes →"</a>
    }
}

/// The caller's current allocations (pending or active), reloaded with the cluster.
fn my_allocations() -> Resource<Result<Page<AllocationView>, UiError>> {
    reloaded(&[Topic::Work], || {
        api::list_allocations(
            String::new(),
            "current".to_owned(),
            true,
            PageRequest::new(0, PageRequest::MAX_LIMIT),
        )
    })
}

/// The caller's jobs, newest first: the live ones and the latest that ended.
fn my_jobs() -> Resource<Result<Page<WorkloadView>, UiError>> {
    reloaded(&[Topic::Work], || {
        let jobs = Some("job".to_owned());
        api::list_workloads(jobs, None, None, true, false, PageRequest::new(0, 50))
    })
}

/// What `load` reads, read again when `topics` change (every [`REFRESH`] where the page
/// cannot stream them).
fn reloaded<T, Fut>(
    topics: &'static [Topic],
    load: impl Fn() -> Fut + Send + Sync + 'static,
) -> Resource<Result<T, UiError>>
where
    T: Clone + Send + Sync + Serialize + serde::de::DeserializeOwned + 'static,
    Fut: std::future::Future<Output = Result<T, UiError>> + Send + 'static,
{
    let tick = refresher(topics, REFRESH, |streaming| !streaming);
    Resource::new(move || tick.get(), move |_| load())
}

/// "Where is my work": the caller's allocations that hold or wait for a GPU and their
/// running or queued jobs, with state, node and time left.
#[component]
fn MyWorkPanel(
    mine: Resource<Result<Page<AllocationView>, UiError>>,
    jobs: Resource<Result<Page<WorkloadView>, UiError>>,
) -> impl IntoView {
    view! {
        <Panel
            title="My work"
            testid="my-work"
            class="wide"
            links=&[("/allocations", "Request or see GPUs →")]
        >
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    let (allocations, jobs) = match (mine.await, jobs.await) {
                        (Ok(a), Ok(j)) => (a.items, j.items),
                        (Err(e), _) | (_, Err(e)) => return alert(e.error.to_string()),
                    };
                    let live_jobs: Vec<WorkloadView> = jobs
                        .into_iter()
                        .filter(|j| !j.state.is_terminal())
                        .collect();
                    if allocations.is_empty() && live_jobs.is_empty() {
                        return view! {
                            <Empty>
                                <p data-testid="no-work">"Nothing running or waiting."</p>
                                <a href="/allocations">"Request a GPU →"</a>
                                " or "
                                <a href="/jobs">"submit a job →"</a>
                            </Empty>
                        }
                            .into_any();
                    }
                    let now = crate::components::now();
                    let rows = allocations
                        .into_iter()
                        .map(|a| {
                            let node = a
                                .devices
                                .first()
                                .map(|d| d.hostname.clone())
                                .unwrap_or_else(|| "—".to_owned());
                            let left = match (a.state, a.ends_at) {
                                (AllocState::Active, Some(end)) => time_left(end - now),
                                _ => a
                                    .pending
                                    .as_ref()
                                    .and_then(|p| p.position)
                                    .map(|p| format!("#{p} in the queue"))
                                    .unwrap_or_default(),
                            };
                            work_row(WorkRow {
                                what: "allocation",
                                state: a.state.as_str(),
                                href: format!("/allocations/{}", a.id),
                                name: a.kind_label.clone(),
                                kind: "GPU",
                                state_view: a.state.label().into_any(),
                                node,
                                left,
                            })
                        })
                        .collect_view();
                    let job_rows = live_jobs
                        .into_iter()
                        .map(|j| {
                            work_row(WorkRow {
                                what: "job",
                                state: j.state.as_str(),
                                href: format!("/workloads/{}", j.id),
                                name: j.name.clone(),
                                kind: "job",
                                state_view: view! { <WorkloadBadge state=j.state /> }.into_any(),
                                node: j.hostname.clone().unwrap_or_else(|| "—".to_owned()),
                                left: j.waiting.clone().unwrap_or_default(),
                            })
                        })
                        .collect_view();
                    let columns = Columns::unnamed(WORK_COLUMNS)
                        .class("list compact")
                        .label("My running and waiting work")
                        .scoped(&[]);
                    list_table(&columns, view! { {rows} {job_rows} }).into_any()
                })}
            </Transition>
        </Panel>
    }
}

const WORK_COLUMNS: &[&str] = &["What", "Kind", "State", "Node", "Time left / queue"];

/// One line of "My work": an allocation or a job.
struct WorkRow {
    /// `allocation` or `job`.
    what: &'static str,
    state: &'static str,
    href: String,
    name: String,
    kind: &'static str,
    state_view: AnyView,
    node: String,
    /// Time left, or the place in the queue.
    left: String,
}

fn work_row(r: WorkRow) -> impl IntoView {
    view! {
        <tr data-testid="my-work-row" data-what=r.what data-state=r.state>
            <td>
                <a href=r.href>{r.name}</a>
            </td>
            <td>{r.kind}</td>
            <td>{r.state_view}</td>
            <td>{r.node}</td>
            <td>{r.left}</td>
        </tr>
    }
}

/// A notebook or job as a list item: its name (a link to it), its state, then `extra`.
fn workload_item<E: IntoView + 'static>(
    testid: &'static str,
    w: &WorkloadView,
    extra: E,
) -> impl IntoView + use<E> {
    view! {
        <li data-testid=testid data-state=w.state.as_str()>
            <a href=format!("/workloads/{}", w.id)>{w.name.clone()}</a>
            " "
            <WorkloadBadge state=w.state />
            {extra}
        </li>
    }
}

/// `2 h 5 min left`, `12 min left`, `ending`.
fn time_left(d: chrono::Duration) -> String {
    let m = d.num_minutes();
    match m {
        ..=0 => "ending".to_owned(),
        1..=59 => format!("{m} min left"),
        _ => format!("{} h {} min left", m / 60, m % 60),
    }
}

/// The caller's last finished jobs with how they ended.
#[component]
fn RecentJobsPanel(jobs: Resource<Result<Page<WorkloadView>, UiError>>) -> impl IntoView {
    view! {
        <Panel title="Recent jobs" testid="recent-jobs" links=&[("/jobs", "Submit or see jobs →")]>
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    let ended: Vec<WorkloadView> = match jobs.await {
                        Ok(page) => {
                            page.items
                                .into_iter()
                                .filter(|j| j.state.is_terminal())
                                .take(RECENT_JOBS)
                                .collect()
                        }
                        Err(e) => return alert(e.error.to_string()),
                    };
                    if ended.is_empty() {
                        return view! { <p class="hint">"No finished job yet."</p> }.into_any();
                    }
                    let items = ended
                        .into_iter()
                        .map(|j| {
                            let exit = j
                                .exit_code
                                .map(|c| format!(" (exit {c})"))
                                .unwrap_or_default();
                            workload_item("recent-job", &j, exit)
                        })
                        .collect_view();
                    view! { <ul class="models">{items}</ul> }.into_any()
                })}
            </Transition>
        </Panel>
    }
}

/// What the caller could start this minute: devices free now per kind.
#[component]
fn FreeNowPanel(
    free: Resource<Result<std::collections::BTreeMap<String, u32>, UiError>>,
) -> impl IntoView {
    view! {
        <Panel title="Free now" testid="free-now" links=&[("/allocations", "Request one →")]>
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    match free.await {
                        Ok(map) => {
                            let items: Vec<_> = map
                                .into_iter()
                                .filter(|(_, n)| *n > 0)
                                .map(|(kind, n)| {
                                    let label = kind
                                        .parse::<tessera_domain::alloc::GpuKind>()
                                        .map(|k| k.label())
                                        .unwrap_or_else(|_| kind.clone());
                                    view! {
                                        <li data-testid="free-kind" data-kind=kind>
                                            <span class="count">{n} "×"</span>
                                            " "
                                            {label}
                                        </li>
                                    }
                                })
                                .collect();
                            if items.is_empty() {
                                view! {
                                    <p class="hint">
                                        "Nothing free right now; requests queue, and idle GPUs may be re-partitioned."
                                    </p>
                                }
                                    .into_any()
                            } else {
                                view! { <ul class="models">{items}</ul> }.into_any()
                            }
                        }
                        Err(e) => alert(e.error.to_string()),
                    }
                })}
            </Transition>
        </Panel>
    }
}

/// The caller's notebooks that have not ended, with open links for the running ones.
#[component]
fn NotebooksPanel(notebooks: Resource<Result<Page<WorkloadView>, UiError>>) -> impl IntoView {
    view! {
        <Panel
            title="My notebooks"
            testid="my-notebooks"
            links=&[("/notebooks", "Launch or see notebooks →")]
        >
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    match notebooks.await {
                        Ok(page) if page.items.is_empty() => {
                            view! { <p class="hint">"No notebook running."</p> }.into_any()
                        }
                        Ok(page) => {
                            let more = (page.total > u64::from(NOTEBOOKS_SHOWN))
                                .then(|| {
                                    view! {
                                        <li class="hint">
                                            {format!("and {} more", page.total - u64::from(NOTEBOOKS_SHOWN))}
                                        </li>
                                    }
                                });
                            let items = page
                                .items
                                .into_iter()
                                .map(|w| {
                                    let open = w
                                        .url
                                        .clone()
                                        .map(|url| {
                                            view! {
                                                " "
                                                <a href=url target="_blank" rel="noopener" data-testid="open-notebook">
                                                    "Open"
                                                </a>
                                            }
                                        });
                                    workload_item("my-notebook", &w, open)
                                })
                                .collect_view();
                            view! { <ul class="models">{items} {more}</ul> }.into_any()
                        }
                        Err(e) => {
                            alert(e.error.to_string())
                        }
                    }
                })}
            </Transition>
        </Panel>
    }
}

/// The caller's own GPU-hours and spend this month (every team of theirs; only their own
/// allocations), with where to read more.
#[component]
fn MyUsagePanel(usage: Resource<Result<UsageReport, UiError>>) -> impl IntoView {
    view! {
        <Panel title="My usage this month" testid="usage-panel" links=&[("/usage", "See usage →")]>
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    let r = match usage.await {
                        Ok(r) => r,
                        Err(e) => return alert(e.error.to_string()),
                    };
                    let hours = tessera_domain::billing::gpu_hours(r.total.gpu_ms);
                    let spent = tessera_domain::billing::format_minor(r.total.cost_minor, &r.currency);
                    // Per team only when there are several to tell apart.
                    let teams = (r.teams.len() > 1)
                        .then(|| {
                            let items = r
                                .teams
                                .iter()
                                .map(|t| {
                                    view! {
                                        <li data-testid="my-usage-team" data-team=t.key.clone()>
                                            {format!(
                                                "{}: {} GPU-hours, {} {}",
                                                t.label,
                                                tessera_domain::billing::gpu_hours(t.totals.gpu_ms),
                                                tessera_domain::billing::format_minor(t.totals.cost_minor, &r.currency),
                                                r.currency,
                                            )}
                                        </li>
                                    }
                                })
                                .collect_view();
                            view! { <ul class="models">{items}</ul> }
                        });
                    view! {
                        <dl class="facts" data-testid="my-usage">
                            <dt>"GPU-hours"</dt>
                            <dd data-testid="my-gpu-hours">
                                <strong>{hours}</strong>
                            </dd>
                            <dt>"Spent"</dt>
                            <dd data-testid="my-spend">
                                <strong>{spent}</strong>
                                " "
                                {r.currency.clone()}
                            </dd>
                        </dl>
                        {teams}
                    }
                        .into_any()
                })}
            </Transition>
            <p class="hint">"Your own allocations only; your teams' budgets are below."</p>
        </Panel>
    }
}

/// What the caller oversees: requests waiting for their approval (team admins: their
/// teams' within the limit; platform admins: all), and for platform admins the nodes'
/// health and the queue. `None` where they oversee nothing of the kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Oversight {
    approvals: Option<Vec<AllocationView>>,
    nodes: Option<NodeHealth>,
    /// Allocations waiting (for approval, in the queue or being placed).
    queue: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct NodeHealth {
    up: u64,
    lost: u64,
    revoked: u64,
}

async fn load_oversight() -> Result<Oversight, UiError> {
    let admin = api::current_user().await?.is_some_and(|me| me.is_admin);
    let teams = api::list_teams(PageRequest::new(0, PageRequest::MAX_LIMIT)).await?;
    let managed: Vec<_> = teams
        .items
        .iter()
        .filter(|t| t.my_role.is_some_and(|r| r.manages_members()))
        .map(|t| t.id)
        .collect();
    let approvals = if admin || !managed.is_empty() {
        let waiting = api::list_allocations(
            String::new(),
            AllocState::PendingApproval.as_str().to_owned(),
            false,
            PageRequest::new(0, PageRequest::MAX_LIMIT),
        )
        .await?;
        Some(
            waiting
                .items
                .into_iter()
                .filter(|a| {
                    admin
                        || (a.approver == Some(Approver::TeamAdmin) && managed.contains(&a.team_id))
                })
                .collect(),
        )
    } else {
        None
    };
    let (nodes, queue) = if admin {
        let all = api::list_nodes(PageRequest::new(0, PageRequest::MAX_LIMIT)).await?;
        let mut health = NodeHealth::default();
        for n in &all.items {
            if n.revoked {
                health.revoked += 1;
            } else if n.online {
                health.up += 1;
            } else {
                health.lost += 1;
            }
        }
        let waiting = api::list_allocations(
            String::new(),
            "pending".to_owned(),
            false,
            PageRequest::new(0, 1),
        )
        .await?;
        (Some(health), Some(waiting.total))
    } else {
        (None, None)
    };
    Ok(Oversight {
        approvals,
        nodes,
        queue,
    })
}

/// "Pending approvals" for team and platform admins; "Nodes and queue" for platform admins.
#[component]
fn OversightPanels(oversight: Resource<Result<Oversight, UiError>>) -> impl IntoView {
    view! {
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                let o = match oversight.await {
                    Ok(o) => o,
                    Err(e) => return alert(e.error.to_string()),
                };
                let approvals = o.approvals.map(|list| view! { <ApprovalsPanel list /> });
                let health = o
                    .nodes
                    .map(|nodes| view! { <HealthPanel nodes queue=o.queue.unwrap_or(0) /> });
                view! {
                    {approvals}
                    {health}
                }
                    .into_any()
            })}
        </Transition>
    }
}

#[component]
fn ApprovalsPanel(list: Vec<AllocationView>) -> impl IntoView {
    let total = list.len();
    let body = if list.is_empty() {
        view! { <p class="hint">"Nothing waits for your approval."</p> }.into_any()
    } else {
        let items = list
            .into_iter()
            .take(APPROVALS_SHOWN)
            .map(|a| {
                view! {
                    <li data-testid="pending-approval" data-team=a.team_id.to_string()>
                        <a href=format!("/allocations/{}", a.id)>
                            {format!("{} · {}", a.username, a.kind_label)}
                        </a>
                        <span class="hint">{format!(" ({})", a.team_name)}</span>
                    </li>
                }
            })
            .collect_view();
        let more = (total > APPROVALS_SHOWN).then(|| {
            view! { <li class="hint">{format!("and {} more", total - APPROVALS_SHOWN)}</li> }
        });
        view! { <ul class="models">{items} {more}</ul> }.into_any()
    };
    view! {
        <Panel
            title="Pending approvals"
            testid="pending-approvals"
            links=&[("/allocations?state=pending&filtered=1", "See waiting requests →")]
        >
            <p data-testid="pending-approvals-count">
                <strong>{total}</strong>
                {format!(" {} for you to approve or deny", tessera_domain::text::noun(total as u64, "request waits", "requests wait"))}
            </p>
            {body}
        </Panel>
    }
}

#[component]
fn HealthPanel(nodes: NodeHealth, queue: u64) -> impl IntoView {
    view! {
        <Panel
            title="Nodes and queue"
            testid="node-health"
            links=&[("/nodes", "See nodes →"), ("/admin/queue", "See the queue →")]
        >
            <dl class="facts">
                <dt>"Nodes up"</dt>
                <dd data-testid="nodes-up">
                    <strong>{nodes.up}</strong>
                </dd>
                <dt>"Lost"</dt>
                <dd data-testid="nodes-lost">
                    {nodes.lost}
                    {(nodes.lost > 0)
                        .then(|| view! { " " <span class="badge warn">"no heartbeat"</span> })}
                </dd>
                <dt>"Revoked"</dt>
                <dd data-testid="nodes-revoked">{nodes.revoked}</dd>
                <dt>"Queue"</dt>
                <dd data-testid="queue-length">
                    {tessera_domain::text::count(queue, "request waits", "requests wait")}
                </dd>
            </dl>
        </Panel>
    }
}

/// A warning per team that has used 80 % or more of its monthly budget.
#[component]
fn BudgetAlerts(quotas: Resource<Result<Vec<TeamQuotas>, UiError>>) -> impl IntoView {
    view! {
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                let teams = quotas.await.unwrap_or_default();
                teams
                    .into_iter()
                    .filter_map(|t| t.budget)
                    .filter(|b| b.alert.is_some_and(|a| a >= ALERT_FROM))
                    .map(|b| {
                        let over = b.used_pct >= 100;
                        view! {
                            <div
                                class=if over { "notice warning over" } else { "notice warning" }
                                role="status"
                                data-testid="budget-alert"
                                data-team=b.team_id.to_string()
                            >
                                {format!(
                                    "Team {} has used {} % of its monthly budget",
                                    b.team_name,
                                    b.used_pct,
                                )}
                                {if over && b.hard {
                                    " — new requests need a platform admin's approval. "
                                } else {
                                    ". "
                                }}
                                <a href=format!("/usage?team={}", b.team_id)>"See usage →"</a>
                            </div>
                        }
                    })
                    .collect_view()
            })}
        </Transition>
    }
}

/// One team's GPU quotas, for its dashboard card.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct TeamQuotas {
    id: String,
    name: String,
    quotas: Vec<QuotaView>,
    /// `None` when it could not be read; it only feeds the budget alerts.
    budget: Option<BudgetView>,
}

/// The quotas and budgets of the caller's first few (unarchived) teams, one team after
/// the other.
async fn team_quotas() -> Result<Vec<TeamQuotas>, UiError> {
    let teams = api::list_teams(PageRequest::new(0, QUOTA_TEAMS)).await?;
    let mut out = Vec::new();
    for team in teams.items.into_iter().filter(|t| !t.archived) {
        let id = team.id.to_string();
        let quotas = api::list_quotas(id.clone()).await?;
        let budget = api::team_budget(id.clone()).await.ok();
        out.push(TeamQuotas {
            id,
            name: team.name,
            quotas,
            budget,
        });
    }
    Ok(out)
}

/// A "Team GPU quotas" card per team: units in use against the limit, and borrowed units.
#[component]
fn QuotaPanels(quotas: Resource<Result<Vec<TeamQuotas>, UiError>>) -> impl IntoView {
    view! {
        <Transition fallback=Loading>
            {move || Suspend::new(async move {
                match quotas.await {
                    Ok(teams) if teams.is_empty() => {
                        view! {
                            <Panel title="Team GPU quotas" testid="team-quotas" links=&[]>
                                <Empty>
                                    <p>"You are not in a team yet."</p>
                                </Empty>
                            </Panel>
                        }
                            .into_any()
                    }
                    Ok(teams) => teams.into_iter().map(|t| view! { <QuotaCard t /> }).collect_view().into_any(),
                    Err(e) => {
                        view! {
                            <Panel title="Team GPU quotas" testid="team-quotas-error" links=&[]>
                                {alert(e.error.to_string())}
                            </Panel>
                        }
                            .into_any()
                    }
                }
            })}
        </Transition>
    }
}

/// A quota as a list item: units in use against the limit, borrowed or beyond it.
fn quota_item(q: QuotaView) -> impl IntoView {
    view! {
        <li data-testid="team-quota" data-model=q.model.clone()>
            <strong>{q.model.clone()}</strong>
            " "
            <span class="quota-numbers">
                {format!("{} / {} units", q.used, q.limit)}
            </span>
            {(q.borrowed > 0)
                .then(|| {
                    view! {
                        " "
                        <span class="badge warn">{format!("{} borrowed", q.borrowed)}</span>
                    }
                })}
            {(q.overridden > 0)
                .then(|| {
                    view! {
                        " "
                        <span class="badge warn">
                            {format!("{} beyond the limit by override", q.overridden)}
                        </span>
                    }
                })}
        </li>
    }
}

#[component]
fn QuotaCard(t: TeamQuotas) -> impl IntoView {
    let body = if t.quotas.is_empty() {
        view! {
            <Empty>
                <p>"No GPU quota yet: a platform admin sets one on the team's page."</p>
            </Empty>
        }
        .into_any()
    } else {
        let rows = t.quotas.into_iter().map(quota_item).collect_view();
        view! { <ul class="models team-quotas">{rows}</ul> }.into_any()
    };
    view! {
        <section
            class="panel"
            aria-label=format!("Team GPU quotas: {}", t.name)
            data-testid="team-quotas"
            data-team=t.id.clone()
        >
            <h2>"Team GPU quotas"</h2>
            <p class="hint">{t.name.clone()}</p>
            {body}
            {t.budget.map(|b| view! { <SpendLine b /> })}
            <a href=format!("/teams/{}", t.id)>"See the team →"</a>
        </section>
    }
}

/// The team's spend this month, against its budget when it has one.
#[component]
fn SpendLine(b: BudgetView) -> impl IntoView {
    let spent = tessera_domain::billing::format_minor(b.spent_minor, &b.currency);
    match b.monthly_minor {
        None => view! {
            <p data-testid="team-spend">
                {format!("Spent this month: {spent} {} (no budget)", b.currency)}
            </p>
        }
        .into_any(),
        Some(m) => {
            let budget = tessera_domain::billing::format_minor(m, &b.currency);
            let pct = b.used_pct.min(100);
            view! {
                <p data-testid="team-spend">
                    {format!(
                        "Spent this month: {spent} of {budget} {}{}",
                        b.currency,
                        if b.hard { " (hard budget)" } else { "" },
                    )}
                </p>
                <span
                    class="meter"
                    role="meter"
                    aria-label="Budget used"
                    aria-valuemin="0"
                    aria-valuemax="100"
                    aria-valuenow=pct.to_string()
                    title=format!("{} % of the budget used", b.used_pct)
                >
                    <span style=format!("width: {pct}%")></span>
                </span>
            }
            .into_any()
        }
    }
}
