//! Bookings: a team holds N of a kind for a future window (docs/operations.md).
//!
//! A booking is admitted when it is made: against the team's quota line for the window
//! (its own bookings that overlap count, its running work does not, since that will have
//! ended or will be warned) and against the capacity that other bookings already hold.
//! Shortly before its start it becomes an allocation that is placed ahead of the queue;
//! work that borrowed the capacity meanwhile is warned through the deadline channel and
//! preempted in time ([`victims`]). The rules here are pure; `core` applies them.

use crate::alloc::{self, AllocPolicy, GpuKind, NewAllocation, PriorityClass, ValidAllocation};
use crate::error::AppError;
use crate::ids::{AllocationId, TeamId};
use crate::mig::Catalog;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// How long before its start a booking's allocation may be placed, so that it is ready
/// at the start: borrowers are preempted this long before the start (the stop grace of
/// 10 s between SIGTERM and SIGKILL, and a node report to free the device).
pub const READY_LEAD: Duration = Duration::seconds(20);

/// A booking as a form or REST client sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewBooking {
    /// The team that books, as a UUID.
    pub team_id: String,
    /// `H100-80GB:whole` or a MIG kind such as `H100-80GB:1g.10gb` (shares cannot be booked).
    pub kind: String,
    /// How many of `kind`; 1 when absent.
    #[serde(default = "one")]
    pub count: u32,
    /// Start of the window, RFC 3339 or `YYYY-MM-DDTHH:MM` in UTC; in the future.
    pub starts_at: String,
    /// End of the window, same forms; after `starts_at`.
    pub ends_at: String,
    /// What it is for, at most 500 characters.
    #[serde(default)]
    pub purpose: String,
}

fn one() -> u32 {
    1
}

/// A booking that passed [`validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidBooking {
    pub alloc: ValidAllocation,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
}

impl ValidBooking {
    /// The quota line and capacity it counts on (the model).
    pub fn model(&self) -> &str {
        self.alloc.kind().model()
    }
    pub fn units(&self) -> u32 {
        self.alloc.units()
    }
}

/// Checks a booking at `now`: the kind, count and length as a request is checked
/// ([`alloc::validate`]), a window that lies ahead and ends after it starts. Errors name
/// the field (`starts_at`, `ends_at`, `kind`, `count`, …).
pub fn validate(
    input: &NewBooking,
    policy: &AllocPolicy,
    catalog: &Catalog,
    now: DateTime<Utc>,
) -> Result<ValidBooking, AppError> {
    let starts_at = parse_time("starts_at", &input.starts_at)?;
    let ends_at = parse_time("ends_at", &input.ends_at)?;
    if starts_at <= now {
        return Err(AppError::invalid("starts_at", "is in the past"));
    }
    if ends_at <= starts_at {
        return Err(AppError::invalid("ends_at", "must be after starts_at"));
    }
    let minutes = (ends_at - starts_at).num_seconds().div_euclid(60).max(1);
    let as_request = NewAllocation {
        team_id: input.team_id.clone(),
        kind: input.kind.clone(),
        count: input.count,
        duration_minutes: Some(u32::try_from(minutes).unwrap_or(u32::MAX)),
        starts_at: Some(starts_at.to_rfc3339()),
        priority: None,
        purpose: input.purpose.clone(),
        needs_cuda: None,
        nodes: None,
    };
    let alloc = alloc::validate(&as_request, policy, catalog, now).map_err(|e| {
        // The request's length is the window's.
        if e.field() == Some("duration_minutes") {
            AppError::invalid(
                "ends_at",
                e.to_string()
                    .replacen("duration_minutes: ", "the window ", 1),
            )
        } else {
            e
        }
    })?;
    if matches!(alloc.kind(), GpuKind::Share { .. }) {
        return Err(AppError::invalid(
            "kind",
            "shares cannot be booked; book whole GPUs or MIG slices",
        ));
    }
    Ok(ValidBooking {
        alloc,
        starts_at,
        ends_at,
    })
}

