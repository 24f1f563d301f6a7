//! The workload pass: starting queued workloads, stopping ones whose allocation ended, reclaiming idle notebooks, giving up on silent nodes.

use super::*;
use crate::auth::SystemActor;
use crate::store::NewEvent;
use tessera_domain::alloc::TypedRequest;
use tessera_domain::audit::AuditAction;
use tessera_domain::notify::EventKind;
use tessera_domain::workload::AttemptEnd;

impl Workloads {
    /// Moves a live workload to `stopping`; one the executor never started ends at once.
    pub(super) async fn request_stop(
        &self,
        w: &WorkloadRow,
        message: &str,
    ) -> Result<bool, AppError> {
        self.request_stop_as(w, stop_end(w), message).await
    }

    /// Moves `w` from the state it was read in to `stopping`, to end as `end` with
    /// `message`; `false` if it had moved meanwhile.
    pub(super) async fn mark_stopping(
        &self,
        w: &WorkloadRow,
        message: String,
        end: WorkloadState,
    ) -> Result<bool, AppError> {
        let change = WorkloadChange {
            message: Some(message),
            stop_state: Some(end),
            ..WorkloadChange::default()
        };
        self.store
            .workload_step(
                w.id,
                w.state.as_str(),
                WorkloadState::Stopping.as_str(),
                &change,
                self.clock.now(),
            )
            .await
            .map_err(internal("stopping workload"))
    }

    /// [`request_stop`](Self::request_stop), ending in `end` (a gang member stopped
    /// because another failed ends `failed`).
    pub(super) async fn request_stop_as(
        &self,
        w: &WorkloadRow,
        end: WorkloadState,
        message: &str,
    ) -> Result<bool, AppError> {
        let state = w.state;
        if state == WorkloadState::Queued {
            // Still waiting for its GPU: nothing runs anywhere; it ends, and so does its
            // request.
            let moved = self.end_queued(w, end, message, self.clock.now()).await?;
            if !moved {
                return Err(AppError::conflict(
                    "the workload changed meanwhile; reload and try again",
                ));
            }
            return Ok(true);
        }
        let moved = self.mark_stopping(w, message.into(), end).await?;
        if moved && state == WorkloadState::Pending {
            // Never started (as far as the server knows): it leaves the node's desired
            // set, so an executor that did start it meanwhile stops and forgets it.
            let now = self.clock.now();
            self.store
                .workload_step(
                    w.id,
                    WorkloadState::Stopping.as_str(),
                    end.as_str(),
                    &WorkloadChange {
                        ended_at: Some(now),
                        ..WorkloadChange::default()
                    },
                    self.clock.now(),
                )
                .await
                .map_err(internal("stopping workload"))?;
            self.store
                .close_log(w.id)
                .await
                .map_err(internal("closing log"))?;
        }
        if !moved {
            return Err(AppError::conflict(
                "the workload changed meanwhile; reload and try again",
            ));
        }
        self.tell_node(w.node_id);
        Ok(moved)
    }

    /// Wakes the agent of `node` (if any): what it should run changed.
    pub(super) fn tell_node(&self, node: Option<NodeId>) {
        if let Some(n) = node {
            self.allocations.signals().bump(n);
        }
    }

