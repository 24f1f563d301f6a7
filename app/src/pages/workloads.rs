//! Workloads on an allocation: notebooks (JupyterLab behind the server's proxy, opened in
//! a new tab at the workload's `url`) and training jobs.
//!
//! `/notebooks` and `/jobs` list the caller's workloads with a form to launch one on a
//! free active allocation (`?allocation=<id>` preselects it); `/workloads/:id` is one
//! workload of either kind: progress, open link, stop, idle reclaim and the live log.
//!
//! The detail page renders its content once per workload and then updates it in place
//! from a poll (state every 2 s while not ended, log every second while incomplete), so
//! a long log keeps its scroll position and nothing flickers.

use crate::api::{self, LaunchNotebook, StopWorkload, SubmitJob, UiError};
use crate::components::images::{EnvironmentSelect, short_pinned};
use crate::components::{
    Authenticated, Columns, Empty, Loading, PAGE_SIZE, Problem, When, echoed, error_of,
    field_error, list_table, now, pager_with, relative, timestamp,
};
use crate::components::{EstimateInput, Topic, load_estimate, refresher};
use crate::components::{alert, confirm_or_cancel};
use leptos::prelude::*;
use leptos::task::spawn_local;
use leptos_router::components::Form;
use leptos_router::hooks::{use_params_map, use_query_map};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use tessera_domain::alloc::{AllocState, AllocationView};
use tessera_domain::error::AppError;
use tessera_domain::mig::Catalog;
use tessera_domain::tenancy::TeamRole;
use tessera_domain::tenancy::{Page, PageRequest, TeamView};
use tessera_domain::workload::{IdleDecision, LogSlice, WorkloadKind, WorkloadState, WorkloadView};

/// How often a hydrated list reloads while one of its workloads has not ended.
const LIST_EVERY: Duration = Duration::from_secs(4);
/// The detail page's poll: the log every tick, the workload every second tick.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// Most log text the detail page keeps on screen; older output is dropped from view
/// (the download has it all).
const LOG_SHOWN_MAX: usize = 1024 * 1024;

// ---------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------

fn state_class(state: WorkloadState) -> &'static str {
    match state {
        WorkloadState::Running | WorkloadState::Succeeded => "badge ok",
        WorkloadState::Queued
        | WorkloadState::Pending
        | WorkloadState::Starting
        | WorkloadState::Stopping => "badge warn",
        WorkloadState::Failed | WorkloadState::Lost => "badge danger",
        WorkloadState::Stopped | WorkloadState::Cancelled => "badge muted",
    }
}

#[component]
pub(super) fn WorkloadBadge(state: WorkloadState) -> impl IntoView {
    view! {
        <span class=state_class(state) data-testid="workload-state" data-state=state.as_str()>
            {state.label()}
        </span>
    }
}

fn kind_label(kind: WorkloadKind) -> &'static str {
    match kind {
        WorkloadKind::Notebook => "Notebook",
        WorkloadKind::Job => "Job",
    }
}

/// The node and device (MIG or GPU UUID) a workload runs on.
fn where_view(w: &WorkloadView) -> impl IntoView + use<> {
    let host = w.hostname.clone().unwrap_or_default();
    let device = w
        .device
        .clone()
        .map(|d| view! { <code class="uuid">{d}</code> });
    view! {
        <div class="device">
            <span class="host">{host}</span>
            " "
            {device}
        </div>
    }
}

/// Stops a notebook or cancels a job, after a confirmation.
#[component]
fn StopButton(
    id: String,
    kind: WorkloadKind,
    name: String,
    action: ServerAction<StopWorkload>,
) -> impl IntoView {
    let (label, question) = match kind {
        WorkloadKind::Notebook => (
            "Stop",
            format!(
                "Stop the notebook `{name}`? JupyterLab shuts down and unsaved changes in \
                 open notebooks are lost. Files in the team workspace stay."
            ),
        ),
        WorkloadKind::Job => (
            "Cancel",
            format!("Cancel the job `{name}`? Its processes are stopped."),
        ),
    };
    view! {
        <ActionForm action=action attr:class="row-form stop-form">
            <input type="hidden" name="id" value=id />
            <button
                type="submit"
                class="danger"
                data-testid="stop"
                disabled=move || action.pending().get()
                on:click=move |ev| confirm_or_cancel(&ev, &question)
            >
                {label}
            </button>
        </ActionForm>
    }
}

/// Why a stop was refused, said plainly.
fn stop_error(action: ServerAction<StopWorkload>) -> impl IntoView {
    move || {
        error_of(action.value().get()).map(|e| {
            let text = match e.error {
                AppError::Forbidden => {
                    "Only its owner, a team admin or a platform admin may stop it.".to_owned()
                }
                other => other.to_string(),
            };
            view! {
                <div class="form-error" role="alert" data-testid="stop-error">
                    {text}
                </div>
            }
        })
    }
}

/// The workloads of one allocation, for its page (name, kind, state, where, created).
pub(super) fn workloads_table(items: Vec<WorkloadView>) -> impl IntoView {
    let rows = items
        .into_iter()
        .map(|w| {
            let href = format!("/workloads/{}", w.id);
            view! {
                <tr data-testid="workload-row" data-state=w.state.as_str() data-id=w.id.to_string()>
                    <td>
                        <a href=href>{w.name.clone()}</a>
                    </td>
                    <td>{kind_label(w.kind)}</td>
                    <td>
                        <WorkloadBadge state=w.state />
                    </td>
                    <td>{w.username.clone()}</td>
                    <td>
                        <When t=w.created_at />
                    </td>
                </tr>
            }
        })
        .collect_view();
    list_table(
        &Columns::new(
            "allocation-workloads",
            &["Name", "Kind", "State", "User", "Created"],
        ),
        rows,
    )
}

// ---------------------------------------------------------------------------------------
// The list pages: /notebooks and /jobs
// ---------------------------------------------------------------------------------------

#[component]
pub fn NotebooksPage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the nodes page (see the comment there).
    let data = ListData::new(WorkloadKind::Notebook);
    view! {
        <Authenticated>
            <h1>"Notebooks"</h1>
            <p class="lead hint">
                "A notebook is JupyterLab on one of your GPU allocations: it sees only that "
                "allocation's device and your team's workspace, and opens in a new tab."
            </p>
            <LaunchSection data />
            <ListSection data />
        </Authenticated>
    }
}

#[component]
pub fn JobsPage() -> impl IntoView {
    // Created here, outside `Authenticated`, like the nodes page (see the comment there).
    let data = ListData::new(WorkloadKind::Job);
    view! {
        <Authenticated>
            <h1>"Training jobs"</h1>
            <p class="lead hint">
                "A job runs a command on one of your GPU allocations, in your team's workspace, "
                "and keeps its output. A failed job can be started again automatically."
            </p>
            <LaunchSection data />
            <ListSection data />
        </Authenticated>
    }
}

/// The list's filter, from the address. Notebooks: `?offset=`; jobs also
/// `?team=…&mine=1&filtered=1` (until the filter form is used, the caller's own jobs).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Filter {
    team: String,
    mine: bool,
    offset: u32,
}

impl Filter {
    fn href(&self, kind: WorkloadKind, offset: u32) -> String {
        match kind {
            WorkloadKind::Notebook => format!("/notebooks?offset={offset}"),
            WorkloadKind::Job => {
                let mine = if self.mine { "&mine=1" } else { "" };
                format!("/jobs?team={}{mine}&filtered=1&offset={offset}", self.team)
            }
        }
    }

    fn is_default(&self) -> bool {
        self.team.is_empty() && self.mine
    }
}

/// One allocation a workload may start on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Choice {
    id: String,
    label: String,
}

/// What the launch form offers, and the labels of the caller's allocations for the list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct LaunchOptions {
    /// Active, the caller's own, and no live workload on it.
    free: Vec<Choice>,
    /// Active allocations that already run a workload.
    busy: usize,
    /// Requests still waiting.
    pending: usize,
    /// Allocation id → e.g. `1g.10gb on H100-80GB`.
    labels: BTreeMap<String, String>,
    /// GPU kinds a workload may request for itself (value, label): those of the models the
    /// caller's teams have a quota on.
    gpus: Vec<(String, String)>,
    /// Teams that may pay for such a request (id, name); a choice only when several.
    teams: Vec<(String, String)>,
    /// One of those teams may ask for `high` priority (a platform admin granted it).
    high: bool,
    /// Devices free right now per kind (as of the last scheduler pass).
    free_now: BTreeMap<String, u32>,
    /// The caller's teams' notebook profiles (value `profile:<id>`).
    profiles: Vec<Choice>,
    /// The catalog images the caller's teams may run (platform entries first).
    images: Vec<tessera_domain::image::CatalogImage>,
    /// The form's idempotency key (a double submit launches one workload).
    key: String,
}

fn choice_label(a: &AllocationView) -> String {
    let place = a
        .devices
        .first()
        .map(|d| {
            let dev = d.mig_uuid.clone().unwrap_or_else(|| d.gpu_uuid.clone());
            format!(" · {} · {dev}", d.hostname)
        })
        .unwrap_or_default();
    format!("{}{place} ({})", a.kind_label, a.team_name)
}

async fn load_options() -> Result<LaunchOptions, UiError> {
    let all = PageRequest::new(0, PageRequest::MAX_LIMIT);
    let allocations = api::list_allocations(String::new(), String::new(), true, all).await?;
    let live = api::list_workloads(None, None, None, true, true, all).await?;
    let taken: Vec<String> = live
        .items
        .iter()
        .map(|w| w.allocation_id.to_string())
        .collect();
    let mut free = Vec::new();
    let mut busy = 0;
    let mut pending = 0;
    let mut labels = BTreeMap::new();
    for a in &allocations.items {
        let id = a.id.to_string();
        labels.insert(id.clone(), a.kind_label.clone());
        if a.state == AllocState::Active {
            if taken.contains(&id) {
                busy += 1;
            } else {
                free.push(Choice {
                    id,
                    label: choice_label(a),
                });
            }
        } else if a.state.is_pending() {
            pending += 1;
        }
    }
    let (gpus, teams, high) = requestable().await?;
    // Not fatal: the form works without the "free now" hints.
    let free_now = api::free_now().await.unwrap_or_default();
    let profiles = api::notebook_profiles(String::new())
        .await?
        .into_iter()
        .map(|p| Choice {
            id: format!("{}{}", api::PROFILE_PREFIX, p.id),
            label: format!(
                "Profile {}: {}, {} h ({})",
                p.name, p.kind_label, p.hours, p.team_name
            ),
        })
        .collect();
    Ok(LaunchOptions {
        free,
        busy,
        pending,
        labels,
        gpus,
        teams,
        high,
        free_now,
        profiles,
        // Not fatal: without the catalog the form offers the node's environment only.
        images: api::list_images(String::new()).await.unwrap_or_default(),
        key: crate::components::new_key(),
    })
}

