//! Queue order with fair share.

use super::*;
use crate::ids::AllocationId;

/// How far back recent usage counts for fair share.
pub const FAIR_SHARE_WINDOW: TimeDelta = TimeDelta::days(7);

/// Unit-seconds an allocation of `units` that ran from `started_at` to `ended_at` (still
/// running: `None`) used within the fair-share window ending at `now`.
pub fn unit_seconds_in_window(
    units: u32,
    started_at: DateTime<Utc>,
    ended_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> u64 {
    let from = now
        .checked_sub_signed(FAIR_SHARE_WINDOW)
        .map_or(started_at, |w| w.max(started_at));
    let to = ended_at.map_or(now, |e| e.min(now));
    let secs = u64::try_from((to - from).num_seconds()).unwrap_or(0);
    secs.saturating_mul(u64::from(units))
}

/// A team's standing for fair share on one model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FairShare {
    /// Unit-seconds used within [`FAIR_SHARE_WINDOW`] (see [`unit_seconds_in_window`]).
    pub recent_unit_seconds: u64,
    /// The team's guaranteed units on the model.
    pub guaranteed: u32,
}

impl FairShare {
    /// Orders by `recent_unit_seconds / guaranteed`, exactly; teams without a guarantee
    /// come after all teams with one, and among themselves by recent usage.
    pub fn cmp_share(&self, other: &FairShare) -> Ordering {
        match (self.guaranteed, other.guaranteed) {
            (0, 0) => self.recent_unit_seconds.cmp(&other.recent_unit_seconds),
            (0, _) => Ordering::Greater,
            (_, 0) => Ordering::Less,
            (ga, gb) => {
                let a = u128::from(self.recent_unit_seconds) * u128::from(gb);
                let b = u128::from(other.recent_unit_seconds) * u128::from(ga);
                a.cmp(&b)
            }
        }
    }
}

/// A waiting allocation as the queue sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueEntry {
    pub id: AllocationId,
    /// The queue it waits in: one per (canonical) model.
    pub model: String,
    pub team: TeamId,
    pub priority: PriorityClass,
    pub created_at: DateTime<Utc>,
}

fn queue_cmp(a: &QueueEntry, b: &QueueEntry, usage: &BTreeMap<TeamId, FairShare>) -> Ordering {
    let share = |t: &TeamId| usage.get(t).copied().unwrap_or_default();
    b.priority
        .cmp(&a.priority)
        .then_with(|| share(&a.team).cmp_share(&share(&b.team)))
        .then_with(|| a.created_at.cmp(&b.created_at))
        .then_with(|| a.id.cmp(&b.id))
}

/// Ids of `entries` in the order they should be served: priority class (high first),
/// fair share ascending, older first, then id. Teams missing from `usage` count as
/// having no guarantee.
pub fn order_queue(
    entries: &[QueueEntry],
    usage: &BTreeMap<TeamId, FairShare>,
) -> Vec<AllocationId> {
    let mut sorted: Vec<&QueueEntry> = entries.iter().collect();
    sorted.sort_by(|a, b| queue_cmp(a, b, usage));
    sorted.into_iter().map(|e| e.id).collect()
}

/// 1-based position of `id` within its model's queue; `None` if it is not in `entries`.
pub fn position(
    entries: &[QueueEntry],
    usage: &BTreeMap<TeamId, FairShare>,
    id: AllocationId,
) -> Option<u32> {
    let me = entries.iter().find(|e| e.id == id)?;
    let ahead = entries
        .iter()
        .filter(|e| e.model == me.model && queue_cmp(e, me, usage) == Ordering::Less)
        .count();
    u32::try_from(ahead).ok()?.checked_add(1)
}
