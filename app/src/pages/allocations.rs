//! GPU allocations: the request form with the team's remaining quota, the list (reloaded
//! while open, so a queued request turns active by itself), and one allocation's page:
//! where it runs, why it waits, who must approve it, and its history.

use crate::api::{
    self, DecideAllocation, ExtendAllocation, ReleaseAllocation, RequestAllocation, UiError,
};
use crate::components::Card;
use crate::components::list_table;
use crate::components::{
    Authenticated, Columns, Empty, Field, FieldInput, Loaded, Loading, PAGE_SIZE, When, echoed,
    error_of, field_error, paged_table, timestamp, use_hydrated,
};
use crate::components::{
    CostEstimate, EstimateInput, Topic, free_text, kind_options, load_estimate, new_key, refresher,
};
use crate::components::{MineFilter, alert, refusal};
use leptos::prelude::*;
use leptos_router::hooks::{use_params_map, use_query_map};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use tessera_domain::account::Me;
use tessera_domain::alloc::{
    AllocState, AllocatedDevice, AllocationView, Approver, PendingInfo, PriorityClass, QuotaView,
};
use tessera_domain::error::AppError;
use tessera_domain::mig::Catalog;
use tessera_domain::tenancy::{Page, PageRequest, TeamRole};
use tessera_domain::workload::WorkloadView;

/// How often a hydrated list page reloads the allocations.
const LIST_EVERY: Duration = Duration::from_secs(5);
/// How often a hydrated detail page reloads an allocation that is still on its way.
const DETAIL_EVERY: Duration = Duration::from_secs(3);

/// The list's state filter: query value, label. `all` asks for every state.
const STATE_FILTERS: [(&str, &str); 5] = [
    ("current", "Current (pending or active)"),
    ("pending", "Pending"),
    ("active", "Active"),
    ("ended", "Ended"),
    ("all", "All"),
];

// ---------------------------------------------------------------------------------------
// The list page
// ---------------------------------------------------------------------------------------

#[component]
pub fn AllocationsPage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the nodes page (see the comment there).
    let data = ListData::new();
    view! {
        <Authenticated>
            <h1>"GPU allocations"</h1>
            <RequestSection data />
            <AllocationList data />
        </Authenticated>
    }
}

/// The list's filter, from the address: `?state=…&mine=1&filtered=1&offset=…`. Until the
/// filter form is used (`filtered` absent) the list shows the caller's own allocations.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Filter {
    state: String,
    mine: bool,
    offset: u32,
}

impl Filter {
    fn is_default(&self) -> bool {
        self.state == "current" && self.mine
    }

    /// The `state` argument of `list_allocations`.
    fn api_state(&self) -> String {
        if self.state == "all" {
            String::new()
        } else {
            self.state.clone()
        }
    }

    /// This filter's address at another offset.
    fn href(&self, offset: u32) -> String {
        let mine = if self.mine { "&mine=1" } else { "" };
        format!(
            "/allocations?state={}{mine}&filtered=1&offset={offset}",
            self.state
        )
    }
}

fn use_filter() -> Memo<Filter> {
    let query = use_query_map();
    Memo::new(move |_| {
        let q = query.read();
        let state = q
            .get("state")
            .filter(|s| STATE_FILTERS.iter().any(|(v, _)| v == s))
            .unwrap_or_else(|| "current".to_owned());
        let mine = q.get("filtered").is_none() || q.get("mine").is_some();
        let offset = q.get("offset").and_then(|v| v.parse().ok()).unwrap_or(0);
        Filter {
            state,
            mine,
            offset,
        }
    })
}

/// One team the caller may request for, with its quotas (only those with a limit).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct TeamQuotas {
    id: String,
    name: String,
    quotas: Vec<QuotaView>,
    /// The team may ask for `high` priority (a platform admin granted it).
    high: bool,
}

/// What the request form offers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct RequestOptions {
    teams: Vec<TeamQuotas>,
    /// The form's idempotency key: a form sent twice (double click, retry after a lost
    /// answer) makes one allocation. A new one comes with every reload of the options.
    key: String,
}

/// Teams where the caller may request (member or team admin; platform admins see all
/// teams, as non-members) that have a quota, with those quotas.
async fn load_options() -> Result<RequestOptions, UiError> {
    let teams = api::list_teams(PageRequest::new(0, PageRequest::MAX_LIMIT)).await?;
    let mut out = Vec::new();
    for team in teams.items {
        if team.archived || team.my_role == Some(TeamRole::Viewer) {
            continue;
        }
        let id = team.id.to_string();
        let quotas: Vec<QuotaView> = api::list_quotas(id.clone())
            .await?
            .into_iter()
            .filter(|q| q.limit > 0)
            .collect();
        if !quotas.is_empty() {
            out.push(TeamQuotas {
                id,
                name: team.name,
                quotas,
                high: team.high_priority.is_some(),
            });
        }
    }
    Ok(RequestOptions {
        teams: out,
        key: new_key(),
    })
}