/// The GPU kinds the caller may request (of the models their teams have a quota on), those
/// teams, and whether one of them may use `high` priority; viewers and archived teams
/// request nothing.
async fn requestable() -> Result<(Vec<(String, String)>, Vec<(String, String)>, bool), UiError> {
    let teams = api::list_teams(PageRequest::new(0, PageRequest::MAX_LIMIT)).await?;
    let mut models = Vec::new();
    let mut payers = Vec::new();
    let mut high = false;
    for team in teams.items {
        if team.archived || team.my_role.is_none_or(|r| r == TeamRole::Viewer) {
            continue;
        }
        let quotas = api::list_quotas(team.id.to_string()).await?;
        let mut any = false;
        for q in quotas.into_iter().filter(|q| q.limit > 0) {
            models.push(q.model);
            any = true;
        }
        if any {
            high |= team.high_priority.is_some();
            payers.push((team.id.to_string(), team.name));
        }
    }
    models.sort();
    models.dedup();
    let catalog = Catalog::builtin();
    let gpus = models
        .iter()
        .flat_map(|m| crate::components::kind_options(&catalog, m))
        .collect();
    Ok((gpus, payers, high))
}

#[derive(Clone, Copy)]
struct ListData {
    kind: WorkloadKind,
    launch: ServerAction<LaunchNotebook>,
    submit: ServerAction<SubmitJob>,
    stop: ServerAction<StopWorkload>,
    options: Resource<Result<LaunchOptions, UiError>>,
    /// The caller's teams, for the jobs filter.
    teams: Resource<Result<Page<TeamView>, UiError>>,
    /// `?allocation=` of the address: the allocation to preselect.
    preselect: Memo<String>,
    filter: Memo<Filter>,
    list: Resource<Result<Page<WorkloadView>, UiError>>,
    /// What "a new GPU" currently asks for; set by the form once hydrated and while that
    /// choice is made (the server never estimates, so both sides start from nothing).
    estimate_for: RwSignal<Option<EstimateInput>>,
    /// Its cost at today's prices (`""`: unpriced or not asked).
    estimate: Resource<Result<String, UiError>>,
}

impl ListData {
    fn new(kind: WorkloadKind) -> Self {
        let query = use_query_map();
        let preselect = Memo::new(move |_| query.read().get("allocation").unwrap_or_default());
        let filter = Memo::new(move |_| {
            let q = query.read();
            Filter {
                team: q.get("team").unwrap_or_default(),
                mine: kind == WorkloadKind::Notebook
                    || q.get("filtered").is_none()
                    || q.get("mine").is_some(),
                offset: q.get("offset").and_then(|v| v.parse().ok()).unwrap_or(0),
            }
        });
        let launch = ServerAction::<LaunchNotebook>::new();
        let submit = ServerAction::<SubmitJob>::new();
        let stop = ServerAction::<StopWorkload>::new();
        // Reloaded when a stop frees an allocation; not after a launch, which leaves the
        // page on success and must keep what was typed on failure.
        let options = Resource::new(move || stop.version().get(), |_| load_options());
        let teams = Resource::new(
            || (),
            move |_| async move {
                if kind == WorkloadKind::Job {
                    api::list_teams(PageRequest::new(0, PageRequest::MAX_LIMIT)).await
                } else {
                    Ok(Page {
                        items: Vec::new(),
                        total: 0,
                        offset: 0,
                        limit: 0,
                    })
                }
            },
        );
        // Reloads while something listed has not ended (set from the list once loaded).
        let moving = RwSignal::new(false);
        let tick = refresher(&[Topic::Work], LIST_EVERY, move |streaming| {
            !streaming && moving.get_untracked()
        });
        let list = Resource::new(
            move || (filter.get(), tick.get(), stop.version().get()),
            move |(f, ..)| {
                let team = Some(f.team).filter(|t| !t.is_empty());
                api::list_workloads(
                    Some(kind.as_str().to_owned()),
                    team,
                    None,
                    f.mine,
                    false,
                    PageRequest::new(f.offset, PAGE_SIZE),
                )
            },
        );
        Effect::new(move |_| {
            let live = list.with(|l| match l {
                Some(Ok(page)) => page.items.iter().any(|w| w.state.is_live()),
                _ => false,
            });
            moving.set(live);
        });
        let estimate_for = RwSignal::new(None::<EstimateInput>);
        let estimate = Resource::new(move || estimate_for.get(), load_estimate);
        ListData {
            kind,
            launch,
            submit,
            stop,
            options,
            teams,
            preselect,
            filter,
            list,
            estimate_for,
            estimate,
        }
    }
}

#[component]
fn LaunchSection(data: ListData) -> impl IntoView {
    let ListData {
        kind,
        launch,
        submit,
        options,
        preselect,
        estimate_for,
        estimate,
        ..
    } = data;
    let estimate = NewGpuEstimate {
        input: estimate_for,
        cost: estimate,
    };
    let title = match kind {
        WorkloadKind::Notebook => "Launch a notebook",
        WorkloadKind::Job => "Submit a job",
    };
    view! {
        <section class="card wide" aria-labelledby="launch-title">
            <h2 id="launch-title">{title}</h2>
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    let chosen = preselect.get_untracked();
                    match options.await {
                        Ok(o) if o.free.is_empty() && o.gpus.is_empty() && o.profiles.is_empty() => {
                            view! { <NoFreeAllocation o kind /> }.into_any()
                        }
                        Ok(o) => {
                            let unusable = (!chosen.is_empty() && !o.free.iter().any(|c| c.id == chosen))
                                .then(|| {
                                    view! {
                                        <div class="notice warn" role="status" data-testid="preselect-unusable">
                                            "That allocation cannot take a workload now: it is not "
                                            "active, not yours, or already runs one. Choose another."
                                        </div>
                                    }
                                });
                            let form = match kind {
                                WorkloadKind::Notebook => {
                                    view! { <LaunchForm o chosen action=launch estimate /> }.into_any()
                                }
                                WorkloadKind::Job => {
                                    view! { <SubmitForm o chosen action=submit estimate /> }.into_any()
                                }
                            };
                            view! {
                                {unusable}
                                {form}
                            }
                                .into_any()
                        }
                        Err(e) => {
                            alert(format!("Your allocations could not be loaded: {}", e.error))
                        }
                    }
                })}
            </Transition>
        </section>
    }
}

/// Nothing to launch on: says why and where to get an allocation.
#[component]
fn NoFreeAllocation(o: LaunchOptions, kind: WorkloadKind) -> impl IntoView {
    let what = match kind {
        WorkloadKind::Notebook => "A notebook",
        WorkloadKind::Job => "A job",
    };
    let why = if o.busy > 0 {
        format!(
            "{what} runs on one of your active GPU allocations, and each of yours already runs \
             a notebook or job. Stop one, or request another GPU."
        )
    } else {
        format!(
            "{what} needs an active GPU allocation of yours, and you have none. Request one \
             (a 1g.10gb MIG slice is plenty to start with); once it is active, come back here."
        )
    };
    let waiting = (o.pending > 0).then(|| {
        view! {
            <p class="hint">
                {format!(
                    "{} still waiting: ",
                    tessera_domain::text::count(
                        o.pending as u64,
                        "of your requests is",
                        "of your requests are",
                    ),
                )} <a href="/allocations">"see them"</a> "."
            </p>
        }
    });
    view! {
        <Empty>
            <p data-testid="no-allocation">{why}</p>
            {waiting}
            <a href="/allocations">"Request a GPU →"</a>
        </Empty>
    }
}

/// "Run on": one of the caller's free active allocations, or a GPU of the workload's own
/// (queued for, given back when it ends). `new_gpu` follows the choice.
#[component]
fn RunOnSelect(
    choices: Vec<Choice>,
    chosen: String,
    input_id: &'static str,
    kind: WorkloadKind,
    can_request: bool,
    new_gpu: RwSignal<bool>,
    /// Notebooks: the team profiles, offered first.
    #[prop(optional)]
    profiles: Vec<Choice>,
) -> impl IntoView {
    // Nothing asked for: the caller's own free allocation first (a GPU they hold and pay
    // for already), then a team profile, then a new GPU.
    let chosen = match (chosen.is_empty(), choices.first(), profiles.first()) {
        (false, ..) => chosen,
        (true, Some(c), _) => c.id.clone(),
        (true, None, Some(p)) => p.id.clone(),
        (true, None, None) => api::NEW_GPU.to_owned(),
    };
    let option_list = |list: Vec<Choice>| {
        list.into_iter()
            .map(|c| {
                let selected = c.id == chosen;
                view! {
                    <option value=c.id selected=selected>
                        {c.label}
                    </option>
                }
            })
            .collect_view()
    };
    let profile_options = option_list(profiles);
    let options = option_list(choices);
    new_gpu.set(chosen == api::NEW_GPU);
    let own = can_request.then(|| {
        let label = match kind {
            WorkloadKind::Notebook => "A new GPU for this notebook (given back when it stops)",
            WorkloadKind::Job => "A new GPU for this job (queued; given back when it ends)",
        };
        view! {
            <option value=api::NEW_GPU selected=chosen == api::NEW_GPU>
                {label}
            </option>
        }
    });
    view! {
        <label for=input_id>"Run on"</label>
        <select
            id=input_id
            name="allocation_id"
            required
            on:change=move |ev| new_gpu.set(event_target_value(&ev) == api::NEW_GPU)
        >
            {options}
            {profile_options}
            {own}
        </select>
    }
}

/// The price estimate of "a new GPU": what the form asks for, and its cost.
#[derive(Clone, Copy)]
struct NewGpuEstimate {
    input: RwSignal<Option<EstimateInput>>,
    cost: Resource<Result<String, UiError>>,
}

/// The kind, count and hours of "a new GPU" as last submitted from a form, kept in the
/// browser's localStorage (nothing on the server): the next form starts from them.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LastGpu {
    gpu: String,
    count: String,
    hours: String,
}

