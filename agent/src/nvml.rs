//! [`GpuBackend`] on NVIDIA's NVML, the only module that touches it.
//!
//! nvml-wrapper 0.13 wraps the read side and mode switching; GPU- and
//! compute-instance create/destroy/list, the named profile query and the
//! placement query are reached through `nvml.lib()` with nvml-wrapper-sys
//! types (mig.md §3). Known traps handled here:
//! - `Device::possible_placements` always returns an empty list: we do the
//!   two-call pattern ourselves;
//! - `set_mig_mode` returns the activation status, which we check;
//! - INSUFFICIENT_RESOURCES arrives as `UnexpectedVariant(23)`;
//! - profile indices are enumerated until INVALID_ARGUMENT, not up to the
//!   stale compile-time `*_PROFILE_COUNT`;
//! - the panicking `NvmlLib::nvmlXxx` convenience methods are never called:
//!   we use the `Result` fields.
//!
//! Profile IDs and names are read from the device. Telemetry leaves out what
//! NVML cannot give (GPU utilization with MIG on; per-GI SM utilization is
//! not sampled yet, which would need GPM on Hopper).
//!
//! Critical Xid events: a thread of their own ([`XidWatcher`]) holds an NVML event set
//! (not `Sync`), registers every GPU for `nvmlEventTypeXidCriticalError` and waits on it,
//! counting per GPU UUID into an [`XidLog`] that `health()` reads. Traps handled:
//! - `Device::register_events` frees the whole set on *any* error, dropping the GPUs
//!   already registered, while NVML keeps the set usable after NOT_SUPPORTED: we check
//!   `supported_event_types` first and register through the raw call; only on UNKNOWN
//!   (set undefined, per NVML) is the set rebuilt and the earlier GPUs registered again;
//! - with MIG on, events are registered on the parent GPU (the one enumeration returns):
//!   NVML delivers a MIG instance's Xids there, with the GI/CI IDs in the event;
//! - `EventSet::wait` answers TIMEOUT when nothing came (or on an interrupt): normal.
//!
//! Not yet run on hardware: compile-checked only.

// NVML's MIG management API is only reachable through raw FFI calls (see the
// module docs); every unsafe block below says why it is sound.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::mem;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::Device as NvDevice;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    ComputeMode as NvComputeMode, EccCounter, MemoryError, TemperatureSensor,
};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::{NvmlError, nvml_try, nvml_try_count};
use nvml_wrapper::event::EventSet;
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, nvmlComputeInstance_t, nvmlComputeInstanceInfo_t,
    nvmlComputeInstanceProfileInfo_t, nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_v2_t,
};
use tessera_domain::image::CudaVersion;
use tessera_domain::wire::{
    ComputeInstanceInfo, DriverInfo, GpuHealth, GpuSample, MigDeviceSample, MigInstance, MigMode,
    MigModeState, PlacementInfo, ProfileInfo,
};

use crate::backend::{
    BackendError, ComputeInstanceId, ComputeMode, Device, ErrorKind, GpuBackend, GpuInstanceAt,
    ModeChange,
};
use crate::xid::{Registration, XidLog, gpu_health};

/// Upper bound on profile indices we probe; NVML answers INVALID_ARGUMENT
/// past the real end long before this.
const MAX_PROFILE_INDEX: u32 = 64;
const NVML_ERROR_INSUFFICIENT_RESOURCES: u32 = 23;
const SUCCESS: u32 = nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_SUCCESS;
const NOT_SUPPORTED: u32 = nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const INVALID_ARGUMENT: u32 =
    nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const UNKNOWN: u32 = nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_UNKNOWN;
const MIB: u64 = 1024 * 1024;

fn kind_of(e: &NvmlError) -> ErrorKind {
    match e {
        NvmlError::UnexpectedVariant(NVML_ERROR_INSUFFICIENT_RESOURCES) => {
            ErrorKind::InsufficientResources
        }
        NvmlError::InUse => ErrorKind::InUse,
        NvmlError::NotSupported => ErrorKind::NotSupported,
        NvmlError::NoPermission => ErrorKind::NoPermission,
        NvmlError::NotFound => ErrorKind::NotFound,
        NvmlError::InvalidArg => ErrorKind::InvalidArgument,
        NvmlError::ResetRequired => ErrorKind::ResetRequired,
        NvmlError::GpuLost => ErrorKind::GpuLost,
        NvmlError::LibloadingError(_)
        | NvmlError::FailedToLoadSymbol(_)
        | NvmlError::LibraryNotFound
        | NvmlError::FunctionNotFound
        | NvmlError::DriverNotLoaded => ErrorKind::LibraryUnavailable,
        other => ErrorKind::Other(other.to_string()),
    }
}

