//! Workloads on an allocation: notebooks and training jobs (see `tessera_domain::workload`
//! for the states, and docs/workloads.md).
//!
//! The service decides what should run on each node and records what the executor
//! reports ([`Workloads::sync`], the agent's `POST /agent/v1/workloads`); the scheduler
//! pass ([`Workloads::tick`]) stops workloads whose allocation ended, reclaims idle
//! notebooks and gives up on ones whose node went silent. [`Workloads::proxy_target`]
//! tells the server's notebook proxy where a notebook listens, for its owner (and,
//! audited, platform admins) only.

use super::allocations::Allocations;
use super::authz::{self, Need};
use super::billing::readings;
use super::nodes::NodeIdentity;
use super::tenancy::paged;
use super::{found, internal};
use crate::auth::Principal;
use crate::auth::secret;
use crate::clock::Clock;
use crate::services::audit::Entry;
use crate::store::{ProfileRow, Store, WorkloadChange, WorkloadListRow, WorkloadRow};
use chrono::{DateTime, Duration, Utc};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tessera_domain::account::Username;
use tessera_domain::alloc::{AllocState, AllocatedDevice, GpuKind, NewAllocation, TypedRequest};
use tessera_domain::audit::AuditAction;
use tessera_domain::drain::{self, DeadlineCause};
use tessera_domain::error::AppError;
use tessera_domain::ids::{AllocationId, NodeId, TeamId, UserId, WorkloadId};
use tessera_domain::mig::Catalog;
use tessera_domain::tenancy::{Page, PageRequest, TeamRole};
use tessera_domain::wire::{
    GangLauncher, LogAck, ShareLimits, ShareMethod, WorkloadPhase, WorkloadReport, WorkloadReports,
    WorkloadSpec, WorkloadSync,
};
use tessera_domain::workload::{
    self as wl, ActivitySignals, EnvVar, IdleDecision, IdlePolicy, JobCommand, LogSlice,
    NotebookProfile, RankView, ServerName, WorkloadKind, WorkloadState, WorkloadView,
};
use uuid::Uuid;

mod exec;
mod executor;
mod gang;
mod notebooks;
mod pass;
mod profiles;
mod secrets;

pub use exec::{ExecTarget, MAX_EXEC_COMMAND};
pub use secrets::open_notebook_token;

/// Who reports workloads to [`Workloads::sync`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reporter {
    /// A node's agent, over the agent API, from this client address.
    Agent(Option<std::net::IpAddr>),
    /// The server's own executor (Kubernetes), reporting for the node.
    Executor,
}

/// Settings of the workload service.
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    /// Command line that starts JupyterLab, split on whitespace. `{base_path}` is replaced
    /// by the notebook's proxy path, `{port}` by the executor with the port it chose.
    pub notebook_command: String,
    pub idle: IdlePolicy,
    /// Idle reclaim also releases the notebook's allocation (else the GPU stays held).
    pub idle_release_allocation: bool,
    /// Log bytes kept per workload (the oldest output is dropped beyond it).
    pub log_cap: u64,
    /// How long a workload whose allocation ended waits for its node to confirm the stop
    /// before it counts as lost.
    pub stop_grace: Duration,
}

/// `--allow-root`: agents often run as root (then so do their workloads; Jupyter refuses
/// that without the flag). It changes nothing for other users. `{host}` is the node's
/// workload address (the agent's `--workload-host`, where the server's proxy reaches the
/// notebook), `{port}` the port the node chose.
pub const DEFAULT_NOTEBOOK_COMMAND: &str = "jupyter lab --no-browser --allow-root \
     --ServerApp.ip={host} --ServerApp.port={port} --ServerApp.port_retries=0 \
     --ServerApp.base_url={base_path}";

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            notebook_command: DEFAULT_NOTEBOOK_COMMAND.into(),
            idle: IdlePolicy::default(),
            idle_release_allocation: true,
            log_cap: 4 * 1024 * 1024,
            stop_grace: Duration::minutes(3),
        }
    }
}

/// A notebook to launch (name parsed here, env typed): on an active allocation of the
/// caller's, or with a GPU request of its own (`gpu`), which it waits for and releases
/// when it stops.
#[derive(Debug, Clone, Default)]
pub struct NewNotebook {
    pub allocation_id: Option<AllocationId>,
    pub gpu: Option<NewAllocation>,
    /// One of the caller's teams' notebook profiles: its GPU and hours, paid by its team.
    pub profile_id: Option<Uuid>,
    pub name: String,
    /// Checked by `wl::parse_env` (a form) or `wl::env_from_pairs` (JSON).
    pub env: Vec<EnvVar>,
    /// An image of the team's catalog (id, name or pinned reference); `None`: the
    /// profile's image, else the node's environment.
    pub image: Option<String>,
    pub idempotency_key: Option<String>,
}

