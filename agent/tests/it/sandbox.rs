//! The workload sandbox attacked from inside: team A's job tries to reach team B's
//! files, runs and processes, the node credential, the agent, other GPUs and MIG
//! instances, and to outgrow its limits; each attempt is refused or contained, while
//! team B's job keeps running. An MPS client reaches its own GPU's daemon and no other. Real `crun` containers over a simulated H100 whose
//! stand-in device nodes carry the driver's numbering. Needs root and crun (`cargo
//! xtask test` installs crun and runs as root).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_agent::backend::GpuBackend;
use tessera_agent::mps::{MpsControl, SIM_SUBCOMMAND, ShareBoard, ShareSupervisor};
use tessera_agent::notebook_env::NotebookEnv;
use tessera_agent::sandbox::{Sandbox, SandboxSettings, mig_minors_table, parse_mig_minors};
use tessera_agent::sim::{SIM_CAPS_MAJOR, SimNode, write_device_files};
use tessera_agent::workloads::LocalExecutor;
use tessera_domain::wire::{
    DesiredState, ShareMethod, WorkloadPhase, WorkloadReport, WorkloadSpec, WorkloadSync,
};
use tessera_domain::workload::WorkloadKind;

use crate::shares::{Reaper, share_job, shared, sim_mps};
use crate::support::{H100, node_with, sync};

const WAIT: Duration = Duration::from_secs(30);
const FIRST_UID: u32 = 300_000;

struct Node {
    dir: tempfile::TempDir,
    backend: Arc<dyn GpuBackend>,
    /// MIG UUID and (gi, ci) of the two slices.
    a: (String, u32, u32),
    b: (String, u32, u32),
}

impl Node {
    fn new() -> Node {
        let (sim, gpu) = node_with(H100, &[("1g.10gb", 0), ("1g.10gb", 1)]);
        let mut slices = Vec::new();
        for i in sim.instances(&gpu).unwrap() {
            for c in &i.compute_instances {
                slices.push((c.uuid.clone().unwrap(), i.gi_id, c.ci_id));
            }
        }
        assert_eq!(slices.len(), 2);
        let dir = tempfile::tempdir().unwrap();
        write_device_files(&dir.path().join("dev"), &[0]).unwrap();
        Node {
            dir,
            backend: Arc::new(sim),
            b: slices.pop().unwrap(),
            a: slices.pop().unwrap(),
        }
    }

    fn settings(&self) -> SandboxSettings {
        let dev = self.dir.path().join("dev");
        crate::support::sandbox_settings(FIRST_UID, 10, 256, (32, 300), dev)
    }

    fn executor(&self) -> LocalExecutor {
        let sb = Sandbox::open(
            self.settings(),
            Arc::clone(&self.backend),
            &self.state("sandbox"),
        )
        .unwrap_or_else(|e| panic!("the sandbox tests need root and crun: {e}"));
        LocalExecutor::open(&self.state("workloads"), "127.0.0.1")
            .unwrap()
            .with_sandbox(sb)
    }

