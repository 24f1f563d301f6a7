//! The workload sandbox: every workload runs in a container of its own, made by an OCI
//! runtime (`crun`, from the distribution) from a bundle this module writes.
//!
//! What a workload gets (see `docs/security.md` for the whole model):
//! - an unprivileged uid/gid of its team (from a configured range, never 0), persisted in
//!   `<state>/uids.json`; `no_new_privs`; no capabilities at all;
//! - a root of its own: an empty read-only folder with the host's system folders
//!   (`/usr`, `/etc`, …) and the configured extra paths bound read-only, its team
//!   workspace read-write at `/workspace`, its run's control folder at `/run/tessera`
//!   and a private size-limited `/tmp`; nothing of the agent's state;
//! - its own PID, IPC, UTS and mount namespaces, and a network of its own
//!   ([`crate::network`]: its own loopback, an address of the node's range, nothing of
//!   the node or other workloads reachable; `--sandbox-network off` keeps the node's);
//! - cgroup limits on memory (swap included), CPU and pids, derived from its allocation's
//!   share of the node unless the node fixes them; explicit rlimits (`NOFILE`, `NPROC`
//!   per team uid, `CORE` 0) rather than the agent's;
//! - Docker's default syscall filter ([`crate::seccomp`]): no new namespaces (user
//!   namespaces included), no `keyctl`, `bpf`, `perf_event_open`, modules or clocks;
//! - a `/dev` with the usual pseudo-devices and only its own GPU's device nodes: the
//!   `/dev/nvidiaN` of its GPU plus `nvidiactl` and `nvidia-uvm*`, and for a MIG device
//!   the `nvidia-cap` nodes of its GPU instance and compute instance, as NVIDIA's
//!   container toolkit gives them. The device cgroup allows those and nothing else;
//! - on an MPS share of a GPU ([`crate::mps`]), that GPU's MPS pipe directory,
//!   read-write at its host path (and no other GPU's), and limits scaled to the share.
//!
//! A gang member (issue 42) also gets the agent's own executable, read-only, at
//! [`RSH_MOUNT`] (its remote agent, `tessera-rsh`): on a tmpfs of its own at `/opt`
//! (with the node's `/opt` entries bound read-only into it) or, in an image, at
//! `/opt/tessera`; its network may be made before its process starts
//! ([`Sandbox::make_network`], [`Extras::net`]). Its host name is `rank-<N>` rather
//! than `tessera`, and a hosts file naming every member at its gang address is bound
//! read-only over `/etc/hosts` ([`Names`]; in an image, only over one it has).
//!
//! The container's first process is the exit-status wrapper; when it ends, the PID
//! namespace ends and with it every process the workload left. The runtime's state
//! (`<state>/crun`) outlives an agent restart, so a restarted agent still stops,
//! inspects (out-of-memory kills) and deletes the containers it finds.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use serde_json::{Value, json};
use tessera_domain::wire::GpuInfo;

use crate::backend::{GpuBackend, inventory};
use crate::driver_files::{DriverFile, DriverFiles, NVIDIA_DIR};
use crate::network::{self, NetworkSettings, Slot};

/// Where the sandbox mounts things, inside.
pub const WORKSPACE_MOUNT: &str = "/workspace";
pub const CONTROL_MOUNT: &str = "/run/tessera";
/// Where a gang member finds its remote agent (the agent's executable, read-only).
pub const RSH_MOUNT: &str = "/opt/tessera/bin/tessera-rsh";
/// The folder of [`RSH_MOUNT`]'s tmpfs in an image.
const RSH_DIR_IN_IMAGE: &str = "/opt/tessera";

/// Host folders bound read-only into every sandbox when they exist.
pub const SYSTEM_PATHS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

/// The NVIDIA character devices' fixed major number (`/dev/nvidia0`, `/dev/nvidiactl`).
pub const NVIDIA_MAJOR: u32 = 195;
/// `/dev/nvidiactl`'s minor.
pub const NVIDIACTL_MINOR: u32 = 255;

/// How the node's sandboxes are made. See `tessera-agent --help`.
#[derive(Debug, Clone)]
pub struct SandboxSettings {
    /// The OCI runtime (`crun`).
    pub runtime: PathBuf,
    /// Extra host paths bound read-only (a Python installation, datasets, …).
    pub read_only: Vec<PathBuf>,
    /// The uids (and gids) teams get: `first..first + count`.
    pub uid_first: u32,
    pub uid_count: u32,
    /// Fixed per-workload limits; `None`: the allocation's share of the node.
    pub memory_mib: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: u64,
    /// Size of the private `/tmp` (and `/dev/shm`).
    pub tmp_mib: u64,
    /// `RLIMIT_NOFILE` (soft = hard) of every workload.
    pub nofile: u64,
    /// `RLIMIT_NPROC`: the kernel counts it per uid, so it bounds all the processes of
    /// one team on the node together (the pids cgroup bounds each workload).
    pub nproc: u64,
    /// Where the GPU device nodes are (`/dev`; a simulated node's own folder).
    pub dev_root: PathBuf,
    /// NVIDIA's MIG capability minors (`/proc/driver/nvidia-caps/mig-minors`).
    pub mig_minors: PathBuf,
    /// The kernel's device majors (`/proc/devices`), for `nvidia-caps`.
    pub proc_devices: PathBuf,
    /// A network namespace per workload; `None`: the node's own network (an explicit
    /// choice, logged loudly).
    pub network: Option<NetworkSettings>,
    /// The NVIDIA driver's user-space files, mounted read-only into image workloads that
    /// have a GPU ([`crate::driver_files`]); empty: none.
    pub driver_files: DriverFiles,
}

impl SandboxSettings {
    /// The defaults for a real node.
    pub fn new(runtime: PathBuf) -> SandboxSettings {
        SandboxSettings {
            runtime,
            read_only: Vec::new(),
            uid_first: 200_000,
            uid_count: 65_536,
            memory_mib: None,
            cpus: None,
            pids: 4096,
            tmp_mib: 1024,
            nofile: 65_536,
            nproc: 16_384,
            dev_root: PathBuf::from("/dev"),
            mig_minors: PathBuf::from("/proc/driver/nvidia-caps/mig-minors"),
            proc_devices: PathBuf::from("/proc/devices"),
            network: Some(NetworkSettings::new()),
            driver_files: DriverFiles::default(),
        }
    }

    /// Reads device nodes, `mig-minors` and `devices` from a simulated node's folder
    /// (`crate::sim::write_device_files`) instead of the driver's.
    pub fn simulated_devices(&mut self, dir: PathBuf) {
        self.mig_minors = dir.join("mig-minors");
        self.proc_devices = dir.join("devices");
        self.dev_root = dir;
    }
}

/// A device node as the container gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// The path inside the container, e.g. `/dev/nvidia-caps/nvidia-cap12`.
    pub path: String,
    pub major: u32,
    pub minor: u32,
    pub mode: u32,
}

/// Per-workload limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub memory_mib: u64,
    pub cpus: f64,
    pub pids: u64,
    pub tmp_mib: u64,
    /// `RLIMIT_NOFILE` and `RLIMIT_NPROC` (`RLIMIT_CORE` is always 0).
    pub nofile: u64,
    pub nproc: u64,
}

/// How cgroups are mounted on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    /// One unified hierarchy at `/sys/fs/cgroup`.
    V2,
    /// Per-controller v1 hierarchies under `/sys/fs/cgroup/<controller>` (possibly with
    /// an empty v2 hierarchy beside them).
    V1,
}