fn err(call: &'static str) -> impl Fn(NvmlError) -> BackendError {
    move |e| BackendError::new(call, kind_of(&e), e.to_string())
}

fn sym_err(call: &'static str) -> impl Fn(&libloading::Error) -> BackendError {
    move |e| BackendError::new(call, ErrorKind::LibraryUnavailable, e.to_string())
}

fn mode_of(v: u32) -> MigMode {
    if v == nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE {
        MigMode::Enabled
    } else {
        MigMode::Disabled
    }
}

/// NVML may print names as `MIG 1g.10gb`; we use the bare profile name.
fn profile_name(raw: &[std::os::raw::c_char]) -> String {
    // `c_char` is i8 or u8 depending on the target; the cast keeps the byte.
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let name = String::from_utf8_lossy(&bytes).into_owned();
    name.strip_prefix("MIG ").map(str::to_owned).unwrap_or(name)
}

fn small(v: u32) -> u8 {
    u8::try_from(v).unwrap_or(u8::MAX)
}

/// A MIG device (GI + CI) as seen through its handle.
struct MigHandleInfo {
    uuid: Option<String>,
    process_count: Option<u32>,
    memory: Option<(u64, u64)>,
}

pub struct NvmlBackend {
    nvml: Arc<Nvml>,
    xids: Arc<XidLog>,
    /// Stops and joins the event thread when the backend is dropped.
    _xid_watcher: Option<XidWatcher>,
}

impl NvmlBackend {
    /// Loads `libnvidia-ml.so.1` and starts the critical-Xid watcher (its GPU
    /// registrations are done when this returns). Fails with a readable message where
    /// there is no NVIDIA driver.
    pub fn init() -> anyhow::Result<NvmlBackend> {
        match Nvml::init() {
            Ok(nvml) => {
                let nvml = Arc::new(nvml);
                let xids = Arc::new(XidLog::new());
                let watcher = XidWatcher::start(Arc::clone(&nvml), Arc::clone(&xids));
                Ok(NvmlBackend {
                    nvml,
                    xids,
                    _xid_watcher: watcher,
                })
            }
            Err(e) => Err(anyhow::anyhow!(
                "cannot load NVML (libnvidia-ml.so.1): {e}. Is the NVIDIA driver installed? \
                 Use --simulate to run against simulated GPUs."
            )),
        }
    }

