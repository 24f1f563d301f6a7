//! `bookings`: capacity a team holds for a future window (docs/operations.md).

use super::{NullableId, Store, StoreError, db, in_tx, undecodable};
use chrono::{DateTime, Utc};
use tessera_domain::alloc::GpuKind;
use tessera_domain::booking::Held;
use tessera_domain::error::AppError;
use tessera_domain::ids::{AllocationId, TeamId, UserId};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct BookingRow {
    pub id: Uuid,
    #[sqlx(try_from = "Uuid")]
    pub team_id: TeamId,
    #[sqlx(try_from = "Uuid")]
    pub user_id: UserId,
    #[sqlx(try_from = "String")]
    pub kind: GpuKind,
    pub model: String,
    pub count: i64,
    pub units: i64,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub purpose: String,
    pub created_at: DateTime<Utc>,
    pub cancelled_at: Option<DateTime<Utc>>,
    #[sqlx(try_from = "NullableId")]
    pub allocation_id: Option<AllocationId>,
}

/// A booking with the names its views show.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct BookingListRow {
    #[sqlx(flatten)]
    pub b: BookingRow,
    pub team_name: String,
    pub username: String,
}

const COLS: &str = "b.id, b.team_id, b.user_id, b.kind, b.model, b.count, b.units, b.starts_at, \
    b.ends_at, b.purpose, b.created_at, b.cancelled_at, b.allocation_id";
const LOCK: &str = "INSERT INTO booking_locks (model, n) VALUES ($1, 1) \
    ON CONFLICT (model) DO UPDATE SET n = booking_locks.n + 1";
/// Bookings that overlap `[$2, $3)`; `$4` (the start less the longest a booking may be)
/// bounds the index scan on `(model, starts_at)`.
const OVERLAPPING: &str = "SELECT team_id, starts_at, ends_at, units FROM bookings \
    WHERE model = $1 AND starts_at >= $4 AND starts_at < $3 AND ends_at > $2 \
    AND cancelled_at IS NULL";

/// Where a new booking's team stands, read under the model's booking lock.
#[derive(Debug, Clone)]
pub struct BookingStanding {
    /// The team's limit on the model's line; `None` without a line.
    pub team_limit: Option<i64>,
    /// Live bookings of the model that overlap the window (every team's).
    pub held: Vec<Held>,
}

impl Store {
    /// Admits `row` in one transaction: bookings of its model are admitted one at a time
    /// (the lock row), the overlapping ones and the team's limit are read, `rule` decides,
    /// and the booking is stored only when it allows. `longest`: no booking is longer.
    pub async fn book(
        &self,
        row: &BookingRow,
        longest: chrono::Duration,
        rule: impl FnOnce(&BookingStanding) -> Result<(), AppError>,
    ) -> Result<Result<(), AppError>, StoreError> {
        in_tx!(self, tx => {
            sqlx::query(LOCK).bind(&row.model).execute(&mut *tx).await?;
            let held: Vec<(Uuid, DateTime<Utc>, DateTime<Utc>, i64)> = sqlx::query_as(OVERLAPPING)
                .bind(&row.model).bind(row.starts_at).bind(row.ends_at)
                .bind(row.starts_at - longest)
                .fetch_all(&mut *tx).await?;
            let team_limit: Option<i64> = sqlx::query_scalar(
                "SELECT limit_units FROM quotas WHERE team_id = $1 AND model = $2")
                .bind(row.team_id.0).bind(&row.model)
                .fetch_optional(&mut *tx).await?;
            let standing = BookingStanding {
                team_limit,
                held: held.into_iter().map(|(team, starts_at, ends_at, units)| {
                    // Units no release wrote fail the read, as any other bad value does.
                    let units = u32::try_from(units).map_err(undecodable)?;
                    Ok(Held { team: TeamId(team), starts_at, ends_at, units })
                }).collect::<Result<_, sqlx::Error>>()?,
            };
            if let Err(e) = rule(&standing) {
                tx.rollback().await?;
                return Ok(Err(e));
            }
            sqlx::query(
                "INSERT INTO bookings (id, team_id, user_id, kind, model, count, units, starts_at, \
                 ends_at, purpose, created_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)")
                .bind(row.id).bind(row.team_id.0).bind(row.user_id.0).bind(row.kind.to_string()).bind(&row.model)
                .bind(row.count).bind(row.units).bind(row.starts_at).bind(row.ends_at)
                .bind(&row.purpose).bind(row.created_at)
                .execute(&mut *tx).await?;
            Ok(())
        })
    }

    pub async fn booking(&self, id: Uuid) -> Result<Option<BookingListRow>, StoreError> {
        let sql = format!(
            "SELECT {COLS}, t.name AS team_name, u.username AS username FROM bookings b \
             JOIN teams t ON t.id = b.team_id JOIN users u ON u.id = b.user_id WHERE b.id = $1"
        );
        db!(self, pool => sqlx::query_as::<_, BookingListRow>(&sql).bind(id).fetch_optional(pool).await)
    }

