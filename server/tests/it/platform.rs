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
        html.contains("Dashboard") && html.contains("Usage and spend") && html.contains("/usage"),
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
    for i in 0..24 {
        let b = app.browser();
        tasks.push(tokio::spawn(async move {
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
