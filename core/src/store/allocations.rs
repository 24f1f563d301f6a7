//! `quotas`, `user_usage`, `allocations`, `allocation_events`, `audit_log`.
//!
//! Quota counters move only inside the transaction that changes an allocation's state, and
//! every state change is a conditional `UPDATE … WHERE state = <expected>`: of two racing
//! transitions exactly one happens, so units are released exactly once. Admission is one
//! conditional `UPDATE quotas SET used = used + n WHERE used + n <= limit` — atomic on
//! both backends (SQLite serializes writers; PostgreSQL re-checks the condition on the
//! locked row), so concurrent requests never admit past the limit.

use super::{
    JsonText, NullableText, Store, StoreError, db, from_driver, in_tx, live_states, on_pool,
    placeholders,
};
use chrono::{DateTime, Utc};
use tessera_domain::alloc::{
    AllocState, AllocatedDevice, Approver, GpuKind, PreemptCause, PriorityClass, ReleaseCause,
};
use tessera_domain::ids::{AllocationId, TeamId, UserId};
use tessera_domain::image::CudaVersion;
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct QuotaRow {
    #[sqlx(try_from = "Uuid")]
    pub team_id: TeamId,
    pub model: String,
    pub guaranteed: i64,
    pub limit_units: i64,
    pub per_user: i64,
    pub used: i64,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AllocationRow {
    #[sqlx(try_from = "Uuid")]
    pub id: AllocationId,
    #[sqlx(try_from = "Uuid")]
    pub team_id: TeamId,
    #[sqlx(try_from = "Uuid")]
    pub user_id: UserId,
    #[sqlx(try_from = "String")]
    pub kind: GpuKind,
    pub model: String,
    pub count: i64,
    pub units: i64,
    #[sqlx(try_from = "String")]
    pub priority: PriorityClass,
    pub purpose: String,
    #[sqlx(try_from = "String")]
    pub state: AllocState,
    pub duration_minutes: i64,
    pub starts_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub active_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
    #[sqlx(try_from = "NullableText")]
    pub approver: Option<Approver>,
    pub approval_reason: Option<String>,
    pub pending_reason: Option<String>,
    /// The placed devices (a JSON list in the table).
    #[sqlx(try_from = "JsonText")]
    pub devices: Vec<AllocatedDevice>,
    #[sqlx(try_from = "NullableText")]
    pub release_cause: Option<ReleaseCause>,
    pub preempt_at: Option<DateTime<Utc>>,
    /// Why `preempt_at` is set (migration 0020; a booking's claim reads `booking`).
    #[sqlx(default, try_from = "NullableText")]
    pub preempt_cause: Option<PreemptCause>,
    pub idempotency_key: Option<String>,
    /// A platform admin approved it beyond the team's limit / hard budget (an override).
    pub over_limit: bool,
    pub over_budget: bool,
    /// The CUDA version its node's driver must support (`12.4`); `None`: any node
    /// (migration 0027).
    #[sqlx(default, try_from = "NullableText")]
    pub needs_cuda: Option<CudaVersion>,
    /// A gang's node count (`count` is the whole gang's, an equal part on each node);
    /// `None`: one node (migration 0028).
    #[sqlx(default)]
    pub gang_nodes: Option<i64>,
}

impl AllocationRow {
    /// A new request as it is first written: queued, nothing decided yet, normal
    /// priority, an hour long, no purpose; `model` (the quota line) is the kind's first
    /// part, which a share must override with its `quota_key`.
    pub fn queued(
        team_id: TeamId,
        user_id: UserId,
        kind: &GpuKind,
        (count, units): (i64, i64),
        created_at: DateTime<Utc>,
    ) -> AllocationRow {
        AllocationRow {
            id: AllocationId(Uuid::new_v4()),
            team_id,
            user_id,
            kind: kind.clone(),
            model: kind.model().to_owned(),
            count,
            units,
            priority: PriorityClass::Normal,
            purpose: String::new(),
            state: AllocState::Queued,
            duration_minutes: 60,
            starts_at: None,
            created_at,
            active_at: None,
            ends_at: None,
            approver: None,
            approval_reason: None,
            pending_reason: None,
            devices: Vec::new(),
            release_cause: None,
            preempt_at: None,
            preempt_cause: None,
            idempotency_key: None,
            over_limit: false,
            over_budget: false,
            needs_cuda: None,
            gang_nodes: None,
        }
    }
}

/// An allocation with the names the views show.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AllocationListRow {
    #[sqlx(flatten)]
    pub a: AllocationRow,
    pub team_name: String,
    pub username: String,
}

