//! A simulated node: GPUs that follow the driver's MIG rules, for tests and
//! for `tessera-agent --simulate`.
//!
//! Profile IDs, names and placements come from the domain catalog
//! ([`Catalog::builtin`]), so the simulator shows what NVML shows on that
//! model. It enforces what NVML enforces (mig.md §1.3, §2):
//! - a GPU instance must use one of its profile's placements
//!   (`InvalidArgument` otherwise) and must not overlap another or exceed the
//!   profile's count (`InsufficientResources`);
//! - destroying a compute instance with processes, or a GPU instance that
//!   still has compute instances, is `InUse`;
//! - a MIG mode change needs an idle GPU with no instances; it stays pending
//!   until a reset on Ampere and applies at once (but does not survive a
//!   reboot) on Hopper and newer;
//! - a reboot or reset removes every instance; MIG UUIDs are stable for an
//!   instance's lifetime and derived from the node's seed.
//!
//! Faults can be injected: one failing call, a "crash" after a budget of
//! calls (every later call fails with [`ErrorKind::Crashed`] until
//! [`SimNode::revive`]), and a GPU falling off the bus.
//!
//! [`SimNode`] is a cheap handle to shared state: clone it to give the same
//! "hardware" to a second agent after the first one died. GI IDs are assigned
//! lowest-free from 1, which need not match what a real driver picks; nothing
//! in the agent depends on GI IDs beyond their identity.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tessera_domain::image::CudaVersion;
use tessera_domain::mig::{Catalog, GpuModel};
use tessera_domain::wire::{
    ComputeInstanceInfo, DriverInfo, GpuHealth, GpuSample, MigDeviceSample, MigInstance, MigMode,
    MigModeState, PlacementInfo, ProfileInfo,
};

use crate::backend::{
    BackendError, ComputeInstanceId, ComputeMode, Device, ErrorKind, GpuBackend, GpuInstanceAt,
    ModeChange,
};

/// Memory of a simulated GPU that is not MIG-capable.
const NON_MIG_MEMORY_MIB: u64 = 49_152;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error(
        "unknown GPU model {0:?}: use a catalog model (e.g. A100-SXM4-40GB, H100-80GB) or nomig:<name>"
    )]
    UnknownModel(String),
    #[error("no simulated GPU or MIG device with UUID {0}")]
    NoSuchDevice(String),
    #[error("no simulated process {0}")]
    NoSuchProcess(u32),
    #[error("GPU {0} is busy")]
    Busy(String),
}

/// Ampere keeps MIG mode across reboots and needs a reset to apply a change;
/// Hopper and newer apply at once and forget it on reboot (mig.md §2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Ampere,
    HopperOrNewer,
}

/// A simulated process, attached to a whole GPU or to one MIG device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pid(pub u32);

#[derive(Debug, Clone)]
struct Proc {
    gpu: usize,
    /// `None`: on the whole GPU (MIG disabled); else `(gi, ci)`.
    on: Option<(u32, u32)>,
    memory_mib: u64,
}

#[derive(Debug, Clone)]
struct Ci {
    profile_id: u32,
    uuid: String,
}

#[derive(Debug, Clone)]
struct Gi {
    profile_id: u32,
    start: u8,
    size: u8,
    cis: BTreeMap<u32, Ci>,
}

#[derive(Debug, Clone)]
struct Gpu {
    index: u32,
    uuid: String,
    name: String,
    arch: Arch,
    /// `None` for a GPU that is not MIG-capable.
    model: Option<GpuModel>,
    memory_mib: u64,
    current: MigMode,
    pending: MigMode,
    lost: bool,
    gis: BTreeMap<u32, Gi>,
    compute_mode: ComputeMode,
}