    /// Bookings overlapping `[from, to)`, cancelled ones left out, by start; `model`: only
    /// that model's.
    pub async fn bookings_between(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        model: Option<&str>,
        limit: i64,
    ) -> Result<Vec<BookingListRow>, StoreError> {
        let sql = format!(
            "SELECT {COLS}, t.name AS team_name, u.username AS username FROM bookings b \
             JOIN teams t ON t.id = b.team_id JOIN users u ON u.id = b.user_id \
             WHERE b.cancelled_at IS NULL AND b.ends_at > $1 AND b.starts_at < $2 \
             AND ($3 IS NULL OR b.model = $3) ORDER BY b.starts_at, b.id LIMIT $4"
        );
        db!(self, pool => sqlx::query_as::<_, BookingListRow>(&sql)
            .bind(from).bind(to).bind(model).bind(limit).fetch_all(pool).await)
    }

    /// Cancels a booking that has not ended; its allocation, if it started, is returned
    /// for the caller to release. `None` when it was cancelled or had ended already.
    pub async fn cancel_booking(
        &self,
        id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<Option<Option<AllocationId>>, StoreError> {
        let sql = "UPDATE bookings SET cancelled_at = $2 \
                   WHERE id = $1 AND cancelled_at IS NULL AND ends_at > $2 RETURNING allocation_id";
        let cancelled = db!(self, pool => sqlx::query_scalar::<_, Option<Uuid>>(sql)
            .bind(id).bind(now).fetch_optional(pool).await)?;
        Ok(cancelled.map(|a| a.map(AllocationId)))
    }

    /// Live bookings that start by `until` and have no allocation yet.
    pub async fn bookings_due(
        &self,
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<BookingRow>, StoreError> {
        let sql = format!(
            "SELECT {COLS} FROM bookings b WHERE b.allocation_id IS NULL \
             AND b.cancelled_at IS NULL AND b.starts_at <= $1 AND b.ends_at > $2 \
             ORDER BY b.starts_at, b.id"
        );
        db!(self, pool => sqlx::query_as::<_, BookingRow>(&sql)
            .bind(until).bind(now).fetch_all(pool).await)
    }

    /// Live bookings that have their allocation (started, or about to), by model.
    pub async fn bookings_started(
        &self,
        now: DateTime<Utc>,
    ) -> Result<Vec<BookingRow>, StoreError> {
        let sql = format!(
            "SELECT {COLS} FROM bookings b WHERE b.allocation_id IS NOT NULL \
             AND b.cancelled_at IS NULL AND b.ends_at > $1 ORDER BY b.starts_at, b.id"
        );
        db!(self, pool => sqlx::query_as::<_, BookingRow>(&sql).bind(now).fetch_all(pool).await)
    }

    /// Records the allocation that holds a booking (once).
    pub async fn link_booking(
        &self,
        id: Uuid,
        allocation: AllocationId,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE bookings SET allocation_id = $2 WHERE id = $1 AND allocation_id IS NULL";
        db!(self, pool => sqlx::query(sql).bind(id).bind(allocation.0).execute(pool).await
            .map(|r| r.rows_affected() == 1))
    }

    /// Warns an active allocation that booking `booking` takes its capacity at `at`.
    pub async fn set_preempt_for_booking(
        &self,
        id: AllocationId,
        at: DateTime<Utc>,
        booking: Uuid,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let sql = "UPDATE allocations SET preempt_at = $2, preempt_cause = NULL, preempt_booking = $3 \
                   WHERE id = $1 AND state = 'active'";
        in_tx!(self, tx => {
            let moved = sqlx::query(sql).bind(id.0).bind(at).bind(booking)
                .execute(&mut *tx).await?.rows_affected() == 1;
            if moved {
                super::outbox::allocation_event!(tx, id,
                    tessera_domain::notify::EventKind::PreemptionWarning, Some(at),
                    Some(tessera_domain::notify::preempt_cause_words(tessera_domain::alloc::PreemptCause::Booking)),
                    Some(format!("preempt:{id}:{}", at.timestamp_micros())), now);
            }
        })
    }

    /// Withdraws the warnings a cancelled booking gave borrowers.
    pub async fn withdraw_booking_warnings(&self, booking: Uuid) -> Result<u64, StoreError> {
        let sql = "UPDATE allocations SET preempt_at = NULL, preempt_booking = NULL \
                   WHERE preempt_booking = $1 AND state = 'active'";
        db!(self, pool => sqlx::query(sql).bind(booking).execute(pool).await
            .map(|r| r.rows_affected()))
    }
}