impl CgroupMode {
    /// Reads the host's layout; an error says what to change when the runtime cannot
    /// work with it (a hybrid host whose v2 hierarchy holds controllers).
    pub fn detect(root: &Path) -> Result<CgroupMode, String> {
        if root.join("cgroup.controllers").exists() {
            return Ok(CgroupMode::V2);
        }
        if !root.join("memory").join("memory.limit_in_bytes").exists() {
            return Err(format!(
                "no memory cgroup controller found under {}",
                root.display()
            ));
        }
        let unified = root.join("unified").join("cgroup.controllers");
        if let Ok(c) = fs::read_to_string(&unified) {
            let c = c.trim();
            if !c.is_empty() {
                return Err(format!(
                    "this host mounts cgroup v1 hierarchies and a v2 hierarchy that holds \
                     the controllers `{c}`; the runtime needs every controller on one side. \
                     Mount each as a v1 hierarchy (for each NAME: `mkdir -p {r}/NAME && \
                     mount -t cgroup -o NAME cgroup {r}/NAME`) or boot with \
                     systemd.unified_cgroup_hierarchy=1",
                    r = root.display()
                ));
            }
        }
        Ok(CgroupMode::V1)
    }

    /// The file that counts the container's out-of-memory kills, and the key in it.
    fn oom_file(self, root: &Path, cgroup: &str) -> PathBuf {
        let rel = cgroup.trim_start_matches('/');
        match self {
            CgroupMode::V2 => root.join(rel).join("memory.events"),
            CgroupMode::V1 => root.join("memory").join(rel).join("memory.oom_control"),
        }
    }
}

/// The per-node sandbox maker. Cheap to share; see the module docs.
pub struct Sandbox {
    settings: SandboxSettings,
    backend: Arc<dyn GpuBackend>,
    /// `<state>`: `rootfs/`, `crun/`, `uids.json`.
    state: PathBuf,
    cgroups: CgroupMode,
    host_memory_mib: u64,
    host_cpus: f64,
    /// `linux.seccomp` of every bundle ([`crate::seccomp`]).
    seccomp: Value,
    /// The agent's own hard `RLIMIT_NOFILE` and `RLIMIT_NPROC`: the runtime sets a
    /// container's rlimits without the privilege to raise them beyond these.
    hard_nofile: u64,
    hard_nproc: u64,
}

/// What a sandbox runs: a workload's process, as whom, where, with what it may reach.
#[derive(Clone, Copy)]
pub struct Process<'a> {
    /// The container's id.
    pub id: &'a str,
    /// The run folder (its bundle, control folder and log).
    pub run: &'a Path,
    /// The team's workspace, bound at [`WORKSPACE_MOUNT`].
    pub workspace: &'a Path,
    pub uid: u32,
    pub cwd: &'a str,
    pub argv: &'a [String],
    pub env: &'a [(OsString, OsString)],
    pub access: &'a Access<'a>,
}

/// What one workload may reach besides its workspace and run folder.
#[derive(Debug, Clone, Copy)]
pub struct Access<'a> {
    /// GPU or MIG UUIDs: their device nodes.
    pub devices: &'a [String],
    /// Host folders bound read-write at the same path inside (an MPS daemon's pipe
    /// directory); mounted after the private `/tmp`, so paths under `/tmp` work too.
    pub binds: &'a [PathBuf],
    /// The workload's share of its GPU (`None`: whole devices): its default memory and
    /// CPU limits are that fraction of a whole GPU's.
    pub gpu_fraction: Option<f64>,
    /// The port a notebook listens on: open to the node and the proxies.
    pub port: Option<u16>,
    /// An OCI image's unpacked root ([`crate::oci::Image::rootfs`]) to run in, read-only,
    /// instead of the node's system folders (`None`: the node's, as always). Its
    /// configuration is applied by the caller with [`image_argv`] and [`image_env`].
    pub image: Option<&'a Path>,
}

/// What an image runs: its `Entrypoint`, then the workload's command if it has one, else
/// the image's `Cmd` (docker's rule).
pub fn image_argv(config: &crate::oci::ImageConfig, command: &[String]) -> Vec<String> {
    let rest = if command.is_empty() {
        &config.cmd
    } else {
        command
    };
    config.entrypoint.iter().chain(rest).cloned().collect()
}

/// A workload's environment in an image: the image's `Env`, then the workload's own
/// variables over it, except `PATH` when the image sets one (the node's `PATH` names
/// folders the image does not have).
pub fn image_env(
    config: &crate::oci::ImageConfig,
    env: &[(OsString, OsString)],
) -> Vec<(OsString, OsString)> {
    let mut out: Vec<(OsString, OsString)> = config
        .env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .collect();
    for (k, v) in env {
        let image_has = out.iter().position(|(ik, _)| ik == k);
        match image_has {
            Some(_) if k == "PATH" => {}
            Some(i) => out[i].1 = v.clone(),
            None => out.push((k.clone(), v.clone())),
        }
    }
    out
}

/// The folders the sandbox mounts over in an image root; the image store makes them
/// plain directories in every root it unpacks, so the runtime never creates (or
/// follows) anything in a shared image.
pub const IMAGE_MOUNT_POINTS: &[&str] = &[
    "proc",
    "sys",
    "dev",
    "tmp",
    "workspace",
    "run/tessera",
    "usr/local/nvidia",
    "opt/tessera",
];

/// What the executor needs to handle one container after it started; kept in the run's
/// `state.json`, so an agent restarted (even without the sandbox) can still stop it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Container {
    runtime: PathBuf,
    root: PathBuf,
    id: String,
    oom_file: PathBuf,
    pub memory_mib: u64,
    /// Its network namespace, removed with it (`None`: the node's network).
    #[serde(default)]
    pub net: Option<Slot>,
}

/// What a gang member's container gets besides [`Access`] (default: nothing more).
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// Its network, made beforehand ([`Sandbox::make_network`]); `None`: made at start
    /// (when the node gives workloads networks of their own).
    pub net: Option<Slot>,
    /// The host file bound read-only at [`RSH_MOUNT`] (the agent's executable).
    pub rsh: Option<PathBuf>,
    /// Its host name and the file bound read-only over `/etc/hosts` (default: the
    /// host name `tessera` and the root's own `/etc/hosts`).
    pub names: Option<Names>,
}

/// A gang member's host name (`rank-<N>`) and its hosts file: a file of the run folder
/// (not visible inside) that names every member at its gang address, so that the host
/// name resolves to the member's own address (what gloo, NCCL and Open MPI advertise).
#[derive(Debug, Clone)]
pub struct Names {
    pub hostname: String,
    /// Bound read-only at `/etc/hosts`.
    pub hosts: PathBuf,
}

/// The host name of every workload without [`Names`].
pub const HOSTNAME: &str = "tessera";

/// What starting a sandboxed workload gives back.
pub struct Started {
    pub pid: u32,
    pub container: Container,
}

