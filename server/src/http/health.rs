//! `/healthz` (process up), `/readyz` (database reachable), `/metrics` (Prometheus text).

use crate::AppState;
use axum::extract::State;
use axum::response::IntoResponse;
use http::{StatusCode, header};

pub async fn healthz() -> &'static str {
    "ok"
}

pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.store.ping().await {
        Ok(()) => (StatusCode::OK, "ready"),
        Err(e) => {
            tracing::warn!(error = %e, "database not reachable");
            (StatusCode::SERVICE_UNAVAILABLE, "database unreachable")
        }
    }
}

pub async fn metrics() -> impl IntoResponse {
    let body = crate::observability::metrics_handle()
        .map(|h| h.render())
        .unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}
