//! Gang jobs (issue 42): one job on several nodes, one member workload per node.
//!
//! - **One request.** The job's own GPU request carries `nodes`; the planner places the
//!   whole gang in one pass or nothing of it, and the allocation's devices list every
//!   member's, in rank order.
//! - **Members.** Rank 0 is the job users see (its row, its id); when the allocation is
//!   active, ranks 1.. are stored beside it (`gang_job` = the job) in the same
//!   transaction that moves rank 0 to `pending`, each on its own node.
//! - **Two-step start.** Each agent makes its member's sandbox and reports the member's
//!   address (`gang_addr`, `gang_via`). Only once every member has one do the specs carry
//!   the peers and the launch environment ([`tessera_domain::alloc::gang::launch_env`]),
//!   and the agents start the processes.
//! - **One outcome.** A member that fails (or is lost) stops the others, and the job fails
//!   with its reason (also when rank 0 had already succeeded). A stop of the job, or the
//!   end of rank 0 under the `rank0` launcher, stops the others; under `each`, rank 0
//!   succeeding leaves the others to finish, and the allocation is held until the last
//!   member ends.

use super::*;
use tessera_domain::alloc as g;
use tessera_domain::wire::{GangLauncher, GangPeer, GangSpec};

/// A gang job's members and how far each is, as `GET /api/v1/workloads/{id}` shows them.
pub(super) type Members = HashMap<WorkloadId, Vec<WorkloadListRow>>;

impl Workloads {
    /// Rank 0 (`w`, queued) of a gang whose allocation is active on `all`:
    /// every member is placed on its node at once (see the module docs).
    pub(super) async fn start_gang(
        &self,
        w: &WorkloadRow,
        all: &[AllocatedDevice],
    ) -> Result<bool, AppError> {
        // Members in rank order: nodes in the order the allocation lists them.
        let mut nodes: Vec<(NodeId, String, Vec<AllocatedDevice>)> = Vec::new();
        for d in all {
            match nodes.iter_mut().find(|n| n.0 == d.node_id) {
                Some(n) => n.2.push(d.clone()),
                None => nodes.push((d.node_id, d.hostname.clone(), vec![d.clone()])),
            }
        }
        if i64::try_from(nodes.len()).ok() != w.gang_size {
            tracing::warn!(workload = %w.id, nodes = nodes.len(), size = ?w.gang_size,
                "a gang's allocation is not spread over as many nodes as it has members");
            return Ok(false);
        }
        let secret = self.notebook_token(w)?;
        let env = self.env_of(w)?;
        let now = self.clock.now();
        let mut members = Vec::new();
        for (rank, (node, host, devs)) in nodes.iter().enumerate().skip(1) {
            let mut row = WorkloadRow {
                node_id: Some(*node),
                hostname: host.clone(),
                devices: devs.clone(),
                command: w.command.clone(),
                workdir: w.workdir.clone(),
                image: w.image.clone(),
                image_cuda: w.image_cuda.clone(),
                gang_job: Some(w.id),
                gang_rank: i64::try_from(rank).unwrap_or(i64::MAX),
                gang_size: w.gang_size,
                gang_launcher: w.gang_launcher,
                gang_ranks: w.gang_ranks,
                // A requeued gang's new members are told from the old by the attempt.
                attempt: w.attempt,
                ..WorkloadRow::new(
                    w.kind,
                    &w.name,
                    (w.allocation_id, w.team_id, w.user_id),
                    WorkloadState::Pending,
                    now,
                )
            };
            self.seal_secrets(&mut row, secret.as_deref(), &env)?;
            members.push(row);
        }
        let Some((node, host, devs)) = nodes.first() else {
            return Ok(false);
        };
        let placed = self
            .store
            .place_gang(w.id, (*node, host, devs), &members, self.clock.now())
            .await
            .map_err(internal("placing a gang"))?;
        if placed {
            for (node, _, _) in &nodes {
                self.tell_node(Some(*node));
            }
        }
        Ok(placed)
    }

