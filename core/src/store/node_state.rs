//! `gpu_desired`, `gpu_apply_status`, `telemetry_samples`.

use super::{
    JsonText, NullableText, Store, StoreError, db, in_tx, json_text, on_node_states, on_pool,
    placeholders,
};
use chrono::{DateTime, Utc};
use tessera_domain::alloc::{AllocatedDevice, GpuKind};
use tessera_domain::ids::{NodeId, UserId};
use tessera_domain::wire::{ApplyStatus, DesiredInstance, MigMode, ShareMethod, TelemetrySample};
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DesiredRow {
    #[sqlx(try_from = "Uuid")]
    pub node_id: NodeId,
    pub gpu_uuid: String,
    #[sqlx(try_from = "String")]
    pub mode: MigMode,
    /// A JSON list of `{profile, start}` in the table.
    #[sqlx(try_from = "JsonText")]
    pub layout: Vec<DesiredInstance>,
    pub version: i64,
    pub updated_at: DateTime<Utc>,
    /// How an admin shared the GPU (`mode` is then `disabled`).
    #[sqlx(try_from = "NullableText")]
    pub sharing: Option<ShareMethod>,
}

/// A share allocation holding part of a shared GPU (placing, active or releasing).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct HeldShareRow {
    pub id: Uuid,
    #[sqlx(try_from = "String")]
    pub kind: GpuKind,
    #[sqlx(try_from = "super::JsonText")]
    pub devices: Vec<AllocatedDevice>,
    pub team_name: String,
}

/// A GPU's desired state with the agent's status for that same version, if any.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DesiredWithStatus {
    #[sqlx(flatten)]
    pub desired: DesiredRow,
    /// The agent's status for `desired.version` (JSON in the table).
    #[sqlx(try_from = "NullableText")]
    pub status: Option<ApplyStatus>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ApplyStatusRow {
    pub gpu_uuid: String,
    pub version: i64,
    /// The agent's status (JSON in the table).
    #[sqlx(try_from = "JsonText")]
    pub status: ApplyStatus,
    pub reported_at: DateTime<Utc>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SampleRow {
    pub seq: i64,
    pub at: DateTime<Utc>,
    /// The sample (JSON in the table; the server writes it from a typed report).
    #[sqlx(try_from = "JsonText")]
    pub payload: TelemetrySample,
}

/// A node that is not revoked, with its newest telemetry sample if it has one (`/metrics`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct NodeLatestSampleRow {
    #[sqlx(try_from = "Uuid")]
    pub id: NodeId,
    pub hostname: String,
    pub registered_at: DateTime<Utc>,
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    /// JSON of `wire::Inventory`.
    pub inventory: String,
    pub telemetry_dropped: i64,
    pub sample_at: Option<DateTime<Utc>>,
    /// The newest sample (JSON in the table).
    #[sqlx(try_from = "NullableText")]
    pub payload: Option<TelemetrySample>,
}

impl Store {
    pub async fn desired_for_node(&self, node: NodeId) -> Result<Vec<DesiredRow>, StoreError> {
        let sql = "SELECT node_id, gpu_uuid, mode, layout, version, updated_at, sharing \
                   FROM gpu_desired WHERE node_id = $1 ORDER BY gpu_uuid";
        db!(self, pool => sqlx::query_as::<_, DesiredRow>(sql).bind(node.0).fetch_all(pool).await)
    }

