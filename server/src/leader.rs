//! One replica runs the background passes; any number serve requests.
//!
//! Every replica runs [`run`]: it tries to take the leader lease (`Store::try_lead`: a
//! PostgreSQL advisory lock held on a connection of its own; always granted on SQLite,
//! where the server's file lock keeps to one process). The leader runs the scheduler and
//! workload passes, metering, notification delivery and the Kubernetes executor, and
//! listens for other replicas' wake-ups; it checks its lease every [`CHECK_EVERY`] and
//! stops every pass the moment the check fails. The others retry every [`RETRY_EVERY`] and meanwhile forward local changes
//! to the leader (`NOTIFY`), so time to placement does not depend on which replica took
//! the request. Every write a pass makes is conditional on the state it read (see
//! ARCHITECTURE.md, "One leader"), so a stale leader's last statement landing late
//! changes nothing another pass has already decided.

use crate::config::ServeConfig;
use crate::k8s::KubeExecutor;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tessera_core::Services;
use tessera_core::auth::SystemActor;
use tessera_core::store::ReplicaRow;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// How often the leader checks its lease.
pub const CHECK_EVERY: Duration = Duration::from_millis(500);
/// How often a replica that does not lead tries to.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);
/// How often a replica writes its row for the admin pages (and at once when it starts or
/// stops leading).
pub const REPORT_EVERY: Duration = Duration::from_secs(5);

/// What the leader needs to run its passes.
#[derive(Clone)]
pub struct Leader {
    pub services: Arc<Services>,
    /// What the passes run as (the composition root's, from `Services::new`).
    pub system: SystemActor,
    pub config: Arc<ServeConfig>,
    pub kube: Option<Arc<KubeExecutor>>,
    /// This replica's name in logs and in the `tessera_leader` gauge.
    pub replica: String,
    /// True while this replica leads (read by `/metrics`; the admin pages read the
    /// replica's row, see [`report`]).
    pub leading: Arc<AtomicBool>,
    /// Wakes [`report`] when leadership changes.
    pub report_now: Arc<Notify>,
}

/// This process's replica name: the host name (a pod's name on Kubernetes) and the pid.
pub fn replica_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "tessera".into());
    format!("{host}-{}", std::process::id())
}

impl Leader {
    fn set(&self, leading: bool) {
        self.leading.store(leading, Ordering::SeqCst);
        metrics::gauge!(crate::observability::LEADER, "replica" => self.replica.clone())
            .set(if leading { 1.0 } else { 0.0 });
        self.report_now.notify_one();
    }

    /// Leads when it can, until `stop` turns true (then the lease is given up at once).
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let reporter = tokio::spawn(report(self.clone()));
        self.lead_until(stop).await;
        reporter.abort();
        let _ = reporter.await;
        if let Err(e) = self
            .services
            .nodes
            .remove_replica(&self.system, &self.replica)
            .await
        {
            tracing::warn!(error = %e, "could not remove this replica's row");
        }
    }

    async fn lead_until(&self, mut stop: watch::Receiver<bool>) {
        self.set(false);
        loop {
            if *stop.borrow() {
                return;
            }
            match self.services.coordination.try_lead().await {
                Ok(Some(mut lease)) => {
                    tracing::info!(replica = %self.replica, "leading: this replica runs the background passes");
                    self.set(true);
                    let passes = self.start_passes();
                    let stopping = loop {
                        tokio::select! {
                            () = tokio::time::sleep(CHECK_EVERY) => {
                                if !lease.holds().await {
                                    break false;
                                }
                            }
                            _ = stop.changed() => break true,
                        }
                    };
                    for p in &passes {
                        p.abort();
                    }
                    self.set(false);
                    if stopping {
                        lease.release().await;
                        tracing::info!(replica = %self.replica, "gave up the leader lease (shutting down)");
                        return;
                    }
                    tracing::warn!(replica = %self.replica, "lost the leader lease (database connection); background passes stopped");
                }
                Ok(None) => {
                    let forward = tokio::spawn(forward_wakes(self.services.clone()));
                    let stopped = tokio::select! {
                        () = tokio::time::sleep(RETRY_EVERY) => false,
                        _ = stop.changed() => true,
                    };
                    forward.abort();
                    if stopped {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot reach the database to take the leader lease");
                    tokio::select! {
                        () = tokio::time::sleep(RETRY_EVERY) => {}
                        _ = stop.changed() => return,
                    }
                }
            }
        }
    }

    fn start_passes(&self) -> Vec<JoinHandle<()>> {
        let s = &self.services;
        let mut tasks = vec![
            tokio::spawn(crate::scheduler::run(
                s.clone(),
                self.system.clone(),
                self.config.scheduler_interval,
            )),
            tokio::spawn(crate::scheduler::meter(
                s.clone(),
                self.system.clone(),
                self.config.metering_interval,
            )),
            tokio::spawn(listen_for_wakes(s.clone())),
            tokio::spawn(crate::notify::run(
                s.clone(),
                self.system.clone(),
                self.config.clone(),
            )),
        ];
        if let Some(k) = &self.kube {
            tasks.push(tokio::spawn(crate::k8s::run(
                s.clone(),
                self.system.clone(),
                k.clone(),
            )));
        }
        tasks
    }
}

