//! The `users` table.

use super::{Store, on_pool};
use chrono::{DateTime, Utc};
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UserRow {
    pub id: Uuid,
    pub username: String,
    pub password_hash: String,
    pub is_admin: bool,
    pub disabled: bool,
    pub password_changed_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
}

const COLUMNS: &str =
    "id, username, password_hash, is_admin, disabled, password_changed_at, created_at";

impl Store {
    pub async fn user_by_username(&self, username: &str) -> Result<Option<UserRow>, sqlx::Error> {
        let sql = format!("SELECT {COLUMNS} FROM users WHERE username = $1");
        on_pool!(self, pool => sqlx::query_as::<_, UserRow>(&sql).bind(username).fetch_optional(pool).await)
    }

    pub async fn user_by_id(&self, id: Uuid) -> Result<Option<UserRow>, sqlx::Error> {
        let sql = format!("SELECT {COLUMNS} FROM users WHERE id = $1");
        on_pool!(self, pool => sqlx::query_as::<_, UserRow>(&sql).bind(id).fetch_optional(pool).await)
    }

    pub async fn count_users(&self) -> Result<i64, sqlx::Error> {
        on_pool!(self, pool => sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM users").fetch_one(pool).await)
    }

    /// Inserts a user; `Ok(false)` when the username is taken.
    pub async fn insert_user(&self, row: &UserRow) -> Result<bool, sqlx::Error> {
        let sql = format!(
            "INSERT INTO users ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (username) DO NOTHING"
        );
        let done = on_pool!(self, pool => sqlx::query(&sql)
            .bind(row.id)
            .bind(&row.username)
            .bind(&row.password_hash)
            .bind(row.is_admin)
            .bind(row.disabled)
            .bind(row.password_changed_at)
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
    ) -> Result<bool, sqlx::Error> {
        let sql = "UPDATE users SET password_hash = $1, password_changed_at = $2 \
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