/// A training job to run (name, command and workdir parsed here; env and retries typed): on an active allocation of the
/// caller's, or with a GPU request of its own (`gpu`: kind, count, priority; its duration
/// is the job's time limit), which the job queues for and releases when it ends.
#[derive(Debug, Clone, Default)]
pub struct NewJob {
    pub allocation_id: Option<AllocationId>,
    pub gpu: Option<NewAllocation>,
    /// One task of a sweep: its index, given to the run as `TESSERA_ARRAY_INDEX`.
    pub array_index: Option<u32>,
    pub name: String,
    pub command: String,
    pub workdir: String,
    /// Checked by `wl::parse_env` (a form) or `wl::env_from_pairs` (JSON).
    pub env: Vec<EnvVar>,
    /// Checked again here (`wl::check_retries`).
    pub retries: u32,
    /// An image of the team's catalog (id, name or pinned reference); `None`: the node's
    /// environment.
    pub image: Option<String>,
    /// A multi-node job (`gpu.nodes`): who runs the command (`each` when absent).
    pub launcher: Option<GangLauncher>,
    /// A multi-node job: one process per node (absent) or per GPU.
    pub ranks: Option<tessera_domain::alloc::Ranks>,
    pub idempotency_key: Option<String>,
}

/// What a new workload runs on.
#[derive(Debug, Clone, Copy)]
enum Target<'a> {
    /// An active allocation of the caller's.
    Allocation(AllocationId),
    /// A GPU request of its own, as the caller asked it.
    NewGpu(&'a NewAllocation),
    /// A GPU request of its own from a team's notebook profile (already in domain types,
    /// its team authorized).
    Profile(&'a TypedRequest),
}

impl<'a> Target<'a> {
    fn of(
        allocation: Option<AllocationId>,
        gpu: Option<&'a NewAllocation>,
    ) -> Result<Self, AppError> {
        match (allocation, gpu) {
            (Some(id), None) => Ok(Target::Allocation(id)),
            (None, Some(g)) => Ok(Target::NewGpu(g)),
            (Some(_), Some(_)) => Err(AppError::invalid(
                "gpu",
                "give either an allocation to run on or a GPU to request, not both",
            )),
            (None, None) => Err(AppError::invalid(
                "allocation_id",
                "choose one of your active allocations, or request a GPU for it",
            )),
        }
    }
}

/// A request's `kind` error as the launch form names the field (`gpu`).
fn as_gpu_error(e: AppError) -> AppError {
    match e {
        AppError::Invalid { field, message } if field == "kind" => AppError::Invalid {
            field: "gpu".into(),
            message,
        },
        other => other,
    }
}

/// Where a new workload is stored: its allocation, and its node once it has one.
struct Place {
    allocation_id: AllocationId,
    team_id: TeamId,
    node_id: Option<NodeId>,
    hostname: String,
    /// The devices it sees.
    devices: Vec<AllocatedDevice>,
    state: WorkloadState,
    owned: bool,
}

/// A process runs on one node: the first device's node, its hostname, and the
/// allocation's devices there. `None` while the allocation has no device.
fn node_devices(all: &[AllocatedDevice]) -> Option<(NodeId, String, Vec<AllocatedDevice>)> {
    let first = all.first()?;
    let (node, hostname) = (first.node_id, first.hostname.clone());
    let here = all.iter().filter(|d| d.node_id == node).cloned().collect();
    Some((node, hostname, here))
}

/// Which workloads to list.
#[derive(Debug, Clone, Default)]
pub struct WorkloadFilter {
    pub kind: Option<WorkloadKind>,
    pub team: Option<TeamId>,
    pub allocation: Option<AllocationId>,
    /// Only the caller's own.
    pub mine: bool,
    /// Only the ones not ended.
    pub live: bool,
}

/// Where the proxy sends a notebook's requests.
#[derive(Debug, Clone)]
pub struct ProxyTarget {
    pub workload_id: WorkloadId,
    /// `host:port`.
    pub endpoint: String,
    /// Sent upstream as `Authorization: token …`; never shown to the browser.
    pub token: String,
    /// `/user/{owner}/{name}/`: every proxied path stays under it.
    pub base_path: String,
}

/// How long a one-time notebook code is good for.
pub const NOTEBOOK_CODE_TTL_SECS: i64 = 60;
/// How long a notebook pass (the notebook origin's cookie) is good for.
pub const NOTEBOOK_PASS_TTL_HOURS: i64 = 12;

/// A way into a notebook's own origin: the one-time code for its entry redirect.
#[derive(Debug, Clone)]
pub struct NotebookEntry {
    pub workload_id: WorkloadId,
    pub code: String,
    pub base_path: String,
}

/// Why the proxy cannot forward yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// Starting; the page should show progress and retry.
    Starting(WorkloadState),
}

/// What one [`Workloads::tick`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadTick {
    /// Gang members stopped because another member failed or rank 0 ended.
    pub gang_stopped: u32,
    /// Own allocations admitted because the team's quota had room again.
    pub admitted: u32,
    /// Queued workloads whose own allocation became active: now pending on its node.
    pub started_queued: u32,
    /// Allocations given back because the workload that owned them ended.
    pub released_allocations: u32,
    /// Jobs whose own allocation was preempted, queued again for a new one.
    pub requeued: u32,
    pub stopped_for_allocation: u32,
    pub reclaimed_idle: u32,
    pub lost: u32,
}

#[derive(Clone)]
pub struct Workloads {
    store: Store,
    clock: Clock,
    allocations: Allocations,
    cfg: WorkloadConfig,
    /// Seal tokens and environments at rest (`secrets.rs`).
    keys: Arc<crate::at_rest::DataKeys>,
    /// Platform admins' proxy use is audited once per (admin, notebook) and hour.
    admin_audited: Arc<Mutex<AuditedAccess>>,
    /// The image catalog and registry logins (`image` of a new workload, its spec's login).
    images: crate::services::images::Images,
}

