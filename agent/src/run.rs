//! The agent process: heartbeats, reconcile rounds, telemetry and workload
//! rounds against a [`ServerLink`], on timers, until shutdown.
//!
//! Each round is also a public method, so tests drive the agent step by step
//! with a fake server and no timers.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tessera_domain::wire::{
    ApplyState, ApplyStatus, ChangeMark, DesiredState, Heartbeat, MAX_WAIT_S, StatusReport,
    WorkloadReports,
};
use tokio::sync::mpsc;

use crate::backend::{GpuBackend, inventory};
use crate::link::ServerLink;
use crate::mps::{MpsControl, ShareBoard, ShareSupervisor};
use crate::reconcile::Controller;
use crate::telemetry::Telemetry;
use crate::workloads::LocalExecutor;

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub manage_mig: bool,
    pub reconcile_every: Duration,
    pub telemetry_every: Duration,
    pub heartbeat_every: Duration,
    /// How often workloads are reported and the desired set fetched.
    pub workload_every: Duration,
    /// Stop every workload (SIGTERM, SIGKILL after [`SHUTDOWN_GRACE`]) when the agent
    /// shuts down. Without it they keep running and the next agent adopts them.
    pub stop_workloads_on_exit: bool,
}

/// How long workloads get to stop when the agent shuts down with
/// [`RunConfig::stop_workloads_on_exit`].
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub struct Agent<L> {
    backend: Arc<dyn GpuBackend>,
    link: L,
    cfg: RunConfig,
    controller: Controller,
    telemetry: Telemetry,
    desired: DesiredState,
    /// Statuses the server has not taken yet, latest per GPU.
    unsent: BTreeMap<String, ApplyStatus>,
    started: Instant,
    /// The process executor; without one the agent runs no workloads.
    workloads: Option<LocalExecutor>,
    /// Shared GPUs: their MPS daemons and what the heartbeat reports of them.
    shares: ShareSupervisor,
    /// Whether the server's desired state has been read at least once (until then no
    /// MPS daemon is started or stopped).
    desired_known: bool,
    /// `tessera exec` sessions already taken.
    execs: crate::exec::Sessions,
}

impl<L: ServerLink> Agent<L> {
    pub fn new(
        backend: Arc<dyn GpuBackend>,
        link: L,
        cfg: RunConfig,
        telemetry: Telemetry,
    ) -> Self {
        Agent {
            backend,
            link,
            controller: Controller::new(cfg.manage_mig),
            cfg,
            telemetry,
            desired: DesiredState::default(),
            unsent: BTreeMap::new(),
            started: Instant::now(),
            workloads: None,
            shares: ShareSupervisor::new(ShareBoard::default()),
            desired_known: false,
            execs: crate::exec::Sessions::default(),
        }
    }

    /// Runs the server's workloads with `executor`.
    pub fn with_workloads(mut self, executor: LocalExecutor) -> Self {
        self.workloads = Some(executor.with_shares(self.shares.board().clone()));
        self
    }

    /// Runs an MPS control daemon with `control` for every GPU the server wants shared
    /// with MPS. Without it such GPUs are reported not ready.
    pub fn with_mps(mut self, control: Arc<dyn MpsControl>) -> Self {
        self.shares = ShareSupervisor::new(ShareBoard::new(Some(control)));
        let board = self.shares.board().clone();
        self.workloads = self.workloads.take().map(|e| e.with_shares(board));
        self
    }

    /// What the agent knows of its shared GPUs.
    pub fn shares(&self) -> &ShareBoard {
        self.shares.board()
    }

    pub fn workloads(&self) -> Option<&LocalExecutor> {
        self.workloads.as_ref()
    }

    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    pub fn link(&self) -> &L {
        &self.link
    }