#[derive(Debug)]
struct State {
    seed: u64,
    gpus: Vec<Gpu>,
    procs: BTreeMap<Pid, Proc>,
    next_pid: u32,
    uuid_counter: u64,
    calls: u64,
    /// `Some(n)`: n more calls succeed, then every call is `Crashed`.
    crash_budget: Option<u64>,
    injected: Vec<(&'static str, ErrorKind)>,
    /// Destroy calls aimed at an instance with processes (refused, but counted:
    /// a correct agent never makes one).
    busy_destroy_attempts: u64,
    /// Where the GPUs' compute modes are published for the simulator's processes
    /// ([`SimNode::publish_driver_state`]).
    driver_dir: Option<PathBuf>,
    /// The driver the node reports ([`SimNode::set_driver`]).
    driver: DriverInfo,
}

/// The simulated driver's version unless set ([`SimNode::set_driver`]).
pub const SIM_DRIVER_VERSION: &str = "550.54.15";
/// The CUDA version the simulated driver supports unless set.
pub const SIM_CUDA: CudaVersion = CudaVersion {
    major: 12,
    minor: 4,
};

/// Handle to a simulated node. Clones share the same GPUs.
#[derive(Debug, Clone)]
pub struct SimNode {
    state: Arc<Mutex<State>>,
}

/// Expands 64 bits of seed into a well-mixed word (splitmix64).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fake_uuid(prefix: &str, seed: u64, salt: u64) -> String {
    let a = mix(seed ^ mix(salt));
    let b = mix(a ^ salt.rotate_left(17));
    format!(
        "{prefix}-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// The full-size compute-instance profile index for a GI of `g` compute
/// slices (`NVML_COMPUTE_INSTANCE_PROFILE_*`); the simulator uses the index
/// as the ID, which matches what nvidia-smi shows for full-size CIs.
fn full_ci_profile(g: u8) -> u32 {
    match g {
        1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        7 => 4,
        8 => 5,
        6 => 6,
        _ => u32::from(g),
    }
}

fn to_profile_info(model: &GpuModel) -> Vec<ProfileInfo> {
    model
        .profiles()
        .iter()
        .map(|p| ProfileInfo {
            id: p.id,
            name: p.name.clone(),
            compute_slices: p.compute_slices,
            memory_slices: p.memory_slices,
            max_count: p.max_count,
            memory_mib: p.memory_mib,
            placements: p
                .placements
                .iter()
                .map(|pl| PlacementInfo {
                    start: pl.start,
                    size: pl.size,
                })
                .collect(),
        })
        .collect()
}

fn overlaps(a_start: u8, a_size: u8, b_start: u8, b_size: u8) -> bool {
    u16::from(a_start) < u16::from(b_start) + u16::from(b_size)
        && u16::from(b_start) < u16::from(a_start) + u16::from(a_size)
}

impl SimNode {
    /// A node with one GPU per model name. Names are looked up in the domain
    /// catalog (aliases such as `H100-SXM5-80GB` work; the catalog's models without
    /// MIG, such as `T4-16GB`, report no MIG mode); `nomig:<name>` gives a GPU without
    /// MIG support that the catalog does not know.
    pub fn new<S: AsRef<str>>(models: &[S], seed: u64) -> Result<SimNode, SimError> {
        let catalog = Catalog::builtin();
        let mut gpus = Vec::new();
        for (i, m) in models.iter().enumerate() {
            let m = m.as_ref().trim();
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            let uuid = fake_uuid("GPU", seed, u64::from(index));
            let gpu = if let Some(name) = m.strip_prefix("nomig:") {
                Gpu {
                    index,
                    uuid,
                    name: format!("NVIDIA {name}"),
                    arch: Arch::HopperOrNewer,
                    model: None,
                    memory_mib: NON_MIG_MEMORY_MIB,
                    current: MigMode::Disabled,
                    pending: MigMode::Disabled,
                    lost: false,
                    gis: BTreeMap::new(),
                    compute_mode: ComputeMode::Default,
                }
            } else {
                let model = catalog
                    .get(m)
                    .ok_or_else(|| SimError::UnknownModel(m.to_owned()))?
                    .clone();
                // A catalog model without MIG (T4, L4, A10): what the driver shows for one.
                if !model.has_mig() {
                    gpus.push(Gpu {
                        index,
                        uuid,
                        name: format!("NVIDIA {}", model.name()),
                        arch: Arch::HopperOrNewer,
                        model: None,
                        memory_mib: model.memory_mib(),
                        current: MigMode::Disabled,
                        pending: MigMode::Disabled,
                        lost: false,
                        gis: BTreeMap::new(),
                        compute_mode: ComputeMode::Default,
                    });
                    continue;
                }
                let arch = if model.name().starts_with('A') {
                    Arch::Ampere
                } else {
                    Arch::HopperOrNewer
                };
                let memory_mib = model
                    .profiles()
                    .iter()
                    .map(|p| p.memory_mib)
                    .max()
                    .unwrap_or(0);
                Gpu {
                    index,
                    uuid,
                    name: format!("NVIDIA {}", model.name()),
                    arch,
                    model: Some(model),
                    memory_mib,
                    current: MigMode::Disabled,
                    pending: MigMode::Disabled,
                    lost: false,
                    gis: BTreeMap::new(),
                    compute_mode: ComputeMode::Default,
                }
            };
            gpus.push(gpu);
        }
        Ok(SimNode {
            state: Arc::new(Mutex::new(State {
                seed,
                gpus,
                procs: BTreeMap::new(),
                next_pid: 1000,
                uuid_counter: 0,
                calls: 0,
                crash_budget: None,
                injected: Vec::new(),
                busy_destroy_attempts: 0,
                driver_dir: None,
                driver: DriverInfo {
                    version: SIM_DRIVER_VERSION.to_owned(),
                    cuda: SIM_CUDA,
                },
            })),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not wedge the "hardware" for the next
        // agent; the state is consistent between statements.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn gpu_uuids(&self) -> Vec<String> {
        self.lock().gpus.iter().map(|g| g.uuid.clone()).collect()
    }

    pub fn arch(&self, gpu: &str) -> Option<Arch> {
        self.lock()
            .gpus
            .iter()
            .find(|g| g.uuid == gpu)
            .map(|g| g.arch)
    }

    /// Sets MIG mode without the agent, as an operator with nvidia-smi would
    /// (idle check and reset semantics included; no call is counted).
    pub fn operator_set_mig_mode(&self, gpu: &str, mode: MigMode) -> Result<(), SimError> {
        let mut st = self.lock();
        let i = st
            .gpu_pos(gpu)
            .ok_or_else(|| SimError::NoSuchDevice(gpu.to_owned()))?;
        st.set_mode(i, mode)
            .map(|_| ())
            .map_err(|_| SimError::Busy(gpu.to_owned()))
    }

    /// The driver version and the newest CUDA it supports, as the node reports them
    /// (`tessera-agent --sim-driver-version`, `--sim-cuda`).
    pub fn set_driver(&self, driver: DriverInfo) {
        self.lock().driver = driver;
    }

    /// From now on, writes each GPU's compute mode to `<dir>/<GPU UUID>/compute_mode`
    /// (`DEFAULT`, `EXCLUSIVE_PROCESS`, `PROHIBITED`), where the simulator's processes
    /// (the stand-in MPS daemon, `tessera-agent sim-cuda-context`) read what a real
    /// driver would enforce; `<dir>/<GPU UUID>/context.lock` is the lock an exclusive
    /// context holds. Real GPUs keep this in the driver.
    pub fn publish_driver_state(&self, dir: &Path) -> std::io::Result<()> {
        let mut st = self.lock();
        st.driver_dir = Some(dir.to_owned());
        for g in &st.gpus {
            write_compute_mode(dir, &g.uuid, g.compute_mode)?;
        }
        Ok(())
    }

    /// Starts a process on a MIG device (by `MIG-…` UUID) or, with MIG
    /// disabled, on a whole GPU (by `GPU-…` UUID).
    pub fn attach_process(&self, device_uuid: &str, memory_mib: u64) -> Result<Pid, SimError> {
        let mut st = self.lock();
        let mut found = None;
        for (gi_pos, g) in st.gpus.iter().enumerate() {
            if g.uuid == device_uuid && g.current == MigMode::Disabled {
                found = Some((gi_pos, None));
            }
            for (&gi_id, gi) in &g.gis {
                for (&ci_id, ci) in &gi.cis {
                    if ci.uuid == device_uuid {
                        found = Some((gi_pos, Some((gi_id, ci_id))));
                    }
                }
            }
        }
        let (gpu, on) = found.ok_or_else(|| SimError::NoSuchDevice(device_uuid.to_owned()))?;
        let pid = Pid(st.next_pid);
        st.next_pid += 1;
        st.procs.insert(
            pid,
            Proc {
                gpu,
                on,
                memory_mib,
            },
        );
        Ok(pid)
    }

    pub fn detach_process(&self, pid: Pid) -> Result<(), SimError> {
        self.lock()
            .procs
            .remove(&pid)
            .map(|_| ())
            .ok_or(SimError::NoSuchProcess(pid.0))
    }

    /// Power cycle: processes end, instances vanish, lost GPUs return; pending
    /// modes apply on Ampere, Hopper forgets MIG mode.
    pub fn reboot(&self) {
        let mut st = self.lock();
        st.procs.clear();
        for g in &mut st.gpus {
            g.lost = false;
            g.gis.clear();
            match g.arch {
                Arch::Ampere => g.current = g.pending,
                Arch::HopperOrNewer => {
                    g.current = MigMode::Disabled;
                    g.pending = MigMode::Disabled;
                }
            }
        }
    }

    /// `nvidia-smi -r`: needs an idle GPU; applies a pending mode and removes
    /// all instances.
    pub fn reset_gpu(&self, gpu: &str) -> Result<(), SimError> {
        let mut st = self.lock();
        let i = st
            .gpu_pos(gpu)
            .ok_or_else(|| SimError::NoSuchDevice(gpu.to_owned()))?;
        if st.procs.values().any(|p| p.gpu == i) {
            return Err(SimError::Busy(gpu.to_owned()));
        }
        let g = &mut st.gpus[i];
        g.gis.clear();
        g.current = g.pending;
        Ok(())
    }

    /// The next call named `call` (a [`GpuBackend`] method name) fails with
    /// `kind`, once.
    pub fn fail_next(&self, call: &'static str, kind: ErrorKind) {
        self.lock().injected.push((call, kind));
    }

    /// After `calls` more backend calls, every call fails with
    /// [`ErrorKind::Crashed`]: the agent died between two steps.
    pub fn crash_after(&self, calls: u64) {
        self.lock().crash_budget = Some(calls);
    }

    /// Clears a crash, as a fresh agent process would find the hardware.
    pub fn revive(&self) {
        self.lock().crash_budget = None;
    }

    pub fn fall_off_bus(&self, gpu: &str) {
        let mut st = self.lock();
        if let Some(i) = st.gpu_pos(gpu) {
            st.gpus[i].lost = true;
        }
    }

    /// Backend calls made so far (all methods, failed ones included).
    pub fn calls(&self) -> u64 {
        self.lock().calls
    }

    /// Destroy calls aimed at instances with processes. A correct agent makes
    /// none.
    pub fn busy_destroy_attempts(&self) -> u64 {
        self.lock().busy_destroy_attempts
    }

    /// The layout of a GPU as `(profile name, start)`, sorted; for tests.
    pub fn layout(&self, gpu: &str) -> Vec<(String, u8)> {
        let st = self.lock();
        let Some(i) = st.gpu_pos(gpu) else {
            return Vec::new();
        };
        let g = &st.gpus[i];
        let mut v: Vec<(String, u8)> = g
            .gis
            .values()
            .map(|gi| (g.profile_name(gi.profile_id), gi.start))
            .collect();
        v.sort();
        v
    }

    /// Pre-state for tests: create an instance (GI and full CI) as an
    /// operator would, bypassing call counting and fault injection; returns
    /// the MIG UUID.
    pub fn operator_create(
        &self,
        gpu: &str,
        profile: &str,
        start: u8,
        with_ci: bool,
    ) -> Result<Option<String>, BackendError> {
        let mut st = self.lock();
        let i = st
            .gpu_pos(gpu)
            .ok_or_else(|| BackendError::new("operator_create", ErrorKind::NotFound, gpu))?;
        let (id, size) = st.gpus[i]
            .model
            .as_ref()
            .and_then(|m| m.profile_by_name(profile))
            .map(|(_, p)| (p.id, p.memory_slices))
            .ok_or_else(|| {
                BackendError::new("operator_create", ErrorKind::InvalidArgument, profile)
            })?;
        let gi = st.create_gi(i, id, start, size)?;
        if with_ci {
            st.create_ci(i, gi).map(|(_, uuid)| Some(uuid))
        } else {
            Ok(None)
        }
    }

    /// Counts the call and applies injected faults; returns the GPU position
    /// for per-GPU calls.
    fn enter(
        &self,
        call: &'static str,
        gpu: Option<&str>,
    ) -> Result<(MutexGuard<'_, State>, usize), BackendError> {
        let mut st = self.lock();
        st.calls += 1;
        if let Some(n) = st.crash_budget {
            if n == 0 {
                return Err(BackendError::new(
                    call,
                    ErrorKind::Crashed,
                    "simulated agent crash",
                ));
            }
            st.crash_budget = Some(n - 1);
        }
        if let Some(pos) = st.injected.iter().position(|(c, _)| *c == call) {
            let (_, kind) = st.injected.remove(pos);
            return Err(BackendError::new(call, kind, "injected fault"));
        }
        let pos = match gpu {
            None => 0,
            Some(uuid) => {
                let i = st
                    .gpu_pos(uuid)
                    .ok_or_else(|| BackendError::new(call, ErrorKind::NotFound, uuid))?;
                if st.gpus[i].lost {
                    return Err(BackendError::new(call, ErrorKind::GpuLost, uuid));
                }
                i
            }
        };
        Ok((st, pos))
    }
}

impl Gpu {
    fn profile_name(&self, id: u32) -> String {
        self.model
            .as_ref()
            .and_then(|m| m.profile_by_id(id))
            .map(|(_, p)| p.name.clone())
            .unwrap_or_default()
    }
}

impl State {
    fn gpu_pos(&self, uuid: &str) -> Option<usize> {
        self.gpus.iter().position(|g| g.uuid == uuid)
    }

    fn procs_on(&self, gpu: usize, on: Option<(u32, u32)>) -> impl Iterator<Item = &Proc> {
        self.procs
            .values()
            .filter(move |p| p.gpu == gpu && p.on == on)
    }

    fn create_gi(
        &mut self,
        i: usize,
        profile_id: u32,
        start: u8,
        size: u8,
    ) -> Result<u32, BackendError> {
        const CALL: &str = "create_gpu_instance";
        let g = &mut self.gpus[i];
        let model = g
            .model
            .as_ref()
            .ok_or_else(|| BackendError::new(CALL, ErrorKind::NotSupported, "not MIG-capable"))?;
        if g.current != MigMode::Enabled {
            return Err(BackendError::new(
                CALL,
                ErrorKind::NotSupported,
                "MIG is disabled",
            ));
        }
        let (_, profile) = model.profile_by_id(profile_id).ok_or_else(|| {
            BackendError::new(
                CALL,
                ErrorKind::InvalidArgument,
                format!("profile id {profile_id}"),
            )
        })?;
        if !profile
            .placements
            .iter()
            .any(|p| p.start == start && p.size == size)
        {
            return Err(BackendError::new(
                CALL,
                ErrorKind::InvalidArgument,
                format!("placement {start}:{size} for profile {profile_id}"),
            ));
        }
        let same = g
            .gis
            .values()
            .filter(|gi| gi.profile_id == profile_id)
            .count();
        if same >= usize::from(profile.max_count) {
            return Err(BackendError::new(
                CALL,
                ErrorKind::InsufficientResources,
                format!("profile {profile_id} count exhausted"),
            ));
        }
        if g.gis
            .values()
            .any(|gi| overlaps(gi.start, gi.size, start, size))
        {
            return Err(BackendError::new(
                CALL,
                ErrorKind::InsufficientResources,
                format!("placement {start}:{size} overlaps"),
            ));
        }
        let id = (1..).find(|id| !g.gis.contains_key(id)).unwrap_or(u32::MAX);
        g.gis.insert(
            id,
            Gi {
                profile_id,
                start,
                size,
                cis: BTreeMap::new(),
            },
        );
        Ok(id)
    }

    fn create_ci(&mut self, i: usize, gi_id: u32) -> Result<(u32, String), BackendError> {
        const CALL: &str = "create_full_compute_instance";
        self.uuid_counter += 1;
        let uuid = fake_uuid("MIG", self.seed, (1 << 40) + self.uuid_counter);
        let g = &mut self.gpus[i];
        let compute = g
            .model
            .as_ref()
            .and_then(|m| {
                let gi = g.gis.get(&gi_id)?;
                m.profile_by_id(gi.profile_id)
                    .map(|(_, p)| p.compute_slices)
            })
            .ok_or_else(|| BackendError::new(CALL, ErrorKind::NotFound, format!("gi {gi_id}")))?;
        let gi = g
            .gis
            .get_mut(&gi_id)
            .ok_or_else(|| BackendError::new(CALL, ErrorKind::NotFound, format!("gi {gi_id}")))?;
        if !gi.cis.is_empty() {
            return Err(BackendError::new(
                CALL,
                ErrorKind::InsufficientResources,
                format!("gi {gi_id} has no free compute slices"),
            ));
        }
        gi.cis.insert(
            0,
            Ci {
                profile_id: full_ci_profile(compute),
                uuid: uuid.clone(),
            },
        );
        Ok((0, uuid))
    }

    /// NVML refuses to destroy a compute instance that a process still runs on.
    fn destroy_ci(&mut self, i: usize, ci: ComputeInstanceId) -> Result<(), BackendError> {
        const CALL: &str = "destroy_compute_instance";
        if self.procs_on(i, Some((ci.gi, ci.ci))).next().is_some() {
            self.busy_destroy_attempts += 1;
            return Err(BackendError::new(
                CALL,
                ErrorKind::InUse,
                format!("ci {}/{} has processes", ci.gi, ci.ci),
            ));
        }
        self.gpus[i]
            .gis
            .get_mut(&ci.gi)
            .and_then(|gi| gi.cis.remove(&ci.ci))
            .map(|_| ())
            .ok_or_else(|| {
                BackendError::new(CALL, ErrorKind::NotFound, format!("ci {}/{}", ci.gi, ci.ci))
            })
    }

    fn set_mode(&mut self, i: usize, mode: MigMode) -> Result<ModeChange, BackendError> {
        const CALL: &str = "set_mig_mode";
        if self.gpus[i].model.is_none() {
            return Err(BackendError::new(
                CALL,
                ErrorKind::NotSupported,
                "not MIG-capable",
            ));
        }
        if self.procs.values().any(|p| p.gpu == i) {
            return Err(BackendError::new(
                CALL,
                ErrorKind::InUse,
                "GPU has processes",
            ));
        }
        let g = &mut self.gpus[i];
        if !g.gis.is_empty() {
            return Err(BackendError::new(
                CALL,
                ErrorKind::InUse,
                "GPU instances exist",
            ));
        }
        g.pending = mode;
        match g.arch {
            Arch::HopperOrNewer => {
                g.current = mode;
                Ok(ModeChange::Applied)
            }
            Arch::Ampere if g.current == mode => Ok(ModeChange::Applied),
            Arch::Ampere => Ok(ModeChange::PendingReset),
        }
    }
}

fn write_compute_mode(dir: &Path, gpu: &str, mode: ComputeMode) -> std::io::Result<()> {
    let d = dir.join(gpu);
    std::fs::create_dir_all(&d)?;
    let tmp = d.join("compute_mode.tmp");
    std::fs::write(&tmp, mode.as_str())?;
    std::fs::rename(&tmp, d.join("compute_mode"))
}

/// The simulator's fault injection for GPU health, a documented `sim` control
/// (docs/operations.md): `<state-dir>/sim-driver/<GPU UUID>/faults.json` holds the
/// counters the simulated driver reports (`{"xid_count": 1, "last_xid": 79}`,
/// `{"ecc_uncorrected": 2}`, `{"retirement_pending": true}`); absent: no errors.
pub const FAULTS_FILE: &str = "faults.json";

impl GpuBackend for SimNode {
    fn driver(&self) -> Option<DriverInfo> {
        Some(self.lock().driver.clone())
    }

    fn health(&self, gpu: &str) -> Option<GpuHealth> {
        let dir = self.lock().driver_dir.clone();
        let Some(dir) = dir else {
            return Some(GpuHealth::default());
        };
        match std::fs::read(dir.join(gpu).join(FAULTS_FILE)) {
            Ok(b) => serde_json::from_slice(&b).ok(),
            Err(_) => Some(GpuHealth::default()),
        }
    }

    fn compute_mode(&self, gpu: &str) -> Result<ComputeMode, BackendError> {
        let (st, i) = self.enter("compute_mode", Some(gpu))?;
        Ok(st.gpus[i].compute_mode)
    }

    fn set_compute_mode(&self, gpu: &str, mode: ComputeMode) -> Result<(), BackendError> {
        const CALL: &str = "set_compute_mode";
        let (mut st, i) = self.enter(CALL, Some(gpu))?;
        if let Some(dir) = &st.driver_dir {
            write_compute_mode(dir, gpu, mode)
                .map_err(|e| BackendError::new(CALL, ErrorKind::Other(e.to_string()), gpu))?;
        }
        st.gpus[i].compute_mode = mode;
        Ok(())
    }

    fn devices(&self) -> Result<Vec<Device>, BackendError> {
        let (st, _) = self.enter("devices", None)?;
        Ok(st
            .gpus
            .iter()
            .filter(|g| !g.lost)
            .map(|g| Device {
                index: g.index,
                minor: g.index,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
                memory_mib: g.memory_mib,
            })
            .collect())
    }

    fn mig_mode(&self, gpu: &str) -> Result<Option<MigModeState>, BackendError> {
        let (st, i) = self.enter("mig_mode", Some(gpu))?;
        let g = &st.gpus[i];
        Ok(g.model.as_ref().map(|_| MigModeState {
            current: g.current,
            pending: g.pending,
        }))
    }

    fn profiles(&self, gpu: &str) -> Result<Vec<ProfileInfo>, BackendError> {
        let (st, i) = self.enter("profiles", Some(gpu))?;
        st.gpus[i]
            .model
            .as_ref()
            .map(to_profile_info)
            .ok_or_else(|| BackendError::new("profiles", ErrorKind::NotSupported, gpu))
    }

    fn instances(&self, gpu: &str) -> Result<Vec<MigInstance>, BackendError> {
        let (st, i) = self.enter("instances", Some(gpu))?;
        let g = &st.gpus[i];
        Ok(g.gis
            .iter()
            .map(|(&gi_id, gi)| MigInstance {
                profile_id: gi.profile_id,
                profile: g.profile_name(gi.profile_id),
                start: gi.start,
                size: gi.size,
                gi_id,
                compute_instances: gi
                    .cis
                    .iter()
                    .map(|(&ci_id, ci)| ComputeInstanceInfo {
                        ci_id,
                        profile_id: ci.profile_id,
                        full_size: true,
                        uuid: Some(ci.uuid.clone()),
                        process_count: Some(
                            u32::try_from(st.procs_on(i, Some((gi_id, ci_id))).count())
                                .unwrap_or(u32::MAX),
                        ),
                    })
                    .collect(),
            })
            .collect())
    }

    fn create_gpu_instance(&self, gpu: &str, at: GpuInstanceAt) -> Result<u32, BackendError> {
        let (mut st, i) = self.enter("create_gpu_instance", Some(gpu))?;
        st.create_gi(i, at.profile_id, at.start, at.size)
    }

    fn destroy_gpu_instance(&self, gpu: &str, gi_id: u32) -> Result<(), BackendError> {
        const CALL: &str = "destroy_gpu_instance";
        let (mut st, i) = self.enter(CALL, Some(gpu))?;
        let busy = st
            .procs
            .values()
            .any(|p| p.gpu == i && matches!(p.on, Some((g, _)) if g == gi_id));
        if busy {
            st.busy_destroy_attempts += 1;
        }
        let g = &mut st.gpus[i];
        let gi = g
            .gis
            .get(&gi_id)
            .ok_or_else(|| BackendError::new(CALL, ErrorKind::NotFound, format!("gi {gi_id}")))?;
        if !gi.cis.is_empty() {
            return Err(BackendError::new(
                CALL,
                ErrorKind::InUse,
                format!("gi {gi_id} has compute instances"),
            ));
        }
        g.gis.remove(&gi_id);
        Ok(())
    }

    fn create_full_compute_instance(&self, gpu: &str, gi_id: u32) -> Result<u32, BackendError> {
        let (mut st, i) = self.enter("create_full_compute_instance", Some(gpu))?;
        st.create_ci(i, gi_id).map(|(id, _)| id)
    }

    fn destroy_compute_instance(
        &self,
        gpu: &str,
        ci: ComputeInstanceId,
    ) -> Result<(), BackendError> {
        let (mut st, i) = self.enter("destroy_compute_instance", Some(gpu))?;
        st.destroy_ci(i, ci)
    }

    fn set_mig_mode(&self, gpu: &str, mode: MigMode) -> Result<ModeChange, BackendError> {
        let (mut st, i) = self.enter("set_mig_mode", Some(gpu))?;
        st.set_mode(i, mode)
    }

    fn sample(&self, gpu: &str) -> Result<GpuSample, BackendError> {
        let (st, i) = self.enter("sample", Some(gpu))?;
        let g = &st.gpus[i];
        let procs: Vec<&Proc> = st.procs.values().filter(|p| p.gpu == i).collect();
        let used: u64 = procs.iter().map(|p| p.memory_mib).sum();
        let busy = u32::try_from(procs.len()).unwrap_or(u32::MAX);
        let mig = g.current == MigMode::Enabled;
        let mut mig_devices = Vec::new();
        for (&gi_id, gi) in &g.gis {
            let gi_mem = g
                .model
                .as_ref()
                .and_then(|m| m.profile_by_id(gi.profile_id))
                .map(|(_, p)| p.memory_mib);
            for (&ci_id, ci) in &gi.cis {
                let on: Vec<&&Proc> = procs
                    .iter()
                    .filter(|p| p.on == Some((gi_id, ci_id)))
                    .collect();
                let n = u32::try_from(on.len()).unwrap_or(u32::MAX);
                mig_devices.push(MigDeviceSample {
                    mig_uuid: ci.uuid.clone(),
                    gi_id,
                    memory_used_mib: Some(on.iter().map(|p| p.memory_mib).sum()),
                    memory_total_mib: gi_mem,
                    process_count: Some(n),
                    sm_util_pct: match g.arch {
                        Arch::HopperOrNewer => Some((n * 40).min(100)),
                        Arch::Ampere => None,
                    },
                });
            }
        }
        Ok(GpuSample {
            gpu_uuid: g.uuid.clone(),
            memory_used_mib: Some(used),
            memory_total_mib: Some(g.memory_mib),
            temperature_c: Some(32 + 6 * busy.min(8)),
            power_mw: Some(60_000 + 45_000 * busy.min(8)),
            utilization_pct: (!mig).then_some((busy * 50).min(100)),
            mig_devices,
        })
    }
}

/// Major numbers the simulator's stand-in device nodes use where the driver's are
/// dynamic (`nvidia-uvm`, `nvidia-caps`); chosen outside what this kernel hands out.
pub const SIM_UVM_MAJOR: u32 = 235;
pub const SIM_CAPS_MAJOR: u32 = 236;

/// Writes the device nodes NVIDIA's driver makes, for GPUs with the given minors, into
/// `dir` (as `/dev`): `nvidiaN`, `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`,
/// `nvidia-caps/nvidia-cap1` and `nvidia-cap2`, the driver's `mig-minors` table and a
/// `/proc/devices` naming the majors. Opening them reaches no driver; the sandbox's
/// device rules are what they test.
pub fn write_device_files(dir: &std::path::Path, gpu_minors: &[u32]) -> std::io::Result<()> {
    use crate::sandbox::{
        NVIDIA_MAJOR, NVIDIACTL_MINOR, make_char_device, mig_minors_table, parse_mig_minors,
    };
    let caps = dir.join("nvidia-caps");
    std::fs::create_dir_all(&caps)?;
    for &m in gpu_minors {
        make_char_device(&dir.join(format!("nvidia{m}")), NVIDIA_MAJOR, m, 0o666)?;
    }
    make_char_device(&dir.join("nvidiactl"), NVIDIA_MAJOR, NVIDIACTL_MINOR, 0o666)?;
    make_char_device(&dir.join("nvidia-uvm"), SIM_UVM_MAJOR, 0, 0o666)?;
    make_char_device(&dir.join("nvidia-uvm-tools"), SIM_UVM_MAJOR, 1, 0o666)?;
    // As the driver at load: only config (0400) and monitor (0444); the nodes of GPU
    // and compute instances are made on first use, so the sandbox must do without.
    let table = mig_minors_table(gpu_minors);
    let minors = parse_mig_minors(&table);
    for (name, mode) in [("config", 0o400), ("monitor", 0o444)] {
        let minor = minors[name];
        make_char_device(
            &caps.join(format!("nvidia-cap{minor}")),
            SIM_CAPS_MAJOR,
            minor,
            mode,
        )?;
    }
    std::fs::write(dir.join("mig-minors"), table)?;
    std::fs::write(
        dir.join("devices"),
        format!(
            "Character devices:\n  1 mem\n{NVIDIA_MAJOR} nvidia-frontend\n{SIM_UVM_MAJOR} nvidia-uvm\n\
             {SIM_CAPS_MAJOR} nvidia-caps\n\nBlock devices:\n  8 sd\n"
        ),
    )
}