/// What the list page loads and the action that changes it.
#[derive(Clone, Copy)]
struct ListData {
    request: ServerAction<RequestAllocation>,
    options: Resource<Result<RequestOptions, UiError>>,
    /// Devices free right now per kind (without re-partitioning), for the kind labels.
    free: Resource<Result<BTreeMap<String, u32>, UiError>>,
    filter: Memo<Filter>,
    list: Resource<Result<Page<AllocationView>, UiError>>,
    /// What the request form currently asks for; set by the form once hydrated (the
    /// server never estimates, so both sides start from the same empty answer).
    estimate_for: RwSignal<Option<EstimateInput>>,
    /// The cost of `estimate_for` at today's prices (`""`: unpriced or not asked yet).
    estimate: Resource<Result<String, UiError>>,
}

impl ListData {
    fn new() -> Self {
        let request = ServerAction::<RequestAllocation>::new();
        let filter = use_filter();
        let tick = refresher(&[Topic::Work], LIST_EVERY, |streaming| !streaming);
        let options = Resource::new(move || request.version().get(), |_| load_options());
        let free = Resource::new(move || request.version().get(), |_| api::free_now());
        let list = Resource::new(
            move || (filter.get(), tick.get(), request.version().get()),
            |(f, ..)| {
                api::list_allocations(
                    String::new(),
                    f.api_state(),
                    f.mine,
                    PageRequest::new(f.offset, PAGE_SIZE),
                )
            },
        );
        let estimate_for = RwSignal::new(None::<EstimateInput>);
        let estimate = Resource::new(move || estimate_for.get(), load_estimate);
        ListData {
            request,
            options,
            free,
            filter,
            list,
            estimate_for,
            estimate,
        }
    }
}

#[component]
fn RequestSection(data: ListData) -> impl IntoView {
    let ListData {
        request,
        options,
        free,
        estimate_for,
        estimate,
        ..
    } = data;
    view! {
        <Card id="request" title="Request a GPU" wide=true>
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    let options = options.await;
                    // Without the free counts the form still works; the labels just omit them.
                    let free = free.await.ok();
                    match options {
                        // A refused request stays said when the form it came from is
                        // gone (its sender was made a viewer meanwhile).
                        Ok(o) if o.teams.is_empty() => {
                            view! {
                                {request_refusal(request)}
                                <NoQuota />
                            }
                                .into_any()
                        }
                        Ok(options) => {
                            view! {
                                <RequestForm
                                    options
                                    free
                                    action=request
                                    estimate_for
                                    estimate
                                />
                            }
                                .into_any()
                        }
                        Err(e) => {
                            alert(format!("Your teams could not be loaded: {}", e.error))
                        }
                    }
                })}
            </Transition>
        </Card>
    }
}

/// Why the last request was refused, unless a field of the form says it.
fn request_refusal(action: ServerAction<RequestAllocation>) -> impl Fn() -> Option<AnyView> {
    move || {
        error_of(action.value().get())
            .filter(|e| e.error.field().is_none_or(|f| !REQUEST_FIELDS.contains(&f)))
            .map(|e| {
                let forbidden = "You may not request GPUs for this team (viewers cannot).";
                refusal(e, forbidden, "request-error").into_any()
            })
    }
}

#[component]
fn NoQuota() -> impl IntoView {
    view! {
        <Empty>
            <p data-testid="no-quota">
                "None of your teams has a GPU quota yet, so there is nothing to request. "
                "A platform admin must give your team a quota (on the team's page) first."
            </p>
            <a href="/teams">"Your teams →"</a>
        </Empty>
    }
}

/// Fields of the request form whose errors show next to them; any other error shows at
/// the top.
const REQUEST_FIELDS: [&str; 8] = [
    "team_id",
    "kind",
    "count",
    "duration_hours",
    "duration_minutes",
    "starts_at",
    "priority",
    "purpose",
];

