//! The REST API under `/api/v1`, documented by the OpenAPI document it generates
//! (`/api/v1/openapi.json`). Handlers are a few lines: extract, call the service, map.

use super::auth::{Call, Caller};
use super::error::{
    ApiError, Conflict, ErrorBody, Forbidden, Invalid, JsonBody, NotFound, Path, Query,
    Unauthorized,
};
use crate::AppState;
use axum::Json;
use http::StatusCode;
use serde::Deserialize;
use tessera_core::services::allocations::ListFilter;
use tessera_core::services::billing::UsageQuery;
use tessera_core::services::workloads::{NewJob, NewNotebook, WorkloadFilter};
use tessera_domain::account::{Me, SetupChecklist};
use tessera_domain::alloc::{AllocationView, NewAllocation, QuotaView};
use tessera_domain::audit::AuditEntryView;
use tessera_domain::billing::{
    BudgetView, CostEstimate, EstimateQuery, LedgerEntryView, NewRate, RateView, SetBudget,
    Statement, UsageReport,
};
use tessera_domain::cluster::{ClusterSummary, NodeTelemetry, NodeView, ServerReplicaView};
use tessera_domain::error::AppError;
use tessera_domain::ids::{TeamId, UserId};
use tessera_domain::tenancy::{
    ApiTokenView, CreatedSecret, JoinTokenView, MemberView, Page, PageRequest, TeamView, UserView,
};
use tessera_domain::workload::{LogSlice, NotebookProfile, WorkloadKind, WorkloadView};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

type ApiResult<T> = Result<Json<T>, ApiError>;
type Created<T> = Result<(StatusCode, Json<T>), ApiError>;

/// A use case's result as a 200 response.
fn ok<T>(result: Result<T, AppError>) -> ApiResult<T> {
    Ok(Json(result?))
}

/// A use case's result as a 201 response.
fn created<T>(result: Result<T, AppError>) -> Created<T> {
    Ok((StatusCode::CREATED, Json(result?)))
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tessera API",
        description = "Self-service GPU portal. Authenticate with a personal API token \
                       (`Authorization: Bearer tsk_…`, created under My account) or a browser \
                       session. Errors share one shape (`ErrorBody`); lists take `offset` and \
                       `limit` (≤ 200) and return `{items, total, offset, limit}`. Another \
                       team's object answers exactly like a missing one (404)."
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    components(schemas(ErrorBody))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        if let Some(c) = openapi.components.as_mut() {
            c.add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}

/// The `/api/v1` routes and their OpenAPI document.
pub fn router() -> (axum::Router<AppState>, utoipa::openapi::OpenApi) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(me))
        .routes(routes!(setup_checklist))
        .routes(routes!(dismiss_setup))
        .routes(routes!(list_users, create_user))
        .routes(routes!(disable_user))
        .routes(routes!(enable_user))
        .routes(routes!(reset_password))
        .routes(routes!(list_teams, create_team))
        .routes(routes!(get_team, rename_team))
        .routes(routes!(archive_team))
        .routes(routes!(unarchive_team))
        .routes(routes!(list_members, add_member))
        .routes(routes!(change_role, remove_member))
        .routes(routes!(list_tokens, create_token))
        .routes(routes!(revoke_token))
        .routes(routes!(list_join_tokens, create_join_token))
        .routes(routes!(revoke_join_token))
        .routes(routes!(list_nodes))
        .routes(routes!(get_node))
        .routes(routes!(revoke_node))
        .routes(routes!(node_telemetry))
        .routes(routes!(set_gpu_layout))
        .routes(routes!(set_gpu_sharing))
        .routes(routes!(cluster_summary))
        .routes(routes!(list_servers))
        .routes(routes!(free_now))
        .routes(routes!(list_allocations, request_allocation))
        .routes(routes!(get_allocation))
        .routes(routes!(release_allocation))
        .routes(routes!(extend_allocation))
        .routes(routes!(approve_allocation))
        .routes(routes!(deny_allocation))
        .routes(routes!(list_quotas))
        .routes(routes!(set_quota))
        .routes(routes!(audit_log))
        .routes(routes!(list_rates, set_rate))
        .routes(routes!(estimate_cost))
        .routes(routes!(list_budgets))
        .routes(routes!(get_budget, set_budget))
        .routes(routes!(ledger))
        .routes(routes!(reverse_charge))
        .routes(routes!(usage))
        .routes(routes!(statement))
        .routes(routes!(chargeback_csv))
        .routes(routes!(usage_csv))
        .routes(routes!(list_workloads))
        .routes(routes!(launch_notebook))
        .routes(routes!(list_notebook_profiles, save_notebook_profile))
        .routes(routes!(delete_notebook_profile))
        .routes(routes!(submit_job))
        .routes(routes!(get_workload))
        .routes(routes!(stop_workload))
        .routes(routes!(workload_logs))
        .routes(routes!(workload_log_file))
        .split_for_parts()
}

#[utoipa::path(get, path = "/api/v1/me", tag = "account",
    responses((status = 200, description = "OK", body = Me), Unauthorized))]
async fn me(Caller(p): Caller) -> ApiResult<Me> {
    Ok(Json(Me::from(&p)))
}

#[utoipa::path(get, path = "/api/v1/setup", tag = "accounts",
    description = "A platform admin's first-run checklist: create a team, give it a quota, add \
                   people (or single sign-on), add GPU nodes, set prices; each step ticked once done.",
    responses((status = 200, description = "OK", body = SetupChecklist), Forbidden))]
async fn setup_checklist(Call(s, p): Call) -> ApiResult<SetupChecklist> {
    ok(s.accounts.setup_checklist(&p).await)
}

#[utoipa::path(post, path = "/api/v1/setup/dismiss", tag = "accounts",
    description = "Puts the first-run checklist away for the calling platform admin.",
    responses((status = 200, description = "OK", body = SetupChecklist), Forbidden))]
