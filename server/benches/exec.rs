//! `tessera exec` round trip, end to end on this machine.
//!
//! `cargo bench -p tessera-server --bench exec` (builds the release agent when missing).
//! Starts the server in-process on SQLite with one simulated H100 node (a real
//! `tessera-agent --simulate`: the agent's process executor and, where the machine allows
//! it, its crun sandbox), runs a job (`sleep`) on a 1g.10gb slice of its own, then `RUNS`
//! times (default 50) runs `true` in it the way `tessera exec JOB -- true` does: a new
//! WebSocket to `GET /api/v1/workloads/{id}/exec` with an API token, stdin closed, read
//! until the exit frame and the close. Prints the round trip (connect → exit code) as
//! median, p90 and p99, and the first session's apart (the agent's first `crun exec`).
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/it/agent_bin.rs"]
mod agent_bin;
mod support;
#[path = "../tests/it/ws_connect.rs"]
mod ws_connect;

use agent_bin::agent_bin;
use futures_util::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::json;
use std::time::{Duration, Instant};
use support::{InProcess, call, env_usize, login, token_for};
use tessera_domain::wire::exec_frame;
use tokio_tungstenite::tungstenite::Message;
use ws_connect::connect_with_token;

const PW: &str = "bench-admin-password";

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One `tessera exec JOB -- true`: milliseconds from connecting to the exit frame.
async fn round_trip(addr: &str, token: &str, job: &str) -> f64 {
    let t = Instant::now();
    let url = format!("ws://{addr}/api/v1/workloads/{job}/exec?command=true&tty=false");
    let (mut ws, _) = connect_with_token(addr, &url, token)
        .await
        .expect("exec refused");
    ws.send(Message::Binary(
        exec_frame::encode(exec_frame::Channel::Stdin, b"").into(),
    ))
    .await
    .expect("send");
    let mut code = None;
    while let Some(m) = ws.next().await {
        match m.expect("socket") {
            Message::Binary(b) => {
                if let Some((exec_frame::Channel::Exit, d)) = exec_frame::decode(&b) {
                    let e: exec_frame::Exit = serde_json::from_slice(d).expect("exit");
                    code = Some(e.code);
                    break;
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(code, Some(0), "`true` exits 0");
    let _ = ws.close(None).await;
    ms
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let runs = env_usize("RUNS", 50).max(2);
    let dir = tempfile::tempdir().expect("tempdir");
    let server = InProcess::start(dir.path(), PW, agent_bin()).await;
    let (addr, base) = (server.addr.clone(), server.base());
    let admin = login(&base, "admin", PW).await;
    let (s, team) = call(
        &base,
        &admin,
        Method::POST,
        "/api/v1/teams",
        json!({"name": "bench"}),
    )
    .await;
    assert_eq!(s, 201, "{team}");
    let team_id = team["id"].as_str().expect("team").to_owned();
    let (s, v) = call(
        &base,
        &admin,
        Method::PUT,
        &format!("/api/v1/teams/{team_id}/quotas/H100-80GB"),
        json!({"guaranteed": 7, "limit": 7, "per_user": 7}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = call(
        &base,
        &admin,
        Method::POST,
        "/api/v1/users",
        json!({"username": "bench", "password": PW}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = call(
        &base,
        &admin,
        Method::POST,
        &format!("/api/v1/teams/{team_id}/members"),
        json!({"username": "bench", "role": "member"}),
    )
    .await;
    assert!(s == 200 || s == 201, "{s} {v}");
    let token = token_for(&base, "bench", PW).await;
    let (s, job) = call(
        &base,
        &token,
        Method::POST,
        "/api/v1/jobs",
        json!({"command": "sleep 3600", "name": "exec-bench", "team_id": team_id,
               "gpu": "H100-80GB:1g.10gb"}),
    )
    .await;
    assert_eq!(s, 201, "{job}");
    let id = job["id"].as_str().expect("id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, v) = call(
            &base,
            &token,
            Method::GET,
            &format!("/api/v1/workloads/{id}"),
            serde_json::Value::Null,
        )
        .await;
        if v["state"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "the job never ran: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let first = round_trip(&addr, &token, &id).await;
    let mut all = Vec::with_capacity(runs);
    for _ in 1..runs {
        all.push(round_trip(&addr, &token, &id).await);
    }
    all.sort_by(|a, b| a.total_cmp(b));
    println!(
        "tessera exec round trip (`true`, connect → exit code) over {} sessions: \
         median {:.1} ms, p90 {:.1} ms, p99 {:.1} ms; the first session {:.1} ms",
        all.len(),
        pct(&all, 0.5),
        pct(&all, 0.9),
        pct(&all, 0.99),
        first
    );
    let _ = call(
        &base,
        &token,
        Method::POST,
        &format!("/api/v1/workloads/{id}/stop"),
        serde_json::Value::Null,
    )
    .await;
    server.stop().await;
}
