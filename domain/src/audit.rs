//! The audit trail as platform admins see it: who did what, when, with before/after.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use uuid::Uuid;

use crate::error::AppError;
use crate::ids::TeamId;

/// One audit entry. `before`/`after` are JSON documents of the changed object's fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEntryView {
    pub id: Uuid,
    pub at: DateTime<Utc>,
    /// Username; `None` for the system (the scheduler).
    pub actor: Option<String>,
    /// An [`AuditAction`]'s text (`allocation.request`, `quota.set`, …); text, so entries
    /// of an action a later release no longer writes still read.
    pub action: String,
    pub object_type: String,
    pub object_id: String,
    pub team_id: Option<TeamId>,
    pub before: Option<String>,
    pub after: Option<String>,
}

macro_rules! audit_actions {
    ($($(#[$doc:meta])* $v:ident => $s:literal,)*) => {
        /// What an audit entry records: one list for the services that write entries and
        /// the audit page's filter, so the page offers every action there is.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        #[serde(try_from = "String", into = "String")]
        pub enum AuditAction {
            $($(#[$doc])* $v,)*
        }

        impl AuditAction {
            pub const ALL: &'static [AuditAction] = &[$(AuditAction::$v,)*];

            /// As stored and as the REST filter takes it: `allocation.request`, ….
            pub fn as_str(self) -> &'static str {
                match self {
                    $(AuditAction::$v => $s,)*
                }
            }
        }
    };
}

audit_actions! {
    AllocationRequest => "allocation.request",
    /// Admitted from `pending_approval` without a decision (room freed up).
    AllocationAdmit => "allocation.admit",
    AllocationApprove => "allocation.approve",
    AllocationDeny => "allocation.deny",
    /// A platform admin approved it beyond a limit or a hard budget.
    AllocationOverride => "allocation.override",
    AllocationPlace => "allocation.place",
    AllocationExtend => "allocation.extend",
    AllocationRelease => "allocation.release",
    AllocationExpire => "allocation.expire",
    AllocationPreempt => "allocation.preempt",
    /// Moved to a hot spare.
    AllocationDisplace => "allocation.displace",
    AllocationFail => "allocation.fail",
    QuotaSet => "quota.set",
    PriorityGrant => "priority.grant",
    PriorityRevoke => "priority.revoke",
    TeamGrace => "team.grace",
    BudgetSet => "budget.set",
    RateSet => "rate.set",
    LedgerReverse => "ledger.reverse",
    BookingCreate => "booking.create",
    BookingCancel => "booking.cancel",
    NodeDrain => "node.drain",
    NodeUndrain => "node.undrain",
    NodeGroup => "node.group",
    NodeHealthClear => "node.health_clear",
    SparesSet => "spares.set",
    SparesClear => "spares.clear",
    NotebookStart => "notebook.start",
    NotebookStop => "notebook.stop",
    JobStart => "job.start",
    JobStop => "job.stop",
    JobRequeue => "job.requeue",
    JobRetry => "job.retry",
    WorkloadExec => "workload.exec",
    NotebookAdminAccess => "notebook.admin_access",
    NotebookIdleReclaim => "notebook.idle_reclaim",
    NotebookProfileSave => "notebook_profile.save",
    NotebookProfileDelete => "notebook_profile.delete",
    ImageAdd => "image.add",
    ImageRemove => "image.remove",
    RegistryAllow => "registry.allow",
    RegistryDisallow => "registry.disallow",
    RegistryLoginSet => "registry_login.set",
    RegistryLoginRemove => "registry_login.remove",
    SsoUserCreated => "sso.user_created",
    SsoGrantsChanged => "sso.grants_changed",
}

impl AuditAction {
    /// A workload of `kind` launched.
    pub fn start(kind: crate::workload::WorkloadKind) -> Self {
        match kind {
            crate::workload::WorkloadKind::Notebook => AuditAction::NotebookStart,
            crate::workload::WorkloadKind::Job => AuditAction::JobStart,
        }
    }

    /// A workload of `kind` stopped by a person.
    pub fn stop(kind: crate::workload::WorkloadKind) -> Self {
        match kind {
            crate::workload::WorkloadKind::Notebook => AuditAction::NotebookStop,
            crate::workload::WorkloadKind::Job => AuditAction::JobStop,
        }
    }
}

impl FromStr for AuditAction {
    type Err = AppError;
    fn from_str(s: &str) -> Result<Self, AppError> {
        AuditAction::ALL
            .iter()
            .copied()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| AppError::invalid("action", format!("unknown audit action {s}")))
    }
}

impl TryFrom<String> for AuditAction {
    type Error = AppError;
    fn try_from(s: String) -> Result<Self, AppError> {
        s.parse()
    }
}

impl From<AuditAction> for String {
    fn from(a: AuditAction) -> Self {
        a.as_str().to_owned()
    }
}

impl fmt::Display for AuditAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_action_reads_back_from_its_text_and_no_two_share_one() {
        let mut seen = std::collections::HashSet::new();
        for a in AuditAction::ALL {
            assert_eq!(a.as_str().parse::<AuditAction>().ok(), Some(*a));
            assert!(seen.insert(a.as_str()), "{a} twice");
        }
        assert!("allocation.bogus".parse::<AuditAction>().is_err());
    }
}
