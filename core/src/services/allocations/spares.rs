//! Hot spares (docs/operations.md, "Hot spares"): the rules platform admins set per model,
//! the pool each scheduler pass keeps idle, and the move of a high-priority allocation off
//! an unhealthy GPU or a lost node onto a spare (a replacement queued in the same
//! transaction that ends it; the replacement is planned on spare GPUs first).

use super::*;
use crate::services::audit::Entry;
use crate::store::{DrainRow, SpareRow};
use tessera_domain::audit::AuditAction;
use tessera_domain::spares::{self, Candidate, ModelPool, SpareRequest, SpareRule, SpareView};

/// The pool as of the last scheduler pass.
#[derive(Debug, Clone, Default)]
pub(super) struct SparePool {
    /// Model → its pool.
    pub(super) pools: BTreeMap<String, ModelPool>,
    /// Every spare GPU's UUID.
    pub(super) gpus: BTreeSet<String>,
}

impl SparePool {
    /// Spares per model (for why-pending).
    pub(super) fn count(&self, model: &str) -> u32 {
        self.pools
            .get(model)
            .map_or(0, |p| u32::try_from(p.gpus.len()).unwrap_or(u32::MAX))
    }
}

impl Allocations {
    // ---- REST / UI ----

    /// Every model's spare rule with its pool now. Anyone signed in may read it (the
    /// capacity views leave spares out and say so).
    pub async fn spares(&self, _p: &Principal) -> Result<Vec<SpareView>, AppError> {
        let rows = self
            .store
            .spares()
            .await
            .map_err(internal("loading spares"))?;
        let pool = self.spare_pool();
        Ok(rows
            .into_iter()
            .map(|r| {
                let p = pool.pools.get(&r.model).cloned().unwrap_or_default();
                SpareView {
                    gpus: r.gpus.and_then(|n| u32::try_from(n).ok()),
                    percent: r.percent.and_then(|n| u32::try_from(n).ok()),
                    wanted: p.wanted,
                    spare_gpus: p.gpus,
                    updated_by: r.updated_by_name,
                    updated_at: r.updated_at,
                    model: r.model,
                }
            })
            .collect())
    }

    /// Sets how many GPUs of `model` are kept as spares (platform admins).
    pub async fn set_spares(
        &self,
        p: &Principal,
        model: &str,
        req: &SpareRequest,
    ) -> Result<Vec<SpareView>, AppError> {
        authz::admin(p)?;
        let model = self.spare_model(model)?;
        let rule = SpareRule::validate(req)?;
        let now = self.clock.now();
        self.store
            .set_spares(&SpareRow {
                model: model.clone(),
                gpus: rule.gpus().map(i64::from),
                percent: rule.percent().map(i64::from),
                updated_by: Some(p.user_id()),
                updated_at: now,
                updated_by_name: None,
            })
            .await
            .map_err(internal("storing spares"))?;
        let after = serde_json::json!({"gpus": rule.gpus(), "percent": rule.percent()});
        self.audit_spares(p, AuditAction::SparesSet, &model, Some(after.to_string()))
            .await;
        tracing::info!(by = %p.username(), %model, ?rule, "hot spares set");
        self.wake.notify_one();
        self.spares(p).await
    }

    /// Keeps no spares of `model` any more (platform admins). Idempotent: a model that
    /// kept none is fine (nothing is audited then).
    pub async fn clear_spares(&self, p: &Principal, model: &str) -> Result<(), AppError> {
        authz::admin(p)?;
        let model = self.spare_model(model)?;
        if self
            .store
            .clear_spares(&model)
            .await
            .map_err(internal("clearing spares"))?
        {
            self.audit_spares(p, AuditAction::SparesClear, &model, None)
                .await;
            tracing::info!(by = %p.username(), %model, "hot spares cleared");
            self.wake.notify_one();
        }
        Ok(())
    }

    /// The catalog's name of `model` (an alias or the driver's spelling is accepted).
    fn spare_model(&self, model: &str) -> Result<String, AppError> {
        self.catalog
            .get(model.trim())
            .map(|m| m.name().to_owned())
            .ok_or_else(|| {
                AppError::invalid(
                    "model",
                    format!(
                        "unknown GPU model `{}`",
                        model.chars().take(64).collect::<String>()
                    ),
                )
            })
    }

    async fn audit_spares(
        &self,
        p: &Principal,
        action: AuditAction,
        model: &str,
        after: Option<String>,
    ) {
        Entry::new(Some(p.username().as_str()), action, "spares", model)
            .after(after)
            .record(&self.store, self.clock.now())
            .await;
    }

    /// The pool as of the last pass.
    pub(super) fn spare_pool(&self) -> SparePool {
        self.spares.read().map(|s| s.clone()).unwrap_or_default()
    }

