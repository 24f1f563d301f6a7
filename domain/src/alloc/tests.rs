use super::*;
use crate::ids::AllocationId;
use chrono::TimeZone;
use uuid::Uuid;

#[test]
fn the_request_form_is_read_with_defaults_and_field_errors() {
    let form = AllocationForm {
        team_id: "t".into(),
        kind: "H100-80GB:1g.10gb".into(),
        ..AllocationForm::default()
    };
    let a = NewAllocation::from_form(form.clone()).unwrap();
    assert_eq!((a.count, a.duration_minutes), (1, None));
    let a = NewAllocation::from_form(AllocationForm {
        count: " 3 ".into(),
        duration_hours: "2".into(),
        ..form.clone()
    })
    .unwrap();
    assert_eq!((a.count, a.duration_minutes), (3, Some(120)));
    for (count, hours, field) in [("x", "", "count"), ("1", "1.5", "duration_hours")] {
        let e = NewAllocation::from_form(AllocationForm {
            count: count.into(),
            duration_hours: hours.into(),
            ..form.clone()
        })
        .unwrap_err();
        assert!(
            matches!(&e, AppError::Invalid { field: f, .. } if f == field),
            "{e:?}"
        );
    }
}

fn t(h: u32, m: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 5, 1, h, m, 0).unwrap()
}

fn team(n: u128) -> TeamId {
    TeamId(Uuid::from_u128(n))
}

fn id(n: u128) -> AllocationId {
    AllocationId(Uuid::from_u128(n))
}

fn kind(s: &str) -> GpuKind {
    s.parse().unwrap()
}

// --- kinds and units

#[test]
fn kind_strings_round_trip() {
    for s in [
        "H100-80GB:1g.10gb",
        "H100-80GB:1g.10gb+me",
        "H100-80GB:whole",
        "H100-80GB:share:250",
        "A30-24GB:share:1000",
    ] {
        let k = kind(s);
        assert_eq!(k.to_string(), s);
        assert_eq!(k.to_string().parse::<GpuKind>().unwrap(), k);
        let json = serde_json::to_string(&k).unwrap();
        assert_eq!(json, format!("\"{s}\""));
        assert_eq!(serde_json::from_str::<GpuKind>(&json).unwrap(), k);
    }
    assert_eq!(
        kind(" H100-80GB : WHOLE "),
        GpuKind::Whole {
            model: "H100-80GB".into()
        }
    );
}

#[test]
fn malformed_kind_strings_are_field_errors() {
    for s in [
        "",
        "H100-80GB",
        ":1g.10gb",
        "H100-80GB:",
        "H100-80GB:share",
        "H100-80GB:share:0",
        "H100-80GB:share:1001",
        "H100-80GB:share:x",
        "H100-80GB:whole:2",
        "H100-80GB:1g.10gb:3",
    ] {
        let e = s.parse::<GpuKind>().expect_err(s);
        assert_eq!(e.field(), Some("kind"), "{s}");
    }
    assert!(serde_json::from_str::<GpuKind>("\"H100-80GB\"").is_err());
}

#[test]
fn units_are_compute_slices_or_milli_for_shares() {
    let c = Catalog::builtin();
    assert_eq!(kind("H100-80GB:1g.10gb").units(7, &c), Ok(7));
    assert_eq!(kind("H100-80GB:1g.20gb").units(1, &c), Ok(1));
    assert_eq!(kind("H100-80GB:2g.20gb").units(2, &c), Ok(4));
    assert_eq!(kind("H100-80GB:3g.40gb").units(2, &c), Ok(6));
    assert_eq!(kind("H100-80GB:4g.40gb").units(1, &c), Ok(4));
    assert_eq!(kind("H100-80GB:7g.80gb").units(1, &c), Ok(7));
    assert_eq!(kind("H100-80GB:whole").units(2, &c), Ok(14));
    assert_eq!(kind("A30-24GB:whole").units(1, &c), Ok(4));
    assert_eq!(kind("A30-24GB:2g.12gb").units(1, &c), Ok(2));
    // Shares count exactly, in milli-GPU, on the model's shared quota line.
    assert_eq!(kind("H100-80GB:share:250").units(1, &c), Ok(250));
    assert_eq!(kind("A30-24GB:share:250").units(1, &c), Ok(250));
    assert_eq!(kind("H100-80GB:share:250").quota_key(), "H100-80GB:shared");
    assert_eq!(kind("H100-80GB:1g.10gb").quota_key(), "H100-80GB");
    assert_eq!(split_quota_key("H100-80GB:shared"), ("H100-80GB", true));
    assert_eq!(split_quota_key("H100-80GB"), ("H100-80GB", false));
    assert_eq!(kind("H100-80GB:share:1").units(1, &c), Ok(1));
    assert_eq!(kind("H100-80GB:share:1000").units(1, &c), Ok(1000));
    // Aliases and case resolve through the catalog.
    assert_eq!(kind("H100-SXM5-80GB:1G.10GB").units(1, &c), Ok(1));
}

