//! The UI's backend port, implemented over the services.
//!
//! This is where a browser request becomes a [`Principal`]: the session cookie is looked up,
//! checked against the absolute timeout, and re-validated against the user row.

use crate::AppState;
use crate::sessions::{self, SessionUser};
use async_trait::async_trait;
use axum::extract::ConnectInfo;
use chrono::Utc;
use http::request::Parts;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use tessera_app::port::Portal;
use tessera_domain::account::{Me, Principal};
use tessera_domain::error::AppError;
use tower_sessions::Session;

pub struct PortalImpl {
    state: AppState,
}

impl PortalImpl {
    pub fn new(state: AppState) -> Self {
        Self { state }
    }

    fn session(req: &Parts) -> Result<Session, AppError> {
        req.extensions.get::<Session>().cloned().ok_or_else(|| {
            tracing::error!("session layer missing");
            AppError::Internal
        })
    }

    /// The principal behind the request's session, if any.
    async fn principal(&self, req: &Parts) -> Result<Option<Principal>, AppError> {
        let session = Self::session(req)?;
        let Some(user) = sessions::read(
            &session,
            self.state.config.session_absolute_timeout,
            Utc::now(),
        )
        .await
        .map_err(session_error)?
        else {
            return Ok(None);
        };
        let principal = self
            .state
            .services
            .accounts
            .principal_for_session(user.user_id, user.signed_in_at)
            .await?;
        if principal.is_none() {
            sessions::sign_out(&session).await.map_err(session_error)?;
        }
        Ok(principal)
    }

    async fn require(&self, req: &Parts) -> Result<Principal, AppError> {
        self.principal(req).await?.ok_or(AppError::Unauthorized)
    }

    fn client_ip(&self, req: &Parts) -> IpAddr {
        if self.state.config.trust_proxy_headers {
            let forwarded = req
                .headers
                .get("x-forwarded-for")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.rsplit(',').next())
                .and_then(|v| v.trim().parse().ok());
            if let Some(ip) = forwarded {
                return ip;
            }
        }
        req.extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
    }
}

#[async_trait]
impl Portal for PortalImpl {
    async fn me(&self, req: &Parts) -> Result<Option<Me>, AppError> {
        Ok(self.principal(req).await?.as_ref().map(Me::from))
    }

    async fn login(&self, req: &Parts, username: &str, password: &str) -> Result<Me, AppError> {
        let signed_in = self
            .state
            .services
            .accounts
            .login(username, password, self.client_ip(req))
            .await?;
        let session = Self::session(req)?;
        sessions::sign_in(
            &session,
            SessionUser {
                user_id: signed_in.principal.user_id.0,
                signed_in_at: signed_in.at,
            },
        )
        .await
        .map_err(session_error)?;
        tracing::info!(user = %signed_in.principal.username, "signed in");
        Ok(Me::from(&signed_in.principal))
    }

    async fn logout(&self, req: &Parts) -> Result<(), AppError> {
        sessions::sign_out(&Self::session(req)?)
            .await
            .map_err(session_error)
    }

    async fn change_password(
        &self,
        req: &Parts,
        current: &str,
        new: &str,
        confirm: &str,
    ) -> Result<(), AppError> {
        let who = self.require(req).await?;
        let at = self
            .state
            .services
            .accounts
            .change_password(&who, current, new, confirm, self.client_ip(req))
            .await?;
        // Keep this session (under a new id); every other session of the user is now void.
        sessions::sign_in(
            &Self::session(req)?,
            SessionUser {
                user_id: who.user_id.0,
                signed_in_at: at,
            },
        )
        .await
        .map_err(session_error)
    }
}

fn session_error(e: tower_sessions::session::Error) -> AppError {
    tracing::error!(error = %e, "session store");
    AppError::Internal
}