async fn dismiss_setup(Call(s, p): Call) -> ApiResult<SetupChecklist> {
    ok(s.accounts.dismiss_setup(&p).await)
}

// ---- users ----

#[derive(Deserialize, utoipa::ToSchema)]
struct NewUser {
    username: String,
    password: String,
    #[serde(default)]
    is_admin: bool,
}

#[derive(Deserialize, utoipa::ToSchema)]
struct NewPasswordBody {
    password: String,
}

#[utoipa::path(get, path = "/api/v1/users", tag = "users", params(PageRequest),
    responses((status = 200, description = "OK", body = Page<UserView>), Forbidden))]
async fn list_users(
    Call(s, p): Call,
    Query(page): Query<PageRequest>,
) -> ApiResult<Page<UserView>> {
    ok(s.tenancy.list_users(&p, page).await)
}

#[utoipa::path(post, path = "/api/v1/users", tag = "users", request_body = NewUser,
    responses((status = 201, description = "Created", body = UserView), Forbidden, Invalid))]
async fn create_user(Call(s, p): Call, JsonBody(b): JsonBody<NewUser>) -> Created<UserView> {
    created(
        s.tenancy
            .create_user(&p, &b.username, &b.password, b.is_admin)
            .await,
    )
}

#[utoipa::path(post, path = "/api/v1/users/{id}/disable", tag = "users",
    description = "Signs the user out everywhere and revokes their API tokens.",
    responses((status = 200, description = "OK", body = UserView), Forbidden, NotFound))]
async fn disable_user(Call(s, p): Call, Path(user): Path<Uuid>) -> ApiResult<UserView> {
    let user = UserId(user);
    ok(s.tenancy.set_user_disabled(&p, user, true).await)
}

#[utoipa::path(post, path = "/api/v1/users/{id}/enable", tag = "users",
    responses((status = 200, description = "OK", body = UserView), Forbidden, NotFound))]
async fn enable_user(Call(s, p): Call, Path(user): Path<Uuid>) -> ApiResult<UserView> {
    let user = UserId(user);
    ok(s.tenancy.set_user_disabled(&p, user, false).await)
}

#[utoipa::path(post, path = "/api/v1/users/{id}/password", tag = "users", request_body = NewPasswordBody,
    responses((status = 200, description = "OK", body = UserView), Forbidden, NotFound))]
async fn reset_password(
    Call(s, p): Call,
    Path(user): Path<Uuid>,
    JsonBody(b): JsonBody<NewPasswordBody>,
) -> ApiResult<UserView> {
    let user = UserId(user);
    ok(s.tenancy.reset_password(&p, user, &b.password).await)
}

// ---- teams ----

#[derive(Deserialize, utoipa::ToSchema)]
struct TeamBody {
    name: String,
}

#[utoipa::path(get, path = "/api/v1/teams", tag = "teams", params(PageRequest),
    description = "Platform admins see every team; others see the teams they belong to.",
    responses((status = 200, description = "OK", body = Page<TeamView>)))]
async fn list_teams(
    Call(s, p): Call,
    Query(page): Query<PageRequest>,
) -> ApiResult<Page<TeamView>> {
    ok(s.tenancy.list_teams(&p, page).await)
}

#[utoipa::path(post, path = "/api/v1/teams", tag = "teams", request_body = TeamBody,
    responses((status = 201, description = "Created", body = TeamView), Forbidden, Invalid))]
async fn create_team(Call(s, p): Call, JsonBody(b): JsonBody<TeamBody>) -> Created<TeamView> {
    created(s.tenancy.create_team(&p, &b.name).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}", tag = "teams",
    responses((status = 200, description = "OK", body = TeamView), NotFound))]
async fn get_team(Call(s, p): Call, Path(team): Path<Uuid>) -> ApiResult<TeamView> {
    ok(s.tenancy.team(&p, TeamId(team)).await)
}

#[utoipa::path(patch, path = "/api/v1/teams/{id}", tag = "teams", request_body = TeamBody,
    responses((status = 200, description = "OK", body = TeamView), Forbidden, NotFound))]
async fn rename_team(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
    JsonBody(b): JsonBody<TeamBody>,
) -> ApiResult<TeamView> {
    ok(s.tenancy.rename_team(&p, TeamId(team), &b.name).await)
}

#[utoipa::path(post, path = "/api/v1/teams/{id}/archive", tag = "teams",
    responses((status = 200, description = "OK", body = TeamView), Forbidden, NotFound))]
async fn archive_team(Call(s, p): Call, Path(team): Path<Uuid>) -> ApiResult<TeamView> {
    ok(s.tenancy.set_team_archived(&p, TeamId(team), true).await)
}

#[utoipa::path(post, path = "/api/v1/teams/{id}/unarchive", tag = "teams",
    responses((status = 200, description = "OK", body = TeamView), Forbidden, NotFound))]
async fn unarchive_team(Call(s, p): Call, Path(team): Path<Uuid>) -> ApiResult<TeamView> {
    ok(s.tenancy.set_team_archived(&p, TeamId(team), false).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
struct NewMember {
    username: String,
    /// `team_admin`, `member` or `viewer`.
    role: String,
}

#[derive(Deserialize, utoipa::ToSchema)]
struct RoleBody {
    /// `team_admin`, `member` or `viewer`.
    role: String,
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/members", tag = "teams", params(PageRequest),
    responses((status = 200, description = "OK", body = Page<MemberView>), NotFound))]
async fn list_members(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
    Query(page): Query<PageRequest>,
) -> ApiResult<Page<MemberView>> {
    ok(s.tenancy.list_members(&p, TeamId(team), page).await)
}

#[utoipa::path(post, path = "/api/v1/teams/{id}/members", tag = "teams", request_body = NewMember,
    responses((status = 201, description = "Created", body = MemberView), Forbidden, NotFound, Invalid))]
async fn add_member(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
    JsonBody(b): JsonBody<NewMember>,
) -> Created<MemberView> {
    created(
        s.tenancy
            .add_member(&p, TeamId(team), &b.username, &b.role)
            .await,
    )
}

