//! Allocations, quotas and the audit trail.

use super::*;

#[utoipa::path(get, path = "/api/v1/cluster/free", tag = "allocations",
    description = "Devices free right now per kind (`H100-80GB:1g.10gb`: existing free MIG \
                   instances; `A100-SXM4-40GB:whole`: idle GPUs without MIG), as of the last \
                   scheduler pass. Re-partitioning an idle GPU may free more.",
    responses((status = 200, description = "OK", body = std::collections::BTreeMap<String, u32>)))]
pub(super) async fn free_now(
    Call(s, p): Call,
) -> ApiResult<std::collections::BTreeMap<String, u32>> {
    Ok(Json(s.allocations.free_now(&p)))
}

#[derive(Deserialize, utoipa::IntoParams)]
pub(super) struct AllocationQuery {
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

#[utoipa::path(get, path = "/api/v1/allocations", tag = "allocations", params(AllocationQuery),
    description = "Allocations the caller may see (platform admins: all teams), newest first.",
    responses((status = 200, description = "OK", body = Page<AllocationView>), NotFound, Invalid))]
pub(super) async fn list_allocations(
    Call(s, p): Call,
    Query(q): Query<AllocationQuery>,
) -> ApiResult<Page<AllocationView>> {
    let filter = ListFilter {
        team: q.team.map(TeamId),
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
pub(super) async fn request_allocation(
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
pub(super) async fn get_allocation(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
) -> ApiResult<AllocationView> {
    ok(s.allocations.get(&p, id.into()).await)
}

#[utoipa::path(post, path = "/api/v1/allocations/{id}/release", tag = "allocations",
    description = "Releases an active allocation or cancels a pending one (owner, team admin, platform admin).",
    responses((status = 200, description = "OK", body = AllocationView), Forbidden, NotFound, Conflict))]
pub(super) async fn release_allocation(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
) -> ApiResult<AllocationView> {
    ok(s.allocations.release(&p, id.into()).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct Extension {
    /// Minutes to add to the end time (the whole allocation may run at most 7 days).
    minutes: u32,
}

#[utoipa::path(post, path = "/api/v1/allocations/{id}/extend", tag = "allocations", request_body = Extension,
    description = "Extends an active allocation (owner, team admin, platform admin).",
    responses((status = 200, description = "OK", body = AllocationView), Forbidden, NotFound, Conflict, Invalid))]
pub(super) async fn extend_allocation(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
    JsonBody(b): JsonBody<Extension>,
) -> ApiResult<AllocationView> {
    ok(s.allocations.extend(&p, id.into(), b.minutes).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Decision {
    /// Shown to the requester; at most 500 characters.
    #[serde(default)]
    reason: String,
    /// Approving: a platform admin's explicit override to go beyond the team's limit or
    /// hard budget (recorded on the allocation and audited). Anyone else gets 403.
    #[serde(default, rename = "override")]
    overrides: bool,
}

impl Decision {
    fn with(&self, approve: bool) -> tessera_core::services::allocations::Decision<'_> {
        tessera_core::services::allocations::Decision {
            approve,
            reason: &self.reason,
            overrides: self.overrides,
        }
    }
}

#[utoipa::path(post, path = "/api/v1/allocations/{id}/approve", tag = "allocations", request_body = Decision,
    responses((status = 200, description = "OK", body = AllocationView), Forbidden, NotFound, Conflict, Invalid))]
pub(super) async fn approve_allocation(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
    JsonBody(b): JsonBody<Decision>,
) -> ApiResult<AllocationView> {
    ok(s.allocations.decide(&p, id.into(), b.with(true)).await)
}

#[utoipa::path(post, path = "/api/v1/allocations/{id}/deny", tag = "allocations", request_body = Decision,
    responses((status = 200, description = "OK", body = AllocationView), Forbidden, NotFound, Conflict, Invalid))]
pub(super) async fn deny_allocation(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
    JsonBody(b): JsonBody<Decision>,
) -> ApiResult<AllocationView> {
    ok(s.allocations.decide(&p, id.into(), b.with(false)).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/quotas", tag = "allocations",
    responses((status = 200, description = "OK", body = Vec<QuotaView>), NotFound))]
pub(super) async fn list_quotas(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
) -> ApiResult<Vec<QuotaView>> {
    ok(s.allocations.quotas(&p, TeamId(team)).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct QuotaBody {
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
pub(super) async fn set_quota(
    Call(s, p): Call,
    Path((team, model)): Path<(Uuid, String)>,
    JsonBody(b): JsonBody<QuotaBody>,
) -> ApiResult<Vec<QuotaView>> {
    ok(s.allocations
        .set_quota(&p, TeamId(team), &model, b.guaranteed, b.limit, b.per_user)
        .await)
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PriorityBody {
    /// Whether the team may ask for `high` priority.
    high: bool,
    /// With `high`: most units the team may hold at high priority on any one quota line
    /// (absent: no cap beyond its quota).
    #[serde(default)]
    cap: Option<u32>,
}

#[utoipa::path(put, path = "/api/v1/teams/{id}/priority", tag = "allocations", request_body = PriorityBody,
    description = "Grants or withdraws `high` priority for a team (platform admin, audited). \
                   Requests at `high` from a team without the grant are refused (422 on `priority`).",
    responses((status = 200, description = "OK", body = TeamView), Forbidden, NotFound, Invalid))]
pub(super) async fn set_team_priority(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
    JsonBody(b): JsonBody<PriorityBody>,
) -> ApiResult<TeamView> {
    let grant = b
        .high
        .then_some(tessera_domain::alloc::HighGrant { cap: b.cap });
    s.allocations
        .set_high_priority(&p, TeamId(team), grant)
        .await?;
    ok(s.tenancy.team(&p, TeamId(team)).await)
}

#[derive(Deserialize, utoipa::IntoParams)]
pub(super) struct AuditQuery {
    /// Only this action, e.g. `allocation.approve` or `quota.set` (an `AuditAction`);
    /// empty for all. An action that does not exist is refused.
    action: Option<String>,
    #[serde(default)]
    offset: u32,
    #[serde(default = "default_limit")]
    limit: u32,
}

#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", params(AuditQuery),
    description = "Who did what and when, newest first (platform admin): allocation requests, \
                   approvals, denials, releases, quota changes.",
    responses((status = 200, description = "OK", body = Page<AuditEntryView>), Forbidden, Invalid))]
pub(super) async fn audit_log(
    Call(s, p): Call,
    Query(q): Query<AuditQuery>,
) -> ApiResult<Page<AuditEntryView>> {
    ok(s.allocations
        .audit_log(&p, q.action.as_deref(), PageRequest::new(q.offset, q.limit))
        .await)
}
