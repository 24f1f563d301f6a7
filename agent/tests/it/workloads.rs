//! The workload executor with real processes (`/bin/sh`, `sleep`, `python3`) under a
//! temporary root: exit codes and logs, stopping whole process groups, adoption after
//! an agent restart, the environment, notebook readiness, the notebook environment,
//! refusals, and the agent's workload round against the fake server.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_agent::notebook_env::NotebookEnv;
use tessera_agent::run::{Agent, RunConfig};
use tessera_agent::sim::SimNode;
use tessera_agent::spool::Spool;
use tessera_agent::telemetry::Telemetry;
use tessera_agent::workloads::{LocalExecutor, parse_stat};
use tessera_domain::wire::{LogAck, WorkloadPhase, WorkloadReport, WorkloadSpec, WorkloadSync};
use tessera_domain::workload::{EnvVar, WorkloadKind};

use crate::support::{FakeServer, H100, report_until, run_config, sync, whole_file};

const WAIT: Duration = Duration::from_secs(20);

fn job(id: &str, argv: &[&str]) -> WorkloadSpec {
    WorkloadSpec::job(id, "team-1", &["MIG-a", "MIG-b"], argv)
}

fn stopped(spec: &WorkloadSpec) -> WorkloadSpec {
    WorkloadSpec {
        run: false,
        ..spec.clone()
    }
}

fn open(root: &Path) -> LocalExecutor {
    LocalExecutor::open(root, "127.0.0.1").unwrap()
}

fn find<'a>(reports: &'a [WorkloadReport], id: &str) -> &'a WorkloadReport {
    reports
        .iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("no report for {id}: {reports:#?}"))
}

/// Whether a process exists and has not exited (a zombie waiting for its parent,
/// the test process, counts as gone).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| parse_stat(&s))
        .is_some_and(|s| s.state != 'Z' && s.state != 'X')
}

/// Live processes in process group `pgid`.
fn group_members(pgid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let s = parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
            (s.pgrp == pgid && s.state != 'Z' && s.state != 'X').then_some(pid)
        })
        .collect()
}

/// Kills a process group when a test ends, however it ends, so that a failed
/// assertion leaves no `sleep 300` behind.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if !group_members(self.0).is_empty() {
            let _ = std::process::Command::new("kill")
                .args(["-s", "KILL", "--", &format!("-{}", self.0)])
                .status();
        }
    }
}

#[tokio::test]
async fn a_job_exits_with_its_code_and_ships_its_log_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut ex = open(dir.path());
    let spec = job("j1", &["sh", "-c", "echo one; echo two; exit 3"]);
    ex.apply(&sync(std::slice::from_ref(&spec)));
    let r = report_until(&mut ex, "j1", "exited", WAIT, |r| {
        r.phase == WorkloadPhase::Exited
    })
    .await;
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(r.message, None);
    assert_eq!(r.endpoint, None);
    let piece = r.log.clone().unwrap();
    assert_eq!((piece.offset, piece.len), (0, 8));
    assert_eq!(piece.text, "one\ntwo\n");
    assert!(
        r.log_complete,
        "the piece reaches the end of an exited process's log"
    );

    // Not acknowledged: the same piece again.
    let again = ex.reports().await;
    assert_eq!(find(&again, "j1").log, Some(piece));
    // Partly acknowledged: the rest, from there.
    ex.apply(&WorkloadSync {
        workloads: vec![spec.clone()],
        execs: Vec::new(),
        log_acks: vec![LogAck {
            id: "j1".into(),
            stored_through: 4,
        }],
    });
    let r = ex.reports().await;
    let piece = find(&r, "j1").log.clone().unwrap();
    assert_eq!(
        (piece.offset, piece.len, piece.text.as_str()),
        (4, 4, "two\n")
    );
    // All acknowledged: nothing more to send, and the log is complete.
    ex.apply(&WorkloadSync {
        workloads: vec![spec.clone()],
        execs: Vec::new(),
        log_acks: vec![LogAck {
            id: "j1".into(),
            stored_through: 8,
        }],
    });
    let r = ex.reports().await;
    let r = find(&r, "j1");
    assert_eq!(r.log, None);
    assert!(r.log_complete);
    assert_eq!((r.phase, r.exit_code), (WorkloadPhase::Exited, Some(3)));
    // Still listed with `run: true`: an exited job is never started again.
    ex.apply(&sync(std::slice::from_ref(&spec)));
    let r = ex.reports().await;
    assert_eq!(find(&r, "j1").phase, WorkloadPhase::Exited);

    // No longer listed: forgotten, run folder gone, workspace kept.
    let run = ex.root().join("runs/j1");
    assert!(run.join("state.json").is_file());
    assert_eq!(std::fs::read_to_string(run.join("exit")).unwrap(), "3");
    ex.apply(&sync(&[]));
    assert!(ex.reports().await.is_empty());
    assert!(!run.exists());
    assert!(ex.root().join("workspaces/team-1").is_dir());
}

