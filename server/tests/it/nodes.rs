//! Nodes: join tokens, registration with a real `tessera-agent` process, heartbeats,
//! revocation, desired MIG layouts applied by the agent, and telemetry ingestion.

use crate::on_both_databases;
use crate::support::{AdminClient, Db, TestApp, sim_agent};
use serde_json::{Value, json};
use std::time::Duration;
use tessera_domain::wire::{
    GpuInfo, Heartbeat, Inventory, MigMode, MigModeState, RegisterResponse, TelemetryBatch,
    TelemetrySample,
};

/// Registers a node through the agent API; returns (node id, credential).
pub async fn register(app: &TestApp, join_token: &str, hostname: &str) -> (String, String) {
    let r = try_register(app, join_token, hostname).await;
    assert_eq!(r.status(), 200, "register");
    let body: RegisterResponse = r.json().await.expect("json");
    (body.node_id, body.credential)
}

async fn try_register(app: &TestApp, join_token: &str, hostname: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(app.url("/agent/v1/register"))
        .json(&json!({"join_token": join_token, "hostname": hostname, "agent_version": "test"}))
        .send()
        .await
        .expect("request")
}

/// Reports one MIG-enabled H100 (no instances).
pub async fn heartbeat(app: &TestApp, credential: &str, gpu_uuid: &str) -> reqwest::Response {
    let hb = Heartbeat {
        at_unix_ms: 0,
        agent_version: "test".into(),
        manages_mig: true,
        workload_sandbox: true,
        inventory: Inventory {
            gpus: vec![GpuInfo {
                index: 0,
                uuid: gpu_uuid.into(),
                name: "NVIDIA H100 80GB HBM3".into(),
                memory_mib: 81_559,
                mig_mode: Some(MigModeState {
                    current: MigMode::Enabled,
                    pending: MigMode::Enabled,
                }),
                profiles: vec![],
                profiles_error: None,
                health: None,
                sharing: None,
                instances: vec![],
            }],
            driver: None,
        },
    };
    reqwest::Client::new()
        .post(app.url("/agent/v1/heartbeat"))
        .bearer_auth(credential)
        .json(&hb)
        .send()
        .await
        .expect("request")
}

pub(crate) async fn join_token(a: &AdminClient, max_uses: u32) -> (String, String) {
    let (s, v) = a
        .post(
            "/api/v1/join-tokens",
            json!({"note": "test", "max_uses": max_uses}),
        )
        .await;
    assert_eq!(s, 201);
    (
        v["token"]["id"].as_str().expect("id").to_owned(),
        v["secret"].as_str().expect("secret").to_owned(),
    )
}

on_both_databases!(
    join_tokens_are_limited_use_and_expire,
    revoked_nodes_and_bad_credentials_are_rejected,
    a_real_agent_registers_reports_and_applies_a_layout,
    telemetry_is_deduplicated_and_acknowledged,
    telemetry_survives_a_server_restart,
    invalid_layouts_are_rejected_with_the_reason,
);

async fn join_tokens_are_limited_use_and_expire(db: Db) {
    let a = AdminClient::new(db).await;
    let (_, single) = join_token(&a, 1).await;
    register(&a.app, &single, "n1").await;
    assert_eq!(
        try_register(&a.app, &single, "n2").await.status(),
        401,
        "reuse refused"
    );
    assert_eq!(
        try_register(&a.app, "tsj_made_up", "n3").await.status(),
        401
    );

    let (id, revoked) = join_token(&a, 5).await;
    let (s, _) = a.delete(&format!("/api/v1/join-tokens/{id}")).await;
    assert_eq!(s, 204);
    assert_eq!(
        try_register(&a.app, &revoked, "n4").await.status(),
        401,
        "revoked refused"
    );

    let (id, expiring) = join_token(&a, 5).await;
    expire_join_token(&a.app, &id).await;
    assert_eq!(
        try_register(&a.app, &expiring, "n5").await.status(),
        401,
        "expired refused"
    );
    let (_, list) = a.get("/api/v1/join-tokens").await;
    assert_eq!(list["total"], 3);
}