impl Sandbox {
    /// Checks the runtime and the host, and prepares `state` (mode 0700).
    pub fn open(
        settings: SandboxSettings,
        backend: Arc<dyn GpuBackend>,
        state: &Path,
    ) -> Result<Sandbox, String> {
        // `/proc/self` belongs to the process's effective uid.
        if fs::metadata("/proc/self").map_or(true, |m| m.uid() != 0) {
            return Err(
                "the workload sandbox needs the agent to run as root (it makes \
                        containers with their own users, mounts and cgroups)"
                    .to_owned(),
            );
        }
        let out = Command::new(&settings.runtime)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| {
                format!(
                    "cannot run the OCI runtime `{}` ({e}); install crun (`apt-get install \
                     crun`) or set --sandbox-runtime",
                    settings.runtime.display()
                )
            })?;
        if !out.status.success() {
            return Err(format!("`{} --version` failed", settings.runtime.display()));
        }
        if settings.uid_first == 0 || settings.uid_count == 0 {
            return Err("the sandbox uid range must not include 0 and not be empty".to_owned());
        }
        let cgroups = CgroupMode::detect(Path::new("/sys/fs/cgroup"))?;
        let mkdir = |p: &Path| -> Result<(), String> {
            fs::create_dir_all(p).map_err(|e| format!("cannot create {}: {e}", p.display()))
        };
        mkdir(state)?;
        fs::set_permissions(state, fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot protect {}: {e}", state.display()))?;
        let rootfs = state.join("rootfs");
        mkdir(&rootfs)?;
        fs::set_permissions(&rootfs, fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("cannot prepare {}: {e}", rootfs.display()))?;
        mkdir(&state.join("crun"))?;
        let seccomp = crate::seccomp::workload_filter()?;
        if let Some(net) = &settings.network {
            network::prepare(net)?;
        }
        let own = fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let hard = |name: &str| hard_limit(&own, name).unwrap_or(u64::MAX);
        let (hard_nofile, hard_nproc) = (hard("Max open files"), hard("Max processes"));
        if settings.nofile > hard_nofile || settings.nproc > hard_nproc {
            tracing::warn!(
                nofile = settings.nofile.min(hard_nofile),
                nproc = settings.nproc.min(hard_nproc),
                "the workloads' rlimits are lowered to the agent's own hard limits"
            );
        }
        Ok(Sandbox {
            seccomp,
            hard_nofile,
            hard_nproc,
            host_memory_mib: host_memory_mib().unwrap_or(4096),
            host_cpus: std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64),
            settings,
            backend,
            state: state.to_owned(),
            cgroups,
        })
    }

    pub fn cgroup_mode(&self) -> CgroupMode {
        self.cgroups
    }

    /// The NVIDIA driver's files mounted into image workloads with a GPU.
    pub fn driver_files(&self) -> &DriverFiles {
        &self.settings.driver_files
    }

    /// Whether workloads get a network of their own (else they share the node's).
    pub fn own_network(&self) -> bool {
        self.settings.network.is_some()
    }

    /// How workloads are networked, when they get networks of their own.
    pub fn network(&self) -> Option<&NetworkSettings> {
        self.settings.network.as_ref()
    }

    /// Makes a workload's network now (before [`Sandbox::start_with`]), with `port`
    /// open; `None` when workloads share the node's network. The caller removes it
    /// ([`network::remove`]) if the workload never starts.
    pub fn make_network(&self, port: Option<u16>) -> Result<Option<Slot>, String> {
        match &self.settings.network {
            Some(settings) => network::create(settings, port).map(Some),
            None => Ok(None),
        }
    }

    /// The uid (= gid) of a workspace, assigned on first use and kept.
    pub fn uid_for(&self, workspace: &str) -> Result<u32, String> {
        let path = self.state.join("uids.json");
        let mut map: BTreeMap<String, u32> = match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| format!("{} is damaged: {e}", path.display()))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        if let Some(uid) = map.get(workspace) {
            return Ok(*uid);
        }
        let uid = next_uid(&map, self.settings.uid_first, self.settings.uid_count)
            .ok_or("the sandbox uid range is used up; widen --sandbox-uids")?;
        map.insert(workspace.to_owned(), uid);
        let tmp = path.with_extension("tmp");
        let bytes = serde_json::to_vec_pretty(&map).map_err(|e| e.to_string())?;
        fs::write(&tmp, bytes)
            .and_then(|()| fs::rename(&tmp, &path))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(uid)
    }

    /// Gives the workspace folder to its team's uid (mode 0700). A folder that belonged
    /// to someone else (made before the sandbox) is handed over whole, once.
    pub fn own_workspace(&self, dir: &Path, uid: u32) -> Result<(), String> {
        let meta = fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
        if !meta.is_dir() {
            return Err("the team workspace is not a folder".to_owned());
        }
        if meta.uid() != uid {
            chown_tree(dir, uid).map_err(|e| format!("cannot hand the workspace over: {e}"))?;
        }
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(|e| e.to_string())
    }

    /// The device nodes for `devices` (GPU or MIG UUIDs) on this node.
    pub fn device_nodes(&self, devices: &[String]) -> Result<Vec<DeviceNode>, String> {
        if devices.is_empty() {
            return Ok(Vec::new());
        }
        let inv = inventory(self.backend.as_ref()).map_err(|e| e.to_string())?;
        let minors_of = self.backend.devices().map_err(|e| e.to_string())?;
        let gpu_minor = |uuid: &str| {
            minors_of
                .iter()
                .find(|d| d.uuid == uuid)
                .map(|d| d.minor)
                .ok_or_else(|| format!("GPU {uuid} is not on this node"))
        };
        let mig_minors = fs::read_to_string(&self.settings.mig_minors).unwrap_or_default();
        let caps = parse_mig_minors(&mig_minors);
        let mut wanted: Vec<PathBuf> = Vec::new();
        for d in devices {
            let (gpu, mig) = find_device(&inv.gpus, d)
                .ok_or_else(|| format!("device {d} is not on this node"))?;
            let minor = gpu_minor(&gpu.uuid)?;
            wanted.push(PathBuf::from(format!("nvidia{minor}")));
            if let Some((gi, ci)) = mig {
                for key in [
                    format!("gpu{minor}/gi{gi}/access"),
                    format!("gpu{minor}/gi{gi}/ci{ci}/access"),
                ] {
                    let cap = caps.get(&key).ok_or_else(|| {
                        format!(
                            "{} has no `{key}`: cannot give MIG device {d} its capabilities",
                            self.settings.mig_minors.display()
                        )
                    })?;
                    wanted.push(PathBuf::from(format!("nvidia-caps/nvidia-cap{cap}")));
                }
            }
        }
        for shared in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
            if self.settings.dev_root.join(shared).exists() {
                wanted.push(PathBuf::from(shared));
            }
        }
        wanted.sort();
        wanted.dedup();
        let caps_major = std::cell::OnceCell::new();
        wanted
            .iter()
            .map(|rel| match char_device(&self.settings.dev_root, rel) {
                Err(e) => self.cap_not_made_yet(rel, &caps_major).ok_or(e),
                ok => ok,
            })
            .collect()
    }

    /// A MIG capability node the driver has not made under `/dev` yet: at load it
    /// makes only `nvidia-cap1` (config) and `nvidia-cap2` (monitor), and NVIDIA's
    /// tools make the others on first use (`nvidia-modprobe -f`), as read on an H100
    /// and an H200. The container gets the node all the same, from the major the
    /// driver registered for `nvidia-caps` and the minor in `mig-minors`, read-only
    /// as the driver makes them; the host's `/dev` is left alone.
    /// `/proc/devices` is read at most once per call of [`Sandbox::device_nodes`].
    fn cap_not_made_yet(
        &self,
        rel: &Path,
        major: &std::cell::OnceCell<Option<u32>>,
    ) -> Option<DeviceNode> {
        let minor = rel
            .strip_prefix("nvidia-caps")
            .ok()?
            .to_str()?
            .strip_prefix("nvidia-cap")?
            .parse()
            .ok()?;
        if self.settings.dev_root.join(rel).exists() {
            return None;
        }
        let major = (*major
            .get_or_init(|| caps_major(&fs::read_to_string(&self.settings.proc_devices).ok()?)))?;
        Some(DeviceNode {
            path: Path::new("/dev").join(rel).to_string_lossy().into_owned(),
            major,
            minor,
            mode: 0o20444,
        })
    }

    /// The limits for a workload on `devices`: the node's fixed values, else the
    /// allocation's share of the node's memory and CPUs (never under 512 MiB and 1 CPU).
    pub fn limits(&self, devices: &[String]) -> Limits {
        self.limits_for(devices, 1.0)
    }

    /// [`Sandbox::limits`] for `fraction` of `devices` (a share of a GPU).
    pub fn limits_for(&self, devices: &[String], fraction: f64) -> Limits {
        let share = inventory(self.backend.as_ref())
            .map(|inv| device_share(&inv.gpus, devices) * fraction.clamp(0.0, 1.0))
            .unwrap_or(0.0);
        let s = &self.settings;
        Limits {
            memory_mib: s
                .memory_mib
                .unwrap_or_else(|| ((self.host_memory_mib as f64 * share) as u64).max(512)),
            cpus: s.cpus.unwrap_or_else(|| (self.host_cpus * share).max(1.0)),
            pids: s.pids,
            tmp_mib: s.tmp_mib,
            nofile: s.nofile.min(self.hard_nofile),
            nproc: s.nproc.min(self.hard_nproc),
        }
    }

    /// Writes the bundle into `run/bundle` and starts the container detached; its first
    /// process is `argv` (the exit-status wrapper), stdout and stderr go to `log`.
    pub fn start(&self, what: &Process<'_>, log: &File) -> Result<Started, String> {
        self.start_with(what, Extras::default(), log)
    }

    /// [`Sandbox::start`] with a gang member's [`Extras`]. A network given in `extras`
    /// becomes the container's (removed with it) once it started; when it does not
    /// start, that network stays the caller's to remove.
    pub fn start_with(
        &self,
        what: &Process<'_>,
        extras: Extras,
        log: &File,
    ) -> Result<Started, String> {
        let Process {
            id,
            run,
            workspace,
            uid,
            cwd,
            argv,
            env,
            access,
        } = *what;
        let nodes = self.device_nodes(access.devices)?;
        let limits = self.limits_for(access.devices, access.gpu_fraction.unwrap_or(1.0));
        let control = run.join("ctl");
        fs::create_dir_all(control.join("runtime"))
            .map_err(|e| format!("cannot create the run folder: {e}"))?;
        for d in [&control, &control.join("runtime")] {
            std::os::unix::fs::chown(d, Some(uid), Some(uid))
                .and_then(|()| fs::set_permissions(d, fs::Permissions::from_mode(0o700)))
                .map_err(|e| format!("cannot prepare the run folder: {e}"))?;
        }
        let cgroup = format!("/tessera/{id}");
        // A network made here goes with the container on failure; one given stays the
        // caller's until the container started.
        let given = extras.net;
        let net = match (&given, &self.settings.network) {
            (Some(_), _) => None,
            (None, Some(settings)) => Some(network::create(settings, access.port)?),
            (None, None) => None,
        };
        let netns = net.as_ref().or(given.as_ref()).map(Slot::netns_path);
        let own_root = self.state.join("rootfs");
        let spec = Bundle {
            rootfs: access.image.unwrap_or(&own_root),
            system: access.image.is_none(),
            // The driver's files: in an image (the node's own `/usr` has them) with a GPU.
            driver: if access.image.is_some() && !access.devices.is_empty() {
                &self.settings.driver_files.files
            } else {
                &[]
            },
            workspace,
            control: &control,
            read_only: &self.settings.read_only,
            binds: access.binds,
            uid,
            cwd,
            argv,
            env,
            nodes: &nodes,
            limits,
            cgroup: &cgroup,
            seccomp: &self.seccomp,
            netns: netns.as_deref(),
            rsh: extras.rsh.as_deref(),
            names: extras.names.as_ref(),
        }
        .config();
        let mut container = Container {
            runtime: self.settings.runtime.clone(),
            root: self.state.join("crun"),
            id: id.to_owned(),
            oom_file: self.cgroups.oom_file(Path::new("/sys/fs/cgroup"), &cgroup),
            memory_mib: limits.memory_mib,
            net,
        };
        let bundle = run.join("bundle");
        let written = fs::create_dir_all(&bundle)
            .and_then(|()| fs::set_permissions(&bundle, fs::Permissions::from_mode(0o700)))
            .and_then(|()| {
                fs::write(
                    bundle.join("config.json"),
                    serde_json::to_vec_pretty(&spec).map_err(io::Error::other)?,
                )
            });
        if let Err(e) = written {
            container.delete();
            return Err(format!("cannot write the bundle: {e}"));
        }
        // A container of that name left from an earlier try would block this one.
        container.delete_runtime();
        let pid_file = bundle.join("pid");
        let (stderr, stdout) = match (log.try_clone(), log.try_clone()) {
            (Ok(e), Ok(o)) => (e, o),
            (Err(e), _) | (_, Err(e)) => {
                container.delete();
                return Err(e.to_string());
            }
        };
        let status = Command::new(&self.settings.runtime)
            .arg("--root")
            .arg(&container.root)
            .args(["run", "--detach", "--bundle"])
            .arg(&bundle)
            .arg("--pid-file")
            .arg(&pid_file)
            .arg(id)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .status()
            .map_err(|e| format!("cannot run `{}`: {e}", self.settings.runtime.display()))?;
        if !status.success() {
            container.delete();
            let said = fs::read_to_string(run.join("output.log")).unwrap_or_default();
            let said = said
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            return Err(format!(
                "the sandbox did not start: {}: {said}",
                self.settings.runtime.display()
            ));
        }
        let pid = fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or("the sandbox started but left no pid")?;
        if given.is_some() {
            container.net = given;
        }
        Ok(Started { pid, container })
    }

    /// The handle of a container this agent (or an earlier run of it) started (its
    /// network, if any, is not known to it).
    pub fn container(&self, id: &str, memory_mib: u64) -> Container {
        Container {
            runtime: self.settings.runtime.clone(),
            root: self.state.join("crun"),
            id: id.to_owned(),
            oom_file: self
                .cgroups
                .oom_file(Path::new("/sys/fs/cgroup"), &format!("/tessera/{id}")),
            memory_mib,
            net: None,
        }
    }
}

