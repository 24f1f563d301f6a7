//! Request counting and latency by route template (never by raw path, which would let
//! clients create unbounded label values) and by method (the standard ones; anything else
//! counts as `OTHER`, for the same reason).

use super::notebook_origin::NotebookRoute;
use crate::observability::{HTTP_DURATION, HTTP_REQUESTS};
use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use http::Method;
use std::time::Instant;

pub async fn track(req: Request<Body>, next: Next) -> Response {
    let matched = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let pkg = req.uri().path().starts_with("/pkg/");
    let method = method_label(req.method());
    let start = Instant::now();
    let res = next.run(req).await;
    let route = match matched {
        Some(m) => m,
        None if res.extensions().get::<NotebookRoute>().is_some() => "notebook origin".into(),
        None if pkg => "/pkg/{file}".into(),
        None => "unmatched".into(),
    };
    let status = res.status().as_u16().to_string();
    metrics::counter!(HTTP_REQUESTS, "route" => route.clone(), "method" => method, "status" => status)
        .increment(1);
    metrics::histogram!(HTTP_DURATION, "route" => route).record(start.elapsed().as_secs_f64());
    res
}

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn unknown_methods_share_one_label() {
        let odd = http::Method::from_bytes(b"XYZZY123").expect("method");
        assert_eq!(super::method_label(&odd), "OTHER");
        assert_eq!(super::method_label(&http::Method::PATCH), "PATCH");
    }
}
