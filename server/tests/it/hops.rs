//! Event-driven hops (issue 41): with the server's scheduler interval and every timer of
//! the agent at an hour, a slice still becomes active and a job on it still starts within
//! seconds, because each hop wakes the next: a request wakes the scheduler; a new desired
//! layout answers the node's long poll (`GET /agent/v1/wait`); the layout applied, the
//! agent's heartbeat wakes the scheduler, which activates; a job placed on the node
//! answers its long poll again. On PostgreSQL the same holds when the node polls a
//! replica that does not lead (the leader's changes reach it by `NOTIFY`). The tests print
//! the latencies (docs/benchmarks.md §19); they assert behaviour only: without the wake-ups
//! nothing would happen for an hour.

use crate::allocations::{request, set_quota, team, wait_for_state};
use crate::on_both_databases;
use crate::replicas::{leads, node_reports_gpu, one_leader};
use crate::support::{AdminClient, Db, TestApp, call_with_token, postgres_url};
use crate::workloads::{WorkloadAgent, get};
use chrono::{DateTime, Utc};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tessera_server::config::ServeConfig;

on_both_databases!(a_slice_and_its_job_start_with_every_timer_at_an_hour);

/// Agent timers that never fire during a test (each round happens once at start).
fn hour_timers() -> Vec<String> {
    [
        "--heartbeat-interval-s",
        "3600",
        "--reconcile-interval-s",
        "3600",
        "--workload-interval-ms",
        "3600000",
        "--telemetry-interval-s",
        "3600",
    ]
    .map(str::to_owned)
    .to_vec()
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| panic!("not a time: {v}"))
}

/// Seconds from the allocation's request to its activation, from its history.
fn request_to_active(alloc: &Value) -> f64 {
    let history = alloc["history"].as_array().expect("history");
    let at = |state: &str| {
        history
            .iter()
            .find(|t| t["to"] == state)
            .map(|t| time(&t["at"]))
            .unwrap_or_else(|| panic!("never {state}: {alloc}"))
    };
    (at("active") - at("queued")).num_milliseconds() as f64 / 1000.0
}

async fn join_token(a: &AdminClient) -> String {
    let (s, jt) = a
        .call(
            Method::POST,
            "/api/v1/join-tokens",
            Some(json!({"note": "hops"})),
        )
        .await;
    assert_eq!(s, 201, "{jt}");
    jt["secret"].as_str().expect("secret").to_owned()
}

async fn a_slice_and_its_job_start_with_every_timer_at_an_hour(db: Db) {
    let app = TestApp::spawn_with(db, |c| c.scheduler_interval = Duration::from_secs(3600)).await;
    let a = AdminClient::with_app(app).await;
    let name = format!("hops-{}", format!("{db:?}").to_lowercase());
    let t = team(&a, &name).await;
    set_quota(&a, &t.id, "H100-80GB", 2, 2, 2).await;
    let host = format!("{name}-node");
    let agent = WorkloadAgent::start_with(
        &a.app.base,
        &join_token(&a).await,
        &host,
        &[],
        &hour_timers(),
    );
    node_reports_gpu(&a, &host).await;
    // The agent's start-up rounds are over; from here only wake-ups move anything.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut latencies = Vec::new();
    for _ in 0..2 {
        let (s, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
        assert_eq!(s, 201, "{v}");
        let id = v["id"].as_str().expect("id").to_owned();
        let alloc = wait_for_state(&a, &id, "active").await;
        latencies.push((id, request_to_active(&alloc)));
    }

    // A job on the first slice: placed on the node at once, started by the long poll.
    let (s, job) = call_with_token(
        &a.app,
        &t.member,
        Method::POST,
        "/api/v1/jobs",
        Some(json!({"allocation_id": latencies[0].0, "command": "sleep 60", "name": "hop"})),
    )
    .await;
    assert_eq!(s, 201, "{job}");
    let job_id = job["id"].as_str().expect("id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let started = loop {
        let v = get(&a.app, &t.member, &job_id).await;
        if matches!(v["state"].as_str(), Some("starting" | "running")) {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "the node never took the job without its timers: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let to_start = (time(&started["started_at"]) - time(&job["created_at"])).num_milliseconds()
        as f64
        / 1000.0;
    eprintln!(
        "event-driven hops ({db:?}): request → active {:.3} s and {:.3} s (the first enables \
         MIG on the simulated H100); job submitted → started on its node {to_start:.3} s",
        latencies[0].1, latencies[1].1
    );
    agent.stop().await;
}

/// PostgreSQL: the node polls the replica that does not lead; the leader's placement
/// reaches it through `NOTIFY tessera_node`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_polling_a_standby_replica_is_woken_by_the_leaders_changes() {
    if postgres_url().is_none() {
        return;
    }
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let (ra, rb) = (format!("a-{tag}"), format!("b-{tag}"));
    let slow = |name: String| {
        move |c: &mut ServeConfig| {
            c.replica_name = Some(name);
            c.scheduler_interval = Duration::from_secs(3600);
        }
    };
    let leader = TestApp::spawn_with(Db::Postgres, slow(ra.clone())).await;
    let (first, _) = one_leader(&leader, &[&ra, &rb], Duration::from_secs(10)).await;
    assert_eq!(first, ra, "the first replica leads");
    let standby = TestApp::replica_of(&leader, slow(rb.clone())).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(leads(&leader, &rb).await, Some(false), "B stands by");

    let a = AdminClient::with_app(leader).await;
    let t = team(&a, &format!("relay-{tag}")).await;
    set_quota(&a, &t.id, "H100-80GB", 1, 1, 1).await;
    let host = format!("relay-{tag}");
    // The node talks to B only.
    let agent = WorkloadAgent::start_with(
        &standby.base,
        &join_token(&a).await,
        &host,
        &[],
        &hour_timers(),
    );
    node_reports_gpu(&a, &host).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (s, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let alloc = wait_for_state(&a, v["id"].as_str().expect("id"), "active").await;
    eprintln!(
        "event-driven hops across replicas: request → active {:.3} s",
        request_to_active(&alloc)
    );
    agent.stop().await;
    drop(standby);
}
