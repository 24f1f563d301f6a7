//! The local process executor: runs the server's workloads (Jupyter notebooks and
//! training jobs) as plain processes on this node, and reports how they stand.
//!
//! Each round the agent calls [`LocalExecutor::reports`] (poll every process, probe
//! notebooks, read new log output), sends the reports to the server, and hands the
//! answer (the complete desired set and the log positions the server holds) to
//! [`LocalExecutor::apply`], which starts, stops and forgets workloads.
//!
//! On disk, under the workload root:
//!
//! ```text
//! workspaces/<workspace>/      a team's files, shared by its workloads; never deleted here
//! runs/<id>/output.log         stdout and stderr of the process, appended; at most the
//!                              newest log cap of it on disk (see below)
//! runs/<id>/exit               the exit status, written by the wrapper when the program ends
//! runs/<id>/state.json         pid, process start time, port and spec (see `RunState`)
//! runs/<id>/stopped            present once the agent asked it to stop
//! runs/<id>/runtime/           JUPYTER_RUNTIME_DIR
//! ```
//!
//! Every program runs under a small `/bin/sh` wrapper ([`WRAPPER`]) in its own process
//! group, so that the exit status survives an agent restart (the wrapper writes it to
//! `exit`) and a stop reaches every process the workload started (the signal goes to
//! the group). After a restart the agent adopts what still runs: `state.json` names the
//! pid and its start time (field 22 of `/proc/<pid>/stat`, which guards against a
//! reused pid), and a process that ended meanwhile is reported with the status from
//! `exit`, or as lost when it left none. Nothing is ever silently orphaned.
//!
//! With a [`Sandbox`] (the default of `tessera-agent`), every workload runs in a
//! container of its own (see [`crate::sandbox`]): its team's uid, its own root, PID
//! namespace, cgroup limits and only its GPU's device nodes. The container's first
//! process is the same wrapper, writing to `runs/<id>/ctl/exit` (its `/run/tessera`);
//! `state.json`, the bundle and the log stay outside, readable by the agent alone.
//! Without one (an explicit, loudly logged choice for a one-person lab), processes run
//! as the agent's user with no limits and isolation between teams is only the devices
//! they are told about (`CUDA_VISIBLE_DEVICES`) and their workspace folder.
//!
//! A workload whose spec names an OCI image runs in it (sandbox only): its image is
//! pulled first, beside the loop, and held while it lives; see `workloads/image.rs`
//! (`runs/<id>/state.json` then also names the image's digest, never the registry login).
//!
//! A gang member (`spec.gang`, issue 42) starts in two steps: its sandbox and network
//! first, reporting its address, and its process once the server sends its peers; see
//! `workloads/gang.rs` (`runs/<id>/prepared.json` keeps a prepared member for adoption).
//!
//! A workload on a share of a shared GPU (`spec.share`) sees that GPU like a whole-GPU
//! workload, plus `TESSERA_GPU_SHARE_METHOD`, `TESSERA_GPU_SHARE_MILLI` and
//! `TESSERA_GPU_MEMORY_MIB`; with MPS it is a client of the GPU's daemon (see
//! [`crate::mps`]): `CUDA_MPS_PIPE_DIRECTORY`/`CUDA_MPS_LOG_DIRECTORY` of that daemon,
//! and in the sandbox that daemon's pipe directory (and no other) at the same path. Its
//! limits, ⌈milli / 10⌉ % of the SMs and `memory_mib` of pinned device memory, are set by
//! the agent through the daemon on the MPS server of the workload's uid (one per GPU and
//! team uid, [`crate::mps::mps_server`]) before it starts, so unsetting its variables
//! gains it nothing; `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and
//! `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`0=<memory_mib>M`) are still set, and can only
//! lower them. It does not start while the daemon does not answer, nor when the limits
//! cannot be set (or the team's server already serves shares with other limits), and is
//! told when the daemon died while it ran.
//!
//! A workload writes its output straight to `output.log` (so it outlives the agent), and
//! could fill the node's disk with it. Each round, before reading, the agent keeps only
//! the newest [`LocalExecutor::with_log_cap`] bytes of each log on disk: it punches the
//! older whole blocks out of the file (`fallocate(PUNCH_HOLE)`), which keeps the file's
//! size and offsets, so the workload's appends go on and offsets stay those the server
//! acknowledges. Output dropped before the server had it is replaced, in the log the
//! server receives, by a line saying how many bytes were dropped ([`dropped_marker`]).
//! Between two rounds a log can outgrow the cap by what the workload writes meanwhile.

use std::collections::{BTreeMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tessera_domain::drain::Deadline;
use tessera_domain::wire::{
    LogPiece, ShareLimits, ShareMethod, WorkloadPhase, WorkloadReport, WorkloadSpec, WorkloadSync,
};
use tessera_domain::workload::WorkloadKind;
use tokio::task::JoinSet;

use crate::mps::{MpsDirs, ServerLimits, ShareBoard, own_uid};
use crate::network::{self, Slot};
use crate::notebook_env::NotebookEnv;
use crate::oci::{Image, ImageStore};
use crate::sandbox::{
    Access, CONTROL_MOUNT, Container, Extras, Process, Sandbox, WORKSPACE_MOUNT, image_argv,
    image_env, read_untrusted,
};

mod gang;
mod image;
pub use gang::{HOSTFILE_VAR, RSH_PORT_VAR, RSH_PROGRAM, SECRET_VAR};
use gang::{Launch, Prepared};
use image::Pull;

/// At most this much log output per workload per report.
pub const LOG_CHUNK: u64 = 256 * 1024;
/// What a workload's log may hold on the node's disk by default.
pub const LOG_CAP: u64 = 16 * 1024 * 1024;
/// How long a stopped workload's processes get between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// A notebook that does not answer its status probe within this is still starting.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Runs `"$@"` and writes its exit status to the file named by `$1`. `printf` and the
/// redirection are shell built-ins, so the write works whatever `PATH` the workload
/// sets. The agent reads the file only once the wrapper has exited, so it is complete.
/// A wrapper killed by a signal (a stop) writes nothing.
pub const WRAPPER: &str = r#"f=$1; shift; "$@"; c=$?; printf %s "$c" > "$f"; exit $c"#;

/// The message of a workload on an MPS share whose GPU's daemon died while it ran.
pub const MPS_DAEMON_DIED: &str = "the GPU's MPS control daemon died while this workload ran \
     and was restarted: the workload's CUDA contexts on that GPU were lost";

/// Phrase for a workload that ended while no agent watched it and left no status.
const LOST_WHILE_DOWN: &str = "the process ended while the agent was down and left no exit status";

/// What `runs/<id>/state.json` holds, written right after the process starts.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RunState {
    /// The wrapper's pid, which is also its process group id.
    pid: u32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks since boot) at start.
    start_time: u64,
    port: Option<u16>,
    spec: WorkloadSpec,
    /// Set when it runs in a sandbox: how to signal, inspect and delete the container.
    #[serde(default)]
    container: Option<Container>,
    /// The manifest digest of the image it runs in (held again by an agent that adopts it).
    #[serde(default)]
    image_digest: Option<String>,
}

/// The process executor. See the module docs.
pub struct LocalExecutor {
    root: PathBuf,
    host: String,
    /// The environment workloads start from (filtered, see [`LocalExecutor::env_for`]).
    inherited: Vec<(OsString, OsString)>,
    http: reqwest::Client,
    workloads: BTreeMap<String, Workload>,
    sandbox: Option<Sandbox>,
    /// Where a notebook's program comes from (see [`crate::notebook_env`]).
    notebook_env: Option<NotebookEnv>,
    /// Shared GPUs: their MPS daemons (see [`crate::mps`]).
    shares: ShareBoard,
    /// Bytes of a workload's log kept on disk (the newest).
    log_cap: u64,
    /// Bytes a team's workspace may hold for a workload of that team to start.
    workspace_quota: Option<u64>,
    /// The node's image store, for workloads in an image (see [`image`]).
    images: Option<ImageStore>,
    /// When unused images were last collected.
    collected: Instant,
    /// The executable gang members get as `tessera-rsh` (this agent's own).
    rsh: Option<PathBuf>,
}

/// One workload the executor knows.
struct Workload {
    /// `<root>/runs/<id>`; `None` when the id is not a safe folder name.
    dir: Option<PathBuf>,
    /// The port chosen for it (notebooks), substituted for `{port}`.
    port: Option<u16>,
    /// Notebooks: how to ask it whether it is up.
    probe: Option<Probe>,
    status: Status,
    /// Log bytes the server holds (its last [`tessera_domain::wire::LogAck`]).
    acked: u64,
    /// Set once a stop was asked: when SIGKILL follows the SIGTERM.
    kill_at: Option<Instant>,
    /// Notebooks: answered its status probe once; stays `Running` from then on.
    ready: bool,
    last_activity_ms: Option<i64>,
    busy: bool,
    /// The container it runs in (sandboxed workloads).
    container: Option<Container>,
    /// Its own address, when it has a network of its own: probed there, and reported
    /// as its endpoint to a server on this node (else the node's address, which the
    /// node forwards to it).
    addr: Option<Ipv4Addr>,
    /// The GPUs (or MIG devices) it was given.
    devices: Vec<String>,
    /// Set when it is a client of a GPU's MPS daemon.
    mps: Option<MpsWatch>,
    /// The deadline it was last told (the deadline channel, docs/operations.md).
    deadline: Option<Deadline>,
    /// The image it runs in, held (never collected) while it lives.
    image: Option<Image>,
    /// The digest of that image, when adopted after a restart before the store was set.
    image_digest: Option<tessera_domain::image::Digest>,
    /// Gang members: the address its processes have (reported as `gang_addr`).
    gang_addr: Option<String>,
}

