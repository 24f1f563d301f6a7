//! Notifications: one's own address and preferences, a team's webhooks
//! (docs/notifications.md).

use super::*;
use axum::extract::{FromRequestParts, State};
use http::request::Parts;
use tessera_core::services::notifications::HookScope;
use tessera_domain::ids::TeamId;
use tessera_domain::notify::{
    DeliveryView, EmailVerificationInput, NotificationSettings, NotificationSettingsInput,
    WebhookCreated, WebhookInput, WebhookTestResult, WebhookView,
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

#[utoipa::path(post, path = "/api/v1/me/email/verification", tag = "notifications",
    description = "Mails a new verification link to the caller's unverified address (the \
                   previous link stops working). Mail goes only to verified addresses. At most \
                   one a minute.",
    responses((status = 204, description = "Sent (queued)"), Invalid, Conflict, Unauthorized))]
pub(super) async fn resend_email_verification(Call(s, p): Call) -> Result<StatusCode, ApiError> {
    s.notifications.resend_verification(&p).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/api/v1/email-verifications", tag = "notifications",
    request_body = EmailVerificationInput,
    description = "Verifies an address with the `user` and `token` of the mailed link. Needs no \
                   sign-in: the token proves the mailbox. The browser link opens `/verify-email`, \
                   which posts here.",
    security(()),
    responses((status = 204, description = "Verified"), Invalid))]
pub(super) async fn verify_email(
    State(state): State<AppState>,
    JsonBody(b): JsonBody<EmailVerificationInput>,
) -> Result<StatusCode, ApiError> {
    state
        .services
        .notifications
        .verify_email(b.user_id, &b.token)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

// ---- webhooks: a team's (team admins) and the platform's (platform admins) ----
//
// One handler serves both routes of each operation: `Hooks` and `Hook` read the scope from
// the path. Each route keeps its own OpenAPI entry; the platform's delegate.

/// The webhooks a path names: a team's (`/teams/{id}/webhooks…`) or the platform's
/// (`/webhooks…`).
pub(super) struct Hooks(HookScope);

/// One webhook a path names (`…/webhooks/{hook}`), in its scope.
pub(super) struct Hook(HookScope, Uuid);

#[derive(Deserialize)]
struct HookPath {
    id: Option<Uuid>,
    hook: Option<Uuid>,
}

impl HookPath {
    async fn of(parts: &mut Parts) -> Result<(HookScope, Option<Uuid>), ApiError> {
        let Path(path) = Path::<HookPath>::from_request_parts(parts, &()).await?;
        let scope = path.id.map_or(HookScope::Platform, |team| {
            HookScope::Team(TeamId::from(team))
        });
        Ok((scope, path.hook))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Hooks {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        Ok(Hooks(HookPath::of(parts).await?.0))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Hook {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        match HookPath::of(parts).await? {
            (scope, Some(hook)) => Ok(Hook(scope, hook)),
            (_, None) => Err(ApiError(AppError::NotFound)),
        }
    }
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/webhooks", tag = "notifications",
    params(("id" = Uuid, Path)),
    description = "The team's webhooks (team admins).",
    responses((status = 200, description = "OK", body = Vec<WebhookView>), Forbidden, NotFound))]
pub(super) async fn list_webhooks(
    Call(s, p): Call,
    Hooks(scope): Hooks,
) -> ApiResult<Vec<WebhookView>> {
    ok(s.notifications.webhooks(&p, scope).await)
}

#[utoipa::path(post, path = "/api/v1/teams/{id}/webhooks", tag = "notifications",
    request_body = WebhookInput, params(("id" = Uuid, Path)),
    description = "Adds a webhook (team admins). The body each event is posted with is \
                   `WebhookBody`, signed in `X-Tessera-Signature: t=<unix>,v1=<hex HMAC-SHA256 of \
                   \"<t>.<body>\" with the secret>`; the secret is in this response only. Loopback, \
                   link-local and private addresses are refused unless the platform allows them.",
    responses((status = 201, description = "Created", body = WebhookCreated), Invalid, Forbidden, NotFound, Conflict))]
pub(super) async fn create_webhook(
    Call(s, p): Call,
    Hooks(scope): Hooks,
    JsonBody(b): JsonBody<WebhookInput>,
) -> Created<WebhookCreated> {
    created(s.notifications.create_webhook(&p, scope, &b).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/webhooks/{hook}", tag = "notifications",
    params(("id" = Uuid, Path), ("hook" = Uuid, Path)),
    responses((status = 200, description = "OK", body = WebhookView), Forbidden, NotFound))]
pub(super) async fn get_webhook(
    Call(s, p): Call,
    Hook(scope, hook): Hook,
) -> ApiResult<WebhookView> {
    ok(s.notifications.webhook(&p, scope, hook).await)
}

#[utoipa::path(put, path = "/api/v1/teams/{id}/webhooks/{hook}", tag = "notifications",
    request_body = WebhookInput, params(("id" = Uuid, Path), ("hook" = Uuid, Path)),
    description = "Changes a webhook's URL, events and switch (turning it on again clears its \
                   failures); the secret stays.",
    responses((status = 200, description = "OK", body = WebhookView), Invalid, Forbidden, NotFound))]
pub(super) async fn update_webhook(
    Call(s, p): Call,
    Hook(scope, hook): Hook,
    JsonBody(b): JsonBody<WebhookInput>,
) -> ApiResult<WebhookView> {
    ok(s.notifications.update_webhook(&p, scope, hook, &b).await)
}

