//! Users (platform admin), teams and memberships.

use super::authz::{self, Admin, Need};
use super::tokens::VerifiedTokens;
use super::{found, internal};
use crate::auth::Principal;
use crate::auth::password::Hasher;
use crate::clock::Clock;
use crate::store::{ChangeOutcome, MemberRow, Store, TeamListRow, TeamRow, UserRow};
use tessera_domain::account::Username;
use tessera_domain::alloc::HighGrant;
use tessera_domain::error::AppError;
use tessera_domain::ids::{TeamId, UserId};
use tessera_domain::tenancy::{
    MemberView, Page, PageRequest, TeamName, TeamRole, TeamView, UserView,
};
use uuid::Uuid;

#[derive(Clone)]
pub struct Tenancy {
    store: Store,
    clock: Clock,
    hasher: Hasher,
    /// Forgotten when a user is disabled, so their tokens stop on this replica at once.
    verified_tokens: VerifiedTokens,
}

impl Tenancy {
    pub fn new(store: Store, hasher: Hasher) -> Self {
        Self {
            store,
            clock: Clock::system(),
            hasher,
            verified_tokens: VerifiedTokens::default(),
        }
    }

    /// Reads the time from `clock` instead of the system's.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Shares the token service's verified tokens (see [`Tenancy::set_user_disabled`]).
    pub fn forgetting(mut self, verified: VerifiedTokens) -> Self {
        self.verified_tokens = verified;
        self
    }

    // ---- users (platform admin) ----

    pub async fn list_users(
        &self,
        p: &Principal,
        page: PageRequest,
    ) -> Result<Page<UserView>, AppError> {
        authz::admin(p)?;
        let page = page.clamped();
        let (rows, total) = self
            .store
            .list_users(page.offset, page.limit)
            .await
            .map_err(internal("listing users"))?;
        Ok(paged(rows.iter().map(user_view).collect(), total, page))
    }

    pub async fn create_user(
        &self,
        p: &Principal,
        username: &str,
        password: &str,
        is_admin: bool,
    ) -> Result<UserView, AppError> {
        authz::admin(p)?;
        let username = Username::parse(username)?;
        let hash = self.hasher.hash_new(password, "password").await?;
        let now = self.clock.now();
        let row = UserRow {
            id: UserId(Uuid::new_v4()),
            username: username.to_string(),
            password_hash: hash,
            is_admin,
            disabled: false,
            sessions_valid_after: now,
            created_at: now,
        };
        if !self
            .store
            .insert_user(&row)
            .await
            .map_err(internal("creating user"))?
        {
            return Err(AppError::invalid("username", "is already taken"));
        }
        tracing::info!(by = %p.username(), user = %row.username, is_admin, "user created");
        Ok(user_view(&row))
    }

    /// Disabling signs the user out everywhere and revokes their API tokens.
    pub async fn set_user_disabled(
        &self,
        p: &Principal,
        user: UserId,
        disabled: bool,
    ) -> Result<UserView, AppError> {
        let admin = authz::admin(p)?;
        if disabled && user == p.user_id() {
            return Err(AppError::conflict("you cannot disable your own account"));
        }
        if !self
            .store
            .set_user_disabled(user, disabled, self.clock.now())
            .await
            .map_err(internal("disabling user"))?
        {
            return Err(AppError::NotFound);
        }
        // Their tokens stop here now, on other replicas within `VERIFIED_FOR`.
        self.verified_tokens.forget_all();
        tracing::info!(by = %admin.0.username(), user = %user, disabled, "user access changed");
        self.user(admin, user).await
    }

    /// Sets a new password chosen by the admin; the user's sessions end.
    pub async fn reset_password(
        &self,
        p: &Principal,
        user: UserId,
        password: &str,
    ) -> Result<UserView, AppError> {
        let admin = authz::admin(p)?;
        let hash = self.hasher.hash_new(password, "password").await?;
        if !self
            .store
            .reset_password_hash(user, &hash, self.clock.now())
            .await
            .map_err(internal("resetting password"))?
        {
            return Err(AppError::NotFound);
        }
        tracing::info!(by = %admin.0.username(), user = %user, "password reset by admin");
        self.user(admin, user).await
    }

