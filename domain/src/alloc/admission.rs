//! Quota and admission.

use super::*;

/// A team's quota on one model, in units (compute slices). Valid by construction:
/// `guaranteed ≤ limit` and `per_user ≤ limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    guaranteed: u32,
    limit: u32,
    per_user: u32,
}

impl Quota {
    /// `guaranteed`: never preempted below this. `limit`: most the team may hold,
    /// borrowing beyond `guaranteed`. `per_user`: most one member may hold without a team
    /// admin's approval (0: every request needs approval).
    pub fn new(guaranteed: u32, limit: u32, per_user: u32) -> Result<Self, AppError> {
        if guaranteed > limit {
            return Err(AppError::invalid(
                "guaranteed",
                format!("must not exceed the limit ({limit})"),
            ));
        }
        if per_user > limit {
            return Err(AppError::invalid(
                "per_user",
                format!("must not exceed the limit ({limit})"),
            ));
        }
        Ok(Self {
            guaranteed,
            limit,
            per_user,
        })
    }

    pub fn guaranteed(&self) -> u32 {
        self.guaranteed
    }
    pub fn limit(&self) -> u32 {
        self.limit
    }
    pub fn per_user(&self) -> u32 {
        self.per_user
    }

    /// Units of `used` beyond the guarantee.
    pub fn borrowed(&self, used: u32) -> u32 {
        used.saturating_sub(self.guaranteed)
    }
}

/// Units a team and the asking user hold on one model now: the sum over their
/// allocations whose state [holds quota](AllocState::holds_quota).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub team: u32,
    pub user: u32,
}

/// Who must approve an allocation that cannot be admitted at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Approver {
    TeamAdmin,
    PlatformAdmin,
}

/// What [`admit`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Goes to the queue. `borrowed`: units of this ask beyond the team's guarantee
    /// (these may be preempted).
    Admit { borrowed: u32 },
    /// Goes to `pending_approval`; `reason` says in plain words why.
    NeedsApproval { by: Approver, reason: String },
    /// The team has no quota (or a limit of 0) on the model; `reason` says so.
    NotEntitled { reason: String },
}

/// Decides whether an ask of `ask` units on `model` may be admitted. `quota` is the
/// team's quota on that model, `None` if it has none.
pub fn admit(model: &str, quota: Option<&Quota>, used: Usage, ask: u32) -> Admission {
    let Some(q) = quota.filter(|q| q.limit > 0) else {
        return Admission::NotEntitled {
            reason: format!("the team has no quota on {model}"),
        };
    };
    // In u64 so that no sum of two u32 can wrap or saturate into "fits".
    let team_after = u64::from(used.team) + u64::from(ask);
    let user_after = u64::from(used.user) + u64::from(ask);
    let team_ok = team_after <= u64::from(q.limit);
    let user_ok = user_after <= u64::from(q.per_user);
    if team_ok && user_ok {
        let beyond = team_after.saturating_sub(u64::from(q.guaranteed));
        return Admission::Admit {
            borrowed: u32::try_from(beyond).unwrap_or(u32::MAX).min(ask),
        };
    }
    let per_user = format!(
        "you would use {user_after} of your {}-slice per-user limit on {model}",
        q.per_user
    );
    if team_after <= u64::from(q.guaranteed) {
        return Admission::NeedsApproval {
            by: Approver::TeamAdmin,
            reason: per_user,
        };
    }
    let reason = if team_ok {
        format!(
            "{per_user}, and the team would borrow beyond its {}-slice guarantee",
            q.guaranteed
        )
    } else {
        format!(
            "the team would use {team_after} of its {}-slice limit on {model}",
            q.limit
        )
    };
    Admission::NeedsApproval {
        by: Approver::PlatformAdmin,
        reason,
    }
}