fn parse_time(field: &'static str, raw: &str) -> Result<DateTime<Utc>, AppError> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Err(AppError::invalid(field, "is required"));
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
        return Ok(t.with_timezone(&Utc));
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"]
        .iter()
        .find_map(|f| chrono::NaiveDateTime::parse_from_str(raw, f).ok())
        .map(|t| t.and_utc())
        .ok_or_else(|| {
            AppError::invalid(field, "must be a UTC date and time like 2025-05-01T14:00")
        })
}

/// A booking already made, as admission sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub team: TeamId,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub units: u32,
}

/// The most units `held` hold at one moment of `[from, to)`.
pub fn peak(held: &[Held], from: DateTime<Utc>, to: DateTime<Utc>) -> u32 {
    // Sweep: +units at each start, −units at each end, within the window; ends sort first
    // at equal times (a booking ending at 10:00 and one starting then do not overlap).
    let mut edges: Vec<(DateTime<Utc>, i64)> = Vec::new();
    for h in held.iter().filter(|h| h.starts_at < to && h.ends_at > from) {
        edges.push((h.starts_at.max(from), i64::from(h.units)));
        edges.push((h.ends_at.min(to), -i64::from(h.units)));
    }
    edges.sort_by_key(|&(t, d)| (t, d));
    let (mut now, mut most) = (0i64, 0i64);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    u32::try_from(most).unwrap_or(u32::MAX)
}

/// Where a new booking stands: what the model's capacity is and what is already booked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing<'a> {
    /// Units of the model on in-service GPUs (no drained, unhealthy or spare ones).
    pub capacity: u32,
    /// The team's limit on the model's quota line (`None`: no line, nothing may be booked).
    pub team_limit: Option<u32>,
    /// Every live booking of the model that overlaps the window.
    pub held: &'a [Held],
}

/// Whether `b` (for `team`) can be honoured: it fits in the cluster, in the team's limit
/// for its window, and in what other bookings leave. The refusal says why.
pub fn admit(b: &ValidBooking, team: TeamId, s: &Standing<'_>) -> Result<(), AppError> {
    let units = b.units();
    let model = b.model();
    if units > s.capacity {
        return Err(AppError::invalid(
            "count",
            format!(
                "more than the cluster has: {model} has {} in service",
                units_words(s.capacity)
            ),
        ));
    }
    let Some(limit) = s.team_limit else {
        return Err(AppError::invalid(
            "kind",
            format!("the team has no quota for {model}; a platform admin can set one"),
        ));
    };
    let own: Vec<Held> = s.held.iter().copied().filter(|h| h.team == team).collect();
    let own_peak = peak(&own, b.starts_at, b.ends_at);
    if u64::from(own_peak) + u64::from(units) > u64::from(limit) {
        return Err(AppError::invalid(
            "count",
            format!(
                "over the team's {model} limit of {} for that window: it has {} booked then",
                units_words(limit),
                units_words(own_peak)
            ),
        ));
    }
    let all_peak = peak(s.held, b.starts_at, b.ends_at);
    if u64::from(all_peak) + u64::from(units) > u64::from(s.capacity) {
        return Err(AppError::conflict(format!(
            "{model} is fully booked for that window: {} of {} are booked at its busiest; \
             {} left",
            units_words(all_peak),
            units_words(s.capacity),
            units_words(s.capacity.saturating_sub(all_peak))
        )));
    }
    Ok(())
}

fn units_words(n: u32) -> String {
    crate::text::count(u64::from(n), "unit", "units")
}

/// A running allocation that a starting booking may take capacity from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Borrower {
    pub id: AllocationId,
    pub units: u32,
    pub priority: PriorityClass,
    pub started_at: DateTime<Utc>,
}

/// Which borrowers go so that `short` units are free for a booking: preemptible first,
/// then normal, then high; the newest first within a class (it loses the least work).
/// Empty when they cannot free enough together (nothing is preempted in vain).
pub fn victims(short: u32, borrowers: &[Borrower]) -> Vec<AllocationId> {
    if short == 0 {
        return Vec::new();
    }
    let mut order: Vec<&Borrower> = borrowers.iter().collect();
    order.sort_by_key(|b| (rank(b.priority), std::cmp::Reverse(b.started_at), b.id));
    let mut freed = 0u32;
    let mut out = Vec::new();
    for b in order {
        if freed >= short {
            break;
        }
        freed = freed.saturating_add(b.units);
        out.push(b.id);
    }
    if freed >= short { out } else { Vec::new() }
}

