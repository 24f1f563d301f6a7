//! Workloads end to end: a real `tessera-agent --simulate` runs a real JupyterLab (from
//! PyPI) and real job processes through its process executor; the server proxies the
//! notebook (HTTP and the kernel WebSocket), streams job logs, stops process groups and
//! reclaims idle notebooks.
//!
//! Needs `jupyter lab` on PATH (`cargo xtask test` installs JupyterLab).

use crate::allocations::{request, set_quota, team, wait_for_state};
use crate::nodes::agent_bin;
use crate::on_both_databases;
use crate::support::{AdminClient, Db, TestApp, call_with_token};
use futures_util::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// A simulated H100 node whose agent runs workloads; stopping it (SIGINT) stops them.
struct WorkloadAgent {
    child: tokio::process::Child,
    state: tempfile::TempDir,
}

impl WorkloadAgent {
    async fn start(a: &AdminClient, hostname: &str) -> WorkloadAgent {
        let (s, jt) = a
            .call(
                Method::POST,
                "/api/v1/join-tokens",
                Some(json!({"note": "workloads"})),
            )
            .await;
        assert_eq!(s, 201);
        let state = tempfile::tempdir().expect("tempdir");
        let child = tokio::process::Command::new(agent_bin())
            .args(["--simulate", "--gpus", "H100-80GB", "--hostname", hostname])
            .args(["--server", &a.app.base, "--join-token"])
            .arg(jt["secret"].as_str().expect("secret"))
            .arg("--manage-mig")
            .arg("--state-dir")
            .arg(state.path())
            .args(["--heartbeat-interval-s", "1", "--reconcile-interval-s", "1"])
            // No telemetry: the idle test decides on the kernel signal alone.
            .args(["--telemetry-interval-s", "3600"])
            .args(["--workload-interval-ms", "300", "--stop-workloads-on-exit"])
            // A fixed memory limit, so that the hostile test can reach it quickly.
            .args(["--sandbox-memory-mib", "768"])
            .kill_on_drop(true)
            .spawn()
            .expect("start tessera-agent");
        WorkloadAgent { child, state }
    }

    /// Asks the agent to shut down (it stops its workloads first) and waits.
    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status();
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await;
    }
}