    /// A gang request that no node could ever hold is refused at once: more of its kind
    /// per node than the largest node has (422 naming `gpus_per_node`). With no node of
    /// the model yet, it waits like any request.
    pub(super) async fn check_gang(&self, gpu: &NewAllocation) -> Result<(), AppError> {
        let catalog = self.allocations.catalog();
        // A kind that does not parse, or a share, is refused by the request's own checks.
        let Some(kind) = gpu
            .kind
            .parse::<GpuKind>()
            .ok()
            .and_then(|k| k.canonical(catalog).ok())
            .filter(|k| !matches!(k, GpuKind::Share { .. }))
        else {
            return Ok(());
        };
        // The parsed inventories the scheduler pass keeps (parsed once per version).
        let (nodes, inventories) =
            crate::services::active_nodes_with_inventories(&self.store).await?;
        let cluster = tessera_domain::planner::Cluster {
            nodes: nodes
                .iter()
                .filter_map(|n| Some((n, inventories.get(&n.id)?)))
                .map(|(n, inv)| {
                    let gpus = inv
                        .gpus
                        .iter()
                        .map(|g| tessera_domain::planner::Gpu {
                            index: g.index,
                            model: catalog
                                .get(&g.name)
                                .map_or(g.name.clone(), |m| m.name().to_owned()),
                            mode: tessera_domain::planner::GpuMode::Whole,
                            reconfigurable: false,
                            instances: Vec::new(),
                            busy: false,
                            used_milli: 0,
                        })
                        .collect();
                    tessera_domain::planner::Node::gpus_only(n.id.to_string(), gpus)
                })
                .collect(),
            ..tessera_domain::planner::Cluster::default()
        };
        let most = g::most_per_node(&kind, &cluster, catalog);
        if most == 0 {
            return Ok(());
        }
        g::GangRequest {
            kind,
            nodes: gpu.nodes.unwrap_or(1),
            gpus_per_node: gpu.count,
            ranks: g::Ranks::PerNode,
        }
        .validate(catalog, most)
        .map(|_| ())
    }

    /// The members of every gang among `rows`, by job.
    pub(super) async fn gangs_of(&self, rows: &[WorkloadListRow]) -> Result<Members, AppError> {
        let mut out = Members::new();
        for r in rows.iter().filter(|r| r.w.gang_size.is_some()) {
            let job = r.w.gang_job.unwrap_or(r.w.id);
            if let std::collections::hash_map::Entry::Vacant(e) = out.entry(job) {
                e.insert(self.members_now(job).await?);
            }
        }
        Ok(out)
    }

    /// The members of gang `job` in its current attempt (rank 0 first).
    pub(super) async fn members_now(
        &self,
        job: WorkloadId,
    ) -> Result<Vec<WorkloadListRow>, AppError> {
        let all = self
            .store
            .gang_members(job)
            .await
            .map_err(internal("loading a gang"))?;
        let attempt = all.iter().find(|m| m.w.id == job).map(|m| m.w.attempt);
        Ok(all
            .into_iter()
            .filter(|m| Some(m.w.attempt) == attempt)
            .collect())
    }

    /// The gang part of member `w`'s spec, and its launch environment once every member
    /// has its address (none before: the agent waits).
    pub(super) fn gang_spec(
        &self,
        w: &WorkloadRow,
        gangs: &Members,
    ) -> Result<Option<(GangSpec, Vec<EnvVar>)>, AppError> {
        let Some(size) = w.gang_size else {
            return Ok(None);
        };
        let job = w.gang_job.unwrap_or(w.id);
        let members = gangs.get(&job).map(Vec::as_slice).unwrap_or_default();
        let size = u32::try_from(size).unwrap_or(0);
        let rank = u32::try_from(w.gang_rank).unwrap_or(0);
        let ready: Option<Vec<GangPeer>> = (0..size)
            .map(|r| {
                let m = members
                    .iter()
                    .find(|m| u32::try_from(m.w.gang_rank).ok() == Some(r))?;
                Some(GangPeer {
                    rank: r,
                    addr: m.w.gang_addr.clone()?,
                    via: m.w.gang_via.clone()?,
                    slots: u32::try_from(m.w.devices.len()).unwrap_or(0),
                })
            })
            .collect();
        let secret = self.notebook_token(w)?.ok_or(AppError::Internal)?;
        let env = ready.as_ref().map_or_else(Vec::new, |peers| {
            let addrs: Vec<String> = peers.iter().map(|p| p.addr.clone()).collect();
            let gpus = u32::try_from(w.devices.len()).unwrap_or(0);
            g::launch_env(&job.to_string(), rank, &addrs, gpus)
        });
        Ok(Some((
            GangSpec {
                job: job.to_string(),
                rank,
                size,
                launcher: launcher_of(w),
                secret,
                rsh_port: g::RSH_PORT,
                peers: ready,
            },
            env,
        )))
    }