#[utoipa::path(put, path = "/api/v1/teams/{id}/members/{user_id}", tag = "teams", request_body = RoleBody,
    responses((status = 200, description = "OK", body = MemberView), Forbidden, NotFound, Conflict))]
async fn change_role(
    Call(s, p): Call,
    Path((team, user)): Path<(Uuid, Uuid)>,
    JsonBody(b): JsonBody<RoleBody>,
) -> ApiResult<MemberView> {
    let (team, user) = (TeamId(team), UserId(user));
    ok(s.tenancy.change_role(&p, team, user, &b.role).await)
}

#[utoipa::path(delete, path = "/api/v1/teams/{id}/members/{user_id}", tag = "teams",
    responses((status = 204, description = "Done"), Forbidden, NotFound, Conflict))]
async fn remove_member(
    Call(s, p): Call,
    Path((team, user)): Path<(Uuid, Uuid)>,
) -> Result<StatusCode, ApiError> {
    let (team, user) = (TeamId(team), UserId(user));
    s.tenancy.remove_member(&p, team, user).await?;
    Ok(StatusCode::NO_CONTENT)
}

// ---- API tokens ----

#[derive(Deserialize, utoipa::ToSchema)]
struct NewToken {
    name: String,
    /// Days until it stops working (1–366); omit for no expiry.
    expires_in_days: Option<u32>,
}

#[utoipa::path(get, path = "/api/v1/tokens", tag = "account", params(PageRequest),
    responses((status = 200, description = "OK", body = Page<ApiTokenView>)))]
async fn list_tokens(
    Call(s, p): Call,
    Query(page): Query<PageRequest>,
) -> ApiResult<Page<ApiTokenView>> {
    ok(s.tokens.list(&p, page).await)
}

#[utoipa::path(post, path = "/api/v1/tokens", tag = "account", request_body = NewToken,
    description = "The secret is in the response only; it is stored hashed.",
    responses((status = 201, description = "Created", body = CreatedSecret<ApiTokenView>), Invalid))]
async fn create_token(
    Call(s, p): Call,
    JsonBody(b): JsonBody<NewToken>,
) -> Created<CreatedSecret<ApiTokenView>> {
    created(s.tokens.create(&p, &b.name, b.expires_in_days).await)
}

#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "account",
    responses((status = 204, description = "Done"), NotFound))]
async fn revoke_token(Call(s, p): Call, Path(token): Path<Uuid>) -> Result<StatusCode, ApiError> {
    s.tokens.revoke(&p, token).await?;
    Ok(StatusCode::NO_CONTENT)
}

// ---- nodes ----

#[derive(Deserialize, utoipa::ToSchema)]
struct NewJoinToken {
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
async fn list_join_tokens(
    Call(s, p): Call,
    Query(page): Query<PageRequest>,
) -> ApiResult<Page<JoinTokenView>> {
    ok(s.nodes.list_join_tokens(&p, page).await)
}

#[utoipa::path(post, path = "/api/v1/join-tokens", tag = "nodes", request_body = NewJoinToken,
    description = "Run `tessera-agent --server URL --join-token SECRET` on the node.",
    responses((status = 201, description = "Created", body = CreatedSecret<JoinTokenView>), Forbidden, Invalid))]
async fn create_join_token(
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
async fn revoke_join_token(
    Call(s, p): Call,
    Path(token): Path<Uuid>,
) -> Result<StatusCode, ApiError> {
    s.nodes.revoke_join_token(&p, token).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/nodes", tag = "nodes", params(PageRequest),
    responses((status = 200, description = "OK", body = Page<NodeView>)))]
async fn list_nodes(
    Call(s, p): Call,
    Query(page): Query<PageRequest>,
) -> ApiResult<Page<NodeView>> {
    ok(s.nodes.list(&p, page).await)
}

#[utoipa::path(get, path = "/api/v1/nodes/{id}", tag = "nodes",
    responses((status = 200, description = "OK", body = NodeView), NotFound))]
async fn get_node(Call(s, p): Call, Path(node): Path<Uuid>) -> ApiResult<NodeView> {
    ok(s.nodes.get(&p, node).await)
}

#[utoipa::path(post, path = "/api/v1/nodes/{id}/revoke", tag = "nodes",
    description = "The node's credential stops working at once.",
    responses((status = 200, description = "OK", body = NodeView), Forbidden, NotFound))]
async fn revoke_node(Call(s, p): Call, Path(node): Path<Uuid>) -> ApiResult<NodeView> {
    ok(s.nodes.revoke(&p, node).await)
}

#[derive(Deserialize, utoipa::IntoParams)]
struct TelemetryQuery {
    /// Newest samples to return (1–1000, default 60).
    limit: Option<u32>,
}

#[utoipa::path(get, path = "/api/v1/nodes/{id}/telemetry", tag = "nodes", params(TelemetryQuery),
    description = "Recent per-GPU samples, oldest first. Metrics the driver cannot give are null.",
    responses((status = 200, description = "OK", body = NodeTelemetry), NotFound))]
