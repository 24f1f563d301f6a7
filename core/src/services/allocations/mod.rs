//! Allocations: request → admit against quota (or wait for approval) → queue → place with
//! the planner → active once the agent reports the device → release / expire / fail.
//!
//! The rules (units, admission, queue order, state table) are pure and live in
//! `tessera_domain::alloc`; this service authorizes, keeps the quota counters atomic
//! through the store, and runs the scheduler ([`Allocations::tick`]), which the server
//! calls every few seconds and after every change.

use super::authz::{self, Need};
use super::billing::Pricer;
use super::tenancy::paged;
use super::{found, internal};
use crate::auth::Principal;
use crate::clock::Clock;
use crate::services::audit::Entry;
use crate::store::{
    Admit, Admitted, AllocationListRow, AllocationRow, Change, DesiredWithStatus, Line, NodeRow,
    QuotaRow, Standing, Store, Transition as StoreTransition, decoded,
};
use chrono::{DateTime, Duration, Utc};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use tessera_domain::alloc::{
    self, AllocPolicy, AllocState, AllocatedDevice, AllocationView, Approver, Ask, Authority,
    FairShare, GpuKind, Held, HighGrant, NewAllocation, PendingInfo, PriorityClass, QueueEntry,
    Quota, QuotaView, Transition, TypedRequest,
};
use tessera_domain::audit::AuditAction;
use tessera_domain::audit::AuditEntryView;
use tessera_domain::billing;
use tessera_domain::cluster;
use tessera_domain::error::AppError;
use tessera_domain::ids::{AllocationId, NodeId, TeamId};
use tessera_domain::mig::Catalog;
use tessera_domain::planner;
use tessera_domain::tenancy::{Page, PageRequest, TeamRole};
use tessera_domain::wire::{ApplyState, DesiredInstance, Inventory, MigMode, ShareMethod};
use tokio::sync::Notify;
use uuid::Uuid;

mod bookings;
mod grace;
mod scheduler;
mod snapshot;
mod spares;

use snapshot::PendingContext;

/// By default, a node that stopped reporting is given this long before its allocations
/// fail (`TESSERA_NODE_GRACE`).
pub const NODE_GRACE: Duration = Duration::minutes(3);

/// A request as it arrives: text from a form or a REST body, or domain types from the
/// server's own passes (a job queued again after a preemption), checked by the same rules
/// without parsing anything back from text.
pub enum Requested<'a> {
    Text(&'a NewAllocation),
    Typed(&'a TypedRequest),
}

impl<'a> From<&'a NewAllocation> for Requested<'a> {
    fn from(r: &'a NewAllocation) -> Self {
        Requested::Text(r)
    }
}

impl<'a> From<&'a TypedRequest> for Requested<'a> {
    fn from(r: &'a TypedRequest) -> Self {
        Requested::Typed(r)
    }
}

/// When a transition happens, who made it (`None`: the system) and why.
#[derive(Debug, Clone, Copy)]
struct By<'a> {
    at: DateTime<Utc>,
    actor: Option<&'a str>,
    note: Option<&'a str>,
}

#[derive(Clone)]
pub struct Allocations {
    store: Store,
    clock: Clock,
    catalog: Arc<Catalog>,
    policy: AllocPolicy,
    /// Wakes the scheduler after a change (request, release, approval).
    wake: Arc<Notify>,
    /// Wakes a node's agent after a change of its desired state.
    signals: Arc<crate::signals::NodeSignals>,
    /// Allocations seen `releasing`, and since when (see `finish_half_released`).
    releasing_seen: Arc<std::sync::Mutex<HashMap<AllocationId, DateTime<Utc>>>>,
    /// How long a borrower is warned before its allocation is preempted.
    preemption_grace: Duration,
    /// Queue positions, capacity and end times as of the last scheduler pass.
    snapshot: Arc<std::sync::RwLock<PendingContext>>,
    /// The scheduler's copy of the live allocations, kept across passes (`scheduler.rs`).
    live: Arc<tokio::sync::Mutex<scheduler::LiveCache>>,
    /// For hard budgets: a request that would exceed one needs a platform admin.
    billing: Option<super::billing::Billing>,
    /// How long a silent node keeps its allocations before they fail.
    node_grace: Duration,
    /// How long an allocation may stay `placing` (its node not reporting the device)
    /// before it fails with the node's last apply error.
    placing_timeout: Duration,
    /// The hot spares as of the last scheduler pass.
    spares: Arc<std::sync::RwLock<spares::SparePool>>,
}

/// Default limit on `placing`: creating a MIG instance takes seconds; a node that has not
/// managed in this long will not.
pub const DEFAULT_PLACING_TIMEOUT: Duration = Duration::minutes(10);

/// Default warning before borrowed capacity is reclaimed.
pub const DEFAULT_PREEMPTION_GRACE: Duration = Duration::minutes(10);

/// How often a release re-reads an allocation that moved on meanwhile.
const RELEASE_TRIES: u32 = 5;

/// How many of the latest requests make up the share mix the planner keeps room for.
const DEMAND_WINDOW: i64 = 2000;

/// Which allocations a list shows.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only this team's.
    pub team: Option<TeamId>,
    /// Only allocations in this state (`active`, `queued`, …) or group: `pending`
    /// (pending_approval, queued, placing), `current` (pending or active), `ended`.
    pub state: Option<String>,
    /// Only the caller's own.
    pub mine: bool,
}

/// Allocation counts for metrics.
#[derive(Debug, Clone, Default)]
pub struct AllocationStats {
    /// (state, model, count).
    pub by_state_model: Vec<(String, String, i64)>,
    pub oldest_queued: Option<DateTime<Utc>>,
}

/// What the scheduler did in one tick (for logs, metrics and tests).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TickReport {
    pub placed: u32,
    pub activated: u32,
    pub expired: u32,
    pub failed: u32,
    pub reconfigured: u32,
    pub queued: u32,
    /// Seconds each allocation placed in this pass waited since its request.
    pub placement_waits: Vec<f64>,
    /// Allocations newly warned that they will be preempted.
    pub warned: u32,
    pub preempted: u32,
}