    fn device(&self, call: &'static str, gpu: &str) -> Result<NvDevice<'_>, BackendError> {
        self.nvml.device_by_uuid(gpu).map_err(err(call))
    }

    /// Possible placements of a profile: the two-call pattern that
    /// `Device::possible_placements` gets wrong.
    fn placements(
        &self,
        dev: &NvDevice<'_>,
        profile_id: u32,
    ) -> Result<Vec<PlacementInfo>, BackendError> {
        const CALL: &str = "possible_placements";
        let f = self
            .nvml
            .lib()
            .nvmlDeviceGetGpuInstancePossiblePlacements_v2
            .as_ref()
            .map_err(sym_err(CALL))?;
        // SAFETY: the handle comes from this `Nvml` and outlives the call; the
        // first call passes a null buffer to ask for the count, the second a
        // buffer of exactly `n` zero-initialised POD structs, and we only read
        // the `n` entries NVML says it wrote.
        unsafe {
            let mut n = 0u32;
            // Tolerates INSUFFICIENT_SIZE, as nvml-wrapper does for its own
            // count queries.
            nvml_try_count(f(dev.handle(), profile_id, ptr::null_mut(), &mut n))
                .map_err(err(CALL))?;
            let mut v = vec![mem::zeroed::<nvmlGpuInstancePlacement_t>(); n as usize];
            nvml_try(f(dev.handle(), profile_id, v.as_mut_ptr(), &mut n)).map_err(err(CALL))?;
            v.truncate(n as usize);
            Ok(v.into_iter()
                .map(|p| PlacementInfo {
                    start: small(p.start),
                    size: small(p.size),
                })
                .collect())
        }
    }

    fn gi_by_id(
        &self,
        call: &'static str,
        dev: &NvDevice<'_>,
        gi_id: u32,
    ) -> Result<nvmlGpuInstance_t, BackendError> {
        let f = self
            .nvml
            .lib()
            .nvmlDeviceGetGpuInstanceById
            .as_ref()
            .map_err(sym_err(call))?;
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: valid device handle; `gi` is an out-pointer to a handle.
        nvml_try(unsafe { f(dev.handle(), gi_id, &mut gi) }).map_err(err(call))?;
        Ok(gi)
    }

    fn gi_info(
        &self,
        call: &'static str,
        gi: nvmlGpuInstance_t,
    ) -> Result<nvmlGpuInstanceInfo_t, BackendError> {
        let f = self
            .nvml
            .lib()
            .nvmlGpuInstanceGetInfo
            .as_ref()
            .map_err(sym_err(call))?;
        // SAFETY: `gi` is a live GI handle from NVML; `info` is a POD out-param.
        unsafe {
            let mut info: nvmlGpuInstanceInfo_t = mem::zeroed();
            nvml_try(f(gi, &mut info)).map_err(err(call))?;
            Ok(info)
        }
    }

    /// Compute-instance profiles of a GI (engine profile SHARED), by index
    /// until INVALID_ARGUMENT.
    fn ci_profiles(
        &self,
        call: &'static str,
        gi: nvmlGpuInstance_t,
    ) -> Result<Vec<nvmlComputeInstanceProfileInfo_t>, BackendError> {
        let f = self
            .nvml
            .lib()
            .nvmlGpuInstanceGetComputeInstanceProfileInfo
            .as_ref()
            .map_err(sym_err(call))?;
        let mut out = Vec::new();
        for index in 0..MAX_PROFILE_INDEX {
            // SAFETY: live GI handle; `info` is a POD out-param.
            let (rc, info) = unsafe {
                let mut info: nvmlComputeInstanceProfileInfo_t = mem::zeroed();
                let rc = f(
                    gi,
                    index,
                    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    &mut info,
                );
                (rc, info)
            };
            match rc {
                SUCCESS => out.push(info),
                NOT_SUPPORTED => continue,
                INVALID_ARGUMENT => break,
                other => nvml_try(other).map_err(err(call))?,
            }
        }
        Ok(out)
    }

    fn compute_instances(
        &self,
        call: &'static str,
        gi: nvmlGpuInstance_t,
    ) -> Result<Vec<nvmlComputeInstanceInfo_t>, BackendError> {
        let lib = self.nvml.lib();
        let list = lib
            .nvmlGpuInstanceGetComputeInstances
            .as_ref()
            .map_err(sym_err(call))?;
        let info_f = lib
            .nvmlComputeInstanceGetInfo_v2
            .as_ref()
            .map_err(sym_err(call))?;
        let mut out = Vec::new();
        for p in self.ci_profiles(call, gi)? {
            let cap = p.instanceCount.max(1);
            // SAFETY: buffer of `cap` null handles, `n` tells NVML its size
            // and on return how many were written; we read only those.
            let handles = unsafe {
                let mut buf: Vec<nvmlComputeInstance_t> = vec![ptr::null_mut(); cap as usize];
                let mut n = cap;
                nvml_try(list(gi, p.id, buf.as_mut_ptr(), &mut n)).map_err(err(call))?;
                buf.truncate(n as usize);
                buf
            };
            for ci in handles {
                // SAFETY: `ci` is a live CI handle just returned by NVML.
                let info = unsafe {
                    let mut info: nvmlComputeInstanceInfo_t = mem::zeroed();
                    nvml_try(info_f(ci, &mut info)).map_err(err(call))?;
                    info
                };
                out.push(info);
            }
        }
        Ok(out)
    }

    /// MIG UUID, processes and memory per `(gi_id, ci_id)`, from the MIG
    /// device handles (re-queried every time: handles die with their CI).
    fn mig_handles(&self, dev: &NvDevice<'_>) -> BTreeMap<(u32, u32), MigHandleInfo> {
        let lib = self.nvml.lib();
        let mut out = BTreeMap::new();
        let (Ok(gi_f), Ok(ci_f)) = (
            lib.nvmlDeviceGetGpuInstanceId.as_ref(),
            lib.nvmlDeviceGetComputeInstanceId.as_ref(),
        ) else {
            return out;
        };
        let Ok(max) = dev.mig_device_count() else {
            return out;
        };
        for i in 0..max {
            let Ok(mig) = dev.mig_device_by_index(i) else {
                continue;
            };
            let (mut gi, mut ci) = (0u32, 0u32);
            // SAFETY: `mig` is a MIG device handle from NVML; out-params are
            // plain integers.
            let ok = unsafe {
                nvml_try(gi_f(mig.handle(), &mut gi)).is_ok()
                    && nvml_try(ci_f(mig.handle(), &mut ci)).is_ok()
            };
            if !ok {
                continue;
            }
            out.insert(
                (gi, ci),
                MigHandleInfo {
                    uuid: mig.uuid().ok(),
                    process_count: mig
                        .running_compute_processes()
                        .ok()
                        .map(|p| u32::try_from(p.len()).unwrap_or(u32::MAX)),
                    memory: mig
                        .memory_info()
                        .ok()
                        .map(|m| (m.used / MIB, m.total / MIB)),
                },
            );
        }
        out
    }
}

impl GpuBackend for NvmlBackend {
    fn driver(&self) -> Option<DriverInfo> {
        let version = self
            .nvml
            .sys_driver_version()
            .map_err(|e| tracing::warn!(error = %e, "cannot read the driver version"))
            .ok()?;
        let cuda = self
            .nvml
            .sys_cuda_driver_version()
            .map_err(|e| tracing::warn!(error = %e, "cannot read the driver's CUDA version"))
            .ok()
            .and_then(CudaVersion::from_nvml)?;
        Some(DriverInfo { version, cuda })
    }

