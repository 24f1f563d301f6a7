//! One workload's page, /workloads/:id: its data, the live log.

use super::*;

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
pub(super) struct LogState {
    pub(super) head: Resource<Result<LogSlice, UiError>>,
    /// Text appended since `head`.
    pub(super) more: RwSignal<String>,
    /// Whether `head` is no longer shown (dropped to keep the page light).
    pub(super) head_hidden: RwSignal<bool>,
    /// Where the next read starts (`None` until the head has loaded).
    pub(super) next: RwSignal<Option<u64>>,
    pub(super) complete: RwSignal<bool>,
    pub(super) pre: NodeRef<leptos::html::Pre>,
    /// A multi-node job: whose log is shown (0: the job itself, whose log `head` is).
    pub(super) rank: RwSignal<u32>,
    /// Another rank's log is loading (the poll waits).
    pub(super) switching: RwSignal<bool>,
}

#[derive(Clone, Copy)]
pub(super) struct DetailData {
    pub(super) workload: Resource<Result<WorkloadView, UiError>>,
    /// The newest view from the poll or a stop (replaces `workload` when it has this id).
    pub(super) polled: RwSignal<Option<WorkloadView>>,
    pub(super) stop: ServerAction<StopWorkload>,
    pub(super) log: LogState,
}

/// Whether the log view is near its end (so new output scrolls it along).
pub(super) fn at_bottom(pre: NodeRef<leptos::html::Pre>) -> bool {
    #[cfg(feature = "hydrate")]
    if let Some(el) = pre.get_untracked() {
        return el.scroll_height() - el.scroll_top() - el.client_height() < 32;
    }
    let _ = pre;
    true
}

pub(super) fn scroll_to_bottom(pre: NodeRef<leptos::html::Pre>) {
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
    pub(super) fn new() -> Self {
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
pub(super) fn switch_rank(log: LogState, id: String, rank: u32) {
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
pub(super) fn append_log(log: LogState, from: u64, slice: &LogSlice) {
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
            push_keeping_tail(
                m,
                &add,
                LOG_SHOWN_MAX,
                "[… earlier output is not shown here; download the log for all of it …]\n",
            );
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
pub(super) fn WorkloadDetail(data: DetailData) -> impl IntoView {
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

/// The log: the tail loaded with the page, then whatever the poll appends.
#[component]
pub(super) fn LogView(
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