    /// Spare GPUs free now, per model (the `tessera_spare_gpus` gauge).
    pub fn spare_gpus(&self) -> BTreeMap<String, u32> {
        let pool = self.spare_pool();
        pool.pools
            .keys()
            .map(|m| (m.clone(), pool.count(m)))
            .collect()
    }

    // ---- the scheduler ----

    /// Chooses this pass's spares: per model with a rule, among online, in-service,
    /// unshared GPUs of a known model that nothing holds and no process uses. Stored for
    /// the views; returned for the pass.
    pub(super) async fn choose_spares(
        &self,
        nodes: &[NodeRow],
        inventories: &HashMap<NodeId, Arc<Inventory>>,
        drains: &[DrainRow],
        shared: &HashMap<String, ShareMethod>,
        live: &mut scheduler::Live,
        now: DateTime<Utc>,
    ) -> Result<SparePool, AppError> {
        let rows = self
            .store
            .spares()
            .await
            .map_err(internal("loading spares"))?;
        let rules: BTreeMap<String, SpareRule> = rows
            .iter()
            .filter_map(|r| {
                let req = SpareRequest {
                    gpus: r.gpus,
                    percent: r.percent,
                };
                Some((r.model.clone(), SpareRule::validate(&req).ok()?))
            })
            .collect();
        if rules.is_empty() {
            if let Ok(mut s) = self.spares.write() {
                *s = SparePool::default();
            }
            return Ok(SparePool::default());
        }
        live.refresh(&self.store).await?;
        // Held on that node (keyed by node too: GPU UUIDs are unique on real hardware, not
        // necessarily among simulated nodes).
        let busy: BTreeSet<(NodeId, String)> = live
            .rows()
            .filter(|a| a.state != AllocState::Queued)
            .flat_map(devices)
            .map(|d| (d.node_id, d.gpu_uuid))
            .collect();
        let last = self.spare_pool().gpus;
        let mut candidates = Vec::new();
        for (n, g, model) in scheduler::online_gpus(nodes, inventories, &self.catalog, now) {
            if shared.contains_key(&g.uuid) || drains.iter().any(|r| r.covers(n.id, &g.uuid)) {
                continue;
            }
            let processes = g
                .instances
                .iter()
                .flat_map(|i| &i.compute_instances)
                .any(|c| c.process_count.is_some_and(|p| p > 0));
            candidates.push(Candidate {
                uuid: g.uuid.clone(),
                model: model.name().to_owned(),
                hostname: n.hostname.clone(),
                index: g.index,
                idle: !busy.contains(&(n.id, g.uuid.clone())) && !processes,
                was_spare: last.contains(&g.uuid),
            });
        }
        let pools = spares::choose(&rules, &candidates);
        let pool = SparePool {
            gpus: spares::spare_set(&pools),
            pools,
        };
        if let Ok(mut s) = self.spares.write() {
            *s = pool.clone();
        }
        Ok(pool)
    }

    /// Whether `a` lost its node (removed, or silent past the node grace).
    pub(super) fn lost_node(
        &self,
        a: &AllocationRow,
        nodes: &[NodeRow],
        now: DateTime<Utc>,
    ) -> bool {
        devices(a).iter().any(|d| {
            nodes.iter().find(|n| n.id == d.node_id).is_none_or(|n| {
                n.last_heartbeat_at
                    .is_none_or(|t| now - t > self.node_grace)
            })
        })
    }

    /// Moves the active high-priority allocation `a` off its unhealthy GPU or lost node
    /// (`why`) when a spare of its model is free (`room`, taken from as spares are
    /// promised): `a` ends as preempted and a replacement, holding the same quota units,
    /// is queued in the same transaction, to be placed on a spare in this pass. `false`
    /// when it does not qualify (then the pass does what it did without spares).
    pub(super) async fn displace_to_spare(
        &self,
        a: &AllocationRow,
        why: &str,
        room: &mut BTreeMap<String, u32>,
        now: DateTime<Utc>,
    ) -> Result<bool, AppError> {
        if a.state != AllocState::Active || a.priority != PriorityClass::High {
            return Ok(false);
        }
        let need = match a.kind {
            GpuKind::Whole { .. } => to_u32(a.count),
            GpuKind::Mig { .. } => 1,
            // Spares are not shared GPUs: a share goes the ordinary way.
            GpuKind::Share { .. } => return Ok(false),
        };
        let Some(free) = room.get_mut(&a.model).filter(|f| **f >= need) else {
            return Ok(false);
        };
        let left = a.ends_at.map_or(a.duration_minutes, |e| {
            ((e - now).num_seconds().max(0) + 59) / 60
        });
        if left < 1 {
            // Ends now anyway.
            return Ok(false);
        }
        let mut new = AllocationRow::queued(a.team_id, a.user_id, &a.kind, (a.count, a.units), now);
        new.model = a.model.clone();
        new.priority = a.priority;
        new.purpose = a.purpose.clone();
        new.duration_minutes = left;
        new.approver = a.approver;
        new.needs_cuda = a.needs_cuda;
        let note = format!("{why}; moved to a hot spare as allocation {}", new.id);
        if !self
            .store
            .displace(a.id, &new, &note, now)
            .await
            .map_err(internal("displacing allocation"))?
        {
            return Ok(false);
        }
        *free -= need;
        tracing::info!(allocation = %a.id, replacement = %new.id, model = %a.model, "{why}: moved to a hot spare");
        self.audit_as(
            None,
            AuditAction::AllocationDisplace,
            a.id,
            Some(a.team_id),
            Some(a),
            Some(&new),
        )
        .await;
        Ok(true)
    }

