//! `teams` and `memberships`.

use super::{Store, StoreError, db, in_tx, on_pool};
use chrono::{DateTime, Utc};
use tessera_domain::ids::{TeamId, UserId};
use tessera_domain::tenancy::TeamRole;
use uuid::Uuid;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TeamRow {
    #[sqlx(try_from = "Uuid")]
    pub id: TeamId,
    pub name: String,
    pub archived: bool,
    pub created_at: DateTime<Utc>,
}

/// A team with its member count and (optionally) one user's role in it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TeamListRow {
    #[sqlx(try_from = "Uuid")]
    pub id: TeamId,
    pub name: String,
    pub archived: bool,
    pub created_at: DateTime<Utc>,
    pub member_count: i64,
    pub role: Option<String>,
    /// Granted `high` priority, with its cap (`None`: no cap).
    pub high_priority: bool,
    pub high_cap: Option<i64>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MemberRow {
    #[sqlx(try_from = "Uuid")]
    pub user_id: UserId,
    pub username: String,
    #[sqlx(try_from = "String")]
    pub role: TeamRole,
    pub disabled: bool,
    pub added_at: DateTime<Utc>,
}

const TEAM_LIST: &str = "SELECT t.id, t.name, t.archived, t.created_at, t.high_priority, t.high_cap, \
     (SELECT COUNT(*) FROM memberships c WHERE c.team_id = t.id) AS member_count, \
     m.role AS role \
     FROM teams t LEFT JOIN memberships m ON m.team_id = t.id AND m.user_id = $1";

impl Store {
    /// Inserts a team; `Ok(false)` if the name (case-insensitively) is taken.
    pub async fn insert_team(&self, row: &TeamRow) -> Result<bool, StoreError> {
        let sql = "INSERT INTO teams (id, name, archived, created_at) VALUES ($1, $2, $3, $4) \
                   ON CONFLICT DO NOTHING";
        let n = on_pool!(self, pool => sqlx::query(sql)
            .bind(row.id.0).bind(&row.name).bind(row.archived).bind(row.created_at)
            .execute(pool).await?.rows_affected());
        Ok(n == 1)
    }

    /// Grants (`Some(cap)`, `cap` `None` for no cap) or withdraws (`None`) `high` priority;
    /// `false` if there is no such team.
    pub async fn set_high_grant(
        &self,
        team: TeamId,
        grant: Option<Option<i64>>,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE teams SET high_priority = $2, high_cap = $3 WHERE id = $1";
        let n = on_pool!(self, pool => sqlx::query(sql).bind(team.0).bind(grant.is_some())
            .bind(grant.flatten()).execute(pool).await?.rows_affected());
        Ok(n == 1)
    }

    /// A team's own grace in seconds (the deadline channel); `None`: the platform maximum
    /// (or no such team).
    pub async fn team_grace_secs(&self, team: TeamId) -> Result<Option<i64>, StoreError> {
        let sql = "SELECT preemption_grace_secs FROM teams WHERE id = $1";
        let row: Option<(Option<i64>,)> = db!(self, pool => sqlx::query_as(sql).bind(team.0)
            .fetch_optional(pool).await)?;
        Ok(row.and_then(|r| r.0))
    }

    /// Sets (or, `None`, clears) a team's own grace; `false` if there is no such team.
    pub async fn set_team_grace_secs(
        &self,
        team: TeamId,
        secs: Option<i64>,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE teams SET preemption_grace_secs = $2 WHERE id = $1";
        let n = on_pool!(self, pool => sqlx::query(sql).bind(team.0).bind(secs)
            .execute(pool).await?.rows_affected());
        Ok(n == 1)
    }

    pub async fn team(&self, id: TeamId) -> Result<Option<TeamRow>, StoreError> {
        let sql = "SELECT id, name, archived, created_at FROM teams WHERE id = $1";
        db!(self, pool => sqlx::query_as::<_, TeamRow>(sql).bind(id.0).fetch_optional(pool).await)
    }