/// Moves a join token's expiry into the past (tests cannot wait an hour).
async fn expire_join_token(app: &TestApp, id: &str) {
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("connect");
    let id = uuid::Uuid::parse_str(id).expect("uuid");
    let past = chrono::Utc::now() - chrono::Duration::hours(1);
    // One statement for either pool (their types differ).
    macro_rules! expire {
        ($pool:expr) => {
            sqlx::query("UPDATE join_tokens SET expires_at = $1 WHERE id = $2")
                .bind(past)
                .bind(id)
                .execute($pool)
                .await
                .map(|_| ())
        };
    }
    match &store {
        tessera_core::store::Store::Sqlite(p) => expire!(p),
        tessera_core::store::Store::Postgres(p) => expire!(p),
    }
    .expect("update");
}

async fn revoked_nodes_and_bad_credentials_are_rejected(db: Db) {
    let a = AdminClient::new(db).await;
    let (_, jt) = join_token(&a, 1).await;
    let (node, cred) = register(&a.app, &jt, "n1").await;
    assert_eq!(heartbeat(&a.app, &cred, "GPU-1").await.status(), 204);
    assert_eq!(heartbeat(&a.app, "tsn_wrong", "GPU-1").await.status(), 401);
    let no_auth = reqwest::Client::new()
        .get(a.app.url("/agent/v1/desired"))
        .send()
        .await
        .expect("req");
    assert_eq!(no_auth.status(), 401);
    let (_, view) = a.get(&format!("/api/v1/nodes/{node}")).await;
    assert_eq!(view["online"], true);
    assert_eq!(view["gpus"][0]["model"], "H100-80GB");
    let (s, view) = a
        .call(
            reqwest::Method::POST,
            &format!("/api/v1/nodes/{node}/revoke"),
            None,
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        (view["revoked"].clone(), view["online"].clone()),
        (json!(true), json!(false))
    );
    assert_eq!(
        heartbeat(&a.app, &cred, "GPU-1").await.status(),
        401,
        "revoked node refused"
    );
    let (_, summary) = a.get("/api/v1/cluster/summary").await;
    assert_eq!(summary["nodes_total"], 0, "revoked nodes leave the summary");
}

async fn telemetry_is_deduplicated_and_acknowledged(db: Db) {
    let a = AdminClient::new(db).await;
    let (_, jt) = join_token(&a, 1).await;
    let (node, cred) = register(&a.app, &jt, "n1").await;
    let sample = |seq: u64| TelemetrySample {
        seq,
        at_unix_ms: 1_700_000_000_000 + seq as i64 * 10_000,
        gpus: vec![],
    };
    let post = |samples: Vec<TelemetrySample>| {
        let cred = cred.clone();
        let url = a.app.url("/agent/v1/telemetry");
        async move {
            let r = reqwest::Client::new()
                .post(url)
                .bearer_auth(cred)
                .json(&TelemetryBatch {
                    samples,
                    dropped_total: 2,
                })
                .send()
                .await
                .expect("req");
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.expect("json")["acked_through"]
                .as_u64()
                .expect("ack")
        }
    };
    assert_eq!(post((1..=5).map(sample).collect()).await, 5);
    // A resend after a lost ack overlaps what is stored: stored once, acked again.
    assert_eq!(post((3..=8).map(sample).collect()).await, 8);
    let store = tessera_core::store::Store::connect(&a.app.database_url)
        .await
        .expect("db");
    let n = store
        .count_samples(tessera_domain::ids::NodeId::parse(&node).expect("uuid"))
        .await
        .expect("count");
    assert_eq!(n, 8);
    let bad = reqwest::Client::new()
        .post(a.app.url("/agent/v1/telemetry"))
        .bearer_auth(&cred)
        .json(&TelemetryBatch {
            samples: vec![sample(0)],
            dropped_total: 0,
        })
        .send()
        .await
        .expect("req");
    assert_eq!(bad.status(), 422, "seq 0 is refused");
}

