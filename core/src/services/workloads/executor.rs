//! The executor sync: what each node should run, and what its agent (or the Kubernetes executor) reports.

use super::*;
use tessera_domain::image::ImageRef;
use tessera_domain::wire::{ImageSpec, RegistryLogin};

/// A node's report on one of its workloads, as the pass that applies it sees it.
#[derive(Clone, Copy)]
struct Seen<'a> {
    w: &'a WorkloadRow,
    /// The state of the allocation it runs on.
    alloc: AllocState,
    rep: &'a WorkloadReport,
    now: DateTime<Utc>,
}

impl Workloads {
    /// Live workloads by kind and state, every combination present (zero included), for
    /// `/metrics`.
    pub async fn live_counts(&self) -> Result<Vec<(WorkloadKind, WorkloadState, u64)>, AppError> {
        let rows = self
            .store
            .live_workload_counts()
            .await
            .map_err(internal("counting workloads"))?;
        let mut out = Vec::new();
        for kind in [WorkloadKind::Notebook, WorkloadKind::Job] {
            for state in WorkloadState::ALL.into_iter().filter(|s| s.is_live()) {
                let n = rows
                    .iter()
                    .find(|(k, s, _)| k == kind.as_str() && s == state.as_str())
                    .map_or(0, |r| u64::try_from(r.2).unwrap_or(0));
                out.push((kind, state, n));
            }
        }
        Ok(out)
    }

    // ---- the executor protocol ----

    /// Records a node executor's reports and answers with what should run there.
    /// `from` says who reports: a node's agent, whose notebook endpoints must be on the
    /// address its request came from ([`wl::endpoint_allowed`]), or the server's own
    /// Kubernetes executor (pod addresses, trusted). A malformed log piece is refused.
    pub async fn sync(
        &self,
        node: &NodeIdentity,
        from: Reporter,
        reports: &WorkloadReports,
    ) -> Result<WorkloadSync, AppError> {
        let now = self.clock.now();
        let rows = self.node_rows(node.id, now).await?;
        let by_run: HashMap<String, &WorkloadListRow> =
            rows.iter().map(|r| (run_id(&r.w), r)).collect();
        let mut acks = Vec::new();
        for rep in &reports.workloads {
            let Some(row) = by_run.get(&rep.id) else {
                continue;
            };
            let w = &row.w;
            let alloc = row.alloc_state;
            if let Some(p) = &rep.log
                && !wl::log_piece_valid(p.offset, p.len, &p.text)
            {
                return Err(AppError::invalid(
                    "log",
                    format!(
                        "workload {}: a log piece's len must be its text's length in bytes",
                        rep.id
                    ),
                ));
            }
            let mut rep = rep.clone();
            if let (Some(e), Reporter::Agent(peer)) = (&rep.endpoint, from)
                && !wl::endpoint_allowed(e, peer)
            {
                tracing::warn!(node = %node.id, workload = rep.id, endpoint = e, ?peer,
                    "ignoring a notebook endpoint that is not the node's own address");
                rep.endpoint = None;
            }
            let rep = &rep;
            let mut stored = u64::try_from(w.log_stored - w.log_base).unwrap_or(0);
            if let Some(piece) = &rep.log {
                stored = self
                    .store
                    .append_log(
                        w.id,
                        piece.offset,
                        piece.len,
                        &piece.text,
                        rep.log_complete,
                        self.cfg.log_cap,
                    )
                    .await
                    .map_err(internal("storing log"))?;
            } else if rep.log_complete {
                self.store
                    .close_log(w.id)
                    .await
                    .map_err(internal("closing log"))?;
            }
            acks.push(LogAck {
                id: rep.id.clone(),
                stored_through: stored,
            });
            let pull = rep.pull.map(|p| {
                (
                    i64::try_from(p.done_bytes).unwrap_or(i64::MAX),
                    i64::try_from(p.total_bytes).unwrap_or(i64::MAX),
                )
            });
            if pull != w.pull_done.zip(w.pull_total) {
                self.store
                    .set_pull_progress(w.id, pull)
                    .await
                    .map_err(internal("storing pull progress"))?;
            }
            self.apply_report(Seen { w, alloc, rep, now }).await?;
            self.gang_report(w, rep, from).await?;
            if w.gang_size.is_some()
                && matches!(
                    rep.phase,
                    WorkloadPhase::Exited | WorkloadPhase::FailedToStart
                )
            {
                let members = self.members_now(w.gang_job.unwrap_or(w.id)).await?;
                self.settle_gang(&members).await?;
            }
        }
        // Reports may have moved workloads on: read again (not for an idle node).
        let rows = if acks.is_empty() {
            rows
        } else {
            self.node_rows(node.id, now).await?
        };
        // Shares carry their limits: how the GPU is shared comes from its desired state.
        let shared: HashMap<String, ShareMethod> = if rows.iter().any(|r| is_share(&r.alloc_kind)) {
            self.store
                .desired_for_node(node.id)
                .await
                .map_err(internal("loading desired state"))?
                .into_iter()
                .filter_map(|d| Some((d.gpu_uuid, d.sharing?)))
                .collect()
        } else {
            HashMap::new()
        };
        // Registry logins go only with a workload that may still pull its image (not yet
        // running), and only its own team's.
        let mut logins: HashMap<(TeamId, String), Option<RegistryLogin>> = HashMap::new();
        for r in &rows {
            let w = &r.w;
            if !matches!(w.state, WorkloadState::Pending | WorkloadState::Starting) {
                continue;
            }
            let Some(image) = w.image.as_deref().and_then(|i| ImageRef::parse(i).ok()) else {
                continue;
            };
            let key = (w.team_id, image.registry().to_owned());
            if let std::collections::hash_map::Entry::Vacant(e) = logins.entry(key) {
                let login = self.images.login(e.key().0.0, &e.key().1).await?;
                e.insert(login);
            }
        }
        let gangs = self.gangs_of(&rows).await?;
        let workloads = rows
            .iter()
            .map(|r| self.spec(r, &shared, &logins, &gangs))
            .collect::<Result<_, _>>()?;
        Ok(WorkloadSync {
            workloads,
            execs: Vec::new(),
            log_acks: acks,
        })
    }