    pub async fn heartbeat(&mut self) -> anyhow::Result<()> {
        let mut inv = inventory(self.backend.as_ref())?;
        self.shares.board().fill(&mut inv);
        self.link
            .heartbeat(&Heartbeat {
                at_unix_ms: unix_ms(),
                agent_version: env!("CARGO_PKG_VERSION").to_owned(),
                manages_mig: self.cfg.manage_mig,
                workload_sandbox: self.workloads.as_ref().is_some_and(|w| w.sandboxed()),
                inventory: inv,
            })
            .await?;
        Ok(())
    }

    /// Fetches the desired state (keeping the last one if the server is
    /// unreachable), reconciles, and reports status changes as they happen. Then keeps
    /// the shared GPUs' MPS daemons running. When a layout was applied, or what the
    /// heartbeat says of shared GPUs changed (one became ready, a daemon was restarted),
    /// one heartbeat goes out at once.
    pub async fn reconcile_round(&mut self, now_ms: u64) -> anyhow::Result<()> {
        match self.link.desired_state().await {
            Ok(d) => {
                self.desired = d;
                self.desired_known = true;
            }
            Err(e) => tracing::warn!(error = %e, "cannot fetch desired state; using the last one"),
        }
        let (tx, mut rx) = mpsc::unbounded_channel();
        let backend = Arc::clone(&self.backend);
        let desired = self.desired.clone();
        let mut controller =
            std::mem::replace(&mut self.controller, Controller::new(self.cfg.manage_mig));
        // Driver calls block (creating an instance can take a while); the
        // statuses stream out while they run, so `applying` is seen live.
        let work = tokio::task::spawn_blocking(move || {
            controller.tick(backend.as_ref(), &desired, now_ms, &mut |s| {
                // The receiver lives until this task ends.
                let _ = tx.send(s);
            });
            controller
        });
        let mut applied = false;
        while let Some(status) = rx.recv().await {
            applied |= status.state == ApplyState::Success;
            self.unsent.insert(status.gpu_uuid.clone(), status);
            self.send_statuses().await;
        }
        self.controller = work.await?;
        self.send_statuses().await;

        let in_use = self
            .workloads
            .as_ref()
            .map(LocalExecutor::gpus_in_use)
            .unwrap_or_default();
        let backend = Arc::clone(&self.backend);
        let desired = self.desired_known.then(|| self.desired.clone());
        let board = self.shares.board().clone();
        let mut shares = std::mem::replace(&mut self.shares, ShareSupervisor::new(board));
        // Control-program calls block (each has a time limit).
        let (shares, changed) = tokio::task::spawn_blocking(move || {
            let changed = shares.tick(backend.as_ref(), desired.as_ref(), &in_use);
            (shares, changed)
        })
        .await?;
        self.shares = shares;
        // A layout was just applied, or a shared GPU changed: the server hears it now,
        // not at the next heartbeat (it activates allocations from the inventory).
        if (applied || changed)
            && let Err(e) = self.heartbeat().await
        {
            tracing::warn!(error = %e, "heartbeat after a change failed");
        }
        Ok(())
    }

    async fn send_statuses(&mut self) {
        if self.unsent.is_empty() {
            return;
        }
        let report = StatusReport {
            statuses: self.unsent.values().cloned().collect(),
        };
        match self.link.post_status(&report).await {
            Ok(()) => self.unsent.clear(),
            Err(e) => tracing::warn!(error = %e, "cannot post apply status; will retry"),
        }
    }

    /// Takes a sample and sends everything unacknowledged.
    pub async fn telemetry_round(&mut self, at_unix_ms: i64) -> anyhow::Result<()> {
        let seq = self.telemetry.sample(self.backend.as_ref(), at_unix_ms)?;
        tracing::debug!(seq, "sampled");
        if let Err(e) = self.telemetry.flush(&self.link).await {
            tracing::warn!(
                error = %e,
                spooled = self.telemetry.spool().len(),
                dropped_total = self.telemetry.spool().dropped_total(),
                "telemetry not delivered; kept in the spool"
            );
        }
        Ok(())
    }