/// When each (admin, notebook) pair was last audited.
type AuditedAccess = HashMap<(UserId, WorkloadId), DateTime<Utc>>;

/// Environment values may be secrets: only the workload's owner and platform admins see
/// them; other readers get the names.
fn redact(mut v: WorkloadView, p: &Principal) -> WorkloadView {
    if v.user_id != p.user_id() && !p.is_admin() {
        for e in &mut v.env {
            e.value = String::from("(hidden)");
        }
    }
    v
}

/// Whether an allocation of `kind` is a share of a shared GPU.
fn is_share(kind: &GpuKind) -> bool {
    matches!(kind, GpuKind::Share { .. })
}

/// A share's limits on its GPU: the milli-GPU, and as much of the GPU's memory (what
/// workloads can use: a MIG model's full-GPU profile, else the GPU's memory). `None` for
/// other kinds, or when the GPU is not shared (any more): the node then limits nothing.
fn share_limits(
    kind: &GpuKind,
    devices: &[AllocatedDevice],
    shared: &HashMap<String, ShareMethod>,
    catalog: &Catalog,
) -> Option<ShareLimits> {
    let GpuKind::Share { model, milli } = kind else {
        return None;
    };
    let gpu = devices.first()?;
    let method = *shared.get(&gpu.gpu_uuid)?;
    let total = catalog.get(model).map_or(0, |m| m.memory_mib());
    Some(ShareLimits {
        method,
        gpu_uuid: gpu.gpu_uuid.clone(),
        milli: *milli,
        memory_mib: total * u64::from(*milli) / 1000,
    })
}

fn run_id(w: &WorkloadRow) -> String {
    if w.attempt <= 1 {
        w.id.to_string()
    } else {
        format!("{}.{}", w.id, w.attempt)
    }
}

/// Where a live notebook's traffic goes, once it runs (`token` opened from the row).
fn target_of(row: &WorkloadListRow, token: Option<String>) -> Result<ProxyTarget, NotReady> {
    let state = row.w.state;
    match (state, &row.w.endpoint, token) {
        (WorkloadState::Running, Some(endpoint), Some(token)) => Ok(ProxyTarget {
            workload_id: row.w.id,
            endpoint: endpoint.clone(),
            token,
            base_path: wl::notebook_base_path(&row.username, &row.w.name),
        }),
        _ => Err(NotReady::Starting(state)),
    }
}

/// The state a stopped workload ends in: a notebook is stopped, a job cancelled.
fn stop_end(w: &WorkloadRow) -> WorkloadState {
    if w.kind == WorkloadKind::Notebook {
        WorkloadState::Stopped
    } else {
        WorkloadState::Cancelled
    }
}

/// Why a workload stops when its allocation ended.
fn allocation_gone(alloc: AllocState) -> String {
    if alloc == AllocState::Expired {
        "its time limit was reached (its allocation expired)".to_owned()
    } else {
        format!("its allocation is {}", alloc.label().to_lowercase())
    }
}

fn device_uuid(d: &AllocatedDevice) -> String {
    d.mig_uuid.clone().unwrap_or_else(|| d.gpu_uuid.clone())
}

fn profile_view(r: ProfileRow) -> NotebookProfile {
    let kind_label = r.kind.label();
    NotebookProfile {
        id: r.id,
        team_id: r.team_id,
        team_name: r.team_name,
        name: r.name,
        kind: r.kind.to_string(),
        kind_label,
        hours: u32::try_from(r.duration_minutes / 60).unwrap_or(0),
        image_id: r.image_id,
        image_name: r.image_name,
    }
}

/// A random secret for a notebook (256 bits, hex).
fn new_token() -> String {
    let a = Uuid::new_v4().simple().to_string();
    let b = Uuid::new_v4().simple().to_string();
    format!("{a}{b}")
}

impl Workloads {
    pub fn new(store: Store, allocations: Allocations) -> Self {
        Workloads {
            store: store.clone(),
            clock: Clock::system(),
            allocations,
            cfg: WorkloadConfig::default(),
            keys: Arc::new(crate::at_rest::DataKeys::ephemeral()),
            admin_audited: Arc::new(Mutex::new(HashMap::new())),
            images: crate::services::images::Images::new(store.clone()),
        }
    }

    /// Reads the time from `clock` instead of the system's.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Chooses images from (and reads registry logins of) this service; give it the one
    /// with the server's data keys.
    pub fn with_images(mut self, images: crate::services::images::Images) -> Self {
        self.images = images;
        self
    }

    pub fn with_config(mut self, cfg: WorkloadConfig) -> Self {
        self.cfg = cfg;
        self
    }

    pub fn config(&self) -> &WorkloadConfig {
        &self.cfg
    }

    // ---- use cases ----

