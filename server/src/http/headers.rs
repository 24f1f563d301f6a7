//! Security headers on every response of the portal's origin.
//!
//! - `Content-Security-Policy`: scripts only from this origin or inline with this
//!   response's nonce (Leptos stamps it on its hydration and streaming scripts; see
//!   [`CspNonce`]), WebAssembly compilation for the UI bundle, no plugins, no `<base>`, and
//!   `frame-ancestors 'none'`: no other page can frame the portal (clickjacking). Styles
//!   may be inline (a few `style` attributes); scripts never.
//! - `X-Frame-Options: DENY` for browsers that predate `frame-ancestors`.
//! - `X-Content-Type-Options: nosniff`, `Referrer-Policy: same-origin`.
//! - `Strict-Transport-Security` when the portal is served over https.
//!
//! Notebook origins never get here (their requests are answered before the portal's
//! routes), so JupyterLab keeps the policy it sends itself.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::HeaderValue;
use http::header;
use tessera_core::request::CspNonce;

/// The policy for a response whose inline scripts carry `nonce`.
pub fn policy(nonce: &str) -> String {
    format!(
        "default-src 'self'; script-src 'self' 'nonce-{nonce}' 'wasm-unsafe-eval'; \
         style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'; \
         base-uri 'none'; frame-ancestors 'none'"
    )
}

/// Adds the headers; `secure`: the portal is served over https.
pub async fn portal(State(secure): State<bool>, mut req: Request<Body>, next: Next) -> Response {
    let nonce = tessera_core::auth::secret::random_hex(16);
    req.extensions_mut().insert(CspNonce(nonce.clone()));
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&policy(&nonce)) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if secure {
        h.insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000"),
        );
    }
    res
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_policy_allows_no_inline_script_without_the_nonce() {
        let p = super::policy("abc123");
        let script = p
            .split(';')
            .map(str::trim)
            .find(|d| d.starts_with("script-src"))
            .expect("script-src");
        assert!(script.contains("'nonce-abc123'"), "{script}");
        assert!(!script.contains("unsafe-inline"), "{script}");
        assert!(!script.contains("'unsafe-eval'"), "{script}");
        assert!(p.contains("frame-ancestors 'none'"), "{p}");
    }
}
