//! State machine.

use super::*;

/// Where an allocation is in its life; the transition table is in the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AllocState {
    /// Beyond what may be admitted at once; waits for a team or platform admin.
    PendingApproval,
    /// Admitted; waits for the planner to find room.
    Queued,
    /// The planner chose a place; the agent is setting it up.
    Placing,
    /// Running on its GPU.
    Active,
    /// Being torn down; the recorded [`ReleaseCause`] names the end state.
    Releasing,
    /// Released by its user (or at its end time, once torn down normally).
    Ended,
    Denied,
    Cancelled,
    Preempted,
    Expired,
    Failed,
}

impl AllocState {
    pub const ALL: [AllocState; 11] = [
        AllocState::PendingApproval,
        AllocState::Queued,
        AllocState::Placing,
        AllocState::Active,
        AllocState::Releasing,
        AllocState::Ended,
        AllocState::Denied,
        AllocState::Cancelled,
        AllocState::Preempted,
        AllocState::Expired,
        AllocState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AllocState::PendingApproval => "pending_approval",
            AllocState::Queued => "queued",
            AllocState::Placing => "placing",
            AllocState::Active => "active",
            AllocState::Releasing => "releasing",
            AllocState::Ended => "ended",
            AllocState::Denied => "denied",
            AllocState::Cancelled => "cancelled",
            AllocState::Preempted => "preempted",
            AllocState::Expired => "expired",
            AllocState::Failed => "failed",
        }
    }

    /// Words for people: `Pending approval`, `Queued`, ….
    pub fn label(self) -> &'static str {
        match self {
            AllocState::PendingApproval => "Pending approval",
            AllocState::Queued => "Queued",
            AllocState::Placing => "Placing",
            AllocState::Active => "Active",
            AllocState::Releasing => "Releasing",
            AllocState::Ended => "Ended",
            AllocState::Denied => "Denied",
            AllocState::Cancelled => "Cancelled",
            AllocState::Preempted => "Preempted",
            AllocState::Expired => "Expired",
            AllocState::Failed => "Failed",
        }
    }

    /// Whether the table in the module docs allows `self → to`.
    pub fn can_transition(self, to: AllocState) -> bool {
        use AllocState::*;
        matches!(
            (self, to),
            (PendingApproval, Queued | Denied | Cancelled)
                | (Queued, Placing | Cancelled | Failed)
                | (Placing, Active | Queued | Failed | Cancelled)
                | (Active, Releasing | Failed)
                | (Releasing, Ended | Expired | Preempted | Failed)
        )
    }

    /// [`AllocState::can_transition`] as a `Conflict` the server can return as is.
    pub fn check_transition(self, to: AllocState) -> Result<(), AppError> {
        if self.can_transition(to) {
            Ok(())
        } else {
            Err(AppError::conflict(format!(
                "an allocation that is {} cannot become {}",
                self.label().to_lowercase(),
                to.label().to_lowercase()
            )))
        }
    }

    /// No transition leaves this state.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            AllocState::Ended
                | AllocState::Denied
                | AllocState::Cancelled
                | AllocState::Preempted
                | AllocState::Expired
                | AllocState::Failed
        )
    }

    /// Counts against the team's quota: queued, placing, active, releasing.
    pub fn holds_quota(self) -> bool {
        Self::LIVE.contains(&self)
    }

    /// The states whose allocation holds GPU on a node: placing, active, releasing.
    pub const ON_NODE: [AllocState; 3] = [
        AllocState::Placing,
        AllocState::Active,
        AllocState::Releasing,
    ];

    /// The states that count against a quota and that the scheduler pass reads: queued and
    /// [`AllocState::ON_NODE`].
    pub const LIVE: [AllocState; 4] = [
        AllocState::Queued,
        AllocState::Placing,
        AllocState::Active,
        AllocState::Releasing,
    ];

    /// Still waiting to run: pending approval, queued, placing.
    pub fn is_pending(self) -> bool {
        matches!(
            self,
            AllocState::PendingApproval | AllocState::Queued | AllocState::Placing
        )
    }
}

impl FromStr for AllocState {
    type Err = AppError;
    fn from_str(s: &str) -> Result<Self, AppError> {
        let s = s.trim();
        AllocState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| AppError::invalid("state", format!("unknown state {s}")))
    }
}

impl fmt::Display for AllocState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an active allocation is being released; recorded when it enters `releasing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ReleaseCause {
    /// Its user (or an admin) released it.
    Released,
    /// Its end time passed.
    Expired,
    /// Another team reclaimed its guaranteed share.
    Preempted,
}

impl ReleaseCause {
    pub const ALL: [ReleaseCause; 3] = [
        ReleaseCause::Released,
        ReleaseCause::Expired,
        ReleaseCause::Preempted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseCause::Released => "released",
            ReleaseCause::Expired => "expired",
            ReleaseCause::Preempted => "preempted",
        }
    }

    /// The terminal state `releasing` goes to once the GPU is torn down.
    pub fn final_state(self) -> AllocState {
        match self {
            ReleaseCause::Released => AllocState::Ended,
            ReleaseCause::Expired => AllocState::Expired,
            ReleaseCause::Preempted => AllocState::Preempted,
        }
    }
}

impl FromStr for ReleaseCause {
    type Err = AppError;
    fn from_str(s: &str) -> Result<Self, AppError> {
        ReleaseCause::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| AppError::invalid("release_cause", format!("unknown release cause {s}")))
    }
}

/// Why an active allocation has a preemption deadline (`preempt_at`): the stored
/// `preempt_cause`, or a booking's claim on its capacity. Ordered so that, of two drains
/// with one deadline, a plain drain is named before a health drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreemptCause {
    /// Borrowed capacity reclaimed for a team's guaranteed share.
    Reclaim,
    /// Its node is drained by a platform admin.
    Drain,
    /// Its GPU turned unhealthy and is taken out of service.
    Health,
    /// Its capacity is booked by a team from the deadline on.
    Booking,
}

impl PreemptCause {
    pub const ALL: [PreemptCause; 4] = [
        PreemptCause::Reclaim,
        PreemptCause::Drain,
        PreemptCause::Health,
        PreemptCause::Booking,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PreemptCause::Reclaim => "reclaim",
            PreemptCause::Drain => "drain",
            PreemptCause::Health => "health",
            PreemptCause::Booking => "booking",
        }
    }

    /// Whether the allocation goes at its deadline whatever the queue does (a drained or
    /// unhealthy node, a booking): only a reclaim is withdrawn when no longer needed.
    pub fn is_firm(self) -> bool {
        self != PreemptCause::Reclaim
    }
}

impl FromStr for PreemptCause {
    type Err = AppError;
    fn from_str(s: &str) -> Result<Self, AppError> {
        PreemptCause::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| {
                AppError::invalid("preempt_cause", format!("unknown preemption cause {s}"))
            })
    }
}
