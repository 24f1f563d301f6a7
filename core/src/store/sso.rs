//! `user_identities`: users who sign in through an OpenID Connect provider, and the one
//! transaction that applies a sign-in's group claim.

use super::{Store, StoreError, UserRow, from_driver, in_tx};
use chrono::{DateTime, Utc};
use tessera_domain::audit::AuditAction;
use uuid::Uuid;

/// The password hash of a user created by single sign-on: no password verifies against it.
pub const NO_PASSWORD: &str = "!";

/// A verified sign-in and what its groups grant.
#[derive(Debug, Clone)]
pub struct SsoSignIn<'a> {
    pub issuer: &'a str,
    pub subject: &'a str,
    pub email: Option<&'a str>,
    /// The group claim, as JSON (kept for the record).
    pub groups_json: &'a str,
    /// Usernames to try, in order, for a first sign-in.
    pub usernames: Vec<String>,
    /// Every team the group map manages (lowercased name) → the role granted, if any.
    pub teams: Vec<(String, Option<&'static str>)>,
    /// Whether the group map can grant platform admin at all.
    pub manages_admin: bool,
    pub grants_admin: bool,
    pub now: DateTime<Utc>,
}

/// What a sign-in changed (for the audit trail and the log).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SsoChanges {
    pub created: bool,
    /// `(team name, role before, role after)` for each membership that changed.
    pub teams: Vec<(String, Option<String>, Option<String>)>,
    /// Mapped teams that do not exist (their groups grant nothing until they do).
    pub missing_teams: Vec<String>,
    /// `Some(now_admin)` when platform admin was granted or taken back.
    pub admin: Option<bool>,
}

#[derive(Debug, Clone)]
pub enum SsoOutcome {
    SignedIn { user: UserRow, changes: SsoChanges },
    Disabled,
}

const USER_COLUMNS: &str =
    "id, username, password_hash, is_admin, disabled, sessions_valid_after, created_at";