    /// Shares (`Some(method)`) or unshares one GPU: MIG off, no layout, its version bumped
    /// — only if the GPU's desired state is still at `expected` (`None`: it has none yet)
    /// and no allocation holds the GPU. `None` when either check failed.
    pub async fn set_sharing(
        &self,
        node: NodeId,
        gpu_uuid: &str,
        sharing: Option<ShareMethod>,
        expected: Option<i64>,
        by: UserId,
        at: DateTime<Utc>,
    ) -> Result<Option<i64>, StoreError> {
        let sql = concat!(
            "INSERT INTO gpu_desired (node_id, gpu_uuid, mode, layout, version, updated_at, \
             updated_by, sharing) \
             SELECT $1, $2, 'disabled', '[]', 1, $3, $4, $5 WHERE NOT EXISTS ( \
             SELECT 1 FROM allocations WHERE state IN ",
            on_node_states!(),
            " AND devices LIKE $7) \
                   ON CONFLICT (node_id, gpu_uuid) DO UPDATE SET mode = 'disabled', layout = '[]', \
                   sharing = excluded.sharing, version = gpu_desired.version + 1, \
                   updated_at = excluded.updated_at, updated_by = excluded.updated_by \
                   WHERE gpu_desired.version = $6 \
                   RETURNING version"
        );
        let holds = format!("%\"gpu_uuid\":\"{gpu_uuid}\"%");
        db!(self, pool => sqlx::query_scalar::<_, i64>(sql)
            .bind(node.0).bind(gpu_uuid).bind(at).bind(by.0).bind(sharing.map(ShareMethod::as_str)).bind(expected).bind(&holds)
            .fetch_optional(pool).await)
    }

    /// Share allocations holding part of a GPU now, with their team's name.
    pub async fn held_shares(&self) -> Result<Vec<HeldShareRow>, StoreError> {
        let sql = concat!(
            "SELECT a.id, a.kind, a.devices, t.name AS team_name FROM allocations a \
             JOIN teams t ON t.id = a.team_id WHERE a.state IN ",
            on_node_states!(),
            " AND a.share_milli IS NOT NULL ORDER BY a.created_at"
        );
        db!(self, pool => sqlx::query_as::<_, HeldShareRow>(sql).fetch_all(pool).await)
    }

    /// Sets the desired state of one GPU, bumping its version; returns the new version.
    pub async fn set_desired(
        &self,
        node: NodeId,
        gpu_uuid: &str,
        mode: MigMode,
        layout: &[DesiredInstance],
        by: Option<UserId>,
        at: DateTime<Utc>,
    ) -> Result<i64, StoreError> {
        let layout = json_text(layout)?;
        let sql = "INSERT INTO gpu_desired (node_id, gpu_uuid, mode, layout, version, updated_at, updated_by) \
                   VALUES ($1, $2, $3, $4, 1, $5, $6) \
                   ON CONFLICT (node_id, gpu_uuid) DO UPDATE SET mode = excluded.mode, \
                   layout = excluded.layout, version = gpu_desired.version + 1, \
                   updated_at = excluded.updated_at, updated_by = excluded.updated_by \
                   RETURNING version";
        db!(self, pool => sqlx::query_scalar::<_, i64>(sql)
            .bind(node.0).bind(gpu_uuid).bind(mode.as_str()).bind(&layout).bind(at).bind(by.map(|v| v.0))
            .fetch_one(pool).await)
    }

    pub async fn upsert_apply_status(
        &self,
        node: NodeId,
        gpu_uuid: &str,
        version: i64,
        status: &str,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let sql = "INSERT INTO gpu_apply_status (node_id, gpu_uuid, version, status, reported_at) \
                   VALUES ($1, $2, $3, $4, $5) \
                   ON CONFLICT (node_id, gpu_uuid) DO UPDATE SET version = excluded.version, \
                   status = excluded.status, reported_at = excluded.reported_at";
        db!(self, pool => sqlx::query(sql)
            .bind(node.0).bind(gpu_uuid).bind(version).bind(status).bind(at)
            .execute(pool).await.map(|_| ()))
    }

    /// Desired states of the given nodes (all nodes with `None`) with their apply status
    /// for the current version: one query, whatever the number of nodes.
    pub async fn desired_with_status(
        &self,
        nodes: Option<&[NodeId]>,
    ) -> Result<Vec<DesiredWithStatus>, StoreError> {
        let filter = match nodes {
            None => String::new(),
            Some([]) => " WHERE 1 = 0".to_owned(),
            Some(ids) => format!(" WHERE d.node_id IN ({})", placeholders(1, ids.len())),
        };
        let sql = format!(
            "SELECT d.node_id, d.gpu_uuid, d.mode, d.layout, d.version, d.updated_at, d.sharing, \
             s.status \
             FROM gpu_desired d LEFT JOIN gpu_apply_status s ON s.node_id = d.node_id \
             AND s.gpu_uuid = d.gpu_uuid AND s.version = d.version{filter} ORDER BY d.gpu_uuid"
        );
        db!(self, pool => {
            let mut q = sqlx::query_as::<_, DesiredWithStatus>(&sql);
            for id in nodes.unwrap_or(&[]) {
                q = q.bind(id.0);
            }
            q.fetch_all(pool).await
        })
    }

