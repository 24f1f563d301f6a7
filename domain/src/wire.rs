//! What the node agent (`tessera-agent`) and the server say to each other.
//!
//! Plain serde values, shared by both ends so the JSON cannot drift. The
//! HTTP routes that carry them are documented in `agent/README.md`. Times
//! are unix milliseconds chosen by the sender (this crate has no clock);
//! quantities are integers (MiB, milliwatts, whole percent) so that nothing
//! downstream (billing, idle detection) has to reason about floats.

use serde::{Deserialize, Serialize};

/// `POST /agent/v1/register`: a node trades a one-time join token for a
/// long-lived node credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    pub join_token: String,
    pub hostname: String,
    pub agent_version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterResponse {
    pub node_id: String,
    /// Sent back as `Authorization: Bearer <credential>` on every later call.
    pub credential: String,
}

/// `POST /agent/v1/heartbeat`: the node's full inventory, sent on start and
/// then periodically.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub at_unix_ms: i64,
    pub agent_version: String,
    /// Whether the agent was started with `--manage-mig`; without it the
    /// agent only reports and never changes a GPU.
    pub manages_mig: bool,
    /// Whether the agent runs workloads in its sandbox (`--sandbox on`, the default).
    /// Absent from older agents, which had none.
    #[serde(default)]
    pub workload_sandbox: bool,
    pub inventory: Inventory,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub gpus: Vec<GpuInfo>,
    /// The node's NVIDIA driver (absent from older agents and where it cannot be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<DriverInfo>,
}

/// The NVIDIA driver a node runs: its version (`550.54.15`) and the newest CUDA it
/// supports (NVML `sys_driver_version`, `sys_cuda_driver_version`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverInfo {
    pub version: String,
    pub cuda: crate::image::CudaVersion,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigMode {
    Disabled,
    Enabled,
}

impl MigMode {
    pub fn as_str(self) -> &'static str {
        match self {
            MigMode::Disabled => "disabled",
            MigMode::Enabled => "enabled",
        }
    }

    /// `enabled` or `disabled`, as a GPU's desired state stores it.
    pub fn parse_stored(s: &str) -> Result<Self, crate::error::AppError> {
        match s {
            "enabled" => Ok(MigMode::Enabled),
            "disabled" => Ok(MigMode::Disabled),
            other => Err(crate::error::AppError::invalid(
                "mode",
                format!("unknown MIG mode {other}"),
            )),
        }
    }
}

/// `pending` differs from `current` while a mode change waits for a GPU
/// reset (Ampere) or a reboot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigModeState {
    pub current: MigMode,
    pub pending: MigMode,
}

/// One physical GPU as the driver reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The driver's enumeration index; may change across reboots, so the
    /// server keys GPUs by `uuid`.
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// Product name as the driver prints it, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    pub memory_mib: u64,
    /// `None` when the GPU is not MIG-capable.
    pub mig_mode: Option<MigModeState>,
    /// The GPU-instance profile table read from the device (IDs, names,
    /// slices, max counts, placements). Empty when not MIG-capable or not
    /// readable (`profiles_error` says why).
    pub profiles: Vec<ProfileInfo>,
    pub profiles_error: Option<String>,
    /// GPU instances present now, with their compute instances flattened in.
    pub instances: Vec<MigInstance>,
    /// How the agent shares this GPU, when the server asked for it to be shared
    /// ([`DesiredGpuState::sharing`]). Absent from older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<SharingState>,
    /// Error counters the agent read (absent from older agents, and where the driver
    /// cannot say). The server decides health from how they move ([`crate::health`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<GpuHealth>,
}

/// A GPU's error counters as the node reads them: NVML's critical Xid events (counted
/// since the agent started watching), volatile uncorrectable ECC errors, and pages or
/// rows waiting for retirement / remapping (a reset is due).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHealth {
    #[serde(default)]
    pub xid_count: u64,
    /// The last critical Xid's code (79: fallen off the bus, 48: double-bit ECC, …).
    #[serde(default)]
    pub last_xid: Option<u64>,
    #[serde(default)]
    pub ecc_uncorrected: u64,
    #[serde(default)]
    pub retirement_pending: bool,
}

