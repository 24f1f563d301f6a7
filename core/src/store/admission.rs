//! Admission: the one transaction in which a team comes to hold more — a new request, an
//! approval, a waiting request admitted once there is room, an extension.
//!
//! It starts by bumping the team's `admissions` counter: that write takes the team's row
//! lock on PostgreSQL (SQLite's writer lock serializes anyway), so one team's admissions
//! run one at a time and the checks that span rows (units held at high priority, spend
//! committed to open allocations) see every earlier admission. It then reads where the
//! team stands ([`Standing`]), asks the caller's rule (pure, `tessera_domain::alloc::check`)
//! for a verdict, and writes what the verdict says — all in that transaction, so a
//! concurrent admission waits for it and then sees its result.

use super::allocations::{
    AllocationRow, COLS, EVENT, INSERT, TEAM_ADD, USER_ADD, bind_insert, is_unique_violation,
};
use super::{BudgetRow, QuotaRow, Store, StoreError, from_driver, in_tx, live_states};
use chrono::{DateTime, Utc};
use tessera_domain::alloc::{AllocState, Approver, GpuKind, PriorityClass, Verdict};
use tessera_domain::error::AppError;
use tessera_domain::ids::{AllocationId, TeamId, UserId};
use tessera_domain::notify::EventKind;

/// What is admitted once the verdict allows it.
#[derive(Debug, Clone)]
pub enum Admit<'a> {
    /// A new request (`row.state` is ignored: it is stored `queued` when admitted, else
    /// `pending_approval` with the verdict's approver and reason).
    Insert {
        row: &'a AllocationRow,
        actor: &'a str,
    },
    /// A request waiting in `pending_approval` joins the queue (an approval, or room that
    /// freed up). When the verdict says it must wait, it keeps waiting, for the approver
    /// and reason the verdict names.
    Waiting {
        id: AllocationId,
        actor: Option<&'a str>,
        note: Option<&'a str>,
        /// Stored as the approval's reason when admitted.
        approval_reason: Option<&'a str>,
    },
    /// An active allocation's end moves from `old_end` to `new_end` (no more units).
    Extend {
        id: AllocationId,
        old_end: DateTime<Utc>,
        new_end: DateTime<Utc>,
        actor: &'a str,
        note: &'a str,
    },
}

/// Where the team stands on the quota line, read under its admission lock.
#[derive(Debug, Clone)]
pub struct Standing {
    /// The allocation concerned (`Waiting`, `Extend`): as read under the lock.
    pub allocation: Option<AllocationRow>,
    pub quota: Option<QuotaRow>,
    /// Units the asking user holds on the line.
    pub user_used: i64,
    /// Units the team holds at high priority on the line.
    pub high_used: i64,
    /// The team's grant of `high`: `None` none; `Some(cap)` granted (`cap` `None`: no cap).
    pub high_grant: Option<Option<i64>>,
    /// The team's budget, if any.
    pub budget: Option<BudgetRow>,
    /// With a hard budget: the team's ledger spend in the month asked about.
    pub month_spent: i64,
    /// With a hard budget: the team's open allocations (queued, placing, active: an
    /// extended one included, at its current end) with what the ledger holds for each.
    pub open: Vec<OpenAllocation>,
}

/// An open allocation and what was posted for it, for committed spend.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OpenAllocation {
    #[sqlx(try_from = "String")]
    pub kind: GpuKind,
    pub count: i64,
    #[sqlx(try_from = "String")]
    pub priority: PriorityClass,
    #[sqlx(try_from = "String")]
    pub state: AllocState,
    pub duration_minutes: i64,
    pub active_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
    /// What the ledger holds for it so far (team side), whatever the month.
    pub posted: i64,
}