#[tokio::test]
async fn stopping_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let mut ex = open(dir.path());
    let spec = job(
        "j2",
        &[
            "sh",
            "-c",
            "sleep 300 & echo $! > bg.pid; sleep 301 & echo $! > fg.pid; wait",
        ],
    );
    ex.apply(&sync(std::slice::from_ref(&spec)));
    let ws = ex.root().join("workspaces/team-1");
    let bg: u32 = whole_file(&ws.join("bg.pid"), WAIT)
        .await
        .trim()
        .parse()
        .unwrap();
    let fg: u32 = whole_file(&ws.join("fg.pid"), WAIT)
        .await
        .trim()
        .parse()
        .unwrap();
    let pgid = ex.pid("j2").unwrap();
    let _guard = KillOnDrop(pgid);
    let r = report_until(&mut ex, "j2", "running", WAIT, |r| {
        r.phase == WorkloadPhase::Running
    })
    .await;
    assert_eq!(r.exit_code, None);
    assert!(alive(bg) && alive(fg));
    assert!(group_members(pgid).len() >= 4, "wrapper, sh, two sleeps");

    ex.apply(&sync(&[stopped(&spec)]));
    let r = report_until(&mut ex, "j2", "exited", WAIT, |r| {
        r.phase == WorkloadPhase::Exited
    })
    .await;
    assert_eq!(r.exit_code, None, "killed, no exit status");
    assert_eq!(r.message.as_deref(), Some("stopped"));
    assert!(!alive(bg), "the background sleep was killed too");
    assert!(!alive(fg));
    assert!(group_members(pgid).is_empty());
    assert!(ex.root().join("runs/j2/stopped").exists());
}

#[tokio::test]
async fn processes_ignoring_sigterm_get_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut ex = open(dir.path());
    // An ignored signal stays ignored in the children: nothing here dies of SIGTERM.
    let spec = job(
        "stubborn",
        &[
            "sh",
            "-c",
            "trap '' TERM; sleep 300 & echo $! > s.pid; wait",
        ],
    );
    ex.apply(&sync(&[spec]));
    let ws = ex.root().join("workspaces/team-1");
    let sleeper: u32 = whole_file(&ws.join("s.pid"), WAIT)
        .await
        .trim()
        .parse()
        .unwrap();
    let pgid = ex.pid("stubborn").unwrap();
    let _guard = KillOnDrop(pgid);
    let started = Instant::now();
    // What agent shutdown does, with a short grace.
    ex.stop_all(Duration::from_millis(300)).await;
    assert!(!ex.any_running());
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "waited for the grace"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!alive(sleeper));
    assert!(group_members(pgid).is_empty());
    let r = ex.reports().await;
    let r = find(&r, "stubborn");
    assert_eq!((r.phase, r.exit_code), (WorkloadPhase::Exited, None));
    assert_eq!(r.message.as_deref(), Some("stopped"));
}

