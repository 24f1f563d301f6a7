//! Preemption.

use super::*;
use crate::ids::AllocationId;

/// The team that wants units back on a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub team: TeamId,
    /// Units the team holds on the model now.
    pub used: u32,
    pub guaranteed: u32,
    /// Units of the waiting allocation.
    pub ask: u32,
}

/// An active allocation of another team on the same model, a possible victim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub id: AllocationId,
    pub team: TeamId,
    pub units: u32,
    pub started_at: DateTime<Utc>,
    pub priority: PriorityClass,
    /// Units its team holds on the model now (the same for all of a team's entries).
    pub team_used: u32,
    pub team_guaranteed: u32,
}

/// Allocations to preempt and the units that frees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    pub victims: Vec<AllocationId>,
    pub freed: u32,
}

/// Chooses allocations to preempt so that `needed` units are freed for `claim`.
///
/// Only a claim within its team's guarantee (`used + ask ≤ guaranteed`) may preempt, and
/// only allocations of other teams that borrow (hold more than their guarantee). Victims
/// are taken preemptible first, then normal, then high, newest first within a class; one
/// is skipped if taking it would drop its team below its guarantee. Stops as soon as
/// `freed ≥ needed`; `None` if the claim may not preempt or all eligible victims would not
/// free enough (never preempt in vain). `needed = 0` gives an empty preemption.
pub fn select_victims(claim: &Claim, needed: u32, running: &[Running]) -> Option<Preemption> {
    if claim.used.saturating_add(claim.ask) > claim.guaranteed {
        return None;
    }
    if needed == 0 {
        return Some(Preemption {
            victims: Vec::new(),
            freed: 0,
        });
    }
    let others: Vec<&Running> = running
        .iter()
        .filter(|r| r.team != claim.team && r.units > 0)
        .collect();
    // What each team can lose and stay at its guarantee; the smallest figure if entries
    // disagree, so a team is never driven below its guarantee.
    let mut spare: BTreeMap<TeamId, u32> = BTreeMap::new();
    for r in &others {
        let s = r.team_used.saturating_sub(r.team_guaranteed);
        spare
            .entry(r.team)
            .and_modify(|v| *v = (*v).min(s))
            .or_insert(s);
    }
    let mut order = others;
    order.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then_with(|| b.started_at.cmp(&a.started_at))
            .then_with(|| a.id.cmp(&b.id))
    });
    let mut victims = Vec::new();
    let mut freed = 0u32;
    for r in order {
        let Some(left) = spare.get_mut(&r.team) else {
            continue;
        };
        if r.units > *left {
            continue;
        }
        *left -= r.units;
        freed = freed.saturating_add(r.units);
        victims.push(r.id);
        if freed >= needed {
            return Some(Preemption { victims, freed });
        }
    }
    None
}
