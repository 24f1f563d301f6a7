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
use crate::nodes::{heartbeat, register};
use crate::on_both_databases;
use crate::replicas::{leader_and_standby, node_reports_gpu};
use crate::support::{AdminClient, Db, TestApp, call_with_token, postgres_url};
use crate::workloads::{WorkloadAgent, wait_workload};
use chrono::{DateTime, Utc};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tessera_core::store::Beat;

on_both_databases!(
    a_slice_and_its_job_start_with_every_timer_at_an_hour,
    the_long_poll_answers_a_change_for_its_node_only,
    heartbeats_rewrite_the_inventory_only_when_it_changed,
);

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
    let (s, jt) = a.post("/api/v1/join-tokens", json!({"note": "hops"})).await;
    assert_eq!(s, 201, "{jt}");
    jt["secret"].as_str().expect("secret").to_owned()
}

/// Node `host` polling the server at `base`, every agent timer at an hour; returns once it
/// reported its GPU and its start-up rounds are over (from then on only wake-ups move
/// anything).
async fn quiet_node(a: &AdminClient, base: &str, host: &str) -> WorkloadAgent {
    let agent = WorkloadAgent::start_with(base, &join_token(a).await, host, &[], &hour_timers());
    node_reports_gpu(a, host).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    agent
}