impl Allocations {
    pub fn new(store: Store, catalog: Arc<Catalog>) -> Self {
        Self {
            store,
            clock: Clock::system(),
            catalog,
            policy: AllocPolicy::default(),
            wake: Arc::new(Notify::new()),
            signals: Arc::default(),
            releasing_seen: Arc::default(),
            preemption_grace: DEFAULT_PREEMPTION_GRACE,
            snapshot: Arc::default(),
            live: Arc::default(),
            billing: None,
            node_grace: NODE_GRACE,
            placing_timeout: DEFAULT_PLACING_TIMEOUT,
            spares: Arc::default(),
        }
    }

    /// Reads the time from `clock` instead of the system's.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Sets how long an allocation may stay `placing` before it fails.
    pub fn with_placing_timeout(mut self, t: std::time::Duration) -> Self {
        self.placing_timeout = Duration::from_std(t).unwrap_or(DEFAULT_PLACING_TIMEOUT);
        self
    }

    /// Sets how long a node may stay silent before its allocations fail.
    pub fn with_node_grace(mut self, grace: std::time::Duration) -> Self {
        self.node_grace = Duration::from_std(grace).unwrap_or(NODE_GRACE);
        self
    }

    /// Checks new requests against the teams' hard budgets through `billing`.
    pub fn with_budgets(mut self, billing: super::billing::Billing) -> Self {
        self.billing = Some(billing);
        self
    }

    /// Sets the warning period before borrowed capacity is reclaimed.
    pub fn with_preemption_grace(mut self, grace: std::time::Duration) -> Self {
        self.preemption_grace = Duration::from_std(grace).unwrap_or(DEFAULT_PREEMPTION_GRACE);
        self
    }

    /// Wakes nodes' agents through `signals` (shared with the agent API's long poll).
    pub fn with_signals(mut self, signals: Arc<crate::signals::NodeSignals>) -> Self {
        self.signals = signals;
        self
    }

    /// The agents' wake-ups.
    pub fn signals(&self) -> &Arc<crate::signals::NodeSignals> {
        &self.signals
    }

    /// Resolves when something changed that the scheduler should look at.
    pub fn changed(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    // ---- requests ----

    /// Requests an allocation. Within quota it is queued at once (atomically against
    /// concurrent requests); beyond it waits for approval. A repeated `idempotency_key` of
    /// the same user returns the allocation the first request made.
    pub async fn request<'a>(
        &self,
        p: &Principal,
        input: impl Into<Requested<'a>>,
        idempotency_key: Option<&str>,
    ) -> Result<AllocationView, AppError> {
        let now = self.clock.now();
        let key = idempotency_key.map(str::trim).filter(|k| !k.is_empty());
        if let Some(k) = key {
            if k.len() > 200 {
                return Err(AppError::invalid(
                    "Idempotency-Key",
                    "at most 200 characters",
                ));
            }
            if let Some(id) = self.existing(p, k).await? {
                return self.get(p, id).await;
            }
        }
        let (policy, catalog) = (&self.policy, &self.catalog);
        let valid = match input.into() {
            Requested::Text(input) => alloc::validate(input, policy, catalog, now)?,
            Requested::Typed(input) => alloc::validate_typed(input, policy, catalog, now)?,
        };
        let access = authz::team(&self.store, p, valid.team_id(), Need::Read).await?;
        if access.team.archived {
            return Err(AppError::Conflict {
                message: "the team is archived".into(),
            });
        }
        if access.role == Some(TeamRole::Viewer) {
            return Err(AppError::Forbidden);
        }
        // Shares count in milli-GPU on the model's shared quota line (`H100-80GB:shared`).
        let model = valid.kind().quota_key();
        let row = AllocationRow {
            model: model.clone(),
            priority: valid.priority(),
            purpose: valid.purpose().to_owned(),
            duration_minutes: i64::from(valid.duration_minutes()),
            starts_at: valid.starts_at(),
            idempotency_key: key.map(str::to_owned),
            needs_cuda: valid.needs_cuda(),
            gang_nodes: valid.nodes().map(i64::from),
            ..AllocationRow::queued(
                TeamId(access.team.id.0),
                p.user_id(),
                valid.kind(),
                (i64::from(valid.devices()), i64::from(valid.units())),
                now,
            )
        };
        let pricer = self.pricer(now).await?;
        let pricer = pricer.as_ref();
        let ask = Ask {
            units: valid.units(),
            high: valid.priority() == PriorityClass::High,
            cost: pricer.map_or(0, |pr| {
                pr.cost(
                    valid.kind(),
                    valid.devices(),
                    i64::from(valid.duration_minutes()) * 60_000,
                    valid.priority(),
                )
            }),
        };
        let line = self.line(&row, pricer, now);
        let what = Admit::Insert {
            row: &row,
            actor: p.username().as_str(),
        };
        let outcome = self
            .store
            .admit(line, what, |s| {
                alloc::check(&model, &standing(s, pricer), &ask, Authority::Request)
            })
            .await
            .map_err(internal("admitting allocation"))?;
        match outcome {
            Admitted::Held { .. } | Admitted::Waits { .. } => {}
            Admitted::Refused(e) => return Err(e),
            Admitted::Duplicate => {
                let k = key.unwrap_or_default();
                let id = self.existing(p, k).await?.ok_or(AppError::Internal)?;
                return self.get(p, id).await;
            }
            Admitted::Moved => return Err(AppError::Internal),
        }
        self.audit_request(Some(p.username().as_str()), &row).await;
        self.wake.notify_one();
        self.get(p, row.id).await
    }

    /// The GPU models this cluster plans and prices for.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// A request's text parsed into domain types by [`alloc::parse`] under this
    /// service's policy (a launch completes it, then asks with [`Requested::Typed`]).
    pub(crate) fn parse(&self, input: &NewAllocation) -> Result<TypedRequest, AppError> {
        alloc::parse(input, &self.policy, &self.catalog, self.clock.now())
    }

