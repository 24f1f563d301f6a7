//! Why pending, and when.

use super::*;

/// The earliest known end time at which `free_now` plus the units freed by allocations
/// ending by then reach `needed`. `None` when no known end frees enough, or when enough
/// is already free (then units do not explain the wait, e.g. free slices are on the
/// wrong GPUs, and there is no honest estimate).
pub fn eta(needed: u32, free_now: u32, ends: &[(DateTime<Utc>, u32)]) -> Option<DateTime<Utc>> {
    if free_now >= needed {
        return None;
    }
    let mut ends: Vec<(DateTime<Utc>, u32)> = ends.to_vec();
    ends.sort();
    let mut free = free_now;
    for (at, units) in ends {
        free = free.saturating_add(units);
        if free >= needed {
            return Some(at);
        }
    }
    None
}

/// Plain words on why an allocation waits, e.g. `2nd in the H100-80GB queue. No free
/// 1g.10gb. Expected by 14:00 UTC.` Parts: the queue position (if queued), the planner's
/// reason (if any), and the ETA (time only when it is today at `now`, else with the date;
/// unknown, and what it waits for, when the reason is a driver too old).
pub fn pending_explanation(
    position: Option<u32>,
    model: &str,
    reason: Option<&str>,
    eta: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> String {
    let mut parts = Vec::new();
    if let Some(p) = position {
        parts.push(format!("{} in the {model} queue", ordinal(p)));
    }
    if let Some(r) = reason
        .map(|r| r.trim().trim_end_matches('.'))
        .filter(|r| !r.is_empty())
    {
        parts.push(r.to_owned());
    }
    parts.push(match eta {
        None if reason.is_some_and(crate::planner::waits_for_driver) => {
            "ETA unknown: it starts once a node whose driver supports it has room".to_owned()
        }
        Some(t) if t.date_naive() == now.date_naive() => {
            format!("expected by {} UTC", t.format("%H:%M"))
        }
        Some(t) => format!("expected by {} UTC", t.format("%Y-%m-%d %H:%M")),
        None => "no known end time frees enough: ETA unknown".to_owned(),
    });
    let sentences: Vec<String> = parts.iter().map(|p| capitalize(p)).collect();
    format!("{}.", sentences.join(". "))
}

pub(super) fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}