#[component]
fn RequestForm(
    options: RequestOptions,
    /// Devices free now per kind; `None` when they could not be loaded.
    free: Option<BTreeMap<String, u32>>,
    action: ServerAction<RequestAllocation>,
    estimate_for: RwSignal<Option<EstimateInput>>,
    estimate: Resource<Result<String, UiError>>,
) -> impl IntoView {
    let value = move || action.value().get();
    let hydrated = use_hydrated();
    let echo_team = untrack(echoed(value, "team_id"));
    let echo_kind = untrack(echoed(value, "kind"));
    let echo_priority = untrack(echoed(value, "priority"));
    // The kind the cost estimate follows (see below).
    let chosen_kind = RwSignal::new(echo_kind.clone());
    let first = options
        .teams
        .iter()
        .find(|t| t.id == echo_team)
        .or(options.teams.first())
        .map(|t| t.id.clone())
        .unwrap_or_default();
    let team = RwSignal::new(first.clone());
    let catalog = Catalog::builtin();
    // Every model any listed team has a quota on, with its kinds, in a stable order.
    let mut models: Vec<String> = options
        .teams
        .iter()
        .flat_map(|t| t.quotas.iter().map(|q| q.model.clone()))
        .collect();
    models.sort();
    models.dedup();
    let kinds: Vec<(String, Vec<(String, String)>)> = models
        .into_iter()
        .map(|m| {
            let k = kind_options(&catalog, &m)
                .into_iter()
                .map(|(value, label)| {
                    let label = match &free {
                        Some(free) => format!("{label} — {}", free_text(free, &value)),
                        None => label,
                    };
                    (value, label)
                })
                .collect();
            (m, k)
        })
        .collect();
    let teams = StoredValue::new(options.teams);
    let kinds = StoredValue::new(kinds);
    // Without the wasm bundle nothing follows the team select: offer every team's models
    // (the server checks the pair). Once hydrated, only the chosen team's.
    let shown_teams = move || {
        let chosen = team.get();
        let all = !hydrated.get();
        teams.with_value(|ts| {
            ts.iter()
                .filter(|t| all || t.id == chosen)
                .cloned()
                .collect::<Vec<_>>()
        })
    };
    let kind_groups = move || {
        let models: Vec<String> = shown_teams()
            .iter()
            .flat_map(|t| t.quotas.iter().map(|q| q.model.clone()))
            .collect();
        kinds.with_value(|all| {
            all.iter()
                .filter(|(m, _)| models.contains(m))
                .map(|(model, options)| {
                    let options = options
                        .iter()
                        .map(|(v, label)| {
                            view! {
                                <option value=v.clone() selected=*v == echo_kind>
                                    {label.clone()}
                                </option>
                            }
                        })
                        .collect_view();
                    view! { <optgroup label=model.clone()>{options}</optgroup> }
                })
                .collect_view()
        })
    };
    let remaining = move || {
        let shown = shown_teams();
        let several = shown.len() > 1;
        shown
            .into_iter()
            .flat_map(|t| {
                t.quotas
                    .into_iter()
                    .map(move |q| (several.then(|| t.name.clone()), q))
            })
            .map(|(team_name, q)| view! { <RemainingQuota team_name q /> })
            .collect_view()
    };
    let team_options = teams.with_value(|ts| {
        ts.iter()
            .map(|t| {
                view! {
                    <option value=t.id.clone() selected=t.id == first>
                        {t.name.clone()}
                    </option>
                }
            })
            .collect_view()
    });
    let echo_p = echo_priority.clone();
    let priority_options = move || {
        // `high` only where the team was granted it (the server refuses it elsewhere).
        let high = shown_teams().iter().any(|t| t.high);
        PriorityClass::ALL
            .iter()
            .filter(|p| **p != PriorityClass::High || high)
            .map(|p| {
                let v = p.as_str();
                let selected = if echo_p.is_empty() {
                    *p == PriorityClass::Normal
                } else {
                    echo_p == v
                };
                let label = match p {
                    PriorityClass::High => "high (granted to your team)",
                    PriorityClass::Normal => "normal",
                    PriorityClass::Preemptible => "preemptible (spare capacity, stopped first)",
                };
                view! {
                    <option value=v selected=selected>
                        {label}
                    </option>
                }
            })
            .collect_view()
    };
    // What the cost estimate follows (the inputs stay uncontrolled, so the form still
    // posts without JavaScript).
    let count = untrack(echoed(value, "count"));
    let chosen_count = RwSignal::new(if count.is_empty() {
        "1".to_owned()
    } else {
        count
    });
    let chosen_hours = RwSignal::new(untrack(echoed(value, "duration_hours")));
    let chosen_priority = RwSignal::new(if echo_priority.is_empty() {
        PriorityClass::Normal.as_str().to_owned()
    } else {
        echo_priority.clone()
    });
    Effect::new(move |_| {
        // The kind the select shows: the chosen one while offered, else the first offered.
        let models: Vec<String> = shown_teams()
            .iter()
            .flat_map(|t| t.quotas.iter().map(|q| q.model.clone()))
            .collect();
        let offered: Vec<String> = kinds.with_value(|all| {
            all.iter()
                .filter(|(m, _)| models.contains(m))
                .flat_map(|(_, options)| options.iter().map(|(v, _)| v.clone()))
                .collect()
        });
        let chosen = chosen_kind.get();
        let kind = if offered.contains(&chosen) {
            chosen
        } else {
            offered.first().cloned().unwrap_or_default()
        };
        let hours = chosen_hours.get();
        estimate_for.set(Some(EstimateInput {
            kind,
            count: chosen_count.get(),
            // Empty duration: 8 hours, like the request.
            hours: if hours.trim().is_empty() {
                "8".to_owned()
            } else {
                hours
            },
            priority: chosen_priority.get(),
        }));
    });
    let other_error = request_refusal(action);
    view! {
        <div class="request-grid">
            <ActionForm action=action attr:data-testid="request-form" attr:novalidate=true>
                {other_error}
                <input type="hidden" name="idempotency_key" value=options.key />
                <div class="field-row">
                    <div>
                        <Field result=value id="req-team" name="team_id" label="Team" typed=team>
                            {team_options}
                        </Field>
                    </div>
                    <div>
                        <Field result=value id="req-kind" name="kind" label="GPU or MIG slice"
                            input=FieldInput::PLAIN.required() typed=chosen_kind>
                            {kind_groups}
                        </Field>
                    </div>
                </div>
                <div class="field-row">
                    <div>
                        <Field result=value id="req-count" name="count" label="How many"
                            input=FieldInput::number("1") default="1" typed=chosen_count />
                    </div>
                    <div>
                        <Field result=value id="req-hours" name="duration_hours" label="Duration (hours)"
                            input=FieldInput::number("1").placeholder("8") typed=chosen_hours />
                        {field_error(value, "duration_minutes")}
                    </div>
                </div>
                <div class="field-row">
                    <div>
                        <Field result=value id="req-start" name="starts_at"
                            label="Earliest start (UTC, optional)" input=FieldInput::of("datetime-local") />
                    </div>
                    <div>
                        <Field result=value id="req-priority" name="priority" label="Priority"
                            typed=chosen_priority>
                            {priority_options}
                        </Field>
                    </div>
                </div>
                <CostEstimate cost=estimate testid="cost-estimate" terms=" at today's prices" />
                <Field result=value id="req-purpose" name="purpose" label="Purpose"
                    input=FieldInput::lines("2").maxlength("500").placeholder("What it is for (optional)") />
                <p class="hint">
                    "Empty duration: 8 hours. Empty start: as soon as possible. "
                    "Beyond your team's quota or your per-user cap, a request waits for approval."
                </p>
                <button type="submit" class="primary" disabled=move || action.pending().get()>
                    {move || if action.pending().get() { "Requesting…" } else { "Request" }}
                </button>
            </ActionForm>
            <aside class="quota-left" data-testid="remaining-quota" aria-label="Remaining quota">
                <h3>"Remaining quota"</h3>
                <ul>{remaining}</ul>
                <p class="hint">"Units are compute slices: a whole H100 is 7, a 1g slice 1."</p>
            </aside>
        </div>
    }
}