    /// Checks that one `kind` for `minutes` could be requested by `team` (the catalog and the
    /// duration policy, as a request is checked); errors name `kind` / `duration_minutes`.
    /// Returns the kind's label, e.g. `1g.10gb on H100-80GB`.
    pub fn check_kind(&self, team: TeamId, kind: &str, minutes: u32) -> Result<String, AppError> {
        let input = NewAllocation {
            team_id: team.to_string(),
            kind: kind.to_owned(),
            count: 1,
            duration_minutes: Some(minutes),
            starts_at: None,
            priority: None,
            purpose: String::new(),
            needs_cuda: None,
            nodes: None,
        };
        let valid = alloc::validate(&input, &self.policy, &self.catalog, self.clock.now())?;
        Ok(valid.kind().label())
    }

    async fn existing(&self, p: &Principal, key: &str) -> Result<Option<AllocationId>, AppError> {
        self.store
            .allocation_by_key(p.user_id(), key)
            .await
            .map_err(internal("loading allocation by key"))
    }

    /// One allocation, with its history and why it waits; another team's is `NotFound`.
    pub async fn get(&self, p: &Principal, id: AllocationId) -> Result<AllocationView, AppError> {
        let row = self.visible(p, id).await?;
        let events = self
            .store
            .allocation_events(id)
            .await
            .map_err(internal("loading history"))?;
        let ctx = self.pending_context(self.clock.now());
        let mut v = self.view(&row, &ctx);
        v.history = events
            .into_iter()
            .map(|e| {
                Ok(Transition {
                    at: e.at,
                    from: e.from_state.map(decoded).transpose()?,
                    to: e.to_state,
                    by: e.actor,
                    note: e.note,
                })
            })
            .collect::<Result<_, crate::store::StoreError>>()
            .map_err(internal("reading history"))?;
        Ok(v)
    }

    async fn visible(
        &self,
        p: &Principal,
        id: AllocationId,
    ) -> Result<AllocationListRow, AppError> {
        let row = self.row(id).await?.ok_or(AppError::NotFound)?;
        authz::team(&self.store, p, row.a.team_id, Need::Read).await?;
        Ok(row)
    }

    /// An allocation the caller may act on: its owner, a team admin of its team or a
    /// platform admin (another member of the team: `Forbidden`; anyone else: `NotFound`).
    async fn actionable(
        &self,
        p: &Principal,
        id: AllocationId,
    ) -> Result<AllocationListRow, AppError> {
        let row = self.visible(p, id).await?;
        let team_admin = authz::team(&self.store, p, row.a.team_id, Need::ManageMembers)
            .await
            .is_ok();
        if row.a.user_id != p.user_id() && !team_admin {
            return Err(AppError::Forbidden);
        }
        Ok(row)
    }

    /// Allocations the caller may see, newest first: a platform admin sees every team's,
    /// others the teams they belong to.
    pub async fn list(
        &self,
        p: &Principal,
        filter: &ListFilter,
        page: PageRequest,
    ) -> Result<Page<AllocationView>, AppError> {
        let page = page.clamped();
        let teams = authz::readable_teams(&self.store, p, filter.team).await?;
        let states = state_filter(filter.state.as_deref())?;
        let user = filter.mine.then_some(p.user_id());
        let (rows, total) = self
            .store
            .list_allocations(teams.as_deref(), user, &states, page.offset, page.limit)
            .await
            .map_err(internal("listing allocations"))?;
        let ctx = self.pending_context(self.clock.now());
        let items = rows.iter().map(|r| self.view(r, &ctx)).collect();
        Ok(paged(items, total, page))
    }

    /// Releases an active allocation, or cancels a pending one: its owner, a team admin
    /// of its team, or a platform admin.
    pub async fn release(
        &self,
        p: &Principal,
        id: AllocationId,
    ) -> Result<AllocationView, AppError> {
        let row = self.actionable(p, id).await?;
        let now = self.clock.now();
        let actor = Some(p.username().as_str());
        // The scheduler may move the allocation on (queued → placing → active) between
        // this read and the conditional write; the user's intent stands, so the release
        // applies to the state it finds then. A few tries: each lost race means another
        // step was taken, and an allocation has only a few.
        let mut state = row.a.state;
        let mut tries = 0;
        loop {
            let Some(done) = self.end_from(id, state, now, actor, None).await? else {
                return Err(AppError::Conflict {
                    message: format!("the allocation is {} already", state.label()),
                });
            };
            if done {
                break;
            }
            tries += 1;
            if tries == RELEASE_TRIES {
                return Err(AppError::Conflict {
                    message: "the allocation changed meanwhile; reload and try again".into(),
                });
            }
            state = self.visible(p, id).await?.a.state;
        }
        self.audit(p, AuditAction::AllocationRelease, &row.a).await;
        self.wake.notify_one();
        self.get(p, id).await
    }

    /// Ends an allocation on the system's behalf (idle reclaim of the notebook on it, the
    /// end of the workload that owned it), with `note` in its history; audited with no
    /// actor. An active one is released, one still waiting (for approval, in the queue, being
    /// placed) is cancelled. `false` if it had ended already.
    pub(crate) async fn release_for_system(
        &self,
        id: AllocationId,
        note: &str,
    ) -> Result<bool, AppError> {
        let now = self.clock.now();
        let mut done = false;
        // Like `release`: the scheduler may move it on between the read and the write.
        for _ in 0..RELEASE_TRIES {
            let Some(row) = self.row(id).await? else {
                return Ok(false);
            };
            let state = row.a.state;
            let Some(moved) = self.end_from(id, state, now, None, Some(note)).await? else {
                return Ok(false);
            };
            if moved {
                done = true;
                break;
            }
        }
        if done {
            self.audit_as(None, AuditAction::AllocationRelease, id, None, None, None)
                .await;
            self.wake.notify_one();
        }
        Ok(done)
    }