impl LastGpu {
    #[cfg(feature = "hydrate")]
    fn key(kind: WorkloadKind) -> String {
        format!("tessera.new-gpu.{}", kind.as_str())
    }

    fn encode(&self) -> String {
        format!("{}\n{}\n{}", self.gpu, self.count, self.hours)
    }

    /// `None` for anything but three lines: a kind, and a count and hours that are empty
    /// or whole numbers of 1 or more.
    fn decode(text: &str) -> Option<Self> {
        let mut lines = text.split('\n');
        let (gpu, count, hours) = (lines.next()?, lines.next()?, lines.next()?);
        let number = |v: &str| v.is_empty() || v.parse::<u32>().is_ok_and(|n| n >= 1);
        (lines.next().is_none() && !gpu.is_empty() && number(count) && number(hours)).then(|| {
            LastGpu {
                gpu: gpu.to_owned(),
                count: count.to_owned(),
                hours: hours.to_owned(),
            }
        })
    }

    /// What a submitted form asked for, when it asked for a new GPU.
    fn of(
        allocation_id: &str,
        gpu: &Option<String>,
        count: &Option<String>,
        hours: &Option<String>,
    ) -> Option<Self> {
        let trim = |v: &Option<String>| v.as_deref().unwrap_or_default().trim().to_owned();
        (allocation_id.trim() == api::NEW_GPU).then(|| LastGpu {
            gpu: trim(gpu),
            count: trim(count),
            hours: trim(hours),
        })
    }

    fn load(kind: WorkloadKind) -> Option<Self> {
        Self::read(kind).as_deref().and_then(Self::decode)
    }

    fn save(&self, kind: WorkloadKind) {
        Self::write(kind, &self.encode());
    }

    #[cfg(feature = "hydrate")]
    fn storage() -> Option<web_sys::Storage> {
        web_sys::window()?.local_storage().ok()?
    }

    #[cfg(feature = "hydrate")]
    fn read(kind: WorkloadKind) -> Option<String> {
        Self::storage()?.get_item(&Self::key(kind)).ok()?
    }

    #[cfg(feature = "hydrate")]
    fn write(kind: WorkloadKind, text: &str) {
        if let Some(storage) = Self::storage() {
            // A full or refused storage only loses the convenience.
            let _ = storage.set_item(&Self::key(kind), text);
        }
    }

    /// The server keeps no choice: its forms start from what is free now.
    #[cfg(not(feature = "hydrate"))]
    fn read(_: WorkloadKind) -> Option<String> {
        None
    }

    #[cfg(not(feature = "hydrate"))]
    fn write(_: WorkloadKind, _: &str) {}
}

/// The workload's own GPU request: kind, hours (a job's time limit), priority (jobs) and
/// the paying team when the caller has several, with what it would cost. Shown while "a
/// new GPU" is chosen. Starts from the caller's last submitted choice (this browser's),
/// else from a kind free right now.
#[component]
fn OwnGpuFields(
    gpus: Vec<(String, String)>,
    teams: Vec<(String, String)>,
    high: bool,
    free_now: BTreeMap<String, u32>,
    kind: WorkloadKind,
    new_gpu: RwSignal<bool>,
    errors: Callback<&'static str, AnyView>,
    estimate: NewGpuEstimate,
) -> impl IntoView {
    let prefix = match kind {
        WorkloadKind::Notebook => "nb",
        WorkloadKind::Job => "job",
    };
    // Preselected: the first kind (smallest first) that is free right now.
    let default_gpu = gpus
        .iter()
        .find(|(v, _)| free_now.get(v).copied().unwrap_or(0) > 0)
        .or(gpus.first())
        .map(|(v, _)| v.clone())
        .unwrap_or_default();
    let offered: Vec<String> = gpus.iter().map(|(v, _)| v.clone()).collect();
    // What the chosen kind meets right now: it fits, or it waits (and why).
    let chosen_gpu = RwSignal::new(default_gpu.clone());
    let chosen_count = RwSignal::new("1".to_owned());
    let chosen_hours = RwSignal::new(String::new());
    let chosen_priority = RwSignal::new("normal".to_owned());
    // Jobs: on how many nodes at once (more than 1: a gang, `count` on each).
    let chosen_nodes = RwSignal::new("1".to_owned());
    let gang = move || gang_size(&chosen_nodes.get());
    // Once hydrated (effects run only in the browser): the last choice, where still offered.
    Effect::new(move |_| {
        if let Some(last) = LastGpu::load(kind).filter(|l| offered.contains(&l.gpu)) {
            chosen_gpu.set(last.gpu);
            chosen_count.set(if last.count.is_empty() {
                "1".to_owned()
            } else {
                last.count
            });
            chosen_hours.set(last.hours);
        }
    });
    Effect::new(move |_| {
        let input = new_gpu.get().then(|| {
            let hours = chosen_hours.get();
            let count = chosen_count.get();
            // A gang costs its GPUs on every node.
            let count = match (gang(), count.trim().parse::<u32>()) {
                (Some(n), Ok(c)) => n.saturating_mul(c).to_string(),
                _ => count,
            };
            EstimateInput {
                kind: chosen_gpu.get(),
                count,
                // Empty: 8 hours, like the request.
                hours: if hours.trim().is_empty() {
                    "8".to_owned()
                } else {
                    hours
                },
                priority: chosen_priority.get(),
            }
        });
        estimate.input.set(input);
    });
    let estimate_text = move || {
        estimate
            .cost
            .get()
            .and_then(Result::ok)
            .filter(|s| !s.is_empty())
    };
    let fits = {
        let free_now = free_now.clone();
        move || {
            let kind = chosen_gpu.get();
            let text = crate::components::free_text(&free_now, &kind);
            if let Some(nodes) = gang() {
                let per_node = chosen_count.with(|c| c.trim().parse().unwrap_or(1));
                return gang_fits(nodes, per_node, free_now.get(&kind).copied(), &text);
            }
            match free_now.get(&kind).copied() {
                Some(n) if n > 0 => format!("Fits now: {text}."),
                _ if text == "fits now" => "Fits now.".to_owned(),
                _ => format!("Waits: {text}; it queues until one is free."),
            }
        }
    };
    let gpu_options = gpus
        .into_iter()
        .map(|(v, label)| {
            let label = format!("{label} — {}", crate::components::free_text(&free_now, &v));
            let selected = v == default_gpu;
            let value = v.clone();
            view! {
                <option
                    value=v
                    selected=selected
                    prop:selected=move || chosen_gpu.with(|c| *c == value)
                >
                    {label}
                </option>
            }
        })
        .collect_view();
    let team_field = (teams.len() > 1).then(|| {
        let options = teams
            .into_iter()
            .map(|(id, name)| view! { <option value=id>{name}</option> })
            .collect_view();
        view! {
            <div>
                <label for=format!("{prefix}-team")>"Team that pays"</label>
                <select id=format!("{prefix}-team") name="team_id">
                    {options}
                </select>
                {errors.run("team_id")}
            </div>
        }
    });
    let priority_field = (kind == WorkloadKind::Job).then(|| {
        view! {
            <div>
                <label for="job-priority">"Priority"</label>
                <select
                    id="job-priority"
                    name="priority"
                    on:change=move |ev| chosen_priority.set(event_target_value(&ev))
                >
                    <option value="normal" selected>"normal"</option>
                    {high.then(|| view! { <option value="high">"high (granted to your team)"</option> })}
                    <option value="preemptible">"preemptible (spare capacity, stopped first)"</option>
                </select>
                {errors.run("priority")}
            </div>
        }
    });
    // Jobs: the nodes, and once more than one, who runs the command.
    let nodes_field = (kind == WorkloadKind::Job).then(|| {
        view! {
            <div>
                <label for="job-nodes">"Nodes"</label>
                <input
                    id="job-nodes"
                    name="nodes"
                    type="number"
                    min="1"
                    inputmode="numeric"
                    value="1"
                    data-testid="own-gpu-nodes"
                    prop:value=move || chosen_nodes.get()
                    on:input=move |ev| chosen_nodes.set(event_target_value(&ev))
                />
                {errors.run("nodes")}
            </div>
        }
    });
    let gang_fields = (kind == WorkloadKind::Job).then(|| {
        let hint = move || {
            gang().map(|n| gang_hint(n, chosen_count.with(|c| c.trim().parse().unwrap_or(1))))
        };
        view! {
            <div class="gang" data-testid="gang-fields" hidden=move || gang().is_none()>
                <label for="job-launcher">"Launcher"</label>
                <select id="job-launcher" name="launcher" data-testid="own-gpu-launcher">
                    <option value="each" selected>"Every node runs the command"</option>
                    <option value="rank0">"Only rank 0 runs it (mpirun)"</option>
                </select>
                {errors.run("launcher")}
                <label for="job-ranks">"Processes"</label>
                <select id="job-ranks" name="ranks" data-testid="own-gpu-ranks">
                    <option value="per_node" selected>"One per node (torchrun, mpirun)"</option>
                    <option value="per_gpu">"One per GPU"</option>
                </select>
                {errors.run("ranks")}
                <p class="hint" data-testid="gang-hint">{hint}</p>
            </div>
        }
    });
    let count_label = move || {
        if gang().is_some() {
            "GPUs per node"
        } else {
            "How many"
        }
    };
    let (hours_label, hours_hint) = match kind {
        WorkloadKind::Notebook => (
            "Hours",
            "At most this long; stopping it earlier gives the GPU back.",
        ),
        WorkloadKind::Job => (
            "Time limit (hours)",
            "The job is stopped after this long; its GPU is given back as soon as it ends.",
        ),
    };
    view! {
        <fieldset class="own-gpu" data-testid="own-gpu" hidden=move || !new_gpu.get()>
            <legend>"The GPU it queues for"</legend>
            <div class="field-row three">
                <div>
                    <label for=format!("{prefix}-gpu")>"GPU or MIG slice"</label>
                    <select
                        id=format!("{prefix}-gpu")
                        name="gpu"
                        data-testid="own-gpu-kind"
                        on:change=move |ev| chosen_gpu.set(event_target_value(&ev))
                    >
                        {gpu_options}
                    </select>
                    <p class="hint" data-testid="own-gpu-fits">{fits}</p>
                    {errors.run("gpu")}
                </div>
                {nodes_field}
                <div>
                    <label for=format!("{prefix}-count")>{count_label}</label>
                    <input
                        id=format!("{prefix}-count")
                        name="count"
                        type="number"
                        min="1"
                        inputmode="numeric"
                        value="1"
                        prop:value=move || chosen_count.get()
                        on:input=move |ev| chosen_count.set(event_target_value(&ev))
                    />
                    {errors.run("count")}
                    {errors.run("gpus_per_node")}
                </div>
                <div>
                    <label for=format!("{prefix}-hours")>{hours_label}</label>
                    <input
                        id=format!("{prefix}-hours")
                        name="hours"
                        type="number"
                        min="1"
                        inputmode="numeric"
                        placeholder="8"
                        prop:value=move || chosen_hours.get()
                        on:input=move |ev| chosen_hours.set(event_target_value(&ev))
                    />
                    {errors.run("hours")}
                    {errors.run("duration_minutes")}
                </div>
                {priority_field}
                {team_field}
            </div>
            {gang_fields}
            <p
                class="estimate"
                data-testid="own-gpu-estimate"
                aria-live="polite"
                hidden=move || estimate_text().is_none()
            >
                {move || {
                    estimate_text()
                        .map(|cost| {
                            view! {
                                "Estimated cost: "
                                <strong>{cost}</strong>
                                " at today's prices, if it runs the whole time"
                            }
                        })
                }}
            </p>
            <p class="hint">
                {hours_hint}
                " It waits in your team's queue like any request; its page says why while it waits."
            </p>
        </fieldset>
    }
}

