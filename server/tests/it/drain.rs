//! Drain and the deadline channel (docs/operations.md): a drained node takes no new work;
//! what runs there is warned (its signal, `$TESSERA_DEADLINE_FILE`) and, at the deadline,
//! released, its job queued again onto another node as its next attempt. Real
//! `tessera-agent --simulate` nodes run the jobs.

use crate::allocations::{Team, request, set_quota, team, wait_for_state};
use crate::on_both_databases;
use crate::support::{AdminClient, Db, TestApp, call_with_token};
use crate::workloads::{WorkloadAgent, logs_from, wait_workload};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

on_both_databases!(
    a_drained_node_warns_its_job_and_requeues_it_elsewhere_at_the_deadline,
    a_gpu_fault_takes_the_gpu_out_and_moves_its_job_until_an_admin_clears_it,
    only_platform_admins_drain_and_bad_drains_name_the_field,
);

pub(crate) async fn node_id(a: &AdminClient, hostname: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (s, v) = a.call(Method::GET, "/api/v1/nodes?limit=100", None).await;
        assert_eq!(s, 200, "{v}");
        if let Some(n) = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["hostname"] == hostname && n["online"] == true)
        {
            return n["id"].as_str().expect("id").to_owned();
        }
        assert!(Instant::now() < deadline, "{hostname} never came online");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

pub(crate) async fn log_of(app: &TestApp, token: &str, id: &str) -> String {
    let (s, l) = logs_from(app, token, id, 0).await;
    assert_eq!(s, 200, "{l}");
    l["text"].as_str().unwrap_or_default().to_owned()
}

/// The workload's log once it contains `needle` (logs reach the server in rounds).
pub(crate) async fn log_has(app: &TestApp, token: &str, id: &str, needle: &str) -> String {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let log = log_of(app, token, id).await;
        if log.contains(needle) {
            return log;
        }
        assert!(Instant::now() < until, "no {needle:?} in the log: {log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Files under `dir` whose name starts with `prefix`, with their text.
/// The text of job `id`'s checkpoint, the first non-empty file named `prefix`… under
/// `dir`, once written (at most `secs`; the job's log, read as `token`, says why not).
pub(crate) async fn checkpoint(
    app: &TestApp,
    token: &str,
    id: &str,
    dir: &std::path::Path,
    prefix: &str,
    secs: u64,
) -> String {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some((_, text)) = files_named(dir, prefix).first()
            && !text.is_empty()
        {
            return text.clone();
        }
        assert!(
            Instant::now() < until,
            "no checkpoint written: {}",
            log_of(app, token, id).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) fn files_named(dir: &std::path::Path, prefix: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_named(&p, prefix));
        } else if e.file_name().to_string_lossy().starts_with(prefix) {
            out.push((
                p.display().to_string(),
                std::fs::read_to_string(&p).unwrap_or_default(),
            ));
        }
    }
    out
}

/// Two simulated nodes, A and B, and a job of team `t`'s member that runs `script` on A
/// (asking to be warned with `signal`) before B joins: `(name, admin, team, node A, node B,
/// A's node id, the job's id, the job's first allocation)`.
struct TwoNodes(
    String,
    AdminClient,
    Team,
    WorkloadAgent,
    WorkloadAgent,
    String,
    String,
    String,
);

/// A server (its configuration changed by `tweak`), team `name` with room for a whole
/// H100, and a simulated node `node` to run its work.
pub(crate) async fn team_and_node(
    db: Db,
    name: &str,
    node: &str,
    tweak: impl FnOnce(&mut tessera_server::config::ServeConfig),
) -> (AdminClient, Team, WorkloadAgent) {
    let app = TestApp::spawn_with(db, tweak).await;
    let a = AdminClient::with_app(app).await;
    let t = team(&a, name).await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let node = WorkloadAgent::start(&a, node).await;
    (a, t, node)
}

