//! `drains`: nodes and GPUs a platform admin takes out of placement (docs/operations.md).

use super::{NullableId, Store, StoreError, db};
use chrono::{DateTime, Utc};
use tessera_domain::ids::{NodeId, UserId};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DrainRow {
    #[sqlx(try_from = "Uuid")]
    pub node_id: NodeId,
    /// `''`: the whole node.
    pub gpu_uuid: String,
    pub deadline: DateTime<Utc>,
    pub reason: String,
    #[sqlx(try_from = "NullableId")]
    pub created_by: Option<UserId>,
    pub created_at: DateTime<Utc>,
    /// Not an admin's drain: the GPU turned unhealthy ([`Store::out_of_service`]).
    #[sqlx(skip)]
    pub health: bool,
}

impl DrainRow {
    /// Whether it covers `gpu` of `node`.
    pub fn covers(&self, node: NodeId, gpu: &str) -> bool {
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
            .bind(r.node_id.0).bind(&r.gpu_uuid).bind(r.deadline).bind(&r.reason)
            .bind(r.created_by.map(|u| u.0)).bind(r.created_at)
            .execute(pool).await.map(|_| ()))
    }

    /// Ends the drains of a node: all of them (`gpu` `None`) or one GPU's. How many ended.
    pub async fn clear_drain(&self, node: NodeId, gpu: Option<&str>) -> Result<u64, StoreError> {
        match gpu {
            None => db!(self, pool => sqlx::query("DELETE FROM drains WHERE node_id = $1")
                .bind(node.0).execute(pool).await.map(|r| r.rows_affected())),
            Some(g) => db!(self, pool => sqlx::query(
                "DELETE FROM drains WHERE node_id = $1 AND gpu_uuid = $2")
                .bind(node.0).bind(g).execute(pool).await.map(|r| r.rows_affected())),
        }
    }

    /// What is out of service: every drain, and every unhealthy GPU as a drain of that
    /// GPU due `grace` after it turned unhealthy (`health` set, `reason` the fault).
    pub async fn out_of_service(
        &self,
        grace: chrono::Duration,
    ) -> Result<Vec<DrainRow>, StoreError> {
        let mut out = self.drains().await?;
        out.extend(self.unhealthy_gpus().await?.into_iter().filter_map(|h| {
            let since = h.unhealthy_since?;
            Some(DrainRow {
                node_id: h.node_id,
                gpu_uuid: h.gpu_uuid,
                deadline: since + grace,
                reason: h.reason.unwrap_or_default(),
                created_by: None,
                created_at: since,
                health: true,
            })
        }));
        Ok(out)
    }

    /// Every drain (few: one per drained node or GPU).
    pub async fn drains(&self) -> Result<Vec<DrainRow>, StoreError> {
        let sql = format!("SELECT {COLS} FROM drains ORDER BY node_id, gpu_uuid");
        db!(self, pool => sqlx::query_as::<_, DrainRow>(&sql).fetch_all(pool).await)
    }
}