async fn a_slice_and_its_job_start_with_every_timer_at_an_hour(db: Db) {
    let app = TestApp::spawn_with(db, |c| c.scheduler_interval = Duration::from_secs(3600)).await;
    let a = AdminClient::with_app(app).await;
    let name = format!("hops-{}", format!("{db:?}").to_lowercase());
    let t = team(&a, &name).await;
    set_quota(&a, &t.id, "H100-80GB", 2, 2, 2).await;
    let host = format!("{name}-node");
    let agent = quiet_node(&a, &a.app.base, &host).await;

    let mut latencies = Vec::new();
    for _ in 0..2 {
        let (s, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
        assert_eq!(s, 201, "{v}");
        let id = v["id"].as_str().expect("id").to_owned();
        let alloc = wait_for_state(&a, &id, "active").await;
        latencies.push((id, request_to_active(&alloc)));
    }

    // Submits `command` as job `name` on slice `i`: the job and its id.
    let submit = async |i: usize, command: &str, name: &str| {
        let body = json!({"allocation_id": latencies[i].0, "command": command, "name": name});
        let (s, job) =
            call_with_token(&a.app, &t.member, Method::POST, "/api/v1/jobs", Some(body)).await;
        assert_eq!(s, 201, "{job}");
        let id = job["id"].as_str().expect("id").to_owned();
        (job, id)
    };
    // A job on the first slice: placed on the node at once, started by the long poll.
    let (job, job_id) = submit(0, "sleep 60", "hop").await;
    let started = wait_workload(&a.app, &t.member, &job_id, "running", 30).await;
    let to_start = (time(&started["started_at"]) - time(&job["created_at"])).num_milliseconds()
        as f64
        / 1000.0;
    // A job that ends at once, on the second slice: its exit reaches the server without
    // the workload timer (the agent checks its live workloads for an exit every 200 ms).
    let (quick, quick_id) = submit(1, "true", "quick").await;
    let ended = wait_workload(&a.app, &t.member, &quick_id, "succeeded", 30).await;
    let to_end =
        (time(&ended["ended_at"]) - time(&quick["created_at"])).num_milliseconds() as f64 / 1000.0;
    eprintln!(
        "event-driven hops ({db:?}): request → active {:.3} s and {:.3} s (the first enables \
         MIG on the simulated H100); job submitted → started on its node {to_start:.3} s; \
         `true` submitted → succeeded {to_end:.3} s",
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
    let (leader, standby, _, _) = leader_and_standby(Duration::from_secs(3600)).await;
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let a = AdminClient::with_app(leader).await;
    let t = team(&a, &format!("relay-{tag}")).await;
    set_quota(&a, &t.id, "H100-80GB", 1, 1, 1).await;
    let host = format!("relay-{tag}");
    // The node talks to B only.
    let agent = quiet_node(&a, &standby.base, &host).await;
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

/// `GET /agent/v1/wait` as a node with `credential`: `(status, body, seconds held)`.
async fn wait(app: &TestApp, credential: &str, query: &str) -> (u16, Value, f64) {
    wait_at(app.base.clone(), credential.to_owned(), query.to_owned()).await
}

/// The same with owned arguments, to hold in a task of its own.
async fn wait_at(base: String, credential: String, query: String) -> (u16, Value, f64) {
    let started = Instant::now();
    let r = reqwest::Client::new()
        .get(format!("{base}/agent/v1/wait?{query}"))
        .bearer_auth(credential)
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let body = r.json().await.unwrap_or(Value::Null);
    (status, body, started.elapsed().as_secs_f64())
}

fn mark_of(v: &Value) -> String {
    format!(
        "epoch={}&generation={}",
        v["epoch"].as_str().expect("epoch"),
        v["generation"]
    )
}

async fn the_long_poll_answers_a_change_for_its_node_only(db: Db) {
    let a = AdminClient::new(db).await;
    let app = &a.app;
    let (_, jt) = crate::nodes::join_token(&a, 2).await;
    let (node, cred) = register(app, &jt, "poll-1").await;
    let (_, other_cred) = register(app, &jt, "poll-2").await;
    assert_eq!(heartbeat(app, &cred, "GPU-p1").await.status(), 204);
    assert_eq!(heartbeat(app, &other_cred, "GPU-p2").await.status(), 204);

    // Without a credential, or with a field the server does not know: refused.
    let r = reqwest::get(app.url("/agent/v1/wait?timeout_s=1"))
        .await
        .expect("request");
    assert_eq!(r.status(), 401);
    let (s, v, _) = wait(app, &cred, "timeout_s=1&since=3").await;
    assert_eq!(s, 422, "{v}");
    let (s, v, _) = wait(app, &cred, "timeout_s=soon").await;
    assert_eq!(s, 422, "{v}");

    // Nothing changed: held for the timeout, then answered without a change.
    let (s, first, held) = wait(app, &cred, "timeout_s=1").await;
    assert_eq!(s, 200, "{first}");
    assert_eq!(first["changed"], false, "{first}");
    assert!(held >= 0.7, "answered after {held} s without a change");

    // A held poll of each node; a layout set for node 1 answers its poll only.
    let mark = mark_of(&first);
    let (_, second, _) = wait(app, &other_cred, "timeout_s=1").await;
    let other_mark = mark_of(&second);
    let poll = tokio::spawn(wait_at(
        app.base.clone(),
        cred.clone(),
        format!("{mark}&timeout_s=20"),
    ));
    let other_poll = tokio::spawn(wait_at(
        app.base.clone(),
        other_cred.clone(),
        format!("{other_mark}&timeout_s=3"),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, v) = a
        .call(
            Method::PUT,
            &format!("/api/v1/nodes/{node}/gpus/GPU-p1/layout"),
            Some(json!({"mode": "enabled", "layout": [{"profile": "1g.10gb", "start": 0}]})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (_, answer, held) = poll.await.expect("poll");
    assert_eq!(answer["changed"], true, "{answer}");
    assert!(held < 10.0, "the change was answered after {held} s");
    assert_eq!(
        answer["generation"].as_u64(),
        first["generation"].as_u64().map(|g| g + 1),
        "{answer} after {first}"
    );
    let (_, other, _) = other_poll.await.expect("poll");
    assert_eq!(
        other["changed"], false,
        "another node's change woke it: {other}"
    );

    // A change made while no poll was held is answered at once by the next one.
    let (s, _) = a
        .call(
            Method::PUT,
            &format!("/api/v1/nodes/{node}/gpus/GPU-p1/layout"),
            Some(json!({"mode": "enabled", "layout": []})),
        )
        .await;
    assert_eq!(s, 200);
    let (_, again, held) = wait(app, &cred, &format!("{}&timeout_s=20", mark_of(&answer))).await;
    assert_eq!(again["changed"], true, "{again}");
    assert!(held < 5.0, "held {held} s though the change came before");
    // A mark from another process (or made up) waits for a change here.
    let foreign = format!("epoch={}&generation=0&timeout_s=1", uuid::Uuid::new_v4());
    let (s, v, held) = wait(app, &cred, &foreign).await;
    assert_eq!((s, v["changed"].as_bool()), (200, Some(false)), "{v}");
    assert!(held >= 0.7, "a foreign mark answered at once");
}

async fn heartbeats_rewrite_the_inventory_only_when_it_changed(db: Db) {
    let a = AdminClient::new(db).await;
    let app = &a.app;
    let (_, jt) = crate::nodes::join_token(&a, 1).await;
    let (node, cred) = register(app, &jt, "beats").await;
    let node = tessera_domain::ids::NodeId::parse(&node).expect("uuid");
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    // (inventory version, inventory, last heartbeat)
    let row = || async {
        let (_, version, inventory) = store
            .node_inventories(&[node])
            .await
            .expect("inventory")
            .pop()
            .expect("the node");
        let beat = store
            .node(node)
            .await
            .expect("node")
            .expect("node")
            .last_heartbeat_at;
        (version, inventory, beat)
    };

    assert_eq!(heartbeat(app, &cred, "GPU-b1").await.status(), 204);
    let first = row().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(heartbeat(app, &cred, "GPU-b1").await.status(), 204);
    let same = row().await;
    assert_eq!(same.0, first.0);
    assert_eq!(same.1, first.1);
    assert!(same.2 > first.2, "the beat itself is recorded");

    // Someone else changed the stored inventory (another replica took a heartbeat of
    // another state): the same inventory as before is written again, not skipped.
    store
        .record_heartbeat(
            &Beat {
                id: node,
                at: Utc::now(),
                agent_version: "test",
                manages_mig: true,
                workload_sandbox: true,
            },
            r#"{"gpus":[]}"#,
        )
        .await
        .expect("write");
    assert_eq!(heartbeat(app, &cred, "GPU-b1").await.status(), 204);
    let restored = row().await;
    assert_eq!(restored.1, first.1);
    assert_eq!(restored.0, first.0 + 2);

    // A new inventory is written and moves the version.
    assert_eq!(heartbeat(app, &cred, "GPU-b2").await.status(), 204);
    let changed = row().await;
    assert!(changed.1.contains("GPU-b2"), "{}", changed.1);
    assert_eq!(changed.0, restored.0 + 1);
}
