//! The UI's backend port, implemented over the services.
//!
//! This is where a browser request becomes a [`Principal`]: the session cookie is looked up,
//! checked against the absolute timeout, and re-validated against the user row.

use crate::AppState;
use crate::sessions::{self, SessionUser};
use async_trait::async_trait;
use axum::extract::ConnectInfo;
use http::request::Parts;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use tessera_app::port::Portal;
use tessera_domain::account::{Me, Principal};
use tessera_domain::cluster::{ClusterSummary, NodeTelemetry, NodeView};
use tessera_domain::error::AppError;
use tessera_domain::ids::{TeamId, UserId};
use tessera_domain::tenancy::{
    ApiTokenView, CreatedSecret, JoinTokenView, MemberView, Page, PageRequest, TeamView, UserView,
};
use tessera_domain::wire::{DesiredInstance, MigMode};
use tower_sessions::Session;
use uuid::Uuid;

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
        crate::http::auth::session_principal(&self.state, &Self::session(req)?).await
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

    async fn list_tokens(
        &self,
        req: &Parts,
        page: PageRequest,
    ) -> Result<Page<ApiTokenView>, AppError> {
        let p = self.require(req).await?;
        self.state.services.tokens.list(&p, page).await
    }

    async fn create_token(
        &self,
        req: &Parts,
        name: &str,
        expires_in_days: Option<u32>,
    ) -> Result<CreatedSecret<ApiTokenView>, AppError> {
        let p = self.require(req).await?;
        self.state
            .services
            .tokens
            .create(&p, name, expires_in_days)
            .await
    }

    async fn revoke_token(&self, req: &Parts, id: Uuid) -> Result<(), AppError> {
        let p = self.require(req).await?;
        self.state.services.tokens.revoke(&p, id).await
    }

    async fn list_users(&self, req: &Parts, page: PageRequest) -> Result<Page<UserView>, AppError> {
        let p = self.require(req).await?;
        self.state.services.tenancy.list_users(&p, page).await
    }

    async fn create_user(
        &self,
        req: &Parts,
        username: &str,
        password: &str,
        is_admin: bool,
    ) -> Result<UserView, AppError> {
        let p = self.require(req).await?;
        self.state
            .services
            .tenancy
            .create_user(&p, username, password, is_admin)
            .await
    }

    async fn set_user_disabled(
        &self,
        req: &Parts,
        user: UserId,
        disabled: bool,
    ) -> Result<UserView, AppError> {
        let p = self.require(req).await?;
        self.state
            .services
            .tenancy
            .set_user_disabled(&p, user, disabled)
            .await
    }

    async fn reset_password(
        &self,
        req: &Parts,
        user: UserId,
        password: &str,
    ) -> Result<UserView, AppError> {
        let p = self.require(req).await?;
        self.state
            .services
            .tenancy
            .reset_password(&p, user, password)
            .await
    }

    async fn list_teams(&self, req: &Parts, page: PageRequest) -> Result<Page<TeamView>, AppError> {
        let p = self.require(req).await?;
        self.state.services.tenancy.list_teams(&p, page).await
    }

    async fn team(&self, req: &Parts, team: TeamId) -> Result<TeamView, AppError> {
        let p = self.require(req).await?;
        self.state.services.tenancy.team(&p, team).await
    }

    async fn create_team(&self, req: &Parts, name: &str) -> Result<TeamView, AppError> {
        let p = self.require(req).await?;
        self.state.services.tenancy.create_team(&p, name).await
    }

    async fn rename_team(
        &self,
        req: &Parts,
        team: TeamId,
        name: &str,
    ) -> Result<TeamView, AppError> {
        let p = self.require(req).await?;
        self.state
            .services
            .tenancy
            .rename_team(&p, team, name)
            .await
    }

    async fn set_team_archived(
        &self,
        req: &Parts,
        team: TeamId,
        archived: bool,
    ) -> Result<TeamView, AppError> {
        let p = self.require(req).await?;
        self.state
            .services
            .tenancy
            .set_team_archived(&p, team, archived)
            .await
    }

    async fn list_members(
        &self,
        req: &Parts,
        team: TeamId,
        page: PageRequest,
    ) -> Result<Page<MemberView>, AppError> {
        let p = self.require(req).await?;
        self.state
            .services
            .tenancy
            .list_members(&p, team, page)
            .await
    }

    async fn add_member(
        &self,
        req: &Parts,
        team: TeamId,
        username: &str,
        role: &str,
    ) -> Result<MemberView, AppError> {
        let p = self.require(req).await?;
        self.state
            .services
            .tenancy
            .add_member(&p, team, username, role)
            .await
    }

    async fn change_role(
        &self,
        req: &Parts,
        team: TeamId,
        user: UserId,
        role: &str,
    ) -> Result<MemberView, AppError> {
        let p = self.require(req).await?;
        self.state
            .services
            .tenancy
            .change_role(&p, team, user, role)
            .await
    }

    async fn remove_member(&self, req: &Parts, team: TeamId, user: UserId) -> Result<(), AppError> {
        let p = self.require(req).await?;
        self.state
            .services
            .tenancy
            .remove_member(&p, team, user)
            .await
    }

    async fn cluster_summary(&self, req: &Parts) -> Result<ClusterSummary, AppError> {
        let p = self.require(req).await?;
        self.state.services.nodes.summary(&p).await
    }

    async fn list_nodes(&self, req: &Parts, page: PageRequest) -> Result<Page<NodeView>, AppError> {
        let p = self.require(req).await?;
        self.state.services.nodes.list(&p, page).await
    }

    async fn revoke_node(&self, req: &Parts, node: Uuid) -> Result<NodeView, AppError> {
        let p = self.require(req).await?;
        self.state.services.nodes.revoke(&p, node).await
    }

    async fn node_telemetry(
        &self,
        req: &Parts,
        node: Uuid,
        limit: u32,
    ) -> Result<NodeTelemetry, AppError> {
        let p = self.require(req).await?;
        self.state.services.nodes.telemetry(&p, node, limit).await
    }

    async fn set_gpu_layout(
        &self,
        req: &Parts,
        node: Uuid,
        gpu_uuid: &str,
        mode: MigMode,
        layout: Vec<DesiredInstance>,
    ) -> Result<NodeView, AppError> {
        let p = self.require(req).await?;
        self.state
            .services
            .nodes
            .set_desired_layout(&p, node, gpu_uuid, mode, layout)
            .await
    }

    async fn list_join_tokens(
        &self,
        req: &Parts,
        page: PageRequest,
    ) -> Result<Page<JoinTokenView>, AppError> {
        let p = self.require(req).await?;
        self.state.services.nodes.list_join_tokens(&p, page).await
    }

    async fn create_join_token(
        &self,
        req: &Parts,
        note: &str,
        max_uses: u32,
        expires_in_hours: u32,
    ) -> Result<CreatedSecret<JoinTokenView>, AppError> {
        let p = self.require(req).await?;
        self.state
            .services
            .nodes
            .create_join_token(&p, note, max_uses, expires_in_hours)
            .await
    }

    async fn revoke_join_token(&self, req: &Parts, id: Uuid) -> Result<(), AppError> {
        let p = self.require(req).await?;
        self.state.services.nodes.revoke_join_token(&p, id).await
    }
}

use crate::http::auth::session_error;