impl Container {
    /// Sends `signal` to every process of the container.
    pub fn signal(&self, signal: &str) {
        let r = self
            .runtime_cmd()
            .args(["kill", "--all", &self.id, signal])
            .status();
        match r {
            Ok(s) if s.success() => tracing::debug!(id = self.id, signal, "signalled"),
            Ok(_) => tracing::debug!(id = self.id, signal, "no container process to signal"),
            Err(e) => tracing::warn!(id = self.id, error = %e, "cannot run the OCI runtime"),
        }
    }

    /// Whether the kernel killed a process of it for reaching its memory limit.
    pub fn oom_killed(&self) -> bool {
        fs::read_to_string(&self.oom_file).is_ok_and(|s| oom_kills(&s) > 0)
    }

    /// Removes the container (and its cgroup) and its network once it has ended.
    pub fn delete(&self) {
        self.delete_runtime();
        if let Some(net) = &self.net {
            network::remove(net);
        }
    }

    /// Removes the container and its cgroup only.
    fn delete_runtime(&self) {
        let _ = self
            .runtime_cmd()
            .args(["delete", "--force", &self.id])
            .status();
    }

    /// What `crun exec` needs: the runtime, its state root and the container's id.
    pub fn exec_parts(&self) -> (&Path, &Path, &str) {
        (&self.runtime, &self.root, &self.id)
    }

    /// The workload's own address, when it has a network of its own.
    pub fn address(&self) -> Option<std::net::Ipv4Addr> {
        self.net.as_ref().map(|n| n.addr)
    }

    fn runtime_cmd(&self) -> Command {
        let mut c = Command::new(&self.runtime);
        c.arg("--root")
            .arg(&self.root)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }
}

/// The OCI runtime configuration of one workload.
struct Bundle<'a> {
    rootfs: &'a Path,
    /// Bind the node's system folders and `read_only` (not in an image's root).
    system: bool,
    /// Bound read-only on a tmpfs at [`NVIDIA_DIR`] (image workloads with a GPU).
    driver: &'a [DriverFile],
    workspace: &'a Path,
    control: &'a Path,
    read_only: &'a [PathBuf],
    /// Read-write at the same path, after everything else.
    binds: &'a [PathBuf],
    uid: u32,
    cwd: &'a str,
    argv: &'a [String],
    env: &'a [(OsString, OsString)],
    nodes: &'a [DeviceNode],
    limits: Limits,
    cgroup: &'a str,
    seccomp: &'a Value,
    /// The network namespace to join (`None`: the node's).
    netns: Option<&'a Path>,
    /// A gang member's remote agent, bound read-only at [`RSH_MOUNT`].
    rsh: Option<&'a Path>,
    /// A gang member's host name and hosts file.
    names: Option<&'a Names>,
}