fn rank(p: PriorityClass) -> u8 {
    match p {
        PriorityClass::Preemptible => 0,
        PriorityClass::Normal => 1,
        PriorityClass::High => 2,
    }
}

/// A booking as the calendar and its page show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BookingView {
    /// `None` for another team's booking on the calendar (it shows only that the
    /// capacity is taken).
    pub id: Option<Uuid>,
    /// `None` for another team's booking (for a platform admin: always set).
    pub team_id: Option<TeamId>,
    pub team_name: Option<String>,
    pub kind: String,
    pub model: String,
    pub count: u32,
    pub units: u32,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub purpose: String,
    /// `booked` (ahead), `starting` (its allocation exists), `ended`, `cancelled`.
    pub state: String,
    /// Who booked it (own team's only).
    pub booked_by: Option<String>,
    /// The allocation that holds it once it starts.
    pub allocation_id: Option<AllocationId>,
}

/// The state a booking is shown in at `now`.
pub fn state_label(
    cancelled: bool,
    allocation: Option<AllocationId>,
    ends_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> &'static str {
    if cancelled {
        "cancelled"
    } else if ends_at <= now {
        "ended"
    } else if allocation.is_some() {
        "started"
    } else {
        "booked"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, h, 0, 0)
            .single()
            .expect("valid")
    }
    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0)
            .single()
            .expect("valid")
    }
    fn team(n: u128) -> TeamId {
        TeamId(Uuid::from_u128(n))
    }
    fn input(kind: &str, count: u32, from: &str, to: &str) -> NewBooking {
        NewBooking {
            team_id: team(1).to_string(),
            kind: kind.into(),
            count,
            starts_at: from.into(),
            ends_at: to.into(),
            purpose: String::new(),
        }
    }
    fn check(i: &NewBooking) -> Result<ValidBooking, AppError> {
        validate(i, &AllocPolicy::default(), &Catalog::builtin(), now())
    }
    fn field(i: &NewBooking) -> String {
        check(i)
            .expect_err("refused")
            .field()
            .unwrap_or("")
            .to_owned()
    }
    fn held(team_n: u128, from: u32, to: u32, units: u32) -> Held {
        Held {
            team: team(team_n),
            starts_at: t(from),
            ends_at: t(to),
            units,
        }
    }

    #[test]
    fn a_window_ahead_is_valid_and_counts_units() {
        let b = check(&input(
            "H100-80GB:whole",
            2,
            "2026-12-01T09:00",
            "2026-12-01T17:00",
        ))
        .expect("valid");
        assert_eq!(b.starts_at, t(9));
        assert_eq!(b.ends_at, t(17));
        assert_eq!(b.units(), 14);
        assert_eq!(b.model(), "H100-80GB");
        assert_eq!(b.alloc.duration_minutes(), 8 * 60);
    }

    #[test]
    fn bad_windows_name_their_field() {
        let past = input("H100-80GB:whole", 1, "2026-11-30T11:00", "2026-12-01T17:00");
        assert_eq!(field(&past), "starts_at");
        let backwards = input("H100-80GB:whole", 1, "2026-12-01T17:00", "2026-12-01T09:00");
        assert_eq!(field(&backwards), "ends_at");
        let same = input("H100-80GB:whole", 1, "2026-12-01T09:00", "2026-12-01T09:00");
        assert_eq!(field(&same), "ends_at");
        let garbled = input("H100-80GB:whole", 1, "tomorrow", "2026-12-01T09:00");
        assert_eq!(field(&garbled), "starts_at");
        let long = input("H100-80GB:whole", 1, "2026-12-01T09:00", "2026-12-20T09:00");
        assert_eq!(field(&long), "ends_at");
        let far = input("H100-80GB:whole", 1, "2027-03-01T09:00", "2027-03-01T10:00");
        assert_eq!(field(&far), "starts_at");
        let share = input(
            "H100-80GB:share:250",
            1,
            "2026-12-01T09:00",
            "2026-12-01T10:00",
        );
        assert_eq!(field(&share), "kind");
        let none = input("H100-80GB:whole", 0, "2026-12-01T09:00", "2026-12-01T10:00");
        assert_eq!(field(&none), "count");
        let unknown = input("Z9000:whole", 1, "2026-12-01T09:00", "2026-12-01T10:00");
        assert_eq!(field(&unknown), "kind");
    }

    #[test]
    fn peak_is_the_busiest_moment_in_the_window() {
        let h = [held(1, 9, 12, 7), held(2, 11, 14, 7), held(3, 13, 15, 7)];
        assert_eq!(peak(&h, t(9), t(17)), 14);
        assert_eq!(peak(&h, t(9), t(11)), 7);
        // Touching windows do not overlap.
        assert_eq!(peak(&h, t(12), t(13)), 7);
        assert_eq!(peak(&h, t(15), t(17)), 0);
        assert_eq!(peak(&[], t(9), t(17)), 0);
    }

    #[test]
    fn admission_checks_cluster_team_limit_and_other_bookings() {
        let b = check(&input(
            "H100-80GB:whole",
            1,
            "2026-12-01T10:00",
            "2026-12-01T12:00",
        ))
        .expect("valid");
        let others = [held(2, 9, 11, 14)];
        let s = |capacity, limit, held| Standing {
            capacity,
            team_limit: limit,
            held,
        };
        assert!(admit(&b, team(1), &s(28, Some(14), &others)).is_ok());
        // Fully booked: a conflict that says how much is left.
        let e = admit(&b, team(1), &s(14, Some(14), &others)).expect_err("refused");
        assert!(matches!(e, AppError::Conflict { .. }), "{e:?}");
        assert!(e.to_string().contains("fully booked"), "{e}");
        // More than the cluster has at all.
        let e = admit(&b, team(1), &s(6, Some(14), &[])).expect_err("refused");
        assert_eq!(e.field(), Some("count"));
        // The team's own bookings in the window count against its limit; others' do not.
        let mine = [held(1, 11, 13, 7)];
        assert_eq!(
            admit(&b, team(1), &s(28, Some(13), &mine))
                .expect_err("refused")
                .field(),
            Some("count")
        );
        assert!(admit(&b, team(1), &s(28, Some(14), &mine)).is_ok());
        assert!(admit(&b, team(3), &s(28, Some(7), &mine)).is_ok());
        // No quota line: nothing to book.
        assert_eq!(
            admit(&b, team(1), &s(28, None, &[]))
                .expect_err("refused")
                .field(),
            Some("kind")
        );
    }

    #[test]
    fn victims_are_the_cheapest_to_lose_and_never_in_vain() {
        let alloc = |n: u128| AllocationId(Uuid::from_u128(n));
        let b = |n: u128, units, priority, h| Borrower {
            id: alloc(n),
            units,
            priority,
            started_at: t(h),
        };
        let running = [
            b(1, 7, PriorityClass::High, 1),
            b(2, 7, PriorityClass::Normal, 2),
            b(3, 7, PriorityClass::Normal, 3),
            b(4, 1, PriorityClass::Preemptible, 1),
        ];
        assert_eq!(victims(0, &running), Vec::<AllocationId>::new());
        assert_eq!(victims(1, &running), vec![alloc(4)]);
        // Newest normal after the preemptible one.
        assert_eq!(victims(7, &running), vec![alloc(4), alloc(3)]);
        assert_eq!(victims(15, &running), vec![alloc(4), alloc(3), alloc(2)]);
        assert_eq!(victims(23, &running), Vec::<AllocationId>::new());
    }

    #[test]
    fn states_follow_the_window() {
        let id = Some(AllocationId(Uuid::from_u128(9)));
        assert_eq!(state_label(false, None, t(12), t(9)), "booked");
        assert_eq!(state_label(false, id, t(12), t(10)), "started");
        assert_eq!(state_label(false, id, t(12), t(12)), "ended");
        assert_eq!(state_label(true, id, t(12), t(10)), "cancelled");
    }
}