/// An MPS client, watched for its daemon dying under it.
#[derive(Debug, Clone)]
struct MpsWatch {
    gpu: String,
    /// Its team (workspace): the sandbox runs it as the team's uid, whose MPS server
    /// it is a client of.
    team: String,
    /// When this agent started (or adopted) it.
    since: Instant,
    /// When this agent found it gone.
    ended: Option<Instant>,
    /// Its daemon died while it ran.
    lost: bool,
}

#[derive(Debug, Clone)]
struct Probe {
    /// `http://<host>:<port><base_path>`, ending in `/`.
    base: String,
    token: Option<String>,
}

enum Status {
    /// Its image is being pulled; it starts once the image is there.
    Pulling(Box<Pull>),
    /// A gang member whose sandbox is ready; its process starts once its peers are known.
    Prepared(Box<Prepared>),
    /// Never ran (the message says why).
    FailedToStart(String),
    /// The wrapper runs, or processes of its group remain.
    Live(Live),
    /// Gone. `code` from the `exit` file (`None`: killed by a signal, or stopped).
    Exited {
        code: Option<i32>,
        message: Option<String>,
    },
    Lost(String),
}

struct Live {
    pid: u32,
    start_time: u64,
    /// The process, when this agent started it; `None` when adopted after a restart
    /// (then `/proc` tells whether it still runs).
    child: Option<Child>,
    /// Set once the wrapper has exited: its status code when this agent reaped it.
    wrapper_exited: Option<Option<i32>>,
}

