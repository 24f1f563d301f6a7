//! Request counting and latency by route template (never by raw path, which would let
//! clients create unbounded label values).

use crate::observability::{HTTP_DURATION, HTTP_REQUESTS};
use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use std::time::Instant;

pub async fn track(req: Request<Body>, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| {
            if req.uri().path().starts_with("/pkg/") {
                "/pkg/{file}".to_owned()
            } else {
                "unmatched".to_owned()
            }
        });
    let method = req.method().to_string();
    let start = Instant::now();
    let res = next.run(req).await;
    let status = res.status().as_u16().to_string();
    metrics::counter!(HTTP_REQUESTS, "route" => route.clone(), "method" => method, "status" => status)
        .increment(1);
    metrics::histogram!(HTTP_DURATION, "route" => route).record(start.elapsed().as_secs_f64());
    res
}
