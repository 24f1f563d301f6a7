//! Logs (tracing) and metrics (Prometheus text at `/metrics`).

use crate::config::LogFormat;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;
use tracing_subscriber::EnvFilter;

/// Installs the global tracing subscriber (`RUST_LOG` filters; default `info`).
pub fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,tower_sessions=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

pub const HTTP_REQUESTS: &str = "tessera_http_requests_total";
pub const HTTP_DURATION: &str = "tessera_http_request_duration_seconds";
pub const SCHEDULER_SECONDS: &str = "tessera_scheduler_pass_duration_seconds";
/// 1 on the replica that runs the background passes, 0 on the others (label `replica`).
pub const LEADER: &str = "tessera_leader";
pub const QUEUE_LENGTH: &str = "tessera_allocation_queue_length";
pub const PLACEMENT_WAIT: &str = "tessera_allocation_placement_wait_seconds";
pub const ALLOCATIONS: &str = "tessera_allocations";
pub const QUEUE_OLDEST_WAIT: &str = "tessera_allocation_queue_oldest_wait_seconds";
/// Spend this calendar month over the monthly budget (1.0 = all of it), per team.
pub const BUDGET_RATIO: &str = "tessera_team_budget_used_ratio";
/// Spend this calendar month in the currency's major unit, per team.
pub const BUDGET_SPENT: &str = "tessera_team_spend_month";
/// The families that carry team names and money: only for the authenticated scraper.
pub const TEAM_FAMILIES: [&str; 2] = [BUDGET_RATIO, BUDGET_SPENT];
/// (allocation, hour) rows the metering job wrote.
pub const METERED_HOURS: &str = "tessera_metered_allocation_hours_total";
/// Live notebooks and jobs by kind and state.
pub const WORKLOADS: &str = "tessera_workloads";
/// Notebooks stopped by idle reclaim.
pub const IDLE_RECLAIMED: &str = "tessera_notebooks_idle_reclaimed_total";
/// Seconds since each node was last heard from (heartbeat, else registration).
pub const NODE_LAST_SEEN: &str = "tessera_node_last_seen_seconds";
/// Telemetry samples each node's agent had to drop (spool full), ever; a gauge set from
/// the agent's own counter, which never resets.
pub const TELEMETRY_DROPPED: &str = "tessera_telemetry_samples_dropped_total";

/// Per-GPU and per-MIG-device telemetry under dcgm-exporter's names and labels, so
/// dashboards and rules written for it work unchanged.
pub mod dcgm {
    /// Whole-GPU utilization, percent (not available while MIG is enabled).
    pub const GPU_UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
    /// GPU temperature, °C.
    pub const GPU_TEMP: &str = "DCGM_FI_DEV_GPU_TEMP";
    /// Framebuffer memory used, MiB (per GPU, and per MIG device).
    pub const FB_USED: &str = "DCGM_FI_DEV_FB_USED";
    /// Framebuffer memory free, MiB (total minus used).
    pub const FB_FREE: &str = "DCGM_FI_DEV_FB_FREE";
    /// Board power draw, W.
    pub const POWER_USAGE: &str = "DCGM_FI_DEV_POWER_USAGE";
    /// Activity of a MIG device, 0..1, from its GPU instance's SM utilization (the driver
    /// gives it on Hopper and newer only).
    pub const GR_ENGINE_ACTIVE: &str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE";
}

fn describe_node_gauges() {
    use metrics::{Unit, describe_gauge};
    describe_gauge!(
        NODE_LAST_SEEN,
        Unit::Seconds,
        "Seconds since the node was last heard from"
    );
    describe_gauge!(
        TELEMETRY_DROPPED,
        "Telemetry samples the node's agent had to drop, ever"
    );
    describe_gauge!(
        "tessera_gpus_unhealthy",
        "GPUs taken out of service for a critical Xid or an uncorrectable ECC error, until an admin clears them"
    );
    describe_gauge!(
        "tessera_spare_gpus",
        "GPUs kept idle as hot spares now, per model (as of the last scheduler pass)"
    );
    describe_gauge!(
        "tessera_preempted_gpu_minutes",
        "GPU-minutes of job attempts ended by a preemption (reclaim, drain, unhealthy GPU), ever"
    );
    describe_gauge!(dcgm::GPU_UTIL, "GPU utilization (in %)");
    describe_gauge!(dcgm::GPU_TEMP, "GPU temperature (in C)");
    describe_gauge!(dcgm::FB_USED, "Framebuffer memory used (in MiB)");
    describe_gauge!(dcgm::FB_FREE, "Framebuffer memory free (in MiB)");
    describe_gauge!(dcgm::POWER_USAGE, "Power draw (in W)");
    describe_gauge!(
        dcgm::GR_ENGINE_ACTIVE,
        "Ratio of time the graphics engine is active"
    );
}

/// The process-wide metrics recorder (installed once; every app in the process shares it).
pub fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets = [
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ];
            let waits = [1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0];
            // Gauges are set at each scrape (or scheduler pass); one not set for a minute
            // belongs to something that is gone (a GPU model, a state) and is dropped.
            match PrometheusBuilder::new()
                .idle_timeout(
                    metrics_util::MetricKindMask::GAUGE,
                    Some(std::time::Duration::from_secs(60)),
                )
                .set_buckets_for_metric(Matcher::Full(HTTP_DURATION.into()), &buckets)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(PLACEMENT_WAIT.into()), &waits)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(SCHEDULER_SECONDS.into()), &buckets)
                })
                .and_then(|b| b.install_recorder())
            {
                Ok(h) => {
                    metrics::describe_counter!(HTTP_REQUESTS, "HTTP requests by route and status");
                    metrics::describe_histogram!(
                        HTTP_DURATION,
                        metrics::Unit::Seconds,
                        "HTTP request latency by route"
                    );
                    describe_node_gauges();
                    Some(h)
                }
                Err(e) => {
                    tracing::error!(error = %e, "metrics recorder not installed");
                    None
                }
            }
        })
        .clone()
}
