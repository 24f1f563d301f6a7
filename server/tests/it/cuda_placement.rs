//! Placement knows the driver (issue 36): an allocation that needs a CUDA version goes only
//! to a node whose reported driver supports it, waits with the reason while none does, and
//! places once one joins or a node's driver is upgraded (its next heartbeat).

use crate::allocations::{set_quota, team};
use crate::on_both_databases;
use crate::support::{AdminClient, Db, TestApp, call_with_token, post_as};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::Duration;
use tessera_domain::image::CudaVersion;
use tessera_domain::wire::{DriverInfo, GpuInfo, Heartbeat, Inventory, MigMode, MigModeState};

on_both_databases!(
    a_need_waits_for_a_new_enough_driver_and_places_when_one_comes,
    a_bad_cuda_need_is_refused_naming_the_field,
);

const OLD: &str = "535.104.05";

fn driver(version: &str, cuda: &str) -> Option<DriverInfo> {
    Some(DriverInfo {
        version: version.into(),
        cuda: CudaVersion::parse(cuda).expect("cuda"),
    })
}

/// A fake node (registered through the agent API) with one H100 handed out whole (MIG off).
struct FakeNode {
    credential: String,
    gpu: String,
}

impl FakeNode {
    async fn join(a: &AdminClient, hostname: &str, driver: Option<DriverInfo>) -> FakeNode {
        let (_, secret) = crate::nodes::join_token(a, 1).await;
        let (_, credential) = crate::nodes::register(&a.app, &secret, hostname).await;
        let node = FakeNode {
            credential,
            gpu: format!("GPU-{hostname}-0"),
        };
        node.heartbeat(&a.app, driver).await;
        node
    }

    /// Reports the node's GPU and `driver`.
    async fn heartbeat(&self, app: &TestApp, driver: Option<DriverInfo>) {
        let off = MigModeState {
            current: MigMode::Disabled,
            pending: MigMode::Disabled,
        };
        let hb = Heartbeat {
            at_unix_ms: 0,
            agent_version: "test".into(),
            manages_mig: false,
            workload_sandbox: true,
            inventory: Inventory {
                gpus: vec![GpuInfo {
                    index: 0,
                    uuid: self.gpu.clone(),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    memory_mib: 81_559,
                    mig_mode: Some(off),
                    profiles: vec![],
                    profiles_error: None,
                    health: None,
                    sharing: None,
                    instances: vec![],
                }],
                driver,
            },
        };
        let r = reqwest::Client::new()
            .post(app.url("/agent/v1/heartbeat"))
            .bearer_auth(&self.credential)
            .json(&hb)
            .send()
            .await
            .expect("request");
        assert!(r.status().is_success(), "heartbeat: {}", r.status());
    }
}

async fn ask(a: &AdminClient, token: &str, team: &str, need: Option<&str>) -> Value {
    let mut body = json!({"team_id": team, "kind": "H100-80GB:whole", "purpose": "cuda"});
    if let Some(n) = need {
        body["needs_cuda"] = json!(n);
    }
    let (s, v) = post_as(&a.app, token, "/api/v1/allocations", body).await;
    assert_eq!(s, 201, "{v}");
    v
}

async fn get(a: &AdminClient, id: &str) -> Value {
    let (s, v) = a.get(&format!("/api/v1/allocations/{id}")).await;
    assert_eq!(s, 200, "{v}");
    v
}

/// Waits until `id` is placed (past `queued`) and returns the hostname it went to.
async fn placed_on(a: &AdminClient, id: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let v = get(a, id).await;
        if v["state"] != "queued" {
            assert!(
                matches!(v["state"].as_str(), Some("placing" | "active")),
                "{v}"
            );
            return v["devices"][0]["hostname"]
                .as_str()
                .expect("hostname")
                .to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "never placed: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `id`'s reason says `text`, checking it stays queued all along.
async fn waits_saying(a: &AdminClient, id: &str, text: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let v = get(a, id).await;
        assert_eq!(v["state"], "queued", "{v}");
        if v["pending"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains(text))
        {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "reason never said {text:?}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn a_need_waits_for_a_new_enough_driver_and_places_when_one_comes(db: Db) {
    let app = TestApp::spawn_with(db, |c| {
        c.scheduler_interval = Duration::from_millis(300);
    })
    .await;
    let a = AdminClient::with_app(app).await;
    let t = team(&a, "cuda").await;
    set_quota(&a, &t.id, "H100-80GB", 21, 21, 21).await;
    let old = FakeNode::join(&a, "old", driver(OLD, "12.2")).await;

    // Only a CUDA 12.2 driver in the cluster: a 12.4 need waits, and says why.
    let needy = ask(&a, &t.member, &t.id, Some("12.4")).await;
    assert_eq!(needy["needs_cuda"], "12.4", "{needy}");
    let needy = needy["id"].as_str().expect("id").to_owned();
    let v = waits_saying(
        &a,
        &needy,
        "Needs CUDA ≥ 12.4; nodes with free H100-80GB run driver 535.104.05 (CUDA 12.2)",
    )
    .await;
    assert_eq!(v["pending"]["position"], 1, "{v}");
    // Several passes later it still waits (the reason is not a first-pass accident).
    tokio::time::sleep(Duration::from_secs(1)).await;
    old.heartbeat(&a.app, driver(OLD, "12.2")).await;
    waits_saying(&a, &needy, "driver 535.104.05 (CUDA 12.2)").await;

    // A node with a new enough driver joins: it goes there.
    let _new = FakeNode::join(&a, "new", driver("550.54.15", "12.4")).await;
    assert_eq!(placed_on(&a, &needy).await, "new");

    // A request that needs nothing goes to the old node.
    let plain = ask(&a, &t.member, &t.id, None).await;
    assert!(plain.get("needs_cuda").is_none(), "{plain}");
    let plain = plain["id"].as_str().expect("id").to_owned();
    assert_eq!(placed_on(&a, &plain).await, "old");

    // A node that reports no driver is unknown: not chosen for a need, and said so.
    let quiet = FakeNode::join(&a, "quiet", None).await;
    let later = ask(&a, &t.member, &t.id, Some("12.4")).await;
    let later = later["id"].as_str().expect("id").to_owned();
    waits_saying(&a, &later, "report no driver").await;
    // Its driver is upgraded (or now read): the next heartbeat places it.
    quiet.heartbeat(&a.app, driver("560.35.03", "12.6")).await;
    assert_eq!(placed_on(&a, &later).await, "quiet");
}

async fn a_bad_cuda_need_is_refused_naming_the_field(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "badcuda").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    for bad in ["twelve", "12", "0.1", "12.4.1.0"] {
        let body = json!({"team_id": t.id, "kind": "H100-80GB:whole", "needs_cuda": bad});
        let (s, v) = post_as(&a.app, &t.member, "/api/v1/allocations", body).await;
        assert_eq!(s, 422, "{bad}: {v}");
        assert_eq!(v["error"]["field"], "needs_cuda", "{v}");
    }
    let (_, list) =
        call_with_token(&a.app, &t.member, Method::GET, "/api/v1/allocations", None).await;
    assert_eq!(list["total"], 0, "nothing stored");
    // The need changes nothing about who may ask: another team's member is refused as
    // before (the team is not theirs to see).
    let other = team(&a, "stranger").await;
    let body = json!({"team_id": t.id, "kind": "H100-80GB:whole", "needs_cuda": "12.4"});
    let (s, v) = post_as(&a.app, &other.member, "/api/v1/allocations", body).await;
    assert_eq!(s, 404, "{v}");
}
