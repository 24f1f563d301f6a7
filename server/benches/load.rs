//! Load: simulated GPU nodes speaking the agent protocol plus portal users, against one or
//! more `tessera serve` processes (release build) on PostgreSQL or SQLite.
//!
//! `cargo bench -p tessera-server --bench load`, configured by environment:
//! `LOAD_DB` (`sqlite`, default, or `postgres` with `TESSERA_BENCH_PG_URL`), `LOAD_REPLICAS`
//! (1), `LOAD_NODES` (1000), `LOAD_GPUS` (8 simulated H100s per node), `LOAD_USERS` (200),
//! `LOAD_SECONDS` (60), `LOAD_INGEST_SECONDS` (20), `LOAD_INGEST_CLIENTS` (32).
//!
//! 1. **Steady state** for `LOAD_SECONDS`: every node does what `tessera-agent` does at its
//!    defaults (workload sync every 1 s, desired state and telemetry every 10 s, heartbeat
//!    every 30 s, each node at its own phase) and holds its long poll open (`GET
//!    /agent/v1/wait`; on a change it fetches its desired state and syncs at once); every user thinks 0.5–1.5 s between calls:
//!    list the team's allocations, the cluster summary, the node list, request a slice and
//!    release it later. Nodes and users are spread over the replicas round-robin (what a
//!    Service does). Prints requests/s, p50/p99/max per route, errors, and the leader's
//!    scheduler pass duration from its `/metrics`.
//! 2. **Telemetry ingest** for `LOAD_INGEST_SECONDS`: `LOAD_INGEST_CLIENTS` connections
//!    send batches of 6 samples (a minute of an agent's spool) as fast as the server acks
//!    them; samples/s counted from the rows committed to the database (node samples, each
//!    with `LOAD_GPUS` GPU samples).
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::env_usize;

use reqwest::Method;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{call, login, token_for};
use tessera_agent::backend::{GpuBackend, inventory};
use tessera_agent::sim::SimNode;
use tessera_domain::wire::{Heartbeat, TelemetryBatch, TelemetrySample, WorkloadReports};

const PW: &str = "load-bench-password-1";

/// A random number below `n` (a v4 UUID's random bits: no extra dependency).
fn random(n: u64) -> u64 {
    (uuid::Uuid::new_v4().as_u128() % u128::from(n)) as u64
}

/// Latencies per route, in microseconds, and failures.
#[derive(Default)]
struct Stats {
    routes: Mutex<BTreeMap<&'static str, Vec<u32>>>,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl Stats {
    fn record(&self, route: &'static str, took: Duration, status: Result<u16, String>) {
        let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        self.routes
            .lock()
            .expect("lock")
            .entry(route)
            .or_default()
            .push(micros);
        let bad = match status {
            Ok(s) if s < 400 || s == 409 => None,
            Ok(s) => Some(format!("{route}: HTTP {s}")),
            Err(e) => Some(format!("{route}: {e}")),
        };
        if let Some(b) = bad {
            *self.errors.lock().expect("lock").entry(b).or_default() += 1;
        }
    }

    fn report(&self, seconds: f64) {
        let routes = self.routes.lock().expect("lock");
        let total: usize = routes.values().map(Vec::len).sum();
        println!(
            "\n{total} requests in {seconds:.0} s: {:.0} requests/s",
            total as f64 / seconds
        );
        println!("| route | requests/s | p50 | p99 | max |\n|---|---:|---:|---:|---:|");
        for (route, lat) in routes.iter() {
            let mut l = lat.clone();
            l.sort_unstable();
            let ms = |p: f64| {
                let i = ((l.len() as f64 - 1.0) * p).round() as usize;
                f64::from(l[i.min(l.len() - 1)]) / 1000.0
            };
            println!(
                "| {route} | {:.0} | {:.1} ms | {:.1} ms | {:.1} ms |",
                l.len() as f64 / seconds,
                ms(0.5),
                ms(0.99),
                ms(1.0)
            );
        }
        let errors = self.errors.lock().expect("lock");
        if errors.is_empty() {
            println!("errors: none");
        } else {
            println!("errors: {errors:?}");
        }
    }
}

