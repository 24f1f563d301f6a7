//! Join tokens, nodes, their GPUs (MIG layouts, sharing) and the cluster.

use super::*;

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct NewJoinToken {
    #[serde(default)]
    note: String,
    /// Nodes that may join with it (1–1000); default 1.
    #[serde(default = "one")]
    max_uses: u32,
    /// Hours until it expires (1–720); default 24.
    #[serde(default = "day")]
    expires_in_hours: u32,
}

fn one() -> u32 {
    1
}
fn day() -> u32 {
    24
}

#[utoipa::path(get, path = "/api/v1/join-tokens", tag = "nodes", params(PageRequest),
    responses((status = 200, description = "OK", body = Page<JoinTokenView>), Forbidden))]
pub(super) async fn list_join_tokens(
    Call(s, p): Call,
    Query(page): Query<PageRequest>,
) -> ApiResult<Page<JoinTokenView>> {
    ok(s.nodes.list_join_tokens(&p, page).await)
}

#[utoipa::path(post, path = "/api/v1/join-tokens", tag = "nodes", request_body = NewJoinToken,
    description = "Run `tessera-agent --server URL --join-token SECRET` on the node.",
    responses((status = 201, description = "Created", body = CreatedSecret<JoinTokenView>), Forbidden, Invalid))]
pub(super) async fn create_join_token(
    Call(s, p): Call,
    JsonBody(b): JsonBody<NewJoinToken>,
) -> Created<CreatedSecret<JoinTokenView>> {
    created(
        s.nodes
            .create_join_token(&p, &b.note, b.max_uses, b.expires_in_hours)
            .await,
    )
}

#[utoipa::path(delete, path = "/api/v1/join-tokens/{id}", tag = "nodes",
    responses((status = 204, description = "Done"), Forbidden, NotFound))]
pub(super) async fn revoke_join_token(
    Call(s, p): Call,
    Path(token): Path<Uuid>,
) -> Result<StatusCode, ApiError> {
    s.nodes.revoke_join_token(&p, token).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/nodes", tag = "nodes", params(PageRequest),
    responses((status = 200, description = "OK", body = Page<NodeView>)))]
pub(super) async fn list_nodes(
    Call(s, p): Call,
    Query(page): Query<PageRequest>,
) -> ApiResult<Page<NodeView>> {
    ok(s.nodes.list(&p, page).await)
}

#[utoipa::path(get, path = "/api/v1/nodes/{id}", tag = "nodes",
    responses((status = 200, description = "OK", body = NodeView), NotFound))]
pub(super) async fn get_node(Call(s, p): Call, Path(node): Path<Uuid>) -> ApiResult<NodeView> {
    ok(s.nodes.get(&p, node.into()).await)
}

#[utoipa::path(post, path = "/api/v1/nodes/{id}/revoke", tag = "nodes",
    description = "The node's credential stops working at once.",
    responses((status = 200, description = "OK", body = NodeView), Forbidden, NotFound))]
pub(super) async fn revoke_node(Call(s, p): Call, Path(node): Path<Uuid>) -> ApiResult<NodeView> {
    ok(s.nodes.revoke(&p, node.into()).await)
}

#[utoipa::path(post, path = "/api/v1/nodes/{id}/drain", tag = "nodes",
    request_body = DrainRequest,
    description = "Drains the node, or one GPU of it (`gpu`), by a deadline (`deadline`, \
        RFC 3339, or `minutes` from now; default 30): nothing new is placed there, running \
        work is warned at once through the deadline channel (signal, `$TESSERA_DEADLINE_FILE`) \
        and released at the deadline, jobs queued again elsewhere. Draining again moves the \
        deadline.",
    responses((status = 200, description = "OK", body = NodeView), Forbidden, NotFound, Invalid, Conflict))]
pub(super) async fn drain_node(
    Call(s, p): Call,
    Path(node): Path<Uuid>,
    JsonBody(b): JsonBody<DrainRequest>,
) -> ApiResult<NodeView> {
    ok(s.nodes.drain(&p, node.into(), &b).await)
}

/// A node's group.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NodeGroupBody {
    /// A rack or switch name (letters, digits, `.`, `_`, `-`); null or empty clears it.
    group: Option<String>,
}

#[utoipa::path(put, path = "/api/v1/nodes/{id}/group", tag = "nodes",
    request_body = NodeGroupBody,
    description = "Sets the node's group (a rack or switch; platform admins): a multi-node job \
        stays inside one group when one can hold it.",
    responses((status = 200, description = "OK", body = NodeView), Forbidden, NotFound, Invalid))]
pub(super) async fn set_node_group(
    Call(s, p): Call,
    Path(node): Path<Uuid>,
    JsonBody(b): JsonBody<NodeGroupBody>,
) -> ApiResult<NodeView> {
    ok(s.nodes.set_group(&p, node.into(), b.group.as_deref()).await)
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(super) struct UndrainQuery {
    /// End only this GPU's drain (`GPU-…`); without it, every drain of the node ends.
    gpu: Option<String>,
}

#[utoipa::path(delete, path = "/api/v1/nodes/{id}/drain", tag = "nodes", params(UndrainQuery),
    description = "Ends the drain: the node (or GPU) takes work again; warnings not yet run \
        out are withdrawn.",
    responses((status = 200, description = "OK", body = NodeView), Forbidden, NotFound))]
