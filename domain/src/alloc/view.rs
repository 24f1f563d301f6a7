//! Views.

use super::*;
use crate::ids::{AllocationId, NodeId};

/// Why and how long a pending allocation waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PendingInfo {
    /// 1-based place in its model's queue; `None` while pending approval.
    pub position: Option<u32>,
    /// Plain words, from [`pending_explanation`].
    pub reason: String,
    /// `None` when unknown; never a guess.
    pub eta: Option<DateTime<Utc>>,
}

impl PendingInfo {
    /// Composes the reason with [`pending_explanation`].
    pub fn new(
        position: Option<u32>,
        model: &str,
        planner_reason: Option<&str>,
        eta: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Self {
        Self {
            position,
            reason: pending_explanation(position, model, planner_reason, eta, now),
            eta,
        }
    }
}

/// One step in an allocation's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Transition {
    pub at: DateTime<Utc>,
    /// `None` for the creation step.
    pub from: Option<AllocState>,
    pub to: AllocState,
    /// Username of whoever caused it; `None` for the system.
    pub by: Option<String>,
    pub note: Option<String>,
}

/// An allocation as the UI and REST API show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AllocationView {
    pub id: AllocationId,
    pub team_id: TeamId,
    pub team_name: String,
    pub user_id: UserId,
    pub username: String,
    /// Canonical kind string, e.g. `H100-80GB:1g.10gb`.
    pub kind: String,
    /// e.g. `1g.10gb on H100-80GB`.
    pub kind_label: String,
    pub count: u32,
    /// Quota units (compute slices) of the whole allocation.
    pub units: u32,
    pub priority: PriorityClass,
    pub state: AllocState,
    pub purpose: String,
    pub created_at: DateTime<Utc>,
    pub starts_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
    /// Where it runs: one entry per MIG instance or whole GPU; empty until placed.
    pub devices: Vec<AllocatedDevice>,
    /// Who must approve it while `pending_approval`.
    pub approver: Option<Approver>,
    /// Why it needs approval, or the approver's reason for the decision.
    pub approval_reason: Option<String>,
    /// Present while pending.
    pub pending: Option<PendingInfo>,
    /// When a preemption warning runs out and the allocation is released.
    pub preempt_at: Option<DateTime<Utc>>,
    /// A platform admin approved it beyond the team's limit (an audited override).
    #[serde(default)]
    pub over_limit: bool,
    /// A platform admin approved it beyond the team's hard budget (an audited override).
    #[serde(default)]
    pub over_budget: bool,
    /// The CUDA version its node's driver must support (e.g. `12.4`); absent: any node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, example = "12.4"))]
    pub needs_cuda: Option<crate::image::CudaVersion>,
    /// A gang's node count (`count` is the whole gang's, an equal part on each node);
    /// absent: one node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    /// Oldest first.
    pub history: Vec<Transition>,
}

/// One device of an allocation: a MIG instance (`profile`, `start`, and `mig_uuid` once
/// the agent reports it) or a whole GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AllocatedDevice {
    pub node_id: NodeId,
    pub hostname: String,
    pub gpu_uuid: String,
    #[serde(default)]
    pub profile: Option<String>,
    #[serde(default)]
    pub start: Option<u8>,
    #[serde(default)]
    pub mig_uuid: Option<String>,
}

/// A team's quota on one model and how much of it is in use, in units.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaView {
    pub team_id: TeamId,
    pub team_name: String,
    pub model: String,
    pub guaranteed: u32,
    pub limit: u32,
    pub per_user: u32,
    /// Units held by allocations that hold quota.
    pub used: u32,
    /// Units of `used` beyond `guaranteed`.
    pub borrowed: u32,
    /// Units of `used` that a platform admin approved beyond the limit (an override).
    #[serde(default)]
    pub overridden: u32,
}

impl QuotaView {
    /// The view of `quota` with `used` units held; `borrowed` is derived.
    pub fn new(
        team_id: TeamId,
        team_name: String,
        model: String,
        quota: &Quota,
        used: u32,
    ) -> Self {
        Self {
            team_id,
            team_name,
            model,
            guaranteed: quota.guaranteed(),
            limit: quota.limit(),
            per_user: quota.per_user(),
            used,
            borrowed: quota.borrowed(used),
            overridden: 0,
        }
    }
}