impl LocalExecutor {
    /// Opens the workload root (creating it) and adopts the runs it finds there.
    /// `host` is the address notebooks are reached at (probes and reported endpoints).
    pub fn open(root: &Path, host: &str) -> io::Result<LocalExecutor> {
        fs::create_dir_all(root.join("runs"))?;
        fs::create_dir_all(root.join("workspaces"))?;
        // Absolute, so that TESSERA_WORKSPACE means the same in any working directory.
        let root = root.canonicalize()?;
        let http = reqwest::Client::builder()
            .timeout(PROBE_TIMEOUT)
            .no_proxy()
            .build()
            .map_err(io::Error::other)?;
        let mut ex = LocalExecutor {
            root,
            host: host.to_owned(),
            inherited: std::env::vars_os().collect(),
            http,
            workloads: BTreeMap::new(),
            sandbox: None,
            notebook_env: None,
            shares: ShareBoard::default(),
            log_cap: LOG_CAP,
            workspace_quota: None,
            images: None,
            collected: Instant::now(),
            rsh: std::env::current_exe().and_then(|p| p.canonicalize()).ok(),
        };
        for dir in [ex.root.clone(), ex.root.join("runs")] {
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
        }
        fs::set_permissions(
            ex.root.join("workspaces"),
            fs::Permissions::from_mode(0o711),
        )?;
        let mut names: Vec<String> = fs::read_dir(ex.root.join("runs"))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| safe_name(n))
            .collect();
        names.sort();
        for id in names {
            let w = ex.adopt(&id);
            ex.workloads.insert(id, w);
        }
        Ok(ex)
    }

    /// Replaces the environment workloads start from (default: the agent's own, read
    /// by [`LocalExecutor::open`]). The same variables are dropped from it either way.
    pub fn with_inherited_env(
        mut self,
        vars: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Self {
        self.inherited = vars.into_iter().collect();
        self
    }

    /// Refuses to start a workload while its team's workspace holds `bytes` or more
    /// (counted in allocated blocks when the workload starts, not while it runs).
    pub fn with_workspace_quota(mut self, bytes: Option<u64>) -> Self {
        self.workspace_quota = bytes;
        self
    }

    /// Keeps at most the newest `bytes` of each workload's log on disk (default
    /// [`LOG_CAP`]; at least a few blocks).
    pub fn with_log_cap(mut self, bytes: u64) -> Self {
        self.log_cap = bytes.max(16 * 1024);
        self
    }

    /// Runs every workload started from now on in `sandbox`.
    pub fn with_sandbox(mut self, sandbox: Sandbox) -> Self {
        self.sandbox = Some(sandbox);
        self
    }

    /// Takes a notebook's program (`jupyter`) from `env`'s `bin/` when it is there (see
    /// [`crate::notebook_env`]). A sandbox must also mount
    /// [`NotebookEnv::read_only_paths`] (`tessera-agent` adds them to its settings).
    pub fn with_notebook_env(mut self, env: NotebookEnv) -> Self {
        self.notebook_env = Some(env);
        self
    }

    /// Takes the state of shared GPUs (and their MPS daemons) from `shares`; without
    /// it, workloads on an MPS share fail to start.
    pub fn with_shares(mut self, shares: ShareBoard) -> Self {
        self.shares = shares;
        self
    }

    /// The GPUs that workloads still running use (whole GPUs, and the GPU of a share).
    pub fn gpus_in_use(&self) -> std::collections::BTreeSet<String> {
        self.workloads
            .values()
            .filter(|w| w.is_live() || matches!(w.status, Status::Prepared(_)))
            .flat_map(|w| {
                w.devices
                    .iter()
                    .cloned()
                    .chain(w.mps.as_ref().map(|m| m.gpu.clone()))
            })
            .collect()
    }

    pub fn sandboxed(&self) -> bool {
        self.sandbox.is_some()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Ids of the workloads known, sorted.
    pub fn ids(&self) -> Vec<String> {
        self.workloads.keys().cloned().collect()
    }

    /// The pid of a workload's wrapper, which is also its process group id, while
    /// it runs.
    pub fn pid(&self, id: &str) -> Option<u32> {
        match &self.workloads.get(id)?.status {
            Status::Live(l) => Some(l.pid),
            _ => None,
        }
    }

    /// A live workload's own address, when it has a network of its own.
    pub fn address(&self, id: &str) -> Option<Ipv4Addr> {
        self.workloads.get(id).filter(|w| w.is_live())?.addr
    }

    /// Whether any workload still has processes.
    /// Where a `tessera exec` session for workload `id` runs (see [`crate::exec`]); why
    /// not, when it does not run here.
    pub fn exec_target(&self, id: &str) -> Result<crate::exec::Target, String> {
        let w = self
            .workloads
            .get(id)
            .ok_or("the workload does not run on this node")?;
        let Status::Live(live) = &w.status else {
            return Err("the workload is not running on this node".into());
        };
        match (&w.container, &w.dir) {
            (Some(c), Some(dir)) => {
                let (runtime, root, cid) = c.exec_parts();
                Ok(crate::exec::Target::Container {
                    runtime: runtime.to_owned(),
                    root: root.to_owned(),
                    id: cid.to_owned(),
                    bundle: dir.join("bundle"),
                })
            }
            (Some(_), None) => Err("the workload has no run folder".into()),
            (None, _) => Ok(crate::exec::Target::Process { pid: live.pid }),
        }
    }

    pub fn any_running(&self) -> bool {
        self.workloads.values().any(Workload::is_live)
    }

    /// Polls every process, probes the notebooks and reads new log output: one report
    /// per known workload, sorted by id.
    pub async fn reports(&mut self) -> Vec<WorkloadReport> {
        self.finish_pulls().await;
        self.poll();
        self.release_images();
        self.probe_notebooks().await;
        let now = Instant::now();
        for w in self.workloads.values_mut() {
            let live = w.is_live();
            if let Some(m) = &mut w.mps {
                if !live && m.ended.is_none() {
                    m.ended = Some(now);
                }
                if !m.lost && self.shares.died_during(&m.gpu, m.since, m.ended) {
                    tracing::warn!(gpu = m.gpu, "an MPS client's daemon died while it ran");
                    m.lost = true;
                }
            }
        }
        self.workloads
            .iter()
            .map(|(id, w)| {
                let mut r = w.report(id, &self.host, self.log_cap);
                let told = matches!(
                    r.phase,
                    WorkloadPhase::Starting | WorkloadPhase::Running | WorkloadPhase::Exited
                );
                if told && r.message.is_none() && w.mps.as_ref().is_some_and(|m| m.lost) {
                    r.message = Some(MPS_DAEMON_DIED.to_owned());
                }
                if let Status::Pulling(p) = &w.status {
                    r.pull = Some(p.progress(self.images.as_ref()));
                }
                r
            })
            .collect()
    }

    /// Applies the server's answer: log positions first, then starts the workloads
    /// listed with `run: true` that are not known yet, stops those listed with
    /// `run: false` or not listed, and forgets (deletes the run folder of) those not
    /// listed that no longer run.
    /// Returns how many workloads it started.
    pub fn apply(&mut self, sync: &WorkloadSync) -> usize {
        let mut started = 0;
        for ack in &sync.log_acks {
            if let Some(w) = self.workloads.get_mut(&ack.id) {
                w.acked = ack.stored_through;
            }
        }
        let now = Instant::now();
        let mut listed = HashSet::new();
        for spec in &sync.workloads {
            listed.insert(spec.id.as_str());
            match self.workloads.get_mut(&spec.id) {
                Some(w) if !spec.run => w.request_stop(now + STOP_GRACE),
                Some(w)
                    if matches!(w.status, Status::Prepared(_))
                        && spec.gang.as_ref().is_some_and(|g| g.peers.is_some()) =>
                {
                    let Some(w) = self.workloads.remove(&spec.id) else {
                        continue;
                    };
                    let mut w = self.launch(w, spec);
                    started += 1;
                    w.tell_deadline(&spec.id, spec.deadline.as_ref());
                    self.workloads.insert(spec.id.clone(), w);
                }
                Some(w) => {
                    if let Status::Pulling(p) = &mut w.status {
                        p.set_gang(spec);
                    }
                    w.tell_deadline(&spec.id, spec.deadline.as_ref());
                }
                None => {
                    let mut w = if spec.run {
                        started += 1;
                        match (&spec.image, &spec.gang) {
                            (Some(_), _) => self.start_pull(spec),
                            (None, Some(_)) => self.prepare_or_launch(spec, None),
                            (None, None) => self.start(spec, None),
                        }
                    } else {
                        Workload::exited(self.run_dir(&spec.id), "stopped before it started")
                    };
                    w.tell_deadline(&spec.id, spec.deadline.as_ref());
                    self.workloads.insert(spec.id.clone(), w);
                }
            }
        }
        self.workloads.retain(|id, w| {
            if listed.contains(id.as_str()) {
                return true;
            }
            if matches!(w.status, Status::Prepared(_)) {
                w.request_stop(now);
            }
            if w.is_live() {
                w.request_stop(now + STOP_GRACE);
                return true;
            }
            if let Some(dir) = &w.dir
                && let Err(e) = fs::remove_dir_all(dir)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(id, error = %e, "cannot delete the run folder");
            }
            tracing::info!(id, "workload forgotten");
            false
        });
        started
    }

    /// Stops every running workload (SIGTERM, SIGKILL after `grace`) and waits until
    /// their processes are gone, or a second past the SIGKILL. For agent shutdown.
    pub async fn stop_all(&mut self, grace: Duration) {
        let now = Instant::now();
        for w in self.workloads.values_mut() {
            w.request_stop(now + grace);
        }
        let give_up = now + grace + Duration::from_secs(1);
        loop {
            self.poll();
            if !self.any_running() || Instant::now() >= give_up {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if self.any_running() {
            tracing::warn!("some workload processes outlived SIGKILL");
        }
    }

    /// A port free on the node and not given to another of its workloads (which, in
    /// networks of their own, do not hold theirs on the node).
    fn free_port(&self) -> io::Result<u16> {
        for _ in 0..16 {
            let p = free_port()?;
            if !self.workloads.values().any(|w| {
                w.port == Some(p) && (w.is_live() || matches!(w.status, Status::Prepared(_)))
            }) {
                return Ok(p);
            }
        }
        Err(io::Error::other("no free port found"))
    }

    fn run_dir(&self, id: &str) -> Option<PathBuf> {
        safe_name(id).then(|| self.root.join("runs").join(id))
    }

    /// Whether the first process of a live workload has exited since the last report
    /// (cheap: a `waitpid` for a process this agent started, one `/proc` read for a
    /// container's or an adopted one; no scan). Checked often between workload rounds, so
    /// an exit is reported at once rather than at the next round.
    pub fn any_exited(&mut self) -> bool {
        self.workloads.values_mut().any(|w| match &mut w.status {
            Status::Live(l) if l.wrapper_exited.is_none() => match l.child.as_mut() {
                Some(c) => matches!(c.try_wait(), Ok(Some(_))),
                None => !is_alive(l.pid, l.start_time),
            },
            _ => false,
        })
    }

    /// Reaps and polls every process, and sends SIGKILL where a deadline passed.
    fn poll(&mut self) {
        let now = Instant::now();
        // Scanning /proc is needed only where a wrapper has exited; at most once.
        let mut groups: Option<HashSet<u32>> = None;
        for (id, w) in &mut self.workloads {
            w.poll(id, now, &mut groups);
        }
    }

    async fn probe_notebooks(&mut self) {
        let mut probes = JoinSet::new();
        for (id, w) in &self.workloads {
            if let (Some(p), Status::Live(l)) = (&w.probe, &w.status)
                && l.wrapper_exited.is_none()
                && w.kill_at.is_none()
            {
                let (id, client, p) = (id.clone(), self.http.clone(), p.clone());
                probes.spawn(async move { (id, probe(&client, &p).await) });
            }
        }
        while let Some(done) = probes.join_next().await {
            let Ok((id, answer)) = done else { continue };
            let (Some(w), Some(answer)) = (self.workloads.get_mut(&id), answer) else {
                continue;
            };
            if !w.ready {
                tracing::info!(id, "notebook answers");
            }
            w.ready = true;
            w.last_activity_ms = answer.last_activity_ms.or(w.last_activity_ms);
            w.busy = answer.busy;
        }
    }

    /// Starts `spec` (in `image` when it has one, held); any failure becomes a
    /// `FailedToStart` workload.
    fn start(&self, spec: &WorkloadSpec, image: Option<Image>) -> Workload {
        match self.try_start(spec, image, None) {
            Ok(w) => {
                tracing::info!(id = spec.id, kind = spec.kind.as_str(), "workload started");
                w
            }
            Err(message) => {
                tracing::warn!(id = spec.id, message, "workload failed to start");
                Workload::new(self.run_dir(&spec.id), Status::FailedToStart(message))
            }
        }
    }

    /// `prepared`: a gang member's port and network, made by [`LocalExecutor::prepare`]
    /// (its workspace quota was checked then); on failure its network stays the caller's.
    fn try_start(
        &self,
        spec: &WorkloadSpec,
        image: Option<Image>,
        prepared: Option<(Option<u16>, Option<Slot>)>,
    ) -> Result<Workload, String> {
        if !safe_name(&spec.id) {
            return Err(format!(
                "workload id `{}` is not a safe folder name ([A-Za-z0-9._-])",
                spec.id
            ));
        }
        if !safe_name(&spec.workspace) {
            return Err(format!(
                "workspace `{}` is not a safe folder name ([A-Za-z0-9._-])",
                spec.workspace
            ));
        }
        let serves = spec.gang.as_ref().is_some_and(gang::serves);
        if spec.argv.is_empty() && image.is_none() && !serves {
            return Err("nothing to run: argv is empty".to_owned());
        }
        if image.is_some() && self.sandbox.is_none() {
            return Err(image::NEEDS_SANDBOX.to_owned());
        }
        let devices = match &spec.share {
            Some(share) => share_devices(spec, share)?,
            None => spec.devices.clone(),
        };
        // MPS: the daemon must answer now, or the client would run without its limits
        // (a CUDA program that finds no daemon runs as if MPS were off).
        let mps = match &spec.share {
            Some(share) if share.method == ShareMethod::Mps => Some(
                self.shares
                    .mps_client(&share.gpu_uuid)
                    .map_err(|e| format!("the GPU's MPS daemon is not running: {e}"))?,
            ),
            _ => None,
        };
        let (workspace, uid) = if prepared.is_some() {
            self.workspace_and_uid(spec)?
        } else {
            self.team_workspace(spec)?
        };
        // MPS: the limits are the server's, set through the control daemon, so that a
        // client that unsets its variables gains nothing.
        if let Some(share) = spec.share.as_ref().filter(|s| s.method == ShareMethod::Mps) {
            let team_uid = uid.unwrap_or_else(own_uid);
            // Clients of the same server (the team's uid; without the sandbox every
            // workload runs as the agent's) already run on this GPU.
            let busy = self.workloads.iter().any(|(id, w)| {
                *id != spec.id
                    && w.is_live()
                    && w.mps.as_ref().is_some_and(|m| {
                        m.gpu == share.gpu_uuid
                            && (self.sandbox.is_none() || m.team == spec.workspace)
                            // Not a client of today's server when its daemon died.
                            && !m.lost
                            && !self.shares.died_during(&m.gpu, m.since, None)
                    })
            });
            self.shares
                .mps_server(&share.gpu_uuid, team_uid, server_limits(share), busy)
                .map_err(|e| format!("the share's MPS limits cannot be enforced: {e}"))?;
        }
        let cwd = workdir(&workspace, &spec.workdir)?;
        // Inside the container: the workdir in the workspace, or an image's own
        // `WorkingDir` when the spec names none (see `image::container_cwd`).
        let container_cwd = match &image {
            Some(img) => image::container_cwd(&spec.workdir, img, &workspace),
            None => Path::new(WORKSPACE_MOUNT)
                .join(&spec.workdir)
                .to_string_lossy()
                .into_owned(),
        };
        let run = self.root.join("runs").join(&spec.id);

        let (port, mut net) = match prepared {
            Some(p) => p,
            None if needs_port(spec) => (
                Some(
                    self.free_port()
                        .map_err(|e| format!("cannot choose a port: {e}"))?,
                ),
                None,
            ),
            None => (None, None),
        };
        // A gang member: its peers, and what it gets for them.
        let launch = match &spec.gang {
            Some(g) => Some(Launch::new(
                g,
                &self.gang_addr(net.as_ref()),
                &run,
                self.sandbox.is_some(),
            )?),
            None => None,
        };
        // In a network of its own, a notebook listens on its own address; which one is
        // known once its network is made.
        let host = match &self.sandbox {
            Some(sb) if sb.own_network() => "0.0.0.0",
            _ => &self.host,
        };
        let mut argv: Vec<String> = spec
            .argv
            .iter()
            .map(|a| {
                let a = a.replace("{host}", host);
                match port {
                    Some(p) => a.replace("{port}", &p.to_string()),
                    None => a,
                }
            })
            .collect();
        let rsh_argv = launch.as_ref().and_then(Launch::argv);
        if let Some(a) = rsh_argv.clone() {
            argv = a;
        } else if let Some(img) = &image {
            argv = image_argv(img.config(), &argv);
            if argv.is_empty() {
                return Err(format!(
                    "nothing to run: the image {} has no Entrypoint or Cmd and the workload \
                     names no command",
                    img.digest()
                ));
            }
        }
        if spec.kind == WorkloadKind::Notebook
            && image.is_none()
            && let (Some(nb_env), Some(program)) = (&self.notebook_env, argv.first_mut())
            && let Some(found) = nb_env.program(program)
            && let Some(found) = found.to_str()
        {
            *program = found.to_owned();
        }
        let env = self.env_for(
            spec,
            &devices,
            mps.as_ref(),
            &workspace,
            &run,
            image.is_none(),
        );
        let env = match &launch {
            Some(l) => with_vars(env, gang::gang_env(&l.spec, &l.hostfile, &l.rsh)),
            None => env,
        };
        let env = match &image {
            Some(img) => image::env_in_image(img, &env, &devices, self.sandbox.as_ref()),
            None => env,
        };
        // In an image, the program is the image's to have (a missing one says so in the log);
        // the remote agent is the agent's.
        if let Some(program) = argv
            .first()
            .filter(|_| image.is_none() && rsh_argv.is_none())
        {
            find_program(program, &cwd, &env).map_err(|e| {
                if spec.kind != WorkloadKind::Notebook || program.contains('/') {
                    return e;
                }
                match &self.notebook_env {
                    Some(nb_env) => format!(
                        "{e} (neither in the notebook environment {} nor on PATH)",
                        nb_env.dir().join("bin").display()
                    ),
                    None => format!(
                        "{e} (install JupyterLab on the node and point the agent at it \
                         with --notebook-env, or set TESSERA_NOTEBOOK_COMMAND on the server)"
                    ),
                }
            })?;
        }

        if let Some(l) = &launch {
            let exe = self
                .rsh
                .as_deref()
                .ok_or("cannot find the agent's own executable (tessera-rsh)")?;
            l.write_files(&run, self.sandbox.is_some(), exe)?;
            if let (Some(sb), Some(slot)) = (&self.sandbox, net.as_mut())
                && let Some(settings) = sb.network()
            {
                let peers = gang::network_peers(&l.spec, &l.peers, &self.host)?;
                if let Err(e) = network::open_to_peers(settings, slot, port, &peers) {
                    network::remove_routes(slot);
                    return Err(e);
                }
            }
        }
        let extras = Extras {
            net: net.clone(),
            rsh: launch.as_ref().and(self.rsh.clone()),
            names: launch.as_ref().map(|l| l.names(&run)),
        };
        let started = match (&self.sandbox, uid) {
            (Some(sb), Some(uid)) => {
                let binds: Vec<PathBuf> = mps.iter().map(|d| d.pipe.clone()).collect();
                let access = Access {
                    devices: &devices,
                    binds: &binds,
                    gpu_fraction: spec.share.as_ref().map(|s| f64::from(s.milli) / 1000.0),
                    port,
                    image: image.as_ref().map(Image::rootfs),
                };
                let what = Process {
                    id: &spec.id,
                    run: &run,
                    workspace: &workspace,
                    uid,
                    cwd: &container_cwd,
                    argv: &argv,
                    env: &env,
                    access: &access,
                };
                start_sandboxed(sb, &what, extras).map(|(pid, c)| (None, pid, Some(c)))
            }
            _ => spawn(&run, &cwd, &argv, &env).map(|c| {
                let pid = c.id();
                (Some(c), pid, None)
            }),
        };
        let (child, pid, container) = match started {
            Ok(c) => c,
            Err(e) => {
                // Nothing ran; leave no folder behind (a prepared network is the
                // caller's; the routes added here go).
                let _ = fs::remove_dir_all(&run);
                if let Some(n) = &net {
                    network::remove_routes(n);
                }
                return Err(e);
            }
        };
        if spec.gang.is_some() {
            Self::forget_prepared(&run);
        }
        // Read before anything can reap it: until then even an exited child has a stat.
        let start_time = read_stat(pid).map_or(0, |s| s.start_time);
        let state = RunState {
            pid,
            start_time,
            port,
            // Never the registry login: it was needed for the pull only.
            spec: image::without_login(spec),
            container: container.clone(),
            image_digest: image.as_ref().map(|i| i.digest().to_string()),
        };
        if let Err(e) = write_atomic(&run.join("state.json"), &state) {
            // It runs and this agent watches it; only adoption after a restart suffers.
            tracing::error!(id = spec.id, error = %e, "cannot write state.json");
        }
        let mut w = Workload::new(
            Some(run),
            Status::Live(Live {
                pid,
                start_time,
                child,
                wrapper_exited: None,
            }),
        );
        w.addr = container.as_ref().and_then(Container::address);
        w.container = container;
        w.port = port;
        w.probe = probe_for(spec, port, &reach_at(&self.host, w.addr, true));
        w.devices = devices;
        w.mps = mps_watch(spec);
        w.image = image;
        Ok(w)
    }

    /// The team workspace of `spec` (made when missing), checked against the quota, and
    /// the team's uid in the sandbox (the workspace handed to it).
    fn team_workspace(&self, spec: &WorkloadSpec) -> Result<(PathBuf, Option<u32>), String> {
        if !safe_name(&spec.workspace) {
            return Err(format!(
                "workspace `{}` is not a safe folder name ([A-Za-z0-9._-])",
                spec.workspace
            ));
        }
        let workspace = self.root.join("workspaces").join(&spec.workspace);
        fs::create_dir_all(&workspace)
            .map_err(|e| format!("cannot create the team workspace: {e}"))?;
        if let Some(quota) = self.workspace_quota {
            let used = disk_usage(&workspace)
                .map_err(|e| format!("cannot measure the team workspace: {e}"))?;
            if used >= quota {
                return Err(format!(
                    "the team's workspace on this node holds {} MiB, at or over its quota of \
                     {} MiB: delete files from it to start workloads here again",
                    used / (1024 * 1024),
                    quota / (1024 * 1024)
                ));
            }
        }
        self.workspace_and_uid(spec)
    }

    /// [`LocalExecutor::team_workspace`] without the quota check.
    fn workspace_and_uid(&self, spec: &WorkloadSpec) -> Result<(PathBuf, Option<u32>), String> {
        let workspace = self.root.join("workspaces").join(&spec.workspace);
        fs::create_dir_all(&workspace)
            .map_err(|e| format!("cannot create the team workspace: {e}"))?;
        let uid = match &self.sandbox {
            Some(sb) => {
                let uid = sb.uid_for(&spec.workspace)?;
                sb.own_workspace(&workspace, uid)?;
                Some(uid)
            }
            None => None,
        };
        Ok((workspace, uid))
    }

    /// The workload's environment: the inherited one (unless `inherit` is false: an
    /// image has its own) minus every `TESSERA_*` variable (the join token must never
    /// leak) and the device variables, plus the spec's, plus the executor's own (which win).
    fn env_for(
        &self,
        spec: &WorkloadSpec,
        devices: &[String],
        mps: Option<&MpsDirs>,
        workspace: &Path,
        run: &Path,
        inherit: bool,
    ) -> Vec<(OsString, OsString)> {
        let mut env: BTreeMap<OsString, OsString> = self
            .inherited
            .iter()
            .filter(|(k, _)| inherit && !dropped_var(k))
            .cloned()
            .collect();
        for v in &spec.env {
            env.insert(v.name.clone().into(), v.value.clone().into());
        }
        let visible = OsString::from(devices.join(","));
        env.insert("CUDA_VISIBLE_DEVICES".into(), visible.clone());
        env.insert("NVIDIA_VISIBLE_DEVICES".into(), visible);
        if let Some(share) = &spec.share {
            // Only the agent says how a share is run.
            env.retain(|k, _| !k.as_encoded_bytes().starts_with(b"CUDA_MPS_"));
            env.extend(share_env(share, mps));
        }
        if let Some(token) = &spec.token {
            env.insert("JUPYTER_TOKEN".into(), token.into());
        }
        env.insert(
            tessera_domain::drain::DEADLINE_FILE_VAR.into(),
            if self.sandbox.is_some() {
                tessera_domain::drain::DEADLINE_FILE.into()
            } else {
                deadline_path(run, false).into()
            },
        );
        if self.sandbox.is_some() {
            // Paths as the workload sees them; its home is the team workspace.
            env.insert("TESSERA_WORKSPACE".into(), WORKSPACE_MOUNT.into());
            env.insert("HOME".into(), WORKSPACE_MOUNT.into());
            env.insert("USER".into(), "tessera".into());
            env.insert("LOGNAME".into(), "tessera".into());
            env.insert(
                "JUPYTER_RUNTIME_DIR".into(),
                format!("{CONTROL_MOUNT}/runtime").into(),
            );
        } else {
            env.insert("TESSERA_WORKSPACE".into(), workspace.into());
            env.insert("JUPYTER_RUNTIME_DIR".into(), run.join("runtime").into());
        }
        env.into_iter().collect()
    }

    /// What a run folder found on open says (adoption after an agent restart).
    fn adopt(&self, id: &str) -> Workload {
        let dir = self.root.join("runs").join(id);
        if let Some(w) = self.adopt_prepared(&dir) {
            return w;
        }
        let state: RunState = match fs::read(dir.join("state.json"))
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(id, error = e, "run folder without a readable state.json");
                return Workload::new(
                    Some(dir),
                    Status::Lost(format!(
                        "the agent stopped while starting it (state.json: {e})"
                    )),
                );
            }
        };
        let stopped = dir.join("stopped").exists();
        let container = state.container.clone();
        let status = if is_alive(state.pid, state.start_time) {
            tracing::info!(id, pid = state.pid, "adopted a running workload");
            Status::Live(Live {
                pid: state.pid,
                start_time: state.start_time,
                child: None,
                wrapper_exited: None,
            })
        } else if let Some(c) = &container {
            let (code, message) = container_end(c, &dir, stopped);
            Status::Exited { code, message }
        } else if let Some(code) = read_exit(&dir) {
            Status::Exited {
                code,
                message: stopped.then(|| "stopped".to_owned()),
            }
        } else if stopped {
            Status::Exited {
                code: None,
                message: Some("stopped".to_owned()),
            }
        } else {
            Status::Lost(LOST_WHILE_DOWN.to_owned())
        };
        let mut w = Workload::new(Some(dir), status);
        if w.is_live() {
            w.addr = container.as_ref().and_then(Container::address);
            w.container = container;
        }
        w.port = state.port;
        w.probe = probe_for(&state.spec, state.port, &reach_at(&self.host, w.addr, true));
        w.devices = match &state.spec.share {
            Some(share) => share_devices(&state.spec, share).unwrap_or_default(),
            None => state.spec.devices.clone(),
        };
        w.mps = mps_watch(&state.spec);
        if state.spec.gang.is_some() {
            w.gang_addr =
                Some(self.gang_addr(state.container.as_ref().and_then(|c| c.net.as_ref())));
        }
        if w.is_live() {
            w.image_digest = state
                .image_digest
                .as_deref()
                .and_then(|d| tessera_domain::image::Digest::parse(d).ok());
        }
        w
    }
}

