//! The MIG reconcile loop: observe → diff against desired → act → report.
//!
//! Safe to kill at any point: every pass starts from what the driver says
//! now, never from what the agent remembers, so a pass interrupted between
//! two calls (a GI without its CI, half the old layout destroyed) is simply
//! the next pass's starting state. Two rules keep running work safe:
//! only instances that are *not* in the desired layout are destroyed, and
//! only when no process uses them. Instances are created at explicit
//! placements, so creation order does not matter (mig.md §1.3).
//!
//! [`plan`] is pure; [`reconcile_gpu`] runs it against a [`GpuBackend`];
//! [`Controller`] adds per-GPU back-off and status reporting on top.

use std::collections::BTreeMap;
use std::fmt;

use tessera_domain::mig::{Catalog, Instance};
use tessera_domain::wire::{
    ApplyError, ApplyState, ApplyStatus, DesiredGpuState, DesiredState, FailureKind, MigInstance,
    MigMode, MigModeState, ProfileInfo,
};

use crate::backend::{
    BackendError, ComputeInstanceId, ErrorKind, GpuBackend, GpuInstanceAt, ModeChange,
};

/// What the driver says about one GPU right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Product name, used to find a built-in profile table when the device
    /// cannot report its own (NVML's named profile query needs MIG enabled).
    pub name: String,
    pub mode: Option<MigModeState>,
    pub profiles: Vec<ProfileInfo>,
    pub instances: Vec<MigInstance>,
}

pub fn observe(backend: &dyn GpuBackend, gpu: &str) -> Result<Observed, BackendError> {
    let name = backend
        .devices()?
        .into_iter()
        .find(|d| d.uuid == gpu)
        .map(|d| d.name)
        .ok_or_else(|| BackendError::new("devices", ErrorKind::NotFound, gpu))?;
    let mode = backend.mig_mode(gpu)?;
    let (profiles, instances) = match mode {
        None => (Vec::new(), Vec::new()),
        Some(m) => {
            let profiles = match backend.profiles(gpu) {
                Ok(p) => p,
                Err(e) if m.current == MigMode::Disabled && e.kind == ErrorKind::NotSupported => {
                    tracing::debug!(gpu, error = %e, "profile table unreadable with MIG disabled");
                    Vec::new()
                }
                Err(e) => return Err(e),
            };
            let instances = if m.current == MigMode::Enabled {
                backend.instances(gpu)?
            } else {
                Vec::new()
            };
            (profiles, instances)
        }
    };
    Ok(Observed {
        name,
        mode,
        profiles,
        instances,
    })
}

/// One driver action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    DestroyCi {
        gi_id: u32,
        ci_id: u32,
    },
    DestroyGi {
        gi_id: u32,
    },
    /// A GI that is wanted but lacks its full-size CI (e.g. the agent died
    /// between the two creates).
    CreateCi {
        gi_id: u32,
    },
    /// A GI at an explicit placement, then its full-size CI.
    CreateInstance {
        profile_id: u32,
        profile: String,
        start: u8,
        size: u8,
    },
    SetMode(MigMode),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::DestroyCi { gi_id, ci_id } => {
                write!(f, "destroy compute instance {gi_id}/{ci_id}")
            }
            Step::DestroyGi { gi_id } => write!(f, "destroy gpu instance {gi_id}"),
            Step::CreateCi { gi_id } => {
                write!(f, "create compute instance in gpu instance {gi_id}")
            }
            Step::CreateInstance { profile, start, .. } => write!(f, "create {profile}@{start}"),
            Step::SetMode(MigMode::Enabled) => write!(f, "enable MIG mode"),
            Step::SetMode(MigMode::Disabled) => write!(f, "disable MIG mode"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Converged,
    /// The desired mode is pending; only a GPU reset or reboot applies it.
    AwaitingReset,
    /// `steps` in order; `blocked` lists what cannot be done because
    /// instances that must go still run processes.
    Act {
        steps: Vec<Step>,
        blocked: Vec<String>,
    },
    /// The desired state can never be reached on this GPU.
    Impossible(String),
}

pub use tessera_domain::wire::model_from_profiles;

fn is_busy(gi: &MigInstance) -> bool {
    gi.compute_instances
        .iter()
        .any(|ci| ci.process_count != Some(0))
}

fn overlaps(a_start: u8, a_size: u8, b_start: u8, b_size: u8) -> bool {
    u16::from(a_start) < u16::from(b_start) + u16::from(b_size)
        && u16::from(b_start) < u16::from(a_start) + u16::from(a_size)
}