impl Store {
    /// Finds or creates the user behind `(issuer, subject)` and applies the group claim, all
    /// in one transaction. A concurrent first sign-in of the same person loses the race on
    /// the identity's primary key and is retried once, finding the winner's user.
    pub async fn sso_sign_in(&self, s: &SsoSignIn<'_>) -> Result<SsoOutcome, StoreError> {
        from_driver(match self.sso_sign_in_once(s).await {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                self.sso_sign_in_once(s).await
            }
            other => other,
        })
    }

    async fn sso_sign_in_once(&self, s: &SsoSignIn<'_>) -> Result<SsoOutcome, sqlx::Error> {
        let mut changes = SsoChanges::default();
        in_tx!(self, tx => {
            // A write first: takes SQLite's write lock up front (no read-to-write upgrade
            // failures) and, on PostgreSQL, locks the identity row.
            sqlx::query("UPDATE user_identities SET last_login_at = $1 WHERE issuer = $2 AND subject = $3")
                .bind(s.now).bind(s.issuer).bind(s.subject).execute(&mut *tx).await?;
            let known: Option<(Uuid, bool)> = sqlx::query_as(
                "SELECT user_id, grants_admin FROM user_identities WHERE issuer = $1 AND subject = $2")
                .bind(s.issuer).bind(s.subject).fetch_optional(&mut *tx).await?;
            let (user_id, mut idp_admin) = match known {
                Some(k) => k,
                None => {
                    let mut chosen = None;
                    for name in &s.usernames {
                        let taken: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM users WHERE username = $1")
                            .bind(name).fetch_one(&mut *tx).await?;
                        if taken == 0 {
                            chosen = Some(name);
                            break;
                        }
                    }
                    let Some(name) = chosen else {
                        return Err(sqlx::Error::Protocol("no free username for a new user".into()));
                    };
                    let id = Uuid::new_v4();
                    let sql = format!("INSERT INTO users ({USER_COLUMNS}) VALUES ($1, $2, $3, FALSE, FALSE, $4, $4)");
                    sqlx::query(&sql).bind(id).bind(name).bind(NO_PASSWORD).bind(s.now)
                        .execute(&mut *tx).await?;
                    sqlx::query("INSERT INTO user_identities (issuer, subject, user_id, email, last_groups, \
                                 grants_admin, created_at, last_login_at) VALUES ($1, $2, $3, $4, $5, FALSE, $6, $6)")
                        .bind(s.issuer).bind(s.subject).bind(id).bind(s.email).bind(s.groups_json).bind(s.now)
                        .execute(&mut *tx).await?;
                    changes.created = true;
                    (id, false)
                }
            };
            let sql = format!("SELECT {USER_COLUMNS} FROM users WHERE id = $1");
            let user: UserRow = sqlx::query_as(&sql).bind(user_id).fetch_one(&mut *tx).await?;
            if user.disabled {
                return Ok(SsoOutcome::Disabled);
            }
            for (team_name, want) in &s.teams {
                let team: Option<(Uuid, String)> = sqlx::query_as(
                    "SELECT id, name FROM teams WHERE lower(name) = $1")
                    .bind(team_name).fetch_optional(&mut *tx).await?;
                let Some((team_id, display)) = team else {
                    if want.is_some() {
                        changes.missing_teams.push(team_name.clone());
                    }
                    continue;
                };
                let have: Option<String> = sqlx::query_scalar(
                    "SELECT role FROM memberships WHERE team_id = $1 AND user_id = $2")
                    .bind(team_id).bind(user_id).fetch_optional(&mut *tx).await?;
                if have.as_deref() == *want {
                    continue;
                }
                match (&have, want) {
                    (None, Some(role)) => sqlx::query(
                        "INSERT INTO memberships (team_id, user_id, role, added_at) VALUES ($1, $2, $3, $4)")
                        .bind(team_id).bind(user_id).bind(*role).bind(s.now).execute(&mut *tx).await?,
                    (Some(_), Some(role)) => sqlx::query(
                        "UPDATE memberships SET role = $1 WHERE team_id = $2 AND user_id = $3")
                        .bind(*role).bind(team_id).bind(user_id).execute(&mut *tx).await?,
                    (Some(_), None) => sqlx::query(
                        "DELETE FROM memberships WHERE team_id = $1 AND user_id = $2")
                        .bind(team_id).bind(user_id).execute(&mut *tx).await?,
                    (None, None) => continue,
                };
                changes.teams.push((display, have, want.map(str::to_owned)));
            }
            let mut is_admin = user.is_admin;
            if s.grants_admin && !user.is_admin {
                is_admin = true;
                idp_admin = true;
                changes.admin = Some(true);
            } else if s.manages_admin && !s.grants_admin && idp_admin {
                is_admin = false;
                idp_admin = false;
                changes.admin = Some(false);
            }
            if changes.admin.is_some() {
                sqlx::query("UPDATE users SET is_admin = $1 WHERE id = $2")
                    .bind(is_admin).bind(user_id).execute(&mut *tx).await?;
            }
            sqlx::query("UPDATE user_identities SET email = $1, last_groups = $2, grants_admin = $3, \
                         last_login_at = $4 WHERE issuer = $5 AND subject = $6")
                .bind(s.email).bind(s.groups_json).bind(idp_admin).bind(s.now)
                .bind(s.issuer).bind(s.subject).execute(&mut *tx).await?;
            if changes.created || !changes.teams.is_empty() || changes.admin.is_some() {
                // Each changed team with its role before (`after = false`) or after.
                let teams = |after: bool| changes.teams.iter()
                    .map(|(t, was, now)| serde_json::json!({"team": t, "role": if after { now } else { was }}))
                    .collect::<Vec<_>>();
                let after = serde_json::json!({
                    "issuer": s.issuer,
                    "created": changes.created,
                    "teams": teams(true),
                    "platform_admin": is_admin,
                });
                let before = serde_json::json!({"teams": teams(false), "platform_admin": user.is_admin});
                sqlx::query("INSERT INTO audit_log (id, at, actor, action, object_type, object_id, team_id, before, after) \
                             VALUES ($1, $2, $3, $4, 'user', $5, NULL, $6, $7)")
                    .bind(Uuid::now_v7()).bind(s.now).bind(&user.username)
                    .bind(if changes.created { AuditAction::SsoUserCreated } else { AuditAction::SsoGrantsChanged }.as_str())
                    .bind(user_id.to_string())
                    .bind((!changes.created).then(|| before.to_string()))
                    .bind(after.to_string())
                    .execute(&mut *tx).await?;
            }
            SsoOutcome::SignedIn { user: UserRow { is_admin, ..user }, changes }
        })
    }
}