async fn job_on_a_then_b(db: Db, prefix: &str, script: &str, signal: &str) -> TwoNodes {
    let name = format!("{prefix}-{}", format!("{db:?}").to_lowercase());
    let (a, t, node_a) = team_and_node(db, &name, &format!("{name}-a"), |c| {
        c.scheduler_interval = Duration::from_millis(500);
    })
    .await;
    let a_id = node_id(&a, &format!("{name}-a")).await;
    let (s, v) = call_with_token(
        &a.app,
        &t.member,
        Method::POST,
        "/api/v1/jobs",
        Some(
            json!({"command": script, "gpu": "H100-80GB:1g.10gb", "name": prefix,
                    "env": {"TESSERA_DEADLINE_SIGNAL": signal}}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let job = v["id"].as_str().expect("id").to_owned();
    let first_alloc = v["allocation_id"].as_str().expect("alloc").to_owned();
    let running = wait_workload(&a.app, &t.member, &job, "running", 90).await;
    assert_eq!(running["hostname"], format!("{name}-a"), "{running}");
    let node_b = WorkloadAgent::start(&a, &format!("{name}-b")).await;
    node_id(&a, &format!("{name}-b")).await;
    TwoNodes(name, a, t, node_a, node_b, a_id, job, first_alloc)
}

async fn a_drained_node_warns_its_job_and_requeues_it_elsewhere_at_the_deadline(db: Db) {
    // A job that traps its warning signal, writes a checkpoint with what the deadline file
    // says, and, as its second attempt, reports the attempt it is.
    // Hostile too: it first plants a link where its deadline file goes, to a file of the
    // node's (outside its sandbox) that the agent, as root, must not write through.
    let victim = tempfile::NamedTempFile::new().expect("victim");
    std::fs::write(victim.path(), "the node's own file\n").expect("victim");
    let script = format!(
        r#"ln -sf {victim} "$TESSERA_DEADLINE_FILE"
echo "attempt $TESSERA_ATTEMPT"
trap 'cat "$TESSERA_DEADLINE_FILE" > "$TESSERA_WORKSPACE/ckpt-$TESSERA_ATTEMPT"; echo warned' USR1
if [ "$TESSERA_ATTEMPT" = 2 ]; then echo resumed; exit 0; fi
while true; do sleep 0.2; done"#,
        victim = victim.path().display()
    );
    let TwoNodes(name, a, t, node_a, node_b, a_id, id, first_alloc) =
        job_on_a_then_b(db, "drain", &script, "SIGUSR1").await;
    let app = &a.app;

    // Node A is drained, now and then with a 6 s deadline.
    let (s, v) = a
        .call(
            Method::POST,
            &format!("/api/v1/nodes/{a_id}/drain"),
            Some(json!({"minutes": 0, "reason": "new fans"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["drain"]["reason"], "new fans", "{v}");
    // A zero-minute drain is due at once: no warning window. Drain again with one.
    let deadline = chrono::Utc::now() + chrono::Duration::seconds(6);
    let (s, v) = a
        .call(
            Method::POST,
            &format!("/api/v1/nodes/{a_id}/drain"),
            Some(json!({"deadline": deadline, "reason": "new fans"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["drain"]["state"], "draining", "{v}");

    // Nothing new lands on A: a slice asked for now goes to B.
    let (s, other) = request(app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{other}");
    let other_id = other["id"].as_str().expect("id").to_owned();
    let placed = wait_for_state(&a, &other_id, "active").await;
    assert!(
        placed["devices"]
            .as_array()
            .is_some_and(|d| d.iter().all(|d| d["hostname"] == format!("{name}-b"))),
        "{placed}"
    );

    // The job is warned before the deadline: its handler wrote the checkpoint on node A
    // from the deadline file.
    let ckpt = checkpoint(app, &t.member, &id, &node_a.state_dir(), "ckpt-1", 30).await;
    assert!(ckpt.contains("cause=drain"), "{ckpt}");
    assert!(ckpt.contains("deadline="), "{ckpt}");
    assert_eq!(
        std::fs::read_to_string(victim.path()).expect("victim"),
        "the node's own file\n",
        "the agent wrote through the workload's link"
    );
    assert!(
        chrono::Utc::now() < deadline,
        "warned only after the deadline"
    );
    log_has(app, &t.member, &id, "warned").await;

    // At the deadline its GPU is released and the job runs again on B, as attempt 2.
    let first = wait_for_state(&a, &first_alloc, "preempted").await;
    assert!(first["history"].to_string().contains("drained"), "{first}");
    let done = wait_workload(app, &t.member, &id, "succeeded", 120).await;
    assert_eq!(done["attempt"], 2, "{done}");
    assert_eq!(done["hostname"], format!("{name}-b"), "{done}");
    let log = log_of(app, &t.member, &id).await;
    assert!(
        log.contains("attempt 2") && log.contains("resumed"),
        "{log}"
    );

    // The job's page lists attempt 1: where it ran, that a preemption ended it, and the
    // GPU time that cost (a 1g.10gb slice of an H100: a seventh of a GPU for its run).
    let attempts = done["attempts"].as_array().expect("attempts").clone();
    assert_eq!(attempts.len(), 1, "{done}");
    let first_try = &attempts[0];
    assert_eq!(first_try["attempt"], 1, "{first_try}");
    assert_eq!(first_try["hostname"], format!("{name}-a"), "{first_try}");
    assert_eq!(first_try["preempted"], true, "{first_try}");
    let began: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(first_try["started_at"].clone()).expect("started_at");
    let ended: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(first_try["ended_at"].clone()).expect("ended_at");
    let ran_ms = (ended - began).num_milliseconds();
    let gpu_ms = first_try["gpu_ms"].as_i64().expect("gpu_ms");
    assert!(
        ran_ms > 0 && (gpu_ms - ran_ms / 7).abs() <= 1,
        "{first_try}"
    );
    let cost = metric(app, "tessera_preempted_gpu_minutes").await;
    assert!(cost >= gpu_ms as f64 / 60_000.0 - 1e-9, "{cost}");

    // Drained: nothing holds A any more. Undrain gives it back.
    let (_, v) = a.get(&format!("/api/v1/nodes/{a_id}")).await;
    assert_eq!(v["drain"]["state"], "drained", "{v}");
    let (s, v) = a.delete(&format!("/api/v1/nodes/{a_id}/drain")).await;
    assert_eq!(s, 200, "{v}");
    assert!(v["drain"].is_null(), "{v}");
    for action in ["node.drain", "node.undrain"] {
        let (_, audit) = a.get(&format!("/api/v1/audit?action={action}")).await;
        assert!(audit.to_string().contains(&a_id), "{action}: {audit}");
    }
    node_b.stop().await;
    node_a.stop().await;
}

async fn only_platform_admins_drain_and_bad_drains_name_the_field(db: Db) {
    let name = format!("drainauth-{}", format!("{db:?}").to_lowercase());
    let a = AdminClient::new(db).await;
    let t = team(&a, &name).await;
    let node = WorkloadAgent::start(&a, &format!("{name}-n")).await;
    let id = node_id(&a, &format!("{name}-n")).await;
    let app = &a.app;
    let path = format!("/api/v1/nodes/{id}/drain");
    for token in [&t.member, &t.team_admin] {
        let (s, _) = call_with_token(app, token, Method::POST, &path, Some(json!({}))).await;
        assert_eq!(s, 403);
        let (s, _) = call_with_token(app, token, Method::DELETE, &path, None).await;
        assert_eq!(s, 403);
    }
    let bad: [(Value, &str); 5] = [
        (json!({"minutes": -1}), "minutes"),
        (json!({"deadline": "2001-01-01T00:00:00Z"}), "deadline"),
        (
            json!({"minutes": 5, "deadline": chrono::Utc::now()}),
            "minutes",
        ),
        (json!({"gpu": "GPU-not-here"}), "gpu"),
        (json!({"minutes": 5, "colour": "red"}), "colour"),
    ];
    for (body, field) in bad {
        let (s, v) = a.call(Method::POST, &path, Some(body.clone())).await;
        assert_eq!(s, 422, "{body}: {v}");
        assert!(
            v["error"]["field"] == field || v.to_string().contains(field),
            "{body}: {v}"
        );
    }
    let (s, _) = a
        .post(
            &format!("/api/v1/nodes/{}/drain", uuid::Uuid::new_v4()),
            json!({}),
        )
        .await;
    assert_eq!(s, 404);
    // Nothing above drained it.
    let (_, v) = a.get(&format!("/api/v1/nodes/{id}")).await;
    assert!(v["drain"].is_null(), "{v}");
    node.stop().await;
}

async fn a_gpu_fault_takes_the_gpu_out_and_moves_its_job_until_an_admin_clears_it(db: Db) {
    let script = r#"trap 'cat "$TESSERA_DEADLINE_FILE"; echo warned' USR1
echo "attempt $TESSERA_ATTEMPT"
if [ "$TESSERA_ATTEMPT" = 2 ]; then exit 0; fi
while true; do sleep 0.2; done"#;
    let TwoNodes(name, a, t, node_a, node_b, a_id, id, first_alloc) =
        job_on_a_then_b(db, "health", script, "USR1").await;
    let app = &a.app;

    // The simulated driver reports a fallen-off-the-bus Xid on A's GPU (the `sim` control).
    let (_, node) = a.get(&format!("/api/v1/nodes/{a_id}")).await;
    let gpu = node["gpus"][0]["uuid"].as_str().expect("gpu").to_owned();
    let faults = node_a.state_dir().join("sim-driver").join(&gpu);
    std::fs::create_dir_all(&faults).expect("faults dir");
    std::fs::write(
        faults.join("faults.json"),
        r#"{"xid_count": 1, "last_xid": 79}"#,
    )
    .expect("inject");
    let until = Instant::now() + Duration::from_secs(20);
    let unhealthy = loop {
        let (_, n) = a.get(&format!("/api/v1/nodes/{a_id}")).await;
        if n["gpus"][0]["unhealthy"].is_object() {
            break n["gpus"][0]["unhealthy"].clone();
        }
        assert!(Instant::now() < until, "never unhealthy: {n}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        unhealthy["reason"]
            .as_str()
            .unwrap_or("")
            .contains("Xid 79"),
        "{unhealthy}"
    );
    assert_eq!(metric(app, "tessera_gpus_unhealthy").await, 1.0);

    // Its job is warned (cause=health), moved off at the grace's end, and runs on B.
    let first = wait_for_state(&a, &first_alloc, "preempted").await;
    assert!(
        first["history"].to_string().contains("unhealthy"),
        "{first}"
    );
    let done = wait_workload(app, &t.member, &id, "succeeded", 120).await;
    assert_eq!(done["attempt"], 2, "{done}");
    assert_eq!(done["hostname"], format!("{name}-b"), "{done}");
    // The first attempt's log has the warning it got before it was stopped.
    let log = log_of(app, &t.member, &id).await;
    assert!(
        log.contains("cause=health") && log.contains("warned"),
        "{log}"
    );

    // Only platform admins clear it; clearing twice is a conflict; the same counters after
    // the clear keep it healthy.
    let path = format!("/api/v1/nodes/{a_id}/gpus/{gpu}/health/clear");
    let (s, _) = call_with_token(app, &t.team_admin, Method::POST, &path, None).await;
    assert_eq!(s, 403);
    let (s, v) = a.call(Method::POST, &path, None).await;
    assert_eq!(s, 200, "{v}");
    assert!(v["gpus"][0]["unhealthy"].is_null(), "{v}");
    let (s, _) = a.call(Method::POST, &path, None).await;
    assert_eq!(s, 409);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, n) = a.get(&format!("/api/v1/nodes/{a_id}")).await;
    assert!(n["gpus"][0]["unhealthy"].is_null(), "{n}");
    // A new uncorrectable ECC error takes it out again.
    std::fs::write(
        faults.join("faults.json"),
        r#"{"xid_count": 1, "last_xid": 79, "ecc_uncorrected": 1}"#,
    )
    .expect("inject");
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, n) = a.get(&format!("/api/v1/nodes/{a_id}")).await;
        if let Some(r) = n["gpus"][0]["unhealthy"]["reason"].as_str() {
            assert!(r.contains("uncorrectable ECC"), "{n}");
            break;
        }
        assert!(Instant::now() < until, "never unhealthy again: {n}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    node_b.stop().await;
    node_a.stop().await;
}

/// The value of the unlabelled series `name` on the server's `/metrics`.
async fn metric(app: &TestApp, name: &str) -> f64 {
    let metrics = app.metrics().await;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} on /metrics: {metrics}"))
}
