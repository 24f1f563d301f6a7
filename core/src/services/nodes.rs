//! GPU nodes: join tokens, agent registration and heartbeats, the cluster view.

use super::authz;
use super::tenancy::paged;
use super::{found, internal};
use crate::auth::secret;
use crate::auth::{Principal, SystemActor};
use crate::clock::Clock;
use crate::services::audit::Entry;
use crate::store::{
    Beat, DesiredRow, DesiredWithStatus, DrainRow, HealthRow, HeldShareRow, JoinTokenRow, NodeRow,
    ReplicaRow, Store,
};
use chrono::{DateTime, Duration, Utc};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use tessera_domain::alloc::{AllocState, GpuKind};
use tessera_domain::audit::AuditAction;
use tessera_domain::cluster::{
    self, ClusterSummary, DesiredView, GpuView, NodeTelemetry, NodeView, ServerReplicaView,
    ShareTenantView, SharingView,
};
use tessera_domain::drain::{self, DrainRequest, DrainState, DrainView};
use tessera_domain::error::AppError;
use tessera_domain::health::{self, HealthView};
use tessera_domain::ids::NodeId;
use tessera_domain::mig::Catalog;
use tessera_domain::mig::Instance;
use tessera_domain::tenancy::{CreatedSecret, JoinTokenView, Page, PageRequest};
use tessera_domain::wire::{
    ApplyState, ApplyStatus, DesiredGpuState, DesiredInstance, DesiredState, GpuHealth, Heartbeat,
    Inventory, MigMode, RegisterRequest, RegisterResponse, ShareMethod, StatusReport, TelemetryAck,
    TelemetryBatch, TelemetrySample,
};
use uuid::Uuid;

/// A node that may report and take work: one the agent API authenticated by its
/// credential ([`Nodes::authenticate`]), or one the platform's own Kubernetes executor
/// reports for ([`NodeIdentity::for_executor`]). No request can make one up.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    pub(crate) id: NodeId,
    pub(crate) hostname: String,
}

