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
use tessera_domain::error::AppError;

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

#[cfg(feature = "ssr")]
mod ssr {
    use super::UiError;
    use crate::port::Portal;
    use http::request::Parts;
    use leptos::prelude::*;
    use leptos_axum::ResponseOptions;
    use std::sync::Arc;
    use tessera_domain::error::AppError;

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
