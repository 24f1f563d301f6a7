//! The notebook proxy: `/user/{username}/{server}/…` → the notebook's JupyterLab.
//!
//! Only the notebook's owner (and platform admins, audited) get through; anyone else gets
//! exactly the 404 of a notebook that does not exist. The caller is authenticated like the
//! REST API (session cookie or `Bearer` API token); neither credential travels upstream:
//! the proxy strips Tessera's session cookie and the caller's `Authorization` header and
//! sends the notebook's own token instead (`Authorization: token …`), so the browser never
//! holds it. JupyterLab writes its token into the HTML page config; the proxy blanks it out
//! of every HTML response. WebSockets (kernels) pass through as raw upgraded connections.
//!
//! JupyterLab runs with `base_url` = `/user/{username}/{server}/`, so paths go upstream
//! unchanged.

use crate::AppState;
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
use tessera_core::request::session_principal;
use tessera_core::services::workloads::{NotReady, ProxyTarget};
use tessera_domain::account::Principal;
use tessera_domain::error::AppError;
use tower_sessions::Session;

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

fn wants_html(req: &Request) -> bool {
    req.method() == http::Method::GET
        && req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/html"))
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "not found").into_response()
}

async fn proxy(s: AppState, username: String, server: String, req: Request) -> Response {
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|v| v.trim().to_owned());
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

/// While a notebook starts: a page that reloads itself (browsers), or 503 + Retry-After.
fn starting_page(html: bool, state: &str) -> Response {
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

/// The request's cookies minus Tessera's session cookie.
fn cookies_without_session(h: &HeaderMap) -> Option<HeaderValue> {
    let kept: Vec<&str> = h
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| {
            let name = c.split('=').next().unwrap_or("");
            !c.is_empty() && !name.ends_with("tessera_session")
        })
        .collect();
    (!kept.is_empty())
        .then(|| HeaderValue::from_str(&kept.join("; ")).ok())
        .flatten()
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
    let cookies = cookies_without_session(&headers);
    headers.remove(header::COOKIE);
    if let Some(c) = cookies {
        headers.insert(header::COOKIE, c);
    }
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
        tokio::spawn(async move {
            match tokio::try_join!(client_upgrade, upstream_upgrade) {
                Ok((c, u)) => {
                    let mut c = TokioIo::new(c);
                    let mut u = TokioIo::new(u);
                    let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
                }
                Err(e) => tracing::debug!(error = %e, "notebook proxy: upgrade failed"),
            }
        });
        let (parts, _) = resp.into_parts();
        let mut out = Response::from_parts(parts, Body::empty());
        // Keep the upgrade handshake headers (Upgrade, Connection, Sec-WebSocket-*).
        out.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        return Ok(out);
    }

    let (mut parts, body) = resp.into_parts();
    strip_hop(&mut parts.headers);
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
