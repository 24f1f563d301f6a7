//! Bookings (docs/operations.md): a team admin books N of a kind for a future window.
//!
//! Admission happens at booking time ([`Allocations::book`]; the rule is
//! `tessera_domain::booking::admit`). Before the start, the scheduler pass
//! ([`Allocations::bookings_pass`]) turns a due booking into an allocation that is placed
//! ahead of the queue, and warns the work that borrowed its capacity, through the deadline
//! channel, so that it is gone by the start.

use super::*;
use crate::services::audit::Entry;
use crate::store::{BookingListRow, BookingRow};
use tessera_domain::audit::AuditAction;
use tessera_domain::booking::{self, BookingView, Borrower, NewBooking, READY_LEAD};

/// Most bookings one calendar read returns.
const CALENDAR_LIMIT: i64 = 2000;

impl Allocations {
    /// Books capacity for a team: a team admin of it, or a platform admin. Refused with
    /// the reason when the cluster, the team's limit for the window or other bookings
    /// cannot honour it.
    pub async fn book(&self, p: &Principal, input: &NewBooking) -> Result<BookingView, AppError> {
        let now = self.clock.now();
        let valid = booking::validate(input, &self.policy, &self.catalog, now)?;
        let access =
            authz::team(&self.store, p, valid.alloc.team_id(), Need::ManageMembers).await?;
        if access.team.archived {
            return Err(AppError::conflict("the team is archived"));
        }
        let model = valid.model().to_owned();
        let capacity = self
            .pending_context(now)
            .capacity
            .get(&model)
            .copied()
            .unwrap_or(0);
        let row = BookingRow {
            id: Uuid::new_v4(),
            team_id: TeamId(access.team.id.0),
            user_id: p.user_id(),
            kind: valid.alloc.kind().clone(),
            model: model.clone(),
            count: i64::from(valid.alloc.count()),
            units: i64::from(valid.units()),
            starts_at: valid.starts_at,
            ends_at: valid.ends_at,
            purpose: valid.alloc.purpose().to_owned(),
            created_at: now,
            cancelled_at: None,
            allocation_id: None,
        };
        let team = access.team.id;
        let verdict = self
            .store
            .book(&row, self.policy.duration_bound(), |s| {
                booking::admit(
                    &valid,
                    team,
                    &booking::Standing {
                        capacity,
                        team_limit: s.team_limit.map(to_u32),
                        held: &s.held,
                    },
                )
            })
            .await
            .map_err(internal("admitting booking"))?;
        verdict?;
        self.audit_booking(
            Some(p.username().as_str()),
            AuditAction::BookingCreate,
            &row,
        )
        .await;
        self.booking(p, row.id).await
    }

    /// One booking of a team the caller belongs to; another team's is `NotFound`.
    pub async fn booking(&self, p: &Principal, id: Uuid) -> Result<BookingView, AppError> {
        let row = self.booking_row(p, id, Need::Read).await?;
        Ok(view(&row, true, self.clock.now()))
    }

    /// A booking that `p` may act on as `need` says: another team's is `NotFound`, one of
    /// `p`'s own teams that `p` may not act on is `Forbidden` (one check).
    async fn booking_row(
        &self,
        p: &Principal,
        id: Uuid,
        need: Need,
    ) -> Result<BookingListRow, AppError> {
        let row = found("loading booking", self.store.booking(id).await)?;
        authz::team(&self.store, p, row.b.team_id, need).await?;
        Ok(row)
    }

    /// The calendar: live bookings overlapping `[from, to)` (at most 2000), every team's.
    /// Another team's shows only that the capacity is taken (no id, team or purpose),
    /// except to a platform admin.
    pub async fn bookings(
        &self,
        p: &Principal,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        model: Option<&str>,
    ) -> Result<Vec<BookingView>, AppError> {
        if to <= from {
            return Err(AppError::invalid("to", "must be after from"));
        }
        if to - from > Duration::days(62) {
            return Err(AppError::invalid("to", "at most 62 days after from"));
        }
        let mine = authz::readable_teams(&self.store, p, None).await?;
        let rows = self
            .store
            .bookings_between(from, to, model, CALENDAR_LIMIT)
            .await
            .map_err(internal("loading bookings"))?;
        let now = self.clock.now();
        Ok(rows
            .iter()
            .map(|r| {
                let visible = mine.as_ref().is_none_or(|t| t.contains(&r.b.team_id));
                view(r, visible, now)
            })
            .collect())
    }

