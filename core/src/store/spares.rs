//! `spares`: per GPU model, how many GPUs platform admins keep as hot spares; and the move
//! of a displaced high-priority allocation onto a replacement (docs/operations.md).

use super::allocations::{EVENT, INSERT, bind_insert};
use super::{AllocationRow, NullableId, Store, StoreError, db, from_driver, in_tx};
use chrono::{DateTime, Utc};
use tessera_domain::ids::{AllocationId, UserId};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SpareRow {
    pub model: String,
    pub gpus: Option<i64>,
    pub percent: Option<i64>,
    #[sqlx(try_from = "NullableId")]
    pub updated_by: Option<UserId>,
    pub updated_at: DateTime<Utc>,
    /// The updater's username (joined).
    #[sqlx(default)]
    pub updated_by_name: Option<String>,
}

impl Store {
    /// Every model's spare rule.
    pub async fn spares(&self) -> Result<Vec<SpareRow>, StoreError> {
        let sql = "SELECT s.model, s.gpus, s.percent, s.updated_by, s.updated_at, \
                   u.username AS updated_by_name FROM spares s \
                   LEFT JOIN users u ON u.id = s.updated_by ORDER BY s.model";
        db!(self, pool => sqlx::query_as::<_, SpareRow>(sql).fetch_all(pool).await)
    }

    /// Sets a model's rule (replacing the one it had).
    pub async fn set_spares(&self, r: &SpareRow) -> Result<(), StoreError> {
        let sql = "INSERT INTO spares (model, gpus, percent, updated_by, updated_at) \
                   VALUES ($1,$2,$3,$4,$5) ON CONFLICT (model) DO UPDATE SET \
                   gpus = excluded.gpus, percent = excluded.percent, \
                   updated_by = excluded.updated_by, updated_at = excluded.updated_at";
        db!(self, pool => sqlx::query(sql)
            .bind(&r.model).bind(r.gpus).bind(r.percent).bind(r.updated_by.map(|u| u.0)).bind(r.updated_at)
            .execute(pool).await.map(|_| ()))
    }

    /// Ends a model's rule; whether it had one.
    pub async fn clear_spares(&self, model: &str) -> Result<bool, StoreError> {
        db!(self, pool => sqlx::query("DELETE FROM spares WHERE model = $1")
            .bind(model).execute(pool).await.map(|r| r.rows_affected() == 1))
    }

    /// Queued allocations that replace a displaced one (placed on spares first).
    pub async fn displaced_queued(&self) -> Result<Vec<AllocationId>, StoreError> {
        let ids = db!(self, pool => sqlx::query_scalar::<_, Uuid>(
            "SELECT id FROM allocations WHERE state = 'queued' AND displaced_from IS NOT NULL")
            .fetch_all(pool).await)?;
        Ok(ids.into_iter().map(AllocationId).collect())
    }

    /// The allocation that replaced `old`, if one did.
    pub async fn replacement_of(
        &self,
        old: AllocationId,
    ) -> Result<Option<AllocationId>, StoreError> {
        let id = db!(self, pool => sqlx::query_scalar::<_, Uuid>(
            "SELECT id FROM allocations WHERE displaced_from = $1")
            .bind(old.0).fetch_optional(pool).await)?;
        Ok(id.map(AllocationId))
    }

    /// In one transaction: the active allocation `old` ends as preempted (`note` says why)
    /// and `new` (queued, same team, user, model and units) takes its place, marked as
    /// displaced from it. The quota counters do not move: the units pass from one to the
    /// other. `false` (nothing written) when `old` was no longer active.
    pub async fn displace(
        &self,
        old: AllocationId,
        new: &AllocationRow,
        note: &str,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let result: Result<bool, sqlx::Error> = in_tx!(self, tx => {
            let moved: Option<(Uuid, Uuid, String, i64)> = sqlx::query_as(
                "UPDATE allocations SET state = 'preempted', release_cause = 'preempted', \
                 preempt_at = NULL, preempt_cause = NULL \
                 WHERE id = $1 AND state = 'active' RETURNING team_id, user_id, model, units")
                .bind(old.0).fetch_optional(&mut *tx).await?;
            let Some((team, user, model, units)) = moved else {
                tx.rollback().await?;
                return Ok(false);
            };
            if (team, user, model.as_str(), units) != (new.team_id.0, new.user_id.0, new.model.as_str(), new.units) {
                tx.rollback().await?;
                return Err(StoreError(sqlx::Error::Protocol(
                    "a replacement must hold what it replaces".into(),
                )));
            }
            sqlx::query(EVENT).bind(old.0).bind(at).bind("active").bind("releasing")
                .bind(None::<String>).bind(note).execute(&mut *tx).await?;
            sqlx::query(EVENT).bind(old.0).bind(at).bind("releasing").bind("preempted")
                .bind(None::<String>).bind(None::<String>).execute(&mut *tx).await?;
            super::outbox::allocation_event!(tx, old,
                tessera_domain::notify::EventKind::Preempted, None, Some(note), None, at);
            bind_insert!(sqlx::query(INSERT), new).execute(&mut *tx).await?;
            sqlx::query("UPDATE allocations SET displaced_from = $2 WHERE id = $1")
                .bind(new.id.0).bind(old.0).execute(&mut *tx).await?;
            let why = format!("replaces {old}, displaced to a hot spare");
            sqlx::query(EVENT).bind(new.id.0).bind(at).bind(None::<String>).bind(new.state.as_str())
                .bind(None::<String>).bind(why).execute(&mut *tx).await?;
            true
        });
        from_driver(result)
    }
}