async fn invalid_layouts_are_rejected_with_the_reason(db: Db) {
    let a = AdminClient::new(db).await;
    let (_, jt) = join_token(&a, 1).await;
    let (node, cred) = register(&a.app, &jt, "n1").await;
    heartbeat(&a.app, &cred, "GPU-h").await;
    let path = format!("/api/v1/nodes/{node}/gpus/GPU-h/layout");
    let (s, v) = a
        .call(
            reqwest::Method::PUT,
            &path,
            Some(json!({"mode": "enabled", "layout": [
            {"profile": "3g.40gb", "start": 0}, {"profile": "2g.20gb", "start": 2}]})),
        )
        .await;
    assert_eq!(s, 422, "{v}");
    assert_eq!(v["error"]["field"], "layout");
    assert!(
        v["message"].as_str().expect("msg").contains("2g.20gb@2"),
        "{v}"
    );
    let (s, _) = a
        .call(
            reqwest::Method::PUT,
            &format!("/api/v1/nodes/{node}/gpus/GPU-none/layout"),
            Some(json!({"mode": "disabled"})),
        )
        .await;
    assert_eq!(s, 404);
    let (s, _) = a
        .call(
            reqwest::Method::PUT,
            &path,
            Some(json!({"mode": "enabled", "layout": [{"profile": "1g.10gb", "start": 0}]})),
        )
        .await;
    assert_eq!(s, 200);
    let r = reqwest::Client::new()
        .get(a.app.url("/agent/v1/desired"))
        .bearer_auth(&cred)
        .send()
        .await
        .expect("req");
    let desired: Value = r.json().await.expect("json");
    assert_eq!(desired["gpus"][0]["version"], 1);
    assert_eq!(desired["gpus"][0]["layout"][0]["profile"], "1g.10gb");
}

