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
    Authenticated, Columns, Empty, Field, FieldInput, Loading, PAGE_SIZE, Problem, When, echoed,
    error_of, field_error, list_table, now, pager_with, relative, timestamp,
};
use crate::components::{ConfirmSubmit, MineFilter, alert, refusal};
use crate::components::{CostEstimate, EstimateInput, Topic, load_estimate, refresher};
use leptos::prelude::*;
use leptos::task::spawn_local;
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

mod detail;
mod launch;
mod list;
mod options;
mod overview;
mod own_gpu;
mod terminal;

pub use detail::WorkloadPage;
use detail::*;
use launch::*;
use list::*;
use options::*;
use overview::*;
use own_gpu::*;
use terminal::*;

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

/// Appends `add` to text shown on the page; past `max` bytes, the older half gives way to
/// `notice` (cut on a character boundary), so a long-running output stays light.
pub(super) fn push_keeping_tail(text: &mut String, add: &str, max: usize, notice: &str) {
    text.push_str(add);
    if text.len() > max {
        let mut cut = text.len() - max / 2;
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        text.replace_range(..cut, notice);
    }
}

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
            <ConfirmSubmit question testid="stop" pending=action.pending()>
                {label}
            </ConfirmSubmit>
        </ActionForm>
    }
}

/// Why a stop was refused, said plainly.
fn stop_error(action: ServerAction<StopWorkload>) -> impl IntoView {
    move || {
        error_of(action.value().get()).map(|e| {
            let forbidden = "Only its owner, a team admin or a platform admin may stop it.";
            refusal(e, forbidden, "stop-error")
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
        for header in RANK_HEADERS {
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