#[component]
fn RemainingQuota(team_name: Option<String>, q: QuotaView) -> impl IntoView {
    let left = q.limit.saturating_sub(q.used);
    let pct = if q.limit == 0 {
        0.0
    } else {
        (f64::from(q.used) / f64::from(q.limit) * 100.0).min(100.0)
    };
    view! {
        <li data-model=q.model.clone()>
            <strong>{q.model.clone()}</strong>
            {team_name.map(|n| view! { <span class="hint">" (" {n} ")"</span> })}
            <span class="quota-numbers">
                {format!("remaining quota: {left} of {} units", q.limit)}
            </span>
            <span class="meter" title=format!("{} of {} units in use", q.used, q.limit)>
                <span style=format!("width: {pct:.1}%")></span>
            </span>
            <span class="hint">
                {format!("guaranteed {} · up to {} per user", q.guaranteed, q.per_user)}
            </span>
        </li>
    }
}

#[component]
fn AllocationList(data: ListData) -> impl IntoView {
    let ListData { filter, list, .. } = data;
    view! {
        <Card id="list" title="Allocations" wide=true>
            <FilterForm filter />
            {paged_table(
                list,
                move |offset| filter.get_untracked().href(offset),
                Columns::new(
                    "allocations",
                    &["Kind", "Count", "Team", "User", "State", "Where", "Created", "Ends", "Waiting"],
                )
                .class("list allocations"),
                move || {
                    if filter.get_untracked().is_default() {
                        "No allocations yet — request a GPU above."
                    } else {
                        "No allocations match this filter."
                    }
                    .into_any()
                },
                allocation_row,
            )}
        </Card>
    }
}

/// State and "mine only" as a GET form: works without JavaScript, navigates in place with it.
#[component]
fn FilterForm(filter: Memo<Filter>) -> impl IntoView {
    let current = filter.get_untracked();
    let options = STATE_FILTERS
        .iter()
        .map(|(v, label)| {
            view! {
                <option value=*v selected=current.state == *v>
                    {*label}
                </option>
            }
        })
        .collect_view();
    view! {
        <MineFilter action="/allocations" id="filter-state" name="state" label="State" mine=current.mine>
            {options}
        </MineFilter>
    }
}

fn state_class(state: AllocState) -> &'static str {
    match state {
        AllocState::Active => "badge ok",
        AllocState::PendingApproval | AllocState::Queued | AllocState::Placing => "badge warn",
        AllocState::Denied | AllocState::Preempted | AllocState::Failed => "badge danger",
        AllocState::Releasing | AllocState::Ended | AllocState::Cancelled | AllocState::Expired => {
            "badge muted"
        }
    }
}

#[component]
pub(super) fn StateBadge(state: AllocState) -> impl IntoView {
    view! {
        <span class=state_class(state) data-testid="allocation-state">
            {state.label()}
        </span>
    }
}

/// "#2 in queue", or why it has no place in the queue.
pub(super) fn position_text(p: &PendingInfo, state: AllocState) -> String {
    match (p.position, state) {
        (Some(n), _) => format!("#{n} in queue"),
        (None, AllocState::PendingApproval) => "awaiting approval".to_owned(),
        (None, AllocState::Placing) => "placed, being set up".to_owned(),
        (None, _) => "not in the queue".to_owned(),
    }
}

fn eta_view(p: &PendingInfo) -> AnyView {
    match p.eta {
        Some(t) => view! {
            <span data-testid="eta">
                "ETA " <When t />
            </span>
        }
        .into_any(),
        None => view! { <span data-testid="eta">"ETA unknown"</span> }.into_any(),
    }
}

/// Hostname and the device's UUID (the MIG UUID in full once the agent reports it).
fn device_line(d: &AllocatedDevice) -> impl IntoView + use<> {
    let id = match (&d.mig_uuid, &d.profile) {
        (Some(mig), _) => view! { <code class="uuid">{mig.clone()}</code> }.into_any(),
        (None, Some(profile)) => view! {
            <span class="hint">{format!("{profile} being set up on ")}</span>
            <code class="uuid">{d.gpu_uuid.clone()}</code>
        }
        .into_any(),
        (None, None) => view! { <code class="uuid">{d.gpu_uuid.clone()}</code> }.into_any(),
    };
    view! {
        <div class="device" data-testid="device">
            <span class="host">{d.hostname.clone()}</span>
            " "
            {id}
        </div>
    }
}

