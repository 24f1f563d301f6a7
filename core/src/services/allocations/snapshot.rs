//! What the views of waiting allocations read between passes: queue positions, capacity,
//! known end times and fair shares, recomputed at the end of each scheduler pass.

use super::*;

impl Allocations {
    /// What views need to explain pending allocations, as of the last scheduler pass
    /// (computing it per view would cost a scan of the queue and every node per request).
    pub(super) fn pending_context(&self, now: DateTime<Utc>) -> PendingContext {
        let snap = self.snapshot.read().map(|s| s.clone()).unwrap_or_default();
        PendingContext { now, ..snap }
    }

    /// Every GPU's desired state with its apply status (one query, all nodes).
    pub(super) async fn desired_states(&self) -> Result<Vec<DesiredWithStatus>, AppError> {
        self.store
            .desired_with_status(None)
            .await
            .map_err(internal("loading desired state"))
    }

    /// Recomputes queue positions, capacity and known end times (end of each pass), from
    /// the nodes the pass read (`seen`) and its live allocations; `shared` is the pass's
    /// map of shared GPUs (a pass does not change it).
    pub(super) async fn refresh_snapshot(
        &self,
        now: DateTime<Utc>,
        seen: &scheduler::Seen<'_>,
        shared: &HashMap<String, ShareMethod>,
        shares: Option<BTreeMap<TeamId, FairShare>>,
        live: &mut scheduler::Live,
    ) -> Result<(), AppError> {
        let shares = match shares {
            Some(s) => s,
            None => self.fair_shares(now, live).await?,
        };
        live.refresh(&self.store).await?;
        let ctx = self.build_pending_context(now, seen, shared, &shares, live);
        if let Ok(mut s) = self.snapshot.write() {
            *s = ctx;
        }
        Ok(())
    }

    fn build_pending_context(
        &self,
        now: DateTime<Utc>,
        seen: &scheduler::Seen<'_>,
        shared: &HashMap<String, ShareMethod>,
        shares: &BTreeMap<TeamId, FairShare>,
        live: &scheduler::Live,
    ) -> PendingContext {
        let (queued, holding): (Vec<&AllocationRow>, Vec<&AllocationRow>) =
            live.rows().partition(|a| a.state == AllocState::Queued);
        let held = holding.iter().filter(|a| a.state != AllocState::Releasing);
        let entries: Vec<QueueEntry> = queued.iter().filter_map(|a| queue_entry(a)).collect();
        let mut position = HashMap::new();
        let order = alloc::order_queue(&entries, shares);
        let model_of: HashMap<AllocationId, &str> =
            entries.iter().map(|e| (e.id, e.model.as_str())).collect();
        let mut per_model: HashMap<&str, u32> = HashMap::new();
        for id in order {
            let m = model_of.get(&id).copied().unwrap_or_default();
            let n = per_model.entry(m).or_default();
            *n += 1;
            position.insert(id, *n);
        }
        let mut ends: HashMap<String, Vec<(DateTime<Utc>, u32)>> = HashMap::new();
        let mut held_units: HashMap<String, u32> = HashMap::new();
        for a in held {
            *held_units.entry(a.model.clone()).or_default() += to_u32(a.units);
            if let Some(e) = a.ends_at {
                ends.entry(a.model.clone())
                    .or_default()
                    .push((e, to_u32(a.units)));
            }
        }
        let held_devices: Vec<&AllocatedDevice> = holding.iter().flat_map(|a| &a.devices).collect();
        let busy: std::collections::HashSet<(&str, Option<u8>)> = held_devices
            .iter()
            .map(|d| (d.gpu_uuid.as_str(), d.start))
            .collect();
        let (capacity, free_now) = self.capacity(
            now,
            seen,
            &busy,
            shared,
            &share_usage(holding.iter().copied()),
        );
        PendingContext {
            now,
            position,
            ends,
            held_units,
            capacity,
            free_now,
        }
    }