    /// Every team (for the platform admin), with `viewer`'s role where they are a member.
    pub async fn list_all_teams(
        &self,
        viewer: UserId,
        offset: u32,
        limit: u32,
    ) -> Result<(Vec<TeamListRow>, i64), StoreError> {
        let sql = format!("{TEAM_LIST} ORDER BY lower(t.name), t.id LIMIT $2 OFFSET $3");
        let rows = on_pool!(self, pool => sqlx::query_as::<_, TeamListRow>(&sql)
            .bind(viewer.0).bind(i64::from(limit)).bind(i64::from(offset))
            .fetch_all(pool).await?);
        let total = on_pool!(self, pool =>
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM teams").fetch_one(pool).await?);
        Ok((rows, total))
    }

    /// The teams `user` belongs to.
    pub async fn list_user_teams(
        &self,
        user: UserId,
        offset: u32,
        limit: u32,
    ) -> Result<(Vec<TeamListRow>, i64), StoreError> {
        let sql = format!(
            "{TEAM_LIST} WHERE m.user_id IS NOT NULL ORDER BY lower(t.name), t.id LIMIT $2 OFFSET $3"
        );
        let rows = on_pool!(self, pool => sqlx::query_as::<_, TeamListRow>(&sql)
            .bind(user.0).bind(i64::from(limit)).bind(i64::from(offset))
            .fetch_all(pool).await?);
        let total = on_pool!(self, pool => sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM memberships WHERE user_id = $1").bind(user.0).fetch_one(pool).await?);
        Ok((rows, total))
    }

    pub async fn team_with_role(
        &self,
        team: TeamId,
        viewer: UserId,
    ) -> Result<Option<TeamListRow>, StoreError> {
        let sql = format!("{TEAM_LIST} WHERE t.id = $2");
        db!(self, pool => sqlx::query_as::<_, TeamListRow>(&sql)
            .bind(viewer.0).bind(team.0).fetch_optional(pool).await)
    }

    /// Renames; `Ok(false)` if another team has the name.
    pub async fn rename_team(&self, id: TeamId, name: &str) -> Result<bool, StoreError> {
        let taken = on_pool!(self, pool => sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM teams WHERE lower(name) = lower($1) AND id <> $2")
            .bind(name).bind(id.0).fetch_one(pool).await?);
        if taken > 0 {
            return Ok(false);
        }
        let r = on_pool!(self, pool => sqlx::query("UPDATE teams SET name = $1 WHERE id = $2")
            .bind(name).bind(id.0).execute(pool).await.map(|_| ()));
        match r {
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn set_team_archived(&self, id: TeamId, archived: bool) -> Result<(), StoreError> {
        on_pool!(self, pool => sqlx::query("UPDATE teams SET archived = $1 WHERE id = $2")
            .bind(archived).bind(id.0).execute(pool).await.map(|_| ()))?;
        Ok(())
    }

    pub async fn membership(
        &self,
        team: TeamId,
        user: UserId,
    ) -> Result<Option<String>, StoreError> {
        db!(self, pool => sqlx::query_scalar::<_, String>(
            "SELECT role FROM memberships WHERE team_id = $1 AND user_id = $2")
            .bind(team.0).bind(user.0).fetch_optional(pool).await)
    }

    pub async fn list_members(
        &self,
        team: TeamId,
        offset: u32,
        limit: u32,
    ) -> Result<(Vec<MemberRow>, i64), StoreError> {
        let sql = "SELECT m.user_id, u.username, m.role, u.disabled, m.added_at \
                   FROM memberships m JOIN users u ON u.id = m.user_id \
                   WHERE m.team_id = $1 ORDER BY u.username LIMIT $2 OFFSET $3";
        let rows = on_pool!(self, pool => sqlx::query_as::<_, MemberRow>(sql)
            .bind(team.0).bind(i64::from(limit)).bind(i64::from(offset)).fetch_all(pool).await?);
        let total = on_pool!(self, pool => sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM memberships WHERE team_id = $1").bind(team.0).fetch_one(pool).await?);
        Ok((rows, total))
    }

    /// Adds a member; `Ok(false)` if already a member.
    pub async fn insert_membership(
        &self,
        team: TeamId,
        user: UserId,
        role: &str,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let sql = "INSERT INTO memberships (team_id, user_id, role, added_at) VALUES ($1, $2, $3, $4) \
                   ON CONFLICT (team_id, user_id) DO NOTHING";
        let n = on_pool!(self, pool => sqlx::query(sql)
            .bind(team.0).bind(user.0).bind(role).bind(at).execute(pool).await?.rows_affected());
        Ok(n == 1)
    }

    /// Changes a role or removes a member (`role = None`), refusing (`Ok(false)`) when that
    /// would leave the team without a team admin. The check and the write happen in one
    /// transaction so two concurrent demotions cannot both pass.
    pub async fn change_membership(
        &self,
        team: TeamId,
        user: UserId,
        role: Option<&str>,
    ) -> Result<ChangeOutcome, StoreError> {
        in_tx!(self, tx => {
            // Takes the write lock up front on SQLite; on PostgreSQL, locks the team row.
            sqlx::query("UPDATE teams SET archived = archived WHERE id = $1")
                .bind(team.0).execute(&mut *tx).await?;
            let current: Option<String> = sqlx::query_scalar(
                "SELECT role FROM memberships WHERE team_id = $1 AND user_id = $2")
                .bind(team.0).bind(user.0).fetch_optional(&mut *tx).await?;
            let Some(current) = current else {
                return Ok(ChangeOutcome::NotMember);
            };
            if current == "team_admin" && role != Some("team_admin") {
                let admins: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM memberships WHERE team_id = $1 AND role = 'team_admin'")
                    .bind(team.0).fetch_one(&mut *tx).await?;
                if admins <= 1 {
                    return Ok(ChangeOutcome::LastAdmin);
                }
            }
            match role {
                Some(r) => sqlx::query("UPDATE memberships SET role = $1 WHERE team_id = $2 AND user_id = $3")
                    .bind(r).bind(team.0).bind(user.0).execute(&mut *tx).await?,
                None => sqlx::query("DELETE FROM memberships WHERE team_id = $1 AND user_id = $2")
                    .bind(team.0).bind(user.0).execute(&mut *tx).await?,
            };
            ChangeOutcome::Done
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeOutcome {
    Done,
    NotMember,
    LastAdmin,
}