    fn devices(&self) -> Result<Vec<Device>, BackendError> {
        const CALL: &str = "devices";
        let count = self.nvml.device_count().map_err(err(CALL))?;
        let mut out = Vec::new();
        for index in 0..count {
            let dev = match self.nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(index, error = %e, "GPU unreachable; leaving it out");
                    continue;
                }
            };
            out.push(Device {
                index,
                minor: dev.minor_number().unwrap_or(index),
                uuid: dev.uuid().map_err(err(CALL))?,
                name: dev.name().map_err(err(CALL))?,
                memory_mib: dev.memory_info().map(|m| m.total / MIB).unwrap_or(0),
            });
        }
        Ok(out)
    }

    fn mig_mode(&self, gpu: &str) -> Result<Option<MigModeState>, BackendError> {
        const CALL: &str = "mig_mode";
        let dev = self.device(CALL, gpu)?;
        match dev.mig_mode() {
            Ok(m) => Ok(Some(MigModeState {
                current: mode_of(m.current),
                pending: mode_of(m.pending),
            })),
            // The go-nvlib / mig-parted test for "not MIG-capable".
            Err(NvmlError::NotSupported) => Ok(None),
            Err(e) => Err(err(CALL)(e)),
        }
    }

    fn profiles(&self, gpu: &str) -> Result<Vec<ProfileInfo>, BackendError> {
        const CALL: &str = "profiles";
        let dev = self.device(CALL, gpu)?;
        let f = self
            .nvml
            .lib()
            .nvmlDeviceGetGpuInstanceProfileInfoV
            .as_ref()
            .map_err(sym_err(CALL))?;
        let mut out = Vec::new();
        for index in 0..MAX_PROFILE_INDEX {
            // SAFETY: valid device handle; `info` is a zeroed POD v2 struct
            // whose `version` field tells NVML its layout (NVML_STRUCT_VERSION).
            let (rc, info) = unsafe {
                let mut info: nvmlGpuInstanceProfileInfo_v2_t = mem::zeroed();
                info.version =
                    (mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32) | (2 << 24);
                let rc = f(dev.handle(), index, &mut info);
                (rc, info)
            };
            match rc {
                SUCCESS => {}
                NOT_SUPPORTED => continue,
                INVALID_ARGUMENT => break,
                other => nvml_try(other).map_err(err(CALL))?,
            }
            let placements = self.placements(&dev, info.id)?;
            let Some(size) = placements.first().map(|p| p.size) else {
                continue;
            };
            out.push(ProfileInfo {
                id: info.id,
                name: profile_name(&info.name),
                compute_slices: small(info.sliceCount),
                memory_slices: size,
                max_count: small(info.instanceCount),
                memory_mib: info.memorySizeMB,
                placements,
            });
        }
        if out.is_empty() {
            return Err(BackendError::new(
                CALL,
                ErrorKind::NotSupported,
                "no GPU-instance profiles (MIG disabled or not supported)",
            ));
        }
        Ok(out)
    }

    fn instances(&self, gpu: &str) -> Result<Vec<MigInstance>, BackendError> {
        const CALL: &str = "instances";
        let dev = self.device(CALL, gpu)?;
        let profiles = self.profiles(gpu)?;
        let list = self
            .nvml
            .lib()
            .nvmlDeviceGetGpuInstances
            .as_ref()
            .map_err(sym_err(CALL))?;
        let handles = self.mig_handles(&dev);
        let mut out = Vec::new();
        for p in &profiles {
            let cap = u32::from(p.max_count).max(1);
            // SAFETY: buffer of `cap` null handles; NVML writes at most `n`
            // (the buffer size) and reports how many; we read only those.
            let gis = unsafe {
                let mut buf: Vec<nvmlGpuInstance_t> = vec![ptr::null_mut(); cap as usize];
                let mut n = cap;
                nvml_try(list(dev.handle(), p.id, buf.as_mut_ptr(), &mut n)).map_err(err(CALL))?;
                buf.truncate(n as usize);
                buf
            };
            for gi in gis {
                let info = self.gi_info(CALL, gi)?;
                let ci_profiles = self.ci_profiles(CALL, gi)?;
                let compute_instances = self
                    .compute_instances(CALL, gi)?
                    .into_iter()
                    .map(|ci| {
                        let h = handles.get(&(info.id, ci.id));
                        let ci_slices = ci_profiles
                            .iter()
                            .find(|c| c.id == ci.profileId)
                            .map(|c| c.sliceCount);
                        ComputeInstanceInfo {
                            ci_id: ci.id,
                            profile_id: ci.profileId,
                            full_size: ci_slices == Some(u32::from(p.compute_slices)),
                            uuid: h.and_then(|h| h.uuid.clone()),
                            process_count: h.and_then(|h| h.process_count),
                        }
                    })
                    .collect();
                out.push(MigInstance {
                    profile_id: info.profileId,
                    profile: p.name.clone(),
                    start: small(info.placement.start),
                    size: small(info.placement.size),
                    gi_id: info.id,
                    compute_instances,
                });
            }
        }
        out.sort_by_key(|i| (i.start, i.gi_id));
        Ok(out)
    }

    fn create_gpu_instance(&self, gpu: &str, at: GpuInstanceAt) -> Result<u32, BackendError> {
        const CALL: &str = "create_gpu_instance";
        let dev = self.device(CALL, gpu)?;
        let f = self
            .nvml
            .lib()
            .nvmlDeviceCreateGpuInstanceWithPlacement
            .as_ref()
            .map_err(sym_err(CALL))?;
        let placement = nvmlGpuInstancePlacement_t {
            start: u32::from(at.start),
            size: u32::from(at.size),
        };
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: valid device handle, a pointer to a live placement struct,
        // and an out-pointer for the new GI handle.
        nvml_try(unsafe { f(dev.handle(), at.profile_id, &placement, &mut gi) })
            .map_err(err(CALL))?;
        Ok(self.gi_info(CALL, gi)?.id)
    }

    fn destroy_gpu_instance(&self, gpu: &str, gi_id: u32) -> Result<(), BackendError> {
        const CALL: &str = "destroy_gpu_instance";
        let dev = self.device(CALL, gpu)?;
        let gi = self.gi_by_id(CALL, &dev, gi_id)?;
        let f = self
            .nvml
            .lib()
            .nvmlGpuInstanceDestroy
            .as_ref()
            .map_err(sym_err(CALL))?;
        // SAFETY: `gi` was just looked up by ID and is not used afterwards.
        nvml_try(unsafe { f(gi) }).map_err(err(CALL))
    }

    fn create_full_compute_instance(&self, gpu: &str, gi_id: u32) -> Result<u32, BackendError> {
        const CALL: &str = "create_full_compute_instance";
        let dev = self.device(CALL, gpu)?;
        let gi = self.gi_by_id(CALL, &dev, gi_id)?;
        let gi_profile = self.gi_info(CALL, gi)?.profileId;
        let gi_slices = self
            .profiles(gpu)?
            .into_iter()
            .find(|p| p.id == gi_profile)
            .map(|p| u32::from(p.compute_slices))
            .ok_or_else(|| {
                BackendError::new(
                    CALL,
                    ErrorKind::NotFound,
                    format!("GI profile {gi_profile}"),
                )
            })?;
        // The first CI profile spanning the whole GI, as go-nvlib picks it.
        let ci_profile = self
            .ci_profiles(CALL, gi)?
            .into_iter()
            .find(|c| c.sliceCount == gi_slices)
            .ok_or_else(|| {
                BackendError::new(CALL, ErrorKind::NotSupported, "no full-size CI profile")
            })?;
        let create = self
            .nvml
            .lib()
            .nvmlGpuInstanceCreateComputeInstance
            .as_ref()
            .map_err(sym_err(CALL))?;
        let info_f = self
            .nvml
            .lib()
            .nvmlComputeInstanceGetInfo_v2
            .as_ref()
            .map_err(sym_err(CALL))?;
        // SAFETY: live GI handle; out-pointers for the new CI handle and a
        // POD info struct.
        unsafe {
            let mut ci: nvmlComputeInstance_t = ptr::null_mut();
            nvml_try(create(gi, ci_profile.id, &mut ci)).map_err(err(CALL))?;
            let mut info: nvmlComputeInstanceInfo_t = mem::zeroed();
            nvml_try(info_f(ci, &mut info)).map_err(err(CALL))?;
            Ok(info.id)
        }
    }

    fn destroy_compute_instance(
        &self,
        gpu: &str,
        ci: ComputeInstanceId,
    ) -> Result<(), BackendError> {
        const CALL: &str = "destroy_compute_instance";
        let dev = self.device(CALL, gpu)?;
        let gi = self.gi_by_id(CALL, &dev, ci.gi)?;
        let lib = self.nvml.lib();
        let by_id = lib
            .nvmlGpuInstanceGetComputeInstanceById
            .as_ref()
            .map_err(sym_err(CALL))?;
        let destroy = lib
            .nvmlComputeInstanceDestroy
            .as_ref()
            .map_err(sym_err(CALL))?;
        // SAFETY: live GI handle; the CI handle is looked up by ID and not
        // used after being destroyed.
        unsafe {
            let mut handle: nvmlComputeInstance_t = ptr::null_mut();
            nvml_try(by_id(gi, ci.ci, &mut handle)).map_err(err(CALL))?;
            nvml_try(destroy(handle)).map_err(err(CALL))
        }
    }

    fn set_mig_mode(&self, gpu: &str, mode: MigMode) -> Result<ModeChange, BackendError> {
        const CALL: &str = "set_mig_mode";
        let dev = self.device(CALL, gpu)?;
        let status = dev
            .set_mig_mode(mode == MigMode::Enabled)
            .map_err(err(CALL))?;
        // The return value is the activation status: IN_USE or
        // RESET_REQUIRED show up only here.
        nvml_try(status).map_err(err(CALL))?;
        // The device may have been re-bound: look it up again.
        let dev = self.device(CALL, gpu)?;
        let now = dev.mig_mode().map_err(err(CALL))?;
        Ok(if mode_of(now.current) == mode {
            ModeChange::Applied
        } else {
            ModeChange::PendingReset
        })
    }

    fn compute_mode(&self, gpu: &str) -> Result<ComputeMode, BackendError> {
        const CALL: &str = "compute_mode";
        let dev = self.device(CALL, gpu)?;
        Ok(match dev.compute_mode().map_err(err(CALL))? {
            NvComputeMode::Default => ComputeMode::Default,
            // EXCLUSIVE_THREAD is gone from current drivers; it is as exclusive.
            NvComputeMode::ExclusiveProcess | NvComputeMode::ExclusiveThread => {
                ComputeMode::ExclusiveProcess
            }
            NvComputeMode::Prohibited => ComputeMode::Prohibited,
        })
    }

    fn set_compute_mode(&self, gpu: &str, mode: ComputeMode) -> Result<(), BackendError> {
        const CALL: &str = "set_compute_mode";
        let mut dev = self.device(CALL, gpu)?;
        dev.set_compute_mode(match mode {
            ComputeMode::Default => NvComputeMode::Default,
            ComputeMode::ExclusiveProcess => NvComputeMode::ExclusiveProcess,
            ComputeMode::Prohibited => NvComputeMode::Prohibited,
        })
        .map_err(err(CALL))
    }

    /// Critical Xids since the agent started (the event thread's count, where the GPU
    /// could be registered), volatile uncorrectable ECC errors and pages waiting for
    /// retirement (docs/operations.md, "GPU health").
    fn health(&self, gpu: &str) -> Option<GpuHealth> {
        let xid = self.xids.counts(gpu);
        let dev = self.device("health", gpu).ok();
        let ecc = dev.as_ref().and_then(|d| {
            d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .ok()
        });
        let pending = dev
            .as_ref()
            .and_then(|d| d.are_pages_pending_retired().ok());
        gpu_health(xid, ecc, pending)
    }

    fn xid_watch(&self, gpu: &str) -> Option<String> {
        Some(match self.xids.registration(gpu) {
            Some(r) => r.to_string(),
            None => "not registered (the watcher did not reach this GPU)".to_owned(),
        })
    }

    fn sample(&self, gpu: &str) -> Result<GpuSample, BackendError> {
        const CALL: &str = "sample";
        let dev = self.device(CALL, gpu)?;
        let mem = dev.memory_info().ok();
        let mig_on = matches!(dev.mig_mode(), Ok(m) if mode_of(m.current) == MigMode::Enabled);
        let mut mig_devices = Vec::new();
        if mig_on {
            for ((gi_id, _), h) in self.mig_handles(&dev) {
                let Some(uuid) = h.uuid else { continue };
                mig_devices.push(MigDeviceSample {
                    mig_uuid: uuid,
                    gi_id,
                    memory_used_mib: h.memory.map(|m| m.0),
                    memory_total_mib: h.memory.map(|m| m.1),
                    process_count: h.process_count,
                    sm_util_pct: None,
                });
            }
        }
        Ok(GpuSample {
            gpu_uuid: gpu.to_owned(),
            memory_used_mib: mem.as_ref().map(|m| m.used / MIB),
            memory_total_mib: mem.as_ref().map(|m| m.total / MIB),
            temperature_c: dev.temperature(TemperatureSensor::Gpu).ok(),
            power_mw: dev.power_usage().ok(),
            // "Not currently supported" on MIG-enabled GPUs (mig.md §2.6).
            utilization_pct: if mig_on {
                None
            } else {
                dev.utilization_rates().ok().map(|u| u.gpu)
            },
            mig_devices,
        })
    }
}

