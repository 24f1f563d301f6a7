//! The audit trail as platform admins see it: who did what, when, with before/after.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::ids::TeamId;

/// One audit entry. `before`/`after` are JSON documents of the changed object's fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEntryView {
    pub id: Uuid,
    pub at: DateTime<Utc>,
    /// Username; `None` for the system (the scheduler).
    pub actor: Option<String>,
    /// e.g. `allocation.request`, `allocation.approve`, `quota.set`.
    pub action: String,
    pub object_type: String,
    pub object_id: String,
    pub team_id: Option<TeamId>,
    pub before: Option<String>,
    pub after: Option<String>,
}