    /// Records the address a member's agent reported; when it is new, every member's node
    /// is told (the last address completes the peers of all of them).
    pub(super) async fn gang_report(
        &self,
        w: &WorkloadRow,
        rep: &WorkloadReport,
        from: Reporter,
    ) -> Result<(), AppError> {
        let (Some(_), Some(addr), Some(via)) = (w.gang_size, &rep.gang_addr, &rep.gang_via) else {
            return Ok(());
        };
        // A node's agent reports IP addresses (its routes are per address); only the
        // server's own Kubernetes executor may name members by cluster DNS names.
        let dns = from == Reporter::Executor;
        if !g::gang_addr_ok(addr, dns) || !g::gang_addr_ok(via, dns) {
            tracing::warn!(workload = %w.id, addr, via, "ignoring a gang address that is not an IP address");
            return Ok(());
        }
        let changed = self
            .store
            .set_gang_addr(w.id, addr, via)
            .await
            .map_err(internal("storing a gang address"))?;
        if changed {
            let job = w.gang_job.unwrap_or(w.id);
            for m in self.members_now(job).await? {
                self.tell_node(m.w.node_id);
            }
        }
        Ok(())
    }

    /// One outcome for each gang among the live `rows` (see the module docs); answers how
    /// many members it stopped.
    pub(super) async fn gang_pass(&self, rows: &[WorkloadListRow]) -> Result<u32, AppError> {
        let gangs = self.gangs_of(rows).await?;
        let mut stopped = 0;
        for members in gangs.values() {
            stopped += self.settle_gang(members).await?;
        }
        Ok(stopped)
    }

    /// One outcome for a gang, from its current attempt's `members` (rank 0 among them):
    /// run by each pass, and at once when a member's end is reported (the last members
    /// may end between two passes, leaving none live for the pass to see). Answers how
    /// many members it stopped.
    pub(super) async fn settle_gang(&self, members: &[WorkloadListRow]) -> Result<u32, AppError> {
        let mut stopped = 0;
        let Some(job) = members.iter().find(|m| m.w.gang_job.is_none()) else {
            return Ok(0);
        };
        // Not started as a gang yet (queued): nothing to keep together.
        if members.len() < 2 {
            return Ok(0);
        }
        let failed = members
            .iter()
            .find(|m| matches!(m.w.state, WorkloadState::Failed | WorkloadState::Lost));
        // With every member running the command, rank 0 succeeding first leaves the
        // others to finish; with `rank0`, rank 0's end is the job's.
        let rank0_done = match launcher_of(&job.w) {
            GangLauncher::Rank0 => !job.w.state.is_live(),
            GangLauncher::Each => matches!(
                job.w.state,
                WorkloadState::Cancelled | WorkloadState::Stopped
            ),
        };
        let (end, why) = if let Some(f) = failed {
            let how = match (f.w.exit_code, f.w.message.as_deref()) {
                (Some(c), _) => format!("exit code {c}"),
                (None, Some(m)) => m.to_owned(),
                (None, None) => f.w.state.as_str().to_owned(),
            };
            let why = format!("rank {} on {} failed ({how})", f.w.gang_rank, f.w.hostname);
            // Retries left: the whole gang goes again, as the job's next attempt on a
            // new allocation (also when rank 0 had already succeeded: the job is the
            // whole gang). `retry_gang` ends this attempt's other members.
            if retryable(&job.w) && self.retry_gang(&job.w, &why).await? {
                return Ok(0);
            }
            if job.w.state == WorkloadState::Succeeded && f.w.id != job.w.id {
                // The job is the whole gang: a rank failing after rank 0 finished
                // fails it.
                self.store
                    .workload_step(
                        job.w.id,
                        WorkloadState::Succeeded.as_str(),
                        WorkloadState::Failed.as_str(),
                        &WorkloadChange {
                            message: Some(why.clone()),
                            ..WorkloadChange::default()
                        },
                        self.clock.now(),
                    )
                    .await
                    .map_err(internal("failing a gang job"))?;
            }
            (WorkloadState::Failed, why)
        } else if job.w.state == WorkloadState::Stopping || rank0_done {
            (stop_end(&job.w), format!("rank 0 {}", job.w.state.as_str()))
        } else {
            return Ok(0);
        };
        for m in members.iter().filter(|m| {
            m.w.id != failed.map_or(WorkloadId(Uuid::nil()), |f| f.w.id)
                && m.w.state.is_live()
                && m.w.state != WorkloadState::Stopping
        }) {
            if self.request_stop_as(&m.w, end, &why).await.unwrap_or(false) {
                stopped += 1;
            }
        }
        Ok(stopped)
    }