fn destroy_all(gi: &MigInstance, steps: &mut Vec<Step>) {
    for ci in &gi.compute_instances {
        steps.push(Step::DestroyCi {
            gi_id: gi.gi_id,
            ci_id: ci.ci_id,
        });
    }
    steps.push(Step::DestroyGi { gi_id: gi.gi_id });
}

/// Diffs one GPU's desired state against what was observed. Pure.
pub fn plan(desired: &DesiredGpuState, obs: &Observed) -> Plan {
    let Some(mode) = obs.mode else {
        return match (desired.mode, desired.layout.is_empty()) {
            (MigMode::Disabled, true) => Plan::Converged,
            _ => Plan::Impossible("GPU is not MIG-capable".to_owned()),
        };
    };
    match desired.mode {
        MigMode::Disabled => plan_disabled(desired, mode, obs),
        MigMode::Enabled => plan_enabled(desired, mode, obs),
    }
}

fn plan_disabled(desired: &DesiredGpuState, mode: MigModeState, obs: &Observed) -> Plan {
    if !desired.layout.is_empty() {
        return Plan::Impossible("a layout was given but MIG mode is to be disabled".to_owned());
    }
    match (mode.current, mode.pending) {
        (MigMode::Disabled, MigMode::Disabled) => Plan::Converged,
        // Someone asked for MIG; cancel the pending change.
        (MigMode::Disabled, MigMode::Enabled) => Plan::Act {
            steps: vec![Step::SetMode(MigMode::Disabled)],
            blocked: Vec::new(),
        },
        (MigMode::Enabled, MigMode::Disabled) => Plan::AwaitingReset,
        (MigMode::Enabled, MigMode::Enabled) => {
            let mut steps = Vec::new();
            let mut blocked = Vec::new();
            for gi in &obs.instances {
                if is_busy(gi) {
                    blocked.push(format!("{}@{} has processes", gi.profile, gi.start));
                } else {
                    destroy_all(gi, &mut steps);
                }
            }
            if blocked.is_empty() {
                steps.push(Step::SetMode(MigMode::Disabled));
            }
            Plan::Act { steps, blocked }
        }
    }
}

fn plan_enabled(desired: &DesiredGpuState, mode: MigModeState, obs: &Observed) -> Plan {
    let enable = Plan::Act {
        steps: vec![Step::SetMode(MigMode::Enabled)],
        blocked: Vec::new(),
    };
    let model = if obs.profiles.is_empty() {
        match Catalog::builtin().get(&obs.name) {
            Some(m) => m.clone(),
            // Validate once MIG is on and the device can tell its table.
            None if mode.current == MigMode::Disabled && mode.pending == MigMode::Disabled => {
                return enable;
            }
            None if mode.current == MigMode::Disabled => return Plan::AwaitingReset,
            None => return Plan::Impossible("the device reports no MIG profiles".to_owned()),
        }
    } else {
        match model_from_profiles(&obs.name, &obs.profiles) {
            Ok(m) => m,
            Err(e) => return Plan::Impossible(format!("unusable profile table: {e}")),
        }
    };
    let wanted: Vec<Instance> = desired
        .layout
        .iter()
        .map(|d| Instance {
            profile: d.profile.clone(),
            start: d.start,
        })
        .collect();
    let slots = match model.validate(&wanted) {
        Ok(s) => s,
        Err(e) => return Plan::Impossible(e.to_string()),
    };
    if mode.current == MigMode::Disabled {
        return if mode.pending == MigMode::Enabled {
            Plan::AwaitingReset
        } else {
            enable
        };
    }

    // (profile_id, start) → still unmatched desired instance.
    let mut missing: BTreeMap<(u32, u8), (String, u8)> = slots
        .iter()
        .map(|&slot| {
            let p = model.profile(slot.profile);
            ((p.id, slot.start), (p.name.clone(), p.memory_slices))
        })
        .collect();
    let mut destroys = Vec::new();
    let mut creates = Vec::new();
    let mut blocked = Vec::new();
    // Memory ranges that stay occupied after this pass's destroys.
    let mut staying: Vec<(u8, u8, String)> = Vec::new();
    for gi in &obs.instances {
        let here = format!("{}@{}", gi.profile, gi.start);
        if missing.remove(&(gi.profile_id, gi.start)).is_some() {
            staying.push((gi.start, gi.size, here.clone()));
            let full = gi.compute_instances.len() == 1 && gi.compute_instances[0].full_size;
            if full {
                continue;
            }
            if gi.compute_instances.is_empty() {
                creates.push(Step::CreateCi { gi_id: gi.gi_id });
            } else if is_busy(gi) {
                blocked.push(format!(
                    "{here} has non-full compute instances with processes"
                ));
            } else {
                for ci in &gi.compute_instances {
                    destroys.push(Step::DestroyCi {
                        gi_id: gi.gi_id,
                        ci_id: ci.ci_id,
                    });
                }
                creates.push(Step::CreateCi { gi_id: gi.gi_id });
            }
        } else if is_busy(gi) {
            blocked.push(format!("{here} is not wanted but has processes"));
            staying.push((gi.start, gi.size, here));
        } else {
            destroy_all(gi, &mut destroys);
        }
    }
    for ((profile_id, start), (profile, size)) in missing {
        if let Some((_, _, who)) = staying
            .iter()
            .find(|(s, z, _)| overlaps(*s, *z, start, size))
        {
            blocked.push(format!("{profile}@{start} overlaps busy {who}"));
            continue;
        }
        creates.push(Step::CreateInstance {
            profile_id,
            profile,
            start,
            size,
        });
    }
    if destroys.is_empty() && creates.is_empty() && blocked.is_empty() {
        return Plan::Converged;
    }
    destroys.extend(creates);
    Plan::Act {
        steps: destroys,
        blocked,
    }
}

