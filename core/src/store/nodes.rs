//! `nodes`: registered GPU servers and their last reported inventory.

use super::{Store, StoreError, db, on_pool, placeholders};
use chrono::{DateTime, Utc};
use tessera_domain::ids::NodeId;
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct NodeRow {
    #[sqlx(try_from = "Uuid")]
    pub id: NodeId,
    pub hostname: String,
    pub credential_hash: String,
    pub join_token_id: Option<Uuid>,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    pub agent_version: String,
    pub manages_mig: bool,
    pub workload_sandbox: bool,
    /// JSON of `tessera_domain::wire::Inventory`.
    pub inventory: String,
    pub revoked_at: Option<DateTime<Utc>>,
    /// Moves each time `inventory` changes (0 where a query does not read it).
    #[sqlx(default)]
    pub inventory_version: i64,
    /// Its group (a rack or switch) as a platform admin set it (migration 0028).
    #[sqlx(default)]
    pub node_group: Option<String>,
}

const COLS: &str = "id, hostname, credential_hash, join_token_id, registered_at, \
                    last_heartbeat_at, agent_version, manages_mig, inventory, revoked_at, \
                    workload_sandbox, node_group";

/// One heartbeat of a node: when, and what its agent said of itself.
#[derive(Debug, Clone, Copy)]
pub struct Beat<'a> {
    pub id: NodeId,
    pub at: DateTime<Utc>,
    pub agent_version: &'a str,
    pub manages_mig: bool,
    pub workload_sandbox: bool,
}

impl Store {
    pub async fn insert_node(&self, r: &NodeRow) -> Result<(), StoreError> {
        let sql =
            format!("INSERT INTO nodes ({COLS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12)");
        on_pool!(self, pool => sqlx::query(&sql)
            .bind(r.id.0).bind(&r.hostname).bind(&r.credential_hash).bind(r.join_token_id)
            .bind(r.registered_at).bind(r.last_heartbeat_at).bind(&r.agent_version)
            .bind(r.manages_mig).bind(&r.inventory).bind(r.revoked_at).bind(r.workload_sandbox)
            .bind(&r.node_group).execute(pool).await.map(|_| ()))?;
        Ok(())
    }

    /// A node by the hash of its credential (revoked ones included, so they can be logged).
    /// Only what authentication needs (every agent call makes it: the inventory, tens of
    /// kilobytes of JSON, stays in the database). `(id, hostname, revoked_at)`.
    pub async fn node_by_credential(
        &self,
        hash: &str,
    ) -> Result<Option<(NodeId, String, Option<DateTime<Utc>>)>, StoreError> {
        let row: Option<(Uuid, String, Option<DateTime<Utc>>)> = db!(self, pool => sqlx::query_as(
            "SELECT id, hostname, revoked_at FROM nodes WHERE credential_hash = $1")
            .bind(hash).fetch_optional(pool).await)?;
        Ok(row.map(|(id, hostname, revoked)| (NodeId(id), hostname, revoked)))
    }

    /// Sets (or clears) a node's group; `false` when there is no such node.
    pub async fn set_node_group(
        &self,
        id: NodeId,
        group: Option<&str>,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE nodes SET node_group = $2 WHERE id = $1";
        db!(self, pool => sqlx::query(sql).bind(id.0).bind(group).execute(pool).await
            .map(|r| r.rows_affected() == 1))
    }

    pub async fn node(&self, id: NodeId) -> Result<Option<NodeRow>, StoreError> {
        let sql = format!("SELECT {COLS} FROM nodes WHERE id = $1");
        db!(self, pool => sqlx::query_as::<_, NodeRow>(&sql).bind(id.0).fetch_optional(pool).await)
    }

    pub async fn list_nodes(
        &self,
        offset: u32,
        limit: u32,
    ) -> Result<(Vec<NodeRow>, i64), StoreError> {
        let sql = format!(
            "SELECT {COLS} FROM nodes ORDER BY revoked_at IS NOT NULL, hostname, id LIMIT $1 OFFSET $2"
        );
        let rows = on_pool!(self, pool => sqlx::query_as::<_, NodeRow>(&sql)
            .bind(i64::from(limit)).bind(i64::from(offset)).fetch_all(pool).await?);
        let total = on_pool!(self, pool =>
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM nodes").fetch_one(pool).await?);
        Ok((rows, total))
    }

    /// Every node that is not revoked (for the cluster summary and metrics).
    pub async fn active_nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        let sql = format!("SELECT {COLS} FROM nodes WHERE revoked_at IS NULL");
        db!(self, pool => sqlx::query_as::<_, NodeRow>(&sql).fetch_all(pool).await)
    }