#[tokio::test]
async fn a_restarted_agent_adopts_running_workloads_and_reports_dead_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = open(dir.path());
    let spec = job("long", &["sh", "-c", "echo started; exec sleep 300"]);
    first.apply(&sync(std::slice::from_ref(&spec)));
    report_until(&mut first, "long", "running", WAIT, |r| {
        r.phase == WorkloadPhase::Running && r.log.as_ref().is_some_and(|l| l.text == "started\n")
    })
    .await;
    let pid = first.pid("long").unwrap();
    let _guard = KillOnDrop(pid);
    // The agent dies without stopping anything.
    drop(first);
    assert!(alive(pid));

    // Runs a crashed agent left behind: one that ended with a status, one that ended
    // without one, one that was being stopped.
    let runs = dir.path().canonicalize().unwrap().join("runs");
    let own = parse_stat(&std::fs::read_to_string("/proc/self/stat").unwrap()).unwrap();
    for (id, exit, stopped) in [
        ("done", Some("0"), false),
        ("ghost", None, false),
        ("halted", None, true),
    ] {
        let run = runs.join(id);
        std::fs::create_dir_all(&run).unwrap();
        // A live pid with another start time: a reused pid, not ours.
        let state = serde_json::json!({
            "pid": std::process::id(),
            "start_time": own.start_time + 1,
            "port": null,
            "spec": job(id, &["true"]),
        });
        std::fs::write(run.join("state.json"), state.to_string()).unwrap();
        std::fs::write(run.join("output.log"), format!("{id} says bye\n")).unwrap();
        if let Some(code) = exit {
            std::fs::write(run.join("exit"), code).unwrap();
        }
        if stopped {
            std::fs::write(run.join("stopped"), "").unwrap();
        }
    }
    // Not a run: a name the agent would never have created.
    std::fs::create_dir_all(runs.join("bad name")).unwrap();

    let mut second = open(dir.path());
    assert_eq!(second.ids(), ["done", "ghost", "halted", "long"]);
    assert_eq!(second.pid("long"), Some(pid));
    let r = second.reports().await;
    let long = find(&r, "long");
    assert_eq!(long.phase, WorkloadPhase::Running);
    // After a restart the log goes out from the start; the server says where it is.
    assert_eq!(long.log.as_ref().unwrap().text, "started\n");
    let done = find(&r, "done");
    assert_eq!(
        (done.phase, done.exit_code),
        (WorkloadPhase::Exited, Some(0))
    );
    assert_eq!(done.log.as_ref().unwrap().text, "done says bye\n");
    assert!(done.log_complete);
    let ghost = find(&r, "ghost");
    assert_eq!(ghost.phase, WorkloadPhase::Lost);
    assert_eq!(
        ghost.message.as_deref(),
        Some("the process ended while the agent was down and left no exit status")
    );
    let halted = find(&r, "halted");
    assert_eq!(
        (halted.phase, halted.exit_code),
        (WorkloadPhase::Exited, None)
    );
    assert_eq!(halted.message.as_deref(), Some("stopped"));

    // The new agent can stop what it adopted (it is not its parent).
    second.apply(&sync(&[stopped(&spec)]));
    let r = report_until(&mut second, "long", "exited", WAIT, |r| {
        r.phase == WorkloadPhase::Exited
    })
    .await;
    assert_eq!(r.message.as_deref(), Some("stopped"));
    assert!(!alive(pid));
    // Nothing listed any more: every ended run is forgotten.
    second.apply(&sync(&[]));
    assert!(second.ids().is_empty());
    let left: Vec<_> = std::fs::read_dir(&runs)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [OsString::from("bad name")]);
}