fn run_step(backend: &dyn GpuBackend, gpu: &str, step: &Step) -> Result<(), BackendError> {
    match step {
        Step::DestroyCi { gi_id, ci_id } => backend.destroy_compute_instance(
            gpu,
            ComputeInstanceId {
                gi: *gi_id,
                ci: *ci_id,
            },
        ),
        Step::DestroyGi { gi_id } => backend.destroy_gpu_instance(gpu, *gi_id),
        Step::CreateCi { gi_id } => backend
            .create_full_compute_instance(gpu, *gi_id)
            .map(|_| ()),
        Step::CreateInstance {
            profile_id,
            start,
            size,
            ..
        } => {
            let at = GpuInstanceAt {
                profile_id: *profile_id,
                start: *start,
                size: *size,
            };
            let gi = backend.create_gpu_instance(gpu, at)?;
            backend.create_full_compute_instance(gpu, gi).map(|_| ())
        }
        Step::SetMode(mode) => backend.set_mig_mode(gpu, *mode).map(|_: ModeChange| ()),
    }
}

/// The result of one [`reconcile_gpu`] call, ready to become an
/// [`ApplyStatus`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub state: ApplyState,
    pub step: Option<String>,
    pub error: Option<ApplyError>,
}

impl Outcome {
    fn new(state: ApplyState, step: Option<String>) -> Self {
        Outcome {
            state,
            step,
            error: None,
        }
    }

    fn failed(kind: FailureKind, step: Option<String>, message: impl Into<String>) -> Self {
        Outcome {
            state: ApplyState::Failed,
            step,
            error: Some(ApplyError {
                kind,
                message: message.into(),
            }),
        }
    }

    fn from_backend(step: Option<String>, e: &BackendError) -> Self {
        let kind = match e.kind {
            ErrorKind::InUse => FailureKind::Busy,
            ErrorKind::InsufficientResources | ErrorKind::InvalidArgument => {
                FailureKind::Impossible
            }
            ErrorKind::GpuLost => FailureKind::GpuUnavailable,
            // Not found while observing: the GPU is not (or no longer) here.
            ErrorKind::NotFound if step.is_none() => FailureKind::GpuUnavailable,
            _ => FailureKind::Driver,
        };
        Outcome::failed(kind, step, e.to_string())
    }
}

/// Passes per call: enabling MIG (one pass) then creating instances (one
/// pass) then verifying (one pass), with one spare.
const MAX_PASSES: usize = 4;