#[test]
fn unknown_models_and_profiles_are_kind_errors() {
    let c = Catalog::builtin();
    let e = kind("V100-32GB:whole").units(1, &c).unwrap_err();
    assert_eq!(e.field(), Some("kind"));
    assert!(e.to_string().contains("H100-80GB"), "{e}");
    let e = kind("H100-80GB:1g.5gb").units(1, &c).unwrap_err();
    assert_eq!(e.field(), Some("kind"));
    assert!(e.to_string().contains("1g.10gb"), "lists offered: {e}");
    let bad_share = GpuKind::Share {
        model: "H100-80GB".into(),
        milli: 0,
    };
    assert_eq!(bad_share.units(1, &c).unwrap_err().field(), Some("kind"));
}

#[test]
fn canonical_kinds_use_the_catalog_spelling() {
    let c = Catalog::builtin();
    assert_eq!(
        kind("h100-sxm5-80gb:1G.10GB+ME").canonical(&c).unwrap(),
        kind("H100-80GB:1g.10gb+me")
    );
    assert_eq!(
        kind("H200:whole").canonical(&c).unwrap().to_string(),
        "H200-141GB:whole"
    );
}

#[test]
fn kind_labels() {
    assert_eq!(kind("H100-80GB:1g.10gb").label(), "1g.10gb on H100-80GB");
    assert_eq!(kind("H100-80GB:whole").label(), "whole H100-80GB");
    assert_eq!(
        kind("H100-80GB:share:250").label(),
        "25% share of H100-80GB"
    );
    assert_eq!(
        kind("H100-80GB:share:125").label(),
        "12.5% share of H100-80GB"
    );
}

// --- priority and states

#[test]
fn priorities_order_and_parse() {
    assert!(PriorityClass::High > PriorityClass::Normal);
    assert!(PriorityClass::Normal > PriorityClass::Preemptible);
    for p in PriorityClass::ALL {
        assert_eq!(p.as_str().parse::<PriorityClass>(), Ok(p));
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            format!("\"{}\"", p.as_str())
        );
    }
    assert_eq!(
        "urgent".parse::<PriorityClass>().unwrap_err().field(),
        Some("priority")
    );
}

#[test]
fn states_round_trip() {
    for s in AllocState::ALL {
        assert_eq!(s.as_str().parse::<AllocState>(), Ok(s));
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            format!("\"{}\"", s.as_str())
        );
    }
    assert!("running".parse::<AllocState>().is_err());
}

#[test]
fn transitions_follow_the_table() {
    use AllocState::*;
    let allowed = [
        (PendingApproval, Queued),
        (PendingApproval, Denied),
        (PendingApproval, Cancelled),
        (Queued, Placing),
        (Queued, Cancelled),
        (Queued, Failed),
        (Placing, Active),
        (Placing, Queued),
        (Placing, Failed),
        (Placing, Cancelled),
        (Active, Releasing),
        (Active, Failed),
        (Releasing, Ended),
        (Releasing, Expired),
        (Releasing, Preempted),
        (Releasing, Failed),
    ];
    for from in AllocState::ALL {
        for to in AllocState::ALL {
            assert_eq!(
                from.can_transition(to),
                allowed.contains(&(from, to)),
                "{from} → {to}"
            );
        }
        // Terminal states are exactly those with no way out.
        assert_eq!(
            from.is_terminal(),
            AllocState::ALL.iter().all(|to| !from.can_transition(*to)),
            "{from}"
        );
    }
    assert!(matches!(
        Active.check_transition(Queued),
        Err(AppError::Conflict { .. })
    ));
    assert_eq!(Releasing.check_transition(Ended), Ok(()));
    for cause in [
        ReleaseCause::Released,
        ReleaseCause::Expired,
        ReleaseCause::Preempted,
    ] {
        assert!(Releasing.can_transition(cause.final_state()));
        assert!(cause.final_state().is_terminal());
    }
}