/// Writes this replica's row (alive, leading or not) every [`REPORT_EVERY`] and whenever
/// leadership changes, for the admin pages.
async fn report(leader: Leader) {
    let started_at = chrono::Utc::now();
    loop {
        // Re-set every round: `/metrics` drops a gauge not set for a minute.
        let leading = leader.leading.load(Ordering::SeqCst);
        metrics::gauge!(crate::observability::LEADER, "replica" => leader.replica.clone())
            .set(if leading { 1.0 } else { 0.0 });
        let me = ReplicaRow {
            name: leader.replica.clone(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            started_at,
            seen_at: chrono::Utc::now(),
            is_leader: leading,
        };
        if let Err(e) = leader
            .services
            .nodes
            .report_replica(&leader.system, &me)
            .await
        {
            tracing::warn!(error = %e, "could not report this replica");
        }
        tokio::select! {
            () = tokio::time::sleep(REPORT_EVERY) => {}
            () = leader.report_now.notified() => {}
        }
    }
}

/// Standby: each local change is passed on to the leader.
async fn forward_wakes(services: Arc<Services>) {
    let changed = services.allocations.changed();
    loop {
        changed.notified().await;
        if let Err(e) = services.coordination.notify_wake().await {
            tracing::warn!(error = %e, "could not wake the leader");
        }
    }
}

/// Leader: other replicas' changes wake this replica's scheduler.
async fn listen_for_wakes(services: Arc<Services>) {
    loop {
        match services.coordination.wake_listener().await {
            Ok(None) => return,
            Ok(Some(mut l)) => {
                while l.next().await.is_ok() {
                    services.allocations.changed().notify_one();
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for other replicas' changes"),
        }
        tokio::time::sleep(RETRY_EVERY).await;
    }
}

/// Every replica on PostgreSQL: node wake-ups made here go to the other replicas
/// (`NOTIFY tessera_node`), and theirs wake the agents' long polls held here. Returns at
/// once on SQLite (one process).
pub async fn relay_node_signals(services: Arc<Services>) {
    if services.coordination.backend_name() != "postgres" {
        return;
    }
    let epoch = services.signals.epoch();
    let mut outgoing = services.signals.forwarded();
    let sender = {
        let services = services.clone();
        tokio::spawn(async move {
            while let Some(node) = outgoing.recv().await {
                if let Err(e) = services
                    .coordination
                    .notify_node(&format!("{epoch} {node}"))
                    .await
                {
                    tracing::warn!(error = %e, "could not tell other replicas of a node change");
                }
            }
        })
    };
    loop {
        match services.coordination.node_listener().await {
            Ok(None) => break,
            Ok(Some(mut l)) => {
                while let Ok(payload) = l.next().await {
                    let Some((from, node)) = payload.split_once(' ') else {
                        continue;
                    };
                    if from == epoch.to_string() {
                        continue;
                    }
                    if let Some(node) = tessera_domain::ids::NodeId::parse(node) {
                        services.signals.bump_local(node);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for other replicas' node changes"),
        }
        tokio::time::sleep(RETRY_EVERY).await;
    }
    sender.abort();
}
