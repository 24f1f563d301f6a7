//! Personal API tokens.

use super::*;

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct NewToken {
    name: String,
    /// Days until it stops working (1–366); omit for no expiry.
    expires_in_days: Option<u32>,
}

#[utoipa::path(get, path = "/api/v1/tokens", tag = "account", params(PageRequest),
    responses((status = 200, description = "OK", body = Page<ApiTokenView>)))]
pub(super) async fn list_tokens(
    Call(s, p): Call,
    Query(page): Query<PageRequest>,
) -> ApiResult<Page<ApiTokenView>> {
    ok(s.tokens.list(&p, page).await)
}

#[utoipa::path(post, path = "/api/v1/tokens", tag = "account", request_body = NewToken,
    description = "The secret is in the response only; it is stored hashed.",
    responses((status = 201, description = "Created", body = CreatedSecret<ApiTokenView>), Invalid))]
pub(super) async fn create_token(
    Call(s, p): Call,
    JsonBody(b): JsonBody<NewToken>,
) -> Created<CreatedSecret<ApiTokenView>> {
    created(s.tokens.create(&p, &b.name, b.expires_in_days).await)
}

#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "account",
    responses((status = 204, description = "Done"), NotFound))]
pub(super) async fn revoke_token(
    Call(s, p): Call,
    Path(token): Path<Uuid>,
) -> Result<StatusCode, ApiError> {
    s.tokens.revoke(&p, token).await?;
    Ok(StatusCode::NO_CONTENT)
}