    async fn user(&self, _: Admin<'_>, user: UserId) -> Result<UserView, AppError> {
        let row = found("loading user", self.store.user_by_id(user).await)?;
        Ok(user_view(&row))
    }

    // ---- teams ----

    /// Platform admins see every team; everyone else sees the teams they belong to.
    pub async fn list_teams(
        &self,
        p: &Principal,
        page: PageRequest,
    ) -> Result<Page<TeamView>, AppError> {
        let page = page.clamped();
        let (rows, total) = if p.is_admin() {
            self.store
                .list_all_teams(p.user_id(), page.offset, page.limit)
                .await
        } else {
            self.store
                .list_user_teams(p.user_id(), page.offset, page.limit)
                .await
        }
        .map_err(internal("listing teams"))?;
        Ok(paged(rows.iter().map(team_view).collect(), total, page))
    }

    pub async fn team(&self, p: &Principal, team: TeamId) -> Result<TeamView, AppError> {
        let access = authz::team(&self.store, p, team, Need::Read).await?;
        self.team_view(p, access.id()).await
    }

    pub async fn create_team(&self, p: &Principal, name: &str) -> Result<TeamView, AppError> {
        authz::admin(p)?;
        let name = TeamName::parse(name)?;
        let row = TeamRow {
            id: TeamId(Uuid::new_v4()),
            name: name.as_str().to_owned(),
            archived: false,
            created_at: self.clock.now(),
        };
        if !self
            .store
            .insert_team(&row)
            .await
            .map_err(internal("creating team"))?
        {
            return Err(AppError::invalid("name", "a team with this name exists"));
        }
        tracing::info!(by = %p.username(), team = %row.name, "team created");
        self.team_view(p, TeamId(row.id.0)).await
    }

    pub async fn rename_team(
        &self,
        p: &Principal,
        team: TeamId,
        name: &str,
    ) -> Result<TeamView, AppError> {
        let access = authz::team(&self.store, p, team, Need::Rename).await?;
        writable(&access.team)?;
        let name = TeamName::parse(name)?;
        if !self
            .store
            .rename_team(team, name.as_str())
            .await
            .map_err(internal("renaming team"))?
        {
            return Err(AppError::invalid("name", "a team with this name exists"));
        }
        self.team_view(p, team).await
    }

    /// Archived teams are read-only. Platform admin only.
    pub async fn set_team_archived(
        &self,
        p: &Principal,
        team: TeamId,
        archived: bool,
    ) -> Result<TeamView, AppError> {
        authz::admin(p)?;
        authz::team(&self.store, p, team, Need::Read).await?;
        self.store
            .set_team_archived(team, archived)
            .await
            .map_err(internal("archiving team"))?;
        self.team_view(p, team).await
    }

    async fn team_view(&self, p: &Principal, team: TeamId) -> Result<TeamView, AppError> {
        let row = found(
            "loading team",
            self.store.team_with_role(team, p.user_id()).await,
        )?;
        Ok(team_view(&row))
    }

    // ---- members ----

    pub async fn list_members(
        &self,
        p: &Principal,
        team: TeamId,
        page: PageRequest,
    ) -> Result<Page<MemberView>, AppError> {
        authz::team(&self.store, p, team, Need::Read).await?;
        let page = page.clamped();
        let (rows, total) = self
            .store
            .list_members(team, page.offset, page.limit)
            .await
            .map_err(internal("listing members"))?;
        Ok(paged(rows.iter().map(member_view).collect(), total, page))
    }