impl Bundle<'_> {
    fn config(&self) -> Value {
        let bind = |dest: &str, src: &Path, rw: bool| {
            let mut options = vec!["rbind", "nosuid", "nodev"];
            options.push(if rw { "rw" } else { "ro" });
            json!({"destination": dest, "type": "bind", "source": src, "options": options})
        };
        let tmpfs = |dest: &str, options: &[&str]| json!({"destination": dest, "type": "tmpfs", "source": "tmpfs", "options": options});
        let tmp_size = format!("size={}m", self.limits.tmp_mib);
        let mut mounts = vec![
            json!({"destination": "/proc", "type": "proc", "source": "proc"}),
            tmpfs(
                "/dev",
                &["nosuid", "strictatime", "mode=755", "size=65536k"],
            ),
            json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
                   "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
            tmpfs(
                "/dev/shm",
                &["nosuid", "noexec", "nodev", "mode=1777", &tmp_size],
            ),
            json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
                   "options": ["nosuid", "noexec", "nodev"]}),
            json!({"destination": "/sys", "type": "bind", "source": "/sys",
                   "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]}),
        ];
        for p in SYSTEM_PATHS
            .iter()
            .map(Path::new)
            .chain(self.read_only.iter().map(PathBuf::as_path))
            .filter(|_| self.system)
        {
            if self.rsh.is_some() && p == Path::new("/opt") {
                // A folder of its own for the remote agent (the node's `/opt` is bound
                // read-only, where no mount point can be made): a tmpfs with the
                // node's entries bound into it.
                mounts.push(tmpfs("/opt", &["nosuid", "nodev", "mode=755", "size=64k"]));
                let mut entries: Vec<PathBuf> = fs::read_dir(p)
                    .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
                    .unwrap_or_default();
                entries.sort();
                for e in entries.iter().filter(|e| !e.ends_with("tessera")) {
                    if let Some(dest) = e.to_str() {
                        mounts.push(bind(dest, e, false));
                    }
                }
                continue;
            }
            if p.exists()
                && let Some(dest) = p.to_str()
            {
                mounts.push(bind(dest, p, false));
            }
        }
        if let Some(rsh) = self.rsh {
            if !self.system {
                // The image store makes this mount point in every image root.
                mounts.push(tmpfs(
                    RSH_DIR_IN_IMAGE,
                    &["nosuid", "nodev", "mode=755", "size=64k"],
                ));
            }
            mounts.push(
                json!({"destination": RSH_MOUNT, "type": "bind", "source": rsh,
                               "options": ["bind", "ro", "nosuid", "nodev"]}),
            );
        }
        if !self.driver.is_empty() {
            // A folder of its own (the image root is shared and read-only): the runtime
            // makes each file's mount point in this tmpfs, root's and 0755.
            mounts.push(tmpfs(
                NVIDIA_DIR,
                &["nosuid", "nodev", "mode=755", "size=64k"],
            ));
            for f in self.driver {
                mounts.push(
                    json!({"destination": f.dest, "type": "bind", "source": f.host,
                                   "options": ["bind", "ro", "nosuid", "nodev"]}),
                );
            }
        }
        if let Some(names) = self.names {
            // Over the node's `/etc/hosts` (bound read-only with `/etc`), or over an
            // image's own. An image without a regular `/etc/hosts` keeps none: its root
            // is shared and read-only, and the runtime would have to create the mount
            // point in it (the image store makes folders only); the host name then does
            // not resolve there, as in every other workload.
            let target = if self.system {
                Path::new("/etc/hosts").is_file()
            } else {
                fs::symlink_metadata(self.rootfs.join("etc/hosts")).is_ok_and(|m| m.is_file())
            };
            if target {
                mounts.push(
                    json!({"destination": "/etc/hosts", "type": "bind", "source": names.hosts,
                           "options": ["bind", "ro", "nosuid", "nodev", "noexec"]}),
                );
            }
        }
        mounts.push(bind(WORKSPACE_MOUNT, self.workspace, true));
        mounts.push(bind(CONTROL_MOUNT, self.control, true));
        mounts.push(tmpfs("/tmp", &["nosuid", "nodev", "mode=1777", &tmp_size]));
        for b in self.binds {
            if let Some(dest) = b.to_str() {
                mounts.push(bind(dest, b, true));
            }
        }

        let env: Vec<String> = self
            .env
            .iter()
            .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy()))
            .collect();
        let mut devices = Vec::new();
        let mut allow = vec![json!({"allow": false, "access": "rwm"})];
        // The pseudo-devices every container has: null, zero, full, random, urandom,
        // tty, ptmx and the pseudo-terminals.
        for (major, minor) in [(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2)] {
            allow.push(json!({"allow": true, "type": "c", "major": major, "minor": minor, "access": "rwm"}));
        }
        allow.push(json!({"allow": true, "type": "c", "major": 136, "access": "rwm"}));
        for n in self.nodes {
            devices.push(
                json!({"path": n.path, "type": "c", "major": n.major, "minor": n.minor,
                                "fileMode": n.mode & 0o777, "uid": 0, "gid": 0}),
            );
            allow.push(json!({"allow": true, "type": "c", "major": n.major, "minor": n.minor, "access": "rw"}));
        }
        let memory = self.limits.memory_mib * 1024 * 1024;
        let period: u64 = 100_000;
        let mut namespaces = vec![
            json!({"type": "pid"}),
            json!({"type": "ipc"}),
            json!({"type": "uts"}),
            json!({"type": "mount"}),
        ];
        if let Some(path) = self.netns {
            namespaces.push(json!({"type": "network", "path": path}));
        }
        json!({
            "ociVersion": "1.0.0",
            "process": {
                "terminal": false,
                "user": {"uid": self.uid, "gid": self.uid, "additionalGids": []},
                "args": self.argv,
                "env": env,
                "cwd": self.cwd,
                "capabilities": {"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []},
                "noNewPrivileges": true,
                "rlimits": [
                    {"type": "RLIMIT_NOFILE", "soft": self.limits.nofile, "hard": self.limits.nofile},
                    {"type": "RLIMIT_NPROC", "soft": self.limits.nproc, "hard": self.limits.nproc},
                    {"type": "RLIMIT_CORE", "soft": 0, "hard": 0}
                ]
            },
            "root": {"path": self.rootfs, "readonly": true},
            "hostname": self.names.map_or(HOSTNAME, |n| n.hostname.as_str()),
            "mounts": mounts,
            "linux": {
                "namespaces": namespaces,
                "devices": devices,
                "cgroupsPath": self.cgroup,
                "seccomp": self.seccomp,
                "resources": {
                    "devices": allow,
                    "memory": {"limit": memory, "swap": memory},
                    "cpu": {"quota": (self.limits.cpus * period as f64) as i64, "period": period},
                    "pids": {"limit": self.limits.pids}
                },
                "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
                    "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
                    "/proc/sched_debug", "/sys/firmware", "/proc/scsi", "/sys/fs/cgroup"],
                "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
            }
        })
    }
}

/// `(gpu, Some((gi, ci)))` for a MIG device's UUID, `(gpu, None)` for a whole GPU's.
fn find_device<'a>(gpus: &'a [GpuInfo], uuid: &str) -> Option<(&'a GpuInfo, Option<(u32, u32)>)> {
    for g in gpus {
        if g.uuid == uuid {
            return Some((g, None));
        }
        for i in &g.instances {
            for ci in &i.compute_instances {
                if ci.uuid.as_deref() == Some(uuid) {
                    return Some((g, Some((i.gi_id, ci.ci_id))));
                }
            }
        }
    }
    None
}

