//! Multi-node (gang) jobs, issue 42: one job on several simulated nodes, each member in
//! its own sandbox and network, started together with the launch environment, reaching
//! each other over TCP; one outcome for the whole gang; all-or-nothing placement (two
//! gangs that each need most of the nodes never both hold part). Three real
//! `tessera-agent --simulate` processes on this host, one H100 each, with workload ranges
//! of their own (members of different nodes reach each other through the host).

use crate::allocations::{set_quota, team, used};
use crate::on_both_databases;
use crate::support::{AdminClient, Db, TestApp, call_with_token, get_as, put_as, tessera_ok};
use crate::workloads::{WorkloadAgent, get, wait_workload};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

on_both_databases!(a_gang_job_runs_on_several_nodes_as_one_job);

pub(crate) async fn post_job(app: &TestApp, token: &str, body: Value) -> (u16, Value) {
    call_with_token(app, token, Method::POST, "/api/v1/jobs", Some(body)).await
}

pub(crate) async fn log(app: &TestApp, token: &str, id: &str, rank: u32) -> (u16, String) {
    let (s, v) = call_with_token(
        app,
        token,
        Method::GET,
        &format!("/api/v1/workloads/{id}/logs?from=0&rank={rank}"),
        None,
    )
    .await;
    (s, v["text"].as_str().unwrap_or_default().to_owned())
}

/// Rank 0 listens on `MASTER_PORT`; every other rank connects to `MASTER_ADDR` and says
/// who it is; both print what they heard (proof that the members reach each other).
const RENDEZVOUS: &str = r#"echo "rank=$RANK world=$WORLD_SIZE node_rank=$NODE_RANK master=$MASTER_ADDR:$MASTER_PORT jax=$JAX_COORDINATOR_ADDRESS/$JAX_NUM_PROCESSES/$JAX_PROCESS_ID"
echo "hostfile:"; cat "$TESSERA_HOSTFILE"
/usr/bin/python3 - <<'PY'
import os, socket, time
rank = int(os.environ["RANK"]); master = os.environ["MASTER_ADDR"]; port = int(os.environ["MASTER_PORT"])
if rank == 0:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(); s.settimeout(60)
    c, _ = s.accept(); print("rank0 heard:", c.recv(100).decode()); c.sendall(b"welcome")
else:
    for _ in range(300):
        try:
            c = socket.create_connection((master, port), timeout=2); break
        except OSError:
            time.sleep(0.2)
    c.sendall(("hello from rank %d" % rank).encode()); print("rank%d heard:" % rank, c.recv(100).decode())
PY"#;

