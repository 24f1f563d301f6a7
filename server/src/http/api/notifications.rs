//! Notifications: one's own address and preferences, a team's webhooks
//! (docs/notifications.md).

use super::*;
use axum::extract::State;
use tessera_domain::notify::{
    DeliveryView, NotificationSettings, NotificationSettingsInput, WebhookCreated, WebhookInput,
    WebhookTestResult, WebhookView,
};

#[utoipa::path(get, path = "/api/v1/me/notifications", tag = "notifications",
    description = "The caller's notification address and, for every event kind, how they get it \
                   (immediately, in the daily digest, or not at all).",
    responses((status = 200, description = "OK", body = NotificationSettings), Unauthorized))]
pub(super) async fn my_notifications(Call(s, p): Call) -> ApiResult<NotificationSettings> {
    ok(s.notifications.settings(&p).await)
}

#[utoipa::path(put, path = "/api/v1/me/notifications", tag = "notifications",
    request_body = NotificationSettingsInput,
    description = "Changes what is given: `email` (\"\" removes it) and preferences per event kind.",
    responses((status = 200, description = "OK", body = NotificationSettings), Invalid, Unauthorized))]
pub(super) async fn set_my_notifications(
    Call(s, p): Call,
    JsonBody(b): JsonBody<NotificationSettingsInput>,
) -> ApiResult<NotificationSettings> {
    ok(s.notifications.update_settings(&p, &b).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/webhooks", tag = "notifications",
    description = "The team's webhooks (team admins).",
    responses((status = 200, description = "OK", body = Vec<WebhookView>), Forbidden, NotFound))]
pub(super) async fn list_webhooks(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
) -> ApiResult<Vec<WebhookView>> {
    ok(s.notifications.webhooks(&p, team).await)
}

#[utoipa::path(post, path = "/api/v1/teams/{id}/webhooks", tag = "notifications",
    request_body = WebhookInput,
    description = "Adds a webhook (team admins). The body each event is posted with is \
                   `WebhookBody`, signed in `X-Tessera-Signature: t=<unix>,v1=<hex HMAC-SHA256 of \
                   \"<t>.<body>\" with the secret>`; the secret is in this response only. Loopback, \
                   link-local and private addresses are refused unless the platform allows them.",
    responses((status = 201, description = "Created", body = WebhookCreated), Invalid, Forbidden, NotFound, Conflict))]
pub(super) async fn create_webhook(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
    JsonBody(b): JsonBody<WebhookInput>,
) -> Created<WebhookCreated> {
    created(s.notifications.create_webhook(&p, team, &b).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/webhooks/{hook}", tag = "notifications",
    responses((status = 200, description = "OK", body = WebhookView), Forbidden, NotFound))]
pub(super) async fn get_webhook(
    Call(s, p): Call,
    Path((team, hook)): Path<(Uuid, Uuid)>,
) -> ApiResult<WebhookView> {
    ok(s.notifications.webhook(&p, team, hook).await)
}

#[utoipa::path(put, path = "/api/v1/teams/{id}/webhooks/{hook}", tag = "notifications",
    request_body = WebhookInput,
    description = "Changes a webhook's URL, events and switch (turning it on again clears its \
                   failures); the secret stays.",
    responses((status = 200, description = "OK", body = WebhookView), Invalid, Forbidden, NotFound))]
pub(super) async fn update_webhook(
    Call(s, p): Call,
    Path((team, hook)): Path<(Uuid, Uuid)>,
    JsonBody(b): JsonBody<WebhookInput>,
) -> ApiResult<WebhookView> {
    ok(s.notifications.update_webhook(&p, team, hook, &b).await)
}

#[utoipa::path(delete, path = "/api/v1/teams/{id}/webhooks/{hook}", tag = "notifications",
    responses((status = 204, description = "Done"), Forbidden, NotFound))]
pub(super) async fn delete_webhook(
    Call(s, p): Call,
    Path((team, hook)): Path<(Uuid, Uuid)>,
) -> Result<StatusCode, ApiError> {
    s.notifications.delete_webhook(&p, team, hook).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/webhooks/{hook}/deliveries", tag = "notifications",
    description = "The webhook's latest 50 deliveries, newest first.",
    responses((status = 200, description = "OK", body = Vec<DeliveryView>), Forbidden, NotFound))]
pub(super) async fn webhook_deliveries(
    Call(s, p): Call,
    Path((team, hook)): Path<(Uuid, Uuid)>,
) -> ApiResult<Vec<DeliveryView>> {
    ok(s.notifications.webhook_deliveries(&p, team, hook).await)
}

#[utoipa::path(post, path = "/api/v1/teams/{id}/webhooks/{hook}/test", tag = "notifications",
    description = "Posts a `webhook.test` event to the webhook now and answers what it said \
                   (not counted as a failure, not in the delivery log).",
    responses((status = 200, description = "OK", body = WebhookTestResult), Invalid, Forbidden, NotFound))]
pub(super) async fn test_webhook(
    State(state): State<AppState>,
    Call(s, p): Call,
    Path((team, hook)): Path<(Uuid, Uuid)>,
) -> ApiResult<WebhookTestResult> {
    let sender = crate::notify::webhook::TestSender::new(state.config.public_url());
    ok(s.notifications.test_webhook(&p, team, hook, &sender).await)
}
