//! The notebook proxy: a notebook's JupyterLab, behind Tessera's own access checks.
//!
//! Browsers open notebooks on an origin of their own (`nb-<id>.<notebook domain>`, see
//! [`super::notebook_origin`]), never on the portal's: a page a notebook serves must not
//! run with the portal's origin, where it could act as whoever opened it. So on the
//! portal's origin, `/user/{username}/{server}/…` answers a signed-in browser with a
//! redirect to the notebook's origin carrying a one-time code, and proxies only requests
//! that carry an API token (`Authorization: Bearer`, which browsers never attach on their
//! own). `TESSERA_NOTEBOOK_SAME_ORIGIN_UNSAFE` restores same-origin serving.
//!
//! Only the notebook's owner (while a member of its team) and platform admins (audited)
//! get through; anyone else gets exactly the 404 of a notebook that does not exist.
//! Neither the caller's credentials nor any cookie travel upstream: the proxy sends the
//! notebook's own token instead (`Authorization: token …`), so the browser never holds it.
//! JupyterLab writes its token into the HTML page config; the proxy blanks it out of every
//! HTML response. Upstream headers that would act beyond the notebook (`Set-Cookie`,
//! `Service-Worker-Allowed`, `Clear-Site-Data`, HSTS, CORS grants) are dropped, and every
//! path must stay under the notebook's base path. WebSockets (kernels) pass through as raw
//! upgraded connections once their `Origin` is checked.
//!
//! JupyterLab runs with `base_url` = `/user/{username}/{server}/`, so paths go upstream
//! unchanged.

use crate::AppState;
use crate::config::NotebookOrigins;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use tessera_core::auth::Principal;
use tessera_core::request::session_principal;
use tessera_core::services::workloads::{NotReady, ProxyTarget};
use tessera_domain::error::AppError;
use tessera_domain::workload::path_within;
use tower_sessions::Session;

/// Proxied WebSockets still open (shutdown waits for them, up to its grace period).
static OPEN_SOCKETS: AtomicUsize = AtomicUsize::new(0);

/// On shutdown: waits until every proxied WebSocket has ended, or `grace` has passed.
pub async fn wait_for_sockets(grace: std::time::Duration) {
    let deadline = tokio::time::Instant::now() + grace;
    while OPEN_SOCKETS.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let left = OPEN_SOCKETS.load(Ordering::SeqCst);
    if left > 0 {
        tracing::info!(
            left,
            "shutdown grace over: closing the remaining notebook WebSockets"
        );
    }
}

/// HTML pages are rewritten in memory; bigger ones pass through unchanged.
const MAX_REWRITE: usize = 16 * 1024 * 1024;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/user/{username}/{server}", any(proxy_root))
        .route("/user/{username}/{server}/", any(proxy_root))
        .route("/user/{username}/{server}/{*rest}", any(proxy_rest))
}

fn client() -> &'static Client<HttpConnector, Body> {
    static CLIENT: OnceLock<Client<HttpConnector, Body>> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let mut c = HttpConnector::new();
        c.set_nodelay(true);
        Client::builder(TokioExecutor::new()).build(c)
    })
}

async fn proxy_root(
    State(s): State<AppState>,
    Path((username, server)): Path<(String, String)>,
    req: Request,
) -> Response {
    proxy(s, username, server, req).await
}

async fn proxy_rest(
    State(s): State<AppState>,
    Path((username, server, _rest)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    proxy(s, username, server, req).await
}

/// The caller, from an API token or the session; `None` when nobody is signed in.
async fn caller(
    s: &AppState,
    bearer: Option<String>,
    session: Option<Session>,
) -> Result<Option<Principal>, AppError> {
    if let Some(token) = bearer {
        return s.services.tokens.authenticate(&token).await.map(Some);
    }
    let Some(session) = session else {
        return Ok(None);
    };
    session_principal(&s.services, &session).await
}

pub(super) fn wants_html(req: &Request) -> bool {
    req.method() == http::Method::GET
        && req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/html"))
}

pub(super) fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "not found").into_response()
}

pub(super) fn bearer(req: &Request) -> Option<String> {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|v| v.trim().to_owned())
}