/// How long one `EventSet::wait` blocks: the longest a dropped backend waits for the
/// event thread to stop.
const XID_WAIT_MS: u32 = 500;
/// How long `init` waits for the GPUs' registrations.
const XID_REGISTER_WAIT: Duration = Duration::from_secs(10);

/// The critical-Xid event thread; dropping it stops and joins the thread.
struct XidWatcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl XidWatcher {
    /// Spawns the thread and waits until it has registered the GPUs (or given up), so
    /// that `health()` and `inventory` see every registration result.
    fn start(nvml: Arc<Nvml>, xids: Arc<XidLog>) -> Option<XidWatcher> {
        XidWatcher::spawn(move |stop, ready| watch_xids(&nvml, &xids, stop, ready))
    }

    /// Runs `body` on the thread: it must send on `ready` once registered and return soon
    /// after `stop` is set.
    fn spawn<F>(body: F) -> Option<XidWatcher>
    where
        F: FnOnce(&AtomicBool, &mpsc::Sender<()>) + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("nvml-xid".to_owned())
                .spawn(move || body(&stop, &ready_tx))
        };
        match thread {
            Ok(thread) => {
                if ready_rx.recv_timeout(XID_REGISTER_WAIT).is_err() {
                    tracing::warn!(
                        "critical Xid watcher: no registration result within 10 s \
                         (still registering, or the thread ended)"
                    );
                }
                Some(XidWatcher {
                    stop,
                    thread: Some(thread),
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the critical Xid watcher; \
                    Xids are not counted");
                None
            }
        }
    }
}