    /// Registered, unrevoked nodes without their inventory's text (`inventory` is empty;
    /// `inventory_version` says whether a copy read earlier is still current).
    pub async fn active_nodes_lean(&self) -> Result<Vec<NodeRow>, StoreError> {
        let sql = "SELECT id, hostname, credential_hash, join_token_id, registered_at, \
                   last_heartbeat_at, agent_version, manages_mig, '' AS inventory, revoked_at, \
                   workload_sandbox, inventory_version, node_group FROM nodes WHERE revoked_at IS NULL";
        db!(self, pool => sqlx::query_as::<_, NodeRow>(sql).fetch_all(pool).await)
    }

    /// `(id, inventory_version, inventory)` of the given nodes.
    pub async fn node_inventories(
        &self,
        ids: &[NodeId],
    ) -> Result<Vec<(NodeId, i64, String)>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let sql = format!(
                "SELECT id, inventory_version, inventory FROM nodes WHERE id IN ({})",
                placeholders(1, chunk.len())
            );
            let rows = on_pool!(self, pool => {
                let mut q = sqlx::query_as::<_, (Uuid, i64, String)>(&sql);
                for id in chunk {
                    q = q.bind(id.0);
                }
                q.fetch_all(pool).await
            })?;
            out.extend(rows.into_iter().map(|(id, v, text)| (NodeId(id), v, text)));
        }
        Ok(out)
    }

    /// Records a heartbeat with its inventory; `inventory_version` moves only when the
    /// inventory's text differs from what is stored. The version after, `None` when the
    /// node is unknown or revoked.
    pub async fn record_heartbeat(
        &self,
        beat: &Beat<'_>,
        inventory: &str,
    ) -> Result<Option<i64>, StoreError> {
        db!(self, pool => sqlx::query_scalar::<_, i64>(
            "UPDATE nodes SET last_heartbeat_at = $1, agent_version = $2, manages_mig = $3, \
             inventory = $4, workload_sandbox = $6, \
             inventory_version = inventory_version + CASE WHEN inventory = $4 THEN 0 ELSE 1 END \
             WHERE id = $5 AND revoked_at IS NULL RETURNING inventory_version")
            .bind(beat.at).bind(beat.agent_version).bind(beat.manages_mig).bind(inventory)
            .bind(beat.id.0).bind(beat.workload_sandbox)
            .fetch_optional(pool).await)
    }

    /// Records a heartbeat whose inventory is the one stored at `inventory_version`,
    /// without sending or rewriting the inventory (tens of kilobytes on a big node).
    /// `false` when the stored version moved meanwhile (another replica, a revocation):
    /// the caller then records it with [`Store::record_heartbeat`].
    pub async fn record_heartbeat_unchanged(
        &self,
        beat: &Beat<'_>,
        inventory_version: i64,
    ) -> Result<bool, StoreError> {
        let n = on_pool!(self, pool => sqlx::query(
            "UPDATE nodes SET last_heartbeat_at = $1, agent_version = $2, manages_mig = $3, \
             workload_sandbox = $4 \
             WHERE id = $5 AND revoked_at IS NULL AND inventory_version = $6")
            .bind(beat.at).bind(beat.agent_version).bind(beat.manages_mig)
            .bind(beat.workload_sandbox).bind(beat.id.0).bind(inventory_version)
            .execute(pool).await?.rows_affected());
        Ok(n == 1)
    }

    pub async fn revoke_node(&self, id: NodeId, at: DateTime<Utc>) -> Result<bool, StoreError> {
        let n = on_pool!(self, pool => sqlx::query(
            "UPDATE nodes SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(at).bind(id.0).execute(pool).await?.rows_affected());
        Ok(n == 1)
    }
}
