//! What the live-update fingerprints read ([`crate::services::changes`]): the visible state
//! of live allocations and workloads, and a summary of the nodes' GPU layouts.

use super::{Store, StoreError, on_pool};
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// A live allocation: team, id, state, why pending, preemption, end, devices.
pub type AllocationMark = (
    Uuid,
    Uuid,
    String,
    Option<String>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    String,
);

/// A live workload: team, id, state, attempt, ready, stop requested.
pub type WorkloadMark = (
    Uuid,
    Uuid,
    String,
    i64,
    Option<DateTime<Utc>>,
    Option<String>,
);

/// The cluster as every signed-in user sees it: (nodes registered and not revoked,
/// Σ desired layout versions, Σ reported versions, Σ lengths of the reported apply
/// statuses — a status that changes almost always changes its length, and the versions
/// catch the rest —, allocations active: the cluster's used capacity).
pub type LayoutMark = (i64, i64, i64, i64, i64);

impl Store {
    pub async fn change_marks(
        &self,
    ) -> Result<(Vec<AllocationMark>, Vec<WorkloadMark>, LayoutMark), StoreError> {
        let allocations = "SELECT team_id, id, state, pending_reason, preempt_at, ends_at, devices \
             FROM allocations WHERE state IN ('pending_approval','queued','placing','active','releasing')";
        let workloads = "SELECT team_id, id, state, attempt, ready_at, stop_state FROM workloads \
             WHERE state IN ('queued','pending','starting','running','stopping')";
        let layouts = "SELECT (SELECT COUNT(*) FROM nodes WHERE revoked_at IS NULL), \
             (SELECT CAST(COALESCE(SUM(version), 0) AS BIGINT) FROM gpu_desired), \
             (SELECT CAST(COALESCE(SUM(version), 0) AS BIGINT) FROM gpu_apply_status), \
             (SELECT CAST(COALESCE(SUM(LENGTH(status)), 0) AS BIGINT) FROM gpu_apply_status), \
             (SELECT COUNT(*) FROM allocations WHERE state = 'active')";
        // PostgreSQL sums BIGINTs to NUMERIC: cast back.
        on_pool!(self, pool => {
            let a = sqlx::query_as::<_, AllocationMark>(allocations).fetch_all(pool).await?;
            let w = sqlx::query_as::<_, WorkloadMark>(workloads).fetch_all(pool).await?;
            let l = sqlx::query_as::<_, LayoutMark>(layouts).fetch_one(pool).await?;
            Ok((a, w, l))
        })
    }
}
