//! Shared GPUs: one NVIDIA MPS control daemon per GPU the server wants shared with MPS,
//! run and supervised by the agent, and the state of every shared GPU as the heartbeat
//! reports it ([`SharingState`]).
//!
//! **The daemon.** [`MpsControl`] is the whole interface: start a GPU's daemon, ask it
//! whether it answers, ask it to quit. Both implementations run a control program the
//! way NVIDIA documents `nvidia-cuda-mps-control`, with `CUDA_VISIBLE_DEVICES=<GPU
//! UUID>`, `CUDA_MPS_PIPE_DIRECTORY=<root>/<GPU>/pipe` and
//! `CUDA_MPS_LOG_DIRECTORY=<root>/<GPU>/log` (`<root>` is `<state-dir>/mps`):
//! `… -d` starts it in the background, `echo get_server_list | …` checks it (a zero exit
//! and no "Cannot find MPS control daemon process"), `echo quit | …` stops it. Every
//! call has a time limit ([`CONTROL_TIMEOUT`]), so a daemon that hangs cannot stall the
//! agent.
//! - [`NvidiaMps`] runs `nvidia-cuda-mps-control` (NVML backend, real GPUs).
//! - [`SimMps`] runs the agent's own binary as `tessera-agent sim-mps-control`
//!   ([`sim_control_main`]), a stand-in for `--simulate` and the tests. The agent's
//!   code path is the same: it spawns a program, reads its exit status and output, and
//!   finds the daemon's pid in the pipe directory.
//!
//! **What the stand-in models** (from NVIDIA's MPS documentation and what operators
//! show of a running daemon): `-d` returns once a detached daemon process runs in its
//! own process group; the daemon creates the pipe and log directories, takes a lock on
//! `<pipe>/control_lock` (a second daemon on the same pipe directory prints "An
//! instance of this daemon is already running" and exits 1, while a killed daemon's
//! lock goes with it, so a new one can take over the stale directory), listens on the
//! UNIX socket `<pipe>/control` (mode 0666), writes its pid to
//! `<pipe>/nvidia-cuda-mps-control.pid` and appends `Starting control daemon using
//! socket <pipe>/control` and `To connect CUDA applications to this daemon, set env
//! CUDA_MPS_PIPE_DIRECTORY=<pipe>` to `<log>/control.log`, each line prefixed
//! `[YYYY-MM-DD HH:MM:SS.mmm Control <pid>]`. The client mode (no option) sends each
//! line of its standard input to the daemon and prints the answer, or prints "Cannot
//! find MPS control daemon process" and exits 1 when nothing listens. `quit` removes the
//! pid file and ends the daemon; the socket stays, as on hardware. SIGKILL ends it at
//! once and leaves the pid file and socket behind, which is how the supervisor tells a
//! daemon that died from one that was stopped. Unlike the real daemon, the stand-in also
//! ends when its control socket is removed (a simulated node's state folder deleted),
//! so that simulated nodes leave no daemon behind.
//!
//! **MPS servers and their limits** (the stand-in's model of `nvidia-cuda-mps-server`):
//! one server per uid, an entry in the daemon rather than a process (its "pid" is a
//! number the daemon hands out, not a process), started by `start_server -uid <uid>`
//! or by the first client of that uid, with the daemon's defaults of that moment
//! (`set_default_active_thread_percentage`, `set_default_device_pinned_mem_limit`);
//! `set_active_thread_percentage <pid> <pct>` and `set_device_pinned_mem_limit <pid>
//! <dev> <limit>` (and their `get_`s) change one server's; `get_server_list` lists them.
//! With the simulated driver's folder ([`SimMps::with_driver`], published by
//! [`crate::sim::SimNode::publish_driver_state`]), the servers hold their GPU's context
//! there: on a GPU in EXCLUSIVE_PROCESS compute mode, an exclusive lock, so no other
//! process gets a context while a server runs.
//!
//! **CUDA clients** (the stand-in's model of what the CUDA driver does at `cuInit`):
//! `tessera-agent sim-cuda-context <driver folder>` ([`sim_context_main`]) connects to
//! the daemon on `CUDA_MPS_PIPE_DIRECTORY` (default `/tmp/nvidia-mps`) and gets its
//! uid's server's limits, which its own `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and
//! `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` can lower but not raise; with no daemon there it
//! makes a plain context, which a GPU in EXCLUSIVE_PROCESS mode held by an MPS server
//! refuses with `cudaErrorDevicesUnavailable` ("all CUDA-capable devices are busy or
//! unavailable"). It prints what it got; no work runs.
//!
//! **Not modelled**: server processes (and the clients' wait when a server of another
//! uid runs, which a daemon without multi-user mode imposes), `get_client_list`, the
//! `control_privileged` socket and the `log` FIFO of the pipe directory, `server.log`,
//! compute actually being limited (the limits are numbers handed to the client), and the
//! real protocol on the socket (the stand-in's is one command per connection).
//!
//! **Supervision.** [`ShareSupervisor::tick`] runs in every reconcile round, after the
//! MIG reconcile (which disables MIG on a GPU the server wants shared): for each GPU
//! desired shared it reports [`SharingState`] through the [`ShareBoard`]; with MPS, once
//! MIG is off, it puts the GPU in EXCLUSIVE_PROCESS compute mode (a GPU that cannot be
//! put in it is not ready, with the reason, and gets no daemon: a program that left MPS
//! would get the whole GPU), makes sure the daemon answers, starts it when it does not, and counts
//! a restart when the daemon had been running (or left a pid file behind: it was
//! killed) before. A daemon of a GPU no longer desired with MPS is asked to quit once no
//! workload uses that GPU, and the GPU goes back to DEFAULT compute mode. The executor
//! reads the board to start MPS clients ([`ShareBoard::mps_client`]), to get the MPS
//! server of the client's uid with the share's limits in force ([`mps_server`]: set
//! through the daemon, so a client that unsets its variables gains nothing; a limit the
//! daemon refuses or does not apply refuses the share), and to tell workloads that their
//! daemon died while they ran ([`ShareBoard::died_during`]).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tessera_domain::wire::{
    DesiredState, Inventory, MigMode, MigModeState, ShareMethod, SharingState,
};

use crate::backend::{ComputeMode, GpuBackend};
use crate::workloads::safe_name;

