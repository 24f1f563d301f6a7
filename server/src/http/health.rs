//! `/healthz` (process up), `/readyz` (database reachable), `/metrics` (Prometheus text).

use crate::AppState;
use axum::extract::State;
use axum::response::IntoResponse;
use http::{StatusCode, header};

pub async fn healthz() -> &'static str {
    "ok"
}

pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.services.store.ping().await {
        Ok(()) => (StatusCode::OK, "ready"),
        Err(e) => {
            tracing::warn!(error = %e, "database not reachable");
            (StatusCode::SERVICE_UNAVAILABLE, "database unreachable")
        }
    }
}

pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    record_cluster_gauges(&state).await;
    record_allocation_gauges(&state).await;
    record_budget_gauges(&state).await;
    let body = crate::observability::metrics_handle()
        .map(|h| h.render())
        .unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
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

/// Each team's spend this month against its budget (teams with a budget or a spend).
async fn record_budget_gauges(state: &AppState) {
    use crate::observability::{BUDGET_RATIO, BUDGET_SPENT};
    let Ok(budgets) = state.services.billing.all_budgets(chrono::Utc::now()).await else {
        return;
    };
    for b in budgets {
        let (id, name) = (b.team_id.to_string(), b.team_name.clone());
        let spent = b.spent_minor as f64 / 10f64.powi(tessera_domain::billing::minor_digits(&b.currency) as i32);
        metrics::gauge!(BUDGET_SPENT, "team_id" => id.clone(), "team" => name.clone(), "currency" => b.currency.clone())
            .set(spent);
        if let Some(m) = b.monthly_minor.filter(|m| *m > 0) {
            metrics::gauge!(BUDGET_RATIO, "team_id" => id, "team" => name)
                .set(b.spent_minor as f64 / m as f64);
        }
    }
}
