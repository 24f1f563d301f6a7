//! `rate_cards`, `meter_hours`, `ledger_entries`, `budgets`.
//!
//! A metered (allocation, hour) and its two ledger entries are written in one transaction,
//! and the row's primary key makes a second write of the same hour a no-op: a rerun or a
//! crash at any point never double-charges. Ledger entries are never updated or deleted
//! (triggers refuse it); corrections are reversing entries. Entry and transaction ids are
//! UUIDv7 (time-ordered), so the ledger's indexes grow at their right edge instead of
//! dirtying pages all over them: metering writes an order of magnitude less.

use super::{
    AllocationRow, SampleRow, Store, StoreError, db, in_tx, on_pool, placeholders, undecodable,
};
use chrono::{DateTime, Utc};
use tessera_domain::alloc::{AllocState, GpuKind, PriorityClass};
use tessera_domain::billing::EntryType;
use tessera_domain::ids::NodeId;
use tessera_domain::ids::{AllocationId, TeamId, UserId};
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RateRow {
    pub id: Uuid,
    #[sqlx(try_from = "String")]
    pub kind: GpuKind,
    pub model: String,
    pub price_minor_per_hour: i64,
    pub preemptible_discount_pct: i64,
    pub high_premium_pct: i64,
    pub effective_from: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub created_by: Option<String>,
}

/// One metered (allocation, hour).
#[derive(Debug, Clone)]
pub struct MeterRow {
    pub allocation_id: AllocationId,
    pub hour_start: DateTime<Utc>,
    /// `YYYY-MM-DD` of `hour_start` (UTC), for grouping by day on both backends.
    pub day: String,
    pub team_id: TeamId,
    pub user_id: UserId,
    pub kind: GpuKind,
    pub model: String,
    pub priority: PriorityClass,
    pub count: i64,
    /// MIG or GPU UUIDs, `;`-separated.
    pub resource_id: String,
    pub resource_name: String,
    pub wall_ms: i64,
    pub gpu_ms: i64,
    pub active_gpu_ms: i64,
    pub samples: i64,
    pub rate_id: Option<Uuid>,
    pub list_minor: i64,
    pub billed_minor: i64,
    pub currency: String,
    pub txn_id: Uuid,
    pub metered_at: DateTime<Utc>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LedgerRow {
    pub id: Uuid,
    pub txn_id: Uuid,
    pub account: String,
    #[sqlx(try_from = "Uuid")]
    pub team_id: TeamId,
    pub team_name: String,
    pub amount_minor: i64,
    pub currency: String,
    #[sqlx(try_from = "String")]
    pub entry_type: EntryType,
    #[sqlx(try_from = "Uuid")]
    pub allocation_id: AllocationId,
    pub hour_start: DateTime<Utc>,
    pub posted_at: DateTime<Utc>,
    pub memo: Option<String>,
}

/// Usage summed over a group (day × kind × team × user, or kind × user).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UsageGroupRow {
    pub day: String,
    #[sqlx(try_from = "String")]
    pub kind: GpuKind,
    #[sqlx(try_from = "Uuid")]
    pub team_id: TeamId,
    pub team_name: String,
    #[sqlx(try_from = "Uuid")]
    pub user_id: UserId,
    pub username: String,
    pub allocations: i64,
    pub wall_ms: i64,
    pub gpu_ms: i64,
    pub active_gpu_ms: i64,
    pub list_minor: i64,
    /// Billed cost net of reversals.
    pub cost_minor: i64,
}

/// One team-side ledger entry with what was charged, for the chargeback export. Read as
/// one JSON array per entry, in this field order (see [`Store::charges_after`]).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ChargeRow {
    pub id: Uuid,
    pub hour_start: DateTime<Utc>,
    pub amount_minor: i64,
    pub entry_type: EntryType,
    pub currency: String,
    pub team_id: TeamId,
    pub user_id: UserId,
    pub allocation_id: AllocationId,
    pub kind: GpuKind,
    pub model: String,
    pub priority: PriorityClass,
    pub count: i64,
    pub resource_id: String,
    pub resource_name: String,
    pub wall_ms: i64,
    pub gpu_ms: i64,
    pub list_minor: i64,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct BudgetRow {
    #[sqlx(try_from = "Uuid")]
    pub team_id: TeamId,
    pub monthly_minor: i64,
    pub hard: bool,
}