impl NodeIdentity {
    /// A node the platform's executor runs workloads on (it reports as the node).
    pub fn for_executor(_: &SystemActor, id: NodeId, hostname: &str) -> Self {
        NodeIdentity {
            id,
            hostname: hostname.to_owned(),
        }
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn hostname(&self) -> &str {
        &self.hostname
    }
}

/// What `/metrics` reports about one node that is not revoked.
#[derive(Debug, Clone)]
pub struct NodeMetrics {
    pub id: NodeId,
    pub hostname: String,
    /// Seconds since the node was last heard from (heartbeat, else registration).
    pub last_seen_secs: f64,
    /// Samples the agent reports it had to drop, ever.
    pub telemetry_dropped: u64,
    pub inventory: Arc<Inventory>,
    /// The newest sample, only when younger than [`FRESH_SAMPLE_SECS`]: a node that
    /// stopped reporting has no current values.
    pub latest: Option<TelemetrySample>,
}

/// A node's newest telemetry sample counts as current for this long.
pub const FRESH_SAMPLE_SECS: i64 = 120;

/// The cluster summary is reused this long (dashboards and `/metrics` ask for it often,
/// and it reads every node's inventory); this replica's own node changes drop it at once.
const SUMMARY_FOR: std::time::Duration = std::time::Duration::from_secs(1);

type Summary = (ClusterSummary, Vec<(bool, Arc<Inventory>)>);

#[derive(Clone)]
pub struct Nodes {
    store: Store,
    clock: Clock,
    catalog: Arc<Catalog>,
    summary: Arc<std::sync::Mutex<Option<(std::time::Instant, Summary)>>>,
    /// Wakes a node's agent after a change of its desired state.
    signals: Arc<crate::signals::NodeSignals>,
    /// Wakes the scheduler when a node reports a new inventory (an instance it created
    /// can be activated now).
    scheduler: Arc<tokio::sync::Notify>,
    /// Per node: the hash of the inventory last stored by this process and the
    /// `inventory_version` it got, so an unchanged inventory is not written again.
    stored_inventory: Arc<std::sync::Mutex<HashMap<NodeId, (u64, i64)>>>,
}

impl Nodes {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            clock: Clock::system(),
            catalog: Arc::new(Catalog::builtin()),
            summary: Arc::default(),
            signals: Arc::default(),
            scheduler: Arc::default(),
            stored_inventory: Arc::default(),
        }
    }

    /// Reads the time from `clock` instead of the system's.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Wakes agents through `signals` and the scheduler through `scheduler`.
    pub fn with_signals(
        mut self,
        signals: Arc<crate::signals::NodeSignals>,
        scheduler: Arc<tokio::sync::Notify>,
    ) -> Self {
        self.signals = signals;
        self.scheduler = scheduler;
        self
    }

    /// Drops the reused summary (a node joined or was revoked here).
    fn forget_summary(&self) {
        if let Ok(mut s) = self.summary.lock() {
            *s = None;
        }
    }

    /// The MIG catalog GPU views are resolved against (built once).
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    // ---- join tokens (platform admin) ----

    pub async fn create_join_token(
        &self,
        p: &Principal,
        note: &str,
        max_uses: u32,
        expires_in_hours: u32,
    ) -> Result<CreatedSecret<JoinTokenView>, AppError> {
        authz::admin(p)?;
        let note = note.trim();
        if note.chars().count() > 128 {
            return Err(AppError::invalid("note", "must be at most 128 characters"));
        }
        if !(1..=1000).contains(&max_uses) {
            return Err(AppError::invalid("max_uses", "must be between 1 and 1000"));
        }
        if !(1..=24 * 30).contains(&expires_in_hours) {
            return Err(AppError::invalid(
                "expires_in_hours",
                "must be between 1 and 720 hours (30 days)",
            ));
        }
        let (secret, hash) = secret::generate("tsj");
        let now = self.clock.now();
        let row = JoinTokenRow {
            id: Uuid::new_v4(),
            note: note.to_owned(),
            prefix: secret::prefix(&secret),
            secret_hash: hash,
            created_by: p.user_id(),
            created_at: now,
            expires_at: now + Duration::hours(i64::from(expires_in_hours)),
            max_uses: i64::from(max_uses),
            uses: 0,
            revoked: false,
        };
        self.store
            .insert_join_token(&row)
            .await
            .map_err(internal("creating join token"))?;
        tracing::info!(by = %p.username(), token = %row.prefix, max_uses, "join token created");
        Ok(CreatedSecret {
            token: join_view(&row),
            secret,
        })
    }

    pub async fn list_join_tokens(
        &self,
        p: &Principal,
        page: PageRequest,
    ) -> Result<Page<JoinTokenView>, AppError> {
        authz::admin(p)?;
        let page = page.clamped();
        let (rows, total) = self
            .store
            .list_join_tokens(page.offset, page.limit)
            .await
            .map_err(internal("listing join tokens"))?;
        Ok(paged(rows.iter().map(join_view).collect(), total, page))
    }

    pub async fn revoke_join_token(&self, p: &Principal, id: Uuid) -> Result<(), AppError> {
        authz::admin(p)?;
        if self
            .store
            .revoke_join_token(id)
            .await
            .map_err(internal("revoking join token"))?
        {
            Ok(())
        } else {
            Err(AppError::NotFound)
        }
    }

    // ---- the agent side ----

    /// Trades a join token for a node credential. Bad, expired, used-up or revoked tokens
    /// are refused and logged.
    pub async fn register(&self, req: &RegisterRequest) -> Result<RegisterResponse, AppError> {
        let hostname = req.hostname.trim();
        if hostname.is_empty() || hostname.len() > 253 {
            return Err(AppError::invalid("hostname", "must be 1 to 253 characters"));
        }
        let now = self.clock.now();
        let token = self
            .store
            .join_token_by_hash(&secret::hash(&req.join_token))
            .await
            .map_err(internal("loading join token"))?;
        let usable = token
            .as_ref()
            .is_some_and(|t| !t.revoked && t.uses < t.max_uses && now < t.expires_at);
        let Some(token) = token.filter(|_| usable) else {
            tracing::warn!(hostname, token = %secret::prefix(&req.join_token), "node registration refused: bad, expired, used or revoked join token");
            return Err(AppError::Unauthorized);
        };
        if !self
            .store
            .consume_join_token(token.id)
            .await
            .map_err(internal("using join token"))?
        {
            tracing::warn!(
                hostname,
                "node registration refused: join token used up concurrently"
            );
            return Err(AppError::Unauthorized);
        }
        let (credential, hash) = secret::generate("tsn");
        let row = NodeRow {
            id: NodeId(Uuid::new_v4()),
            hostname: hostname.to_owned(),
            credential_hash: hash,
            join_token_id: Some(token.id),
            registered_at: now,
            last_heartbeat_at: None,
            agent_version: req.agent_version.chars().take(64).collect(),
            manages_mig: false,
            workload_sandbox: false,
            inventory: r#"{"gpus":[]}"#.into(),
            revoked_at: None,
            inventory_version: 0,
            node_group: None,
        };
        self.store
            .insert_node(&row)
            .await
            .map_err(internal("registering node"))?;
        tracing::info!(node = %row.id, hostname, "node registered");
        self.forget_summary();
        Ok(RegisterResponse {
            node_id: row.id.to_string(),
            credential,
        })
    }

    /// The node behind a credential; revoked nodes and unknown credentials are refused
    /// and logged.
    pub async fn authenticate(&self, credential: &str) -> Result<NodeIdentity, AppError> {
        let node = self
            .store
            .node_by_credential(&secret::hash(credential))
            .await
            .map_err(internal("loading node"))?;
        match node {
            Some((id, hostname, None)) => Ok(NodeIdentity { id, hostname }),
            Some((id, hostname, Some(_))) => {
                tracing::warn!(node = %id, %hostname, "revoked node refused");
                Err(AppError::Unauthorized)
            }
            None => {
                tracing::warn!(credential = %secret::prefix(credential), "unknown node credential refused");
                Err(AppError::Unauthorized)
            }
        }
    }

    pub async fn heartbeat(&self, node: &NodeIdentity, hb: &Heartbeat) -> Result<(), AppError> {
        if hb.inventory.gpus.len() > 64 {
            return Err(AppError::invalid(
                "inventory.gpus",
                "at most 64 GPUs per node",
            ));
        }
        let inventory = serde_json::to_string(&hb.inventory).map_err(|_| AppError::Internal)?;
        let hash = {
            use std::hash::{Hash, Hasher};
            let mut h = std::hash::DefaultHasher::new();
            inventory.hash(&mut h);
            h.finish()
        };
        let now = self.clock.now();
        let known = self
            .stored_inventory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&node.id)
            .copied();
        // The same inventory as this process last stored: only the beat is written, and
        // only while the stored version is still the one that inventory got.
        let beat = Beat {
            id: node.id,
            at: now,
            agent_version: &hb.agent_version,
            manages_mig: hb.manages_mig,
            workload_sandbox: hb.workload_sandbox,
        };
        let unchanged = match known {
            Some((h, version)) if h == hash => self
                .store
                .record_heartbeat_unchanged(&beat, version)
                .await
                .map_err(internal("recording heartbeat"))?,
            _ => false,
        };
        if !unchanged {
            let version = self
                .store
                .record_heartbeat(&beat, &inventory)
                .await
                .map_err(internal("recording heartbeat"))?;
            let mut stored = self
                .stored_inventory
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match version {
                Some(v) => {
                    stored.insert(node.id, (hash, v));
                }
                None => {
                    stored.remove(&node.id);
                }
            }
            drop(stored);
            // A new inventory may show an instance the scheduler waits for (activation)
            // or capacity it can place on: it looks at once.
            self.scheduler.notify_one();
        }
        self.judge_health(node, &hb.inventory).await
    }

    /// GPU health from the reported counters (docs/operations.md): a GPU whose counters
    /// moved past what an admin last cleared turns unhealthy. Nothing is read or written
    /// while every counter is zero and nothing is stored for the node.
    async fn judge_health(&self, node: &NodeIdentity, inv: &Inventory) -> Result<(), AppError> {
        let reported: Vec<(&str, &GpuHealth)> = inv
            .gpus
            .iter()
            .filter_map(|g| Some((g.uuid.as_str(), g.health.as_ref()?)))
            .collect();
        let any = reported
            .iter()
            .any(|(_, h)| h.xid_count > 0 || h.ecc_uncorrected > 0 || h.retirement_pending);
        if !any {
            return Ok(());
        }
        let stored = self
            .store
            .gpu_health_of(node.id)
            .await
            .map_err(internal("loading GPU health"))?;
        let now = self.clock.now();
        for (gpu, h) in reported {
            let row = stored.iter().find(|r| r.gpu_uuid == gpu);
            let base = health::Baseline {
                xid_count: row.map_or(0, |r| u64::try_from(r.xid_base).unwrap_or(0)),
                ecc_uncorrected: row.map_or(0, |r| u64::try_from(r.ecc_base).unwrap_or(0)),
            };
            let (fault, kept) = health::judge(h, base);
            let already = row.is_some_and(|r| r.unhealthy_since.is_some());
            if (fault.is_none() || already) && kept == base {
                continue;
            }
            let turned = self
                .store
                .record_gpu_health(
                    &HealthRow {
                        node_id: node.id,
                        gpu_uuid: gpu.to_owned(),
                        xid_base: i64::try_from(kept.xid_count).unwrap_or(i64::MAX),
                        ecc_base: i64::try_from(kept.ecc_uncorrected).unwrap_or(i64::MAX),
                        unhealthy_since: None,
                        reason: None,
                    },
                    fault.as_deref().map(|f| (f, now)),
                )
                .await
                .map_err(internal("recording GPU health"))?;
            if turned {
                tracing::warn!(node = %node.id, hostname = %node.hostname, gpu,
                    reason = fault.as_deref().unwrap_or_default(),
                    "GPU unhealthy: no new work, its work is moved off");
                self.forget_summary();
            }
        }
        Ok(())
    }

    /// How many GPUs are unhealthy now (for `/metrics`).
    pub async fn unhealthy_count(&self) -> Result<usize, AppError> {
        Ok(self
            .store
            .unhealthy_gpus()
            .await
            .map_err(internal("loading GPU health"))?
            .len())
    }

    /// A platform admin marks a repaired GPU healthy again: the counters it reports now
    /// become its baseline. 409 when it is not unhealthy.
    pub async fn clear_health(
        &self,
        p: &Principal,
        id: NodeId,
        gpu: &str,
    ) -> Result<NodeView, AppError> {
        authz::admin(p)?;
        let row = self.node_row(id).await?;
        let inv = inventory(&row);
        let Some(g) = inv.gpus.iter().find(|g| g.uuid == gpu) else {
            return Err(AppError::NotFound);
        };
        let h = g.health.clone().unwrap_or_default();
        let cleared = self
            .store
            .clear_gpu_health(
                id,
                gpu,
                i64::try_from(h.xid_count).unwrap_or(i64::MAX),
                i64::try_from(h.ecc_uncorrected).unwrap_or(i64::MAX),
            )
            .await
            .map_err(internal("clearing GPU health"))?;
        if !cleared {
            return Err(AppError::conflict("this GPU is not marked unhealthy"));
        }
        tracing::info!(by = %p.username(), node = %id, gpu, "GPU health cleared");
        self.audit_node(p, AuditAction::NodeHealthClear, id, gpu)
            .await;
        self.forget_summary();
        self.view(&row, true, self.clock.now()).await
    }

    // ---- the user side ----

    /// Every signed-in user may see the cluster (what exists, not who uses it).
    pub async fn list(&self, p: &Principal, page: PageRequest) -> Result<Page<NodeView>, AppError> {
        let page = page.clamped();
        let (rows, total) = self
            .store
            .list_nodes(page.offset, page.limit)
            .await
            .map_err(internal("listing nodes"))?;
        let now = self.clock.now();
        let ids: Vec<NodeId> = rows.iter().map(|r| r.id).collect();
        let desired = self.desired_of(&ids).await?;
        let shares = self.held_shares(&desired).await?;
        let drains = self.drain_context().await?;
        let views = rows
            .iter()
            .map(|r| self.view_with(r, &desired, &shares, &drains, p.is_admin(), now))
            .collect();
        Ok(paged(views, total, page))
    }

    pub async fn get(&self, p: &Principal, id: NodeId) -> Result<NodeView, AppError> {
        let row = self.node_row(id).await?;
        self.view(&row, p.is_admin(), self.clock.now()).await
    }

    pub async fn revoke(&self, p: &Principal, id: NodeId) -> Result<NodeView, AppError> {
        authz::admin(p)?;
        let now = self.clock.now();
        self.store
            .revoke_node(id, now)
            .await
            .map_err(internal("revoking node"))?;
        let row = self.node_row(id).await?;
        tracing::info!(by = %p.username(), node = %id, hostname = %row.hostname, "node revoked");
        self.forget_summary();
        self.view(&row, true, now).await
    }

    /// Sets a node's group (platform admins): a rack or switch, `[A-Za-z0-9._-]`, at most
    /// 64 characters; `None` or empty clears it. A gang stays inside one group when it can.
    pub async fn set_group(
        &self,
        p: &Principal,
        id: NodeId,
        group: Option<&str>,
    ) -> Result<NodeView, AppError> {
        authz::admin(p)?;
        let group = group.map(str::trim).filter(|g| !g.is_empty());
        if let Some(g) = group
            && (g.len() > 64
                || !g
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(AppError::invalid(
                "group",
                "at most 64 letters, digits, `.`, `_` or `-` (e.g. rack-a)",
            ));
        }
        let row = self.node_row(id).await?;
        self.store
            .set_node_group(id, group)
            .await
            .map_err(internal("setting a node's group"))?;
        self.audit_node(p, AuditAction::NodeGroup, id, group.unwrap_or("(none)"))
            .await;
        self.forget_summary();
        let row = NodeRow {
            node_group: group.map(str::to_owned),
            ..row
        };
        self.view(&row, true, self.clock.now()).await
    }

    /// Drains a node, or one GPU of it (platform admins): no new placements there; what
    /// runs is warned through the deadline channel and released at the deadline (jobs
    /// are queued again elsewhere). Draining again moves the deadline.
    pub async fn drain(
        &self,
        p: &Principal,
        id: NodeId,
        req: &DrainRequest,
    ) -> Result<NodeView, AppError> {
        authz::admin(p)?;
        let now = self.clock.now();
        let valid = drain::validate(req, now)?;
        let row = self.node_row(id).await?;
        if row.revoked_at.is_some() {
            return Err(AppError::conflict(
                "the node is revoked: there is nothing to drain",
            ));
        }
        if let Some(g) = &valid.gpu
            && !inventory(&row).gpus.iter().any(|x| &x.uuid == g)
        {
            return Err(AppError::invalid(
                "gpu",
                format!("{} reports no GPU {g}", row.hostname),
            ));
        }
        self.store
            .set_drain(&DrainRow {
                node_id: id,
                gpu_uuid: valid.gpu.clone().unwrap_or_default(),
                deadline: valid.deadline,
                reason: valid.reason.clone(),
                created_by: Some(p.user_id()),
                created_at: now,
                health: false,
            })
            .await
            .map_err(internal("draining node"))?;
        tracing::info!(by = %p.username(), node = %id, hostname = %row.hostname,
            gpu = valid.gpu.as_deref().unwrap_or("all"), deadline = %valid.deadline,
            reason = %valid.reason, "node drained");
        self.audit_node(p, AuditAction::NodeDrain, id, &valid.reason)
            .await;
        self.forget_summary();
        self.view(&row, true, now).await
    }

    /// Ends a drain (platform admins): the whole node's and its GPUs' (`gpu` `None`) or one
    /// GPU's. Warnings not yet run out are withdrawn by the next pass.
    pub async fn undrain(
        &self,
        p: &Principal,
        id: NodeId,
        gpu: Option<&str>,
    ) -> Result<NodeView, AppError> {
        authz::admin(p)?;
        let row = self.node_row(id).await?;
        let ended = self
            .store
            .clear_drain(id, gpu)
            .await
            .map_err(internal("undraining node"))?;
        if ended > 0 {
            tracing::info!(by = %p.username(), node = %id, hostname = %row.hostname, "node undrained");
            self.audit_node(p, AuditAction::NodeUndrain, id, gpu.unwrap_or("all"))
                .await;
        }
        self.forget_summary();
        self.view(&row, true, self.clock.now()).await
    }

    /// A registered node's row (revoked ones too); 404 when there is none.
    async fn node_row(&self, id: NodeId) -> Result<NodeRow, AppError> {
        found("loading node", self.store.node(id).await)
    }

    async fn audit_node(&self, p: &Principal, action: AuditAction, id: NodeId, note: &str) {
        Entry::new(Some(p.username().as_str()), action, "node", id)
            .note(note)
            .record(&self.store, self.clock.now())
            .await;
    }

    /// The drains with the GPUs where work still holds something (draining, not drained).
    async fn drain_context(&self) -> Result<DrainContext, AppError> {
        let drains = self
            .store
            .drains()
            .await
            .map_err(internal("loading drains"))?;
        let unhealthy = self
            .store
            .unhealthy_gpus()
            .await
            .map_err(internal("loading GPU health"))?;
        if drains.is_empty() {
            return Ok(DrainContext {
                unhealthy,
                ..DrainContext::default()
            });
        }
        let busy = self
            .store
            .allocations_in(&AllocState::ON_NODE)
            .await
            .map_err(internal("loading allocations"))?
            .into_iter()
            .flat_map(|a| a.devices)
            .map(|d| (d.node_id, d.gpu_uuid))
            .collect();
        Ok(DrainContext {
            drains,
            busy,
            unhealthy,
        })
    }

    pub async fn summary(&self, _p: &Principal) -> Result<ClusterSummary, AppError> {
        let (s, _) = self.summary_now().await?;
        Ok(s)
    }

    /// The server replicas heard from in the last ten minutes and which one leads
    /// (platform admins).
    pub async fn replicas(&self, p: &Principal) -> Result<Vec<ServerReplicaView>, AppError> {
        authz::admin(p)?;
        let now = self.clock.now();
        let rows = self
            .store
            .replicas(now - Duration::minutes(10))
            .await
            .map_err(internal("loading server replicas"))?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let responding = now - r.seen_at <= Duration::seconds(cluster::REPLICA_SILENT_SECS);
                ServerReplicaView {
                    leading: r.is_leader && responding,
                    responding,
                    name: r.name,
                    version: r.version,
                    started_at: r.started_at,
                    seen_at: r.seen_at,
                }
            })
            .collect())
    }

    /// This server process reports itself alive, leading or not (its leader task, as the
    /// platform).
    pub async fn report_replica(&self, _: &SystemActor, me: &ReplicaRow) -> Result<(), AppError> {
        self.store
            .report_replica(me)
            .await
            .map_err(internal("reporting this server replica"))
    }

    /// This server process stops.
    pub async fn remove_replica(&self, _: &SystemActor, name: &str) -> Result<(), AppError> {
        self.store
            .remove_replica(name)
            .await
            .map_err(internal("removing this server replica"))
    }

    /// The summary for dashboards and `/metrics` (no principal: aggregate counts only).
    pub async fn summary_now(&self) -> Result<Summary, AppError> {
        if let Ok(s) = self.summary.lock()
            && let Some((at, summary)) = s.as_ref()
            && at.elapsed() < SUMMARY_FOR
        {
            return Ok(summary.clone());
        }
        let started = std::time::Instant::now();
        let (rows, inventories) = super::active_nodes_with_inventories(&self.store).await?;
        let now = self.clock.now();
        // Drained and unhealthy GPUs are left out of what the cluster offers.
        let drains = self
            .store
            .out_of_service(Duration::seconds(health::GRACE_SECS))
            .await
            .map_err(internal("loading drains"))?;
        let listed: Vec<(NodeId, bool, Arc<Inventory>)> = rows
            .iter()
            .filter_map(|r| {
                let inv = inventories.get(&r.id)?.clone();
                Some((r.id, cluster::is_online(r.last_heartbeat_at, now), inv))
            })
            .collect();
        let offered: Vec<(bool, Arc<Inventory>)> = listed
            .iter()
            .map(|(id, online, inv)| {
                if !drains.iter().any(|d| d.node_id == *id) {
                    return (*online, inv.clone());
                }
                let mut left = (**inv).clone();
                left.gpus
                    .retain(|g| !drains.iter().any(|d| d.covers(*id, &g.uuid)));
                (*online, Arc::new(left))
            })
            .collect();
        let nodes: Vec<(bool, Arc<Inventory>)> =
            listed.into_iter().map(|(_, o, i)| (o, i)).collect();
        // "In use" is what allocations hold, whether or not a process runs on it.
        let held: std::collections::BTreeSet<(String, u8)> = self
            .store
            .allocations_in(&AllocState::ON_NODE)
            .await
            .map_err(internal("loading held devices"))?
            .into_iter()
            .flat_map(|a| a.devices)
            .filter_map(|d| Some((d.gpu_uuid, d.start?)))
            .collect();
        let summary = cluster::summarize(
            offered.iter().map(|(o, i)| (*o, &**i)),
            &self.catalog,
            &held,
        );
        if let Ok(mut s) = self.summary.lock() {
            *s = Some((started, (summary.clone(), nodes.clone())));
        }
        Ok((summary, nodes))
    }

    /// Per-node liveness, drop counter, inventory and current telemetry, for `/metrics`
    /// (one query).
    pub async fn metrics_now(&self) -> Result<Vec<NodeMetrics>, AppError> {
        let rows = self
            .store
            .latest_sample_per_node()
            .await
            .map_err(internal("loading telemetry"))?;
        let now = self.clock.now();
        Ok(rows
            .into_iter()
            .map(|r| {
                let seen = r.last_heartbeat_at.unwrap_or(r.registered_at);
                let fresh = r
                    .sample_at
                    .is_some_and(|at| now - at < Duration::seconds(FRESH_SAMPLE_SECS));
                let latest = r.payload.filter(|_| fresh);
                let inventory = super::parsed_inventory(r.id, &r.inventory);
                NodeMetrics {
                    id: r.id,
                    hostname: r.hostname,
                    last_seen_secs: ((now - seen).num_milliseconds().max(0) as f64) / 1000.0,
                    telemetry_dropped: u64::try_from(r.telemetry_dropped).unwrap_or(0),
                    inventory,
                    latest,
                }
            })
            .collect())
    }

    /// Desired states with their apply status, for these nodes (one query).
    async fn desired_of(&self, nodes: &[NodeId]) -> Result<Vec<DesiredWithStatus>, AppError> {
        self.store
            .desired_with_status(Some(nodes))
            .await
            .map_err(internal("loading desired state"))
    }

    /// A node as users see it, with each GPU's desired layout and apply state (and, for
    /// `admin`, whose shares a shared GPU holds).
    async fn view(
        &self,
        r: &NodeRow,
        admin: bool,
        now: DateTime<Utc>,
    ) -> Result<NodeView, AppError> {
        let desired = self.desired_of(&[r.id]).await?;
        let shares = self.held_shares(&desired).await?;
        let drains = self.drain_context().await?;
        Ok(self.view_with(r, &desired, &shares, &drains, admin, now))
    }

    /// The shares held on shared GPUs; nothing to load while no GPU in `desired` is shared.
    async fn held_shares(
        &self,
        desired: &[DesiredWithStatus],
    ) -> Result<Vec<HeldShareRow>, AppError> {
        if desired.iter().all(|d| d.desired.sharing.is_none()) {
            return Ok(Vec::new());
        }
        self.store
            .held_shares()
            .await
            .map_err(internal("loading shares"))
    }

    fn view_with(
        &self,
        r: &NodeRow,
        desired: &[DesiredWithStatus],
        shares: &[HeldShareRow],
        drains: &DrainContext,
        admin: bool,
        now: DateTime<Utc>,
    ) -> NodeView {
        let gpus = inventory(r)
            .gpus
            .iter()
            .map(|g| {
                let mut v = GpuView::from_wire(g, &self.catalog);
                let d = desired
                    .iter()
                    .find(|d| d.desired.node_id == r.id && d.desired.gpu_uuid == g.uuid);
                v.desired = d.map(|d| desired_view(&d.desired, d.status.as_ref()));
                v.sharing = d
                    .and_then(|d| d.desired.sharing)
                    .map(|method| sharing_view(method, g, shares, admin));
                v.drain = drains.view(r.id, Some(&g.uuid));
                v.unhealthy = drains.health(r.id, &g.uuid);
                v
            })
            .collect();
        NodeView {
            id: r.id,
            hostname: r.hostname.clone(),
            online: r.revoked_at.is_none() && cluster::is_online(r.last_heartbeat_at, now),
            revoked: r.revoked_at.is_some(),
            registered_at: r.registered_at,
            last_heartbeat_at: r.last_heartbeat_at,
            agent_version: r.agent_version.clone(),
            manages_mig: r.manages_mig,
            workload_sandbox: r.workload_sandbox,
            group: r.node_group.clone(),
            gpus,
            drain: drains.view(r.id, None),
        }
    }

    /// Recent telemetry of a node (every signed-in user may see it, like the node).
    pub async fn telemetry(
        &self,
        _p: &Principal,
        node: NodeId,
        limit: u32,
    ) -> Result<NodeTelemetry, AppError> {
        found("loading node", self.store.node(node).await)?;
        let rows = self
            .store
            .recent_samples(node, limit.clamp(1, 1000))
            .await
            .map_err(internal("loading telemetry"))?;
        let samples: Vec<TelemetrySample> = rows.into_iter().map(|r| r.payload).collect();
        let dropped = self
            .store
            .telemetry_dropped(node)
            .await
            .map_err(internal("loading telemetry"))?;
        Ok(NodeTelemetry::from_samples(
            &samples,
            u64::try_from(dropped).unwrap_or(0),
        ))
    }
}