#[tokio::test]
async fn the_environment_names_the_devices_and_never_the_agents_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let path = std::env::var_os("PATH").unwrap();
    let mut ex = open(dir.path()).with_inherited_env([
        ("PATH".into(), path),
        ("KEEP_ME".into(), "yes".into()),
        ("TESSERA_JOIN_TOKEN".into(), "tsr_join_secret".into()),
        ("TESSERA_AGENT_STATE_DIR".into(), "/var/lib/x".into()),
        ("CUDA_VISIBLE_DEVICES".into(), "0,1,2,3".into()),
        ("NVIDIA_VISIBLE_DEVICES".into(), "all".into()),
    ]);
    std::fs::create_dir_all(ex.root().join("workspaces/team-1/src")).unwrap();
    let mut spec = job("env", &["sh", "-c", "env; echo \"cwd=$(pwd)\""]);
    spec.workdir = "src".into();
    spec.env = vec![
        EnvVar {
            name: "MY_VAR".into(),
            value: "a b=c".into(),
        },
        EnvVar {
            name: "CUDA_VISIBLE_DEVICES".into(),
            value: "sneaky".into(),
        },
    ];
    ex.apply(&sync(&[spec]));
    let r = report_until(&mut ex, "env", "exited", WAIT, |r| {
        r.phase == WorkloadPhase::Exited
    })
    .await;
    assert_eq!(r.exit_code, Some(0));
    let text = r.log.unwrap().text;
    let vars: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    let root = ex.root().to_str().unwrap();
    assert_eq!(vars["CUDA_VISIBLE_DEVICES"], "MIG-a,MIG-b");
    assert_eq!(vars["NVIDIA_VISIBLE_DEVICES"], "MIG-a,MIG-b");
    assert_eq!(vars["MY_VAR"], "a b=c");
    assert_eq!(vars["KEEP_ME"], "yes");
    assert_eq!(
        vars["TESSERA_WORKSPACE"],
        format!("{root}/workspaces/team-1")
    );
    assert_eq!(
        vars["JUPYTER_RUNTIME_DIR"],
        format!("{root}/runs/env/runtime")
    );
    assert_eq!(vars["cwd"], format!("{root}/workspaces/team-1/src"));
    assert!(!vars.contains_key("JUPYTER_TOKEN"), "jobs have no token");
    assert!(!text.contains("tsr_join_secret"), "{text}");
    assert!(!vars.contains_key("TESSERA_AGENT_STATE_DIR"));
}

/// A stand-in for Jupyter: answers `{base}api/status` and `{base}api/kernels` only
/// with the right token (from `JUPYTER_TOKEN`), after a moment.
const FAKE_JUPYTER: &str = r#"
import http.server, json, os, sys, time
port, base, token = int(sys.argv[1]), sys.argv[2], os.environ["JUPYTER_TOKEN"]
time.sleep(0.5)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.headers.get("Authorization") != "token " + token:
            self.send_response(403); self.end_headers(); return
        if self.path == base + "api/status":
            body = {"started": "2026-11-23T17:00:00.000000Z",
                    "last_activity": "2026-11-23T18:00:00.123456Z",
                    "connections": 0, "kernels": 1}
        elif self.path == base + "api/kernels?no_track_activity=1":
            body = [{"id": "k1", "execution_state": "idle"},
                    {"id": "k2", "execution_state": "busy"}]
        else:
            self.send_response(404); self.end_headers(); return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *args):
        pass
