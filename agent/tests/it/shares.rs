//! Shared GPUs through the agent's rounds, against a fake server and a simulated H100,
//! with real processes: the MPS control daemon is the simulator's stand-in
//! (`tessera-agent sim-mps-control`, the agent's own binary), started, checked, killed
//! with SIGKILL, restarted and stopped exactly as `nvidia-cuda-mps-control` would be;
//! workloads are real `/bin/sh` jobs (without the sandbox; `sandbox.rs` has the
//! sandboxed MPS client).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_agent::backend::{ComputeMode, ErrorKind, GpuBackend};
use tessera_agent::mps::{
    ALREADY_RUNNING, DEVICES_UNAVAILABLE, MpsControl, MpsDirs, NO_DAEMON, NvidiaMps,
    SIM_CONTEXT_SUBCOMMAND, ServerLimits, SimMps, mps_server, own_uid,
};
use tessera_agent::run::{Agent, RunConfig};
use tessera_agent::sim::SimNode;
use tessera_agent::spool::Spool;
use tessera_agent::telemetry::Telemetry;
use tessera_agent::workloads::{LocalExecutor, MPS_DAEMON_DIED, parse_stat};
use tessera_domain::wire::{
    DesiredGpuState, DesiredState, MigMode, ShareLimits, ShareMethod, SharingState, WorkloadPhase,
    WorkloadReport, WorkloadSpec,
};
use tessera_domain::workload::EnvVar;

use crate::support::{FakeServer, H100, node_with, run_config};

const WAIT: Duration = Duration::from_secs(20);

/// The stand-in control program: this package's `tessera-agent` binary.
pub fn sim_mps(root: &Path) -> Arc<SimMps> {
    Arc::new(SimMps::new(
        Path::new(env!("CARGO_BIN_EXE_tessera-agent")),
        root,
    ))
}

/// Kills (SIGKILL) every daemon whose pid file is under `root` when dropped, so that a
/// failing test leaves no daemon behind.
pub struct Reaper(pub PathBuf);

impl Drop for Reaper {
    fn drop(&mut self) {
        let Ok(gpus) = std::fs::read_dir(&self.0) else {
            return;
        };
        for g in gpus.flatten() {
            let dirs = MpsDirs::under(&self.0, &g.file_name().to_string_lossy());
            if let Some(pid) = dirs.recorded_pid() {
                kill9(pid);
            }
        }
    }
}

pub fn kill9(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
}

/// Whether `pid` runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| parse_stat(&s))
        .is_some_and(|s| s.state != 'Z' && s.state != 'X')
}