async fn a_gang_job_runs_on_several_nodes_as_one_job(db: Db) {
    let name = format!("gang-{}", format!("{db:?}").to_lowercase());
    let a = AdminClient::new(db).await;
    let app = &a.app;
    let t = team(&a, &name).await;
    // Three nodes of 7 units each; a limit above that, so that a second gang waits for
    // capacity, not for approval.
    set_quota(&a, &t.id, "H100-80GB", 21, 28, 28).await;
    let o = team(&a, &format!("{name}-other")).await;
    // Ranges of their own for each store's run (the two run at once on this host).
    let net = if matches!(db, Db::Sqlite) { 214 } else { 215 };
    let mut agents = Vec::new();
    for i in 1..=3 {
        let (s, jt) = a.post("/api/v1/join-tokens", json!({"note": "gang"})).await;
        assert_eq!(s, 201, "{jt}");
        agents.push(WorkloadAgent::start_with(
            &app.base,
            jt["secret"].as_str().expect("secret"),
            &format!("{name}-n{i}"),
            &[],
            &["--sandbox-net".into(), format!("10.{net}.{i}.0/24")],
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (_, nodes) = a.call(Method::GET, "/api/v1/nodes", None).await;
        let online = nodes["items"]
            .as_array()
            .or_else(|| nodes.as_array())
            .map(|n| {
                n.iter()
                    .filter(|n| n["hostname"].as_str().is_some_and(|h| h.starts_with(&name)))
                    .filter(|n| n["gpus"].as_array().is_some_and(|g| !g.is_empty()))
                    .count()
            })
            .unwrap_or(0);
        if online == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "three nodes never reported: {nodes}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Bad input: a 422 naming the field, and nothing queued.
    for (body, field) in [
        (
            json!({"command": "true", "gpu": "H100-80GB:whole", "nodes": 0}),
            "nodes",
        ),
        (
            json!({"command": "true", "gpu": "H100-80GB:whole", "nodes": 65}),
            "nodes",
        ),
        (
            json!({"command": "true", "gpu": "H100-80GB:whole", "nodes": 2, "gpus_per_node": 2}),
            "gpus_per_node",
        ),
        (
            json!({"command": "true", "gpu": "H100-80GB:share:250", "nodes": 2}),
            "nodes",
        ),
        (
            json!({"command": "true", "gpu": "H100-80GB:whole", "launcher": "rank0"}),
            "launcher",
        ),
        (
            json!({"command": "true", "gpu": "H100-80GB:whole", "nodes": 2, "launcher": "srun"}),
            "launcher",
        ),
        (
            json!({"command": "true", "gpu": "H100-80GB:whole", "nodes": 2, "ranks": "per_core"}),
            "ranks",
        ),
        (
            json!({"command": "true", "gpu": "H100-80GB:whole", "nodes": 2,
                   "launcher": "rank0", "ranks": "per_gpu"}),
            "ranks",
        ),
        (
            json!({"command": "true", "gpu": "H100-80GB:whole", "ranks": "per_gpu"}),
            "ranks",
        ),
        (
            json!({"command": "true", "gpu": "H100-80GB:whole", "nodes": 2, "retries": 9}),
            "retries",
        ),
        (json!({"command": "true", "nodes": 2}), "nodes"),
        (
            json!({"command": "true", "gpu": "H100-80GB:whole", "nodez": 2}),
            "nodez",
        ),
    ] {
        let (s, v) = post_job(app, &t.member, body.clone()).await;
        assert_eq!(s, 422, "{body}: {v}");
        assert_eq!(v["error"]["field"], field, "{body}: {v}");
    }
    let (s, v) = call_with_token(
        app,
        &t.member,
        Method::POST,
        "/api/v1/notebooks",
        Some(json!({"name": "wide", "gpu": "H100-80GB:whole", "nodes": 2})),
    )
    .await;
    assert_eq!(s, 422, "{v}");
    assert_eq!(v["error"]["field"], "nodes", "{v}");
    assert_eq!(
        used(&a, &t.id, "H100-80GB").await,
        0,
        "nothing was admitted"
    );

    // A gang of 2 × 1 whole H100: one job, both members started together, reaching
    // each other.
    let (s, job) = post_job(
        app,
        &t.member,
        json!({"command": RENDEZVOUS, "name": "rendezvous", "gpu": "H100-80GB:whole",
               "nodes": 2, "gpus_per_node": 1, "time_limit_minutes": 30}),
    )
    .await;
    assert_eq!(s, 201, "{job}");
    let id = job["id"].as_str().expect("id").to_owned();
    let (s, alloc) = a
        .call(
            Method::GET,
            &format!(
                "/api/v1/allocations/{}",
                job["allocation_id"].as_str().expect("alloc")
            ),
            None,
        )
        .await;
    assert_eq!(s, 200, "{alloc}");
    assert_eq!(
        (&alloc["count"], &alloc["nodes"]),
        (&json!(2), &json!(2)),
        "{alloc}"
    );
    wait_workload(app, &t.member, &id, "succeeded", 180).await;
    // Under `each`, rank 0 may finish first; the others finish on their own.
    let done = ranks_ended(app, &t.member, &id).await;
    let ranks = done["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 2, "{done}");
    let hosts: std::collections::BTreeSet<&str> = ranks
        .iter()
        .filter_map(|r| r["hostname"].as_str())
        .collect();
    assert_eq!(hosts.len(), 2, "two distinct nodes: {done}");
    let addrs: Vec<&str> = ranks.iter().filter_map(|r| r["addr"].as_str()).collect();
    assert_eq!(addrs.len(), 2, "{done}");
    for (r, addr) in ranks.iter().zip(&addrs) {
        assert_eq!(r["state"], "succeeded", "{done}");
        assert!(
            addr.starts_with(&format!("10.{net}.")),
            "a member's own address: {done}"
        );
    }
    assert_eq!(ranks[0]["id"], done["id"], "rank 0 is the job itself");
    let (s, zero) = log(app, &t.member, &id, 0).await;
    assert_eq!(s, 200);
    assert!(zero.contains("rank=0 world=2 node_rank=0"), "{zero}");
    assert!(
        zero.contains(&format!("master={}:29500", addrs[0])),
        "{zero}"
    );
    assert!(
        zero.contains(&format!("jax={}:29501/2/0", addrs[0])),
        "{zero}"
    );
    assert!(zero.contains("rank0 heard: hello from rank 1"), "{zero}");
    for addr in &addrs {
        assert!(
            zero.contains(&format!("{addr} slots=1")),
            "hostfile: {zero}"
        );
    }
    let (s, one) = log(app, &t.member, &id, 1).await;
    assert_eq!(s, 200);
    assert!(one.contains("rank=1 world=2 node_rank=1"), "{one}");
    assert!(one.contains("rank1 heard: welcome"), "{one}");
    // Another team's member sees none of it.
    let (s, _) = log(app, &o.member, &id, 1).await;
    assert_eq!(s, 404);
    let (s, _) = log(app, &t.member, &id, 2).await;
    assert_eq!(s, 422, "no rank 2");
    // Listed once.
    let (_, list) = get_as(app, &t.member, "/api/v1/workloads?kind=job").await;
    let listed = list["items"].as_array().expect("items");
    assert_eq!(listed.len(), 1, "the gang is one job: {list}");
    wait_until_used(&a, &t.id, 0).await;

    // One rank fails: every rank stops, the job fails naming the rank, the GPUs go back.
    let (s, job) = post_job(
        app,
        &t.member,
        json!({"command": "if [ \"$RANK\" = 1 ]; then sleep 1; exit 3; fi; sleep 300",
               "name": "one-fails", "gpu": "H100-80GB:whole", "nodes": 2}),
    )
    .await;
    assert_eq!(s, 201, "{job}");
    let id = job["id"].as_str().expect("id").to_owned();
    wait_workload(app, &t.member, &id, "failed", 180).await;
    let failed = ranks_ended(app, &t.member, &id).await;
    let message = failed["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("rank 1") && message.contains("exit code 3"),
        "{failed}"
    );
    for r in failed["ranks"].as_array().expect("ranks") {
        assert!(
            ["failed", "cancelled"].contains(&r["state"].as_str().unwrap_or_default()),
            "every rank ended: {failed}"
        );
    }
    wait_until_used(&a, &t.id, 0).await;

    // With a retry: rank 1 fails the first attempt, so the whole gang goes again (every
    // member new, on a new allocation: the old one is given back first) and the second
    // attempt succeeds.
    let (s, job) = post_job(
        app,
        &t.member,
        json!({"command": "if [ \"$RANK\" = 1 ] && [ \"$TESSERA_ATTEMPT\" = 1 ]; then exit 3; fi; \
                           echo \"attempt=$TESSERA_ATTEMPT rank=$RANK\"",
               "name": "retried", "gpu": "H100-80GB:whole", "nodes": 2, "retries": 1}),
    )
    .await;
    assert_eq!(s, 201, "{job}");
    let id = job["id"].as_str().expect("id").to_owned();
    let first_alloc = job["allocation_id"]
        .as_str()
        .expect("allocation")
        .to_owned();
    // (Rank 0 may read `succeeded` before rank 1 fails: the job is done only when its
    // second attempt is.)
    let deadline = Instant::now() + Duration::from_secs(180);
    let done = loop {
        let v = get(app, &t.member, &id).await;
        if v["state"] == "succeeded" && v["attempt"] == 2 {
            break v;
        }
        if ["failed", "cancelled"].contains(&v["state"].as_str().unwrap_or_default())
            || Instant::now() > deadline
        {
            let (_, alloc) = a
                .call(
                    Method::GET,
                    &format!(
                        "/api/v1/allocations/{}",
                        v["allocation_id"].as_str().unwrap_or_default()
                    ),
                    None,
                )
                .await;
            panic!("the gang was not retried to success: {v}\nits allocation: {alloc}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let tried = done["attempts"].as_array().expect("attempts");
    assert_eq!(tried.len(), 1, "{done}");
    let reason = tried[0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("rank 1") && reason.contains("exit code 3"),
        "{done}"
    );
    assert_eq!(tried[0]["preempted"], false);
    assert_ne!(done["allocation_id"], first_alloc.as_str(), "{done}");
    let (_, old) = a.get(&format!("/api/v1/allocations/{first_alloc}")).await;
    assert_eq!(old["state"], "ended", "{old}");
    let (_, one) = log(app, &t.member, &id, 1).await;
    assert!(one.contains("attempt=2 rank=1"), "{one}");
    let ranks = ranks_ended(app, &t.member, &id).await;
    assert_eq!(ranks["ranks"].as_array().map(Vec::len), Some(2), "{ranks}");
    wait_until_used(&a, &t.id, 0).await;

    // From the terminal: `--nodes`, `--gpus-per-node`, and a member's log with `--rank`.
    let tessera = |args: &[&str]| tessera_ok(&app.base, &t.member, args);
    let id = tessera(&[
        "job",
        "submit",
        "--gpu",
        "H100-80GB:whole",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--name",
        "from-cli",
        "--",
        "sh",
        "-c",
        "echo from-rank-$RANK-of-$WORLD_SIZE",
    ])
    .trim()
    .to_owned();
    wait_workload(app, &t.member, &id, "succeeded", 180).await;
    ranks_ended(app, &t.member, &id).await;
    let one = tessera(&["job", "logs", &id, "--rank", "1"]);
    assert!(one.contains("from-rank-1-of-2"), "{one}");
    let zero = tessera(&["job", "logs", &id]);
    assert!(zero.contains("from-rank-0-of-2"), "{zero}");
    wait_until_used(&a, &t.id, 0).await;

    // Node groups (racks): nodes 1 and 3 share a rack, node 2 is alone; a 2-node gang stays
    // inside the rack. Only platform admins set a node's group.
    let (_, nodes) = a.call(Method::GET, "/api/v1/nodes?limit=200", None).await;
    let node_id = |host: String| {
        nodes["items"]
            .as_array()
            .and_then(|n| n.iter().find(|n| n["hostname"] == host.as_str()))
            .and_then(|n| n["id"].as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no node {host}: {nodes}"))
    };
    for (i, group) in [(1, "rack-a"), (2, "rack-b"), (3, "rack-a")] {
        let id = node_id(format!("{name}-n{i}"));
        let path = format!("/api/v1/nodes/{id}/group");
        let (s, v) = put_as(app, &t.team_admin, &path, json!({"group": group})).await;
        assert_eq!(s, 403, "a team admin does not set racks: {v}");
        let (s, v) = a.put(&path, json!({"group": "rack a!"})).await;
        assert_eq!((s, &v["error"]["field"]), (422, &json!("group")), "{v}");
        let (s, v) = a.put(&path, json!({"group": group})).await;
        assert_eq!((s, &v["group"]), (200, &json!(group)), "{v}");
    }
    let (s, job) = post_job(
        app,
        &t.member,
        json!({"command": "true", "name": "in-a-rack", "gpu": "H100-80GB:whole", "nodes": 2}),
    )
    .await;
    assert_eq!(s, 201, "{job}");
    let rack_job = job["id"].as_str().expect("id");
    wait_workload(app, &t.member, rack_job, "succeeded", 180).await;
    let done = ranks_ended(app, &t.member, rack_job).await;
    let hosts: std::collections::BTreeSet<String> = done["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .filter_map(|r| r["hostname"].as_str().map(str::to_owned))
        .collect();
    let rack: std::collections::BTreeSet<String> = [format!("{name}-n1"), format!("{name}-n3")]
        .into_iter()
        .collect();
    assert_eq!(hosts, rack, "the gang stayed in rack-a: {done}");
    for i in 1..=3 {
        let id = node_id(format!("{name}-n{i}"));
        let (s, _) = a
            .put(&format!("/api/v1/nodes/{id}/group"), json!({"group": null}))
            .await;
        assert_eq!(s, 200);
    }
    wait_until_used(&a, &t.id, 0).await;

    // Two gangs that each need two of the three nodes, submitted together: one runs, the
    // other waits holding nothing, then runs.
    let mut pair = Vec::new();
    for n in ["first", "second"] {
        let (s, v) = post_job(
            app,
            &t.member,
            json!({"command": "sleep 6", "name": n, "gpu": "H100-80GB:whole", "nodes": 2}),
        )
        .await;
        assert_eq!(s, 201, "{v}");
        pair.push(v["id"].as_str().expect("id").to_owned());
    }
    let deadline = Instant::now() + Duration::from_secs(240);
    let (mut saw_one_running, mut saw_reason, mut saw_empty) = (false, false, false);
    loop {
        let a0 = get(app, &t.member, &pair[0]).await;
        let a1 = get(app, &t.member, &pair[1]).await;
        let running = |v: &Value| v["state"] == "running";
        assert!(
            !(running(&a0) && running(&a1)),
            "both gangs ran at once: {a0}\n{a1}"
        );
        for (v, other) in [(&a0, &a1), (&a1, &a0)] {
            if running(v) && other["state"] == "queued" {
                saw_one_running = true;
                let (_, alloc) = a
                    .call(
                        Method::GET,
                        &format!(
                            "/api/v1/allocations/{}",
                            other["allocation_id"].as_str().unwrap_or("")
                        ),
                        None,
                    )
                    .await;
                // The first gang can finish between the two reads: only an allocation still
                // queued when read says what a waiting gang holds.
                if alloc["state"] == "queued" {
                    assert_eq!(
                        alloc["devices"],
                        json!([]),
                        "the waiting gang holds nothing: {alloc}"
                    );
                    saw_empty = true;
                }
                let why = other["waiting"].as_str().unwrap_or_default();
                if why.contains("2 nodes") {
                    saw_reason = true;
                }
            }
        }
        if a0["state"] == "succeeded" && a1["state"] == "succeeded" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the gangs never both finished: {a0}\n{a1}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(saw_one_running, "one gang ran while the other waited");
    assert!(
        saw_empty,
        "the waiting gang's allocation was read while queued"
    );
    // Capacity freed → every rank of the waiting gang running (this machine, both stores
    // at once: a figure for docs/benchmarks.md, not a bound).
    let (a0, a1) = (
        get(app, &t.member, &pair[0]).await,
        get(app, &t.member, &pair[1]).await,
    );
    let time = |v: &Value| {
        v.as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&chrono::Utc))
    };
    let (first, second) = if time(&a0["ready_at"]) <= time(&a1["ready_at"]) {
        (&a0, &a1)
    } else {
        (&a1, &a0)
    };
    let freed = time(&first["ended_at"]).expect("the first gang ended");
    let all_running = second["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .filter_map(|r| time(&r["ready_at"]))
        .max()
        .expect("ranks ran");
    eprintln!(
        "gangs ({db:?}): capacity freed → all ranks of the waiting 2-node gang running: {:.2} s",
        (all_running - freed).num_milliseconds() as f64 / 1000.0
    );
    assert!(saw_reason, "the waiting gang said it needs 2 nodes");
    wait_until_used(&a, &t.id, 0).await;

    // One process per GPU: two MIG slices on each of two nodes are four ranks, each with
    // its own rank, local rank and device; the job ends when all four have.
    let (s, job) = post_job(
        app,
        &t.member,
        json!({"command": "echo \"proc rank=$RANK local=$LOCAL_RANK/$LOCAL_WORLD_SIZE world=$WORLD_SIZE node=$NODE_RANK dev=$CUDA_VISIBLE_DEVICES\"",
               "name": "per-gpu", "gpu": "H100-80GB:1g.10gb", "nodes": 2,
               "gpus_per_node": 2, "ranks": "per_gpu"}),
    )
    .await;
    assert_eq!(s, 201, "{job}");
    let id = job["id"].as_str().expect("id").to_owned();
    wait_workload(app, &t.member, &id, "succeeded", 240).await;
    let done = ranks_ended(app, &t.member, &id).await;
    let mut seen = Vec::new();
    for rank in 0..2u32 {
        let (_, text) = log(app, &t.member, &id, rank).await;
        let devices: Vec<String> = done["ranks"][rank as usize]["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .filter_map(|d| d.as_str().map(str::to_owned))
            .collect();
        assert_eq!(devices.len(), 2, "{done}");
        for line in text.lines().filter(|l| l.starts_with("proc ")) {
            assert!(line.contains(&format!("node={rank}")), "{line}");
            // Each process sees one device of its member's, a different one each.
            let dev = line.rsplit("dev=").next().unwrap_or_default();
            assert!(!dev.contains(','), "{line}");
            seen.push((
                line.split(" dev=").next().unwrap_or_default().to_owned(),
                dev.to_owned(),
            ));
        }
    }
    let mut ranks: Vec<&str> = seen.iter().map(|(r, _)| r.as_str()).collect();
    ranks.sort_unstable();
    assert_eq!(
        ranks,
        [
            "proc rank=0 local=0/2 world=4 node=0",
            "proc rank=1 local=1/2 world=4 node=0",
            "proc rank=2 local=0/2 world=4 node=1",
            "proc rank=3 local=1/2 world=4 node=1",
        ],
        "{seen:?}"
    );
    // (Simulated nodes number their devices alike: distinct within each node.)
    let devs: std::collections::BTreeSet<(&str, &str)> = seen
        .iter()
        .map(|(r, d)| (r.rsplit(' ').next().unwrap_or_default(), d.as_str()))
        .collect();
    assert_eq!(devs.len(), 4, "a device of its own each: {seen:?}");
    wait_until_used(&a, &t.id, 0).await;

    for agent in agents {
        agent.stop().await;
    }
}

/// The job `id` once every one of its ranks has ended (within three minutes).
pub(crate) async fn ranks_ended(app: &TestApp, token: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let v = get(app, token, id).await;
        let live = ["queued", "pending", "starting", "running", "stopping"];
        let ended = v["ranks"].as_array().is_some_and(|r| {
            !r.is_empty()
                && r.iter()
                    .all(|r| !live.contains(&r["state"].as_str().unwrap_or("running")))
        });
        if ended {
            return v;
        }
        assert!(Instant::now() < deadline, "the ranks never all ended: {v}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Quota counters equal what live allocations hold: `want` units, within a minute.
pub(crate) async fn wait_until_used(a: &AdminClient, team: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = used(a, team, "H100-80GB").await;
        if n == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "quota used stayed {n}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
