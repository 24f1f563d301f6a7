//! The scheduler pass ([`Allocations::tick`]): expiry and lost nodes, activation of what
//! the agents report, placement of the queue with the planner, preemption warnings.

use super::*;
use crate::auth::SystemActor;
use crate::store::DrainRow;
use std::sync::atomic::{AtomicBool, Ordering};
use tessera_domain::alloc::PreemptCause;
use tessera_domain::audit::AuditAction;
use tessera_domain::image::CudaVersion;

impl Allocations {
    /// Why a `placing` allocation gives up: placed (`since`, when it last became `placing`)
    /// longer than the timeout ago, with the node's last apply error for its GPU when there
    /// is one.
    async fn placing_too_long(
        &self,
        a: &AllocationRow,
        since: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<Option<String>, AppError> {
        let Some(since) = since else {
            return Ok(None);
        };
        if now - since <= self.placing_timeout {
            return Ok(None);
        }
        let mut why = format!(
            "the node did not set up the device within {} min",
            self.placing_timeout.num_minutes().max(1)
        );
        if let Some(d) = devices(a).first() {
            let statuses = self
                .store
                .apply_statuses(d.node_id)
                .await
                .map_err(internal("loading apply statuses"))?;
            let error = statuses
                .iter()
                .filter(|s| s.gpu_uuid == d.gpu_uuid)
                .find_map(|s| s.status.error.as_ref().map(|e| e.message.clone()));
            match error {
                Some(e) => why.push_str(&format!(" ({} reports: {e})", d.hostname)),
                None => why.push_str(&format!(
                    " ({} reported no progress on GPU {}; does its agent run with --manage-mig?)",
                    d.hostname, d.gpu_uuid
                )),
            }
        }
        Ok(Some(why))
    }

    /// One scheduler pass at `now`: expire what ran out, fail what lost its node, activate
    /// what the agents now report, and place the queue with the planner (writing the
    /// desired MIG layouts the agents apply). Idempotent: after a crash the next pass
    /// picks up from the stored states. Only the platform runs it.
    pub async fn tick(&self, _: &SystemActor, now: DateTime<Utc>) -> Result<TickReport, AppError> {
        let mut report = TickReport::default();
        // The leader's live allocations, held for the pass (passes run one at a time).
        let mut live = Live::new(&self.live, now).await;
        let (nodes, inventories) =
            crate::services::active_nodes_with_inventories(&self.store).await?;
        self.end_departed(now).await?;
        self.finish_half_released(now).await?;
        let drains = self
            .store
            .out_of_service(Duration::seconds(tessera_domain::health::GRACE_SECS))
            .await
            .map_err(internal("loading drains"))?;
        let desired = self.desired_states().await?;
        let shared = shared_gpus(&desired);
        // Hot spares, chosen before anything moves: the pool refills as work ends.
        let spare_pool = self
            .choose_spares(&nodes, &inventories, &drains, &shared, &mut live, now)
            .await?;
        let mut spare_room = spare_pool.room();
        self.expire(
            &nodes,
            &inventories,
            &drains,
            &mut spare_room,
            &mut live,
            now,
            &mut report,
        )
        .await?;
        self.activate(&inventories, &shared, &mut live, now, &mut report)
            .await?;
        let seen = Seen {
            nodes: &nodes,
            inventories: &inventories,
            drains: &drains,
            spares: &spare_pool.gpus,
        };
        // Bookings about to start: their allocations queued, borrowers warned.
        let (booked, warned) = self.bookings_pass(&mut live, now).await?;
        report.warned += warned;
        self.place(
            &seen,
            &desired,
            &shared,
            &booked,
            &mut live,
            now,
            &mut report,
        )
        .await?;
        tracing::debug!(reads = live.loads, "scheduler pass: live allocations read");
        Ok(report)
    }

    /// Brings the scheduler's copy of the live allocations up to date as a pass would (from
    /// the change feed, or whole when due) and returns how it differs from a fresh load of
    /// the store at `now` (live rows in queue order, and fair share's usage): empty when
    /// they agree. For tests (issue 41: the leader's state against a fresh load).
    #[doc(hidden)]
    pub async fn live_cache_differences(
        &self,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, AppError> {
        let mut live = Live::new(&self.live, now).await;
        live.refresh(&self.store).await?;
        let fresh = self
            .store
            .live_allocations()
            .await
            .map_err(internal("loading allocations"))?;
        let mut out = Vec::new();
        let kept: Vec<String> = live.rows().map(|r| format!("{r:?}")).collect();
        let read: Vec<String> = fresh.iter().map(|r| format!("{r:?}")).collect();
        if kept != read {
            out.push(format!("live allocations: kept {kept:#?}, read {read:#?}"));
        }
        let since = now - alloc::FAIR_SHARE_WINDOW;
        let mut kept = live.usage_since(since);
        let mut read: Vec<_> = self
            .store
            .usage_since(since)
            .await
            .map_err(internal("loading usage"))?
            .into_iter()
            .map(|(_, team, units, running, start, end)| (team, units, running, start, end))
            .collect();
        kept.sort();
        read.sort();
        if kept != read {
            out.push(format!("fair-share usage: kept {kept:?}, read {read:?}"));
        }
        Ok(out)
    }

    /// Expiry, preemption deadlines, lost nodes: what is held and should no longer be.
    #[allow(clippy::too_many_arguments)]
    async fn expire(
        &self,
        nodes: &[NodeRow],
        inventories: &HashMap<NodeId, Arc<Inventory>>,
        drains: &[DrainRow],
        spare_room: &mut BTreeMap<String, u32>,
        live: &mut Live,
        now: DateTime<Utc>,
        report: &mut TickReport,
    ) -> Result<(), AppError> {
        let by_id: HashMap<NodeId, &NodeRow> = nodes.iter().map(|n| (n.id, n)).collect();
        live.refresh(&self.store).await?;
        let held: Vec<&AllocationRow> = live
            .rows()
            .filter(|a| matches!(a.state, AllocState::Placing | AllocState::Active))
            .collect();
        // When each placing allocation was placed: one query, and only when some are.
        let placing_since: HashMap<AllocationId, DateTime<Utc>> =
            if held.iter().any(|a| a.state == AllocState::Placing) {
                let mut since: HashMap<AllocationId, DateTime<Utc>> = HashMap::new();
                for (id, at) in self
                    .store
                    .placing_since()
                    .await
                    .map_err(internal("loading history"))?
                {
                    let t = since.entry(id).or_insert(at);
                    *t = (*t).max(at);
                }
                since
            } else {
                HashMap::new()
            };
        for &a in &held {
            let state = a.state;
            let devs = &a.devices;
            let lost = devs.iter().find_map(|d| {
                let Some(node) = by_id.get(&d.node_id) else {
                    return Some(format!("node {} was removed", d.hostname));
                };
                let silent = node
                    .last_heartbeat_at
                    .is_none_or(|t| now - t > self.node_grace);
                if silent {
                    return Some(format!("node {} stopped reporting", d.hostname));
                }
                let gpu = inventories
                    .get(&d.node_id)
                    .and_then(|i| i.gpus.iter().find(|g| g.uuid == d.gpu_uuid));
                let Some(gpu) = gpu else {
                    return Some(format!("GPU {} vanished from {}", d.gpu_uuid, d.hostname));
                };
                // An active MIG slice whose instance is gone (destroyed outside Tessera, or
                // lost in a GPU reset) is over: say so rather than bill and show it. Judged
                // only on an inventory the node sent after the slice became active (an
                // apply status can activate it before the next heartbeat lists it).
                let inventory_since_active = node
                    .last_heartbeat_at
                    .zip(a.active_at)
                    .is_some_and(|(seen, active)| seen > active + Duration::seconds(1));
                if state == AllocState::Active
                    && inventory_since_active
                    && let (Some(mig), Some(profile), Some(start)) =
                        (&d.mig_uuid, &d.profile, d.start)
                    && !mig_instance_present(gpu, mig, profile, start)
                {
                    return Some(format!(
                        "MIG instance {mig} ({profile}) is gone from GPU {} on {}",
                        d.gpu_uuid, d.hostname
                    ));
                }
                None
            });
            let lost = match lost {
                Some(why) => Some(why),
                None if state == AllocState::Placing => {
                    self.placing_too_long(a, placing_since.get(&a.id).copied(), now)
                        .await?
                }
                None => None,
            };
            // An allocation past its end expires, whatever became of its node.
            let ended = state == AllocState::Active && a.ends_at.is_some_and(|e| e <= now);
            if let (Some(why), false) = (lost, ended) {
                live.changed();
                // A high-priority allocation whose node was lost moves to a hot spare.
                if self.lost_node(a, nodes, now)
                    && self.displace_to_spare(a, &why, spare_room, now).await?
                {
                    report.preempted += 1;
                    continue;
                }
                if self
                    .step(
                        a.id,
                        state,
                        AllocState::Failed,
                        By {
                            at: now,
                            actor: None,
                            note: Some(&why),
                        },
                        Change::default(),
                    )
                    .await?
                {
                    tracing::warn!(allocation = %a.id, "{why}: allocation failed");
                    report.failed += 1;
                    self.audit_change(None, AuditAction::AllocationFail, a)
                        .await;
                }
                continue;
            }
            if state != AllocState::Active {
                continue;
            }
            // On a GPU that turned unhealthy, with a hot spare free: moved at once.
            if let Some(why) = spares::unhealthy_under(a, drains)
                && self.displace_to_spare(a, &why, spare_room, now).await?
            {
                live.changed();
                report.preempted += 1;
                continue;
            }
            // Drained: warned now (the deadline channel), released at the drain's deadline.
            let drain = devs
                .iter()
                .filter_map(|d| drains.iter().find(|r| r.covers(d.node_id, &d.gpu_uuid)))
                .map(|r| {
                    let cause = if r.health {
                        PreemptCause::Health
                    } else {
                        PreemptCause::Drain
                    };
                    (r.deadline, cause)
                })
                .min();
            let out_of_service = matches!(
                a.preempt_cause,
                Some(PreemptCause::Drain | PreemptCause::Health)
            );
            if drain.is_none() && out_of_service {
                // Undrained before its deadline: the warning is withdrawn.
                live.changed();
                self.store
                    .set_preempt_at(a.id, None, self.clock.now())
                    .await
                    .map_err(internal("withdrawing a drain warning"))?;
                continue;
            }
            if let Some((deadline, cause)) = drain
                && a.preempt_at.is_none_or(|p| p > deadline)
            {
                live.changed();
                self.store
                    .set_preempt_at(a.id, Some((deadline, cause)), self.clock.now())
                    .await
                    .map_err(internal("warning of a drain"))?;
                tracing::info!(allocation = %a.id, %deadline, "its node is drained");
                report.warned += 1;
            }
            if a.ends_at.is_some_and(|e| e <= now) {
                live.changed();
                if self
                    .finish(
                        a.id,
                        alloc::ReleaseCause::Expired,
                        now,
                        None,
                        Some("end time reached"),
                    )
                    .await?
                {
                    report.expired += 1;
                    self.audit_change(None, AuditAction::AllocationExpire, a)
                        .await;
                }
            } else if a.preempt_at.is_some_and(|e| e <= now)
                && live.changed()
                && self
                    .finish(
                        a.id,
                        alloc::ReleaseCause::Preempted,
                        now,
                        None,
                        Some(tessera_domain::notify::preempted_words(a.preempt_cause)),
                    )
                    .await?
            {
                report.preempted += 1;
                self.audit_change(None, AuditAction::AllocationPreempt, a)
                    .await;
            }
        }
        Ok(())
    }

    /// Activation: placed devices the agents now report (a share: its GPU shared the way an
    /// admin asked, and ready).
    async fn activate(
        &self,
        inventories: &HashMap<NodeId, Arc<Inventory>>,
        shared: &HashMap<String, ShareMethod>,
        live: &mut Live,
        now: DateTime<Utc>,
        report: &mut TickReport,
    ) -> Result<(), AppError> {
        live.refresh(&self.store).await?;
        for a in live.rows().filter(|a| a.state == AllocState::Placing) {
            let mut devs = devices(a);
            let is_share = matches!(a.kind, GpuKind::Share { .. });
            let all_present = devs.iter_mut().all(|d| {
                if is_share {
                    share_ready(d, inventories, shared)
                } else {
                    present(d, inventories)
                }
            });
            if all_present {
                let change = Change {
                    active_at: Some(now),
                    ends_at: Some(now + Duration::minutes(a.duration_minutes)),
                    devices: serde_json::to_string(&devs).ok(),
                    ..Change::default()
                };
                live.changed();
                if self
                    .step(
                        a.id,
                        AllocState::Placing,
                        AllocState::Active,
                        By {
                            at: now,
                            actor: None,
                            note: None,
                        },
                        change,
                    )
                    .await?
                {
                    report.activated += 1;
                }
            }
        }
        Ok(())
    }

    /// Placement: the queue in fair-share order through the planner; desired layouts are
    /// written before an allocation becomes `placing`, and what waits gets its reason.
    #[allow(clippy::too_many_arguments)]
    async fn place(
        &self,
        seen: &Seen<'_>,
        desired: &[DesiredWithStatus],
        shared: &HashMap<String, ShareMethod>,
        booked: &BTreeSet<AllocationId>,
        live: &mut Live,
        now: DateTime<Utc>,
        report: &mut TickReport,
    ) -> Result<(), AppError> {
        let by_id: HashMap<NodeId, &NodeRow> = seen.nodes.iter().map(|n| (n.id, n)).collect();
        live.refresh(&self.store).await?;
        let queued: Vec<AllocationRow> = live
            .rows()
            .filter(|a| a.state == AllocState::Queued)
            .filter(|a| a.starts_at.is_none_or(|s| s <= now))
            .cloned()
            .collect();
        report.queued = u32::try_from(queued.len()).unwrap_or(u32::MAX);
        if queued.is_empty() {
            self.refresh_snapshot(now, seen, shared, None, live).await?;
            return Ok(());
        }
        let held: Vec<&AllocationRow> = live
            .rows()
            .filter(|a| a.state != AllocState::Queued)
            .collect();
        let mut input = self
            .planner_input(seen, &held, desired, shared, now)
            .await?;
        // Placement moves nothing to active, so the pass's snapshot reuses these.
        let shares = self.fair_shares(now, live).await?;
        let requests = planner_requests(&queued, &shares, booked);
        let mut cluster = std::mem::take(&mut input.cluster);
        cluster.demand = self.recent_share_demand().await?;
        // Allocations displaced from an unhealthy GPU or a lost node go to spares first.
        let spare_ids = if input.spare_cluster.nodes.is_empty() {
            BTreeSet::new()
        } else {
            self.store
                .displaced_queued()
                .await
                .map_err(internal("loading displaced allocations"))?
                .into_iter()
                .collect()
        };
        let plan = self.plan_with_spares(&cluster, &input.spare_cluster, &requests, &spare_ids)?;
        let mut placed: HashMap<AllocationId, Vec<AllocatedDevice>> = HashMap::new();
        for asg in &plan.assignments {
            let Some(id) = requests.owner(&asg.request) else {
                continue;
            };
            if !asg.members.is_empty() {
                // A gang: every member's devices, in rank order.
                placed.insert(id, gang_devices(&asg.members, &by_id, &input));
                continue;
            }
            let Some(node_id) = planned_node(&asg.node) else {
                continue;
            };
            let hostname = by_id
                .get(&node_id)
                .map(|n| n.hostname.clone())
                .unwrap_or_default();
            let gpus = if asg.gpus.is_empty() {
                asg.gpu.into_iter().collect()
            } else {
                asg.gpus.clone()
            };
            for g in gpus {
                let Some(uuid) = input.gpu_uuid.get(&(node_id, g)) else {
                    continue;
                };
                placed.entry(id).or_default().push(AllocatedDevice {
                    node_id,
                    hostname: hostname.clone(),
                    gpu_uuid: uuid.clone(),
                    profile: asg.profile.clone(),
                    start: asg.start,
                    mig_uuid: None,
                });
            }
        }
        let mut pending_reason: HashMap<AllocationId, String> = HashMap::new();
        for p in &plan.pending {
            if let Some(id) = requests.owner(&p.request) {
                pending_reason.entry(id).or_insert_with(|| p.reason.clone());
            }
        }
        self.write_layouts(&plan, &input, now, report).await?;
        live.changed();
        // Drained capacity is left out; a request that waits says so when it counts.
        for a in &queued {
            if let (Some((drained, unhealthy)), Some(r)) =
                (input.drained.get(&a.model), pending_reason.get_mut(&a.id))
            {
                let count = |n: u32| tessera_domain::text::count(u64::from(n), "GPU", "GPUs");
                let mut out = Vec::new();
                if *drained > 0 {
                    out.push(format!("{} drained by a platform admin", count(*drained)));
                }
                if *unhealthy > 0 {
                    out.push(format!("{} unhealthy", count(*unhealthy)));
                }
                r.push_str(&format!(" ({}: {})", a.model, out.join(", ")));
            }
            if let (Some(n), Some(r)) = (input.spared.get(&a.model), pending_reason.get_mut(&a.id))
            {
                r.push_str(&spares::spare_note(&a.model, *n));
            }
        }
        let still_waiting = self
            .settle_queue(&queued, placed, &pending_reason, now, report)
            .await?;
        report.warned += self
            .preempt_for(&still_waiting, booked, seen.inventories, live, now)
            .await?;
        self.refresh_snapshot(now, seen, shared, Some(shares), live)
            .await?;
        Ok(())
    }

    /// The plan's layouts as desired states: an allocation is `placing` only once its GPU
    /// is told.
    async fn write_layouts(
        &self,
        plan: &planner::Plan,
        input: &PlannerInput,
        now: DateTime<Utc>,
        report: &mut TickReport,
    ) -> Result<(), AppError> {
        for r in &plan.reconfigurations {
            let Some(node_id) = planned_node(&r.node) else {
                continue;
            };
            let Some(uuid) = input.gpu_uuid.get(&(node_id, r.gpu)) else {
                continue;
            };
            let current = input.instances.get(uuid).cloned().unwrap_or_default();
            let (mode, layout) = match r.mode {
                planner::GpuMode::Mig => {
                    let mut layout: Vec<DesiredInstance> = current
                        .into_iter()
                        .filter(|i| {
                            !r.destroy
                                .iter()
                                .any(|d| d.profile == i.profile && d.start == i.start)
                        })
                        .collect();
                    layout.extend(r.create.iter().map(|c| DesiredInstance {
                        profile: c.profile.clone(),
                        start: c.start,
                    }));
                    layout.sort_by_key(|i| i.start);
                    (MigMode::Enabled, layout)
                }
                _ => (MigMode::Disabled, Vec::new()),
            };
            self.store
                .set_desired(node_id, uuid, mode, &layout, None, now)
                .await
                .map_err(internal("writing desired layout"))?;
            self.signals.bump(node_id);
            report.reconfigured += 1;
        }
        Ok(())
    }

    /// Moves the placed allocations to `placing` and stores the reason of those left
    /// waiting, which it returns.
    async fn settle_queue<'q>(
        &self,
        queued: &'q [AllocationRow],
        mut placed: HashMap<AllocationId, Vec<AllocatedDevice>>,
        pending_reason: &HashMap<AllocationId, String>,
        now: DateTime<Utc>,
        report: &mut TickReport,
    ) -> Result<Vec<&'q AllocationRow>, AppError> {
        let mut still_waiting: Vec<&AllocationRow> = Vec::new();
        for a in queued {
            let devs = placed.remove(&a.id).unwrap_or_default();
            let complete = match a.kind {
                GpuKind::Mig { .. } | GpuKind::Whole { .. } => {
                    devs.len() == usize::try_from(a.count).unwrap_or(0)
                }
                GpuKind::Share { .. } => devs.len() == 1,
            };
            if complete {
                let change = Change {
                    devices: serde_json::to_string(&devs).ok(),
                    pending_reason: Some(None),
                    ..Change::default()
                };
                let note = format!(
                    "placed on {}",
                    devs.iter()
                        .map(|d| d.hostname.as_str())
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                if self
                    .step(
                        a.id,
                        AllocState::Queued,
                        AllocState::Placing,
                        By {
                            at: now,
                            actor: None,
                            note: Some(&note),
                        },
                        change,
                    )
                    .await?
                {
                    report.placed += 1;
                    self.audit_change(None, AuditAction::AllocationPlace, a)
                        .await;
                    let since = a.starts_at.unwrap_or(a.created_at).max(a.created_at);
                    report
                        .placement_waits
                        .push((now - since).num_milliseconds().max(0) as f64 / 1000.0);
                }
            } else {
                let reason = pending_reason
                    .get(&a.id)
                    .cloned()
                    .unwrap_or_else(|| format!("not enough free {} capacity", a.model));
                if a.pending_reason.as_deref() != Some(reason.as_str()) {
                    self.store
                        .set_pending_reason(a.id, Some(&reason))
                        .await
                        .map_err(internal("storing pending reason"))?;
                }
                still_waiting.push(a);
            }
        }
        Ok(still_waiting)
    }

    /// Borrowed capacity is preemptible: for each waiting allocation whose team asks
    /// within its guarantee, the borrowers' newest allocations on that model are warned
    /// (`preempt_at` = now + grace) and released when the warning runs out (see
    /// [`tick`](Self::tick)). A warning no longer needed is withdrawn. Never preempts
    /// within a team's guarantee, and never in vain (an allocation that needs a CUDA
    /// version reclaims only from nodes whose driver supports it).
    async fn preempt_for(
        &self,
        waiting: &[&AllocationRow],
        booked: &BTreeSet<AllocationId>,
        inventories: &HashMap<NodeId, Arc<Inventory>>,
        live: &mut Live,
        now: DateTime<Utc>,
    ) -> Result<u32, AppError> {
        live.refresh(&self.store).await?;
        let active: Vec<&AllocationRow> = live
            .rows()
            .filter(|a| a.state == AllocState::Active)
            .collect();
        let quotas: HashMap<(TeamId, String), QuotaRow> = self
            .store
            .quotas(None)
            .await
            .map_err(internal("loading quotas"))?
            .into_iter()
            .map(|q| ((q.team_id, q.model.clone()), q))
            .collect();
        let quota_of_team = |team: TeamId, model: &str| {
            quotas
                .get(&(team, model.to_owned()))
                .map_or((0, 0), |q| (to_u32(q.used), to_u32(q.guaranteed)))
        };
        let mut victims: BTreeSet<AllocationId> = BTreeSet::new();
        let runs = |need: Option<CudaVersion>, r: &AllocationRow| {
            need.is_none_or(|need| {
                r.devices.iter().all(|d| {
                    inventories
                        .get(&d.node_id)
                        .and_then(|i| i.driver.as_ref())
                        .is_some_and(|drv| drv.cuda >= need)
                })
            })
        };
        for a in waiting {
            let need = a.needs_cuda;
            let (used, guaranteed) = quota_of_team(a.team_id, &a.model);
            let ask = to_u32(a.units);
            // `used` already counts this queued allocation.
            let claim = alloc::Claim {
                team: a.team_id,
                used: used.saturating_sub(ask),
                guaranteed,
                ask,
            };
            let running: Vec<alloc::Running> = active
                .iter()
                .filter(|r| r.model == a.model && r.team_id != a.team_id)
                .filter(|r| !victims.contains(&r.id) && !booked.contains(&r.id))
                .filter(|r| runs(need, r))
                .filter_map(|r| {
                    let (team_used, team_guaranteed) = quota_of_team(r.team_id, &r.model);
                    Some(alloc::Running {
                        id: r.id,
                        team: r.team_id,
                        units: to_u32(r.units),
                        started_at: r.active_at?,
                        priority: r.priority,
                        team_used,
                        team_guaranteed,
                    })
                })
                .collect();
            if let Some(p) = alloc::select_victims(&claim, ask, &running) {
                victims.extend(p.victims);
            }
        }
        let mut warned = 0;
        for &r in &active {
            if r.preempt_cause.is_some_and(PreemptCause::is_firm) {
                // Goes anyway, at the drain's deadline.
                continue;
            }
            let wanted = victims.contains(&r.id);
            match (wanted, r.preempt_at) {
                (true, None) => {
                    live.changed();
                    let at = now + self.grace_for(r.team_id).await?;
                    self.store
                        .set_preempt_at(r.id, Some((at, PreemptCause::Reclaim)), self.clock.now())
                        .await
                        .map_err(internal("warning of preemption"))?;
                    tracing::info!(allocation = %r.id, %at, "borrowed capacity will be reclaimed");
                    warned += 1;
                }
                (false, Some(_)) => {
                    live.changed();
                    self.store
                        .set_preempt_at(r.id, None, self.clock.now())
                        .await
                        .map_err(internal("withdrawing preemption warning"))?;
                }
                _ => {}
            }
        }
        Ok(warned)
    }

    /// The shares asked for lately, by kind, placed or not: the fractional policy keeps
    /// room for this mix on shared GPUs, as FGD keeps room for its target workload. A
    /// single new request alone in the queue would otherwise be its own whole forecast.
    async fn recent_share_demand(&self) -> Result<Vec<planner::Demand>, AppError> {
        let kinds = self
            .store
            .recent_kinds(DEMAND_WINDOW)
            .await
            .map_err(internal("loading recent requests"))?;
        Ok(kinds
            .into_iter()
            .filter_map(|(kind, n)| match kind.parse::<GpuKind>() {
                Ok(GpuKind::Share { model, milli }) => Some(planner::Demand {
                    request: planner::Request {
                        gpu_milli: Some(milli),
                        models: vec![model],
                        ..planner::Request::new(kind)
                    },
                    weight: u32::try_from(n).unwrap_or(u32::MAX),
                }),
                _ => None,
            })
            .collect())
    }

    /// The cluster as the planner sees it: online nodes' GPUs of known models, minus GPUs
    /// whose desired layout is still being applied; instances held by allocations (or
    /// running processes) are busy and never destroyed; a GPU handed out whole is never changed.
    async fn planner_input(
        &self,
        seen: &Seen<'_>,
        held: &[&AllocationRow],
        desired: &[DesiredWithStatus],
        shared: &HashMap<String, ShareMethod>,
        now: DateTime<Utc>,
    ) -> Result<PlannerInput, AppError> {
        let Seen {
            nodes,
            inventories,
            drains,
            spares,
        } = *seen;
        let mut busy: BTreeSet<(String, Option<u8>)> = BTreeSet::new();
        for a in held {
            for d in devices(a) {
                busy.insert((d.gpu_uuid.clone(), d.start));
            }
        }
        let share_used = share_usage(held.iter().copied());
        let held_devices: Vec<AllocatedDevice> = held.iter().flat_map(|a| devices(a)).collect();
        // (node, GPU) pairs anything is held on.
        let held_on: BTreeSet<(NodeId, &str)> = held_devices
            .iter()
            .map(|d| (d.node_id, d.gpu_uuid.as_str()))
            .collect();
        let mut input = PlannerInput::default();
        // Admins choose the shared GPUs; the planner never makes one.
        input.cluster.fixed_sharing = true;
        input.spare_cluster.fixed_sharing = true;
        // A GPU whose desired layout is not applied yet is left out: its instances are
        // about to change.
        let applying: BTreeSet<(NodeId, &str)> = desired
            .iter()
            .filter(|d| {
                !d.status
                    .as_ref()
                    .is_some_and(|st| st.state == ApplyState::Success)
            })
            .map(|d| (d.desired.node_id, d.desired.gpu_uuid.as_str()))
            .collect();
        for n in nodes
            .iter()
            .filter(|n| cluster::is_online(n.last_heartbeat_at, now))
        {
            let mut gpus = Vec::new();
            let mut spare_gpus = Vec::new();
            let Some(inv) = inventories.get(&n.id) else {
                continue;
            };
            for g in &inv.gpus {
                let Some(model) = self.catalog.get(&g.name) else {
                    continue;
                };
                if let Some(r) = drains.iter().find(|r| r.covers(n.id, &g.uuid)) {
                    let (ref mut drained, ref mut unhealthy) =
                        *input.drained.entry(model.name().to_owned()).or_default();
                    *if r.health { unhealthy } else { drained } += 1;
                    continue;
                }
                if applying.contains(&(n.id, g.uuid.as_str())) {
                    continue;
                }
                input.gpu_uuid.insert((n.id, g.index), g.uuid.clone());
                let mig_on = g.mig_mode.is_some_and(|m| m.current == MigMode::Enabled);
                let settled = g.mig_mode.is_some_and(|m| m.current == m.pending);
                let instances: Vec<planner::MigInstance> = g
                    .instances
                    .iter()
                    .map(|i| planner::MigInstance {
                        profile: i.profile.clone(),
                        start: i.start,
                        busy: busy.contains(&(g.uuid.clone(), Some(i.start)))
                            || i.compute_instances
                                .iter()
                                .any(|c| c.process_count != Some(0)),
                    })
                    .collect();
                input.instances.insert(
                    g.uuid.clone(),
                    g.instances
                        .iter()
                        .map(|i| DesiredInstance {
                            profile: i.profile.clone(),
                            start: i.start,
                        })
                        .collect(),
                );
                if shared.contains_key(&g.uuid) {
                    // Shares only, never reconfigured (its mode is the admin's).
                    gpus.push(planner::Gpu {
                        index: g.index,
                        model: model.name().to_owned(),
                        mode: planner::GpuMode::Shared,
                        reconfigurable: false,
                        instances: Vec::new(),
                        busy: false,
                        used_milli: share_used.get(&g.uuid).copied().unwrap_or(0).min(1000),
                    });
                    continue;
                }
                // Held whole, or held at all while the node still reports MIG off (a slice
                // placed on it, e.g. on a hot spare, whose layout the inventory does not
                // show yet): never handed out whole.
                let whole_busy = busy.contains(&(g.uuid.clone(), None))
                    || (!mig_on && held_on.contains(&(n.id, g.uuid.as_str())));
                let gpu = planner::Gpu {
                    index: g.index,
                    model: model.name().to_owned(),
                    mode: if mig_on {
                        planner::GpuMode::Mig
                    } else {
                        planner::GpuMode::Whole
                    },
                    // Busy instances are never destroyed (the planner keeps them); new
                    // instances may go into free slices beside them. A GPU handed out whole
                    // is never touched.
                    reconfigurable: n.manages_mig && settled && (mig_on || !whole_busy),
                    instances: if mig_on { instances } else { Vec::new() },
                    busy: !mig_on && whole_busy,
                    used_milli: 0,
                };
                // A hot spare is planned only for displaced allocations.
                if spares.contains(&g.uuid) {
                    *input.spared.entry(model.name().to_owned()).or_default() += 1;
                    spare_gpus.push(gpu);
                } else {
                    gpus.push(gpu);
                }
            }
            // The driver from its latest inventory: a request that needs a CUDA version
            // goes only where the driver supports it.
            input.cluster.nodes.push(planner::Node {
                driver: inv.driver.clone(),
                group: n.node_group.clone(),
                ..planner::Node::gpus_only(n.id.to_string(), gpus)
            });
            if !spare_gpus.is_empty() {
                input.spare_cluster.nodes.push(planner::Node {
                    driver: inv.driver.clone(),
                    ..planner::Node::gpus_only(n.id.to_string(), spare_gpus)
                });
            }
        }
        Ok(input)
    }
}

/// The queue as planner requests, with the allocation each request is for.
///
/// The planner names requests by text; an allocation of `count` MIG slices is `count`
/// requests (`<id>#<i>`). The passes look a request's allocation up here instead of
/// parsing the text back.
pub(super) struct Requests {
    pub(super) list: Vec<planner::Request>,
    owner: HashMap<String, AllocationId>,
}

impl Requests {
    /// The allocation the planner's request `id` is for (`None`: not one of these, which
    /// would be the planner's fault: logged).
    pub(super) fn owner(&self, id: &str) -> Option<AllocationId> {
        let owner = self.owner.get(id).copied();
        if owner.is_none() {
            tracing::error!(
                request = id,
                "the planner answered for a request it was not given"
            );
        }
        owner
    }
}

/// The node a planner answer names: the pass gives the planner node ids as text, so an
/// answer naming anything else is the planner's fault (`None`, logged).
fn planned_node(node: &str) -> Option<NodeId> {
    let id = NodeId::parse(node);
    if id.is_none() {
        tracing::error!(node, "the planner answered for a node it was not given");
    }
    id
}

/// The queue as planner requests (a MIG request of `count` slices is `count` requests),
/// ranked by the queue order: the first in line has the highest priority.
fn planner_requests(
    queued: &[AllocationRow],
    shares: &BTreeMap<TeamId, FairShare>,
    booked: &BTreeSet<AllocationId>,
) -> Requests {
    let entries: Vec<QueueEntry> = queued.iter().filter_map(queue_entry).collect();
    let order = alloc::order_queue(&entries, shares);
    let rank: HashMap<AllocationId, usize> =
        order.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let total = i32::try_from(order.len()).unwrap_or(i32::MAX);
    let mut requests = Vec::new();
    let mut owner = HashMap::new();
    for a in queued {
        let first = requests.len();
        push_requests(a, &rank, total, booked, &mut requests);
        for r in &requests[first..] {
            owner.insert(r.id.clone(), a.id);
        }
    }
    Requests {
        list: requests,
        owner,
    }
}

/// Allocation `a`'s planner requests, at its place in the queue.
fn push_requests(
    a: &AllocationRow,
    rank: &HashMap<AllocationId, usize>,
    total: i32,
    booked: &BTreeSet<AllocationId>,
    requests: &mut Vec<planner::Request>,
) {
    let kind = a.kind.clone();
    // A booking's allocation goes before the whole queue: its capacity was promised.
    let priority = if booked.contains(&a.id) {
        total.saturating_add(1)
    } else {
        total - i32::try_from(rank.get(&a.id).copied().unwrap_or(0)).unwrap_or(0)
    };
    let base = planner::Request {
        team: Some(a.team_id.to_string()),
        priority,
        models: vec![a.model.clone()],
        needs_cuda: a.needs_cuda,
        ..planner::Request::new(a.id.to_string())
    };
    if let Some(nodes) = a.gang_nodes {
        // A gang: one request, placed whole or not at all.
        // `count` is the whole gang's; each member holds an equal part.
        let nodes = u32::try_from(nodes).unwrap_or(u32::MAX).max(1);
        let each = to_u32(a.count) / nodes;
        let (gpus, mig, per_node) = match kind {
            GpuKind::Mig { profile, .. } => (None, Some(profile), each),
            _ => (Some(each), None, 1),
        };
        requests.push(planner::Request {
            gpus,
            mig,
            gang: Some(planner::Gang { nodes, per_node }),
            ..base
        });
        return;
    }
    match kind {
        GpuKind::Share { model, milli } => requests.push(planner::Request {
            gpu_milli: Some(milli),
            models: vec![model],
            ..base
        }),
        GpuKind::Mig { profile, .. } => {
            for i in 0..a.count {
                requests.push(planner::Request {
                    id: format!("{}#{i}", a.id),
                    mig: Some(profile.clone()),
                    ..base.clone()
                });
            }
        }
        GpuKind::Whole { .. } => requests.push(planner::Request {
            gpus: Some(to_u32(a.count)),
            ..base
        }),
    }
}

/// A placed gang's devices, member by member (rank order), as an allocation stores them.
fn gang_devices(
    members: &[planner::GangMember],
    by_id: &HashMap<NodeId, &NodeRow>,
    input: &PlannerInput,
) -> Vec<AllocatedDevice> {
    let mut out = Vec::new();
    for m in members {
        let Some(node_id) = planned_node(&m.node) else {
            continue;
        };
        let hostname = by_id
            .get(&node_id)
            .map(|n| n.hostname.clone())
            .unwrap_or_default();
        let whole = m.gpus.iter().map(|g| (*g, None, None));
        let slices = m
            .slices
            .iter()
            .map(|s| (s.gpu, Some(s.profile.clone()), Some(s.start)));
        for (gpu, profile, start) in whole.chain(slices) {
            if let Some(uuid) = input.gpu_uuid.get(&(node_id, gpu)) {
                out.push(AllocatedDevice {
                    node_id,
                    hostname: hostname.clone(),
                    gpu_uuid: uuid.clone(),
                    profile,
                    start,
                    mig_uuid: None,
                });
            }
        }
    }
    out
}

/// The GPUs of the online nodes that are of a catalog model, with their node and model,
/// node by node.
pub(super) fn online_gpus<'a>(
    nodes: &'a [NodeRow],
    inventories: &'a HashMap<NodeId, Arc<Inventory>>,
    catalog: &'a Catalog,
    now: DateTime<Utc>,
) -> impl Iterator<
    Item = (
        &'a NodeRow,
        &'a tessera_domain::wire::GpuInfo,
        &'a tessera_domain::mig::GpuModel,
    ),