/// The share of the node that `devices` are: a whole GPU counts 1, a MIG device its
/// memory slices out of 8; divided by the node's GPU count.
pub fn device_share(gpus: &[GpuInfo], devices: &[String]) -> f64 {
    if gpus.is_empty() {
        return 0.0;
    }
    let mut sum = 0.0;
    for d in devices {
        match find_device(gpus, d) {
            Some((_, None)) => sum += 1.0,
            Some((g, Some((gi, _)))) => {
                let size = g
                    .instances
                    .iter()
                    .find(|i| i.gi_id == gi)
                    .map_or(1, |i| i.size);
                sum += f64::from(size) / 8.0;
            }
            None => {}
        }
    }
    (sum / gpus.len() as f64).min(1.0)
}

/// `/proc/driver/nvidia-caps/mig-minors`: `gpu0/gi1/ci0/access 13` lines as a map.
pub fn parse_mig_minors(text: &str) -> BTreeMap<String, u32> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(char::is_whitespace)?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

/// The character-device major registered for `nvidia-caps` in `/proc/devices`.
pub fn caps_major(proc_devices: &str) -> Option<u32> {
    proc_devices
        .lines()
        .skip_while(|l| !l.starts_with("Character devices"))
        .take_while(|l| !l.starts_with("Block devices"))
        .find_map(|l| {
            let (major, name) = l.trim().split_once(' ')?;
            if name.trim() == "nvidia-caps" {
                major.parse().ok()
            } else {
                None
            }
        })
}

/// What NVIDIA's driver writes to `mig-minors`: `config 1`, `monitor 2`, then for each
/// GPU minor `g` and GPU instance `i` (0..15) its access minor `3 + 135g + 9i`, followed
/// by its compute instances `c` (0..8) at `+ 1 + c`. The simulator writes this table for
/// its GPUs; on hardware the driver's own file is read, never this.
pub fn mig_minors_table(gpu_minors: &[u32]) -> String {
    let mut out = String::from("config 1\nmonitor 2\n");
    for &g in gpu_minors {
        for i in 0..15 {
            let gi = 3 + 135 * g + 9 * i;
            out.push_str(&format!("gpu{g}/gi{i}/access {gi}\n"));
            for c in 0..8 {
                out.push_str(&format!("gpu{g}/gi{i}/ci{c}/access {}\n", gi + 1 + c));
            }
        }
    }
    out
}

/// The hard limit on the line `name` of `/proc/<pid>/limits` (`unlimited`: `u64::MAX`).
pub fn hard_limit(limits: &str, name: &str) -> Option<u64> {
    let rest = limits.lines().find_map(|l| l.strip_prefix(name))?;
    match rest.split_whitespace().nth(1)? {
        "unlimited" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}

/// The `oom_kill` count of a v1 `memory.oom_control` or v2 `memory.events`.
pub fn oom_kills(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// The device node at `dev_root/rel`, as `/dev/rel` inside.
fn char_device(dev_root: &Path, rel: &Path) -> Result<DeviceNode, String> {
    let host = dev_root.join(rel);
    let meta = fs::metadata(&host).map_err(|e| format!("device {}: {e}", host.display()))?;
    use std::os::unix::fs::FileTypeExt;
    if !meta.file_type().is_char_device() {
        return Err(format!("{} is not a character device", host.display()));
    }
    let rdev = meta.rdev();
    Ok(DeviceNode {
        path: Path::new("/dev").join(rel).to_string_lossy().into_owned(),
        major: dev_major(rdev),
        minor: dev_minor(rdev),
        mode: meta.mode(),
    })
}

/// glibc's `major()` and `minor()` of a `dev_t`.
pub fn dev_major(rdev: u64) -> u32 {
    (((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff)) as u32
}
pub fn dev_minor(rdev: u64) -> u32 {
    ((rdev & 0xff) | ((rdev >> 12) & !0xff)) as u32
}

/// Makes the character device `path` (`mknod`), replacing what is there.
pub fn make_char_device(path: &Path, major: u32, minor: u32, mode: u32) -> io::Result<()> {
    let _ = fs::remove_file(path);
    let st = Command::new("mknod")
        .arg("-m")
        .arg(format!("{:o}", mode & 0o777))
        .arg(path)
        .arg("c")
        .arg(major.to_string())
        .arg(minor.to_string())
        .stdin(Stdio::null())
        .status()?;
    if !st.success() {
        return Err(io::Error::other(format!("mknod {} failed", path.display())));
    }
    Ok(())
}

fn next_uid(map: &BTreeMap<String, u32>, first: u32, count: u32) -> Option<u32> {
    let used: std::collections::HashSet<u32> = map.values().copied().collect();
    (first..first.saturating_add(count)).find(|u| !used.contains(u))
}

/// `chown -hR uid:uid dir`, never following a symlink.
fn chown_tree(dir: &Path, uid: u32) -> io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(uid))?;
    let meta = fs::symlink_metadata(dir)?;
    if meta.is_dir() {
        for e in fs::read_dir(dir)? {
            chown_tree(&e?.path(), uid)?;
        }
    }
    Ok(())
}

fn host_memory_mib() -> Option<u64> {
    let s = fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024)
}

