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

impl Approver {
    pub fn as_str(self) -> &'static str {
        match self {
            Approver::TeamAdmin => "team_admin",
            Approver::PlatformAdmin => "platform_admin",
        }
    }
}

impl FromStr for Approver {
    type Err = AppError;
    fn from_str(s: &str) -> Result<Self, AppError> {
        [Approver::TeamAdmin, Approver::PlatformAdmin]
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| AppError::invalid("approver", format!("unknown approver {s}")))
    }
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

/// A team's grant of `high` priority (platform admins give it). `cap`: most units the team
/// may hold at high priority on any one quota line; `None`, no cap beyond its quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HighGrant {
    #[serde(default)]
    pub cap: Option<u32>,
}

/// Who wants units held, and with what power.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    /// A member's request, or the system acting for one (a job queued again, a waiting
    /// request admitted once there is room): every rule applies.
    Request,
    /// A team admin approving a waiting request: waives the per-user cap, nothing else.
    TeamAdmin,
    /// A platform admin approving a waiting request: waives the per-user cap; goes beyond
    /// the team's limit or hard budget only when `overrides` (an explicit, audited act).
    PlatformAdmin { overrides: bool },
}

/// Units held on one quota line: by the team, by the asking user, at high priority.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub team: u32,
    pub user: u32,
    pub high: u32,
}

/// A team's hard budget and what it has committed: this month's ledger plus the
/// remaining cost of every open allocation, at today's rates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub budget: i64,
    pub committed: i64,
    /// The currency both are in (for the reason).
    pub currency: String,
}

/// Everything an admission is checked against, read under the team's admission lock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Standing {
    pub quota: Option<Quota>,
    pub held: Held,
    /// `None`: the team may not use high priority.
    pub high: Option<HighGrant>,
    /// `None`: no hard budget.
    pub budget: Option<Committed>,
}

/// What is asked: `units` more held on the quota line (0 for an extension, which holds
/// nothing more), whether at high priority, and what it may cost at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub units: u32,
    pub high: bool,
    pub cost: i64,
}

/// What [`check`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Hold the units. `over_limit` / `over_budget`: a platform admin's override made it
    /// fit; it must be recorded as such.
    Admit { over_limit: bool, over_budget: bool },
    /// Wait for approval by `by`, for `reason`.
    NeedsApproval { by: Approver, reason: String },
    /// Refused outright, with the reason.
    Refused(AppError),
}

/// The one check every path that makes a team hold more (a request, an approval, a job
/// queued again, a waiting request admitted, an extension) goes through. The invariants it
/// keeps (docs/allocations.md):
/// - a team holds at most its limit, unless a platform admin's override says otherwise;
/// - a member holds at most the per-user cap, unless an admin approved beyond it;
/// - committed spend stays within a hard budget, unless a platform admin's override;
/// - only a team granted `high` uses it, within the grant's cap (no override).
pub fn check(model: &str, s: &Standing, ask: &Ask, by: Authority) -> Verdict {
    let mut over_limit = false;
    if ask.units > 0 {
        if ask.high {
            let Some(grant) = s.high else {
                return Verdict::Refused(AppError::invalid(
                    "priority",
                    "the team may not use high priority; a platform admin can grant it",
                ));
            };
            if let Some(cap) = grant.cap
                && u64::from(s.held.high) + u64::from(ask.units) > u64::from(cap)
            {
                return Verdict::Refused(AppError::invalid(
                    "priority",
                    format!(
                        "the team may hold at most {cap} units at high priority on {model} and holds {}",
                        s.held.high
                    ),
                ));
            }
        }
        let usage = Usage {
            team: s.held.team,
            user: s.held.user,
        };
        match admit(model, s.quota.as_ref(), usage, ask.units) {
            Admission::NotEntitled { reason } => {
                return Verdict::Refused(AppError::invalid("kind", reason));
            }
            Admission::Admit { .. } => {}
            Admission::NeedsApproval {
                by: approver,
                reason,
            } => {
                let limit = s.quota.map_or(0, |q| q.limit());
                let team_after = u64::from(s.held.team) + u64::from(ask.units);
                let beyond =
                    format!("the team would hold {team_after} of its limit {limit} on {model}");
                match by {
                    Authority::Request => {
                        return Verdict::NeedsApproval {
                            by: approver,
                            reason,
                        };
                    }
                    _ if team_after <= u64::from(limit) => {}
                    Authority::TeamAdmin => {
                        return Verdict::NeedsApproval {
                            by: Approver::PlatformAdmin,
                            reason: format!("needs a platform admin: {beyond}"),
                        };
                    }
                    Authority::PlatformAdmin { overrides: true } => over_limit = true,
                    Authority::PlatformAdmin { overrides: false } => {
                        return Verdict::Refused(AppError::conflict(format!(
                            "{beyond}; approve it as an override to go beyond the limit"
                        )));
                    }
                }
            }
        }
    }
    let mut over_budget = false;
    if let Some(b) = &s.budget
        && b.committed.saturating_add(ask.cost) > b.budget
    {
        let c = b.currency.as_str();
        let reason = format!(
            "the team's hard monthly budget is {} {c}, {} {c} is spent or committed to open allocations, and this may cost up to {} {c}",
            crate::billing::format_minor(b.budget, c),
            crate::billing::format_minor(b.committed, c),
            crate::billing::format_minor(ask.cost, c)
        );
        match by {
            Authority::Request | Authority::TeamAdmin => {
                return Verdict::NeedsApproval {
                    by: Approver::PlatformAdmin,
                    reason: if by == Authority::TeamAdmin {
                        format!("needs a platform admin: {reason}")
                    } else {
                        reason
                    },
                };
            }
            Authority::PlatformAdmin { overrides: true } => over_budget = true,
            Authority::PlatformAdmin { overrides: false } => {
                return Verdict::Refused(AppError::conflict(format!(
                    "{reason}; approve it as an override to go beyond the budget"
                )));
            }
        }
    }
    Verdict::Admit {
        over_limit,
        over_budget,
    }
}
