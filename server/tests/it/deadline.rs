//! The deadline channel's grace and its other early stops (docs/operations.md): a team
//! admin sets the team's grace within the platform maximum and a reclaim preemption uses
//! it; an idle notebook is told its stop before it comes (cause `idle`), and told again
//! no more once used; a user's stop warns a job that listens (cause `stop`) before SIGTERM,
//! and a second stop ends the warning at once. Real `tessera-agent --simulate` nodes.

use crate::allocations::{SimAgent, request, set_quota, team, wait_for_state};
use crate::drain::{checkpoint, files_named, log_has, team_and_node};
use crate::on_both_databases;
use crate::support::{AdminClient, Db, TestApp, assert_message_contains, call_with_token};
use crate::workloads::{get, notebook_on, wait_workload};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

on_both_databases!(
    a_team_admin_sets_the_grace_within_the_maximum_and_a_reclaim_uses_it,
    a_user_stop_warns_a_job_that_listens_and_a_second_stop_is_at_once,
    an_idle_notebook_is_told_its_stop_and_untold_when_used,
);

async fn a_team_admin_sets_the_grace_within_the_maximum_and_a_reclaim_uses_it(db: Db) {
    // The platform maximum is ten minutes; the lender's admin asks for 4 s.
    let app = TestApp::spawn_with(db, |c| {
        c.preemption_grace = Duration::from_secs(600);
        c.scheduler_interval = Duration::from_millis(500);
    })
    .await;
    let a = AdminClient::with_app(app).await;
    let lender = team(&a, "lender").await;
    let claimant = team(&a, "claimant").await;
    let app = &a.app;
    let path = format!("/api/v1/teams/{}/grace", lender.id);
    let (s, g) = call_with_token(app, &lender.member, Method::GET, &path, None).await;
    assert_eq!(s, 200, "{g}");
    assert_eq!(
        g,
        json!({"preemption_grace_secs": null, "effective_secs": 600, "max_secs": 600})
    );
    // A member cannot set it; another team's admin does not see the team.
    let put_grace = async |token: &str, body: &Value| {
        call_with_token(app, token, Method::PUT, &path, Some(body.clone())).await
    };
    let body = json!({"preemption_grace_secs": 4});
    let (s, _) = put_grace(&lender.member, &body).await;
    assert_eq!(s, 403);
    let (s, _) = put_grace(&claimant.team_admin, &body).await;
    assert_eq!(s, 404);
    // Above the maximum, negative, or an unknown field: 422 naming the field.
    for (bad, field) in [
        (
            json!({"preemption_grace_secs": 601}),
            "preemption_grace_secs",
        ),
        (
            json!({"preemption_grace_secs": -1}),
            "preemption_grace_secs",
        ),
        (json!({"preemption_grace_secs": 5, "grace": 5}), "grace"),
    ] {
        let (s, v) = put_grace(&lender.team_admin, &bad).await;
        assert_eq!(s, 422, "{bad}: {v}");
        assert!(v.to_string().contains(field), "{bad}: {v}");
    }
    let (s, g) = put_grace(&lender.team_admin, &body).await;
    assert_eq!(s, 200, "{g}");
    assert_eq!(g["preemption_grace_secs"], 4);
    assert_eq!(g["effective_secs"], 4);
    let (_, audit) = a.get("/api/v1/audit?action=team.grace").await;
    assert!(audit.to_string().contains(&lender.id), "{audit}");

    // Both teams are guaranteed the one H100; the lender holds it whole, the claimant
    // waits. Once the lender's guarantee drops, its GPU is borrowed and reclaimed with the
    // lender's 4 s, not the platform's ten minutes.
    set_quota(&a, &lender.id, "H100-80GB", 7, 7, 7).await;
    set_quota(&a, &claimant.id, "H100-80GB", 7, 7, 7).await;
    let _agent = SimAgent::start(&a, "sim-grace").await;
    let (_, whole) = request(app, &lender.member, &lender.id, "H100-80GB:whole").await;
    let whole_id = whole["id"].as_str().expect("id").to_owned();
    wait_for_state(&a, &whole_id, "active").await;
    let (_, slice) = request(app, &claimant.member, &claimant.id, "H100-80GB:1g.10gb").await;
    let slice_id = slice["id"].as_str().expect("id").to_owned();
    set_quota(&a, &lender.id, "H100-80GB", 0, 7, 7).await;
    let until = Instant::now() + Duration::from_secs(30);
    let warned_at = chrono::Utc::now();
    let preempt_at = loop {
        let (_, w) = a.get(&format!("/api/v1/allocations/{whole_id}")).await;
        if let Some(at) = w["preempt_at"].as_str() {
            break chrono::DateTime::parse_from_rfc3339(at)
                .expect("rfc3339")
                .with_timezone(&chrono::Utc);
        }
        assert!(Instant::now() < until, "never warned: {w}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let grace = preempt_at - warned_at;
    assert!(
        grace <= chrono::Duration::seconds(35),
        "the platform maximum was used, not the team's grace: {grace}"
    );
    wait_for_state(&a, &whole_id, "preempted").await;
    wait_for_state(&a, &slice_id, "active").await;
}

/// Submits a job of its own 1g.10gb slice running `script`, `env` in its environment.
async fn submit(app: &TestApp, token: &str, name: &str, script: &str, env: Value) -> String {
    let (s, v) = call_with_token(
        app,
        token,
        Method::POST,
        "/api/v1/jobs",
        Some(json!({"command": script, "gpu": "H100-80GB:1g.10gb", "name": name, "env": env})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    v["id"].as_str().expect("id").to_owned()
}

async fn a_user_stop_warns_a_job_that_listens_and_a_second_stop_is_at_once(db: Db) {
    let name = format!("stopwarn-{}", format!("{db:?}").to_lowercase());
    let (a, t, node) = team_and_node(db, &name, &format!("{name}-n"), |c| {
        c.scheduler_interval = Duration::from_millis(500);
    })
    .await;
    let app = &a.app;
    // A job that checkpoints when warned, from what the deadline file says, and says when
    // SIGTERM comes.
    let script = r#"trap 'cat "$TESSERA_DEADLINE_FILE" > "$TESSERA_WORKSPACE/ckpt-$JOB"; echo warned' USR1
trap 'echo terminated; exit 143' TERM
echo started
while true; do sleep 0.2; done"#;
    // One after the other: each slice is placed on the GPU's layout as it stands.
    let mut ids = Vec::new();
    for (job, signal) in [("listens", true), ("deaf", false), ("hurried", true)] {
        let mut env = json!({ "JOB": job });
        if signal {
            env["TESSERA_DEADLINE_SIGNAL"] = json!("USR1");
        }
        let id = submit(app, &t.member, job, script, env).await;
        wait_workload(app, &t.member, &id, "running", 120).await;
        ids.push(id);
    }
    let [listens, deaf, hurried] = <[String; 3]>::try_from(ids).expect("three jobs");
    // Running for the agent too: its trap is set once it printed.
    for id in [&listens, &deaf, &hurried] {
        log_has(app, &t.member, id, "started").await;
    }

    // The job that asked for the signal is warned, not stopped: `stopping` for the stop
    // grace (30 s), its handler writes the checkpoint from the deadline file.
    let stop = |id: &str, q: &str| format!("/api/v1/workloads/{id}/stop{q}");
    let (s, v) = call_with_token(app, &t.member, Method::POST, &stop(&listens, ""), None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "stopping", "{v}");
    assert_message_contains(&v, "warned");
    let dir = node.state_dir();
    let ckpt = checkpoint(app, &t.member, &listens, &dir, "ckpt-listens", 20).await;
    assert!(ckpt.contains("cause=stop"), "{ckpt}");
    assert!(ckpt.contains("deadline="), "{ckpt}");
    // Warned, still running: no SIGTERM yet.
    let log = log_has(app, &t.member, &listens, "warned").await;
    let v = get(app, &t.member, &listens).await;
    assert_eq!(v["state"], "stopping", "{v}");
    assert!(
        log.contains("warned") && !log.contains("terminated"),
        "{log}"
    );

    // A second stop during the grace stops it at once (well before the 30 s).
    let asked = Instant::now();
    let (s, _) = call_with_token(app, &t.member, Method::POST, &stop(&listens, ""), None).await;
    assert_eq!(s, 200);
    let done = wait_workload(app, &t.member, &listens, "cancelled", 20).await;
    assert!(asked.elapsed() < Duration::from_secs(20), "{done}");
    let log = log_has(app, &t.member, &listens, "terminated").await;
    let (w, term) = (log.find("warned"), log.find("terminated"));
    assert!(
        w.is_some() && term.is_some() && w < term,
        "warned, then SIGTERM: {log}"
    );

    // A job that did not ask (its team set no grace) stops at once, as before; so does
    // one that asked, with `?now=true`. Neither gets a checkpoint.
    for (id, q) in [(&deaf, ""), (&hurried, "?now=true")] {
        let (s, v) = call_with_token(app, &t.member, Method::POST, &stop(id, q), None).await;
        assert_eq!(s, 200, "{v}");
        assert!(
            !v["message"].as_str().unwrap_or("").contains("warned"),
            "{v}"
        );
        wait_workload(app, &t.member, id, "cancelled", 20).await;
    }
    for job in ["deaf", "hurried"] {
        assert!(
            files_named(&node.state_dir(), &format!("ckpt-{job}")).is_empty(),
            "{job} was warned"
        );
    }
    // The stops are audited.
    let (_, audit) = a.get("/api/v1/audit?action=job.stop").await;
    assert!(audit.to_string().contains("stopped at once"), "{audit}");
    node.stop().await;
}

async fn an_idle_notebook_is_told_its_stop_and_untold_when_used(db: Db) {
    let name = format!("idlewarn-{}", format!("{db:?}").to_lowercase());
    // Idle 40 s → stopped; warned (and told through the channel) from 10 s idle.
    let (a, t, node) = team_and_node(db, &name, &format!("{name}-n"), |c| {
        c.scheduler_interval = Duration::from_millis(500);
        c.idle_after = Duration::from_secs(40);
        c.idle_warn = Duration::from_secs(30);
    })
    .await;
    let app = &a.app;
    let (s, v) = request(app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let alloc = v["id"].as_str().expect("id").to_owned();
    wait_for_state(&a, &alloc, "active").await;
    let nb_name = format!("nb-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (s, v) = notebook_on(app, &t.member, &alloc, &nb_name).await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    wait_workload(app, &t.member, &id, "running", 120).await;

    // In its warning window the notebook's deadline file says when the idle rule stops it.
    let dir = node.state_dir();
    let text = told(app, &t.member, &id, &dir).await;
    assert!(text.contains("deadline="), "{text}");
    let v = get(app, &t.member, &id).await;
    assert_eq!(v["idle"]["decision"], "warn", "{v}");

    // Used again (a kernel started through the proxy): the warning is withdrawn, the file
    // goes.
    let base = format!("/user/{name}-member/{nb_name}/");
    let r = reqwest::Client::new()
        .post(app.url(&format!("{base}api/kernels")))
        .bearer_auth(&t.member)
        .json(&json!({"name": "python3"}))
        .send()
        .await
        .expect("request");
    assert!(r.status().is_success(), "{}", r.status());
    let until = Instant::now() + Duration::from_secs(20);
    while files_named(&node.state_dir(), "deadline")
        .iter()
        .any(|(_, t)| t.contains("cause=idle"))
    {
        assert!(Instant::now() < until, "the idle warning stayed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(get(app, &t.member, &id).await["state"], "running");

    // Idle again: told again, then stopped by the idle rule at its time.
    told(app, &t.member, &id, &dir).await;
    let stopped = wait_workload(app, &t.member, &id, "stopped", 60).await;
    assert_message_contains(&stopped, "without kernel or GPU activity");
    node.stop().await;
}

/// The idle deadline file's text once the notebook is told, failing if it stops untold.
async fn told(app: &TestApp, token: &str, id: &str, dir: &std::path::Path) -> String {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((_, text)) = files_named(dir, "deadline")
            .into_iter()
            .find(|(_, t)| t.contains("cause=idle"))
        {
            return text;
        }
        let v = get(app, token, id).await;
        assert_eq!(v["state"], "running", "stopped untold: {v}");
        assert!(Instant::now() < until, "never told: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