fn allocation_row(a: AllocationView) -> impl IntoView {
    let href = format!("/allocations/{}", a.id);
    let devices = if a.devices.is_empty() {
        "—".into_any()
    } else {
        a.devices.iter().map(device_line).collect_view().into_any()
    };
    let ends = match a.ends_at {
        Some(t) => view! { <When t /> }.into_any(),
        None => "—".into_any(),
    };
    let waiting = a.pending.as_ref().map(|p| {
        view! {
            <div class="pending-info" data-testid="pending-info">
                <strong class="queue-pos">{position_text(p, a.state)}</strong>
                " · "
                {eta_view(p)}
                <div class="hint">{p.reason.clone()}</div>
            </div>
        }
    });
    view! {
        <tr data-testid="allocation-row" data-state=a.state.as_str() data-id=a.id.to_string()>
            <td>
                <a href=href>{a.kind_label.clone()}</a>
            </td>
            <td data-testid="count">{count_label(&a)}</td>
            <td>{a.team_name.clone()}</td>
            <td>{a.username.clone()}</td>
            <td>
                <StateBadge state=a.state />
            </td>
            <td class="where">{devices}</td>
            <td>
                <When t=a.created_at />
            </td>
            <td>{ends}</td>
            <td>{waiting}</td>
        </tr>
    }
}

// ---------------------------------------------------------------------------------------
// One allocation
// ---------------------------------------------------------------------------------------

#[component]
pub fn AllocationPage() -> impl IntoView {
    // Created outside `Authenticated`, like the nodes page (see the comment there).
    let data = DetailData::new();
    view! {
        <Authenticated>
            <a class="back" href="/allocations">
                "← Allocations"
            </a>
            <AllocationDetail data />
        </Authenticated>
    }
}

/// Whether the page keeps reloading an allocation in this state: until it runs or ends.
fn still_moving(state: AllocState) -> bool {
    state.is_pending() || state == AllocState::Releasing
}

/// What the detail page loads, its actions, and the approval reason being typed (kept
/// across reloads; reloads pause while the approval form has focus).
#[derive(Clone, Copy)]
struct DetailData {
    release: ServerAction<ReleaseAllocation>,
    extend: ServerAction<ExtendAllocation>,
    decide: ServerAction<DecideAllocation>,
    allocation: Resource<Result<AllocationView, UiError>>,
    /// Notebooks and jobs on it (newest first).
    workloads: Resource<Result<Page<WorkloadView>, UiError>>,
    reason: RwSignal<String>,
    typing: RwSignal<bool>,
}

impl DetailData {
    fn new() -> Self {
        let params = use_params_map();
        let id = Memo::new(move |_| params.read().get("id").unwrap_or_default());
        let release = ServerAction::<ReleaseAllocation>::new();
        let extend = ServerAction::<ExtendAllocation>::new();
        let decide = ServerAction::<DecideAllocation>::new();
        let reason = RwSignal::new(untrack(echoed(move || decide.value().get(), "reason")));
        let typing = RwSignal::new(false);
        // (still moving, waiting for approval) of what is shown; set below, once loaded.
        let status = RwSignal::new((false, false));
        // Polls while it moves, stream or not: its queue position and ETA move with other
        // teams' requests, which its viewer's stream does not hear of. Someone typing a
        // reason into the approval form keeps it as it is.
        let tick = refresher(&[Topic::Work], DETAIL_EVERY, move |_| {
            let (moving, approval) = status.get_untracked();
            moving && !(approval && typing.get_untracked())
        });
        let allocation = Resource::new(
            move || {
                (
                    id.get(),
                    tick.get(),
                    release.version().get(),
                    decide.version().get(),
                    extend.version().get(),
                )
            },
            |(id, ..)| api::get_allocation(id),
        );
        let workloads = Resource::new(
            move || (id.get(), release.version().get()),
            |(id, _)| {
                api::list_workloads(
                    None,
                    None,
                    Some(id),
                    false,
                    false,
                    PageRequest::new(0, PAGE_SIZE),
                )
            },
        );
        // Read in an effect, where reading a resource is fine.
        Effect::new(move |_| {
            let now = allocation.with(|a| match a {
                Some(Ok(a)) => (
                    still_moving(a.state),
                    a.state == AllocState::PendingApproval,
                ),
                _ => (false, false),
            });
            status.set(now);
        });
        DetailData {
            release,
            extend,
            decide,
            allocation,
            workloads,
            reason,
            typing,
        }
    }
}

#[component]
fn AllocationDetail(data: DetailData) -> impl IntoView {
    let allocation = data.allocation;
    view! {
        <Loaded resource=allocation heading="Allocation" let:a>
            <AllocationOverview a data />
        </Loaded>
    }
}

fn approver_text(approver: Option<Approver>, team: &str) -> String {
    match approver {
        Some(Approver::TeamAdmin) => format!("a team admin of {team} (or a platform admin)"),
        Some(Approver::PlatformAdmin) | None => "a platform admin".to_owned(),
    }
}

