//! `drains`: nodes and GPUs a platform admin takes out of placement (docs/operations.md).

use super::{Store, StoreError, db};
use chrono::{DateTime, Utc};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DrainRow {
    pub node_id: Uuid,
    /// `''`: the whole node.
    pub gpu_uuid: String,
    pub deadline: DateTime<Utc>,
    pub reason: String,
    pub created_by: Option<Uuid>,
    pub created_at: DateTime<Utc>,
}

impl DrainRow {
    /// Whether it covers `gpu` of `node`.
    pub fn covers(&self, node: Uuid, gpu: &str) -> bool {
        self.node_id == node && (self.gpu_uuid.is_empty() || self.gpu_uuid == gpu)
    }
}

const COLS: &str = "node_id, gpu_uuid, deadline, reason, created_by, created_at";

impl Store {
    /// Drains `gpu_uuid` ('' = the whole node); a second drain of the same target moves
    /// its deadline and reason.
    pub async fn set_drain(&self, r: &DrainRow) -> Result<(), StoreError> {
        let sql = format!(
            "INSERT INTO drains ({COLS}) VALUES ($1,$2,$3,$4,$5,$6) \
             ON CONFLICT (node_id, gpu_uuid) DO UPDATE SET deadline = excluded.deadline, \
             reason = excluded.reason, created_by = excluded.created_by"
        );
        db!(self, pool => sqlx::query(&sql)
            .bind(r.node_id).bind(&r.gpu_uuid).bind(r.deadline).bind(&r.reason)
            .bind(r.created_by).bind(r.created_at)
            .execute(pool).await.map(|_| ()))
    }

    /// Ends the drains of a node: all of them (`gpu` `None`) or one GPU's. How many ended.
    pub async fn clear_drain(&self, node: Uuid, gpu: Option<&str>) -> Result<u64, StoreError> {
        match gpu {
            None => db!(self, pool => sqlx::query("DELETE FROM drains WHERE node_id = $1")
                .bind(node).execute(pool).await.map(|r| r.rows_affected())),
            Some(g) => db!(self, pool => sqlx::query(
                "DELETE FROM drains WHERE node_id = $1 AND gpu_uuid = $2")
                .bind(node).bind(g).execute(pool).await.map(|r| r.rows_affected())),
        }
    }

    /// Every drain (few: one per drained node or GPU).
    pub async fn drains(&self) -> Result<Vec<DrainRow>, StoreError> {
        let sql = format!("SELECT {COLS} FROM drains ORDER BY node_id, gpu_uuid");
        db!(self, pool => sqlx::query_as::<_, DrainRow>(&sql).fetch_all(pool).await)
    }
}
