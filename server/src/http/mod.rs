//! HTTP: the router, cross-cutting middleware (metrics, CSRF, sessions, security headers,
//! notebook origins), health endpoints.
//!
//! Pages and server functions are served by leptos_axum; the REST API will live under
//! `/api/v1` and the agent API under `/agent/v1`.

mod agent_api;
mod api;
pub(crate) mod auth;
pub(crate) mod bundle;
mod csrf;
pub(crate) mod error;
pub(crate) mod events;
mod exec;
mod headers;
mod health;
mod metrics;
mod notebook_origin;
mod proxy;
mod sso;
mod verify_email;

use crate::AppState;
use crate::config::ServeConfig;
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use leptos::prelude::provide_context;
use leptos_axum::{LeptosRoutes, generate_route_list};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tessera_core::request::ClientIp;
use tessera_core::sessions::{AnySessionStore, cookie_name};
use tower_sessions::{Expiry, SessionManagerLayer, cookie::SameSite};

pub(crate) use proxy::wait_for_sockets;

type Sessions = SessionManagerLayer<AnySessionStore>;

pub fn router(state: AppState, sessions: Sessions) -> Router {
    let trust_proxy = state.config.trust_proxy_headers;
    let leptos_options = state.leptos_options.clone();
    let routes = generate_route_list(tessera_app::App);
    let services = state.services.clone();
    let pkg_dir = state.config.site_root.join("pkg");
    let split = bundle::split_manifest(&pkg_dir, &leptos_options.output_name);
    let sessions_for_api = sessions.clone();
    // The team page's "Send test" button sends as the REST API does.
    let test_sender: Arc<dyn tessera_core::services::notifications::WebhookTestSender> = Arc::new(
        crate::notify::webhook::TestSender::new(state.config.public_url())
            .allowing_private(state.config.notify.webhook_allow_private),
    );

    let app = Router::new()
        .leptos_routes_with_context(
            &leptos_options,
            routes,
            move || {
                provide_context(services.clone());
                provide_context(test_sender.clone());
                if let Some(split) = &split {
                    provide_context(split.clone());
                }
            },
            {
                let options = leptos_options.clone();
                move || tessera_app::shell(options.clone())
            },
        )
        .nest_service("/pkg", bundle::service(pkg_dir))
        .with_state(leptos_options)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            csrf::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            sign_in_first,
        ))
        .layer(sessions)
        .layer(axum::middleware::from_fn(bundle::no_cache_pages));

    let (api_router, openapi) = api::router();
    let openapi = Arc::new(openapi);
    let api_and_agent = api_router
        .route(
            "/api/v1/openapi.json",
            get(move || {
                let doc = openapi.clone();
                async move { axum::Json(doc.as_ref().clone()) }
            }),
        )
        .route("/events", get(events::events))
        .merge(agent_api::router())
        .merge(proxy::router())
        .merge(sso::router())
        .merge(verify_email::router())
        .with_state(state.clone())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            csrf::guard,
        ))
        .layer(sessions_for_api);

    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .with_state(state.clone())
        .merge(app)
        .merge(api_and_agent)
        .layer(axum::middleware::from_fn_with_state(
            state.config.secure_cookies(),
            headers::portal,
        ))
        // Outside the portal's routes and headers: a notebook origin sees none of them.
        .layer(axum::middleware::from_fn_with_state(
            state,
            notebook_origin::dispatch,
        ))
        .layer(axum::middleware::from_fn_with_state(trust_proxy, client_ip))
        .layer(axum::middleware::from_fn(metrics::track))
}

/// The browser session layer: HttpOnly, SameSite=Lax, `Secure` with a `__Host-` name over
/// https, expiring after the idle timeout (the absolute timeout is checked on every read).
pub fn session_layer(store: AnySessionStore, config: &ServeConfig) -> Sessions {
    let secure = config.secure_cookies();
    SessionManagerLayer::new(store)
        .with_name(cookie_name(secure))
        .with_secure(secure)
        .with_http_only(true)
        .with_same_site(SameSite::Lax)
        .with_path("/")
        .with_expiry(idle_expiry(config))
}

/// A signed-in session's expiry: after the configured inactivity.
pub(crate) fn idle_expiry(config: &ServeConfig) -> Expiry {
    Expiry::OnInactivity(
        tower_sessions::cookie::time::Duration::try_from(config.session_idle_timeout)
            .unwrap_or(tower_sessions::cookie::time::Duration::hours(8)),
    )
}

/// Decides the client's address once per request ([`ClientIp`]): the socket peer, or the
/// last `X-Forwarded-For` hop when proxy headers are trusted.
async fn client_ip(
    State(trust_proxy): State<bool>,
    mut req: Request<Body>,
    next: Next,
) -> Response {
    let forwarded = trust_proxy
        .then(|| {
            req.headers()
                .get("x-forwarded-for")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.rsplit(',').next())
                .and_then(|v| v.trim().parse::<IpAddr>().ok())
        })
        .flatten();
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .or_else(|| {
            req.extensions()
                .get::<ConnectInfo<crate::tls::TlsPeer>>()
                .map(|c| c.0.0.ip())
        });
    if let Some(ip) = forwarded.or(peer) {
        req.extensions_mut().insert(ClientIp(ip));
    }
    next.run(req).await
}

/// An anonymous visitor asking for a page gets a real answer at once: 303 to the sign-in
/// page, which returns them to `next` afterwards (works without JavaScript, for curl and
/// link previews too). Assets, server functions and the sign-in page itself pass.
async fn sign_in_first(State(s): State<AppState>, req: Request<Body>, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    let page = matches!(*req.method(), http::Method::GET | http::Method::HEAD)
        && !path.starts_with("/fn/")
        && !path.starts_with("/pkg/")
        && path != "/login";
    let session = req.extensions().get::<tower_sessions::Session>().cloned();
    if let (true, Some(session)) = (page, session) {
        let asked = req
            .uri()
            .path_and_query()
            .map_or_else(|| path.clone(), |pq| pq.as_str().to_owned());
        let anonymous = matches!(
            tessera_core::request::session_principal(&s.services, &session).await,
            Ok(None) | Err(tessera_domain::error::AppError::Unauthorized)
        );
        if anonymous
            && let Ok(url) =
                reqwest::Url::parse_with_params("http://portal/login", &[("next", &asked)])
        {
            let location = format!("/login?{}", url.query().unwrap_or_default());
            return (
                http::StatusCode::SEE_OTHER,
                [(http::header::LOCATION, location)],
            )
                .into_response();
        }
    }
    next.run(req).await
}
