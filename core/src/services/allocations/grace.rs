//! A team's own grace (the deadline channel, docs/operations.md): how long its work is
//! warned before an early stop, set by a team admin within the platform maximum
//! (`TESSERA_PREEMPTION_GRACE`).

use super::*;
use crate::services::audit::Entry;
use tessera_domain::audit::AuditAction;
use tessera_domain::drain::{self, GraceRequest, TeamGrace};

impl Allocations {
    /// The grace that applies to `team`'s work: its own, else the platform maximum. Every
    /// place that sets a warning deadline for a team's work (a reclaim preemption, a
    /// booking's start) asks here.
    pub async fn grace_for(&self, team: TeamId) -> Result<Duration, AppError> {
        let own = self
            .store
            .team_grace_secs(team)
            .await
            .map_err(internal("loading the team's grace"))?;
        Ok(drain::effective_grace(own, self.preemption_grace))
    }

    /// The platform maximum (`TESSERA_PREEMPTION_GRACE`).
    pub fn max_grace(&self) -> Duration {
        self.preemption_grace
    }

    /// A team's grace as its page shows it (any member, or a platform admin).
    pub async fn team_grace(&self, p: &Principal, team: TeamId) -> Result<TeamGrace, AppError> {
        authz::team(&self.store, p, team, Need::Read).await?;
        self.grace_view(team).await
    }

    /// Sets (or, `null`, clears) a team's own grace: a team admin of the team or a
    /// platform admin; audited. Above the platform maximum or negative: 422.
    pub async fn set_team_grace(
        &self,
        p: &Principal,
        team: TeamId,
        req: &GraceRequest,
    ) -> Result<TeamGrace, AppError> {
        let access = authz::team(&self.store, p, team, Need::ManageMembers).await?;
        if access.team.archived {
            return Err(AppError::conflict("the team is archived; it is read-only"));
        }
        let secs = drain::validate_grace(req, self.preemption_grace)?;
        let before = self
            .store
            .team_grace_secs(team)
            .await
            .map_err(internal("loading the team's grace"))?;
        if !self
            .store
            .set_team_grace_secs(team, secs)
            .await
            .map_err(internal("storing the team's grace"))?
        {
            return Err(AppError::NotFound);
        }
        Entry::new(
            Some(p.username().as_str()),
            AuditAction::TeamGrace,
            "team",
            team.0,
        )
        .team(Some(team))
        .before(Some(
            serde_json::json!({ "preemption_grace_secs": before }).to_string(),
        ))
        .after(Some(
            serde_json::json!({ "preemption_grace_secs": secs }).to_string(),
        ))
        .record(&self.store, self.clock.now())
        .await;
        self.grace_view(team).await
    }

    async fn grace_view(&self, team: TeamId) -> Result<TeamGrace, AppError> {
        let own = self
            .store
            .team_grace_secs(team)
            .await
            .map_err(internal("loading the team's grace"))?;
        Ok(TeamGrace {
            preemption_grace_secs: own,
            effective_secs: drain::effective_grace(own, self.preemption_grace).num_seconds(),
            max_secs: self.preemption_grace.num_seconds(),
        })
    }
}
