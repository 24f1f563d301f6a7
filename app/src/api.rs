//! Server functions: the UI's only way to the backend.
//!
//! Each is a thin adapter: take the [`port::Portal`](crate::port::Portal) and the request from
//! context, call one use case, map the result. Errors travel as [`UiError`], which carries the
//! domain [`AppError`] (so forms can put messages next to fields) and an echo of non-secret
//! inputs, so a form posted without JavaScript comes back with what the user typed.

use leptos::prelude::*;
use leptos::server_fn::codec::JsonEncoding;
use leptos::server_fn::error::{FromServerFnError, ServerFnErrorErr};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tessera_domain::account::Me;
use tessera_domain::cluster::{ClusterSummary, NodeTelemetry, NodeView};
use tessera_domain::error::AppError;
#[cfg(feature = "ssr")]
use tessera_domain::ids::{TeamId, UserId};
use tessera_domain::tenancy::{
    ApiTokenView, CreatedSecret, JoinTokenView, MemberView, Page, PageRequest, TeamView, UserView,
};
use tessera_domain::wire::DesiredInstance;
#[cfg(feature = "ssr")]
use tessera_domain::wire::MigMode;

/// An [`AppError`] plus the non-secret form values to show again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UiError {
    pub error: AppError,
    #[serde(default)]
    pub echo: BTreeMap<String, String>,
}

impl UiError {
    /// The message for `field`, if the error belongs to it.
    pub fn for_field(&self, field: &str) -> Option<String> {
        match &self.error {
            AppError::Invalid { field: f, message } if f == field => Some(message.clone()),
            _ => None,
        }
    }

    /// The message for the whole form (anything not tied to a field).
    pub fn general(&self) -> Option<String> {
        self.error.field().is_none().then(|| self.error.to_string())
    }

    pub fn echoed(&self, field: &str) -> Option<String> {
        self.echo.get(field).cloned()
    }
}

impl From<AppError> for UiError {
    fn from(error: AppError) -> Self {
        UiError {
            error,
            echo: BTreeMap::new(),
        }
    }
}

impl FromServerFnError for UiError {
    type Encoder = JsonEncoding;

    fn from_server_fn_error(value: ServerFnErrorErr) -> Self {
        let error = match value {
            ServerFnErrorErr::Args(m)
            | ServerFnErrorErr::MissingArg(m)
            | ServerFnErrorErr::Deserialization(m) => AppError::invalid("form", m),
            _ => AppError::Internal,
        };
        error.into()
    }
}

/// The signed-in user, or `None`.
#[server(prefix = "/fn", endpoint = "current_user")]
pub async fn current_user() -> Result<Option<Me>, UiError> {
    let (portal, req) = ssr::context()?;
    ssr::finish(portal.me(&req).await, [])
}

#[server(prefix = "/fn", endpoint = "login")]
pub async fn login(username: String, password: String) -> Result<(), UiError> {
    let (portal, req) = ssr::context()?;
    let result = portal.login(&req, &username, &password).await;
    if result.is_ok() {
        leptos_axum::redirect("/");
    }
    ssr::finish(result.map(|_| ()), [("username", username)])
}

#[server(prefix = "/fn", endpoint = "logout")]
pub async fn logout() -> Result<(), UiError> {
    let (portal, req) = ssr::context()?;
    let result = portal.logout(&req).await;
    if result.is_ok() {
        leptos_axum::redirect("/login");
    }
    ssr::finish(result, [])
}

#[server(prefix = "/fn", endpoint = "change_password")]
pub async fn change_password(
    current_password: String,
    new_password: String,
    confirm_password: String,
) -> Result<(), UiError> {
    let (portal, req) = ssr::context()?;
    let result = portal
        .change_password(&req, &current_password, &new_password, &confirm_password)
        .await;
    if result.is_ok() {
        leptos_axum::redirect("/account?changed=1");
    }
    ssr::finish(result, [])
}

// ---- account: API tokens ----

#[server(prefix = "/fn", endpoint = "list_tokens")]
pub async fn list_tokens(page: PageRequest) -> Result<Page<ApiTokenView>, UiError> {
    let (portal, req) = ssr::context()?;
    ssr::finish(portal.list_tokens(&req, page).await, [])
}

