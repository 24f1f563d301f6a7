//! Allocations: atomic admission against quota under concurrency, approval, release and
//! cancel (quota returned exactly once), surviving a restart between admit and place, and a
//! real simulated agent turning a request into an active MIG slice.

use crate::on_both_databases;
use crate::support::sim_agent;
use crate::support::{AdminClient, Db, TestApp, call_with_token, get_as, mint_token, post_as};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::Duration;
use tessera_core::store::Beat;

pub(crate) const PW: &str = "allocation-password-1";

/// A team with a member and a team admin, each with an API token.
pub(crate) struct Team {
    pub(crate) id: String,
    pub(crate) member: String,
    pub(crate) team_admin: String,
}

/// Creates `user` with password `pw`, adds them to `team` as `role`; their new API token.
pub(crate) async fn add_member(
    a: &AdminClient,
    team: &str,
    user: &str,
    pw: &str,
    role: &str,
) -> String {
    let (s, _) = a
        .post("/api/v1/users", json!({"username": user, "password": pw}))
        .await;
    assert_eq!(s, 201);
    let (s, _) = a
        .call(
            Method::POST,
            &format!("/api/v1/teams/{team}/members"),
            Some(json!({"username": user, "role": role})),
        )
        .await;
    assert_eq!(s, 201);
    let cookie = crate::support::login(&a.app, user, pw).await;
    mint_token(&reqwest::Client::new(), &a.app.base, &cookie, "t").await
}

pub(crate) async fn team(a: &AdminClient, name: &str) -> Team {
    let (s, t) = a.post("/api/v1/teams", json!({"name": name})).await;
    assert_eq!(s, 201, "{t}");
    let id = t["id"].as_str().expect("id").to_owned();
    let member = add_member(a, &id, &format!("{name}-member"), PW, "member").await;
    let team_admin = add_member(a, &id, &format!("{name}-lead"), PW, "team_admin").await;
    Team {
        id,
        member,
        team_admin,
    }
}