    async fn node_rows(
        &self,
        node: NodeId,
        now: DateTime<Utc>,
    ) -> Result<Vec<WorkloadListRow>, AppError> {
        self.store
            .node_workloads(node, now - Duration::minutes(10))
            .await
            .map_err(internal("loading node workloads"))
    }

    /// What `r` should be on its node; Internal when its secrets do not open (a notebook
    /// is never started without its token).
    fn spec(
        &self,
        r: &WorkloadListRow,
        shared: &HashMap<String, ShareMethod>,
        logins: &HashMap<(TeamId, String), Option<RegistryLogin>>,
        gangs: &super::gang::Members,
    ) -> Result<WorkloadSpec, AppError> {
        let w = &r.w;
        let kind = w.kind;
        let state = w.state;
        let alloc_active = r.alloc_state == AllocState::Active;
        let now = self.clock.now();
        // A stop that warns first keeps it running, told, until its deadline.
        let warned_stop = state == WorkloadState::Stopping
            && r.deadline_cause == Some(DeadlineCause::Stop)
            && r.deadline_at.is_some_and(|d| d > now);
        let run = alloc_active
            && (warned_stop
                || matches!(
                    state,
                    WorkloadState::Pending | WorkloadState::Starting | WorkloadState::Running
                ));
        let base = wl::notebook_base_path(&r.username, &w.name);
        let argv = match kind {
            WorkloadKind::Notebook => self
                .cfg
                .notebook_command
                .split_whitespace()
                .map(|a| a.replace("{base_path}", &base))
                .collect(),
            WorkloadKind::Job if gang::per_gpu(w) => {
                tessera_domain::alloc::per_gpu_argv(&w.command)
            }
            WorkloadKind::Job => vec!["/bin/sh".into(), "-c".into(), w.command.clone()],
        };
        let devices = &w.devices;
        let share = is_share(&r.alloc_kind);
        let mut env = self.env_of(w)?;
        // The deadline channel: which signal warns it (opt-in, docs/operations.md), and
        // which attempt this is (a requeued job resumes in the same workspace).
        let signal = env
            .iter()
            .find(|v| v.name == tessera_domain::drain::SIGNAL_VAR)
            .and_then(|v| tessera_domain::drain::signal_of(&v.value))
            .unwrap_or_default();
        env.retain(|v| v.name != tessera_domain::drain::ATTEMPT_VAR);
        // A gang member: its launch environment first (the job's own variables may
        // override the frameworks' ports; `TESSERA_*` they cannot set).
        let gang = self.gang_spec(w, gangs)?;
        if let Some((_, launch)) = &gang {
            let own = std::mem::take(&mut env);
            env = launch.clone();
            env.extend(own);
        }
        env.push(tessera_domain::workload::EnvVar {
            name: tessera_domain::drain::ATTEMPT_VAR.to_owned(),
            value: w.attempt.to_string(),
        });
        Ok(WorkloadSpec {
            id: run_id(w),
            kind,
            run,
            argv,
            env,
            devices: devices.iter().map(device_uuid).collect(),
            workspace: w.team_id.to_string(),
            workdir: w.workdir.clone(),
            // A gang's secret travels in `gang`, never as a notebook token.
            token: if gang.is_some() {
                None
            } else {
                self.notebook_token(w)?
            },
            base_path: (kind == WorkloadKind::Notebook).then_some(base),
            allocation_id: w.allocation_id.to_string(),
            resources: if share {
                vec![wl::SHARED_GPU_RESOURCE.to_owned()]
            } else {
                devices
                    .iter()
                    .map(|d| wl::device_resource(d.profile.as_deref()))
                    .collect()
            },
            share: share_limits(&r.alloc_kind, devices, shared, self.allocations.catalog()),
            deadline: run.then(|| deadline_of(r, signal, now)).flatten(),
            image: w.image.as_ref().map(|reference| ImageSpec {
                reference: reference.clone(),
                requires_cuda: w
                    .image_cuda
                    .as_deref()
                    .and_then(|c| tessera_domain::image::CudaVersion::parse(c).ok()),
                login: ImageRef::parse(reference)
                    .ok()
                    .and_then(|i| logins.get(&(w.team_id, i.registry().to_owned())).cloned())
                    .flatten(),
            }),
            gang: gang.map(|(spec, _)| spec),
        })
    }