    /// Admits, in the order given, allocations that wait in `pending_approval` only for
    /// room in their team's quota (those that workloads requested for themselves: a job
    /// queues for its GPU, like a batch scheduler, instead of waiting for an admin), as far
    /// as the quota and the per-user limit now have room and no hard budget blocks them.
    /// Each admission is the same conditional update as at request time, so concurrent
    /// passes cannot over-admit. Returns how many were admitted.
    pub(crate) async fn admit_when_room(
        &self,
        ids: &[AllocationId],
        now: DateTime<Utc>,
    ) -> Result<u32, AppError> {
        let mut admitted = 0;
        let pricer = self.pricer(now).await?;
        for &id in ids {
            let Some(row) = self.row(id).await? else {
                continue;
            };
            if row.a.state != AllocState::PendingApproval {
                continue;
            }
            let what = Admit::Waiting {
                id,
                actor: None,
                note: Some("admitted: the team's quota has room for it now"),
                approval_reason: None,
            };
            if let Admitted::Held { .. } = self
                .admit_waiting(&row.a, what, Authority::Request, pricer.as_ref(), now)
                .await?
            {
                admitted += 1;
                self.audit_as(
                    None,
                    AuditAction::AllocationAdmit,
                    id,
                    Some(row.a.team_id),
                    None,
                    None,
                )
                .await;
            }
        }
        if admitted > 0 {
            self.wake.notify_one();
        }
        Ok(admitted)
    }