pub(crate) async fn set_quota(a: &AdminClient, team: &str, model: &str, g: u32, l: u32, u: u32) {
    let (s, v) = a
        .call(
            Method::PUT,
            &format!("/api/v1/teams/{team}/quotas/{model}"),
            Some(json!({"guaranteed": g, "limit": l, "per_user": u})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
}

/// How many units of `model` the team's quota has in use.
pub(crate) async fn used(a: &AdminClient, team: &str, model: &str) -> u64 {
    let (s, v) = a.get(&format!("/api/v1/teams/{team}/quotas")).await;
    assert_eq!(s, 200, "{v}");
    v.as_array()
        .expect("quotas")
        .iter()
        .find(|q| q["model"] == model)
        .and_then(|q| q["used"].as_u64())
        .expect("quota")
}

pub(crate) async fn request(app: &TestApp, token: &str, team: &str, kind: &str) -> (u16, Value) {
    call_with_token(
        app,
        token,
        Method::POST,
        "/api/v1/allocations",
        Some(json!({"team_id": team, "kind": kind, "purpose": "test"})),
    )
    .await
}

/// A request of `team`'s for `kind` that lasts `minutes`, as `token`.
pub(crate) async fn request_for(
    app: &TestApp,
    token: &str,
    team: &str,
    kind: &str,
    minutes: u32,
) -> (u16, Value) {
    let body = json!({"team_id": team, "kind": kind, "duration_minutes": minutes});
    post_as(app, token, "/api/v1/allocations", body).await
}

/// `n` requests for one `kind` at once: each one's `(status, body)`.
pub(crate) async fn race(
    app: &TestApp,
    token: &str,
    team: &str,
    kind: &str,
    n: usize,
) -> Vec<(u16, Value)> {
    let url = app.url("/api/v1/allocations");
    let calls = (0..n).map(|_| {
        let (url, token) = (url.clone(), token.to_owned());
        let body = json!({"team_id": team, "kind": kind});
        async move {
            let r = reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .expect("request");
            let s = r.status().as_u16();
            (s, r.json::<Value>().await.expect("json"))
        }
    });
    futures_join_all(calls).await
}

async fn concurrent_requests_admit_exactly_the_quota(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "race").await;
    const N: u32 = 5;
    set_quota(&a, &t.id, "H100-80GB", N, N, N).await;
    let results = race(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb", 50).await;
    let mut admitted = 0;
    let mut waiting = 0;
    for (s, v) in &results {
        assert_eq!(*s, 201, "{v}");
        match v["state"].as_str() {
            Some("queued" | "placing" | "active") => admitted += 1,
            Some("pending_approval") => waiting += 1,
            other => panic!("unexpected state {other:?}"),
        }
    }
    assert_eq!(admitted, N, "exactly the quota is admitted");
    assert_eq!(waiting, 50 - N);
    assert_eq!(used(&a, &t.id, "H100-80GB").await, u64::from(N));
    let metrics = a.app.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tessera_allocations{") && l.contains("pending_approval")),
        "{metrics}"
    );
    assert!(metrics.contains("tessera_allocation_queue_oldest_wait_seconds"));
}

/// Runs futures concurrently on the test runtime (no extra dependency).
async fn futures_join_all<
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
>(
    fs: impl Iterator<Item = F>,
) -> Vec<T> {
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

async fn beyond_quota_waits_for_the_right_approver(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "approve").await;
    // Team guarantee 7 (a whole H100), limit 7, per-user cap 1.
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 1).await;
    let (_, first) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(first["state"], "queued");
    // Over the per-user cap but within the team's guarantee: a team admin decides.
    let (_, second) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(second["state"], "pending_approval");
    assert_eq!(second["approver"], "team_admin");
    assert!(
        second["pending"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("approval")),
        "{second}"
    );
    let id = second["id"].as_str().expect("id");
    let approve = format!("/api/v1/allocations/{id}/approve");
    let (s, _) = post_as(&a.app, &t.member, &approve, json!({"reason": "self"})).await;
    assert_eq!(s, 403, "a member cannot approve");
    let (s, v) = call_with_token(
        &a.app,
        &t.team_admin,
        Method::POST,
        &approve,
        Some(json!({"reason": "deadline friday"})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "queued");
    assert_eq!(used(&a, &t.id, "H100-80GB").await, 2);
    // The decision is in the history, with who made it and why.
    let last = v["history"]
        .as_array()
        .and_then(|h| h.last())
        .expect("history");
    assert_eq!(last["to"], "queued");
    assert_eq!(last["note"], "deadline friday");

    // Beyond the team's limit: only a platform admin decides; a denial returns nothing.
    let (_, whole) = request(&a.app, &t.member, &t.id, "H100-80GB:whole").await;
    assert_eq!(whole["state"], "pending_approval");
    assert_eq!(whole["approver"], "platform_admin");
    let wid = whole["id"].as_str().expect("id");
    let (s, _) = call_with_token(
        &a.app,
        &t.team_admin,
        Method::POST,
        &format!("/api/v1/allocations/{wid}/approve"),
        Some(json!({})),
    )
    .await;
    assert_eq!(s, 403);
    let (s, v) = a
        .call(
            Method::POST,
            &format!("/api/v1/allocations/{wid}/deny"),
            Some(json!({"reason": "no capacity this week"})),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(v["state"], "denied");
    assert_eq!(v["approval_reason"], "no capacity this week");
    assert_eq!(used(&a, &t.id, "H100-80GB").await, 2);
    // Both decisions are in the audit trail, with who made them.
    let (s, audit) = a.get("/api/v1/audit?action=allocation.deny").await;
    assert_eq!(s, 200);
    assert_eq!(audit["items"][0]["actor"], "admin");
    assert_eq!(audit["items"][0]["object_id"], wid);
    let (_, audit) = a.get("/api/v1/audit?action=allocation.approve").await;
    assert_eq!(audit["items"][0]["actor"], "approve-lead");
    // A filter that names no action is refused, not answered with an empty page.
    let (s, v) = a.get("/api/v1/audit?action=allocation.approved").await;
    assert_eq!(s, 422, "{v}");
    assert_eq!(v["error"]["field"], "action", "{v}");

    // Another team's admin sees nothing of it.
    let other = team(&a, "other").await;
    let (s, _) = get_as(
        &a.app,
        &other.team_admin,
        &format!("/api/v1/allocations/{id}"),
    )
    .await;
    assert_eq!(s, 404);
}

async fn bad_requests_name_the_field_and_store_nothing(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "bad").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    for (body, field) in [
        (
            json!({"team_id": t.id, "kind": "H100-80GB:9g.99gb"}),
            "kind",
        ),
        (
            json!({"team_id": t.id, "kind": "A100-SXM4-40GB:whole"}),
            "kind",
        ),
        (
            json!({"team_id": t.id, "kind": "H100-80GB:1g.10gb", "count": 0}),
            "count",
        ),
        (
            json!({"team_id": t.id, "kind": "H100-80GB:1g.10gb", "duration_minutes": 999999}),
            "duration_minutes",
        ),
        (
            json!({"team_id": t.id, "kind": "H100-80GB:1g.10gb", "priority": "urgent"}),
            "priority",
        ),
    ] {
        let (s, v) = post_as(&a.app, &t.member, "/api/v1/allocations", body).await;
        assert_eq!(s, 422, "{v}");
        assert_eq!(v["error"]["field"], field, "{v}");
    }
    let (_, list) =
        call_with_token(&a.app, &t.member, Method::GET, "/api/v1/allocations", None).await;
    assert_eq!(list["total"], 0);
    assert_eq!(used(&a, &t.id, "H100-80GB").await, 0);
}

async fn idempotency_key_returns_the_first_allocation(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "idem").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let send = || async {
        let r = reqwest::Client::new()
            .post(a.app.url("/api/v1/allocations"))
            .bearer_auth(&t.member)
            .header("idempotency-key", "k-1")
            .json(&json!({"team_id": t.id, "kind": "H100-80GB:1g.10gb"}))
            .send()
            .await
            .expect("request");
        r.json::<Value>().await.expect("json")
    };
    let first = send().await;
    let again = send().await;
    assert_eq!(first["id"], again["id"]);
    assert_eq!(used(&a, &t.id, "H100-80GB").await, 1);
}

async fn cancel_returns_quota_exactly_once_and_survives_a_restart(db: Db) {
    let mut a = AdminClient::new(db).await;
    let t = team(&a, "crash").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let (_, v) = request(&a.app, &t.member, &t.id, "H100-80GB:2g.20gb").await;
    assert_eq!(v["state"], "queued");
    assert_eq!(used(&a, &t.id, "H100-80GB").await, 2);
    // A crash between admission and placement: the allocation and its units survive.
    a.app.stop().await;
    a.app.start_again().await;
    let id = v["id"].as_str().expect("id");
    let (s, after) = a.get(&format!("/api/v1/allocations/{id}")).await;
    assert_eq!(s, 200);
    assert_eq!(after["state"], "queued");
    assert_eq!(used(&a, &t.id, "H100-80GB").await, 2);
    let release = format!("/api/v1/allocations/{id}/release");
    let (s, v) = call_with_token(&a.app, &t.member, Method::POST, &release, None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "cancelled");
    let (s, _) = call_with_token(&a.app, &t.member, Method::POST, &release, None).await;
    assert_eq!(s, 409, "a second cancel conflicts");
    assert_eq!(used(&a, &t.id, "H100-80GB").await, 0);
}

async fn a_slice_becomes_active_on_a_simulated_h100_and_release_frees_it(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "sim").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let _agent = SimAgent::start(&a, "sim-h100").await;
    // The GPU starts whole (MIG off): the scheduler must re-partition it.
    let (_, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    let id = v["id"].as_str().expect("id").to_owned();
    let active = wait_for_state(&a, &id, "active").await;
    let dev = &active["devices"][0];
    assert_eq!(dev["hostname"], "sim-h100");
    assert_eq!(dev["profile"], "1g.10gb");
    let mig = dev["mig_uuid"].as_str().expect("MIG UUID");
    assert!(mig.starts_with("MIG-"), "{mig}");
    // The MIG UUID is one the agent reports on that GPU.
    let (_, nodes) = a.call(Method::GET, "/api/v1/nodes", None).await;
    let reported = nodes.to_string();
    assert!(reported.contains(mig), "agent reports {mig}");
    assert!(active["ends_at"].is_string());
    // The cluster summary counts it in use (held), and idle: nothing runs on it yet (the
    // summary is cached for a second).
    let mut summary = Value::Null;
    for _ in 0..20 {
        summary = a.call(Method::GET, "/api/v1/cluster/summary", None).await.1;
        if summary["instances_in_use"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        (
            &summary["instances_in_use"],
            &summary["instances_held_idle"]
        ),
        (&json!(1), &json!(1)),
        "{summary}"
    );
    // Extending moves the end time; past the 7-day maximum it is refused, naming the field.
    let extend = format!("/api/v1/allocations/{id}/extend");
    let (s, v) = post_as(&a.app, &t.member, &extend, json!({"minutes": 120})).await;
    assert_eq!(s, 200, "{v}");
    let before = chrono::DateTime::parse_from_rfc3339(active["ends_at"].as_str().expect("end"))
        .expect("time");
    let after =
        chrono::DateTime::parse_from_rfc3339(v["ends_at"].as_str().expect("end")).expect("time");
    assert_eq!((after - before).num_minutes(), 120);
    let (s, v) = post_as(&a.app, &t.member, &extend, json!({"minutes": 7 * 24 * 60})).await;
    assert_eq!(s, 422, "{v}");
    assert_eq!(v["error"]["field"], "minutes");

    let (s, v) = call_with_token(
        &a.app,
        &t.member,
        Method::POST,
        &format!("/api/v1/allocations/{id}/release"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "ended");
    assert_eq!(used(&a, &t.id, "H100-80GB").await, 0);
    // The freed instance shows as free now (after the next scheduler pass).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, free) = a.call(Method::GET, "/api/v1/cluster/free", None).await;
        if free["H100-80GB:1g.10gb"].as_u64().is_some_and(|n| n >= 1) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never free: {free}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The freed instance is reused by the next request without a re-partition.
    let (_, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    let next = wait_for_state(&a, v["id"].as_str().expect("id"), "active").await;
    assert_eq!(next["devices"][0]["gpu_uuid"], dev["gpu_uuid"]);
}

async fn borrowed_capacity_is_preempted_after_a_warning_but_never_a_guarantee(db: Db) {
    let app = TestApp::spawn_with(db, |c| {
        c.preemption_grace = Duration::from_secs(3);
        c.scheduler_interval = Duration::from_millis(500);
    })
    .await;
    let a = AdminClient::with_app(app).await;
    let lender = team(&a, "lender").await;
    let claimant = team(&a, "claimant").await;
    // Both teams are guaranteed the node's one H100 (over-committed guarantees).
    set_quota(&a, &lender.id, "H100-80GB", 7, 7, 7).await;
    set_quota(&a, &claimant.id, "H100-80GB", 7, 7, 7).await;
    let _agent = SimAgent::start(&a, "sim-pre").await;
    let (_, whole) = request(&a.app, &lender.member, &lender.id, "H100-80GB:whole").await;
    let whole_id = whole["id"].as_str().expect("id").to_owned();
    wait_for_state(&a, &whole_id, "active").await;
    let (_, slice) = request(&a.app, &claimant.member, &claimant.id, "H100-80GB:1g.10gb").await;
    let slice_id = slice["id"].as_str().expect("id").to_owned();
    // Within the lender's guarantee: nobody is warned, the claimant waits and is told why.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (_, w) = a.get(&format!("/api/v1/allocations/{whole_id}")).await;
    assert_eq!(w["state"], "active");
    assert!(w["preempt_at"].is_null(), "{w}");
    let (_, q) = a.get(&format!("/api/v1/allocations/{slice_id}")).await;
    assert_eq!(q["state"], "queued");
    assert_eq!(q["pending"]["position"], 1);
    assert!(
        q["pending"]["reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty())
    );
    // The lender's guarantee drops to nothing: its GPU is now borrowed, so it is warned,
    // then preempted, and the claimant's slice becomes active on the re-partitioned GPU.
    set_quota(&a, &lender.id, "H100-80GB", 0, 7, 7).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, w) = a.get(&format!("/api/v1/allocations/{whole_id}")).await;
        if w["preempt_at"].is_string() {
            assert_eq!(w["state"], "active", "warned before it is released");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never warned: {w}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let w = wait_for_state(&a, &whole_id, "preempted").await;
    assert!(w.to_string().contains("reclaimed"), "{w}");
    // The scheduler's decisions are in the audit trail, by the system (no actor).
    for action in ["allocation.place", "allocation.preempt"] {
        let (_, audit) = a.get(&format!("/api/v1/audit?action={action}")).await;
        let items = audit["items"].as_array().expect("items");
        assert!(
            items
                .iter()
                .any(|e| e["object_id"] == whole_id && e["actor"].is_null()),
            "{action}: {audit}"
        );
    }
    let q = wait_for_state(&a, &slice_id, "active").await;
    assert!(
        q["devices"][0]["mig_uuid"]
            .as_str()
            .is_some_and(|m| m.starts_with("MIG-"))
    );
    assert_eq!(used(&a, &lender.id, "H100-80GB").await, 0);
}

async fn expiry_and_a_lost_node_end_allocations_and_return_quota(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "clock").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let agent = SimAgent::start(&a, "sim-clock").await;
    let (_, v) = request_for(&a.app, &t.member, &t.id, "H100-80GB:2g.20gb", 60).await;
    let short = v["id"].as_str().expect("id").to_owned();
    let first = wait_for_state(&a, &short, "active").await;
    // A second slice goes into free space beside the busy one, on the same GPU.
    let (_, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    let long = v["id"].as_str().expect("id").to_owned();
    let second = wait_for_state(&a, &long, "active").await;
    assert_eq!(
        first["devices"][0]["gpu_uuid"],
        second["devices"][0]["gpu_uuid"]
    );
    assert_eq!(used(&a, &t.id, "H100-80GB").await, 3);

    // The scheduler pass with the clock moved 61 minutes on: the 1-hour allocation has
    // expired, and the node's last heartbeat is now an hour old, so the other one fails
    // with the reason (after the 3-minute grace).
    let (services, system) = a.app.side_services().await;
    drop(agent);
    let later = chrono::Utc::now() + chrono::Duration::minutes(61);
    // With a 2-hour node grace (TESSERA_NODE_GRACE) the silent node keeps its allocation;
    // only the expiry happens.
    let patient = services
        .allocations
        .clone()
        .with_node_grace(Duration::from_secs(2 * 3600));
    let r = patient.tick(&system, later).await.expect("tick");
    assert_eq!((r.expired, r.failed), (1, 0), "{r:?}");
    let r = services
        .allocations
        .tick(&system, later)
        .await
        .expect("tick");
    assert_eq!((r.expired, r.failed), (0, 1), "{r:?}");
    let (_, v) = a.get(&format!("/api/v1/allocations/{short}")).await;
    assert_eq!(v["state"], "expired");
    let (_, v) = a.get(&format!("/api/v1/allocations/{long}")).await;
    assert_eq!(v["state"], "failed");
    assert!(v.to_string().contains("stopped reporting"), "{v}");
    assert_eq!(used(&a, &t.id, "H100-80GB").await, 0);
    // Running the same pass again changes nothing and returns nothing twice.
    let r = services
        .allocations
        .tick(&system, later)
        .await
        .expect("tick");
    assert_eq!((r.expired, r.failed), (0, 0));
    assert_eq!(used(&a, &t.id, "H100-80GB").await, 0);
}

async fn a_destroyed_mig_instance_fails_its_allocation(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "gone").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let agent = SimAgent::start(&a, "sim-gone").await;
    let (_, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    let id = v["id"].as_str().expect("id").to_owned();
    let active = wait_for_state(&a, &id, "active").await;
    let dev = &active["devices"][0];
    let mig = dev["mig_uuid"].as_str().expect("mig uuid").to_owned();
    let node =
        tessera_domain::ids::NodeId::parse(dev["node_id"].as_str().expect("node")).expect("uuid");
    // The agent stops; the node's last report shows the GPU without that instance (as
    // after someone destroyed it by hand), still well within the node's grace period.
    drop(agent);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let store = tessera_core::store::Store::connect(&a.app.database_url)
        .await
        .expect("store");
    let row = store.node(node).await.expect("node").expect("node");
    let mut inv: tessera_domain::wire::Inventory =
        serde_json::from_str(&row.inventory).expect("inventory");
    for g in &mut inv.gpus {
        g.instances.retain(|i| {
            !i.compute_instances
                .iter()
                .any(|c| c.uuid.as_deref() == Some(mig.as_str()))
        });
    }
    store
        .record_heartbeat(
            &Beat {
                id: node,
                at: chrono::Utc::now(),
                agent_version: &row.agent_version,
                manages_mig: row.manages_mig,
                workload_sandbox: row.workload_sandbox,
            },
            &serde_json::to_string(&inv).expect("json"),
        )
        .await
        .expect("heartbeat");
    let failed = wait_for_state(&a, &id, "failed").await;
    assert!(failed.to_string().contains("is gone"), "{failed}");
    assert_eq!(
        used(&a, &t.id, "H100-80GB").await,
        0,
        "its quota is returned"
    );
}

/// A real `tessera-agent --simulate` with one H100, joined with a fresh join token and
/// managing MIG; killed when dropped.
pub(crate) struct SimAgent {
    _child: tokio::process::Child,
    _state: tempfile::TempDir,
}

impl SimAgent {
    pub(crate) async fn start(a: &AdminClient, hostname: &str) -> SimAgent {
        let (s, jt) = a.post("/api/v1/join-tokens", json!({"note": "sim"})).await;
        assert_eq!(s, 201);
        let state = tempfile::tempdir().expect("tempdir");
        let child = sim_agent(&a.app.base, "H100-80GB", hostname, state.path())
            .arg("--join-token")
            .arg(jt["secret"].as_str().expect("secret"))
            .arg("--manage-mig")
            .spawn()
            .expect("start tessera-agent");
        SimAgent {
            _child: child,
            _state: state,
        }
    }
}

pub(crate) async fn wait_for_state(a: &AdminClient, id: &str, state: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, v) = a.get(&format!("/api/v1/allocations/{id}")).await;
        if v["state"] == state {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "allocation never became {state}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A node that reports its GPU but never creates the instance (no `--manage-mig`, or a
/// driver that keeps failing) fails the allocation after the placing timeout, with the
/// reason, and the quota comes back.
async fn an_allocation_its_node_never_sets_up_fails_after_the_placing_timeout(db: Db) {
    let app = TestApp::spawn_with(db, |c| {
        c.placing_timeout = Duration::from_secs(2);
        c.scheduler_interval = Duration::from_millis(300);
    })
    .await;
    let a = AdminClient::with_app(app).await;
    let t = team(&a, "stuck").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let (s, jt) = a
        .post("/api/v1/join-tokens", json!({"note": "stuck"}))
        .await;
    assert_eq!(s, 201);
    let (_, credential) =
        crate::nodes::register(&a.app, jt["secret"].as_str().expect("secret"), "stuck-node").await;
    crate::nodes::heartbeat(&a.app, &credential, "GPU-stuck-0").await;
    let (s, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    wait_for_state(&a, &id, "placing").await;
    assert_eq!(used(&a, &t.id, "H100-80GB").await, 1);
    let failed = wait_for_state(&a, &id, "failed").await;
    let text = failed.to_string();
    assert!(text.contains("did not set up the device"), "{failed}");
    assert!(text.contains("stuck-node"), "{failed}");
    assert_eq!(used(&a, &t.id, "H100-80GB").await, 0);
}

on_both_databases!(
    an_allocation_its_node_never_sets_up_fails_after_the_placing_timeout,
    a_destroyed_mig_instance_fails_its_allocation,
    concurrent_requests_admit_exactly_the_quota,
    beyond_quota_waits_for_the_right_approver,
    bad_requests_name_the_field_and_store_nothing,
    idempotency_key_returns_the_first_allocation,
    cancel_returns_quota_exactly_once_and_survives_a_restart,
    a_slice_becomes_active_on_a_simulated_h100_and_release_frees_it,
    borrowed_capacity_is_preempted_after_a_warning_but_never_a_guarantee,
    expiry_and_a_lost_node_end_allocations_and_return_quota,
);