> {
    nodes
        .iter()
        .filter(move |n| cluster::is_online(n.last_heartbeat_at, now))
        .filter_map(|n| Some((n, inventories.get(&n.id)?)))
        .flat_map(move |(n, inv)| {
            inv.gpus
                .iter()
                .filter_map(move |g| Some((n, g, catalog.get(&g.name)?)))
        })
}

/// The nodes as the pass read them: their inventories, and what is out of service.
#[derive(Clone, Copy)]
pub(super) struct Seen<'a> {
    pub(super) nodes: &'a [NodeRow],
    pub(super) inventories: &'a HashMap<NodeId, Arc<Inventory>>,
    pub(super) drains: &'a [DrainRow],
    /// This pass's hot spares (GPU UUIDs).
    pub(super) spares: &'a BTreeSet<String>,
}

#[derive(Default)]
struct PlannerInput {
    cluster: planner::Cluster,
    /// (node, GPU index) → GPU UUID.
    gpu_uuid: HashMap<(NodeId, u32), String>,
    /// GPU UUID → its instances now.
    instances: HashMap<String, Vec<DesiredInstance>>,
    /// Model → GPUs of it left out: (drained by an admin, unhealthy).
    drained: HashMap<String, (u32, u32)>,
    /// The hot spares: only they, for displaced allocations.
    spare_cluster: planner::Cluster,
    /// Model → spare GPUs left out of ordinary placement.
    spared: HashMap<String, u32>,
}