    /// The quota line and budget month `row` is admitted on.
    fn line<'a>(
        &self,
        row: &'a AllocationRow,
        pricer: Option<&Pricer>,
        now: DateTime<Utc>,
    ) -> Line<'a> {
        Line {
            team: row.team_id,
            model: &row.model,
            user: row.user_id,
            month: pricer.map_or_else(
                || billing::month_bounds(billing::month_of(now)),
                Pricer::month,
            ),
            at: now,
        }
    }

    /// Today's prices, when budgets are checked.
    async fn pricer(&self, now: DateTime<Utc>) -> Result<Option<Pricer>, AppError> {
        match &self.billing {
            Some(b) => Ok(Some(b.pricer(now).await?)),
            None => Ok(None),
        }
    }

    /// Admits the waiting allocation `a` (`what` is `Admit::Waiting`) as `by` may: the
    /// admission rule on the row as it is under the team's lock.
    async fn admit_waiting(
        &self,
        a: &AllocationRow,
        what: Admit<'_>,
        by: Authority,
        pricer: Option<&Pricer>,
        now: DateTime<Utc>,
    ) -> Result<Admitted, AppError> {
        let line = self.line(a, pricer, now);
        self.store
            .admit(line, what, |s| {
                let Some(row) = &s.allocation else {
                    return alloc::Verdict::Refused(AppError::NotFound);
                };
                alloc::check(&row.model, &standing(s, pricer), &ask_of(row, pricer), by)
            })
            .await
            .map_err(internal("admitting a waiting allocation"))
    }

    /// Ends an allocation found in `state`: one still waiting is cancelled, an active one
    /// released. `None` when `state` has nothing to end; `Some(false)` when the allocation
    /// had moved on from `state` meanwhile (the caller reads it again).
    async fn end_from(
        &self,
        id: AllocationId,
        state: AllocState,
        now: DateTime<Utc>,
        actor: Option<&str>,
        note: Option<&str>,
    ) -> Result<Option<bool>, AppError> {
        Ok(Some(match state {
            AllocState::PendingApproval | AllocState::Queued | AllocState::Placing => {
                self.step(
                    id,
                    state,
                    AllocState::Cancelled,
                    By {
                        at: now,
                        actor,
                        note,
                    },
                    Change::default(),
                )
                .await?
            }
            AllocState::Active => {
                self.finish(id, alloc::ReleaseCause::Released, now, actor, note)
                    .await?
            }
            _ => return Ok(None),
        }))
    }

    /// Completes releases that stopped half-way: `finish` moves an allocation to
    /// `releasing` and at once to its final state; a process killed (or a leader that lost
    /// its lease) between the two left it `releasing`, holding quota. Each is taken to the
    /// final state its recorded cause names (conditional, like every step).
    async fn finish_half_released(&self, now: DateTime<Utc>) -> Result<(), AppError> {
        let rows = self
            .store
            .allocations_in(&[AllocState::Releasing])
            .await
            .map_err(internal("loading releasing allocations"))?;
        // A release in progress takes two statements in a row: leave it a while.
        let due: Vec<_> = {
            let Ok(mut seen) = self.releasing_seen.lock() else {
                return Ok(());
            };
            seen.retain(|id, _| rows.iter().any(|a| a.id == *id));
            rows.into_iter()
                .filter(|a| now - *seen.entry(a.id).or_insert(now) > Duration::seconds(10))
                .collect()
        };
        for a in due {
            // `finish` writes the cause with the step into `releasing`; a row without one
            // predates causes, and was a release.
            let cause = a.release_cause.unwrap_or(alloc::ReleaseCause::Released);
            if self
                .step(
                    a.id,
                    AllocState::Releasing,
                    cause.final_state(),
                    By {
                        at: now,
                        actor: None,
                        note: None,
                    },
                    Change::default(),
                )
                .await?
            {
                tracing::warn!(allocation = %a.id, "finished a release that had stopped half-way");
            }
        }
        Ok(())
    }

    /// Ends what people who left a team (or were removed), or whose account was disabled,
    /// still hold there: a waiting, queued or placing request is cancelled, an active
    /// allocation released (its workloads stop with it, and metering ends). Runs at the
    /// start of every scheduler pass; re-enabling an account brings none of it back.
    async fn end_departed(&self, now: DateTime<Utc>) -> Result<(), AppError> {
        for disabled in [false, true] {
            let rows = self
                .store
                .allocations_of_departed(disabled)
                .await
                .map_err(internal("loading allocations of departed members"))?;
            let note = if disabled {
                "its owner's account was disabled"
            } else {
                "its owner is no longer a member of the team"
            };
            self.end_all(rows, note, now).await?;
        }
        Ok(())
    }

    async fn end_all(
        &self,
        rows: Vec<AllocationRow>,
        note: &str,
        now: DateTime<Utc>,
    ) -> Result<(), AppError> {
        for a in rows {
            let state = a.state;
            let done = match state {
                AllocState::Active => {
                    self.finish(a.id, alloc::ReleaseCause::Released, now, None, Some(note))
                        .await?
                }
                AllocState::PendingApproval | AllocState::Queued | AllocState::Placing => {
                    self.step(
                        a.id,
                        state,
                        AllocState::Cancelled,
                        By {
                            at: now,
                            actor: None,
                            note: Some(note),
                        },
                        Change::default(),
                    )
                    .await?
                }
                _ => false,
            };
            if done {
                tracing::info!(allocation = %a.id, "ended: {note}");
                self.audit_change(None, AuditAction::AllocationRelease, &a)
                    .await;
            }
        }
        Ok(())
    }

    /// Extends an active allocation by `minutes` (owner, team admin, platform admin), up
    /// to the policy's longest duration counted from when it became active. Its units stay
    /// the same, so quota is unaffected; one that is being preempted cannot be extended.
    pub async fn extend(
        &self,
        p: &Principal,
        id: AllocationId,
        minutes: u32,
    ) -> Result<AllocationView, AppError> {
        let row = self.actionable(p, id).await?;
        let max = self.policy.max_duration_minutes;
        if minutes == 0 || minutes > max {
            return Err(AppError::invalid(
                "minutes",
                format!("must be between 1 and {max} minutes"),
            ));
        }
        let (Some(started), Some(end), "active") =
            (row.a.active_at, row.a.ends_at, row.a.state.as_str())
        else {
            return Err(AppError::Conflict {
                message: "only an active allocation can be extended".into(),
            });
        };
        if row.a.preempt_at.is_some() {
            return Err(AppError::Conflict {
                message: "this allocation is being reclaimed for another team's guaranteed share"
                    .into(),
            });
        }
        let new_end = end + Duration::minutes(i64::from(minutes));
        if new_end - started > Duration::minutes(i64::from(max)) {
            let left = (started + Duration::minutes(i64::from(max)) - end)
                .num_minutes()
                .max(0);
            return Err(AppError::invalid(
                "minutes",
                format!(
                    "an allocation may run at most {} days; at most {left} more minutes",
                    max / 1440
                ),
            ));
        }
        let note = format!(
            "extended by {minutes} min to {}",
            new_end.format("%Y-%m-%d %H:%M UTC")
        );
        let now = self.clock.now();
        let pricer = self.pricer(now).await?;
        let pricer = pricer.as_ref();
        let line = self.line(&row.a, pricer, now);
        let what = Admit::Extend {
            id,
            old_end: end,
            new_end,
            actor: p.username().as_str(),
            note: &note,
        };
        let outcome = self
            .store
            .admit(line, what, |s| {
                let Some(a) = &s.allocation else {
                    return alloc::Verdict::Refused(AppError::NotFound);
                };
                // No more units, but more time: weighed against a hard budget.
                let ask = Ask {
                    units: 0,
                    high: false,
                    cost: cost_of(a, i64::from(minutes) * 60_000, pricer),
                };
                alloc::check(&a.model, &standing(s, pricer), &ask, Authority::Request)
            })
            .await
            .map_err(internal("extending allocation"))?;
        match outcome {
            Admitted::Held { .. } => {}
            Admitted::Waits { reason, .. } => return Err(AppError::invalid("minutes", reason)),
            Admitted::Refused(e) => return Err(e),
            Admitted::Duplicate | Admitted::Moved => {
                return Err(AppError::Conflict {
                    message: "the allocation changed meanwhile; reload and try again".into(),
                });
            }
        }
        self.audit(p, AuditAction::AllocationExtend, &row.a).await;
        self.get(p, id).await
    }

    /// Approves (it joins the queue) or denies a request waiting for approval. A team admin
    /// may decide what needs a team admin, and approve only within the team's limit and
    /// hard budget: beyond them the request goes on to platform admins. A platform admin
    /// approves beyond the limit or budget only with `overrides` (recorded on the
    /// allocation and audited as `allocation.override`).
    pub async fn decide(
        &self,
        p: &Principal,
        id: AllocationId,
        decision: Decision<'_>,
    ) -> Result<AllocationView, AppError> {
        let row = self.visible(p, id).await?;
        let reason = decision.reason.trim();
        if reason.chars().count() > 500 {
            return Err(AppError::invalid(
                "reason",
                "must be at most 500 characters",
            ));
        }
        if row.a.state != AllocState::PendingApproval {
            return Err(AppError::Conflict {
                message: "only a request waiting for approval can be approved or denied".into(),
            });
        }
        let by = if p.is_admin() {
            Authority::PlatformAdmin {
                overrides: decision.overrides,
            }
        } else if row.a.approver == Some(Approver::TeamAdmin)
            && !decision.overrides
            && authz::team(&self.store, p, row.a.team_id, Need::ManageMembers)
                .await
                .is_ok()
        {
            Authority::TeamAdmin
        } else {
            return Err(AppError::Forbidden);
        };
        let note = (!reason.is_empty()).then_some(reason);
        let now = self.clock.now();
        let actor = Some(p.username().as_str());
        if !decision.approve {
            let reason = Change {
                approval_reason: note.map(str::to_owned),
                ..Change::default()
            };
            let by = By {
                at: now,
                actor,
                note,
            };
            let (from, to) = (AllocState::PendingApproval, AllocState::Denied);
            if !self.step(id, from, to, by, reason).await? {
                return Err(AppError::conflict(
                    "the request changed meanwhile; reload and try again",
                ));
            }
            self.audit(p, AuditAction::AllocationDeny, &row.a).await;
            self.wake.notify_one();
            return self.get(p, id).await;
        }
        let pricer = self.pricer(now).await?;
        let what = Admit::Waiting {
            id,
            actor,
            note,
            approval_reason: note,
        };
        match self
            .admit_waiting(&row.a, what, by, pricer.as_ref(), now)
            .await?
        {
            Admitted::Held {
                over_limit,
                over_budget,
            } => {
                self.audit(p, AuditAction::AllocationApprove, &row.a).await;
                if over_limit || over_budget {
                    let what = match (over_limit, over_budget) {
                        (true, true) => "limit and hard budget",
                        (true, false) => "limit",
                        _ => "hard budget",
                    };
                    tracing::warn!(allocation = %id, by = %p.username(), "approved beyond the team's {what}");
                    self.audit(p, AuditAction::AllocationOverride, &row.a).await;
                }
            }
            Admitted::Waits { reason, .. } => {
                self.wake.notify_one();
                return Err(AppError::conflict(format!(
                    "{reason}; the request now waits for a platform admin"
                )));
            }
            Admitted::Refused(e) => return Err(e),
            Admitted::Duplicate | Admitted::Moved => {
                return Err(AppError::conflict(
                    "the request changed meanwhile; reload and try again",
                ));
            }
        }
        self.wake.notify_one();
        self.get(p, id).await
    }

    // ---- quotas ----

    /// A team's quotas with their usage (members of the team and platform admins).
    pub async fn quotas(&self, p: &Principal, team: TeamId) -> Result<Vec<QuotaView>, AppError> {
        let access = authz::team(&self.store, p, team, Need::Read).await?;
        let rows = self
            .store
            .quotas(Some(team))
            .await
            .map_err(internal("loading quotas"))?;
        let overridden: HashMap<String, i64> = self
            .store
            .overridden_units(team)
            .await
            .map_err(internal("loading overrides"))?
            .into_iter()
            .collect();
        Ok(rows
            .iter()
            .filter_map(|r| {
                let q = quota_of(r)?;
                let mut v = QuotaView::new(
                    team,
                    access.team.name.clone(),
                    r.model.clone(),
                    &q,
                    to_u32(r.used),
                );
                v.overridden = to_u32(overridden.get(&r.model).copied().unwrap_or(0));
                Some(v)
            })
            .collect())
    }

    /// Sets a team's quota on a model (platform admin). Units are compute slices, or
    /// milli-GPU on a model's shared line (`H100-80GB:shared`).
    pub async fn set_quota(
        &self,
        p: &Principal,
        team: TeamId,
        model: &str,
        guaranteed: u32,
        limit: u32,
        per_user: u32,
    ) -> Result<Vec<QuotaView>, AppError> {
        authz::admin(p)?;
        authz::team(&self.store, p, team, Need::Read).await?;
        // `H100-80GB` (compute slices) or `H100-80GB:shared` (shares, in milli-GPU).
        let (name, shared) = alloc::split_quota_key(model.trim());
        let model = self
            .catalog
            .get(name)
            .map(|m| {
                if shared {
                    alloc::shared_quota_key(m.name())
                } else {
                    m.name().to_owned()
                }
            })
            .ok_or_else(|| {
                let known: Vec<&str> = self.catalog.models().map(|m| m.name()).collect();
                AppError::invalid(
                    "model",
                    format!(
                        "unknown model; one of {} (append :shared for its shares, in milli-GPU)",
                        known.join(", ")
                    ),
                )
            })?;
        Quota::new(guaranteed, limit, per_user)?;
        let before = self
            .store
            .quota(team, &model)
            .await
            .map_err(internal("loading quota"))?;
        let row = QuotaRow {
            team_id: team,
            model: model.clone(),
            guaranteed: i64::from(guaranteed),
            limit_units: i64::from(limit),
            per_user: i64::from(per_user),
            used: before.as_ref().map_or(0, |b| b.used),
        };
        self.store
            .set_quota(&row, p.user_id(), self.clock.now())
            .await
            .map_err(internal("storing quota"))?;
        let json = |q: &QuotaRow| {
            serde_json::json!({"model": q.model, "guaranteed": q.guaranteed,
                "limit": q.limit_units, "per_user": q.per_user})
            .to_string()
        };
        Entry::new(
            Some(p.username().as_str()),
            AuditAction::QuotaSet,
            "quota",
            format!("{}:{model}", team.0),
        )
        .team(Some(team))
        .before(before.as_ref().map(json))
        .after(Some(json(&row)))
        .record(&self.store, self.clock.now())
        .await;
        self.wake.notify_one();
        self.quotas(p, team).await
    }

    /// Grants a team `high` priority (`Some`, with an optional cap in units held at high
    /// priority on any one quota line) or withdraws it (`None`): platform admins, audited.
    /// Withdrawing ends nothing that runs; new requests and jobs queued again at `high` are
    /// refused from then on.
    pub async fn set_high_priority(
        &self,
        p: &Principal,
        team: TeamId,
        grant: Option<HighGrant>,
    ) -> Result<(), AppError> {
        authz::admin(p)?;
        authz::team(&self.store, p, team, Need::Read).await?;
        let stored = grant.map(|g| g.cap.map(i64::from));
        if !self
            .store
            .set_high_grant(team, stored)
            .await
            .map_err(internal("storing the high-priority grant"))?
        {
            return Err(AppError::NotFound);
        }
        let action = if grant.is_some() {
            AuditAction::PriorityGrant
        } else {
            AuditAction::PriorityRevoke
        };
        Entry::new(Some(p.username().as_str()), action, "team", team.0)
            .team(Some(team))
            .after(grant.map(|g| serde_json::json!({"high": true, "cap": g.cap}).to_string()))
            .record(&self.store, self.clock.now())
            .await;
        Ok(())
    }

    /// The audit trail, newest first (platform admin), optionally one action only (an
    /// [`AuditAction`]'s text; empty for all, one that does not exist refused).
    pub async fn audit_log(
        &self,
        p: &Principal,
        action: Option<&str>,
        page: PageRequest,
    ) -> Result<Page<AuditEntryView>, AppError> {
        authz::admin(p)?;
        let action: Option<AuditAction> = action
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::parse)
            .transpose()?;
        let page = page.clamped();
        let (rows, total) = self
            .store
            .audit_page(action.map(AuditAction::as_str), page.offset, page.limit)
            .await
            .map_err(internal("loading audit log"))?;
        Ok(paged(rows, total, page))
    }

    /// Counts for `/metrics` (no principal: operational data, no names).
    pub async fn stats(&self) -> Result<AllocationStats, AppError> {
        let (by_state_model, oldest) = self
            .store
            .allocation_stats()
            .await
            .map_err(internal("counting allocations"))?;
        Ok(AllocationStats {
            by_state_model,
            oldest_queued: oldest,
        })
    }

    // ---- views ----

    fn view(&self, r: &AllocationListRow, ctx: &PendingContext) -> AllocationView {
        let a = &r.a;
        let state = a.state;
        let kind_label = a.kind.label();
        let pending = match state {
            AllocState::PendingApproval => Some(PendingInfo {
                position: None,
                reason: format!(
                    "Waiting for approval by {}: {}.",
                    match a.approver {
                        Some(Approver::TeamAdmin) => "a team admin",
                        _ => "a platform admin",
                    },
                    a.approval_reason.as_deref().unwrap_or("beyond quota")
                ),
                eta: None,
            }),
            AllocState::Queued => {
                let position = ctx.position.get(&a.id).copied();
                let needed = to_u32(a.units);
                let free = ctx
                    .capacity
                    .get(&a.model)
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(ctx.held_units.get(&a.model).copied().unwrap_or(0));
                let ends = ctx.ends.get(&a.model).map(Vec::as_slice).unwrap_or(&[]);
                let eta = match a.starts_at {
                    Some(s) if s > ctx.now => Some(s),
                    // Ends of running work free units, not a new enough driver.
                    _ if a
                        .pending_reason
                        .as_deref()
                        .is_some_and(tessera_domain::planner::waits_for_driver) =>
                    {
                        None
                    }
                    _ => alloc::eta(needed, free, ends),
                };
                let reason = match a.starts_at {
                    Some(s) if s > ctx.now => Some(format!(
                        "Reserved to start at {} UTC",
                        s.format("%Y-%m-%d %H:%M")
                    )),
                    _ => a.pending_reason.clone(),
                };
                Some(PendingInfo::new(
                    position,
                    &a.model,
                    reason.as_deref(),
                    eta,
                    ctx.now,
                ))
            }
            AllocState::Placing => Some(PendingInfo {
                position: None,
                reason: "Placed; waiting for the node's agent to create the device.".into(),
                eta: None,
            }),
            _ => None,
        };
        AllocationView {
            id: a.id,
            team_id: a.team_id,
            team_name: r.team_name.clone(),
            user_id: a.user_id,
            username: r.username.clone(),
            kind: a.kind.to_string(),
            kind_label,
            count: to_u32(a.count),
            units: to_u32(a.units),
            priority: a.priority,
            state,
            purpose: a.purpose.clone(),
            created_at: a.created_at,
            starts_at: a.starts_at.or(a.active_at),
            ends_at: a.ends_at,
            devices: devices(a),
            approver: a.approver,
            approval_reason: a.approval_reason.clone(),
            pending,
            preempt_at: a.preempt_at,
            over_limit: a.over_limit,
            over_budget: a.over_budget,
            needs_cuda: a.needs_cuda,
            nodes: a.gang_nodes.and_then(|n| u32::try_from(n).ok()),
            history: Vec::new(),
        }
    }

    /// An audit entry for `action` on `before` (the allocation as it was) by `p`.
    async fn audit(&self, p: &Principal, action: AuditAction, before: &AllocationRow) {
        self.audit_change(Some(p.username().as_str()), action, before)
            .await;
    }

    /// The audit entry of a new request, `row`, by `actor` (`None`: the system's own, a
    /// booking's).
    async fn audit_request(&self, actor: Option<&str>, row: &AllocationRow) {
        let action = AuditAction::AllocationRequest;
        self.audit_as(actor, action, row.id, Some(row.team_id), None, Some(row))
            .await;
    }

    /// An audit entry for `action` on `before` (the allocation as it was) by `actor`
    /// (`None`: the system).
    async fn audit_change(&self, actor: Option<&str>, action: AuditAction, a: &AllocationRow) {
        self.audit_as(actor, action, a.id, Some(a.team_id), Some(a), None)
            .await;
    }

    /// An audit entry by `actor` (`None`: the scheduler).
    async fn audit_as(
        &self,
        actor: Option<&str>,
        action: AuditAction,
        id: AllocationId,
        team: Option<TeamId>,
        before: Option<&AllocationRow>,
        after: Option<&AllocationRow>,
    ) {
        let json = |r: &AllocationRow| {
            serde_json::json!({"state": r.state, "kind": r.kind.to_string(), "count": r.count,
                "units": r.units, "priority": r.priority})
            .to_string()
        };
        Entry::new(actor, action, "allocation", id)
            .team(team)
            .before(before.map(json))
            .after(after.map(json))
            .record(&self.store, self.clock.now())
            .await;
    }

    /// The allocation's row, if there is one.
    pub(crate) async fn row(
        &self,
        id: AllocationId,
    ) -> Result<Option<AllocationListRow>, AppError> {
        self.store
            .allocation(id)
            .await
            .map_err(internal("loading allocation"))
    }

    // ---- transitions ----

    /// One checked transition with its quota effect; `false` if the allocation was no
    /// longer in `from`.
    async fn step(
        &self,
        id: AllocationId,
        from: AllocState,
        to: AllocState,
        by: By<'_>,
        change: Change,
    ) -> Result<bool, AppError> {
        let By { at, actor, note } = by;
        from.check_transition(to)?;
        if !from.holds_quota() && to.holds_quota() {
            // Only the admission rule makes a team hold more (`Store::admit`).
            tracing::error!(allocation = %id, "a plain step may not start holding quota");
            return Err(AppError::Internal);
        }
        let quota_delta = match (from.holds_quota(), to.holds_quota()) {
            (false, true) => 1,
            (true, false) => -1,
            _ => 0,
        };
        self.store
            .transition(&StoreTransition {
                id,
                from,
                to,
                quota_delta,
                at,
                actor,
                note,
                change,
            })
            .await
            .map_err(internal("changing allocation state"))
    }

    /// active → releasing → ended/expired/preempted. The MIG instance stays; it is free
    /// for the next placement.
    async fn finish(
        &self,
        id: AllocationId,
        cause: alloc::ReleaseCause,
        at: DateTime<Utc>,
        actor: Option<&str>,
        note: Option<&str>,
    ) -> Result<bool, AppError> {
        let release = Change {
            release_cause: Some(cause),
            ..Change::default()
        };
        let by = By { at, actor, note };
        if !self
            .step(id, AllocState::Active, AllocState::Releasing, by, release)
            .await?
        {
            return Ok(false);
        }
        let ended = By { note: None, ..by };
        self.step(
            id,
            AllocState::Releasing,
            cause.final_state(),
            ended,
            Change::default(),
        )
        .await
    }

    // ---- the scheduler ----
}