    /// Reports every workload and applies the server's answer (starts, stops,
    /// forgets, log acks). If the server cannot be reached nothing changes: running
    /// processes keep running, stops in progress still escalate, and the next round
    /// tries again. Does nothing without an executor.
    pub async fn workload_round(&mut self) -> anyhow::Result<()> {
        let Some(executor) = self.workloads.as_mut() else {
            return Ok(());
        };
        let reports = WorkloadReports {
            at_unix_ms: unix_ms(),
            workloads: executor.reports().await,
        };
        let sync = self.link.sync_workloads(&reports).await?;
        if executor.apply(&sync) > 0 {
            // Started: say so now rather than at the next round.
            let reports = WorkloadReports {
                at_unix_ms: unix_ms(),
                workloads: executor.reports().await,
            };
            let sync = self.link.sync_workloads(&reports).await?;
            executor.apply(&sync);
            self.take_execs(&sync.execs).await;
        }
        self.take_execs(&sync.execs).await;
        Ok(())
    }

    /// Takes the `tessera exec` sessions the server offers (each once): opens its
    /// WebSocket and runs it on a task of its own ([`crate::exec::serve`]).
    async fn take_execs(&mut self, offered: &[tessera_domain::wire::ExecRequest]) {
        for req in offered {
            if !self.execs.first_time(&req.session) {
                continue;
            }
            let target = self
                .workloads
                .as_ref()
                .ok_or_else(|| "this node runs no workloads".to_owned())
                .and_then(|w| w.exec_target(&req.workload_id));
            let opened =
                tokio::time::timeout(Duration::from_secs(10), self.link.open_exec(req)).await;
            match opened {
                Ok(Ok(stream)) => {
                    tokio::spawn(crate::exec::serve(stream, target, req.clone()));
                }
                Ok(Err(e)) => {
                    tracing::warn!(session = req.session, error = %e, "cannot take an exec session");
                }
                Err(_) => tracing::warn!(
                    session = req.session,
                    "exec session: the server did not answer"
                ),
            }
        }
    }