async fn a_real_agent_registers_reports_and_applies_a_layout(db: Db) {
    let a = AdminClient::new(db).await;
    let (_, jt) = join_token(&a, 1).await;
    let state = tempfile::tempdir().expect("tempdir");
    let mut agent = sim_agent(
        &a.app.base,
        "H100-80GB,A100-SXM4-40GB",
        "gpu-box-1",
        state.path(),
    )
    .args([
        "--join-token",
        &jt,
        "--manage-mig",
        "--telemetry-interval-s",
        "1",
    ])
    .spawn()
    .expect("start tessera-agent");

    let node = wait_for(&a, |nodes| {
        let n = nodes["items"].as_array()?.first()?;
        (n["gpus"].as_array()?.len() == 2).then(|| n.clone())
    })
    .await;
    assert_eq!(node["hostname"], "gpu-box-1");
    assert_eq!(node["manages_mig"], true);
    // The real agent (root, crun) reports its sandbox on.
    assert_eq!(node["workload_sandbox"], true, "{node}");
    let h100 = node["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .find(|g| g["model"] == "H100-80GB")
        .expect("an H100")
        .clone();
    let node_id = node["id"].as_str().expect("id");
    let gpu = h100["uuid"].as_str().expect("uuid");

    // The admin asks for a mixed layout; the agent enables MIG (immediate on Hopper) and
    // creates the instances at the given placements.
    let (s, v) = a
        .call(
            reqwest::Method::PUT,
            &format!("/api/v1/nodes/{node_id}/gpus/{gpu}/layout"),
            Some(json!({"mode": "enabled", "layout": [
                {"profile": "3g.40gb", "start": 0}, {"profile": "2g.20gb", "start": 4},
                {"profile": "1g.10gb", "start": 6}]})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let gpu_view = wait_for(&a, |nodes| {
        let g = nodes["items"][0]["gpus"]
            .as_array()?
            .iter()
            .find(|g| g["uuid"] == gpu)?;
        (g["instances"].as_array()?.len() == 3).then(|| g.clone())
    })
    .await;
    assert_eq!(gpu_view["mig_enabled"], true);
    let mut placed: Vec<(String, u64)> = gpu_view["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .map(|i| {
            (
                i["profile"].as_str().expect("p").to_owned(),
                i["start"].as_u64().expect("s"),
            )
        })
        .collect();
    placed.sort();
    assert_eq!(
        placed,
        vec![
            ("1g.10gb".into(), 6),
            ("2g.20gb".into(), 4),
            ("3g.40gb".into(), 0)
        ]
    );
    for i in gpu_view["instances"].as_array().expect("instances") {
        assert!(
            i["uuid"].as_str().is_some_and(|u| u.starts_with("MIG-")),
            "{i}"
        );
    }

    // The agent reports success for this version; telemetry arrives for both GPUs.
    let applied = wait_for(&a, |nodes| {
        let g = nodes["items"][0]["gpus"]
            .as_array()?
            .iter()
            .find(|g| g["uuid"] == gpu)?;
        (g["desired"]["state"] == "success").then(|| g["desired"].clone())
    })
    .await;
    assert_eq!(applied["version"], 1);
    assert_eq!(
        applied["layout"],
        json!(["3g.40gb@0", "2g.20gb@4", "1g.10gb@6"])
    );
    // Telemetry arrives for both GPUs; once the H100's samples show its three MIG devices,
    // whole-GPU utilization is reported as unavailable rather than invented.
    let mut last = Value::Null;
    for _ in 0..100 {
        let (_, t) = a
            .get(&format!("/api/v1/nodes/{node_id}/telemetry?limit=5"))
            .await;
        let series = t["gpus"].as_array().cloned().unwrap_or_default();
        if series.len() == 2
            && let Some(p) = series
                .iter()
                .find(|s| s["gpu_uuid"] == gpu)
                .and_then(|s| s["points"].as_array()?.last().cloned())
            && p["mig_devices"] == 3
        {
            last = p;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        last["memory_total_mib"]
            .as_u64()
            .is_some_and(|m| m > 80_000),
        "{last}"
    );
    assert!(
        last["utilization_pct"].is_null(),
        "no whole-GPU utilization with MIG on: {last}"
    );

    // The credential survives an agent restart (no join token needed the second time).
    agent.kill().await.expect("kill");
    let mut again = sim_agent(
        &a.app.base,
        "H100-80GB,A100-SXM4-40GB",
        "gpu-box-1",
        state.path(),
    )
    .spawn()
    .expect("restart tessera-agent");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_, nodes) = a.call(reqwest::Method::GET, "/api/v1/nodes", None).await;
    assert_eq!(nodes["total"], 1, "the restarted agent is the same node");
    let _ = again.kill().await;
}

/// Polls the node list until `pick` finds what it wants (agents report every second).
async fn wait_for(a: &AdminClient, pick: impl Fn(&Value) -> Option<Value>) -> Value {
    for _ in 0..150 {
        let (_, nodes) = a.call(reqwest::Method::GET, "/api/v1/nodes", None).await;
        if let Some(v) = pick(&nodes) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, nodes) = a.call(reqwest::Method::GET, "/api/v1/nodes", None).await;
    panic!("timed out; nodes: {nodes}");
}

/// A real agent keeps sampling while the server is down (spooling to disk) and resends
/// after it is back: every sequence number arrives exactly once.
async fn telemetry_survives_a_server_restart(db: Db) {
    let mut a = AdminClient::new(db).await;
    let (_, jt) = join_token(&a, 1).await;
    let state = tempfile::tempdir().expect("tempdir");
    let mut agent = sim_agent(&a.app.base, "H100-80GB", "spooler", state.path())
        .args(["--join-token", &jt, "--telemetry-interval-s", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start tessera-agent");
    let store = tessera_core::store::Store::connect(&a.app.database_url)
        .await
        .expect("db");
    let node = wait_for(&a, |nodes| {
        nodes["items"][0]["id"].as_str().map(|s| json!(s))
    })
    .await;
    let node = tessera_domain::ids::NodeId::parse(node.as_str().expect("id")).expect("uuid");
    let count = || async { store.count_samples(node).await.expect("count") };
    while count().await < 2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.app.stop().await;
    let before = count().await;
    // The agent samples into its spool while the server is away.
    tokio::time::sleep(Duration::from_secs(4)).await;
    a.app.start_again().await;
    let mut seqs = Vec::new();
    for _ in 0..100 {
        let rows = store.recent_samples(node, 1000).await.expect("samples");
        seqs = rows.iter().map(|r| r.seq).collect::<Vec<_>>();
        if seqs.len() as i64 >= before + 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = agent.kill().await;
    assert!(
        seqs.len() as i64 >= before + 4,
        "samples from the outage arrived: {seqs:?}"
    );
    let expected: Vec<i64> = (1..=seqs.len() as i64).collect();
    assert_eq!(
        seqs, expected,
        "every sequence number exactly once, no gaps"
    );
}
