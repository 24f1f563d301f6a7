//! The UI bundle under `/pkg`: `cargo xtask build` names its files by their content
//! (`tessera.<hash>.js`, `tessera.<hash>_bg.wasm`, `tessera.<hash>.css`) and writes brotli
//! and gzip twins beside them. Browsers get the smallest encoding they accept, and keep a
//! hashed file for a year without asking again: a new build is a new name. Pages
//! (`text/html`) are revalidated on every visit ([`no_cache_pages`]).

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tower_http::services::ServeDir;

/// The bundle's name in `pkg` (`tessera.<hash>`, as Leptos's output name), from its `.js`
/// file; the newest when several are there. None: no bundle built.
pub fn name(pkg: &Path) -> Option<String> {
    let base = tessera_app::OUTPUT_NAME;
    std::fs::read_dir(pkg)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let file = e.file_name().into_string().ok()?;
            let stem = file.strip_suffix(".js")?;
            (stem == base || stem.strip_prefix(base)?.starts_with('.')).then(|| {
                (
                    e.metadata().and_then(|m| m.modified()).ok(),
                    stem.to_owned(),
                )
            })
        })
        .max()
        .map(|(_, stem)| stem)
}

/// The split bundle's map (`<name>.split.json`, written by `cargo xtask build`): the chunk
/// loader's file and, for each lazily loaded group of pages, the chunks it needs. Provided
/// to every page's render, it lets pages preload what they need beside the main module.
/// None: no map (an older bundle), so pages load their chunks on demand only.
pub fn split_manifest(pkg: &Path, name: &str) -> Option<Arc<tessera_app::SplitBundle>> {
    #[derive(serde::Deserialize)]
    struct Manifest {
        loader: String,
        needs: std::collections::HashMap<String, Vec<String>>,
    }
    let path = pkg.join(format!("{name}.split.json"));
    let text = std::fs::read_to_string(&path).ok()?;
    match serde_json::from_str::<Manifest>(&text) {
        Ok(m) => Some(Arc::new(tessera_app::SplitBundle {
            loader: m.loader,
            needs: m.needs,
        })),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "unreadable split-bundle map: pages load their chunks on demand only");
            None
        }
    }
}

/// Serves `pkg`: precompressed twins by `Accept-Encoding`, immutable caching for hashed
/// names.
pub fn service(pkg: PathBuf) -> Router {
    Router::new()
        .fallback_service(ServeDir::new(pkg).precompressed_br().precompressed_gzip())
        .layer(axum::middleware::from_fn(cache_hashed))
}

async fn cache_hashed(req: Request<Body>, next: Next) -> Response {
    let hashed = is_hashed(req.uri().path());
    let mut res = next.run(req).await;
    if res.status() == StatusCode::OK {
        let value = if hashed {
            "public, max-age=31536000, immutable"
        } else {
            "no-cache"
        };
        res.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static(value));
    }
    res
}

/// A content-hashed file: one of its name's dot-separated parts is 16 hex digits
/// (`tessera.<hash>.js`, `tessera.<hash>_bg.wasm`, `chunk_4.<hash>.wasm`,
/// `__wasm_split.<hash>.split.js`), and it is code or style.
fn is_hashed(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    let Some(stem) = file
        .strip_suffix(".js")
        .or_else(|| file.strip_suffix(".wasm"))
        .or_else(|| file.strip_suffix(".css"))
    else {
        return false;
    };
    stem.split('.').skip(1).any(|part| {
        let hash = part.strip_suffix("_bg").unwrap_or(part);
        hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// Pages carry the viewer's data and change with every action: the browser asks again
/// each time (`no-cache`), and shared caches keep none (`private`).
pub async fn no_cache_pages(req: Request<Body>, next: Next) -> Response {
    let mut res = next.run(req).await;
    let html = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("text/html"));
    if html && !res.headers().contains_key(header::CACHE_CONTROL) {
        res.headers_mut().insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("private, no-cache"),
        );
    }
    res
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_content_hashed_names_count_as_hashed() {
        for yes in [
            "/tessera.0123456789abcdef.js",
            "/tessera.0123456789abcdef_bg.wasm",
            "/pkg/tessera.0123456789ABCDEF.css",
            "/pkg/chunk_4.0123456789abcdef.wasm",
            "/pkg/split_work_87032.0123456789abcdef.wasm",
            "/pkg/__wasm_split.0123456789abcdef.split.js",
        ] {
            assert!(super::is_hashed(yes), "{yes}");
        }
        for no in [
            "/tessera.js",
            "/tessera_bg.wasm",
            "/tessera.0123456789abcde.js",
            "/tessera.0123456789abcdeg.js",
            "/tessera.0123456789abcdef.html",
            "/tessera.0123456789abcdef.split.json",
            "/0123456789abcdef.js",
        ] {
            assert!(!super::is_hashed(no), "{no}");
        }
    }
}
