//! One workload at a glance: progress, idle reclaim, image, attempts, ranks.

use super::*;

/// Pending → Starting → Running, and how it ended.
pub(super) fn steps_view(v: &WorkloadView) -> impl IntoView + use<> {
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
pub(super) fn idle_view(v: &WorkloadView) -> impl IntoView + use<> {
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

pub(super) fn time_or_dash(t: Option<chrono::DateTime<chrono::Utc>>) -> AnyView {
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
pub(super) fn WorkloadOverview(
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
    // Those who may read the log may also run commands in the workload.
    let readable = head.is_ok();
    let terminal_id = id.clone();
    let terminal = move || {
        (readable && state.get() == WorkloadState::Running).then(|| {
            view! { <Terminal id=terminal_id.clone() ranks=rank_choices /> }
        })
    };
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
            {terminal}
            {log_section}
        </section>
    }
}

/// The image a workload runs in, shortened (the full pinned reference in its title), or
/// the node's environment.
pub(super) fn image_view(image: Option<&str>) -> AnyView {
    match image {
        Some(i) => view! { <code title=i.to_owned()>{short_pinned(i)}</code> }.into_any(),
        None => "Node environment".into_any(),
    }
}

/// "Pulling image 43 %" with a progress bar, while the node pulls the workload's image
/// (it follows the page's refresh).
#[component]
pub(super) fn PullProgress(pull: tessera_domain::workload::PullView) -> impl IntoView {
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
pub(super) fn Attempts(attempts: Vec<tessera_domain::workload::AttemptView>) -> impl IntoView {
    (!attempts.is_empty()).then(|| {
        let rows = attempts
            .into_iter()
            .map(|a| {
                let how = if a.end.preempted {
                    format!("Preempted: {}", a.end.reason)
                } else {
                    a.end.reason.clone()
                };
                view! {
                    <tr data-testid="attempt-row">
                        <td>{a.attempt}</td>
                        <td>{a.end.hostname.clone()}</td>
                        <td>{time_or_dash(a.end.started_at)}</td>
                        <td>{time_or_dash(Some(a.end.ended_at))}</td>
                        <td>{how}</td>
                        <td>{format!("{} GPU-h", tessera_domain::billing::gpu_hours(a.end.gpu_ms))}</td>
                    </tr>
                }
            })
            .collect_view();
        let columns = Columns::new(
            "attempts",
            &[
                "Attempt",
                "Node",
                "Started",
                "Ended",
                "How it ended",
                "GPU time",
            ],
        )
        .scoped(&[]);
        view! {
            <section aria-labelledby="attempts-title">
                <h2 id="attempts-title">"Earlier attempts"</h2>
                {list_table(&columns, rows)}
            </section>
        }
    })
}

/// The columns of [`ranks_table`].
pub(super) const RANK_HEADERS: &[&str] = &[
    "Rank",
    "Node",
    "Devices",
    "Address",
    "State",
    "Exit code",
    "Message",
];

/// A multi-node job's members: where each runs and how it stands.
pub(super) fn ranks_table(ranks: Vec<tessera_domain::workload::RankView>) -> impl IntoView {
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
    let columns = Columns::new("ranks", RANK_HEADERS).scoped(&[]);
    view! {
        <section aria-labelledby="ranks-title">
            <h2 id="ranks-title">"Ranks"</h2>
            {list_table(&columns, rows)}
        </section>
    }
}
