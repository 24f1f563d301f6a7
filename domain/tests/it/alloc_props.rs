//! Invariants of the allocation rules: admission never exceeds a quota, preemption never
//! takes a team below its guarantee nor preempts in vain, the queue is a fair permutation.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use tessera_domain::alloc::{
    Admission, Approver, Claim, FairShare, GpuKind, PriorityClass, QueueEntry, Quota, Running,
    Usage, admit, order_queue, position, select_victims,
};
use tessera_domain::ids::{AllocationId, TeamId};
use uuid::Uuid;

fn team(n: u8) -> TeamId {
    TeamId(Uuid::from_u128(u128::from(n)))
}

fn base() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 5, 1, 0, 0, 0).unwrap()
}

fn priority() -> impl Strategy<Value = PriorityClass> {
    prop_oneof![
        Just(PriorityClass::High),
        Just(PriorityClass::Normal),
        Just(PriorityClass::Preemptible),
    ]
}

/// `(guaranteed, limit, per_user)` with both bounded by the limit.
fn quota() -> impl Strategy<Value = (u32, u32, u32)> {
    (0..=30u32).prop_flat_map(|limit| (0..=limit, Just(limit), 0..=limit))
}

proptest! {
    #[test]
    fn admitted_asks_never_exceed_the_limit_or_the_per_user_cap(
        (g, l, u) in quota(),
        asks in prop::collection::vec((0..3usize, 1..=10u32), 0..40),
    ) {
        let q = Quota::new(g, l, u).unwrap();
        let mut team_used = 0u32;
        let mut user_used = [0u32; 3];
        let mut borrowed = 0u32;
        for (user, ask) in asks {
            let before = Usage { team: team_used, user: user_used[user] };
            match admit("H100-80GB", Some(&q), before, ask) {
                Admission::Admit { borrowed: b } => {
                    prop_assert!(b <= ask);
                    team_used += ask;
                    user_used[user] += ask;
                    borrowed += b;
                }
                Admission::NeedsApproval { by, reason } => {
                    prop_assert!(team_used + ask > l || user_used[user] + ask > u);
                    prop_assert!(!reason.is_empty());
                    if by == Approver::TeamAdmin {
                        prop_assert!(team_used + ask <= g);
                    }
                }
                Admission::NotEntitled { .. } => prop_assert_eq!(l, 0),
            }
            prop_assert!(team_used <= l);
            prop_assert!(user_used.iter().all(|&x| x <= u));
            prop_assert_eq!(borrowed, team_used.saturating_sub(g));
        }
    }

    #[test]
    fn preemption_keeps_guarantees_and_frees_enough(
        teams in prop::collection::vec(
            (prop::collection::vec((1..=7u32, priority(), 0..600i64), 1..5), 0..=20u32),
            1..5,
        ),
        own in prop::collection::vec(1..=7u32, 0..3),
        (used, ask, spare_g) in (0..=7u32, 1..=7u32, 0..=7u32),
        needed in 0..=30u32,
    ) {
        // Teams 2.. hold allocations; their guarantee is at most what they use.
        let mut running = Vec::new();
        let mut used_by: BTreeMap<TeamId, (u32, u32)> = BTreeMap::new();
        let mut next = 0u128;
        for (i, (allocs, g)) in teams.iter().enumerate() {
            let t = team(u8::try_from(i).unwrap() + 2);
            let total: u32 = allocs.iter().map(|a| a.0).sum();
            let g = (*g).min(total);
            used_by.insert(t, (total, g));
            for &(units, p, start) in allocs {
                next += 1;
                running.push(Running {
                    id: AllocationId(Uuid::from_u128(next)),
                    team: t,
                    units,
                    started_at: base() + TimeDelta::minutes(start),
                    priority: p,
                    team_used: total,
                    team_guaranteed: g,
                });
            }
        }
        // The claiming team's own allocations must never be chosen.
        let own_total: u32 = own.iter().sum();
        for units in own {
            next += 1;
            running.push(Running {
                id: AllocationId(Uuid::from_u128(next)),
                team: team(1),
                units,
                started_at: base(),
                priority: PriorityClass::Preemptible,
                team_used: own_total,
                team_guaranteed: 0,
            });
        }
        let claim = Claim { team: team(1), used, guaranteed: used + ask + spare_g, ask };
        let eligible: u32 = used_by.values().map(|(u, g)| u - g).sum();

        match select_victims(&claim, needed, &running) {
            Some(p) => {
                let by_id: BTreeMap<AllocationId, &Running> = running.iter().map(|r| (r.id, r)).collect();
                let unique: BTreeSet<AllocationId> = p.victims.iter().copied().collect();
                prop_assert_eq!(unique.len(), p.victims.len());
                let mut taken: BTreeMap<TeamId, u32> = BTreeMap::new();
                let mut freed = 0;
                for v in &p.victims {
                    let r = by_id[v];
                    prop_assert_ne!(r.team, team(1));
                    *taken.entry(r.team).or_default() += r.units;
                    freed += r.units;
                }
                prop_assert_eq!(freed, p.freed);
                prop_assert!(p.freed >= needed);
                for (t, lost) in taken {
                    let (u, g) = used_by[&t];
                    prop_assert!(u - lost >= g, "team {t} left below its guarantee");
                }
                // It stops as soon as enough is freed.
                if let Some(last) = p.victims.last() {
                    prop_assert!(p.freed - by_id[last].units < needed);
                }
            }
            None => prop_assert!(needed > 0),
        }
        if needed > eligible {
            prop_assert_eq!(select_victims(&claim, needed, &running), None);
        }
        // A claim beyond its guarantee never preempts.
        let greedy = Claim { guaranteed: used + ask - 1, ..claim };
        prop_assert_eq!(select_victims(&greedy, needed, &running), None);
    }

    #[test]
    fn with_one_unit_allocations_preemption_succeeds_exactly_when_borrowed_units_suffice(
        teams in prop::collection::vec((1..=6u32, 0..=6u32), 1..5),
        needed in 1..=20u32,
    ) {
        let mut running = Vec::new();
        let mut borrowed = 0;
        let mut next = 0u128;
        for (i, &(count, g)) in teams.iter().enumerate() {
            let g = g.min(count);
            borrowed += count - g;
            for k in 0..count {
                next += 1;
                running.push(Running {
                    id: AllocationId(Uuid::from_u128(next)),
                    team: team(u8::try_from(i).unwrap() + 2),
                    units: 1,
                    started_at: base() + TimeDelta::minutes(i64::from(k)),
                    priority: PriorityClass::Normal,
                    team_used: count,
                    team_guaranteed: g,
                });
            }
        }
        let claim = Claim { team: team(1), used: 0, guaranteed: 30, ask: needed };
        let got = select_victims(&claim, needed, &running);
        prop_assert_eq!(got.is_some(), needed <= borrowed);
        if let Some(p) = got {
            prop_assert_eq!(p.freed, needed);
        }
    }

    #[test]
    fn the_queue_is_a_permutation_ordered_by_priority_then_fair_share(
        raw in prop::collection::vec((priority(), 0..4u8, 0..1000i64), 0..30),
        usage in prop::collection::vec((0..1_000_000u64, 0..5u32), 4),
    ) {
        let entries: Vec<QueueEntry> = raw
            .iter()
            .enumerate()
            .map(|(i, &(p, t, age))| QueueEntry {
                id: AllocationId(Uuid::from_u128(u128::try_from(i).unwrap() + 1)),
                model: "H100-80GB".into(),
                team: team(t),
                priority: p,
                created_at: base() + TimeDelta::minutes(age),
            })
            .collect();
        let usage: BTreeMap<TeamId, FairShare> = usage
            .iter()
            .enumerate()
            .map(|(t, &(u, g))| {
                (team(u8::try_from(t).unwrap()), FairShare { recent_unit_seconds: u, guaranteed: g })
            })
            .collect();
        let order = order_queue(&entries, &usage);

        let mut sorted = order.clone();
        sorted.sort();
        let mut ids: Vec<AllocationId> = entries.iter().map(|e| e.id).collect();
        ids.sort();
        prop_assert_eq!(sorted, ids);

        let by_id: BTreeMap<AllocationId, &QueueEntry> = entries.iter().map(|e| (e.id, e)).collect();
        for pair in order.windows(2) {
            let (a, b) = (by_id[&pair[0]], by_id[&pair[1]]);
            prop_assert!(a.priority >= b.priority);
            if a.priority == b.priority {
                let (sa, sb) = (usage[&a.team], usage[&b.team]);
                prop_assert!(sa.cmp_share(&sb).is_le());
                if sa.cmp_share(&sb).is_eq() {
                    prop_assert!(a.created_at <= b.created_at);
                }
            }
        }
        for (i, id) in order.iter().enumerate() {
            prop_assert_eq!(position(&entries, &usage, *id), Some(u32::try_from(i).unwrap() + 1));
        }
    }

    #[test]
    fn kind_strings_round_trip(
        model in "[A-Z][A-Z0-9-]{0,15}",
        which in 0..3u8,
        profile in "[1-7]g\\.[0-9]{1,3}gb(\\+me)?",
        milli in 1..=1000u32,
    ) {
        let kind = match which {
            0 => GpuKind::Mig { model, profile },
            1 => GpuKind::Whole { model },
            _ => GpuKind::Share { model, milli },
        };
        prop_assert_eq!(kind.to_string().parse::<GpuKind>().unwrap(), kind);
    }
}