/// Sends `rb` and records how long the whole answer took, as a client sees it.
async fn timed(stats: &Stats, route: &'static str, rb: reqwest::RequestBuilder) {
    timed_json(stats, route, rb).await;
}

async fn timed_json(stats: &Stats, route: &'static str, rb: reqwest::RequestBuilder) -> Value {
    let t0 = Instant::now();
    match rb.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            let v = r.json::<Value>().await.unwrap_or(Value::Null);
            stats.record(route, t0.elapsed(), Ok(status));
            v
        }
        Err(e) => {
            stats.record(route, t0.elapsed(), Err(e.to_string()));
            Value::Null
        }
    }
}

struct Server {
    port: u16,
    child: tokio::process::Child,
}

fn start_server(i: usize, url: &str) -> Server {
    let (port, child) = support::serve(url, PW, &["--replica-name", &format!("load-{i}")]);
    Server { port, child }
}

struct Node {
    credential: String,
    base: String,
    sim: SimNode,
    /// Read once: a real agent reads it on the node, not on the server's clock.
    inventory: tessera_domain::wire::Inventory,
    seq: AtomicU64,
}

impl Node {
    fn samples(&self, n: u64) -> TelemetryBatch {
        let first = self.seq.fetch_add(n, Ordering::SeqCst) + 1;
        let uuids = self.sim.gpu_uuids();
        let samples = (first..first + n)
            .map(|seq| TelemetrySample {
                seq,
                at_unix_ms: chrono::Utc::now().timestamp_millis(),
                gpus: uuids
                    .iter()
                    .filter_map(|u| self.sim.sample(u).ok())
                    .collect(),
            })
            .collect();
        TelemetryBatch {
            samples,
            dropped_total: 0,
        }
    }

    fn heartbeat(&self) -> Heartbeat {
        Heartbeat {
            at_unix_ms: chrono::Utc::now().timestamp_millis(),
            agent_version: "load-bench".into(),
            manages_mig: true,
            workload_sandbox: true,
            inventory: self.inventory.clone(),
        }
    }
}

/// One node at the agent's default cadence until `stop`.
async fn run_node(node: Arc<Node>, c: reqwest::Client, stats: Arc<Stats>, stop: Arc<AtomicBool>) {
    let phase = random(10_000);
    tokio::time::sleep(Duration::from_millis(phase % 1000)).await;
    let mut tick: u64 = phase / 1000;
    let url = |p: &str| format!("{}{p}", node.base);
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        sync_workloads(&node, &c, &stats).await;
        if tick.is_multiple_of(10) {
            fetch_desired(&node, &c, &stats).await;
            timed(
                &stats,
                "POST /agent/v1/telemetry",
                c.post(url("/agent/v1/telemetry"))
                    .bearer_auth(&node.credential)
                    .json(&node.samples(1)),
            )
            .await;
        }
        if tick.is_multiple_of(30) {
            timed(
                &stats,
                "POST /agent/v1/heartbeat",
                c.post(url("/agent/v1/heartbeat"))
                    .bearer_auth(&node.credential)
                    .json(&node.heartbeat()),
            )
            .await;
        }
        tick += 1;
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(t0.elapsed())).await;
    }
}