#[component]
fn AllocationOverview(a: AllocationView, data: DetailData) -> impl IntoView {
    let id = a.id.to_string();
    let state = a.state;
    let releasable = state == AllocState::Active || state.is_pending();
    let starts = match a.starts_at {
        Some(t) => view! { <When t /> " · " {timestamp(t)} }.into_any(),
        None => "as soon as possible".into_any(),
    };
    let ends = match a.ends_at {
        Some(t) => view! { <When t /> " · " {timestamp(t)} }.into_any(),
        None => "—".into_any(),
    };
    let purpose = if a.purpose.trim().is_empty() {
        "—".to_owned()
    } else {
        a.purpose.clone()
    };
    let preempt = a.preempt_at.map(|t| {
        view! {
            <div class="notice warn preempt" role="alert" data-testid="preempt-warning">
                <strong>"Preemption: "</strong>
                "a higher-priority request needs this capacity. This allocation is released "
                <When t />
                {format!(" (at {}). Save your work now.", timestamp(t))}
            </div>
        }
    });
    let why = a.pending.clone().map(|p| view! { <WhyPending p state /> });
    let approval = (state == AllocState::PendingApproval).then(|| {
        view! {
            <ApprovalBox
                id=id.clone()
                approver=a.approver
                reason=a.approval_reason.clone()
                team=a.team_name.clone()
                data
            />
        }
    });
    let decision = (state != AllocState::PendingApproval)
        .then_some(a.approval_reason.clone())
        .flatten()
        .map(|r| {
            view! {
                <div>
                    <dt>"Approval note"</dt>
                    <dd data-testid="approval-reason">{r}</dd>
                </div>
            }
        });
    let extend = (state == AllocState::Active && a.preempt_at.is_none())
        .then(|| view! { <ExtendForm id=id.clone() action=data.extend /> });
    // The owner starts notebooks and jobs on an active allocation of theirs.
    let owner = use_context::<Me>().is_some_and(|me| me.username == a.username);
    let launch = (state == AllocState::Active && owner).then(|| {
        view! {
            <div class="buttons workload-actions" data-testid="workload-actions">
                <a
                    class="button primary"
                    href=format!("/notebooks?allocation={id}")
                    data-testid="launch-notebook"
                >
                    "Open a notebook here"
                </a>
                <a class="button" href=format!("/jobs?allocation={id}") data-testid="submit-job">
                    "Run a job here"
                </a>
            </div>
        }
    });
    let release = releasable.then(|| {
        view! {
            <ReleaseForm
                id=id.clone()
                active=state == AllocState::Active
                team=a.team_name.clone()
                action=data.release
            />
        }
    });
    view! {
        <section
            class="allocation-detail"
            data-testid="allocation-detail"
            data-state=state.as_str()
            data-id=id.clone()
        >
            <h1>{a.kind_label.clone()} <StateBadge state /></h1>
            <DetailNotices data />
            {preempt}
            {why}
            {approval}
            <dl class="facts row">
                <div>
                    <dt>"Kind"</dt>
                    <dd>
                        <code>{a.kind.clone()}</code>
                    </dd>
                </div>
                <div>
                    <dt>"Count"</dt>
                    <dd data-testid="count">{count_label(&a)}</dd>
                </div>
                <div>
                    <dt>"Units"</dt>
                    <dd data-testid="units">{a.units}</dd>
                </div>
                <div>
                    <dt>"Priority"</dt>
                    <dd>{a.priority.as_str()}</dd>
                </div>
                {(a.over_limit || a.over_budget)
                    .then(|| {
                        let what = match (a.over_limit, a.over_budget) {
                            (true, true) => "the team's limit and hard budget",
                            (true, false) => "the team's limit",
                            _ => "the team's hard budget",
                        };
                        view! {
                            <div>
                                <dt>"Override"</dt>
                                <dd data-testid="override-note">
                                    <span class="badge warn">
                                        {format!("approved beyond {what} by a platform admin")}
                                    </span>
                                </dd>
                            </div>
                        }
                    })}
                <div>
                    <dt>"Team"</dt>
                    <dd>
                        <a href=format!("/teams/{}", a.team_id)>{a.team_name.clone()}</a>
                    </dd>
                </div>
                <div>
                    <dt>"User"</dt>
                    <dd>{a.username.clone()}</dd>
                </div>
                <div>
                    <dt>"Created"</dt>
                    <dd>
                        <When t=a.created_at />
                    </dd>
                </div>
                <div>
                    <dt>"Starts"</dt>
                    <dd>{starts}</dd>
                </div>
                <div>
                    <dt>"Ends"</dt>
                    <dd>{ends}</dd>
                </div>
                {decision}
            </dl>
            <p class="purpose">
                <span class="hint">"Purpose: "</span>
                {purpose}
            </p>
            {launch}
            {extend}
            {release}
            <AllocationWorkloads workloads=data.workloads />
            <h2>"Devices"</h2>
            <DevicesTable devices=a.devices.clone() kind=a.kind.clone() />
            <h2>"History"</h2>
            <HistoryTable a=a.clone() />
        </section>
    }
}