/// The GPUs admins shared, by UUID, with how.
fn shared_gpus(desired: &[DesiredWithStatus]) -> HashMap<String, ShareMethod> {
    desired
        .iter()
        .filter_map(|d| {
            let method = d.desired.sharing?;
            Some((d.desired.gpu_uuid.clone(), method))
        })
        .collect()
}

/// Milli-GPU held by shares per GPU UUID, among `held`.
fn share_usage<'a>(held: impl IntoIterator<Item = &'a AllocationRow>) -> HashMap<String, u32> {
    let mut used: HashMap<String, u32> = HashMap::new();
    for a in held {
        if let GpuKind::Share { milli, .. } = a.kind {
            for d in devices(a) {
                *used.entry(d.gpu_uuid).or_default() += milli;
            }
        }
    }
    used
}

/// Whether a share's GPU is shared on its node the way the admin asked, and ready.
fn share_ready(
    d: &AllocatedDevice,
    inventories: &HashMap<NodeId, std::sync::Arc<Inventory>>,
    shared: &HashMap<String, ShareMethod>,
) -> bool {
    let Some(method) = shared.get(&d.gpu_uuid) else {
        return false;
    };
    inventories
        .get(&d.node_id)
        .and_then(|i| i.gpus.iter().find(|g| g.uuid == d.gpu_uuid))
        .and_then(|g| g.sharing.as_ref())
        .is_some_and(|s| s.ready && s.method == *method)
}

