//! The cluster as users see it: nodes, their GPUs and MIG layouts, and a summary.
//!
//! Built from the agents' [`Inventory`](crate::wire::Inventory) reports; `now` is a
//! parameter so "online" is decided by the caller's clock.

use crate::error::AppError;
use crate::ids::NodeId;
use crate::mig::Catalog;
use crate::wire::{GpuInfo, Inventory, MigMode, ShareMethod};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A node is online while its last heartbeat is younger than this (3 missed beats).
pub const OFFLINE_AFTER_SECS: i64 = 90;

pub fn is_online(last_heartbeat: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
    last_heartbeat.is_some_and(|t| now - t < Duration::seconds(OFFLINE_AFTER_SECS))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeView {
    pub id: NodeId,
    pub hostname: String,
    pub online: bool,
    pub revoked: bool,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    pub agent_version: String,
    /// The agent may change MIG layouts (`--manage-mig`).
    pub manages_mig: bool,
    /// The agent runs local workloads in its sandbox (docs/security.md); `false` means a
    /// team's code there can reach other teams' files and every GPU.
    pub workload_sandbox: bool,
    /// Its group (a rack or switch), set by platform admins; gangs stay inside one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub gpus: Vec<GpuView>,
    /// Set while a platform admin drains the whole node.
    #[serde(default)]
    pub drain: Option<crate::drain::DrainView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuView {
    pub index: u32,
    pub uuid: String,
    /// The driver's product name.
    pub name: String,
    /// The catalog model (`H100-80GB`), when known.
    pub model: Option<String>,
    pub memory_mib: u64,
    /// `None` when the GPU is not MIG-capable.
    pub mig_enabled: Option<bool>,
    /// A mode change waits for a GPU reset.
    pub mig_pending_change: bool,
    /// Memory slices of the GPU (8 on A100/H100/H200, 4 on A30); 0 if unknown.
    pub memory_slices: u8,
    pub instances: Vec<InstanceView>,
    /// The layout an admin asked for, if any, and how applying it goes.
    pub desired: Option<DesiredView>,
    /// Set when an admin shared this GPU (fractional shares).
    pub sharing: Option<SharingView>,
    /// Set while a platform admin drains this GPU alone.
    #[serde(default)]
    pub drain: Option<crate::drain::DrainView>,
    /// Set while the GPU is unhealthy (no new work; its work was moved off).
    #[serde(default)]
    pub unhealthy: Option<crate::health::HealthView>,
}

/// A shared GPU: how it is shared, whether its node runs it so, and its shares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SharingView {
    /// `mps` or `time_slice`.
    pub method: String,
    /// The node runs it that way (MIG off; with MPS its control daemon answers): shares
    /// can start on it.
    pub ready: bool,
    /// What keeps it from being ready, or the last MPS daemon failure.
    pub error: Option<String>,
    /// How often the node restarted the GPU's MPS daemon after it died.
    pub daemon_restarts: u32,
    /// Milli-GPU held by shares (being set up, active or being released).
    pub used_milli: u32,
    /// Each share on it, oldest first.
    pub tenants: Vec<ShareTenantView>,
}

/// An admin's sharing setting for a GPU: `mps`, `time_slice`, or `off` (not shared).
pub fn parse_sharing(raw: &str) -> Result<Option<ShareMethod>, AppError> {
    match raw.trim() {
        "off" => Ok(None),
        other => ShareMethod::parse(other)
            .map(Some)
            .ok_or_else(|| AppError::invalid("sharing", "one of mps, time_slice or off")),
    }
}

/// One share of a shared GPU. Only platform admins see whose it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShareTenantView {
    pub milli: u32,
    pub team: Option<String>,
}

/// A desired MIG layout and the agent's last report about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DesiredView {
    pub mig_enabled: bool,
    /// `profile@start` per instance.
    pub layout: Vec<String>,
    pub version: u64,
    /// `pending`, `applying`, `success` or `failed` for this version; `None` until the
    /// agent reports on it.
    pub state: Option<String>,
    /// What failed or blocks it (driver error, busy instances), or the step in progress.
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstanceView {
    pub profile: String,
    pub start: u8,
    pub size: u8,
    /// `MIG-…` of its compute instance.
    pub uuid: Option<String>,
    /// Has processes, or the driver could not say.
    pub busy: bool,
}

