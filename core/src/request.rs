//! Who is calling, read from a request: the browser session's principal and the client
//! address, plus the use cases that change the session itself (sign in, sign out, change
//! password). The HTTP server puts the [`Session`] and a [`ClientIp`] into every request's
//! extensions; server functions and REST handlers both come here for the principal.

use crate::Services;
use crate::auth::Principal;
use crate::services::accounts::{ExternalIdentity, SignedIn};
use crate::sessions::{self, SessionUser};
use http::request::Parts;
use std::net::{IpAddr, Ipv4Addr};
use tessera_domain::account::Me;
use tessera_domain::error::AppError;
use tower_sessions::Session;

/// The client's address as the server decided it (the socket peer, or the last
/// `X-Forwarded-For` hop when proxy headers are trusted).
#[derive(Debug, Clone, Copy)]
pub struct ClientIp(pub IpAddr);

/// The request's session (the session layer puts it there).
pub fn session(req: &Parts) -> Result<Session, AppError> {
    req.extensions.get::<Session>().cloned().ok_or_else(|| {
        tracing::error!("session layer missing");
        AppError::Internal
    })
}

fn client_ip(req: &Parts) -> IpAddr {
    req.extensions
        .get::<ClientIp>()
        .map(|c| c.0)
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// The principal behind a browser session, if any (signing out sessions that are no
/// longer valid: past the absolute timeout, user disabled, password changed since).
pub async fn session_principal(
    services: &Services,
    session: &Session,
) -> Result<Option<Principal>, AppError> {
    let Some(user) = sessions::read(
        session,
        services.session_absolute_timeout,
        services.clock.now(),
    )
    .await
    .map_err(session_error)?
    else {
        return Ok(None);
    };
    let principal = services
        .accounts
        .principal_for_session(user.user_id, user.signed_in_at)
        .await?;
    if principal.is_none() {
        sessions::sign_out(session).await.map_err(session_error)?;
    }
    Ok(principal)
}

/// The signed-in principal of a browser request, if any.
pub async fn principal(services: &Services, req: &Parts) -> Result<Option<Principal>, AppError> {
    session_principal(services, &session(req)?).await
}

/// Verifies credentials and starts a fresh session (the session id is cycled).
pub async fn sign_in(
    services: &Services,
    req: &Parts,
    username: &str,
    password: &str,
) -> Result<Me, AppError> {
    let signed_in = services
        .accounts
        .login(username, password, client_ip(req))
        .await?;
    start_session(&session(req)?, &signed_in).await?;
    tracing::info!(user = %signed_in.principal.username(), "signed in");
    Ok(Me::from(&signed_in.principal))
}

/// Signs in a person the identity provider vouched for and starts a fresh session, exactly
/// as a password sign-in does (the session id is cycled; timeouts and disabling apply).
pub async fn sign_in_sso(
    services: &Services,
    session: &Session,
    who: &ExternalIdentity,
) -> Result<Me, AppError> {
    let signed_in = services.accounts.sign_in_sso(who).await?;
    start_session(session, &signed_in).await?;
    Ok(Me::from(&signed_in.principal))
}

async fn start_session(session: &Session, signed_in: &SignedIn) -> Result<(), AppError> {
    sessions::sign_in(
        session,
        SessionUser {
            user_id: signed_in.principal.user_id().0,
            signed_in_at: signed_in.at,
        },
    )
    .await
    .map_err(session_error)
}

/// Ends the session on the server.
pub async fn sign_out(req: &Parts) -> Result<(), AppError> {
    sessions::sign_out(&session(req)?)
        .await
        .map_err(session_error)
}

/// Changes the caller's password; this session continues under a new id while every other
/// session of the user becomes void.
pub async fn change_password(
    services: &Services,
    req: &Parts,
    who: &Principal,
    current: &str,
    new: &str,
    confirm: &str,
) -> Result<(), AppError> {
    let at = services
        .accounts
        .change_password(who, current, new, confirm, client_ip(req))
        .await?;
    sessions::sign_in(
        &session(req)?,
        SessionUser {
            user_id: who.user_id().0,
            signed_in_at: at,
        },
    )
    .await
    .map_err(session_error)
}

pub fn session_error(e: tower_sessions::session::Error) -> AppError {
    tracing::error!(error = %e, "session store");
    AppError::Internal
}

/// The nonce of this response's Content-Security-Policy: the server's header middleware
/// puts it into the request, and the page shell stamps it on its inline scripts.
#[derive(Debug, Clone)]
pub struct CspNonce(pub String);

/// The principal behind a notebook origin's pass (its cookie) for `workload`: `None` when
/// it is not a valid pass for that notebook, or its user was disabled or changed their
/// password since it was issued (as for sessions).
pub async fn notebook_principal(
    services: &Services,
    workload: tessera_domain::ids::WorkloadId,
    pass: &str,
) -> Result<Option<Principal>, AppError> {
    let (user, issued) = match services.workloads.notebook_pass(workload, pass).await {
        Ok(v) => v,
        Err(AppError::Unauthorized) => return Ok(None),
        Err(e) => return Err(e),
    };
    services.accounts.principal_for_session(user, issued).await
}
