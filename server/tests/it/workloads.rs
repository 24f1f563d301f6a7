//! Workloads end to end: a real `tessera-agent --simulate` runs a real JupyterLab (from
//! PyPI) and real job processes through its process executor; the server proxies the
//! notebook (HTTP and the kernel WebSocket), streams job logs, stops process groups and
//! reclaims idle notebooks.
//!
//! Needs `jupyter lab` on PATH (`cargo xtask test` installs JupyterLab).

use crate::allocations::{request, set_quota, team, wait_for_state};
use crate::on_both_databases;
use crate::support::agent_bin;
use crate::support::{
    AdminClient, Db, TestApp, assert_message_contains, call_with_token, get_as, post_as, wait_until,
};
use futures_util::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// A simulated H100 node whose agent runs workloads; stopping it (SIGINT) stops them.
pub(crate) struct WorkloadAgent {
    child: tokio::process::Child,
    state: tempfile::TempDir,
}

/// The agent's state folder, relative to its working folder (the temp dir).
const AGENT_STATE: &str = "agent-state";

impl WorkloadAgent {
    /// Where the agent keeps its credential and runs.
    pub(crate) fn state_dir(&self) -> std::path::PathBuf {
        self.state.path().join(AGENT_STATE)
    }

    pub(crate) async fn start(a: &AdminClient, hostname: &str) -> WorkloadAgent {
        let (s, jt) = a
            .post("/api/v1/join-tokens", json!({"note": "workloads"}))
            .await;
        assert_eq!(s, 201);
        Self::start_at(
            &a.app.base,
            jt["secret"].as_str().expect("secret"),
            hostname,
        )
    }

    /// An agent joining the server at `server` with the join token `secret`.
    pub(crate) fn start_at(server: &str, secret: &str, hostname: &str) -> WorkloadAgent {
        Self::start_with(server, secret, hostname, &[], &[])
    }

    /// The same, started through `wrap` (a program and its arguments, e.g. `nsenter
    /// --net=…`, which must exec the agent in its place) and with `extra` arguments.
    pub(crate) fn start_with(
        server: &str,
        secret: &str,
        hostname: &str,
        wrap: &[String],
        extra: &[String],
    ) -> WorkloadAgent {
        let state = tempfile::tempdir().expect("tempdir");
        let mut cmd = match wrap.split_first() {
            Some((program, args)) => {
                let mut c = tokio::process::Command::new(program);
                c.args(args).arg(agent_bin());
                c
            }
            None => tokio::process::Command::new(agent_bin()),
        };
        let child = cmd
            .args(["--simulate", "--gpus", "H100-80GB", "--hostname", hostname])
            .args(["--server", server, "--join-token", secret])
            .arg("--manage-mig")
            // A relative state folder, as `cargo xtask run` gives its simulated nodes
            // (`data/sim/…`): crun and the workloads must still find their paths.
            .current_dir(state.path())
            .args(["--state-dir", AGENT_STATE])
            .args(["--heartbeat-interval-s", "1", "--reconcile-interval-s", "1"])
            // No telemetry: the idle test decides on the kernel signal alone.
            .args(["--telemetry-interval-s", "3600"])
            .args(["--workload-interval-ms", "300", "--stop-workloads-on-exit"])
            // A fixed memory limit, so that the hostile test can reach it quickly.
            .args(["--sandbox-memory-mib", "768"])
            .args(extra)
            .kill_on_drop(true)
            .spawn()
            .expect("start tessera-agent");
        WorkloadAgent { child, state }
    }

    /// Asks the agent to shut down (it stops its workloads first) and waits.
    pub(crate) async fn stop(mut self) {
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
    team: String,
}

/// Names the team, its node and its member after `prefix` and the database.
async fn setup(db: Db, prefix: &str) -> Setup {
    let name = &format!("{prefix}-{}", format!("{db:?}").to_lowercase());
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
        team: t.id,
    }
}

pub(crate) async fn get(app: &TestApp, token: &str, id: &str) -> Value {
    let (s, v) = get_as(app, token, &format!("/api/v1/workloads/{id}")).await;
    assert_eq!(s, 200, "{v}");
    v
}