impl Drop for XidWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::warn!("the critical Xid watcher panicked");
        }
    }
}

/// What the raw `nvmlDeviceRegisterEvents` return code means for that GPU, and whether
/// the set must be rebuilt (UNKNOWN: NVML says the set is then undefined).
fn registration_of(rc: u32) -> (Registration, bool) {
    match rc {
        SUCCESS => (Registration::Watching, false),
        NOT_SUPPORTED => (Registration::NotSupported, false),
        UNKNOWN => (Registration::Failed(NvmlError::from(rc).to_string()), true),
        other => (
            Registration::Failed(NvmlError::from(other).to_string()),
            false,
        ),
    }
}

/// The event thread: registers every GPU, then waits for events until `stop`.
fn watch_xids(nvml: &Nvml, xids: &XidLog, stop: &AtomicBool, ready: &mpsc::Sender<()>) {
    let registered = register_xids(nvml, xids);
    // The receiver may have stopped waiting: nothing to tell then.
    let _ = ready.send(());
    let Some((set, watched)) = registered else {
        return;
    };
    let mut last_error: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        match set.wait(XID_WAIT_MS) {
            Ok(ev) => {
                last_error = None;
                if !ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    continue;
                }
                let code = match ev.event_data {
                    Some(XidError::Value(v)) => Some(v),
                    Some(XidError::Unknown) | None => None,
                };
                match event_gpu(&ev.device, &watched) {
                    Some(gpu) => {
                        tracing::warn!(gpu, xid = ?code, "critical Xid event");
                        xids.record(&gpu, code);
                    }
                    None => tracing::warn!(xid = ?code, "critical Xid event on a GPU \
                        the agent cannot name"),
                }
            }
            // Nothing within the timeout, or an interrupt.
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                // E.g. GPU_IS_LOST. Log each new error once, and do not spin on it.
                let text = e.to_string();
                if last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "waiting for critical Xid events failed");
                    last_error = Some(text);
                }
                std::thread::sleep(Duration::from_millis(u64::from(XID_WAIT_MS)));
            }
        }
    }
}