    /// Plans the queue: the displaced allocations (`spare_ids`) on the spare GPUs first,
    /// each placed whole or not at all there; then everything else (and the displaced that
    /// found no spare) on the ordinary GPUs.
    pub(super) fn plan_with_spares(
        &self,
        cluster: &planner::Cluster,
        spare_cluster: &planner::Cluster,
        requests: &scheduler::Requests,
        spare_ids: &BTreeSet<AllocationId>,
    ) -> Result<planner::Plan, AppError> {
        let of = |r: &str| requests.owner(r);
        let (to_spares, ordinary): (Vec<_>, Vec<_>) = requests
            .list
            .iter()
            .cloned()
            .partition(|r| of(&r.id).is_some_and(|id| spare_ids.contains(&id)));
        let mut on_spares = planner::Plan::default();
        let mut placed: BTreeSet<AllocationId> = BTreeSet::new();
        if !to_spares.is_empty() && !spare_cluster.nodes.is_empty() {
            let plan = planner::plan(spare_cluster, &to_spares, &self.catalog).map_err(|e| {
                tracing::error!(error = %e, "planner input rejected (spares)");
                AppError::Internal
            })?;
            // Placed only if every part of it was.
            let pending: BTreeSet<AllocationId> =
                plan.pending.iter().filter_map(|p| of(&p.request)).collect();
            placed = plan
                .assignments
                .iter()
                .filter_map(|a| of(&a.request))
                .filter(|id| !pending.contains(id))
                .collect();
            let gpus: BTreeSet<(String, u32)> = plan
                .assignments
                .iter()
                .filter(|a| of(&a.request).is_some_and(|id| placed.contains(&id)))
                .flat_map(|a| {
                    a.gpu
                        .into_iter()
                        .chain(a.gpus.iter().copied())
                        .map(|g| (a.node.clone(), g))
                        .collect::<Vec<_>>()
                })
                .collect();
            on_spares.assignments = plan
                .assignments
                .into_iter()
                .filter(|a| of(&a.request).is_some_and(|id| placed.contains(&id)))
                .collect();
            on_spares.reconfigurations = plan
                .reconfigurations
                .into_iter()
                .filter(|r| gpus.contains(&(r.node.clone(), r.gpu)))
                .collect();
        }
        let rest: Vec<planner::Request> = to_spares
            .into_iter()
            .filter(|r| of(&r.id).is_none_or(|id| !placed.contains(&id)))
            .chain(ordinary)
            .collect();
        let mut plan = planner::plan(cluster, &rest, &self.catalog).map_err(|e| {
            tracing::error!(error = %e, "planner input rejected");
            AppError::Internal
        })?;
        plan.assignments.extend(on_spares.assignments);
        plan.reconfigurations.extend(on_spares.reconfigurations);
        Ok(plan)
    }
}

impl SparePool {
    /// Free spares per model, as the pass promises them to displaced allocations.
    pub(super) fn room(&self) -> BTreeMap<String, u32> {
        self.pools
            .keys()
            .map(|m| (m.clone(), self.count(m)))
            .collect()
    }
}

/// Why `a` must move, when one of its GPUs turned unhealthy.
pub(super) fn unhealthy_under(a: &AllocationRow, drains: &[DrainRow]) -> Option<String> {
    if !drains.iter().any(|r| r.health) {
        return None;
    }
    devices(a).iter().find_map(|d| {
        drains
            .iter()
            .find(|r| r.health && r.covers(d.node_id, &d.gpu_uuid))
            .map(|r| {
                format!(
                    "its GPU {} on {} turned unhealthy ({})",
                    d.gpu_uuid, d.hostname, r.reason
                )
            })
    })
}

/// What a waiting request adds to its reason while spares of its model are kept.
pub(super) fn spare_note(model: &str, n: u32) -> String {
    format!(
        " ({model}: {} kept as {})",
        tessera_domain::text::count(u64::from(n), "GPU", "GPUs"),
        if n == 1 { "a hot spare" } else { "hot spares" }
    )
}