/// The form's "Nodes" as a gang's size: a whole number above 1 (anything else is one node
/// here; the server says what is wrong with it).
fn gang_size(nodes: &str) -> Option<u32> {
    nodes.trim().parse::<u32>().ok().filter(|n| *n > 1)
}

/// What a gang of `nodes` × `per_node` is, and what each node is told.
fn gang_hint(nodes: u32, per_node: u32) -> String {
    format!(
        "{} × {}, placed all at once; each node gets MASTER_ADDR, RANK, WORLD_SIZE… and \
         $TESSERA_HOSTFILE.",
        tessera_domain::text::count(u64::from(nodes), "node", "nodes"),
        tessera_domain::text::count(u64::from(per_node), "GPU", "GPUs"),
    )
}

/// "Fits now / waits" for a gang: the free count is the cluster's, not per node, so
/// enough in all only means it may fit.
fn gang_fits(nodes: u32, per_node: u32, free: Option<u32>, free_text: &str) -> String {
    let needed = nodes.saturating_mul(per_node);
    let each = format!("{per_node} free");
    if free.unwrap_or(0) >= needed {
        format!("Fits now if {nodes} nodes each have {each} ({free_text} in all).")
    } else {
        format!(
            "Waits: {free_text}; it needs {needed} in all, {per_node} on each of {nodes} \
             nodes, and queues until they are free at once."
        )
    }
}

/// The form's errors that belong to no field it shows.
fn other_error<T: 'static>(
    value: impl Fn() -> Option<Result<T, UiError>> + Send + Sync + Copy + 'static,
    fields: &'static [&'static str],
) -> impl IntoView {
    move || {
        error_of(value())
            .filter(|e| e.error.field().is_none_or(|f| !fields.contains(&f)))
            .map(|e| {
                view! {
                    <div class="form-error" role="alert" data-testid="launch-error">
                        {e.error.to_string()}
                    </div>
                }
            })
    }
}

const NOTEBOOK_FIELDS: [&str; 9] = [
    "allocation_id",
    "name",
    "image",
    "env",
    "gpu",
    "count",
    "hours",
    "duration_minutes",
    "team_id",
];
const JOB_FIELDS: [&str; 16] = [
    "allocation_id",
    "name",
    "image",
    "command",
    "workdir",
    "env",
    "retries",
    "gpu",
    "count",
    "hours",
    "duration_minutes",
    "team_id",
    "nodes",
    "gpus_per_node",
    "launcher",
    "ranks",
];

const ENV_PLACEHOLDER: &str =
    "One NAME=value per line, e.g.\nWANDB_PROJECT=resnet\nHF_HOME=cache/hf";

#[component]
fn LaunchForm(
    o: LaunchOptions,
    chosen: String,
    action: ServerAction<LaunchNotebook>,
    estimate: NewGpuEstimate,
) -> impl IntoView {
    let value = move || action.value().get();
    // What a submitted "new GPU" asked for is the next form's start.
    Effect::new(move |_| {
        action.input().with(|i| {
            if let Some(last) = i
                .as_ref()
                .and_then(|i| LastGpu::of(&i.allocation_id, &i.gpu, &i.count, &i.hours))
            {
                last.save(WorkloadKind::Notebook);
            }
        });
    });
    let echo_alloc = untrack(echoed(value, "allocation_id"));
    let chosen = if echo_alloc.is_empty() {
        chosen
    } else {
        echo_alloc
    };
    let name = untrack(echoed(value, "name"));
    let name = if name.is_empty() {
        "default".to_owned()
    } else {
        name
    };
    let new_gpu = RwSignal::new(false);
    view! {
        <ActionForm action=action attr:data-testid="launch-form" attr:novalidate=true>
            {other_error(value, &NOTEBOOK_FIELDS)}
            <input type="hidden" name="idempotency_key" value=o.key />
            <RunOnSelect
                choices=o.free
                chosen
                input_id="nb-allocation"
                kind=WorkloadKind::Notebook
                can_request=!o.gpus.is_empty()
                new_gpu
                profiles=o.profiles
            />
            {field_error(value, "allocation_id")}
            <OwnGpuFields
                gpus=o.gpus
                teams=o.teams
                high=o.high
                free_now=o.free_now
                kind=WorkloadKind::Notebook
                new_gpu
                errors=Callback::new(move |f| field_error(value, f).into_any())
                estimate
            />
            <label for="nb-name">"Name"</label>
            <input
                id="nb-name"
                name="name"
                value=name
                autocomplete="off"
                maxlength="32"
                aria-describedby="nb-name-hint"
            />
            <p class="hint" id="nb-name-hint">
                "Lowercase letters, digits and -; part of the notebook's address."
            </p>
            {field_error(value, "name")}
            <EnvironmentSelect
                input_id="nb-image"
                images=o.images
                chosen=untrack(echoed(value, "image"))
            />
            {field_error(value, "image")}
            <label for="nb-env">"Environment variables (optional)"</label>
            <textarea id="nb-env" name="env" rows="3" placeholder=ENV_PLACEHOLDER></textarea>
            {field_error(value, "env")}
            <button type="submit" class="primary" disabled=move || action.pending().get()>
                {move || if action.pending().get() { "Launching…" } else { "Launch notebook" }}
            </button>
        </ActionForm>
    }
}

#[component]
fn SubmitForm(
    o: LaunchOptions,
    chosen: String,
    action: ServerAction<SubmitJob>,
    estimate: NewGpuEstimate,
) -> impl IntoView {
    let value = move || action.value().get();
    // What a submitted "new GPU" asked for is the next form's start.
    Effect::new(move |_| {
        action.input().with(|i| {
            if let Some(last) = i
                .as_ref()
                .and_then(|i| LastGpu::of(&i.allocation_id, &i.gpu, &i.count, &i.hours))
            {
                last.save(WorkloadKind::Job);
            }
        });
    });
    let echo_alloc = untrack(echoed(value, "allocation_id"));
    let chosen = if echo_alloc.is_empty() {
        chosen
    } else {
        echo_alloc
    };
    let name = untrack(echoed(value, "name"));
    let command = untrack(echoed(value, "command"));
    let workdir = untrack(echoed(value, "workdir"));
    let retries = untrack(echoed(value, "retries"));
    let retries = if retries.is_empty() {
        "0".to_owned()
    } else {
        retries
    };
    let new_gpu = RwSignal::new(false);
    view! {
        <ActionForm action=action attr:data-testid="submit-form" attr:novalidate=true>
            {other_error(value, &JOB_FIELDS)}
            <input type="hidden" name="idempotency_key" value=o.key />
            <RunOnSelect
                choices=o.free
                chosen
                input_id="job-allocation"
                kind=WorkloadKind::Job
                can_request=!o.gpus.is_empty()
                new_gpu
            />
            {field_error(value, "allocation_id")}
            <OwnGpuFields
                gpus=o.gpus
                teams=o.teams
                high=o.high
                free_now=o.free_now
                kind=WorkloadKind::Job
                new_gpu
                errors=Callback::new(move |f| field_error(value, f).into_any())
                estimate
            />
            <label for="job-command">"Command"</label>
            <textarea
                id="job-command"
                name="command"
                rows="3"
                required
                placeholder="python train.py --epochs 10"
            >
                {command}
            </textarea>
            <p class="hint">"Run by /bin/sh in the working folder; the exit code decides success."</p>
            {field_error(value, "command")}
            <div class="field-row three">
                <div>
                    <label for="job-name">"Name (optional)"</label>
                    <input
                        id="job-name"
                        name="name"
                        value=name
                        autocomplete="off"
                        maxlength="80"
                        placeholder="the command"
                    />
                    {field_error(value, "name")}
                </div>
                <div>
                    <label for="job-workdir">"Working folder (optional)"</label>
                    <input
                        id="job-workdir"
                        name="workdir"
                        value=workdir
                        autocomplete="off"
                        placeholder="projects/resnet"
                    />
                    {field_error(value, "workdir")}
                </div>
                <div>
                    <label for="job-retries">"Retries on failure"</label>
                    <input
                        id="job-retries"
                        name="retries"
                        type="number"
                        min="0"
                        max="5"
                        inputmode="numeric"
                        value=retries
                    />
                    {field_error(value, "retries")}
                </div>
            </div>
            <p class="hint">"The working folder is inside your team's workspace; empty: its top."</p>
            <EnvironmentSelect
                input_id="job-image"
                images=o.images
                chosen=untrack(echoed(value, "image"))
            />
            {field_error(value, "image")}
            <label for="job-env">"Environment variables (optional)"</label>
            <textarea id="job-env" name="env" rows="3" placeholder=ENV_PLACEHOLDER></textarea>
            {field_error(value, "env")}
            <button type="submit" class="primary" disabled=move || action.pending().get()>
                {move || if action.pending().get() { "Submitting…" } else { "Submit job" }}
            </button>
        </ActionForm>
    }
}