    fn state(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
}

/// Makes a raw syscall from inside (`SYSCALL NR ARG…`): prints its result, or the
/// error's text.
const SYSCALL: &str = "python3 -c 'import ctypes, os, sys; c = ctypes.CDLL(None, use_errno=True); \
    r = c.syscall(*[ctypes.c_long(int(a)) for a in sys.argv[1:]]); \
    print(r if r >= 0 else \"x: \" + os.strerror(ctypes.get_errno()))'";
/// Without the filter, as the team's uid: `keyctl(KEYCTL_GET_KEYRING_ID,
/// KEY_SPEC_SESSION_KEYRING, create)` gives a keyring's serial number, and
/// `bpf(BPF_MAP_CREATE, NULL, 0)` fails with EINVAL (the kernel checks the attributes'
/// size first), even where unprivileged eBPF is off (seen on Linux 6.18); `unshare -Urn`
/// works. With it, all three fail with EPERM.
#[cfg(target_arch = "x86_64")]
const KEYCTL: u32 = 250;
#[cfg(target_arch = "x86_64")]
const BPF: u32 = 321;
#[cfg(target_arch = "aarch64")]
const KEYCTL: u32 = 219;
#[cfg(target_arch = "aarch64")]
const BPF: u32 = 280;

fn job(id: &str, team: &str, device: &str, script: &str) -> WorkloadSpec {
    WorkloadSpec::job(id, team, &[device], &["/bin/sh", "-c", script])
}

/// Reports until `id` has exited; returns its report and its whole log.
/// `desired` is what the "server" wants meanwhile.
async fn finished(
    ex: &mut LocalExecutor,
    id: &str,
    desired: &[WorkloadSpec],
) -> (WorkloadReport, String) {
    let deadline = Instant::now() + WAIT;
    let mut log = String::new();
    loop {
        let reports = ex.reports().await;
        let r = reports.iter().find(|r| r.id == id).expect("report").clone();
        if let Some(p) = &r.log {
            log.push_str(&p.text);
            ex.apply(&WorkloadSync {
                workloads: desired.to_vec(),
                execs: Vec::new(),
                log_acks: vec![tessera_domain::wire::LogAck {
                    id: id.to_owned(),
                    stored_through: p.offset + p.len,
                }],
            });
        }
        if matches!(
            r.phase,
            WorkloadPhase::Exited | WorkloadPhase::FailedToStart | WorkloadPhase::Lost
        ) && r.log_complete
        {
            return (r, log);
        }
        assert!(
            Instant::now() < deadline,
            "{id} did not finish: {r:#?}\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn line<'a>(log: &'a str, case: &str) -> &'a str {
    log.lines()
        .find_map(|l| l.strip_prefix(&format!("{case}: ")))
        .unwrap_or_else(|| panic!("no `{case}` line in:\n{log}"))
}

/// Lists the device-cgroup rules of a running container (cgroup v1).
/// `None` on a cgroup v2 host, where the rules are an eBPF program.
fn device_rules(id: &str) -> Option<Vec<String>> {
    if !Path::new("/sys/fs/cgroup/devices").exists() {
        return None;
    }
    let path = format!("/sys/fs/cgroup/devices/tessera/{id}/devices.list");
    let s = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Some(s.lines().map(str::to_owned).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_job_reaches_nothing_of_another_team_or_the_node() {
    let node = Node::new();
    let mut ex = node.executor();
    let creds = node.dir.path().join("credential.json");
    std::fs::write(&creds, r#"{"secret":"tsn_node_secret"}"#).unwrap();

    // Team B: a job that keeps its own file and runs until stopped.
    let b = job(
        "run-b",
        "team-b",
        &node.b.0,
        "echo b-data > $TESSERA_WORKSPACE/secret.txt; echo ready; while true; do sleep 1; done",
    );
    ex.apply(&sync(std::slice::from_ref(&b)));
    let b_ws = node.state("workloads/workspaces/team-b");
    let deadline = Instant::now() + WAIT;
    while !b_ws.join("secret.txt").exists() {
        let _ = ex.reports().await;
        assert!(
            Instant::now() < deadline,
            "team B's job never wrote its file"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let b_pid = ex.pid("run-b").expect("team B's job runs");
    let b_state = node.state("workloads/runs/run-b/state.json");
    let a_caps = parse_mig_minors(&mig_minors_table(&[0]));
    let cap = |gi: u32, ci: Option<u32>| match ci {
        None => a_caps[&format!("gpu0/gi{gi}/access")],
        Some(ci) => a_caps[&format!("gpu0/gi{gi}/ci{ci}/access")],
    };
    let (a_gi, a_ci) = (node.a.1, node.a.2);
    let b_gi_cap = cap(node.b.1, None);
    let script = format!(
        r#"
t() {{ name=$1; shift; printf '%s: %s\n' "$name" "$( ("$@") 2>&1 | head -n1 | sed 's/^.*: //')"; }}
t uid id -u
t read_b_workspace cat {b_ws}/secret.txt
t write_b_workspace sh -c 'echo x > {b_ws}/pwned'
t read_credential cat {creds}
t read_credential_relative cat $TESSERA_WORKSPACE/../../../credential.json
t read_b_state cat {b_state}
t list_runs ls $TESSERA_WORKSPACE/../../runs
t signal_b kill -0 {b_pid}
t signal_agent kill -0 {agent}
t highest_pid sh -c 'ls /proc | grep "^[0-9]" | sort -n | tail -n1'
t nvidia_nodes sh -c 'ls /dev | grep nvidia | tr "\n" " "'
t caps sh -c 'ls /dev/nvidia-caps | tr "\n" " "'
t other_gpu cat /dev/nvidia1
t other_mig cat /dev/nvidia-caps/nvidia-cap{b_gi_cap}
t mknod_other_mig mknod /tmp/cap c {caps_major} {b_gi_cap}
t own_gpu head -c1 /dev/nvidia0
unset CUDA_VISIBLE_DEVICES NVIDIA_VISIBLE_DEVICES
t unset_devices sh -c 'ls /dev | grep -c "^nvidia[0-9]"'
t fill_tmp dd if=/dev/zero of=/tmp/fill-{tag} bs=1M count=64
t capabilities sh -c 'grep CapEff /proc/self/status | tr -d "\t"'
t no_new_privs sh -c 'grep NoNewPrivs /proc/self/status | tr -d "\t"'
t seccomp sh -c 'grep "^Seccomp:" /proc/self/status | tr -d "\t"'
t unshare_user unshare -U true
t unshare_root_net unshare -Urn true
t unshare_mount unshare -m true
t keyctl {syscall} {keyctl} 0 -3 1
t bpf {syscall} {bpf} 0 0 0
t nofile awk '/^Max open files/ {{print $4 "/" $5}}' /proc/self/limits
t nproc awk '/^Max processes/ {{print $3 "/" $4}}' /proc/self/limits
t core awk '/^Max core file size/ {{print $5 "/" $6}}' /proc/self/limits
"#,
        b_ws = b_ws.display(),
        creds = creds.display(),
        b_state = b_state.display(),
        agent = std::process::id(),
        caps_major = SIM_CAPS_MAJOR,
        tag = "tessera-sandbox-test",
        syscall = SYSCALL,
        keyctl = KEYCTL,
        bpf = BPF,
    );
    let a = job("run-a", "team-a", &node.a.0, &script);
    let both = [b.clone(), a.clone()];
    ex.apply(&sync(&both));
    let (rep, log) = finished(&mut ex, "run-a", &both).await;
    assert_eq!(rep.phase, WorkloadPhase::Exited, "{log}");

    // Team B asked first and got the first uid of the range.
    assert_eq!(line(&log, "uid"), (FIRST_UID + 1).to_string());
    assert_eq!(line(&log, "read_b_workspace"), "No such file or directory");
    assert_eq!(line(&log, "write_b_workspace"), "Directory nonexistent");
    assert!(!b_ws.join("pwned").exists());
    assert_eq!(line(&log, "read_credential"), "No such file or directory");
    assert_eq!(
        line(&log, "read_credential_relative"),
        "No such file or directory"
    );
    assert_eq!(line(&log, "read_b_state"), "No such file or directory");
    assert_eq!(line(&log, "list_runs"), "No such file or directory");
    assert_eq!(line(&log, "signal_b"), "No such process");
    assert_eq!(line(&log, "signal_agent"), "No such process");
    // A PID namespace of its own: only its few processes, numbered from 1.
    let highest: u32 = line(&log, "highest_pid").parse().unwrap();
    assert!(highest < 100, "pid {highest} visible:\n{log}");
    assert_eq!(
        line(&log, "nvidia_nodes").trim(),
        "nvidia-caps nvidia-uvm nvidia-uvm-tools nvidia0 nvidiactl"
    );
    assert_eq!(
        line(&log, "caps").trim(),
        format!(
            "nvidia-cap{} nvidia-cap{}",
            cap(a_gi, None),
            cap(a_gi, Some(a_ci))
        )
    );
    assert_eq!(line(&log, "other_gpu"), "No such file or directory");
    assert_eq!(line(&log, "other_mig"), "No such file or directory");
    assert_eq!(line(&log, "mknod_other_mig"), "Operation not permitted");
    // Its own node is there and the device cgroup lets it through: the stand-in reaches
    // no driver (ENXIO), where a denied node says "Operation not permitted".
    assert_eq!(line(&log, "own_gpu"), "No such device or address");
    assert_eq!(line(&log, "unset_devices"), "1");
    assert_eq!(line(&log, "fill_tmp"), "No space left on device");
    assert!(!Path::new("/tmp/fill-tessera-sandbox-test").exists());
    assert_eq!(line(&log, "capabilities"), "CapEff:0000000000000000");
    assert_eq!(line(&log, "no_new_privs"), "NoNewPrivs:1");
    // Docker's default syscall filter: no user namespace (the usual road to kernel
    // bugs), no other namespace, no keyrings, no eBPF.
    assert_eq!(line(&log, "seccomp"), "Seccomp:2", "{log}");
    assert_eq!(line(&log, "unshare_user"), "Operation not permitted");
    assert_eq!(line(&log, "unshare_root_net"), "Operation not permitted");
    assert_eq!(line(&log, "unshare_mount"), "Operation not permitted");
    assert_eq!(line(&log, "keyctl"), "Operation not permitted");
    assert_eq!(line(&log, "bpf"), "Operation not permitted");
    // Explicit rlimits, not the agent's.
    assert_eq!(line(&log, "nofile"), "1024/1024");
    assert_eq!(line(&log, "nproc"), "300/300");
    assert_eq!(line(&log, "core"), "0/0");

    // Team B is untouched and still runs; its device cgroup holds its own slice only.
    assert_eq!(
        std::fs::read_to_string(b_ws.join("secret.txt")).unwrap(),
        "b-data\n"
    );
    assert_eq!(ex.pid("run-b"), Some(b_pid));
    if let Some(rules) = device_rules("run-b") {
        let mut gpu_rules: Vec<&str> = rules
            .iter()
            .map(String::as_str)
            .filter(|r| {
                r.starts_with("c 195:") || r.starts_with("c 235:") || r.starts_with("c 236:")
            })
            .collect();
        gpu_rules.sort();
        let mut expected = vec![
            "c 195:0 rw".to_owned(),
            "c 195:255 rw".to_owned(),
            "c 235:0 rw".to_owned(),
            "c 235:1 rw".to_owned(),
            format!("c {SIM_CAPS_MAJOR}:{} rw", cap(node.b.1, None)),
            format!("c {SIM_CAPS_MAJOR}:{} rw", cap(node.b.1, Some(node.b.2))),
        ];
        expected.sort();
        assert_eq!(gpu_rules, expected, "{rules:?}");
    }
    // The agent's secrets are its own.
    let mode = |p: &Path| {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions())
            & 0o777
    };
    assert_eq!(mode(&node.state("workloads/runs")), 0o700);
    assert_eq!(mode(&node.state("sandbox")), 0o700);
    assert_eq!(mode(&b_ws), 0o700);
    let stop = [WorkloadSpec { run: false, ..b }, a];
    ex.apply(&sync(&stop));
    let (rep, _) = finished(&mut ex, "run-b", &stop).await;
    assert_eq!(rep.message.as_deref(), Some("stopped"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_end_a_workload_with_the_reason() {
    let node = Node::new();
    let mut ex = node.executor();
    let hog = job(
        "hog",
        "team-a",
        &node.a.0,
        "python3 -c 'b = bytearray(1024 * 2**20); print(len(b))'",
    );
    let bomb = job(
        "bomb",
        "team-a",
        &node.a.0,
        "for i in $(seq 1 100); do sleep 3 & done 2>&1 | head -n1; wait; echo survived",
    );
    let both = [hog.clone(), bomb.clone()];
    ex.apply(&sync(&both));
    let (rep, log) = finished(&mut ex, "hog", &both).await;
    assert_eq!(rep.exit_code, Some(137), "{rep:?} {log}");
    assert_eq!(
        rep.message.as_deref(),
        Some("killed: out of memory (the workload's memory limit is 256 MiB)")
    );
    let (rep, log) = finished(&mut ex, "bomb", &both).await;
    assert!(
        log.contains("Cannot fork") || log.contains("Resource temporarily unavailable"),
        "{log}"
    );
    assert!(
        log.contains("survived"),
        "the job goes on after refused forks: {log}"
    );
    assert_eq!(rep.exit_code, Some(0));
    assert_eq!(rep.message, None);
    // Both containers are gone with their cgroups.
    assert!(!Path::new("/sys/fs/cgroup/memory/tessera/hog").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_adopts_stops_and_cleans_up_sandboxed_workloads() {
    let node = Node::new();
    let mut ex = node.executor();
    let spec = job("long", "team-a", &node.a.0, "echo up; exec sleep 600");
    let quick = job("quick", "team-a", &node.a.0, "sleep 1; exit 3");
    let both = [spec.clone(), quick.clone()];
    ex.apply(&sync(&both));
    let _ = ex.reports().await;
    let pid = ex.pid("long").expect("runs");
    drop(ex);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A new agent process: the one still running is adopted, the one that ended while no
    // agent watched is reported with its status.
    let mut ex = node.executor();
    assert_eq!(ex.pid("long"), Some(pid));
    let (rep, _) = finished(&mut ex, "quick", &both).await;
    assert_eq!(rep.exit_code, Some(3));
    let stop = [WorkloadSpec { run: false, ..spec }, quick];
    ex.apply(&sync(&stop));
    let (rep, _) = finished(&mut ex, "long", &stop).await;
    assert_eq!(rep.message.as_deref(), Some("stopped"));
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists() || {
            let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            s.contains(") Z")
        }
    );
}

/// A notebook's program from a real virtual environment (`python3 -m venv`, made from
/// whatever `python3` is here: pyenv's lives outside the system folders) runs in the
/// sandbox once the agent mounts what [`NotebookEnv::read_only_paths`] names, and not
/// without the installation the environment's `python` links to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notebook_runs_from_a_virtual_environment_in_the_sandbox() {
    let node = Node::new();
    // Not under /tmp, which the sandbox replaces with a private one.
    let envs = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let venv = envs.path().join("venv");
    let made = std::process::Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .expect("python3 -m venv");
    assert!(made.success());
    let env = NotebookEnv::open(&venv).unwrap();
    let read_only = env.read_only_paths();
    assert_eq!(read_only[0], venv);
    let executor = |read_only: Vec<PathBuf>, state: &str| {
        let mut settings = node.settings();
        settings.read_only = read_only;
        let sb = Sandbox::open(settings, Arc::clone(&node.backend), &node.state("sandbox"))
            .unwrap_or_else(|e| panic!("the sandbox tests need root and crun: {e}"));
        LocalExecutor::open(&node.state(state), "127.0.0.1")
            .unwrap()
            .with_sandbox(sb)
            .with_notebook_env(env.clone())
    };
    let spec = WorkloadSpec {
        kind: WorkloadKind::Notebook,
        argv: vec![
            "python".into(),
            "-c".into(),
            "import sys; print(sys.prefix, sys.prefix != sys.base_prefix)".into(),
        ],
        token: Some("t".into()),
        base_path: Some("/user/ann/nb/".into()),
        ..job("nb", "team-a", &node.a.0, "")
    };
    let mut ex = executor(read_only.clone(), "workloads");
    ex.apply(&sync(std::slice::from_ref(&spec)));
    let (rep, log) = finished(&mut ex, "nb", std::slice::from_ref(&spec)).await;
    assert_eq!(rep.exit_code, Some(0), "{rep:?}\n{log}");
    assert_eq!(log, format!("{} True\n", venv.display()));

    if read_only.len() > 1 {
        // Only the environment: its python's installation is missing in there.
        let mut ex = executor(vec![venv.clone()], "workloads-2");
        ex.apply(&sync(std::slice::from_ref(&spec)));
        let (rep, log) = finished(&mut ex, "nb", std::slice::from_ref(&spec)).await;
        assert_ne!(rep.exit_code, Some(0), "{rep:?}\n{log}");
    }
}

/// The real thing: JupyterLab from the notebook environment `cargo xtask test` provisions
/// (`TESSERA_AGENT_NOTEBOOK_ENV`, the project's `.venv-jupyter`) starts in the sandbox
/// with the server's default command, its program named `jupyter` on a PATH that lacks
/// it, and answers its status probe. Skipped when the variable is not set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jupyterlab_from_the_notebook_environment_answers_in_the_sandbox() {
    let Some(dir) = std::env::var_os("TESSERA_AGENT_NOTEBOOK_ENV") else {
        eprintln!("skipped: TESSERA_AGENT_NOTEBOOK_ENV is not set (`cargo xtask test` sets it)");
        return;
    };
    let env = NotebookEnv::open(Path::new(&dir)).unwrap();
    let node = Node::new();
    let mut settings = node.settings();
    settings.read_only = env.read_only_paths();
    // JupyterLab's server needs more than the hostile tests' limits.
    settings.memory_mib = Some(1024);
    settings.pids = 512;
    let sb = Sandbox::open(settings, Arc::clone(&node.backend), &node.state("sandbox"))
        .unwrap_or_else(|e| panic!("the sandbox tests need root and crun: {e}"));
    let mut ex = LocalExecutor::open(&node.state("workloads"), "127.0.0.1")
        .unwrap()
        .with_inherited_env([("PATH".into(), "/usr/bin:/bin".into())])
        .with_sandbox(sb)
        .with_notebook_env(env);
    let argv = "jupyter lab --no-browser --allow-root --ServerApp.ip={host} \
                --ServerApp.port={port} --ServerApp.port_retries=0 \
                --ServerApp.base_url=/user/ann/nb/";
    let spec = WorkloadSpec {
        kind: WorkloadKind::Notebook,
        argv: argv.split_whitespace().map(str::to_owned).collect(),
        token: Some("s3cret-token".into()),
        base_path: Some("/user/ann/nb/".into()),
        ..job("lab", "team-a", &node.a.0, "")
    };
    ex.apply(&sync(std::slice::from_ref(&spec)));
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut log = String::new();
    loop {
        let reports = ex.reports().await;
        let r = reports.iter().find(|r| r.id == "lab").expect("report");
        if let Some(p) = &r.log {
            log.push_str(&p.text);
            ex.apply(&WorkloadSync {
                workloads: vec![spec.clone()],
                execs: Vec::new(),
                log_acks: vec![tessera_domain::wire::LogAck {
                    id: "lab".into(),
                    stored_through: p.offset + p.len,
                }],
            });
        }
        if r.phase == WorkloadPhase::Running {
            break;
        }
        assert!(
            matches!(r.phase, WorkloadPhase::Starting) && Instant::now() < deadline,
            "JupyterLab did not come up: {r:#?}\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stop = [WorkloadSpec {
        run: false,
        ..spec.clone()
    }];
    ex.apply(&sync(&stop));
    let (rep, _) = finished(&mut ex, "lab", &stop).await;
    assert_eq!(rep.message.as_deref(), Some("stopped"));
}

/// Two simulated H100s, both shared with MPS, their daemons started by the supervisor;
/// a sandboxed job on a 250-milli share of the first one. It gets its limits, sees its
/// daemon's pipe directory at the same path and can talk to the daemon as its own uid,
/// while the other GPU's pipe directory, daemon and device node do not exist for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mps_client_reaches_its_own_daemon_and_no_other() {
    let sim = SimNode::new(&[H100, H100], 21).unwrap();
    let gpus = sim.gpu_uuids();
    let (g0, g1) = (&gpus[0], &gpus[1]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mps");
    let _reaper = Reaper(root.clone());
    write_device_files(&dir.path().join("dev"), &[0, 1]).unwrap();
    let mps = sim_mps(&root);
    let board = ShareBoard::new(Some(mps.clone()));
    let mut supervisor = ShareSupervisor::new(board.clone());
    let desired = DesiredState {
        gpus: vec![
            shared(g0, Some(ShareMethod::Mps), 1),
            shared(g1, Some(ShareMethod::Mps), 1),
        ],
    };
    supervisor.tick(&sim, Some(&desired), &Default::default());
    for g in [g0, g1] {
        let share = board.get(g).unwrap();
        assert!(share.ready, "{share:?}");
    }
    let (own, other) = (mps.dirs(g0), mps.dirs(g1));

    let exe = Path::new(env!("CARGO_BIN_EXE_tessera-agent"));
    let mut settings = SandboxSettings::new(PathBuf::from("crun"));
    settings.uid_first = FIRST_UID;
    settings.uid_count = 10;
    settings.memory_mib = Some(256);
    settings.pids = 32;
    settings.tmp_mib = 16;
    settings.simulated_devices(dir.path().join("dev"));
    // The stand-in control program, to talk to the daemons from inside.
    settings.read_only = vec![exe.parent().unwrap().to_owned()];
    let backend: Arc<dyn GpuBackend> = Arc::new(sim.clone());
    let sb = Sandbox::open(settings, backend, &dir.path().join("sandbox"))
        .unwrap_or_else(|e| panic!("the sandbox tests need root and crun: {e}"));
    let mut ex = LocalExecutor::open(&dir.path().join("workloads"), "127.0.0.1")
        .unwrap()
        .with_sandbox(sb)
        .with_shares(board.clone());
    let control = format!("{} {SIM_SUBCOMMAND}", exe.display());
    let script = format!(
        r#"
t() {{ name=$1; shift; printf '%s: %s\n' "$name" "$( ("$@") 2>&1 | head -n1 | sed 's/^.*: //')"; }}
t uid id -u
t threads printenv CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
t memory printenv CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
t pipe printenv CUDA_MPS_PIPE_DIRECTORY
t method printenv TESSERA_GPU_SHARE_METHOD
t devices printenv CUDA_VISIBLE_DEVICES
t own_pipe sh -c 'ls "$CUDA_MPS_PIPE_DIRECTORY" | tr "\n" " "'
t own_daemon sh -c 'echo get_server_list | {control} >/dev/null && echo answers'
t other_pipe ls {other}
t other_daemon sh -c 'echo get_server_list | CUDA_MPS_PIPE_DIRECTORY={other} {control}'
t mps_root sh -c 'ls {root} | tr "\n" " "'
t own_gpu_dir sh -c 'ls {root}/{g0} | tr "\n" " "'
t nvidia_nodes sh -c 'ls /dev | grep nvidia | tr "\n" " "'
"#,
        other = other.pipe.display(),
        root = root.display(),
    );
    let spec = WorkloadSpec {
        workspace: "team-a".into(),
        ..share_job("client", g0, ShareMethod::Mps, 250, &script)
    };
    ex.apply(&sync(std::slice::from_ref(&spec)));
    let (rep, log) = finished(&mut ex, "client", std::slice::from_ref(&spec)).await;
    assert_eq!(rep.phase, WorkloadPhase::Exited, "{rep:?}\n{log}");
    assert_eq!(rep.exit_code, Some(0), "{log}");
    assert_eq!(line(&log, "uid"), FIRST_UID.to_string());
    assert_eq!(line(&log, "threads"), "25");
    assert_eq!(line(&log, "memory"), "0=20480M");
    assert_eq!(line(&log, "pipe"), own.pipe.display().to_string());
    assert_eq!(line(&log, "method"), "mps");
    assert_eq!(line(&log, "devices"), g0.as_str());
    assert_eq!(
        line(&log, "own_pipe").trim(),
        "control control_lock nvidia-cuda-mps-control.pid"
    );
    assert_eq!(line(&log, "own_daemon"), "answers");
    assert_eq!(line(&log, "other_pipe"), "No such file or directory");
    assert_eq!(
        line(&log, "other_daemon"),
        "Cannot find MPS control daemon process"
    );
    // Of the daemons' folders only the path to its own pipe directory exists in there
    // (the mount point's parents): no log folder, no other GPU.
    assert_eq!(line(&log, "mps_root").trim(), g0.as_str());
    assert_eq!(line(&log, "own_gpu_dir").trim(), "pipe");
    // Its whole GPU's nodes, as a whole-GPU workload gets them (no MIG capabilities).
    assert_eq!(
        line(&log, "nvidia_nodes").trim(),
        "nvidia-uvm nvidia-uvm-tools nvidia0 nvidiactl"
    );
    // The daemon saw the client's connection.
    let control_log = std::fs::read_to_string(own.log.join("control.log")).unwrap();
    assert!(
        control_log.contains("Cmd: get_server_list"),
        "{control_log}"
    );
    // Its limits were set on the MPS server of its team's uid, through the daemon.
    assert!(
        control_log.contains(&format!("Cmd: start_server -uid {FIRST_UID}"))
            && control_log.contains("Cmd: set_active_thread_percentage"),
        "{control_log}"
    );
    // Both daemons still run, and the pipe directory is still the agent's.
    assert!(mps.check(g0).is_ok() && mps.check(g1).is_ok());
    let meta = std::fs::metadata(&own.pipe).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 0);
}

/// A job writes twice its log cap in one go, faster than any round ships it: the node
/// keeps the newest part only (on disk, within the cap), and the log the server gets
/// says how much was dropped, then goes on to the job's last line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_writing_twice_its_log_cap_leaves_a_capped_log() {
    use std::os::unix::fs::MetadataExt;
    let node = Node::new();
    let cap: u64 = 256 * 1024;
    let mut ex = node.executor().with_log_cap(cap);
    // 50,000 lines of 12 bytes: 600,000 bytes, over 2 × 256 KiB.
    let spec = job(
        "chatty",
        "team-a",
        &node.a.0,
        "seq -f 'line %06.0f' 0 49999",
    );
    ex.apply(&sync(std::slice::from_ref(&spec)));
    // No round while it writes: all of it is there at once.
    let exit = node.state("workloads/runs/chatty/ctl/exit");
    let deadline = Instant::now() + WAIT;
    while !exit.exists() {
        assert!(Instant::now() < deadline, "the job never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let output = node.state("workloads/runs/chatty/output.log");
    assert_eq!(std::fs::metadata(&output).unwrap().len(), 600_000);
    let (rep, log) = finished(&mut ex, "chatty", std::slice::from_ref(&spec)).await;
    assert_eq!(rep.exit_code, Some(0), "{log}");
    let meta = std::fs::metadata(&output).unwrap();
    assert!(
        meta.blocks() * 512 <= cap + 2 * meta.blksize(),
        "{} bytes of log on disk",
        meta.blocks() * 512
    );
    let (marker, kept) = log.split_once("newest part]\n").expect("a dropped marker");
    let dropped: u64 = marker
        .trim_start_matches("\n[tessera: ")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        marker.ends_with("bytes of output dropped here: the workload wrote faster than its log could be shipped, and the node keeps only the "),
        "{marker}"
    );
    assert_eq!(dropped + kept.len() as u64, 600_000, "{marker}");
    assert!(cap <= kept.len() as u64 && (kept.len() as u64) < cap + meta.blksize());
    assert!(!log.contains("line 000000"));
    assert!(kept.ends_with("line 049999\n"));
    // What is kept is whole output, from a line boundary or not, up to the end.
    let first_full = kept.find('\n').unwrap() + 1;
    let n: u32 = kept[first_full + 5..first_full + 11].parse().unwrap();
    assert_eq!(kept.len() - first_full, (50_000 - n as usize) * 12);
}

/// Set by [`workload_networks_keep_teams_apart_from_each_other_the_node_and_the_cloud`]
/// for the test it runs in a network namespace of its own.
const OWN_NETNS: &str = "TESSERA_TEST_OWN_NETNS";

/// Runs [`networks_in_a_namespace_of_its_own`] in a fresh network namespace (`unshare
/// --net`), which stands for the node: its addresses, listeners, routes and rules are
/// the test's own, and the host's network is left alone.
#[test]
fn workload_networks_keep_teams_apart_from_each_other_the_node_and_the_cloud() {
    let text = crate::support::run_in_own_netns(
        &["--exact", "sandbox::networks_in_a_namespace_of_its_own"],
        OWN_NETNS,
    );
    assert!(text.contains("1 passed"), "{text}");
}

fn sh(script: &str) {
    let st = std::process::Command::new("sh")
        .args(["-c", script])
        .status()
        .unwrap();
    assert!(st.success(), "{script}");
}

/// Answers every connection with `banner` and closes it.
fn banner_listener(addr: &str, banner: &'static str) -> u16 {
    let l = std::net::TcpListener::bind(addr).unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            use std::io::Write;
            let _ = (&c).write_all(format!("{banner}\n").as_bytes());
        }
    });
    port
}

/// Connects from here (the node) and reads the banner, or the error.
fn connect(addr: &str) -> String {
    use std::io::Read;
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
        Ok(mut c) => {
            let mut s = String::new();
            let _ = c.read_to_string(&mut s);
            s.trim().to_owned()
        }
        Err(e) => format!("x: {}", e.kind()),
    }
}

/// A Python server: `SERVE HOST PORT BANNER [HOST PORT BANNER]…`.
const SERVE: &str = r#"
import socket, sys, threading
def serve(host, port, banner):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen(16)
    while True:
        c, _ = s.accept()
        c.sendall(banner.encode() + b"\n")
        c.close()
a = sys.argv[1:]
ts = [threading.Thread(target=serve, args=a[i:i + 3]) for i in range(0, len(a), 3)]
for t in ts:
    t.start()
for t in ts:
    t.join()
"#;

/// "The cloud" behind the node: a namespace with the metadata service's address and a
/// host on the internet (198.51.100.1), each answering with a banner.
struct Cloud {
    ns: String,
    servers: std::process::Child,
}

impl Cloud {
    fn new() -> Cloud {
        let ns = format!("tsrtest-cloud-{}", std::process::id());
        sh(&format!(
            "ip netns add {ns} && \
             ip link add cloudlink type veth peer name eth0 netns {ns} && \
             ip addr add 198.51.100.2/24 dev cloudlink && ip link set cloudlink up && \
             ip -n {ns} link set lo up && ip -n {ns} addr add 169.254.169.254/32 dev lo && \
             ip -n {ns} addr add 198.51.100.1/24 dev eth0 && ip -n {ns} link set eth0 up && \
             ip -n {ns} addr add 198.51.100.3/24 dev eth0 && \
             ip -n {ns} route add 192.0.2.0/24 via 198.51.100.2 && \
             ip -n {ns} route add 10.213.0.0/16 via 198.51.100.2 && \
             ip route add 169.254.169.254/32 via 198.51.100.1"
        ));
        let servers = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "python3", "-c", SERVE])
            .args(["169.254.169.254", "80", "metadata-credentials"])
            .args(["198.51.100.1", "8080", "hello-from-the-internet"])
            .spawn()
            .unwrap();
        let cloud = Cloud { ns, servers };
        let deadline = Instant::now() + WAIT;
        while connect("169.254.169.254:80") != "metadata-credentials"
            || connect("198.51.100.1:8080") != "hello-from-the-internet"
        {
            assert!(
                Instant::now() < deadline,
                "the cloud's servers never answered"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cloud
    }
}

impl Cloud {
    /// Connects from the cloud, from `from`, to `to`: the banner or the error's text.
    fn connect(&self, from: &str, to: &str) -> String {
        let (host, port) = to.rsplit_once(':').unwrap();
        let py = "import socket, sys\n\
                  try:\n    \
                  s = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=2, \
                  source_address=(sys.argv[1], 0))\n    \
                  print(s.recv(64).decode().strip())\n\
                  except OSError as e:\n    print('x: ' + (e.strerror or str(e)))\n";
        let out = std::process::Command::new("ip")
            .args([
                "netns", "exec", &self.ns, "python3", "-c", py, from, host, port,
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for Cloud {
    fn drop(&mut self) {
        let _ = self.servers.kill();
        let _ = self.servers.wait();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.ns])
            .status();
    }
}

/// Connects from inside a workload: `python3 /tmp/c.py HOST PORT` prints the banner or
/// the error's text; HOST `gateway` is the node's end of the workload's link.
const CONNECT_PY: &str = r#"cat > /tmp/c.py <<'PY'
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
if host == "gateway":
    for line in open("/proc/net/route").read().splitlines()[1:]:
        f = line.split()
        if f[1] == "00000000":
            host = socket.inet_ntoa(bytes.fromhex(f[2])[::-1])
try:
    s = socket.create_connection((host, port), timeout=3)
    print(s.recv(64).decode().strip() or "connected")
except OSError as e:
    print("x: " + (e.strerror or str(e)))
PY
t() { name=$1; shift; printf '%s: %s\n' "$name" "$( ("$@") 2>&1 | head -n1 | sed 's/^.*: //')"; }
"#;

/// Team B runs a notebook (and a private service on its loopback); team A's job tries
/// to reach it, the node's loopback and addresses, the metadata service, and the
/// internet. Only the internet answers, and only while allowed; the node (the proxy)
/// reaches B's notebook at the endpoint the agent reports: B's own address.
#[ignore = "needs a network namespace of its own: run by \
            workload_networks_keep_teams_apart_from_each_other_the_node_and_the_cloud"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn networks_in_a_namespace_of_its_own() {
    assert!(
        std::env::var_os(OWN_NETNS).is_some(),
        "run through the test that gives it a network namespace of its own"
    );
    sh("ip link set lo up && \
        ip link add uplink type veth peer name uplink-peer && \
        ip addr add 192.0.2.10/24 dev uplink && ip link set uplink up && \
        ip link set uplink-peer up");
    // Services of the node: one on its loopback (the portal, an agent), one on all its
    // addresses (its uplink's and every workload link's node end).
    let node_lo = banner_listener("127.0.0.1:0", "node-loopback-service");
    let node_any = banner_listener("0.0.0.0:0", "node-service");
    let cloud = Cloud::new();

    let node = Node::new();
    let mut ex = node.executor();
    let b = WorkloadSpec {
        kind: WorkloadKind::Notebook,
        argv: ["python3", "-c", SERVE, "{host}", "{port}", "b-notebook"]
            .into_iter()
            .chain(["127.0.0.1", "7000", "b-private"])
            .map(str::to_owned)
            .collect(),
        token: Some("t".into()),
        base_path: Some("/user/bob/nb/".into()),
        ..job("nb-b", "team-b", &node.b.0, "")
    };
    ex.apply(&sync(std::slice::from_ref(&b)));
    let reports = ex.reports().await;
    let endpoint = reports[0].endpoint.clone().expect("an endpoint");
    let (b_addr, b_port) = endpoint.rsplit_once(':').unwrap();
    // B's own address, in the node's range.
    assert!(b_addr.starts_with("10.213."), "{endpoint}");
    let deadline = Instant::now() + WAIT;
    while connect(&endpoint) != "b-notebook" {
        assert!(
            Instant::now() < deadline,
            "the node never reached B's notebook at {endpoint}: {}",
            connect(&endpoint)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Its other port is not open to the node either.
    assert_ne!(connect(&format!("{b_addr}:7000")), "b-private");

    let script = format!(
        "{CONNECT_PY}
t b_notebook python3 /tmp/c.py {b_addr} {b_port}
t b_loopback python3 /tmp/c.py 127.0.0.1 7000
t b_in_proc_net sh -c 'grep -ci \":1B58 \" /proc/net/tcp'
t node_loopback python3 /tmp/c.py 127.0.0.1 {node_lo}
t node_address python3 /tmp/c.py 192.0.2.10 {node_any}
t node_gateway python3 /tmp/c.py gateway {node_any}
t metadata python3 /tmp/c.py 169.254.169.254 80
t internet python3 /tmp/c.py 198.51.100.1 8080
t node_addresses_seen sh -c 'grep -c 192.0.2.10 /proc/net/fib_trie'
"
    );
    let a = job("run-a", "team-a", &node.a.0, &script);
    let both = [b.clone(), a.clone()];
    ex.apply(&sync(&both));
    let (rep, log) = finished(&mut ex, "run-a", &both).await;
    assert_eq!(rep.exit_code, Some(0), "{log}");
    // Refused by the node's rules ("administratively prohibited"), not merely unanswered.
    assert_eq!(line(&log, "b_notebook"), "No route to host", "{log}");
    assert_eq!(line(&log, "b_loopback"), "Connection refused");
    assert_eq!(line(&log, "b_in_proc_net"), "0");
    assert_eq!(line(&log, "node_loopback"), "Connection refused");
    assert_eq!(line(&log, "node_address"), "No route to host");
    assert_eq!(line(&log, "node_gateway"), "No route to host");
    assert_eq!(line(&log, "metadata"), "No route to host");
    assert_eq!(line(&log, "internet"), "hello-from-the-internet");
    assert_eq!(line(&log, "node_addresses_seen"), "0");
    // B still answers the node.
    assert_eq!(connect(&endpoint), "b-notebook");

    // A node that allows no internet.
    let mut settings = node.settings();
    settings.network.as_mut().unwrap().internet = false;
    let sb = Sandbox::open(settings, Arc::clone(&node.backend), &node.state("sandbox"))
        .unwrap_or_else(|e| panic!("the sandbox tests need root and crun: {e}"));
    let mut closed = LocalExecutor::open(&node.state("workloads-closed"), "127.0.0.1")
        .unwrap()
        .with_sandbox(sb);
    let c = job(
        "run-c",
        "team-a",
        &node.a.0,
        &format!("{CONNECT_PY}\nt internet python3 /tmp/c.py 198.51.100.1 8080\n"),
    );
    closed.apply(&sync(std::slice::from_ref(&c)));
    let (rep, log) = finished(&mut closed, "run-c", std::slice::from_ref(&c)).await;
    assert_eq!(rep.exit_code, Some(0), "{log}");
    assert_eq!(line(&log, "internet"), "No route to host");

    // A portal elsewhere (198.51.100.1, in the cloud) reaches a notebook at the node's
    // address, which the node forwards to the workload; another host does not, nor does
    // the portal at the workload's own address.
    let mut settings = node.settings();
    settings.network.as_mut().unwrap().proxies = vec!["198.51.100.1".parse().unwrap()];
    let sb = Sandbox::open(settings, Arc::clone(&node.backend), &node.state("sandbox"))
        .unwrap_or_else(|e| panic!("the sandbox tests need root and crun: {e}"));
    let mut remote = LocalExecutor::open(&node.state("workloads-remote"), "192.0.2.10")
        .unwrap()
        .with_sandbox(sb);
    let d = WorkloadSpec {
        argv: ["python3", "-c", SERVE, "{host}", "{port}", "d-notebook"]
            .into_iter()
            .map(str::to_owned)
            .collect(),
        ..b.clone()
    };
    let d = WorkloadSpec {
        id: "nb-d".into(),
        ..d
    };
    remote.apply(&sync(std::slice::from_ref(&d)));
    let reports = remote.reports().await;
    let at = reports[0].endpoint.clone().expect("an endpoint");
    assert!(at.starts_with("192.0.2.10:"), "{at}");
    let deadline = Instant::now() + WAIT;
    while cloud.connect("198.51.100.1", &at) != "d-notebook" {
        assert!(
            Instant::now() < deadline,
            "the portal never reached the notebook at {at}: {}",
            cloud.connect("198.51.100.1", &at)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cloud.connect("198.51.100.3", &at), "x: Connection refused");
    let own = format!(
        "{}:{}",
        remote.address("nb-d").unwrap(),
        at.rsplit_once(':').unwrap().1
    );
    assert_eq!(cloud.connect("198.51.100.1", &own), "x: timed out");
    let stop_d = [WorkloadSpec { run: false, ..d }];
    remote.apply(&sync(&stop_d));
    let (rep, _) = finished(&mut remote, "nb-d", &stop_d).await;
    assert_eq!(rep.message.as_deref(), Some("stopped"));
    remote.apply(&sync(&[]));

    // Stopped, every workload's namespace, link and rules are gone.
    let stop = [WorkloadSpec { run: false, ..b }, a];
    ex.apply(&sync(&stop));
    let (rep, _) = finished(&mut ex, "nb-b", &stop).await;
    assert_eq!(rep.message.as_deref(), Some("stopped"));
    closed.apply(&sync(&[]));
    let tables = std::process::Command::new("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&tables.stdout), "");
    let links = std::process::Command::new("ip")
        .args(["-o", "link"])
        .output()
        .unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(!links.contains(": tsr"), "{links}");
}

/// Team A fills its workspace past the node's quota: its next workload is refused with
/// the reason, while team B's starts and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_over_its_workspace_quota_starts_nothing_more_and_others_run() {
    let node = Node::new();
    let mut ex = node.executor().with_workspace_quota(Some(4 * 1024 * 1024));
    let fill = job(
        "fill",
        "team-a",
        &node.a.0,
        "dd if=/dev/urandom of=$TESSERA_WORKSPACE/big bs=1M count=5 2>/dev/null; sync; echo filled",
    );
    ex.apply(&sync(std::slice::from_ref(&fill)));
    let (rep, log) = finished(&mut ex, "fill", std::slice::from_ref(&fill)).await;
    assert_eq!(rep.exit_code, Some(0), "{log}");
    let more = job("more", "team-a", &node.a.0, "echo started");
    let b = job("b", "team-b", &node.b.0, "echo b-runs");
    let all = [fill, more, b];
    ex.apply(&sync(&all));
    let (rep, _) = finished(&mut ex, "more", &all).await;
    assert_eq!(rep.phase, WorkloadPhase::FailedToStart);
    let message = rep.message.unwrap_or_default();
    assert!(
        message.starts_with(
            "the team's workspace on this node holds 5 MiB, at or over its quota of 4 MiB"
        ),
        "{message}"
    );
    let (rep, log) = finished(&mut ex, "b", &all).await;
    assert_eq!((rep.exit_code, log.as_str()), (Some(0), "b-runs\n"));
}
