//! Who is calling: a browser session, a personal API token, or a node credential.

use crate::AppState;
use axum::extract::FromRequestParts;
use http::request::Parts;
use std::sync::Arc;
use tessera_core::Services;
use tessera_core::auth::Principal;
use tessera_core::request::session_principal;
use tessera_core::services::nodes::NodeIdentity;
use tessera_domain::error::AppError;
use tower_sessions::Session;

use super::error::ApiError;

fn bearer(parts: &Parts) -> Option<&str> {
    parts
        .headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// A signed-in caller of the REST API: `Authorization: Bearer <API token>`, or the
/// browser session cookie.
pub struct Caller(pub Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if let Some(token) = bearer(parts) {
            return Ok(Caller(state.services.tokens.authenticate(token).await?));
        }
        let session = parts
            .extensions
            .get::<Session>()
            .cloned()
            .ok_or(AppError::Internal)?;
        session_principal(&state.services, &session)
            .await?
            .map(Caller)
            .ok_or(ApiError(AppError::Unauthorized))
    }
}

/// The services and the signed-in caller: what almost every REST handler needs.
pub struct Call(pub Arc<Services>, pub Principal);

impl FromRequestParts<AppState> for Call {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Caller(p) = Caller::from_request_parts(parts, state).await?;
        Ok(Call(state.services.clone(), p))
    }
}

/// A node agent, authenticated by its node credential.
pub struct NodeCaller(pub NodeIdentity);

impl FromRequestParts<AppState> for NodeCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let credential = bearer(parts).ok_or(AppError::Unauthorized)?;
        Ok(NodeCaller(
            state.services.nodes.authenticate(credential).await?,
        ))
    }
}