/// Submits a job running `command` on allocation `alloc`, as `token`: `(status, job)`.
pub(crate) async fn job_on(app: &TestApp, token: &str, alloc: &str, command: &str) -> (u16, Value) {
    let body = json!({"allocation_id": alloc, "command": command});
    post_as(app, token, "/api/v1/jobs", body).await
}

/// Opens notebook `name` on allocation `alloc`, as `token`: `(status, notebook)`.
pub(crate) async fn notebook_on(
    app: &TestApp,
    token: &str,
    alloc: &str,
    name: &str,
) -> (u16, Value) {
    let body = json!({"allocation_id": alloc, "name": name});
    post_as(app, token, "/api/v1/notebooks", body).await
}

/// Workload `id`'s log from byte `from` on, as `token`: `(status, body)`.
pub(crate) async fn logs_from(app: &TestApp, token: &str, id: &str, from: u64) -> (u16, Value) {
    get_as(
        app,
        token,
        &format!("/api/v1/workloads/{id}/logs?from={from}"),
    )
    .await
}

/// Stops workload `id`, as `token`: `(status, body)`.
pub(crate) async fn stop_workload(app: &TestApp, token: &str, id: &str) -> (u16, Value) {
    let path = format!("/api/v1/workloads/{id}/stop");
    call_with_token(app, token, Method::POST, &path, None).await
}

pub(crate) async fn wait_workload(
    app: &TestApp,
    token: &str,
    id: &str,
    state: &str,
    secs: u64,
) -> Value {
    let what = format!("workload never became {state}");
    wait_until(&what, secs, 300, || async {
        let v = get(app, token, id).await;
        (v["state"] == state, v)
    })
    .await
}

/// Polls notebook `id` until its kernel reports `busy` (at most 30 s).
async fn wait_kernel_busy(app: &TestApp, token: &str, id: &str, busy: bool) {
    let what = if busy {
        "kernel never reported busy"
    } else {
        "kernel stayed busy"
    };
    wait_until(what, 30, 200, || async {
        let v = get(app, token, id).await;
        (v["activity"]["kernel_busy"] == busy, v)
    })
    .await;
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
    let (st, v) = notebook_on(&s.a.app, &s.member, &s.alloc, name).await;
    assert_eq!(st, 201, "{v}");
    v
}

/// Launches a notebook named `prefix` and a fresh suffix: `(its proxied base path, it)`.
async fn launch_fresh(s: &Setup, prefix: &str) -> (String, Value) {
    let nb_name = format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let nb = launch(s, &nb_name).await;
    (format!("/user/{}/{nb_name}/", s.member_name), nb)
}

/// `GET {base}api/contents` through the proxy as `token` (or with no credentials): the
/// status.
async fn contents_status(
    c: &reqwest::Client,
    app: &TestApp,
    base: &str,
    token: Option<&str>,
) -> u16 {
    let mut rb = c.get(app.url(&format!("{base}api/contents")));
    if let Some(token) = token {
        rb = rb.bearer_auth(token);
    }
    rb.send().await.expect("request").status().as_u16()
}

/// Starts a python3 kernel in the notebook at `base` with an API token: the response.
async fn post_kernel(
    c: &reqwest::Client,
    app: &TestApp,
    token: &str,
    base: &str,
) -> reqwest::Response {
    c.post(app.url(&format!("{base}api/kernels")))
        .bearer_auth(token)
        .json(&json!({"name": "python3"}))
        .send()
        .await
        .expect("request")
}

