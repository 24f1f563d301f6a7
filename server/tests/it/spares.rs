//! Hot spares (docs/operations.md, "Hot spares"): a platform admin keeps a GPU of a model
//! idle; ordinary work is not placed on it and capacity shown to teams leaves it out; when
//! the GPU under a high-priority allocation throws a critical Xid or an uncorrectable ECC
//! error (injected through the simulator's fault file), the allocation is moved onto the
//! spare at once and its job follows, while normal-priority work there is only warned.
//! Real `tessera-agent --simulate` nodes.

use crate::allocations::{request, set_quota, team, used, wait_for_state};
use crate::drain::node_id;
use crate::on_both_databases;
use crate::support::{AdminClient, Db, TestApp, call_with_token, get_as};
use crate::workloads::{WorkloadAgent, wait_workload};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

on_both_databases!(
    a_critical_xid_moves_high_priority_work_onto_the_hot_spare,
    an_uncorrectable_ecc_error_moves_high_priority_work_onto_the_hot_spare,
    only_platform_admins_change_spares_and_bad_rules_name_the_field,
);

async fn a_critical_xid_moves_high_priority_work_onto_the_hot_spare(db: Db) {
    fault_moves_work_to_the_spare(db, "xid", r#"{"xid_count": 1, "last_xid": 79}"#, "Xid 79").await;
}

async fn an_uncorrectable_ecc_error_moves_high_priority_work_onto_the_hot_spare(db: Db) {
    fault_moves_work_to_the_spare(db, "ecc", r#"{"ecc_uncorrected": 1}"#, "uncorrectable ECC")
        .await;
}

/// A simulated node whose GPU UUIDs come from `seed` (each node its own, as real GPUs).
async fn node_seeded(a: &AdminClient, hostname: &str, seed: u32) -> WorkloadAgent {
    let (s, jt) = a
        .post("/api/v1/join-tokens", json!({"note": "spares"}))
        .await;
    assert_eq!(s, 201);
    WorkloadAgent::start_with(
        &a.app.base,
        jt["secret"].as_str().expect("secret"),
        hostname,
        &[],
        &["--sim-seed".to_owned(), seed.to_string()],
    )
}

/// Units the team's live allocations hold (queued, placing, active, releasing).
async fn live_units(a: &AdminClient, team: &str) -> u64 {
    let (s, v) = a
        .get(&format!("/api/v1/allocations?team={team}&limit=200"))
        .await;
    assert_eq!(s, 200, "{v}");
    v["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|x| {
            ["queued", "placing", "active", "releasing"]
                .iter()
                .any(|s| x["state"] == *s)
        })
        .filter_map(|x| x["units"].as_u64())
        .sum()
}

async fn gpu_of(a: &AdminClient, node: &str) -> String {
    let (_, n) = a.get(&format!("/api/v1/nodes/{node}")).await;
    n["gpus"][0]["uuid"].as_str().expect("gpu").to_owned()
}

/// Polls `GET /api/v1/spares` until the model's spares are `want`.
async fn wait_spares(a: &AdminClient, want: &[&str]) -> Value {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let (s, v) = a.call(Method::GET, "/api/v1/spares", None).await;
        assert_eq!(s, 200, "{v}");
        let row = v
            .as_array()
            .and_then(|r| r.iter().find(|x| x["model"] == "H100-80GB"))
            .cloned()
            .unwrap_or(Value::Null);
        if row["spare_gpus"] == json!(want) {
            return row;
        }
        assert!(Instant::now() < until, "spares never became {want:?}: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn fault_moves_work_to_the_spare(db: Db, tag: &str, fault: &str, words: &str) {
    let name = format!("spare-{tag}-{}", format!("{db:?}").to_lowercase());
    let pass = Duration::from_millis(500);
    let app = TestApp::spawn_with(db, |c| {
        c.scheduler_interval = pass;
    })
    .await;
    let a = AdminClient::with_app(app).await;
    let app = &a.app;
    let t = team(&a, &name).await;
    set_quota(&a, &t.id, "H100-80GB", 14, 14, 14).await;
    let (s, v) = a
        .put(
            &format!("/api/v1/teams/{}/priority", t.id),
            json!({"high": true}),
        )
        .await;
    assert_eq!(s, 200, "{v}");

    // Node A runs a high-priority job (a 1g.10gb slice) and a normal-priority slice.
    let node_a = node_seeded(&a, &format!("{name}-a"), 11).await;
    let a_id = node_id(&a, &format!("{name}-a")).await;
    let script = r#"echo "attempt $TESSERA_ATTEMPT"
if [ "$TESSERA_ATTEMPT" = 2 ]; then echo "on the spare"; sleep 4; exit 0; fi
while true; do sleep 0.2; done"#;
    let (s, v) = call_with_token(
        app,
        &t.member,
        Method::POST,
        "/api/v1/jobs",
        Some(
            json!({"command": script, "gpu": "H100-80GB:1g.10gb", "priority": "high",
                    "name": "urgent"}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let job = v["id"].as_str().expect("id").to_owned();
    let first = v["allocation_id"].as_str().expect("alloc").to_owned();
    let running = wait_workload(app, &t.member, &job, "running", 90).await;
    assert_eq!(running["hostname"], format!("{name}-a"), "{running}");
    let (s, v) = request(app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let normal = v["id"].as_str().expect("id").to_owned();
    wait_for_state(&a, &normal, "active").await;

    // Node B joins; its GPU is kept as the one spare H100.
    let node_b = node_seeded(&a, &format!("{name}-b"), 12).await;
    let b_id = node_id(&a, &format!("{name}-b")).await;
    let spare = gpu_of(&a, &b_id).await;
    let (s, v) = a.put("/api/v1/spares/H100-80GB", json!({"gpus": 1})).await;
    assert_eq!(s, 200, "{v}");
    let row = wait_spares(&a, &[&spare]).await;
    assert_eq!(
        (row["gpus"].as_u64(), row["wanted"].as_u64()),
        (Some(1), Some(1)),
        "{row}"
    );

    let metrics = app.metrics().await;
    assert!(
        metrics.contains("tessera_spare_gpus{model=\"H100-80GB\"} 1"),
        "{metrics}"
    );

    // Ordinary work is not placed on it: a whole GPU, which only B could give, waits and
    // says why; teams are not shown B as free.
    let (s, v) = request(app, &t.member, &t.id, "H100-80GB:whole").await;
    assert_eq!(s, 201, "{v}");
    let whole = v["id"].as_str().expect("id").to_owned();
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, w) = a.get(&format!("/api/v1/allocations/{whole}")).await;
        assert_eq!(w["state"], "queued", "{w}");
        if w["pending"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("1 GPU kept as a hot spare"))
        {
            break;
        }
        assert!(Instant::now() < until, "no spare in the reason: {w}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (s, free) =
        call_with_token(app, &t.member, Method::GET, "/api/v1/cluster/free", None).await;
    assert_eq!(s, 200, "{free}");
    assert!(
        free["H100-80GB:whole"].as_u64().unwrap_or(0) == 0,
        "the spare is shown as free: {free}"
    );

    // The fault: A's GPU is out within one agent report, and the high-priority allocation
    // is replaced by one that becomes active on the spare.
    let gpu_a = gpu_of(&a, &a_id).await;
    let faults = node_a.state_dir().join("sim-driver").join(&gpu_a);
    std::fs::create_dir_all(&faults).expect("faults dir");
    let injected = Instant::now();
    let injected_at = chrono::Utc::now();
    std::fs::write(faults.join("faults.json"), fault).expect("inject");
    let until = Instant::now() + Duration::from_secs(30);
    let replacement = loop {
        let (_, w) = get_as(app, &t.member, &format!("/api/v1/workloads/{job}")).await;
        if let Some(id) = w["allocation_id"].as_str()
            && id != first
        {
            break id.to_owned();
        }
        assert!(Instant::now() < until, "the job never moved: {w}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let until = Instant::now() + Duration::from_secs(30);
    let moved = loop {
        let (_, r) = a.get(&format!("/api/v1/allocations/{replacement}")).await;
        if r["state"] == "active" {
            break r;
        }
        assert!(Instant::now() < until, "replacement never active: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let elapsed = injected.elapsed();
    assert_eq!(moved["priority"], "high", "{moved}");
    assert_eq!(moved["kind"], "H100-80GB:1g.10gb", "{moved}");
    assert!(
        moved["devices"]
            .as_array()
            .is_some_and(|d| d.len() == 1 && d[0]["gpu_uuid"] == spare.as_str()),
        "{moved}"
    );
    let (_, n) = a.get(&format!("/api/v1/nodes/{a_id}")).await;
    let unhealthy = &n["gpus"][0]["unhealthy"];
    assert!(
        unhealthy["reason"]
            .as_str()
            .is_some_and(|r| r.contains(words)),
        "{n}"
    );
    let old = wait_for_state(&a, &first, "preempted").await;
    assert!(
        old["history"].to_string().contains("moved to a hot spare"),
        "{old}"
    );

    // The figure: fault → GPU unhealthy (agent report) → replaced (scheduler pass) → active
    // on the spare (its node created the instance).
    let at = |v: &Value| -> chrono::DateTime<chrono::Utc> {
        serde_json::from_value(v.clone()).expect("time")
    };
    let since = at(&unhealthy["since"]);
    let replaced = at(&moved["created_at"]);
    let activated = moved["history"]
        .as_array()
        .and_then(|h| h.iter().find(|e| e["to"] == "active"))
        .map(|e| at(&e["at"]))
        .expect("activated");
    let ms = |d: chrono::Duration| d.num_milliseconds();
    eprintln!(
        "FIGURE spare {tag} {db:?}: fault→active on the spare {} ms (fault→unhealthy {} ms, \
         unhealthy→replaced {} ms, replaced→active {} ms; scheduler pass {} ms)",
        elapsed.as_millis(),
        ms(since - injected_at),
        ms(replaced - since),
        ms(activated - replaced),
        pass.as_millis()
    );
    // Goal: at most two scheduler passes after the GPU is out, plus the node's setup.
    assert!(
        ms(replaced - since) <= 2 * pass.as_millis() as i64 + 250,
        "replaced {} ms after the GPU turned unhealthy",
        ms(replaced - since)
    );

    // The pool is short now (A is out, B is busy) and says so.
    let row = wait_spares(&a, &[]).await;
    assert_eq!(row["wanted"], 1, "{row}");

    // Normal priority is not moved to the spare: warned (health), still on A.
    let (_, n) = a.get(&format!("/api/v1/allocations/{normal}")).await;
    assert_eq!(n["state"], "active", "{n}");
    assert!(n["preempt_at"].is_string(), "not warned: {n}");
    assert!(n["devices"][0]["hostname"] == format!("{name}-a"), "{n}");
    // The whole GPU still waits (B now holds the moved slice); the quota counters are
    // exactly what live allocations hold: the units passed over, not counted twice.
    let (_, w) = a.get(&format!("/api/v1/allocations/{whole}")).await;
    assert_eq!(w["state"], "queued", "{w}");
    assert_eq!(
        used(&a, &t.id, "H100-80GB").await,
        live_units(&a, &t.id).await
    );
    assert_eq!(used(&a, &t.id, "H100-80GB").await, 1 + 1 + 7);

    // The job follows as attempt 2 on B.
    let done = wait_workload(app, &t.member, &job, "succeeded", 120).await;
    assert_eq!(done["attempt"], 2, "{done}");
    assert_eq!(done["hostname"], format!("{name}-b"), "{done}");
    // Its allocation given back, B is a spare again: the pool refills as capacity frees.
    wait_spares(&a, &[&spare]).await;
    let (_, audit) = a.get("/api/v1/audit?action=allocation.displace").await;
    assert!(audit.to_string().contains(&first), "{audit}");
    node_b.stop().await;
    node_a.stop().await;
}

async fn only_platform_admins_change_spares_and_bad_rules_name_the_field(db: Db) {
    let name = format!("spareauth-{}", format!("{db:?}").to_lowercase());
    let a = AdminClient::new(db).await;
    let t = team(&a, &name).await;
    let app = &a.app;
    let path = "/api/v1/spares/H100-80GB";
    for token in [&t.member, &t.team_admin] {
        let (s, _) = call_with_token(app, token, Method::PUT, path, Some(json!({"gpus": 1}))).await;
        assert_eq!(s, 403);
        let (s, _) = call_with_token(app, token, Method::DELETE, path, None).await;
        assert_eq!(s, 403);
        // Everyone may read them (capacity views leave them out).
        let (s, v) = call_with_token(app, token, Method::GET, "/api/v1/spares", None).await;
        assert_eq!((s, v), (200, json!([])));
    }
    let bad: [(&str, Value, &str); 7] = [
        (path, json!({"gpus": -1}), "gpus"),
        (path, json!({"percent": 51}), "percent"),
        (path, json!({"percent": -1}), "percent"),
        (path, json!({"gpus": 1, "percent": 10}), "percent"),
        (path, json!({}), "gpus"),
        (path, json!({"gpus": 1, "colour": "red"}), "colour"),
        ("/api/v1/spares/Z80-1GB", json!({"gpus": 1}), "model"),
    ];
    for (p, body, field) in bad {
        let (s, v) = a.call(Method::PUT, p, Some(body.clone())).await;
        assert_eq!(s, 422, "{body}: {v}");
        assert!(
            v["error"]["field"] == field || v.to_string().contains(field),
            "{body}: {v}"
        );
    }
    // Nothing above stored a rule; a percentage does, an alias names the same model, and
    // DELETE ends it (again: still 204).
    let (_, v) = a.call(Method::GET, "/api/v1/spares", None).await;
    assert_eq!(v, json!([]));
    let (s, v) = a.put(path, json!({"percent": 10})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v[0]["model"], "H100-80GB", "{v}");
    assert_eq!(v[0]["percent"], 10, "{v}");
    assert!(v[0]["gpus"].is_null(), "{v}");
    assert_eq!(v[0]["updated_by"], "admin", "{v}");
    let (s, _) = a.call(Method::DELETE, path, None).await;
    assert_eq!(s, 204);
    let (s, _) = a.call(Method::DELETE, path, None).await;
    assert_eq!(s, 204, "idempotent");
    let (_, v) = a.call(Method::GET, "/api/v1/spares", None).await;
    assert_eq!(v, json!([]));
    let (_, audit) = a.get("/api/v1/audit?action=spares.set").await;
    assert!(audit.to_string().contains("H100-80GB"), "{audit}");
}