const METER_COLUMNS: &str = "INSERT INTO meter_hours (allocation_id, hour_start, day, team_id, \
    user_id, kind, model, priority, count, resource_id, resource_name, wall_ms, gpu_ms, \
    active_gpu_ms, samples, rate_id, list_minor, billed_minor, currency, txn_id, metered_at) ";
/// Hours per statement (× 21 parameters, within both backends' limits).
const METER_CHUNK: usize = 400;

const LEDGER_COLUMNS: &str = "INSERT INTO ledger_entries (id, txn_id, account, team_id, \
    amount_minor, currency, entry_type, allocation_id, hour_start, posted_at, memo) ";
/// Entries per statement (× 11 parameters).
const LEDGER_CHUNK: usize = 800;

const LEDGER_INSERT: &str = "INSERT INTO ledger_entries (id, txn_id, account, team_id, \
    amount_minor, currency, entry_type, allocation_id, hour_start, posted_at, memo) \
    VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)";

fn sum(col: &str) -> String {
    format!("CAST(COALESCE(SUM({col}), 0) AS BIGINT)")
}

impl Store {
    // ---- rate cards ----

    pub async fn rates(&self) -> Result<Vec<RateRow>, StoreError> {
        let sql = "SELECT r.id, r.kind, r.model, r.price_minor_per_hour, r.preemptible_discount_pct, \
                   r.high_premium_pct, r.effective_from, r.created_at, u.username AS created_by FROM rate_cards r \
                   LEFT JOIN users u ON u.id = r.created_by ORDER BY r.kind, r.effective_from";
        db!(self, pool => sqlx::query_as::<_, RateRow>(sql).fetch_all(pool).await)
    }

    /// Adds a rate from its `effective_from` on. With `replace`, one of the same kind
    /// starting at the same hour is replaced (the caller allows that only for hours that
    /// have not begun); without, such a clash stores nothing and returns `false`.
    pub async fn set_rate(
        &self,
        r: &RateRow,
        by: UserId,
        replace: bool,
    ) -> Result<bool, StoreError> {
        let insert = "INSERT INTO rate_cards (id, kind, model, price_minor_per_hour, \
                   preemptible_discount_pct, effective_from, created_at, created_by, \
                   high_premium_pct) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)";
        let sql = if replace {
            format!(
                "{insert} ON CONFLICT (kind, effective_from) DO UPDATE SET \
                 price_minor_per_hour = excluded.price_minor_per_hour, \
                 preemptible_discount_pct = excluded.preemptible_discount_pct, \
                 high_premium_pct = excluded.high_premium_pct, \
                 created_at = excluded.created_at, created_by = excluded.created_by"
            )
        } else {
            format!("{insert} ON CONFLICT (kind, effective_from) DO NOTHING")
        };
        let n = on_pool!(self, pool => sqlx::query(&sql).bind(r.id).bind(r.kind.to_string()).bind(&r.model)
            .bind(r.price_minor_per_hour).bind(r.preemptible_discount_pct).bind(r.effective_from)
            .bind(r.created_at).bind(by.0).bind(r.high_premium_pct).execute(pool).await?.rows_affected());
        Ok(n == 1)
    }

    // ---- metering ----