#[utoipa::path(delete, path = "/api/v1/teams/{id}/webhooks/{hook}", tag = "notifications",
    params(("id" = Uuid, Path), ("hook" = Uuid, Path)),
    responses((status = 204, description = "Done"), Forbidden, NotFound))]
pub(super) async fn delete_webhook(
    Call(s, p): Call,
    Hook(scope, hook): Hook,
) -> Result<StatusCode, ApiError> {
    s.notifications.delete_webhook(&p, scope, hook).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/webhooks/{hook}/deliveries", tag = "notifications",
    params(("id" = Uuid, Path), ("hook" = Uuid, Path)),
    description = "The webhook's latest 50 deliveries, newest first.",
    responses((status = 200, description = "OK", body = Vec<DeliveryView>), Forbidden, NotFound))]
pub(super) async fn webhook_deliveries(
    Call(s, p): Call,
    Hook(scope, hook): Hook,
) -> ApiResult<Vec<DeliveryView>> {
    ok(s.notifications.webhook_deliveries(&p, scope, hook).await)
}

#[utoipa::path(post, path = "/api/v1/teams/{id}/webhooks/{hook}/test", tag = "notifications",
    params(("id" = Uuid, Path), ("hook" = Uuid, Path)),
    description = "Posts a `webhook.test` event to the webhook now and answers what it said \
                   (not counted as a failure, not in the delivery log).",
    responses((status = 200, description = "OK", body = WebhookTestResult), Invalid, Forbidden, NotFound))]
pub(super) async fn test_webhook(
    State(state): State<AppState>,
    Call(s, p): Call,
    Hook(scope, hook): Hook,
) -> ApiResult<WebhookTestResult> {
    let sender = crate::notify::webhook::TestSender::new(state.config.public_url())
        .allowing_private(state.config.notify.webhook_allow_private);
    ok(s.notifications.test_webhook(&p, scope, hook, &sender).await)
}

#[utoipa::path(get, path = "/api/v1/webhooks", tag = "notifications",
    description = "The platform-wide webhooks (platform admins): they get every team's events \
                   and the platform's own (a node lost).",
    responses((status = 200, description = "OK", body = Vec<WebhookView>), Forbidden))]
pub(super) async fn list_platform_webhooks(c: Call, h: Hooks) -> ApiResult<Vec<WebhookView>> {
    list_webhooks(c, h).await
}

#[utoipa::path(post, path = "/api/v1/webhooks", tag = "notifications",
    request_body = WebhookInput,
    description = "Adds a platform-wide webhook (platform admins); signed and checked as a \
                   team's webhook is. The secret is in this response only.",
    responses((status = 201, description = "Created", body = WebhookCreated), Invalid, Forbidden))]
pub(super) async fn create_platform_webhook(
    c: Call,
    h: Hooks,
    b: JsonBody<WebhookInput>,
) -> Created<WebhookCreated> {
    create_webhook(c, h, b).await
}

#[utoipa::path(get, path = "/api/v1/webhooks/{hook}", tag = "notifications",
    params(("hook" = Uuid, Path)),
    responses((status = 200, description = "OK", body = WebhookView), Forbidden, NotFound))]
pub(super) async fn get_platform_webhook(c: Call, h: Hook) -> ApiResult<WebhookView> {
    get_webhook(c, h).await
}

#[utoipa::path(put, path = "/api/v1/webhooks/{hook}", tag = "notifications",
    request_body = WebhookInput, params(("hook" = Uuid, Path)),
    responses((status = 200, description = "OK", body = WebhookView), Invalid, Forbidden, NotFound))]
pub(super) async fn update_platform_webhook(
    c: Call,
    h: Hook,
    b: JsonBody<WebhookInput>,
) -> ApiResult<WebhookView> {
    update_webhook(c, h, b).await
}

#[utoipa::path(delete, path = "/api/v1/webhooks/{hook}", tag = "notifications",
    params(("hook" = Uuid, Path)),
    responses((status = 204, description = "Done"), Forbidden, NotFound))]
pub(super) async fn delete_platform_webhook(c: Call, h: Hook) -> Result<StatusCode, ApiError> {
    delete_webhook(c, h).await
}

#[utoipa::path(get, path = "/api/v1/webhooks/{hook}/deliveries", tag = "notifications",
    params(("hook" = Uuid, Path)),
    description = "The platform webhook's latest 50 deliveries, newest first.",
    responses((status = 200, description = "OK", body = Vec<DeliveryView>), Forbidden, NotFound))]
pub(super) async fn platform_webhook_deliveries(c: Call, h: Hook) -> ApiResult<Vec<DeliveryView>> {
    webhook_deliveries(c, h).await
}

#[utoipa::path(post, path = "/api/v1/webhooks/{hook}/test", tag = "notifications",
    params(("hook" = Uuid, Path)),
    description = "Posts a `webhook.test` event to the platform webhook now and answers what it said.",
    responses((status = 200, description = "OK", body = WebhookTestResult), Invalid, Forbidden, NotFound))]
pub(super) async fn test_platform_webhook(
    state: State<AppState>,
    c: Call,
    h: Hook,
) -> ApiResult<WebhookTestResult> {
    test_webhook(state, c, h).await
}