    /// Cancels a booking (a team admin of its team, or a platform admin): the capacity is
    /// free for others again, and its allocation, if it started, is released.
    pub async fn cancel_booking(&self, p: &Principal, id: Uuid) -> Result<BookingView, AppError> {
        let row = self.booking_row(p, id, Need::ManageMembers).await?;
        let now = self.clock.now();
        let Some(allocation) = self
            .store
            .cancel_booking(id, now)
            .await
            .map_err(internal("cancelling booking"))?
        else {
            return Err(AppError::conflict(
                "the booking was cancelled already or has ended",
            ));
        };
        self.store
            .withdraw_booking_warnings(id)
            .await
            .map_err(internal("withdrawing booking warnings"))?;
        if let Some(a) = allocation {
            self.release_for_system(a, &format!("its booking was cancelled by {}", p.username()))
                .await?;
        }
        self.audit_booking(
            Some(p.username().as_str()),
            AuditAction::BookingCancel,
            &row.b,
        )
        .await;
        self.wake.notify_one();
        self.booking(p, id).await
    }

    /// The scheduler's part: due bookings become allocations (placed ahead of the queue
    /// from [`READY_LEAD`] before their start), and borrowers of the capacity they need
    /// are warned to be gone by then. Returns the ids of the bookings' allocations, which
    /// the pass places first, and how many borrowers it warned.
    pub(super) async fn bookings_pass(
        &self,
        live: &mut scheduler::Live,
        now: DateTime<Utc>,
    ) -> Result<(BTreeSet<AllocationId>, u32), AppError> {
        let lead = self.preemption_grace + READY_LEAD;
        for b in self
            .store
            .bookings_due(now + lead, now)
            .await
            .map_err(internal("loading due bookings"))?
        {
            live.changed();
            self.start_booking(&b, now).await?;
        }
        let started = self
            .store
            .bookings_started(now)
            .await
            .map_err(internal("loading started bookings"))?;
        let first: BTreeSet<AllocationId> =
            started.iter().filter_map(|b| b.allocation_id).collect();
        let warned = self.clear_the_way(&started, live, now).await?;
        Ok((first, warned))
    }

    /// Puts a due booking's allocation in the queue (once: keyed by the booking), admitted
    /// as the booking was: the team's limit was checked for the window when it was made.
    async fn start_booking(&self, b: &BookingRow, now: DateTime<Utc>) -> Result<(), AppError> {
        let key = format!("booking:{}", b.id);
        let start = b.starts_at.max(now);
        let minutes = ((b.ends_at - start).num_seconds() + 59)
            .div_euclid(60)
            .max(1);
        let row = AllocationRow {
            purpose: if b.purpose.is_empty() {
                "booking".to_owned()
            } else {
                format!("booking: {}", b.purpose)
            },
            duration_minutes: minutes,
            starts_at: Some(b.starts_at - READY_LEAD),
            idempotency_key: Some(key.clone()),
            ..AllocationRow::queued(b.team_id, b.user_id, &b.kind, (b.count, b.units), now)
        };
        let pricer = self.pricer(now).await?;
        let line = self.line(&row, pricer.as_ref(), now);
        let outcome = self
            .store
            .admit(
                line,
                Admit::Insert {
                    row: &row,
                    actor: "booking",
                },
                |_| alloc::Verdict::Admit {
                    over_limit: false,
                    over_budget: false,
                },
            )
            .await
            .map_err(internal("starting a booking"))?;
        let id = match outcome {
            Admitted::Held { .. } => row.id,
            // Stored by an earlier pass that stopped before linking it.
            Admitted::Duplicate => self
                .store
                .allocation_by_key(b.user_id, &key)
                .await
                .map_err(internal("loading a booking's allocation"))?
                .ok_or(AppError::Internal)?,
            other => {
                tracing::error!(booking = %b.id, ?other, "a booking's allocation was not admitted");
                return Ok(());
            }
        };
        self.store
            .link_booking(b.id, id)
            .await
            .map_err(internal("linking a booking"))?;
        if matches!(outcome, Admitted::Held { .. }) {
            self.audit_request(None, &row).await;
        }
        tracing::info!(booking = %b.id, allocation = %id, "booking starting");
        Ok(())
    }