pub(crate) type KernelSocket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// Opens a kernel's channels WebSocket at `url` (whose host may be a notebook origin),
/// connecting to the app at `addr`, with extra request headers. `Err(status)` when the
/// upgrade is refused.
pub(crate) async fn kernel_socket(
    addr: std::net::SocketAddr,
    url: &str,
    headers: &[(&'static str, String)],
) -> Result<KernelSocket, u16> {
    let mut req =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url)
            .expect("ws request");
    for (k, v) in headers {
        req.headers_mut()
            .insert(*k, v.parse().expect("header value"));
    }
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("tcp");
    match tokio_tungstenite::client_async(req, tcp).await {
        Ok((ws, resp)) => {
            assert_eq!(resp.status(), 101);
            Ok(ws)
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("websocket: {e}"),
    }
}

/// Runs `code` in a kernel over the proxied WebSocket with an API token.
async fn run_in_kernel(server: &str, token: &str, base: &str, kernel: &str, code: &str) -> String {
    let addr = server.trim_start_matches("http://");
    let url = format!("ws://{addr}{base}api/kernels/{kernel}/channels");
    let ws = kernel_socket(
        addr.parse().expect("addr"),
        &url,
        &[("authorization", format!("Bearer {token}"))],
    )
    .await
    .expect("websocket through the proxy");
    execute(ws, code).await
}

/// Sends an `execute_request` and returns its `text/plain` result.
async fn execute(mut ws: KernelSocket, code: &str) -> String {
    execute_on(&mut ws, code, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `code` on an open kernel socket; `Err` when the socket fails or no result comes
/// within `within`.
pub(crate) async fn execute_on<S>(
    ws: &mut tokio_tungstenite::WebSocketStream<S>,
    code: &str,
    within: Duration,
) -> Result<String, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
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
        .map_err(|e| format!("send: {e}"))?;
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = tokio::time::timeout(left, ws.next())
            .await
            .map_err(|_| "no execute_result in time".to_owned())?
            .ok_or("the socket closed")?
            .map_err(|e| format!("socket: {e}"))?;
        let Message::Text(t) = next else { continue };
        let v: Value = serde_json::from_str(&t).map_err(|e| format!("json: {e}"))?;
        if v["parent_header"]["msg_id"] == msg_id.as_str()
            && v["header"]["msg_type"] == "execute_result"
        {
            return v["content"]["data"]["text/plain"]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("no text in {v}"));
        }
    }
}

/// Demoted to viewer, a member launches nothing more; removed from the team, they lose
/// their notebook at once and what they held there ends (allocation released, its
/// workloads stopped).
async fn membership_changes_take_effect_at_once(db: Db) {
    let s = setup(db, "leave").await;
    let app = &s.a.app;
    let nb = launch(&s, "stays").await;
    let id = nb["id"].as_str().expect("id").to_owned();
    let user = s.a.user(&s.member_name).await;
    let member_path = format!(
        "/api/v1/teams/{}/members/{}",
        s.team,
        user["id"].as_str().expect("user id")
    );
    let base = format!("/user/{}/stays/", s.member_name);
    let proxied = || async {
        reqwest::Client::new()
            .get(app.url(&format!("{base}api/contents")))
            .bearer_auth(&s.member)
            .send()
            .await
            .expect("request")
            .status()
            .as_u16()
    };
    assert_ne!(proxied().await, 404, "the owner reaches their notebook");

    let (st, v) =
        s.a.call(Method::PUT, &member_path, Some(json!({"role": "viewer"})))
            .await;
    assert_eq!(st, 200, "{v}");
    for (path, body) in [
        (
            "/api/v1/jobs",
            json!({"allocation_id": s.alloc, "command": "true"}),
        ),
        (
            "/api/v1/notebooks",
            json!({"allocation_id": s.alloc, "name": "second"}),
        ),
    ] {
        let (st, v) = call_with_token(app, &s.member, Method::POST, path, Some(body)).await;
        assert_eq!(st, 403, "a viewer launched through {path}: {v}");
    }
    assert_ne!(
        proxied().await,
        404,
        "a viewer still reaches their own notebook"
    );

    let (st, v) = s.a.call(Method::DELETE, &member_path, None).await;
    assert!(st == 200 || st == 204, "{st} {v}");
    assert_eq!(
        proxied().await,
        404,
        "removed: the notebook is gone for them at once"
    );
    let ended = wait_for_state(&s.a, &s.alloc, "ended").await;
    let (_, events) =
        s.a.call(
            Method::GET,
            &format!("/api/v1/allocations/{}", s.alloc),
            None,
        )
        .await;
    assert!(
        events.to_string().contains("no longer a member"),
        "{ended}\n{events}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, w) =
            s.a.call(Method::GET, &format!("/api/v1/workloads/{id}"), None)
                .await;
        let state = w["state"].as_str().unwrap_or("").to_owned();
        if ["stopped", "cancelled", "lost", "failed"].contains(&state.as_str()) {
            break;
        }
        assert!(Instant::now() < deadline, "the notebook still runs: {w}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    s.agent.stop().await;
}

/// A client that follows no redirects and reaches `host` (a notebook's origin) at `addr`.
fn origin_client(host: &str, addr: std::net::SocketAddr) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .resolve(host, addr)
        .build()
        .expect("client")
}

/// A browser opening the notebook: signed in on the portal, it is sent to the notebook's
/// own origin with a one-time code, and gets a pass there. Every attack on that flow and
/// on the origin's boundary is refused; the kernel works from the origin's own pages.
async fn notebook_origin_boundary(s: &Setup, base: &str, kernel: &str) {
    let app = &s.a.app;
    let cookie = crate::support::login(app, &s.member_name, crate::allocations::PW).await;
    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let portal_get = |path: String| {
        plain
            .get(app.url(&path))
            .header("cookie", &cookie)
            .header("accept", "text/html")
            .send()
    };
    // The portal never serves the notebook to a browser: it redirects, once per visit.
    let r = portal_get(format!("{base}lab?reset"))
        .await
        .expect("request");
    assert_eq!(r.status(), 303);
    let entry = reqwest::Url::parse(r.headers()["location"].to_str().expect("location"))
        .expect("entry url");
    let host = entry.host_str().expect("host").to_owned();
    assert!(
        host.starts_with("nb-") && host.ends_with(".localhost") && host.len() == 45,
        "{entry}"
    );
    assert_eq!(entry.port(), Some(app.addr.port()));
    assert_eq!(entry.path(), "/_tessera/enter");
    let origin = format!("http://{host}:{}", app.addr.port());
    // A POST or a WebSocket with the portal session on the portal's origin: not served.
    let r = plain
        .post(app.url(&format!("{base}api/kernels")))
        .header("cookie", &cookie)
        .header("origin", &app.base)
        .json(&json!({"name": "python3"}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 404);
    let nb = origin_client(&host, app.addr);
    // The portal's session means nothing on the notebook's origin.
    let r = nb
        .get(format!("{origin}{base}api/contents"))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 401);
    let r = nb
        .get(format!("{origin}{base}lab"))
        .header("cookie", &cookie)
        .header("accept", "text/html")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 303, "back to the portal to get in");
    assert_eq!(r.headers()["location"], app.url(&format!("{base}lab")));
    // A code for this notebook does not open another notebook's origin.
    let other_host = format!(
        "{}.localhost",
        tessera_domain::workload::notebook_host_label(tessera_domain::ids::WorkloadId(
            uuid::Uuid::now_v7()
        ))
    );
    let other = origin_client(&other_host, app.addr);
    let r = other
        .get(entry.as_str().replace(&host, &other_host))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 403, "a code is bound to its notebook");
    // The code, once: a pass cookie, host-only and out of scripts' reach.
    let r = nb.get(entry.as_str()).send().await.expect("request");
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], format!("{base}lab?reset"));
    let set = r.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .to_owned();
    assert!(set.starts_with("tessera_notebook=tnp_"), "{set}");
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Lax"),
        "{set}"
    );
    assert!(!set.to_ascii_lowercase().contains("domain="), "{set}");
    let pass = set.split(';').next().expect("pair").to_owned();
    let r = nb.get(entry.as_str()).send().await.expect("request");
    assert_eq!(r.status(), 403, "a code works once");
    assert!(entry.query().unwrap_or_default().contains("code=tnc_"));

    let with_pass = |req: reqwest::RequestBuilder| req.header("cookie", &pass);
    let r = with_pass(nb.get(format!("{origin}{base}api/contents")))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    // No upstream cookie reaches the browser.
    assert!(r.headers().get("set-cookie").is_none());
    // The pass opens this notebook only, and none of the portal's routes exist here.
    for path in [
        "/api/v1/me".to_owned(),
        "/fn/current_user".to_owned(),
        "/".to_owned(),
        "/user/admin/other/api/contents".to_owned(),
        format!("{base}..%2f..%2fadmin/x/api/contents"),
        format!("{base}%2e%2e/%2e%2e/admin/x/api"),
    ] {
        let r = with_pass(nb.get(format!("{origin}{path}")))
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 404, "{path}");
        let body = r.text().await.unwrap_or_default();
        assert!(!body.contains("username"), "{path}: {body}");
    }
    let r = with_pass(nb.post(format!("{origin}/api/v1/tokens")))
        .header("origin", &origin)
        .json(&json!({"name": "stolen"}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 404);
    // Changes only from the notebook's own pages.
    for foreign in [app.base.as_str(), "http://evil.localhost:1", "null"] {
        let r = with_pass(nb.post(format!("{origin}{base}api/kernels")))
            .header("origin", foreign)
            .header("sec-fetch-site", "cross-site")
            .json(&json!({"name": "python3"}))
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 403, "{foreign}");
    }
    let r = with_pass(nb.post(format!("{origin}{base}api/kernels")))
        .header("origin", &origin)
        .header("sec-fetch-site", "same-origin")
        .json(&json!({"name": "python3"}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    // The kernel's WebSocket: refused from any other origin, or with no origin.
    let ws_url = format!(
        "ws://{host}:{}{base}api/kernels/{kernel}/channels",
        app.addr.port()
    );
    for foreign in [
        Some(app.base.clone()),
        Some("http://evil.localhost".into()),
        None,
    ] {
        let mut h = vec![("cookie", pass.clone())];
        if let Some(o) = &foreign {
            h.push(("origin", o.clone()));
        }
        let r = kernel_socket(app.addr, &ws_url, &h).await;
        assert_eq!(r.err(), Some(403), "{foreign:?}");
    }
    // The portal's session cookie on the notebook origin's WebSocket: no way in either.
    let r = kernel_socket(
        app.addr,
        &ws_url,
        &[("cookie", cookie.clone()), ("origin", origin.clone())],
    )
    .await;
    assert_eq!(r.err(), Some(401));
    let ws = kernel_socket(
        app.addr,
        &ws_url,
        &[("cookie", pass.clone()), ("origin", origin.clone())],
    )
    .await
    .expect("the notebook's own page opens its kernel");
    assert_eq!(execute(ws, "6*7").await, "42");
    // The other team's member, signed in, gets the 404 of nothing, and no code.
    let other_cookie = {
        let (st, v) = call_with_token(app, &s.other, Method::GET, "/api/v1/me", None).await;
        assert_eq!(st, 200, "{v}");
        let name = v["username"].as_str().expect("username").to_owned();
        crate::support::login(app, &name, crate::allocations::PW).await
    };
    let r = plain
        .get(app.url(&format!("{base}lab")))
        .header("cookie", &other_cookie)
        .header("accept", "text/html")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 404);
}

