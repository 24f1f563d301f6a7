//! The audit trail: written by the services (`services/audit.rs`), read by platform
//! admins page by page.

use super::{Store, StoreError, db, on_pool};
use chrono::{DateTime, Utc};
use tessera_domain::audit::AuditEntryView;
use tessera_domain::ids::TeamId;
use uuid::Uuid;

/// An audit entry's columns, in `audit_page`'s order.
type AuditColumns = (
    Uuid,
    DateTime<Utc>,
    Option<String>,
    String,
    String,
    String,
    Option<Uuid>,
    Option<String>,
    Option<String>,
);

impl Store {
    pub async fn audit(&self, r: &AuditEntryView) -> Result<(), StoreError> {
        let sql = "INSERT INTO audit_log (id, at, actor, action, object_type, object_id, team_id, before, after) \
                   VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)";
        db!(self, pool => sqlx::query(sql).bind(r.id).bind(r.at).bind(&r.actor).bind(&r.action)
            .bind(&r.object_type).bind(&r.object_id).bind(r.team_id.map(|v| v.0)).bind(&r.before).bind(&r.after)
            .execute(pool).await.map(|_| ()))
    }

    pub async fn audit_page(
        &self,
        action: Option<&str>,
        offset: u32,
        limit: u32,
    ) -> Result<(Vec<AuditEntryView>, i64), StoreError> {
        let sql = "SELECT id, at, actor, action, object_type, object_id, team_id, before, after \
                   FROM audit_log WHERE ($1 IS NULL OR action = $1) ORDER BY at DESC, id LIMIT $2 OFFSET $3";
        let count = "SELECT COUNT(*) FROM audit_log WHERE ($1 IS NULL OR action = $1)";
        on_pool!(self, pool => {
            let rows = sqlx::query_as::<_, AuditColumns>(sql).bind(action).bind(i64::from(limit))
                .bind(i64::from(offset)).fetch_all(pool).await?;
            let rows = rows.into_iter().map(|(id, at, actor, action, object_type, object_id, team, before, after)| {
                AuditEntryView { id, at, actor, action, object_type, object_id,
                    team_id: team.map(TeamId::from), before, after }
            }).collect();
            let total = sqlx::query_scalar::<_, i64>(count).bind(action).fetch_one(pool).await?;
            Ok((rows, total))
        })
    }
}
