//! The allocation scheduler's loop: one [`tick`](tessera_core::services::allocations::Allocations::tick)
//! every interval, and at once after a change (a request, a release, an approval). Each
//! tick works from stored state only, so a restart simply continues.

use std::sync::Arc;
use std::time::Duration;
use tessera_core::Services;
use tessera_core::auth::SystemActor;

pub async fn run(services: Arc<Services>, system: SystemActor, every: Duration) {
    let changed = services.allocations.changed();
    loop {
        let started = std::time::Instant::now();
        match services
            .allocations
            .tick(&system, services.clock.now())
            .await
        {
            Ok(r) => {
                if r.placed
                    + r.activated
                    + r.expired
                    + r.failed
                    + r.reconfigured
                    + r.warned
                    + r.preempted
                    > 0
                {
                    tracing::info!(
                        placed = r.placed,
                        activated = r.activated,
                        expired = r.expired,
                        failed = r.failed,
                        reconfigured = r.reconfigured,
                        queued = r.queued,
                        "scheduler pass"
                    );
                }
                // Placed on instances that already exist: the next pass activates them
                // (and starts their queued jobs) at once, not at the next interval.
                if r.placed > 0 {
                    changed.notify_one();
                }
                for w in &r.placement_waits {
                    metrics::histogram!(crate::observability::PLACEMENT_WAIT).record(*w);
                }
                metrics::histogram!(crate::observability::SCHEDULER_SECONDS)
                    .record(started.elapsed().as_secs_f64());
                metrics::gauge!(crate::observability::QUEUE_LENGTH).set(f64::from(r.queued));
            }
            Err(e) => tracing::warn!("scheduler pass failed: {e}"),
        }
        match services.workloads.tick(&system, services.clock.now()).await {
            Ok(r) if r.stopped_for_allocation + r.reclaimed_idle + r.lost > 0 => {
                metrics::counter!(crate::observability::IDLE_RECLAIMED)
                    .increment(u64::from(r.reclaimed_idle));
                tracing::info!(
                    stopped_for_allocation = r.stopped_for_allocation,
                    reclaimed_idle = r.reclaimed_idle,
                    lost = r.lost,
                    "workload pass"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("workload pass failed: {e}"),
        }
        tokio::select! {
            _ = changed.notified() => {}
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// The metering loop: every `every`, meters complete hours (and ended allocations) into
/// the ledger. Each pass is idempotent, so a restart or an overlapping pass bills nothing
/// twice.
pub async fn meter(services: Arc<Services>, system: SystemActor, every: Duration) {
    loop {
        match services
            .billing
            .meter(&system, services.clock.now(), None)
            .await
        {
            Ok(r) => {
                if r.hours > 0 {
                    tracing::info!(hours = r.hours, closed = r.closed, "metered GPU usage");
                }
                metrics::counter!(crate::observability::METERED_HOURS)
                    .increment(u64::from(r.hours));
            }
            Err(e) => tracing::warn!("metering pass failed: {e}"),
        }
        tokio::time::sleep(every).await;
    }
}