#[test]
fn quota_holding_and_pending_states() {
    use AllocState::*;
    let holds: Vec<_> = AllocState::ALL
        .into_iter()
        .filter(|s| s.holds_quota())
        .collect();
    assert_eq!(holds, [Queued, Placing, Active, Releasing]);
    let pending: Vec<_> = AllocState::ALL
        .into_iter()
        .filter(|s| s.is_pending())
        .collect();
    assert_eq!(pending, [PendingApproval, Queued, Placing]);
}

// --- validation

fn input(kind: &str, count: u32) -> NewAllocation {
    NewAllocation {
        team_id: team(1).to_string(),
        kind: kind.into(),
        count,
        duration_minutes: None,
        starts_at: None,
        priority: None,
        purpose: "  train a model ".into(),
        needs_cuda: None,
        nodes: None,
    }
}

fn check(i: &NewAllocation) -> Result<ValidAllocation, AppError> {
    validate(i, &AllocPolicy::default(), &Catalog::builtin(), t(12, 0))
}

fn field(i: &NewAllocation) -> String {
    check(i).unwrap_err().field().unwrap_or("").to_owned()
}

#[test]
fn a_valid_request_gets_defaults() {
    let v = check(&input("H100-SXM5-80GB:1g.10gb", 2)).unwrap();
    assert_eq!(v.team_id(), team(1));
    assert_eq!(v.kind().to_string(), "H100-80GB:1g.10gb");
    assert_eq!(v.count(), 2);
    assert_eq!(v.units(), 2);
    assert_eq!(v.priority(), PriorityClass::Normal);
    assert_eq!(v.duration_minutes(), 480);
    assert_eq!(v.starts_at(), None);
    assert_eq!(v.purpose(), "train a model");
    assert_eq!(v.ends_at(t(12, 0)), Some(t(20, 0)));
}

#[test]
fn each_bad_field_is_named() {
    let mut i = input("H100-80GB:whole", 1);
    i.team_id = "nope".into();
    assert_eq!(field(&i), "team_id");
    i.team_id = " ".into();
    assert_eq!(field(&i), "team_id");

    assert_eq!(field(&input("H100-80GB:9g.90gb", 1)), "kind");
    assert_eq!(field(&input("H100-80GB:whole", 0)), "count");
    assert_eq!(field(&input("H100-80GB:whole", 9)), "count");
    assert!(check(&input("H100-80GB:whole", 8)).is_ok());
    assert_eq!(field(&input("H100-80GB:1g.10gb", 8)), "count");
    assert!(check(&input("H100-80GB:1g.10gb", 7)).is_ok());
    assert_eq!(field(&input("H100-80GB:share:500", 2)), "count");

    let mut i = input("H100-80GB:whole", 1);
    i.duration_minutes = Some(0);
    assert_eq!(field(&i), "duration_minutes");
    i.duration_minutes = Some(7 * 24 * 60 + 1);
    assert_eq!(
        check(&i).unwrap_err().to_string(),
        "duration_minutes: must be at most 7 days"
    );
    i.duration_minutes = Some(7 * 24 * 60);
    assert!(check(&i).is_ok());

    let mut i = input("H100-80GB:whole", 1);
    i.priority = Some("urgent".into());
    assert_eq!(field(&i), "priority");
    i.priority = Some("preemptible".into());
    assert_eq!(check(&i).unwrap().priority(), PriorityClass::Preemptible);

    let mut i = input("H100-80GB:whole", 1);
    i.purpose = "x".repeat(501);
    assert_eq!(field(&i), "purpose");
    i.purpose = "é".repeat(500);
    assert!(check(&i).is_ok(), "counts characters, not bytes");
    i.purpose = "a\u{7}b".into();
    assert_eq!(field(&i), "purpose");
    i.purpose = "line one\r\nline two".into();
    assert!(check(&i).is_ok());
}