    pub async fn apply_statuses(&self, node: NodeId) -> Result<Vec<ApplyStatusRow>, StoreError> {
        let sql = "SELECT gpu_uuid, version, status, reported_at FROM gpu_apply_status WHERE node_id = $1";
        db!(self, pool => sqlx::query_as::<_, ApplyStatusRow>(sql).bind(node.0).fetch_all(pool).await)
    }

    /// Stores samples, ignoring `(node, seq)` already stored, all in one transaction;
    /// records the agent's drop counter.
    pub async fn insert_samples(
        &self,
        node: NodeId,
        samples: &[(i64, DateTime<Utc>, String)],
        dropped_total: i64,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        // One multi-row statement per 500 samples (a round trip each, not one per sample).
        in_tx!(self, tx => {
            for chunk in samples.chunks(500) {
                let mut q = sqlx::QueryBuilder::new(
                    "INSERT INTO telemetry_samples (node_id, seq, at, payload, received_at) ");
                q.push_values(chunk, |mut row, (seq, sampled_at, payload)| {
                    row.push_bind(node.0).push_bind(*seq).push_bind(*sampled_at)
                        .push_bind(payload.as_str()).push_bind(at);
                });
                q.push(" ON CONFLICT (node_id, seq) DO NOTHING");
                q.build().execute(&mut *tx).await?;
            }
            if dropped_total > 0 {
                sqlx::query("UPDATE nodes SET telemetry_dropped = $1 WHERE id = $2 AND telemetry_dropped < $1")
                    .bind(dropped_total).bind(node.0).execute(&mut *tx).await?;
            }
        })
    }

    /// The newest `limit` samples of a node, oldest first.
    pub async fn recent_samples(
        &self,
        node: NodeId,
        limit: u32,
    ) -> Result<Vec<SampleRow>, StoreError> {
        let sql = "SELECT seq, at, payload FROM telemetry_samples WHERE node_id = $1 \
                   ORDER BY seq DESC LIMIT $2";
        let mut rows = on_pool!(self, pool => sqlx::query_as::<_, SampleRow>(sql)
            .bind(node.0).bind(i64::from(limit)).fetch_all(pool).await?);
        rows.reverse();
        Ok(rows)
    }

    /// Every node that is not revoked with its newest sample (highest `seq`), in one query
    /// whatever the number of nodes (the primary key makes `MAX(seq)` an index lookup).
    pub async fn latest_sample_per_node(&self) -> Result<Vec<NodeLatestSampleRow>, StoreError> {
        let sql = "SELECT n.id, n.hostname, n.registered_at, n.last_heartbeat_at, n.inventory, \
                   n.telemetry_dropped, s.at AS sample_at, s.payload \
                   FROM nodes n LEFT JOIN telemetry_samples s ON s.node_id = n.id \
                   AND s.seq = (SELECT MAX(m.seq) FROM telemetry_samples m WHERE m.node_id = n.id) \
                   WHERE n.revoked_at IS NULL ORDER BY n.hostname, n.id";
        db!(self, pool => sqlx::query_as::<_, NodeLatestSampleRow>(sql).fetch_all(pool).await)
    }

    pub async fn count_samples(&self, node: NodeId) -> Result<i64, StoreError> {
        db!(self, pool => sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM telemetry_samples WHERE node_id = $1").bind(node.0).fetch_one(pool).await)
    }
}

impl Store {
    pub async fn telemetry_dropped(&self, node: NodeId) -> Result<i64, StoreError> {
        db!(self, pool => sqlx::query_scalar::<_, i64>(
            "SELECT telemetry_dropped FROM nodes WHERE id = $1").bind(node.0).fetch_one(pool).await)
    }
}