/// What an admission did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admitted {
    /// The units are held (or the end moved); with the overrides recorded on it.
    Held { over_limit: bool, over_budget: bool },
    /// It waits for approval (stored so, or kept so), by `by` for `reason`.
    Waits { by: Approver, reason: String },
    /// Refused by the rule: nothing was written.
    Refused(AppError),
    /// `Insert`: the (user, idempotency key) pair exists already; nothing was stored.
    Duplicate,
    /// `Waiting`/`Extend`: the allocation is no longer where the caller found it.
    Moved,
}

/// Who is asking, on which quota line.
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    pub team: TeamId,
    pub model: &'a str,
    pub user: UserId,
    /// `[from, to)` of the month whose spend counts against the budget.
    pub month: (DateTime<Utc>, DateTime<Utc>),
    /// When the admission happens: its history entry and notifications carry this time.
    pub at: DateTime<Utc>,
}

const LOCK: &str = "UPDATE teams SET admissions = admissions + 1 WHERE id = $1";
/// Where the team stands, in one statement (one round trip) after the lock: its grant, the
/// quota line, the user's units on it, the team's units at high priority on it, and its
/// budget. A statement of its own, not the lock's `RETURNING`: on PostgreSQL (read
/// committed) a statement that waited for the lock reads with the snapshot it started
/// with, which would miss the admission it waited for; this one starts after.
const STANDING: &str = concat!(
    "SELECT t.high_priority, t.high_cap, q.model, q.guaranteed, q.limit_units, \
    q.per_user, q.used, \
    (SELECT u.used FROM user_usage u WHERE u.team_id = $1 AND u.model = $2 AND u.user_id = $3), \
    (SELECT CAST(COALESCE(SUM(a.units), 0) AS BIGINT) FROM allocations a \
     WHERE a.team_id = $1 AND a.model = $2 AND a.priority = 'high' AND a.state IN ",
    live_states!(),
    "), b.monthly_minor, b.hard \
    FROM teams t LEFT JOIN quotas q ON q.team_id = t.id AND q.model = $2 \
    LEFT JOIN budgets b ON b.team_id = t.id WHERE t.id = $1"
);

/// [`STANDING`]'s columns.
type StandingCols = (
    bool,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    i64,
    Option<i64>,
    Option<bool>,
);
const OPEN: &str = "SELECT a.kind, a.count, a.priority, a.state, a.duration_minutes, a.active_at, \
    a.ends_at, (SELECT CAST(COALESCE(SUM(l.amount_minor), 0) AS BIGINT) FROM ledger_entries l \
    WHERE l.allocation_id = a.id AND l.account <> 'platform') AS posted \
    FROM allocations a WHERE a.team_id = $1 AND a.state IN ('queued', 'placing', 'active')";
const MONTH_SPENT: &str = "SELECT CAST(COALESCE(SUM(amount_minor), 0) AS BIGINT) FROM ledger_entries \
    WHERE account <> 'platform' AND team_id = $1 AND hour_start >= $2 AND hour_start < $3";

/// Inserts `$row` with its overrides and first history entry, in `$tx`; `false` on a
/// duplicate idempotency key.
macro_rules! insert {
    ($tx:expr, $row:expr, $actor:expr, $over:expr) => {{
        let row: &AllocationRow = $row;
        match bind_insert!(sqlx::query(INSERT), row)
            .execute(&mut *$tx)
            .await
        {
            Ok(_) => {
                let (over_limit, over_budget): (bool, bool) = $over;
                // Both columns default to false: written only for an override.
                if over_limit || over_budget {
                    sqlx::query(
                        "UPDATE allocations SET over_limit = $2, over_budget = $3 WHERE id = $1",
                    )
                    .bind(row.id.0)
                    .bind(over_limit)
                    .bind(over_budget)
                    .execute(&mut *$tx)
                    .await?;
                }
                sqlx::query(EVENT)
                    .bind(row.id.0)
                    .bind(row.created_at)
                    .bind(None::<String>)
                    .bind(row.state.as_str())
                    .bind($actor)
                    .bind(None::<String>)
                    .execute(&mut *$tx)
                    .await?;
                true
            }
            Err(e) if is_unique_violation(&e) => false,
            Err(e) => return Err(e.into()),
        }
    }};
}

