//! `api_tokens` and `join_tokens`: only hashes of secrets are stored.

use super::{Store, StoreError, db, on_pool};
use chrono::{DateTime, Utc};
use tessera_domain::ids::UserId;
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ApiTokenRow {
    pub id: Uuid,
    #[sqlx(try_from = "Uuid")]
    pub user_id: UserId,
    pub name: String,
    pub prefix: String,
    pub secret_hash: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct JoinTokenRow {
    pub id: Uuid,
    pub note: String,
    pub prefix: String,
    pub secret_hash: String,
    #[sqlx(try_from = "Uuid")]
    pub created_by: UserId,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub max_uses: i64,
    pub uses: i64,
    pub revoked: bool,
}

const API_COLS: &str =
    "id, user_id, name, prefix, secret_hash, created_at, expires_at, last_used_at, revoked_at";
const JOIN_COLS: &str =
    "id, note, prefix, secret_hash, created_by, created_at, expires_at, max_uses, uses, revoked";

impl Store {
    pub async fn insert_api_token(&self, r: &ApiTokenRow) -> Result<(), StoreError> {
        let sql =
            format!("INSERT INTO api_tokens ({API_COLS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)");
        on_pool!(self, pool => sqlx::query(&sql)
            .bind(r.id).bind(r.user_id.0).bind(&r.name).bind(&r.prefix).bind(&r.secret_hash)
            .bind(r.created_at).bind(r.expires_at).bind(r.last_used_at).bind(r.revoked_at)
            .execute(pool).await.map(|_| ()))?;
        Ok(())
    }

    /// A live (not revoked) token by the hash of its secret.
    pub async fn api_token_by_hash(&self, hash: &str) -> Result<Option<ApiTokenRow>, StoreError> {
        let sql = format!(
            "SELECT {API_COLS} FROM api_tokens WHERE secret_hash = $1 AND revoked_at IS NULL"
        );
        db!(self, pool => sqlx::query_as::<_, ApiTokenRow>(&sql).bind(hash).fetch_optional(pool).await)
    }

    pub async fn touch_api_token(&self, id: Uuid, at: DateTime<Utc>) -> Result<(), StoreError> {
        on_pool!(self, pool => sqlx::query("UPDATE api_tokens SET last_used_at = $1 WHERE id = $2")
            .bind(at).bind(id).execute(pool).await.map(|_| ()))?;
        Ok(())
    }

    /// A user's live tokens, newest first.
    pub async fn list_api_tokens(
        &self,
        user: UserId,
        offset: u32,
        limit: u32,
    ) -> Result<(Vec<ApiTokenRow>, i64), StoreError> {
        let sql = format!(
            "SELECT {API_COLS} FROM api_tokens WHERE user_id = $1 AND revoked_at IS NULL \
             ORDER BY created_at DESC, id LIMIT $2 OFFSET $3"
        );
        let rows = on_pool!(self, pool => sqlx::query_as::<_, ApiTokenRow>(&sql)
            .bind(user.0).bind(i64::from(limit)).bind(i64::from(offset)).fetch_all(pool).await?);
        let total = on_pool!(self, pool => sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM api_tokens WHERE user_id = $1 AND revoked_at IS NULL")
            .bind(user.0).fetch_one(pool).await?);
        Ok((rows, total))
    }

    /// Revokes one of `user`'s tokens; `Ok(false)` if there is no such live token.
    pub async fn revoke_api_token(
        &self,
        user: UserId,
        id: Uuid,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let n = on_pool!(self, pool => sqlx::query(
            "UPDATE api_tokens SET revoked_at = $1 WHERE id = $2 AND user_id = $3 AND revoked_at IS NULL")
            .bind(at).bind(id).bind(user.0).execute(pool).await?.rows_affected());
        Ok(n == 1)
    }

    pub async fn revoke_all_api_tokens(
        &self,
        user: UserId,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        on_pool!(self, pool => sqlx::query(
            "UPDATE api_tokens SET revoked_at = $1 WHERE user_id = $2 AND revoked_at IS NULL")
            .bind(at).bind(user.0).execute(pool).await.map(|_| ()))?;
        Ok(())
    }

    pub async fn insert_join_token(&self, r: &JoinTokenRow) -> Result<(), StoreError> {
        let sql = format!(
            "INSERT INTO join_tokens ({JOIN_COLS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)"
        );
        on_pool!(self, pool => sqlx::query(&sql)
            .bind(r.id).bind(&r.note).bind(&r.prefix).bind(&r.secret_hash).bind(r.created_by.0)
            .bind(r.created_at).bind(r.expires_at).bind(r.max_uses).bind(r.uses).bind(r.revoked)
            .execute(pool).await.map(|_| ()))?;
        Ok(())
    }

    pub async fn join_token_by_hash(&self, hash: &str) -> Result<Option<JoinTokenRow>, StoreError> {
        let sql = format!("SELECT {JOIN_COLS} FROM join_tokens WHERE secret_hash = $1");
        db!(self, pool => sqlx::query_as::<_, JoinTokenRow>(&sql).bind(hash).fetch_optional(pool).await)
    }

    /// Counts one use, atomically: `Ok(false)` when it was used up or revoked meanwhile.
    pub async fn consume_join_token(&self, id: Uuid) -> Result<bool, StoreError> {
        let n = on_pool!(self, pool => sqlx::query(
            "UPDATE join_tokens SET uses = uses + 1 WHERE id = $1 AND uses < max_uses AND NOT revoked")
            .bind(id).execute(pool).await?.rows_affected());
        Ok(n == 1)
    }

    pub async fn list_join_tokens(
        &self,
        offset: u32,
        limit: u32,
    ) -> Result<(Vec<JoinTokenRow>, i64), StoreError> {
        let sql = format!(
            "SELECT {JOIN_COLS} FROM join_tokens ORDER BY created_at DESC, id LIMIT $1 OFFSET $2"
        );
        let rows = on_pool!(self, pool => sqlx::query_as::<_, JoinTokenRow>(&sql)
            .bind(i64::from(limit)).bind(i64::from(offset)).fetch_all(pool).await?);
        let total = on_pool!(self, pool =>
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM join_tokens").fetch_one(pool).await?);
        Ok((rows, total))
    }

    pub async fn revoke_join_token(&self, id: Uuid) -> Result<bool, StoreError> {
        let n = on_pool!(self, pool => sqlx::query("UPDATE join_tokens SET revoked = TRUE WHERE id = $1")
            .bind(id).execute(pool).await?.rows_affected());
        Ok(n == 1)
    }
}