async fn a_notebook_runs_jupyterlab_behind_the_proxy(db: Db) {
    let s = setup(db, "nb").await;
    let app = &s.a.app;
    let (base, nb) = launch_fresh(&s, "lab").await;
    let id = nb["id"].as_str().expect("id").to_owned();
    assert_eq!(nb["state"], "pending");
    let started = Instant::now();
    let running = wait_workload(app, &s.member, &id, "running", 120).await;
    eprintln!("notebook ready in {:?}", started.elapsed());
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
    let r = post_kernel(&c, app, &s.member, &base).await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    let kernel: Value = r.json().await.expect("json");
    let kernel_id = kernel["id"].as_str().expect("kernel id");
    assert_eq!(
        run_in_kernel(&app.base, &s.member, &base, kernel_id, "1+1").await,
        "2"
    );
    notebook_origin_boundary(&s, &base, kernel_id).await;

    // The JupyterLab page loads, without the notebook's token in it.
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    let wid = tessera_domain::ids::WorkloadId::parse(&id).expect("uuid");
    let row = store.workload(wid).await.expect("load").expect("row");
    let secret = app
        .side_services()
        .await
        .0
        .workloads
        .notebook_token(&row.w)
        .expect("the token opens")
        .expect("token");
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
    assert_eq!(contents_status(&c, app, &base, Some(&s.other)).await, 404);
    assert_eq!(contents_status(&c, app, &base, None).await, 401);

    // A second notebook on the same allocation is refused; the name is taken too.
    let (st, v) = notebook_on(app, &s.member, &s.alloc, "other").await;
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["error"]["field"], "allocation_id", "{v}");

    // Stop: the whole process group goes, the proxy answers 404.
    let needle = format!("--ServerApp.base_url={base}");
    assert!(!processes_with(&needle).is_empty(), "JupyterLab not found");
    let (st, v) = stop_workload(app, &s.member, &id).await;
    assert_eq!(st, 200, "{v}");
    let stopped = wait_workload(app, &s.member, &id, "stopped", 30).await;
    assert_message_contains(&stopped, "stopped by");
    wait_no_process(&needle).await;
    assert_eq!(contents_status(&c, app, &base, Some(&s.member)).await, 404);
    s.agent.stop().await;
}