print("listening on", port, flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"#;

#[tokio::test]
async fn a_notebook_is_running_once_it_answers_with_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut ex = open(dir.path());
    let spec = WorkloadSpec {
        kind: WorkloadKind::Notebook,
        token: Some("s3cret".into()),
        base_path: Some("/user/ann/nb/".into()),
        ..job(
            "nb",
            &["python3", "-c", FAKE_JUPYTER, "{port}", "/user/ann/nb/"],
        )
    };
    ex.apply(&sync(std::slice::from_ref(&spec)));
    let _guard = KillOnDrop(ex.pid("nb").unwrap());
    let first = ex.reports().await;
    let first = find(&first, "nb");
    assert_eq!(first.phase, WorkloadPhase::Starting);
    let endpoint = first.endpoint.clone().unwrap();
    let port: u16 = endpoint
        .strip_prefix("127.0.0.1:")
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(port, 0);
    let r = report_until(&mut ex, "nb", "running", WAIT, |r| {
        r.phase == WorkloadPhase::Running
    })
    .await;
    assert_eq!(r.endpoint.as_deref(), Some(endpoint.as_str()));
    assert_eq!(r.kernel_last_activity_ms, Some(1_795_456_800_123));
    assert!(r.kernel_busy);
    // `{port}` was replaced by the port reported.
    let log = r.log.unwrap().text;
    assert!(log.contains(&format!("listening on {port}")), "{log}");
    // The probe's token is what makes it answer.
    let anonymous = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{endpoint}/user/ann/nb/api/status"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 403);

    ex.apply(&sync(&[stopped(&spec)]));
    let r = report_until(&mut ex, "nb", "exited", WAIT, |r| {
        r.phase == WorkloadPhase::Exited
    })
    .await;
    assert_eq!(r.endpoint, None);
    assert!(!r.kernel_busy);
}

/// A notebook spec whose program is `argv` (no probe answers: it just runs).
fn notebook(id: &str, argv: &[&str]) -> WorkloadSpec {
    WorkloadSpec {
        kind: WorkloadKind::Notebook,
        token: Some("t".into()),
        base_path: Some("/user/ann/nb/".into()),
        ..job(id, argv)
    }
}