/// Brings one GPU toward `desired`. Without `manage`, only observes and
/// reports. `on_step` is told each step before it runs (for `applying`
/// reports).
pub fn reconcile_gpu(
    backend: &dyn GpuBackend,
    desired: &DesiredGpuState,
    manage: bool,
    on_step: &mut dyn FnMut(&Step),
) -> Outcome {
    let gpu = desired.gpu_uuid.as_str();
    for _ in 0..MAX_PASSES {
        let obs = match observe(backend, gpu) {
            Ok(o) => o,
            Err(e) => return Outcome::from_backend(None, &e),
        };
        match plan(desired, &obs) {
            Plan::Converged => return Outcome::new(ApplyState::Success, None),
            Plan::Impossible(why) => return Outcome::failed(FailureKind::Impossible, None, why),
            Plan::AwaitingReset => {
                return Outcome::new(
                    ApplyState::Pending,
                    Some("MIG mode change waits for a GPU reset or reboot".to_owned()),
                );
            }
            Plan::Act { steps, blocked } => {
                if !manage {
                    return Outcome::new(
                        ApplyState::Pending,
                        Some(format!(
                            "read-only agent (--manage-mig not set); {} change(s) needed",
                            steps.len() + blocked.len()
                        )),
                    );
                }
                for step in &steps {
                    on_step(step);
                    if let Err(e) = run_step(backend, gpu, step) {
                        return Outcome::from_backend(Some(step.to_string()), &e);
                    }
                }
                if !blocked.is_empty() {
                    return Outcome::failed(
                        FailureKind::Busy,
                        None,
                        format!("blocked by busy instances: {}", blocked.join("; ")),
                    );
                }
            }
        }
    }
    Outcome::failed(
        FailureKind::Driver,
        None,
        format!("did not converge after {MAX_PASSES} passes"),
    )
}

/// First and longest waits before retrying a GPU whose apply failed.
pub const BACKOFF_MIN_MS: u64 = 5_000;
pub const BACKOFF_MAX_MS: u64 = 300_000;

#[derive(Debug, Clone)]
struct Track {
    version: u64,
    last: Option<ApplyStatus>,
    retry_at_ms: u64,
    delay_ms: u64,
}

/// Runs [`reconcile_gpu`] for every GPU in the desired state, with per-GPU
/// exponential back-off after failures (reset when the server sends a new
/// version), and reports only status changes. Time is a parameter so tests
/// are exact.
#[derive(Debug)]
pub struct Controller {
    manage: bool,
    tracks: BTreeMap<String, Track>,
}

impl Controller {
    pub fn new(manage: bool) -> Self {
        Controller {
            manage,
            tracks: BTreeMap::new(),
        }
    }

    /// One round. `publish` receives every status that differs from the last
    /// one sent for that GPU, including `applying` just before the first
    /// change.
    pub fn tick(
        &mut self,
        backend: &dyn GpuBackend,
        desired: &DesiredState,
        now_ms: u64,
        publish: &mut dyn FnMut(ApplyStatus),
    ) {
        self.tracks
            .retain(|uuid, _| desired.gpus.iter().any(|d| &d.gpu_uuid == uuid));
        for d in &desired.gpus {
            let track = self.tracks.entry(d.gpu_uuid.clone()).or_insert(Track {
                version: d.version,
                last: None,
                retry_at_ms: 0,
                delay_ms: 0,
            });
            if track.version != d.version {
                track.version = d.version;
                track.retry_at_ms = 0;
                track.delay_ms = 0;
            }
            if now_ms < track.retry_at_ms {
                continue;
            }
            let mut announced = false;
            let outcome = reconcile_gpu(backend, d, self.manage, &mut |step| {
                if !announced {
                    announced = true;
                    let status = ApplyStatus {
                        gpu_uuid: d.gpu_uuid.clone(),
                        version: d.version,
                        state: ApplyState::Applying,
                        step: Some(step.to_string()),
                        error: None,
                        retry_in_s: None,
                    };
                    track.last = Some(status.clone());
                    publish(status);
                }
            });
            let retry_in_s = if outcome.state == ApplyState::Failed {
                let impossible = outcome
                    .error
                    .as_ref()
                    .is_some_and(|e| e.kind == FailureKind::Impossible);
                track.delay_ms = if impossible {
                    BACKOFF_MAX_MS
                } else {
                    (track.delay_ms * 2).clamp(BACKOFF_MIN_MS, BACKOFF_MAX_MS)
                };
                track.retry_at_ms = now_ms + track.delay_ms;
                Some(track.delay_ms / 1000)
            } else {
                track.delay_ms = 0;
                track.retry_at_ms = 0;
                None
            };
            let status = ApplyStatus {
                gpu_uuid: d.gpu_uuid.clone(),
                version: d.version,
                state: outcome.state,
                step: outcome.step,
                error: outcome.error,
                retry_in_s,
            };
            if track.last.as_ref() != Some(&status) {
                track.last = Some(status.clone());
                publish(status);
            }
        }
    }
}