#[component]
fn ListSection(data: ListData) -> impl IntoView {
    let ListData {
        kind,
        stop,
        options,
        teams,
        filter,
        list,
        ..
    } = data;
    let (title, testid) = match kind {
        WorkloadKind::Notebook => ("Your notebooks", "notebooks"),
        WorkloadKind::Job => ("Jobs", "jobs"),
    };
    let filters = (kind == WorkloadKind::Job).then(|| view! { <JobFilter filter teams /> });
    view! {
        <section class="card wide" aria-labelledby="list-title">
            <h2 id="list-title">{title}</h2>
            {filters}
            {stop_error(stop)}
            <Transition fallback=Loading>
                {move || Suspend::new(async move {
                    let f = filter.get_untracked();
                    let labels = options.await.map(|o| o.labels).unwrap_or_default();
                    match list.await {
                        Ok(page) if page.total == 0 => {
                            let text = match kind {
                                WorkloadKind::Notebook => "No notebooks yet — launch one above.",
                                WorkloadKind::Job if f.is_default() => "No jobs yet — submit one above.",
                                WorkloadKind::Job => "No jobs match this filter.",
                            };
                            view! {
                                <Empty>
                                    <p>{text}</p>
                                </Empty>
                            }
                                .into_any()
                        }
                        Ok(page) => {
                            let pager = pager_with(&page, &|offset| f.href(kind, offset));
                            let rows = page
                                .items
                                .into_iter()
                                .map(|w| view! { <ListRow w labels=labels.clone() stop /> })
                                .collect_view();
                            let heads = match kind {
                                WorkloadKind::Notebook => {
                                    &["Name", "State", "Allocation", "Where", "Created", ""][..]
                                }
                                WorkloadKind::Job => {
                                    &[
                                        "Name",
                                        "State",
                                        "Exit code",
                                        "Attempt",
                                        "Allocation",
                                        "Team",
                                        "User",
                                        "Created",
                                        "",
                                    ][..]
                                }
                            };
                            view! {
                                {list_table(&Columns::new(testid, heads).class("list workloads"), rows)}
                                {pager}
                            }
                                .into_any()
                        }
                        Err(e) => view! { <Problem error=e.error /> }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}

/// Team and "mine only" as a GET form: works without JavaScript, navigates in place with it.
#[component]
fn JobFilter(
    filter: Memo<Filter>,
    teams: Resource<Result<Page<TeamView>, UiError>>,
) -> impl IntoView {
    view! {
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                let current = filter.get_untracked();
                let options = teams
                    .await
                    .map(|p| p.items)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| {
                        let id = t.id.to_string();
                        let selected = id == current.team;
                        view! {
                            <option value=id selected=selected>
                                {t.name}
                            </option>
                        }
                    })
                    .collect_view();
                view! {
                    <Form method="get" action="/jobs" attr:class="filters">
                        <input type="hidden" name="filtered" value="1" />
                        <label for="filter-team">"Team"</label>
                        <select id="filter-team" name="team">
                            <option value="" selected=current.team.is_empty()>
                                "All my teams"
                            </option>
                            {options}
                        </select>
                        <label class="check">
                            <input type="checkbox" name="mine" value="1" checked=current.mine />
                            " Mine only"
                        </label>
                        <button type="submit">"Show"</button>
                    </Form>
                }
            })}
        </Transition>
    }
}

#[component]
fn ListRow(
    w: WorkloadView,
    labels: BTreeMap<String, String>,
    stop: ServerAction<StopWorkload>,
) -> impl IntoView {
    let href = format!("/workloads/{}", w.id);
    let alloc_href = format!("/allocations/{}", w.allocation_id);
    let alloc_label = labels
        .get(&w.allocation_id.to_string())
        .cloned()
        .unwrap_or_else(|| "allocation".to_owned());
    let stoppable = w.state.is_live() && w.state != WorkloadState::Stopping;
    let stop_button = stoppable.then(|| {
        view! { <StopButton id=w.id.to_string() kind=w.kind name=w.name.clone() action=stop /> }
    });
    let open = w.url.clone().map(|url| {
        view! {
            <a class="button small" href=url target="_blank" rel="noopener" data-testid="open-notebook">
                "Open"
            </a>
        }
    });
    let common_start = view! {
        <td>
            <a href=href data-testid="workload-link">
                {w.name.clone()}
            </a>
            {w.pull.map(|p| view! { " " <span class="badge muted" data-testid="pull-label">{p.label()}</span> })}
        </td>
        <td>
            <WorkloadBadge state=w.state />
        </td>
    };
    let cells = match w.kind {
        WorkloadKind::Notebook => view! {
            {common_start}
            <td>
                <a href=alloc_href>{alloc_label}</a>
            </td>
            <td class="where">{where_view(&w)}</td>
            <td>
                <When t=w.created_at />
            </td>
            <td class="actions">{open} {stop_button}</td>
        }
        .into_any(),
        WorkloadKind::Job => view! {
            {common_start}
            <td data-testid="exit-code">{w.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "—".to_owned())}</td>
            <td>{tessera_domain::workload::attempt_label(w.attempt, w.retries)}</td>
            <td>
                <a href=alloc_href>{alloc_label}</a>
            </td>
            <td>{w.team_name.clone()}</td>
            <td>{w.username.clone()}</td>
            <td>
                <When t=w.created_at />
            </td>
            <td class="actions">{stop_button}</td>
        }
        .into_any(),
    };
    view! {
        <tr data-testid="workload-row" data-state=w.state.as_str() data-id=w.id.to_string() data-name=w.name.clone()>
            {cells}
        </tr>
    }
}

// ---------------------------------------------------------------------------------------
// One workload: /workloads/:id
// ---------------------------------------------------------------------------------------

#[component]
pub fn WorkloadPage() -> impl IntoView {
    // Created outside `Authenticated`, like the nodes page (see the comment there).
    let data = DetailData::new();
    view! {
        <Authenticated>
            <WorkloadDetail data />
        </Authenticated>
    }
}

/// The log as the page has it: the tail loaded with the page (`head`), then what each
/// poll appended.
#[derive(Clone, Copy)]
struct LogState {
    head: Resource<Result<LogSlice, UiError>>,
    /// Text appended since `head`.
    more: RwSignal<String>,
    /// Whether `head` is no longer shown (dropped to keep the page light).
    head_hidden: RwSignal<bool>,
    /// Where the next read starts (`None` until the head has loaded).
    next: RwSignal<Option<u64>>,
    complete: RwSignal<bool>,
    pre: NodeRef<leptos::html::Pre>,
    /// A multi-node job: whose log is shown (0: the job itself, whose log `head` is).
    rank: RwSignal<u32>,
    /// Another rank's log is loading (the poll waits).
    switching: RwSignal<bool>,
}

#[derive(Clone, Copy)]
struct DetailData {
    workload: Resource<Result<WorkloadView, UiError>>,
    /// The newest view from the poll or a stop (replaces `workload` when it has this id).
    polled: RwSignal<Option<WorkloadView>>,
    stop: ServerAction<StopWorkload>,
    log: LogState,
}

/// Whether the log view is near its end (so new output scrolls it along).
fn at_bottom(pre: NodeRef<leptos::html::Pre>) -> bool {
    #[cfg(feature = "hydrate")]
    if let Some(el) = pre.get_untracked() {
        return el.scroll_height() - el.scroll_top() - el.client_height() < 32;
    }
    let _ = pre;
    true
}

fn scroll_to_bottom(pre: NodeRef<leptos::html::Pre>) {
    #[cfg(feature = "hydrate")]
    request_animation_frame(move || {
        if let Some(el) = pre.get_untracked() {
            el.set_scroll_top(el.scroll_height());
        }
    });
    #[cfg(not(feature = "hydrate"))]
    let _ = pre;
}

impl DetailData {
    fn new() -> Self {
        let params = use_params_map();
        let id = Memo::new(move |_| params.read().get("id").unwrap_or_default());
        let stop = ServerAction::<StopWorkload>::new();
        let workload = Resource::new(move || id.get(), api::get_workload);
        let log = LogState {
            head: Resource::new(move || id.get(), |id| api::workload_logs(id, None, None)),
            more: RwSignal::new(String::new()),
            head_hidden: RwSignal::new(false),
            next: RwSignal::new(None),
            complete: RwSignal::new(false),
            pre: NodeRef::new(),
            rank: RwSignal::new(0),
            switching: RwSignal::new(false),
        };
        let polled = RwSignal::new(None::<WorkloadView>);
        // Another workload (navigation between two): start over.
        Effect::new(move |prev: Option<String>| {
            let now = id.get();
            if prev.is_some_and(|p| p != now) {
                polled.set(None);
                log.more.set(String::new());
                log.head_hidden.set(false);
                log.next.set(None);
                log.complete.set(false);
                log.rank.set(0);
                log.switching.set(false);
            }
            now
        });
        Effect::new(move |_| {
            if let Some(Ok(v)) = stop.value().get() {
                polled.set(Some(v));
            }
        });
        // (kind, state) of what is shown, for the poll.
        let status = RwSignal::new(None::<(WorkloadKind, WorkloadState)>);
        Effect::new(move |_| {
            let want = id.get();
            let now = polled
                .get()
                .filter(|v| v.id.to_string() == want)
                .map(|v| (v.kind, v.state))
                .or_else(|| {
                    workload.with(|w| match w {
                        Some(Ok(v)) => Some((v.kind, v.state)),
                        _ => None,
                    })
                });
            status.set(now);
        });
        // The poll goes on from where the head ends.
        Effect::new(move |_| {
            if let Some((next, complete)) = log.head.with(|h| match h {
                Some(Ok(s)) => Some((s.next, s.complete)),
                _ => None,
            }) {
                if log.next.get_untracked().is_none() {
                    log.next.set(Some(next));
                }
                if complete {
                    log.complete.set(true);
                }
            }
        });
        // The first time the log shows, start at its end.
        Effect::new(move |_| {
            if log.pre.get().is_some() {
                scroll_to_bottom(log.pre);
            }
        });
        Effect::new(move |_| {
            let ticks = RwSignal::new(0u32);
            let fetching_workload = RwSignal::new(false);
            let fetching_log = RwSignal::new(false);
            let poll = move || {
                let n = ticks.get_untracked();
                ticks.set(n.wrapping_add(1));
                let Some((kind, state)) = status.get_untracked() else {
                    return;
                };
                let current = id.get_untracked();
                if state.is_live() && n.is_multiple_of(2) && !fetching_workload.get_untracked() {
                    fetching_workload.set(true);
                    let current = current.clone();
                    spawn_local(async move {
                        if let Ok(v) = api::get_workload(current.clone()).await
                            && id.try_get_untracked().as_deref() == Some(current.as_str())
                        {
                            polled.try_set(Some(v));
                        }
                        fetching_workload.try_set(false);
                    });
                }
                // A running notebook's log only grows by JupyterLab's chatter: read it
                // while it starts or stops, and a job's always.
                let wanted = kind == WorkloadKind::Job || state != WorkloadState::Running;
                if !wanted
                    || log.complete.get_untracked()
                    || fetching_log.get_untracked()
                    || log.switching.get_untracked()
                {
                    return;
                }
                // Set once the log's head has loaded (and only if the caller may read it).
                let Some(from) = log.next.get_untracked() else {
                    return;
                };
                let rank = log.rank.get_untracked();
                fetching_log.set(true);
                spawn_local(async move {
                    if let Ok(slice) =
                        api::workload_logs(current.clone(), Some(from), Some(rank)).await
                        && id.try_get_untracked().as_deref() == Some(current.as_str())
                        // Not meanwhile switched to another rank's log.
                        && log.rank.try_get_untracked() == Some(rank)
                        && log.next.try_get_untracked() == Some(Some(from))
                    {
                        append_log(log, from, &slice);
                    }
                    fetching_log.try_set(false);
                });
            };
            if let Ok(handle) = set_interval_with_handle(poll, POLL_EVERY) {
                on_cleanup(move || handle.clear());
            }
        });
        DetailData {
            workload,
            polled,
            stop,
            log,
        }
    }
}