#[tokio::test]
async fn a_notebooks_program_comes_from_the_notebook_environment() {
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("venv");
    let program = venv.join("bin/tessera-test-jupyter");
    std::fs::create_dir_all(program.parent().unwrap()).unwrap();
    std::fs::write(&program, "#!/bin/sh\necho \"ran $0 with $*\"\n").unwrap();
    std::fs::set_permissions(
        &program,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // A PATH without the environment: it is found without PATH tricks.
    let mut ex = open(&dir.path().join("root"))
        .with_inherited_env([("PATH".into(), "/usr/bin:/bin".into())])
        .with_notebook_env(NotebookEnv::open(&venv).unwrap());
    let all = [
        notebook("nb", &["tessera-test-jupyter", "lab", "--port={port}"]),
        // An override naming a path is used as it is.
        notebook("abs", &["/bin/echo", "override"]),
        // What the environment does not have is looked up on PATH.
        notebook("path", &["echo", "from PATH"]),
        notebook("missing", &["no-such-jupyter-tessera"]),
        // Jobs never take their program from it.
        job("job", &["tessera-test-jupyter"]),
    ];
    ex.apply(&sync(&all));
    for id in ["nb", "abs", "path"] {
        let r = report_until(&mut ex, id, "exited", WAIT, |r| {
            r.phase == WorkloadPhase::Exited
        })
        .await;
        assert_eq!(r.exit_code, Some(0), "{r:?}");
        let log = r.log.unwrap().text;
        match id {
            "nb" => assert!(
                log.starts_with(&format!("ran {} with lab --port=", program.display())),
                "{log}"
            ),
            "abs" => assert_eq!(log, "override\n"),
            _ => assert_eq!(log, "from PATH\n"),
        }
    }
    let r = ex.reports().await;
    assert_eq!(find(&r, "missing").phase, WorkloadPhase::FailedToStart);
    assert_eq!(
        find(&r, "missing").message.as_deref().unwrap(),
        format!(
            "cannot start `no-such-jupyter-tessera`: program not found (neither in the \
             notebook environment {} nor on PATH)",
            venv.join("bin").display()
        )
    );
    assert_eq!(
        find(&r, "job").message.as_deref(),
        Some("cannot start `tessera-test-jupyter`: program not found")
    );

    // Without a notebook environment, the message says how to give one.
    let mut plain = open(&dir.path().join("root2"))
        .with_inherited_env([("PATH".into(), "/usr/bin:/bin".into())]);
    plain.apply(&sync(&[notebook("nb", &["tessera-test-jupyter", "lab"])]));
    let r = plain.reports().await;
    let message = find(&r, "nb").message.clone().unwrap();
    assert!(
        message.starts_with("cannot start `tessera-test-jupyter`: program not found (")
            && message.contains("--notebook-env"),
        "{message}"
    );
}

#[tokio::test]
async fn what_cannot_start_fails_to_start_and_touches_nothing_outside_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut ex = open(&root);
    let mut bad_workdir = job("wd", &["true"]);
    bad_workdir.workdir = "missing".into();
    let mut escaping_workdir = job("wd2", &["true"]);
    escaping_workdir.workdir = "../../..".into();
    let bad_id = job("../escape", &["sh", "-c", "touch pwned"]);
    let mut bad_workspace = job("ws", &["true"]);
    bad_workspace.workspace = "..".into();
    let missing_program = job("np", &["no-such-program-tessera"]);
    let empty = job("empty", &[]);
    let all = [
        bad_workdir,
        escaping_workdir,
        bad_id,
        bad_workspace,
        missing_program,
        empty,
    ];
    ex.apply(&sync(&all));
    let r = ex.reports().await;
    assert_eq!(r.len(), all.len());
    for x in &r {
        assert_eq!(x.phase, WorkloadPhase::FailedToStart, "{x:?}");
        assert!(x.log_complete && x.log.is_none(), "{x:?}");
    }
    let msg = |id| find(&r, id).message.clone().unwrap();
    assert_eq!(
        msg("wd"),
        "folder `missing` does not exist in the team workspace"
    );
    assert_eq!(
        msg("wd2"),
        "folder `../../..` is not inside the team workspace"
    );
    assert!(
        msg("../escape").contains("not a safe folder name"),
        "{}",
        msg("../escape")
    );
    assert!(
        msg("ws").contains("not a safe folder name"),
        "{}",
        msg("ws")
    );
    assert_eq!(
        msg("np"),
        "cannot start `no-such-program-tessera`: program not found"
    );
    assert_eq!(msg("empty"), "nothing to run: argv is empty");
    // Nothing ran, nothing was created beside the root or as a run folder.
    let beside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(beside, [OsString::from("root")]);
    assert_eq!(std::fs::read_dir(root.join("runs")).unwrap().count(), 0);
    // Not started again while listed; forgotten once not listed.
    ex.apply(&sync(&all));
    assert_eq!(ex.ids().len(), all.len());
    ex.apply(&sync(&[]));
    assert!(ex.ids().is_empty());
}

#[tokio::test]
async fn a_workload_stopped_before_it_started_is_reported_as_exited() {
    let dir = tempfile::tempdir().unwrap();
    let mut ex = open(dir.path());
    ex.apply(&sync(&[stopped(&job("late", &["sleep", "300"]))]));
    let r = ex.reports().await;
    let r = find(&r, "late");
    assert_eq!((r.phase, r.exit_code), (WorkloadPhase::Exited, None));
    assert_eq!(r.message.as_deref(), Some("stopped before it started"));
    assert!(r.log_complete);
    assert!(!ex.root().join("runs/late").exists());
}

fn agent<'a>(dir: &Path, server: &'a FakeServer, stop_on_exit: bool) -> Agent<&'a FakeServer> {
    Agent::new(
        Arc::new(SimNode::new(&[H100], 3).unwrap()),
        server,
        RunConfig {
            workload_every: Duration::from_millis(50),
            stop_workloads_on_exit: stop_on_exit,
            ..run_config()
        },
        Telemetry::new(Spool::open(&dir.join("spool"), 60, 10).unwrap()),
    )
    .with_workloads(open(&dir.join("workloads")))
}