/// A shared GPU as users see it: how the node runs it, and its shares (whose, for admins).
fn sharing_view(
    method: ShareMethod,
    gpu: &tessera_domain::wire::GpuInfo,
    shares: &[HeldShareRow],
    admin: bool,
) -> SharingView {
    let reported = gpu.sharing.as_ref().filter(|s| s.method == method);
    let tenants: Vec<ShareTenantView> = shares
        .iter()
        .filter_map(|s| {
            s.devices.iter().find(|d| d.gpu_uuid == gpu.uuid)?;
            let GpuKind::Share { milli, .. } = s.kind else {
                return None;
            };
            Some(ShareTenantView {
                milli,
                team: admin.then(|| s.team_name.clone()),
            })
        })
        .collect();
    SharingView {
        method: method.as_str().to_owned(),
        ready: reported.is_some_and(|s| s.ready),
        error: match reported {
            Some(s) => s.error.clone(),
            None => Some("the node has not reported this GPU as shared yet".to_owned()),
        },
        daemon_restarts: reported.map_or(0, |s| s.daemon_restarts),
        used_milli: tenants.iter().map(|t| t.milli).sum(),
        tenants,
    }
}

fn desired_view(d: &DesiredRow, status: Option<&ApplyStatus>) -> DesiredView {
    let layout = &d.layout;
    let state = status.map(|s| {
        match s.state {
            ApplyState::Pending => "pending",
            ApplyState::Applying => "applying",
            ApplyState::Success => "success",
            ApplyState::Failed => "failed",
        }
        .to_owned()
    });
    let detail = status.and_then(|s| {
        s.error
            .as_ref()
            .map(|e| e.message.clone())
            .or_else(|| s.step.clone())
    });
    DesiredView {
        mig_enabled: d.mode == MigMode::Enabled,
        layout: layout
            .iter()
            .map(|i| format!("{}@{}", i.profile, i.start))
            .collect(),
        version: u64::try_from(d.version).unwrap_or(0),
        state,
        detail,
    }
}

