//! Notebooks on their own origin: `nb-<workload id>.<notebook domain>`.
//!
//! Every request whose `Host` falls under the notebook domain comes here, before any
//! portal route: on a notebook's origin there are no portal pages, no server functions, no
//! REST API and no session cookie, only that one notebook. The browser gets in through
//! [`ENTER_PATH`]: the portal (where the user is signed in) redirects there with a
//! one-time code, which is swapped for a pass in a host-only, HttpOnly cookie bound to
//! this notebook and this user. Each request is then authorized afresh (the notebook still
//! runs, its owner is still a member, the user is not disabled), so stopping the notebook
//! or removing the member cuts access at once. A request without a valid pass is sent back
//! to the portal (pages) or refused (everything else). Cookie-authenticated requests
//! that may change something, and every WebSocket upgrade, must come from this origin's
//! own pages. API tokens (`Authorization: Bearer`) work here too.

use super::proxy::{self, bearer, foreign_origin, is_upgrade, not_found, starting_page};
use crate::AppState;
use crate::config::NotebookOrigins;
use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode, header};
use tessera_core::auth::Principal;
use tessera_core::request::notebook_principal;
use tessera_core::services::workloads::{NOTEBOOK_PASS_TTL_HOURS, NotReady};
use tessera_domain::error::AppError;
use tessera_domain::ids::WorkloadId;

/// Where the portal's redirect lands on a notebook's origin (outside the notebook's own
/// paths, which all start with `/user/`).
pub const ENTER_PATH: &str = "/_tessera/enter";

/// What the metrics middleware labels notebook-origin requests with.
#[derive(Debug, Clone, Copy)]
pub struct NotebookRoute;

/// Sends requests for a notebook's origin to [`serve`]; everything else to the portal.
pub async fn dispatch(State(s): State<AppState>, req: Request<Body>, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
        .map(str::to_owned);
    let class = host.as_deref().and_then(|h| s.notebooks.classify(h));
    let mut res = match class {
        None => return next.run(req).await,
        Some(None) => not_found(),
        Some(Some(workload)) => serve(&s, workload, host.unwrap_or_default(), req).await,
    };
    res.extensions_mut().insert(NotebookRoute);
    res.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        http::HeaderValue::from_static("nosniff"),
    );
    res
}

fn secure(s: &AppState) -> bool {
    matches!(s.notebooks.as_ref(), NotebookOrigins::Isolated { scheme, .. } if scheme == "https")
}

/// The pass cookie's name: `__Host-` bound (https only, no `Domain`, path `/`) where
/// browsers support it.
fn cookie_name(secure: bool) -> &'static str {
    if secure {
        "__Host-tessera_notebook"
    } else {
        "tessera_notebook"
    }
}

fn pass_of(req: &Request, name: &str) -> Option<String> {
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.to_owned())
}

async fn serve(s: &AppState, workload: WorkloadId, host: String, req: Request) -> Response {
    let secure = secure(s);
    let own_origin = format!("{}://{host}", if secure { "https" } else { "http" });
    if req.uri().path() == ENTER_PATH {
        return enter(s, workload, secure, req).await;
    }
    let token = bearer(&req);
    let by_token = token.is_some();
    let pass = pass_of(&req, cookie_name(secure));
    let who = match (token, pass) {
        (Some(t), _) => s.services.tokens.authenticate(&t).await.map(Some),
        (None, Some(pass)) => notebook_principal(&s.services, workload, &pass).await,
        (None, None) => Ok(None),
    };
    let p: Principal = match who {
        Ok(Some(p)) => p,
        Ok(None) | Err(AppError::Unauthorized) => return back_to_portal(s, &req),
        Err(e) => return super::error::ApiError(e).into_response(),
    };
    if !by_token {
        // The pass is a cookie, so another page could make the browser send it: only this
        // origin's own pages may change anything or open a WebSocket.
        let safe = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
        let ours = if is_upgrade(&req) {
            req.headers()
                .get(header::ORIGIN)
                .and_then(|o| o.to_str().ok())
                .is_some_and(|o| o.eq_ignore_ascii_case(&own_origin))
        } else {
            safe || super::csrf::same_origin(req.headers(), &own_origin).is_ok()
        };
        if !ours {
            tracing::warn!(%workload, "notebook origin: request from a foreign origin refused");
            return foreign_origin();
        }
    }
    let html = proxy::wants_html(&req);
    match s.services.workloads.notebook_target(&p, workload).await {
        Ok(Ok(target)) => proxy::proxy_to(target, req).await,
        Ok(Err(NotReady::Starting(state))) => starting_page(html, state.label()),
        Err(AppError::NotFound) => not_found(),
        Err(e) => super::error::ApiError(e).into_response(),
    }
}

/// No valid pass: a page load goes back to the same path on the portal, which lets the
/// signed-in owner straight back in (or asks them to sign in); anything else is refused.
fn back_to_portal(s: &AppState, req: &Request) -> Response {
    if proxy::wants_html(req) {
        let path = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
        let portal = s.config.public_url();
        return (
            StatusCode::SEE_OTHER,
            [
                (header::LOCATION, format!("{portal}{path}")),
                (header::CACHE_CONTROL, "no-store".to_owned()),
            ],
        )
            .into_response();
    }
    (
        StatusCode::UNAUTHORIZED,
        "open the notebook from the portal to sign in here",
    )
        .into_response()
}

#[derive(serde::Deserialize)]
struct Enter {
    code: String,
    next: Option<String>,
}

/// The portal's redirect lands here: swap the one-time code for a pass cookie and go on to
/// the page asked for.
async fn enter(s: &AppState, workload: WorkloadId, secure: bool, req: Request) -> Response {
    if req.method() != Method::GET {
        return (StatusCode::METHOD_NOT_ALLOWED, "GET only").into_response();
    }
    let Ok(Query(q)) = Query::<Enter>::try_from_uri(req.uri()) else {
        return (StatusCode::BAD_REQUEST, "missing code").into_response();
    };
    let pass = match s
        .services
        .workloads
        .redeem_notebook_code(workload, &q.code)
        .await
    {
        Ok(p) => p,
        Err(AppError::NotFound) => return expired_link(s),
        Err(e) => return super::error::ApiError(e).into_response(),
    };
    // Only a path on this origin: never a way to send the browser elsewhere.
    let next = q
        .next
        .filter(|n| n.starts_with("/user/") && !n.contains('\\'))
        .unwrap_or_else(|| "/".into());
    let cookie = format!(
        "{}={pass}; Path=/; HttpOnly; SameSite=Lax; Max-Age={}{}",
        cookie_name(secure),
        NOTEBOOK_PASS_TTL_HOURS * 3600,
        if secure { "; Secure" } else { "" }
    );
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, next),
            (header::SET_COOKIE, cookie),
            (header::CACHE_CONTROL, "no-store".into()),
            (header::REFERRER_POLICY, "no-referrer".into()),
        ],
    )
        .into_response()
}

fn expired_link(s: &AppState) -> Response {
    let portal = s.config.public_url();
    (
        StatusCode::FORBIDDEN,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>Link expired</title>\
             </head><body><main><h1>This notebook link has expired</h1><p>Links into a \
             notebook work once, for a minute. Open the notebook again from \
             <a href=\"{portal}/notebooks\">the portal's Notebooks page</a>.</p></main>\
             </body></html>"
        ),
    )
        .into_response()
}