/// How a GPU in shared mode is divided among its tenants (an admin's choice per GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareMethod {
    /// NVIDIA MPS: one control daemon per GPU, run and supervised by the agent; each
    /// workload is an MPS client limited to its compute share
    /// (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) and its memory share
    /// (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`).
    Mps,
    /// Time-slicing: tenants take turns on the whole GPU; no compute limit, and the
    /// memory share is only advertised to the workload (`TESSERA_GPU_MEMORY_MIB`).
    TimeSlice,
}

impl ShareMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            ShareMethod::Mps => "mps",
            ShareMethod::TimeSlice => "time_slice",
        }
    }

    pub fn parse(s: &str) -> Option<ShareMethod> {
        match s {
            "mps" => Some(ShareMethod::Mps),
            "time_slice" => Some(ShareMethod::TimeSlice),
            _ => None,
        }
    }

    /// [`parse`](Self::parse) for a stored value: an unknown one is an error.
    pub fn parse_stored(s: &str) -> Result<Self, crate::error::AppError> {
        Self::parse(s).ok_or_else(|| {
            crate::error::AppError::invalid("sharing", format!("unknown sharing method {s}"))
        })
    }
}

/// A shared GPU as the agent runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharingState {
    pub method: ShareMethod,
    /// Workloads can start on it: MIG is off and, for MPS, the control daemon answers.
    pub ready: bool,
    /// Why it is not ready (the MPS daemon's or the driver's error), or the last
    /// daemon failure if it was restarted since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// MPS: how many times the agent restarted the control daemon after it died.
    #[serde(default)]
    pub daemon_restarts: u32,
}

/// One row of a device's GPU-instance profile table, as read from the
/// driver. Deliberately its own type rather than the catalog's: the wire
/// format must not change when the planner's internals do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileInfo {
    /// NVML profile ID (`info.id`), not the `NVML_GPU_INSTANCE_PROFILE_*` index.
    pub id: u32,
    pub name: String,
    pub compute_slices: u8,
    pub memory_slices: u8,
    pub max_count: u8,
    pub memory_mib: u64,
    pub placements: Vec<PlacementInfo>,
}

/// `{start,size}` in memory slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PlacementInfo {
    pub start: u8,
    pub size: u8,
}

/// A GPU instance and (if it has one) its compute instance: one MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    pub profile_id: u32,
    /// Profile name such as `1g.10gb`; empty if the ID is not in the table.
    pub profile: String,
    /// Placement in memory slices.
    pub start: u8,
    pub size: u8,
    pub gi_id: u32,
    /// Compute instances inside this GPU instance. The agent creates exactly
    /// one full-size CI per GI; others may exist if someone else made them.
    pub compute_instances: Vec<ComputeInstanceInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeInstanceInfo {
    pub ci_id: u32,
    pub profile_id: u32,
    /// Whether the CI spans its whole GPU instance (C == G), the only kind
    /// the device plugin exposes.
    pub full_size: bool,
    /// `MIG-…`, stable for the lifetime of the instance. `None` if the driver
    /// could not report it.
    pub uuid: Option<String>,
    /// `None` when the driver could not say; the agent then treats the
    /// instance as busy and never destroys it.
    pub process_count: Option<u32>,
}

/// `GET /agent/v1/desired`: what the server wants on this node's GPUs.
/// GPUs that are not listed are left alone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredState {
    pub gpus: Vec<DesiredGpuState>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredGpuState {
    pub gpu_uuid: String,
    pub mode: MigMode,
    /// Must be empty when `mode` is `disabled`.
    pub layout: Vec<DesiredInstance>,
    /// `Some`: the GPU is shared (`mode` is then `disabled` and `layout` empty); with
    /// MPS the agent keeps its control daemon running. `None`: not shared (an MPS daemon
    /// the agent started for it is stopped once no workload uses it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<ShareMethod>,
    /// Increases whenever the server changes this GPU's desired state; every
    /// [`ApplyStatus`] names the version it is about.
    pub version: u64,
}

/// One GPU instance (with its full-size compute instance) at an explicit
/// placement.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DesiredInstance {
    pub profile: String,
    pub start: u8,
}