fn inventory(r: &NodeRow) -> Arc<Inventory> {
    super::parsed_inventory(r.id, &r.inventory)
}

fn join_view(r: &JoinTokenRow) -> JoinTokenView {
    JoinTokenView {
        id: r.id,
        note: r.note.clone(),
        prefix: r.prefix.clone(),
        created_at: r.created_at,
        expires_at: r.expires_at,
        max_uses: u32::try_from(r.max_uses).unwrap_or(0),
        uses: u32::try_from(r.uses).unwrap_or(0),
        revoked: r.revoked,
    }
}

// ---- desired MIG state and what the agents report ----

impl Nodes {
    /// Sets what MIG layout a GPU should have (platform admin). The layout is validated
    /// against the GPU's own profile table (or the catalog) before it is stored.
    pub async fn set_desired_layout(
        &self,
        p: &Principal,
        node: NodeId,
        gpu_uuid: &str,
        mode: MigMode,
        layout: Vec<DesiredInstance>,
    ) -> Result<NodeView, AppError> {
        authz::admin(p)?;
        let gpu = self.reported_gpu(node, gpu_uuid).await?;
        if mode == MigMode::Disabled && !layout.is_empty() {
            return Err(AppError::invalid(
                "layout",
                "must be empty when MIG is disabled",
            ));
        }
        let shared = self
            .desired_row(node, gpu_uuid)
            .await?
            .is_some_and(|d| d.sharing.is_some());
        if shared {
            return Err(AppError::Conflict {
                message: "this GPU is shared: stop sharing it first".into(),
            });
        }
        if mode == MigMode::Enabled {
            if gpu.mig_mode.is_none() {
                return Err(AppError::invalid("mode", "this GPU is not MIG-capable"));
            }
            let model = self.model_of(&gpu).ok_or_else(|| {
                AppError::invalid("layout", "no MIG profile table is known for this GPU model")
            })?;
            let instances: Vec<Instance> = layout
                .iter()
                .map(|i| Instance {
                    profile: i.profile.clone(),
                    start: i.start,
                })
                .collect();
            model
                .validate(&instances)
                .map_err(|e| AppError::invalid("layout", e.to_string()))?;
        }
        let version = self
            .store
            .set_desired(
                node,
                gpu_uuid,
                mode,
                &layout,
                Some(p.user_id()),
                self.clock.now(),
            )
            .await
            .map_err(internal("storing desired layout"))?;
        self.signals.bump(node);
        tracing::info!(by = %p.username(), node = %node, gpu = gpu_uuid, version, "desired MIG layout set");
        self.get(p, node).await
    }