/// (id, team, units, running, active_at, ends_at): [`Store::usage_since`].
pub type Usage = (
    AllocationId,
    TeamId,
    i64,
    bool,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
);

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventRow {
    pub at: DateTime<Utc>,
    pub from_state: Option<String>,
    #[sqlx(try_from = "String")]
    pub to_state: AllocState,
    pub actor: Option<String>,
    pub note: Option<String>,
}

/// What changes with a state transition besides the state.
#[derive(Debug, Clone, Default)]
pub struct Change {
    pub active_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
    pub devices: Option<String>,
    pub release_cause: Option<ReleaseCause>,
    pub pending_reason: Option<Option<String>>,
    pub approval_reason: Option<String>,
}

/// A transition: from which state to which, and what it does to the quota counters.
#[derive(Debug, Clone)]
pub struct Transition<'a> {
    pub id: AllocationId,
    pub from: AllocState,
    pub to: AllocState,
    /// `+units` when the allocation starts holding quota, `-units` when it stops, 0 else.
    pub quota_delta: i64,
    pub at: DateTime<Utc>,
    pub actor: Option<&'a str>,
    pub note: Option<&'a str>,
    pub change: Change,
}

impl<'a> Transition<'a> {
    /// A move of `id` from `from` to `to` at `at` that holds or frees no quota and names
    /// no actor.
    pub fn plain(
        id: AllocationId,
        (from, to): (AllocState, AllocState),
        at: DateTime<Utc>,
        change: Change,
    ) -> Self {
        Transition {
            id,
            from,
            to,
            quota_delta: 0,
            at,
            actor: None,
            note: None,
            change,
        }
    }
}

pub(super) const COLS: &str = "a.id, a.team_id, a.user_id, a.kind, a.model, a.count, a.units, a.priority, \
                    a.purpose, a.state, a.duration_minutes, a.starts_at, a.created_at, a.active_at, \
                    a.ends_at, a.approver, a.approval_reason, a.pending_reason, a.devices, \
                    a.release_cause, a.preempt_at, \
                    CASE WHEN a.preempt_booking IS NOT NULL THEN 'booking' ELSE a.preempt_cause END \
                    AS preempt_cause, a.idempotency_key, a.over_limit, \
                    a.over_budget, a.needs_cuda, a.gang_nodes";

pub(super) const INSERT: &str = "INSERT INTO allocations (id, team_id, user_id, kind, model, count, units, \
    priority, purpose, state, duration_minutes, starts_at, created_at, approver, \
    approval_reason, idempotency_key, needs_cuda, gang_nodes, share_milli) \
    VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19)";

pub(super) const EVENT: &str = "INSERT INTO allocation_events (allocation_id, seq, at, from_state, to_state, actor, note) \
    VALUES ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM allocation_events WHERE allocation_id = $1), \
    $2, $3, $4, $5, $6)";

/// Adds `units` to the team's counter (the admission rule checked it, under the team's lock).
pub(super) const TEAM_ADD: &str =
    "UPDATE quotas SET used = used + $3 WHERE team_id = $1 AND model = $2";
pub(super) const USER_ADD: &str = "INSERT INTO user_usage (team_id, model, user_id, used) \
    VALUES ($1, $2, $3, $4) ON CONFLICT (team_id, model, user_id) DO UPDATE \
    SET used = user_usage.used + excluded.used";
const TEAM_SUB: &str =
    "UPDATE quotas SET used = used - $3 WHERE team_id = $1 AND model = $2 AND used >= $3";
const USER_SUB: &str = "UPDATE user_usage SET used = used - $4 \
    WHERE team_id = $1 AND model = $2 AND user_id = $3 AND used >= $4";

/// How a new allocation entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// Stored as given (e.g. `pending_approval`), counters untouched.
    Stored,
    /// The (user, idempotency key) pair exists already: nothing was stored.
    Duplicate,
}

