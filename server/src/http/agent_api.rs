//! The agent API under `/agent/v1` (protocol: `agent/README.md`; types:
//! `tessera_domain::wire`). Authenticated by node credential, except `register`, which
//! trades a join token for one.

use super::auth::NodeCaller;
use super::error::{ApiError, JsonBody, Query};
use crate::AppState;
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use http::StatusCode;
use tessera_domain::wire::{
    ChangeMark, DesiredState, Heartbeat, MAX_WAIT_S, RegisterRequest, RegisterResponse,
    StatusReport, TelemetryAck, TelemetryBatch, WorkloadReports, WorkloadSync,
};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/agent/v1/register", post(register))
        .route("/agent/v1/heartbeat", post(heartbeat))
        .route("/agent/v1/desired", get(desired))
        .route("/agent/v1/wait", get(wait))
        .route("/agent/v1/status", post(status))
        .route("/agent/v1/telemetry", post(telemetry))
        .route("/agent/v1/workloads", post(workloads))
        .route("/agent/v1/exec/{session}", get(super::exec::agent_exec))
}

async fn register(
    State(s): State<AppState>,
    JsonBody(req): JsonBody<RegisterRequest>,
) -> Result<Json<RegisterResponse>, ApiError> {
    Ok(Json(s.services.nodes.register(&req).await?))
}

async fn heartbeat(
    State(s): State<AppState>,
    NodeCaller(node): NodeCaller,
    JsonBody(hb): JsonBody<Heartbeat>,
) -> Result<StatusCode, ApiError> {
    s.services.nodes.heartbeat(&node, &hb).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn desired(
    State(s): State<AppState>,
    NodeCaller(node): NodeCaller,
) -> Result<Json<DesiredState>, ApiError> {
    Ok(Json(s.services.nodes.desired(&node).await?))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitQuery {
    epoch: Option<String>,
    generation: Option<u64>,
    timeout_s: Option<u64>,
}

/// The long poll (`tessera_domain::wire::ChangeMark`): answers when something changed for
/// this node since the mark sent, or when the wait runs out.
async fn wait(
    State(s): State<AppState>,
    NodeCaller(node): NodeCaller,
    Query(q): Query<WaitQuery>,
) -> Result<Json<ChangeMark>, ApiError> {
    let since = match (q.epoch.as_deref(), q.generation) {
        (Some(e), Some(generation)) => Some(tessera_core::signals::Mark {
            // A mark this process never gave out (another replica's, or garbage) is as
            // good as none.
            epoch: e.parse().unwrap_or_default(),
            generation,
        }),
        _ => None,
    };
    // Up to a fifth shorter at random: polls that began together (every agent after a
    // server restart) drift apart instead of all coming back at the same moment.
    let asked = std::time::Duration::from_secs(q.timeout_s.unwrap_or(MAX_WAIT_S).min(MAX_WAIT_S));
    let jitter = f64::from(uuid::Uuid::new_v4().as_bytes()[0]) / 255.0 * 0.2;
    let timeout = asked.mul_f64(1.0 - jitter);
    let (mark, changed) = s.services.signals.wait(node.id(), since, timeout).await;
    Ok(Json(ChangeMark {
        epoch: mark.epoch.to_string(),
        generation: mark.generation,
        changed,
    }))
}

async fn status(
    State(s): State<AppState>,
    NodeCaller(node): NodeCaller,
    JsonBody(report): JsonBody<StatusReport>,
) -> Result<StatusCode, ApiError> {
    s.services.nodes.record_status(&node, &report).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn telemetry(
    State(s): State<AppState>,
    NodeCaller(node): NodeCaller,
    JsonBody(batch): JsonBody<TelemetryBatch>,
) -> Result<Json<TelemetryAck>, ApiError> {
    Ok(Json(
        s.services.nodes.ingest_telemetry(&node, &batch).await?,
    ))
}

/// With the Kubernetes executor, workloads are not the agents' business: they get an
/// empty set (and stop anything they might still run).
async fn workloads(
    State(s): State<AppState>,
    NodeCaller(node): NodeCaller,
    peer: Option<axum::Extension<tessera_core::request::ClientIp>>,
    JsonBody(reports): JsonBody<WorkloadReports>,
) -> Result<Json<WorkloadSync>, ApiError> {
    if s.config.executor == crate::config::Executor::Kubernetes {
        return Ok(Json(WorkloadSync::default()));
    }
    let peer = peer.map(|axum::Extension(ip)| ip.0);
    let mut sync = s
        .services
        .workloads
        .sync(
            &node,
            tessera_core::services::workloads::Reporter::Agent(peer),
            &reports,
        )
        .await?;
    sync.execs = super::exec::pending_for(node.id());
    Ok(Json(sync))
}