async fn node_telemetry(
    Call(s, p): Call,
    Path(node): Path<Uuid>,
    Query(q): Query<TelemetryQuery>,
) -> ApiResult<NodeTelemetry> {
    let limit = q.limit.unwrap_or(60);
    ok(s.nodes.telemetry(&p, node, limit).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
struct LayoutBody {
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
async fn set_gpu_layout(
    Call(s, p): Call,
    Path((node, gpu)): Path<(Uuid, String)>,
    JsonBody(b): JsonBody<LayoutBody>,
) -> ApiResult<NodeView> {
    ok(s.nodes
        .set_desired_layout(&p, node, &gpu, b.mode, b.layout)
        .await)
}

#[derive(Deserialize, utoipa::ToSchema)]
struct SharingBody {
    /// `mps` (NVIDIA MPS: compute and memory limits per share), `time_slice` (tenants
    /// take turns; memory share advertised only) or `off` (not shared).
    sharing: String,
}

#[utoipa::path(put, path = "/api/v1/nodes/{id}/gpus/{gpu_uuid}/sharing", tag = "nodes", request_body = SharingBody,
    description = "Shares a GPU for fractional requests (`MODEL:share:MILLI`), with MPS or time-slicing, or stops \
                   sharing it (platform admin). Only while no allocation holds the GPU. A shared GPU runs with \
                   MIG off and takes only shares; see the GPU's `sharing` for how its node runs it.",
    responses((status = 200, description = "OK", body = NodeView), Forbidden, NotFound, Invalid, Conflict))]
async fn set_gpu_sharing(
    Call(s, p): Call,
    Path((node, gpu)): Path<(Uuid, String)>,
    JsonBody(b): JsonBody<SharingBody>,
) -> ApiResult<NodeView> {
    let sharing = tessera_domain::cluster::parse_sharing(&b.sharing)?;
    ok(s.nodes.set_gpu_sharing(&p, node, &gpu, sharing).await)
}

#[utoipa::path(get, path = "/api/v1/cluster/summary", tag = "nodes",
    responses((status = 200, description = "OK", body = ClusterSummary)))]
async fn cluster_summary(Call(s, p): Call) -> ApiResult<ClusterSummary> {
    ok(s.nodes.summary(&p).await)
}

#[utoipa::path(get, path = "/api/v1/cluster/servers", tag = "nodes",
    description = "The server replicas on this database (heard from in the last ten minutes) \
                   and which one leads: runs the scheduler, metering and the other background \
                   passes. Platform admins.",
    responses((status = 200, description = "OK", body = Vec<ServerReplicaView>), Forbidden))]
async fn list_servers(Call(s, p): Call) -> ApiResult<Vec<ServerReplicaView>> {
    ok(s.nodes.replicas(&p).await)
}

// ---- allocations ----

#[utoipa::path(get, path = "/api/v1/cluster/free", tag = "allocations",
    description = "Devices free right now per kind (`H100-80GB:1g.10gb`: existing free MIG \
                   instances; `A100-SXM4-40GB:whole`: idle GPUs without MIG), as of the last \
                   scheduler pass. Re-partitioning an idle GPU may free more.",
    responses((status = 200, description = "OK", body = std::collections::BTreeMap<String, u32>)))]
async fn free_now(Call(s, p): Call) -> ApiResult<std::collections::BTreeMap<String, u32>> {
    Ok(Json(s.allocations.free_now(&p)))
}

#[derive(Deserialize, utoipa::IntoParams)]
struct AllocationQuery {
    /// Only this team's.
    team: Option<Uuid>,
    /// A state (`active`, `queued`, …) or `pending`, `current`, `ended`, `all` (default).
    state: Option<String>,
    /// Only the caller's own.
    #[serde(default)]
    mine: bool,
    #[serde(default)]
    offset: u32,
    #[serde(default = "default_limit")]
    limit: u32,
}

fn default_limit() -> u32 {
    PageRequest::default().limit
}

#[utoipa::path(get, path = "/api/v1/allocations", tag = "allocations", params(AllocationQuery),
    description = "Allocations the caller may see (platform admins: all teams), newest first.",
    responses((status = 200, description = "OK", body = Page<AllocationView>), NotFound, Invalid))]
async fn list_allocations(
    Call(s, p): Call,
    Query(q): Query<AllocationQuery>,
) -> ApiResult<Page<AllocationView>> {
    let filter = ListFilter {
        team: q.team.map(|t| t.to_string()),
        state: q.state,
        mine: q.mine,
    };
    ok(s.allocations
        .list(&p, &filter, PageRequest::new(q.offset, q.limit))
        .await)
}

#[utoipa::path(post, path = "/api/v1/allocations", tag = "allocations", request_body = NewAllocation,
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeating a request with the same key returns the allocation the first one made.")),
    description = "Requests GPUs. Within the team's quota it is queued at once (`queued`, then \
                   `placing`, then `active` once the node's agent reports the device); beyond it, \
                   it waits for approval (`pending_approval`). Units are compute slices.",
    responses((status = 201, description = "Created", body = AllocationView), Forbidden, NotFound, Conflict, Invalid))]
async fn request_allocation(
    Call(s, p): Call,
    headers: http::HeaderMap,
    JsonBody(b): JsonBody<NewAllocation>,
) -> Created<AllocationView> {
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    created(s.allocations.request(&p, &b, key).await)
}

#[utoipa::path(get, path = "/api/v1/allocations/{id}", tag = "allocations",
    description = "With its history and, while pending, its queue position, reason and ETA.",
    responses((status = 200, description = "OK", body = AllocationView), NotFound))]
async fn get_allocation(Call(s, p): Call, Path(id): Path<Uuid>) -> ApiResult<AllocationView> {
    ok(s.allocations.get(&p, id).await)
}

#[utoipa::path(post, path = "/api/v1/allocations/{id}/release", tag = "allocations",
    description = "Releases an active allocation or cancels a pending one (owner, team admin, platform admin).",
    responses((status = 200, description = "OK", body = AllocationView), Forbidden, NotFound, Conflict))]
async fn release_allocation(Call(s, p): Call, Path(id): Path<Uuid>) -> ApiResult<AllocationView> {
    ok(s.allocations.release(&p, id).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
struct Extension {
    /// Minutes to add to the end time (the whole allocation may run at most 7 days).
    minutes: u32,
}

#[utoipa::path(post, path = "/api/v1/allocations/{id}/extend", tag = "allocations", request_body = Extension,
    description = "Extends an active allocation (owner, team admin, platform admin).",
    responses((status = 200, description = "OK", body = AllocationView), Forbidden, NotFound, Conflict, Invalid))]