pub(super) async fn undrain_node(
    Call(s, p): Call,
    Path(node): Path<Uuid>,
    Query(q): Query<UndrainQuery>,
) -> ApiResult<NodeView> {
    ok(s.nodes.undrain(&p, node.into(), q.gpu.as_deref()).await)
}

#[derive(Deserialize, utoipa::IntoParams)]
pub(super) struct TelemetryQuery {
    /// Newest samples to return (1–1000, default 60).
    limit: Option<u32>,
}

#[utoipa::path(get, path = "/api/v1/nodes/{id}/telemetry", tag = "nodes", params(TelemetryQuery),
    description = "Recent per-GPU samples, oldest first. Metrics the driver cannot give are null.",
    responses((status = 200, description = "OK", body = NodeTelemetry), NotFound))]
pub(super) async fn node_telemetry(
    Call(s, p): Call,
    Path(node): Path<Uuid>,
    Query(q): Query<TelemetryQuery>,
) -> ApiResult<NodeTelemetry> {
    let limit = q.limit.unwrap_or(60);
    ok(s.nodes.telemetry(&p, node.into(), limit).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct LayoutBody {
    /// `enabled` or `disabled`.
    #[schema(value_type = String)]
    mode: tessera_domain::wire::MigMode,
    /// Instances at explicit placements; must be empty when `mode` is `disabled`.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    layout: Vec<tessera_domain::wire::DesiredInstance>,
}

#[utoipa::path(put, path = "/api/v1/nodes/{id}/gpus/{gpu_uuid}/layout", tag = "nodes", request_body = LayoutBody,
    description = "Sets the MIG layout the node's agent should apply (validated against the GPU's profile table). \
                   The agent reports progress; see the GPU's `apply_state`.",
    responses((status = 200, description = "OK", body = NodeView), Forbidden, NotFound, Invalid))]
pub(super) async fn set_gpu_layout(
    Call(s, p): Call,
    Path((node, gpu)): Path<(Uuid, String)>,
    JsonBody(b): JsonBody<LayoutBody>,
) -> ApiResult<NodeView> {
    ok(s.nodes
        .set_desired_layout(&p, node.into(), &gpu, b.mode, b.layout)
        .await)
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct SharingBody {
    /// `mps` (NVIDIA MPS: compute and memory limits per share), `time_slice` (tenants
    /// take turns; memory share advertised only) or `off` (not shared).
    sharing: String,
}

#[utoipa::path(put, path = "/api/v1/nodes/{id}/gpus/{gpu_uuid}/sharing", tag = "nodes", request_body = SharingBody,
    description = "Shares a GPU for fractional requests (`MODEL:share:MILLI`), with MPS or time-slicing, or stops \
                   sharing it (platform admin). Only while no allocation holds the GPU. A shared GPU runs with \
                   MIG off and takes only shares; see the GPU's `sharing` for how its node runs it.",
    responses((status = 200, description = "OK", body = NodeView), Forbidden, NotFound, Invalid, Conflict))]
pub(super) async fn set_gpu_sharing(
    Call(s, p): Call,
    Path((node, gpu)): Path<(Uuid, String)>,
    JsonBody(b): JsonBody<SharingBody>,
) -> ApiResult<NodeView> {
    let sharing = tessera_domain::cluster::parse_sharing(&b.sharing)?;
    ok(s.nodes
        .set_gpu_sharing(&p, node.into(), &gpu, sharing)
        .await)
}

#[utoipa::path(get, path = "/api/v1/cluster/summary", tag = "nodes",
    responses((status = 200, description = "OK", body = ClusterSummary)))]
pub(super) async fn cluster_summary(Call(s, p): Call) -> ApiResult<ClusterSummary> {
    ok(s.nodes.summary(&p).await)
}

#[utoipa::path(get, path = "/api/v1/cluster/servers", tag = "nodes",
    description = "The server replicas on this database (heard from in the last ten minutes) \
                   and which one leads: runs the scheduler, metering and the other background \
                   passes. Platform admins.",
    responses((status = 200, description = "OK", body = Vec<ServerReplicaView>), Forbidden))]
pub(super) async fn list_servers(Call(s, p): Call) -> ApiResult<Vec<ServerReplicaView>> {
    ok(s.nodes.replicas(&p).await)
}

#[utoipa::path(post, path = "/api/v1/nodes/{id}/gpus/{gpu_uuid}/health/clear", tag = "nodes",
    description = "Marks a repaired GPU healthy again (platform admins): it takes work again, and the \
        error counters it reports now become its baseline. 409 when it is not unhealthy.",
    responses((status = 200, description = "OK", body = NodeView), Forbidden, NotFound, Conflict))]
pub(super) async fn clear_gpu_health(
    Call(s, p): Call,
    Path((node, gpu)): Path<(Uuid, String)>,
) -> ApiResult<NodeView> {
    ok(s.nodes.clear_health(&p, node.into(), &gpu).await)
}