    /// Ends a workload still waiting for its own allocation, and that allocation's request.
    async fn end_queued(
        &self,
        w: &WorkloadRow,
        end: WorkloadState,
        message: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, AppError> {
        let moved = self
            .store
            .workload_step(
                w.id,
                WorkloadState::Queued.as_str(),
                end.as_str(),
                &WorkloadChange {
                    ended_at: Some(now),
                    message: Some(message.into()),
                    ..WorkloadChange::default()
                },
                self.clock.now(),
            )
            .await
            .map_err(internal("ending workload"))?;
        if moved {
            self.store
                .close_log(w.id)
                .await
                .map_err(internal("closing log"))?;
            if w.owns_allocation {
                let note = format!("its {} `{}` ended while waiting", w.kind.as_str(), w.name);
                self.allocations
                    .release_for_system(w.allocation_id, &note)
                    .await?;
            }
        }
        Ok(moved)
    }

    /// A queued workload whose allocation is active gets that allocation's node and devices
    /// and becomes `pending`: the node's executor starts it on its next sync.
    async fn start_queued(&self, w: &WorkloadRow) -> Result<bool, AppError> {
        let Some(alloc) = self.allocations.row(w.allocation_id).await? else {
            return Ok(false);
        };
        if w.gang_size.is_some() {
            return self.start_gang(w, &alloc.a.devices).await;
        }
        let Some((node, hostname, devices)) = node_devices(&alloc.a.devices) else {
            return Ok(false);
        };
        let placed = self
            .store
            .place_queued_workload(w.id, node, &hostname, &devices, self.clock.now())
            .await
            .map_err(internal("placing workload"))?;
        if placed {
            self.tell_node(Some(node));
        }
        Ok(placed)
    }

    /// A job whose own allocation was preempted is queued again for a new one (same kind,
    /// count, priority, time limit, team; the same quota and queue), as its next attempt,
    /// instead of ending. `false` when it cannot be (the owner left the team, the request
    /// is refused, or the workload moved on meanwhile): then it stops like any other.
    pub(super) async fn requeue(&self, w: &WorkloadRow) -> Result<bool, AppError> {
        self.requeue_as(w, None).await
    }

    /// [`requeue`](Self::requeue), for a preemption (`retry` = `None`) or a gang's retry
    /// after a member failed (`Some(why)`: the caller gives the old allocation back once
    /// the job has moved to the new one, the gang's next attempt).
    pub(super) async fn requeue_as(
        &self,
        w: &WorkloadRow,
        retry: Option<&str>,
    ) -> Result<bool, AppError> {
        if !w.owns_allocation || w.kind != WorkloadKind::Job {
            return Ok(false);
        }
        let state = w.state;
        let (Some(old), Some(user)) = (
            self.allocations.row(w.allocation_id).await?,
            self.store
                .user_by_id(w.user_id)
                .await
                .map_err(internal("loading user"))?,
        ) else {
            return Ok(false);
        };
        // A disabled owner's work ends with their allocations; nothing of theirs is queued again.
        if user.disabled {
            return Ok(false);
        }
        let Ok(username) = Username::parse(&user.username) else {
            return Ok(false);
        };
        let owner = Principal::of_user(w.user_id, username, user.is_admin);
        let req = TypedRequest {
            team_id: old.a.team_id,
            kind: old.a.kind.clone(),
            // A gang's count is the whole gang's; the request asks per node.
            count: u32::try_from(old.a.count / old.a.gang_nodes.unwrap_or(1).max(1)).unwrap_or(1),
            duration_minutes: u32::try_from(old.a.duration_minutes).ok(),
            starts_at: None,
            priority: old.a.priority,
            purpose: old.a.purpose.clone(),
            needs_cuda: old.a.needs_cuda,
            nodes: old.a.gang_nodes.and_then(|n| u32::try_from(n).ok()),
        };
        let attempt = w.attempt + 1;
        // One key per attempt: a report and a pass requeueing at once share one request.
        let key = format!("requeue:{}:{attempt}", w.id);
        // Moved to a hot spare: the job follows its allocation's replacement.
        let spare = self
            .store
            .replacement_of(w.allocation_id)
            .await
            .map_err(internal("loading replacement"))?;
        let fresh = match spare {
            Some(id) => id,
            None => match self.allocations.request(&owner, &req, Some(&key)).await {
                Ok(a) => a.id,
                Err(e) => {
                    tracing::warn!(workload = %w.id, error = %e, "a preempted job could not be queued again");
                    return Ok(false);
                }
            },
        };
        let (note, why) = match retry {
            Some(why) => (
                format!(
                    "attempt {} ended: {why}; queued again as attempt {attempt} ({} of {} retries)",
                    w.attempt, w.attempt, w.retries
                ),
                why.to_owned(),
            ),
            None => (
                format!("its GPU was preempted; queued again for a new one (attempt {attempt})"),
                old.a
                    .release_cause
                    .map_or("its allocation was preempted".to_owned(), |c| {
                        format!("its allocation was {}", c.as_str())
                    }),
            ),
        };
        let ended = self
            .attempt_end(w, None, &why, retry.is_none(), self.clock.now())
            .await?;
        // A report can move it on meanwhile (a gang's rank 0 finishing while another member's
        // failure retries the gang): while it is still this attempt on the old allocation,
        // try again from where it is now.
        let mut from = state;
        let mut moved = false;
        for _ in 0..3 {
            moved = self
                .store
                .requeue_workload(
                    w.id,
                    from.as_str(),
                    w.allocation_id,
                    fresh,
                    attempt,
                    &note,
                    &ended,
                )
                .await
                .map_err(internal("requeueing workload"))?;
            if moved {
                break;
            }
            let now = self
                .store
                .workload(w.id)
                .await
                .map_err(internal("loading workload"))?;
            match now {
                Some(r)
                    if r.w.allocation_id == w.allocation_id
                        && r.w.attempt == w.attempt
                        && r.w.state != from
                        && (matches!(
                            r.w.state,
                            WorkloadState::Pending
                                | WorkloadState::Starting
                                | WorkloadState::Running
                        ) || (retry.is_some() && r.w.state == WorkloadState::Succeeded)) =>
                {
                    from = r.w.state;
                }
                _ => break,
            }
        }
        if moved {
            // Its old node stops the run it no longer wants.
            self.tell_node(w.node_id);
            let action = if retry.is_some() {
                AuditAction::JobRetry
            } else {
                AuditAction::JobRequeue
            };
            self.audit(None, action, w.id, w.team_id, &note).await;
            return Ok(true);
        }
        // Another pass requeued it onto the same request: keep that; else give it back.
        let now_on = self
            .store
            .workload(w.id)
            .await
            .map_err(internal("loading workload"))?
            .map(|r| r.w.allocation_id);
        if now_on != Some(fresh) {
            self.allocations
                .release_for_system(fresh, "its job had moved on")
                .await?;
        }
        Ok(now_on == Some(fresh))
    }

    /// Gives back the allocations of workloads that owned them and have ended (the job
    /// exited, was cancelled or lost, the notebook stopped): metering stops with them.
    async fn release_ended_owners(&self) -> Result<u32, AppError> {
        let ended = self
            .store
            .allocations_of_ended_workloads()
            .await
            .map_err(internal("loading ended workloads"))?;
        let mut released = 0;
        for (allocation, name, state) in ended {
            let note = format!("its workload `{name}` ended ({state})");
            if self
                .allocations
                .release_for_system(allocation, &note)
                .await?
            {
                released += 1;
            }
        }
        Ok(released)
    }

    /// Stops workloads whose allocation is no longer active, reclaims idle notebooks, and
    /// gives up on workloads whose node never confirmed a stop. Idempotent. Only the
    /// platform runs it.
    pub async fn tick(
        &self,
        _: &SystemActor,
        now: DateTime<Utc>,
    ) -> Result<WorkloadTick, AppError> {
        let mut report = WorkloadTick::default();
        let rows = self
            .store
            .live_workloads()
            .await
            .map_err(internal("loading workloads"))?;
        // Queued workloads whose request waits beyond the team's quota are admitted as the
        // quota frees, oldest first.
        let over_quota: Vec<AllocationId> = rows
            .iter()
            .filter(|r| {
                r.w.state == WorkloadState::Queued
                    && r.w.owns_allocation
                    && r.alloc_state == AllocState::PendingApproval
            })
            .map(|r| r.w.allocation_id)
            .collect();
        if !over_quota.is_empty() {
            report.admitted = self.allocations.admit_when_room(&over_quota, now).await?;
        }
        for r in &rows {
            let w = &r.w;
            let state = w.state;
            let alloc = r.alloc_state;
            if state == WorkloadState::Queued {
                if alloc == AllocState::Active {
                    if self.start_queued(w).await? {
                        report.started_queued += 1;
                    }
                } else if alloc == AllocState::Releasing || alloc.is_terminal() {
                    let end = match (w.kind, alloc) {
                        (WorkloadKind::Notebook, _) => WorkloadState::Stopped,
                        (_, AllocState::Cancelled | AllocState::Ended) => WorkloadState::Cancelled,
                        _ => WorkloadState::Failed,
                    };
                    let m = format!("its GPU request was {}", alloc.label().to_lowercase());
                    if self.end_queued(w, end, &m, now).await? {
                        report.stopped_for_allocation += 1;
                    }
                }
                continue;
            }
            if alloc == AllocState::Preempted
                && state != WorkloadState::Stopping
                && self.requeue(w).await?
            {
                report.requeued += 1;
                continue;
            }
            // Workloads start only on active allocations; once the allocation is being
            // released or has ended, they stop.
            if alloc == AllocState::Releasing || alloc.is_terminal() {
                if alloc.is_terminal()
                    && w.synced_at.is_none_or(|t| now - t > self.cfg.stop_grace)
                    && (state == WorkloadState::Stopping || w.synced_at.is_none())
                {
                    let m = format!(
                        "its allocation is {} and node {} did not confirm the stop",
                        alloc.label().to_lowercase(),
                        w.hostname
                    );
                    if self.mark_lost(w, &m, now).await? {
                        report.lost += 1;
                    }
                } else if state != WorkloadState::Stopping {
                    let m = allocation_gone(alloc);
                    if self.request_stop(w, &m).await.is_ok() {
                        report.stopped_for_allocation += 1;
                    }
                }
                continue;
            }
            if alloc != AllocState::Active {
                continue;
            }
            if w.kind == WorkloadKind::Notebook && state == WorkloadState::Running {
                let s = self.signals(w, now).await?;
                let decision = self.decide(w, &s, now);
                if let IdleDecision::Warn {
                    idle_since,
                    stop_at,
                } = decision
                {
                    self.warn_idle(w, idle_since, stop_at, now).await?;
                    self.tell_idle(r, Some(stop_at)).await?;
                } else if !matches!(decision, IdleDecision::Reclaim { .. }) {
                    // Used again: the warning is withdrawn (the node removes the file).
                    self.tell_idle(r, None).await?;
                }
                if let IdleDecision::Reclaim { idle_since } = decision {
                    let m = format!(
                        "stopped after {} min without kernel or GPU activity (idle since {} UTC)",
                        self.cfg.idle.idle_after.num_minutes(),
                        idle_since.format("%Y-%m-%d %H:%M")
                    );
                    if self.request_stop(w, &m).await.is_ok() {
                        report.reclaimed_idle += 1;
                        self.audit(None, AuditAction::NotebookIdleReclaim, w.id, w.team_id, &m)
                            .await;
                        if self.cfg.idle_release_allocation {
                            self.allocations
                                .release_for_system(
                                    w.allocation_id,
                                    &format!("its notebook `{}` was idle", w.name),
                                )
                                .await?;
                        }
                    }
                }
            }
        }
        report.gang_stopped = self.gang_pass(&rows).await?;
        report.released_allocations = self.release_ended_owners().await?;
        Ok(report)
    }

    /// The deadline channel for an idle notebook: in its warning window its processes are
    /// told the stop (cause `idle`, at the time the idle rule stops it: the deadline file,
    /// and the signal if it asked for one); `None` withdraws it once it is used again.
    async fn tell_idle(
        &self,
        r: &WorkloadListRow,
        stop_at: Option<DateTime<Utc>>,
    ) -> Result<(), AppError> {
        let idle = DeadlineCause::Idle;
        let told = r.deadline_cause == Some(idle);
        match stop_at {
            Some(at) => {
                let same = told
                    && r.deadline_at
                        .is_some_and(|d| (d - at).num_milliseconds().abs() < 1000);
                if !same {
                    self.store
                        .set_workload_deadline(r.w.id, WorkloadState::Running.as_str(), at, idle)
                        .await
                        .map_err(internal("telling the idle deadline"))?;
                }
            }
            None if told => {
                self.store
                    .clear_workload_deadline(r.w.id, idle)
                    .await
                    .map_err(internal("withdrawing the idle deadline"))?;
            }
            None => {}
        }
        Ok(())
    }

    /// Tells a notebook's owner it will be stopped for idleness: once per idle stretch
    /// (keyed by when it went idle; used again and idle again, told again).
    async fn warn_idle(
        &self,
        w: &WorkloadRow,
        idle_since: DateTime<Utc>,
        stop_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), AppError> {
        let payload = tessera_domain::notify::idle_warning_payload(
            (w.id.0, &w.name),
            w.user_id.0,
            idle_since,
            stop_at,
        );
        let mut event = NewEvent::new(
            EventKind::IdleWarning,
            Some(w.team_id.0),
            ("workload", w.id.0),
            payload,
            now,
        );
        event.dedupe_key = Some(format!("idle:{}:{}", w.id, idle_since.timestamp()));
        self.store
            .record_event(&event)
            .await
            .map_err(internal("recording an idle warning"))?;
        Ok(())
    }

    /// How `w`'s current attempt ended at `now`: where it ran, from when, and the GPU
    /// time its allocation held meanwhile (what a preemption cost).
    pub(super) async fn attempt_end(
        &self,
        w: &WorkloadRow,
        exit_code: Option<i64>,
        reason: &str,
        preempted: bool,
        now: DateTime<Utc>,
    ) -> Result<AttemptEnd, AppError> {
        let began = self
            .store
            .attempt_began(w.id, w.started_at)
            .await
            .map_err(internal("loading attempts"))?;
        let alloc = self.allocations.row(w.allocation_id).await?;
        let gpu_ms = match (began, alloc) {
            (Some(b), Some(a)) => tessera_domain::billing::gpu_ms(
                u32::try_from(a.a.units).unwrap_or(0),
                (now - b).num_milliseconds().max(0),
                a.a.kind.units_per_gpu(self.allocations.catalog()),
            ),
            _ => 0,
        };
        Ok(AttemptEnd {
            hostname: w.hostname.clone(),
            started_at: began,
            ended_at: now,
            exit_code,
            reason: reason.to_owned(),
            preempted,
            gpu_ms,
        })
    }

    pub(super) fn decide(
        &self,
        w: &WorkloadRow,
        s: &ActivitySignals,
        now: DateTime<Utc>,
    ) -> IdleDecision {
        let started = w.ready_at.or(w.started_at).unwrap_or(w.created_at);
        wl::idle_decision(now, started, s, &self.cfg.idle)
    }

    /// The idle signals of a notebook: the kernel activity the executor last reported and
    /// the last telemetry sample within the idle window in which its device was busy.
    pub(super) async fn signals(
        &self,
        w: &WorkloadRow,
        now: DateTime<Utc>,
    ) -> Result<ActivitySignals, AppError> {
        let (from, to) = (now - self.cfg.idle.idle_after, now + Duration::seconds(1));
        let readings = readings(&self.store, &w.devices, from, to).await?;
        let gpu_has_data = !readings.is_empty();
        let gpu_last_busy = readings
            .iter()
            .filter(|(_, u)| *u >= self.cfg.idle.busy_pct)
            .map(|(at, _)| *at)
            .max();
        Ok(ActivitySignals {
            kernel_last_activity: w.kernel_activity,
            kernel_busy: w.kernel_busy,
            gpu_last_busy,
            gpu_has_data,
        })
    }

    // ---- views ----
}