/// An ended allocation that was active once: (team, units, active_at, ends_at).
type Ended = (TeamId, i64, DateTime<Utc>, Option<DateTime<Utc>>);

/// Fair share's usage of one allocation: (team, units, running, active_at, ends_at).
pub(super) type Usage = (TeamId, i64, bool, DateTime<Utc>, Option<DateTime<Utc>>);

/// How long the leader's copy of the live allocations goes on changes alone before it is
/// loaded whole again (the safety net; change-feed entries are kept ten minutes).
const FULL_RELOAD: std::time::Duration = std::time::Duration::from_secs(60);

/// The leader's copy of the live allocations (queued, placing, active, releasing), kept
/// across passes: loaded whole once (and every [`FULL_RELOAD`]), then kept current from the
/// change feed (`allocation_changes`, filled by triggers on every write, whoever writes):
/// a pass reads only the allocations that changed since the last one. With them, what
/// fair share needs of the allocations that ended within its window.
#[derive(Default)]
pub(super) struct LiveCache {
    /// In queue order: (created_at, id).
    rows: BTreeMap<(DateTime<Utc>, AllocationId), AllocationRow>,
    /// id → created_at (the key in `rows`).
    keys: HashMap<AllocationId, DateTime<Utc>>,
    /// Ended allocations that were active once: (team, units, active_at, ends_at).
    ended: HashMap<AllocationId, Ended>,
    /// The change feed's position and when everything was last loaded.
    horizon: i64,
    loaded_at: Option<std::time::Instant>,
}