/// Shows rank `rank`'s log of the job `id` instead of the one shown: its tail replaces the
/// text, and the poll goes on from its end.
fn switch_rank(log: LogState, id: String, rank: u32) {
    log.rank.set(rank);
    log.switching.set(true);
    log.next.set(None);
    log.complete.set(false);
    spawn_local(async move {
        let result = api::workload_logs(id, None, Some(rank)).await;
        if log.rank.try_get_untracked() != Some(rank) {
            return;
        }
        log.head_hidden.try_set(true);
        match result {
            Ok(slice) => {
                let mut shown = String::new();
                if slice.offset > slice.start {
                    shown.push_str("[… earlier output: download the log for all of it …]\n");
                }
                shown.push_str(&slice.text);
                log.more.try_set(shown);
                log.next.try_set(Some(slice.next));
                log.complete.try_set(slice.complete);
                scroll_to_bottom(log.pre);
            }
            Err(e) => {
                log.more.try_set(format!(
                    "The log of rank {rank} could not be loaded: {}\n",
                    e.error
                ));
            }
        }
        log.switching.try_set(false);
    });
}

/// Adds a polled slice to the log view, scrolling along when the reader is at its end.
fn append_log(log: LogState, from: u64, slice: &LogSlice) {
    let stick = at_bottom(log.pre);
    let mut add = String::new();
    if slice.offset > from {
        add.push_str(&format!(
            "[… {} bytes of older output were dropped …]\n",
            slice.offset - from
        ));
    }
    add.push_str(&slice.text);
    if !add.is_empty() {
        log.more.try_update(|m| {
            m.push_str(&add);
            if m.len() > LOG_SHOWN_MAX {
                let mut cut = m.len() - LOG_SHOWN_MAX / 2;
                while !m.is_char_boundary(cut) {
                    cut += 1;
                }
                m.replace_range(
                    ..cut,
                    "[… earlier output is not shown here; download the log for all of it …]\n",
                );
            }
        });
        if log
            .more
            .with_untracked(|m| m.starts_with("[… earlier output"))
        {
            log.head_hidden.try_set(true);
        }
    }
    log.next.try_set(Some(slice.next));
    if slice.complete {
        log.complete.try_set(true);
    }
    if stick && !add.is_empty() {
        scroll_to_bottom(log.pre);
    }
}

#[component]
fn WorkloadDetail(data: DetailData) -> impl IntoView {
    let DetailData { workload, log, .. } = data;
    view! {
        <Transition fallback=Loading>
            {move || Suspend::new(async move {
                let w = workload.await;
                let head = log.head.await;
                match w {
                    Ok(first) => view! { <WorkloadOverview first head data /> }.into_any(),
                    Err(e) => {
                        view! {
                            <h1>"Workload"</h1>
                            <Problem error=e.error />
                        }
                            .into_any()
                    }
                }
            })}
        </Transition>
    }
}

/// Pending → Starting → Running, and how it ended.
fn steps_view(v: &WorkloadView) -> impl IntoView + use<> {
    // A workload with a GPU request of its own first waits for that GPU.
    let mut order = Vec::new();
    if v.owns_allocation {
        order.push(WorkloadState::Queued);
    }
    order.extend([
        WorkloadState::Pending,
        WorkloadState::Starting,
        WorkloadState::Running,
    ]);
    let at = |s: WorkloadState| order.iter().position(|o| *o == s).unwrap_or(0);
    let reached = match v.state {
        s @ (WorkloadState::Queued
        | WorkloadState::Pending
        | WorkloadState::Starting
        | WorkloadState::Running) => at(s),
        _ if v.ready_at.is_some() => at(WorkloadState::Running),
        _ if v.started_at.is_some() => at(WorkloadState::Starting),
        _ if v.hostname.is_some() => at(WorkloadState::Pending),
        _ => 0,
    };
    let live = v.state.is_live() && v.state != WorkloadState::Stopping;
    let steps = order
        .iter()
        .copied()
        .enumerate()
        .map(|(i, s)| {
            // A running notebook has arrived; a running job is still at work.
            let arrived = v.state == WorkloadState::Running && v.kind == WorkloadKind::Notebook;
            let class = if i < reached || (i == reached && (!live || arrived)) {
                "done"
            } else if i == reached {
                "current"
            } else {
                "todo"
            };
            let current = (live && i == reached).then_some("step");
            view! {
                <li class=class aria-current=current>
                    {s.label()}
                </li>
            }
        })
        .collect_view();
    let end = (!live).then(|| {
        let class = match v.state {
            WorkloadState::Stopping => "current",
            WorkloadState::Succeeded | WorkloadState::Stopped => "done",
            WorkloadState::Cancelled => "done muted",
            _ => "failed",
        };
        view! {
            <li class=class aria-current=(v.state == WorkloadState::Stopping).then_some("step")>
                {v.state.label()}
            </li>
        }
    });
    let waiting = (v.state == WorkloadState::Queued).then(|| {
        let why = v
            .waiting
            .clone()
            .unwrap_or_else(|| "It waits for its GPU.".to_owned());
        view! {
            <p class="hint" data-testid="waiting" aria-live="polite">
                {why} " " <a href=format!("/allocations/{}", v.allocation_id)>"See its GPU request"</a>
            </p>
        }
    });
    view! {
        <ol class="steps" data-testid="steps" aria-label="Progress">
            {steps}
            {end}
        </ol>
        {waiting}
    }
}

/// Idle reclaim of a running notebook: both signals and what happens next.
fn idle_view(v: &WorkloadView) -> impl IntoView + use<> {
    let a = v.activity.unwrap_or_default();
    let kernel = if a.kernel_busy {
        view! { <strong>"busy now"</strong> }.into_any()
    } else {
        match a.kernel_last_activity {
            Some(t) => view! { <When t /> }.into_any(),
            None => view! { <span class="hint">"no activity reported yet"</span> }.into_any(),
        }
    };
    let gpu = if !a.gpu_has_data {
        view! {
            <span class="hint" data-testid="no-gpu-telemetry">
                "no GPU telemetry (the kernel alone decides)"
            </span>
        }
        .into_any()
    } else {
        match a.gpu_last_busy {
            Some(t) => view! { <When t /> }.into_any(),
            None => view! { <span class="hint">"not busy lately"</span> }.into_any(),
        }
    };
    let (key, decision) = match v.idle {
        Some(IdleDecision::Active { idle_since }) => {
            let quiet = now() - idle_since;
            let text = if quiet < chrono::Duration::minutes(1) {
                "in use".to_owned()
            } else {
                format!("quiet since {}", relative(idle_since, now()))
            };
            (
                "active",
                view! {
                    <span class="badge ok">"Active"</span>
                    " "
                    <span title=timestamp(idle_since)>{text}</span>
                }
                .into_any(),
            )
        }
        Some(IdleDecision::Warn { stop_at, .. }) => (
            "warn",
            view! {
                <span class="badge warn">"Idle"</span>
                " "
                <strong>
                    {format!("Will be stopped at {} unless used", stop_at.format("%H:%M UTC"))}
                </strong>
                " ("
                <When t=stop_at />
                "). Run a cell or use the GPU to keep it."
            }
            .into_any(),
        ),
        Some(IdleDecision::Reclaim { .. }) => (
            "reclaim",
            view! {
                <span class="badge danger">"Reclaiming"</span>
                " idle too long: it is being stopped and its GPU released."
            }
            .into_any(),
        ),
        None => (
            "unknown",
            view! { <span class="hint">"not decided yet"</span> }.into_any(),
        ),
    };
    view! {
        <section class="idle-panel" data-testid="idle-panel" aria-label="Idle reclaim">
            <h2>"Idle reclaim"</h2>
            <p class="hint">
                "A notebook whose kernel and GPU both stay quiet is stopped and its GPU released."
            </p>
            <dl class="facts row">
                <div>
                    <dt>"Kernel last activity"</dt>
                    <dd data-testid="kernel-activity">{kernel}</dd>
                </div>
                <div>
                    <dt>"GPU last busy"</dt>
                    <dd data-testid="gpu-busy">{gpu}</dd>
                </div>
            </dl>
            <p class="idle-decision" data-testid="idle-decision" data-decision=key>
                {decision}
            </p>
        </section>
    }
}

fn time_or_dash(t: Option<chrono::DateTime<chrono::Utc>>) -> AnyView {
    match t {
        Some(t) => view! {
            <When t />
            " · "
            {timestamp(t)}
        }
        .into_any(),
        None => "—".into_any(),
    }
}