/// Apply state per GPU, named as mig-manager's `mig.config.state` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyState {
    /// Not converged and the agent is not (or not yet) changing anything:
    /// read-only agent, or a mode change waiting for a GPU reset.
    Pending,
    Applying,
    Success,
    Failed,
}

/// Why an apply failed, so the UI can tell "fix the plan" from "wait".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The layout can never be applied on this GPU (validator or driver said
    /// so, e.g. overlapping placements or an unknown profile).
    Impossible,
    /// Instances that would have to go still run processes; the agent waits.
    Busy,
    /// The GPU is gone (fell off the bus) or not on this node.
    GpuUnavailable,
    /// Any other driver error.
    Driver,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyError {
    pub kind: FailureKind,
    pub message: String,
}

/// `POST /agent/v1/status` carries a list of these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyStatus {
    pub gpu_uuid: String,
    /// The [`DesiredGpuState::version`] this status is about.
    pub version: u64,
    pub state: ApplyState,
    /// The step in progress or the one that failed, e.g. `destroy gi 3`.
    pub step: Option<String>,
    pub error: Option<ApplyError>,
    /// When failed or blocked: seconds until the agent tries again.
    pub retry_in_s: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    pub statuses: Vec<ApplyStatus>,
}

/// One telemetry sample of the whole node. `(node, seq)` is unique; the
/// server deduplicates on it, since the agent resends what was not acked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TelemetrySample {
    /// Per-agent sequence number, strictly increasing, starting at 1.
    pub seq: u64,
    pub at_unix_ms: i64,
    pub gpus: Vec<GpuSample>,
}

/// Metrics of one GPU. `None` means the driver cannot give the value (for
/// example GPU utilization while MIG is enabled); it is never made up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSample {
    pub gpu_uuid: String,
    pub memory_used_mib: Option<u64>,
    pub memory_total_mib: Option<u64>,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    /// Whole-GPU utilization; not available while MIG is enabled.
    pub utilization_pct: Option<u32>,
    pub mig_devices: Vec<MigDeviceSample>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigDeviceSample {
    pub mig_uuid: String,
    pub gi_id: u32,
    pub memory_used_mib: Option<u64>,
    pub memory_total_mib: Option<u64>,
    pub process_count: Option<u32>,
    /// SM utilization of the GPU instance (GPM, Hopper and newer only).
    pub sm_util_pct: Option<u32>,
}

/// `POST /agent/v1/telemetry`: oldest unacknowledged samples first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TelemetryBatch {
    pub samples: Vec<TelemetrySample>,
    /// Samples the agent had to drop, ever, because its spool was full.
    /// Never reset, so the server sees gaps are accounted for.
    pub dropped_total: u64,
}

/// Every sample with `seq <= acked_through` is stored (or was a duplicate);
/// the agent forgets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TelemetryAck {
    pub acked_through: u64,
}