impl LiveCache {
    /// Brings the copy up to date: everything when due, else what changed.
    async fn sync(&mut self, store: &Store, now: DateTime<Utc>) -> Result<(), AppError> {
        let due = self.loaded_at.is_none_or(|t| t.elapsed() > FULL_RELOAD);
        if due {
            // The horizon before the load: what changes after it is read again next time.
            let horizon = store
                .allocation_change_horizon()
                .await
                .map_err(internal("reading the allocation change feed"))?;
            let rows = store
                .live_allocations()
                .await
                .map_err(internal("loading allocations"))?;
            let usage = store
                .usage_since(now - alloc::FAIR_SHARE_WINDOW)
                .await
                .map_err(internal("loading usage"))?;
            self.rows.clear();
            self.keys.clear();
            self.ended.clear();
            for r in rows {
                self.put(r);
            }
            // Ended ones only (a row that became live since is in `rows`, and a change
            // after the horizon is read next time).
            for (id, team, units, running, start, end) in usage {
                if !running && !self.keys.contains_key(&id) {
                    self.ended.insert(id, (team, units, start, end));
                }
            }
            self.horizon = horizon;
            self.loaded_at = Some(std::time::Instant::now());
            if let Err(e) = store.prune_allocation_changes().await {
                tracing::warn!(error = %e, "pruning the allocation change feed");
            }
            return Ok(());
        }
        let (next, ids) = store
            .allocation_changes_since(self.horizon)
            .await
            .map_err(internal("reading the allocation change feed"))?;
        if !ids.is_empty() {
            let ids: Vec<AllocationId> = ids
                .into_iter()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let fresh = store
                .allocations_by_ids(&ids)
                .await
                .map_err(internal("loading changed allocations"))?;
            for id in &ids {
                self.remove(*id);
            }
            for r in fresh {
                self.put(r);
            }
        }
        self.horizon = next;
        Ok(())
    }