/// The GPU UUID of an event's device: the registered handle it is (with MIG on, NVML
/// reports the parent GPU), else asked from the device, going up from a MIG device.
fn event_gpu(dev: &NvDevice<'_>, watched: &[(nvmlDevice_t, String)]) -> Option<String> {
    // SAFETY: the handle is only compared, never dereferenced.
    let handle = unsafe { dev.handle() };
    if let Some((_, uuid)) = watched.iter().find(|(h, _)| *h == handle) {
        return Some(uuid.clone());
    }
    if matches!(dev.mig_is_mig_device_handle(), Ok(true)) {
        return dev.mig_parent_device().and_then(|p| p.uuid()).ok();
    }
    dev.uuid().ok()
}

/// Creates the event set and registers every GPU for critical Xid events, noting each
/// result in `xids`. `None` when no GPU could be registered (the thread then ends).
fn register_xids<'n>(
    nvml: &'n Nvml,
    xids: &XidLog,
) -> Option<(EventSet<'n>, Vec<(nvmlDevice_t, String)>)> {
    let mut gpus = Vec::new();
    match nvml.device_count() {
        Ok(n) => {
            for index in 0..n {
                match nvml.device_by_index(index).and_then(|d| Ok((d.uuid()?, d))) {
                    Ok(g) => gpus.push(g),
                    Err(e) => tracing::warn!(index, error = %e, "critical Xid watcher: \
                        GPU unreachable"),
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "critical Xid watcher: cannot count the GPUs");
            return None;
        }
    }
    let fail_all = |why: String| {
        for (uuid, _) in &gpus {
            xids.registered(uuid, Registration::Failed(why.clone()));
        }
    };
    let mut set = match nvml.create_event_set() {
        Ok(s) => s,
        Err(e) => {
            fail_all(format!("cannot create an NVML event set: {e}"));
            return None;
        }
    };
    let register = match nvml.lib().nvmlDeviceRegisterEvents.as_ref() {
        Ok(f) => f,
        Err(e) => {
            fail_all(format!("nvmlDeviceRegisterEvents: {e}"));
            return None;
        }
    };
    let bits = EventTypes::CRITICAL_XID_ERROR.bits();
    let mut watched: Vec<(nvmlDevice_t, String)> = Vec::new();
    for (uuid, dev) in &gpus {
        let supported = match dev.supported_event_types() {
            Ok(t) => t.contains(EventTypes::CRITICAL_XID_ERROR),
            Err(NvmlError::NotSupported) => false,
            Err(e) => {
                xids.registered(uuid, Registration::Failed(e.to_string()));
                continue;
            }
        };
        if !supported {
            xids.registered(uuid, Registration::NotSupported);
            continue;
        }
        // SAFETY: a live device handle and the live set, both from this `Nvml`; the raw
        // call leaves the set usable after NOT_SUPPORTED, unlike `register_events`.
        let handle = unsafe { dev.handle() };
        let rc = unsafe { register(handle, bits, set.handle()) };
        let (r, rebuild) = registration_of(rc);
        if r == Registration::Watching {
            watched.push((handle, uuid.clone()));
        }
        tracing::info!(gpu = %uuid, registration = %r, "critical Xid watcher");
        xids.registered(uuid, r);
        if rebuild {
            // The set is undefined now: a new one, with the GPUs registered so far.
            drop(set);
            set = match nvml.create_event_set() {
                Ok(s) => s,
                Err(e) => {
                    for (_, uuid) in &watched {
                        xids.registered(
                            uuid,
                            Registration::Failed(format!("cannot rebuild the event set: {e}")),
                        );
                    }
                    return None;
                }
            };
            watched.retain(|(h, uuid)| {
                // SAFETY: as above; the handles are still live.
                let rc = unsafe { register(*h, bits, set.handle()) };
                let (r, _) = registration_of(rc);
                let ok = r == Registration::Watching;
                xids.registered(uuid, r);
                ok
            });
        }
    }
    if watched.is_empty() {
        None
    } else {
        Some((set, watched))
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_watcher_is_registered_when_started_and_joined_when_dropped() {
        let log = Arc::new(XidLog::new());
        let ended = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (log, ended) = (Arc::clone(&log), Arc::clone(&ended));
            XidWatcher::spawn(move |stop, ready| {
                std::thread::sleep(Duration::from_millis(50));
                log.registered("GPU-a", Registration::Watching);
                ready.send(()).expect("ready");
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                ended.store(true, Ordering::Relaxed);
            })
        }
        .expect("spawned");
        // `spawn` returned after the registrations, not before.
        assert_eq!(log.registration("GPU-a"), Some(Registration::Watching));
        assert!(!ended.load(Ordering::Relaxed));
        drop(watcher);
        // Dropping stopped the loop and joined the thread.
        assert!(ended.load(Ordering::Relaxed));
    }

    #[test]
    fn registration_results_from_nvml_return_codes() {
        assert_eq!(registration_of(SUCCESS), (Registration::Watching, false));
        // NOT_SUPPORTED leaves the set usable: nothing to rebuild.
        assert_eq!(
            registration_of(NOT_SUPPORTED),
            (Registration::NotSupported, false)
        );
        // UNKNOWN leaves it undefined: rebuild.
        let (r, rebuild) = registration_of(UNKNOWN);
        assert!(matches!(r, Registration::Failed(_)));
        assert!(rebuild);
        let gpu_lost = nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
        let (r, rebuild) = registration_of(gpu_lost);
        assert_eq!(r, Registration::Failed(NvmlError::GpuLost.to_string()));
        assert!(!rebuild);
    }
}
