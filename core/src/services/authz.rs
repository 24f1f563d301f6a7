//! Capabilities: proofs that the caller may do something, obtained only by checking.
//!
//! A service that needs a platform admin asks for [`Admin`]; one that touches a team asks
//! for [`TeamAccess`] at the level it needs. Only these functions can make them, so a use
//! case cannot forget the check. A team the caller cannot see answers exactly like a
//! missing one: `NotFound`.

use super::{found, internal};
use crate::auth::Principal;
use crate::store::{Store, TeamRow};
use tessera_domain::error::AppError;
use tessera_domain::ids::TeamId;
use tessera_domain::tenancy::TeamRole;

/// Proof that the caller is a platform admin.
#[derive(Debug, Clone, Copy)]
pub struct Admin<'a>(pub &'a Principal);

pub fn admin(p: &Principal) -> Result<Admin<'_>, AppError> {
    if p.is_admin() {
        Ok(Admin(p))
    } else {
        Err(AppError::Forbidden)
    }
}

/// What the caller needs to do with a team.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// See the team and its members: any member, or a platform admin.
    Read,
    /// Manage members: a team admin, or a platform admin.
    ManageMembers,
    /// Rename, archive: a platform admin (team admins may rename too).
    Rename,
}

/// Proof that the caller may act on `team` at the level asked for.
#[derive(Debug, Clone)]
pub struct TeamAccess {
    pub team: TeamRow,
    /// The caller's own role; `None` for a platform admin who is not a member.
    pub role: Option<TeamRole>,
}

impl TeamAccess {
    pub fn id(&self) -> TeamId {
        TeamId(self.team.id.0)
    }
}

pub async fn team(
    store: &Store,
    p: &Principal,
    team: TeamId,
    need: Need,
) -> Result<TeamAccess, AppError> {
    let row = found("loading team", store.team(team).await)?;
    let role = store
        .membership(team, p.user_id())
        .await
        .map_err(internal("loading membership"))?
        .and_then(|r| TeamRole::parse(&r).ok());
    if !p.is_admin() && role.is_none() {
        return Err(AppError::NotFound);
    }
    let allowed = p.is_admin()
        || match need {
            Need::Read => true,
            Need::ManageMembers | Need::Rename => role.is_some_and(TeamRole::manages_members),
        };
    if !allowed {
        return Err(AppError::Forbidden);
    }
    Ok(TeamAccess { team: row, role })
}

/// The teams whose objects a list may show: `team` alone (if the caller may read it), or
/// every team for a platform admin (`None`), or the caller's own teams.
pub async fn readable_teams(
    store: &Store,
    p: &Principal,
    team: Option<TeamId>,
) -> Result<Option<Vec<TeamId>>, AppError> {
    match team {
        Some(t) => {
            self::team(store, p, t, Need::Read).await?;
            Ok(Some(vec![t]))
        }
        None if p.is_admin() => Ok(None),
        None => Ok(Some(
            store
                .list_user_teams(p.user_id(), 0, 10_000)
                .await
                .map_err(internal("loading teams"))?
                .0
                .into_iter()
                .map(|t| t.id)
                .collect(),
        )),
    }
}
