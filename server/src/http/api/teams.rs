//! Teams and their members.

use super::*;
use tessera_domain::drain::{GraceRequest, TeamGrace};

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct TeamBody {
    name: String,
}

#[utoipa::path(get, path = "/api/v1/teams", tag = "teams", params(PageRequest),
    description = "Platform admins see every team; others see the teams they belong to.",
    responses((status = 200, description = "OK", body = Page<TeamView>)))]
pub(super) async fn list_teams(
    Call(s, p): Call,
    Query(page): Query<PageRequest>,
) -> ApiResult<Page<TeamView>> {
    ok(s.tenancy.list_teams(&p, page).await)
}

#[utoipa::path(post, path = "/api/v1/teams", tag = "teams", request_body = TeamBody,
    responses((status = 201, description = "Created", body = TeamView), Forbidden, Invalid))]
pub(super) async fn create_team(
    Call(s, p): Call,
    JsonBody(b): JsonBody<TeamBody>,
) -> Created<TeamView> {
    created(s.tenancy.create_team(&p, &b.name).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}", tag = "teams",
    responses((status = 200, description = "OK", body = TeamView), NotFound))]
pub(super) async fn get_team(Call(s, p): Call, Path(team): Path<Uuid>) -> ApiResult<TeamView> {
    ok(s.tenancy.team(&p, TeamId(team)).await)
}

#[utoipa::path(patch, path = "/api/v1/teams/{id}", tag = "teams", request_body = TeamBody,
    responses((status = 200, description = "OK", body = TeamView), Forbidden, NotFound))]
pub(super) async fn rename_team(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
    JsonBody(b): JsonBody<TeamBody>,
) -> ApiResult<TeamView> {
    ok(s.tenancy.rename_team(&p, TeamId(team), &b.name).await)
}

#[utoipa::path(post, path = "/api/v1/teams/{id}/archive", tag = "teams",
    responses((status = 200, description = "OK", body = TeamView), Forbidden, NotFound))]
pub(super) async fn archive_team(Call(s, p): Call, Path(team): Path<Uuid>) -> ApiResult<TeamView> {
    ok(s.tenancy.set_team_archived(&p, TeamId(team), true).await)
}

#[utoipa::path(post, path = "/api/v1/teams/{id}/unarchive", tag = "teams",
    responses((status = 200, description = "OK", body = TeamView), Forbidden, NotFound))]
pub(super) async fn unarchive_team(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
) -> ApiResult<TeamView> {
    ok(s.tenancy.set_team_archived(&p, TeamId(team), false).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/grace", tag = "teams",
    description = "The team's own grace before an early stop of its work (the deadline channel): \
                   what it set, what applies, and the platform maximum (`TESSERA_PREEMPTION_GRACE`).",
    responses((status = 200, description = "OK", body = TeamGrace), NotFound))]
pub(super) async fn get_team_grace(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
) -> ApiResult<TeamGrace> {
    ok(s.allocations.team_grace(&p, TeamId(team)).await)
}

#[utoipa::path(put, path = "/api/v1/teams/{id}/grace", tag = "teams", request_body = GraceRequest,
    description = "Sets the team's grace in seconds (team admin or platform admin, audited): how \
                   long its work is warned (signal, deadline file) before a reclaim preemption or \
                   a booking stops it; a user's stop warns at most 30 s of it. `null` goes back to \
                   the platform maximum; above it or negative: 422 on `preemption_grace_secs`.",
    responses((status = 200, description = "OK", body = TeamGrace), Forbidden, NotFound, Invalid, Conflict))]
pub(super) async fn set_team_grace(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
    JsonBody(b): JsonBody<GraceRequest>,
) -> ApiResult<TeamGrace> {
    ok(s.allocations.set_team_grace(&p, TeamId(team), &b).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct NewMember {
    username: String,
    /// `team_admin`, `member` or `viewer`.
    role: String,
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct RoleBody {
    /// `team_admin`, `member` or `viewer`.
    role: String,
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/members", tag = "teams", params(PageRequest),
    responses((status = 200, description = "OK", body = Page<MemberView>), NotFound))]
pub(super) async fn list_members(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
    Query(page): Query<PageRequest>,
) -> ApiResult<Page<MemberView>> {
    ok(s.tenancy.list_members(&p, TeamId(team), page).await)
}

#[utoipa::path(post, path = "/api/v1/teams/{id}/members", tag = "teams", request_body = NewMember,
    responses((status = 201, description = "Created", body = MemberView), Forbidden, NotFound, Invalid))]
pub(super) async fn add_member(
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
pub(super) async fn change_role(
    Call(s, p): Call,
    Path((team, user)): Path<(Uuid, Uuid)>,
    JsonBody(b): JsonBody<RoleBody>,
) -> ApiResult<MemberView> {
    let (team, user) = (TeamId(team), UserId(user));
    ok(s.tenancy.change_role(&p, team, user, &b.role).await)
}

#[utoipa::path(delete, path = "/api/v1/teams/{id}/members/{user_id}", tag = "teams",
    responses((status = 204, description = "Done"), Forbidden, NotFound, Conflict))]
pub(super) async fn remove_member(
    Call(s, p): Call,
    Path((team, user)): Path<(Uuid, Uuid)>,
) -> Result<StatusCode, ApiError> {
    let (team, user) = (TeamId(team), UserId(user));
    s.tenancy.remove_member(&p, team, user).await?;
    Ok(StatusCode::NO_CONTENT)
}
