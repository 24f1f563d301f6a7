//! Several servers, one database. On PostgreSQL: any number of replicas serve, exactly one
//! leads the background passes, a change taken by any replica wakes the leader's scheduler,
//! and when the leader's database connection dies (a crash, a network cut) or it shuts
//! down, another replica leads within seconds. On SQLite: a second server on the same file
//! refuses to start.

use crate::allocations::{request, set_quota, team, wait_for_state};
use crate::support::{AdminClient, Db, TestApp, postgres_url};
use crate::support::{client_with_timeout, sim_agent};
use reqwest::Method;
use serde_json::json;
use std::time::{Duration, Instant};
use tessera_server::config::ServeConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_one_sqlite_file_refuses_to_start() {
    let app = TestApp::spawn(Db::Sqlite).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let second = tessera_server::run(
        ServeConfig::for_tests(&app.database_url),
        listener,
        std::future::pending(),
    );
    let err = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("refuses at once")
        .expect_err("a second server on the same SQLite file must not start");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("another Tessera server") && msg.contains("PostgreSQL"),
        "{msg}"
    );
    // The first keeps serving.
    let r = reqwest::get(app.url("/readyz")).await.expect("readyz");
    assert_eq!(r.status(), 200);
}

/// `Some(true)` when the `/metrics` of the server at `base` says `replica` leads,
/// `Some(false)` when it says it does not, `None` when it does not answer.
async fn leads_at(base: &str, replica: &str) -> Option<bool> {
    let body = reqwest::Client::new()
        .get(format!("{base}/metrics"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let prefix = format!("tessera_leader{{replica=\"{replica}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim() == "1")
}

pub(crate) async fn leads(app: &TestApp, replica: &str) -> Option<bool> {
    leads_at(&app.base, replica).await
}

/// Waits until exactly one of `replicas` leads; returns it and how long that took.
pub(crate) async fn one_leader(
    app: &TestApp,
    replicas: &[&str],
    within: Duration,
) -> (String, Duration) {
    let start = Instant::now();
    loop {
        let mut leading = Vec::new();
        for r in replicas {
            if leads(app, r).await == Some(true) {
                leading.push((*r).to_owned());
            }
        }
        assert!(leading.len() <= 1, "two leaders at once: {leading:?}");
        if let [one] = leading.as_slice() {
            return (one.clone(), start.elapsed());
        }
        assert!(
            start.elapsed() < within,
            "no replica leads after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the node `host` is listed with its GPU (the scheduler can place on it).
pub(crate) async fn node_reports_gpu(a: &AdminClient, host: &str) {
    let start = Instant::now();
    loop {
        let (_, nodes) = a.call(Method::GET, "/api/v1/nodes", None).await;
        let ready = nodes["items"].as_array().is_some_and(|ns| {
            ns.iter().any(|n| {
                n["hostname"] == host && n["gpus"].as_array().is_some_and(|g| !g.is_empty())
            })
        });
        if ready {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{host} never reported: {nodes}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The scheduler placed allocation `id` (it left `queued`) within `within`: with a 20 s
/// interval, only a wake-up does that.
async fn placed_within(a: &AdminClient, id: &str, within: Duration) {
    let start = Instant::now();
    loop {
        let (_, v) = a.get(&format!("/api/v1/allocations/{id}")).await;
        if v["state"] != "queued" {
            eprintln!("placed {:?} after the request", start.elapsed());
            return;
        }
        assert!(
            start.elapsed() < within,
            "not placed after {within:?}: the leader was not woken: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two replicas on one fresh PostgreSQL database, each with the scheduler interval
/// `every`: A, which leads, and B, which stands by. Returns `(A, B, A's name, B's name)`.
pub(crate) async fn leader_and_standby(every: Duration) -> (TestApp, TestApp, String, String) {
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let (ra, rb) = (format!("a-{tag}"), format!("b-{tag}"));
    let config = |name: String| {
        move |c: &mut ServeConfig| {
            c.replica_name = Some(name);
            c.scheduler_interval = every;
        }
    };
    let a = TestApp::spawn_with(Db::Postgres, config(ra.clone())).await;
    let (first, _) = one_leader(&a, &[&ra, &rb], Duration::from_secs(10)).await;
    assert_eq!(first, ra, "the first replica leads");
    let b = TestApp::replica_of(&a, config(rb.clone())).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        leads(&a, &rb).await,
        Some(false),
        "the second replica stands by"
    );
    (a, b, ra, rb)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_postgres_elect_one_leader_wake_it_and_fail_over() {
    if postgres_url().is_none() {
        return;
    }
    // A long scheduler interval: only a wake-up places within seconds.
    let (a, b, ra, rb) = leader_and_standby(Duration::from_secs(20)).await;
    let tag = ra.trim_start_matches("a-").to_owned();
    assert_eq!(leads(&a, &ra).await, Some(true));

    // Everything goes through B, which does not lead: the leader's scheduler must be
    // woken through the database for the slice to be placed and activated in time.
    let admin = AdminClient::with_app(b).await;
    // The admin pages name the leader: every replica reports itself, from any of them.
    let t0 = Instant::now();
    loop {
        let (s, v) = admin.get("/api/v1/cluster/servers").await;
        assert_eq!(s, 200, "{v}");
        let role = |name: &str| {
            v.as_array()
                .into_iter()
                .flatten()
                .find(|r| r["name"] == name)
                .map(|r| (r["leading"].as_bool(), r["responding"].as_bool()))
        };
        if role(&ra) == Some((Some(true), Some(true)))
            && role(&rb) == Some((Some(false), Some(true)))
        {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "servers list never showed {ra} leading and {rb} standing by: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let t = team(&admin, &format!("rep{tag}")).await;
    set_quota(&admin, &t.id, "H100-80GB", 7, 7, 7).await;
    let (s, jt) = admin
        .post("/api/v1/join-tokens", json!({"note": "replicas"}))
        .await;
    assert_eq!(s, 201, "{jt}");
    let state = tempfile::tempdir().expect("tempdir");
    let _agent = sim_agent(
        &admin.app.base,
        "H100-80GB",
        &format!("rep-{tag}"),
        state.path(),
    )
    .arg("--join-token")
    .arg(jt["secret"].as_str().expect("secret"))
    .arg("--manage-mig")
    .spawn()
    .expect("start tessera-agent");
    node_reports_gpu(&admin, &format!("rep-{tag}")).await;
    let (s, v) = request(&admin.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let first_alloc = v["id"].as_str().expect("id").to_owned();
    placed_within(&admin, &first_alloc, Duration::from_secs(8)).await;
    wait_for_state(&admin, &first_alloc, "active").await;

    // The leader's lock connection dies (as when its process is killed or cut off): the
    // lock goes with it, and a replica holds it again on a new connection within seconds.
    // (The old leader may believe it leads until its next check, ≤ 0.5 s + 2 s timeout:
    // the window that conditional writes make harmless, see ARCHITECTURE.md.)
    use sqlx::Connection;
    let mut db = sqlx::PgConnection::connect(&a.database_url)
        .await
        .expect("db");
    async fn holder(db: &mut sqlx::PgConnection) -> Option<i32> {
        sqlx::query_scalar::<_, i32>(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .fetch_optional(db)
        .await
        .expect("pg_locks")
    }
    let before = holder(&mut db).await.expect("the leader holds the lock");
    let store = tessera_core::store::Store::connect(&a.database_url)
        .await
        .expect("store");
    let killed = store
        .terminate_leader_connection()
        .await
        .expect("terminate");
    assert!(killed, "the leader's lock connection was found");
    let cut = Instant::now();
    loop {
        if holder(&mut db).await.is_some_and(|pid| pid != before) {
            break;
        }
        assert!(
            cut.elapsed() < Duration::from_secs(10),
            "nobody holds the lock 10 s after the leader's connection died"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "lock held again {:?} after the leader's connection died",
        cut.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    one_leader(&a, &[&ra, &rb], Duration::from_secs(5)).await;

    // A graceful stop of the leader hands over at once.
    let mut a = a;
    let (leader, _) = one_leader(&admin.app, &[&ra, &rb], Duration::from_secs(10)).await;
    if leader == ra {
        a.stop().await;
        let (next, took) = one_leader(&admin.app, &[&ra, &rb], Duration::from_secs(5)).await;
        assert_eq!(next, rb, "B leads once A is gone");
        eprintln!("handover after a graceful stop: {took:?}");
    }
    // Whoever leads now places a new request at once.
    let (s, v) = request(&admin.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let second = v["id"].as_str().expect("id").to_owned();
    placed_within(&admin, &second, Duration::from_secs(8)).await;
    wait_for_state(&admin, &second, "active").await;
    // Nothing was placed twice: two slices, two distinct MIG instances.
    let (_, one) = admin
        .get(&format!("/api/v1/allocations/{first_alloc}"))
        .await;
    let (_, two) = admin.get(&format!("/api/v1/allocations/{second}")).await;
    assert_ne!(
        one["devices"][0]["mig_uuid"], two["devices"][0]["mig_uuid"],
        "{one}\n{two}"
    );
}

/// `tessera backup` while requests keep coming, then `tessera restore` into the stopped
/// server: every request acknowledged before the backup began is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_under_load_restores_everything_acknowledged_before_it() {
    let a = AdminClient::new(Db::Sqlite).await;
    let t = team(&a, "backup-team").await;
    set_quota(&a, &t.id, "H100-80GB", 500, 500, 500).await;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let load = {
        let (app_url, token, team_id, acked) = (
            a.app.base.clone(),
            t.member.clone(),
            t.id.clone(),
            acked.clone(),
        );
        tokio::spawn(async move {
            let c = reqwest::Client::new();
            for i in 0..60 {
                let r = c
                    .post(format!("{app_url}/api/v1/allocations"))
                    .bearer_auth(&token)
                    .header("idempotency-key", format!("backup-{i}"))
                    .json(
                        &json!({"team_id": team_id, "kind": "H100-80GB:1g.10gb", "count": 1,
                                  "duration_minutes": 60}),
                    )
                    .send()
                    .await
                    .expect("request");
                assert_eq!(r.status(), 201);
                let v: serde_json::Value = r.json().await.expect("json");
                acked
                    .lock()
                    .expect("lock")
                    .push(v["id"].as_str().expect("id").to_owned());
            }
        })
    };
    while acked.lock().expect("lock").len() < 20 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before: Vec<String> = acked.lock().expect("lock").clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tessera-backup.db");
    tessera_server::backup(&a.app.database_url, &file)
        .await
        .expect("backup while serving");
    load.await.expect("load");
    let all = acked.lock().expect("lock").len();
    assert_eq!(all, 60);
    // A backup never overwrites.
    assert!(
        tessera_server::backup(&a.app.database_url, &file)
            .await
            .is_err()
    );

    let mut a = a;
    // Restoring under a running server is refused.
    let err = tessera_server::restore(&a.app.database_url, &file)
        .await
        .expect_err("the server is running");
    assert!(
        format!("{err:#}").contains("another Tessera server"),
        "{err:#}"
    );
    a.app.stop().await;
    tessera_server::restore(&a.app.database_url, &file)
        .await
        .expect("restore");
    a.app.start_again().await;
    let a = AdminClient::with_app(a.app).await;
    let (s, list) = a
        .get(&format!("/api/v1/allocations?team={}&limit=200", t.id))
        .await;
    assert_eq!(s, 200, "{list}");
    let ids: std::collections::BTreeSet<String> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|v| v["id"].as_str().map(str::to_owned))
        .collect();
    for id in &before {
        assert!(
            ids.contains(id),
            "acknowledged {id} is missing after the restore"
        );
    }
    assert!(
        ids.len() >= before.len() && ids.len() <= all,
        "{}",
        ids.len()
    );
    // Not a backup: refused, and the database is untouched.
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, b"not a database").expect("write");
    let mut app = a.app;
    app.stop().await;
    assert!(
        tessera_server::restore(&app.database_url, &junk)
            .await
            .is_err()
    );
    app.start_again().await;
    assert_eq!(
        reqwest::get(app.url("/readyz"))
            .await
            .expect("ready")
            .status(),
        200
    );
}

/// A PostgreSQL database with a team `name` (quota `limit` H100 units per member) and a
/// join token, set up by an in-process server that then stops; the returned admin owns
/// the database until it is dropped. Returns it, the team, the join secret and the URL.
pub(crate) async fn stopped_setup(
    name: &str,
    limit: u32,
) -> (AdminClient, crate::allocations::Team, String, String) {
    let mut admin = AdminClient::new(Db::Postgres).await;
    let t = team(&admin, name).await;
    set_quota(&admin, &t.id, "H100-80GB", 7, limit, limit).await;
    let (s, jt) = admin
        .post("/api/v1/join-tokens", json!({"note": name}))
        .await;
    assert_eq!(s, 201, "{jt}");
    let join = jt["secret"].as_str().expect("secret").to_owned();
    let url = admin.app.database_url.clone();
    admin.app.stop().await;
    (admin, t, join, url)
}

/// A free port on loopback (bound and released; fine for a test).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// One `tessera serve` process of the cluster under test.
pub(crate) struct Replica {
    pub name: String,
    pub port: u16,
    pub child: tokio::process::Child,
}

pub(crate) fn start_replica(name: &str, port: u16, database_url: &str) -> Replica {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["serve", "--no-sim", "--bind", &format!("127.0.0.1:{port}")])
        .args(["--database-url", database_url, "--replica-name", name])
        .args(["--scheduler-interval", "1s", "--site-root", "/nonexistent"])
        .env("RUST_LOG", "warn")
        .env("TESSERA_DATA_KEY", crate::support::TEST_DATA_KEY)
        // A short drain and grace: a stopped replica is gone within seconds.
        .env("TESSERA_DRAIN_SECONDS", "1")
        .env("TESSERA_SHUTDOWN_GRACE_SECONDS", "3")
        .kill_on_drop(true)
        .spawn()
        .expect("start tessera serve");
    Replica {
        name: name.to_owned(),
        port,
        child,
    }
}

/// A round-robin TCP proxy in front of the replicas: each connection goes to the next
/// backend that accepts it (what a Service does for agents and clients).
pub(crate) async fn round_robin(ports: Vec<u16>) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind proxy");
    let port = l.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        while let Ok((mut inbound, _)) = l.accept().await {
            let (ports, next) = (ports.clone(), next.clone());
            tokio::spawn(async move {
                let start = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                for i in 0..ports.len() {
                    let p = ports[(start + i) % ports.len()];
                    if let Ok(mut out) = tokio::net::TcpStream::connect(("127.0.0.1", p)).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        return;
                    }
                }
            });
        }
    });
    port
}

/// Three server processes on one PostgreSQL database, an agent and a client behind a
/// round-robin proxy; the leader is killed (SIGKILL) at a random moment 20 times. Each
/// time another replica leads within the lease timeout, and afterwards nothing was lost or
/// counted twice: every acknowledged request exists once, quota counters equal what the
/// live allocations hold, no MIG instance is held by two allocations.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_leader_twenty_times_loses_nothing_and_places_nothing_twice() {
    if postgres_url().is_none() {
        return;
    }
    // The database, its admin, a team with a quota and a member: set up by an in-process
    // server that then stops (it owns the throwaway database until the test ends).
    let (_admin, t, join, url) = stopped_setup("failover", 7).await;

    let tag = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let mut replicas: Vec<Replica> = (0..3)
        .map(|i| start_replica(&format!("r{i}-{tag}"), free_port(), &url))
        .collect();
    let front = round_robin(replicas.iter().map(|r| r.port).collect()).await;
    let base = format!("http://127.0.0.1:{front}");
    let ready = Instant::now();
    while reqwest::get(format!("{base}/readyz"))
        .await
        .map(|r| r.status().as_u16())
        .ok()
        != Some(200)
    {
        assert!(
            ready.elapsed() < Duration::from_secs(60),
            "replicas never ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let state = tempfile::tempdir().expect("tempdir");
    let _agent = sim_agent(&base, "H100-80GB", &format!("fo-{tag}"), state.path())
        .args(["--join-token", &join, "--manage-mig"])
        .spawn()
        .expect("start tessera-agent");

    // The client: requests a slice (Idempotency-Key, retried until acknowledged), then
    // releases the one before (retried), over and over.
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let (base, token, team_id, acked, done) = (
            base.clone(),
            t.member.clone(),
            t.id.clone(),
            acked.clone(),
            done.clone(),
        );
        tokio::spawn(async move {
            let c = client_with_timeout();
            let mut previous: Option<String> = None;
            let mut i = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                i += 1;
                let key = format!("fo-{i}");
                let id = loop {
                    let r = c
                        .post(format!("{base}/api/v1/allocations"))
                        .bearer_auth(&token)
                        .header("idempotency-key", &key)
                        .json(&json!({"team_id": team_id, "kind": "H100-80GB:1g.10gb"}))
                        .send()
                        .await;
                    if let Ok(r) = r
                        && r.status().is_success()
                        && let Ok(v) = r.json::<serde_json::Value>().await
                        && let Some(id) = v["id"].as_str()
                    {
                        break id.to_owned();
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                };
                acked.lock().expect("lock").push((key, id.clone()));
                if let Some(p) = previous.replace(id) {
                    loop {
                        let r = c
                            .post(format!("{base}/api/v1/allocations/{p}/release"))
                            .bearer_auth(&token)
                            .send()
                            .await;
                        if let Ok(r) = r
                            && (r.status().is_success() || r.status().as_u16() == 409)
                        {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        })
    };

    let names: Vec<String> = replicas.iter().map(|r| r.name.clone()).collect();
    let leader_now = |replicas: &Vec<Replica>| {
        let probes: Vec<(usize, u16, String)> = replicas
            .iter()
            .enumerate()
            .map(|(i, r)| (i, r.port, r.name.clone()))
            .collect();
        async move {
            let mut leaders = Vec::new();
            for (i, port, name) in probes {
                if leads_at(&format!("http://127.0.0.1:{port}"), &name).await == Some(true) {
                    leaders.push(i);
                }
            }
            leaders
        }
    };
    let mut failovers = Vec::new();
    for kill in 0..20 {
        // Find the one leader.
        let t0 = Instant::now();
        let leader = loop {
            let l = leader_now(&replicas).await;
            assert!(l.len() <= 1, "two leaders: {l:?}");
            if let [one] = l.as_slice() {
                break *one;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "no leader ({kill})");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // At a random point of its passes.
        let pause = u64::from(uuid::Uuid::new_v4().as_bytes()[0]) * 6;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        replicas[leader].child.start_kill().expect("kill -9");
        let _ = replicas[leader].child.wait().await;
        let killed_at = Instant::now();
        loop {
            let l = leader_now(&replicas).await;
            assert!(l.len() <= 1, "two leaders after kill {kill}: {l:?}");
            if let [one] = l.as_slice()
                && *one != leader
            {
                break;
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs(10),
                "no new leader 10 s after kill {kill}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        failovers.push(killed_at.elapsed());
        let (name, port) = (replicas[leader].name.clone(), replicas[leader].port);
        replicas[leader] = start_replica(&name, port, &url);
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    client.await.expect("client");
    failovers.sort();
    eprintln!(
        "failover over {} kills: min {:?}, median {:?}, max {:?}",
        failovers.len(),
        failovers[0],
        failovers[failovers.len() / 2],
        failovers[failovers.len() - 1]
    );
    let _ = names;
    // Let the passes settle, then check the books.
    tokio::time::sleep(Duration::from_secs(4)).await;
    use sqlx::Connection;
    let mut db = sqlx::PgConnection::connect(&url).await.expect("db");
    let acked = acked.lock().expect("lock").clone();
    assert!(acked.len() >= 20, "the client got through: {}", acked.len());
    for (key, id) in &acked {
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM allocations WHERE idempotency_key = $1")
                .bind(key)
                .fetch_one(&mut db)
                .await
                .expect("count");
        assert_eq!(n, 1, "request {key} stored {n} times");
        let found: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM allocations WHERE id = $1")
            .bind(uuid::Uuid::parse_str(id).expect("uuid"))
            .fetch_one(&mut db)
            .await
            .expect("count");
        assert_eq!(found, 1, "acknowledged {id} ({key}) lost");
    }
    let drift: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT q.model, q.used, COALESCE((SELECT SUM(a.units) FROM allocations a \
         WHERE a.team_id = q.team_id AND a.model = q.model AND a.state IN \
         ('queued', 'placing', 'active', 'releasing')), 0)::BIGINT FROM quotas q",
    )
    .fetch_all(&mut db)
    .await
    .expect("quotas");
    for (model, used, held) in drift {
        assert_eq!(
            used, held,
            "{model}: quota counter {used}, live allocations hold {held}"
        );
    }
    let placed: Vec<String> = sqlx::query_scalar(
        "SELECT devices FROM allocations WHERE state IN ('placing', 'active', 'releasing')",
    )
    .fetch_all(&mut db)
    .await
    .expect("devices");
    let mut migs = std::collections::BTreeSet::new();
    for d in placed {
        let v: serde_json::Value = serde_json::from_str(&d).expect("devices json");
        for dev in v.as_array().into_iter().flatten() {
            if let Some(m) = dev["mig_uuid"].as_str() {
                assert!(migs.insert(m.to_owned()), "{m} held by two allocations");
            }
        }
    }
    for mut r in replicas {
        let _ = r.child.start_kill();
        let _ = r.child.wait().await;
    }
}
