//! The `users` table.

use super::{Store, StoreError, db, in_tx, on_pool};
use chrono::{DateTime, Utc};
use tessera_domain::ids::UserId;
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UserRow {
    #[sqlx(try_from = "Uuid")]
    pub id: UserId,
    pub username: String,
    pub password_hash: String,
    pub is_admin: bool,
    pub disabled: bool,
    pub sessions_valid_after: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
}

const COLUMNS: &str =
    "id, username, password_hash, is_admin, disabled, sessions_valid_after, created_at";

impl Store {
    pub async fn user_by_username(&self, username: &str) -> Result<Option<UserRow>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM users WHERE username = $1");
        db!(self, pool => sqlx::query_as::<_, UserRow>(&sql).bind(username).fetch_optional(pool).await)
    }

    pub async fn user_by_id(&self, id: UserId) -> Result<Option<UserRow>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM users WHERE id = $1");
        db!(self, pool => sqlx::query_as::<_, UserRow>(&sql).bind(id.0).fetch_optional(pool).await)
    }

    pub async fn count_users(&self) -> Result<i64, StoreError> {
        db!(self, pool => sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM users").fetch_one(pool).await)
    }

    /// What a fresh install's checklist is made from: `(teams not archived, quotas with a
    /// limit, users who are not platform admins, nodes not revoked, rate cards, whether
    /// `user` dismissed the checklist)`.
    pub async fn setup_facts(
        &self,
        user: UserId,
    ) -> Result<(i64, i64, i64, i64, i64, bool), StoreError> {
        let sql = "SELECT \
            (SELECT COUNT(*) FROM teams WHERE archived = FALSE), \
            (SELECT COUNT(*) FROM quotas WHERE limit_units > 0), \
            (SELECT COUNT(*) FROM users WHERE is_admin = FALSE), \
            (SELECT COUNT(*) FROM nodes WHERE revoked_at IS NULL), \
            (SELECT COUNT(*) FROM rate_cards), \
            COALESCE((SELECT setup_dismissed FROM users WHERE id = $1), FALSE)";
        db!(self, pool => sqlx::query_as::<_, (i64, i64, i64, i64, i64, bool)>(sql)
            .bind(user.0).fetch_one(pool).await)
    }

    pub async fn dismiss_setup(&self, user: UserId) -> Result<(), StoreError> {
        db!(self, pool => sqlx::query("UPDATE users SET setup_dismissed = TRUE WHERE id = $1")
            .bind(user.0).execute(pool).await.map(|_| ()))
    }

    /// Inserts a user; `Ok(false)` when the username is taken.
    pub async fn insert_user(&self, row: &UserRow) -> Result<bool, StoreError> {
        let sql = format!(
            "INSERT INTO users ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (username) DO NOTHING"
        );
        let done = on_pool!(self, pool => sqlx::query(&sql)
            .bind(row.id.0)
            .bind(&row.username)
            .bind(&row.password_hash)
            .bind(row.is_admin)
            .bind(row.disabled)
            .bind(row.sessions_valid_after)
            .bind(row.created_at)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(done == 1)
    }

    /// Replaces the password hash, but only if it is still `expected_hash` (so two concurrent
    /// changes cannot both succeed from the same old password). `Ok(false)` if it changed.
    pub async fn set_password_hash(
        &self,
        id: Uuid,
        expected_hash: &str,
        new_hash: &str,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE users SET password_hash = $1, sessions_valid_after = $2 \
                   WHERE id = $3 AND password_hash = $4";
        let n = on_pool!(self, pool => sqlx::query(sql)
            .bind(new_hash)
            .bind(at)
            .bind(id)
            .bind(expected_hash)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(n == 1)
    }
}

impl Store {
    pub async fn list_users(
        &self,
        offset: u32,
        limit: u32,
    ) -> Result<(Vec<UserRow>, i64), StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM users ORDER BY username LIMIT $1 OFFSET $2");
        let rows = on_pool!(self, pool => sqlx::query_as::<_, UserRow>(&sql)
            .bind(i64::from(limit)).bind(i64::from(offset)).fetch_all(pool).await?);
        let total = self.count_users().await?;
        Ok((rows, total))
    }

    /// Disables or enables a user. Disabling also voids every session (by moving
    /// `sessions_valid_after`) and revokes every API token, in one transaction.
    pub async fn set_user_disabled(
        &self,
        id: UserId,
        disabled: bool,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        in_tx!(self, tx => {
            let n = if disabled {
                sqlx::query("UPDATE users SET disabled = TRUE, sessions_valid_after = $1 WHERE id = $2")
                    .bind(at).bind(id.0).execute(&mut *tx).await?.rows_affected()
            } else {
                sqlx::query("UPDATE users SET disabled = FALSE WHERE id = $1")
                    .bind(id.0).execute(&mut *tx).await?.rows_affected()
            };
            if disabled {
                sqlx::query("UPDATE api_tokens SET revoked_at = $1 WHERE user_id = $2 AND revoked_at IS NULL")
                    .bind(at).bind(id.0).execute(&mut *tx).await?;
            }
            n == 1
        })
    }

    /// An administrator's password reset: no expected-hash check, sessions voided.
    pub async fn reset_password_hash(
        &self,
        id: UserId,
        new_hash: &str,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let n = on_pool!(self, pool => sqlx::query(
            "UPDATE users SET password_hash = $1, sessions_valid_after = $2 WHERE id = $3")
            .bind(new_hash).bind(at).bind(id.0).execute(pool).await?.rows_affected());
        Ok(n == 1)
    }
}