impl Workload {
    fn new(dir: Option<PathBuf>, status: Status) -> Workload {
        Workload {
            dir,
            port: None,
            probe: None,
            status,
            acked: 0,
            kill_at: None,
            ready: false,
            last_activity_ms: None,
            busy: false,
            container: None,
            addr: None,
            devices: Vec::new(),
            mps: None,
            deadline: None,
            image: None,
            image_digest: None,
            gang_addr: None,
        }
    }

    /// A prepared gang member's network.
    fn prepared_net(&self) -> Option<&Slot> {
        match &self.status {
            Status::Prepared(p) => p.net.as_ref(),
            _ => None,
        }
    }

    /// The deadline channel: once per new deadline, the deadline file is (re)written in
    /// the workload's control folder and, when the workload asked for one, its warning
    /// signal is sent to its processes (never to the exit-status wrapper, which would die
    /// of it). `None` after a deadline: the file goes (a withdrawn warning).
    fn tell_deadline(&mut self, id: &str, d: Option<&Deadline>) {
        if let Status::Pulling(p) = &mut self.status {
            // Told once it runs.
            p.set_deadline(d);
            return;
        }
        if self.deadline.as_ref() == d {
            return;
        }
        let Status::Live(live) = &self.status else {
            return;
        };
        let Some(file) = self
            .dir
            .as_deref()
            .map(|dir| deadline_path(dir, self.container.is_some()))
        else {
            return;
        };
        match d {
            Some(d) => {
                if let Err(e) = write_untrusted_dir(&file, d.file_text().as_bytes()) {
                    tracing::warn!(id, error = %e, "cannot write the deadline file");
                }
                let changed = self.deadline.as_ref().is_none_or(|old| old.at != d.at);
                if changed && !d.signal.is_empty() {
                    match &self.container {
                        Some(c) => c.signal(&d.signal),
                        None => signal_members(live.pid, &d.signal),
                    }
                }
                tracing::info!(id, deadline = %d.at, cause = d.cause.as_str(), "deadline told");
            }
            None => {
                let _ = fs::remove_file(&file);
            }
        }
        self.deadline = d.cloned();
    }