async fn extend_allocation(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
    JsonBody(b): JsonBody<Extension>,
) -> ApiResult<AllocationView> {
    ok(s.allocations.extend(&p, id, b.minutes).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
struct Decision {
    /// Shown to the requester; at most 500 characters.
    #[serde(default)]
    reason: String,
}

#[utoipa::path(post, path = "/api/v1/allocations/{id}/approve", tag = "allocations", request_body = Decision,
    responses((status = 200, description = "OK", body = AllocationView), Forbidden, NotFound, Conflict, Invalid))]
async fn approve_allocation(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
    JsonBody(b): JsonBody<Decision>,
) -> ApiResult<AllocationView> {
    ok(s.allocations.decide(&p, id, true, &b.reason).await)
}

#[utoipa::path(post, path = "/api/v1/allocations/{id}/deny", tag = "allocations", request_body = Decision,
    responses((status = 200, description = "OK", body = AllocationView), Forbidden, NotFound, Conflict, Invalid))]
async fn deny_allocation(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
    JsonBody(b): JsonBody<Decision>,
) -> ApiResult<AllocationView> {
    ok(s.allocations.decide(&p, id, false, &b.reason).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/quotas", tag = "allocations",
    responses((status = 200, description = "OK", body = Vec<QuotaView>), NotFound))]
async fn list_quotas(Call(s, p): Call, Path(team): Path<Uuid>) -> ApiResult<Vec<QuotaView>> {
    ok(s.allocations.quotas(&p, TeamId(team)).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
struct QuotaBody {
    /// Units (compute slices) always available to the team.
    guaranteed: u32,
    /// Most units the team may hold, borrowing idle capacity beyond `guaranteed`.
    limit: u32,
    /// Most units one member may hold.
    per_user: u32,
}

#[utoipa::path(put, path = "/api/v1/teams/{id}/quotas/{model}", tag = "allocations", request_body = QuotaBody,
    description = "Sets the team's quota on a GPU model (platform admin). Returns the team's quotas.",
    responses((status = 200, description = "OK", body = Vec<QuotaView>), Forbidden, NotFound, Invalid))]
async fn set_quota(
    Call(s, p): Call,
    Path((team, model)): Path<(Uuid, String)>,
    JsonBody(b): JsonBody<QuotaBody>,
) -> ApiResult<Vec<QuotaView>> {
    ok(s.allocations
        .set_quota(&p, TeamId(team), &model, b.guaranteed, b.limit, b.per_user)
        .await)
}

#[derive(Deserialize, utoipa::IntoParams)]
struct AuditQuery {
    /// Only this action, e.g. `allocation.approve` or `quota.set`.
    action: Option<String>,
    #[serde(default)]
    offset: u32,
    #[serde(default = "default_limit")]
    limit: u32,
}

#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", params(AuditQuery),
    description = "Who did what and when, newest first (platform admin): allocation requests, \
                   approvals, denials, releases, quota changes.",
    responses((status = 200, description = "OK", body = Page<AuditEntryView>), Forbidden))]
async fn audit_log(
    Call(s, p): Call,
    Query(q): Query<AuditQuery>,
) -> ApiResult<Page<AuditEntryView>> {
    ok(s.allocations
        .audit_log(&p, q.action.as_deref(), PageRequest::new(q.offset, q.limit))
        .await)
}

// ---- billing ----

#[utoipa::path(get, path = "/api/v1/rates", tag = "billing",
    description = "Every price (per unit of a kind and hour, minor units): current, past and \
                   scheduled. A MIG profile without a price of its own costs its model's \
                   whole-GPU price pro rata by compute slices.",
    responses((status = 200, description = "OK", body = Vec<RateView>)))]
async fn list_rates(Call(s, p): Call) -> ApiResult<Vec<RateView>> {
    ok(s.billing.rates(&p).await)
}

#[derive(Deserialize, utoipa::IntoParams)]
struct EstimateParams {
    /// What would be requested, e.g. `H100-80GB:1g.10gb`, `H100-80GB:whole` or
    /// `T4-16GB:share:250`.
    kind: String,
    /// How many (default 1).
    count: Option<u32>,
    /// For how long; omitted or 0: open-ended, which has no estimate (0).
    duration_hours: Option<u32>,
    /// `high`, `normal` (default) or `preemptible` (discounted where the rate says so).
    priority: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/estimate", tag = "billing", params(EstimateParams),
    description = "What a request would cost at today's rates, as the request form shows it.",
    responses((status = 200, description = "OK", body = CostEstimate), Invalid))]
async fn estimate_cost(
    Call(s, p): Call,
    Query(q): Query<EstimateParams>,
) -> ApiResult<CostEstimate> {
    let query = EstimateQuery {
        kind: q.kind.parse()?,
        count: q.count.unwrap_or(1),
        duration_hours: q.duration_hours.unwrap_or(0),
        priority: q
            .priority
            .as_deref()
            .map_or(Ok(Default::default()), str::parse)?,
    };
    ok(s.billing.quote(&p, &query, chrono::Utc::now()).await)
}

#[utoipa::path(post, path = "/api/v1/rates", tag = "billing", request_body = NewRate,
    description = "Sets a price from a full hour on (platform admin); hours already billed keep \
                   their price, so `effective_from` may not be in the past.",
    responses((status = 201, description = "Created", body = RateView), Forbidden, Invalid))]
async fn set_rate(Call(s, p): Call, JsonBody(b): JsonBody<NewRate>) -> Created<RateView> {
    created(s.billing.set_rate(&p, &b).await)
}

#[utoipa::path(get, path = "/api/v1/budgets", tag = "billing",
    description = "Every team's monthly budget and spend this month (platform admin).",
    responses((status = 200, description = "OK", body = Vec<BudgetView>), Forbidden))]
async fn list_budgets(Call(s, p): Call) -> ApiResult<Vec<BudgetView>> {
    ok(s.billing.budgets(&p).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/budget", tag = "billing",
    responses((status = 200, description = "OK", body = BudgetView), NotFound))]
