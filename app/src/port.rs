//! The backend port: what the UI needs from the server, as one trait.
//!
//! The server implements it over its services; server functions get it from context. The UI
//! crate never sees SQL, sessions or HTTP clients.

use http::request::Parts;
use tessera_domain::account::Me;
use tessera_domain::error::AppError;

#[async_trait::async_trait]
pub trait Portal: Send + Sync + 'static {
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
}