    pub async fn add_member(
        &self,
        p: &Principal,
        team: TeamId,
        username: &str,
        role: &str,
    ) -> Result<MemberView, AppError> {
        let access = authz::team(&self.store, p, team, Need::ManageMembers).await?;
        writable(&access.team)?;
        let role = TeamRole::parse(role)?;
        let username = Username::parse(username)?;
        let user = self
            .store
            .user_by_username(username.as_str())
            .await
            .map_err(internal("loading user"))?
            .ok_or_else(|| AppError::invalid("username", "no user with this name"))?;
        if !self
            .store
            .insert_membership(team, user.id, role.as_str(), self.clock.now())
            .await
            .map_err(internal("adding member"))?
        {
            return Err(AppError::invalid("username", "is already a member"));
        }
        tracing::info!(by = %p.username(), team = %access.team.name, user = %user.username, %role, "member added");
        self.member(team, UserId(user.id.0)).await
    }

    pub async fn change_role(
        &self,
        p: &Principal,
        team: TeamId,
        user: UserId,
        role: &str,
    ) -> Result<MemberView, AppError> {
        let access = authz::team(&self.store, p, team, Need::ManageMembers).await?;
        writable(&access.team)?;
        let role = TeamRole::parse(role)?;
        self.apply_change(team, user, Some(role)).await?;
        self.member(team, user).await
    }

    pub async fn remove_member(
        &self,
        p: &Principal,
        team: TeamId,
        user: UserId,
    ) -> Result<(), AppError> {
        let access = authz::team(&self.store, p, team, Need::ManageMembers).await?;
        writable(&access.team)?;
        self.apply_change(team, user, None).await
    }

    async fn apply_change(
        &self,
        team: TeamId,
        user: UserId,
        role: Option<TeamRole>,
    ) -> Result<(), AppError> {
        match self
            .store
            .change_membership(team, user, role.map(TeamRole::as_str))
            .await
            .map_err(internal("changing membership"))?
        {
            ChangeOutcome::Done => Ok(()),
            ChangeOutcome::NotMember => Err(AppError::NotFound),
            ChangeOutcome::LastAdmin => Err(AppError::conflict(
                "a team needs at least one team admin; promote someone else first",
            )),
        }
    }

    async fn member(&self, team: TeamId, user: UserId) -> Result<MemberView, AppError> {
        // Membership lists are small per user; find the one row.
        let (rows, _) = self
            .store
            .list_members(team, 0, u32::MAX)
            .await
            .map_err(internal("loading member"))?;
        rows.iter()
            .find(|m| m.user_id == user)
            .map(member_view)
            .ok_or(AppError::NotFound)
    }
}

fn writable(team: &TeamRow) -> Result<(), AppError> {
    if team.archived {
        Err(AppError::conflict("the team is archived (read-only)"))
    } else {
        Ok(())
    }
}

pub(crate) fn paged<T>(items: Vec<T>, total: i64, page: PageRequest) -> Page<T> {
    Page {
        items,
        total: u64::try_from(total).unwrap_or(0),
        offset: page.offset,
        limit: page.limit,
    }
}

fn user_view(u: &UserRow) -> UserView {
    UserView {
        id: UserId(u.id.0),
        username: u.username.clone(),
        is_admin: u.is_admin,
        disabled: u.disabled,
        has_password: u.password_hash != crate::store::NO_PASSWORD,
        created_at: u.created_at,
    }
}

fn team_view(t: &TeamListRow) -> TeamView {
    TeamView {
        id: TeamId(t.id.0),
        name: t.name.clone(),
        archived: t.archived,
        member_count: u64::try_from(t.member_count).unwrap_or(0),
        my_role: t.role.as_deref().and_then(|r| TeamRole::parse(r).ok()),
        created_at: t.created_at,
        high_priority: t.high_priority.then(|| HighGrant {
            cap: t.high_cap.and_then(|c| u32::try_from(c).ok()),
        }),
    }
}

fn member_view(m: &MemberRow) -> MemberView {
    MemberView {
        user_id: m.user_id,
        username: m.username.clone(),
        role: m.role,
        disabled: m.disabled,
        added_at: m.added_at,
    }
}