    /// For each booking whose allocation still waits and whose start is within the grace:
    /// the units its model lacks are taken from borrowers (not other bookings), which are
    /// warned to be gone [`READY_LEAD`] before the start. Counted in units: a MIG layout
    /// may still need the planner to re-partition (docs/operations.md).
    async fn clear_the_way(
        &self,
        started: &[BookingRow],
        live: &mut scheduler::Live,
        now: DateTime<Utc>,
    ) -> Result<u32, AppError> {
        // Only bookings in their lead (warnings are given from a grace before the start)
        // whose allocation still waits need anything; that is rare, so the pass reads the
        // live allocations only then.
        let in_lead: Vec<&BookingRow> = started
            .iter()
            .filter(|b| b.starts_at - READY_LEAD - self.preemption_grace <= now)
            .collect();
        if in_lead.is_empty() {
            return Ok(0);
        }
        live.refresh(&self.store).await?;
        let queue: BTreeSet<AllocationId> = live
            .rows()
            .filter(|a| a.state == AllocState::Queued)
            .map(|a| a.id)
            .collect();
        let (waiting, placed): (Vec<&BookingRow>, Vec<&BookingRow>) = in_lead
            .into_iter()
            .partition(|b| b.allocation_id.is_some_and(|id| queue.contains(&id)));
        // A booking placed before its start no longer needs its borrowers gone.
        for b in placed.iter().filter(|b| b.starts_at > now) {
            live.changed();
            self.store
                .withdraw_booking_warnings(b.id)
                .await
                .map_err(internal("withdrawing booking warnings"))?;
        }
        if waiting.is_empty() {
            return Ok(0);
        }
        let booked: BTreeSet<AllocationId> =
            started.iter().filter_map(|b| b.allocation_id).collect();
        live.refresh(&self.store).await?;
        let rows: Vec<&AllocationRow> = live
            .rows()
            .filter(|a| a.state != AllocState::Releasing)
            .collect();
        let by_id: HashMap<AllocationId, &AllocationRow> =
            rows.iter().map(|a| (a.id, *a)).collect();
        let capacity = self.pending_context(now).capacity;
        let mut warned = 0;
        let mut taken: BTreeSet<AllocationId> = BTreeSet::new();
        for b in waiting {
            let Some(mine) = b.allocation_id.and_then(|id| by_id.get(&id)) else {
                continue;
            };
            if mine.state != AllocState::Queued {
                continue;
            }
            let cap = capacity.get(&b.model).copied().unwrap_or(0);
            // Held now on the model by what stays: placed work not already on its way out.
            let staying: u32 = rows
                .iter()
                .filter(|a| a.model == b.model && a.state != AllocState::Queued)
                .filter(|a| !taken.contains(&a.id))
                .filter(|a| a.preempt_at.is_none_or(|t| t > b.starts_at))
                .map(|a| to_u32(a.units))
                .sum();
            let short = to_u32(b.units).saturating_sub(cap.saturating_sub(staying));
            let borrowers: Vec<Borrower> = rows
                .iter()
                .filter(|a| a.model == b.model && a.state == AllocState::Active)
                .filter(|a| !booked.contains(&a.id) && !taken.contains(&a.id))
                .filter(|a| a.preempt_at.is_none_or(|t| t > b.starts_at))
                .filter_map(|a| {
                    Some(Borrower {
                        id: a.id,
                        units: to_u32(a.units),
                        priority: a.priority,
                        started_at: a.active_at?,
                    })
                })
                .collect();
            let at = (b.starts_at - READY_LEAD).max(now);
            for v in booking::victims(short, &borrowers) {
                live.changed();
                taken.insert(v);
                self.store
                    .set_preempt_for_booking(v, at, b.id, self.clock.now())
                    .await
                    .map_err(internal("warning a borrower"))?;
                tracing::info!(allocation = %v, booking = %b.id, %at, "capacity booked: borrower warned");
                warned += 1;
            }
        }
        Ok(warned)
    }

    async fn audit_booking(&self, actor: Option<&str>, action: AuditAction, b: &BookingRow) {
        let after = serde_json::json!({"kind": b.kind, "count": b.count, "units": b.units,
            "starts_at": b.starts_at, "ends_at": b.ends_at});
        Entry::new(actor, action, "booking", b.id)
            .team(Some(b.team_id))
            .after(Some(after.to_string()))
            .record(&self.store, self.clock.now())
            .await;
    }
}

/// A booking as its views show it; `visible`: the caller may see whose it is.
fn view(r: &BookingListRow, visible: bool, now: DateTime<Utc>) -> BookingView {
    let b = &r.b;
    BookingView {
        id: visible.then_some(b.id),
        team_id: visible.then_some(b.team_id),
        team_name: visible.then(|| r.team_name.clone()),
        kind: b.kind.to_string(),
        model: b.model.clone(),
        count: to_u32(b.count),
        units: to_u32(b.units),
        starts_at: b.starts_at,
        ends_at: b.ends_at,
        purpose: if visible {
            b.purpose.clone()
        } else {
            String::new()
        },
        state: booking::state_label(b.cancelled_at.is_some(), b.allocation_id, b.ends_at, now)
            .to_owned(),
        booked_by: visible.then(|| r.username.clone()),
        allocation_id: if visible { b.allocation_id } else { None },
    }
}
