//! Users: list, create, disable, enable, reset a password (platform admins).

use super::*;

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct NewUser {
    username: String,
    password: String,
    #[serde(default)]
    is_admin: bool,
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct NewPasswordBody {
    password: String,
}

#[utoipa::path(get, path = "/api/v1/users", tag = "users", params(PageRequest),
    responses((status = 200, description = "OK", body = Page<UserView>), Forbidden))]
pub(super) async fn list_users(
    Call(s, p): Call,
    Query(page): Query<PageRequest>,
) -> ApiResult<Page<UserView>> {
    ok(s.tenancy.list_users(&p, page).await)
}

#[utoipa::path(post, path = "/api/v1/users", tag = "users", request_body = NewUser,
    responses((status = 201, description = "Created", body = UserView), Forbidden, Invalid))]
pub(super) async fn create_user(
    Call(s, p): Call,
    JsonBody(b): JsonBody<NewUser>,
) -> Created<UserView> {
    created(
        s.tenancy
            .create_user(&p, &b.username, &b.password, b.is_admin)
            .await,
    )
}

#[utoipa::path(post, path = "/api/v1/users/{id}/disable", tag = "users",
    description = "Signs the user out everywhere and revokes their API tokens.",
    responses((status = 200, description = "OK", body = UserView), Forbidden, NotFound))]
pub(super) async fn disable_user(Call(s, p): Call, Path(user): Path<Uuid>) -> ApiResult<UserView> {
    let user = UserId(user);
    ok(s.tenancy.set_user_disabled(&p, user, true).await)
}

#[utoipa::path(post, path = "/api/v1/users/{id}/enable", tag = "users",
    responses((status = 200, description = "OK", body = UserView), Forbidden, NotFound))]
pub(super) async fn enable_user(Call(s, p): Call, Path(user): Path<Uuid>) -> ApiResult<UserView> {
    let user = UserId(user);
    ok(s.tenancy.set_user_disabled(&p, user, false).await)
}

#[utoipa::path(post, path = "/api/v1/users/{id}/password", tag = "users", request_body = NewPasswordBody,
    responses((status = 200, description = "OK", body = UserView), Forbidden, NotFound))]
pub(super) async fn reset_password(
    Call(s, p): Call,
    Path(user): Path<Uuid>,
    JsonBody(b): JsonBody<NewPasswordBody>,
) -> ApiResult<UserView> {
    let user = UserId(user);
    ok(s.tenancy.reset_password(&p, user, &b.password).await)
}
