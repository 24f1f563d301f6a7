//! Tenancy: teams, roles, memberships, tokens, and the views the UI and REST API show.
//!
//! Teams are the tenant unit. A user holds one [`TeamRole`] per team; the platform admin
//! (the principal's `is_admin`) sits above teams.

use crate::error::AppError;
use crate::ids::{TeamId, UserId};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;
use uuid::Uuid;

/// A role within one team, from most to least privileged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TeamRole {
    /// Manages the team's members (and, later, its quota requests).
    TeamAdmin,
    /// Uses the team's resources.
    Member,
    /// Reads the team's data.
    Viewer,
}

impl TeamRole {
    pub const ALL: [TeamRole; 3] = [TeamRole::TeamAdmin, TeamRole::Member, TeamRole::Viewer];

    pub fn parse(s: &str) -> Result<Self, AppError> {
        match s.trim() {
            "team_admin" => Ok(TeamRole::TeamAdmin),
            "member" => Ok(TeamRole::Member),
            "viewer" => Ok(TeamRole::Viewer),
            _ => Err(AppError::invalid(
                "role",
                "must be team_admin, member or viewer",
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TeamRole::TeamAdmin => "team_admin",
            TeamRole::Member => "member",
            TeamRole::Viewer => "viewer",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            TeamRole::TeamAdmin => "Team admin",
            TeamRole::Member => "Member",
            TeamRole::Viewer => "Viewer",
        }
    }

    /// May add and remove members and change their roles.
    pub fn manages_members(self) -> bool {
        self == TeamRole::TeamAdmin
    }
}

impl fmt::Display for TeamRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A team name: 2–64 characters, letters, digits, spaces, `-`, `_`, `.`; trimmed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TeamName(String);

impl TeamName {
    pub fn parse(raw: &str) -> Result<Self, AppError> {
        let s = raw.trim();
        let err = |m: &str| Err(AppError::invalid("name", m));
        if s.is_empty() {
            return err("is required");
        }
        let n = s.chars().count();
        if !(2..=64).contains(&n) {
            return err("must be 2 to 64 characters");
        }
        if !s
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_' | '.'))
        {
            return err("may contain only letters, digits, spaces, '-', '_' and '.'");
        }
        Ok(Self(s.split_whitespace().collect::<Vec<_>>().join(" ")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A token's display name: 1–64 printable characters.
pub fn parse_token_name(raw: &str) -> Result<String, AppError> {
    let s = raw.trim();
    if s.is_empty() {
        return Err(AppError::invalid("name", "is required"));
    }
    if s.chars().count() > 64 || s.chars().any(char::is_control) {
        return Err(AppError::invalid(
            "name",
            "must be at most 64 printable characters",
        ));
    }
    Ok(s.to_owned())
}

/// `offset`/`limit` of a list request, clamped to sane bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema, utoipa::IntoParams))]
pub struct PageRequest {
    #[serde(default)]
    pub offset: u32,
    #[serde(default = "PageRequest::default_limit")]
    pub limit: u32,
}

impl PageRequest {
    pub const MAX_LIMIT: u32 = 200;

    fn default_limit() -> u32 {
        25
    }

    pub fn new(offset: u32, limit: u32) -> Self {
        Self { offset, limit }.clamped()
    }

    /// `limit` in 1..=200 (0 means the default).
    pub fn clamped(self) -> Self {
        let limit = match self.limit {
            0 => Self::default_limit(),
            l => l.min(Self::MAX_LIMIT),
        };
        Self {
            offset: self.offset,
            limit,
        }
    }
}

impl Default for PageRequest {
    fn default() -> Self {
        Self {
            offset: 0,
            limit: Self::default_limit(),
        }
    }
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Items in the whole list.
    pub total: u64,
    pub offset: u32,
    pub limit: u32,
}

impl<T> Page<T> {
    pub fn has_next(&self) -> bool {
        u64::from(self.offset) + (self.items.len() as u64) < self.total
    }
    pub fn has_prev(&self) -> bool {
        self.offset > 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserView {
    pub id: UserId,
    pub username: String,
    pub is_admin: bool,
    pub disabled: bool,
    /// Has a Tessera password. Users created by single sign-on have none (until an admin
    /// sets one) and sign in only through the identity provider.
    pub has_password: bool,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TeamView {
    pub id: TeamId,
    pub name: String,
    pub archived: bool,
    pub member_count: u64,
    /// The caller's role in this team, if a member.
    pub my_role: Option<TeamRole>,
    pub created_at: DateTime<Utc>,
    /// Whether the team may use `high` priority (platform admins grant it), and its cap.
    #[serde(default)]
    pub high_priority: Option<crate::alloc::HighGrant>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MemberView {
    pub user_id: UserId,
    pub username: String,
    pub role: TeamRole,
    pub disabled: bool,
    pub added_at: DateTime<Utc>,
}

/// A personal API token, without its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApiTokenView {
    pub id: Uuid,
    pub name: String,
    /// The first characters of the secret, to tell tokens apart.
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
}

/// A token just created: the only time its secret is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedSecret<T> {
    pub token: T,
    /// Shown once; only a hash is stored.
    pub secret: String,
}

/// A node join token, without its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JoinTokenView {
    pub id: Uuid,
    pub note: String,
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub max_uses: u32,
    pub uses: u32,
    pub revoked: bool,
}

impl JoinTokenView {
    /// Whether a node could still join with it at `now`.
    pub fn usable(&self, now: DateTime<Utc>) -> bool {
        !self.revoked && self.uses < self.max_uses && now < self.expires_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip_and_reject_unknown() {
        for r in TeamRole::ALL {
            assert_eq!(TeamRole::parse(r.as_str()), Ok(r));
        }
        assert_eq!(
            TeamRole::parse("owner").expect_err("unknown").field(),
            Some("role")
        );
        assert!(TeamRole::TeamAdmin.manages_members());
        assert!(!TeamRole::Member.manages_members());
    }

    #[test]
    fn team_names() {
        assert_eq!(
            TeamName::parse("  Vision   Lab ").expect("ok").as_str(),
            "Vision Lab"
        );
        assert!(TeamName::parse("x").is_err());
        assert!(TeamName::parse("a/b").is_err());
    }

    #[test]
    fn pages_clamp_and_know_their_neighbours() {
        assert_eq!(PageRequest::new(0, 0).limit, 25);
        assert_eq!(PageRequest::new(0, 10_000).limit, 200);
        let p = Page {
            items: vec![1, 2],
            total: 5,
            offset: 2,
            limit: 2,
        };
        assert!(p.has_next() && p.has_prev());
        let last = Page {
            items: vec![5],
            total: 5,
            offset: 4,
            limit: 2,
        };
        assert!(!last.has_next());
    }
}