macro_rules! bind_insert {
    ($q:expr, $r:expr) => {
        $q.bind($r.id.0)
            .bind($r.team_id.0)
            .bind($r.user_id.0)
            .bind($r.kind.to_string())
            .bind(&$r.model)
            .bind($r.count)
            .bind($r.units)
            .bind($r.priority.as_str())
            .bind(&$r.purpose)
            .bind($r.state.as_str())
            .bind($r.duration_minutes)
            .bind($r.starts_at)
            .bind($r.created_at)
            .bind($r.approver.map(|a| a.as_str()))
            .bind(&$r.approval_reason)
            .bind(&$r.idempotency_key)
            .bind($r.needs_cuda.map(|v| v.to_string()))
            .bind($r.gang_nodes)
            .bind($r.kind.share_milli().map(i64::from))
    };
}
pub(super) use bind_insert;

pub(super) fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.is_unique_violation())
}

impl Store {
    // ---- quotas ----

    pub async fn quota(&self, team: TeamId, model: &str) -> Result<Option<QuotaRow>, StoreError> {
        let sql = "SELECT team_id, model, guaranteed, limit_units, per_user, used FROM quotas \
                   WHERE team_id = $1 AND model = $2";
        db!(self, pool => sqlx::query_as::<_, QuotaRow>(sql).bind(team.0).bind(model).fetch_optional(pool).await)
    }

    /// Quotas of one team (`Some`) or every team, by model.
    pub async fn quotas(&self, team: Option<TeamId>) -> Result<Vec<QuotaRow>, StoreError> {
        let sql = "SELECT team_id, model, guaranteed, limit_units, per_user, used FROM quotas \
                   WHERE ($1 IS NULL OR team_id = $1) ORDER BY team_id, model";
        db!(self, pool => sqlx::query_as::<_, QuotaRow>(sql).bind(team.map(|v| v.0)).fetch_all(pool).await)
    }

    /// Units held on each of `team`'s quota lines by allocations a platform admin approved
    /// beyond the limit: `(model, units)`.
    pub async fn overridden_units(&self, team: TeamId) -> Result<Vec<(String, i64)>, StoreError> {
        let sql = concat!(
            "SELECT model, CAST(COALESCE(SUM(units), 0) AS BIGINT) FROM allocations \
             WHERE team_id = $1 AND over_limit AND state IN ",
            live_states!(),
            " GROUP BY model"
        );
        db!(self, pool => sqlx::query_as::<_, (String, i64)>(sql).bind(team.0).fetch_all(pool).await)
    }

    /// Creates or changes a quota (its usage counter is kept). A change is told to the
    /// team's admins in the same transaction (`quota.changed`); setting the same numbers
    /// again tells nobody.
    pub async fn set_quota(
        &self,
        q: &QuotaRow,
        by: UserId,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let sql = "INSERT INTO quotas (team_id, model, guaranteed, limit_units, per_user, used, updated_at, updated_by) \
                   VALUES ($1, $2, $3, $4, $5, 0, $6, $7) ON CONFLICT (team_id, model) DO UPDATE SET \
                   guaranteed = excluded.guaranteed, limit_units = excluded.limit_units, \
                   per_user = excluded.per_user, updated_at = excluded.updated_at, updated_by = excluded.updated_by";
        let after = (q.guaranteed, q.limit_units, q.per_user);
        in_tx!(self, tx => {
            // Write first: on SQLite a transaction that read and then writes fails at once
            // (busy) if another writer committed in between; a first write takes the lock.
            sqlx::query("UPDATE quotas SET updated_at = updated_at WHERE team_id = $1 AND model = $2")
                .bind(q.team_id.0).bind(&q.model).execute(&mut *tx).await?;
            let before: Option<(i64, i64, i64)> = sqlx::query_as(
                "SELECT guaranteed, limit_units, per_user FROM quotas WHERE team_id = $1 AND model = $2")
                .bind(q.team_id.0).bind(&q.model).fetch_optional(&mut *tx).await?;
            sqlx::query(sql).bind(q.team_id.0).bind(&q.model).bind(q.guaranteed)
                .bind(q.limit_units).bind(q.per_user).bind(at).bind(by.0).execute(&mut *tx).await?;
            if before != Some(after) {
                let team_name: String = sqlx::query_scalar("SELECT name FROM teams WHERE id = $1")
                    .bind(q.team_id.0).fetch_one(&mut *tx).await?;
                let payload = tessera_domain::notify::quota_payload(
                    (q.team_id.0, &team_name), &q.model, before, after);
                let event = super::outbox::NewEvent::new(
                    tessera_domain::notify::EventKind::QuotaChanged, Some(q.team_id.0),
                    ("team", q.team_id.0), payload, at);
                super::outbox::record_event!(tx, &event);
            }
        })
    }