impl Drop for WorkloadAgent {
    /// A failed test still stops its workloads: SIGINT, a blocking wait of up to 15 s,
    /// and only then the kill.
    fn drop(&mut self) {
        let Some(pid) = self.child.id() else { return };
        let _ = std::process::Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A member with an active 1g.10gb slice on a fresh simulated H100.
struct Setup {
    a: AdminClient,
    agent: WorkloadAgent,
    member: String,
    member_name: String,
    other: String,
    alloc: String,
}

async fn setup(db: Db, name: &str) -> Setup {
    let a = AdminClient::new(db).await;
    let t = team(&a, name).await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let o = team(&a, &format!("{name}-other")).await;
    let agent = WorkloadAgent::start(&a, &format!("{name}-node")).await;
    let (s, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let alloc = v["id"].as_str().expect("id").to_owned();
    let active = wait_for_state(&a, &alloc, "active").await;
    assert!(active["devices"][0]["mig_uuid"].is_string(), "{active}");
    Setup {
        a,
        agent,
        member: t.member,
        member_name: format!("{name}-member"),
        other: o.member,
        alloc,
    }
}

pub(crate) async fn get(app: &TestApp, token: &str, id: &str) -> Value {
    let (s, v) = call_with_token(
        app,
        token,
        Method::GET,
        &format!("/api/v1/workloads/{id}"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    v
}

pub(crate) async fn wait_workload(
    app: &TestApp,
    token: &str,
    id: &str,
    state: &str,
    secs: u64,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let v = get(app, token, id).await;
        if v["state"] == state {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "workload never became {state}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Processes whose command line contains `needle` (this machine's /proc).
fn processes_with(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                out.push(format!("{name}: {cmd}"));
            }
        }
    }
    out
}

async fn wait_no_process(needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = processes_with(needle);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "processes left over: {left:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn launch(s: &Setup, name: &str) -> Value {
    let (st, v) = call_with_token(
        &s.a.app,
        &s.member,
        Method::POST,
        "/api/v1/notebooks",
        Some(json!({"allocation_id": s.alloc, "name": name})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    v
}

/// Runs `code` in a kernel over the proxied WebSocket and returns its `text/plain` result.
async fn run_in_kernel(server: &str, token: &str, base: &str, kernel: &str, code: &str) -> String {
    let addr = server.trim_start_matches("http://");
    let url = format!("ws://{addr}{base}api/kernels/{kernel}/channels");
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        url.as_str(),
    )
    .expect("ws request");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("tcp");
    let (mut ws, resp) = tokio_tungstenite::client_async(req, tcp)
        .await
        .expect("websocket through the proxy");
    assert_eq!(resp.status(), 101);
    let msg_id = uuid::Uuid::new_v4().to_string();
    let msg = json!({
        "header": {"msg_id": msg_id, "username": "test", "session": uuid::Uuid::new_v4().to_string(),
                   "msg_type": "execute_request", "version": "5.3",
                   "date": chrono::Utc::now().to_rfc3339()},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": false, "store_history": false,
                    "user_expressions": {}, "allow_stdin": false, "stop_on_error": true},
    });
    ws.send(Message::Text(msg.to_string().into()))
        .await
        .expect("send");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let next = tokio::time::timeout(Duration::from_secs(60), ws.next())
            .await
            .expect("kernel answers")
            .expect("stream open")
            .expect("frame");
        let Message::Text(t) = next else { continue };
        let v: Value = serde_json::from_str(&t).expect("json");
        if v["parent_header"]["msg_id"] == msg_id.as_str()
            && v["header"]["msg_type"] == "execute_result"
        {
            return v["content"]["data"]["text/plain"]
                .as_str()
                .expect("text")
                .to_owned();
        }
    }
    panic!("no execute_result");
}

async fn a_notebook_runs_jupyterlab_behind_the_proxy(db: Db) {
    let name = format!("nb-{}", format!("{db:?}").to_lowercase());
    let s = setup(db, &name).await;
    let app = &s.a.app;
    let nb_name = format!("lab-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let nb = launch(&s, &nb_name).await;
    let id = nb["id"].as_str().expect("id").to_owned();
    assert_eq!(nb["state"], "pending");
    let started = Instant::now();
    let running = wait_workload(app, &s.member, &id, "running", 120).await;
    eprintln!("notebook ready in {:?}", started.elapsed());
    let base = format!("/user/{}/{nb_name}/", s.member_name);
    assert_eq!(running["url"], format!("{base}lab"));
    assert!(
        running["device"]
            .as_str()
            .expect("device")
            .starts_with("MIG-")
    );

    // The owner, with an API token: contents, a kernel, 1+1 over the WebSocket.
    let c = reqwest::Client::new();
    let r = c
        .get(app.url(&format!("{base}api/contents")))
        .bearer_auth(&s.member)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    let contents: Value = r.json().await.expect("json");
    assert_eq!(contents["type"], "directory", "{contents}");
    let r = c
        .post(app.url(&format!("{base}api/kernels")))
        .bearer_auth(&s.member)
        .json(&json!({"name": "python3"}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    let kernel: Value = r.json().await.expect("json");
    let kernel_id = kernel["id"].as_str().expect("kernel id");
    assert_eq!(
        run_in_kernel(&app.base, &s.member, &base, kernel_id, "1+1").await,
        "2"
    );

    // The JupyterLab page loads, without the notebook's token in it.
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    let row = store
        .workload(uuid::Uuid::parse_str(&id).expect("uuid"))
        .await
        .expect("load")
        .expect("row");
    let secret = row.w.token.clone().expect("token");
    let r = c
        .get(app.url(&format!("{base}lab")))
        .bearer_auth(&s.member)
        .header("accept", "text/html")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    let page = r.text().await.expect("page");
    assert!(
        page.contains("jupyter-config-data"),
        "not the JupyterLab page"
    );
    assert!(
        !page.contains(&secret),
        "the notebook token reached the browser"
    );

    // Another team's member, a stranger without credentials.
    let r = c
        .get(app.url(&format!("{base}api/contents")))
        .bearer_auth(&s.other)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 404);
    let r = c
        .get(app.url(&format!("{base}api/contents")))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 401);

    // A second notebook on the same allocation is refused; the name is taken too.
    let (st, v) = call_with_token(
        app,
        &s.member,
        Method::POST,
        "/api/v1/notebooks",
        Some(json!({"allocation_id": s.alloc, "name": "other"})),
    )
    .await;
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["error"]["field"], "allocation_id", "{v}");

    // Stop: the whole process group goes, the proxy answers 404.
    let needle = format!("--ServerApp.base_url={base}");
    assert!(!processes_with(&needle).is_empty(), "JupyterLab not found");
    let (st, v) = call_with_token(
        app,
        &s.member,
        Method::POST,
        &format!("/api/v1/workloads/{id}/stop"),
        None,
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let stopped = wait_workload(app, &s.member, &id, "stopped", 30).await;
    assert!(
        stopped["message"]
            .as_str()
            .unwrap_or("")
            .contains("stopped by"),
        "{stopped}"
    );
    wait_no_process(&needle).await;
    let r = c
        .get(app.url(&format!("{base}api/contents")))
        .bearer_auth(&s.member)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 404);
    s.agent.stop().await;
}

async fn a_job_streams_its_output_and_ends_with_its_exit_code(db: Db) {
    let name = format!("job-{}", format!("{db:?}").to_lowercase());
    let s = setup(db, &name).await;
    let app = &s.a.app;
    let (st, v) = call_with_token(
        app,
        &s.member,
        Method::POST,
        "/api/v1/jobs",
        Some(json!({"allocation_id": s.alloc, "command":
            "echo one; echo \"devices=$CUDA_VISIBLE_DEVICES\"; sleep 2; echo two; exit 3"})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    // The first line arrives while the job still runs.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut log = Value::Null;
    while Instant::now() < deadline {
        let (_, l) = call_with_token(
            app,
            &s.member,
            Method::GET,
            &format!("/api/v1/workloads/{id}/logs?from=0"),
            None,
        )
        .await;
        if l["text"].as_str().unwrap_or("").contains("one") {
            log = l;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(log["text"].as_str().unwrap_or("").contains("one"), "{log}");
    let first = get(app, &s.member, &id).await;
    let failed = wait_workload(app, &s.member, &id, "failed", 30).await;
    assert!(
        first["state"] == "running" || first["state"] == "starting" || first["state"] == "failed",
        "{first}"
    );
    assert_eq!(failed["exit_code"], 3, "{failed}");
    let (_, all) = call_with_token(
        app,
        &s.member,
        Method::GET,
        &format!("/api/v1/workloads/{id}/logs?from=0"),
        None,
    )
    .await;
    let text = all["text"].as_str().expect("text");
    assert!(text.contains("one\n") && text.contains("two\n"), "{all}");
    assert!(text.contains("devices=MIG-"), "{all}");
    assert_eq!(all["complete"], true, "{all}");
    // Following from `next` returns nothing new.
    let next = all["next"].as_u64().expect("next");
    let (_, more) = call_with_token(
        app,
        &s.member,
        Method::GET,
        &format!("/api/v1/workloads/{id}/logs?from={next}"),
        None,
    )
    .await;
    assert_eq!(more["text"], "", "{more}");
    // A resent log piece is stored once.
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    let wid = uuid::Uuid::parse_str(&id).expect("uuid");
    let again = store
        .append_log(wid, 0, 4, "one\n", true, 1 << 20)
        .await
        .expect("append");
    assert_eq!(again, next);
    // Another team's member cannot see it.
    let (st, _) = call_with_token(
        app,
        &s.other,
        Method::GET,
        &format!("/api/v1/workloads/{id}/logs"),
        None,
    )
    .await;
    assert_eq!(st, 404);

    // Cancel kills a running job's whole process group.
    let marker = format!("sleep 3{}", 100 + u32::from(matches!(db, Db::Postgres)));
    let (st, v) = call_with_token(
        app,
        &s.member,
        Method::POST,
        "/api/v1/jobs",
        Some(json!({"allocation_id": s.alloc, "command": format!("{marker} & {marker}; wait")})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    wait_workload(app, &s.member, &id, "running", 30).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_with(&marker).len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        processes_with(&marker).len() >= 2,
        "the job's sleeps are not running"
    );
    let (st, _) = call_with_token(
        app,
        &s.member,
        Method::POST,
        &format!("/api/v1/workloads/{id}/stop"),
        None,
    )
    .await;
    assert_eq!(st, 200);
    wait_workload(app, &s.member, &id, "cancelled", 30).await;
    wait_no_process(&marker).await;

    // The terminal client: submit, follow the output, exit with the job.
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(args)
            .env("TESSERA_URL", &app.base)
            .env("TESSERA_TOKEN", &s.member)
            .output()
            .expect("run tessera")
    };
    let out = cli(&[
        "job",
        "submit",
        "--allocation",
        &s.alloc,
        "--command",
        "echo cli-says-$GREETING",
        "--env",
        "GREETING=hi",
        "--follow",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("cli-says-hi"), "{stdout}");
    let out = cli(&["job", "list"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("succeeded") && listed.contains("cancelled"),
        "{listed}"
    );
    let out = cli(&[
        "job",
        "submit",
        "--allocation",
        &s.alloc,
        "--command",
        "exit 4",
        "--follow",
    ]);
    assert_eq!(out.status.code(), Some(1), "a failed job fails the command");
    let out = cli(&["notebook", "start", "--allocation", "not-an-id"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("error:"));
    s.agent.stop().await;
}

async fn an_idle_notebook_is_reclaimed_but_a_busy_kernel_never(db: Db) {
    let name = format!("idle-{}", format!("{db:?}").to_lowercase());
    let s = setup(db, &name).await;
    let app = &s.a.app;
    let nb_name = format!("idle-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let nb = launch(&s, &nb_name).await;
    let id = nb["id"].as_str().expect("id").to_owned();
    wait_workload(app, &s.member, &id, "running", 120).await;
    let base = format!("/user/{}/{nb_name}/", s.member_name);
    let c = reqwest::Client::new();
    let r = c
        .post(app.url(&format!("{base}api/kernels")))
        .bearer_auth(&s.member)
        .json(&json!({"name": "python3"}))
        .send()
        .await
        .expect("request");
    let kernel: Value = r.json().await.expect("json");
    let kernel_id = kernel["id"].as_str().expect("kernel id").to_owned();
    // A kernel busy for a while: the executor reports it busy.
    let server = app.base.clone();
    let member = s.member.clone();
    let base2 = base.clone();
    let k2 = kernel_id.clone();
    let busy = tokio::spawn(async move {
        run_in_kernel(
            &server,
            &member,
            &base2,
            &k2,
            "import time; time.sleep(8); 7",
        )
        .await
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = get(app, &s.member, &id).await;
        if v["activity"]["kernel_busy"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "kernel never reported busy: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The same services over the same database, with a clock 2 hours ahead.
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    let services = tessera_core::Services::new(
        store,
        tessera_core::auth::password::Hasher::new(1, 1).expect("hasher"),
        std::sync::Arc::new(tessera_core::auth::limiter::LoginLimiter::new(
            Default::default(),
        )),
        Duration::from_secs(3600),
    );
    let later = chrono::Utc::now() + chrono::Duration::hours(2);
    let r = services.workloads.tick(later).await.expect("tick");
    assert_eq!(r.reclaimed_idle, 0, "a busy kernel was reclaimed");
    assert_eq!(busy.await.expect("kernel"), "7");
    // Idle now: the kernel is quiet, the GPU has no telemetry. Two hours on, it goes.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = get(app, &s.member, &id).await;
        if v["activity"]["kernel_busy"] == false {
            break;
        }
        assert!(Instant::now() < deadline, "kernel stayed busy: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = services.workloads.tick(later).await.expect("tick");
    assert_eq!(r.reclaimed_idle, 1);
    let stopped = wait_workload(app, &s.member, &id, "stopped", 30).await;
    assert!(
        stopped["message"]
            .as_str()
            .unwrap_or("")
            .contains("without kernel or GPU activity"),
        "{stopped}"
    );
    // The allocation was released with it (the default policy).
    let alloc = wait_for_state(&s.a, &s.alloc, "ended").await;
    assert!(alloc.to_string().contains("was idle"), "{alloc}");
    wait_no_process(&format!("--ServerApp.base_url={base}")).await;
    s.agent.stop().await;
}

/// A hostile job through the whole stack (REST, scheduler, a real agent, its sandbox):
/// the node credential, the agent's state and other runs are out of reach, it runs as an
/// unprivileged uid with only its slice's device nodes; and a forged report with the
/// stolen credential is refused.
async fn a_hostile_job_is_contained_by_the_node_sandbox(db: Db) {
    let name = format!("hostile-{}", format!("{db:?}").to_lowercase());
    let s = setup(db, &name).await;
    let app = &s.a.app;
    let state = s.agent.state.path().display().to_string();
    let script = format!(
        "t() {{ n=$1; shift; printf '%s: %s\\n' \"$n\" \"$( (\"$@\") 2>&1 | head -n1 | sed 's/^.*: //')\"; }}; \
         t uid id -u; \
         t credential cat $TESSERA_WORKSPACE/../../../credential.json; \
         t credential_abs cat {state}/credential.json; \
         t runs ls {state}/workloads/runs; \
         t caps sh -c 'ls /dev/nvidia-caps | wc -l'; \
         t gpus sh -c 'ls /dev | grep -c \"^nvidia[0-9]\"'"
    );
    let (st, v) = call_with_token(
        app,
        &s.member,
        Method::POST,
        "/api/v1/jobs",
        Some(json!({"allocation_id": s.alloc, "command": script})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    let done = wait_workload(app, &s.member, &id, "succeeded", 60).await;
    let (_, all) = call_with_token(
        app,
        &s.member,
        Method::GET,
        &format!("/api/v1/workloads/{id}/logs?from=0"),
        None,
    )
    .await;
    let text = all["text"].as_str().expect("text");
    let line = |case: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{case}: ")))
            .unwrap_or_else(|| panic!("no {case} in {text} ({done})"))
            .to_owned()
    };
    let uid: u32 = line("uid").parse().expect("uid");
    assert!(uid >= 200_000, "{text}");
    assert_eq!(line("credential"), "No such file or directory");
    assert_eq!(line("credential_abs"), "No such file or directory");
    assert_eq!(line("runs"), "No such file or directory");
    // A 1g.10gb slice: its GPU instance's and compute instance's capabilities, one GPU.
    assert_eq!(line("caps"), "2");
    assert_eq!(line("gpus"), "1");

    // A job that outgrows its memory limit fails, and says why.
    let (st, v) = call_with_token(
        app,
        &s.member,
        Method::POST,
        "/api/v1/jobs",
        Some(json!({"allocation_id": s.alloc,
                    "command": "python3 -c 'b = bytearray(2 * 1024**3)'"})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let hog = v["id"].as_str().expect("id").to_owned();
    let failed = wait_workload(app, &s.member, &hog, "failed", 60).await;
    assert_eq!(
        failed["message"],
        "the job exited with code 137 (killed: out of memory (the workload's memory limit is \
         768 MiB))",
        "{failed}"
    );

    // Even with the node's credential, a report cannot carry a malformed log piece for a
    // workload the node runs.
    let (st, v) = call_with_token(
        app,
        &s.member,
        Method::POST,
        "/api/v1/jobs",
        Some(json!({"allocation_id": s.alloc, "command": "sleep 60"})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let sleeper = v["id"].as_str().expect("id").to_owned();
    wait_workload(app, &s.member, &sleeper, "running", 30).await;
    let id = sleeper.clone();
    let cred: Value = serde_json::from_slice(
        &std::fs::read(s.agent.state.path().join("credential.json")).expect("credential"),
    )
    .expect("json");
    let run = id.clone();
    let forged = json!({"at_unix_ms": 0, "workloads": [{
        "id": run, "phase": "running", "exit_code": null, "message": null,
        "endpoint": null, "kernel_last_activity_ms": null,
        "log": {"offset": 0, "len": 999, "text": "short"}}]});
    let r = reqwest::Client::new()
        .post(format!("{}/agent/v1/workloads", app.base))
        .bearer_auth(cred["credential"].as_str().expect("credential"))
        .json(&forged)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 422);
    let (st, _) = call_with_token(
        app,
        &s.member,
        Method::POST,
        &format!("/api/v1/workloads/{sleeper}/stop"),
        None,
    )
    .await;
    assert_eq!(st, 200);
    wait_workload(app, &s.member, &sleeper, "cancelled", 30).await;
    s.agent.stop().await;
}

on_both_databases!(
    a_hostile_job_is_contained_by_the_node_sandbox,
    a_notebook_runs_jupyterlab_behind_the_proxy,
    a_job_streams_its_output_and_ends_with_its_exit_code,
    an_idle_notebook_is_reclaimed_but_a_busy_kernel_never,
);
