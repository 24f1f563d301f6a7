//! A rolling restart under load (PostgreSQL): three `tessera serve` processes behind a
//! round-robin proxy are stopped (SIGTERM: readiness off, lease given up, drain, in-flight
//! requests finish) and started again one after another, while 50 clients request, list
//! and release allocations and a notebook's kernel is used over its proxied WebSocket.
//! A client that retries what a load balancer in front of a restarting server can give it
//! (a refused or cut connection, 502, 503) sees no request fail, and the kernel socket
//! reconnects to the same, still running kernel.

use crate::replicas::{Replica, free_port, round_robin, start_replica, stopped_setup};
use crate::support::{client_with_timeout, postgres_url};
use crate::workloads::{KernelSocket, WorkloadAgent, execute_on};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLIENTS: usize = 50;
/// How long a client keeps retrying one request before it counts as failed.
const GIVE_UP: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Tally {
    /// Requests that ended well (after retries where needed).
    ok: AtomicU64,
    /// Attempts that a retrying client absorbed (connection errors, 502, 503).
    retried: AtomicU64,
    /// What a retrying client would have seen fail.
    failed: Mutex<Vec<String>>,
}

/// Sends `make()` until an answer that `done` accepts (`Some(body)`), retrying transport
/// errors, 502 and 503; any other answer, or retrying for longer than [`GIVE_UP`], is a
/// failure. `done` learns whether an earlier attempt may have reached the server.
async fn retrying(
    tally: &Tally,
    what: &str,
    make: impl Fn() -> reqwest::RequestBuilder,
    done: impl Fn(u16, bool) -> bool,
) -> Option<Value> {
    let start = Instant::now();
    let mut retried = false;
    loop {
        match make().send().await {
            Ok(r) if done(r.status().as_u16(), retried) => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
                return Some(r.json().await.unwrap_or(Value::Null));
            }
            Ok(r) if !matches!(r.status().as_u16(), 502 | 503) => {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                tally
                    .failed
                    .lock()
                    .expect("lock")
                    .push(format!("{what}: {status} {body}"));
                return None;
            }
            _ => {}
        }
        retried = true;
        tally.retried.fetch_add(1, Ordering::Relaxed);
        if start.elapsed() > GIVE_UP {
            tally
                .failed
                .lock()
                .expect("lock")
                .push(format!("{what}: still failing after {GIVE_UP:?}"));
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One client: request a slice (with an Idempotency-Key), list, release the one before.
async fn client(
    n: usize,
    base: String,
    token: String,
    team: String,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) {
    let c = client_with_timeout();
    let mut previous: Option<String> = None;
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let key = format!("roll-{n}-{i}");
        let created = retrying(
            &tally,
            "request",
            || {
                c.post(format!("{base}/api/v1/allocations"))
                    .bearer_auth(&token)
                    .header("idempotency-key", &key)
                    .json(&json!({"team_id": team, "kind": "H100-80GB:1g.10gb"}))
            },
            |s, _| s == 201 || s == 200,
        )
        .await;
        let id = created.and_then(|v| v["id"].as_str().map(str::to_owned));
        retrying(
            &tally,
            "list",
            || {
                c.get(format!("{base}/api/v1/allocations?team={team}&limit=20"))
                    .bearer_auth(&token)
            },
            |s, _| s == 200,
        )
        .await;
        if let Some(p) = std::mem::replace(&mut previous, id) {
            // A 409 means "already released": right only when an earlier attempt may
            // have done it.
            retrying(
                &tally,
                "release",
                || {
                    c.post(format!("{base}/api/v1/allocations/{p}/release"))
                        .bearer_auth(&token)
                },
                |s, retried| s == 200 || (retried && s == 409),
            )
            .await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A kernel WebSocket through the proxy at `addr`, or why not.
async fn kernel_socket(addr: u16, path: &str, token: &str) -> Result<KernelSocket, String> {
    let url = format!("ws://127.0.0.1:{addr}{path}");
    let mut req =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url)
            .map_err(|e| e.to_string())?;
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().map_err(|_| "header")?,
    );
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", addr))
        .await
        .map_err(|e| e.to_string())?;
    let (ws, _) = tokio_tungstenite::client_async(req, tcp)
        .await
        .map_err(|e| e.to_string())?;
    Ok(ws)
}

/// [`kernel_socket`], retried for up to [`GIVE_UP`]: a handshake that meets a replica as it
/// drains can fail (hyper then answers `Connection: upgrade, close`, which tungstenite
/// refuses), and a browser's notebook reconnects the same way.
async fn kernel_socket_retrying(addr: u16, path: &str, token: &str) -> KernelSocket {
    let t0 = Instant::now();
    loop {
        match kernel_socket(addr, path, token).await {
            Ok(ws) => return ws,
            Err(e) => {
                assert!(t0.elapsed() < GIVE_UP, "no kernel socket: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Polls `path` (with `token`) through the proxy until `ready(body)`.
async fn wait_until(
    base: &str,
    token: &str,
    path: &str,
    secs: u64,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Ok(r) = reqwest::Client::new()
            .get(format!("{base}{path}"))
            .bearer_auth(token)
            .send()
            .await
            && let Ok(v) = r.json::<Value>().await
            && ready(&v)
        {
            return v;
        }
        assert!(Instant::now() < deadline, "{path} never got ready");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn ready(port: u16) -> bool {
    reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
        .await
        .is_ok_and(|r| r.status() == 200)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_restart_under_load_fails_no_request_and_the_notebook_reconnects() {
    if postgres_url().is_none() {
        return;
    }
    let name = format!("roll{}", &uuid::Uuid::new_v4().simple().to_string()[..6]);
    let (_admin, t, join, url) = stopped_setup(&name, 400).await;

    let mut replicas: Vec<Replica> = (0..3)
        .map(|i| start_replica(&format!("{name}-{i}"), free_port(), &url))
        .collect();
    let front = round_robin(replicas.iter().map(|r| r.port).collect()).await;
    let base = format!("http://127.0.0.1:{front}");
    for r in &replicas {
        let t0 = Instant::now();
        while !ready(r.port).await {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{} never ready",
                r.name
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // The notebook: an active slice, JupyterLab on it, a kernel.
    let agent = WorkloadAgent::start_at(&base, &join, &format!("{name}-node"));
    let token = t.member.clone();
    let (s, a) = crate::support::json_call(
        reqwest::Client::new()
            .post(format!("{base}/api/v1/allocations"))
            .bearer_auth(&token),
        Some(json!({"team_id": t.id, "kind": "H100-80GB:1g.10gb"})),
    )
    .await;
    assert_eq!(s, 201, "{a}");
    let alloc = a["id"].as_str().expect("id").to_owned();
    wait_until(
        &base,
        &token,
        &format!("/api/v1/allocations/{alloc}"),
        60,
        |v| v["state"] == "active",
    )
    .await;
    let (s, nb) = crate::support::json_call(
        reqwest::Client::new()
            .post(format!("{base}/api/v1/notebooks"))
            .bearer_auth(&token),
        Some(json!({"allocation_id": alloc, "name": "rolling"})),
    )
    .await;
    assert_eq!(s, 201, "{nb}");
    let nb_id = nb["id"].as_str().expect("id").to_owned();
    wait_until(
        &base,
        &token,
        &format!("/api/v1/workloads/{nb_id}"),
        120,
        |v| v["state"] == "running",
    )
    .await;
    let nb_base = format!("/user/{name}-member/rolling/");
    let r = reqwest::Client::new()
        .post(format!("{base}{nb_base}api/kernels"))
        .bearer_auth(&token)
        .json(&json!({"name": "python3"}))
        .send()
        .await
        .expect("kernel");
    assert_eq!(r.status(), 201);
    let kernel: Value = r.json().await.expect("json");
    let channels = format!(
        "{nb_base}api/kernels/{}/channels",
        kernel["id"].as_str().expect("kernel id")
    );

    // The notebook user: counts in the kernel every 300 ms; reconnects when cut.
    let stop = Arc::new(AtomicBool::new(false));
    let notebook = {
        let (stop, token, channels) = (stop.clone(), token.clone(), channels.clone());
        tokio::spawn(async move {
            let mut ws = kernel_socket_retrying(front, &channels, &token).await;
            let first = execute_on(&mut ws, "n = 0; n", Duration::from_secs(30)).await;
            assert_eq!(first.as_deref(), Ok("0"), "the kernel answers");
            let (mut reconnects, mut last) = (0u32, 0i64);
            while !stop.load(Ordering::SeqCst) {
                match execute_on(&mut ws, "n += 1; n", Duration::from_secs(10)).await {
                    Ok(v) => {
                        let v: i64 = v.parse().expect("a number");
                        assert!(v > last, "the same kernel keeps counting ({last} then {v})");
                        last = v;
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    Err(_) => {
                        ws = kernel_socket_retrying(front, &channels, &token).await;
                        reconnects += 1;
                    }
                }
            }
            (reconnects, last)
        })
    };

    let tally = Arc::new(Tally::default());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| {
            tokio::spawn(client(
                n,
                base.clone(),
                token.clone(),
                t.id.clone(),
                stop.clone(),
                tally.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Restart each replica in turn: SIGTERM, wait for it to exit, start it again, ready.
    let mut downtime = Vec::new();
    for r in replicas.iter_mut() {
        let pid = r.child.id().expect("pid");
        let t0 = Instant::now();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let exited = tokio::time::timeout(Duration::from_secs(30), r.child.wait()).await;
        assert!(
            exited.is_ok(),
            "{} did not stop within 30 s of SIGTERM",
            r.name
        );
        let stopped = t0.elapsed();
        *r = start_replica(&r.name.clone(), r.port, &url);
        while !ready(r.port).await {
            assert!(
                t0.elapsed() < Duration::from_secs(90),
                "{} never ready again",
                r.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        downtime.push((stopped, t0.elapsed()));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.expect("client");
    }
    let (reconnects, counted) = notebook.await.expect("notebook");
    let failed = tally.failed.lock().expect("lock").clone();
    eprintln!(
        "rolling restart: {} requests ok, {} retried attempts, {} failed; notebook: {} \
         reconnects, counted to {}; per replica (stopped after, ready again after): {:?}",
        tally.ok.load(Ordering::Relaxed),
        tally.retried.load(Ordering::Relaxed),
        failed.len(),
        reconnects,
        counted,
        downtime
    );
    assert!(failed.is_empty(), "requests failed: {failed:?}");
    assert!(
        tally.ok.load(Ordering::Relaxed) >= 300,
        "the clients got through"
    );
    assert!(
        reconnects >= 1,
        "the notebook's socket went through a restarted replica and came back"
    );
    assert!(counted > 10, "the kernel kept answering");
    agent.stop().await;
    for mut r in replicas {
        let _ = r.child.start_kill();
        let _ = r.child.wait().await;
    }
}