/// Builds a domain model from the table the device reported, so the layout
/// is validated against what this GPU really offers.
pub fn model_from_profiles(
    name: &str,
    profiles: &[ProfileInfo],
) -> Result<crate::mig::GpuModel, String> {
    let memory_slices = profiles
        .iter()
        .flat_map(|p| {
            p.placements
                .iter()
                .map(|pl| pl.start.saturating_add(pl.size))
        })
        .max()
        .unwrap_or(0);
    let compute_slices = profiles.iter().map(|p| p.compute_slices).max().unwrap_or(0);
    let table = profiles
        .iter()
        .map(|p| crate::mig::Profile {
            id: p.id,
            name: p.name.clone(),
            compute_slices: p.compute_slices,
            memory_slices: p.memory_slices,
            max_count: p.max_count,
            placements: p
                .placements
                .iter()
                .map(|pl| crate::mig::Placement {
                    start: pl.start,
                    size: pl.size,
                })
                .collect(),
            memory_mib: p.memory_mib,
        })
        .collect();
    crate::mig::GpuModel::new(name, memory_slices, compute_slices, table).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------
// Workloads (`POST /agent/v1/workloads`): the agent reports what runs, the server answers
// with what should run. One round trip per round; the agent's process executor reconciles
// the answer like MIG layouts.
// ---------------------------------------------------------------------------------------

/// One workload the server wants on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    /// The workload's id (UUID); also its run folder's name on the node.
    pub id: String,
    pub kind: crate::workload::WorkloadKind,
    /// `false`: stop it (kill its process group) and report how it ended.
    pub run: bool,
    /// Program and arguments. `{port}` in any argument is replaced by the port the
    /// agent chose for it (notebooks).
    pub argv: Vec<String>,
    /// Extra environment (the agent adds `CUDA_VISIBLE_DEVICES`, `TESSERA_WORKSPACE`).
    pub env: Vec<crate::workload::EnvVar>,
    /// MIG or GPU UUIDs the process may see (`CUDA_VISIBLE_DEVICES`).
    pub devices: Vec<String>,
    /// The team workspace folder's name under the agent's workload root
    /// (`<root>/workspaces/<workspace>`), created when missing and shared by the team.
    pub workspace: String,
    /// Folder inside the workspace to start in ("" = the workspace itself).
    pub workdir: String,
    /// Notebooks: a secret the agent exports as `JUPYTER_TOKEN` and uses to probe
    /// `{base_path}api/status`; `None` for jobs.
    pub token: Option<String>,
    /// Notebooks: the URL path prefix the server listens under (`/user/{user}/{name}/`).
    pub base_path: Option<String>,
    /// The allocation it runs on (the Kubernetes executor labels its objects with it).
    #[serde(default)]
    pub allocation_id: String,
    /// What it asks a Kubernetes node for, one entry per device, named as NVIDIA's device
    /// plugin names them in its "mixed" strategy ([`crate::workload::device_resource`]).
    #[serde(default)]
    pub resources: Vec<String>,
    /// Set when it runs on a share of a shared GPU (`devices` is then that GPU): the
    /// limits the agent applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<ShareLimits>,
    /// Set once the workload must stop early (preemption, drain, its allocation's end):
    /// the agent signals it once with [`Deadline::signal`](crate::drain::Deadline) and
    /// writes the deadline file; at the deadline the server stops it (`run: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<crate::drain::Deadline>,
    /// Set when it runs in an OCI image instead of the node's own environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageSpec>,
    /// Set on each member of a gang job (issue 42): one workload per node of the gang.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<GangSpec>,
}

/// One member of a gang job. The member starts in two steps:
/// 1. While `peers` is `None`, the agent makes the member's sandbox (devices, network)
///    but starts no process; it reports phase `starting` with
///    [`WorkloadReport::gang_addr`], the address the member's processes will have.
/// 2. Once every member has reported its address, the server sends `peers` (and the
///    launch environment in [`WorkloadSpec::env`]: `MASTER_ADDR`, `RANK`, …). The agent
///    then lets the members reach each other (and nobody else reach them), writes the
///    hostfile, and starts the process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GangSpec {
    /// The gang's job (the workload id of rank 0, which the user sees as the job).
    pub job: String,
    /// This member's node rank (0 = the coordinator: `MASTER_ADDR` is its address).
    pub rank: u32,
    /// How many members (nodes) the gang has.
    pub size: u32,
    /// Who runs the command: every member, or only rank 0 (an `mpirun`-style launcher
    /// that starts the other members' processes through the gang's remote agent).
    #[serde(default)]
    pub launcher: GangLauncher,
    /// A secret shared by the gang's members only: the remote agent (`tessera-rsh`)
    /// accepts a command only with it.
    pub secret: String,
    /// The port the remote agent listens on in every member.
    pub rsh_port: u16,
    /// Every member (this one included), by rank, once all are ready; see above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<Vec<GangPeer>>,
}

/// Who runs a gang job's command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GangLauncher {
    /// Every member runs it (torchrun, JAX: each reads its rank from the environment).
    #[default]
    Each,
    /// Only rank 0 runs it (`mpirun --hostfile $TESSERA_HOSTFILE …`); the other members
    /// run the gang's remote agent and end when rank 0 ends.
    Rank0,
}