/// Fills in the device's MIG UUID from the inventory; whether the device is there.
fn present(
    d: &mut AllocatedDevice,
    inventories: &HashMap<NodeId, std::sync::Arc<Inventory>>,
) -> bool {
    let Some(g) = inventories
        .get(&d.node_id)
        .and_then(|i| i.gpus.iter().find(|g| g.uuid == d.gpu_uuid))
    else {
        return false;
    };
    match (&d.profile, d.start) {
        (Some(profile), Some(start)) => {
            let uuid = g
                .instances
                .iter()
                .find(|i| i.start == start && &i.profile == profile)
                .and_then(|i| i.compute_instances.iter().find_map(|c| c.uuid.clone()));
            d.mig_uuid = uuid;
            d.mig_uuid.is_some()
        }
        _ => g.mig_mode.is_none_or(|m| m.current == MigMode::Disabled),
    }
}

/// Whether `gpu` still has the instance `mig` (by its UUID, or, when the driver did not
/// report one, by its profile and placement).
fn mig_instance_present(
    gpu: &tessera_domain::wire::GpuInfo,
    mig: &str,
    profile: &str,
    start: u8,
) -> bool {
    gpu.instances.iter().any(|i| {
        i.compute_instances
            .iter()
            .any(|c| c.uuid.as_deref() == Some(mig))
            || (i.start == start
                && i.profile == profile
                && i.compute_instances.iter().all(|c| c.uuid.is_none()))
    })
}