#[test]
fn a_cuda_need_is_optional_and_checked() {
    let mut i = input("H100-80GB:whole", 1);
    assert_eq!(check(&i).unwrap().needs_cuda(), None);
    i.needs_cuda = Some(" ".into());
    assert_eq!(check(&i).unwrap().needs_cuda(), None, "empty: none");
    i.needs_cuda = Some("12.4".into());
    assert_eq!(check(&i).unwrap().needs_cuda().unwrap().to_string(), "12.4");
    i.needs_cuda = Some("12.4.1".into());
    assert_eq!(check(&i).unwrap().needs_cuda().unwrap().to_string(), "12.4");
    for bad in ["twelve", "12", "12.x", "0.9", "12.4.1.0"] {
        i.needs_cuda = Some(bad.into());
        let e = check(&i).unwrap_err();
        assert_eq!(e.field(), Some("needs_cuda"), "{bad}: {e}");
        assert!(e.to_string().contains("like 12.4"), "{e}");
    }
    // Absent from a REST body: none.
    let json = r#"{"team_id":"00000000-0000-0000-0000-000000000001","kind":"H100-80GB:whole"}"#;
    let parsed: NewAllocation = serde_json::from_str(json).unwrap();
    assert_eq!(parsed.needs_cuda, None);
}

#[test]
fn start_times_must_be_near_and_not_past() {
    let mut i = input("H100-80GB:whole", 1);
    let at = |i: &mut NewAllocation, s: &str| i.starts_at = Some(s.into());
    at(&mut i, "2025-05-01T14:00");
    assert_eq!(check(&i).unwrap().starts_at(), Some(t(14, 0)));
    at(&mut i, "2025-05-01T16:00:00+02:00");
    assert_eq!(check(&i).unwrap().starts_at(), Some(t(14, 0)));
    // Within the grace minute: means now.
    at(&mut i, "2025-05-01T11:59:30Z");
    assert_eq!(check(&i).unwrap().starts_at(), None);
    at(&mut i, "2025-05-01T11:58");
    assert_eq!(
        check(&i).unwrap_err().to_string(),
        "starts_at: is in the past"
    );
    at(&mut i, "2025-05-31T12:00");
    assert!(check(&i).is_ok());
    at(&mut i, "2025-05-31T12:01");
    assert_eq!(
        check(&i).unwrap_err().to_string(),
        "starts_at: must be within 30 days from now"
    );
    at(&mut i, "tomorrow");
    assert_eq!(field(&i), "starts_at");
    at(&mut i, " ");
    assert_eq!(check(&i).unwrap().starts_at(), None);
}

#[test]
fn new_allocation_json_defaults() {
    let i: NewAllocation = serde_json::from_str(&format!(
        r#"{{"team_id":"{}","kind":"H100-80GB:whole"}}"#,
        team(1)
    ))
    .unwrap();
    assert_eq!(i.count, 1);
    assert!(check(&i).is_ok());
}

// --- quota and admission

fn quota(g: u32, l: u32, u: u32) -> Quota {
    Quota::new(g, l, u).unwrap()
}

fn used(team: u32, user: u32) -> Usage {
    Usage { team, user }
}

#[test]
fn quotas_are_consistent() {
    assert_eq!(Quota::new(9, 8, 8).unwrap_err().field(), Some("guaranteed"));
    assert_eq!(Quota::new(4, 8, 9).unwrap_err().field(), Some("per_user"));
    assert!(Quota::new(0, 0, 0).is_ok());
    assert_eq!(quota(4, 8, 8).borrowed(3), 0);
    assert_eq!(quota(4, 8, 8).borrowed(6), 2);
}

#[test]
fn admits_exactly_up_to_the_limit() {
    let q = quota(4, 8, 8);
    assert_eq!(
        admit("H100-80GB", Some(&q), used(0, 0), 4),
        Admission::Admit { borrowed: 0 }
    );
    assert_eq!(
        admit("H100-80GB", Some(&q), used(3, 3), 2),
        Admission::Admit { borrowed: 1 }
    );
    assert_eq!(
        admit("H100-80GB", Some(&q), used(6, 6), 2),
        Admission::Admit { borrowed: 2 }
    );
    assert_eq!(
        admit("H100-80GB", Some(&q), used(7, 7), 2),
        Admission::NeedsApproval {
            by: Approver::PlatformAdmin,
            reason: "the team would use 9 of its 8-slice limit on H100-80GB".into()
        }
    );
}

