//! Health, readiness, metrics, pages, configuration errors and load shedding.

use crate::on_both_databases;
use crate::support::{ADMIN_PASSWORD, Db, TestApp};
use std::time::{Duration, Instant};

on_both_databases!(
    health_ready_and_metrics,
    pages_render_and_protect_themselves,
    a_login_flood_gets_429_and_does_not_starve_other_requests,
);

async fn health_ready_and_metrics(db: Db) {
    let app = TestApp::spawn(db).await;
    let c = reqwest::Client::new();
    assert_eq!(
        c.get(app.url("/healthz"))
            .send()
            .await
            .expect("req")
            .text()
            .await
            .expect("b"),
        "ok"
    );
    assert_eq!(
        c.get(app.url("/readyz"))
            .send()
            .await
            .expect("req")
            .status(),
        200
    );
    let _ = c.get(app.url("/login")).send().await.expect("req");
    let m = c
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("req")
        .text()
        .await
        .expect("b");
    assert!(m.contains("tessera_http_requests_total{"), "{m}");
    assert!(m.contains(r#"route="/login""#), "{m}");
    assert!(
        m.contains("tessera_http_request_duration_seconds_bucket{"),
        "{m}"
    );
}

async fn pages_render_and_protect_themselves(db: Db) {
    let app = TestApp::spawn(db).await;
    let b = app.browser();
    let page = |path: &str| {
        b.client
            .get(app.url(path))
            .header("accept", "text/html,application/xhtml+xml")
            .send()
    };
    let login = page("/login").await.expect("req");
    assert_eq!(login.status(), 200);
    let html = login.text().await.expect("body");
    assert!(html.contains("Sign in to Tessera") && html.contains("name=\"password\""));
    // Anonymous visitors are sent to the login page.
    let dash = page("/").await.expect("req");
    assert_eq!(dash.status(), 303);
    assert_eq!(dash.headers()["location"], "/login?next=%2F");
    // Any page, with its query, and whatever the client accepts (curl, link previews).
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
        .get(app.url("/allocations?state=active"))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 303);
    assert_eq!(
        r.headers()["location"],
        "/login?next=%2Fallocations%3Fstate%3Dactive"
    );
    // Signing in returns there; a foreign `next` goes to the dashboard instead.
    for (next, lands) in [
        ("/allocations?state=active", "/allocations?state=active"),
        ("//evil.example/x", "/"),
        ("https://evil.example/", "/"),
    ] {
        // As the sign-in form posts without JavaScript.
        let r = app
            .browser()
            .client
            .post(app.url("/fn/login"))
            .header("accept", "text/html")
            .form(&[
                ("username", "admin"),
                ("password", ADMIN_PASSWORD),
                ("next", next),
            ])
            .send()
            .await
            .expect("login");
        assert_eq!(r.status(), 302, "{next}");
        assert_eq!(r.headers()["location"], lands, "{next}");
    }
    assert!(b.login("admin", ADMIN_PASSWORD).await.status().is_success());
    let dash = page("/").await.expect("req");
    assert_eq!(dash.status(), 200);
    let html = dash.text().await.expect("body");
    assert!(
        html.contains("Dashboard")
            && html.contains("My usage this month")
            && html.contains("/usage"),
        "{html}"
    );
    let missing = page("/no/such/page").await.expect("req");
    assert_eq!(missing.status(), 404);
}

async fn a_login_flood_gets_429_and_does_not_starve_other_requests(db: Db) {
    let app = TestApp::spawn_with(db, |c| {
        c.login_concurrency = Some(1);
        c.login_queue = 1;
    })
    .await;
    let mut tasks = Vec::new();
    // All 24 set off together, so that they overlap even on a loaded machine.
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(24));
    for i in 0..24 {
        let b = app.browser();
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let r = b.login(&format!("flood{i}"), "some-password-here").await;
            (
                r.status().as_u16(),
                r.headers().get("retry-after").is_some(),
            )
        }));
    }
    // While the flood runs, health checks still answer promptly.
    let c = reqwest::Client::new();
    let t = Instant::now();
    let h = c.get(app.url("/healthz")).send().await.expect("req");
    assert!(h.status().is_success());
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "healthz took {:?}",
        t.elapsed()
    );
    let mut limited = 0;
    for t in tasks {
        let (status, retry_after) = t.await.expect("join");
        assert!(status == 401 || status == 429, "{status}");
        if status == 429 {
            assert!(retry_after, "429 carries Retry-After");
            limited += 1;
        }
    }
    assert!(limited > 0, "some of the flood was shed");
}

