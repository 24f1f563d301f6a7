//! `/healthz` (process up), `/readyz` (database reachable), `/metrics` (Prometheus text).

use crate::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, header};

pub async fn healthz() -> &'static str {
    "ok"
}

pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    }
    match state.services.coordination.ping().await {
        Ok(()) => (StatusCode::OK, "ready"),
        Err(e) => {
            tracing::warn!(error = %e, "database not reachable");
            (StatusCode::SERVICE_UNAVAILABLE, "database unreachable")
        }
    }
}

/// Prometheus text. Per-team series (names, spend, budget use) only for a scraper that
/// sends `Authorization: Bearer <TESSERA_METRICS_TOKEN>`; everyone else gets the rest. A
/// wrong token is refused outright, so a misconfigured scraper notices.
pub async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let team_data = match (given, &state.config.metrics_token) {
        (Some(g), Some(t)) if same_secret(g, t.expose()) => true,
        (Some(_), _) => {
            return (
                StatusCode::UNAUTHORIZED,
                "wrong metrics token (TESSERA_METRICS_TOKEN)",
            )
                .into_response();
        }
        (None, _) => false,
    };
    record_cluster_gauges(&state).await;
    record_allocation_gauges(&state).await;
    record_workload_gauges(&state).await;
    if team_data {
        record_budget_gauges(&state).await;
    }
    record_node_gauges(&state).await;
    let body = crate::observability::metrics_handle()
        .map(|h| h.render())
        .unwrap_or_default();
    let body = if team_data {
        body
    } else {
        without_families(&body, &crate::observability::TEAM_FAMILIES)
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

/// Compares hashes, so the time taken says nothing about how much of the token matched.
fn same_secret(given: &str, expected: &str) -> bool {
    use tessera_core::auth::secret::hash;
    hash(given) == hash(expected)
}

/// The exposition text without the samples, `# HELP` and `# TYPE` lines of `families`.
fn without_families(body: &str, families: &[&str]) -> String {
    let hidden = |line: &str| {
        let name = line
            .strip_prefix("# HELP ")
            .or_else(|| line.strip_prefix("# TYPE "))
            .unwrap_or(line);
        families.iter().any(|f| {
            name.strip_prefix(f)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '{']))
        })
    };
    let mut out = String::with_capacity(body.len());
    for line in body.lines().filter(|l| !hidden(l)) {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Cluster gauges are computed at scrape time from the stored inventories.
async fn record_cluster_gauges(state: &AppState) {
    let Ok((summary, nodes)) = state.services.nodes.summary_now().await else {
        return;
    };
    metrics::gauge!("tessera_nodes", "state" => "online").set(f64::from(summary.nodes_online));
    metrics::gauge!("tessera_nodes", "state" => "offline")
        .set(f64::from(summary.nodes_total - summary.nodes_online));
    let catalog = state.services.nodes.catalog();
    let mut by_model_state: std::collections::BTreeMap<(String, &str), u32> = Default::default();
    for (_, inv) in &nodes {
        for g in &inv.gpus {
            let v = tessera_domain::cluster::GpuView::from_wire(g, catalog);
            let state = match v.mig_enabled {
                Some(true) => "mig",
                Some(false) => "whole",
                None => "no_mig",
            };
            *by_model_state
                .entry((v.model.unwrap_or(v.name), state))
                .or_default() += 1;
        }
    }
    for ((model, st), n) in by_model_state {
        metrics::gauge!("tessera_gpus", "model" => model, "mig" => st).set(f64::from(n));
    }
    metrics::gauge!("tessera_mig_instances", "state" => "in_use")
        .set(f64::from(summary.instances_in_use));
    metrics::gauge!("tessera_mig_instances", "state" => "free")
        .set(f64::from(summary.instances_free));
    metrics::gauge!("tessera_mig_instances", "state" => "held_idle")
        .set(f64::from(summary.instances_held_idle));
    if let Ok(n) = state.services.nodes.unhealthy_count().await {
        metrics::gauge!("tessera_gpus_unhealthy").set(n as f64);
    }
    for (model, n) in state.services.allocations.spare_gpus() {
        metrics::gauge!("tessera_spare_gpus", "model" => model).set(f64::from(n));
    }
    if let Ok(m) = state.services.workloads.preempted_gpu_minutes().await {
        metrics::gauge!("tessera_preempted_gpu_minutes").set(m);
    }
}

/// Allocations by state and model, and how long the oldest queued one has waited.
async fn record_allocation_gauges(state: &AppState) {
    use crate::observability::{ALLOCATIONS, QUEUE_OLDEST_WAIT};
    let Ok(stats) = state.services.allocations.stats().await else {
        return;
    };
    for (st, model, n) in stats.by_state_model {
        metrics::gauge!(ALLOCATIONS, "state" => st, "model" => model).set(n as f64);
    }
    let wait = stats
        .oldest_queued
        .map(|t| (chrono::Utc::now() - t).num_seconds().max(0) as f64)
        .unwrap_or(0.0);
    metrics::gauge!(QUEUE_OLDEST_WAIT).set(wait);
}

/// Live workloads by kind and state.
async fn record_workload_gauges(state: &AppState) {
    let Ok(counts) = state.services.workloads.live_counts().await else {
        return;
    };
    for (kind, st, n) in counts {
        metrics::gauge!(crate::observability::WORKLOADS, "kind" => kind.as_str(), "state" => st.as_str())
            .set(n as f64);
    }
}

/// Each team's spend this month against its budget (teams with a budget or a spend).
async fn record_budget_gauges(state: &AppState) {
    use crate::observability::{BUDGET_RATIO, BUDGET_SPENT};
    let Ok(budgets) = state
        .services
        .billing
        .all_budgets(state.services.clock.now())
        .await
    else {
        return;
    };
    for b in budgets {
        let (id, name) = (b.team_id.to_string(), b.team_name.clone());
        let spent = b.spent_minor as f64
            / 10f64.powi(tessera_domain::billing::minor_digits(&b.currency) as i32);
        metrics::gauge!(BUDGET_SPENT, "team_id" => id.clone(), "team" => name.clone(), "currency" => b.currency.clone())
            .set(spent);
        if let Some(m) = b.monthly_minor.filter(|m| *m > 0) {
            metrics::gauge!(BUDGET_RATIO, "team_id" => id, "team" => name)
                .set(b.spent_minor as f64 / m as f64);
        }
    }
}

/// Per node: liveness and dropped samples; per GPU and MIG device of the newest sample
/// (only when it is fresh): the values the driver gave, under dcgm-exporter's names and
/// labels. A value the driver could not give has no series, and the series of a GPU that
/// stops reporting are no longer set, so the recorder drops them after a minute.
async fn record_node_gauges(state: &AppState) {
    use crate::observability::{NODE_LAST_SEEN, TELEMETRY_DROPPED, dcgm};
    let Ok(nodes) = state.services.nodes.metrics_now().await else {
        return;
    };
    for n in nodes {
        let node = [
            ("node_id", n.id.to_string()),
            ("hostname", n.hostname.clone()),
        ];
        metrics::gauge!(NODE_LAST_SEEN, &node).set(n.last_seen_secs);
        metrics::gauge!(TELEMETRY_DROPPED, &node).set(n.telemetry_dropped as f64);
        let Some(sample) = &n.latest else {
            continue;
        };
        for g in &sample.gpus {
            // The index and product name come from the inventory; a GPU missing there
            // cannot be labelled as dcgm-exporter would, so it is left out.
            let Some(info) = n.inventory.gpus.iter().find(|i| i.uuid == g.gpu_uuid) else {
                continue;
            };
            let gpu = vec![
                ("gpu", info.index.to_string()),
                ("UUID", info.uuid.clone()),
                ("device", format!("nvidia{}", info.index)),
                ("modelName", info.name.clone()),
                ("Hostname", n.hostname.clone()),
            ];
            set(dcgm::GPU_UTIL, &gpu, g.utilization_pct.map(f64::from));
            set(dcgm::GPU_TEMP, &gpu, g.temperature_c.map(f64::from));
            set(
                dcgm::POWER_USAGE,
                &gpu,
                g.power_mw.map(|mw| f64::from(mw) / 1000.0),
            );
            set_memory(&gpu, g.memory_used_mib, g.memory_total_mib);
            for d in &g.mig_devices {
                let profile = info
                    .instances
                    .iter()
                    .find(|i| i.gi_id == d.gi_id)
                    .map(|i| i.profile.clone())
                    .unwrap_or_default();
                let mut mig = gpu.clone();
                mig.push(("GPU_I_PROFILE", profile));
                mig.push(("GPU_I_ID", d.gi_id.to_string()));
                set(
                    dcgm::GR_ENGINE_ACTIVE,
                    &mig,
                    d.sm_util_pct.map(|p| f64::from(p) / 100.0),
                );
                set_memory(&mig, d.memory_used_mib, d.memory_total_mib);
            }
        }
    }
}

/// Sets the gauge when the driver gave a value; without one there is no series.
fn set(name: &'static str, labels: &[(&'static str, String)], value: Option<f64>) {
    if let Some(v) = value {
        metrics::gauge!(name, labels).set(v);
    }
}

/// Framebuffer used and free (MiB), as dcgm-exporter names them.
fn set_memory(labels: &[(&'static str, String)], used: Option<u64>, total: Option<u64>) {
    use crate::observability::dcgm;
    set(dcgm::FB_USED, labels, used.map(|m| m as f64));
    set(
        dcgm::FB_FREE,
        labels,
        total.zip(used).map(|(t, u)| t.saturating_sub(u) as f64),
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn team_families_are_cut_whole() {
        let body = "# HELP tessera_team_spend_month spend\n# TYPE tessera_team_spend_month gauge\n\
                    tessera_team_spend_month{team=\"vision\"} 12\n\
                    tessera_team_spend_month_total 1\n\
                    tessera_nodes{state=\"online\"} 2\n";
        let out = super::without_families(body, &["tessera_team_spend_month"]);
        assert!(!out.contains("vision"), "{out}");
        assert!(
            !out.contains("# HELP tessera_team_spend_month spend"),
            "{out}"
        );
        assert!(out.contains("tessera_team_spend_month_total 1"), "{out}");
        assert!(out.contains("tessera_nodes"), "{out}");
    }
}