async fn get_budget(Call(s, p): Call, Path(team): Path<Uuid>) -> ApiResult<BudgetView> {
    ok(s.billing.budget(&p, TeamId(team)).await)
}

#[utoipa::path(put, path = "/api/v1/teams/{id}/budget", tag = "billing", request_body = SetBudget,
    description = "Sets (or with `monthly_minor: null` removes) the team's monthly budget \
                   (platform admin). A hard budget sends requests that would exceed it to a \
                   platform admin for approval.",
    responses((status = 200, description = "OK", body = BudgetView), Forbidden, NotFound, Invalid))]
async fn set_budget(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
    JsonBody(b): JsonBody<SetBudget>,
) -> ApiResult<BudgetView> {
    ok(s.billing.set_budget(&p, TeamId(team), &b).await)
}

#[derive(Deserialize, utoipa::IntoParams)]
struct PeriodQuery {
    /// A team id; omitted: every team (platform admins only).
    team: Option<String>,
    /// First day, `YYYY-MM-DD` (UTC); default the first of this month.
    from: Option<String>,
    /// Last day, inclusive; default today.
    to: Option<String>,
}

impl PeriodQuery {
    fn usage(self) -> UsageQuery {
        UsageQuery {
            team: self.team,
            from: self.from,
            to: self.to,
        }
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
struct LedgerQuery {
    /// A team id; omitted: every team (platform admins only).
    team: Option<String>,
    from: Option<String>,
    to: Option<String>,
    #[serde(default)]
    offset: u32,
    #[serde(default = "default_limit")]
    limit: u32,
}

#[utoipa::path(get, path = "/api/v1/ledger", tag = "billing", params(LedgerQuery),
    description = "Ledger entries for hours in the period, newest first: platform admins (all \
                   teams or one), team admins (their team). Each charge is two entries (team \
                   debit, platform credit) sharing a `txn_id`; they sum to zero.",
    responses((status = 200, description = "OK", body = Page<LedgerEntryView>), Forbidden, NotFound, Invalid))]
async fn ledger(
    Call(s, p): Call,
    Query(q): Query<LedgerQuery>,
) -> ApiResult<Page<LedgerEntryView>> {
    let page = PageRequest::new(q.offset, q.limit);
    let query = UsageQuery {
        team: q.team,
        from: q.from,
        to: q.to,
    };
    ok(s.billing.ledger(&p, &query, page).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
struct Reversal {
    /// Why (kept in the ledger entry and the audit trail); at most 500 characters.
    reason: String,
}

#[utoipa::path(post, path = "/api/v1/ledger/{txn_id}/reverse", tag = "billing", request_body = Reversal,
    description = "Reverses one charge with a reversing pair of entries (platform admin). A charge \
                   is reversed at most once; entries are never edited.",
    responses((status = 200, description = "The reversing entries", body = Vec<LedgerEntryView>), Forbidden, NotFound, Conflict, Invalid))]
async fn reverse_charge(
    Call(s, p): Call,
    Path(txn): Path<Uuid>,
    JsonBody(b): JsonBody<Reversal>,
) -> ApiResult<Vec<LedgerEntryView>> {
    ok(s.billing.reverse(&p, txn, &b.reason).await)
}

#[utoipa::path(get, path = "/api/v1/usage", tag = "billing", params(PeriodQuery),
    description = "GPU-time and cost per day, GPU kind, user and team. Platform admins see every \
                   team; team admins their team; members their own usage in a team.",
    responses((status = 200, description = "OK", body = UsageReport), NotFound, Invalid))]
async fn usage(Call(s, p): Call, Query(q): Query<PeriodQuery>) -> ApiResult<UsageReport> {
    ok(s.billing.usage(&p, &q.usage()).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/statements/{month}", tag = "billing",
    params(("id" = Uuid, Path), ("month" = String, Path, description = "`YYYY-MM`")),
    description = "What the team owes for a calendar month (UTC): team admins, platform admins.",
    responses((status = 200, description = "OK", body = Statement), Forbidden, NotFound, Invalid))]
async fn statement(
    Call(s, p): Call,
    Path((team, month)): Path<(Uuid, String)>,
) -> ApiResult<Statement> {
    ok(s.billing.statement(&p, TeamId(team), &month).await)
}

fn csv_response(filename: &str, body: axum::body::Body) -> axum::response::Response {
    let mut res = axum::response::Response::new(body);
    let h = res.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    if let Ok(v) = http::HeaderValue::from_str(&format!("attachment; filename=\"{filename}\"")) {
        h.insert(http::header::CONTENT_DISPOSITION, v);
    }
    res
}

#[utoipa::path(get, path = "/api/v1/exports/chargeback.csv", tag = "billing", params(PeriodQuery),
    description = "The chargeback file for hours in the period, one row per ledger entry of a \
                   team (a metered allocation-hour, or its reversal), with FinOps FOCUS column \
                   names (BilledCost, ChargePeriodStart, ResourceId = MIG or GPU UUID, \
                   SubAccountName = team, …). Streamed; the BilledCost total equals the ledger's \
                   for the period. Platform admins: all teams or one; team admins: their team.",
    responses((status = 200, description = "CSV", content_type = "text/csv", body = String), Forbidden, NotFound, Invalid))]
async fn chargeback_csv(
    Call(s, p): Call,
    Query(q): Query<PeriodQuery>,
) -> Result<axum::response::Response, ApiError> {
    let csv = s.billing.chargeback(&p, &q.usage()).await?;
    let filename = csv.filename.clone();
    let stream = futures_util::stream::unfold(Some(csv), |state| async move {
        let mut csv = state?;
        match csv.next_chunk().await {
            Ok(Some(chunk)) => Some((Ok(bytes::Bytes::from(chunk)), Some(csv))),
            Ok(None) => None,
            // The status is sent already: end the body early so the client sees a
            // truncated (not a silently complete) download.
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), None)),
        }
    });
    Ok(csv_response(
        &filename,
        axum::body::Body::from_stream(stream),
    ))
}