#[test]
fn the_approver_depends_on_the_guarantee() {
    let q = quota(6, 10, 2);
    // Team stays within its guarantee; only the per-user cap is exceeded.
    assert_eq!(
        admit("H100-80GB", Some(&q), used(2, 1), 3),
        Admission::NeedsApproval {
            by: Approver::TeamAdmin,
            reason: "you would use 4 of your 2-slice per-user limit on H100-80GB".into()
        }
    );
    // Per-user cap exceeded and the team would borrow: platform admin.
    let Admission::NeedsApproval { by, reason } = admit("H100-80GB", Some(&q), used(5, 0), 3)
    else {
        panic!("needs approval")
    };
    assert_eq!(by, Approver::PlatformAdmin);
    assert!(reason.contains("6-slice guarantee"), "{reason}");
    // Over the limit: platform admin.
    let Admission::NeedsApproval { by, .. } = admit("H100-80GB", Some(&q), used(9, 0), 2) else {
        panic!("needs approval")
    };
    assert_eq!(by, Approver::PlatformAdmin);
}

#[test]
fn no_quota_means_not_entitled() {
    assert!(matches!(
        admit("H100-80GB", None, used(0, 0), 1),
        Admission::NotEntitled { .. }
    ));
    assert!(matches!(
        admit("H100-80GB", Some(&quota(0, 0, 0)), used(0, 0), 1),
        Admission::NotEntitled { .. }
    ));
}

#[test]
fn admission_never_overflows() {
    let q = quota(u32::MAX, u32::MAX, u32::MAX);
    assert!(matches!(
        admit("H100-80GB", Some(&q), used(u32::MAX, u32::MAX), 1),
        Admission::NeedsApproval { .. }
    ));
}

// --- queue

fn entry(n: u128, tm: u128, p: PriorityClass, at: DateTime<Utc>) -> QueueEntry {
    QueueEntry {
        id: id(n),
        model: "H100-80GB".into(),
        team: team(tm),
        priority: p,
        created_at: at,
    }
}

fn share(used: u64, g: u32) -> FairShare {
    FairShare {
        recent_unit_seconds: used,
        guaranteed: g,
    }
}

#[test]
fn queue_orders_by_priority_then_fair_share_then_age() {
    use PriorityClass::*;
    // Team 1 used 100 per guaranteed unit, team 2 only 50: team 2 goes first.
    let usage = BTreeMap::from([(team(1), share(400, 4)), (team(2), share(100, 2))]);
    let entries = [
        entry(1, 1, Normal, t(9, 0)),
        entry(2, 2, Normal, t(10, 0)),
        entry(3, 1, High, t(11, 0)),
        entry(4, 2, Preemptible, t(8, 0)),
        entry(5, 2, Normal, t(9, 30)),
        entry(6, 3, Normal, t(7, 0)), // no guarantee: after all guaranteed teams
    ];
    assert_eq!(
        order_queue(&entries, &usage),
        [id(3), id(5), id(2), id(1), id(6), id(4)]
    );
    assert_eq!(position(&entries, &usage, id(5)), Some(2));
    assert_eq!(position(&entries, &usage, id(4)), Some(6));
    assert_eq!(position(&entries, &usage, id(99)), None);
}

#[test]
fn positions_count_only_the_same_model() {
    let usage = BTreeMap::new();
    let mut other = entry(1, 1, PriorityClass::High, t(8, 0));
    other.model = "A30-24GB".into();
    let entries = [other, entry(2, 1, PriorityClass::Normal, t(9, 0))];
    assert_eq!(position(&entries, &usage, id(2)), Some(1));
    assert_eq!(position(&entries, &usage, id(1)), Some(1));
}

#[test]
fn fair_share_compares_exactly() {
    // 1/3 vs 333_333/1_000_000: a float might call these equal at low precision.
    assert_eq!(
        share(1, 3).cmp_share(&share(333_333, 1_000_000)),
        Ordering::Greater
    );
    assert_eq!(share(2, 4).cmp_share(&share(1, 2)), Ordering::Equal);
    assert_eq!(share(u64::MAX, 1).cmp_share(&share(0, 0)), Ordering::Less);
    assert_eq!(share(5, 0).cmp_share(&share(7, 0)), Ordering::Less);
}