    pub async fn user_used(
        &self,
        team: TeamId,
        model: &str,
        user: UserId,
    ) -> Result<i64, StoreError> {
        let sql = "SELECT used FROM user_usage WHERE team_id = $1 AND model = $2 AND user_id = $3";
        let v = on_pool!(self, pool => sqlx::query_scalar::<_, i64>(sql).bind(team.0).bind(model)
            .bind(user.0).fetch_optional(pool).await?);
        Ok(v.unwrap_or(0))
    }

    // ---- allocations ----

    /// Stores an allocation exactly as given, quota counters untouched: for history written
    /// by tests and benchmarks. Requests go through [`Store::admit`], which checks the rules.
    pub async fn insert_allocation(
        &self,
        r: &AllocationRow,
        actor: &str,
    ) -> Result<Inserted, StoreError> {
        let result: Result<Inserted, sqlx::Error> = in_tx!(self, tx => {
            match bind_insert!(sqlx::query(INSERT), r).execute(&mut *tx).await {
                Ok(_) => {}
                Err(e) if is_unique_violation(&e) => {
                    tx.rollback().await?;
                    return Ok(Inserted::Duplicate);
                }
                Err(e) => return Err(e.into()),
            }
            sqlx::query(EVENT).bind(r.id.0).bind(r.created_at).bind(None::<String>).bind(r.state.as_str())
                .bind(actor).bind(None::<String>).execute(&mut *tx).await?;
            Inserted::Stored
        });
        from_driver(result)
    }

    /// Applies a state transition if the allocation is still in `t.from`; returns whether
    /// it happened. Quota counters change in the same transaction.
    pub async fn transition(&self, t: &Transition<'_>) -> Result<bool, StoreError> {
        let c = &t.change;
        let sql = "UPDATE allocations SET state = $3, \
                   active_at = COALESCE($4, active_at), ends_at = COALESCE($5, ends_at), \
                   devices = COALESCE($6, devices), release_cause = COALESCE($7, release_cause), \
                   pending_reason = CASE WHEN $8 THEN $9 ELSE pending_reason END, \
                   approval_reason = COALESCE($10, approval_reason), \
                   preempt_at = CASE WHEN $3 = 'active' THEN preempt_at ELSE NULL END, \
                   preempt_cause = CASE WHEN $3 = 'active' THEN preempt_cause ELSE NULL END, \
                   preempt_booking = CASE WHEN $3 = 'active' THEN preempt_booking ELSE NULL END \
                   WHERE id = $1 AND state = $2 RETURNING team_id, model, user_id, units";
        let (set_pending, pending) = match &c.pending_reason {
            Some(p) => (true, p.clone()),
            None => (false, None),
        };
        in_tx!(self, tx => {
            let row: Option<(Uuid, String, Uuid, i64)> = sqlx::query_as(sql)
                .bind(t.id.0).bind(t.from.as_str()).bind(t.to.as_str()).bind(c.active_at).bind(c.ends_at)
                .bind(&c.devices).bind(c.release_cause.map(ReleaseCause::as_str)).bind(set_pending).bind(pending)
                .bind(&c.approval_reason)
                .fetch_optional(&mut *tx).await?;
            let Some((team, model, user, units)) = row else {
                tx.rollback().await?;
                return Ok(false);
            };
            if t.quota_delta > 0 {
                sqlx::query(TEAM_ADD).bind(team).bind(&model).bind(units).execute(&mut *tx).await?;
                sqlx::query(USER_ADD).bind(team).bind(&model).bind(user).bind(units).execute(&mut *tx).await?;
            } else if t.quota_delta < 0 {
                let a = sqlx::query(TEAM_SUB).bind(team).bind(&model).bind(units).execute(&mut *tx).await?.rows_affected();
                let b = sqlx::query(USER_SUB).bind(team).bind(&model).bind(user).bind(units).execute(&mut *tx).await?.rows_affected();
                if a != 1 || b != 1 {
                    tracing::error!(allocation = %t.id, "quota counters were already below this allocation's units");
                }
            }
            sqlx::query(EVENT).bind(t.id.0).bind(t.at).bind(t.from.as_str()).bind(t.to.as_str()).bind(t.actor)
                .bind(t.note).execute(&mut *tx).await?;
            if (t.from, t.to) == (AllocState::PendingApproval, AllocState::Denied) {
                super::outbox::request_event!(tx, t.id,
                    tessera_domain::notify::EventKind::RequestDenied, t.note, None, t.at);
            }
            if t.to == AllocState::Releasing && c.release_cause == Some(ReleaseCause::Preempted) {
                super::outbox::allocation_event!(tx, t.id,
                    tessera_domain::notify::EventKind::Preempted, None, t.note, None, t.at);
            }
            true
        })
    }

