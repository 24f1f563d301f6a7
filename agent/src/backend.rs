//! The one seam between the agent and a GPU driver.
//!
//! [`GpuBackend`] is implemented by NVML ([`crate::nvml`]) and by the
//! simulator ([`crate::sim`]); the reconcile loop and telemetry see only this
//! trait, so what is proven on the simulator is what runs on hardware. Calls
//! are synchronous, as NVML's are, and return `domain::wire` values directly.
//! GPUs are addressed by UUID because indices can change when a mode change
//! re-binds a device.

use std::fmt;

use tessera_domain::wire::{
    DriverInfo, GpuHealth, GpuInfo, GpuSample, Inventory, MigInstance, MigMode, MigModeState,
    ProfileInfo,
};

/// A physical GPU as enumeration reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub index: u32,
    /// The device file's minor number: `/dev/nvidia<minor>` (not always the index).
    pub minor: u32,
    pub uuid: String,
    pub name: String,
    pub memory_mib: u64,
}

/// What a successful `set_mig_mode` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeChange {
    /// The new mode is current now (Hopper and newer).
    Applied,
    /// The new mode is pending until the GPU is reset (Ampere).
    PendingReset,
}

/// A GPU's compute mode (`nvmlComputeMode_t`): how many CUDA contexts it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeMode {
    /// Any number of contexts, from any process.
    Default,
    /// One process's contexts at a time. A GPU shared with MPS is in this mode: the MPS
    /// server is that process, and a CUDA program that bypasses MPS gets
    /// `cudaErrorDevicesUnavailable` ("all CUDA-capable devices are busy or
    /// unavailable") instead of the whole GPU.
    ExclusiveProcess,
    /// No contexts.
    Prohibited,
}

impl ComputeMode {
    /// As `nvidia-smi` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ComputeMode::Default => "DEFAULT",
            ComputeMode::ExclusiveProcess => "EXCLUSIVE_PROCESS",
            ComputeMode::Prohibited => "PROHIBITED",
        }
    }

    pub fn parse(s: &str) -> Option<ComputeMode> {
        [
            ComputeMode::Default,
            ComputeMode::ExclusiveProcess,
            ComputeMode::Prohibited,
        ]
        .into_iter()
        .find(|m| m.as_str() == s.trim())
    }
}

/// A GPU instance to create: its profile (NVML's profile ID) and its placement, as
/// `nvmlDeviceCreateGpuInstanceWithPlacement` takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuInstanceAt {
    pub profile_id: u32,
    pub start: u8,
    pub size: u8,
}

/// A compute instance: its GPU instance's ID and its own (CI IDs are per GPU instance).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComputeInstanceId {
    pub gi: u32,
    pub ci: u32,
}

/// Driver errors the agent acts on; everything else is [`ErrorKind::Other`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// `NVML_ERROR_INSUFFICIENT_RESOURCES`: overlap, or the profile's count is
    /// exhausted.
    InsufficientResources,
    /// `NVML_ERROR_IN_USE`: processes (or compute instances) still there.
    InUse,
    NotSupported,
    NoPermission,
    NotFound,
    InvalidArgument,
    /// `NVML_ERROR_RESET_REQUIRED`, e.g. in a VM passthrough.
    ResetRequired,
    /// `NVML_ERROR_GPU_IS_LOST`: fell off the bus.
    GpuLost,
    /// The library could not be loaded or lacks a symbol.
    LibraryUnavailable,
    /// Only the simulator: the agent "died" here (fault injection).
    Crashed,
    Other(String),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct BackendError {
    /// The driver call that failed, e.g. `create_gpu_instance`.
    pub call: &'static str,
    pub kind: ErrorKind,
    pub detail: String,
}

impl BackendError {
    pub fn new(call: &'static str, kind: ErrorKind, detail: impl Into<String>) -> Self {
        BackendError {
            call,
            kind,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {:?}", self.call, self.kind)?;
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        Ok(())
    }
}

pub trait GpuBackend: Send + Sync {
    /// All GPUs the driver can reach. A GPU that fell off the bus is left out.
    fn devices(&self) -> Result<Vec<Device>, BackendError>;