    async fn step(
        &self,
        w: &WorkloadRow,
        to: WorkloadState,
        change: WorkloadChange,
    ) -> Result<bool, AppError> {
        let from = w.state;
        if !from.can_transition(to) {
            return Ok(false);
        }
        let moved = self
            .store
            .workload_step(w.id, from.as_str(), to.as_str(), &change, self.clock.now())
            .await
            .map_err(internal("updating workload"))?;
        if moved && to.is_terminal() {
            // Its allocation may be freed (a job that owned it), and queued work may
            // start: the scheduler looks at once.
            self.allocations.changed().notify_one();
        }
        Ok(moved)
    }

    async fn apply_report(&self, seen: Seen<'_>) -> Result<(), AppError> {
        let Seen { w, rep, now, .. } = seen;
        let state = w.state;
        let activity = rep
            .kernel_last_activity_ms
            .and_then(DateTime::<Utc>::from_timestamp_millis);
        self.store
            .workload_seen(
                w.id,
                now,
                rep.endpoint.as_deref(),
                activity,
                rep.kernel_busy,
            )
            .await
            .map_err(internal("recording workload report"))?;
        if !state.is_live() {
            return Ok(());
        }
        match rep.phase {
            WorkloadPhase::Starting => {
                if state == WorkloadState::Pending {
                    self.step(
                        w,
                        WorkloadState::Starting,
                        WorkloadChange {
                            started_at: Some(now),
                            ..WorkloadChange::default()
                        },
                    )
                    .await?;
                }
            }
            WorkloadPhase::Running => {
                if matches!(state, WorkloadState::Pending | WorkloadState::Starting) {
                    self.step(
                        w,
                        WorkloadState::Running,
                        WorkloadChange {
                            started_at: Some(now),
                            ready_at: Some(now),
                            ..WorkloadChange::default()
                        },
                    )
                    .await?;
                }
            }
            // The end is recorded once all the output has arrived, so a finished
            // workload's log is whole.
            WorkloadPhase::Exited if rep.log_complete => self.on_exit(seen).await?,
            WorkloadPhase::Exited => {}
            WorkloadPhase::FailedToStart => {
                let message = Some(format!(
                    "could not start: {}",
                    rep.message.as_deref().unwrap_or("unknown error")
                ));
                let to = if state == WorkloadState::Stopping {
                    w.stop_state.unwrap_or(WorkloadState::Stopped)
                } else {
                    WorkloadState::Failed
                };
                self.step(
                    w,
                    to,
                    WorkloadChange {
                        ended_at: Some(now),
                        message,
                        ..WorkloadChange::default()
                    },
                )
                .await?;
                self.store
                    .close_log(w.id)
                    .await
                    .map_err(internal("closing log"))?;
            }
            WorkloadPhase::Lost => {
                self.mark_lost(
                    w,
                    rep.message
                        .as_deref()
                        .unwrap_or("the node's executor lost the process"),
                    now,
                )
                .await?;
            }
        }
        Ok(())
    }