    /// Shares a GPU with MPS or time-slicing (`Some`), or stops sharing it (`None`)
    /// (platform admin). Only while nothing holds the GPU, like a MIG mode change: the
    /// check and the change are one statement, so a placement cannot slip in between.
    /// A shared GPU runs with MIG off and takes only shares; the planner never changes it.
    pub async fn set_gpu_sharing(
        &self,
        p: &Principal,
        node: NodeId,
        gpu_uuid: &str,
        sharing: Option<ShareMethod>,
    ) -> Result<NodeView, AppError> {
        authz::admin(p)?;
        let gpu = self.reported_gpu(node, gpu_uuid).await?;
        if sharing.is_some() && self.catalog.get(&gpu.name).is_none() {
            return Err(AppError::invalid(
                "sharing",
                format!(
                    "{} is not a GPU model Tessera prices and plans for",
                    gpu.name
                ),
            ));
        }
        let current = self.desired_row(node, gpu_uuid).await?;
        let now_sharing = current.as_ref().and_then(|d| d.sharing);
        if now_sharing == sharing {
            return self.get(p, node).await;
        }
        let version = self
            .store
            .set_sharing(
                node,
                gpu_uuid,
                sharing,
                current.as_ref().map(|d| d.version),
                p.user_id(),
                self.clock.now(),
            )
            .await
            .map_err(internal("storing GPU sharing"))?
            .ok_or_else(|| AppError::Conflict {
                message: "the GPU is in use (an allocation holds it) or was changed \
                          meanwhile; its mode changes only while it is idle"
                    .into(),
            })?;
        self.signals.bump(node);
        tracing::info!(by = %p.username(), node = %node, gpu = gpu_uuid, version,
            sharing = sharing.map_or("off", ShareMethod::as_str), "GPU sharing set");
        self.get(p, node).await
    }