#[test]
fn usage_counts_only_inside_the_window() {
    let now = t(12, 0);
    assert_eq!(unit_seconds_in_window(2, t(11, 0), None, now), 2 * 3600);
    assert_eq!(
        unit_seconds_in_window(1, t(10, 0), Some(t(11, 0)), now),
        3600
    );
    let long_ago = now - TimeDelta::days(30);
    assert_eq!(
        unit_seconds_in_window(1, long_ago, None, now),
        7 * 24 * 3600
    );
    assert_eq!(
        unit_seconds_in_window(1, long_ago, Some(long_ago + TimeDelta::days(1)), now),
        0
    );
}

// --- preemption

fn running(
    n: u128,
    tm: u128,
    units: u32,
    started: DateTime<Utc>,
    p: PriorityClass,
    team_used: u32,
    team_guaranteed: u32,
) -> Running {
    Running {
        id: id(n),
        team: team(tm),
        units,
        started_at: started,
        priority: p,
        team_used,
        team_guaranteed,
    }
}

fn claim(used: u32, guaranteed: u32, ask: u32) -> Claim {
    Claim {
        team: team(1),
        used,
        guaranteed,
        ask,
    }
}

#[test]
fn preemption_takes_preemptible_then_newest_borrowed_units() {
    use PriorityClass::*;
    // Team 2 holds 6 with a guarantee of 2: 4 borrowed.
    let r = [
        running(10, 2, 2, t(8, 0), Normal, 6, 2),
        running(11, 2, 2, t(9, 0), Normal, 6, 2),
        running(12, 2, 2, t(7, 0), Preemptible, 6, 2),
    ];
    let p = select_victims(&claim(0, 4, 3), 3, &r).unwrap();
    assert_eq!(p.victims, [id(12), id(11)]);
    assert_eq!(p.freed, 4);
}

#[test]
fn preemption_never_drives_a_team_below_its_guarantee() {
    use PriorityClass::*;
    // Team 2 borrows 1 unit only; its 2-unit allocations cannot go. Team 3 borrows 3.
    let r = [
        running(10, 2, 2, t(10, 0), Preemptible, 5, 4),
        running(11, 3, 1, t(9, 0), Normal, 4, 1),
        running(12, 3, 2, t(8, 0), Normal, 4, 1),
        running(13, 3, 1, t(7, 0), Normal, 4, 1),
    ];
    let p = select_victims(&claim(0, 7, 3), 3, &r).unwrap();
    assert_eq!(p.victims, [id(11), id(12)]);
    // Needing 4 would take team 3 below its guarantee: no preemption at all.
    assert_eq!(select_victims(&claim(0, 7, 4), 4, &r), None);
}

#[test]
fn only_a_claim_within_its_guarantee_may_preempt() {
    let r = [running(10, 2, 7, t(8, 0), PriorityClass::Normal, 7, 0)];
    assert!(select_victims(&claim(3, 4, 1), 1, &r).is_some());
    assert_eq!(select_victims(&claim(3, 4, 2), 1, &r), None);
    // Never its own team.
    let own = [running(10, 1, 7, t(8, 0), PriorityClass::Normal, 7, 0)];
    assert_eq!(select_victims(&claim(0, 4, 1), 1, &own), None);
    assert_eq!(
        select_victims(&claim(0, 4, 1), 0, &own),
        Some(Preemption {
            victims: vec![],
            freed: 0
        })
    );
}

// --- eta and explanation

#[test]
fn eta_is_the_first_end_that_frees_enough() {
    let ends = [(t(15, 0), 2), (t(13, 0), 1), (t(14, 0), 1)];
    assert_eq!(eta(3, 1, &ends), Some(t(14, 0)));
    assert_eq!(eta(2, 1, &ends), Some(t(13, 0)));
    assert_eq!(eta(5, 1, &ends), Some(t(15, 0)));
    assert_eq!(eta(6, 1, &ends), None, "not enough ends in sight");
    assert_eq!(
        eta(1, 1, &ends),
        None,
        "units alone do not explain the wait"
    );
    assert_eq!(eta(1, 0, &[]), None);
}