    /// Up to `limit` allocations that were active and are not fully metered yet, in
    /// `(active_at, id)` order after the cursor `after`.
    pub async fn billing_candidates(
        &self,
        after: Option<(DateTime<Utc>, AllocationId)>,
        limit: u32,
    ) -> Result<Vec<AllocationRow>, StoreError> {
        // A row-value cursor (an index range seek on both backends); the first batch
        // starts after (epoch, nil), i.e. at the beginning.
        let sql = format!(
            "SELECT {} FROM allocations a WHERE a.active_at IS NOT NULL AND a.billing_closed = FALSE \
             AND (a.active_at, a.id) > ($1, $2) ORDER BY a.active_at, a.id LIMIT $3",
            super::allocations::COLS
        );
        let (at, id) = after.unwrap_or((DateTime::<Utc>::UNIX_EPOCH, AllocationId(Uuid::nil())));
        db!(self, pool => sqlx::query_as::<_, AllocationRow>(&sql).bind(at).bind(id.0)
            .bind(i64::from(limit)).fetch_all(pool).await)
    }

    /// `(id, username)` of every user.
    pub async fn user_names(&self) -> Result<Vec<(UserId, String)>, StoreError> {
        self.names("SELECT id, username FROM users").await
    }

    /// `(id, name)` of every team.
    pub async fn team_names(&self) -> Result<Vec<(TeamId, String)>, StoreError> {
        self.names("SELECT id, name FROM teams").await
    }

    /// `(id, name)` pairs read by `sql`, the id as its type.
    async fn names<I: From<Uuid>>(&self, sql: &str) -> Result<Vec<(I, String)>, StoreError> {
        let rows =
            db!(self, pool => sqlx::query_as::<_, (Uuid, String)>(sql).fetch_all(pool).await)?;
        Ok(rows
            .into_iter()
            .map(|(id, name)| (I::from(id), name))
            .collect())
    }