/// What `tessera-agent` holds open besides its timers: the long poll
/// (`GET /agent/v1/wait`). When it answers "changed", the node fetches its desired state
/// and syncs its workloads at once (timed like the timers' calls); the holds themselves
/// are counted, not timed (each lasts until a change or 25 s).
async fn hold_poll(node: Arc<Node>, c: reqwest::Client, stats: Arc<Stats>) {
    let url = |p: &str| format!("{}{p}", node.base);
    let mut mark: Option<(String, u64)> = None;
    loop {
        let mut rb = c
            .get(url("/agent/v1/wait"))
            .bearer_auth(&node.credential)
            .query(&[("timeout_s", "25")]);
        if let Some((epoch, generation)) = &mark {
            rb = rb.query(&[
                ("epoch", epoch.clone()),
                ("generation", generation.to_string()),
            ]);
        }
        let answer = match rb.send().await {
            Ok(r) if r.status().is_success() => r.json::<Value>().await.unwrap_or(Value::Null),
            Ok(r) => {
                stats.record(
                    "GET /agent/v1/wait (answers)",
                    Duration::ZERO,
                    Ok(r.status().as_u16()),
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => {
                stats.record(
                    "GET /agent/v1/wait (answers)",
                    Duration::ZERO,
                    Err(e.to_string()),
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        stats.record("GET /agent/v1/wait (answers)", Duration::ZERO, Ok(200));
        if let (Some(epoch), Some(generation)) =
            (answer["epoch"].as_str(), answer["generation"].as_u64())
        {
            mark = Some((epoch.to_owned(), generation));
        }
        if answer["changed"] == true {
            fetch_desired(&node, &c, &stats).await;
            sync_workloads(&node, &c, &stats).await;
        }
    }
}

/// One workload sync of a node that runs nothing.
async fn sync_workloads(node: &Node, c: &reqwest::Client, stats: &Stats) {
    let reports = WorkloadReports {
        at_unix_ms: chrono::Utc::now().timestamp_millis(),
        workloads: Vec::new(),
    };
    timed(
        stats,
        "POST /agent/v1/workloads",
        c.post(format!("{}/agent/v1/workloads", node.base))
            .bearer_auth(&node.credential)
            .json(&reports),
    )
    .await;
}

async fn fetch_desired(node: &Node, c: &reqwest::Client, stats: &Stats) {
    timed(
        stats,
        "GET /agent/v1/desired",
        c.get(format!("{}/agent/v1/desired", node.base))
            .bearer_auth(&node.credential),
    )
    .await;
}

/// One portal user with think time until `stop`.
async fn run_user(
    base: String,
    token: String,
    team: String,
    c: reqwest::Client,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
) {
    let mut held: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        let think = 500 + random(1000);
        tokio::time::sleep(Duration::from_millis(think)).await;
        let pick = random(10);
        match pick {
            0..=4 => {
                timed(
                    &stats,
                    "GET /api/v1/allocations",
                    c.get(format!("{base}/api/v1/allocations?team={team}&limit=20"))
                        .bearer_auth(&token),
                )
                .await;
            }
            5 | 6 => {
                timed(
                    &stats,
                    "GET /api/v1/cluster/summary",
                    c.get(format!("{base}/api/v1/cluster/summary"))
                        .bearer_auth(&token),
                )
                .await;
            }
            7 => {
                timed(
                    &stats,
                    "GET /api/v1/nodes",
                    c.get(format!("{base}/api/v1/nodes?limit=20"))
                        .bearer_auth(&token),
                )
                .await;
            }
            _ => {
                if let Some(id) = held.take() {
                    timed(
                        &stats,
                        "POST /api/v1/allocations/{id}/release",
                        c.post(format!("{base}/api/v1/allocations/{id}/release"))
                            .bearer_auth(&token),
                    )
                    .await;
                } else {
                    let v = timed_json(
                        &stats,
                        "POST /api/v1/allocations",
                        c.post(format!("{base}/api/v1/allocations"))
                            .bearer_auth(&token)
                            .json(&json!({"team_id": team, "kind": "H100-80GB:1g.10gb"})),
                    )
                    .await;
                    held = v["id"].as_str().map(str::to_owned);
                }
            }
        }
    }
}

/// `name`'s value in a Prometheus text page.
fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn leader_pass(bases: &[String]) -> (f64, f64) {
    for b in bases {
        let r = reqwest::get(format!("{b}/metrics")).await.expect("metrics");
        let status = r.status();
        let page = r.text().await.expect("text");
        if !status.is_success() {
            eprintln!(
                "{b}/metrics: {status} {}",
                page.chars().take(200).collect::<String>()
            );
        }
        if page
            .lines()
            .any(|l| l.starts_with("tessera_leader{") && l.ends_with(" 1"))
        {
            return (
                metric(&page, "tessera_scheduler_pass_duration_seconds_sum"),
                metric(&page, "tessera_scheduler_pass_duration_seconds_count"),
            );
        }
    }
    eprintln!("no replica reports leading in /metrics");
    (0.0, 0.0)
}

async fn stored_samples(url: &str) -> i64 {
    let store = tessera_core::store::Store::connect(url)
        .await
        .expect("store");
    let n = match &store {
        tessera_core::store::Store::Sqlite(p) => {
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM telemetry_samples")
                .fetch_one(p)
                .await
        }
        tessera_core::store::Store::Postgres(p) => {
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM telemetry_samples")
                .fetch_one(p)
                .await
        }
    }
    .expect("count");
    store.close().await;
    n
}

#[tokio::main]
async fn main() {
    let db = std::env::var("LOAD_DB").unwrap_or_else(|_| "sqlite".into());
    let replicas = env_usize("LOAD_REPLICAS", 1);
    let nodes_n = env_usize("LOAD_NODES", 1000);
    let gpus = env_usize("LOAD_GPUS", 8);
    let users_n = env_usize("LOAD_USERS", 200);
    let seconds = env_usize("LOAD_SECONDS", 60);
    let ingest_seconds = env_usize("LOAD_INGEST_SECONDS", 20);
    let ingest_clients = env_usize("LOAD_INGEST_CLIENTS", 32);
    let dir = tempfile::tempdir().expect("tempdir");
    let url = if db == "postgres" {
        let admin = std::env::var("TESSERA_BENCH_PG_URL").expect("TESSERA_BENCH_PG_URL");
        tessera_core::store::Store::create_postgres_database(&admin)
            .await
            .expect("create database")
    } else {
        assert_eq!(replicas, 1, "SQLite serves one server process");
        format!("sqlite://{}/load.db?mode=rwc", dir.path().display())
    };
    println!(
        "load: {db}, {replicas} replica(s), {nodes_n} nodes × {gpus} GPUs, {users_n} users, \
         {seconds} s steady + {ingest_seconds} s ingest"
    );
    // The first server migrates; the others start once it is up.
    let mut servers = vec![start_server(0, &url)];
    let wait_ready = |port: u16| async move {
        support::wait_ready(&format!("http://127.0.0.1:{port}")).await;
    };
    wait_ready(servers[0].port).await;
    for i in 1..replicas {
        servers.push(start_server(i, &url));
    }
    for s in &servers {
        wait_ready(s.port).await;
    }
    let bases: Vec<String> = servers
        .iter()
        .map(|s| format!("http://127.0.0.1:{}", s.port))
        .collect();
    let base0 = bases[0].clone();

    // Teams of 10 users, each team with room for every member's slice.
    let admin = login(&base0, "admin", PW).await;
    let teams_n = users_n.div_ceil(10);
    let mut teams = Vec::new();
    for t in 0..teams_n {
        let (s, v) = call(
            &base0,
            &admin,
            Method::POST,
            "/api/v1/teams",
            json!({"name": format!("load-{t}")}),
        )
        .await;
        assert_eq!(s, 201, "{v}");
        let id = v["id"].as_str().expect("id").to_owned();
        let (s, v) = call(
            &base0,
            &admin,
            Method::PUT,
            &format!("/api/v1/teams/{id}/quotas/H100-80GB"),
            json!({"guaranteed": 0, "limit": 70, "per_user": 7}),
        )
        .await;
        assert!(s < 300, "{v}");
        teams.push(id);
    }
    let setup = Instant::now();
    let mut users = Vec::new();
    for u in 0..users_n {
        let name = format!("load-user-{u}");
        let team = teams[u / 10].clone();
        support::add_user(&base0, &admin, &team, &name, PW, "member").await;
        users.push((name, team));
    }
    let mut tokens = Vec::new();
    for (name, team) in &users {
        tokens.push((token_for(&base0, name, PW).await, team.clone()));
    }
    let (s, jt) = call(
        &base0,
        &admin,
        Method::POST,
        "/api/v1/join-tokens",
        json!({"note": "load", "max_uses": nodes_n.min(1000)}),
    )
    .await;
    assert_eq!(s, 201, "{jt}");
    let join = jt["secret"].as_str().expect("secret").to_owned();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let mut nodes = Vec::new();
    for i in 0..nodes_n {
        let base = bases[i % bases.len()].clone();
        let (s, v) = call(
            &base,
            "",
            Method::POST,
            "/agent/v1/register",
            json!({"join_token": join, "hostname": format!("load-node-{i}"), "agent_version": "load-bench"}),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        let sim = SimNode::new(&vec!["H100-80GB"; gpus], i as u64 + 1).expect("sim");
        let node = Arc::new(Node {
            credential: v["credential"].as_str().expect("credential").to_owned(),
            base,
            inventory: inventory(&sim).expect("inventory"),
            sim,
            seq: AtomicU64::new(0),
        });
        let r = client
            .post(format!("{}/agent/v1/heartbeat", node.base))
            .bearer_auth(&node.credential)
            .json(&node.heartbeat())
            .send()
            .await
            .expect("heartbeat");
        assert!(r.status().is_success(), "heartbeat: {}", r.status());
        nodes.push(node);
    }
    println!(
        "set up {users_n} users and {nodes_n} nodes in {:.0} s",
        setup.elapsed().as_secs_f64()
    );

    // 1. Steady state.
    let stats = Arc::new(Stats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (sum0, count0) = leader_pass(&bases).await;
    let mut tasks = Vec::new();
    let polls: Vec<_> = nodes
        .iter()
        .map(|n| tokio::spawn(hold_poll(n.clone(), client.clone(), stats.clone())))
        .collect();
    for n in &nodes {
        tasks.push(tokio::spawn(run_node(
            n.clone(),
            client.clone(),
            stats.clone(),
            stop.clone(),
        )));
    }
    for (i, (token, team)) in tokens.iter().enumerate() {
        tasks.push(tokio::spawn(run_user(
            bases[i % bases.len()].clone(),
            token.clone(),
            team.clone(),
            client.clone(),
            stats.clone(),
            stop.clone(),
        )));
    }
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds as u64)).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        let _ = t.await;
    }
    for p in polls {
        p.abort();
    }
    let steady = t0.elapsed().as_secs_f64();
    let (sum1, count1) = leader_pass(&bases).await;
    stats.report(steady);
    if count1 > count0 {
        println!(
            "leader's scheduler pass: {:.0} passes, mean {:.1} ms",
            count1 - count0,
            (sum1 - sum0) / (count1 - count0) * 1000.0
        );
    } else {
        println!("leader's scheduler pass: none finished ({count0} then {count1} passes)");
    }

    // 2. Telemetry ingest as fast as acked.
    let before = stored_samples(&url).await;
    let ingest = Arc::new(Stats::default());
    let next = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..ingest_clients {
        let (nodes, next, stop, ingest, c) = (
            nodes.clone(),
            next.clone(),
            stop.clone(),
            ingest.clone(),
            client.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let node = &nodes[next.fetch_add(1, Ordering::Relaxed) % nodes.len()];
                timed(
                    &ingest,
                    "POST /agent/v1/telemetry (6 samples)",
                    c.post(format!("{}/agent/v1/telemetry", node.base))
                        .bearer_auth(&node.credential)
                        .json(&node.samples(6)),
                )
                .await;
            }
        }));
    }
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(ingest_seconds as u64)).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        let _ = t.await;
    }
    let took = t0.elapsed().as_secs_f64();
    let stored = stored_samples(&url).await - before;
    ingest.report(took);
    println!(
        "telemetry ingest: {stored} node samples stored in {took:.1} s = {:.0} node samples/s \
         = {:.0} GPU samples/s ({gpus} GPUs each)",
        stored as f64 / took,
        stored as f64 * gpus as f64 / took
    );
    for mut s in servers {
        let _ = s.child.start_kill();
        let _ = s.child.wait().await;
    }
}