async fn a_job_streams_its_output_and_ends_with_its_exit_code(db: Db) {
    let s = setup(db, "job").await;
    let app = &s.a.app;
    let (st, v) = job_on(
        app,
        &s.member,
        &s.alloc,
        "echo one; echo \"devices=$CUDA_VISIBLE_DEVICES\"; sleep 2; echo two; exit 3",
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    // The first line arrives while the job still runs.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut log = Value::Null;
    while Instant::now() < deadline {
        let (_, l) = logs_from(app, &s.member, &id, 0).await;
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
    let (_, all) = logs_from(app, &s.member, &id, 0).await;
    let text = all["text"].as_str().expect("text");
    assert!(text.contains("one\n") && text.contains("two\n"), "{all}");
    assert!(text.contains("devices=MIG-"), "{all}");
    assert_eq!(all["complete"], true, "{all}");
    // Following from `next` returns nothing new.
    let next = all["next"].as_u64().expect("next");
    let (_, more) = logs_from(app, &s.member, &id, next).await;
    assert_eq!(more["text"], "", "{more}");
    // A resent log piece is stored once.
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    let wid = tessera_domain::ids::WorkloadId::parse(&id).expect("uuid");
    let again = store
        .append_log(wid, 0, 4, "one\n", true, 1 << 20)
        .await
        .expect("append");
    assert_eq!(again, next);
    // Another team's member cannot see it.
    let (st, _) = get_as(app, &s.other, &format!("/api/v1/workloads/{id}/logs")).await;
    assert_eq!(st, 404);

    // Cancel kills a running job's whole process group.
    let marker = format!("sleep 3{}", 100 + u32::from(matches!(db, Db::Postgres)));
    let (st, v) = job_on(
        app,
        &s.member,
        &s.alloc,
        &format!("{marker} & {marker}; wait"),
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
    let (st, _) = stop_workload(app, &s.member, &id).await;
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
    let submit_and_follow = |command: &str, more: &[&str]| {
        let mut args = vec![
            "job",
            "submit",
            "--allocation",
            &s.alloc,
            "--command",
            command,
        ];
        args.extend_from_slice(more);
        args.push("--follow");
        cli(&args)
    };
    let out = submit_and_follow("echo cli-says-$GREETING", &["--env", "GREETING=hi"]);
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
    let out = submit_and_follow("exit 4", &[]);
    assert_eq!(out.status.code(), Some(1), "a failed job fails the command");
    let out = cli(&["notebook", "start", "--allocation", "not-an-id"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("error:"));
    s.agent.stop().await;
}

async fn an_idle_notebook_is_reclaimed_but_a_busy_kernel_never(db: Db) {
    let s = setup(db, "idle").await;
    let app = &s.a.app;
    let (base, nb) = launch_fresh(&s, "idle").await;
    let id = nb["id"].as_str().expect("id").to_owned();
    wait_workload(app, &s.member, &id, "running", 120).await;
    let c = reqwest::Client::new();
    let r = post_kernel(&c, app, &s.member, &base).await;
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
    wait_kernel_busy(app, &s.member, &id, true).await;
    // The same services over the same database, with a clock 2 hours ahead.
    let (services, system) = app.side_services().await;
    let later = chrono::Utc::now() + chrono::Duration::hours(2);
    let r = services.workloads.tick(&system, later).await.expect("tick");
    assert_eq!(r.reclaimed_idle, 0, "a busy kernel was reclaimed");
    assert_eq!(busy.await.expect("kernel"), "7");
    // Idle now: the kernel is quiet, the GPU has no telemetry. Two hours on, it goes.
    wait_kernel_busy(app, &s.member, &id, false).await;
    // Within the warning window (stopped 60 min after it went idle, warned from 50):
    // its owner is told when it will stop, once however often the pass looks.
    let warn_at = chrono::Utc::now() + chrono::Duration::minutes(55);
    for _ in 0..2 {
        let r = services
            .workloads
            .tick(&system, warn_at)
            .await
            .expect("tick");
        assert_eq!(r.reclaimed_idle, 0, "warned, not stopped");
    }
    let kinds = outbox_kinds_about(app, &id).await;
    assert_eq!(
        kinds
            .iter()
            .filter(|k| *k == "workload.idle_warning")
            .count(),
        1,
        "{kinds:?}"
    );
    let r = services.workloads.tick(&system, later).await.expect("tick");
    assert_eq!(r.reclaimed_idle, 1);
    let stopped = wait_workload(app, &s.member, &id, "stopped", 30).await;
    assert_message_contains(&stopped, "without kernel or GPU activity");
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
    let s = setup(db, "hostile").await;
    let app = &s.a.app;
    let state = s.agent.state_dir().display().to_string();
    let script = format!(
        "t() {{ n=$1; shift; printf '%s: %s\\n' \"$n\" \"$( (\"$@\") 2>&1 | head -n1 | sed 's/^.*: //')\"; }}; \
         t uid id -u; \
         t credential cat $TESSERA_WORKSPACE/../../../credential.json; \
         t credential_abs cat {state}/credential.json; \
         t runs ls {state}/workloads/runs; \
         t caps sh -c 'ls /dev/nvidia-caps | wc -l'; \
         t gpus sh -c 'ls /dev | grep -c \"^nvidia[0-9]\"'"
    );
    let (st, v) = job_on(app, &s.member, &s.alloc, &script).await;
    assert_eq!(st, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    let done = wait_workload(app, &s.member, &id, "succeeded", 60).await;
    let (_, all) = logs_from(app, &s.member, &id, 0).await;
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
    let (st, v) = job_on(app, &s.member, &s.alloc, "sleep 60").await;
    assert_eq!(st, 201, "{v}");
    let sleeper = v["id"].as_str().expect("id").to_owned();
    wait_workload(app, &s.member, &sleeper, "running", 30).await;
    let id = sleeper.clone();
    let cred: Value = serde_json::from_slice(
        &std::fs::read(s.agent.state_dir().join("credential.json")).expect("credential"),
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
    let (st, _) = stop_workload(app, &s.member, &sleeper).await;
    assert_eq!(st, 200);
    wait_workload(app, &s.member, &sleeper, "cancelled", 30).await;
    s.agent.stop().await;
}

on_both_databases!(
    a_hostile_job_is_contained_by_the_node_sandbox,
    membership_changes_take_effect_at_once,
    a_notebook_runs_jupyterlab_behind_the_proxy,
    a_job_streams_its_output_and_ends_with_its_exit_code,
    an_idle_notebook_is_reclaimed_but_a_busy_kernel_never,
);

/// The kinds of the outbox events about `subject` (docs/notifications.md), oldest first.
pub(crate) async fn outbox_kinds_about(app: &TestApp, subject: &str) -> Vec<String> {
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    let id = uuid::Uuid::parse_str(subject).expect("uuid");
    let sql = "SELECT kind FROM outbox_events WHERE subject_id = $1 ORDER BY created_at, id";
    match &store {
        tessera_core::store::Store::Sqlite(p) => {
            sqlx::query_scalar(sql).bind(id).fetch_all(p).await
        }
        tessera_core::store::Store::Postgres(p) => {
            sqlx::query_scalar(sql).bind(id).fetch_all(p).await
        }
    }
    .expect("outbox")
}