    /// Runs until `shutdown` resolves. Errors in a round are logged, never
    /// fatal: the next round starts from the driver's state again.
    ///
    /// Besides the timers, a long poll (`ServerLink::wait_for_change`) is held open: when
    /// the server says something changed for this node, the desired state is fetched and
    /// applied and the workloads synced at once. The timers stay as the safety net (a
    /// server without the long poll, a lost wake-up).
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()>
    where
        L: Clone,
    {
        // A workload's process ending is reported within `EXIT_CHECK` (a local check),
        // not at the next workload round.
        let mut exits = tokio::time::interval(EXIT_CHECK);
        exits.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut mark: Option<ChangeMark> = None;
        let mut change = Box::pin(wait_change(self.link.clone(), None, Duration::ZERO));
        let mut heartbeat = tokio::time::interval(self.cfg.heartbeat_every);
        let mut reconcile = tokio::time::interval(self.cfg.reconcile_every);
        let mut telemetry = tokio::time::interval(self.cfg.telemetry_every);
        let mut workloads = tokio::time::interval(self.cfg.workload_every);
        for t in [
            &mut heartbeat,
            &mut reconcile,
            &mut telemetry,
            &mut workloads,
        ] {
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        tokio::pin!(shutdown);
        // While the server rejects the credential (401: the node was revoked, or the
        // server's database was reset), heartbeats back off up to `MAX_REJECTED_BACKOFF`
        // instead of hammering it; the first accepted one restores the normal interval.
        let mut rejected_backoff: Option<Duration> = None;
        loop {
            tokio::select! {
                () = &mut shutdown => {
                    if self.cfg.stop_workloads_on_exit
                        && let Some(executor) = self.workloads.as_mut()
                    {
                        tracing::info!("stopping every workload before exiting");
                        executor.stop_all(SHUTDOWN_GRACE).await;
                    }
                    return Ok(());
                }
                _ = heartbeat.tick() => {
                    match self.heartbeat().await {
                        Ok(()) => {
                            if rejected_backoff.take().is_some() {
                                tracing::info!("the server accepts this node's credential again");
                                heartbeat = tokio::time::interval(self.cfg.heartbeat_every);
                                heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                                heartbeat.tick().await;
                            }
                        }
                        Err(e) if is_unauthorized(&e) => {
                            let next = rejected_backoff
                                .map_or(self.cfg.heartbeat_every, |b| b * 2)
                                .min(MAX_REJECTED_BACKOFF);
                            rejected_backoff = Some(next);
                            tracing::error!(retry_in_s = next.as_secs(),
                                "the server rejected this node's credential (401): the node was \
                                 revoked or the server's database was reset. To join again, delete \
                                 credential.json in the state dir and restart with a new --join-token");
                            heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + next, next);
                            heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        }
                        Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
                    }
                }
                _ = reconcile.tick() => {
                    let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    if let Err(e) = self.reconcile_round(now).await {
                        tracing::warn!(error = %e, "reconcile round failed");
                    }
                }
                _ = telemetry.tick() => {
                    if let Err(e) = self.telemetry_round(unix_ms()).await {
                        tracing::warn!(error = %e, "telemetry round failed");
                    }
                }
                (answer, took) = &mut change => {
                    let mut delay = Duration::ZERO;
                    match answer {
                        Ok(m) => {
                            if m.changed {
                                let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
                                if let Err(e) = self.reconcile_round(now).await {
                                    tracing::warn!(error = %e, "reconcile round failed");
                                }
                                if let Err(e) = self.workload_round().await {
                                    tracing::warn!(error = %e, "workload sync failed; keeping the last desired set");
                                }
                            } else if took < Duration::from_secs(1) {
                                // Nothing changed, yet answered at once (a server shutting
                                // down): not in a tight loop.
                                delay = Duration::from_secs(1);
                            }
                            mark = Some(m);
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "long poll failed; the timers carry on");
                            delay = WAIT_RETRY;
                        }
                    }
                    change = Box::pin(wait_change(self.link.clone(), mark.clone(), delay));
                }
                _ = exits.tick(), if self.workloads.is_some() => {
                    let exited = self.workloads.as_mut().is_some_and(LocalExecutor::any_exited);
                    if exited && let Err(e) = self.workload_round().await {
                        tracing::warn!(error = %e, "workload sync failed; keeping the last desired set");
                    }
                }
                _ = workloads.tick(), if self.workloads.is_some() => {
                    if let Err(e) = self.workload_round().await {
                        tracing::warn!(error = %e, "workload sync failed; keeping the last desired set");
                    }
                }
            }
        }
    }
}

/// How often live workloads are checked for an exit between workload rounds (locally: no
/// request unless one exited).
pub const EXIT_CHECK: Duration = Duration::from_millis(200);

/// After a failed long poll (an older server without it, the server unreachable), the
/// next one waits this long; the timers carry on meanwhile.
pub const WAIT_RETRY: Duration = Duration::from_secs(10);

/// One long poll, after `delay`; with how long the server held it.
async fn wait_change<L: ServerLink>(
    link: L,
    since: Option<ChangeMark>,
    delay: Duration,
) -> (Result<ChangeMark, crate::link::LinkError>, Duration) {
    tokio::time::sleep(delay).await;
    let asked = Instant::now();
    let answer = link.wait_for_change(since.as_ref(), MAX_WAIT_S).await;
    (answer, asked.elapsed())
}

/// Heartbeats sent while the credential is rejected are at most this far apart.
pub const MAX_REJECTED_BACKOFF: Duration = Duration::from_secs(300);

fn is_unauthorized(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<crate::link::LinkError>(),
        Some(crate::link::LinkError::Unauthorized)
    )
}