#[utoipa::path(get, path = "/api/v1/exports/usage.csv", tag = "billing", params(PeriodQuery),
    description = "Usage per day (GPU-hours, active GPU-hours, efficiency, cost): the usage \
                   chart's data, with the same visibility as `/api/v1/usage`.",
    responses((status = 200, description = "CSV", content_type = "text/csv", body = String), NotFound, Invalid))]
async fn usage_csv(
    Call(s, p): Call,
    Query(q): Query<PeriodQuery>,
) -> Result<axum::response::Response, ApiError> {
    let body = s.billing.usage_csv(&p, &q.usage()).await?;
    Ok(csv_response(
        "tessera-usage.csv",
        axum::body::Body::from(body),
    ))
}

// ---- workloads ----

#[derive(Deserialize, utoipa::IntoParams)]
struct WorkloadQuery {
    /// `notebook` or `job`.
    kind: Option<WorkloadKind>,
    /// Only this team's.
    team: Option<Uuid>,
    /// Only those on this allocation.
    allocation: Option<Uuid>,
    /// Only the caller's own.
    #[serde(default)]
    mine: bool,
    /// Only those not ended.
    #[serde(default)]
    live: bool,
    #[serde(default)]
    offset: u32,
    #[serde(default = "default_limit")]
    limit: u32,
}

#[utoipa::path(get, path = "/api/v1/workloads", tag = "workloads", params(WorkloadQuery),
    description = "Notebooks and jobs the caller may see (their teams'; platform admins: all), newest first.",
    responses((status = 200, description = "OK", body = Page<WorkloadView>), NotFound, Invalid))]
async fn list_workloads(
    Call(s, p): Call,
    Query(q): Query<WorkloadQuery>,
) -> ApiResult<Page<WorkloadView>> {
    let filter = WorkloadFilter {
        kind: q.kind,
        team: q.team.map(TeamId),
        allocation: q.allocation,
        mine: q.mine,
        live: q.live,
    };
    ok(s.workloads
        .list(&p, &filter, PageRequest::new(q.offset, q.limit))
        .await)
}

/// Environment variables as `{"NAME": "value"}` (values without line breaks).
fn env_lines(env: &std::collections::BTreeMap<String, String>) -> Result<String, AppError> {
    let mut out = String::new();
    for (k, v) in env {
        if k.contains(['\n', '=']) || v.contains('\n') {
            return Err(AppError::invalid(
                "env",
                format!(
                    "`{}`: names cannot contain `=` or line breaks, values no line breaks",
                    k.escape_debug()
                ),
            ));
        }
        out.push_str(&format!("{k}={v}\n"));
    }
    Ok(out)
}

/// A GPU request of a workload's own, instead of an `allocation_id`: the workload waits
/// `queued` until it is active (same quota, approval and queue as any request) and gives it
/// back when it ends.
#[derive(Deserialize, utoipa::ToSchema)]
struct OwnGpu {
    /// `H100-80GB:1g.10gb` or `H100-80GB:whole`.
    gpu: Option<String>,
    /// How many of `gpu`; 1 when absent.
    #[serde(default)]
    count: Option<u32>,
    /// The team that pays; the caller's only team when absent.
    #[serde(default)]
    team_id: Option<String>,
    /// `high`, `normal` (default) or `preemptible`.
    #[serde(default)]
    priority: Option<String>,
    /// Longest run in minutes (the allocation's duration); the policy's default when absent.
    #[serde(default)]
    time_limit_minutes: Option<u32>,
}

impl OwnGpu {
    fn request(&self) -> Option<NewAllocation> {
        let gpu = self.gpu.as_deref()?;
        Some(NewAllocation {
            team_id: self.team_id.clone().unwrap_or_default(),
            kind: gpu.to_owned(),
            count: self.count.unwrap_or(1),
            duration_minutes: self.time_limit_minutes,
            starts_at: None,
            priority: self.priority.clone(),
            purpose: String::new(),
        })
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
struct NewNotebookBody {
    /// An active allocation of the caller's; or give `gpu` or `profile_id` instead.
    #[serde(default)]
    allocation_id: Option<Uuid>,
    /// One of the caller's teams' notebook profiles (its GPU and hours, its team pays).
    #[serde(default)]
    profile_id: Option<Uuid>,
    #[serde(flatten)]
    own: OwnGpu,
    /// The notebook's name (its URL is `/user/{username}/{name}/lab`); lowercase letters,
    /// digits and `-`.
    name: String,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
}

#[utoipa::path(post, path = "/api/v1/notebooks", tag = "workloads", request_body = NewNotebookBody,
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeating a request with the same key returns the notebook the first one made.")),
    description = "Launches JupyterLab on one of the caller's active allocations, or with a GPU \
                   request of its own (`gpu`): then it is `queued` until that GPU is active and \
                   gives it back when stopped. It is `pending`, then `starting`, then `running` \
                   once it answers; open its `url` (through the server's authenticated proxy).",
    responses((status = 201, description = "Created", body = WorkloadView), Invalid, Conflict))]
async fn launch_notebook(
    Call(s, p): Call,
    headers: http::HeaderMap,
    JsonBody(b): JsonBody<NewNotebookBody>,
) -> Created<WorkloadView> {
    let req = NewNotebook {
        allocation_id: b.allocation_id,
        gpu: b.own.request(),
        profile_id: b.profile_id,
        name: b.name,
        env: env_lines(&b.env)?,
        idempotency_key: headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    };
    created(s.workloads.launch_notebook(&p, &req).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/notebook-profiles", tag = "workloads",
    description = "The team's named notebook profiles (GPU and hours a member starts a notebook \
                   with in one click: `POST /api/v1/notebooks {profile_id}`).",
    responses((status = 200, description = "OK", body = Vec<NotebookProfile>), NotFound))]