#[server(prefix = "/fn", endpoint = "create_token")]
pub async fn create_token(
    name: String,
    expires_in_days: Option<String>,
) -> Result<CreatedSecret<ApiTokenView>, UiError> {
    let (portal, req) = ssr::context()?;
    let echo = [
        ("name", name.clone()),
        (
            "expires_in_days",
            expires_in_days.clone().unwrap_or_default(),
        ),
    ];
    let days = match ssr::optional_number(expires_in_days.as_deref(), "expires_in_days") {
        Ok(d) => d,
        Err(e) => return ssr::finish(Err(e), echo),
    };
    ssr::finish(portal.create_token(&req, &name, days).await, echo)
}

#[server(prefix = "/fn", endpoint = "revoke_token")]
pub async fn revoke_token(id: String) -> Result<(), UiError> {
    let (portal, req) = ssr::context()?;
    let r = match ssr::id(&id) {
        Ok(id) => portal.revoke_token(&req, id).await,
        Err(e) => Err(e),
    };
    ssr::finish(r, [])
}

// ---- users (platform admin) ----

#[server(prefix = "/fn", endpoint = "list_users")]
pub async fn list_users(page: PageRequest) -> Result<Page<UserView>, UiError> {
    let (portal, req) = ssr::context()?;
    ssr::finish(portal.list_users(&req, page).await, [])
}

#[server(prefix = "/fn", endpoint = "create_user")]
pub async fn create_user(
    username: String,
    password: String,
    is_admin: Option<String>,
) -> Result<UserView, UiError> {
    let (portal, req) = ssr::context()?;
    let admin = is_admin.is_some_and(|v| !v.is_empty() && v != "false");
    let r = portal.create_user(&req, &username, &password, admin).await;
    ssr::finish(r, [("username", username)])
}

#[server(prefix = "/fn", endpoint = "set_user_disabled")]
pub async fn set_user_disabled(user_id: String, disabled: bool) -> Result<UserView, UiError> {
    let (portal, req) = ssr::context()?;
    let r = match ssr::id(&user_id) {
        Ok(id) => portal.set_user_disabled(&req, UserId(id), disabled).await,
        Err(e) => Err(e),
    };
    ssr::finish(r, [])
}

#[server(prefix = "/fn", endpoint = "reset_password")]
pub async fn reset_password(user_id: String, password: String) -> Result<UserView, UiError> {
    let (portal, req) = ssr::context()?;
    let r = match ssr::id(&user_id) {
        Ok(id) => portal.reset_password(&req, UserId(id), &password).await,
        Err(e) => Err(e),
    };
    ssr::finish(r, [])
}

// ---- teams ----

#[server(prefix = "/fn", endpoint = "list_teams")]
pub async fn list_teams(page: PageRequest) -> Result<Page<TeamView>, UiError> {
    let (portal, req) = ssr::context()?;
    ssr::finish(portal.list_teams(&req, page).await, [])
}

#[server(prefix = "/fn", endpoint = "get_team")]
pub async fn get_team(team_id: String) -> Result<TeamView, UiError> {
    let (portal, req) = ssr::context()?;
    let r = match ssr::id(&team_id) {
        Ok(id) => portal.team(&req, TeamId(id)).await,
        Err(e) => Err(e),
    };
    ssr::finish(r, [])
}

#[server(prefix = "/fn", endpoint = "create_team")]
pub async fn create_team(name: String) -> Result<TeamView, UiError> {
    let (portal, req) = ssr::context()?;
    let r = portal.create_team(&req, &name).await;
    ssr::finish(r, [("name", name)])
}

#[server(prefix = "/fn", endpoint = "rename_team")]
pub async fn rename_team(team_id: String, name: String) -> Result<TeamView, UiError> {
    let (portal, req) = ssr::context()?;
    let r = match ssr::id(&team_id) {
        Ok(id) => portal.rename_team(&req, TeamId(id), &name).await,
        Err(e) => Err(e),
    };
    ssr::finish(r, [("name", name)])
}

#[server(prefix = "/fn", endpoint = "set_team_archived")]
pub async fn set_team_archived(team_id: String, archived: bool) -> Result<TeamView, UiError> {
    let (portal, req) = ssr::context()?;
    let r = match ssr::id(&team_id) {
        Ok(id) => portal.set_team_archived(&req, TeamId(id), archived).await,
        Err(e) => Err(e),
    };
    ssr::finish(r, [])
}