#[component]
fn WorkloadOverview(
    first: WorkloadView,
    head: Result<LogSlice, UiError>,
    data: DetailData,
) -> impl IntoView {
    let DetailData {
        polled, stop, log, ..
    } = data;
    let wid = first.id;
    let kind = first.kind;
    let initial = first.clone();
    let cur = Memo::new(move |_| {
        polled
            .get()
            .filter(|v| v.id == wid)
            .unwrap_or_else(|| initial.clone())
    });
    let state = Memo::new(move |_| cur.with(|v| v.state));
    let url = Memo::new(move |_| cur.with(|v| v.url.clone()));
    let back = match kind {
        WorkloadKind::Notebook => view! {
            <a class="back" href="/notebooks">
                "← Notebooks"
            </a>
        },
        WorkloadKind::Job => view! {
            <a class="back" href="/jobs">
                "← Jobs"
            </a>
        },
    };
    let id = wid.to_string();
    let name = first.name.clone();
    let open = move || {
        url.get().map(|url| {
            view! {
                <a
                    class="button primary"
                    href=url
                    target="_blank"
                    rel="noopener"
                    data-testid="open-notebook"
                >
                    "Open JupyterLab"
                </a>
            }
        })
    };
    let starting_hint = move || {
        (kind == WorkloadKind::Notebook
            && matches!(
                state.get(),
                WorkloadState::Pending | WorkloadState::Starting
            ))
        .then(|| {
            view! {
                <p class="hint" role="status" data-testid="starting-hint">
                    "JupyterLab is starting; this page follows it. It usually takes a few seconds."
                </p>
            }
        })
    };
    let stop_id = id.clone();
    let stop_name = name.clone();
    let stop_button = move || {
        let s = state.get();
        (s.is_live() && s != WorkloadState::Stopping).then(|| {
            view! {
                <StopButton id=stop_id.clone() kind name=stop_name.clone() action=stop />
            }
        })
    };
    let message = move || {
        cur.with(|v| v.message.clone()).map(|m| {
            let failed = matches!(state.get(), WorkloadState::Failed | WorkloadState::Lost);
            view! {
                <div
                    class=if failed { "form-error" } else { "notice muted" }
                    role="status"
                    data-testid="workload-message"
                >
                    {m}
                </div>
            }
        })
    };
    let idle = move || {
        (kind == WorkloadKind::Notebook && state.get() == WorkloadState::Running)
            .then(|| cur.with(idle_view))
    };
    let job_facts = (kind == WorkloadKind::Job).then(|| {
        let workdir = if first.workdir.is_empty() {
            "the workspace's top folder".to_owned()
        } else {
            first.workdir.clone()
        };
        view! {
            <div>
                <dt>"Exit code"</dt>
                <dd data-testid="exit-code">
                    {move || {
                        cur.with(|v| v.exit_code)
                            .map(|c| c.to_string())
                            .unwrap_or_else(|| "—".to_owned())
                    }}
                </dd>
            </div>
            <div>
                <dt>"Attempt"</dt>
                <dd data-testid="attempt">
                    {move || {
                        cur.with(|v| tessera_domain::workload::attempt_label(v.attempt, v.retries))
                    }}
                </dd>
            </div>
            <div>
                <dt>"Working folder"</dt>
                <dd>{workdir}</dd>
            </div>
        }
    });
    let command = (kind == WorkloadKind::Job).then(|| {
        view! {
            <h2>"Command"</h2>
            <pre class="command" data-testid="command">
                {first.command.clone()}
            </pre>
        }
    });
    // Values may be secrets: the page names the variables only.
    let env = (!first.env.is_empty()).then(|| {
        let names = first
            .env
            .iter()
            .map(|e| e.name.clone())
            .collect::<Vec<_>>()
            .join(", ");
        view! {
            <p class="hint" data-testid="env-names">
                "Environment: "
                <code>{names}</code>
                " (values not shown)"
            </p>
        }
    });
    // A multi-node job: its members, and whose log is shown.
    let ranks = Memo::new(move |_| cur.with(|v| v.ranks.clone()));
    let ranks_section = move || ranks.with(|r| (!r.is_empty()).then(|| ranks_table(r.clone())));
    let rank_choices = Memo::new(move |_| {
        ranks.with(|rs| {
            rs.iter()
                .map(|r| (r.rank, r.hostname.clone()))
                .collect::<Vec<_>>()
        })
    });
    let rank_id = id.clone();
    let rank_select = move || {
        let choices = rank_choices.get();
        (choices.len() > 1).then(|| {
            let shown = log.rank.get_untracked();
            let options = choices
                .into_iter()
                .map(|(rank, host)| {
                    view! {
                        <option value=rank.to_string() selected=rank == shown>
                            {format!("Rank {rank} · {host}")}
                        </option>
                    }
                })
                .collect_view();
            let id = rank_id.clone();
            view! {
                <div class="log-rank">
                    <label for="log-rank">"Show the log of"</label>
                    <select
                        id="log-rank"
                        data-testid="log-rank"
                        prop:value=move || log.rank.get().to_string()
                        on:change=move |ev| {
                            let rank = event_target_value(&ev).parse().unwrap_or(0);
                            switch_rank(log, id.clone(), rank);
                        }
                    >
                        {options}
                    </select>
                </div>
            }
        })
    };
    // The download is the shown member's own log.
    let download_id = id.clone();
    let download = Signal::derive(move || {
        let rank = log.rank.get();
        let member = ranks.with(|rs| {
            rs.iter()
                .find(|r| r.rank == rank && rank != 0)
                .map(|r| r.id.to_string())
        });
        format!(
            "/api/v1/workloads/{}/log.txt",
            member.unwrap_or_else(|| download_id.clone())
        )
    });
    let log_view = view! { <LogView head log download /> };
    let log_section = match kind {
        WorkloadKind::Job => view! {
            <h2>"Log"</h2>
            {rank_select}
            {log_view}
        }
        .into_any(),
        WorkloadKind::Notebook => view! {
            <details
                class="log-details"
                open=move || matches!(state.get(), WorkloadState::Failed | WorkloadState::Lost)
            >
                <summary>"JupyterLab log"</summary>
                {log_view}
            </details>
        }
        .into_any(),
    };
    view! {
        {back}
        <section
            class="workload-detail"
            data-testid="workload-detail"
            data-kind=kind.as_str()
            data-state=move || state.get().as_str()
            data-id=id.clone()
        >
            <h1>
                <span class="hint">{kind_label(kind)}</span>
                {name.clone()}
                {move || view! { <WorkloadBadge state=state.get() /> }}
            </h1>
            {move || cur.with(steps_view)}
            {starting_hint}
            {message}
            {move || cur.with(|v| v.pull).map(|p| view! { <PullProgress pull=p /> })}
            <div class="buttons">{open} {stop_button}</div>
            {stop_error(stop)}
            <dl class="facts row">
                <div>
                    <dt>"Team"</dt>
                    <dd>
                        <a href=format!("/teams/{}", first.team_id)>{first.team_name.clone()}</a>
                    </dd>
                </div>
                <div>
                    <dt>"User"</dt>
                    <dd>{first.username.clone()}</dd>
                </div>
                <div>
                    <dt>"Allocation"</dt>
                    <dd>
                        <a href=format!("/allocations/{}", first.allocation_id)>"see allocation"</a>
                    </dd>
                </div>
                <div>
                    <dt>"Node"</dt>
                    <dd data-testid="node">{first.hostname.clone().unwrap_or_else(|| "—".to_owned())}</dd>
                </div>
                <div>
                    <dt>"Device"</dt>
                    <dd data-testid="device">
                        {match first.device.clone() {
                            Some(d) => view! { <code class="uuid">{d}</code> }.into_any(),
                            None => "—".into_any(),
                        }}
                    </dd>
                </div>
                <div>
                    <dt>"Environment"</dt>
                    <dd data-testid="image">{image_view(first.image.as_deref())}</dd>
                </div>
                {job_facts}
            </dl>
            <dl class="facts row">
                <div>
                    <dt>"Created"</dt>
                    <dd>{move || time_or_dash(cur.with(|v| Some(v.created_at)))}</dd>
                </div>
                <div>
                    <dt>"Started"</dt>
                    <dd>{move || time_or_dash(cur.with(|v| v.started_at))}</dd>
                </div>
                {(kind == WorkloadKind::Notebook)
                    .then(|| {
                        view! {
                            <div>
                                <dt>"Ready"</dt>
                                <dd>{move || time_or_dash(cur.with(|v| v.ready_at))}</dd>
                            </div>
                        }
                    })}
                <div>
                    <dt>"Ended"</dt>
                    <dd>{move || time_or_dash(cur.with(|v| v.ended_at))}</dd>
                </div>
            </dl>
            {ranks_section}
            {env}
            {idle}
            {command}
            <Attempts attempts=first.attempts.clone() />
            {log_section}
        </section>
    }
}

/// The image a workload runs in, shortened (the full pinned reference in its title), or
/// the node's environment.
fn image_view(image: Option<&str>) -> AnyView {
    match image {
        Some(i) => view! { <code title=i.to_owned()>{short_pinned(i)}</code> }.into_any(),
        None => "Node environment".into_any(),
    }
}

/// "Pulling image 43 %" with a progress bar, while the node pulls the workload's image
/// (it follows the page's refresh).
#[component]
fn PullProgress(pull: tessera_domain::workload::PullView) -> impl IntoView {
    let label = pull.label();
    // No total yet: an indeterminate bar (no `value`).
    let known = pull.total_bytes > 0;
    let max = pull.total_bytes.max(1).to_string();
    let value = known.then(|| pull.done_bytes.min(pull.total_bytes).to_string());
    view! {
        <div class="notice muted pull" role="status" data-testid="pull-progress">
            <span>{label.clone()}</span>
            " "
            <progress max=max value=value aria-label=label></progress>
        </div>
    }
}

