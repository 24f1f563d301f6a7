//! Time to notebook and notebook-proxy throughput, end to end on this machine.
//!
//! `cargo bench -p tessera-server --bench notebook` (needs `jupyter lab` on PATH and a
//! built `tessera-agent`; it builds the release agent when missing). Starts the server
//! in-process on SQLite with one simulated H100 node (a real `tessera-agent --simulate`
//! whose process executor starts real JupyterLab), then:
//!
//! 1. `RUNS` times (default 10): request a 1g.10gb slice, launch a notebook on it once
//!    active, wait until it answers; prints request→ready and launch→ready (median, p90).
//! 2. `REQUESTS` (default 2000) GETs of the notebook's `api/status` with `CONCURRENCY`
//!    (default 16) clients, through the proxy and directly at JupyterLab; requests/s and
//!    p50/p99 latency of each.
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/it/agent_bin.rs"]
mod agent_bin;
mod support;

use agent_bin::agent_bin;
use support::env_usize;

use reqwest::Method;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{InProcess, login};
use tessera_server::config::ServeConfig;

const PW: &str = "bench-admin-password";

struct Api {
    base: String,
    client: reqwest::Client,
    auth: String,
}

impl Api {
    async fn call(&self, m: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut rb = self
            .client
            .request(m, format!("{}{path}", self.base))
            .header("origin", &self.base);
        rb = if self.auth.starts_with("tsk_") {
            rb.bearer_auth(&self.auth)
        } else {
            rb.header("cookie", &self.auth)
        };
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let r = rb.send().await.expect("request");
        let s = r.status().as_u16();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    async fn wait(&self, path: &str, state: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let (_, v) = self.call(Method::GET, path, None).await;
            if v["state"] == state {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{path} never became {state}: {v}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn load(
    url: String,
    header: (&'static str, String),
    requests: usize,
    concurrency: usize,
) -> (f64, f64, f64) {
    let client = reqwest::Client::new();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, url, header, next) =
            (client.clone(), url.clone(), header.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < requests {
                let t = Instant::now();
                let r = client
                    .get(&url)
                    .header(header.0, &header.1)
                    .send()
                    .await
                    .expect("request");
                assert_eq!(r.status(), 200);
                let _ = r.bytes().await.expect("body");
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    let secs = started.elapsed().as_secs_f64();
    all.sort_by(|a, b| a.total_cmp(b));
    (all.len() as f64 / secs, pct(&all, 0.5), pct(&all, 0.99))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let runs = env_usize("RUNS", 10);
    let requests = env_usize("REQUESTS", 2000);
    let concurrency = env_usize("CONCURRENCY", 16);
    let dir = tempfile::tempdir().expect("tempdir");
    let server = InProcess::start(dir.path(), PW, agent_bin()).await;
    let (url, base) = (server.url.clone(), server.base());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let admin = Api {
        base: base.clone(),
        client: reqwest::Client::new(),
        auth: login(&base, "admin", PW).await,
    };
    let (_, team) = admin
        .call(
            Method::POST,
            "/api/v1/teams",
            Some(json!({"name": "bench"})),
        )
        .await;
    let team_id = team["id"].as_str().expect("team").to_owned();
    admin
        .call(
            Method::POST,
            "/api/v1/users",
            Some(json!({"username": "bench", "password": PW})),
        )
        .await;
    admin
        .call(
            Method::POST,
            &format!("/api/v1/teams/{team_id}/members"),
            Some(json!({"username": "bench", "role": "member"})),
        )
        .await;
    admin
        .call(
            Method::PUT,
            &format!("/api/v1/teams/{team_id}/quotas/H100-80GB"),
            Some(json!({"guaranteed": 7, "limit": 7, "per_user": 7})),
        )
        .await;
    let member = Api {
        base: base.clone(),
        client: reqwest::Client::new(),
        auth: login(&base, "bench", PW).await,
    };
    // The node must have registered before the clock starts.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, nodes) = admin.call(Method::GET, "/api/v1/nodes", None).await;
        if nodes["total"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "simulated node never registered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let mut total = Vec::new();
    let mut launch = Vec::new();
    let mut last: Option<(String, String)> = None;
    for i in 0..runs {
        let t0 = Instant::now();
        let (s, a) = member
            .call(
                Method::POST,
                "/api/v1/allocations",
                Some(json!({"team_id": team_id, "kind": "H100-80GB:1g.10gb"})),
            )
            .await;
        assert_eq!(s, 201, "{a}");
        let alloc = a["id"].as_str().expect("id").to_owned();
        member
            .wait(&format!("/api/v1/allocations/{alloc}"), "active")
            .await;
        let t1 = Instant::now();
        let (s, nb) = member
            .call(
                Method::POST,
                "/api/v1/notebooks",
                Some(json!({"allocation_id": alloc, "name": format!("nb{i}")})),
            )
            .await;
        assert_eq!(s, 201, "{nb}");
        let id = nb["id"].as_str().expect("id").to_owned();
        member
            .wait(&format!("/api/v1/workloads/{id}"), "running")
            .await;
        total.push(t0.elapsed().as_secs_f64());
        launch.push(t1.elapsed().as_secs_f64());
        eprintln!(
            "run {i}: request→ready {:.2} s, launch→ready {:.2} s",
            total[i], launch[i]
        );
        if i + 1 < runs {
            member
                .call(Method::POST, &format!("/api/v1/workloads/{id}/stop"), None)
                .await;
            member
                .wait(&format!("/api/v1/workloads/{id}"), "stopped")
                .await;
            member
                .call(
                    Method::POST,
                    &format!("/api/v1/allocations/{alloc}/release"),
                    None,
                )
                .await;
        } else {
            last = Some((id, format!("/user/bench/nb{i}/")));
        }
    }
    total.sort_by(|a, b| a.total_cmp(b));
    launch.sort_by(|a, b| a.total_cmp(b));
    println!(
        "time to notebook over {runs} runs: request→ready median {:.2} s (p90 {:.2}); \
         launch→ready median {:.2} s (p90 {:.2})",
        pct(&total, 0.5),
        pct(&total, 0.9),
        pct(&launch, 0.5),
        pct(&launch, 0.9)
    );

    let (id, path) = last.expect("a notebook");
    let store = tessera_core::store::Store::connect(&url)
        .await
        .expect("store");
    let row = store
        .workload(tessera_domain::ids::WorkloadId::parse(&id).expect("uuid"))
        .await
        .expect("load")
        .expect("row");
    let keys = tessera_server::data_keys::load(&ServeConfig::for_tests(&url)).expect("data keys");
    let token = tessera_core::services::workloads::open_notebook_token(&keys, &row.w)
        .expect("the token opens")
        .expect("token");
    let endpoint = row.w.endpoint.expect("endpoint");
    let (s, tok) = member
        .call(
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"name": "bench"})),
        )
        .await;
    assert_eq!(s, 201);
    let api_token = tok["secret"].as_str().expect("secret").to_owned();
    // Warm both paths up.
    let _ = load(
        format!("http://{endpoint}{path}api/status"),
        ("authorization", format!("token {token}")),
        50,
        4,
    )
    .await;
    let direct = load(
        format!("http://{endpoint}{path}api/status"),
        ("authorization", format!("token {token}")),
        requests,
        concurrency,
    )
    .await;
    let proxied = load(
        format!("{base}{path}api/status"),
        ("authorization", format!("Bearer {api_token}")),
        requests,
        concurrency,
    )
    .await;
    println!(
        "api/status, {requests} requests, {concurrency} clients: direct {:.0} req/s (p50 {:.1} ms, \
         p99 {:.1} ms); through the proxy {:.0} req/s (p50 {:.1} ms, p99 {:.1} ms)",
        direct.0, direct.1, direct.2, proxied.0, proxied.1, proxied.2
    );
    server.stop().await;
}