impl GangLauncher {
    pub fn as_str(self) -> &'static str {
        match self {
            GangLauncher::Each => "each",
            GangLauncher::Rank0 => "rank0",
        }
    }

    /// `each` or `rank0`; anything else is a 422 naming `launcher`.
    pub fn parse(s: &str) -> Result<Self, crate::error::AppError> {
        match s.trim() {
            "each" => Ok(GangLauncher::Each),
            "rank0" => Ok(GangLauncher::Rank0),
            other => Err(crate::error::AppError::invalid(
                "launcher",
                format!(
                    "`{other}` is not `each` (every node runs the command) or `rank0` (mpirun-style)"
                ),
            )),
        }
    }
}

/// A gang member as its peers see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GangPeer {
    pub rank: u32,
    /// The member's own address (its workload network's), which its processes listen on.
    pub addr: String,
    /// Its node's address (the agent's `--workload-host`): the route to `addr` from the
    /// other nodes.
    pub via: String,
    /// Processes it runs in an MPI hostfile (`addr slots=N`): its GPUs.
    pub slots: u32,
}

/// The image a workload runs in: pinned by digest, with the team's login to its
/// registry when the team has one (sent only for the workload's own team).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageSpec {
    /// `registry/repository@sha256:…`.
    pub reference: String,
    /// The CUDA version the image needs, when its config says (the server placed the
    /// workload on a node whose driver supports it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_cuda: Option<crate::image::CudaVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login: Option<RegistryLogin>,
}

impl std::fmt::Debug for ImageSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageSpec")
            .field("reference", &self.reference)
            .field("requires_cuda", &self.requires_cuda)
            .field("login", &self.login)
            .finish()
    }
}

/// A registry login. `Debug` never prints the password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryLogin {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for RegistryLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryLogin")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// How far an image pull for a workload has come (bytes of its layers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullProgress {
    pub done_bytes: u64,
    pub total_bytes: u64,
}

impl WorkloadSpec {
    /// A job that runs `argv` on `devices` in `workspace`, with nothing else set (tests,
    /// benches and tools build the rest with struct update syntax).
    pub fn job(id: &str, workspace: &str, devices: &[&str], argv: &[&str]) -> WorkloadSpec {
        WorkloadSpec {
            id: id.to_owned(),
            kind: crate::workload::WorkloadKind::Job,
            run: true,
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            env: Vec::new(),
            devices: devices.iter().map(|d| (*d).to_owned()).collect(),
            workspace: workspace.to_owned(),
            workdir: String::new(),
            token: None,
            base_path: None,
            allocation_id: String::new(),
            resources: Vec::new(),
            share: None,
            deadline: None,
            image: None,
            gang: None,
        }
    }
}