    /// GPU `gpu_uuid` of node `node` (not revoked) as its agent last reported it.
    async fn reported_gpu(
        &self,
        node: NodeId,
        gpu_uuid: &str,
    ) -> Result<tessera_domain::wire::GpuInfo, AppError> {
        let row = self
            .store
            .node(node)
            .await
            .map_err(internal("loading node"))?
            .filter(|r| r.revoked_at.is_none())
            .ok_or(AppError::NotFound)?;
        inventory(&row)
            .gpus
            .iter()
            .find(|g| g.uuid == gpu_uuid)
            .cloned()
            .ok_or(AppError::NotFound)
    }

    /// The desired state an admin or the scheduler last set for one GPU, if any.
    async fn desired_row(
        &self,
        node: NodeId,
        gpu_uuid: &str,
    ) -> Result<Option<DesiredRow>, AppError> {
        Ok(self
            .store
            .desired_for_node(node)
            .await
            .map_err(internal("loading desired state"))?
            .into_iter()
            .find(|d| d.gpu_uuid == gpu_uuid))
    }

    fn model_of(
        &self,
        gpu: &tessera_domain::wire::GpuInfo,
    ) -> Option<tessera_domain::mig::GpuModel> {
        if !gpu.profiles.is_empty()
            && let Ok(m) = tessera_domain::wire::model_from_profiles(&gpu.name, &gpu.profiles)
        {
            return Some(m);
        }
        self.catalog.get(&gpu.name).cloned()
    }