    /// Gang `job` (rank 0) goes again after `why` (a member failed): the job is queued for
    /// a new allocation as its next attempt, members and all, and the old one is given
    /// back (this attempt's other members are cancelled). `false` when it has no
    /// retries left or could not be queued again (then it fails like any gang).
    pub(super) async fn retry_gang(&self, job: &WorkloadRow, why: &str) -> Result<bool, AppError> {
        if !retryable(job) {
            return Ok(false);
        }
        // The job moves to its new request first, then the old allocation is given back:
        // at no moment does the job sit on an ended allocation (which would stop it). A new
        // request that the old one's units push over the team's limit waits for room and is
        // admitted as the old one goes (`admit_when_room`).
        let attempt = self.members_now(job.id).await?;
        let moved = self.requeue_as(job, Some(why)).await?;
        if moved {
            let note = format!("its job `{}` goes again: {why}", job.name);
            self.allocations
                .release_for_system(job.allocation_id, &note)
                .await?;
            // The attempt's other members end with it (rank 0's run is no longer wanted on
            // its node: the job moved on).
            for m in attempt.iter().filter(|m| {
                m.w.gang_job.is_some()
                    && m.w.state.is_live()
                    && m.w.state != WorkloadState::Stopping
            }) {
                let _ = self
                    .request_stop_as(&m.w, WorkloadState::Cancelled, why)
                    .await;
            }
        }
        Ok(moved)
    }
}

impl Workloads {
    /// Every member of gang `job` in its current attempt, for the job's view.
    pub(super) async fn rank_views(&self, job: WorkloadId) -> Result<Vec<RankView>, AppError> {
        Ok(self
            .members_now(job)
            .await?
            .into_iter()
            .map(|m| RankView {
                rank: u32::try_from(m.w.gang_rank).unwrap_or(0),
                id: m.w.id,
                state: m.w.state,
                hostname: m.w.hostname.clone(),
                devices: m.w.devices.iter().map(device_uuid).collect(),
                addr: m.w.gang_addr.clone(),
                exit_code: m.w.exit_code.and_then(|c| i32::try_from(c).ok()),
                message: m.w.message.clone(),
                ready_at: m.w.ready_at,
            })
            .collect())
    }

    /// The workload id of rank `rank` of the job `id` the caller may act on (its log);
    /// rank 0 is the job itself. 404 for a rank the job does not have.
    pub async fn rank_id(
        &self,
        p: &Principal,
        id: WorkloadId,
        rank: u32,
    ) -> Result<WorkloadId, AppError> {
        let row = self.actionable(p, id).await?;
        if rank == 0 {
            return Ok(row.w.id);
        }
        if row.w.gang_size.is_none() || row.w.gang_job.is_some() {
            return Err(AppError::invalid("rank", "only a multi-node job has ranks"));
        }
        self.members_now(row.w.id)
            .await?
            .into_iter()
            .find(|m| u32::try_from(m.w.gang_rank).ok() == Some(rank))
            .map(|m| m.w.id)
            .ok_or_else(|| AppError::invalid("rank", format!("the job has no rank {rank} (yet)")))
    }
}

/// How `w`'s gang launches (`each` unless stored otherwise).
/// Whether gang job `w` (rank 0) may go again: retries left, and live or succeeded (under
/// `each`, rank 0 may finish before another member fails).
fn retryable(w: &WorkloadRow) -> bool {
    w.gang_size.is_some()
        && w.gang_job.is_none()
        && (w.state.is_live() || w.state == WorkloadState::Succeeded)
        && w.attempt <= w.retries
}

/// Whether gang member `w` starts one process per GPU.
pub(super) fn per_gpu(w: &WorkloadRow) -> bool {
    w.gang_ranks == Some(g::Ranks::PerGpu)
}

fn launcher_of(w: &WorkloadRow) -> GangLauncher {
    w.gang_launcher.unwrap_or_default()
}