impl GpuView {
    pub fn from_wire(gpu: &GpuInfo, catalog: &Catalog) -> Self {
        let model = catalog.get(&gpu.name);
        let memory_slices = model.map(|m| m.memory_slices()).unwrap_or_else(|| {
            gpu.profiles
                .iter()
                .map(|p| p.memory_slices)
                .max()
                .unwrap_or(0)
        });
        GpuView {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            name: gpu.name.clone(),
            model: model.map(|m| m.name().to_owned()),
            memory_mib: gpu.memory_mib,
            mig_enabled: gpu.mig_mode.map(|m| m.current == MigMode::Enabled),
            mig_pending_change: gpu.mig_mode.is_some_and(|m| m.current != m.pending),
            memory_slices,
            instances: gpu
                .instances
                .iter()
                .map(|i| InstanceView {
                    profile: i.profile.clone(),
                    start: i.start,
                    size: i.size,
                    uuid: i.compute_instances.iter().find_map(|c| c.uuid.clone()),
                    busy: i
                        .compute_instances
                        .iter()
                        .any(|c| c.process_count.is_none_or(|n| n > 0)),
                })
                .collect(),
            desired: None,
            sharing: None,
            drain: None,
            unhealthy: None,
        }
    }
}

/// Recent telemetry of one node, per GPU, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeTelemetry {
    pub gpus: Vec<GpuSeries>,
    /// Samples the agent dropped because its spool was full (ever).
    pub dropped_total: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuSeries {
    pub gpu_uuid: String,
    pub points: Vec<GpuPoint>,
}

/// One sample of one GPU; `None` where the driver cannot tell (never made up).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuPoint {
    pub at_unix_ms: i64,
    pub memory_used_mib: Option<u64>,
    pub memory_total_mib: Option<u64>,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub utilization_pct: Option<u32>,
    /// MIG devices on the GPU and their processes.
    pub mig_devices: u32,
    pub mig_processes: u32,
}

impl NodeTelemetry {
    /// Regroups node samples (oldest first) into per-GPU series.
    pub fn from_samples<'a>(
        samples: impl IntoIterator<Item = &'a crate::wire::TelemetrySample>,
        dropped_total: u64,
    ) -> Self {
        let mut by_gpu: BTreeMap<String, Vec<GpuPoint>> = BTreeMap::new();
        for s in samples {
            for g in &s.gpus {
                by_gpu
                    .entry(g.gpu_uuid.clone())
                    .or_default()
                    .push(GpuPoint {
                        at_unix_ms: s.at_unix_ms,
                        memory_used_mib: g.memory_used_mib,
                        memory_total_mib: g.memory_total_mib,
                        temperature_c: g.temperature_c,
                        power_mw: g.power_mw,
                        utilization_pct: g.utilization_pct,
                        mig_devices: u32::try_from(g.mig_devices.len()).unwrap_or(u32::MAX),
                        mig_processes: g
                            .mig_devices
                            .iter()
                            .map(|d| d.process_count.unwrap_or(0))
                            .sum(),
                    });
            }
        }
        NodeTelemetry {
            gpus: by_gpu
                .into_iter()
                .map(|(gpu_uuid, points)| GpuSeries { gpu_uuid, points })
                .collect(),
            dropped_total,
        }
    }
}

/// One server process (replica) on the database, as the admin pages show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ServerReplicaView {
    /// `TESSERA_REPLICA_NAME`, else the host (pod) name and the process id.
    pub name: String,
    pub version: String,
    pub started_at: DateTime<Utc>,
    /// When it last reported itself (every few seconds while it runs).
    pub seen_at: DateTime<Utc>,
    /// It holds the leader lease: it runs the scheduler, metering and the other passes.
    pub leading: bool,
    /// It reported within [`REPLICA_SILENT_SECS`]; otherwise it probably died.
    pub responding: bool,
}

/// A replica that has not reported for this long counts as not responding.
pub const REPLICA_SILENT_SECS: i64 = 20;

/// Counts for the dashboard.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterSummary {
    pub nodes_total: u32,
    pub nodes_online: u32,
    pub gpus_total: u32,
    /// GPU count per model (catalog name, else the driver's name).
    pub gpus_by_model: BTreeMap<String, u32>,
    pub mig_enabled_gpus: u32,
    pub mig_disabled_gpus: u32,
    pub instances_total: u32,
    /// MIG instances held by allocations (placing, active or being released).
    pub instances_in_use: u32,
    /// Of those held, how many run no process now (held but idle).
    #[serde(default)]
    pub instances_held_idle: u32,
    /// MIG instances no allocation holds.
    pub instances_free: u32,
}