    /// `(allocation, at, to_state)` of every history entry of `ids`, in order.
    pub async fn histories(
        &self,
        ids: &[AllocationId],
    ) -> Result<Vec<(AllocationId, DateTime<Utc>, AllocState)>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT allocation_id, at, to_state FROM allocation_events WHERE allocation_id IN ({}) \
             ORDER BY allocation_id, seq",
            placeholders(1, ids.len())
        );
        on_pool!(self, pool => {
            let mut q = sqlx::query_as::<_, (Uuid, DateTime<Utc>, String)>(&sql);
            for id in ids {
                q = q.bind(id.0);
            }
            q.fetch_all(pool).await
        })?
        .into_iter()
        .map(|(id, at, to)| Ok((AllocationId(id), at, super::decoded(to)?)))
        .collect()
    }

    /// The hours of `ids` metered already.
    pub async fn metered_hours(
        &self,
        ids: &[AllocationId],
    ) -> Result<Vec<(AllocationId, DateTime<Utc>)>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT allocation_id, hour_start FROM meter_hours WHERE allocation_id IN ({})",
            placeholders(1, ids.len())
        );
        let rows = db!(self, pool => {
            let mut q = sqlx::query_as::<_, (Uuid, DateTime<Utc>)>(&sql);
            for id in ids {
                q = q.bind(id.0);
            }
            q.fetch_all(pool).await
        })?;
        Ok(rows
            .into_iter()
            .map(|(id, hour)| (AllocationId(id), hour))
            .collect())
    }

    /// A node's telemetry samples taken in `[from, to)`.
    pub async fn samples_between(
        &self,
        node: NodeId,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<SampleRow>, StoreError> {
        let sql = "SELECT seq, at, payload FROM telemetry_samples WHERE node_id = $1 \
                   AND at >= $2 AND at < $3 ORDER BY at";
        db!(self, pool => sqlx::query_as::<_, SampleRow>(sql).bind(node.0).bind(from).bind(to).fetch_all(pool).await)
    }

    /// Writes metered hours of one allocation and their ledger entries in one transaction;
    /// an hour metered before is skipped with its entries. With `close`, the allocation is
    /// marked fully metered in the same transaction. Returns the hours written.
    pub async fn write_meter(
        &self,
        allocation: AllocationId,
        rows: &[MeterRow],
        close: bool,
        now: DateTime<Utc>,
    ) -> Result<u32, StoreError> {
        in_tx!(self, tx => {
            let mut written = 0u32;
            // Multi-row statements: hours in chunks (21 parameters each), then the entries
            // of the hours actually inserted (`RETURNING` names only those).
            for chunk in rows.chunks(METER_CHUNK) {
                let mut q = sqlx::QueryBuilder::new(METER_COLUMNS);
                q.push_values(chunk, |mut b, m| {
                    b.push_bind(m.allocation_id.0).push_bind(m.hour_start).push_bind(&m.day)
                        .push_bind(m.team_id.0).push_bind(m.user_id.0).push_bind(m.kind.to_string())
                        .push_bind(&m.model).push_bind(m.priority.as_str()).push_bind(m.count)
                        .push_bind(&m.resource_id).push_bind(&m.resource_name).push_bind(m.wall_ms)
                        .push_bind(m.gpu_ms).push_bind(m.active_gpu_ms).push_bind(m.samples)
                        .push_bind(m.rate_id).push_bind(m.list_minor).push_bind(m.billed_minor)
                        .push_bind(&m.currency).push_bind(m.txn_id).push_bind(m.metered_at);
                });
                q.push(" ON CONFLICT (allocation_id, hour_start) DO NOTHING RETURNING hour_start");
                let inserted: std::collections::HashSet<DateTime<Utc>> = q
                    .build_query_scalar::<DateTime<Utc>>()
                    .fetch_all(&mut *tx)
                    .await?
                    .into_iter()
                    .collect();
                let entries: Vec<(&MeterRow, tessera_domain::billing::Posting)> = chunk
                    .iter()
                    .filter(|m| inserted.contains(&m.hour_start))
                    .flat_map(|m| {
                        tessera_domain::billing::charge(m.team_id, m.billed_minor)
                            .map(|p| (m, p))
                    })
                    .collect();
                written += u32::try_from(entries.len() / 2).unwrap_or(u32::MAX);
                for part in entries.chunks(LEDGER_CHUNK) {
                    let mut q = sqlx::QueryBuilder::new(LEDGER_COLUMNS);
                    q.push_values(part, |mut b, (m, p)| {
                        b.push_bind(Uuid::now_v7()).push_bind(m.txn_id).push_bind(p.account.key())
                            .push_bind(m.team_id.0).push_bind(p.amount_minor).push_bind(&m.currency)
                            .push_bind(EntryType::Charge.as_str()).push_bind(m.allocation_id.0).push_bind(m.hour_start)
                            .push_bind(m.metered_at).push_bind(None::<String>);
                    });
                    q.build().execute(&mut *tx).await?;
                }
            }
            // Budget thresholds this spend reached are told to team admins, in this
            // transaction (docs/notifications.md).
            let mut months: Vec<(TeamId, chrono::NaiveDate)> = rows
                .iter()
                .filter(|m| m.billed_minor != 0)
                .map(|m| (m.team_id, tessera_domain::billing::month_of(m.hour_start)))
                .collect();
            months.sort();
            months.dedup();
            if written > 0 {
                for (team, month) in months {
                    super::outbox::budget_events!(tx, team.0, month, now);
                }
            }
            if close {
                sqlx::query("UPDATE allocations SET billing_closed = TRUE WHERE id = $1")
                    .bind(allocation.0).execute(&mut *tx).await?;
            }
            written
        })
    }

    // ---- ledger ----

    /// Posts the reversal of the charge `txn` (both entries negated, one new transaction);
    /// `None` if there is no such charge, `Some(false)` if it was reversed before.
    pub async fn reverse_charge(
        &self,
        txn: Uuid,
        at: DateTime<Utc>,
        memo: &str,
    ) -> Result<Option<(bool, Vec<LedgerRow>)>, StoreError> {
        let charge = self.ledger_txn(txn).await?;
        if charge.is_empty() || charge.iter().any(|e| e.entry_type != EntryType::Charge) {
            return Ok(None);
        }
        let reversal = Uuid::now_v7();
        let done = self.insert_reversal(&charge, reversal, at, memo).await?;
        Ok(Some((
            done,
            if done {
                self.ledger_txn(reversal).await?
            } else {
                Vec::new()
            },
        )))
    }

    async fn insert_reversal(
        &self,
        charge: &[LedgerRow],
        reversal: Uuid,
        at: DateTime<Utc>,
        memo: &str,
    ) -> Result<bool, sqlx::Error> {
        in_tx!(self, tx => {
            for e in charge {
                let r = sqlx::query(LEDGER_INSERT).bind(Uuid::now_v7()).bind(reversal)
                    .bind(&e.account).bind(e.team_id.0).bind(-e.amount_minor).bind(&e.currency)
                    .bind(EntryType::Reversal.as_str()).bind(e.allocation_id.0).bind(e.hour_start).bind(at)
                    .bind(memo).execute(&mut *tx).await;
                match r {
                    Ok(_) => {}
                    Err(sqlx::Error::Database(d)) if d.is_unique_violation() => {
                        tx.rollback().await?;
                        return Ok(false);
                    }
                    Err(e) => return Err(e),
                }
            }
            true
        })
    }

    pub async fn ledger_txn(&self, txn: Uuid) -> Result<Vec<LedgerRow>, StoreError> {
        let sql = "SELECT le.id, le.txn_id, le.account, le.team_id, t.name AS team_name, le.amount_minor, \
                   le.currency, le.entry_type, le.allocation_id, le.hour_start, le.posted_at, le.memo \
                   FROM ledger_entries le JOIN teams t ON t.id = le.team_id WHERE le.txn_id = $1 ORDER BY le.account";
        db!(self, pool => sqlx::query_as::<_, LedgerRow>(sql).bind(txn).fetch_all(pool).await)
    }

    /// A page of ledger entries for hours in `[from, to)`, newest first; `team`: only the
    /// entries of that team's transactions (both sides).
    pub async fn ledger_page(
        &self,
        team: Option<TeamId>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        offset: u32,
        limit: u32,
    ) -> Result<(Vec<LedgerRow>, i64), StoreError> {
        let filter =
            "WHERE le.hour_start >= $1 AND le.hour_start < $2 AND ($3 IS NULL OR le.team_id = $3)";
        let sql = format!(
            "SELECT le.id, le.txn_id, le.account, le.team_id, t.name AS team_name, le.amount_minor, \
             le.currency, le.entry_type, le.allocation_id, le.hour_start, le.posted_at, le.memo \
             FROM ledger_entries le JOIN teams t ON t.id = le.team_id {filter} \
             ORDER BY le.hour_start DESC, le.posted_at DESC, le.txn_id, le.account LIMIT $4 OFFSET $5"
        );
        let count = format!("SELECT COUNT(*) FROM ledger_entries le {filter}");
        on_pool!(self, pool => {
            let rows = sqlx::query_as::<_, LedgerRow>(&sql).bind(from).bind(to).bind(team.map(|v| v.0))
                .bind(i64::from(limit)).bind(i64::from(offset)).fetch_all(pool).await?;
            let total = sqlx::query_scalar::<_, i64>(&count).bind(from).bind(to).bind(team.map(|v| v.0))
                .fetch_one(pool).await?;
            Ok((rows, total))
        })
    }

    /// What teams were charged for hours in `[from, to)` (net of reversals), per team.
    pub async fn team_charges(
        &self,
        team: Option<TeamId>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<Vec<(TeamId, i64)>, StoreError> {
        let sql = format!(
            "SELECT team_id, {} FROM ledger_entries WHERE account <> 'platform' \
             AND hour_start >= $1 AND hour_start < $2 AND ($3 IS NULL OR team_id = $3) GROUP BY team_id",
            sum("amount_minor")
        );
        let rows = db!(self, pool => sqlx::query_as::<_, (Uuid, i64)>(&sql).bind(from).bind(to).bind(team.map(|v| v.0)).fetch_all(pool).await)?;
        Ok(rows
            .into_iter()
            .map(|(id, minor)| (TeamId(id), minor))
            .collect())
    }

    /// Reversals posted for hours in `[from, to)` of one team (team side, negative).
    pub async fn team_adjustments(
        &self,
        team: TeamId,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<i64, StoreError> {
        let sql = format!(
            "SELECT {} FROM ledger_entries WHERE account <> 'platform' AND entry_type = 'reversal' \
             AND hour_start >= $1 AND hour_start < $2 AND team_id = $3",
            sum("amount_minor")
        );
        db!(self, pool => sqlx::query_scalar::<_, i64>(&sql).bind(from).bind(to).bind(team.0).fetch_one(pool).await)
    }

    /// `(sum of every entry, number of entries)`: the sum is 0 in a balanced ledger.
    pub async fn ledger_balance(&self) -> Result<(i64, i64), StoreError> {
        let sql = format!(
            "SELECT {}, COUNT(*) FROM ledger_entries",
            sum("amount_minor")
        );
        db!(self, pool => sqlx::query_as::<_, (i64, i64)>(&sql).fetch_one(pool).await)
    }

    // ---- usage ----

    /// Metered usage in `[from, to)`, summed per day × kind × team × user (`by_day`) or per
    /// kind × team × user; cost is net of reversals.
    pub async fn usage_groups(
        &self,
        team: Option<TeamId>,
        user: Option<UserId>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        by_day: bool,
    ) -> Result<Vec<UsageGroupRow>, StoreError> {
        let day = if by_day { "m.day" } else { "''" };
        let group = if by_day { "m.day, " } else { "" };
        let sql = format!(
            "SELECT {day} AS day, m.kind, m.team_id, t.name AS team_name, m.user_id, u.username, \
             CAST(COUNT(DISTINCT m.allocation_id) AS BIGINT) AS allocations, {} AS wall_ms, \
             {} AS gpu_ms, {} AS active_gpu_ms, {} AS list_minor, {} AS cost_minor \
             FROM meter_hours m JOIN teams t ON t.id = m.team_id JOIN users u ON u.id = m.user_id \
             LEFT JOIN ledger_entries r ON r.allocation_id = m.allocation_id \
               AND r.hour_start = m.hour_start AND r.entry_type = 'reversal' AND r.account <> 'platform' \
             WHERE m.hour_start >= $1 AND m.hour_start < $2 AND ($3 IS NULL OR m.team_id = $3) \
               AND ($4 IS NULL OR m.user_id = $4) \
             GROUP BY {group}m.kind, m.team_id, t.name, m.user_id, u.username",
            sum("m.wall_ms"),
            sum("m.gpu_ms"),
            sum("m.active_gpu_ms"),
            sum("m.list_minor"),
            sum("m.billed_minor + COALESCE(r.amount_minor, 0)"),
        );
        db!(self, pool => sqlx::query_as::<_, UsageGroupRow>(&sql).bind(from).bind(to)
            .bind(team.map(|v| v.0)).bind(user.map(|v| v.0)).fetch_all(pool).await)
    }

    /// Up to `limit` team-side ledger entries for hours in `[from, to)` after the cursor
    /// `(hour, id)`, in `(hour_start, id)` order, with what they charged: the chargeback
    /// export reads the ledger in these pages, so its memory stays constant.
    ///
    /// The database answers each page as one JSON array (one array per entry) rather than
    /// one result row per entry: a driver's cost per row (for SQLite, a message from its
    /// worker thread and a value allocated per column) was most of the export's time.
    #[allow(clippy::too_many_arguments)]
    pub async fn charges_after(
        &self,
        team: Option<TeamId>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        after: Option<(DateTime<Utc>, Uuid)>,
        limit: u32,
    ) -> Result<Vec<ChargeRow>, StoreError> {
        // Each page is a range seek on the (hour_start, id) index, not a rescan: the range
        // starts at the cursor's hour ($1; SQLite seeks on that bound, not on the row
        // value, so a bound at the period's start made every page rescan all pages before
        // it), and the row value skips what that hour's earlier pages had. The first page
        // starts after (from, nil): every entry of the period.
        const PAGE: &str = "FROM (SELECT le.id, le.hour_start, le.amount_minor, le.entry_type, \
               le.currency, le.team_id, le.allocation_id FROM ledger_entries le \
               WHERE le.account <> 'platform' AND le.hour_start >= $1 AND le.hour_start < $2 \
                 AND ($3 IS NULL OR le.team_id = $3) AND (le.hour_start, le.id) > ($4, $5) \
               ORDER BY le.hour_start, le.id LIMIT $6) le \
             JOIN meter_hours m ON m.allocation_id = le.allocation_id AND m.hour_start = le.hour_start";
        let (after_hour, after_id) = after.unwrap_or((from, Uuid::nil()));
        let from = from.max(after_hour);
        // The two backends build the array with their own JSON functions.
        let sql = match self {
            Store::Sqlite(_) => format!(
                "SELECT json_group_array(json_array(hex(le.id), le.hour_start, \
                 le.amount_minor, le.entry_type, le.currency, hex(le.team_id), \
                 hex(m.user_id), hex(le.allocation_id), m.kind, m.model, m.priority, \
                 m.count, m.resource_id, m.resource_name, m.wall_ms, m.gpu_ms, \
                 m.list_minor)) {PAGE}"
            ),
            Store::Postgres(_) => format!(
                "SELECT COALESCE(json_agg(json_build_array(le.id, le.hour_start, \
                 le.amount_minor, le.entry_type, le.currency, le.team_id, m.user_id, \
                 le.allocation_id, m.kind, m.model, m.priority, m.count, m.resource_id, \
                 m.resource_name, m.wall_ms, m.gpu_ms, m.list_minor)), '[]')::TEXT {PAGE}"
            ),
        };
        let json: String = db!(self, pool => sqlx::query_scalar(&sql)
            .bind(from)
            .bind(to)
            .bind(team.map(|v| v.0))
            .bind(after_hour)
            .bind(after_id)
            .bind(i64::from(limit))
            .fetch_one(pool)
            .await)?;
        let mut rows: Vec<ChargeRow> = serde_json::from_str(&json).map_err(undecodable)?;
        // An aggregate's input order is the plan's, not the page's: restore it.
        rows.sort_unstable_by_key(|r| (r.hour_start, r.id));
        Ok(rows)
    }

    // ---- budgets ----

    pub async fn budgets(&self) -> Result<Vec<BudgetRow>, StoreError> {
        let sql = "SELECT team_id, monthly_minor, hard FROM budgets";
        db!(self, pool => sqlx::query_as::<_, BudgetRow>(sql).fetch_all(pool).await)
    }

    pub async fn budget(&self, team: TeamId) -> Result<Option<BudgetRow>, StoreError> {
        let sql = "SELECT team_id, monthly_minor, hard FROM budgets WHERE team_id = $1";
        db!(self, pool => sqlx::query_as::<_, BudgetRow>(sql).bind(team.0).fetch_optional(pool).await)
    }

    /// Sets (`Some`) or removes (`None`) a team's budget.
    pub async fn set_budget(
        &self,
        team: TeamId,
        budget: Option<(i64, bool)>,
        by: UserId,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        match budget {
            Some((monthly, hard)) => {
                let sql = "INSERT INTO budgets (team_id, monthly_minor, hard, updated_at, updated_by) \
                           VALUES ($1,$2,$3,$4,$5) ON CONFLICT (team_id) DO UPDATE SET \
                           monthly_minor = excluded.monthly_minor, hard = excluded.hard, \
                           updated_at = excluded.updated_at, updated_by = excluded.updated_by";
                db!(self, pool => sqlx::query(sql).bind(team.0).bind(monthly).bind(hard).bind(at)
                    .bind(by.0).execute(pool).await.map(|_| ()))
            }
            None => db!(self, pool => sqlx::query("DELETE FROM budgets WHERE team_id = $1")
                    .bind(team.0).execute(pool).await.map(|_| ())),
        }
    }
}