/// The last report the fake server got for `id`.
fn last_report(server: &FakeServer, id: &str) -> Option<WorkloadReport> {
    server.with(|s| {
        s.workload_reports
            .last()
            .and_then(|r| r.workloads.iter().find(|w| w.id == id).cloned())
    })
}

#[tokio::test]
async fn the_workload_round_reports_and_applies_the_servers_answer() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::default();
    let mut a = agent(dir.path(), &server, false);
    // Nothing known yet: an empty report.
    a.workload_round().await.unwrap();
    server.with(|s| assert!(s.workload_reports[0].workloads.is_empty()));

    let done = job("done", &["sh", "-c", "printf 'h\\303\\251llo\\n'; exit 0"]);
    let long = job("long", &["sleep", "300"]);
    server.with(|s| s.workloads = vec![done.clone(), long.clone()]);
    let deadline = Instant::now() + WAIT;
    loop {
        a.workload_round().await.unwrap();
        let finished = last_report(&server, "done")
            .is_some_and(|r| r.phase == WorkloadPhase::Exited && r.log_complete);
        let running =
            last_report(&server, "long").is_some_and(|r| r.phase == WorkloadPhase::Running);
        if finished && running {
            break;
        }
        assert!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = a.workloads().unwrap().pid("long").unwrap();
    let _guard = KillOnDrop(pid);
    server.with(|s| {
        assert_eq!(s.logs["done"].text, "héllo\n");
        assert_eq!(s.logs["done"].through, 7);
        assert_eq!(
            s.logs["done"].ignored, 0,
            "every piece continued the stored log"
        );
    });
    assert_eq!(last_report(&server, "done").unwrap().exit_code, Some(0));

    // The server is unreachable: the round fails, nothing is stopped.
    server.with(|s| {
        s.down = true;
        s.workloads.clear();
    });
    assert!(a.workload_round().await.is_err());
    assert!(alive(pid));
    assert_eq!(a.workloads().unwrap().ids(), ["done", "long"]);

    // Back, wanting nothing: `long` is stopped, then both are forgotten.
    server.with(|s| s.down = false);
    let deadline = Instant::now() + WAIT;
    while !a.workloads().unwrap().ids().is_empty() {
        a.workload_round().await.unwrap();
        assert!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!alive(pid));
    let long = last_report(&server, "long").unwrap();
    assert_eq!(long.phase, WorkloadPhase::Exited);
    assert_eq!(long.message.as_deref(), Some("stopped"));
    assert!(!dir.path().join("workloads/runs/long").exists());
}

#[tokio::test]
async fn the_agent_loop_runs_workloads_and_stops_them_on_exit_when_told() {
    for stop_on_exit in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let server = FakeServer::default();
        server.with(|s| s.workloads = vec![job("long", &["sleep", "300"])]);
        let a = agent(dir.path(), &server, stop_on_exit);
        // Shut down once the server has seen it running.
        a.run(async {
            let deadline = Instant::now() + WAIT;
            while !last_report(&server, "long").is_some_and(|r| r.phase == WorkloadPhase::Running) {
                assert!(Instant::now() < deadline, "timed out");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap();
        let state: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join("workloads/runs/long/state.json")).unwrap(),
        )
        .unwrap();
        let pid = u32::try_from(state["pid"].as_u64().unwrap()).unwrap();
        let _guard = KillOnDrop(pid);
        assert_eq!(alive(pid), !stop_on_exit, "stop_on_exit: {stop_on_exit}");
        if !stop_on_exit {
            // The next agent adopts it.
            let mut next = open(&dir.path().join("workloads"));
            assert_eq!(next.pid("long"), Some(pid));
            next.stop_all(Duration::from_secs(5)).await;
            assert!(!alive(pid));
        }
    }
}