    /// `None` when the GPU is not MIG-capable.
    fn mig_mode(&self, gpu: &str) -> Result<Option<MigModeState>, BackendError>;

    /// The GPU-instance profile table with possible placements, read from the
    /// device (IDs and names differ between GPU families).
    fn profiles(&self, gpu: &str) -> Result<Vec<ProfileInfo>, BackendError>;

    /// GPU instances with their placement, compute instances, MIG UUIDs and
    /// process counts. Empty when MIG is disabled.
    fn instances(&self, gpu: &str) -> Result<Vec<MigInstance>, BackendError>;

    /// Creates a GPU instance of a profile at an explicit placement and returns its GI ID.
    fn create_gpu_instance(&self, gpu: &str, at: GpuInstanceAt) -> Result<u32, BackendError>;

    /// Fails with `InUse` while the GI has compute instances.
    fn destroy_gpu_instance(&self, gpu: &str, gi_id: u32) -> Result<(), BackendError>;

    /// Creates the compute instance spanning the whole GI and returns its ID.
    fn create_full_compute_instance(&self, gpu: &str, gi_id: u32) -> Result<u32, BackendError>;

    /// Fails with `InUse` while processes run on it.
    fn destroy_compute_instance(
        &self,
        gpu: &str,
        ci: ComputeInstanceId,
    ) -> Result<(), BackendError>;

    /// Needs an idle GPU (`InUse` otherwise). The caller must re-read handles
    /// and instances afterwards.
    fn set_mig_mode(&self, gpu: &str, mode: MigMode) -> Result<ModeChange, BackendError>;

    /// The GPU's compute mode.
    fn compute_mode(&self, gpu: &str) -> Result<ComputeMode, BackendError>;

    /// Sets the GPU's compute mode (root; applies to contexts created from then on).
    fn set_compute_mode(&self, gpu: &str, mode: ComputeMode) -> Result<(), BackendError>;

    /// One sample of the GPU and its MIG devices; values the driver cannot
    /// give are `None`.
    fn sample(&self, gpu: &str) -> Result<GpuSample, BackendError>;

    /// The GPU's error counters (docs/operations.md, "GPU health"); `None` where the
    /// driver cannot say.
    fn health(&self, _gpu: &str) -> Option<GpuHealth> {
        None
    }

    /// The driver's version and the newest CUDA version it supports; `None` where the
    /// driver cannot say.
    fn driver(&self) -> Option<DriverInfo> {
        None
    }

    /// How the driver's critical Xid events are watched for this GPU, in words (the
    /// registration result `tessera-agent inventory` prints); `None` without a watcher.
    fn xid_watch(&self, _gpu: &str) -> Option<String> {
        None
    }
}

/// Reads everything the server needs to know about the node. Per-GPU read
/// errors are recorded in the GPU's entry rather than failing the whole
/// inventory, so one broken GPU does not hide the others.
pub fn inventory(backend: &dyn GpuBackend) -> Result<Inventory, BackendError> {
    let mut gpus = Vec::new();
    for d in backend.devices()? {
        let mig_mode = backend.mig_mode(&d.uuid)?;
        let (profiles, profiles_error) = if mig_mode.is_some() {
            match backend.profiles(&d.uuid) {
                Ok(p) => (p, None),
                Err(e) => (Vec::new(), Some(e.to_string())),
            }
        } else {
            (Vec::new(), Some("GPU is not MIG-capable".to_owned()))
        };
        let instances = match mig_mode {
            Some(MigModeState {
                current: MigMode::Enabled,
                ..
            }) => backend.instances(&d.uuid)?,
            _ => Vec::new(),
        };
        let health = backend.health(&d.uuid);
        gpus.push(GpuInfo {
            index: d.index,
            uuid: d.uuid,
            name: d.name,
            memory_mib: d.memory_mib,
            mig_mode,
            profiles,
            profiles_error,
            instances,
            sharing: None,
            health,
        });
    }
    Ok(Inventory {
        gpus,
        driver: backend.driver(),
    })
}