    /// Launches a JupyterLab named `name` on the caller's active allocation.
    pub async fn launch_notebook(
        &self,
        p: &Principal,
        req: &NewNotebook,
    ) -> Result<WorkloadView, AppError> {
        let name = ServerName::parse(&req.name)?;
        let env = req.env.clone();
        let (from_profile, profile_image) = match req.profile_id {
            Some(id) if req.allocation_id.is_none() && req.gpu.is_none() => {
                let (gpu, image) = self.profile_request(p, id).await?;
                (Some(gpu), image.map(|i| i.to_string()))
            }
            Some(_) => {
                return Err(AppError::invalid(
                    "profile_id",
                    "give a profile, an allocation or a GPU, not several",
                ));
            }
            None => (None, None),
        };
        let image = req.image.clone().or(profile_image);
        let target = match &from_profile {
            Some(gpu) => Target::Profile(gpu),
            None => Target::of(req.allocation_id, req.gpu.as_ref())?,
        };
        self.create(
            p,
            target,
            None,
            WorkloadKind::Notebook,
            name.as_str(),
            "",
            "",
            &env,
            0,
            image.as_deref(),
            req.idempotency_key.as_deref(),
        )
        .await
    }

    /// Submits a training job on the caller's active allocation.
    pub async fn submit_job(&self, p: &Principal, req: &NewJob) -> Result<WorkloadView, AppError> {
        let command = JobCommand::parse(&req.command)?;
        let workdir = wl::parse_workdir(&req.workdir)?;
        let mut env = req.env.clone();
        if let Some(i) = req.array_index {
            // Tessera's own variable (a request's env may not set `TESSERA_*` names).
            env.push(EnvVar {
                name: "TESSERA_ARRAY_INDEX".into(),
                value: i.to_string(),
            });
        }
        let retries = wl::check_retries(req.retries)?;
        let name = req.name.trim();
        if name.chars().count() > 80 {
            return Err(AppError::invalid("name", "at most 80 characters"));
        }
        let name = if name.is_empty() {
            command.as_str().chars().take(40).collect::<String>()
        } else {
            name.to_owned()
        };
        let nodes = req.gpu.as_ref().and_then(|g| g.nodes);
        let gang = match (nodes, req.launcher) {
            (Some(_), launcher) => Some(launcher.unwrap_or_default()),
            (None, Some(_)) => {
                return Err(AppError::invalid(
                    "launcher",
                    "only a multi-node job (gpu with nodes) has a launcher",
                ));
            }
            (None, None) => None,
        };
        let ranks = req.ranks.unwrap_or_default();
        if ranks == tessera_domain::alloc::Ranks::PerGpu {
            match gang {
                None => {
                    return Err(AppError::invalid(
                        "ranks",
                        "only a multi-node job (gpu with nodes) has ranks",
                    ));
                }
                Some(GangLauncher::Rank0) => {
                    return Err(AppError::invalid(
                        "ranks",
                        "with `launcher: rank0`, mpirun starts a process per slot itself \
                         (the hostfile gives each node its GPUs as slots): leave ranks out",
                    ));
                }
                Some(GangLauncher::Each) => {}
            }
        }
        let gang = gang.map(|l| (l, ranks));
        self.create(
            p,
            Target::of(req.allocation_id, req.gpu.as_ref())?,
            gang,
            WorkloadKind::Job,
            &name,
            command.as_str(),
            &workdir,
            &env,
            retries,
            req.image.as_deref(),
            req.idempotency_key.as_deref(),
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn create(
        &self,
        p: &Principal,
        target: Target<'_>,
        gang: Option<(GangLauncher, tessera_domain::alloc::Ranks)>,
        kind: WorkloadKind,
        name: &str,
        command: &str,
        workdir: &str,
        env: &[EnvVar],
        retries: u32,
        image: Option<&str>,
        key: Option<&str>,
    ) -> Result<WorkloadView, AppError> {
        let key = key.map(str::trim).filter(|k| !k.is_empty());
        if let Some(k) = key {
            if k.len() > 200 {
                return Err(AppError::invalid(
                    "idempotency_key",
                    "at most 200 characters",
                ));
            }
            if let Some(id) = self.by_key(p, k).await? {
                return self.get(p, id).await;
            }
        }
        let image = image.map(str::trim).filter(|i| !i.is_empty());
        let nodes = match target {
            Target::NewGpu(g) => g.nodes,
            Target::Allocation(_) | Target::Profile(_) => None,
        };
        if nodes.is_some() && gang.is_none() {
            return Err(AppError::invalid(
                "nodes",
                "only a job runs on several nodes; a notebook runs on one",
            ));
        }
        if let (Some(_), Target::NewGpu(gpu)) = (nodes, target) {
            self.check_gang(gpu).await?;
        }
        let (place, chosen) = match target {
            Target::Allocation(id) => {
                let place = self.on_allocation(p, id).await?;
                let chosen = match image {
                    Some(i) => Some(self.images.choose(place.team_id, i).await?),
                    None => None,
                };
                if let (Some(c), Some(node)) = (&chosen, place.node_id) {
                    self.check_driver(node, c).await?;
                }
                (place, chosen)
            }
            Target::NewGpu(gpu) => {
                let mut gpu = gpu.clone();
                let chosen = match image {
                    Some(i) => {
                        let team = self.paying_team(p, &gpu).await?;
                        gpu.team_id = team.to_string();
                        // The image's need replaces whatever the request said.
                        gpu.needs_cuda = None;
                        Some(self.images.choose(team, i).await?)
                    }
                    None => None,
                };
                if gpu.team_id.trim().is_empty() {
                    gpu.team_id = self.only_team(p).await?.to_string();
                }
                let mut typed = self.allocations.parse(&gpu).map_err(as_gpu_error)?;
                if let Some(c) = &chosen {
                    typed.needs_cuda = c.requires_cuda;
                }
                (
                    self.own_allocation(p, typed, kind, name, key).await?,
                    chosen,
                )
            }
            Target::Profile(gpu) => {
                let mut typed = gpu.clone();
                let chosen = match image {
                    Some(i) => Some(self.images.choose(typed.team_id, i).await?),
                    None => None,
                };
                typed.needs_cuda = chosen.as_ref().and_then(|c| c.requires_cuda);
                (
                    self.own_allocation(p, typed, kind, name, key).await?,
                    chosen,
                )
            }
        };
        let base = wl::notebook_base_path(p.username().as_str(), name);
        let mut row = WorkloadRow {
            node_id: place.node_id,
            hostname: place.hostname,
            devices: place.devices,
            command: command.into(),
            workdir: workdir.into(),
            retries: i64::from(retries),
            idempotency_key: key.map(str::to_owned),
            owns_allocation: place.owned,
            gang_size: nodes.map(i64::from),
            gang_launcher: nodes.and(gang).map(|(l, _)| l),
            gang_ranks: nodes
                .and(gang)
                .filter(|(_, r)| *r == tessera_domain::alloc::Ranks::PerGpu)
                .map(|(_, r)| r),
            image: chosen.as_ref().map(|c| c.pinned.clone()),
            image_cuda: chosen
                .as_ref()
                .and_then(|c| c.requires_cuda)
                .map(|v| v.to_string()),
            ..WorkloadRow::new(
                kind,
                name,
                (place.allocation_id, place.team_id, p.user_id()),
                place.state,
                self.clock.now(),
            )
        };
        // A notebook's token; a gang's secret (its members' remote agents check it).
        let token = (kind == WorkloadKind::Notebook || nodes.is_some()).then(new_token);
        self.seal_secrets(&mut row, token.as_deref(), env)?;
        let inserted = self
            .store
            .insert_workload(&row)
            .await
            .map_err(internal("storing workload"))?;
        if inserted {
            self.tell_node(row.node_id);
        }
        if !inserted {
            // A concurrent request with the same key made it (and owns the same allocation).
            if let Some(k) = key
                && let Some(id) = self.by_key(p, k).await?
            {
                return self.get(p, id).await;
            }
            if place.owned {
                self.allocations
                    .release_for_system(place.allocation_id, "its workload could not start")
                    .await?;
            }
            return Err(self
                .why_not_inserted(p, key, place.allocation_id, kind, name)
                .await);
        }
        let what = if kind == WorkloadKind::Notebook {
            format!("notebook {base}")
        } else {
            format!("job {name}")
        };
        self.audit(
            Some(p.username().as_str()),
            AuditAction::start(kind),
            row.id,
            row.team_id,
            &what,
        )
        .await;
        self.get(p, row.id).await
    }

    /// The team a GPU request of the caller's pays with (its `team_id`, else the caller's
    /// only team), which the caller must be able to read (else `team_id: no such team`,
    /// before anything of the team's catalog is looked at).
    async fn paying_team(&self, p: &Principal, gpu: &NewAllocation) -> Result<TeamId, AppError> {
        let team = match gpu.team_id.trim() {
            "" => self.only_team(p).await?,
            t => TeamId::parse(t).ok_or_else(|| AppError::invalid("team_id", "not a team id"))?,
        };
        authz::team(&self.store, p, team, Need::Read)
            .await
            .map_err(|e| match e {
                AppError::NotFound => AppError::invalid("team_id", "no such team"),
                other => other,
            })?;
        Ok(team)
    }

    /// An image that needs a newer CUDA than the allocation's node supports is refused
    /// (the allocation is placed already; a workload with its own GPU request is placed
    /// on a node that runs it instead).
    async fn check_driver(
        &self,
        node: NodeId,
        image: &super::images::Chosen,
    ) -> Result<(), AppError> {
        let Some(need) = image.requires_cuda else {
            return Ok(());
        };
        let rows = self
            .store
            .node_inventories(&[node])
            .await
            .map_err(internal("loading inventory"))?;
        let driver = rows
            .first()
            .and_then(|(id, _, json)| crate::services::parsed_inventory(*id, json).driver.clone());
        match driver {
            Some(d) if d.cuda >= need => Ok(()),
            Some(d) => Err(AppError::invalid(
                "image",
                format!(
                    "the image needs CUDA ≥ {need}; the allocation's node runs driver {} (CUDA {}). \
                     Request a GPU for the workload instead, and it is placed on a node that runs it",
                    d.version, d.cuda
                ),
            )),
            None => Err(AppError::invalid(
                "image",
                format!(
                    "the image needs CUDA ≥ {need}; the allocation's node does not report its \
                     driver. Request a GPU for the workload instead"
                ),
            )),
        }
    }

    /// Where a workload on an existing allocation runs: the caller's own, active one.
    async fn on_allocation(
        &self,
        p: &Principal,
        allocation_id: AllocationId,
    ) -> Result<Place, AppError> {
        let alloc = self
            .allocations
            .row(allocation_id)
            .await?
            .ok_or_else(|| AppError::invalid("allocation_id", "no such allocation"))?;
        let access = authz::team(&self.store, p, alloc.a.team_id, Need::Read)
            .await
            .map_err(|e| match e {
                AppError::NotFound => AppError::invalid("allocation_id", "no such allocation"),
                other => other,
            })?;
        // Viewers read; they launch nothing, even on an allocation they held as a member.
        if access.role == Some(TeamRole::Viewer) {
            return Err(AppError::Forbidden);
        }
        if alloc.a.user_id != p.user_id() {
            return Err(AppError::invalid(
                "allocation_id",
                "workloads run on your own allocations only",
            ));
        }
        let state = alloc.a.state;
        if state != AllocState::Active {
            return Err(AppError::invalid(
                "allocation_id",
                format!(
                    "the allocation is {}; workloads start once it is active",
                    state.label().to_lowercase()
                ),
            ));
        }
        let (node, hostname, devices) = node_devices(&alloc.a.devices).ok_or_else(|| {
            AppError::invalid("allocation_id", "the allocation has no device yet")
        })?;
        Ok(Place {
            allocation_id,
            team_id: alloc.a.team_id,
            node_id: Some(node),
            hostname,
            devices,
            state: WorkloadState::Pending,
            owned: false,
        })
    }

    /// Requests the workload's own allocation (same quota, approval and queue as any
    /// request, in the caller's only team unless it names one); the workload waits
    /// `queued` for it.
    async fn own_allocation(
        &self,
        p: &Principal,
        mut req: TypedRequest,
        kind: WorkloadKind,
        name: &str,
        key: Option<&str>,
    ) -> Result<Place, AppError> {
        if req.purpose.trim().is_empty() {
            req.purpose = format!("{} `{name}`", kind.as_str());
        }
        // The same key finds the same allocation again when a request is repeated.
        let key = key.map(|k| format!("{}:{k}", kind.as_str()));
        let a = self
            .allocations
            .request(p, &req, key.as_deref())
            .await
            .map_err(as_gpu_error)?;
        Ok(Place {
            allocation_id: a.id,
            team_id: a.team_id,
            node_id: None,
            hostname: String::new(),
            devices: Vec::new(),
            state: WorkloadState::Queued,
            owned: true,
        })
    }

    async fn why_not_inserted(
        &self,
        p: &Principal,
        key: Option<&str>,
        allocation: AllocationId,
        kind: WorkloadKind,
        name: &str,
    ) -> AppError {
        if let Some(k) = key
            && let Ok(Some(_)) = self.store.workload_by_key(p.user_id(), k).await
        {
            return AppError::conflict("this idempotency key was used concurrently; retry");
        }
        if let Ok((rows, _)) = self
            .store
            .list_workloads(None, None, None, Some(allocation), true, 0, 1)
            .await
            && let Some(r) = rows.first()
        {
            return AppError::invalid(
                "allocation_id",
                format!(
                    "the allocation already runs {} `{}`; stop it first or request another allocation",
                    r.w.kind.as_str(),
                    r.w.name
                ),
            );
        }
        if kind == WorkloadKind::Notebook {
            return AppError::invalid(
                "name",
                format!("you already have a running notebook named `{name}`"),
            );
        }
        AppError::conflict("the workload could not be stored; retry")
    }

    async fn by_key(&self, p: &Principal, key: &str) -> Result<Option<WorkloadId>, AppError> {
        self.store
            .workload_by_key(p.user_id(), key)
            .await
            .map_err(internal("loading workload by key"))
    }

    /// GPU-minutes of jobs' attempts ended by a preemption, ever (a metric: what
    /// preemption costs the platform).
    pub async fn preempted_gpu_minutes(&self) -> Result<f64, AppError> {
        let ms = self
            .store
            .preempted_gpu_ms()
            .await
            .map_err(internal("loading attempts"))?;
        Ok(ms as f64 / 60_000.0)
    }

    /// One workload; another team's is `NotFound`.
    pub async fn get(&self, p: &Principal, id: WorkloadId) -> Result<WorkloadView, AppError> {
        let row = self.visible(p, id).await?;
        let mut v = redact(self.view(&row), p);
        if row.w.kind == WorkloadKind::Notebook && row.w.state == WorkloadState::Running {
            let now = self.clock.now();
            let s = self.signals(&row.w, now).await?;
            v.idle = Some(self.decide(&row.w, &s, now));
            v.activity = Some(s);
        }
        if row.w.state == WorkloadState::Queued {
            v.waiting = self.waiting(p, &row).await;
        }
        if row.w.gang_size.is_some()
            && row.w.gang_job.is_none()
            && row.w.state != WorkloadState::Queued
        {
            v.ranks = self.rank_views(row.w.id).await?;
        }
        if row.w.attempt > 1 {
            v.attempts = self
                .store
                .workload_attempts(row.w.id)
                .await
                .map_err(internal("loading attempts"))?;
        }
        Ok(v)
    }

    /// Why a queued workload's allocation is not active yet: the allocation's own
    /// explanation (place in the queue, why the planner cannot place it, ETA), or that it
    /// waits for approval.
    async fn waiting(&self, p: &Principal, row: &WorkloadListRow) -> Option<String> {
        let a = self.allocations.get(p, row.w.allocation_id).await.ok()?;
        if let Some(pending) = a.pending {
            return Some(pending.reason);
        }
        Some(match a.state {
            AllocState::PendingApproval => format!(
                "it waits for room in the team's quota ({}); it is admitted as soon as the \
                 team's other work frees some, or sooner if an admin approves it",
                a.approval_reason
                    .unwrap_or_else(|| "the quota is in use".into())
            ),
            AllocState::Placing => "its GPU is being set up on the node".into(),
            AllocState::Active => "its GPU is ready; it starts on the next scheduler pass".into(),
            other => format!("its GPU request is {}", other.label().to_lowercase()),
        })
    }

    async fn visible(&self, p: &Principal, id: WorkloadId) -> Result<WorkloadListRow, AppError> {
        let row = found("loading workload", self.store.workload(id).await)?;
        authz::team(&self.store, p, row.w.team_id, Need::Read).await?;
        Ok(row)
    }

    /// Visible, and the caller may act on it (stop it, read its log): its owner, a team
    /// admin of its team, or a platform admin. Other members of the team get `Forbidden`.
    async fn actionable(&self, p: &Principal, id: WorkloadId) -> Result<WorkloadListRow, AppError> {
        let row = self.visible(p, id).await?;
        if row.w.user_id == p.user_id() || p.is_admin() {
            return Ok(row);
        }
        authz::team(&self.store, p, row.w.team_id, Need::ManageMembers).await?;
        Ok(row)
    }

    /// Workloads the caller may see, newest first.
    pub async fn list(
        &self,
        p: &Principal,
        f: &WorkloadFilter,
        page: PageRequest,
    ) -> Result<Page<WorkloadView>, AppError> {
        let page = page.clamped();
        let teams = authz::readable_teams(&self.store, p, f.team).await?;
        let user = f.mine.then_some(p.user_id());
        let (rows, total) = self
            .store
            .list_workloads(
                teams.as_deref(),
                user,
                f.kind.map(WorkloadKind::as_str),
                f.allocation,
                f.live,
                page.offset,
                page.limit,
            )
            .await
            .map_err(internal("listing workloads"))?;
        Ok(paged(
            rows.iter().map(|r| redact(self.view(r), p)).collect(),
            i64::try_from(total).unwrap_or(i64::MAX),
            page,
        ))
    }

    /// Stops a notebook or cancels a job (owner, team admin, platform admin), warning it
    /// first where it listens ([`Workloads::stop_with`]).
    pub async fn stop(&self, p: &Principal, id: WorkloadId) -> Result<WorkloadView, AppError> {
        self.stop_with(p, id, false).await
    }

    /// Stops a notebook or cancels a job (owner, team admin, platform admin). A running
    /// workload that asked for the warning signal (`TESSERA_DEADLINE_SIGNAL`), or whose
    /// team set a grace, is first warned through the deadline channel (cause `stop`: the
    /// deadline file and the signal) and stays `stopping` for the stop grace
    /// ([`drain::stop_grace`]: at most 30 s), then gets SIGTERM and SIGKILL. `immediate`,
    /// or a second stop during that grace, stops it at once; so does a stop of work that
    /// has not started.
    pub async fn stop_with(
        &self,
        p: &Principal,
        id: WorkloadId,
        immediate: bool,
    ) -> Result<WorkloadView, AppError> {
        let row = self.actionable(p, id).await?;
        let state = row.w.state;
        if !state.is_live() {
            return Err(AppError::conflict(format!(
                "the {} has {} already",
                row.w.kind.as_str(),
                state.label().to_lowercase()
            )));
        }
        let action = AuditAction::stop(row.w.kind);
        let now = self.clock.now();
        if state == WorkloadState::Stopping {
            // A second stop during the stop grace: at once.
            if row.deadline_cause == Some(DeadlineCause::Stop)
                && row.deadline_at.is_some_and(|d| d > now)
                && self
                    .store
                    .clear_workload_deadline(id, DeadlineCause::Stop)
                    .await
                    .map_err(internal("stopping workload"))?
            {
                let msg = format!("stopped at once by {}", p.username());
                self.audit(Some(p.username().as_str()), action, id, row.w.team_id, &msg)
                    .await;
            }
            return self.get(p, id).await;
        }
        let mut msg = format!("stopped by {}", p.username());
        let grace = if state == WorkloadState::Running && row.alloc_state == AllocState::Active {
            drain::stop_grace(
                row.team_grace_secs,
                self.allocations.max_grace(),
                !self.warning_signal(&row.w).is_empty(),
                immediate,
            )
        } else {
            None
        };
        let mut warned = false;
        if let Some(g) = grace {
            // Told before it is `stopping`: the node never sees it stopping untold.
            let at = now + g;
            warned = self
                .store
                .set_workload_deadline(id, state.as_str(), at, DeadlineCause::Stop)
                .await
                .map_err(internal("warning workload"))?;
            if warned {
                msg = format!(
                    "{msg}; warned, it gets SIGTERM at {} UTC",
                    at.format("%H:%M:%S")
                );
            }
        }
        if let Err(e) = self.request_stop(&row.w, &msg).await {
            if warned {
                let _ = self
                    .store
                    .clear_workload_deadline(id, DeadlineCause::Stop)
                    .await;
            }
            return Err(e);
        }
        self.audit(Some(p.username().as_str()), action, id, row.w.team_id, &msg)
            .await;
        self.get(p, id).await
    }

    /// The signal `w` asked to be warned with (`TESSERA_DEADLINE_SIGNAL`), or `""`.
    fn warning_signal(&self, w: &WorkloadRow) -> &'static str {
        self.env_of(w)
            .unwrap_or_default()
            .iter()
            .find(|v| v.name == drain::SIGNAL_VAR)
            .and_then(|v| drain::signal_of(&v.value))
            .unwrap_or_default()
    }

    /// Part of a workload's log from byte `from` (default: the last `max` bytes kept).
    pub async fn logs(
        &self,
        p: &Principal,
        id: WorkloadId,
        from: Option<u64>,
        max: u64,
    ) -> Result<LogSlice, AppError> {
        let row = self.actionable(p, id).await?;
        let max = max.clamp(1024, 1024 * 1024);
        let start = u64::try_from(row.w.log_start).unwrap_or(0);
        let stored = u64::try_from(row.w.log_stored).unwrap_or(0);
        let from = from
            .unwrap_or_else(|| stored.saturating_sub(max))
            .max(start);
        let chunks = self
            .store
            .log_chunks(id, from, max)
            .await
            .map_err(internal("loading log"))?;
        let offset = chunks
            .first()
            .map_or(from, |c| u64::try_from(c.offset_b).unwrap_or(0));
        let next = chunks.last().map_or(from.min(stored), |c| {
            u64::try_from(c.offset_b + c.len_b).unwrap_or(0)
        });
        let text: String = chunks.iter().map(|c| c.text.as_str()).collect();
        Ok(LogSlice {
            offset,
            next,
            start,
            text,
            complete: !row.w.state.is_live() && row.w.log_complete && next >= stored,
        })
    }

    /// The whole log kept for a workload (at most the configured bound), for download.
    pub async fn log_text(
        &self,
        p: &Principal,
        id: WorkloadId,
    ) -> Result<(String, String), AppError> {
        let row = self.actionable(p, id).await?;
        let mut out = String::new();
        let mut from = u64::try_from(row.w.log_start).unwrap_or(0);
        loop {
            let chunks = self
                .store
                .log_chunks(id, from, 1024 * 1024)
                .await
                .map_err(internal("loading log"))?;
            let Some(last) = chunks.last() else { break };
            from = u64::try_from(last.offset_b + last.len_b).unwrap_or(u64::MAX);
            for c in &chunks {
                out.push_str(&c.text);
            }
        }
        let file = format!(
            "{}-{}.log",
            row.w.kind.as_str(),
            row.w
                .name
                .replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_")
        );
        Ok((file, out))
    }

    fn view(&self, r: &WorkloadListRow) -> WorkloadView {
        let w = &r.w;
        let kind = w.kind;
        let state = w.state;
        let devices = &w.devices;
        let url = (kind == WorkloadKind::Notebook && state == WorkloadState::Running)
            .then(|| format!("{}lab", wl::notebook_base_path(&r.username, &w.name)));
        WorkloadView {
            id: w.id,
            kind,
            name: w.name.clone(),
            allocation_id: w.allocation_id,
            team_id: w.team_id,
            team_name: r.team_name.clone(),
            user_id: w.user_id,
            username: r.username.clone(),
            state,
            command: w.command.clone(),
            workdir: w.workdir.clone(),
            // A row no key opens was already logged; its view shows no environment.
            env: self.env_of(w).unwrap_or_default(),
            retries: u32::try_from(w.retries).unwrap_or(0),
            attempt: u32::try_from(w.attempt).unwrap_or(1),
            exit_code: w.exit_code.and_then(|c| i32::try_from(c).ok()),
            message: w.message.clone(),
            created_at: w.created_at,
            started_at: w.started_at,
            ready_at: w.ready_at,
            ended_at: w.ended_at,
            hostname: (!w.hostname.is_empty()).then(|| w.hostname.clone()),
            device: (!devices.is_empty()).then(|| {
                devices
                    .iter()
                    .map(device_uuid)
                    .collect::<Vec<_>>()
                    .join(", ")
            }),
            url,
            activity: None,
            idle: None,
            owns_allocation: w.owns_allocation,
            image: w.image.clone(),
            pull: w
                .pull_done
                .zip(w.pull_total)
                .filter(|_| matches!(w.state, WorkloadState::Pending | WorkloadState::Starting))
                .map(|(d, t)| wl::PullView {
                    done_bytes: u64::try_from(d).unwrap_or(0),
                    total_bytes: u64::try_from(t).unwrap_or(0),
                }),
            waiting: None,
            attempts: Vec::new(),
            ranks: Vec::new(),
        }
    }

    async fn audit(
        &self,
        actor: Option<&str>,
        action: AuditAction,
        id: WorkloadId,
        team: TeamId,
        after: &str,
    ) {
        self.audit_note("workload", actor, action, (id.0, team), after)
            .await;
    }

    /// Records `action` on the `object_type` `id` of `team` with a note; a failure to
    /// write it is logged, never the caller's error.
    pub(super) async fn audit_note(
        &self,
        object_type: &str,
        actor: Option<&str>,
        action: AuditAction,
        (id, team): (Uuid, TeamId),
        note: &str,
    ) {
        Entry::new(actor, action, object_type, id)
            .team(Some(team))
            .note(note)
            .record(&self.store, self.clock.now())
            .await;
    }
}
