//! Cross-site request forgery protection for every state-changing request.
//!
//! Browsers label each request with `Sec-Fetch-Site` (and send `Origin` on POST). A request
//! that may change state (anything but GET/HEAD/OPTIONS) is accepted only when it comes from
//! this origin. Server functions are POSTs, so they are covered too. Requests that carry no
//! cookie but an `Authorization` header (API tokens, node credentials) cannot be forged by
//! another site and are let through to their own authentication, as is the agent API
//! (`/agent/`), which never reads cookies.

use crate::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, header};
use tessera_domain::error::AppError;

pub async fn guard(State(state): State<AppState>, req: Request<Body>, next: Next) -> Response {
    let path = req.uri().path();
    // A REST call without cookies carries no ambient credential a cross-site page could
    // ride on: it is either token-authenticated or answered 401 by the auth layer.
    let cookieless_api = path.starts_with("/api/") && !req.headers().contains_key(header::COOKIE);
    if is_safe(req.method())
        || is_token_request(req.headers())
        || cookieless_api
        || path.starts_with("/agent/")
    {
        return next.run(req).await;
    }
    match same_origin(req.headers(), &state.config.public_url()) {
        Ok(()) => next.run(req).await,
        Err(why) => {
            tracing::warn!(path = %req.uri().path(), why, "cross-site request refused");
            // The API's one error shape (`{error, message}`), as its OpenAPI document says.
            super::error::ApiError(AppError::Forbidden).into_response()
        }
    }
}

fn is_safe(m: &Method) -> bool {
    matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn is_token_request(h: &HeaderMap) -> bool {
    h.contains_key(header::AUTHORIZATION) && !h.contains_key(header::COOKIE)
}

pub(super) fn same_origin(h: &HeaderMap, public_url: &str) -> Result<(), &'static str> {
    if let Some(site) = h.get("sec-fetch-site") {
        return match site.as_bytes() {
            b"same-origin" | b"none" => Ok(()),
            _ => Err("Sec-Fetch-Site is not same-origin"),
        };
    }
    let Some(origin) = h.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return Err("neither Sec-Fetch-Site nor Origin present");
    };
    let host = h.get(header::HOST).and_then(|v| v.to_str().ok());
    let matches_host = host.is_some_and(|host| {
        origin
            .split_once("://")
            .is_some_and(|(_, rest)| rest.eq_ignore_ascii_case(host))
    });
    if matches_host || origin.eq_ignore_ascii_case(public_url) {
        Ok(())
    } else {
        Err("Origin does not match")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn origin_rules() {
        let pub_url = "https://gpu.example.org";
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-origin")]), pub_url).is_ok());
        assert!(same_origin(&headers(&[("sec-fetch-site", "cross-site")]), pub_url).is_err());
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-site")]), pub_url).is_err());
        assert!(
            same_origin(
                &headers(&[
                    ("origin", "http://127.0.0.1:3000"),
                    ("host", "127.0.0.1:3000")
                ]),
                pub_url
            )
            .is_ok()
        );
        assert!(
            same_origin(
                &headers(&[
                    ("origin", "https://evil.example"),
                    ("host", "127.0.0.1:3000")
                ]),
                pub_url
            )
            .is_err()
        );
        assert!(same_origin(&headers(&[("origin", "https://gpu.example.org")]), pub_url).is_ok());
        assert!(same_origin(&headers(&[]), pub_url).is_err());
    }

    #[test]
    fn bearer_requests_without_cookies_skip_the_check() {
        assert!(is_token_request(&headers(&[("authorization", "Bearer x")])));
        assert!(!is_token_request(&headers(&[
            ("authorization", "Bearer x"),
            ("cookie", "tessera_session=1")
        ])));
    }
}