    /// Why a queued allocation waits (the planner's words).
    pub async fn set_pending_reason(
        &self,
        id: AllocationId,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        let sql = "UPDATE allocations SET pending_reason = $2 WHERE id = $1 AND state = 'queued'";
        db!(self, pool => sqlx::query(sql).bind(id.0).bind(reason).execute(pool).await.map(|_| ()))
    }

    /// Sets (with its cause) or withdraws (`None`) an active allocation's preemption
    /// deadline. A booking's claim is [`set_preempt_for_booking`](Self::set_preempt_for_booking).
    ///
    /// A deadline set is told to the owner in the same transaction (one event per
    /// allocation and deadline: setting the same one again tells nobody).
    pub async fn set_preempt_at(
        &self,
        id: AllocationId,
        at: Option<(DateTime<Utc>, PreemptCause)>,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let sql = "UPDATE allocations SET preempt_at = $2, preempt_cause = $3, \
                   preempt_booking = NULL WHERE id = $1 AND state = 'active'";
        let (deadline, cause) = at.map_or((None, None), |(t, c)| (Some(t), Some(c)));
        let stored = cause.map(PreemptCause::as_str);
        in_tx!(self, tx => {
            let moved = sqlx::query(sql).bind(id.0).bind(deadline).bind(stored)
                .execute(&mut *tx).await?.rows_affected() == 1;
            if let (true, Some(t), Some(cause)) = (moved, deadline, cause) {
                super::outbox::allocation_event!(tx, id,
                    tessera_domain::notify::EventKind::PreemptionWarning, Some(t),
                    Some(tessera_domain::notify::preempt_cause_words(cause)),
                    Some(format!("preempt:{id}:{}", t.timestamp_micros())), now);
            }
        })
    }

    pub async fn allocation(
        &self,
        id: AllocationId,
    ) -> Result<Option<AllocationListRow>, StoreError> {
        let sql = format!(
            "SELECT {COLS}, t.name AS team_name, u.username AS username FROM allocations a \
             JOIN teams t ON t.id = a.team_id JOIN users u ON u.id = a.user_id WHERE a.id = $1"
        );
        db!(self, pool => sqlx::query_as::<_, AllocationListRow>(&sql).bind(id.0).fetch_optional(pool).await)
    }

    pub async fn allocation_by_key(
        &self,
        user: UserId,
        key: &str,
    ) -> Result<Option<AllocationId>, StoreError> {
        let sql = "SELECT id FROM allocations WHERE user_id = $1 AND idempotency_key = $2";
        db!(self, pool => sqlx::query_scalar::<_, Uuid>(sql).bind(user.0).bind(key).fetch_optional(pool).await.map(|id| id.map(AllocationId)))
    }

