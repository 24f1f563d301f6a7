//! Fractional GPUs: an admin shares a GPU (MPS or time-slicing), members ask for
//! `MODEL:share:MILLI`, counted exactly in milli-GPU on the team's shared quota line,
//! placed on shared GPUs only, activated when the node runs the GPU shared, and billed
//! pro rata. Real simulated agents (`tessera-agent --simulate`).

use crate::allocations::{race, request, set_quota, team};
use crate::billing::{chargeback, history, member_id, next_hour, services, set_rate};
use crate::on_both_databases;
use crate::support::{AdminClient, Db, TestApp, call_with_token, get_as, put_as};
use crate::workloads::{WorkloadAgent, logs_from, wait_workload};
use chrono::Duration as TimeDelta;
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use uuid::Uuid;

on_both_databases!(
    share_quota_counts_exact_milli_under_concurrency,
    four_quarter_shares_fill_a_shared_gpu_and_a_fifth_waits_with_a_reason,
    a_gpu_changes_mode_only_while_idle,
    a_gpu_without_mig_is_shared_by_time_slicing,
);

/// The node's only GPU, once its agent reported it.
async fn node_gpu(a: &AdminClient, hostname: &str) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, nodes) = a.call(Method::GET, "/api/v1/nodes", None).await;
        if let Some(n) = nodes["items"]
            .as_array()
            .and_then(|n| n.iter().find(|n| n["hostname"] == hostname))
            && let Some(uuid) = n["gpus"][0]["uuid"].as_str()
        {
            return (
                n["id"].as_str().expect("node id").to_owned(),
                uuid.to_owned(),
            );
        }
        assert!(
            Instant::now() < deadline,
            "{hostname} never reported: {nodes}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn set_sharing(a: &AdminClient, node: &str, gpu: &str, sharing: &str) -> (u16, Value) {
    a.call(
        Method::PUT,
        &format!("/api/v1/nodes/{node}/gpus/{gpu}/sharing"),
        Some(json!({ "sharing": sharing })),
    )
    .await
}

/// The node's first GPU's view once `pick` accepts it.
async fn wait_gpu(a: &AdminClient, node: &str, what: &str, pick: impl Fn(&Value) -> bool) -> Value {
    wait_gpu_at(a, node, 0, what, pick).await
}