/// A workload's share of a shared GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareLimits {
    pub method: ShareMethod,
    /// `GPU-…`, the shared GPU.
    pub gpu_uuid: String,
    /// 1..=1000 milli-GPU: the compute share (MPS: `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`
    /// = ⌈milli / 10⌉).
    pub milli: u32,
    /// The memory share, `milli / 1000` of the GPU's memory (MPS:
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<memory_mib>M`).
    pub memory_mib: u64,
}

/// How a workload's process stands on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadPhase {
    /// The process runs; a notebook does not answer yet.
    Starting,
    /// The process runs (and a notebook answers its status probe).
    Running,
    /// The process ended; `exit_code` says how (`None`: killed by a signal).
    Exited,
    /// Could not be started (`message` says why).
    FailedToStart,
    /// The agent lost the process (gone without an exit status, e.g. after a reboot).
    Lost,
}

/// New output of a workload: `len` raw bytes of its log from byte `offset`, as text
/// (each byte of invalid UTF-8 replaced by `?`, so `len` is always `text.len()`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogPiece {
    pub offset: u64,
    pub len: u64,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadReport {
    pub id: String,
    pub phase: WorkloadPhase,
    pub exit_code: Option<i32>,
    pub message: Option<String>,
    /// Notebooks: `host:port` the server's proxy reaches it at.
    pub endpoint: Option<String>,
    /// Notebooks: Jupyter's `last_activity` (unix ms) from `api/status`.
    pub kernel_last_activity_ms: Option<i64>,
    /// Notebooks: whether a kernel is executing right now.
    #[serde(default)]
    pub kernel_busy: bool,
    /// Whether the log below reaches the end of the output of an exited process.
    #[serde(default)]
    pub log_complete: bool,
    pub log: Option<LogPiece>,
    /// While the workload's image is being pulled (phase `starting`, no process yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull: Option<PullProgress>,
    /// Gang members: the address the member's processes have (its workload network's, or
    /// the node's when workloads share the node's network), reported from the moment its
    /// sandbox is ready (see [`GangSpec`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang_addr: Option<String>,
    /// Gang members: the node's own address (the agent's `--workload-host`), the route
    /// to `gang_addr` from the other members' nodes ([`GangPeer::via`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang_via: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadReports {
    pub at_unix_ms: i64,
    pub workloads: Vec<WorkloadReport>,
}

/// How much of a workload's log the server holds: the agent sends from `stored_through`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogAck {
    pub id: String,
    pub stored_through: u64,
}

/// `GET /agent/v1/wait?epoch=…&generation=…&timeout_s=…`: a long poll that answers
/// when something changed for the node (its desired state, a workload to start or stop)
/// since the mark it sends (the last answer's `epoch` and `generation`; none on the
/// first call), or when `timeout_s` (at most [`MAX_WAIT_S`]; the server holds up to a fifth
/// less, at random, so polls begun together drift apart) runs out. After an answer
/// with `changed`, the agent fetches its desired state and syncs its workloads at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeMark {
    /// The answering server process (marks from another process never answer at once).
    pub epoch: String,
    pub generation: u64,
    pub changed: bool,
}

/// The longest a wait is held.
pub const MAX_WAIT_S: u64 = 25;

/// The server's answer to [`WorkloadReports`]: the full desired set (a workload not
/// listed is not wanted: the agent stops it and forgets it) and the log positions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadSync {
    pub workloads: Vec<WorkloadSpec>,
    pub log_acks: Vec<LogAck>,
    /// `tessera exec` sessions waiting for this node's agent (absent from older servers;
    /// ignored by older agents).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub execs: Vec<ExecRequest>,
}

/// A `tessera exec` session waiting for the agent: it opens
/// `GET /agent/v1/exec/{session}` as a WebSocket (node credential, and the session's
/// one-time `secret` in `X-Tessera-Exec-Secret`), then runs `argv` in the workload's
/// sandbox and streams it in [`exec_frame`]s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    pub session: String,
    pub secret: String,
    /// The workload (its run folder's name on the node).
    pub workload_id: String,
    pub argv: Vec<String>,
    /// Run it on a pseudo-terminal.
    pub tty: bool,
}

/// The frames of a `tessera exec` WebSocket (user ↔ server ↔ agent): binary messages
/// whose first byte is the channel and the rest its payload.
///
/// | byte | direction | payload |
/// |---|---|---|
/// | 0 | to the process | stdin bytes (an empty payload closes stdin) |
/// | 1 | from it | stdout bytes (with a TTY: the terminal's output) |
/// | 2 | from it | stderr bytes (also the server's and agent's own messages) |
/// | 3 | to it | a terminal resize, JSON `{"cols":80,"rows":24}` |
/// | 4 | from it | its exit, JSON `{"code":0}` (the last frame; `code` 128+n when killed by signal n) |
pub mod exec_frame {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Channel {
        Stdin = 0,
        Stdout = 1,
        Stderr = 2,
        Resize = 3,
        Exit = 4,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Resize {
        pub cols: u16,
        pub rows: u16,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Exit {
        pub code: i32,
    }

    /// The headers that ask for a WebSocket upgrade with `key` (RFC 6455 §4.1), as the CLI
    /// and the agent send them over plain HTTP clients.
    pub fn upgrade_headers(key: String) -> [(&'static str, String); 4] {
        [
            ("connection", "upgrade".into()),
            ("upgrade", "websocket".into()),
            ("sec-websocket-version", "13".into()),
            ("sec-websocket-key", key),
        ]
    }

    /// One frame: the channel byte, then `payload`.
    pub fn encode(channel: Channel, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(payload.len() + 1);
        v.push(channel as u8);
        v.extend_from_slice(payload);
        v
    }

    /// A frame's channel and payload; `None` for an empty frame or an unknown channel.
    pub fn decode(frame: &[u8]) -> Option<(Channel, &[u8])> {
        let (&c, rest) = frame.split_first()?;
        let channel = match c {
            0 => Channel::Stdin,
            1 => Channel::Stdout,
            2 => Channel::Stderr,
            3 => Channel::Resize,
            4 => Channel::Exit,
            _ => return None,
        };
        Some((channel, rest))
    }

    pub fn resize(cols: u16, rows: u16) -> Vec<u8> {
        encode(
            Channel::Resize,
            &serde_json::to_vec(&Resize { cols, rows }).unwrap_or_default(),
        )
    }

    /// The code an exit frame's payload carries (`None`: not an exit's JSON).
    pub fn exit_code(payload: &[u8]) -> Option<i32> {
        serde_json::from_slice::<Exit>(payload).ok().map(|e| e.code)
    }

    pub fn exit(code: i32) -> Vec<u8> {
        encode(
            Channel::Exit,
            &serde_json::to_vec(&Exit { code }).unwrap_or_default(),
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The server and the agent's README rely on these exact spellings.
    #[test]
    fn enums_serialize_in_snake_case() {
        let s = serde_json::to_string(&ApplyStatus {
            gpu_uuid: "GPU-1".into(),
            version: 3,
            state: ApplyState::Failed,
            step: None,
            error: Some(ApplyError {
                kind: FailureKind::GpuUnavailable,
                message: "lost".into(),
            }),
            retry_in_s: Some(5),
        })
        .unwrap();
        assert_eq!(
            s,
            r#"{"gpu_uuid":"GPU-1","version":3,"state":"failed","step":null,"error":{"kind":"gpu_unavailable","message":"lost"},"retry_in_s":5}"#
        );
    }

    #[test]
    fn desired_state_parses_from_the_documented_form() {
        let d: DesiredState = serde_json::from_str(
            r#"{"gpus":[{"gpu_uuid":"GPU-x","mode":"enabled","version":3,
                "layout":[{"profile":"3g.40gb","start":0},{"profile":"1g.10gb","start":6}]}]}"#,
        )
        .unwrap();
        assert_eq!(d.gpus[0].mode, MigMode::Enabled);
        assert_eq!(
            d.gpus[0].layout[1],
            DesiredInstance {
                profile: "1g.10gb".into(),
                start: 6
            }
        );
    }

    #[test]
    fn exec_frames_round_trip() {
        use exec_frame::{Channel, Exit, Resize, decode, encode};
        let f = encode(Channel::Stdin, b"ls\n");
        assert_eq!(f, b"\0ls\n");
        assert_eq!(decode(&f), Some((Channel::Stdin, &b"ls\n"[..])));
        assert_eq!(
            decode(&encode(Channel::Stderr, b"")),
            Some((Channel::Stderr, &b""[..]))
        );
        let frame = exec_frame::resize(120, 40);
        let (c, p) = decode(&frame).unwrap();
        assert_eq!(c, Channel::Resize);
        assert_eq!(
            serde_json::from_slice::<Resize>(p).unwrap(),
            Resize {
                cols: 120,
                rows: 40
            }
        );
        let frame = exec_frame::exit(7);
        let (c, p) = decode(&frame).unwrap();
        assert_eq!(c, Channel::Exit);
        assert_eq!(p, br#"{"code":7}"#);
        assert_eq!(serde_json::from_slice::<Exit>(p).unwrap().code, 7);
        assert_eq!(exec_frame::exit_code(p), Some(7));
        assert_eq!(exec_frame::exit_code(b"{}"), None);
        assert_eq!(decode(b""), None);
        assert_eq!(decode(b"\x09x"), None);
    }

    #[test]
    fn workload_sync_without_execs_parses() {
        let s: WorkloadSync = serde_json::from_str(r#"{"workloads":[],"log_acks":[]}"#).unwrap();
        assert!(s.execs.is_empty());
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"workloads":[],"log_acks":[]}"#
        );
    }
}