    /// A process that ended, its whole log in: how its workload ends (as its stop asked,
    /// requeued after a preemption, stopped with its allocation, succeeded, retried or
    /// failed).
    async fn on_exit(&self, seen: Seen<'_>) -> Result<(), AppError> {
        let Seen { w, alloc, rep, now } = seen;
        let (kind, state) = (w.kind, w.state);
        let code = rep.exit_code.map(i64::from);
        let change = |message: Option<String>| WorkloadChange {
            // A process that ended before any report said it ran started no later
            // than now (an earlier start time is kept).
            started_at: Some(now),
            ended_at: Some(now),
            exit_code: code,
            message,
            ..WorkloadChange::default()
        };
        if state == WorkloadState::Stopping {
            let end = w.stop_state.unwrap_or(WorkloadState::Stopped);
            self.step(w, end, change(None)).await?;
            return Ok(());
        }
        if alloc == AllocState::Preempted && self.requeue(w).await? {
            return Ok(());
        }
        if alloc == AllocState::Releasing || alloc.is_terminal() {
            // The executor stopped it because its allocation ended (before this
            // server's pass asked it to): a stop, not a failure of the workload.
            let end = stop_end(w);
            if self.mark_stopping(w, allocation_gone(alloc), end).await? {
                self.store
                    .workload_step(
                        w.id,
                        "stopping",
                        end.as_str(),
                        &change(None),
                        self.clock.now(),
                    )
                    .await
                    .map_err(internal("stopping workload"))?;
            }
            return Ok(());
        }
        let mut how = match rep.exit_code {
            Some(c) => format!("exited with code {c}"),
            None => "was killed by a signal".to_owned(),
        };
        if let Some(m) = &rep.message {
            how = format!("{how} ({m})");
        }
        match kind {
            WorkloadKind::Job if rep.exit_code == Some(0) => {
                self.step(w, WorkloadState::Succeeded, change(None)).await?;
            }
            WorkloadKind::Job
                if w.gang_size.is_some()
                    && self
                        .retry_gang(w, &format!("rank 0 on {} {how}", w.hostname))
                        .await? =>
            {
                // The whole gang goes again (its other members stop with the allocation).
            }
            WorkloadKind::Job if w.attempt <= w.retries && w.gang_size.is_none() => {
                let note = format!(
                    "attempt {} {how}; retrying ({} of {} retries)",
                    w.attempt, w.attempt, w.retries
                );
                let ended = self
                    .attempt_end(
                        w,
                        rep.exit_code.map(i64::from),
                        &format!("it {how}"),
                        false,
                        self.clock.now(),
                    )
                    .await?;
                self.store
                    .workload_retry(w.id, state.as_str(), w.attempt + 1, &note, &ended)
                    .await
                    .map_err(internal("retrying job"))?;
            }
            WorkloadKind::Job => {
                self.step(
                    w,
                    WorkloadState::Failed,
                    change(Some(format!("the job {how}"))),
                )
                .await?;
            }
            WorkloadKind::Notebook if rep.exit_code == Some(0) => {
                let m = "JupyterLab shut down".to_owned();
                self.step(w, WorkloadState::Stopping, change(Some(m.clone())))
                    .await?;
                let mut again = w.clone();
                again.state = WorkloadState::Stopping;
                self.step(&again, WorkloadState::Stopped, change(Some(m)))
                    .await?;
            }
            WorkloadKind::Notebook => {
                let m = format!("JupyterLab {how}; the log shows why");
                self.step(w, WorkloadState::Failed, change(Some(m))).await?;
            }
        }
        Ok(())
    }

    pub(super) async fn mark_lost(
        &self,
        w: &WorkloadRow,
        message: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, AppError> {
        let done = self
            .step(
                w,
                WorkloadState::Lost,
                WorkloadChange {
                    ended_at: Some(now),
                    message: Some(message.into()),
                    ..WorkloadChange::default()
                },
            )
            .await?;
        if done {
            self.store
                .close_log(w.id)
                .await
                .map_err(internal("closing log"))?;
        }
        Ok(done)
    }

    // ---- the scheduler pass ----
}

/// What a running workload is told about its end (docs/operations.md, "The deadline
/// channel"): a preemption or drain deadline at once, its allocation's end ten minutes
/// before, an idle notebook's stop in its warning window, a user's stop for its grace.
/// The earliest wins.
fn deadline_of(
    r: &WorkloadListRow,
    signal: &str,
    now: DateTime<Utc>,
) -> Option<tessera_domain::drain::Deadline> {
    use tessera_domain::drain;
    let alloc = drain::deadline_for(
        r.alloc_ends_at,
        r.alloc_preempt_at,
        r.alloc_preempt_cause,
        now,
    );
    let own = match (r.deadline_at, r.deadline_cause) {
        (Some(at), Some(cause @ (DeadlineCause::Idle | DeadlineCause::Stop))) => Some((at, cause)),
        _ => None,
    };
    let (at, cause) = match (alloc, own) {
        (Some(a), Some(o)) => Some(if o.0 < a.0 { o } else { a }),
        (a, o) => a.or(o),
    }?;
    Some(drain::Deadline {
        cause,
        at,
        signal: signal.to_owned(),
        message: drain::deadline_message(cause, ""),
    })
}