    /// What this node's agent should apply.
    pub async fn desired(&self, node: &NodeIdentity) -> Result<DesiredState, AppError> {
        let rows = self
            .store
            .desired_for_node(node.id)
            .await
            .map_err(internal("loading desired state"))?;
        let mut gpus = Vec::with_capacity(rows.len());
        for r in rows {
            gpus.push(DesiredGpuState {
                gpu_uuid: r.gpu_uuid,
                mode: r.mode,
                layout: r.layout,
                sharing: r.sharing,
                version: u64::try_from(r.version).unwrap_or(0),
            });
        }
        Ok(DesiredState { gpus })
    }

    pub async fn record_status(
        &self,
        node: &NodeIdentity,
        report: &StatusReport,
    ) -> Result<(), AppError> {
        let now = self.clock.now();
        for s in &report.statuses {
            let json = serde_json::to_string(s).map_err(|_| AppError::Internal)?;
            let version = i64::try_from(s.version)
                .map_err(|_| AppError::invalid("statuses.version", "too large"))?;
            self.store
                .upsert_apply_status(node.id, &s.gpu_uuid, version, &json, now)
                .await
                .map_err(internal("storing apply status"))?;
            if s.state == ApplyState::Failed {
                tracing::warn!(node = %node.hostname, gpu = %s.gpu_uuid, version = s.version,
                    error = ?s.error, step = ?s.step, "MIG apply failed");
            }
        }
        Ok(())
    }