fn devices(a: &AllocationRow) -> Vec<AllocatedDevice> {
    a.devices.clone()
}

fn queue_entry(a: &AllocationRow) -> Option<QueueEntry> {
    Some(QueueEntry {
        id: a.id,
        model: a.model.clone(),
        team: a.team_id,
        priority: a.priority,
        created_at: a.created_at,
    })
}

fn quota_of(r: &QuotaRow) -> Option<Quota> {
    Quota::new(
        to_u32(r.guaranteed),
        to_u32(r.limit_units),
        to_u32(r.per_user),
    )
    .ok()
}

fn to_u32(v: i64) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX)
}

/// The states a list filter names.
fn state_filter(filter: Option<&str>) -> Result<Vec<String>, AppError> {
    let names: Vec<&str> = match filter.map(str::trim).unwrap_or("") {
        "" | "all" => vec![],
        "pending" => vec!["pending_approval", "queued", "placing"],
        "current" => vec![
            "pending_approval",
            "queued",
            "placing",
            "active",
            "releasing",
        ],
        "ended" => vec![
            "ended",
            "denied",
            "cancelled",
            "expired",
            "preempted",
            "failed",
        ],
        s => {
            let st: AllocState = s.parse().map_err(|_| {
                AppError::invalid(
                    "state",
                    "must be a state (active, queued, …) or pending, current, ended, all",
                )
            })?;
            vec![st.as_str()]
        }
    };
    Ok(names.into_iter().map(str::to_owned).collect())
}

/// What approving or denying says.
#[derive(Debug, Clone, Copy)]
pub struct Decision<'a> {
    pub approve: bool,
    pub reason: &'a str,
    /// A platform admin approving beyond the team's limit or hard budget, on purpose.
    pub overrides: bool,
}

/// Where the team stands, as the admission rule reads it.
fn standing(s: &Standing, pricer: Option<&Pricer>) -> alloc::Standing {
    alloc::Standing {
        quota: s.quota.as_ref().and_then(quota_of),
        held: Held {
            team: s.quota.as_ref().map_or(0, |q| to_u32(q.used)),
            user: to_u32(s.user_used),
            high: to_u32(s.high_used),
        },
        high: s.high_grant.map(|cap| HighGrant {
            cap: cap.map(to_u32),
        }),
        budget: pricer.and_then(|p| p.committed(s)),
    }
}

/// What `a` asks for: its units, at its priority, for its whole duration.
fn ask_of(a: &AllocationRow, pricer: Option<&Pricer>) -> Ask {
    Ask {
        units: to_u32(a.units),
        high: a.priority == PriorityClass::High,
        cost: cost_of(a, a.duration_minutes.saturating_mul(60_000), pricer),
    }
}

/// What `a`'s kind and count cost for `ms` at today's rates (0 without prices).
fn cost_of(a: &AllocationRow, ms: i64, pricer: Option<&Pricer>) -> i64 {
    pricer.map_or(0, |p| p.cost(&a.kind, to_u32(a.count), ms, a.priority))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_groups_name_real_states() {
        for group in ["pending", "current", "ended"] {
            for s in state_filter(Some(group)).unwrap_or_default() {
                assert!(s.parse::<AllocState>().is_ok(), "{s}");
            }
        }
        assert!(state_filter(Some("bogus")).is_err());
        assert_eq!(
            state_filter(Some("active")).ok(),
            Some(vec!["active".to_owned()])
        );
    }
}