/// NVIDIA's control program.
pub const CONTROL_PROGRAM: &str = "nvidia-cuda-mps-control";
/// The hidden subcommand of `tessera-agent` that stands in for [`CONTROL_PROGRAM`].
pub const SIM_SUBCOMMAND: &str = "sim-mps-control";
/// In the pipe directory: the daemon's pid, removed when it quits.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// In the pipe directory: the socket clients and the control program connect to.
pub const CONTROL_SOCKET: &str = "control";
/// In the pipe directory: what the running daemon holds locked.
pub const CONTROL_LOCK: &str = "control_lock";
/// In the log directory: the daemon's log.
pub const CONTROL_LOG: &str = "control.log";
/// What `-d` prints when a daemon already runs on that pipe directory.
pub const ALREADY_RUNNING: &str = "An instance of this daemon is already running";
/// What the control program prints when no daemon listens on the pipe directory.
pub const NO_DAEMON: &str = "Cannot find MPS control daemon process";
/// The stand-in daemon's variable naming the simulated driver's folder.
pub const SIM_DRIVER_ENV: &str = "SIM_GPU_DRIVER_DIR";
/// The hidden subcommand of `tessera-agent` that stands in for a CUDA program creating
/// a context ([`sim_context_main`]).
pub const SIM_CONTEXT_SUBCOMMAND: &str = "sim-cuda-context";
/// What the CUDA runtime says when a GPU takes no more contexts
/// (`cudaErrorDevicesUnavailable`).
pub const DEVICES_UNAVAILABLE: &str = "all CUDA-capable devices are busy or unavailable";
/// The longest any call of the control program may take.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// The folders of one GPU's daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsDirs {
    /// `CUDA_MPS_PIPE_DIRECTORY`: the daemon's sockets, lock and pid file.
    pub pipe: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`: `control.log` (and `server.log` on hardware).
    pub log: PathBuf,
}

impl MpsDirs {
    /// `<root>/<gpu>/pipe` and `<root>/<gpu>/log`.
    pub fn under(root: &Path, gpu: &str) -> MpsDirs {
        let base = root.join(gpu);
        MpsDirs {
            pipe: base.join("pipe"),
            log: base.join("log"),
        }
    }

    /// The pid the daemon wrote, if its pid file is there (a daemon that quit removes
    /// it; one that was killed leaves it).
    pub fn recorded_pid(&self) -> Option<u32> {
        read_pid(&self.pipe)
    }
}

fn read_pid(pipe: &Path) -> Option<u32> {
    fs::read_to_string(pipe.join(PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// One MPS control daemon per GPU. See the module docs.
pub trait MpsControl: Send + Sync {
    /// Where `gpu`'s daemon lives (the folders need not exist yet).
    fn dirs(&self, gpu: &str) -> MpsDirs;
    /// Starts `gpu`'s daemon in the background (`-d`); the error is what went wrong,
    /// in the control program's words when it said something.
    fn start(&self, gpu: &str) -> Result<(), String>;
    /// `Ok` when the daemon answers (`get_server_list`).
    fn check(&self, gpu: &str) -> Result<(), String>;
    /// Asks the daemon to quit.
    fn quit(&self, gpu: &str) -> Result<(), String>;
    /// Sends one command to `gpu`'s daemon; its answer (empty when it said nothing).
    fn send(&self, gpu: &str, command: &str) -> Result<String, String>;
}

/// The limits of one MPS server, set through the control daemon (never through the
/// client's environment, which the client controls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// `set_active_thread_percentage <server pid> <pct>`.
    pub active_thread_percentage: u32,
    /// `set_device_pinned_mem_limit <server pid> 0 <MiB>M` (the server sees one GPU).
    pub pinned_mem_mib: u64,
}

impl std::fmt::Display for ServerLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}% of the SMs and {} MiB of pinned device memory",
            self.active_thread_percentage, self.pinned_mem_mib
        )
    }
}

/// This process's (effective) uid: the owner of `/proc/self`.
pub fn own_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

/// The PIDs `get_server_list` names (one per line).
fn server_list(c: &dyn MpsControl, gpu: &str) -> Result<BTreeSet<u32>, String> {
    let out = c.send(gpu, "get_server_list")?;
    out.split_whitespace()
        .map(|w| {
            w.parse::<u32>()
                .map_err(|_| format!("unexpected answer to `get_server_list`: {out}"))
        })
        .collect()
}

/// A memory size as the control daemon writes one: a number with an optional `K`, `M`,
/// `G` or `T` (binary units), bytes without; in MiB, rounded down.
fn parse_mib(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().find(|(_, ch)| ch.is_ascii_alphabetic()) {
        Some((i, _)) => (&s[..i], s[i..].trim_end_matches(['B', 'b'])),
        None => (s, ""),
    };
    let v: f64 = num.trim().parse().ok()?;
    let mib = match unit.to_ascii_uppercase().as_str() {
        "" => v / (1024.0 * 1024.0),
        "K" => v / 1024.0,
        "M" => v,
        "G" => v * 1024.0,
        "T" => v * 1024.0 * 1024.0,
        _ => return None,
    };
    (mib >= 0.0).then_some(mib as u64)
}

/// What the daemon says `pid`'s limits are.
fn read_limits(c: &dyn MpsControl, gpu: &str, pid: u32) -> Result<ServerLimits, String> {
    let ask = |command: String| -> Result<String, String> {
        c.send(gpu, &command)
            .map_err(|e| format!("`{command}` failed: {e}"))
    };
    let pct = ask(format!("get_active_thread_percentage {pid}"))?;
    let mem = ask(format!("get_device_pinned_mem_limit {pid} 0"))?;
    let active_thread_percentage = pct
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|p| (0.0..=100.0).contains(p))
        .map(|p| p.round() as u32)
        .ok_or_else(|| format!("unexpected answer to `get_active_thread_percentage`: {pct}"))?;
    let pinned_mem_mib = parse_mib(&mem)
        .ok_or_else(|| format!("unexpected answer to `get_device_pinned_mem_limit`: {mem}"))?;
    Ok(ServerLimits {
        active_thread_percentage,
        pinned_mem_mib,
    })
}

/// The MPS server of `uid` on `gpu`, with `limits`; its pid. One server per (GPU, team
/// uid): started with `start_server -uid <uid>` when none runs (the agent notes its
/// pid in `<root>/<gpu>/server-uid-<uid>`), then its limits set with
/// `set_active_thread_percentage` and `set_device_pinned_mem_limit` and read back. A
/// limit the daemon refuses or does not apply is an error: the share is refused, never
/// run with limits that are only advice. `busy`: clients of this server run, whose
/// limits must not change, so a server with other limits is an error too.
pub fn mps_server(
    c: &dyn MpsControl,
    gpu: &str,
    uid: u32,
    limits: ServerLimits,
    busy: bool,
) -> Result<u32, String> {
    let gpu = checked_gpu(gpu)?;
    let base = c
        .dirs(gpu)
        .pipe
        .parent()
        .map(Path::to_path_buf)
        .ok_or("the MPS pipe directory has no parent")?;
    let record = base.join(format!("server-uid-{uid}"));
    let before = server_list(c, gpu)?;
    let known = fs::read_to_string(&record)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|p| before.contains(p));
    let pid = match known {
        Some(p) => p,
        None => {
            let command = format!("start_server -uid {uid}");
            let out = c
                .send(gpu, &command)
                .map_err(|e| format!("`{command}` failed: {e}"))?;
            if !out.trim().is_empty() {
                return Err(format!("`{command}` answered: {out}"));
            }
            let after = server_list(c, gpu)?;
            let new: Vec<u32> = after.difference(&before).copied().collect();
            let [p] = new.as_slice() else {
                return Err(format!(
                    "`{command}` started {} servers (get_server_list before: {before:?}, \
                     after: {after:?}); the agent cannot tell which is the team's",
                    new.len()
                ));
            };
            fs::write(&record, p.to_string())
                .map_err(|e| format!("cannot write {}: {e}", record.display()))?;
            *p
        }
    };
    let current = read_limits(c, gpu, pid)?;
    if current == limits {
        return Ok(pid);
    }
    if busy {
        return Err(format!(
            "the team's MPS server on this GPU serves other shares with {current}, and MPS \
             limits are per server: a share with {limits} cannot run beside them"
        ));
    }
    for command in [
        format!(
            "set_active_thread_percentage {pid} {}",
            limits.active_thread_percentage
        ),
        format!(
            "set_device_pinned_mem_limit {pid} 0 {}M",
            limits.pinned_mem_mib
        ),
    ] {
        let out = c
            .send(gpu, &command)
            .map_err(|e| format!("`{command}` failed: {e}"))?;
        if !out.trim().is_empty() {
            return Err(format!(
                "the MPS control daemon refused `{command}`: {out} (this driver cannot \
                 enforce the share's limits)"
            ));
        }
    }
    let now = read_limits(c, gpu, pid)?;
    if now != limits {
        return Err(format!(
            "the MPS control daemon did not apply the share's limits ({limits} asked, {now} \
             in force): this driver cannot enforce them"
        ));
    }
    Ok(pid)
}

/// A control program and how both implementations run it.
#[derive(Debug, Clone)]
struct ControlProgram {
    program: PathBuf,
    /// Arguments before the control program's own (the stand-in's subcommand).
    prefix: Vec<OsString>,
    root: PathBuf,
    /// More of the daemon's environment (the stand-in's driver folder).
    env: Vec<(OsString, OsString)>,
}

impl ControlProgram {
    fn name(&self) -> String {
        self.program.display().to_string()
    }

    fn dirs(&self, gpu: &str) -> MpsDirs {
        MpsDirs::under(&self.root, gpu)
    }

    /// The control program with the daemon's environment and nothing else of the agent's
    /// (the join token stays with the agent; the MPS server inherits this environment).
    fn command(&self, gpu: &str, dirs: &MpsDirs) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.prefix)
            .env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| {
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
                }),
            )
            .env("CUDA_VISIBLE_DEVICES", gpu)
            .env("CUDA_MPS_PIPE_DIRECTORY", &dirs.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &dirs.log)
            .current_dir("/");
        if let Some(v) = std::env::var_os("LD_LIBRARY_PATH") {
            c.env("LD_LIBRARY_PATH", v);
        }
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c
    }

    fn start(&self, gpu: &str) -> Result<(), String> {
        let gpu = checked_gpu(gpu)?;
        let dirs = self.dirs(gpu);
        for d in [&self.root, &dirs.pipe, &dirs.log] {
            fs::create_dir_all(d)
                .and_then(|()| fs::set_permissions(d, fs::Permissions::from_mode(0o755)))
                .map_err(|e| format!("cannot prepare {}: {e}", d.display()))?;
        }
        let mut c = self.command(gpu, &dirs);
        // Its own process group: a Ctrl-C meant for the agent does not reach it.
        c.arg("-d").process_group(0);
        run_control(c, None, &self.root.join(gpu).join("agent-control.out"))
            .map(|_| ())
            .map_err(|e| format!("`{} -d`: {e}", self.name()))
    }

    fn send(&self, gpu: &str, command: &str) -> Result<String, String> {
        let gpu = checked_gpu(gpu)?;
        let dirs = self.dirs(gpu);
        let base = self.root.join(gpu);
        fs::create_dir_all(&base).map_err(|e| format!("cannot prepare {}: {e}", base.display()))?;
        let out = run_control(
            self.command(gpu, &dirs),
            Some(command),
            &base.join("agent-control.out"),
        )?;
        if out.contains(NO_DAEMON) {
            return Err(out);
        }
        Ok(out)
    }
}

fn checked_gpu(gpu: &str) -> Result<&str, String> {
    if safe_name(gpu) {
        Ok(gpu)
    } else {
        Err(format!("`{gpu}` is not a GPU UUID"))
    }
}

/// Runs `cmd` (stdin: `input` then end of file), its stdout and stderr into `out_path`
/// (a file, not a pipe: a daemon that keeps them open must not block the agent), for at
/// most [`CONTROL_TIMEOUT`]. `Ok(output)` on a zero exit, else `Err(output or status)`.
fn run_control(mut cmd: Command, input: Option<&str>, out_path: &Path) -> Result<String, String> {
    let out = File::create(out_path).map_err(|e| format!("{}: {e}", out_path.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    cmd.stdout(out).stderr(err).stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run `{program}`: {e}"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        // A program that exits without reading is answered by its exit status below.
        let _ = stdin.write_all(format!("{text}\n").as_bytes());
    }
    let deadline = Instant::now() + CONTROL_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "`{program}` did not finish within {} s",
                    CONTROL_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for `{program}`: {e}")),
        }
    };
    let text = fs::read_to_string(out_path)
        .unwrap_or_default()
        .trim()
        .to_owned();
    if status.success() {
        Ok(text)
    } else if text.is_empty() {
        Err(format!("it exited with {status}"))
    } else {
        Err(text)
    }
}

/// NVIDIA's `nvidia-cuda-mps-control`, for real GPUs.
#[derive(Debug, Clone)]
pub struct NvidiaMps(ControlProgram);

impl NvidiaMps {
    /// `nvidia-cuda-mps-control` from `PATH`, daemons under `root` (`<state-dir>/mps`).
    pub fn new(root: &Path) -> NvidiaMps {
        NvidiaMps::with_program(Path::new(CONTROL_PROGRAM), root)
    }

    pub fn with_program(program: &Path, root: &Path) -> NvidiaMps {
        NvidiaMps(ControlProgram {
            program: program.to_owned(),
            prefix: Vec::new(),
            root: root.to_owned(),
            env: Vec::new(),
        })
    }
}

/// The simulator's daemon: `<agent> sim-mps-control` ([`sim_control_main`]), real
/// processes that behave as the module docs say.
#[derive(Debug, Clone)]
pub struct SimMps(ControlProgram);

impl SimMps {
    /// `agent` is the `tessera-agent` binary (the running one: `std::env::current_exe`;
    /// in tests `CARGO_BIN_EXE_tessera-agent`).
    pub fn new(agent: &Path, root: &Path) -> SimMps {
        SimMps(ControlProgram {
            program: agent.to_owned(),
            prefix: vec![SIM_SUBCOMMAND.into()],
            root: root.to_owned(),
            env: Vec::new(),
        })
    }

    /// The simulated driver's folder ([`crate::sim::SimNode::publish_driver_state`]):
    /// the stand-in's MPS servers then hold their GPU's exclusive context there.
    pub fn with_driver(mut self, dir: &Path) -> SimMps {
        self.0
            .env
            .push((SIM_DRIVER_ENV.into(), dir.as_os_str().to_owned()));
        self
    }
}

macro_rules! control_via_program {
    ($t:ty) => {
        impl MpsControl for $t {
            fn dirs(&self, gpu: &str) -> MpsDirs {
                self.0.dirs(gpu)
            }
            fn start(&self, gpu: &str) -> Result<(), String> {
                self.0.start(gpu)
            }
            fn check(&self, gpu: &str) -> Result<(), String> {
                self.0.send(gpu, "get_server_list").map(|_| ())
            }
            fn quit(&self, gpu: &str) -> Result<(), String> {
                self.0.send(gpu, "quit").map(|_| ())
            }
            fn send(&self, gpu: &str, command: &str) -> Result<String, String> {
                self.0.send(gpu, command)
            }
        }
    };
}
control_via_program!(NvidiaMps);
control_via_program!(SimMps);

/// A shared GPU as the agent runs it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuShare {
    pub method: ShareMethod,
    pub ready: bool,
    pub error: Option<String>,
    pub daemon_restarts: u32,
    /// MPS: the daemon's folders while it answers.
    pub mps: Option<MpsDirs>,
}

impl GpuShare {
    fn not_ready(method: ShareMethod, restarts: u32, why: impl Into<String>) -> GpuShare {
        GpuShare {
            method,
            ready: false,
            error: Some(why.into()),
            daemon_restarts: restarts,
            mps: None,
        }
    }

    pub fn state(&self) -> SharingState {
        SharingState {
            method: self.method,
            ready: self.ready,
            error: self.error.clone(),
            daemon_restarts: self.daemon_restarts,
        }
    }
}

/// A daemon death the supervisor found: between `alive_until` (its last answer; `None`
/// when this agent never saw it answer) and `detected`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Death {
    alive_until: Option<Instant>,
    detected: Instant,
}

#[derive(Default)]
struct Board {
    gpus: BTreeMap<String, GpuShare>,
    deaths: BTreeMap<String, Vec<Death>>,
}

/// What the supervisor found, for the heartbeat and the executor. Clones share it.
#[derive(Clone, Default)]
pub struct ShareBoard {
    board: Arc<Mutex<Board>>,
    control: Option<Arc<dyn MpsControl>>,
}

/// Deaths remembered per GPU (for workloads started before them).
const DEATHS_KEPT: usize = 32;

impl ShareBoard {
    /// A board whose MPS daemons `control` runs (`None`: this agent runs none).
    pub fn new(control: Option<Arc<dyn MpsControl>>) -> ShareBoard {
        ShareBoard {
            board: Arc::default(),
            control,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn control(&self) -> Option<&Arc<dyn MpsControl>> {
        self.control.as_ref()
    }

    pub fn get(&self, gpu: &str) -> Option<GpuShare> {
        self.lock().gpus.get(gpu).cloned()
    }

    /// Sets `GpuInfo::sharing` for every GPU desired shared.
    pub fn fill(&self, inv: &mut Inventory) {
        let board = self.lock();
        for g in &mut inv.gpus {
            g.sharing = board.gpus.get(&g.uuid).map(GpuShare::state);
        }
    }

    /// For a workload about to start on an MPS share of `gpu`: the daemon's folders, once
    /// the daemon has answered just now. The error says why it cannot start.
    pub fn mps_client(&self, gpu: &str) -> Result<MpsDirs, String> {
        let share = self.get(gpu);
        let dirs = match share {
            Some(GpuShare {
                method: ShareMethod::Mps,
                mps: Some(dirs),
                ..
            }) => dirs,
            Some(GpuShare {
                method: ShareMethod::Mps,
                error,
                ..
            }) => {
                return Err(error.unwrap_or_else(|| "it has not been started yet".to_owned()));
            }
            Some(GpuShare {
                method: ShareMethod::TimeSlice,
                ..
            }) => return Err("the GPU is shared by time-slicing on this node, not MPS".into()),
            None => return Err("the GPU is not shared with MPS on this node".to_owned()),
        };
        let control = self
            .control
            .as_ref()
            .ok_or("this agent runs no MPS daemons")?;
        control.check(gpu)?;
        Ok(dirs)
    }

    /// The MPS server for a client of `uid` on `gpu`, with `limits` in force (see
    /// [`mps_server`]); its pid.
    pub fn mps_server(
        &self,
        gpu: &str,
        uid: u32,
        limits: ServerLimits,
        busy: bool,
    ) -> Result<u32, String> {
        let control = self
            .control
            .as_ref()
            .ok_or("this agent runs no MPS daemons")?;
        mps_server(control.as_ref(), gpu, uid, limits, busy)
    }

    /// Whether `gpu`'s daemon died (and was found dead) while a workload that started at
    /// `started` and ended at `ended` (`None`: still runs) ran.
    pub fn died_during(&self, gpu: &str, started: Instant, ended: Option<Instant>) -> bool {
        let board = self.lock();
        board.deaths.get(gpu).is_some_and(|ds| {
            ds.iter().any(|d| {
                d.detected > started && ended.is_none_or(|e| d.alive_until.is_none_or(|a| a < e))
            })
        })
    }

    fn publish(&self, gpus: BTreeMap<String, GpuShare>) -> bool {
        let mut board = self.lock();
        let changed = board.gpus != gpus;
        board.gpus = gpus;
        changed
    }

    fn record_death(&self, gpu: &str, death: Death) {
        let mut board = self.lock();
        let ds = board.deaths.entry(gpu.to_owned()).or_default();
        ds.push(death);
        if ds.len() > DEATHS_KEPT {
            ds.remove(0);
        }
    }
}

/// What the supervisor keeps per GPU whose daemon it knows.
#[derive(Debug, Default)]
struct Track {
    /// The daemon answered at the last check (or a pid file said one may run).
    running: bool,
    /// When it last answered.
    alive_at: Option<Instant>,
    /// It died: the next successful start is a restart.
    restart_due: bool,
    restarts: u32,
    /// The last death, and how the restart went.
    last_failure: Option<String>,
}

/// Keeps each shared GPU's daemon running; see the module docs.
pub struct ShareSupervisor {
    board: ShareBoard,
    tracks: BTreeMap<String, Track>,
    seeded: bool,
}

/// Why a GPU cannot be shared yet, or `Ok` once MIG is off (or it has none).
fn mig_off(backend: &dyn GpuBackend, gpu: &str) -> Result<(), String> {
    match backend.mig_mode(gpu) {
        Ok(None)
        | Ok(Some(MigModeState {
            current: MigMode::Disabled,
            ..
        })) => Ok(()),
        Ok(Some(MigModeState {
            pending: MigMode::Disabled,
            ..
        })) => Err(
            "MIG is still enabled on this GPU: disabling it waits for a GPU reset or reboot".into(),
        ),
        Ok(Some(_)) => {
            Err("MIG is enabled on this GPU; it is shared once MIG is disabled".to_owned())
        }
        Err(e) => Err(format!("cannot read the GPU's MIG mode: {e}")),
    }
}

/// Puts an MPS GPU in EXCLUSIVE_PROCESS compute mode, or says why it cannot be shared:
/// in that mode the MPS server is the GPU's one process, so a program that leaves MPS
/// (unsets `CUDA_MPS_PIPE_DIRECTORY`) gets no context rather than the whole GPU.
fn exclusive(backend: &dyn GpuBackend, gpu: &str) -> Result<(), String> {
    let refused = |e: &dyn std::fmt::Display| {
        format!(
            "cannot put the GPU in EXCLUSIVE_PROCESS compute mode ({e}): without it a \
             workload that leaves MPS would get the whole GPU, so it is not shared"
        )
    };
    match backend.compute_mode(gpu) {
        Ok(ComputeMode::ExclusiveProcess) => Ok(()),
        Ok(_) => backend
            .set_compute_mode(gpu, ComputeMode::ExclusiveProcess)
            .map_err(|e| refused(&e)),
        Err(e) => Err(refused(&e)),
    }
}

impl ShareSupervisor {
    pub fn new(board: ShareBoard) -> ShareSupervisor {
        ShareSupervisor {
            board,
            tracks: BTreeMap::new(),
            seeded: false,
        }
    }

    pub fn board(&self) -> &ShareBoard {
        &self.board
    }

    /// One round. `desired` is `None` until the server's desired state has been read
    /// once (nothing is started or stopped before). `in_use`: GPUs with live workloads.
    /// Returns whether what the heartbeat reports changed.
    pub fn tick(
        &mut self,
        backend: &dyn GpuBackend,
        desired: Option<&DesiredState>,
        in_use: &BTreeSet<String>,
    ) -> bool {
        let Some(desired) = desired else {
            return false;
        };
        let control = self.board.control.clone();
        if !self.seeded {
            self.seeded = true;
            // Daemons an earlier agent started: known, so that they are stopped when
            // their GPU is no longer shared, and a dead one counts as a restart.
            if let (Some(c), Ok(devices)) = (&control, backend.devices()) {
                for d in devices {
                    if safe_name(&d.uuid) && c.dirs(&d.uuid).recorded_pid().is_some() {
                        self.tracks.entry(d.uuid).or_default().running = true;
                    }
                }
            }
        }
        let wanted: BTreeMap<&str, ShareMethod> = desired
            .gpus
            .iter()
            .filter_map(|d| d.sharing.map(|m| (d.gpu_uuid.as_str(), m)))
            .collect();
        let mut shares = BTreeMap::new();
        for (&gpu, &method) in &wanted {
            let restarts = self.tracks.get(gpu).map_or(0, |t| t.restarts);
            let share = if !safe_name(gpu) {
                GpuShare::not_ready(method, 0, format!("`{gpu}` is not a GPU UUID"))
            } else {
                match (method, mig_off(backend, gpu)) {
                    (_, Err(why)) => GpuShare::not_ready(method, restarts, why),
                    (ShareMethod::TimeSlice, Ok(())) => GpuShare {
                        method,
                        ready: true,
                        error: None,
                        daemon_restarts: restarts,
                        mps: None,
                    },
                    (ShareMethod::Mps, Ok(())) => match (&control, exclusive(backend, gpu)) {
                        (None, _) => {
                            GpuShare::not_ready(method, restarts, "this agent runs no MPS daemons")
                        }
                        (Some(_), Err(why)) => GpuShare::not_ready(method, restarts, why),
                        (Some(c), Ok(())) => self.supervise(c.as_ref(), gpu),
                    },
                }
            };
            shares.insert(gpu.to_owned(), share);
        }
        // Daemons of GPUs no longer shared with MPS: stopped once nothing uses the GPU.
        if let Some(c) = &control {
            let idle: Vec<String> = self
                .tracks
                .keys()
                .filter(|g| wanted.get(g.as_str()) != Some(&ShareMethod::Mps))
                .filter(|g| !in_use.contains(*g))
                .cloned()
                .collect();
            for gpu in idle {
                if self.tracks.get(&gpu).is_some_and(|t| t.running) {
                    match c.quit(&gpu) {
                        Ok(()) => tracing::info!(gpu, "MPS control daemon stopped"),
                        Err(e) => tracing::debug!(gpu, error = e, "no MPS control daemon to stop"),
                    }
                }
                // Contexts of any process again (a GPU now whole or time-sliced).
                if backend.compute_mode(&gpu).ok() == Some(ComputeMode::ExclusiveProcess)
                    && let Err(e) = backend.set_compute_mode(&gpu, ComputeMode::Default)
                {
                    tracing::warn!(gpu, error = %e, "cannot set the compute mode back to DEFAULT");
                }
                self.tracks.remove(&gpu);
            }
        }
        self.board.publish(shares)
    }

    /// Makes sure `gpu`'s daemon answers: starts it, counting a restart when it had died.
    fn supervise(&mut self, c: &dyn MpsControl, gpu: &str) -> GpuShare {
        let dirs = c.dirs(gpu);
        let t = self.tracks.entry(gpu.to_owned()).or_default();
        let now = Instant::now();
        let ready = |t: &Track| GpuShare {
            method: ShareMethod::Mps,
            ready: true,
            error: t.last_failure.clone(),
            daemon_restarts: t.restarts,
            mps: Some(dirs.clone()),
        };
        let why = match c.check(gpu) {
            Ok(()) => {
                t.running = true;
                t.alive_at = Some(now);
                return ready(t);
            }
            Err(why) => why,
        };
        // A daemon that quit removes its pid file; one that was killed leaves it.
        if !t.restart_due && (t.running || dirs.recorded_pid().is_some()) {
            tracing::warn!(gpu, error = why, "the MPS control daemon died");
            t.restart_due = true;
            t.last_failure = Some(format!("the MPS control daemon died ({why})"));
            self.board.record_death(
                gpu,
                Death {
                    alive_until: t.alive_at,
                    detected: now,
                },
            );
        }
        t.running = false;
        match c.start(gpu).and_then(|()| c.check(gpu)) {
            Ok(()) => {
                t.running = true;
                t.alive_at = Some(Instant::now());
                if t.restart_due {
                    t.restart_due = false;
                    t.restarts += 1;
                    let cause = t.last_failure.take().unwrap_or_default();
                    t.last_failure = Some(format!(
                        "{cause} and was restarted ({} restart(s) so far); its clients' CUDA \
                         contexts were lost",
                        t.restarts
                    ));
                    tracing::info!(gpu, restarts = t.restarts, "MPS control daemon restarted");
                } else {
                    tracing::info!(gpu, "MPS control daemon started");
                }
                ready(t)
            }
            Err(e) => {
                let why = match (&t.last_failure, t.restart_due) {
                    (Some(cause), true) => format!("{cause} and could not be restarted: {e}"),
                    _ => format!("cannot start the MPS control daemon: {e}"),
                };
                tracing::warn!(gpu, error = why, "MPS control daemon not running");
                GpuShare::not_ready(ShareMethod::Mps, t.restarts, why)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The stand-in control program (`tessera-agent sim-mps-control`).

/// `tessera-agent sim-mps-control [-d | -f]`: the simulator's `nvidia-cuda-mps-control`
/// (see the module docs). `-d`: start the daemon in the background; `-f`: run it in the
/// foreground; no option: send each line of standard input to the daemon. Reads
/// `CUDA_MPS_PIPE_DIRECTORY` (default `/tmp/nvidia-mps`) and `CUDA_MPS_LOG_DIRECTORY`
/// (default `/var/log/nvidia-mps`). Returns the exit status.
pub fn sim_control_main(args: &[OsString]) -> i32 {
    let dir = |var: &str, default: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from(default), PathBuf::from)
    };
    let pipe = dir("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps");
    let log = dir("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps");
    match args.first().and_then(|a| a.to_str()) {
        Some("-d") => sim_background(&pipe),
        Some("-f") => sim_daemon(&pipe, &log),
        None => sim_client(&pipe),
        Some(other) => {
            say_err(&format!(
                "{SIM_SUBCOMMAND}: unknown option {other} (usage: [-d | -f])"
            ));
            1
        }
    }
}

fn say(s: &str) {
    let _ = writeln!(io::stdout(), "{s}");
}

fn say_err(s: &str) {
    let _ = writeln!(io::stderr(), "{s}");
}

/// `-d`: starts `-f` detached and returns once it runs (its pid in the pid file) or with
/// its status when it refused (it said why on the shared stdout).
fn sim_background(pipe: &Path) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            say_err(&format!("cannot find my own program: {e}"));
            return 1;
        }
    };
    let mut child = match Command::new(exe)
        .arg(SIM_SUBCOMMAND)
        .arg("-f")
        .stdin(Stdio::null())
        .current_dir("/")
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            say_err(&format!("cannot start the daemon: {e}"));
            return 1;
        }
    };
    let pid = child.id();
    let deadline = Instant::now() + CONTROL_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return st.code().unwrap_or(1),
            Ok(None) => {}
            Err(e) => {
                say_err(&format!("cannot watch the daemon: {e}"));
                return 1;
            }
        }
        if read_pid(pipe) == Some(pid) {
            return 0;
        }
        if Instant::now() >= deadline {
            say_err("the daemon did not come up");
            return 1;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Appends one line to `control.log` in the daemon's format.
fn log_line(log: &mut Option<File>, text: &str) {
    if let Some(f) = log {
        let at = chrono::Local::now().format("%Y-%m-%d %H:%M:%S%.3f");
        let _ = writeln!(f, "[{at} Control {:>5}] {text}", std::process::id());
    }
}

/// `-f`: the daemon itself.
fn sim_daemon(pipe: &Path, log_dir: &Path) -> i32 {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        say_err(&format!("{what}: {e}"));
        1
    };
    for d in [pipe, log_dir] {
        if let Err(e) = fs::create_dir_all(d) {
            return fail(&format!("cannot create {}", d.display()), &e);
        }
    }
    let lock_path = pipe.join(CONTROL_LOCK);
    let lock = match OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
    {
        Ok(f) => f,
        Err(e) => return fail(&format!("cannot open {}", lock_path.display()), &e),
    };
    match lock.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            say(ALREADY_RUNNING);
            return 1;
        }
        Err(fs::TryLockError::Error(e)) => {
            return fail(&format!("cannot lock {}", lock_path.display()), &e);
        }
    }
    let _ = fs::set_permissions(&lock_path, fs::Permissions::from_mode(0o666));
    let socket = pipe.join(CONTROL_SOCKET);
    // A socket left by a killed daemon.
    let _ = fs::remove_file(&socket);
    let listener = match UnixListener::bind(&socket) {
        Ok(l) => l,
        Err(e) => return fail(&format!("cannot listen on {}", socket.display()), &e),
    };
    let _ = fs::set_permissions(&socket, fs::Permissions::from_mode(0o666));
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_dir.join(CONTROL_LOG))
        .ok();
    log_line(
        &mut log,
        &format!("Starting control daemon using socket {}", socket.display()),
    );
    log_line(
        &mut log,
        &format!(
            "To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={}",
            pipe.display()
        ),
    );
    log_line(
        &mut log,
        &format!(
            "CUDA MPS Control binary version: simulated (tessera-agent {})",
            env!("CARGO_PKG_VERSION")
        ),
    );
    // Written last: `-d` returns once it names this process.
    let pid_path = pipe.join(PID_FILE);
    let tmp = pipe.join(format!("{PID_FILE}.tmp"));
    if let Err(e) = fs::write(&tmp, std::process::id().to_string())
        .and_then(|()| fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644)))
        .and_then(|()| fs::rename(&tmp, &pid_path))
    {
        return fail(&format!("cannot write {}", pid_path.display()), &e);
    }
    let gpu = std::env::var("CUDA_VISIBLE_DEVICES")
        .ok()
        .filter(|g| safe_name(g));
    let driver = std::env::var_os(SIM_DRIVER_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    let mut defaults = SimDefaults::on(gpu.as_deref(), driver.as_deref());
    // Polled, to notice the socket going away (see the module docs).
    if let Err(e) = listener.set_nonblocking(true) {
        return fail("cannot poll the control socket", &e);
    }
    loop {
        let mut conn = match listener.accept() {
            Ok((conn, _)) => conn,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !socket.exists() {
                    let _ = fs::remove_file(&pid_path);
                    return 0;
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(_) => continue,
        };
        let _ = conn.set_nonblocking(false);
        log_line(&mut log, "Accepting connection...");
        let _ = conn.set_read_timeout(Some(CONTROL_TIMEOUT));
        let mut request = String::new();
        if (&mut conn).take(4096).read_to_string(&mut request).is_err() {
            continue;
        }
        let command = request.trim();
        let (answer, quit) = defaults.answer(command);
        if !command.is_empty() {
            log_line(&mut log, &format!("Cmd: {command}"));
        }
        let _ = conn.write_all(answer.as_bytes());
        drop(conn);
        if quit {
            log_line(&mut log, "Exit");
            let _ = fs::remove_file(&pid_path);
            return 0;
        }
    }
}

/// One of the stand-in's MPS servers (no process of its own: an entry in the daemon).
#[derive(Debug, Clone)]
struct SimServer {
    uid: u32,
    active_thread_percentage: f64,
    pinned_mem_limits: BTreeMap<String, String>,
}

/// The stand-in daemon's state: its defaults, which apply to servers started from then
/// on, and its servers, one per uid, with their own limits. What a client gets is its
/// server's limits, whatever its environment says (the environment can only lower them).
#[derive(Debug)]
struct SimDefaults {
    active_thread_percentage: f64,
    pinned_mem_limits: BTreeMap<String, String>,
    servers: BTreeMap<u32, SimServer>,
    next_pid: u32,
    /// `<driver>/<gpu>/context.lock`, when the simulated driver's folder is known: the
    /// servers' context on the GPU, held (exclusively) while any server runs.
    gpu_lock_path: Option<PathBuf>,
    gpu_lock: Option<File>,
}

impl Default for SimDefaults {
    fn default() -> Self {
        SimDefaults {
            active_thread_percentage: 100.0,
            pinned_mem_limits: BTreeMap::new(),
            servers: BTreeMap::new(),
            next_pid: std::process::id().saturating_mul(8).max(100_000),
            gpu_lock_path: None,
            gpu_lock: None,
        }
    }
}

/// A context lock on a simulated GPU: `Ok(None)` when the GPU takes any number of
/// contexts (not EXCLUSIVE_PROCESS), `Ok(Some(lock))` held while the context lives,
/// `Err` when another process holds the GPU (the CUDA runtime's
/// `cudaErrorDevicesUnavailable`).
fn sim_context_lock(driver: &Path, gpu: &str) -> Result<Option<File>, String> {
    let dir = driver.join(gpu);
    let mode = fs::read_to_string(dir.join("compute_mode"))
        .ok()
        .and_then(|m| ComputeMode::parse(&m))
        .unwrap_or(ComputeMode::Default);
    match mode {
        ComputeMode::Default => Ok(None),
        ComputeMode::Prohibited => Err(DEVICES_UNAVAILABLE.to_owned()),
        ComputeMode::ExclusiveProcess => {
            let lock = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join("context.lock"))
                .map_err(|e| format!("cannot open the simulated GPU: {e}"))?;
            match lock.try_lock() {
                Ok(()) => Ok(Some(lock)),
                Err(fs::TryLockError::WouldBlock) => Err(DEVICES_UNAVAILABLE.to_owned()),
                Err(fs::TryLockError::Error(e)) => {
                    Err(format!("cannot lock the simulated GPU: {e}"))
                }
            }
        }
    }
}

impl SimDefaults {
    /// A daemon of `gpu` whose servers hold its context in the simulated driver's
    /// folder `driver`.
    fn on(gpu: Option<&str>, driver: Option<&Path>) -> SimDefaults {
        SimDefaults {
            gpu_lock_path: gpu.zip(driver).map(|(g, d)| d.join(g)),
            ..SimDefaults::default()
        }
    }

    /// The server of `uid`, started when none runs: its pid, or why it cannot start.
    fn server_for(&mut self, uid: u32) -> Result<u32, String> {
        if let Some((pid, _)) = self.servers.iter().find(|(_, s)| s.uid == uid) {
            return Ok(*pid);
        }
        if self.gpu_lock.is_none()
            && let Some(dir) = &self.gpu_lock_path
            && let (Some(driver), Some(gpu)) = (dir.parent(), dir.file_name())
        {
            self.gpu_lock = sim_context_lock(driver, &gpu.to_string_lossy())?;
        }
        let pid = self.next_pid;
        self.next_pid += 1;
        self.servers.insert(
            pid,
            SimServer {
                uid,
                active_thread_percentage: self.active_thread_percentage,
                pinned_mem_limits: self.pinned_mem_limits.clone(),
            },
        );
        Ok(pid)
    }

    /// The answer to one command, and whether the daemon quits.
    fn answer(&mut self, command: &str) -> (String, bool) {
        let words: Vec<&str> = command.split_whitespace().collect();
        let pct = |p: &str| p.parse::<f64>().ok().filter(|p| (0.0..=100.0).contains(p));
        let no_server = |pid: &str| (format!("Server {pid} not found\n"), false);
        match words.as_slice() {
            [] => (String::new(), false),
            ["get_server_list"] => (
                self.servers.keys().map(|p| format!("{p}\n")).collect(),
                false,
            ),
            ["quit"] => (String::new(), true),
            ["start_server", "-uid", uid] => match uid.parse::<u32>() {
                Ok(uid) => match self.server_for(uid) {
                    Ok(_) => (String::new(), false),
                    Err(e) => (format!("{e}\n"), false),
                },
                Err(_) => (format!("Invalid user id {uid}\n"), false),
            },
            ["get_default_active_thread_percentage"] => {
                (format!("{:.1}\n", self.active_thread_percentage), false)
            }
            ["set_default_active_thread_percentage", p] => match pct(p) {
                Some(p) => {
                    self.active_thread_percentage = p;
                    (String::new(), false)
                }
                None => (format!("Invalid percentage {p}\n"), false),
            },
            ["get_active_thread_percentage", pid] => {
                match pid.parse().ok().and_then(|p: u32| self.servers.get(&p)) {
                    Some(s) => (format!("{:.1}\n", s.active_thread_percentage), false),
                    None => no_server(pid),
                }
            }
            ["set_active_thread_percentage", pid, p] => {
                match (
                    pid.parse().ok().and_then(|q: u32| self.servers.get_mut(&q)),
                    pct(p),
                ) {
                    (None, _) => no_server(pid),
                    (Some(_), None) => (format!("Invalid percentage {p}\n"), false),
                    (Some(s), Some(p)) => {
                        s.active_thread_percentage = p;
                        (String::new(), false)
                    }
                }
            }
            ["get_default_device_pinned_mem_limit", dev] => (
                format!(
                    "{}\n",
                    self.pinned_mem_limits.get(*dev).map_or("0", String::as_str)
                ),
                false,
            ),
            ["set_default_device_pinned_mem_limit", dev, value] => {
                self.pinned_mem_limits
                    .insert((*dev).to_owned(), (*value).to_owned());
                (String::new(), false)
            }
            ["get_device_pinned_mem_limit", pid, dev] => {
                match pid.parse().ok().and_then(|p: u32| self.servers.get(&p)) {
                    Some(s) => (
                        format!(
                            "{}\n",
                            s.pinned_mem_limits.get(*dev).map_or("0", String::as_str)
                        ),
                        false,
                    ),
                    None => no_server(pid),
                }
            }
            ["set_device_pinned_mem_limit", pid, dev, value] => {
                match pid.parse().ok().and_then(|p: u32| self.servers.get_mut(&p)) {
                    Some(s) => {
                        s.pinned_mem_limits
                            .insert((*dev).to_owned(), (*value).to_owned());
                        (String::new(), false)
                    }
                    None => no_server(pid),
                }
            }
            // The stand-in's own: a CUDA client of `uid` connecting (what the driver does
            // inside cuInit); the daemon starts its uid's server as the real one does.
            // Answer: `<server pid> <active thread percentage> <pinned limit of device 0>`.
            ["sim_client", uid] => match uid.parse::<u32>() {
                Ok(uid) => match self.server_for(uid) {
                    Ok(pid) => {
                        let s = &self.servers[&pid];
                        (
                            format!(
                                "{pid} {:.1} {}\n",
                                s.active_thread_percentage,
                                s.pinned_mem_limits.get("0").map_or("0", String::as_str)
                            ),
                            false,
                        )
                    }
                    Err(e) => (format!("error: {e}\n"), false),
                },
                Err(_) => (format!("error: invalid user id {uid}\n"), false),
            },
            _ => (
                format!("The simulated MPS control daemon does not support `{command}`\n"),
                false,
            ),
        }
    }
}

/// `tessera-agent sim-cuda-context <driver folder>`: the simulator's stand-in for a CUDA
/// program creating a context on its first visible GPU (`CUDA_VISIBLE_DEVICES`), as the
/// driver does it: with a control daemon on `CUDA_MPS_PIPE_DIRECTORY` (default
/// `/tmp/nvidia-mps`), an MPS client of its uid's server, with that server's limits
/// (lowered, never raised, by `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and
/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`); without one, a plain context, which a GPU in
/// EXCLUSIVE_PROCESS mode refuses while another process (the MPS server) holds it.
/// Prints `context: mps server=<pid> active_thread_percentage=<p>
/// pinned_mem_limit_mib=<m>` or `context: direct active_thread_percentage=100
/// pinned_mem_limit_mib=none` and exits 0, or prints `cudaErrorDevicesUnavailable: all
/// CUDA-capable devices are busy or unavailable` (or another failure) and exits 1.
pub fn sim_context_main(args: &[OsString]) -> i32 {
    let Some(driver) = args.first().map(PathBuf::from) else {
        say_err(&format!("usage: {SIM_CONTEXT_SUBCOMMAND} <driver folder>"));
        return 2;
    };
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let Some(gpu) = env("CUDA_VISIBLE_DEVICES").and_then(|v| {
        v.split(',')
            .next()
            .map(str::to_owned)
            .filter(|g| safe_name(g))
    }) else {
        say("cudaErrorNoDevice: no CUDA-capable device is detected");
        return 1;
    };
    let pipe = env("CUDA_MPS_PIPE_DIRECTORY").unwrap_or_else(|| "/tmp/nvidia-mps".into());
    let uid = own_uid();
    if let Ok(mut conn) = UnixStream::connect(Path::new(&pipe).join(CONTROL_SOCKET)) {
        let _ = conn.set_read_timeout(Some(CONTROL_TIMEOUT));
        let mut answer = String::new();
        let asked = conn
            .write_all(format!("sim_client {uid}").as_bytes())
            .and_then(|()| conn.shutdown(std::net::Shutdown::Write))
            .and_then(|()| conn.read_to_string(&mut answer));
        let words: Vec<&str> = answer.split_whitespace().collect();
        let (pid, server_pct, server_mem) = match (asked, words.as_slice()) {
            (Ok(_), [pid, pct, mem]) if !pid.starts_with("error") => (
                (*pid).to_owned(),
                pct.parse::<f64>().unwrap_or(100.0),
                parse_mib(mem).filter(|m| *m > 0),
            ),
            (Ok(_), _) => {
                say(&format!(
                    "cudaErrorMpsConnectionFailed: {}",
                    answer.trim().trim_start_matches("error: ")
                ));
                return 1;
            }
            (Err(e), _) => {
                say(&format!("cudaErrorMpsConnectionFailed: {e}"));
                return 1;
            }
        };
        // The client's own variables only lower what its server allows.
        let pct = env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
            .and_then(|p| p.parse::<f64>().ok())
            .map_or(server_pct, |p| p.min(server_pct));
        let mem = env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
            .and_then(|v| {
                v.split(',')
                    .find_map(|d| d.strip_prefix("0=").and_then(parse_mib))
            })
            .map_or(server_mem, |m| Some(server_mem.map_or(m, |s| s.min(m))));
        say(&format!(
            "context: mps server={pid} active_thread_percentage={pct:.1} \
             pinned_mem_limit_mib={}",
            mem.map_or("none".to_owned(), |m| m.to_string())
        ));
        return 0;
    }
    match sim_context_lock(&driver, &gpu) {
        Ok(_held) => {
            say("context: direct active_thread_percentage=100.0 pinned_mem_limit_mib=none");
            0
        }
        Err(e) if e == DEVICES_UNAVAILABLE => {
            say(&format!("cudaErrorDevicesUnavailable: {e}"));
            1
        }
        Err(e) => {
            say(&e);
            1
        }
    }
}