/// Reads a small file the workload could have tampered with: never follows a symlink,
/// never blocks on a FIFO, reads at most 64 bytes of a regular file.
pub fn read_untrusted(path: &Path) -> Option<String> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut s = String::new();
    f.take(64).read_to_string(&mut s).ok()?;
    Some(s)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::sim::SimNode;

    /// The seccomp profile the bundle tests pass: everything denied.
    fn deny_all() -> Value {
        json!({"defaultAction": "SCMP_ACT_ERRNO"})
    }

    /// Run `r1` of team `t1` on the node's root, with nothing extra: each bundle test
    /// changes the fields it looks at.
    fn plain_bundle(seccomp: &Value) -> Bundle<'_> {
        Bundle {
            rootfs: Path::new("/state/rootfs"),
            system: true,
            driver: &[],
            workspace: Path::new("/state/workspaces/t1"),
            control: Path::new("/state/runs/r1/ctl"),
            read_only: &[],
            binds: &[],
            uid: 200_001,
            cwd: "/workspace",
            argv: &[],
            env: &[],
            nodes: &[],
            limits: Limits {
                memory_mib: 512,
                cpus: 1.0,
                pids: 100,
                tmp_mib: 64,
                nofile: 1024,
                nproc: 200,
            },
            cgroup: "/tessera/r1",
            seccomp,
            netns: None,
            rsh: None,
            names: None,
        }
    }

    #[test]
    fn mig_minors_follow_the_driver_layout() {
        let t = parse_mig_minors(&mig_minors_table(&[0, 1]));
        assert_eq!(t["config"], 1);
        assert_eq!(t["monitor"], 2);
        assert_eq!(t["gpu0/gi0/access"], 3);
        assert_eq!(t["gpu0/gi0/ci0/access"], 4);
        assert_eq!(t["gpu0/gi0/ci7/access"], 11);
        assert_eq!(t["gpu0/gi1/access"], 12);
        assert_eq!(t["gpu0/gi14/ci7/access"], 137);
        assert_eq!(t["gpu1/gi0/access"], 138);
        assert_eq!(t.len(), 2 + 2 * 15 * 9);
        assert!(parse_mig_minors("garbage\nx y\n").is_empty());
        // Read on an H100 (driver 580.159.04): 4,322 lines, for 32 GPU minors.
        let real = parse_mig_minors(&mig_minors_table(&(0..32).collect::<Vec<_>>()));
        assert_eq!(real.len(), 4322);
        for (key, minor) in [
            ("gpu0/gi1/access", 12),
            ("gpu0/gi14/ci4/access", 134),
            ("gpu0/gi14/ci7/access", 137),
            ("gpu1/gi0/access", 138),
            ("gpu1/gi0/ci1/access", 140),
        ] {
            assert_eq!(real[key], minor, "{key}");
        }
    }

    #[test]
    fn the_caps_major_is_read_from_proc_devices() {
        // Excerpt of an H100 node's /proc/devices (driver 580.159.04).
        let real = "Character devices:\n  1 mem\n136 pts\n195 nvidia\n195 nvidiactl\n\
                    238 nvidia-uvm\n241 nvidia-caps\n242 nvidia-caps-imex-channels\n\n\
                    Block devices:\n  7 loop\n";
        assert_eq!(caps_major(real), Some(241));
        assert_eq!(
            caps_major("Character devices:\n  1 mem\n\nBlock devices:\n 99 nvidia-caps\n"),
            None
        );
        assert_eq!(caps_major(""), None);
    }

    #[test]
    fn oom_counters_are_read_from_both_cgroup_versions() {
        assert_eq!(
            oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"),
            2
        );
        assert_eq!(
            oom_kills("low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\noom_group_kill 0\n"),
            1
        );
        assert_eq!(oom_kills("oom_kill_disable 0\n"), 0);
    }

    #[test]
    fn hard_limits_are_read_from_proc() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max core file size        0                    unlimited            bytes     \n\
                      Max processes             96551                96551                processes \n\
                      Max open files            20000                20000                files     \n";
        assert_eq!(hard_limit(limits, "Max open files"), Some(20_000));
        assert_eq!(hard_limit(limits, "Max processes"), Some(96_551));
        assert_eq!(hard_limit(limits, "Max core file size"), Some(u64::MAX));
        assert_eq!(hard_limit(limits, "Max locked memory"), None);
    }

    #[test]
    fn device_numbers_split_like_glibc() {
        // makedev(195, 0) and makedev(511, 300): minor bits 8.. sit above the major.
        assert_eq!((dev_major(0xc300), dev_minor(0xc300)), (195, 0));
        let d: u64 = (1 << 20) | (0x1ff << 8) | 0x2c;
        assert_eq!((dev_major(d), dev_minor(d)), (511, 300));
    }

    #[test]
    fn uids_are_never_reused_or_zero() {
        let mut m = BTreeMap::new();
        assert_eq!(next_uid(&m, 1000, 2), Some(1000));
        m.insert("a".into(), 1000);
        assert_eq!(next_uid(&m, 1000, 2), Some(1001));
        m.insert("b".into(), 1001);
        assert_eq!(next_uid(&m, 1000, 2), None);
    }

    #[test]
    fn untrusted_files_are_read_safely() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("exit");
        fs::write(&f, "0123456789".repeat(20)).unwrap();
        assert_eq!(read_untrusted(&f).unwrap().len(), 64);
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert_eq!(read_untrusted(&link), None, "symlinks are not followed");
        assert_eq!(read_untrusted(d.path()), None, "folders are not files");
    }

    #[test]
    fn shares_follow_the_devices() {
        let sim = SimNode::new(&["H100-80GB", "H100-80GB"], 1).unwrap();
        let inv = inventory(&sim).unwrap();
        // No instances yet: whole GPUs.
        let g0 = inv.gpus[0].uuid.clone();
        assert_eq!(device_share(&inv.gpus, std::slice::from_ref(&g0)), 0.5);
        assert_eq!(device_share(&inv.gpus, &["MIG-nope".into()]), 0.0);
    }

    #[test]
    fn an_mps_pipe_directory_is_bound_read_write_at_its_path_after_tmp() {
        let pipe = vec![PathBuf::from("/tmp/state/mps/GPU-1/pipe")];
        let seccomp = deny_all();
        let b = Bundle {
            binds: &pipe,
            netns: Some(Path::new("/run/netns/tsr-7")),
            ..plain_bundle(&seccomp)
        };
        let c = b.config();
        let mounts = c["mounts"].as_array().unwrap();
        let dests: Vec<&str> = mounts
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        let tmp = dests.iter().position(|d| *d == "/tmp").unwrap();
        let at = dests
            .iter()
            .position(|d| *d == "/tmp/state/mps/GPU-1/pipe")
            .unwrap();
        assert!(
            at > tmp,
            "inside the private /tmp, not hidden by it: {dests:?}"
        );
        assert_eq!(mounts[at]["source"], "/tmp/state/mps/GPU-1/pipe");
        assert!(
            mounts[at]["options"]
                .as_array()
                .unwrap()
                .iter()
                .any(|o| o == "rw")
        );
    }

    #[test]
    fn an_image_is_the_read_only_root_and_no_node_folder_is_bound() {
        let ro = vec![PathBuf::from("/")];
        let driver = [DriverFile {
            host: PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            dest: "/usr/local/nvidia/lib64/libcuda.so.1".into(),
        }];
        let seccomp = deny_all();
        let b = Bundle {
            rootfs: Path::new("/images/roots/abc/rootfs"),
            system: false,
            driver: &driver,
            read_only: &ro,
            cwd: "/work",
            ..plain_bundle(&seccomp)
        };
        let c = b.config();
        assert_eq!(
            c["root"],
            json!({"path": "/images/roots/abc/rootfs", "readonly": true})
        );
        assert_eq!(c["process"]["user"]["uid"], 200_001);
        let binds: Vec<&str> = c["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["type"] == "bind")
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        assert_eq!(
            binds,
            [
                "/sys",
                "/usr/local/nvidia/lib64/libcuda.so.1",
                WORKSPACE_MOUNT,
                CONTROL_MOUNT
            ]
        );
        // The driver's files: read-only, on a tmpfs of their own over the image's folder.
        let mounts = c["mounts"].as_array().unwrap();
        let at = |dest: &str| {
            mounts
                .iter()
                .position(|m| m["destination"] == dest)
                .unwrap()
        };
        let lib = &mounts[at("/usr/local/nvidia/lib64/libcuda.so.1")];
        assert_eq!(lib["source"], "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
        assert!(lib["options"].as_array().unwrap().iter().any(|o| o == "ro"));
        assert_eq!(mounts[at(NVIDIA_DIR)]["type"], "tmpfs");
        assert!(at(NVIDIA_DIR) < at("/usr/local/nvidia/lib64/libcuda.so.1"));
        for dest in ["/proc", "/dev", "/tmp", NVIDIA_DIR] {
            let bare = dest.trim_start_matches('/');
            assert!(IMAGE_MOUNT_POINTS.contains(&bare), "{dest}");
        }
    }

    #[test]
    fn an_image_config_gives_the_command_and_environment() {
        let config = crate::oci::ImageConfig {
            env: vec![
                "PATH=/opt/conda/bin:/bin".into(),
                "LANG=C.UTF-8".into(),
                "BROKEN".into(),
            ],
            entrypoint: vec!["/bin/entry".into()],
            cmd: vec!["serve".into(), "--port=1".into()],
            ..Default::default()
        };
        assert_eq!(
            image_argv(&config, &[]),
            ["/bin/entry", "serve", "--port=1"]
        );
        assert_eq!(
            image_argv(&config, &["train.py".into()]),
            ["/bin/entry", "train.py"]
        );
        let plain = crate::oci::ImageConfig {
            cmd: vec!["/bin/sh".into()],
            ..Default::default()
        };
        assert_eq!(image_argv(&plain, &["python".into()]), ["python"]);
        let os = |s: &str| OsString::from(s);
        let env = image_env(
            &config,
            &[
                (os("PATH"), os("/usr/bin")),
                (os("LANG"), os("de_DE")),
                (os("TOKEN"), os("t")),
            ],
        );
        assert_eq!(
            env,
            [
                (os("PATH"), os("/opt/conda/bin:/bin")),
                (os("LANG"), os("de_DE")),
                (os("TOKEN"), os("t")),
            ]
        );
    }

    #[test]
    fn the_bundle_holds_only_what_the_workload_may_have() {
        let nodes = vec![
            DeviceNode {
                path: "/dev/nvidia0".into(),
                major: 195,
                minor: 0,
                mode: 0o20666,
            },
            DeviceNode {
                path: "/dev/nvidia-caps/nvidia-cap30".into(),
                major: 236,
                minor: 30,
                mode: 0o20444,
            },
        ];
        let env = vec![(OsString::from("A"), OsString::from("b"))];
        let argv = vec!["/bin/sh".to_owned(), "-c".to_owned(), "true".to_owned()];
        let ro = vec![PathBuf::from("/nonexistent-extra")];
        let seccomp = deny_all();
        let mut b = Bundle {
            read_only: &ro,
            argv: &argv,
            env: &env,
            nodes: &nodes,
            netns: Some(Path::new("/run/netns/tsr-7")),
            ..plain_bundle(&seccomp)
        };
        b.limits.cpus = 1.5;
        let c = b.config();
        assert_eq!(c["process"]["user"]["uid"], 200_001);
        assert_eq!(c["process"]["noNewPrivileges"], true);
        assert_eq!(
            c["process"]["rlimits"],
            json!([
                {"type": "RLIMIT_NOFILE", "soft": 1024, "hard": 1024},
                {"type": "RLIMIT_NPROC", "soft": 200, "hard": 200},
                {"type": "RLIMIT_CORE", "soft": 0, "hard": 0}
            ])
        );
        assert_eq!(c["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(c["process"]["capabilities"]["bounding"], json!([]));
        assert_eq!(c["root"]["readonly"], true);
        assert_eq!(c["process"]["env"], json!(["A=b"]));
        let ns: Vec<&str> = c["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap())
            .collect();
        assert!(ns.contains(&"pid") && ns.contains(&"mount") && ns.contains(&"network"));
        assert_eq!(c["linux"]["namespaces"][4]["path"], "/run/netns/tsr-7");
        let r = &c["linux"]["resources"];
        assert_eq!(r["memory"]["limit"], 512 * 1024 * 1024);
        assert_eq!(r["cpu"]["quota"], 150_000);
        assert_eq!(r["pids"]["limit"], 100);
        // Deny everything, then the pseudo-devices and exactly the two nodes.
        let rules = r["devices"].as_array().unwrap();
        assert_eq!(rules[0], json!({"allow": false, "access": "rwm"}));
        let gpu_rules: Vec<(u64, u64)> = rules
            .iter()
            .filter(|r| {
                r["allow"] == true && r["major"] != 1 && r["major"] != 5 && r["major"] != 136
            })
            .map(|r| (r["major"].as_u64().unwrap(), r["minor"].as_u64().unwrap()))
            .collect();
        assert_eq!(gpu_rules, vec![(195, 0), (236, 30)]);
        assert_eq!(c["linux"]["devices"][1]["fileMode"], 0o444);
        // Writable: the workspace, the control folder and the private tmpfs only.
        let rw: Vec<&str> = c["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| {
                m["type"] == "bind" && m["options"].as_array().unwrap().iter().any(|o| o == "rw")
            })
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        assert_eq!(rw, vec![WORKSPACE_MOUNT, CONTROL_MOUNT]);
        assert!(
            c["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m["destination"] != "/nonexistent-extra"),
            "missing extra paths are skipped"
        );
    }

    #[test]
    fn a_gang_member_gets_the_remote_agent_read_only_on_a_folder_of_its_own() {
        let exe = Path::new("/usr/local/bin/tessera-agent");
        let seccomp = deny_all();
        let bundle = |system: bool, rsh: Option<&'static Path>| {
            Bundle {
                system,
                rsh,
                ..plain_bundle(&seccomp)
            }
            .config()
        };
        let mounts = |c: &Value| c["mounts"].as_array().unwrap().clone();
        let at = |ms: &[Value], dest: &str| ms.iter().position(|m| m["destination"] == dest);
        for system in [true, false] {
            let ms = mounts(&bundle(
                system,
                Some(Path::new("/usr/local/bin/tessera-agent")),
            ));
            let rsh = at(&ms, RSH_MOUNT).unwrap();
            assert_eq!(ms[rsh]["source"], exe.to_str().unwrap());
            let opts = ms[rsh]["options"].as_array().unwrap();
            assert!(opts.iter().any(|o| o == "ro") && !opts.iter().any(|o| o == "rw"));
            // Its folder is a tmpfs mounted before it, never the node's `/opt` itself.
            let dir = if system { "/opt" } else { RSH_DIR_IN_IMAGE };
            let tmp = at(&ms, dir).unwrap();
            assert_eq!(ms[tmp]["type"], "tmpfs");
            assert!(tmp < rsh);
            if system && Path::new("/opt").is_dir() {
                // The node's `/opt` entries, read-only inside it.
                for e in fs::read_dir("/opt").unwrap() {
                    let p = e.unwrap().path();
                    let m = &ms[at(&ms, p.to_str().unwrap()).unwrap()];
                    assert!(m["options"].as_array().unwrap().iter().any(|o| o == "ro"));
                }
            }
        }
        assert!(IMAGE_MOUNT_POINTS.contains(&RSH_DIR_IN_IMAGE.trim_start_matches('/')));
        // Other workloads: the node's `/opt` bound as always, no remote agent.
        let plain = mounts(&bundle(true, None));
        assert!(at(&plain, RSH_MOUNT).is_none());
        if Path::new("/opt").exists() {
            assert_eq!(plain[at(&plain, "/opt").unwrap()]["type"], "bind");
        }
    }

    #[test]
    fn a_gang_member_gets_its_host_name_and_hosts_file_read_only_over_etc_hosts() {
        let image = tempfile::tempdir().unwrap();
        let seccomp = deny_all();
        let names = Names {
            hostname: "rank-3".into(),
            hosts: PathBuf::from("/state/runs/r1/hosts"),
        };
        let config = |system: bool, names: Option<&Names>| {
            Bundle {
                rootfs: if system {
                    Path::new("/state/rootfs")
                } else {
                    image.path()
                },
                system,
                names,
                ..plain_bundle(&seccomp)
            }
            .config()
        };
        let hosts_at = |c: &Value| {
            c["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .position(|m| m["destination"] == "/etc/hosts")
        };
        // On the node's root: after `/etc`, read-only, from the run folder.
        let c = config(true, Some(&names));
        assert_eq!(c["hostname"], "rank-3");
        if Path::new("/etc/hosts").is_file() {
            let ms = c["mounts"].as_array().unwrap();
            let at = hosts_at(&c).unwrap();
            assert_eq!(ms[at]["source"], "/state/runs/r1/hosts");
            let opts = ms[at]["options"].as_array().unwrap();
            assert!(opts.iter().any(|o| o == "ro") && !opts.iter().any(|o| o == "rw"));
            let etc = ms.iter().position(|m| m["destination"] == "/etc").unwrap();
            assert!(etc < at);
        }
        // Other workloads: `tessera` and the root's own `/etc/hosts`.
        let plain = config(true, None);
        assert_eq!(plain["hostname"], HOSTNAME);
        assert!(hosts_at(&plain).is_none());
        // An image: only over an `/etc/hosts` it has (never a mount point made in it).
        let c = config(false, Some(&names));
        assert_eq!(c["hostname"], "rank-3");
        assert!(hosts_at(&c).is_none());
        fs::create_dir(image.path().join("etc")).unwrap();
        fs::write(image.path().join("etc/hosts"), "").unwrap();
        assert!(hosts_at(&config(false, Some(&names))).is_some());
    }
}
