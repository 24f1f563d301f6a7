//! Live updates at scale: `STREAMS` (1,000) open `/events` streams of one team's member
//! against one `tessera serve` (release build, SQLite, no simulated nodes).
//!
//! `cargo bench -p tessera-server --bench events` (env `STREAMS`, `CHANGES` (20)). Prints
//! the server's resident memory and CPU with no stream, with every stream open and idle,
//! and while changes happen; then, for `CHANGES` changes (a slice requested, then
//! released), how long after the API call answered each stream heard of it: p50, p99, max
//! over every stream and change. Figures in docs/benchmarks.md §12.
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::env_usize;

use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{call, login, token_for};

const PW: &str = "events-bench-password-1";

/// (resident KiB, CPU seconds so far) of process `pid`.
fn usage(pid: u32) -> (u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum();
    (rss, ticks / 100.0)
}

/// Milliseconds over which `window` CPU seconds were spent, as a share of one core.
fn cpu_share(before: f64, after: f64, window: Duration) -> f64 {
    100.0 * (after - before) / window.as_secs_f64()
}

#[tokio::main]
async fn main() {
    let streams = env_usize("STREAMS", 1000);
    let changes = env_usize("CHANGES", 20);
    let dir = tempfile::tempdir().expect("tempdir");
    let (port, mut server) = support::serve(
        &format!("sqlite://{}/events.db?mode=rwc", dir.path().display()),
        PW,
        &[],
    );
    let pid = server.id().expect("pid");
    let base = format!("http://127.0.0.1:{port}");
    while !reqwest::get(format!("{base}/readyz"))
        .await
        .is_ok_and(|r| r.status() == reqwest::StatusCode::OK)
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A team with a quota and a member with an API token.
    let admin = login(&base, "admin", PW).await;
    let post = reqwest::Method::POST;
    let (_, team) = call(
        &base,
        &admin,
        post.clone(),
        "/api/v1/teams",
        json!({"name": "live"}),
    )
    .await;
    let team = team["id"].as_str().expect("team").to_owned();
    call(
        &base,
        &admin,
        reqwest::Method::PUT,
        &format!("/api/v1/teams/{team}/quotas/H100-80GB"),
        json!({"guaranteed": 7, "limit": 7, "per_user": 7}),
    )
    .await;
    call(
        &base,
        &admin,
        post.clone(),
        "/api/v1/users",
        json!({"username": "viewer", "password": PW}),
    )
    .await;
    call(
        &base,
        &admin,
        post.clone(),
        &format!("/api/v1/teams/{team}/members"),
        json!({"username": "viewer", "role": "member"}),
    )
    .await;
    let token = token_for(&base, "viewer", PW).await;

    let window = Duration::from_secs(10);
    let (rss0, cpu0) = usage(pid);
    tokio::time::sleep(window).await;
    let (_, cpu1) = usage(pid);
    println!("events: {streams} streams, {changes} changes");
    println!(
        "no stream: RSS {} MiB, CPU {:.1} % of a core",
        rss0 / 1024,
        cpu_share(cpu0, cpu1, window)
    );

    // The streams: each notes when it hears a change.
    let heard: Arc<Mutex<Vec<Vec<Instant>>>> = Arc::new(Mutex::new(vec![Vec::new(); streams]));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let mut tasks = Vec::new();
    for i in 0..streams {
        let (client, url, token, heard) = (
            client.clone(),
            format!("{base}/events"),
            token.clone(),
            heard.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut r = client
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .expect("stream");
            assert_eq!(r.status(), 200);
            while let Ok(Some(chunk)) = r.chunk().await {
                let n = String::from_utf8_lossy(&chunk)
                    .matches("event: change")
                    .count();
                let now = Instant::now();
                let mut h = heard.lock().expect("lock");
                h[i].extend(std::iter::repeat_n(now, n));
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rss1, cpu2) = usage(pid);
    tokio::time::sleep(window).await;
    let (_, cpu3) = usage(pid);
    println!(
        "{streams} streams open, idle: RSS {} MiB (+{:.1} KiB a stream), CPU {:.1} % of a core",
        rss1 / 1024,
        (rss1.saturating_sub(rss0)) as f64 / streams as f64,
        cpu_share(cpu2, cpu3, window)
    );

    // Changes: request a slice, then release it; each stream should hear each once.
    let mut latencies = Vec::new();
    let mut missed = 0usize;
    let (_, cpu4) = usage(pid);
    let started = Instant::now();
    let mut id = None;
    for c in 0..changes {
        let before: Vec<usize> = heard.lock().expect("lock").iter().map(Vec::len).collect();
        let (s, v) = match id.take() {
            None => {
                call(
                    &base,
                    &token,
                    post.clone(),
                    "/api/v1/allocations",
                    json!({"team_id": team, "kind": "H100-80GB:1g.10gb"}),
                )
                .await
            }
            Some(a) => {
                call(
                    &base,
                    &token,
                    post.clone(),
                    &format!("/api/v1/allocations/{a}/release"),
                    Value::Null,
                )
                .await
            }
        };
        let acked = Instant::now();
        assert!(s == 200 || s == 201, "change {c}: {s} {v}");
        if s == 201 {
            id = v["id"].as_str().map(str::to_owned);
        }
        let deadline = acked + Duration::from_secs(5);
        loop {
            let done = heard
                .lock()
                .expect("lock")
                .iter()
                .zip(&before)
                .all(|(h, b)| h.len() > *b);
            if done || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for (h, b) in heard.lock().expect("lock").iter().zip(&before) {
            match h.get(*b) {
                Some(t) => latencies.push(t.saturating_duration_since(acked)),
                None => missed += 1,
            }
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let (rss2, cpu5) = usage(pid);
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or_default()
    };
    println!(
        "during changes: RSS {} MiB, CPU {:.1} % of a core",
        rss2 / 1024,
        cpu_share(cpu4, cpu5, started.elapsed())
    );
    println!(
        "update latency after the API answered ({} deliveries, {missed} missed): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        latencies.len(),
        pct(0.5).as_secs_f64() * 1000.0,
        pct(0.99).as_secs_f64() * 1000.0,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1000.0
    );
    for t in tasks {
        t.abort();
    }
    let _ = server.start_kill();
    let _ = server.wait().await;
}