async fn proxy(s: AppState, username: String, server: String, req: Request) -> Response {
    let bearer = bearer(&req);
    let browser = bearer.is_none();
    let session = req.extensions().get::<Session>().cloned();
    let html = wants_html(&req);
    let p = match caller(&s, bearer, session).await {
        Ok(Some(p)) => p,
        Ok(None) | Err(AppError::Unauthorized) => {
            if html {
                return (StatusCode::SEE_OTHER, [(header::LOCATION, "/login")]).into_response();
            }
            return (StatusCode::UNAUTHORIZED, "please sign in").into_response();
        }
        Err(e) => return super::error::ApiError(e).into_response(),
    };
    if browser {
        match s.notebooks.as_ref() {
            NotebookOrigins::Isolated { .. } => {
                let page_load = matches!(*req.method(), http::Method::GET | http::Method::HEAD)
                    && !is_upgrade(&req);
                let asked = req
                    .uri()
                    .path_and_query()
                    .map_or_else(|| req.uri().path().to_owned(), |pq| pq.as_str().to_owned());
                let path = req.uri().path().to_owned();
                drop(req);
                let visit = Visit {
                    page_load,
                    path,
                    asked,
                    html,
                };
                return enter_redirect(&s, &p, &username, &server, visit).await;
            }
            NotebookOrigins::Unconfigured => return not_configured(html),
            NotebookOrigins::SameOriginUnsafe => {
                if is_upgrade(&req)
                    && super::csrf::same_origin(req.headers(), &s.config.public_url()).is_err()
                {
                    return foreign_origin();
                }
            }
        }
    }
    let target = match s
        .services
        .workloads
        .proxy_target(&p, &username, &server)
        .await
    {
        Ok(Ok(t)) => t,
        Ok(Err(NotReady::Starting(state))) => return starting_page(html, state.label()),
        Err(AppError::NotFound) => return not_found(),
        Err(e) => return super::error::ApiError(e).into_response(),
    };
    proxy_to(target, req).await
}

/// Forwards to a notebook the caller may open, once the path is confined to it.
pub(super) async fn proxy_to(target: ProxyTarget, req: Request) -> Response {
    if !path_within(req.uri().path(), &target.base_path) {
        return not_found();
    }
    match forward(target, req).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "notebook proxy: upstream failed");
            (
                StatusCode::BAD_GATEWAY,
                "the notebook did not answer; it may be restarting",
            )
                .into_response()
        }
    }
}

pub(super) fn is_upgrade(req: &Request) -> bool {
    req.headers().contains_key(header::UPGRADE)
}

pub(super) fn foreign_origin() -> Response {
    (
        StatusCode::FORBIDDEN,
        "this notebook accepts connections from its own pages only",
    )
        .into_response()
}

/// What [`enter_redirect`] needs of the browser's request.
struct Visit {
    /// A GET or HEAD that is no WebSocket upgrade.
    page_load: bool,
    path: String,
    /// Path and query.
    asked: String,
    html: bool,
}

/// A browser on the portal's origin: off to the notebook's own origin, with a one-time
/// code that lets it in there (only page loads; anything else is not served here).
async fn enter_redirect(
    s: &AppState,
    p: &Principal,
    username: &str,
    server: &str,
    visit: Visit,
) -> Response {
    if !visit.page_load {
        return (
            StatusCode::NOT_FOUND,
            "notebooks are served from their own address; open the notebook from the \
             Notebooks page",
        )
            .into_response();
    }
    let entry = match s
        .services
        .workloads
        .notebook_code(p, username, server)
        .await
    {
        Ok(Ok(e)) => e,
        Ok(Err(NotReady::Starting(state))) => return starting_page(visit.html, state.label()),
        Err(AppError::NotFound) => return not_found(),
        Err(e) => return super::error::ApiError(e).into_response(),
    };
    let next = if path_within(&visit.path, &entry.base_path) {
        visit.asked.as_str()
    } else {
        entry.base_path.as_str()
    };
    let Some(origin) = s.notebooks.origin_of(entry.workload_id) else {
        return super::error::ApiError(AppError::Internal).into_response();
    };
    let Ok(url) = reqwest::Url::parse_with_params(
        &format!("{origin}{}", super::notebook_origin::ENTER_PATH),
        &[("code", entry.code.as_str()), ("next", next)],
    ) else {
        return super::error::ApiError(AppError::Internal).into_response();
    };
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, url.as_str()),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
    )
        .into_response()
}

/// Notebooks have no origin of their own configured: say so rather than serve them here.
fn not_configured(html: bool) -> Response {
    let msg = "Notebooks cannot be opened in a browser yet: the portal's operator has to \
               set TESSERA_NOTEBOOK_HOST (a wildcard domain for notebooks). API tokens \
               still reach notebooks.";
    if html {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            format!(
                "<!doctype html><html><head><meta charset=\"utf-8\"><title>Notebooks not \
                 configured</title><link rel=\"stylesheet\" href=\"/pkg/tessera.css\"></head>\
                 <body><main class=\"container\"><h1>Notebooks are not set up</h1><p>{msg}</p>\
                 <p><a href=\"/notebooks\">Back to notebooks</a></p></main></body></html>"
            ),
        )
            .into_response();
    }
    (StatusCode::SERVICE_UNAVAILABLE, msg).into_response()
}

