//! `image_catalog`, `registry_allowlist`, `registry_logins` (issue 36).

use super::{NullableId, Store, StoreError, db, in_tx, on_pool, placeholders};
use crate::at_rest::Sealed;
use chrono::{DateTime, Utc};
use tessera_domain::ids::{TeamId, WorkloadId};
use uuid::Uuid;

/// A catalog entry as stored (`team_id` NULL: platform-wide).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CatalogRow {
    pub id: Uuid,
    #[sqlx(try_from = "NullableId")]
    pub team_id: Option<TeamId>,
    pub team_name: Option<String>,
    pub name: String,
    pub reference: String,
    pub pinned: String,
    pub requires_cuda: Option<String>,
    pub added_by: String,
    pub created_at: DateTime<Utc>,
}

/// A team's registry login without its secret.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LoginRow {
    #[sqlx(try_from = "Uuid")]
    pub team_id: TeamId,
    pub registry: String,
    pub username: String,
    pub updated_at: DateTime<Utc>,
}

const CATALOG: &str = "SELECT c.id, c.team_id, t.name AS team_name, c.name, c.reference, c.pinned, \
     c.requires_cuda, c.added_by, c.created_at FROM image_catalog c \
     LEFT JOIN teams t ON t.id = c.team_id";

impl Store {
    /// Adds a catalog entry; `false` when its scope (the team, or the platform) already
    /// has one of that name.
    pub async fn insert_catalog_image(&self, r: &CatalogRow) -> Result<bool, StoreError> {
        let sql = "INSERT INTO image_catalog (id, team_id, name, reference, pinned, \
                   requires_cuda, added_by, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                   ON CONFLICT DO NOTHING";
        let n = on_pool!(self, pool => sqlx::query(sql)
            .bind(r.id).bind(r.team_id.map(|v| v.0)).bind(&r.name).bind(&r.reference).bind(&r.pinned)
            .bind(&r.requires_cuda).bind(&r.added_by).bind(r.created_at)
            .execute(pool).await?.rows_affected());
        Ok(n == 1)
    }

    /// The entries `teams` see: every platform-wide one and those teams' own (`None`:
    /// every entry), platform entries first, then by team and name.
    pub async fn catalog_images(
        &self,
        teams: Option<&[TeamId]>,
    ) -> Result<Vec<CatalogRow>, StoreError> {
        let ids = teams.unwrap_or_default();
        let scope = match teams {
            None => "1 = 1".to_owned(),
            Some([]) => "c.team_id IS NULL".to_owned(),
            Some(_) => format!(
                "c.team_id IS NULL OR c.team_id IN ({})",
                placeholders(1, ids.len())
            ),
        };
        let sql = format!(
            "{CATALOG} WHERE {scope} ORDER BY CASE WHEN c.team_id IS NULL THEN 0 ELSE 1 END, \
             lower(t.name), lower(c.name)"
        );
        db!(self, pool => {
            let mut q = sqlx::query_as::<_, CatalogRow>(&sql);
            for t in ids {
                q = q.bind(t.0);
            }
            q.fetch_all(pool).await
        })
    }

    pub async fn catalog_image(&self, id: Uuid) -> Result<Option<CatalogRow>, StoreError> {
        let sql = format!("{CATALOG} WHERE c.id = $1");
        db!(self, pool => sqlx::query_as::<_, CatalogRow>(&sql).bind(id).fetch_optional(pool).await)
    }

    /// Removes a catalog entry (profiles that named it fall back to the node's
    /// environment); `false` when there was none.
    pub async fn delete_catalog_image(&self, id: Uuid) -> Result<bool, StoreError> {
        let n: Result<u64, StoreError> = in_tx!(self, tx => {
            sqlx::query("UPDATE notebook_profiles SET image_id = NULL WHERE image_id = $1")
                .bind(id).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM image_catalog WHERE id = $1")
                .bind(id).execute(&mut *tx).await?.rows_affected()
        });
        Ok(n? == 1)
    }