    /// A page of allocations, newest first. `teams`: only these teams (`None`: all);
    /// `user`: only this user's; `states`: only these states (empty: all).
    pub async fn list_allocations(
        &self,
        teams: Option<&[TeamId]>,
        user: Option<UserId>,
        states: &[String],
        offset: u32,
        limit: u32,
    ) -> Result<(Vec<AllocationListRow>, i64), StoreError> {
        let mut filter = String::from("WHERE 1 = 1");
        let mut n = 0;
        let mut next = || {
            n += 1;
            format!("${n}")
        };
        if let Some(ts) = teams {
            let ps: Vec<String> = ts.iter().map(|_| next()).collect();
            if ps.is_empty() {
                filter.push_str(" AND 1 = 0");
            } else {
                filter.push_str(&format!(" AND a.team_id IN ({})", ps.join(",")));
            }
        }
        if user.is_some() {
            filter.push_str(&format!(" AND a.user_id = {}", next()));
        }
        if !states.is_empty() {
            let ps: Vec<String> = states.iter().map(|_| next()).collect();
            filter.push_str(&format!(" AND a.state IN ({})", ps.join(",")));
        }
        let (lim, off) = (next(), next());
        let sql = format!(
            "SELECT {COLS}, t.name AS team_name, u.username AS username FROM allocations a \
             JOIN teams t ON t.id = a.team_id JOIN users u ON u.id = a.user_id {filter} \
             ORDER BY a.created_at DESC, a.id LIMIT {lim} OFFSET {off}"
        );
        let count = format!("SELECT COUNT(*) FROM allocations a {filter}");
        macro_rules! binds {
            ($q:expr) => {{
                let mut q = $q;
                for t in teams.unwrap_or(&[]) {
                    q = q.bind(t.0);
                }
                if let Some(u) = user {
                    q = q.bind(u.0);
                }
                for s in states {
                    q = q.bind(s.clone());
                }
                q
            }};
        }
        on_pool!(self, pool => {
            let rows = binds!(sqlx::query_as::<_, AllocationListRow>(&sql))
                .bind(i64::from(limit)).bind(i64::from(offset)).fetch_all(pool).await?;
            let total = binds!(sqlx::query_scalar::<_, i64>(&count)).fetch_one(pool).await?;
            Ok((rows, total))
        })
    }

    /// Every allocation in one of `states`, oldest first (the scheduler's working set).
    /// Open allocations (waiting, queued, placing, active) whose owner is no longer a
    /// member of the allocation's team and is not a platform admin (`disabled` false), or
    /// whose owner's account is disabled (`disabled` true).
    pub async fn allocations_of_departed(
        &self,
        disabled: bool,
    ) -> Result<Vec<AllocationRow>, StoreError> {
        let who = if disabled {
            "EXISTS (SELECT 1 FROM users u WHERE u.id = a.user_id AND u.disabled)"
        } else {
            "NOT EXISTS (SELECT 1 FROM memberships m WHERE m.team_id = a.team_id \
             AND m.user_id = a.user_id) \
             AND NOT EXISTS (SELECT 1 FROM users u WHERE u.id = a.user_id AND u.is_admin)"
        };
        let sql = format!(
            "SELECT {COLS} FROM allocations a WHERE a.state IN \
             ('pending_approval', 'queued', 'placing', 'active') AND {who} \
             ORDER BY a.created_at, a.id"
        );
        db!(self, pool => sqlx::query_as::<_, AllocationRow>(&sql).fetch_all(pool).await)
    }

    /// The latest `limit` allocation requests grouped by kind, whatever became of them:
    /// `(kind, how many)`, for the mix the planner keeps room for.
    pub async fn recent_kinds(&self, limit: i64) -> Result<Vec<(String, i64)>, StoreError> {
        let sql = "SELECT kind, COUNT(*) FROM (SELECT kind FROM allocations \
                   ORDER BY created_at DESC LIMIT $1) r GROUP BY kind ORDER BY kind";
        db!(self, pool => sqlx::query_as::<_, (String, i64)>(sql).bind(limit).fetch_all(pool).await)
    }

    pub async fn allocations_in(
        &self,
        states: &[AllocState],
    ) -> Result<Vec<AllocationRow>, StoreError> {
        let sql = format!(
            "SELECT {COLS} FROM allocations a WHERE a.state IN ({}) ORDER BY a.created_at, a.id",
            placeholders(1, states.len())
        );
        db!(self, pool => {
            let mut q = sqlx::query_as::<_, AllocationRow>(&sql);
            for s in states {
                q = q.bind(s.as_str());
            }
            q.fetch_all(pool).await
        })
    }

