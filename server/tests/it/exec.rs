//! `tessera exec` end to end: a real `tessera-agent --simulate` takes the session the
//! server offers, runs the command inside the job's crun sandbox and streams it back
//! through the server's WebSocket (`GET /api/v1/workloads/{id}/exec`); the CLI's
//! `tessera exec` passes the exit code through.

use crate::allocations::{add_member, request, set_quota, team, wait_for_state};
use crate::on_both_databases;
use crate::support::{AdminClient, Db, TestApp, call_with_token};
use crate::workloads::{WorkloadAgent, job_on, logs_from, wait_workload};
use crate::ws_connect::connect_with_token;
use futures_util::{SinkExt, StreamExt};
use reqwest::Method;
use std::time::{Duration, Instant};
use tessera_domain::wire::exec_frame::{self, Channel};
use tokio_tungstenite::tungstenite::Message;

pub(crate) type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// What a session gave back.
#[derive(Debug, Default)]
pub(crate) struct Output {
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) code: Option<i32>,
}

/// Opens an exec session; `Err((status, body))` when the server refuses the upgrade.
async fn open(
    app: &TestApp,
    token: &str,
    id: &str,
    argv: &[&str],
    tty: bool,
) -> Result<Socket, (u16, String)> {
    open_rank(app, token, id, 0, argv, tty).await
}

/// [`open`] in rank `rank` of a multi-node job.
pub(crate) async fn open_rank(
    app: &TestApp,
    token: &str,
    id: &str,
    rank: u32,
    argv: &[&str],
    tty: bool,
) -> Result<Socket, (u16, String)> {
    let addr = app.base.trim_start_matches("http://");
    let mut query: Vec<String> = argv
        .iter()
        .map(|a| format!("command={}", tessera_server::cli::encode(a)))
        .collect();
    query.push(format!("tty={tty}"));
    query.push(format!("rank={rank}"));
    let url = format!("ws://{addr}/api/v1/workloads/{id}/exec?{}", query.join("&"));
    match connect_with_token(addr, &url, token).await {
        Ok((ws, resp)) => {
            assert_eq!(resp.status(), 101);
            Ok(ws)
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err((
            r.status().as_u16(),
            String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned(),
        )),
        Err(e) => panic!("websocket: {e}"),
    }
}

/// `tessera` against the server at `base` as `token`, its configuration under
/// `config_home`; the caller adds what to run.
fn tessera(base: &str, token: &str, config_home: &std::path::Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.env("TESSERA_URL", base)
        .env("TESSERA_TOKEN", token)
        .env("XDG_CONFIG_HOME", config_home);
    cmd
}

pub(crate) async fn send(ws: &mut Socket, channel: Channel, payload: &[u8]) {
    ws.send(Message::Binary(exec_frame::encode(channel, payload).into()))
        .await
        .expect("send");
}

/// Reads the session until it closes (or `until` shows up in stdout, when given).
pub(crate) async fn read(ws: &mut Socket, until: Option<&str>) -> Output {
    let mut out = Output::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(next) = tokio::time::timeout(left, ws.next()).await else {
            panic!("the session did not end in time: {out:?}");
        };
        match next {
            Some(Ok(Message::Binary(b))) => match exec_frame::decode(&b) {
                Some((Channel::Stdout, d)) => out.stdout.push_str(&String::from_utf8_lossy(d)),
                Some((Channel::Stderr, d)) => out.stderr.push_str(&String::from_utf8_lossy(d)),
                Some((Channel::Exit, d)) => {
                    let e: exec_frame::Exit = serde_json::from_slice(d).expect("exit json");
                    out.code = Some(e.code);
                }
                other => panic!("unexpected frame {other:?}"),
            },
            Some(Ok(Message::Close(_))) | None => return out,
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("socket: {e} ({out:?})"),
        }
        if until.is_some_and(|u| out.stdout.contains(u)) {
            return out;
        }
    }
}

/// Runs `argv` without a terminal and with its input closed.
async fn run(app: &TestApp, token: &str, id: &str, argv: &[&str]) -> Output {
    let mut ws = open(app, token, id, argv, false)
        .await
        .unwrap_or_else(|e| panic!("exec refused: {e:?}"));
    send(&mut ws, Channel::Stdin, b"").await;
    read(&mut ws, None).await
}

async fn submit(app: &TestApp, token: &str, alloc: &str, command: &str) -> String {
    let (st, v) = job_on(app, token, alloc, command).await;
    assert_eq!(st, 201, "{v}");
    v["id"].as_str().expect("id").to_owned()
}

/// A team viewer's API token.
async fn viewer(a: &AdminClient, team: &str, name: &str) -> String {
    let user = format!("{name}-viewer");
    add_member(a, team, &user, "exec-viewer-password-1", "viewer").await
}

