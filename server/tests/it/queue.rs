//! Jobs and notebooks that bring their own GPU: submitted with a GPU request instead of an
//! allocation, they wait `queued` in the team's queue (same quota and fair share as any
//! request), run once their own allocation is active, and give it back when they end, so
//! metering stops with them. A real `tessera-agent --simulate` runs the job processes.

use crate::allocations::request;
use crate::allocations::{set_quota, team, wait_for_state};
use crate::on_both_databases;
use crate::support::{
    AdminClient, Db, TestApp, assert_message_contains, call_with_token, get_as, post_as, tessera_ok,
};
use crate::workloads::{WorkloadAgent, get, logs_from, stop_workload, wait_workload};
use chrono::{DateTime, Utc};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

on_both_databases!(
    twenty_queued_jobs_share_a_quota_of_seven_and_give_each_gpu_back,
    a_time_limit_stops_a_job_and_a_stopped_queued_job_gives_up_its_request,
    a_preempted_job_is_queued_again_and_runs_its_next_attempt,
    a_team_profile_starts_a_notebook_in_one_call,
);

async fn submit(app: &TestApp, token: &str, body: Value) -> Value {
    let (s, v) = call_with_token(app, token, Method::POST, "/api/v1/jobs", Some(body)).await;
    assert_eq!(s, 201, "{v}");
    v
}

async fn allocation(a: &AdminClient, id: &str) -> Value {
    let (s, v) = a.get(&format!("/api/v1/allocations/{id}")).await;
    assert_eq!(s, 200, "{v}");
    v
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|| panic!("not a time: {v}"))
}