    fn exited(dir: Option<PathBuf>, message: &str) -> Workload {
        Workload::new(
            dir,
            Status::Exited {
                code: None,
                message: Some(message.to_owned()),
            },
        )
    }

    fn is_live(&self) -> bool {
        matches!(self.status, Status::Live(_))
    }

    /// SIGTERM to the process group now (once), SIGKILL at `kill_at` (the earliest
    /// asked) if anything of it is left.
    fn request_stop(&mut self, kill_at: Instant) {
        if let Status::Prepared(p) = &mut self.status {
            // No process yet: what was made for it goes.
            p.discard();
            if let Some(dir) = &self.dir {
                let _ = fs::write(dir.join("stopped"), b"");
                LocalExecutor::forget_prepared(dir);
            }
            self.status = Status::Exited {
                code: None,
                message: Some("stopped before it started".to_owned()),
            };
            return;
        }
        if matches!(self.status, Status::Pulling(_)) {
            // Nothing runs yet: the pull is cancelled (dropped) and the workload ends.
            self.status = Status::Exited {
                code: None,
                message: Some("stopped while its image was pulled".to_owned()),
            };
            return;
        }
        let Status::Live(live) = &self.status else {
            return;
        };
        if self.kill_at.is_none() {
            if let Some(dir) = &self.dir {
                // So that an agent restarted before it is gone reports it as stopped.
                let _ = fs::write(dir.join("stopped"), b"");
            }
            if let Some(c) = &self.container {
                c.signal("TERM");
            } else if live.wrapper_exited.is_none() || group_alive(live.pid) {
                signal_group(live.pid, "TERM");
            }
        }
        self.kill_at = Some(self.kill_at.map_or(kill_at, |k| k.min(kill_at)));
    }

    fn poll(&mut self, id: &str, now: Instant, groups: &mut Option<HashSet<u32>>) {
        let Status::Live(live) = &mut self.status else {
            return;
        };
        if live.wrapper_exited.is_none() {
            live.wrapper_exited = match &mut live.child {
                Some(child) => match child.try_wait() {
                    Ok(Some(st)) => Some(st.code()),
                    Ok(None) => None,
                    Err(e) => {
                        tracing::warn!(id, error = %e, "cannot wait for the workload");
                        (!is_alive(live.pid, live.start_time)).then_some(None)
                    }
                },
                None => (!is_alive(live.pid, live.start_time)).then_some(None),
            };
        }
        let Some(wrapper_code) = live.wrapper_exited else {
            if self.kill_at.is_some_and(|k| now >= k) {
                match &self.container {
                    Some(c) => c.signal("KILL"),
                    None => signal_group(live.pid, "KILL"),
                }
            }
            return;
        };
        // A container ends with its first process (its PID namespace goes with it).
        if let (Some(c), Some(dir)) = (self.container.take(), self.dir.as_deref()) {
            let (code, message) = container_end(&c, dir, self.kill_at.is_some());
            tracing::info!(id, code, message, "sandboxed workload exited");
            self.status = Status::Exited { code, message };
            return;
        }
        // The wrapper is gone; the workload is gone once nothing of its group is left.
        let alive = groups.get_or_insert_with(live_groups).contains(&live.pid);
        if alive {
            match self.kill_at {
                // Asked to stop: the grace period applies to every process of it.
                Some(k) if now < k => {}
                // Leftovers of a program that ended on its own (or past the grace).
                _ => signal_group(live.pid, "KILL"),
            }
            return;
        }
        let code = self
            .dir
            .as_deref()
            .and_then(read_exit)
            .unwrap_or(wrapper_code);
        let message = self.kill_at.map(|_| "stopped".to_owned());
        tracing::info!(id, code, stopped = message.is_some(), "workload exited");
        self.status = Status::Exited { code, message };
    }

    fn report(&self, id: &str, host: &str, log_cap: u64) -> WorkloadReport {
        let (phase, exit_code, message) = match &self.status {
            Status::Pulling(_) | Status::Prepared(_) => (WorkloadPhase::Starting, None, None),
            Status::FailedToStart(m) => (WorkloadPhase::FailedToStart, None, Some(m.clone())),
            Status::Live(_) if self.probe.is_some() && !self.ready => {
                (WorkloadPhase::Starting, None, None)
            }
            Status::Live(_) => (WorkloadPhase::Running, None, None),
            Status::Exited { code, message } => (WorkloadPhase::Exited, *code, message.clone()),
            Status::Lost(m) => (WorkloadPhase::Lost, None, Some(m.clone())),
        };
        // A workload whose image is pulled (or a prepared gang member) has no output
        // yet, and will have.
        let finished =
            !self.is_live() && !matches!(self.status, Status::Pulling(_) | Status::Prepared(_));
        if let Some(dir) = &self.dir
            && let Err(e) = cap_log(&dir.join("output.log"), log_cap)
        {
            tracing::warn!(id, error = %e, "cannot cap the workload's log");
        }
        let (log, log_complete) = match &self.dir {
            Some(dir) => match read_log(&dir.join("output.log"), self.acked, finished) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(id, error = %e, "cannot read the workload's log");
                    (None, false)
                }
            },
            None => (None, finished),
        };
        let live = self.is_live();
        WorkloadReport {
            id: id.to_owned(),
            phase,
            exit_code,
            message,
            endpoint: self
                .port
                .filter(|_| live)
                .map(|p| format!("{}:{p}", host_for_url(&reach_at(host, self.addr, false)))),
            kernel_last_activity_ms: self.last_activity_ms.filter(|_| live),
            kernel_busy: live && self.busy,
            log_complete,
            log,
            pull: None,
            gang_addr: self.gang_addr.clone(),
            // The route to it from the other members' nodes: this node's address.
            gang_via: self.gang_addr.as_ref().map(|_| host.to_owned()),
        }
    }
}

