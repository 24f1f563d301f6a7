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
//! Not yet run on hardware: compile-checked only.

// NVML's MIG management API is only reachable through raw FFI calls (see the
// module docs); every unsafe block below says why it is sound.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::mem;
use std::ptr;

use nvml_wrapper::Device as NvDevice;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{
    ComputeMode as NvComputeMode, EccCounter, MemoryError, TemperatureSensor,
};
use nvml_wrapper::error::{NvmlError, nvml_try, nvml_try_count};
use nvml_wrapper_sys::bindings::{
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, nvmlComputeInstance_t, nvmlComputeInstanceInfo_t,
    nvmlComputeInstanceProfileInfo_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_v2_t,
};
use tessera_domain::wire::{
    ComputeInstanceInfo, GpuHealth, GpuSample, MigDeviceSample, MigInstance, MigMode, MigModeState,
    PlacementInfo, ProfileInfo,
};

use crate::backend::{BackendError, ComputeMode, Device, ErrorKind, GpuBackend, ModeChange};

/// Upper bound on profile indices we probe; NVML answers INVALID_ARGUMENT
/// past the real end long before this.
const MAX_PROFILE_INDEX: u32 = 64;
const NVML_ERROR_INSUFFICIENT_RESOURCES: u32 = 23;
const SUCCESS: u32 = nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_SUCCESS;
const NOT_SUPPORTED: u32 = nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const INVALID_ARGUMENT: u32 =
    nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
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
    nvml: Nvml,
}

impl NvmlBackend {
    /// Loads `libnvidia-ml.so.1`. Fails with a readable message where there
    /// is no NVIDIA driver.
    pub fn init() -> anyhow::Result<NvmlBackend> {
        match Nvml::init() {
            Ok(nvml) => Ok(NvmlBackend { nvml }),
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

    fn create_gpu_instance(
        &self,
        gpu: &str,
        profile_id: u32,
        start: u8,
        size: u8,
    ) -> Result<u32, BackendError> {
        const CALL: &str = "create_gpu_instance";
        let dev = self.device(CALL, gpu)?;
        let f = self
            .nvml
            .lib()
            .nvmlDeviceCreateGpuInstanceWithPlacement
            .as_ref()
            .map_err(sym_err(CALL))?;
        let placement = nvmlGpuInstancePlacement_t {
            start: u32::from(start),
            size: u32::from(size),
        };
        let mut gi: nvmlGpuInstance_t = ptr::null_mut();
        // SAFETY: valid device handle, a pointer to a live placement struct,
        // and an out-pointer for the new GI handle.
        nvml_try(unsafe { f(dev.handle(), profile_id, &placement, &mut gi) }).map_err(err(CALL))?;
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
        gi_id: u32,
        ci_id: u32,
    ) -> Result<(), BackendError> {
        const CALL: &str = "destroy_compute_instance";
        let dev = self.device(CALL, gpu)?;
        let gi = self.gi_by_id(CALL, &dev, gi_id)?;
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
            let mut ci: nvmlComputeInstance_t = ptr::null_mut();
            nvml_try(by_id(gi, ci_id, &mut ci)).map_err(err(CALL))?;
            nvml_try(destroy(ci)).map_err(err(CALL))
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

    /// Volatile uncorrectable ECC errors and pages waiting for retirement. Critical Xid
    /// events need an NVML event set watched by a thread: not read yet (docs/operations.md).
    fn health(&self, gpu: &str) -> Option<GpuHealth> {
        let dev = self.device("health", gpu).ok()?;
        let ecc = dev
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .ok();
        let pending = dev.are_pages_pending_retired().ok();
        if ecc.is_none() && pending.is_none() {
            return None;
        }
        Some(GpuHealth {
            xid_count: 0,
            last_xid: None,
            ecc_uncorrected: ecc.unwrap_or(0),
            retirement_pending: pending.unwrap_or(false),
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