    /// Active allocations that end after `now` and by `until`.
    pub async fn ending_allocations(
        &self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<Vec<AllocationRow>, StoreError> {
        let sql = format!(
            "SELECT {COLS} FROM allocations a WHERE a.state = $1 AND a.active_at IS NOT NULL \
             AND a.ends_at > $2 AND a.ends_at <= $3"
        );
        db!(self, pool => sqlx::query_as::<_, AllocationRow>(&sql)
            .bind(AllocState::Active.as_str())
            .bind(now)
            .bind(until)
            .fetch_all(pool)
            .await)
    }

    /// Every live allocation (queued, placing, active, releasing), in queue order: the
    /// scheduler pass reads them once and filters by state.
    pub async fn live_allocations(&self) -> Result<Vec<AllocationRow>, StoreError> {
        self.allocations_in(&AllocState::LIVE).await
    }

    /// The live allocations of `ids` (any state: the caller sorts them), in chunks.
    pub async fn allocations_by_ids(
        &self,
        ids: &[AllocationId],
    ) -> Result<Vec<AllocationRow>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let sql = format!(
                "SELECT {COLS} FROM allocations a WHERE a.id IN ({})",
                placeholders(1, chunk.len())
            );
            let rows = db!(self, pool => {
                let mut q = sqlx::query_as::<_, AllocationRow>(&sql);
                for id in chunk {
                    q = q.bind(id.0);
                }
                q.fetch_all(pool).await
            })?;
            out.extend(rows);
        }
        Ok(out)
    }

    /// Where the allocation change feed (`allocation_changes`, migration 0026) stands now:
    /// on SQLite the last entry's `seq` (writers are serialized, so entries become visible
    /// in `seq` order); on PostgreSQL the oldest transaction still running
    /// (`pg_snapshot_xmin`): every change not yet visible belongs to it or a later one.
    /// Read it before what it is the horizon of.
    pub async fn allocation_change_horizon(&self) -> Result<i64, StoreError> {
        let r = match self {
            Store::Sqlite(pool) => {
                sqlx::query_scalar::<_, i64>("SELECT COALESCE(MAX(seq), 0) FROM allocation_changes")
                    .fetch_one(pool)
                    .await
            }
            Store::Postgres(pool) => {
                sqlx::query_scalar::<_, i64>(
                    "SELECT CAST(CAST(pg_snapshot_xmin(pg_current_snapshot()) AS TEXT) AS BIGINT)",
                )
                .fetch_one(pool)
                .await
            }
        };
        from_driver(r)
    }

    /// The allocations changed (inserted, updated, deleted) since `horizon` (from
    /// [`allocation_change_horizon`](Self::allocation_change_horizon) or this), and the
    /// horizon to ask from next time. May name an allocation again (harmless).
    pub async fn allocation_changes_since(
        &self,
        horizon: i64,
    ) -> Result<(i64, Vec<AllocationId>), StoreError> {
        match self {
            Store::Sqlite(pool) => {
                let rows = from_driver(
                    sqlx::query_as::<_, (i64, Uuid)>(
                        "SELECT seq, allocation_id FROM allocation_changes WHERE seq > $1",
                    )
                    .bind(horizon)
                    .fetch_all(pool)
                    .await,
                )?;
                let next = rows
                    .iter()
                    .map(|r| r.0)
                    .max()
                    .unwrap_or(horizon)
                    .max(horizon);
                Ok((next, rows.into_iter().map(|r| AllocationId(r.1)).collect()))
            }
            Store::Postgres(pool) => {
                // The next horizon first: what commits after it is read next time.
                let next = self.allocation_change_horizon().await?;
                let ids = from_driver(
                    sqlx::query_scalar::<_, Uuid>(
                        "SELECT DISTINCT allocation_id FROM allocation_changes \
                         WHERE txid >= CAST(CAST(CAST($1 AS BIGINT) AS TEXT) AS xid8)",
                    )
                    .bind(horizon)
                    .fetch_all(pool)
                    .await,
                )?;
                Ok((next, ids.into_iter().map(AllocationId).collect()))
            }
        }
    }

    /// Drops change-feed entries older than ten minutes (readers that fell further behind
    /// load everything again).
    pub async fn prune_allocation_changes(&self) -> Result<u64, StoreError> {
        let r = match self {
            Store::Sqlite(pool) => sqlx::query(
                "DELETE FROM allocation_changes \
                 WHERE at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-10 minutes')",
            )
            .execute(pool)
            .await
            .map(|r| r.rows_affected()),
            Store::Postgres(pool) => sqlx::query(
                "DELETE FROM allocation_changes WHERE at < now() - INTERVAL '10 minutes'",
            )
            .execute(pool)
            .await
            .map(|r| r.rows_affected()),
        };
        from_driver(r)
    }

    /// When each `placing` allocation last became `placing` (one query for all of them,
    /// instead of each one's history).
    pub async fn placing_since(&self) -> Result<Vec<(AllocationId, DateTime<Utc>)>, StoreError> {
        let sql = "SELECT e.allocation_id, e.at FROM allocation_events e \
                   JOIN allocations a ON a.id = e.allocation_id \
                   WHERE a.state = 'placing' AND e.to_state = 'placing'";
        let rows = db!(self, pool => sqlx::query_as::<_, (Uuid, DateTime<Utc>)>(sql).fetch_all(pool).await)?;
        Ok(rows
            .into_iter()
            .map(|(id, at)| (AllocationId(id), at))
            .collect())
    }

    /// What fair share needs of the allocations active at some point since `since`: (id,
    /// team, units, still running — active or releasing —, start, end); the lean form of
    /// [`allocations_active_since`](Self::allocations_active_since).
    pub async fn usage_since(&self, since: DateTime<Utc>) -> Result<Vec<Usage>, StoreError> {
        let sql = "SELECT a.id, a.team_id, a.units, a.state IN ('active', 'releasing'), a.active_at, \
                   a.ends_at FROM allocations a \
                   WHERE a.active_at IS NOT NULL AND (a.ends_at IS NULL OR a.ends_at >= $1)";
        type Raw = (Uuid, Uuid, i64, bool, DateTime<Utc>, Option<DateTime<Utc>>);
        let rows =
            db!(self, pool => sqlx::query_as::<_, Raw>(sql).bind(since).fetch_all(pool).await)?;
        Ok(rows
            .into_iter()
            .map(|(id, team, units, running, start, end)| {
                (AllocationId(id), TeamId(team), units, running, start, end)
            })
            .collect())
    }

    /// Allocations that were active at some point since `since` (for fair share).
    pub async fn allocations_active_since(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<AllocationRow>, StoreError> {
        let sql = format!(
            "SELECT {COLS} FROM allocations a WHERE a.active_at IS NOT NULL \
             AND (a.ends_at IS NULL OR a.ends_at >= $1)"
        );
        db!(self, pool => sqlx::query_as::<_, AllocationRow>(&sql).bind(since).fetch_all(pool).await)
    }

    pub async fn allocation_events(&self, id: AllocationId) -> Result<Vec<EventRow>, StoreError> {
        let sql = "SELECT at, from_state, to_state, actor, note FROM allocation_events \
                   WHERE allocation_id = $1 ORDER BY seq";
        db!(self, pool => sqlx::query_as::<_, EventRow>(sql).bind(id.0).fetch_all(pool).await)
    }

    /// Allocations by (state, model), and the oldest queued allocation's creation time.
    pub async fn allocation_stats(
        &self,
    ) -> Result<(Vec<(String, String, i64)>, Option<DateTime<Utc>>), StoreError> {
        let counts = "SELECT state, model, COUNT(*) FROM allocations GROUP BY state, model";
        let oldest = "SELECT MIN(created_at) FROM allocations WHERE state = 'queued'";
        on_pool!(self, pool => {
            let c = sqlx::query_as::<_, (String, String, i64)>(counts).fetch_all(pool).await?;
            let o = sqlx::query_scalar::<_, Option<DateTime<Utc>>>(oldest).fetch_one(pool).await?;
            Ok((c, o))
        })
    }
}