/// The node's GPU at `index` in its list, once `pick` accepts it.
async fn wait_gpu_at(
    a: &AdminClient,
    node: &str,
    index: usize,
    what: &str,
    pick: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (_, n) = a.get(&format!("/api/v1/nodes/{node}")).await;
        let gpu = n["gpus"][index].clone();
        if pick(&gpu) {
            return gpu;
        }
        assert!(Instant::now() < deadline, "{what}: {gpu}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// What a job on allocation `alloc` sees of its GPU: its `CUDA_*` and `TESSERA_GPU_*`
/// environment, one `NAME=value` a line.
async fn gpu_environment(app: &TestApp, token: &str, alloc: &str) -> String {
    let (s, job) = call_with_token(
        app,
        token,
        Method::POST,
        "/api/v1/jobs",
        Some(json!({"allocation_id": alloc,
            "command": "env | grep -E '^(CUDA_|TESSERA_GPU_)' | sort"})),
    )
    .await;
    assert_eq!(s, 201, "{job}");
    let job_id = job["id"].as_str().expect("id").to_owned();
    wait_workload(app, token, &job_id, "succeeded", 120).await;
    let (_, log) = logs_from(app, token, &job_id, 0).await;
    log["text"].as_str().unwrap_or("").to_owned()
}

async fn alloc_state(app: &TestApp, token: &str, id: &str) -> Value {
    let (_, v) = get_as(app, token, &format!("/api/v1/allocations/{id}")).await;
    v
}

/// 50 members' requests race for a 1000-milli shared quota in 100-milli shares: exactly
/// ten are admitted, and the counter says 1000, not a rounded number of GPUs.
async fn share_quota_counts_exact_milli_under_concurrency(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "milli").await;
    let (s, v) = a
        .call(
            Method::PUT,
            &format!("/api/v1/teams/{}/quotas/H100-80GB:shared", t.id),
            Some(json!({"guaranteed": 1000, "limit": 1000, "per_user": 1000})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let states: Vec<String> = race(&a.app, &t.member, &t.id, "H100-80GB:share:100", 50)
        .await
        .into_iter()
        .map(|(s, v)| {
            assert_eq!(s, 201, "{v}");
            v["state"].as_str().expect("state").to_owned()
        })
        .collect();
    let admitted = states.iter().filter(|s| *s == "queued").count();
    let over = states.iter().filter(|s| *s == "pending_approval").count();
    assert_eq!((admitted, over), (10, 40), "{states:?}");
    let (_, quotas) = a.get(&format!("/api/v1/teams/{}/quotas", t.id)).await;
    let line = quotas
        .as_array()
        .expect("quotas")
        .iter()
        .find(|q| q["model"] == "H100-80GB:shared")
        .cloned()
        .expect("the shared line");
    assert_eq!(line["used"], 1000, "{line}");
    // The whole-GPU line is another budget: a MIG slice is not a share.
    let (s, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 422, "no H100-80GB quota for slices: {v}");
}

/// An admin shares a simulated H100 with MPS; four 250-milli shares fill it, a fifth
/// waits saying why; a job on a share gets its MPS limits and only its GPU; the nodes
/// page shows the tenants (their teams to admins only).
async fn four_quarter_shares_fill_a_shared_gpu_and_a_fifth_waits_with_a_reason(db: Db) {
    let a = AdminClient::new(db).await;
    let name = format!("share-{}", format!("{db:?}").to_lowercase());
    let t = team(&a, &name).await;
    set_quota(&a, &t.id, "H100-80GB:shared", 2000, 2000, 2000).await;
    let host = format!("{name}-node");
    let agent = WorkloadAgent::start(&a, &host).await;
    let (node, gpu) = node_gpu(&a, &host).await;
    let (s, v) = set_sharing(&a, &node, &gpu, "mps").await;
    assert_eq!(s, 200, "{v}");
    let shared = wait_gpu(&a, &node, "the GPU never became a ready MPS GPU", |g| {
        g["sharing"]["ready"] == true
    })
    .await;
    assert_eq!(shared["sharing"]["method"], "mps", "{shared}");
    assert_eq!(shared["mig_enabled"], false, "{shared}");

    let mut ids = Vec::new();
    for _ in 0..4 {
        let (s, v) = request(&a.app, &t.member, &t.id, "H100-80GB:share:250").await;
        assert_eq!(s, 201, "{v}");
        ids.push(v["id"].as_str().expect("id").to_owned());
    }
    for id in &ids {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = alloc_state(&a.app, &t.member, id).await;
            if v["state"] == "active" {
                assert_eq!(v["devices"][0]["gpu_uuid"], gpu.as_str(), "{v}");
                break;
            }
            assert!(Instant::now() < deadline, "never active: {v}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    let (s, fifth) = request(&a.app, &t.member, &t.id, "H100-80GB:share:250").await;
    assert_eq!(s, 201, "{fifth}");
    let fifth_id = fifth["id"].as_str().expect("id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let waiting = loop {
        let v = alloc_state(&a.app, &t.member, &fifth_id).await;
        if v["pending"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("free on one shared GPU"))
        {
            break v;
        }
        assert!(Instant::now() < deadline, "no share reason: {v}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(waiting["state"], "queued", "{waiting}");

    // The nodes page: four quarters; whose, for the admin only.
    let full = wait_gpu(&a, &node, "the shares are not shown", |g| {
        g["sharing"]["used_milli"] == 1000
    })
    .await;
    let tenants = full["sharing"]["tenants"].as_array().expect("tenants");
    assert_eq!(tenants.len(), 4, "{full}");
    assert!(
        tenants
            .iter()
            .all(|x| x["milli"] == 250 && x["team"] == name.as_str())
    );
    let (_, as_member) = get_as(&a.app, &t.member, &format!("/api/v1/nodes/{node}")).await;
    let seen = &as_member["gpus"][0]["sharing"]["tenants"];
    assert!(
        seen.as_array()
            .is_some_and(|x| x.len() == 4 && x.iter().all(|t| t["team"].is_null())),
        "members see fractions, not teams: {seen}"
    );

    // A job on a share runs as an MPS client with its limits, on its GPU only.
    let text = gpu_environment(&a.app, &t.member, &ids[0]).await;
    for expected in [
        format!("CUDA_VISIBLE_DEVICES={gpu}"),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25".to_owned(),
        "TESSERA_GPU_SHARE_MILLI=250".to_owned(),
        "TESSERA_GPU_SHARE_METHOD=mps".to_owned(),
    ] {
        assert!(text.contains(&expected), "{expected} missing:\n{text}");
    }
    assert!(
        text.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0="),
        "{text}"
    );
    assert!(text.contains("CUDA_MPS_PIPE_DIRECTORY="), "{text}");

    // Releasing one share lets the fifth in.
    let (s, v) = call_with_token(
        &a.app,
        &t.member,
        Method::POST,
        &format!("/api/v1/allocations/{}/release", ids[1]),
        None,
    )
    .await;
    assert!(s == 200, "{s} {v}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = alloc_state(&a.app, &t.member, &fifth_id).await;
        if v["state"] == "active" {
            break;
        }
        assert!(Instant::now() < deadline, "the fifth never got in: {v}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    agent.stop().await;
}

/// A GPU's mode (shared or not) changes only while nothing holds it; members cannot
/// change it; an unknown method is a clear error.
async fn a_gpu_changes_mode_only_while_idle(db: Db) {
    let a = AdminClient::new(db).await;
    let name = format!("mode-{}", format!("{db:?}").to_lowercase());
    let t = team(&a, &name).await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let host = format!("{name}-node");
    let agent = WorkloadAgent::start(&a, &host).await;
    let (node, gpu) = node_gpu(&a, &host).await;
    let path = format!("/api/v1/nodes/{node}/gpus/{gpu}/sharing");
    let (s, v) = put_as(&a.app, &t.member, &path, json!({"sharing": "mps"})).await;
    assert_eq!(s, 403, "{v}");
    let (s, v) = set_sharing(&a, &node, &gpu, "fractional").await;
    assert_eq!(
        (s, v["error"]["field"].as_str()),
        (422, Some("sharing")),
        "{v}"
    );
    // A slice on it: the GPU is in use.
    let (s, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let slice = v["id"].as_str().expect("id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    while alloc_state(&a.app, &t.member, &slice).await["state"] != "active" {
        assert!(Instant::now() < deadline, "the slice never became active");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (s, v) = set_sharing(&a, &node, &gpu, "time_slice").await;
    assert_eq!(s, 409, "{v}");
    assert!(v["message"].as_str().unwrap_or("").contains("idle"), "{v}");
    // Released: now it may be shared, and the agent is told so.
    let (s, _) = call_with_token(
        &a.app,
        &t.member,
        Method::POST,
        &format!("/api/v1/allocations/{slice}/release"),
        None,
    )
    .await;
    assert_eq!(s, 200);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (s, v) = set_sharing(&a, &node, &gpu, "time_slice").await;
        if s == 200 {
            assert_eq!(v["gpus"][0]["sharing"]["method"], "time_slice", "{v}");
            break;
        }
        assert_eq!(s, 409, "{v}");
        assert!(Instant::now() < deadline, "never idle: {v}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    wait_gpu(&a, &node, "time-slicing never ready", |g| {
        g["sharing"]["ready"] == true && g["mig_enabled"] == false
    })
    .await;
    // A MIG layout on a shared GPU is refused; unsharing makes it whole again.
    let (s, v) = a
        .call(
            Method::PUT,
            &format!("/api/v1/nodes/{node}/gpus/{gpu}/layout"),
            Some(json!({"mode": "enabled", "layout": []})),
        )
        .await;
    assert_eq!(s, 409, "{v}");
    let (s, v) = set_sharing(&a, &node, &gpu, "off").await;
    assert_eq!(s, 200, "{v}");
    assert!(v["gpus"][0]["sharing"].is_null(), "{v}");
    agent.stop().await;
}

/// A 250-milli share is billed a quarter of the whole GPU's price, to the cent, and the
/// chargeback export names the share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_is_billed_pro_rata() {
    let a = AdminClient::new(Db::Sqlite).await;
    let t = team(&a, "prorata").await;
    let team_id = Uuid::parse_str(&t.id).expect("team");
    let user = member_id(&a, &t.id).await;
    let (s, system, store) = services(&a.app).await;
    let h = next_hour();
    // A whole H100 at 7.00/h: a quarter share costs 1.75/h.
    set_rate(&a, "H100-80GB:whole", 700, 50, h).await;
    history(
        &store,
        team_id,
        user,
        "H100-80GB:share:250",
        1,
        250,
        "normal",
        h,
        Some(h + TimeDelta::hours(2)),
    )
    .await;
    let now = h + TimeDelta::hours(3);
    let r = s.billing.meter(&system, now, None).await.expect("meter");
    assert_eq!(r.hours, 2, "{r:?}");
    let team = tessera_domain::ids::TeamId(team_id);
    let charged = store
        .team_charges(Some(team), h - TimeDelta::days(1), now + TimeDelta::days(1))
        .await
        .expect("charges");
    assert_eq!(charged, vec![(team, 350)], "2 h × 1.75");
    let admin = a.token().await;
    let q = format!(
        "from={}&to={}",
        h.format("%Y-%m-%d"),
        (now + TimeDelta::days(1)).format("%Y-%m-%d")
    );
    let (st, rows, total) = chargeback(&a.app, &admin, &q).await;
    assert_eq!(st, 200);
    assert_eq!(total, 350);
    assert!(
        rows.iter().all(|r| r.iter().any(|f| f == "share:250")
            && r.iter().any(|f| f == "GPU share")
            && r.iter().any(|f| f.contains("25% share of H100-80GB"))),
        "{rows:?}"
    );
}

/// A T4 has no MIG: it is handed out whole or shared. Shared by time-slicing, two halves
/// fill it; a job on one gets its fraction and no MPS variables.
async fn a_gpu_without_mig_is_shared_by_time_slicing(db: Db) {
    let a = AdminClient::new(db).await;
    let name = format!("t4-{}", format!("{db:?}").to_lowercase());
    let t = team(&a, &name).await;
    set_quota(&a, &t.id, "T4-16GB:shared", 1000, 1000, 1000).await;
    let (s, jt) = a.post("/api/v1/join-tokens", json!({"note": "t4"})).await;
    assert_eq!(s, 201, "{jt}");
    let host = format!("{name}-node");
    let agent = WorkloadAgent::start_with(
        &a.app.base,
        jt["secret"].as_str().expect("secret"),
        &host,
        &[],
        &["--gpus".into(), "T4-16GB".into()],
    );
    // The test agent always has an H100; the T4 comes second.
    let (node, _) = node_gpu(&a, &host).await;
    let t4 = wait_gpu_at(&a, &node, 1, "the T4 never reported", |g| {
        g["model"] == "T4-16GB"
    })
    .await;
    assert!(t4["mig_enabled"].is_null(), "no MIG on a T4: {t4}");
    let gpu = t4["uuid"].as_str().expect("uuid").to_owned();
    // A MIG slice of a T4 does not exist.
    let (s, v) = request(&a.app, &t.member, &t.id, "T4-16GB:1g.5gb").await;
    assert_eq!(s, 422, "{v}");
    let (s, v) = set_sharing(&a, &node, &gpu, "time_slice").await;
    assert_eq!(s, 200, "{v}");
    wait_gpu_at(&a, &node, 1, "the T4 never became ready", |g| {
        g["sharing"]["ready"] == true
    })
    .await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (s, v) = request(&a.app, &t.member, &t.id, "T4-16GB:share:500").await;
        assert_eq!(v["units"], 500, "{v}");
        assert_eq!(s, 201, "{v}");
        ids.push(v["id"].as_str().expect("id").to_owned());
    }
    for id in &ids {
        let deadline = Instant::now() + Duration::from_secs(60);
        while alloc_state(&a.app, &t.member, id).await["state"] != "active" {
            assert!(Instant::now() < deadline, "the half never became active");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    let text = gpu_environment(&a.app, &t.member, &ids[0]).await;
    assert!(text.contains("TESSERA_GPU_SHARE_MILLI=500"), "{text}");
    assert!(
        text.contains("TESSERA_GPU_SHARE_METHOD=time_slice"),
        "{text}"
    );
    assert!(
        text.contains("TESSERA_GPU_MEMORY_MIB=7680"),
        "half of 15360 MiB: {text}"
    );
    assert!(
        !text.contains("CUDA_MPS_"),
        "no MPS under time-slicing: {text}"
    );
    agent.stop().await;
}