/// No option: each line of stdin to the daemon, its answers to stdout.
fn sim_client(pipe: &Path) -> i32 {
    let mut input = String::new();
    if let Err(e) = io::stdin().read_to_string(&mut input) {
        say_err(&format!("cannot read the commands: {e}"));
        return 1;
    }
    for command in input.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let Ok(mut conn) = UnixStream::connect(pipe.join(CONTROL_SOCKET)) else {
            say(NO_DAEMON);
            return 1;
        };
        let _ = conn.set_read_timeout(Some(CONTROL_TIMEOUT));
        let mut answer = String::new();
        let sent = conn
            .write_all(command.as_bytes())
            .and_then(|()| conn.shutdown(std::net::Shutdown::Write))
            .and_then(|()| conn.read_to_string(&mut answer));
        if sent.is_err() {
            say(NO_DAEMON);
            return 1;
        }
        let _ = io::stdout().write_all(answer.as_bytes());
    }
    0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn dirs_are_per_gpu() {
        let d = MpsDirs::under(Path::new("/state/mps"), "GPU-1");
        assert_eq!(d.pipe, Path::new("/state/mps/GPU-1/pipe"));
        assert_eq!(d.log, Path::new("/state/mps/GPU-1/log"));
        assert!(checked_gpu("../etc").is_err());
        assert!(checked_gpu("GPU-0a1b").is_ok());
    }

    #[test]
    fn the_stand_in_answers_like_the_control_program() {
        let mut d = SimDefaults::default();
        assert_eq!(d.answer("get_server_list"), (String::new(), false));
        assert_eq!(
            d.answer("get_default_active_thread_percentage").0,
            "100.0\n"
        );
        d.answer("set_default_active_thread_percentage 25");
        assert_eq!(d.answer("get_default_active_thread_percentage").0, "25.0\n");
        d.answer("set_default_device_pinned_mem_limit 0 2048M");
        assert_eq!(
            d.answer("get_default_device_pinned_mem_limit 0").0,
            "2048M\n"
        );
        // Servers: one per uid, with the defaults of when they started, then their own.
        assert_eq!(d.answer("start_server -uid 1000").0, "");
        let list = d.answer("get_server_list").0;
        let pid: u32 = list.trim().parse().unwrap();
        assert_eq!(d.answer("start_server -uid 1000").0, "");
        assert_eq!(d.answer("get_server_list").0, list, "one per uid");
        assert_eq!(
            d.answer(&format!("get_active_thread_percentage {pid}")).0,
            "25.0\n"
        );
        assert_eq!(
            d.answer(&format!("set_active_thread_percentage {pid} 10"))
                .0,
            ""
        );
        assert_eq!(
            d.answer(&format!("set_device_pinned_mem_limit {pid} 0 512M"))
                .0,
            ""
        );
        assert_eq!(d.answer("sim_client 1000").0, format!("{pid} 10.0 512M\n"));
        assert_eq!(d.answer("get_default_active_thread_percentage").0, "25.0\n");
        assert!(
            d.answer("set_active_thread_percentage 1 10")
                .0
                .contains("not found")
        );
        assert!(
            d.answer(&format!("set_active_thread_percentage {pid} 300"))
                .0
                .contains("Invalid")
        );
        d.answer("start_server -uid 1001");
        assert_eq!(d.answer("get_server_list").0.lines().count(), 2);
        assert_eq!(d.answer("quit"), (String::new(), true));
        assert!(d.answer("get_client_list 1").0.contains("does not support"));
    }

    #[test]
    fn memory_sizes_read_as_the_daemon_writes_them() {
        assert_eq!(parse_mib("20480M"), Some(20480));
        assert_eq!(parse_mib("2G"), Some(2048));
        assert_eq!(parse_mib("1048576"), Some(1));
        assert_eq!(parse_mib("0"), Some(0));
        assert_eq!(parse_mib("lots"), None);
    }

    #[test]
    fn deaths_count_for_workloads_that_ran_through_them() {
        let board = ShareBoard::default();
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let t2 = t0 + Duration::from_secs(2);
        let t3 = t0 + Duration::from_secs(3);
        board.record_death(
            "GPU-a",
            Death {
                alive_until: Some(t1),
                detected: t2,
            },
        );
        // Running since before it died.
        assert!(board.died_during("GPU-a", t0, None));
        // Ended after its last answer: may have seen it die.
        assert!(board.died_during("GPU-a", t0, Some(t2)));
        // Ended before it could have died.
        assert!(!board.died_during("GPU-a", t0, Some(t0)));
        // Started after the death was handled.
        assert!(!board.died_during("GPU-a", t3, None));
        assert!(!board.died_during("GPU-b", t0, None));
    }
}