#[test]
fn bad_configuration_fails_at_start_naming_the_setting() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["serve", "--bind", "127.0.0.1:0"])
        .env("TESSERA_DATABASE_URL", "mysql://nope")
        .output()
        .expect("run tessera");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TESSERA_DATABASE_URL"), "{err}");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["serve", "--session-idle-timeout", "forever"])
        .output()
        .expect("run tessera");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--session-idle-timeout"), "{err}");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["serve", "--bind", "not-an-address"])
        .output()
        .expect("run tessera");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bind"));
}

#[test]
fn tessera_plan_prints_a_plan_and_locates_bad_input() {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/examples");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["plan", "--cluster", &format!("{examples}/cluster.json")])
        .args(["--requests", &format!("{examples}/requests.json")])
        .output()
        .expect("run tessera plan");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("plan is JSON");
    assert!(plan["assignments"].is_array() && plan["pending"].is_array());

    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("requests.json");
    std::fs::write(&bad, "[\n  {\"id\": \"r1\", \"gpus\": \"two\"}\n]\n").expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["plan", "--cluster", &format!("{examples}/cluster.json")])
        .arg("--requests")
        .arg(&bad)
        .output()
        .expect("run tessera plan");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("requests.json:2:") && err.contains("[0].gpus"),
        "{err}"
    );
}