pub fn wait_gone(pid: u32) {
    let deadline = Instant::now() + WAIT;
    while alive(pid) {
        assert!(Instant::now() < deadline, "{pid} still runs");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The server's wish: `gpu` shared with `method` (MIG off, no layout), or not shared.
pub fn shared(gpu: &str, method: Option<ShareMethod>, version: u64) -> DesiredGpuState {
    DesiredGpuState {
        gpu_uuid: gpu.to_owned(),
        mode: MigMode::Disabled,
        layout: vec![],
        sharing: method,
        version,
    }
}

pub fn share_job(
    id: &str,
    gpu: &str,
    method: ShareMethod,
    milli: u32,
    script: &str,
) -> WorkloadSpec {
    WorkloadSpec {
        share: Some(ShareLimits {
            method,
            gpu_uuid: gpu.to_owned(),
            milli,
            memory_mib: u64::from(milli) * 80 * 1024 / 1000,
        }),
        ..WorkloadSpec::job(id, "team-1", &[gpu], &["/bin/sh", "-c", script])
    }
}

/// Prints the job's GPU variables, then `ready`, then waits to be stopped.
const PRINT_ENV: &str = "env | grep -E '^(CUDA_|NVIDIA_|TESSERA_GPU_)' | sort; echo ready; \
                         exec sleep 600";

struct Setup {
    // First: fields drop in order, and it reads the pid files in `dir`.
    _reaper: Reaper,
    dir: tempfile::TempDir,
    node: SimNode,
    gpu: String,
    server: FakeServer,
    mps: Arc<SimMps>,
    /// The simulated driver's folder (compute modes, context locks).
    driver: PathBuf,
}

/// A simulated H100 with MIG enabled, the server wanting it shared with `method`.
fn setup(method: ShareMethod) -> Setup {
    let (node, gpu) = node_with(H100, &[]);
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::default();
    server.with(|s| {
        s.desired = DesiredState {
            gpus: vec![shared(&gpu, Some(method), 1)],
        }
    });
    let root = dir.path().join("mps");
    let driver = dir.path().join("driver");
    node.publish_driver_state(&driver).unwrap();
    Setup {
        mps: Arc::new(
            SimMps::new(Path::new(env!("CARGO_BIN_EXE_tessera-agent")), &root).with_driver(&driver),
        ),
        driver,
        _reaper: Reaper(root),
        dir,
        node,
        gpu,
        server,
    }
}

impl Setup {
    fn agent(&self, manage_mig: bool) -> Agent<&FakeServer> {
        let executor = LocalExecutor::open(&self.dir.path().join("workloads"), "127.0.0.1")
            .unwrap()
            .with_inherited_env([
                ("PATH".into(), "/usr/bin:/bin".into()),
                // The agent's own MPS settings never reach a workload.
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "100".into()),
            ]);
        Agent::new(
            Arc::new(self.node.clone()),
            &self.server,
            RunConfig {
                manage_mig,
                ..run_config()
            },
            Telemetry::new(Spool::open(&self.dir.path().join("spool"), 60, 10).unwrap()),
        )
        .with_mps(self.mps.clone())
        .with_workloads(executor)
    }

    fn dirs(&self) -> MpsDirs {
        self.mps.dirs(&self.gpu)
    }

    /// What the last heartbeat said of the GPU's sharing.
    fn sharing(&self) -> Option<SharingState> {
        self.server.with(|s| {
            s.heartbeats
                .last()
                .and_then(|h| h.inventory.gpus.iter().find(|g| g.uuid == self.gpu))
                .and_then(|g| g.sharing.clone())
        })
    }

    fn heartbeats(&self) -> usize {
        self.server.with(|s| s.heartbeats.len())
    }

    fn report(&self, id: &str) -> Option<WorkloadReport> {
        self.server.with(|s| {
            s.workload_reports
                .last()
                .and_then(|r| r.workloads.iter().find(|w| w.id == id).cloned())
        })
    }

    /// The job's variables once it printed them (`NAME=value` lines before `ready`).
    fn job_env(&self, id: &str) -> BTreeMap<String, String> {
        self.job_output(id)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// The job's output once it printed `ready`.
    fn job_output(&self, id: &str) -> String {
        let log = self
            .dir
            .path()
            .join("workloads/runs")
            .join(id)
            .join("output.log");
        let deadline = Instant::now() + WAIT;
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.lines().any(|l| l == "ready") {
                return text;
            }
            assert!(Instant::now() < deadline, "{id} never got ready:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A plain CUDA program's context on the GPU (the simulator's stand-in), from
    /// outside any workload: no MPS variables at all. Its output and whether it got one.
    fn plain_context(&self) -> (String, bool) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera-agent"))
            .arg(SIM_CONTEXT_SUBCOMMAND)
            .arg(&self.driver)
            .env_clear()
            .env("CUDA_VISIBLE_DEVICES", &self.gpu)
            // Not the default /tmp/nvidia-mps of the machine running the tests.
            .env("CUDA_MPS_PIPE_DIRECTORY", self.dir.path().join("no-daemon"))
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            out.status.success(),
        )
    }

    /// The line of the job's output that starts with `label: `, without it.
    fn job_line(&self, id: &str, label: &str) -> String {
        let text = self.job_output(id);
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{label}: ")))
            .unwrap_or_else(|| panic!("no `{label}` in {id}'s output:\n{text}"))
            .to_owned()
    }
}

/// Workload rounds until `done` holds for `id`'s report.
async fn until(
    s: &Setup,
    a: &mut Agent<&FakeServer>,
    id: &str,
    what: &str,
    done: impl Fn(&WorkloadReport) -> bool,
) -> WorkloadReport {
    let deadline = Instant::now() + WAIT;
    loop {
        a.workload_round().await.unwrap();
        if let Some(r) = s.report(id)
            && done(&r)
        {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "{id} never became {what}: {:?}",
            s.report(id)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mps_gpu_gets_mig_disabled_and_a_supervised_daemon() {
    let s = setup(ShareMethod::Mps);
    let mut a = s.agent(true);
    a.heartbeat().await.unwrap();
    assert_eq!(
        s.sharing(),
        None,
        "nothing is known before the desired state"
    );
    assert_eq!(
        s.node.mig_mode(&s.gpu).unwrap().unwrap().current,
        MigMode::Enabled
    );

    a.reconcile_round(0).await.unwrap();
    // MIG went off, the daemon came up, and the server heard it at once.
    assert_eq!(
        s.node.mig_mode(&s.gpu).unwrap().unwrap().current,
        MigMode::Disabled
    );
    assert_eq!(s.heartbeats(), 2, "a heartbeat follows the change");
    assert_eq!(
        s.sharing(),
        Some(SharingState {
            method: ShareMethod::Mps,
            ready: true,
            error: None,
            daemon_restarts: 0,
        })
    );
    let dirs = s.dirs();
    assert_eq!(
        dirs.pipe,
        s.dir.path().join("mps").join(&s.gpu).join("pipe")
    );
    let pid = dirs.recorded_pid().expect("the daemon wrote its pid");
    assert!(alive(pid));
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("sim-mps-control"),
        "{cmdline:?}"
    );
    // It was given the GPU and its folders, as nvidia-cuda-mps-control would be.
    let environ = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/environ")).unwrap())
        .into_owned();
    let vars: Vec<&str> = environ.split('\0').collect();
    assert!(
        vars.contains(&format!("CUDA_VISIBLE_DEVICES={}", s.gpu).as_str()),
        "{vars:?}"
    );
    assert!(
        vars.contains(&format!("CUDA_MPS_PIPE_DIRECTORY={}", dirs.pipe.display()).as_str()),
        "{vars:?}"
    );
    assert!(!vars.iter().any(|v| v.starts_with("TESSERA_")), "{vars:?}");
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::metadata(dirs.pipe.join("control"))
            .unwrap()
            .file_type()
            .is_socket()
    );
    let log = std::fs::read_to_string(dirs.log.join("control.log")).unwrap();
    assert!(
        log.contains(&format!(
            "Starting control daemon using socket {}/control",
            dirs.pipe.display()
        )),
        "{log}"
    );
    assert!(s.mps.check(&s.gpu).is_ok());

    // Converged: the same daemon, nothing new to tell.
    a.reconcile_round(10_000).await.unwrap();
    assert_eq!(dirs.recorded_pid(), Some(pid));
    assert!(alive(pid));
    a.heartbeat().await.unwrap();
    assert_eq!(s.sharing().unwrap().daemon_restarts, 0);
    assert_eq!(s.heartbeats(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_still_in_mig_mode_is_not_ready_and_gets_no_daemon() {
    let s = setup(ShareMethod::Mps);
    // Read-only: the agent may not disable MIG.
    let mut a = s.agent(false);
    a.reconcile_round(0).await.unwrap();
    let state = s.sharing().expect("reported at once");
    assert!(!state.ready);
    assert!(state.error.unwrap().contains("MIG is enabled"));
    assert_eq!(s.dirs().recorded_pid(), None);
    // An MPS job cannot start there.
    let spec = share_job("j", &s.gpu, ShareMethod::Mps, 250, PRINT_ENV);
    s.server.with(|st| st.workloads = vec![spec]);
    let r = until(&s, &mut a, "j", "failed to start", |r| {
        r.phase == WorkloadPhase::FailedToStart
    })
    .await;
    let m = r.message.unwrap();
    assert!(
        m.starts_with("the GPU's MPS daemon is not running: MIG is enabled"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_daemon_is_restarted_and_its_clients_are_told() {
    let s = setup(ShareMethod::Mps);
    let mut a = s.agent(true);
    a.reconcile_round(0).await.unwrap();
    let first = s.dirs().recorded_pid().unwrap();

    let spec = share_job("j", &s.gpu, ShareMethod::Mps, 250, PRINT_ENV);
    s.server.with(|st| st.workloads = vec![spec.clone()]);
    let r = until(&s, &mut a, "j", "running", |r| {
        r.phase == WorkloadPhase::Running
    })
    .await;
    assert_eq!(r.message, None);
    let env = s.job_env("j");
    assert_eq!(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
    assert_eq!(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=20480M");
    assert_eq!(
        env["CUDA_MPS_PIPE_DIRECTORY"],
        s.dirs().pipe.display().to_string()
    );
    assert_eq!(
        env["CUDA_MPS_LOG_DIRECTORY"],
        s.dirs().log.display().to_string()
    );
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], s.gpu);
    assert_eq!(env["TESSERA_GPU_SHARE_METHOD"], "mps");
    assert_eq!(env["TESSERA_GPU_SHARE_MILLI"], "250");
    assert_eq!(env["TESSERA_GPU_MEMORY_MIB"], "20480");

    kill9(first);
    wait_gone(first);
    assert!(s.mps.check(&s.gpu).unwrap_err().contains(NO_DAEMON));
    // A job that arrives now does not start: its daemon does not answer.
    let late = share_job("late", &s.gpu, ShareMethod::Mps, 100, PRINT_ENV);
    s.server
        .with(|st| st.workloads = vec![spec.clone(), late.clone()]);
    let r = until(&s, &mut a, "late", "refused", |r| {
        r.phase == WorkloadPhase::FailedToStart
    })
    .await;
    assert_eq!(
        r.message.as_deref(),
        Some(format!("the GPU's MPS daemon is not running: {NO_DAEMON}").as_str())
    );

    // The next reconcile round finds it dead and starts a new one.
    let mut rounds = 0;
    while s.sharing().is_none_or(|st| st.daemon_restarts == 0) {
        rounds += 1;
        assert!(rounds <= 3, "not restarted: {:?}", s.sharing());
        a.reconcile_round(rounds * 10_000).await.unwrap();
    }
    assert_eq!(rounds, 1);
    let second = s.dirs().recorded_pid().unwrap();
    assert_ne!(second, first);
    assert!(alive(second));
    let state = s.sharing().unwrap();
    assert!(state.ready);
    assert_eq!(state.daemon_restarts, 1);
    let error = state.error.unwrap();
    assert!(
        error.starts_with(&format!(
            "the MPS control daemon died ({NO_DAEMON}) and was restarted"
        )),
        "{error}"
    );

    // The job that ran through it is told; it still runs (on hardware its CUDA calls
    // fail from now on).
    let r = until(&s, &mut a, "j", "told", |r| r.message.is_some()).await;
    assert_eq!(r.phase, WorkloadPhase::Running);
    assert_eq!(r.message.as_deref(), Some(MPS_DAEMON_DIED));
    // One started after the restart is not.
    let fresh = share_job("fresh", &s.gpu, ShareMethod::Mps, 100, PRINT_ENV);
    s.server.with(|st| st.workloads = vec![spec.clone(), fresh]);
    let r = until(&s, &mut a, "fresh", "running", |r| {
        r.phase == WorkloadPhase::Running
    })
    .await;
    assert_eq!(r.message, None);
    // A stop is reported as one.
    s.server.with(|st| st.workloads = vec![]);
    let r = until(&s, &mut a, "j", "stopped", |r| {
        r.phase == WorkloadPhase::Exited
    })
    .await;
    assert_eq!(r.message.as_deref(), Some("stopped"));

    // Another round with the daemon alive: no new restart, same daemon.
    a.reconcile_round(100_000).await.unwrap();
    assert_eq!(s.dirs().recorded_pid(), Some(second));
    a.heartbeat().await.unwrap();
    assert_eq!(s.sharing().unwrap().daemon_restarts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_no_longer_shared_loses_its_daemon_once_idle() {
    let s = setup(ShareMethod::Mps);
    let mut a = s.agent(true);
    a.reconcile_round(0).await.unwrap();
    let pid = s.dirs().recorded_pid().unwrap();
    let spec = share_job("j", &s.gpu, ShareMethod::Mps, 500, PRINT_ENV);
    s.server.with(|st| st.workloads = vec![spec.clone()]);
    until(&s, &mut a, "j", "running", |r| {
        r.phase == WorkloadPhase::Running
    })
    .await;

    s.server.with(|st| {
        st.desired = DesiredState {
            gpus: vec![shared(&s.gpu, None, 2)],
        }
    });
    a.reconcile_round(10_000).await.unwrap();
    assert_eq!(s.sharing(), None, "no longer reported as shared");
    assert!(alive(pid), "its client still runs");
    assert!(s.mps.check(&s.gpu).is_ok());

    s.server.with(|st| st.workloads = vec![]);
    until(&s, &mut a, "j", "stopped", |r| {
        r.phase == WorkloadPhase::Exited
    })
    .await;
    a.reconcile_round(20_000).await.unwrap();
    wait_gone(pid);
    // Stopped with `quit`: the pid file went with it (the socket stays, as on hardware).
    assert_eq!(s.dirs().recorded_pid(), None);
    assert!(s.dirs().pipe.join("control").exists());
    assert!(s.mps.check(&s.gpu).unwrap_err().contains(NO_DAEMON));
    let log = std::fs::read_to_string(s.dirs().log.join("control.log")).unwrap();
    assert!(log.contains("Cmd: quit"), "{log}");

    // Shared again: a fresh daemon, not counted as a restart.
    s.server.with(|st| {
        st.desired = DesiredState {
            gpus: vec![shared(&s.gpu, Some(ShareMethod::Mps), 3)],
        }
    });
    a.reconcile_round(30_000).await.unwrap();
    let state = s.sharing().unwrap();
    assert!(state.ready);
    assert_eq!(state.daemon_restarts, 0);
    assert_eq!(state.error, None);
    assert!(s.dirs().recorded_pid().is_some_and(alive));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_agent_adopts_a_running_daemon_and_restarts_a_dead_one() {
    let s = setup(ShareMethod::Mps);
    let mut a = s.agent(true);
    a.reconcile_round(0).await.unwrap();
    let pid = s.dirs().recorded_pid().unwrap();
    drop(a);
    // The next agent finds it answering: adopted, not started again.
    let mut b = s.agent(true);
    b.reconcile_round(0).await.unwrap();
    assert_eq!(s.dirs().recorded_pid(), Some(pid));
    assert_eq!(s.sharing().unwrap().daemon_restarts, 0);
    drop(b);
    // It died while no agent ran: its pid file says it did not quit.
    kill9(pid);
    wait_gone(pid);
    let mut c = s.agent(true);
    c.reconcile_round(0).await.unwrap();
    let state = s.sharing().unwrap();
    assert!(state.ready);
    assert_eq!(state.daemon_restarts, 1);
    assert_ne!(s.dirs().recorded_pid(), Some(pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_slicing_needs_no_daemon_and_sets_no_mps_variables() {
    let s = setup(ShareMethod::TimeSlice);
    let mut a = s.agent(true);
    a.reconcile_round(0).await.unwrap();
    assert_eq!(
        s.node.mig_mode(&s.gpu).unwrap().unwrap().current,
        MigMode::Disabled
    );
    assert_eq!(
        s.sharing(),
        Some(SharingState {
            method: ShareMethod::TimeSlice,
            ready: true,
            error: None,
            daemon_restarts: 0,
        })
    );
    assert!(!s.dir.path().join("mps").exists(), "no daemon, no folders");

    let mut spec = share_job("ts", &s.gpu, ShareMethod::TimeSlice, 500, PRINT_ENV);
    // Not even when the spec asks for them.
    spec.env = vec![EnvVar {
        name: "CUDA_MPS_PIPE_DIRECTORY".into(),
        value: "/tmp/elsewhere".into(),
    }];
    s.server.with(|st| st.workloads = vec![spec]);
    until(&s, &mut a, "ts", "running", |r| {
        r.phase == WorkloadPhase::Running
    })
    .await;
    let env = s.job_env("ts");
    assert_eq!(env["TESSERA_GPU_SHARE_METHOD"], "time_slice");
    assert_eq!(env["TESSERA_GPU_SHARE_MILLI"], "500");
    assert_eq!(env["TESSERA_GPU_MEMORY_MIB"], "40960");
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], s.gpu);
    let mps: Vec<&String> = env.keys().filter(|k| k.starts_with("CUDA_MPS_")).collect();
    assert!(mps.is_empty(), "{mps:?}");
    s.server.with(|st| st.workloads = vec![]);
    until(&s, &mut a, "ts", "stopped", |r| {
        r.phase == WorkloadPhase::Exited
    })
    .await;
}

#[test]
fn a_second_daemon_on_the_same_pipe_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mps");
    let _reaper = Reaper(root.clone());
    let mps = sim_mps(&root);
    let gpu = "GPU-5ca1ab1e";
    mps.start(gpu).unwrap();
    let pid = mps.dirs(gpu).recorded_pid().unwrap();
    let e = mps.start(gpu).unwrap_err();
    assert!(e.contains(ALREADY_RUNNING), "{e}");
    assert_eq!(mps.dirs(gpu).recorded_pid(), Some(pid));
    assert!(mps.check(gpu).is_ok());
    // Killed, it leaves its socket and pid file; its lock goes with it, so a new daemon
    // takes the stale directory over.
    kill9(pid);
    wait_gone(pid);
    assert!(mps.dirs(gpu).pipe.join("control").exists());
    assert_eq!(mps.dirs(gpu).recorded_pid(), Some(pid));
    mps.start(gpu).unwrap();
    let next = mps.dirs(gpu).recorded_pid().unwrap();
    assert_ne!(next, pid);
    assert!(mps.check(gpu).is_ok());
    // Each GPU has a daemon of its own.
    mps.start("GPU-0ther").unwrap();
    assert!(mps.check("GPU-0ther").is_ok());
    mps.quit(gpu).unwrap();
    wait_gone(next);
    assert!(mps.check("GPU-0ther").is_ok());
    mps.quit("GPU-0ther").unwrap();
    assert!(mps.start("../escape").is_err());
}

/// Only the stand-in: a simulated node whose state folder is deleted leaves no daemon.
#[test]
fn the_stand_in_ends_with_its_state_folder() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("mps");
    let _reaper = Reaper(root.clone());
    let mps = sim_mps(&root);
    mps.start("GPU-1").unwrap();
    let pid = mps.dirs("GPU-1").recorded_pid().unwrap();
    std::fs::remove_dir_all(&root).unwrap();
    wait_gone(pid);
}

/// A job that creates CUDA contexts (the simulator's stand-in) as given, with its limit
/// variables raised, with them unset, and with every `CUDA_MPS_*` variable unset (no
/// pipe directory: it tries a plain context, as CUDA does without a daemon).
fn context_probe(driver: &Path) -> String {
    let ctx = format!(
        "{} {SIM_CONTEXT_SUBCOMMAND} {}",
        env!("CARGO_BIN_EXE_tessera-agent"),
        driver.display()
    );
    format!(
        "echo \"given: $({ctx} 2>&1; echo rc=$?)\"; \
         export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=81920M; \
         echo \"raised: $({ctx} 2>&1; echo rc=$?)\"; \
         unset CUDA_MPS_ACTIVE_THREAD_PERCENTAGE CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; \
         echo \"limits unset: $({ctx} 2>&1; echo rc=$?)\"; \
         for v in $(env | sed -n 's/^\\(CUDA_MPS_[A-Z_]*\\)=.*/\\1/p'); do unset $v; done; \
         echo \"all unset: $({ctx} 2>&1; echo rc=$?)\"; \
         echo \"left: $(env | grep -c '^CUDA_MPS_')\"; \
         echo ready; exec sleep 600"
    )
}

/// The fields of a `context: mps …` line: server pid, percentage, pinned MiB.
fn mps_context(line: &str) -> (u32, String, String) {
    let rest = line
        .strip_prefix("context: mps ")
        .unwrap_or_else(|| panic!("not an MPS context: {line}"));
    let field = |k: &str| {
        rest.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} in {line}"))
            .to_owned()
    };
    (
        field("server").parse().unwrap(),
        field("active_thread_percentage"),
        field("pinned_mem_limit_mib")
            .trim_end_matches(" rc=0")
            .to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mps_limits_are_the_servers_and_a_client_that_unsets_its_variables_gains_nothing() {
    let s = setup(ShareMethod::Mps);
    // Before MPS, the GPU takes anyone's contexts.
    assert_eq!(s.node.compute_mode(&s.gpu).unwrap(), ComputeMode::Default);
    let (out, ok) = s.plain_context();
    assert!(ok, "{out}");
    let mut a = s.agent(true);
    a.reconcile_round(0).await.unwrap();
    assert!(s.sharing().unwrap().ready);
    // Shared with MPS: EXCLUSIVE_PROCESS, so that only the MPS server holds the GPU.
    assert_eq!(
        s.node.compute_mode(&s.gpu).unwrap(),
        ComputeMode::ExclusiveProcess
    );

    let spec = share_job(
        "j",
        &s.gpu,
        ShareMethod::Mps,
        250,
        &context_probe(&s.driver),
    );
    s.server.with(|st| st.workloads = vec![spec.clone()]);
    until(&s, &mut a, "j", "running", |r| {
        r.phase == WorkloadPhase::Running
    })
    .await;
    // As given: the server's limits (25 % and 20480 MiB, the share's).
    let given = s.job_line("j", "given");
    let (server, pct, mib) = mps_context(&given);
    assert_eq!((pct.as_str(), mib.as_str()), ("25.0", "20480"), "{given}");
    // Raising its own variables, or unsetting them, gains nothing: the limits are the
    // server's, set through the control daemon.
    for label in ["raised", "limits unset"] {
        let line = s.job_line("j", label);
        assert_eq!(
            mps_context(&line),
            (server, "25.0".to_owned(), "20480".to_owned()),
            "{label}: {line}"
        );
    }
    // Without any CUDA_MPS_* variable it is not an MPS client, and the GPU, held by the
    // MPS server in EXCLUSIVE_PROCESS mode, refuses it a context of its own.
    assert_eq!(s.job_line("j", "left"), "0");
    assert_eq!(
        s.job_line("j", "all unset"),
        format!("cudaErrorDevicesUnavailable: {DEVICES_UNAVAILABLE}"),
        "{}",
        s.job_output("j")
    );
    // So does any other plain program on the node.
    let (out, ok) = s.plain_context();
    assert!(!ok);
    assert_eq!(
        out,
        format!("cudaErrorDevicesUnavailable: {DEVICES_UNAVAILABLE}")
    );
    // The limits went through the control daemon, on the server of the job's uid.
    let log = std::fs::read_to_string(s.dirs().log.join("control.log")).unwrap();
    let uid = own_uid();
    for cmd in [
        format!("Cmd: start_server -uid {uid}"),
        format!("Cmd: set_active_thread_percentage {server} 25"),
        format!("Cmd: set_device_pinned_mem_limit {server} 0 20480M"),
    ] {
        assert!(log.contains(&cmd), "no `{cmd}` in\n{log}");
    }

    // Another share of the same server (same uid) with other limits cannot run beside
    // it: MPS limits are per server. One with the same limits can.
    let other = share_job("other", &s.gpu, ShareMethod::Mps, 500, PRINT_ENV);
    let same = share_job("same", &s.gpu, ShareMethod::Mps, 250, PRINT_ENV);
    s.server
        .with(|st| st.workloads = vec![spec.clone(), other, same.clone()]);
    let r = until(&s, &mut a, "other", "refused", |r| {
        r.phase == WorkloadPhase::FailedToStart
    })
    .await;
    let m = r.message.unwrap();
    assert!(
        m.starts_with("the share's MPS limits cannot be enforced:")
            && m.contains("MPS limits are per server"),
        "{m}"
    );
    until(&s, &mut a, "same", "running", |r| {
        r.phase == WorkloadPhase::Running
    })
    .await;

    // Unshared and idle: the daemon quits and the GPU takes plain contexts again.
    s.server.with(|st| {
        st.workloads = vec![];
        st.desired = DesiredState {
            gpus: vec![shared(&s.gpu, None, 2)],
        }
    });
    let deadline = Instant::now() + WAIT;
    let ended = |id: &str| {
        s.report(id)
            .is_none_or(|r| r.phase == WorkloadPhase::Exited)
    };
    while !(ended("j") && ended("same")) {
        assert!(Instant::now() < deadline, "the jobs never stopped");
        a.workload_round().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = s.dirs().recorded_pid().unwrap();
    a.reconcile_round(10_000).await.unwrap();
    wait_gone(pid);
    assert_eq!(s.node.compute_mode(&s.gpu).unwrap(), ComputeMode::Default);
    let (out, ok) = s.plain_context();
    assert!(ok, "{out}");
    assert!(out.starts_with("context: direct"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_that_cannot_be_made_exclusive_is_not_shared_with_mps() {
    let s = setup(ShareMethod::Mps);
    let mut a = s.agent(true);
    s.node
        .fail_next("set_compute_mode", ErrorKind::NoPermission);
    a.reconcile_round(0).await.unwrap();
    let state = s.sharing().unwrap();
    assert!(!state.ready);
    let error = state.error.unwrap();
    assert!(
        error.starts_with("cannot put the GPU in EXCLUSIVE_PROCESS compute mode"),
        "{error}"
    );
    // No daemon: it would have been advice only.
    assert_eq!(s.dirs().recorded_pid(), None);
    assert_eq!(s.node.compute_mode(&s.gpu).unwrap(), ComputeMode::Default);
    // The next round, with the driver willing, shares it.
    a.reconcile_round(10_000).await.unwrap();
    assert!(s.sharing().unwrap().ready);
    assert_eq!(
        s.node.compute_mode(&s.gpu).unwrap(),
        ComputeMode::ExclusiveProcess
    );
}

/// A control daemon that runs servers but cannot set per-server limits (an old driver):
/// `set_*` answers as an unknown command does.
const OLD_DRIVER: &str = r#"#!/bin/sh
state="$CUDA_MPS_PIPE_DIRECTORY/servers"
[ "$1" = "-d" ] && { mkdir -p "$CUDA_MPS_PIPE_DIRECTORY"; exit 0; }
while read -r cmd a b c; do
  case "$cmd" in
    get_server_list) cat "$state" 2>/dev/null || true ;;
    start_server) echo 4242 > "$state" ;;
    get_active_thread_percentage) echo 100.0 ;;
    get_device_pinned_mem_limit) echo 0 ;;
    *) echo "Unrecognized command $cmd" ;;
  esac
done
exit 0
"#;

#[test]
fn a_driver_that_cannot_set_a_servers_limits_refuses_the_share() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("old-mps-control");
    std::fs::write(&program, OLD_DRIVER).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mps = NvidiaMps::with_program(&program, &dir.path().join("mps"));
    let gpu = "GPU-01d";
    mps.start(gpu).unwrap();
    let limits = ServerLimits {
        active_thread_percentage: 25,
        pinned_mem_mib: 20480,
    };
    let e = mps_server(&mps, gpu, 1000, limits, false).unwrap_err();
    assert!(
        e.starts_with("the MPS control daemon refused `set_active_thread_percentage 4242 25`")
            && e.contains("Unrecognized command")
            && e.contains("cannot enforce"),
        "{e}"
    );
    // Limits it already has are not asked again.
    let unlimited = ServerLimits {
        active_thread_percentage: 100,
        pinned_mem_mib: 0,
    };
    assert_eq!(mps_server(&mps, gpu, 1000, unlimited, false), Ok(4242));
}