/// Sums the inventories of non-revoked nodes; `online` says which ones answer. `held`: the
/// MIG instances allocations hold, as (GPU UUID, placement start); an instance is in use
/// when one holds it, whether or not a process runs on it.
pub fn summarize<'a>(
    nodes: impl IntoIterator<Item = (bool, &'a Inventory)>,
    catalog: &Catalog,
    held: &std::collections::BTreeSet<(String, u8)>,
) -> ClusterSummary {
    let mut s = ClusterSummary::default();
    for (online, inv) in nodes {
        s.nodes_total += 1;
        s.nodes_online += u32::from(online);
        for gpu in &inv.gpus {
            let view = GpuView::from_wire(gpu, catalog);
            s.gpus_total += 1;
            *s.gpus_by_model
                .entry(view.model.clone().unwrap_or_else(|| view.name.clone()))
                .or_default() += 1;
            match view.mig_enabled {
                Some(true) => s.mig_enabled_gpus += 1,
                _ => s.mig_disabled_gpus += 1,
            }
            for i in &view.instances {
                s.instances_total += 1;
                if held.contains(&(gpu.uuid.clone(), i.start)) {
                    s.instances_in_use += 1;
                    s.instances_held_idle += u32::from(!i.busy);
                } else {
                    s.instances_free += 1;
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ComputeInstanceInfo, MigInstance, MigModeState};

    fn gpu(name: &str, mig: bool, busy: &[Option<u32>]) -> GpuInfo {
        GpuInfo {
            index: 0,
            uuid: format!("GPU-{name}"),
            name: name.into(),
            memory_mib: 81_559,
            mig_mode: Some(MigModeState {
                current: if mig {
                    MigMode::Enabled
                } else {
                    MigMode::Disabled
                },
                pending: if mig {
                    MigMode::Enabled
                } else {
                    MigMode::Disabled
                },
            }),
            profiles: vec![],
            profiles_error: None,
            sharing: None,
            health: None,
            instances: busy
                .iter()
                .enumerate()
                .map(|(i, p)| MigInstance {
                    profile_id: 19,
                    profile: "1g.10gb".into(),
                    start: i as u8,
                    size: 1,
                    gi_id: i as u32,
                    compute_instances: vec![ComputeInstanceInfo {
                        ci_id: 0,
                        profile_id: 0,
                        full_size: true,
                        uuid: Some(format!("MIG-{i}")),
                        process_count: *p,
                    }],
                })
                .collect(),
        }
    }

    #[test]
    fn summary_counts_models_modes_and_busy_instances() {
        let catalog = Catalog::builtin();
        let a = Inventory {
            driver: None,
            gpus: vec![
                gpu("NVIDIA H100 80GB HBM3", true, &[Some(0), Some(2), None]),
                gpu("NVIDIA H100 80GB HBM3", false, &[]),
            ],
        };
        let b = Inventory {
            driver: None,
            gpus: vec![gpu("Tesla V100-SXM2-32GB", false, &[])],
        };
        // The instances at 0 (no process) and 2 (process count unknown) are held, so the
        // one at 0 is held but idle; the one at 1 runs processes but nobody holds it.
        let held: std::collections::BTreeSet<(String, u8)> = [0, 2]
            .iter()
            .map(|s| (a.gpus[0].uuid.clone(), *s))
            .collect();
        let s = summarize([(true, &a), (false, &b)], &catalog, &held);
        assert_eq!((s.nodes_total, s.nodes_online, s.gpus_total), (2, 1, 3));
        assert_eq!(s.gpus_by_model.get("H100-80GB"), Some(&2));
        assert_eq!(s.gpus_by_model.get("Tesla V100-SXM2-32GB"), Some(&1));
        assert_eq!((s.mig_enabled_gpus, s.mig_disabled_gpus), (1, 2));
        // In use means held by an allocation, whatever runs on it.
        assert_eq!(
            (
                s.instances_total,
                s.instances_in_use,
                s.instances_held_idle,
                s.instances_free
            ),
            (3, 2, 1, 1)
        );
        let v = GpuView::from_wire(&a.gpus[0], &catalog);
        assert_eq!(v.memory_slices, 8);
        assert_eq!(v.instances[0].uuid.as_deref(), Some("MIG-0"));
    }

    #[test]
    fn online_means_a_recent_heartbeat() {
        let now = DateTime::<Utc>::from_timestamp(1_000_000, 0).expect("time");
        assert!(is_online(Some(now - Duration::seconds(10)), now));
        assert!(!is_online(Some(now - Duration::seconds(91)), now));
        assert!(!is_online(None, now));
    }

    #[test]
    fn sharing_settings_parse_or_name_the_field() {
        assert_eq!(parse_sharing("off"), Ok(None));
        assert_eq!(parse_sharing(" mps "), Ok(Some(ShareMethod::Mps)));
        assert_eq!(
            parse_sharing("time_slice"),
            Ok(Some(ShareMethod::TimeSlice))
        );
        assert!(matches!(
            parse_sharing("fractional"),
            Err(AppError::Invalid { field, .. }) if field == "sharing"
        ));
    }
}