#[test]
fn explanations_in_plain_words() {
    assert_eq!(
        pending_explanation(
            Some(2),
            "H100-80GB",
            Some("no free 1g.10gb; free after this plan: 1 × 3g.40gb on H100-80GB"),
            Some(t(14, 0)),
            t(12, 0)
        ),
        "2nd in the H100-80GB queue. No free 1g.10gb; free after this plan: 1 × 3g.40gb on H100-80GB. Expected by 14:00 UTC."
    );
    assert_eq!(
        pending_explanation(Some(11), "A30-24GB", None, None, t(12, 0)),
        "11th in the A30-24GB queue. No known end time frees enough: ETA unknown."
    );
    assert_eq!(
        pending_explanation(
            Some(1),
            "H100-80GB",
            Some("needs CUDA ≥ 12.4; nodes with free H100-80GB run driver 535.104.05 (CUDA 12.2)"),
            None,
            t(12, 0)
        ),
        "1st in the H100-80GB queue. Needs CUDA ≥ 12.4; nodes with free H100-80GB run driver \
         535.104.05 (CUDA 12.2). ETA unknown: it starts once a node whose driver supports it \
         has room."
    );
    let tomorrow = t(9, 0) + TimeDelta::days(1);
    assert_eq!(
        PendingInfo::new(
            None,
            "H100-80GB",
            Some("waiting for a team admin."),
            Some(tomorrow),
            t(12, 0)
        )
        .reason,
        "Waiting for a team admin. Expected by 2025-05-02 09:00 UTC."
    );
    assert_eq!(
        [1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111].map(ordinal),
        [
            "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st",
            "111th"
        ]
    );
}