    fn remove(&mut self, id: AllocationId) {
        if let Some(created) = self.keys.remove(&id) {
            self.rows.remove(&(created, id));
        }
        self.ended.remove(&id);
    }

    /// Files `r` as live, as ended usage, or not at all.
    fn put(&mut self, r: AllocationRow) {
        if AllocState::LIVE.contains(&r.state) {
            self.keys.insert(r.id, r.created_at);
            self.rows.insert((r.created_at, r.id), r);
        } else if let Some(start) = r.active_at {
            self.ended
                .insert(r.id, (r.team_id, r.units, start, r.ends_at));
        }
    }
}

/// One pass's view of the leader's [`LiveCache`] (held for the pass): brought up to date
/// before each step that reads it after a step that wrote, so each step sees what the
/// earlier ones did, as when each read the store itself.
pub(super) struct Live {
    cache: tokio::sync::OwnedMutexGuard<LiveCache>,
    now: DateTime<Utc>,
    synced: bool,
    /// Set by a write (through `&self`, while the rows are borrowed).
    stale: AtomicBool,
    /// How many times the pass synced (logged at debug level).
    loads: u32,
}

impl Live {
    pub(super) async fn new(
        cache: &Arc<tokio::sync::Mutex<LiveCache>>,
        now: DateTime<Utc>,
    ) -> Self {
        Live {
            cache: cache.clone().lock_owned().await,
            now,
            synced: false,
            stale: AtomicBool::new(false),
            loads: 0,
        }
    }