/// The notebooks and jobs that ran or run on the allocation (nothing when none).
#[component]
fn AllocationWorkloads(workloads: Resource<Result<Page<WorkloadView>, UiError>>) -> impl IntoView {
    view! {
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                match workloads.await {
                    Ok(page) if page.items.is_empty() => ().into_any(),
                    Ok(page) => {
                        view! {
                            <h2>"Notebooks and jobs"</h2>
                            {super::workloads::workloads_table(page.items)}
                        }
                            .into_any()
                    }
                    Err(_) => ().into_any(),
                }
            })}
        </Transition>
    }
}

/// What the last release or decision did, or why it was refused.
#[component]
fn DetailNotices(data: DetailData) -> impl IntoView {
    let DetailData {
        release, decide, ..
    } = data;
    let done = move || {
        let text = match (release.value().get(), decide.value().get()) {
            (Some(Ok(a)), _) if a.state == AllocState::Cancelled => "Request cancelled.",
            (Some(Ok(_)), _) => "Released.",
            (_, Some(Ok(a))) if a.state == AllocState::Denied => "Request denied.",
            (_, Some(Ok(_))) => "Request approved: it joins the queue.",
            _ => return None,
        };
        Some(view! {
            <div class="notice" role="status" data-testid="action-done">
                {text}
            </div>
        })
    };
    view! { {done} }
}

#[component]
fn WhyPending(p: PendingInfo, state: AllocState) -> impl IntoView {
    let position = position_text(&p, state);
    let eta = match p.eta {
        Some(t) => view! { <When t /> " · " {timestamp(t)} }.into_any(),
        None => "unknown".into_any(),
    };
    view! {
        <section class="why-pending" data-testid="why-pending" aria-label="Why pending">
            <h2>"Why pending"</h2>
            <p data-testid="pending-reason">{p.reason.clone()}</p>
            <dl class="facts row">
                <div>
                    <dt>"Position"</dt>
                    <dd data-testid="queue-position">{position}</dd>
                </div>
                <div>
                    <dt>"Expected start"</dt>
                    <dd data-testid="eta">{eta}</dd>
                </div>
            </dl>
        </section>
    }
}

/// Who must approve and why; the approve/deny form for everyone who sees the page (the
/// server refuses those who may not, and the answer is said plainly here).
#[component]
fn ApprovalBox(
    id: String,
    approver: Option<Approver>,
    reason: Option<String>,
    team: String,
    data: DetailData,
) -> impl IntoView {
    let action = data.decide;
    let draft = data.reason;
    let typing = data.typing;
    let value = move || action.value().get();
    let who = approver_text(approver, &team);
    let refused = move || {
        error_of(value())
            .filter(|e| e.error == AppError::Forbidden || e.error.field().is_none())
            .map(|e| {
                let needs = approver_text(approver, &team);
                let forbidden =
                    format!("You may not approve or deny this request: it needs {needs}.");
                refusal(e, forbidden, "decide-error")
            })
    };
    view! {
        <section class="approval" data-testid="approval" aria-label="Approval">
            <h2>"Waiting for approval"</h2>
            <p>
                "Needs approval by " <strong data-testid="approver">{who}</strong>
                {reason.map(|r| view! { ": " <span data-testid="approval-reason">{r}</span> })}
            </p>
            <ActionForm
                action=action
                attr:class="decide"
                attr:data-testid="decide-form"
                attr:novalidate=true
            >
                {refused}
                <input type="hidden" name="id" value=id />
                <label for="decide-reason">"Reason (optional)"</label>
                <input
                    id="decide-reason"
                    name="reason"
                    autocomplete="off"
                    maxlength="500"
                    value=move || draft.get()
                    prop:value=move || draft.get()
                    on:input=move |ev| draft.set(event_target_value(&ev))
                    on:focus=move |_| typing.set(true)
                    on:blur=move |_| typing.set(false)
                />
                {field_error(value, "reason")}
                {(approver == Some(Approver::PlatformAdmin))
                    .then(|| {
                        view! {
                            <label class="check">
                                <input
                                    type="checkbox"
                                    name="overrides"
                                    value="true"
                                    data-testid="override"
                                />
                                " Approve beyond the team's limit or hard budget if it needs that (an override, recorded and audited)"
                            </label>
                        }
                    })}
                <div class="buttons">
                    {[("true", "primary", "approve", "Approve"), ("false", "danger", "deny", "Deny")]
                        .map(|(approve, class, testid, label)| view! {
                            <button
                                type="submit"
                                name="approve"
                                value=approve
                                class=class
                                data-testid=testid
                                disabled=move || action.pending().get()
                            >
                                {label}
                            </button>
                        })}
                </div>
            </ActionForm>
        </section>
    }
}

#[component]
fn ReleaseForm(
    id: String,
    active: bool,
    team: String,
    action: ServerAction<ReleaseAllocation>,
) -> impl IntoView {
    let error = move || {
        error_of(action.value().get()).map(|e| {
            let what = if active {
                "release it"
            } else {
                "cancel this request"
            };
            let forbidden =
                format!("Only its owner, a team admin of {team} or a platform admin may {what}.");
            refusal(e, forbidden, "release-error")
        })
    };
    let (label, hint) = if active {
        (
            "Release",
            "Frees the GPU for others now; anything running on it is stopped.",
        )
    } else {
        (
            "Cancel request",
            "Withdraws the request; nothing was started.",
        )
    };
    view! {
        <ActionForm action=action attr:class="release-form">
            {error}
            <input type="hidden" name="id" value=id />
            <div class="buttons">
                <button
                    type="submit"
                    class="danger"
                    data-testid="release"
                    disabled=move || action.pending().get()
                >
                    {label}
                </button>
                <span class="hint">{hint}</span>
            </div>
        </ActionForm>
    }
}