    /// Units each quota line has on online nodes (a shared GPU: 1000 milli-GPU on its
    /// model's shared line), and what is free right now per kind (existing free MIG
    /// instances, idle whole GPUs without MIG; `MODEL:share`: the most milli-GPU free on
    /// one shared GPU), without re-partitioning.
    fn capacity(
        &self,
        now: DateTime<Utc>,
        seen: &scheduler::Seen<'_>,
        busy: &std::collections::HashSet<(&str, Option<u8>)>,
        shared: &HashMap<String, ShareMethod>,
        share_used: &HashMap<String, u32>,
    ) -> (HashMap<String, u32>, BTreeMap<String, u32>) {
        // The pass's nodes; drained capacity, and unhealthy GPUs, are not there for anyone.
        let (nodes, inventories, drains) = (seen.nodes, seen.inventories, seen.drains);
        // Hot spares are kept for displaced high-priority work: not capacity for teams.
        let spare = self.spare_pool().gpus;
        let mut cap = HashMap::new();
        let mut free: BTreeMap<String, u32> = BTreeMap::new();
        for (n, g, m) in scheduler::online_gpus(nodes, inventories, &self.catalog, now) {
            if drains.iter().any(|r| r.covers(n.id, &g.uuid)) || spare.contains(&g.uuid) {
                continue;
            }
            if shared.contains_key(&g.uuid) {
                *cap.entry(alloc::shared_quota_key(m.name())).or_default() += 1000;
                let left = 1000u32.saturating_sub(share_used.get(&g.uuid).copied().unwrap_or(0));
                let most = free.entry(format!("{}:share", m.name())).or_default();
                *most = (*most).max(left);
                continue;
            }
            *cap.entry(m.name().to_owned()).or_default() += u32::from(m.compute_slices());
            let mig_on = g.mig_mode.is_some_and(|x| x.current == MigMode::Enabled);
            if mig_on {
                for i in &g.instances {
                    let idle = i
                        .compute_instances
                        .iter()
                        .all(|c| c.process_count == Some(0));
                    if idle && !busy.contains(&(g.uuid.as_str(), Some(i.start))) {
                        *free
                            .entry(format!("{}:{}", m.name(), i.profile))
                            .or_default() += 1;
                    }
                }
            } else if !busy.contains(&(g.uuid.as_str(), None)) {
                *free.entry(format!("{}:whole", m.name())).or_default() += 1;
            }
        }
        (cap, free)
    }

    /// Devices free right now per kind string (`H100-80GB:1g.10gb`, `A100-SXM4-40GB:whole`),
    /// as of the last scheduler pass, without re-partitioning (which may free more).
    /// Every signed-in user may see it, like the cluster.
    pub fn free_now(&self, _p: &Principal) -> BTreeMap<String, u32> {
        self.pending_context(self.clock.now()).free_now
    }

    pub(super) async fn fair_shares(
        &self,
        now: DateTime<Utc>,
        live: &mut scheduler::Live,
    ) -> Result<BTreeMap<TeamId, FairShare>, AppError> {
        let since = now - alloc::FAIR_SHARE_WINDOW;
        live.refresh(&self.store).await?;
        let recent = live.usage_since(since);
        let quotas = self
            .store
            .quotas(None)
            .await
            .map_err(internal("loading quotas"))?;
        let mut shares: BTreeMap<TeamId, FairShare> = BTreeMap::new();
        for q in &quotas {
            let s = shares.entry(q.team_id).or_insert(FairShare {
                recent_unit_seconds: 0,
                guaranteed: 0,
            });
            s.guaranteed = s.guaranteed.saturating_add(to_u32(q.guaranteed));
        }
        for &(team, units, running, start, ends_at) in &recent {
            let end = if running {
                None
            } else {
                ends_at.map(|e| e.min(now))
            };
            let used = alloc::unit_seconds_in_window(to_u32(units), start, end, now);
            let s = shares.entry(team).or_insert(FairShare {
                recent_unit_seconds: 0,
                guaranteed: 0,
            });
            s.recent_unit_seconds = s.recent_unit_seconds.saturating_add(used);
        }
        Ok(shares)
    }
}

#[derive(Clone, Default)]
pub(super) struct PendingContext {
    pub(super) now: DateTime<Utc>,
    pub(super) position: HashMap<AllocationId, u32>,
    pub(super) ends: HashMap<String, Vec<(DateTime<Utc>, u32)>>,
    pub(super) held_units: HashMap<String, u32>,
    pub(super) capacity: HashMap<String, u32>,
    pub(super) free_now: BTreeMap<String, u32>,
}