    /// Brings the copy up to date unless nothing was written since it was.
    pub(super) async fn refresh(&mut self, store: &Store) -> Result<(), AppError> {
        if !self.synced || *self.stale.get_mut() {
            self.cache.sync(store, self.now).await?;
            self.synced = true;
            *self.stale.get_mut() = false;
            self.loads += 1;
        }
        Ok(())
    }

    /// The live allocations in queue order (call [`refresh`](Self::refresh) first).
    pub(super) fn rows(&self) -> impl Iterator<Item = &AllocationRow> + Clone {
        self.cache.rows.values()
    }

    /// Fair share's usage: (team, units, running, active_at, ends_at) of the allocations
    /// active at some point since `since` (as [`Store::usage_since`]).
    pub(super) fn usage_since(&self, since: DateTime<Utc>) -> Vec<Usage> {
        // As `Store::usage_since`: a row is counted from when it was first active.
        let live = self.rows().filter_map(|a| {
            let start = a.active_at?;
            let running = matches!(a.state, AllocState::Active | AllocState::Releasing);
            Some((a.team_id, a.units, running, start, a.ends_at))
        });
        let ended = self
            .cache
            .ended
            .values()
            .map(|&(team, units, start, end)| (team, units, false, start, end));
        live.chain(ended)
            .filter(|u| u.4.is_none_or(|e| e >= since))
            .collect()
    }

    /// Marks the copy out of date: the caller is about to write. Always `true` (for use
    /// inside conditions).
    pub(super) fn changed(&self) -> bool {
        self.stale.store(true, Ordering::Relaxed);
        true
    }
}