/// While a notebook starts: a page that reloads itself (browsers), or 503 + Retry-After.
pub(super) fn starting_page(html: bool, state: &str) -> Response {
    if html {
        let body = format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" \
             content=\"2\"><title>Notebook starting</title><link rel=\"stylesheet\" \
             href=\"/pkg/tessera.css\"></head><body><main class=\"container\"><h1>Your \
             notebook is starting</h1><p aria-live=\"polite\">State: {state}. This page \
             reloads by itself.</p></main></body></html>"
        );
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::RETRY_AFTER, "2"),
            ],
            body,
        )
            .into_response();
    }
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "2")],
        format!("the notebook is {}", state.to_lowercase()),
    )
        .into_response()
}

/// Connection-level headers, never forwarded (RFC 9110 §7.6.1).
const HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::try_from(n.trim()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP {
        h.remove(n);
    }
}

/// Upstream response headers that would act beyond the notebook's own pages: cookies
/// (which a notebook on a sibling subdomain could scope to a parent domain), service
/// worker scope widening, storage wiping, HSTS and CORS grants.
const DROPPED_UPSTREAM: [&str; 9] = [
    "set-cookie",
    "set-cookie2",
    "service-worker-allowed",
    "clear-site-data",
    "strict-transport-security",
    "alt-svc",
    "access-control-allow-origin",
    "access-control-allow-credentials",
    "public-key-pins",
];

fn drop_upstream_headers(h: &mut HeaderMap) {
    for n in DROPPED_UPSTREAM {
        h.remove(n);
    }
}

async fn forward(t: ProxyTarget, mut req: Request) -> anyhow::Result<Response> {
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    let uri: Uri = format!("http://{}{path}", t.endpoint).parse()?;

    let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let mut headers = parts.headers;
    strip_hop(&mut headers);
    // No cookie goes upstream: the notebook authenticates the proxy by its token, and the
    // browser's cookies (Tessera's, or a notebook pass) are none of its business.
    headers.remove(header::COOKIE);
    // Uncompressed, so HTML can be rewritten (loopback: compression buys nothing).
    headers.remove(header::ACCEPT_ENCODING);
    headers.remove(header::AUTHORIZATION);
    headers.remove(header::ORIGIN);
    headers.remove(header::REFERER);
    headers.insert(header::HOST, HeaderValue::from_str(&t.endpoint)?);
    headers.insert(
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("token {}", t.token))?,
    );
    if let Some(u) = &upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_str(u)?);
    }
    let mut up = http::Request::builder()
        .method(parts.method)
        .uri(uri)
        .body(Body::new(body))?;
    *up.headers_mut() = headers;

    let mut resp = client().request(up).await?;

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            anyhow::bail!("upstream switched protocols without being asked");
        };
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        OPEN_SOCKETS.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            match tokio::try_join!(client_upgrade, upstream_upgrade) {
                Ok((c, u)) => {
                    let mut c = TokioIo::new(c);
                    let mut u = TokioIo::new(u);
                    let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
                }
                Err(e) => tracing::debug!(error = %e, "notebook proxy: upgrade failed"),
            }
            OPEN_SOCKETS.fetch_sub(1, Ordering::SeqCst);
        });
        let (mut parts, _) = resp.into_parts();
        drop_upstream_headers(&mut parts.headers);
        let mut out = Response::from_parts(parts, Body::empty());
        // Keep the upgrade handshake headers (Upgrade, Connection, Sec-WebSocket-*).
        out.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        return Ok(out);
    }

    let (mut parts, body) = resp.into_parts();
    strip_hop(&mut parts.headers);
    drop_upstream_headers(&mut parts.headers);
    let html = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("text/html"));
    let small = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .is_none_or(|n| n <= MAX_REWRITE);
    let encoded = parts.headers.contains_key(header::CONTENT_ENCODING);
    if html && small && !encoded {
        let bytes = axum::body::to_bytes(Body::new(body), MAX_REWRITE).await?;
        let page = String::from_utf8_lossy(&bytes).replace(&t.token, "");
        parts.headers.remove(header::CONTENT_LENGTH);
        return Ok(Response::from_parts(parts, Body::from(page)));
    }
    Ok(Response::from_parts(parts, Body::new(body)))
}