#[component]
fn ExtendForm(id: String, action: ServerAction<ExtendAllocation>) -> impl IntoView {
    let value = action.value();
    view! {
        <ActionForm action=action attr:class="extend-form" attr:data-testid="extend-form">
            <input type="hidden" name="id" value=id />
            <label for="extend-hours">"Extend by (hours)"</label>
            <input id="extend-hours" name="hours" type="number" min="1" value="1" />
            <button type="submit" disabled=move || action.pending().get()>
                "Extend"
            </button>
            {move || {
                error_of(value.get())
                    .map(|e| {
                        let text = e.for_field("minutes").unwrap_or_else(|| e.error.to_string());
                        view! {
                            <div class="form-error" role="alert" data-testid="extend-error">
                                {text}
                            </div>
                        }
                    })
            }}
        </ActionForm>
    }
}

#[component]
fn DevicesTable(devices: Vec<AllocatedDevice>, kind: String) -> impl IntoView {
    // A share holds part of a whole GPU: say which part.
    let share = match kind.parse::<tessera_domain::alloc::GpuKind>() {
        Ok(tessera_domain::alloc::GpuKind::Share { milli, .. }) => {
            Some(format!("{milli} milli-GPU share"))
        }
        _ => None,
    };
    if devices.is_empty() {
        return view! {
            <Empty>
                <p>"Not placed yet: devices show here once the planner has chosen them."</p>
            </Empty>
        }
        .into_any();
    }
    let rows = devices
        .into_iter()
        .map(|d| {
            let slice = match (&d.profile, d.start) {
                (Some(p), Some(s)) => format!("{p}@{s}"),
                (Some(p), None) => p.clone(),
                _ => share.clone().unwrap_or_else(|| "whole GPU".to_owned()),
            };
            let mig = match (d.mig_uuid.clone(), d.profile.is_some()) {
                (Some(u), _) => view! { <code class="uuid">{u}</code> }.into_any(),
                (None, true) => view! { <span class="hint">"not reported yet"</span> }.into_any(),
                (None, false) => "—".into_any(),
            };
            view! {
                <tr data-testid="device">
                    <td>{d.hostname.clone()}</td>
                    <td>
                        <code class="uuid">{d.gpu_uuid.clone()}</code>
                    </td>
                    <td>{slice}</td>
                    <td>{mig}</td>
                </tr>
            }
        })
        .collect_view();
    list_table(
        &Columns::new("devices", &["Node", "GPU UUID", "Slice", "MIG UUID"]),
        rows,
    )
    .into_any()
}

#[component]
fn HistoryTable(a: AllocationView) -> impl IntoView {
    let rows = a
        .history
        .into_iter()
        .map(|t| {
            let step = match t.from {
                Some(from) => format!("{} → {}", from.label(), t.to.label()),
                None => format!("→ {}", t.to.label()),
            };
            view! {
                <tr data-testid="transition" data-to=t.to.as_str()>
                    <td>
                        <time datetime=t.at.to_rfc3339()>{timestamp(t.at)}</time>
                    </td>
                    <td>{step}</td>
                    <td>{t.by.unwrap_or_else(|| "system".to_owned())}</td>
                    <td>{t.note.unwrap_or_default()}</td>
                </tr>
            }
        })
        .collect_view();
    list_table(
        &Columns::new("history", &["At", "Step", "By", "Note"]),
        rows,
    )
}

/// An allocation's count: `2`, or for a multi-node job `2 nodes × 1 GPU` (its `count`
/// is the whole gang's, an equal part on each node).
fn count_label(a: &AllocationView) -> String {
    gang_count(a.count, a.nodes, &a.kind)
}

fn gang_count(count: u32, nodes: Option<u32>, kind: &str) -> String {
    match nodes.filter(|n| *n > 1) {
        None => count.to_string(),
        Some(nodes) => {
            let (one, many) = if kind.ends_with(":whole") {
                ("GPU", "GPUs")
            } else {
                ("slice", "slices")
            };
            format!(
                "{} × {}",
                tessera_domain::text::count(u64::from(nodes), "node", "nodes"),
                tessera_domain::text::count(u64::from(count / nodes), one, many)
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gang_counts_its_nodes_and_what_each_gets() {
        assert_eq!(gang_count(2, Some(2), "H100-80GB:whole"), "2 nodes × 1 GPU");
        assert_eq!(
            gang_count(16, Some(2), "H100-80GB:whole"),
            "2 nodes × 8 GPUs"
        );
        assert_eq!(
            gang_count(6, Some(3), "H100-80GB:1g.10gb"),
            "3 nodes × 2 slices"
        );
        // One node (or none given): the plain count.
        assert_eq!(gang_count(3, None, "H100-80GB:whole"), "3");
        assert_eq!(gang_count(3, Some(1), "H100-80GB:whole"), "3");
    }
}