/// When the allocation entered `state` (from its history).
fn entered(alloc: &Value, state: &str) -> Option<DateTime<Utc>> {
    alloc["history"]
        .as_array()?
        .iter()
        .find(|t| t["to"] == state)
        .map(|t| time(&t["at"]))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn twenty_queued_jobs_share_a_quota_of_seven_and_give_each_gpu_back(db: Db) {
    let name = format!("queue-{}", format!("{db:?}").to_lowercase());
    let a = AdminClient::new(db).await;
    let t = team(&a, &name).await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let agent = WorkloadAgent::start(&a, &format!("{name}-node")).await;
    let app = &a.app;

    // Bad requests are refused before anything is queued.
    let (s, v) = call_with_token(
        app,
        &t.member,
        Method::POST,
        "/api/v1/jobs",
        Some(json!({"command": "true", "gpu": "H100-80GB:9g.99gb"})),
    )
    .await;
    assert_eq!(s, 422, "{v}");
    assert_eq!(v["error"]["field"], "gpu", "{v}");
    let (s, v) = post_as(app, &t.member, "/api/v1/jobs", json!({"command": "true"})).await;
    assert_eq!(s, 422, "{v}");
    assert_eq!(v["error"]["field"], "allocation_id", "{v}");

    let mut ids = Vec::new();
    for i in 0..20 {
        let v = submit(
            app,
            &t.member,
            json!({"command": format!("sleep 2; echo run {i}"), "name": format!("sweep-{i}"),
                   "gpu": "H100-80GB:1g.10gb", "time_limit_minutes": 60}),
        )
        .await;
        assert_eq!(v["state"], "queued", "{v}");
        assert_eq!(v["owns_allocation"], true, "{v}");
        ids.push(v["id"].as_str().expect("id").to_owned());
    }
    // A repeated submission with the same Idempotency-Key is the same job.
    let keyed = || {
        reqwest::Client::new()
            .post(app.url("/api/v1/jobs"))
            .bearer_auth(&t.member)
            .header("Idempotency-Key", "sweep-once")
    };
    let body = json!({"command": "true", "gpu": "H100-80GB:1g.10gb"});
    let (s, first) = crate::support::json_call(keyed(), Some(body.clone())).await;
    assert_eq!(s, 201, "{first}");
    let (_, again) = crate::support::json_call(keyed(), Some(body)).await;
    assert_eq!(first["id"], again["id"]);
    assert_eq!(first["allocation_id"], again["allocation_id"]);
    ids.push(first["id"].as_str().expect("id").to_owned());

    // A queued job says why it waits.
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut most_running = 0;
    let mut saw_waiting = false;
    let done = loop {
        let mut running = 0;
        let mut finished = Vec::new();
        // One list call: a snapshot of every job at one moment (one GET per job would
        // see a job that ended and the next one that started in the same scan).
        let (s, page) = call_with_token(
            app,
            &t.member,
            Method::GET,
            &format!("/api/v1/workloads?team={}&limit=100", t.id),
            None,
        )
        .await;
        assert_eq!(s, 200, "{page}");
        let items = page["items"].as_array().expect("items");
        for id in &ids {
            let v = items
                .iter()
                .find(|w| w["id"] == id.as_str())
                .unwrap_or_else(|| panic!("job {id} is not listed: {page}"))
                .clone();
            match v["state"].as_str().unwrap_or("") {
                "pending" | "starting" | "running" | "stopping" => running += 1,
                "queued" if !saw_waiting => {
                    // The list leaves the reason out; the job's own view says it.
                    let one = get(app, &t.member, id).await;
                    saw_waiting = one["waiting"].as_str().is_some_and(|w| !w.is_empty());
                }
                "queued" => {}
                "succeeded" => finished.push(v),
                other => panic!("job {id} is {other}: {v}"),
            }
        }
        most_running = most_running.max(running);
        assert!(
            running <= 7,
            "{running} jobs hold GPUs at once; the quota is 7"
        );
        if finished.len() == ids.len() {
            break finished;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} jobs finished",
            finished.len(),
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(saw_waiting, "no queued job said why it waits");
    assert!(most_running >= 2, "the jobs never ran side by side");

    // Every job's allocation ended with it: released, within a scheduler pass or two.
    let mut allocated = 0.0;
    let mut used = 0.0;
    let mut ends = Vec::new();
    let mut starts = Vec::new();
    for job in &done {
        let alloc_id = job["allocation_id"].as_str().expect("allocation");
        let alloc = wait_for_state(&a, alloc_id, "ended").await;
        let job_end = time(&job["ended_at"]);
        let job_start = time(&job["started_at"]);
        let active = entered(&alloc, "active").expect("was active");
        let released = entered(&alloc, "releasing")
            .or_else(|| entered(&alloc, "ended"))
            .expect("ended");
        let lag = (released - job_end).num_milliseconds();
        assert!(
            lag < 10_000,
            "allocation {alloc_id} ended {lag} ms after its job: {alloc}"
        );
        allocated += (released - active).num_milliseconds() as f64 / 3_600_000.0;
        used += (job_end - job_start).num_milliseconds() as f64 / 3_600_000.0;
        ends.push(job_end);
        starts.push(job_start);
    }
    // No quota stays held.
    let (_, quotas) = a.get(&format!("/api/v1/teams/{}/quotas", t.id)).await;
    assert_eq!(quotas[0]["used"], 0, "{quotas}");

    // Time from capacity freeing to the next queued job running: the k-th job to start
    // after the first seven waited for the k-th job to end.
    starts.sort();
    ends.sort();
    let waits: Vec<f64> = starts
        .iter()
        .skip(7)
        .zip(&ends)
        .map(|(s, e)| (*s - *e).num_milliseconds().max(0) as f64 / 1000.0)
        .collect();
    eprintln!(
        "queued jobs ({db:?}): {} jobs, at most {most_running} at once; capacity freed → next \
         job running: median {:.2} s, max {:.2} s; GPU hours allocated {allocated:.5} vs used \
         {used:.5} ({:.0} %)",
        done.len(),
        median(waits.clone()),
        waits.iter().copied().fold(0.0, f64::max),
        100.0 * used / allocated,
    );

    // A sweep from the terminal: one job per index, each with its index, each queued for
    // a GPU of its own.
    let stdout = tessera_ok(
        &app.base,
        &t.member,
        &[
            "job",
            "submit",
            "--gpu",
            "H100-80GB:1g.10gb",
            "--name",
            "sweep",
            "--array",
            "1-3",
            "--",
            "sh",
            "-c",
            "echo idx=$TESSERA_ARRAY_INDEX",
        ],
    );
    let array: Vec<&str> = stdout.lines().collect();
    assert_eq!(array.len(), 3, "{stdout}");
    for (i, id) in array.iter().enumerate() {
        let v = wait_workload(app, &t.member, id, "succeeded", 120).await;
        assert_eq!(v["name"], format!("sweep[{}]", i + 1), "{v}");
        let (_, log) = logs_from(app, &t.member, id, 0).await;
        let text = log["text"].as_str().unwrap_or("");
        assert!(text.contains(&format!("idx={}", i + 1)), "{log}");
    }
    agent.stop().await;
}

async fn a_time_limit_stops_a_job_and_a_stopped_queued_job_gives_up_its_request(db: Db) {
    let name = format!("limit-{}", format!("{db:?}").to_lowercase());
    let a = AdminClient::new(db).await;
    let t = team(&a, &name).await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let app = &a.app;

    // Without a node, a job waits; stopping it cancels its request and frees the quota.
    let v = submit(
        app,
        &t.member,
        json!({"command": "sleep 600", "gpu": "H100-80GB:whole"}),
    )
    .await;
    let waiting = v["id"].as_str().expect("id").to_owned();
    let waiting_alloc = v["allocation_id"].as_str().expect("alloc").to_owned();
    assert_eq!(v["state"], "queued", "{v}");
    let (s, v) = stop_workload(app, &t.member, &waiting).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "cancelled", "{v}");
    assert_eq!(allocation(&a, &waiting_alloc).await["state"], "cancelled");
    // Another team's member cannot see or stop it.
    let o = team(&a, &format!("{name}-other")).await;
    let (s, _) = get_as(app, &o.member, &format!("/api/v1/workloads/{waiting}")).await;
    assert_eq!(s, 404);

    // A job with a 60-minute limit runs; an hour later its allocation has expired and the
    // job is stopped on the node.
    let agent = WorkloadAgent::start(&a, &format!("{name}-node")).await;
    let v = submit(
        app,
        &t.member,
        json!({"command": "echo started; sleep 600", "gpu": "H100-80GB:1g.10gb",
               "time_limit_minutes": 60, "priority": "normal"}),
    )
    .await;
    let id = v["id"].as_str().expect("id").to_owned();
    let alloc_id = v["allocation_id"].as_str().expect("alloc").to_owned();
    let running = wait_workload(app, &t.member, &id, "running", 90).await;
    assert!(running["hostname"].is_string(), "{running}");
    assert!(
        running["device"]
            .as_str()
            .is_some_and(|d| d.starts_with("MIG-")),
        "{running}"
    );

    let (services, system) = app.side_services().await;
    let later = Utc::now() + chrono::Duration::minutes(61);
    let r = services
        .allocations
        .tick(&system, later)
        .await
        .expect("tick");
    assert_eq!(r.expired, 1, "{r:?}");
    let ended = wait_workload(app, &t.member, &id, "cancelled", 60).await;
    assert_message_contains(&ended, "time limit");
    assert_eq!(allocation(&a, &alloc_id).await["state"], "expired");
    agent.stop().await;
}

async fn a_preempted_job_is_queued_again_and_runs_its_next_attempt(db: Db) {
    let name = format!("requeue-{}", format!("{db:?}").to_lowercase());
    let app = TestApp::spawn_with(db, |c| {
        c.preemption_grace = Duration::from_secs(3);
        c.scheduler_interval = Duration::from_millis(500);
    })
    .await;
    let a = AdminClient::with_app(app).await;
    let lender = team(&a, &format!("{name}-lender")).await;
    let claimant = team(&a, &format!("{name}-claimant")).await;
    set_quota(&a, &lender.id, "H100-80GB", 7, 7, 7).await;
    set_quota(&a, &claimant.id, "H100-80GB", 7, 7, 7).await;
    let agent = WorkloadAgent::start(&a, &format!("{name}-node")).await;
    let app = &a.app;
    let v = submit(
        app,
        &lender.member,
        json!({"command": "sleep 600", "gpu": "H100-80GB:4g.40gb", "name": "long-train"}),
    )
    .await;
    let id = v["id"].as_str().expect("id").to_owned();
    let first_alloc = v["allocation_id"].as_str().expect("alloc").to_owned();
    wait_workload(app, &lender.member, &id, "running", 90).await;

    // Another team claims the GPU's one 4g.40gb place; the lender's guarantee drops to
    // nothing, so its slice is borrowed and preempted: the job goes back to the queue, on
    // a new request. (MIG slices on both sides: no MIG mode switch in the way.)
    let (s, slice) = request(app, &claimant.member, &claimant.id, "H100-80GB:4g.40gb").await;
    assert_eq!(s, 201, "{slice}");
    let slice_id = slice["id"].as_str().expect("id").to_owned();
    set_quota(&a, &lender.id, "H100-80GB", 0, 7, 7).await;
    wait_for_state(&a, &first_alloc, "preempted").await;
    let requeued = wait_workload(app, &lender.member, &id, "queued", 60).await;
    assert_eq!(requeued["attempt"], 2, "{requeued}");
    assert_ne!(
        requeued["allocation_id"],
        first_alloc.as_str(),
        "{requeued}"
    );
    assert_message_contains(&requeued, "preempted");
    // Its next attempt runs once the GPU is free again.
    wait_for_state(&a, &slice_id, "active").await;
    let (s, _) = call_with_token(
        app,
        &claimant.member,
        Method::POST,
        &format!("/api/v1/allocations/{slice_id}/release"),
        None,
    )
    .await;
    assert_eq!(s, 200);
    let again = wait_workload(app, &lender.member, &id, "running", 120).await;
    assert_eq!(again["attempt"], 2, "{again}");
    // Cancelled, it gives its second GPU back.
    let second_alloc = again["allocation_id"].as_str().expect("alloc").to_owned();
    let (s, _) = stop_workload(app, &lender.member, &id).await;
    assert_eq!(s, 200);
    wait_workload(app, &lender.member, &id, "cancelled", 60).await;
    wait_for_state(&a, &second_alloc, "ended").await;
    agent.stop().await;
}

async fn a_team_profile_starts_a_notebook_in_one_call(db: Db) {
    let name = format!("profile-{}", format!("{db:?}").to_lowercase());
    let a = AdminClient::new(db).await;
    let t = team(&a, &name).await;
    let o = team(&a, &format!("{name}-other")).await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let app = &a.app;
    let path = format!("/api/v1/teams/{}/notebook-profiles", t.id);

    // Team admins define profiles; members may not; a bad kind or hours is refused.
    let body = json!({"name": "Small", "kind": "H100-80GB:1g.10gb", "hours": 4});
    let (s, _) = call_with_token(app, &t.member, Method::POST, &path, Some(body.clone())).await;
    assert_eq!(s, 403);
    let (s, v) = call_with_token(
        app,
        &t.team_admin,
        Method::POST,
        &path,
        Some(json!({"name": "Odd", "kind": "H100-80GB:9g.99gb", "hours": 4})),
    )
    .await;
    assert_eq!(
        (s, v["error"]["field"].as_str()),
        (422, Some("kind")),
        "{v}"
    );
    let (s, v) = call_with_token(
        app,
        &t.team_admin,
        Method::POST,
        &path,
        Some(json!({"name": "Odd", "kind": "H100-80GB:whole", "hours": 0})),
    )
    .await;
    assert_eq!(
        (s, v["error"]["field"].as_str()),
        (422, Some("hours")),
        "{v}"
    );
    let (s, small) = call_with_token(app, &t.team_admin, Method::POST, &path, Some(body)).await;
    assert_eq!(s, 201, "{small}");
    assert_eq!(small["kind_label"], "1g.10gb on H100-80GB", "{small}");
    let (s, list) = call_with_token(app, &t.member, Method::GET, &path, None).await;
    assert_eq!(s, 200);
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");

    // One call starts a notebook on it: it waits for its own 1g.10gb for 4 hours, paid by
    // the profile's team.
    let (s, nb) = call_with_token(
        app,
        &t.member,
        Method::POST,
        "/api/v1/notebooks",
        Some(json!({"profile_id": small["id"], "name": "quick"})),
    )
    .await;
    assert_eq!(s, 201, "{nb}");
    assert_eq!(nb["state"], "queued", "{nb}");
    assert_eq!(nb["owns_allocation"], true);
    let alloc = allocation(&a, nb["allocation_id"].as_str().expect("alloc")).await;
    assert_eq!(alloc["kind"], "H100-80GB:1g.10gb", "{alloc}");
    assert_eq!(alloc["team_id"], t.id.as_str(), "{alloc}");
    assert!(
        alloc["purpose"].as_str().unwrap_or("").contains("Small"),
        "{alloc}"
    );
    // Another team's member cannot use it, nor see the team's profiles.
    let (s, v) = call_with_token(
        app,
        &o.member,
        Method::POST,
        "/api/v1/notebooks",
        Some(json!({"profile_id": small["id"], "name": "steal"})),
    )
    .await;
    assert_eq!(
        (s, v["error"]["field"].as_str()),
        (422, Some("profile_id")),
        "{v}"
    );
    let (s, _) = call_with_token(app, &o.member, Method::GET, &path, None).await;
    assert_eq!(s, 404);
    // Stopped while it waits, its request is cancelled.
    let (s, v) = call_with_token(
        app,
        &t.member,
        Method::POST,
        &format!("/api/v1/workloads/{}/stop", nb["id"].as_str().expect("id")),
        None,
    )
    .await;
    assert_eq!((s, v["state"].as_str()), (200, Some("stopped")), "{v}");
    let alloc = allocation(&a, nb["allocation_id"].as_str().expect("alloc")).await;
    assert_eq!(alloc["state"], "cancelled", "{alloc}");
    // Deleted, it is gone.
    let (s, _) = call_with_token(
        app,
        &t.team_admin,
        Method::DELETE,
        &format!("{path}/{}", small["id"].as_str().expect("id")),
        None,
    )
    .await;
    assert_eq!(s, 204);
    let (_, list) = call_with_token(app, &t.member, Method::GET, &path, None).await;
    assert_eq!(list.as_array().map(Vec::len), Some(0), "{list}");
}