/// `[A-Za-z0-9._-]+`, and not `.` or `..`: safe as one folder name.
pub fn safe_name(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Variables a workload never inherits from the agent.
fn dropped_var(name: &OsStr) -> bool {
    let b = name.as_encoded_bytes();
    b.starts_with(b"TESSERA_")
        || b.starts_with(b"CUDA_MPS_")
        || name == "CUDA_VISIBLE_DEVICES"
        || name == "NVIDIA_VISIBLE_DEVICES"
}

/// The devices of a workload on a share: its GPU, which `devices` must name alone (or
/// leave empty). The limits must be usable.
fn share_devices(spec: &WorkloadSpec, share: &ShareLimits) -> Result<Vec<String>, String> {
    let gpu = &share.gpu_uuid;
    if !(spec.devices.is_empty() || spec.devices == std::slice::from_ref(gpu)) {
        return Err(format!(
            "a workload on a share of GPU {gpu} must have that GPU as its only device, not {}",
            spec.devices.join(",")
        ));
    }
    if !(1..=1000).contains(&share.milli) {
        return Err(format!(
            "a GPU share is 1 to 1000 milli-GPU, not {}",
            share.milli
        ));
    }
    if share.method == ShareMethod::Mps && share.memory_mib == 0 {
        return Err("an MPS share needs a memory limit above 0 MiB".to_owned());
    }
    Ok(vec![gpu.clone()])
}

/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` for a share: ⌈milli / 10⌉, within 1..=100.
pub fn active_thread_percentage(milli: u32) -> u32 {
    milli.div_ceil(10).clamp(1, 100)
}

/// The limits of the MPS server a client on `share` connects to.
pub fn server_limits(share: &ShareLimits) -> ServerLimits {
    ServerLimits {
        active_thread_percentage: active_thread_percentage(share.milli),
        pinned_mem_mib: share.memory_mib,
    }
}

/// The variables of a workload on `share` (`mps`: its daemon's folders).
pub fn share_env(share: &ShareLimits, mps: Option<&MpsDirs>) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = vec![
        (
            "TESSERA_GPU_SHARE_METHOD".into(),
            share.method.as_str().into(),
        ),
        (
            "TESSERA_GPU_SHARE_MILLI".into(),
            share.milli.to_string().into(),
        ),
        (
            "TESSERA_GPU_MEMORY_MIB".into(),
            share.memory_mib.to_string().into(),
        ),
    ];
    if let (ShareMethod::Mps, Some(dirs)) = (share.method, mps) {
        env.extend([
            ("CUDA_MPS_PIPE_DIRECTORY".into(), dirs.pipe.clone().into()),
            ("CUDA_MPS_LOG_DIRECTORY".into(), dirs.log.clone().into()),
            (
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
                active_thread_percentage(share.milli).to_string().into(),
            ),
            // The client sees one GPU: device ordinal 0.
            (
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(),
                format!("0={}M", share.memory_mib).into(),
            ),
        ]);
    }
    env
}

/// An MPS client's watch, from its spec.
fn mps_watch(spec: &WorkloadSpec) -> Option<MpsWatch> {
    let share = spec
        .share
        .as_ref()
        .filter(|s| s.method == ShareMethod::Mps)?;
    Some(MpsWatch {
        gpu: share.gpu_uuid.clone(),
        team: spec.workspace.clone(),
        since: Instant::now(),
        ended: None,
        lost: false,
    })
}

/// The folder to start in: `workdir` inside the workspace, which must exist.
fn workdir(workspace: &Path, workdir: &str) -> Result<PathBuf, String> {
    let rel = Path::new(workdir);
    if !rel
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "folder `{workdir}` is not inside the team workspace"
        ));
    }
    let dir = workspace.join(rel);
    if !dir.is_dir() {
        return Err(format!(
            "folder `{workdir}` does not exist in the team workspace"
        ));
    }
    Ok(dir)
}

/// Notebooks get a port; so does anything that asks for one with `{port}`.
fn needs_port(spec: &WorkloadSpec) -> bool {
    spec.kind == WorkloadKind::Notebook
        || spec.base_path.is_some()
        || spec.argv.iter().any(|a| a.contains("{port}"))
}

/// Where a notebook is reached: `host` (the node's address), or the workload's own
/// address when it has one and either the agent itself asks (`probe`) or `host` is a
/// loopback address, i.e. the server is on this node and routes to it directly. A
/// server elsewhere reaches `host`, which the node forwards to the workload.
fn reach_at(host: &str, own: Option<Ipv4Addr>, probe: bool) -> String {
    let local = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|a| a.is_loopback());
    match own {
        Some(addr) if probe || local => addr.to_string(),
        _ => host.to_owned(),
    }
}

/// A port free right now: bind port 0, read it, let it go.
fn free_port() -> io::Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(l.local_addr()?.port())
}

/// IPv6 literals need brackets in `host:port` and URLs.
fn host_for_url(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

fn probe_for(spec: &WorkloadSpec, port: Option<u16>, host: &str) -> Option<Probe> {
    let base_path = spec.base_path.as_deref()?;
    let port = port?;
    let mut base_path = base_path.to_owned();
    if !base_path.starts_with('/') {
        base_path.insert(0, '/');
    }
    if !base_path.ends_with('/') {
        base_path.push('/');
    }
    Some(Probe {
        base: format!("http://{}:{port}{base_path}", host_for_url(host)),
        token: spec.token.clone(),
    })
}

/// What a notebook's API said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProbeAnswer {
    last_activity_ms: Option<i64>,
    busy: bool,
}

/// `GET api/status` (must answer 200) and `GET api/kernels`; `None` if not up.
async fn probe(client: &reqwest::Client, p: &Probe) -> Option<ProbeAnswer> {
    let get = |path: &str| {
        let mut req = client.get(format!("{}{path}", p.base));
        if let Some(t) = &p.token {
            req = req.header(reqwest::header::AUTHORIZATION, format!("token {t}"));
        }
        req.send()
    };
    let status = get("api/status").await.ok()?;
    if status.status() != reqwest::StatusCode::OK {
        return None;
    }
    let status: serde_json::Value = status.json().await.unwrap_or_default();
    // `no_track_activity`: listing the kernels is not use of the notebook (without it
    // Jupyter counts every probe as activity, and no notebook would ever go idle).
    let kernels: serde_json::Value = match get("api/kernels?no_track_activity=1").await {
        Ok(r) if r.status().is_success() => r.json().await.unwrap_or_default(),
        _ => serde_json::Value::Null,
    };
    Some(ProbeAnswer {
        last_activity_ms: status
            .get("last_activity")
            .and_then(serde_json::Value::as_str)
            .and_then(parse_time_ms),
        busy: kernels_busy(&kernels),
    })
}

/// Jupyter's ISO-8601 times (`2026-11-23T18:00:00.123456Z`) as unix milliseconds.
pub fn parse_time_ms(s: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// Whether any kernel of a Jupyter `api/kernels` answer is executing.
fn kernels_busy(kernels: &serde_json::Value) -> bool {
    kernels.as_array().is_some_and(|ks| {
        ks.iter()
            .any(|k| k.get("execution_state").and_then(serde_json::Value::as_str) == Some("busy"))
    })
}

/// `argv[0]` must name an executable file: one with a `/` relative to `cwd`, else
/// found on the workload's `PATH`. (The wrapper would only say "not found" in the log.)
fn find_program(program: &str, cwd: &Path, env: &[(OsString, OsString)]) -> Result<(), String> {
    let executable = |p: &Path| {
        fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let found = if program.contains('/') {
        executable(&cwd.join(program))
    } else {
        let path = env.iter().find(|(k, _)| k == "PATH").map_or_else(
            || OsString::from("/usr/local/bin:/usr/bin:/bin"),
            |(_, v)| v.clone(),
        );
        !program.is_empty()
            && std::env::split_paths(&path).any(|d| executable(&cwd.join(d).join(program)))
    };
    if found {
        Ok(())
    } else {
        Err(format!("cannot start `{program}`: program not found"))
    }
}

/// Creates the run folder and starts the wrapper in its own process group, stdin
/// closed, stdout and stderr appended to `output.log`.
fn spawn(
    run: &Path,
    cwd: &Path,
    argv: &[String],
    env: &[(OsString, OsString)],
) -> Result<Child, String> {
    let log = open_run_dir(run).map_err(|e| format!("cannot create the run folder: {e}"))?;
    let stderr = log
        .try_clone()
        .map_err(|e| format!("cannot create the run folder: {e}"))?;
    Command::new("/bin/sh")
        .arg("-c")
        .arg(WRAPPER)
        .arg("tessera-run")
        .arg(run.join("exit"))
        .args(argv)
        .current_dir(cwd)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(stderr)
        .process_group(0)
        .spawn()
        .map_err(|e| {
            format!(
                "cannot start `{}`: {e}",
                argv.first().map_or("", String::as_str)
            )
        })
}

/// Writes `value` as JSON next to `path`, then renames it into place.
fn write_atomic<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(value).map_err(io::Error::other)?)?;
    f.sync_all()?;
    fs::rename(tmp, path)
}

/// The `exit` file: `None` if there is none; `Some(None)` if unreadable as a number.
fn read_exit(dir: &Path) -> Option<Option<i32>> {
    let s = read_untrusted(&dir.join("exit"))?;
    Some(s.trim().parse().ok())
}

/// How a container ended: the wrapper's status from `ctl/exit` and a message for a
/// stop or an out-of-memory kill. Deletes the container (and its cgroup).
fn container_end(c: &Container, dir: &Path, stopped: bool) -> (Option<i32>, Option<String>) {
    let code = read_exit(&dir.join("ctl")).flatten();
    let oom = c.oom_killed();
    c.delete();
    let message = if oom {
        Some(format!(
            "killed: out of memory (the workload's memory limit is {} MiB)",
            c.memory_mib
        ))
    } else if stopped {
        Some("stopped".to_owned())
    } else {
        None
    };
    (code, message)
}

/// `env` with `vars` set (replacing variables of the same name).
fn with_vars(
    env: Vec<(OsString, OsString)>,
    vars: Vec<(OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = env
        .into_iter()
        .filter(|(k, _)| !vars.iter().any(|(v, _)| v == k))
        .collect();
    env.extend(vars);
    env
}

/// Starts `what` under the exit-status wrapper in a container of `sb`.
fn start_sandboxed(
    sb: &Sandbox,
    what: &Process<'_>,
    extras: Extras,
) -> Result<(u32, Container), String> {
    let log = open_run_dir(what.run).map_err(|e| format!("cannot create the run folder: {e}"))?;
    let mut wrapped: Vec<String> = vec![
        "/bin/sh".into(),
        "-c".into(),
        WRAPPER.into(),
        "tessera-run".into(),
        format!("{CONTROL_MOUNT}/exit"),
    ];
    wrapped.extend(what.argv.iter().cloned());
    let wrapped = Process {
        argv: &wrapped,
        ..*what
    };
    let started = sb.start_with(&wrapped, extras, &log)?;
    Ok((started.pid, started.container))
}

/// Creates the run folder (mode 0700) and opens `output.log` for appending.
fn open_run_dir(run: &Path) -> io::Result<File> {
    fs::create_dir_all(run.join("runtime"))?;
    fs::set_permissions(run, fs::Permissions::from_mode(0o700))?;
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(run.join("output.log"))
}

/// The log from `acked`: at most [`LOG_CHUNK`] bytes, never ending in the middle of a
/// UTF-8 sequence unless the process has `finished` and that is the end of the file.
/// Also whether the piece reaches the end of a finished process's log.
fn read_log(path: &Path, acked: u64, finished: bool) -> io::Result<(Option<LogPiece>, bool)> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((None, finished)),
        Err(e) => return Err(e),
    };
    let size = f.metadata()?.len();
    if acked >= size {
        return Ok((None, finished));
    }
    // Output from `acked` on that `cap_log` punched out never reached the server.
    let data = next_data(&f, acked)?.min(size);
    let marker = (data > acked).then(|| {
        let m = dropped_marker(data - acked);
        // Ending where the kept output starts, inside the dropped range: offsets stay
        // those of the file. A gap shorter than the marker keeps its tail.
        let fits = usize::try_from(data - acked)
            .unwrap_or(usize::MAX)
            .min(m.len());
        m[m.len() - fits..].to_owned()
    });
    let marker = marker.unwrap_or_default();
    let from = data;
    f.seek(SeekFrom::Start(from))?;
    let mut buf = Vec::new();
    f.take((size - from).min(LOG_CHUNK.saturating_sub(marker.len() as u64)))
        .read_to_end(&mut buf)?;
    let end = from + buf.len() as u64;
    if !(finished && end >= size) {
        buf.truncate(complete_utf8_prefix(&buf));
    }
    if buf.is_empty() && marker.is_empty() {
        return Ok((None, false));
    }
    let end = from + buf.len() as u64;
    let text = marker + &same_length_text(&buf);
    Ok((
        Some(LogPiece {
            offset: end - text.len() as u64,
            len: text.len() as u64,
            text,
        }),
        finished && end >= size,
    ))
}

/// The line that stands, in the log the server receives, for `bytes` of output the
/// node dropped before the server had them.
pub fn dropped_marker(bytes: u64) -> String {
    format!(
        "\n[tessera: {bytes} bytes of output dropped here: the workload wrote faster than \
         its log could be shipped, and the node keeps only the newest part]\n"
    )
}

/// The bytes allocated to `dir`'s tree, symlinks not followed, each inode once.
pub fn disk_usage(dir: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![dir.to_owned()];
    while let Some(p) = stack.pop() {
        let meta = fs::symlink_metadata(&p)?;
        if seen.insert((meta.dev(), meta.ino())) {
            total = total.saturating_add(meta.blocks() * 512);
        }
        if meta.is_dir() {
            for e in fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        }
    }
    Ok(total)
}

/// The first offset at or after `from` that holds data (`SEEK_DATA`): past the blocks
/// [`cap_log`] punched out. The file's end when only a hole follows.
#[allow(unsafe_code)]
fn next_data(f: &File, from: u64) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    let at = libc::off_t::try_from(from).map_err(io::Error::other)?;
    // SAFETY: lseek on a descriptor this function borrows; no memory is passed.
    let r = unsafe { libc::lseek(f.as_raw_fd(), at, libc::SEEK_DATA) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(u64::MAX),
            _ => Err(e),
        };
    }
    Ok(u64::try_from(r).unwrap_or(from))
}

/// Keeps at most about the newest `cap` bytes of the log at `path` on disk: punches
/// whole blocks out of its head, keeping its size (the workload's `O_APPEND` writes go
/// on at the end, and offsets do not move). Cheap when the file's blocks are within it.
#[allow(unsafe_code)]
pub fn cap_log(path: &Path, cap: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let f = match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let meta = f.metadata()?;
    let block = meta.blksize().max(512);
    if !meta.is_file() || meta.blocks() * 512 <= cap + block {
        return Ok(());
    }
    let end = meta.len().saturating_sub(cap) / block * block;
    if end == 0 {
        return Ok(());
    }
    let len = libc::off_t::try_from(end).map_err(io::Error::other)?;
    // SAFETY: fallocate on a descriptor this function owns; no memory is passed.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `b` as text of exactly `b.len()` bytes: each byte of an invalid sequence becomes `?`
/// (the server checks that a piece's `len` is its text's length, and offsets count
/// bytes of the file).
fn same_length_text(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    for chunk in b.utf8_chunks() {
        out.push_str(chunk.valid());
        out.extend(std::iter::repeat_n('?', chunk.invalid().len()));
    }
    out
}

/// The length of `b` without a multi-byte UTF-8 sequence cut off at its end.
pub fn complete_utf8_prefix(b: &[u8]) -> usize {
    let n = b.len();
    // The last lead byte is within the last 4 bytes of any well-formed tail.
    for back in 1..=n.min(4) {
        let i = n - back;
        let byte = b[i];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let need = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if back < need { i } else { n };
    }
    n
}

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3: `R`, `S`, `D`, `Z` (exited, not reaped yet), …
    pub state: char,
    /// Field 5: the process group id.
    pub pgrp: u32,
    /// Field 22: start time in clock ticks since boot.
    pub start_time: u64,
}

/// Parses a `/proc/<pid>/stat` line. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse_stat(s: &str) -> Option<ProcStat> {
    let rest = s.get(s.rfind(')')? + 1..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

fn read_stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn is_zombie(s: &ProcStat) -> bool {
    matches!(s.state, 'Z' | 'X' | 'x')
}

/// Whether `pid` is still the process that started at `start_time`, and has not exited.
fn is_alive(pid: u32, start_time: u64) -> bool {
    read_stat(pid).is_some_and(|s| s.start_time == start_time && !is_zombie(&s))
}

/// Process groups with at least one process that has not exited.
fn live_groups() -> HashSet<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return HashSet::new();
    };
    entries
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let s = read_stat(pid)?;
            (!is_zombie(&s)).then_some(s.pgrp)
        })
        .collect()
}

fn group_alive(pgid: u32) -> bool {
    live_groups().contains(&pgid)
}

/// Where a workload's deadline file lives on the node: in its control folder (mounted at
/// `/run/tessera` in the sandbox) or its run folder.
fn deadline_path(run: &Path, sandboxed: bool) -> PathBuf {
    if sandboxed {
        run.join("ctl").join("deadline")
    } else {
        run.join("deadline")
    }
}

/// Writes `path` in a folder its workload may write to: through a fresh file created
/// with O_EXCL (never through a link the workload planted) renamed over the name (a
/// rename replaces a planted link itself, not its target).
fn write_untrusted_dir(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".tessera-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    f.write_all(bytes)?;
    drop(f);
    fs::rename(&tmp, path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// Sends `signal` to every process of the group `pgid` but its leader (the exit-status
/// wrapper, a shell that a signal it does not trap would end).
fn signal_members(pgid: u32, signal: &str) {
    if !tessera_domain::drain::SIGNALS.contains(&signal) {
        tracing::warn!(signal, "unknown signal");
        return;
    }
    let Ok(entries) = fs::read_dir("/proc") else {
        return;
    };
    let members: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            pid != pgid && read_stat(pid).is_some_and(|s| s.pgrp == pgid && !is_zombie(&s))
        })
        .map(|pid| pid.to_string())
        .collect();
    if members.is_empty() {
        return;
    }
    let r = Command::new("/bin/sh")
        .args([
            "-c",
            r#"s=$1; shift; kill -s "$s" "$@""#,
            "tessera-kill",
            signal,
        ])
        .args(&members)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if let Err(e) = r {
        tracing::warn!(pgid, signal, error = %e, "cannot run kill");
    }
}

/// `kill -s <signal> -- -<pgid>` through the shell's built-in. Callers signal a group
/// only while its leader runs or members remain, so the id cannot have been reused.
fn signal_group(pgid: u32, signal: &str) {
    let r = Command::new("/bin/sh")
        .args(["-c", r#"kill -s "$1" -- "-$2""#, "tessera-kill", signal])
        .arg(pgid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match r {
        Ok(s) if s.success() => tracing::debug!(pgid, signal, "signalled the process group"),
        Ok(_) => tracing::debug!(pgid, signal, "no process left to signal"),
        Err(e) => tracing::warn!(pgid, signal, error = %e, "cannot run kill"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn safe_names() {
        for ok in ["a", "team-1", "0b6c.x_y", "...", "a..b"] {
            assert!(safe_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "/abs", "a b", "é", "a\0b", "../x"] {
            assert!(!safe_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let line = "4242 (we(ird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 \
                    1 0 987654 1000 10 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(ProcStat {
                state: 'S',
                pgrp: 4242,
                start_time: 987654
            })
        );
        assert_eq!(parse_stat("12 (x) S 1"), None);
        let own = read_stat(std::process::id()).unwrap();
        assert!(is_alive(std::process::id(), own.start_time));
        assert!(!is_alive(std::process::id(), own.start_time + 1));
    }

    #[test]
    fn invalid_bytes_keep_the_length() {
        for b in [
            &b"ok"[..],
            b"a\xff\xfeb",
            "é".as_bytes(),
            &"é".as_bytes()[..1],
            b"",
        ] {
            assert_eq!(same_length_text(b).len(), b.len(), "{b:?}");
        }
        assert_eq!(same_length_text(b"a\xffb"), "a?b");
    }

    #[test]
    fn utf8_tails_are_held_back() {
        let s = "aé€😀".as_bytes();
        assert_eq!(complete_utf8_prefix(s), s.len());
        // Cut inside 😀 (4 bytes), € (3 bytes), é (2 bytes).
        assert_eq!(complete_utf8_prefix(&s[..s.len() - 1]), s.len() - 4);
        assert_eq!(complete_utf8_prefix(&s[..s.len() - 3]), s.len() - 4);
        assert_eq!(complete_utf8_prefix(&s[..6 - 1]), 3);
        assert_eq!(complete_utf8_prefix(&s[..2]), 1);
        assert_eq!(complete_utf8_prefix(b""), 0);
        // Invalid bytes are not held forever: only a plausible cut sequence is.
        assert_eq!(complete_utf8_prefix(b"a\x80\x80\x80\x80"), 5);
        assert_eq!(complete_utf8_prefix(b"a\xff"), 2);
    }

    #[test]
    fn logs_are_read_from_the_ack_and_end_where_text_does() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.log");
        let (piece, complete) = read_log(&path, 0, false).unwrap();
        assert!(piece.is_none() && !complete);
        let mut bytes = b"hello ".to_vec();
        bytes.extend_from_slice(&"é".as_bytes()[..1]);
        fs::write(&path, &bytes).unwrap();
        let (piece, complete) = read_log(&path, 0, false).unwrap();
        let piece = piece.unwrap();
        assert_eq!(
            (piece.offset, piece.len, piece.text.as_str()),
            (0, 6, "hello ")
        );
        assert!(!complete);
        // Still running: the half character waits.
        let (piece, _) = read_log(&path, 6, false).unwrap();
        assert!(piece.is_none());
        // Exited: the end of the file goes out as it is.
        let (piece, complete) = read_log(&path, 6, true).unwrap();
        assert_eq!(piece.unwrap().text, "?");
        assert!(complete);
        let (piece, complete) = read_log(&path, 7, true).unwrap();
        assert!(piece.is_none() && complete);
        // Large logs go in chunks.
        fs::write(&path, vec![b'x'; LOG_CHUNK as usize + 10]).unwrap();
        let (piece, complete) = read_log(&path, 0, true).unwrap();
        assert_eq!(piece.unwrap().len, LOG_CHUNK);
        assert!(!complete);
        let (piece, complete) = read_log(&path, LOG_CHUNK, true).unwrap();
        assert_eq!(piece.unwrap().len, 10);
        assert!(complete);
    }

    #[test]
    fn a_log_beyond_its_cap_keeps_its_newest_output_and_says_what_was_dropped() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.log");
        let text: String = (0..20_000).map(|i| format!("line {i:06}\n")).collect();
        fs::write(&path, &text).unwrap();
        let cap = 64 * 1024;
        cap_log(&path, cap).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), text.len() as u64, "the size (and offsets) stay");
        assert!(
            meta.blocks() * 512 <= cap + 2 * meta.blksize(),
            "{} bytes on disk",
            meta.blocks() * 512
        );
        // From the start: the marker, then the newest output, up to the end.
        let (piece, complete) = read_log(&path, 0, true).unwrap();
        let piece = piece.unwrap();
        assert!(complete);
        assert_eq!(piece.offset + piece.len, text.len() as u64);
        assert_eq!(piece.len, piece.text.len() as u64);
        let kept = piece.text.split_once("part]\n").unwrap().1;
        let dropped = text.len() - kept.len();
        assert!(text.len() - dropped >= cap as usize - 4096, "{dropped}");
        assert_eq!(kept, &text[dropped..]);
        assert_eq!(piece.text, dropped_marker(dropped as u64) + kept);
        assert!(kept.ends_with("line 019999\n"));
        // Once the server has the marker, the rest reads as usual.
        let (piece, _) = read_log(&path, dropped as u64, true).unwrap();
        assert_eq!(piece.unwrap().text, kept);
        // A gap shorter than the marker keeps the marker's tail, and the offsets.
        let (piece, _) = read_log(&path, dropped as u64 - 3, true).unwrap();
        let piece = piece.unwrap();
        assert_eq!(piece.offset, dropped as u64 - 3);
        assert!(piece.text.starts_with("t]\n"), "{:?}", &piece.text[..10]);
        assert_eq!(&piece.text[3..], kept);
        // Under the cap, nothing is touched.
        let small = dir.path().join("small.log");
        fs::write(&small, "hello\n").unwrap();
        cap_log(&small, cap).unwrap();
        assert_eq!(
            read_log(&small, 0, true).unwrap().0.unwrap().text,
            "hello\n"
        );
        cap_log(&dir.path().join("missing.log"), cap).unwrap();
    }

    #[test]
    fn jupyter_answers_are_read() {
        assert_eq!(
            parse_time_ms("2026-11-23T18:00:00.123456Z"),
            Some(1_795_456_800_123)
        );
        assert_eq!(
            parse_time_ms("2026-11-23T19:00:00+01:00"),
            Some(1_795_456_800_000)
        );
        assert_eq!(parse_time_ms("yesterday"), None);
        let ks: serde_json::Value = serde_json::from_str(
            r#"[{"id":"a","execution_state":"idle"},{"id":"b","execution_state":"busy"}]"#,
        )
        .unwrap();
        assert!(kernels_busy(&ks));
        assert!(!kernels_busy(&serde_json::json!([])));
        assert!(!kernels_busy(&serde_json::Value::Null));
    }

    #[test]
    fn workdirs_stay_inside_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        fs::create_dir(ws.path().join("data")).unwrap();
        assert_eq!(workdir(ws.path(), "").unwrap(), ws.path());
        assert_eq!(workdir(ws.path(), "data/").unwrap(), ws.path().join("data"));
        assert_eq!(
            workdir(ws.path(), "nope").unwrap_err(),
            "folder `nope` does not exist in the team workspace"
        );
        assert!(workdir(ws.path(), "../").is_err());
        assert!(workdir(ws.path(), "/etc").is_err());
    }

    #[test]
    fn shares_get_their_limits_in_the_documented_formats() {
        assert_eq!(active_thread_percentage(1), 1);
        assert_eq!(active_thread_percentage(10), 1);
        assert_eq!(active_thread_percentage(11), 2);
        assert_eq!(active_thread_percentage(250), 25);
        assert_eq!(active_thread_percentage(333), 34);
        assert_eq!(active_thread_percentage(1000), 100);
        let share = ShareLimits {
            method: ShareMethod::Mps,
            gpu_uuid: "GPU-1".into(),
            milli: 250,
            memory_mib: 20_480,
        };
        let dirs = MpsDirs::under(Path::new("/s/mps"), "GPU-1");
        let env: BTreeMap<String, String> = share_env(&share, Some(&dirs))
            .into_iter()
            .map(|(k, v)| (k.into_string().unwrap(), v.into_string().unwrap()))
            .collect();
        assert_eq!(env["TESSERA_GPU_SHARE_METHOD"], "mps");
        assert_eq!(env["TESSERA_GPU_SHARE_MILLI"], "250");
        assert_eq!(env["TESSERA_GPU_MEMORY_MIB"], "20480");
        assert_eq!(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
        assert_eq!(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=20480M");
        assert_eq!(env["CUDA_MPS_PIPE_DIRECTORY"], "/s/mps/GPU-1/pipe");
        assert_eq!(env["CUDA_MPS_LOG_DIRECTORY"], "/s/mps/GPU-1/log");
        let sliced = ShareLimits {
            method: ShareMethod::TimeSlice,
            ..share.clone()
        };
        let names: Vec<OsString> = share_env(&sliced, None)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            names,
            [
                "TESSERA_GPU_SHARE_METHOD",
                "TESSERA_GPU_SHARE_MILLI",
                "TESSERA_GPU_MEMORY_MIB"
            ]
        );
    }

    #[test]
    fn a_share_names_its_gpu_alone() {
        let share = ShareLimits {
            method: ShareMethod::Mps,
            gpu_uuid: "GPU-1".into(),
            milli: 500,
            memory_mib: 1024,
        };
        let mut spec: WorkloadSpec = serde_json::from_value(serde_json::json!({
            "id": "a", "kind": "job", "run": true, "argv": ["true"], "env": [],
            "devices": [], "workspace": "t", "workdir": "", "token": null,
            "base_path": null, "allocation_id": ""
        }))
        .unwrap();
        assert_eq!(share_devices(&spec, &share).unwrap(), ["GPU-1"]);
        spec.devices = vec!["GPU-1".into()];
        assert_eq!(share_devices(&spec, &share).unwrap(), ["GPU-1"]);
        spec.devices = vec!["GPU-1".into(), "GPU-2".into()];
        assert!(share_devices(&spec, &share).is_err());
        spec.devices = vec![];
        for bad in [
            ShareLimits {
                milli: 0,
                ..share.clone()
            },
            ShareLimits {
                milli: 1001,
                ..share.clone()
            },
            ShareLimits {
                memory_mib: 0,
                ..share.clone()
            },
        ] {
            assert!(share_devices(&spec, &bad).is_err(), "{bad:?}");
        }
        let sliced_without_memory = ShareLimits {
            method: ShareMethod::TimeSlice,
            memory_mib: 0,
            ..share
        };
        assert!(share_devices(&spec, &sliced_without_memory).is_ok());
    }

    #[test]
    fn agent_variables_are_not_inherited() {
        for v in [
            "TESSERA_JOIN_TOKEN",
            "TESSERA_AGENT_STATE_DIR",
            "CUDA_VISIBLE_DEVICES",
            "CUDA_MPS_PIPE_DIRECTORY",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        ] {
            assert!(dropped_var(OsStr::new(v)), "{v}");
        }
        assert!(!dropped_var(OsStr::new("PATH")));
        assert!(!dropped_var(OsStr::new("MY_TESSERA_X")));
    }
}
