//! HTTP: the router, cross-cutting middleware (metrics, CSRF, sessions), health endpoints.
//!
//! Pages and server functions are served by leptos_axum; the REST API will live under
//! `/api/v1` and the agent API under `/agent/v1`.

mod agent_api;
mod api;
pub(crate) mod auth;
mod csrf;
pub(crate) mod error;
mod health;
mod metrics;

use crate::AppState;
use crate::portal::PortalImpl;
use axum::Router;
use axum::routing::get;
use leptos::prelude::provide_context;
use leptos_axum::{LeptosRoutes, generate_route_list};
use std::sync::Arc;
use tessera_app::port::Portal;
use tower_http::services::ServeDir;

pub fn router(
    state: AppState,
    sessions: tower_sessions::SessionManagerLayer<crate::sessions::AnySessionStore>,
) -> Router {
    let leptos_options = state.leptos_options.clone();
    let routes = generate_route_list(tessera_app::App);
    let portal: Arc<dyn Portal> = Arc::new(PortalImpl::new(state.clone()));
    let pkg_dir = state.config.site_root.join("pkg");
    let sessions_for_api = sessions.clone();

    let app = Router::new()
        .leptos_routes_with_context(
            &leptos_options,
            routes,
            move || provide_context(portal.clone()),
            {
                let options = leptos_options.clone();
                move || tessera_app::shell(options.clone())
            },
        )
        .nest_service("/pkg", ServeDir::new(pkg_dir))
        .with_state(leptos_options)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            csrf::guard,
        ))
        .layer(sessions);

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
        .merge(agent_api::router())
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
        .with_state(state)
        .merge(app)
        .merge(api_and_agent)
        .layer(axum::middleware::from_fn(metrics::track))
}