/// Commands run in a running job's sandbox: output, exit code, stdin, a terminal; who may
/// (the owner; not another team, not a viewer), the audit trail, the CLI, and a job that
/// ended.
async fn exec_runs_commands_inside_a_running_job(db: Db) {
    let name = format!("exec-{}", format!("{db:?}").to_lowercase());
    let a = AdminClient::new(db).await;
    let t = team(&a, &name).await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let other = team(&a, &format!("{name}-other")).await;
    let viewer = viewer(&a, &t.id, &name).await;
    let agent = WorkloadAgent::start(&a, &format!("{name}-node")).await;
    let app = &a.app;
    let (s, v) = request(app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let alloc = v["id"].as_str().expect("id").to_owned();
    wait_for_state(&a, &alloc, "active").await;
    let job = submit(app, &t.member, &alloc, "echo job-uid $(id -u); sleep 300").await;
    wait_workload(app, &t.member, &job, "running", 60).await;

    // Output on both channels and the exit code.
    let started = Instant::now();
    let out = run(
        app,
        &t.member,
        &job,
        &["sh", "-c", "echo out-$((6*7)); echo err >&2; exit 7"],
    )
    .await;
    let round_trip = started.elapsed();
    assert_eq!(out.stdout, "out-42\n", "{out:?}");
    assert_eq!(out.stderr, "err\n", "{out:?}");
    assert_eq!(out.code, Some(7), "{out:?}");
    eprintln!("exec round trip (one-line command): {round_trip:?}");

    // Standard input reaches the command; an empty stdin frame closes it.
    let mut ws = open(app, &t.member, &job, &["cat"], false)
        .await
        .expect("exec cat");
    send(&mut ws, Channel::Stdin, b"piped ").await;
    send(&mut ws, Channel::Stdin, b"input").await;
    send(&mut ws, Channel::Stdin, b"").await;
    let out = read(&mut ws, None).await;
    assert_eq!((out.stdout.as_str(), out.code), ("piped input", Some(0)));

    // Inside the same sandbox as the job: its uid (a team uid, not root), its
    // environment, and nothing of the node (the agent's state, host processes).
    let state = agent.state_dir().display().to_string();
    let script = format!(
        "t() {{ n=$1; shift; printf '%s: %s\\n' \"$n\" \"$( (\"$@\") 2>&1 | head -n1 | sed 's/^.*: //')\"; }}; \
         t uid id -u; \
         t workspace sh -c 'test -n \"$TESSERA_WORKSPACE\" && echo set'; \
         t credential cat {state}/credential.json; \
         t runs ls {state}/workloads/runs; \
         t agents sh -c 'cat /proc/[0-9]*/cmdline 2>/dev/null | tr \"\\0\" \" \" | grep -c \"tessera-agen[t]\"'; \
         t pid1 sh -c 'tr \"\\0\" \" \" < /proc/1/cmdline'"
    );
    let out = run(app, &t.member, &job, &["sh", "-c", &script]).await;
    assert_eq!(out.code, Some(0), "{out:?}");
    let line = |case: &str| {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{case}: ")))
            .unwrap_or_else(|| panic!("no {case} in {out:?}"))
            .to_owned()
    };
    let uid: u32 = line("uid").parse().expect("uid");
    assert!(uid >= 200_000, "{out:?}");
    let (_, log) = logs_from(app, &t.member, &job, 0).await;
    assert!(
        log["text"]
            .as_str()
            .is_some_and(|l| l.contains(&format!("job-uid {uid}"))),
        "exec ran as {uid}, the job as: {log}"
    );
    assert_eq!(line("workspace"), "set");
    assert_eq!(line("credential"), "No such file or directory");
    assert_eq!(line("runs"), "No such file or directory");
    assert_eq!(line("agents"), "0");
    // PID 1 is the job's own wrapper: its own PID namespace.
    assert!(line("pid1").contains("tessera-run"), "{out:?}");

    // A terminal: typed input is echoed and run, its size follows resizes, `exit 3` ends
    // it with 3.
    let mut ws = open(app, &t.member, &job, &["sh"], true)
        .await
        .expect("exec with a tty");
    send(&mut ws, Channel::Resize, br#"{"cols":101,"rows":33}"#).await;
    send(&mut ws, Channel::Stdin, b"echo hi-$((40+2))\n").await;
    let first = read(&mut ws, Some("hi-42\r\n")).await;
    // The echo of the typed line, then the output.
    assert!(first.stdout.contains("echo hi-$((40+2))"), "{first:?}");
    send(&mut ws, Channel::Stdin, b"stty size; exit 3\n").await;
    let rest = read(&mut ws, None).await;
    assert!(rest.stdout.contains("33 101"), "{rest:?}");
    assert_eq!(rest.code, Some(3), "{first:?} {rest:?}");

    // Another team's member: not found; a viewer: forbidden; nothing to run: 422.
    let (st, body) = open(app, &other.member, &job, &["true"], false)
        .await
        .expect_err("stranger");
    assert_eq!(st, 404, "{body}");
    let (st, body) = open(app, &viewer, &job, &["true"], false)
        .await
        .expect_err("viewer");
    assert_eq!(st, 403, "{body}");
    let (st, body) = open(app, &t.member, &job, &[], false)
        .await
        .expect_err("no command");
    assert_eq!(st, 422, "{body}");
    assert!(body.contains("command"), "{body}");

    // A browser session works from the portal's own pages only: another site's page
    // cannot ride the cookie into a shell.
    let cookie =
        crate::support::login(app, &format!("{name}-member"), crate::allocations::PW).await;
    let cookie_exec = |origin: &'static str| {
        let url = app.url(&format!("/api/v1/workloads/{job}/exec?command=true"));
        let cookie = cookie.clone();
        async move {
            reqwest::Client::new()
                .get(url)
                .header("cookie", cookie)
                .header("origin", origin)
                .header("connection", "upgrade")
                .header("upgrade", "websocket")
                .header("sec-websocket-version", "13")
                .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
                .send()
                .await
                .expect("request")
                .status()
        }
    };
    assert_eq!(cookie_exec("https://evil.example").await, 403);

    // Audited with the command, never its input or output.
    let (st, audit) = a.get("/api/v1/audit?action=workload.exec").await;
    assert_eq!(st, 200, "{audit}");
    let notes: Vec<String> = audit["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|e| e["object_id"] == job.as_str())
        .map(|e| e["after"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(notes.len(), 4, "{audit}");
    assert!(
        notes
            .iter()
            .any(|n| n.contains(&format!("by {name}-member: cat"))),
        "{notes:?}"
    );
    assert!(!notes.iter().any(|n| n.contains("piped")), "{notes:?}");

    // The CLI passes the exit code through.
    let cli = tessera(&app.base, &t.member, &agent.state_dir())
        .args(["exec", &job, "--", "sh", "-c", "echo from-cli; exit 5"])
        .output()
        .await
        .expect("tessera exec");
    assert_eq!(cli.status.code(), Some(5), "{cli:?}");
    assert_eq!(String::from_utf8_lossy(&cli.stdout), "from-cli\n");
    let cli = tessera(&app.base, &t.member, &agent.state_dir())
        .args(["exec", "-i", &job, "--", "tr", "a-z", "A-Z"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("tessera exec -i");
    let mut cli = cli;
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = cli.stdin.take().expect("stdin");
        stdin.write_all(b"shout\n").await.expect("write");
    }
    let cli = cli.wait_with_output().await.expect("wait");
    assert_eq!(cli.status.code(), Some(0), "{cli:?}");
    assert_eq!(String::from_utf8_lossy(&cli.stdout), "SHOUT\n");

    // An agent that does not take the session (frozen here): it fails after 15 s, saying
    // why, and leaves nothing waiting.
    let agent_pid = agent_pid(&format!("{name}-node"));
    signal(agent_pid, "-STOP");
    let waited = Instant::now();
    let mut ws = open(app, &t.member, &job, &["true"], false)
        .await
        .expect("exec");
    let out = read(&mut ws, None).await;
    signal(agent_pid, "-CONT");
    assert!(waited.elapsed() >= Duration::from_secs(14), "{out:?}");
    assert_eq!(out.code, None, "{out:?}");
    assert!(
        out.stderr
            .contains("the node's agent did not take the exec session within 15 s"),
        "{out:?}"
    );

    // A job that ended says so, before any WebSocket.
    let (st, _) = call_with_token(
        app,
        &t.member,
        Method::POST,
        &format!("/api/v1/workloads/{job}/stop?now=true"),
        None,
    )
    .await;
    assert_eq!(st, 200);
    wait_workload(app, &t.member, &job, "cancelled", 30).await;
    let (st, body) = open(app, &t.member, &job, &["true"], false)
        .await
        .expect_err("ended");
    assert_eq!(st, 409, "{body}");
    assert!(body.contains("the job has ended (cancelled)"), "{body}");
    let done = submit(app, &t.member, &alloc, "true").await;
    wait_workload(app, &t.member, &done, "succeeded", 60).await;
    let (st, body) = open(app, &t.member, &done, &["true"], false)
        .await
        .expect_err("ended");
    assert_eq!(st, 409, "{body}");
    assert!(body.contains("the job has ended (succeeded)"), "{body}");
    let cli = tessera(&app.base, &t.member, &agent.state_dir())
        .args(["exec", &done, "--", "true"])
        .output()
        .await
        .expect("tessera exec");
    assert_eq!(cli.status.code(), Some(1), "{cli:?}");
    assert!(
        String::from_utf8_lossy(&cli.stderr).contains("has ended (succeeded)"),
        "{cli:?}"
    );
    agent.stop().await;
}

/// The pid of the agent started with `--hostname host`.
fn agent_pid(host: &str) -> u32 {
    let needle = format!("--hostname\0{host}\0");
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
        })
        .expect("the agent's process")
}

fn signal(pid: u32, sig: &str) {
    let s = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(s.success());
}

on_both_databases!(exec_runs_commands_inside_a_running_job);
