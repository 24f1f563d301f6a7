//! A team's named notebook profiles (a GPU request launched by name).

use super::*;
use tessera_domain::alloc::{PriorityClass, TypedRequest};
use tessera_domain::audit::AuditAction;

impl Workloads {
    /// The GPU request a profile stands for, for a caller who may use it (a member of its
    /// team; another team's profile is `profile_id: no such profile`).
    pub(super) async fn profile_request(
        &self,
        p: &Principal,
        id: Uuid,
    ) -> Result<(TypedRequest, Option<Uuid>), AppError> {
        let missing = || AppError::invalid("profile_id", "no such profile");
        let row = self
            .store
            .notebook_profile(id)
            .await
            .map_err(internal("loading profile"))?
            .ok_or_else(missing)?;
        authz::team(&self.store, p, row.team_id, Need::Read)
            .await
            .map_err(|e| match e {
                AppError::NotFound => missing(),
                other => other,
            })?;
        let gpu = TypedRequest {
            team_id: row.team_id,
            kind: row.kind.clone(),
            count: 1,
            duration_minutes: u32::try_from(row.duration_minutes).ok(),
            starts_at: None,
            priority: PriorityClass::default(),
            purpose: format!("notebook profile `{}`", row.name),
            needs_cuda: None,
            nodes: None,
        };
        Ok((gpu, row.image_id))
    }

    /// Notebook profiles: of one team (its readers), or of every team of the caller's
    /// (`team: None`; all teams for a platform admin) for the launch form.
    pub async fn profiles(
        &self,
        p: &Principal,
        team: Option<TeamId>,
    ) -> Result<Vec<NotebookProfile>, AppError> {
        let teams = match team {
            Some(t) => {
                authz::team(&self.store, p, t, Need::Read).await?;
                vec![t]
            }
            None => {
                let (rows, _) = self
                    .store
                    .list_user_teams(p.user_id(), 0, 1000)
                    .await
                    .map_err(internal("loading teams"))?;
                rows.into_iter()
                    .filter(|t| !t.archived && t.role.as_deref() != Some("viewer"))
                    .map(|t| t.id)
                    .collect()
            }
        };
        let rows = self
            .store
            .notebook_profiles(&teams)
            .await
            .map_err(internal("loading profiles"))?;
        Ok(rows.into_iter().map(profile_view).collect())
    }

    /// Adds a profile to a team, or changes the one of that name (team admins, platform
    /// admins). `hours`: how long its notebooks may run.
    pub async fn save_profile(
        &self,
        p: &Principal,
        team: TeamId,
        name: &str,
        kind: &str,
        hours: u32,
        image: Option<&str>,
    ) -> Result<NotebookProfile, AppError> {
        authz::team(&self.store, p, team, Need::ManageMembers).await?;
        // An entry of the team's catalog (platform-wide or its own), by id or name.
        let image_id = match image.map(str::trim).filter(|i| !i.is_empty()) {
            Some(i) => Some(self.images.choose(team, i).await?.id),
            None => None,
        };
        let name = wl::parse_profile_name(name)?;
        let minutes = hours
            .checked_mul(60)
            .filter(|m| *m > 0)
            .ok_or_else(|| AppError::invalid("hours", "a whole number of hours, 1 or more"))?;
        self.allocations
            .check_kind(team, kind, minutes)
            .map_err(|e| match e {
                AppError::Invalid { field, message } if field == "duration_minutes" => {
                    AppError::Invalid {
                        field: "hours".into(),
                        message,
                    }
                }
                other => other,
            })?;
        let id = self
            .store
            .save_notebook_profile(
                Uuid::now_v7(),
                team,
                &name,
                kind.trim(),
                i64::from(minutes),
                image_id,
                self.clock.now(),
                p.user_id(),
            )
            .await
            .map_err(internal("storing profile"))?;
        self.audit_profile(
            p,
            AuditAction::NotebookProfileSave,
            id,
            team.0,
            &format!("{name}: {kind}, {hours} h"),
        )
        .await;
        let row = self
            .store
            .notebook_profile(id)
            .await
            .map_err(internal("loading profile"))?
            .ok_or(AppError::Internal)?;
        Ok(profile_view(row))
    }

    /// Removes a team's profile (team admins, platform admins); running notebooks keep
    /// their GPU.
    pub async fn delete_profile(
        &self,
        p: &Principal,
        team: TeamId,
        id: Uuid,
    ) -> Result<(), AppError> {
        authz::team(&self.store, p, team, Need::ManageMembers).await?;
        let gone = self
            .store
            .delete_notebook_profile(team, id)
            .await
            .map_err(internal("deleting profile"))?;
        if !gone {
            return Err(AppError::NotFound);
        }
        self.audit_profile(p, AuditAction::NotebookProfileDelete, id, team.0, "deleted")
            .await;
        Ok(())
    }

    /// The caller's team when they belong to exactly one.
    pub(super) async fn only_team(&self, p: &Principal) -> Result<TeamId, AppError> {
        let (teams, total) = self
            .store
            .list_user_teams(p.user_id(), 0, 2)
            .await
            .map_err(internal("loading teams"))?;
        match (teams.first(), total) {
            (Some(t), 1) => Ok(t.id),
            (None, _) => Err(AppError::invalid(
                "team_id",
                "you are in no team yet; ask a team admin to add you",
            )),
            _ => Err(AppError::invalid(
                "team_id",
                "you are in several teams: choose the one that pays",
            )),
        }
    }

    async fn audit_profile(
        &self,
        p: &Principal,
        action: AuditAction,
        id: Uuid,
        team: Uuid,
        after: &str,
    ) {
        let actor = p.username().as_str();
        self.audit_note(
            "notebook_profile",
            Some(actor),
            action,
            (id, TeamId(team)),
            after,
        )
        .await;
    }
}
