//! `gpu_health`: per GPU, the error counters a platform admin last cleared at and since
//! when it is unhealthy (docs/operations.md, "GPU health").

use super::{Store, StoreError, db};
use chrono::{DateTime, Utc};
use tessera_domain::ids::NodeId;
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct HealthRow {
    #[sqlx(try_from = "Uuid")]
    pub node_id: NodeId,
    pub gpu_uuid: String,
    pub xid_base: i64,
    pub ecc_base: i64,
    pub unhealthy_since: Option<DateTime<Utc>>,
    pub reason: Option<String>,
}

const COLS: &str = "node_id, gpu_uuid, xid_base, ecc_base, unhealthy_since, reason";

impl Store {
    /// The health rows of one node.
    pub async fn gpu_health_of(&self, node: NodeId) -> Result<Vec<HealthRow>, StoreError> {
        let sql = format!("SELECT {COLS} FROM gpu_health WHERE node_id = $1");
        db!(self, pool => sqlx::query_as::<_, HealthRow>(&sql).bind(node.0).fetch_all(pool).await)
    }

    /// Every unhealthy GPU.
    pub async fn unhealthy_gpus(&self) -> Result<Vec<HealthRow>, StoreError> {
        let sql = format!("SELECT {COLS} FROM gpu_health WHERE unhealthy_since IS NOT NULL");
        db!(self, pool => sqlx::query_as::<_, HealthRow>(&sql).fetch_all(pool).await)
    }

    /// Writes a GPU's row: its baseline, and (when `fault` is set and it is not already
    /// unhealthy) since when and why it is unhealthy. `true` when it turned unhealthy now.
    pub async fn record_gpu_health(
        &self,
        r: &HealthRow,
        fault: Option<(&str, DateTime<Utc>)>,
    ) -> Result<bool, StoreError> {
        let (reason, since) = fault.map_or((None, None), |(r, t)| (Some(r), Some(t)));
        let sql = format!(
            "INSERT INTO gpu_health ({COLS}) VALUES ($1,$2,$3,$4,$5,$6) \
             ON CONFLICT (node_id, gpu_uuid) DO UPDATE SET xid_base = excluded.xid_base, \
             ecc_base = excluded.ecc_base, \
             reason = CASE WHEN gpu_health.unhealthy_since IS NULL THEN excluded.reason \
                      ELSE gpu_health.reason END, \
             unhealthy_since = COALESCE(gpu_health.unhealthy_since, excluded.unhealthy_since) \
             RETURNING unhealthy_since"
        );
        let now: Option<DateTime<Utc>> = db!(self, pool => sqlx::query_scalar(&sql)
            .bind(r.node_id.0).bind(&r.gpu_uuid).bind(r.xid_base).bind(r.ecc_base)
            .bind(since).bind(reason)
            .fetch_one(pool).await)?;
        // The stored time may have lost sub-microsecond digits (PostgreSQL).
        Ok(match (since, now) {
            (Some(a), Some(b)) => (a - b).num_milliseconds().abs() < 1,
            _ => false,
        })
    }

    /// A platform admin's clear: healthy again, with the counters now as the baseline.
    /// `false` when the GPU was not unhealthy.
    pub async fn clear_gpu_health(
        &self,
        node: NodeId,
        gpu: &str,
        xid_base: i64,
        ecc_base: i64,
    ) -> Result<bool, StoreError> {
        db!(self, pool => sqlx::query(
            "UPDATE gpu_health SET unhealthy_since = NULL, reason = NULL, xid_base = $3, \
             ecc_base = $4 WHERE node_id = $1 AND gpu_uuid = $2 AND unhealthy_since IS NOT NULL")
            .bind(node.0).bind(gpu).bind(xid_base).bind(ecc_base)
            .execute(pool).await.map(|r| r.rows_affected() == 1))
    }
}