/// A job's earlier attempts and how each ended (a retry after a failure, a requeue after a
/// preemption, with the GPU time the preemption cost); nothing for a first attempt.
#[component]
fn Attempts(attempts: Vec<tessera_domain::workload::AttemptView>) -> impl IntoView {
    (!attempts.is_empty()).then(|| {
        let rows = attempts
            .into_iter()
            .map(|a| {
                let how = if a.preempted {
                    format!("Preempted: {}", a.reason)
                } else {
                    a.reason.clone()
                };
                view! {
                    <tr data-testid="attempt-row">
                        <td>{a.attempt}</td>
                        <td>{a.hostname.clone()}</td>
                        <td>{time_or_dash(a.started_at)}</td>
                        <td>{time_or_dash(Some(a.ended_at))}</td>
                        <td>{how}</td>
                        <td>{format!("{} GPU-h", tessera_domain::billing::gpu_hours(a.gpu_ms))}</td>
                    </tr>
                }
            })
            .collect_view();
        view! {
            <section aria-labelledby="attempts-title">
                <h2 id="attempts-title">"Earlier attempts"</h2>
                <table class="list" data-testid="attempts">
                    <thead>
                        <tr>
                            <th scope="col">"Attempt"</th>
                            <th scope="col">"Node"</th>
                            <th scope="col">"Started"</th>
                            <th scope="col">"Ended"</th>
                            <th scope="col">"How it ended"</th>
                            <th scope="col">"GPU time"</th>
                        </tr>
                    </thead>
                    <tbody>{rows}</tbody>
                </table>
            </section>
        }
    })
}

/// A multi-node job's members: where each runs and how it stands.
fn ranks_table(ranks: Vec<tessera_domain::workload::RankView>) -> impl IntoView {
    let rows = ranks
        .into_iter()
        .map(|r| {
            let devices = r
                .devices
                .iter()
                .map(|d| view! { <code class="uuid">{d.clone()}</code> " " })
                .collect_view();
            view! {
                <tr
                    data-testid="rank-row"
                    data-rank=r.rank.to_string()
                    data-node=r.hostname.clone()
                    data-state=r.state.as_str()
                >
                    <td>{r.rank}</td>
                    <td>{r.hostname.clone()}</td>
                    <td>{devices}</td>
                    <td>{r.addr.clone().unwrap_or_else(|| "—".to_owned())}</td>
                    <td>
                        <WorkloadBadge state=r.state />
                    </td>
                    <td>{r.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "—".to_owned())}</td>
                    <td>{r.message.clone().unwrap_or_default()}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <section aria-labelledby="ranks-title">
            <h2 id="ranks-title">"Ranks"</h2>
            <table class="list" data-testid="ranks">
                <thead>
                    <tr>
                        <th scope="col">"Rank"</th>
                        <th scope="col">"Node"</th>
                        <th scope="col">"Devices"</th>
                        <th scope="col">"Address"</th>
                        <th scope="col">"State"</th>
                        <th scope="col">"Exit code"</th>
                        <th scope="col">"Message"</th>
                    </tr>
                </thead>
                <tbody>{rows}</tbody>
            </table>
        </section>
    }
}

/// The log: the tail loaded with the page, then whatever the poll appends.
#[component]
fn LogView(
    head: Result<LogSlice, UiError>,
    log: LogState,
    /// Where "Download log" points (the shown rank's log).
    download: Signal<String>,
) -> impl IntoView {
    let download = view! {
        <a
            class="download"
            href=move || download.get()
            download
            data-testid="download-log"
        >
            "Download log"
        </a>
    };
    match head {
        Ok(slice) => {
            let mut shown = String::new();
            if slice.offset > slice.start {
                shown.push_str("[… earlier output: download the log for all of it …]\n");
            }
            shown.push_str(&slice.text);
            let head_empty = shown.is_empty();
            let text = StoredValue::new(shown);
            let empty =
                move || head_empty && !log.head_hidden.get() && log.more.with(String::is_empty);
            view! {
                // One text node: the head, then what the poll appended.
                <pre class="log" data-testid="log" node_ref=log.pre aria-live="off">
                    {move || {
                        let mut all = if log.head_hidden.get() {
                            String::new()
                        } else {
                            text.get_value()
                        };
                        log.more.with(|m| all.push_str(m));
                        all
                    }}
                </pre>
                <p class="log-foot">
                    {move || {
                        if log.complete.get() {
                            view! { <span class="hint" data-testid="log-complete">"End of output."</span> }
                                .into_any()
                        } else {
                            view! { <span class="hint" data-testid="log-live">"Live: new output appears here."</span> }
                                .into_any()
                        }
                    }}
                    " "
                    {download}
                    {move || empty().then(|| view! { <span class="hint">" · no output yet"</span> })}
                </p>
            }
            .into_any()
        }
        Err(e) => {
            let text = match e.error {
                AppError::Forbidden => {
                    "Only its owner, a team admin or a platform admin may read its log.".to_owned()
                }
                other => format!("The log could not be loaded: {other}"),
            };
            view! { <p class="hint" data-testid="log-unavailable">{text}</p> }.into_any()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "ssr")]
    fn html(view: impl IntoView + 'static) -> String {
        let owner = Owner::new();
        owner.with(|| view.to_html())
    }

    #[cfg(feature = "ssr")]
    #[test]
    fn a_pull_shows_its_percentage_and_a_progress_bar() {
        use tessera_domain::workload::PullView;
        let half =
            html(view! { <PullProgress pull=PullView { done_bytes: 43, total_bytes: 100 } /> });
        assert!(half.contains("Pulling image 43 %"), "{half}");
        assert!(
            half.contains(r#"max="100""#) && half.contains(r#"value="43""#),
            "{half}"
        );
        // The size not known yet: 0 % and a bar without a value (indeterminate).
        let unknown =
            html(view! { <PullProgress pull=PullView { done_bytes: 0, total_bytes: 0 } /> });
        assert!(unknown.contains("Pulling image 0 %"), "{unknown}");
        assert!(!unknown.contains("value="), "{unknown}");
    }

    #[cfg(feature = "ssr")]
    #[test]
    fn the_image_shows_shortened_with_the_full_reference_in_its_title() {
        let pinned = format!("ghcr.io/acme/torch@sha256:{}", "ab".repeat(32));
        let shown = html(image_view(Some(&pinned)));
        assert!(shown.contains(&format!(r#"title="{pinned}""#)), "{shown}");
        assert!(
            shown.contains("ghcr.io/acme/torch@sha256:abababababab…<"),
            "{shown}"
        );
        assert_eq!(html(image_view(None)), "Node environment");
    }

    #[test]
    fn more_than_one_node_is_a_gang() {
        assert_eq!(gang_size("2"), Some(2));
        assert_eq!(gang_size(" 4 "), Some(4));
        for one in ["", "1", "0", "-2", "two"] {
            assert_eq!(gang_size(one), None, "{one:?}");
        }
    }

    #[test]
    fn the_gang_hint_says_its_shape_and_what_each_node_gets() {
        let hint = gang_hint(2, 1);
        assert!(
            hint.starts_with("2 nodes × 1 GPU, placed all at once;"),
            "{hint}"
        );
        assert!(
            hint.contains("MASTER_ADDR, RANK, WORLD_SIZE") && hint.contains("$TESSERA_HOSTFILE"),
            "{hint}"
        );
        assert!(gang_hint(4, 8).starts_with("4 nodes × 8 GPUs"));
    }

    #[test]
    fn a_gang_waits_when_the_cluster_has_fewer_free_than_it_needs() {
        let waits = gang_fits(2, 4, Some(6), "6 free now");
        assert!(
            waits.starts_with("Waits: 6 free now; it needs 8 in all"),
            "{waits}"
        );
        assert!(gang_fits(2, 4, None, "none free now").starts_with("Waits:"));
        let may = gang_fits(2, 4, Some(8), "8 free now");
        assert!(
            may.starts_with("Fits now if 2 nodes each have 4 free"),
            "{may}"
        );
    }

    #[cfg(feature = "ssr")]
    #[test]
    fn the_ranks_table_shows_each_member_where_it_runs() {
        use tessera_domain::workload::RankView;
        // From JSON, as the server sends it (fields added later keep their defaults).
        let rank = |rank: u32,
                    host: &str,
                    state: WorkloadState,
                    exit_code: Option<i32>,
                    message: Option<&str>| {
            serde_json::from_value::<RankView>(serde_json::json!({
                "rank": rank,
                "id": uuid::Uuid::from_u128(u128::from(rank) + 1),
                "state": state,
                "hostname": host,
                "devices": [format!("GPU-{host}-0")],
                "addr": format!("10.77.0.{}", rank + 2),
                "exit_code": exit_code,
                "message": message,
            }))
            .expect("a rank view")
        };
        let table = html(ranks_table(vec![
            rank(0, "node-a", WorkloadState::Succeeded, Some(0), None),
            rank(
                1,
                "node-b",
                WorkloadState::Failed,
                Some(3),
                Some("exited with 3"),
            ),
        ]));
        for header in [
            "Rank",
            "Node",
            "Devices",
            "Address",
            "State",
            "Exit code",
            "Message",
        ] {
            assert!(table.contains(&format!(">{header}<")), "{header}: {table}");
        }
        assert!(
            table.contains(r#"data-rank="0" data-node="node-a""#)
                && table.contains(r#"data-rank="1" data-node="node-b""#),
            "{table}"
        );
        assert!(
            table.contains("GPU-node-b-0") && table.contains("10.77.0.3"),
            "{table}"
        );
        assert!(
            table.contains("exited with 3") && table.contains(">3<"),
            "{table}"
        );
    }

    #[test]
    fn the_last_new_gpu_choice_reads_back_as_written() {
        let last = LastGpu {
            gpu: "H100-80GB:1g.10gb".to_owned(),
            count: "2".to_owned(),
            hours: String::new(),
        };
        assert_eq!(LastGpu::decode(&last.encode()), Some(last));
    }

    #[test]
    fn a_damaged_last_choice_is_ignored() {
        for text in [
            "",
            "H100-80GB",
            "H100-80GB\n1",
            "\n1\n2",
            "H100-80GB\n0\n2",
            "H100-80GB\n1\nlots",
            "H100-80GB\n1\n2\nmore",
        ] {
            assert_eq!(LastGpu::decode(text), None, "{text:?}");
        }
    }

    #[test]
    fn only_a_new_gpu_is_remembered() {
        let some = |v: &str| Some(v.to_owned());
        assert_eq!(
            LastGpu::of(api::NEW_GPU, &some("A100-40GB"), &some(" 2 "), &None),
            Some(LastGpu {
                gpu: "A100-40GB".to_owned(),
                count: "2".to_owned(),
                hours: String::new(),
            })
        );
        let allocation = "0b0e4c7e-0000-4000-8000-000000000000";
        assert_eq!(
            LastGpu::of(allocation, &some("A100-40GB"), &None, &None),
            None
        );
    }
}