/// Counts `$row`'s units on the team's and the user's counters, in `$tx` (the rule has
/// checked them under the lock).
macro_rules! hold {
    ($tx:expr, $row:expr) => {{
        let row: &AllocationRow = $row;
        sqlx::query(TEAM_ADD)
            .bind(row.team_id.0)
            .bind(&row.model)
            .bind(row.units)
            .execute(&mut *$tx)
            .await?;
        sqlx::query(USER_ADD)
            .bind(row.team_id.0)
            .bind(&row.model)
            .bind(row.user_id.0)
            .bind(row.units)
            .execute(&mut *$tx)
            .await?;
    }};
}

impl Store {
    /// Admits `what` on `line` if `rule` says so, all in one transaction under the team's
    /// admission lock (module docs).
    pub async fn admit(
        &self,
        line: Line<'_>,
        what: Admit<'_>,
        rule: impl FnOnce(&Standing) -> Verdict,
    ) -> Result<Admitted, StoreError> {
        let result: Result<Admitted, sqlx::Error> = in_tx!(self, tx => {
            let locked = sqlx::query(LOCK).bind(line.team.0).execute(&mut *tx).await?.rows_affected();
            if locked != 1 {
                tx.rollback().await?;
                return Ok(Admitted::Refused(AppError::NotFound));
            }
            let concerned = match &what {
                Admit::Insert { .. } => None,
                Admit::Waiting { id, .. } | Admit::Extend { id, .. } => {
                    let sql = format!("SELECT {COLS} FROM allocations a WHERE a.id = $1");
                    let row = sqlx::query_as::<_, AllocationRow>(&sql).bind(id.0)
                        .fetch_optional(&mut *tx).await?;
                    let expected = match &what {
                        Admit::Extend { old_end, .. } => row.as_ref().is_some_and(|r| {
                            r.state == AllocState::Active && r.ends_at == Some(*old_end)
                                && r.preempt_at.is_none()
                        }),
                        _ => row.as_ref().is_some_and(|r| r.state == AllocState::PendingApproval),
                    };
                    if !expected {
                        tx.rollback().await?;
                        return Ok(Admitted::Moved);
                    }
                    row
                }
            };
            let (high, cap, q_model, guaranteed, limit_units, per_user, used, user_used,
                 high_used, monthly_minor, hard) = sqlx::query_as::<_, StandingCols>(STANDING)
                .bind(line.team.0).bind(line.model).bind(line.user.0)
                .fetch_one(&mut *tx).await?;
            let quota = q_model.map(|model| QuotaRow {
                team_id: line.team,
                model,
                guaranteed: guaranteed.unwrap_or(0),
                limit_units: limit_units.unwrap_or(0),
                per_user: per_user.unwrap_or(0),
                used: used.unwrap_or(0),
            });
            let user_used = user_used.unwrap_or(0);
            let budget = monthly_minor.zip(hard).map(|(monthly_minor, hard)| BudgetRow {
                team_id: line.team,
                monthly_minor,
                hard,
            });
            let (month_spent, open) = if budget.as_ref().is_some_and(|b| b.hard) {
                let spent = sqlx::query_scalar::<_, i64>(MONTH_SPENT).bind(line.team.0)
                    .bind(line.month.0).bind(line.month.1).fetch_one(&mut *tx).await?;
                let open = sqlx::query_as::<_, OpenAllocation>(OPEN).bind(line.team.0)
                    .fetch_all(&mut *tx).await?;
                (spent, open)
            } else {
                (0, Vec::new())
            };
            let standing = Standing {
                allocation: concerned,
                quota,
                user_used,
                high_used,
                high_grant: high.then_some(cap),
                budget,
                month_spent,
                open,
            };
            let (over_limit, over_budget) = match rule(&standing) {
                Verdict::Refused(e) => {
                    tx.rollback().await?;
                    return Ok(Admitted::Refused(e));
                }
                Verdict::NeedsApproval { by, reason } => {
                    match &what {
                        Admit::Insert { row, actor } => {
                            let mut row = (*row).clone();
                            row.state = AllocState::PendingApproval;
                            row.approver = Some(by);
                            row.approval_reason = Some(reason.clone());
                            if !insert!(tx, &row, *actor, (false, false)) {
                                tx.rollback().await?;
                                return Ok(Admitted::Duplicate);
                            }
                            super::outbox::request_event!(tx, row.id,
                                EventKind::RequestNeedsApproval, Some(reason.as_str()),
                                Some(by.as_str()), line.at);
                        }
                        Admit::Waiting { id, .. } => {
                            let was = standing.allocation.as_ref().and_then(|r| r.approver);
                            let n = sqlx::query("UPDATE allocations SET approver = $2, approval_reason = $3 \
                                         WHERE id = $1 AND state = 'pending_approval'")
                                .bind(id.0).bind(by.as_str()).bind(&reason)
                                .execute(&mut *tx).await?.rows_affected();
                            if n == 1 && was != Some(by) {
                                // It goes on to other approvers: tell them.
                                super::outbox::request_event!(tx, *id,
                                    EventKind::RequestNeedsApproval, Some(reason.as_str()),
                                    Some(by.as_str()), line.at);
                            }
                        }
                        Admit::Extend { .. } => {
                            tx.rollback().await?;
                            return Ok(Admitted::Waits { by, reason });
                        }
                    }
                    tx.commit().await?;
                    return Ok(Admitted::Waits { by, reason });
                }
                Verdict::Admit { over_limit, over_budget } => (over_limit, over_budget),
            };
            match &what {
                Admit::Insert { row, actor } => {
                    let mut row = (*row).clone();
                    row.state = AllocState::Queued;
                    if !insert!(tx, &row, *actor, (over_limit, over_budget)) {
                        tx.rollback().await?;
                        return Ok(Admitted::Duplicate);
                    }
                    hold!(tx, &row);
                }
                Admit::Waiting { id, actor, note, approval_reason } => {
                    let sql = "UPDATE allocations SET state = 'queued', \
                               approval_reason = COALESCE($2, approval_reason), \
                               over_limit = $3, over_budget = $4 \
                               WHERE id = $1 AND state = 'pending_approval'";
                    let n = sqlx::query(sql).bind(id.0).bind(*approval_reason).bind(over_limit)
                        .bind(over_budget).execute(&mut *tx).await?.rows_affected();
                    let Some(row) = standing.allocation.as_ref().filter(|_| n == 1) else {
                        tx.rollback().await?;
                        return Ok(Admitted::Moved);
                    };
                    hold!(tx, row);
                    sqlx::query(EVENT).bind(id.0).bind(line.at).bind("pending_approval")
                        .bind("queued").bind(*actor).bind(*note).execute(&mut *tx).await?;
                    super::outbox::request_event!(tx, *id, EventKind::RequestApproved, *note, None, line.at);
                }
                Admit::Extend { id, old_end, new_end, actor, note } => {
                    let sql = "UPDATE allocations SET ends_at = $2, \
                               over_budget = over_budget OR $4 WHERE id = $1 \
                               AND state = 'active' AND ends_at = $3 AND preempt_at IS NULL";
                    let n = sqlx::query(sql).bind(id.0).bind(*new_end).bind(*old_end)
                        .bind(over_budget).execute(&mut *tx).await?.rows_affected();
                    if n != 1 {
                        tx.rollback().await?;
                        return Ok(Admitted::Moved);
                    }
                    sqlx::query(EVENT).bind(id.0).bind(line.at).bind("active").bind("active")
                        .bind(*actor).bind(*note).execute(&mut *tx).await?;
                }
            }
            Admitted::Held { over_limit, over_budget }
        });
        from_driver(result)
    }
}