    /// The registry allow-list, sorted.
    pub async fn registry_allowlist(&self) -> Result<Vec<String>, StoreError> {
        let sql = "SELECT entry FROM registry_allowlist ORDER BY entry";
        db!(self, pool => sqlx::query_scalar::<_, String>(sql).fetch_all(pool).await)
    }

    /// Adds an allow-list entry; `false` when it was there.
    pub async fn allow_registry(
        &self,
        entry: &str,
        by: &str,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let sql = "INSERT INTO registry_allowlist (entry, added_by, created_at) \
                   VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
        let n = on_pool!(self, pool => sqlx::query(sql).bind(entry).bind(by).bind(at)
            .execute(pool).await?.rows_affected());
        Ok(n == 1)
    }

    /// Removes an allow-list entry; `false` when there was none.
    pub async fn disallow_registry(&self, entry: &str) -> Result<bool, StoreError> {
        let n = on_pool!(self, pool => sqlx::query("DELETE FROM registry_allowlist WHERE entry = $1")
            .bind(entry).execute(pool).await?.rows_affected());
        Ok(n == 1)
    }

    /// Stores team `team`'s login to `registry` (replacing one there was).
    pub async fn set_registry_login(
        &self,
        team: TeamId,
        registry: &str,
        username: &str,
        secret: &Sealed,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let sql = "INSERT INTO registry_logins (team_id, registry, username, secret, updated_at) \
                   VALUES ($1, $2, $3, $4, $5) ON CONFLICT (team_id, registry) DO UPDATE SET \
                   username = excluded.username, secret = excluded.secret, \
                   updated_at = excluded.updated_at";
        on_pool!(self, pool => sqlx::query(sql).bind(team.0).bind(registry).bind(username)
            .bind(secret).bind(at).execute(pool).await?.rows_affected());
        Ok(())
    }

    /// Team `team`'s logins, without their secrets.
    pub async fn registry_logins(&self, team: TeamId) -> Result<Vec<LoginRow>, StoreError> {
        let sql = "SELECT team_id, registry, username, updated_at FROM registry_logins \
                   WHERE team_id = $1 ORDER BY registry";
        db!(self, pool => sqlx::query_as::<_, LoginRow>(sql).bind(team.0).fetch_all(pool).await)
    }

    /// Team `team`'s login to `registry`: the username and the sealed secret.
    pub async fn registry_login_secret(
        &self,
        team: TeamId,
        registry: &str,
    ) -> Result<Option<(String, Sealed)>, StoreError> {
        let sql =
            "SELECT username, secret FROM registry_logins WHERE team_id = $1 AND registry = $2";
        db!(self, pool => sqlx::query_as::<_, (String, Sealed)>(sql).bind(team.0).bind(registry)
            .fetch_optional(pool).await)
    }

    /// Removes team `team`'s login to `registry`; `false` when there was none.
    pub async fn delete_registry_login(
        &self,
        team: TeamId,
        registry: &str,
    ) -> Result<bool, StoreError> {
        let sql = "DELETE FROM registry_logins WHERE team_id = $1 AND registry = $2";
        let n = on_pool!(self, pool => sqlx::query(sql).bind(team.0).bind(registry)
            .execute(pool).await?.rows_affected());
        Ok(n == 1)
    }

    /// Records how far workload `id`'s image pull has come (`None`: not pulling).
    pub async fn set_pull_progress(
        &self,
        id: WorkloadId,
        progress: Option<(i64, i64)>,
    ) -> Result<(), StoreError> {
        let sql = "UPDATE workloads SET pull_done = $2, pull_total = $3 WHERE id = $1";
        on_pool!(self, pool => sqlx::query(sql).bind(id.0).bind(progress.map(|p| p.0))
            .bind(progress.map(|p| p.1)).execute(pool).await?.rows_affected());
        Ok(())
    }
}