/// The UI bundle as `cargo xtask build` publishes it (content-hashed names with brotli and
/// gzip twins, split into lazily loaded chunks): pages name the hashed files, a page of a
/// lazily loaded group names the chunk loader to preload, each client gets the encoding it
/// accepts, and hashed files may be cached for a year while pages are asked for again on
/// each visit. (The browser tests load the real split bundle.)
#[tokio::test]
async fn the_bundle_is_served_hashed_precompressed_and_cached() {
    let site = tempfile::tempdir().expect("tmp");
    let pkg = site.path().join("pkg");
    std::fs::create_dir_all(&pkg).expect("pkg");
    let stem = "tessera.0123456789abcdef";
    let loader = "__wasm_split.0123456789abcdef.split.js";
    for (file, body) in [
        (format!("{stem}.js"), "js plain"),
        (format!("{stem}.js.br"), "js brotli"),
        (format!("{stem}.js.gz"), "js gzip"),
        (format!("{stem}_bg.wasm"), "wasm plain"),
        (format!("{stem}_bg.wasm.br"), "wasm brotli"),
        (format!("{stem}_bg.wasm.gz"), "wasm gzip"),
        (format!("{stem}.css"), "css plain"),
        ("tessera.css".to_owned(), "css unhashed"),
        (loader.to_owned(), "loader"),
        ("chunk_4.0123456789abcdef.wasm".to_owned(), "chunk"),
        (
            format!("{stem}.split.json"),
            &format!(
                r#"{{"loader": "{loader}", "needs": {{"work": ["chunk_4.0123456789abcdef", "split_work_42.0123456789abcdef"]}}}}"#
            ),
        ),
    ] {
        std::fs::write(pkg.join(file), body).expect("write");
    }
    let root = site.path().to_owned();
    let app = TestApp::spawn_with(Db::Sqlite, move |c| c.site_root = root).await;
    let c = reqwest::Client::new();

    let login = c.get(app.url("/login")).send().await.expect("login");
    assert_eq!(login.headers()["cache-control"], "private, no-cache");
    let html = login.text().await.expect("html");
    // The sign-in page is server-only: its stylesheet, no bundle loaded, the hashed
    // bundle named for the prefetch once the visitor types.
    assert!(html.contains(&format!("/pkg/{stem}.css")), "{html}");
    assert!(html.contains("data-server-only"), "{html}");
    assert!(
        !html.contains("modulepreload") && !html.contains("rel=\"preload\""),
        "{html}"
    );
    assert!(
        html.contains(&format!(
            "data-prefetch=\"/pkg/{stem}.js /pkg/{stem}_bg.wasm /pkg/{loader}\""
        )),
        "{html}"
    );
    // Headed for a lazily loaded page, the visitor also prefetches that page's chunks.
    let html = c
        .get(app.url("/login?next=%2Fallocations%3Fstate%3Dactive"))
        .send()
        .await
        .expect("login")
        .text()
        .await
        .expect("html");
    assert!(
        html.contains(
            "data-prefetch-next=\"/pkg/chunk_4.0123456789abcdef.wasm /pkg/split_work_42.0123456789abcdef.wasm\""
        ),
        "{html}"
    );
    // A signed-in page names the hashed bundle.
    let cookie = crate::support::login(&app, "admin", crate::support::ADMIN_PASSWORD).await;
    let dash = c
        .get(app.url("/"))
        .header("cookie", cookie.clone())
        .send()
        .await
        .expect("dashboard");
    assert_eq!(dash.headers()["cache-control"], "private, no-cache");
    let html = dash.text().await.expect("html");
    for href in [
        format!("/pkg/{stem}.js"),
        format!("/pkg/{stem}_bg.wasm"),
        format!("/pkg/{stem}.css"),
    ] {
        assert!(html.contains(&href), "{href} in {html}");
    }
    assert!(!html.contains("data-server-only"), "{html}");
    // Every hydrated page preloads the chunk loader the main module imports; the dashboard
    // is in the main module, so no chunk. The allocations page is loaded on demand: its
    // response names its group's chunks for the browser to fetch beside the main module.
    let modulepreload = format!("rel=\"modulepreload\" href=\"/pkg/{loader}\"");
    let chunk = "rel=\"preload\" href=\"/pkg/split_work_42.0123456789abcdef.wasm\"";
    assert!(html.contains(&modulepreload), "{html}");
    assert!(!html.contains(".0123456789abcdef.wasm\""), "{html}");
    let html = c
        .get(app.url("/allocations"))
        .header("cookie", cookie.clone())
        .send()
        .await
        .expect("allocations")
        .text()
        .await
        .expect("html");
    assert!(html.contains(&modulepreload), "{html}");
    assert!(html.contains(chunk), "{html}");
    assert!(
        html.contains("rel=\"preload\" href=\"/pkg/chunk_4.0123456789abcdef.wasm\""),
        "{html}"
    );

    let get = |path: String, encoding: &'static str| {
        let c = c.clone();
        let url = app.url(&path);
        async move {
            let r = c
                .get(url)
                .header("accept-encoding", encoding)
                .send()
                .await
                .expect("asset");
            let h = r.headers().clone();
            let header = |k: &str| {
                h.get(k)
                    .map(|v| v.to_str().expect("ascii").to_owned())
                    .unwrap_or_default()
            };
            (
                r.status().as_u16(),
                header("content-encoding"),
                header("content-type"),
                header("cache-control"),
                r.text().await.expect("body"),
            )
        }
    };
    let immutable = "public, max-age=31536000, immutable";
    let (s, enc, ty, cache, body) = get(format!("/pkg/{stem}_bg.wasm"), "gzip, deflate, br").await;
    assert_eq!((s, enc.as_str(), body.as_str()), (200, "br", "wasm brotli"));
    assert_eq!(
        (ty.as_str(), cache.as_str()),
        ("application/wasm", immutable)
    );
    for hashed in [loader, "chunk_4.0123456789abcdef.wasm"] {
        let (s, _, _, cache, _) = get(format!("/pkg/{hashed}"), "br").await;
        assert_eq!((s, cache.as_str()), (200, immutable), "{hashed}");
    }
    let (s, enc, _, _, body) = get(format!("/pkg/{stem}.js"), "gzip").await;
    assert_eq!((s, enc.as_str(), body.as_str()), (200, "gzip", "js gzip"));
    let (s, enc, _, cache, body) = get(format!("/pkg/{stem}.css"), "identity").await;
    assert_eq!((s, enc.as_str(), body.as_str()), (200, "", "css plain"));
    assert_eq!(cache, immutable);
    // Unhashed: revalidated, never cached for long.
    let (s, _, _, cache, body) = get("/pkg/tessera.css".into(), "br").await;
    assert_eq!(
        (s, cache.as_str(), body.as_str()),
        (200, "no-cache", "css unhashed")
    );
    let (s, _, _, cache, _) = get(format!("/pkg/{stem}.map"), "br").await;
    assert_eq!(s, 404);
    assert!(!cache.contains("immutable"), "{cache}");
}
