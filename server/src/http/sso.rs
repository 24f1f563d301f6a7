//! Single sign-on routes: `POST /auth/oidc/login` sends the browser to the identity
//! provider; `GET /auth/oidc/callback` takes its answer, signs in and goes home. Failures
//! land on `/login?sso_error=<code>`, which explains them; details go to the log only.
//!
//! The callback is a GET that signs in: the provider redirects there, so it cannot be a
//! POST. It acts only on a sign-in this browser's session started (the state), once.

use crate::AppState;
use crate::oidc::{CallbackQuery, PENDING_MINUTES, PendingLogin, SsoFailure};
use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::Utc;
use tessera_domain::error::AppError;
use tower_sessions::{Expiry, Session};

const PENDING: &str = "oidc_pending";

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/auth/oidc/login", post(begin))
        .route("/auth/oidc/callback", get(callback))
}

fn failed(why: SsoFailure) -> Response {
    Redirect::to(&format!("/login?sso_error={}", why.code())).into_response()
}

async fn begin(State(state): State<AppState>, session: Session) -> Response {
    let Some(oidc) = &state.oidc else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match tessera_core::request::session_principal(&state.services, &session).await {
        Ok(Some(_)) => return Redirect::to("/").into_response(),
        Ok(None) => {}
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
    let (url, pending) = match oidc.begin(Utc::now()).await {
        Ok(started) => started,
        Err(why) => return failed(why),
    };
    // An anonymous session only for the trip to the provider: it expires with the pending
    // sign-in instead of lingering for the whole idle timeout.
    session.set_expiry(Some(Expiry::OnInactivity(
        tower_sessions::cookie::time::Duration::minutes(PENDING_MINUTES),
    )));
    if let Err(e) = session.insert(PENDING, pending).await {
        tracing::error!(error = %e, "session store");
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    Redirect::to(&url).into_response()
}

async fn callback(
    State(state): State<AppState>,
    session: Session,
    Query(answer): Query<CallbackQuery>,
) -> Response {
    let Some(oidc) = &state.oidc else {
        return StatusCode::NOT_FOUND.into_response();
    };
    // Taken out whatever happens next: an answer is good for one try.
    let pending = match session.remove::<PendingLogin>(PENDING).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "unreadable pending sign-in");
            None
        }
    };
    let Some(pending) = pending else {
        return failed(SsoFailure::State);
    };
    let who = match oidc.finish(pending, &answer, Utc::now()).await {
        Ok(who) => who,
        Err(why) => return failed(why),
    };
    session.set_expiry(Some(super::idle_expiry(&state.config)));
    match tessera_core::request::sign_in_sso(&state.services, &session, &who).await {
        Ok(me) => {
            tracing::info!(user = %me.username, "signed in through single sign-on");
            Redirect::to("/").into_response()
        }
        Err(AppError::Forbidden) => failed(SsoFailure::Disabled),
        Err(e) => {
            tracing::warn!(error = %e, "single sign-on refused");
            failed(SsoFailure::Failed)
        }
    }
}