async fn list_notebook_profiles(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
) -> ApiResult<Vec<NotebookProfile>> {
    ok(s.workloads.profiles(&p, Some(TeamId(team))).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
struct NewProfile {
    /// E.g. `Small`; a profile of the same name is replaced.
    name: String,
    /// `H100-80GB:1g.10gb`, `H100-80GB:whole`.
    kind: String,
    /// How long its notebooks may run.
    hours: u32,
}

#[utoipa::path(post, path = "/api/v1/teams/{id}/notebook-profiles", tag = "workloads",
    request_body = NewProfile, description = "Adds (or replaces by name) a notebook profile \
    of the team: team admins and platform admins.",
    responses((status = 201, description = "Created", body = NotebookProfile), Forbidden, NotFound, Invalid))]
async fn save_notebook_profile(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
    JsonBody(b): JsonBody<NewProfile>,
) -> Created<NotebookProfile> {
    created(
        s.workloads
            .save_profile(&p, TeamId(team), &b.name, &b.kind, b.hours)
            .await,
    )
}

#[utoipa::path(delete, path = "/api/v1/teams/{id}/notebook-profiles/{profile_id}", tag = "workloads",
    responses((status = 204, description = "Done"), Forbidden, NotFound))]
async fn delete_notebook_profile(
    Call(s, p): Call,
    Path((team, id)): Path<(Uuid, Uuid)>,
) -> Result<StatusCode, ApiError> {
    s.workloads.delete_profile(&p, TeamId(team), id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, utoipa::ToSchema)]
struct NewJobBody {
    /// An active allocation of the caller's; or give `gpu` instead.
    #[serde(default)]
    allocation_id: Option<Uuid>,
    #[serde(flatten)]
    own: OwnGpu,
    /// Shell command (`/bin/sh -c`), run in the team workspace.
    command: String,
    /// Default: the start of the command.
    #[serde(default)]
    name: String,
    /// Folder inside the team workspace (must exist).
    #[serde(default)]
    workdir: String,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    /// Times a failed run is started again (0–5).
    #[serde(default)]
    retries: u32,
    /// One task of a sweep (`tessera job submit --array`): its index, which the run gets as
    /// `TESSERA_ARRAY_INDEX`.
    #[serde(default)]
    array_index: Option<u32>,
}

#[utoipa::path(post, path = "/api/v1/jobs", tag = "workloads", request_body = NewJobBody,
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeating a request with the same key returns the job the first one made.")),
    description = "Runs a command on one of the caller's active allocations, or with a GPU request \
                   of its own (`gpu`, `count`, `priority`, `time_limit_minutes`): then it waits \
                   `queued` (see `waiting`) until that GPU is active and gives it back when it \
                   ends. `pending → running → succeeded | failed` (with its exit code), or \
                   `cancelled`. Logs: `/api/v1/workloads/{id}/logs`.",
    responses((status = 201, description = "Created", body = WorkloadView), Invalid, Conflict))]
async fn submit_job(
    Call(s, p): Call,
    headers: http::HeaderMap,
    JsonBody(b): JsonBody<NewJobBody>,
) -> Created<WorkloadView> {
    let req = NewJob {
        allocation_id: b.allocation_id,
        gpu: b.own.request(),
        array_index: b.array_index,
        name: b.name,
        command: b.command,
        workdir: b.workdir,
        env: env_lines(&b.env)?,
        retries: b.retries.to_string(),
        idempotency_key: headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    };
    created(s.workloads.submit_job(&p, &req).await)
}

#[utoipa::path(get, path = "/api/v1/workloads/{id}", tag = "workloads",
    description = "A notebook or job; running notebooks include their idle-reclaim signals and decision.",
    responses((status = 200, description = "OK", body = WorkloadView), NotFound))]
async fn get_workload(Call(s, p): Call, Path(id): Path<Uuid>) -> ApiResult<WorkloadView> {
    ok(s.workloads.get(&p, id).await)
}

#[utoipa::path(post, path = "/api/v1/workloads/{id}/stop", tag = "workloads",
    description = "Stops a notebook or cancels a job (owner, team admin, platform admin); its \
                   process group is killed on the node.",
    responses((status = 200, description = "OK", body = WorkloadView), Forbidden, NotFound, Conflict))]
async fn stop_workload(Call(s, p): Call, Path(id): Path<Uuid>) -> ApiResult<WorkloadView> {
    ok(s.workloads.stop(&p, id).await)
}

#[derive(Deserialize, utoipa::IntoParams)]
struct LogQuery {
    /// Byte offset to read from (a previous answer's `next`); default: the last `max` bytes.
    from: Option<u64>,
    /// Bytes to return at most (1 KiB–1 MiB, default 64 KiB).
    #[serde(default = "default_log_max")]
    max: u64,
}

fn default_log_max() -> u64 {
    64 * 1024
}

#[utoipa::path(get, path = "/api/v1/workloads/{id}/logs", tag = "workloads", params(LogQuery),
    description = "Output (stdout and stderr) from byte `from`; poll with `from = next` to follow. \
                   `complete` once the workload ended and all its output arrived. Owner, team \
                   admin, platform admin.",
    responses((status = 200, description = "OK", body = LogSlice), Forbidden, NotFound, Invalid))]
async fn workload_logs(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
    Query(q): Query<LogQuery>,
) -> ApiResult<LogSlice> {
    ok(s.workloads.logs(&p, id, q.from, q.max).await)
}

#[utoipa::path(get, path = "/api/v1/workloads/{id}/log.txt", tag = "workloads",
    description = "The whole log kept (the newest 4 MiB), as a download.",
    responses((status = 200, description = "Log", content_type = "text/plain", body = String), Forbidden, NotFound))]
async fn workload_log_file(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
) -> Result<axum::response::Response, ApiError> {
    let (file, text) = s.workloads.log_text(&p, id).await?;
    let mut res = axum::response::IntoResponse::into_response(text);
    let h = res.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(v) = http::HeaderValue::from_str(&format!("attachment; filename=\"{file}\"")) {
        h.insert(http::header::CONTENT_DISPOSITION, v);
    }
    Ok(res)
}