#[server(prefix = "/fn", endpoint = "list_members")]
pub async fn list_members(team_id: String, page: PageRequest) -> Result<Page<MemberView>, UiError> {
    let (portal, req) = ssr::context()?;
    let r = match ssr::id(&team_id) {
        Ok(id) => portal.list_members(&req, TeamId(id), page).await,
        Err(e) => Err(e),
    };
    ssr::finish(r, [])
}

#[server(prefix = "/fn", endpoint = "add_member")]
pub async fn add_member(
    team_id: String,
    username: String,
    role: String,
) -> Result<MemberView, UiError> {
    let (portal, req) = ssr::context()?;
    let r = match ssr::id(&team_id) {
        Ok(id) => portal.add_member(&req, TeamId(id), &username, &role).await,
        Err(e) => Err(e),
    };
    ssr::finish(r, [("username", username), ("role", role)])
}

#[server(prefix = "/fn", endpoint = "change_role")]
pub async fn change_role(
    team_id: String,
    user_id: String,
    role: String,
) -> Result<MemberView, UiError> {
    let (portal, req) = ssr::context()?;
    let r = match (ssr::id(&team_id), ssr::id(&user_id)) {
        (Ok(t), Ok(u)) => portal.change_role(&req, TeamId(t), UserId(u), &role).await,
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    ssr::finish(r, [])
}

#[server(prefix = "/fn", endpoint = "remove_member")]
pub async fn remove_member(team_id: String, user_id: String) -> Result<(), UiError> {
    let (portal, req) = ssr::context()?;
    let r = match (ssr::id(&team_id), ssr::id(&user_id)) {
        (Ok(t), Ok(u)) => portal.remove_member(&req, TeamId(t), UserId(u)).await,
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    ssr::finish(r, [])
}

// ---- nodes ----

#[server(prefix = "/fn", endpoint = "cluster_summary")]
pub async fn get_cluster_summary() -> Result<ClusterSummary, UiError> {
    let (portal, req) = ssr::context()?;
    ssr::finish(portal.cluster_summary(&req).await, [])
}

#[server(prefix = "/fn", endpoint = "list_nodes")]
pub async fn list_nodes(page: PageRequest) -> Result<Page<NodeView>, UiError> {
    let (portal, req) = ssr::context()?;
    ssr::finish(portal.list_nodes(&req, page).await, [])
}

#[server(prefix = "/fn", endpoint = "revoke_node")]
pub async fn revoke_node(node_id: String) -> Result<NodeView, UiError> {
    let (portal, req) = ssr::context()?;
    let r = match ssr::id(&node_id) {
        Ok(id) => portal.revoke_node(&req, id).await,
        Err(e) => Err(e),
    };
    ssr::finish(r, [])
}

/// Recent telemetry of a node (newest `limit` samples, oldest first).
#[server(prefix = "/fn", endpoint = "node_telemetry")]
pub async fn get_node_telemetry(node_id: String, limit: u32) -> Result<NodeTelemetry, UiError> {
    let (portal, req) = ssr::context()?;
    let r = match ssr::id(&node_id) {
        Ok(id) => portal.node_telemetry(&req, id, limit).await,
        Err(e) => Err(e),
    };
    ssr::finish(r, [])
}

/// `layout` is written like `3g.40gb@0, 2g.20gb@4, 1g.10gb@6` (profile@start); `mode` is
/// `enabled` or `disabled`.
#[server(prefix = "/fn", endpoint = "set_gpu_layout")]
pub async fn set_gpu_layout(
    node_id: String,
    gpu_uuid: String,
    mode: String,
    layout: String,
) -> Result<NodeView, UiError> {
    let (portal, req) = ssr::context()?;
    let parsed = ssr::id(&node_id).and_then(|n| {
        let mode = match mode.as_str() {
            "enabled" => MigMode::Enabled,
            "disabled" => MigMode::Disabled,
            _ => return Err(AppError::invalid("mode", "must be enabled or disabled")),
        };
        Ok((n, mode, parse_layout(&layout)?))
    });
    let r = match parsed {
        Ok((n, mode, l)) => portal.set_gpu_layout(&req, n, &gpu_uuid, mode, l).await,
        Err(e) => Err(e),
    };
    ssr::finish(r, [("layout", layout), ("mode", mode)])
}

/// Parses `3g.40gb@0, 1g.10gb@6` into instances.
pub fn parse_layout(text: &str) -> Result<Vec<DesiredInstance>, AppError> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (profile, start) = item.split_once('@').ok_or_else(|| {
                AppError::invalid(
                    "layout",
                    format!("'{item}': write profile@start, e.g. 1g.10gb@0"),
                )
            })?;
            let start = start.trim().parse::<u8>().map_err(|_| {
                AppError::invalid("layout", format!("'{item}': start must be a slice number"))
            })?;
            Ok(DesiredInstance {
                profile: profile.trim().to_owned(),
                start,
            })
        })
        .collect()
}