#[test]
fn views_serialize_round_trip() {
    let v = AllocationView {
        id: id(1),
        team_id: team(1),
        team_name: "Vision".into(),
        user_id: UserId(Uuid::from_u128(7)),
        username: "ada".into(),
        kind: "H100-80GB:1g.10gb".into(),
        kind_label: kind("H100-80GB:1g.10gb").label(),
        count: 2,
        units: 2,
        priority: PriorityClass::Normal,
        state: AllocState::Queued,
        purpose: String::new(),
        created_at: t(9, 0),
        starts_at: None,
        ends_at: None,
        devices: Vec::new(),
        approver: None,
        approval_reason: None,
        pending: Some(PendingInfo::new(Some(1), "H100-80GB", None, None, t(9, 0))),
        preempt_at: None,
        over_limit: true,
        over_budget: false,
        needs_cuda: Some(crate::image::CudaVersion::parse("12.4").unwrap()),
        nodes: None,
        history: vec![Transition {
            at: t(9, 0),
            from: None,
            to: AllocState::Queued,
            by: Some("ada".into()),
            note: None,
        }],
    };
    let json = serde_json::to_string(&v).unwrap();
    assert!(json.contains(r#""state":"queued""#), "{json}");
    assert!(json.contains(r#""needs_cuda":"12.4""#), "{json}");
    assert_eq!(serde_json::from_str::<AllocationView>(&json).unwrap(), v);
    let q = QuotaView::new(
        team(1),
        "Vision".into(),
        "H100-80GB".into(),
        &quota(4, 8, 8),
        6,
    );
    assert_eq!(q.borrowed, 2);
}

fn standing(limit: u32, per_user: u32, team: u32, user: u32) -> Standing {
    Standing {
        quota: Some(Quota::new(limit, limit, per_user).unwrap()),
        held: Held {
            team,
            user,
            high: 0,
        },
        high: None,
        budget: None,
    }
}

const ASK2: Ask = Ask {
    units: 2,
    high: false,
    cost: 0,
};

#[test]
fn a_team_admin_approves_within_the_limit_only() {
    // Guaranteed 2 / limit 2 / per-user 1: a 2-unit request needs a team admin.
    let s = standing(2, 1, 0, 0);
    assert!(matches!(
        crate::alloc::check("H100-80GB", &s, &ASK2, Authority::Request),
        Verdict::NeedsApproval {
            by: Approver::TeamAdmin,
            ..
        }
    ));
    assert_eq!(
        crate::alloc::check("H100-80GB", &s, &ASK2, Authority::TeamAdmin),
        Verdict::Admit {
            over_limit: false,
            over_budget: false
        }
    );
    // The second such approval would make the team hold 4 of 2: a platform admin's.
    let s = standing(2, 1, 2, 0);
    match crate::alloc::check("H100-80GB", &s, &ASK2, Authority::TeamAdmin) {
        Verdict::NeedsApproval {
            by: Approver::PlatformAdmin,
            reason,
        } => assert_eq!(
            reason,
            "needs a platform admin: the team would hold 4 of its limit 2 on H100-80GB"
        ),
        v => panic!("{v:?}"),
    }
    // A platform admin must say it is an override; then it is recorded as one.
    assert!(matches!(
        crate::alloc::check(
            "H100-80GB",
            &s,
            &ASK2,
            Authority::PlatformAdmin { overrides: false }
        ),
        Verdict::Refused(AppError::Conflict { .. })
    ));
    assert_eq!(
        crate::alloc::check(
            "H100-80GB",
            &s,
            &ASK2,
            Authority::PlatformAdmin { overrides: true }
        ),
        Verdict::Admit {
            over_limit: true,
            over_budget: false
        }
    );
}

#[test]
fn high_priority_is_an_entitlement_with_a_cap() {
    let mut s = standing(14, 14, 0, 0);
    let high = Ask {
        units: 7,
        high: true,
        cost: 0,
    };
    let refused = |v: Verdict| matches!(v, Verdict::Refused(AppError::Invalid { field, .. }) if field == "priority");
    assert!(refused(crate::alloc::check(
        "H100-80GB",
        &s,
        &high,
        Authority::Request
    )));
    // Not even a platform admin's approval gives it to a team without the grant.
    assert!(refused(crate::alloc::check(
        "H100-80GB",
        &s,
        &high,
        Authority::PlatformAdmin { overrides: true }
    )));
    s.high = Some(HighGrant { cap: Some(7) });
    assert!(matches!(
        crate::alloc::check("H100-80GB", &s, &high, Authority::Request),
        Verdict::Admit { .. }
    ));
    s.held.high = 1;
    assert!(refused(crate::alloc::check(
        "H100-80GB",
        &s,
        &high,
        Authority::Request
    )));
    // Normal priority is not capped by the grant.
    assert!(matches!(
        crate::alloc::check(
            "H100-80GB",
            &s,
            &Ask {
                high: false,
                ..high
            },
            Authority::Request
        ),
        Verdict::Admit { .. }
    ));
    s.high = Some(HighGrant { cap: None });
    assert!(matches!(
        crate::alloc::check("H100-80GB", &s, &high, Authority::Request),
        Verdict::Admit { .. }
    ));
}

#[test]
fn committed_spend_stays_within_a_hard_budget() {
    let mut s = standing(14, 14, 0, 0);
    s.budget = Some(Committed {
        budget: 10_000,
        committed: 9_000,
        currency: "USD".into(),
    });
    let ask = Ask {
        units: 1,
        high: false,
        cost: 1_000,
    };
    assert_eq!(
        crate::alloc::check("H100-80GB", &s, &ask, Authority::Request),
        Verdict::Admit {
            over_limit: false,
            over_budget: false
        }
    );
    let ask = Ask { cost: 1_001, ..ask };
    match crate::alloc::check("H100-80GB", &s, &ask, Authority::Request) {
        Verdict::NeedsApproval {
            by: Approver::PlatformAdmin,
            reason,
        } => assert!(
            reason.contains("hard monthly budget is 100.00 USD")
                && reason.contains("90.00 USD is spent or committed"),
            "{reason}"
        ),
        v => panic!("{v:?}"),
    }
    // An extension holds no more units but is checked against the budget all the same.
    let extend = Ask { units: 0, ..ask };
    assert!(matches!(
        crate::alloc::check("H100-80GB", &s, &extend, Authority::Request),
        Verdict::NeedsApproval { .. }
    ));
    assert!(matches!(
        crate::alloc::check("H100-80GB", &s, &ask, Authority::TeamAdmin),
        Verdict::NeedsApproval {
            by: Approver::PlatformAdmin,
            ..
        }
    ));
    assert_eq!(
        crate::alloc::check(
            "H100-80GB",
            &s,
            &ask,
            Authority::PlatformAdmin { overrides: true }
        ),
        Verdict::Admit {
            over_limit: false,
            over_budget: true
        }
    );
}