    /// Stores a telemetry batch (duplicates ignored) and acknowledges through its highest
    /// sequence number: everything up to it is now stored.
    pub async fn ingest_telemetry(
        &self,
        node: &NodeIdentity,
        batch: &TelemetryBatch,
    ) -> Result<TelemetryAck, AppError> {
        if batch.samples.len() > 1000 {
            return Err(AppError::invalid(
                "samples",
                "at most 1000 samples per batch",
            ));
        }
        let mut rows = Vec::with_capacity(batch.samples.len());
        for s in &batch.samples {
            let seq = i64::try_from(s.seq)
                .ok()
                .filter(|&q| q > 0)
                .ok_or_else(|| AppError::invalid("samples.seq", "must be a positive integer"))?;
            let at = DateTime::<Utc>::from_timestamp_millis(s.at_unix_ms)
                .ok_or_else(|| AppError::invalid("samples.at_unix_ms", "out of range"))?;
            let payload = serde_json::to_string(s).map_err(|_| AppError::Internal)?;
            rows.push((seq, at, payload));
        }
        let dropped = i64::try_from(batch.dropped_total).unwrap_or(i64::MAX);
        self.store
            .insert_samples(node.id, &rows, dropped, self.clock.now())
            .await
            .map_err(internal("storing telemetry"))?;
        Ok(TelemetryAck {
            acked_through: batch.samples.iter().map(|s| s.seq).max().unwrap_or(0),
        })
    }
}

/// The drains, and the (node, GPU) pairs allocations still hold.
#[derive(Default)]
struct DrainContext {
    drains: Vec<DrainRow>,
    busy: BTreeSet<(NodeId, String)>,
    unhealthy: Vec<HealthRow>,
}

impl DrainContext {
    fn health(&self, node: NodeId, gpu: &str) -> Option<HealthView> {
        let r = self
            .unhealthy
            .iter()
            .find(|r| r.node_id == node && r.gpu_uuid == gpu)?;
        Some(HealthView {
            reason: r.reason.clone().unwrap_or_default(),
            since: r.unhealthy_since?,
        })
    }

    /// The drain of `gpu` alone (`Some`), or of the whole node (`None`), as the Nodes page
    /// shows it: draining while something there is still held.
    fn view(&self, node: NodeId, gpu: Option<&str>) -> Option<DrainView> {
        let r = self
            .drains
            .iter()
            .find(|r| r.node_id == node && r.gpu_uuid == gpu.unwrap_or(""))?;
        let busy = self
            .busy
            .iter()
            .any(|(n, g)| *n == node && (gpu.is_none() || Some(g.as_str()) == gpu));
        Some(DrainView {
            state: if busy {
                DrainState::Draining
            } else {
                DrainState::Drained
            },
            deadline: r.deadline,
            reason: r.reason.clone(),
            since: r.created_at,
        })
    }
}