#[server(prefix = "/fn", endpoint = "list_join_tokens")]
pub async fn list_join_tokens(page: PageRequest) -> Result<Page<JoinTokenView>, UiError> {
    let (portal, req) = ssr::context()?;
    ssr::finish(portal.list_join_tokens(&req, page).await, [])
}

#[server(prefix = "/fn", endpoint = "create_join_token")]
pub async fn create_join_token(
    note: String,
    max_uses: String,
    expires_in_hours: String,
) -> Result<CreatedSecret<JoinTokenView>, UiError> {
    let (portal, req) = ssr::context()?;
    let echo = [
        ("note", note.clone()),
        ("max_uses", max_uses.clone()),
        ("expires_in_hours", expires_in_hours.clone()),
    ];
    let nums = ssr::number(&max_uses, "max_uses")
        .and_then(|m| Ok((m, ssr::number(&expires_in_hours, "expires_in_hours")?)));
    let r = match nums {
        Ok((m, h)) => portal.create_join_token(&req, &note, m, h).await,
        Err(e) => Err(e),
    };
    ssr::finish(r, echo)
}

#[server(prefix = "/fn", endpoint = "revoke_join_token")]
pub async fn revoke_join_token(id: String) -> Result<(), UiError> {
    let (portal, req) = ssr::context()?;
    let r = match ssr::id(&id) {
        Ok(id) => portal.revoke_join_token(&req, id).await,
        Err(e) => Err(e),
    };
    ssr::finish(r, [])
}

#[cfg(feature = "ssr")]
mod ssr {
    use super::UiError;
    use crate::port::Portal;
    use http::request::Parts;
    use leptos::prelude::*;
    use leptos_axum::ResponseOptions;
    use std::sync::Arc;
    use tessera_domain::error::AppError;

    /// Ids that do not parse name nothing that exists.
    pub fn id(raw: &str) -> Result<uuid::Uuid, AppError> {
        uuid::Uuid::parse_str(raw.trim()).map_err(|_| AppError::NotFound)
    }

    pub fn number(raw: &str, field: &str) -> Result<u32, AppError> {
        raw.trim()
            .parse()
            .map_err(|_| AppError::invalid(field, "must be a whole number"))
    }

    pub fn optional_number(raw: Option<&str>, field: &str) -> Result<Option<u32>, AppError> {
        match raw.map(str::trim) {
            None | Some("") => Ok(None),
            Some(v) => number(v, field).map(Some),
        }
    }

    /// The backend port and the current request, as provided by the server.
    pub fn context() -> Result<(Arc<dyn Portal>, Parts), UiError> {
        let portal = use_context::<Arc<dyn Portal>>().ok_or(AppError::Internal)?;
        let parts = use_context::<Parts>().ok_or(AppError::Internal)?;
        Ok((portal, parts))
    }

    /// Maps a use case's result to the server function's: sets the HTTP status for
    /// programmatic callers (a plain form post keeps the redirect leptos sets up, which
    /// carries the error in the URL) and attaches the echoed form values.
    pub fn finish<T, const N: usize>(
        result: Result<T, AppError>,
        echo: [(&str, String); N],
    ) -> Result<T, UiError> {
        let error = match result {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if let Some(res) = use_context::<ResponseOptions>() {
            if let AppError::RateLimited { retry_after_secs } = &error
                && let Ok(v) = http::HeaderValue::from_str(&retry_after_secs.to_string())
            {
                res.insert_header(http::header::RETRY_AFTER, v);
            }
            let plain_form = use_context::<Parts>()
                .and_then(|p| p.headers.get(http::header::ACCEPT).cloned())
                .and_then(|v| v.to_str().ok().map(|s| s.contains("text/html")))
                .unwrap_or(false);
            if !plain_form && let Ok(code) = http::StatusCode::from_u16(error.status()) {
                res.set_status(code);
            }
        }
        Err(UiError {
            error,
            echo: echo.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        })
    }
}
