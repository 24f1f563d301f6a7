//! The backend port: what the UI needs from the server, as one trait.
//!
//! The server implements it over its services (authorizing every call); server functions
//! get it from context. The UI crate never sees SQL, sessions or HTTP clients.

use http::request::Parts;
use tessera_domain::account::Me;
use tessera_domain::cluster::{ClusterSummary, NodeTelemetry, NodeView};
use tessera_domain::error::AppError;
use tessera_domain::ids::{TeamId, UserId};
use tessera_domain::tenancy::{
    ApiTokenView, CreatedSecret, JoinTokenView, MemberView, Page, PageRequest, TeamView, UserView,
};
use tessera_domain::wire::{DesiredInstance, MigMode};
use uuid::Uuid;

#[async_trait::async_trait]
pub trait Portal: Send + Sync + 'static {
    // ---- account ----
    /// The signed-in user, or `None` when the request has no valid session.
    async fn me(&self, req: &Parts) -> Result<Option<Me>, AppError>;
    /// Verifies credentials and starts a fresh session (the session id is cycled).
    async fn login(&self, req: &Parts, username: &str, password: &str) -> Result<Me, AppError>;
    /// Ends the session on the server.
    async fn logout(&self, req: &Parts) -> Result<(), AppError>;
    async fn change_password(
        &self,
        req: &Parts,
        current: &str,
        new: &str,
        confirm: &str,
    ) -> Result<(), AppError>;
    async fn list_tokens(
        &self,
        req: &Parts,
        page: PageRequest,
    ) -> Result<Page<ApiTokenView>, AppError>;
    async fn create_token(
        &self,
        req: &Parts,
        name: &str,
        expires_in_days: Option<u32>,
    ) -> Result<CreatedSecret<ApiTokenView>, AppError>;
    async fn revoke_token(&self, req: &Parts, id: Uuid) -> Result<(), AppError>;

    // ---- users (platform admin) ----
    async fn list_users(&self, req: &Parts, page: PageRequest) -> Result<Page<UserView>, AppError>;
    async fn create_user(
        &self,
        req: &Parts,
        username: &str,
        password: &str,
        is_admin: bool,
    ) -> Result<UserView, AppError>;
    async fn set_user_disabled(
        &self,
        req: &Parts,
        user: UserId,
        disabled: bool,
    ) -> Result<UserView, AppError>;
    async fn reset_password(
        &self,
        req: &Parts,
        user: UserId,
        password: &str,
    ) -> Result<UserView, AppError>;

    // ---- teams ----
    async fn list_teams(&self, req: &Parts, page: PageRequest) -> Result<Page<TeamView>, AppError>;
    async fn team(&self, req: &Parts, team: TeamId) -> Result<TeamView, AppError>;
    async fn create_team(&self, req: &Parts, name: &str) -> Result<TeamView, AppError>;
    async fn rename_team(
        &self,
        req: &Parts,
        team: TeamId,
        name: &str,
    ) -> Result<TeamView, AppError>;
    async fn set_team_archived(
        &self,
        req: &Parts,
        team: TeamId,
        archived: bool,
    ) -> Result<TeamView, AppError>;
    async fn list_members(
        &self,
        req: &Parts,
        team: TeamId,
        page: PageRequest,
    ) -> Result<Page<MemberView>, AppError>;
    async fn add_member(
        &self,
        req: &Parts,
        team: TeamId,
        username: &str,
        role: &str,
    ) -> Result<MemberView, AppError>;
    async fn change_role(
        &self,
        req: &Parts,
        team: TeamId,
        user: UserId,
        role: &str,
    ) -> Result<MemberView, AppError>;
    async fn remove_member(&self, req: &Parts, team: TeamId, user: UserId) -> Result<(), AppError>;

    // ---- nodes ----
    async fn cluster_summary(&self, req: &Parts) -> Result<ClusterSummary, AppError>;
    async fn list_nodes(&self, req: &Parts, page: PageRequest) -> Result<Page<NodeView>, AppError>;
    async fn revoke_node(&self, req: &Parts, node: Uuid) -> Result<NodeView, AppError>;
    async fn node_telemetry(
        &self,
        req: &Parts,
        node: Uuid,
        limit: u32,
    ) -> Result<NodeTelemetry, AppError>;
    async fn set_gpu_layout(
        &self,
        req: &Parts,
        node: Uuid,
        gpu_uuid: &str,
        mode: MigMode,
        layout: Vec<DesiredInstance>,
    ) -> Result<NodeView, AppError>;
    async fn list_join_tokens(
        &self,
        req: &Parts,
        page: PageRequest,
    ) -> Result<Page<JoinTokenView>, AppError>;
    async fn create_join_token(
        &self,
        req: &Parts,
        note: &str,
        max_uses: u32,
        expires_in_hours: u32,
    ) -> Result<CreatedSecret<JoinTokenView>, AppError>;
    async fn revoke_join_token(&self, req: &Parts, id: Uuid) -> Result<(), AppError>;
}
