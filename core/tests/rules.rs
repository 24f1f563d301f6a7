//! The allocation invariants (docs/allocations.md, "Invariants") under random interleavings
//! of every call that moves them — requests at every priority by members (some of them at
//! once), approvals and denials by team admins and platform admins (with and without an
//! override), extensions, releases, activations and preemptions by the system, users
//! disabled and enabled, scheduler passes — on SQLite (and PostgreSQL with
//! `TESSERA_TEST_PG_URL`). After every step:
//! - each team's and user's quota counter equals the units of their allocations that hold
//!   quota;
//! - no team holds beyond its limit except by units a platform admin approved as an override;
//! - committed spend (open allocations at today's rates; no hour is metered here) stays
//!   within the hard budget unless an allocation was approved beyond it;
//! - `high` is held only by the team granted it, within its cap;
//! - a disabled user holds nothing after a scheduler pass.
// A test: a step that fails should fail it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Tests and benches stand outside the use cases: they read the wall clock to set up.
#![allow(clippy::disallowed_methods)]

mod common;

use chrono::{Duration, TimeZone, Utc};
use common::{Lcg, services_with_admin};
use std::collections::HashMap;
use tessera_core::Services;
use tessera_core::auth::{Principal, SystemActor};
use tessera_core::services::allocations::Decision;
use tessera_core::store::{Change, Store, Transition};
use tessera_domain::alloc::{AllocState, GpuKind, HighGrant, NewAllocation, PriorityClass};
use tessera_domain::billing::{self, NewRate, Rate, RateCard, SetBudget};
use tessera_domain::ids::{TeamId, UserId};
use tessera_domain::mig::Catalog;
use uuid::Uuid;

const KINDS: [&str; 3] = ["H100-80GB:1g.10gb", "H100-80GB:2g.20gb", "H100-80GB:whole"];
/// Team 0 may use `high` up to this many units; team 1 may not use it at all.
const HIGH_CAP: u32 = 7;
/// 7.00 per whole H100-hour: one compute slice 1.00 per hour.
const PRICE: i64 = 700;
const BUDGET: i64 = 3_000;

struct World {
    s: Services,
    /// What the scheduler's passes run as.
    system: SystemActor,
    store: Store,
    admin: Principal,
    teams: Vec<Uuid>,
    /// Per team: (member principals, team admin principal).
    members: Vec<Vec<Principal>>,
    leads: Vec<Principal>,
    card: RateCard,
}

/// A stored user's principal, as trusted code acting for them gets it.
async fn principal(s: &Services, name: &str) -> Principal {
    s.accounts.principal_of(name).await.expect("principal")
}

async fn world(url: &str, seed: u64) -> World {
    let (store, s, system) = services_with_admin(url, "rules-test-password").await;
    let admin = principal(&s, "admin").await;
    let now = Utc::now().timestamp();
    let hour = Utc
        .timestamp_opt(now - now.rem_euclid(3600), 0)
        .single()
        .expect("time");
    let rate = NewRate {
        kind: "H100-80GB:whole".into(),
        price_minor_per_hour: PRICE,
        preemptible_discount_pct: 0,
        high_premium_pct: 50,
        effective_from: Some(hour),
    };
    s.billing.set_rate(&admin, &rate).await.expect("rate");
    let mut teams = Vec::new();
    let mut members = Vec::new();
    let mut leads = Vec::new();
    for t in 0..2 {
        let team = s
            .tenancy
            .create_team(&admin, &format!("rules-{seed}-{t}"))
            .await
            .expect("team");
        // Guaranteed 7, limit 14, per user 7: borrowing, per-user approvals and the limit
        // all come into play.
        s.allocations
            .set_quota(&admin, team.id, "H100-80GB", 7, 14, 7)
            .await
            .expect("quota");
        let budget = SetBudget {
            monthly_minor: Some(BUDGET),
            hard: true,
        };
        s.billing
            .set_budget(&admin, team.id, &budget)
            .await
            .expect("budget");
        if t == 0 {
            let grant = HighGrant {
                cap: Some(HIGH_CAP),
            };
            s.allocations
                .set_high_priority(&admin, team.id, Some(grant))
                .await
                .expect("grant");
        }
        let mut ms = Vec::new();
        for (i, role) in ["member", "member", "team_admin"].iter().enumerate() {
            let name = format!("r{seed}t{t}u{i}");
            s.tenancy
                .create_user(&admin, &name, "rules-user-password", false)
                .await
                .expect("user");
            s.tenancy
                .add_member(&admin, team.id, &name, role)
                .await
                .expect("member");
            let p = principal(&s, &name).await;
            if *role == "team_admin" {
                leads.push(p);
            } else {
                ms.push(p);
            }
        }
        members.push(ms);
        teams.push(team.id.0);
    }
    let card = RateCard::new([Rate {
        id: Uuid::new_v4(),
        kind: "H100-80GB:whole".into(),
        price_minor_per_hour: PRICE,
        preemptible_discount_pct: 0,
        high_premium_pct: 50,
        effective_from: hour,
    }]);
    World {
        s,
        system,
        store,
        admin,
        teams,
        members,
        leads,
        card,
    }
}

impl World {
    async fn request(&self, rng: &mut Lcg, team: usize, who: &Principal) {
        let kind = *rng.pick(&KINDS);
        let count = if kind.ends_with("whole") {
            1
        } else {
            1 + u32::try_from(rng.next(2)).unwrap_or(0)
        };
        let priority = *rng.pick(&["normal", "normal", "high", "preemptible"]);
        let input = NewAllocation {
            team_id: self.teams[team].to_string(),
            kind: kind.into(),
            count,
            duration_minutes: Some(30 * (1 + u32::try_from(rng.next(8)).unwrap_or(0))),
            starts_at: None,
            priority: Some(priority.into()),
            purpose: String::new(),
            needs_cuda: None,
            nodes: None,
        };
        let r = self.s.allocations.request(who, &input, None).await;
        if priority == "high" && team == 1 {
            assert!(r.is_err(), "team 1 has no grant for high: {r:?}");
        }
    }

    /// Every allocation of the world: (id, team, user, state, units, priority, over_limit...).
    async fn open(&self, states: &[&str]) -> Vec<tessera_core::store::AllocationRow> {
        let states: Vec<AllocState> = states.iter().map(|s| s.parse().expect("state")).collect();
        self.store
            .allocations_in(&states)
            .await
            .expect("allocations")
    }

    async fn step(&self, rng: &mut Lcg) {
        let team = usize::try_from(rng.next(2)).unwrap_or(0);
        let member = rng.pick(&self.members[team]).clone();
        let op = rng.next(12);
        if std::env::var_os("RULES_TRACE").is_some() {
            eprintln!("op {op} team {team} by {}", member.username());
        }
        match op {
            0..=2 => self.request(rng, team, &member).await,
            3 => {
                // Two members of the team at once.
                let other = rng.pick(&self.members[team]).clone();
                let mut r2 = Lcg(rng.next(u64::MAX));
                let (a, b) = (
                    self.request(rng, team, &member),
                    self.request(&mut r2, team, &other),
                );
                tokio::join!(a, b);
            }
            4 | 5 => {
                let waiting = self.open(&["pending_approval"]).await;
                if waiting.is_empty() {
                    return;
                }
                let a = rng.pick(&waiting).clone();
                let t = self
                    .teams
                    .iter()
                    .position(|t| *t == a.team_id.0)
                    .unwrap_or(0);
                let (who, overrides) = match rng.next(4) {
                    0 => (self.leads[t].clone(), false),
                    1 => (self.admin.clone(), false),
                    2 => (self.admin.clone(), true),
                    _ => (member.clone(), false),
                };
                let approve = rng.next(5) > 0;
                let d = Decision {
                    approve,
                    reason: "",
                    overrides,
                };
                let _ = self.s.allocations.decide(&who, a.id, d).await;
            }
            6 => {
                // The system places and activates a queued allocation (no GPU here).
                let queued = self.open(&["queued"]).await;
                if queued.is_empty() {
                    return;
                }
                let a = rng.pick(&queued).clone();
                let now = Utc::now();
                let go = |from, to, change| Transition::plain(a.id, (from, to), now, change);
                if self
                    .store
                    .transition(&go(
                        AllocState::Queued,
                        AllocState::Placing,
                        Change::default(),
                    ))
                    .await
                    .expect("placing")
                {
                    let change = Change {
                        active_at: Some(now),
                        ends_at: Some(now + Duration::minutes(a.duration_minutes)),
                        ..Change::default()
                    };
                    self.store
                        .transition(&go(AllocState::Placing, AllocState::Active, change))
                        .await
                        .expect("active");
                }
            }
            7 => {
                let active = self.open(&["active"]).await;
                if active.is_empty() {
                    return;
                }
                let a = rng.pick(&active).clone();
                let owner = self
                    .members
                    .iter()
                    .flatten()
                    .find(|p| p.user_id() == a.user_id)
                    .cloned()
                    .unwrap_or_else(|| self.admin.clone());
                let minutes = 30 * (1 + u32::try_from(rng.next(12)).unwrap_or(0));
                let _ = self.s.allocations.extend(&owner, a.id, minutes).await;
            }
            8 => {
                let live = self.open(&["pending_approval", "queued", "active"]).await;
                if live.is_empty() {
                    return;
                }
                let a = rng.pick(&live).clone();
                let _ = self.s.allocations.release(&self.admin, a.id).await;
            }
            9 => {
                // Preemption: the system ends an active allocation.
                let active = self.open(&["active"]).await;
                if active.is_empty() {
                    return;
                }
                let a = rng.pick(&active).clone();
                let now = Utc::now();
                let t = Transition {
                    quota_delta: 0,
                    ..Transition::plain(
                        a.id,
                        (AllocState::Active, AllocState::Releasing),
                        now,
                        Change::default(),
                    )
                };
                if self.store.transition(&t).await.expect("releasing") {
                    let t = Transition {
                        quota_delta: -1,
                        ..Transition::plain(
                            a.id,
                            (AllocState::Releasing, AllocState::Preempted),
                            now,
                            Change::default(),
                        )
                    };
                    self.store.transition(&t).await.expect("preempted");
                }
            }
            10 => {
                let disabled = rng.next(2) == 0;
                let _ = self
                    .s
                    .tenancy
                    .set_user_disabled(&self.admin, member.user_id(), disabled)
                    .await;
                self.s
                    .allocations
                    .tick(&self.system, Utc::now())
                    .await
                    .expect("scheduler pass");
                if disabled {
                    let held: Vec<_> = self
                        .open(&["pending_approval", "queued", "placing", "active"])
                        .await
                        .into_iter()
                        .filter(|a| a.user_id == member.user_id())
                        .collect();
                    assert!(held.is_empty(), "a disabled user holds nothing: {held:?}");
                }
            }
            _ => {
                self.s
                    .allocations
                    .tick(&self.system, Utc::now())
                    .await
                    .expect("scheduler pass");
            }
        }
    }

    async fn check(&self, seed: u64, step: usize) {
        // The scheduler's copy of the live allocations (kept across passes, issue 41)
        // agrees with a fresh load.
        let differences = self
            .s
            .allocations
            .live_cache_differences(Utc::now())
            .await
            .expect("live cache");
        assert!(
            differences.is_empty(),
            "seed {seed}, step {step}: {differences:?}"
        );
        let holding = self
            .open(&["queued", "placing", "active", "releasing"])
            .await;
        let catalog = Catalog::builtin();
        let at = Utc::now();
        for (t, team) in self.teams.iter().enumerate() {
            let mine: Vec<_> = holding.iter().filter(|a| a.team_id.0 == *team).collect();
            let units: i64 = mine.iter().map(|a| a.units).sum();
            let quota = self
                .store
                .quota(TeamId(*team), "H100-80GB")
                .await
                .expect("quota")
                .expect("quota");
            let ctx = format!("seed {seed} step {step} team {t}");
            assert_eq!(quota.used, units, "{ctx}: counter = live allocations");
            let mut by_user: HashMap<Uuid, i64> = HashMap::new();
            for a in &mine {
                *by_user.entry(a.user_id.0).or_default() += a.units;
            }
            for (user, units) in &by_user {
                let used = self
                    .store
                    .user_used(TeamId(*team), "H100-80GB", UserId(*user))
                    .await
                    .expect("user");
                assert_eq!(used, *units, "{ctx}: user counter = live allocations");
            }
            let overridden = self
                .store
                .overridden_units(TeamId(*team))
                .await
                .expect("overrides")
                .into_iter()
                .map(|(_, u)| u)
                .sum::<i64>();
            assert!(
                units <= quota.limit_units + overridden,
                "{ctx}: holds {units} of limit {} with {overridden} overridden",
                quota.limit_units
            );
            let high: i64 = mine
                .iter()
                .filter(|a| a.priority == PriorityClass::High)
                .map(|a| a.units)
                .sum();
            if t == 1 {
                assert_eq!(high, 0, "{ctx}: no grant, no high");
            } else {
                assert!(high <= i64::from(HIGH_CAP), "{ctx}: high {high} > cap");
            }
            // Committed spend: nothing is metered here, so it is what the open allocations
            // may cost at today's rate.
            let open = self.open(&["queued", "placing", "active"]).await;
            let open: Vec<_> = open.iter().filter(|a| a.team_id.0 == *team).collect();
            let committed: i64 = open
                .iter()
                .map(|a| {
                    let kind: &GpuKind = &a.kind;
                    let ms = match (a.state, a.active_at, a.ends_at) {
                        (AllocState::Active, Some(f), Some(e)) => (e - f).num_milliseconds(),
                        _ => a.duration_minutes * 60_000,
                    };
                    let p = self.card.price(kind, &catalog, at).expect("priced");
                    let count = u32::try_from(a.count).expect("count");
                    billing::cost(&p, count, ms, a.priority).1
                })
                .sum();
            if !self.over_budget(*team).await {
                assert!(
                    committed <= BUDGET,
                    "{ctx}: committed {committed} > budget {BUDGET} with no override"
                );
            }
        }
    }

    async fn over_budget(&self, team: Uuid) -> bool {
        self.open(&["queued", "placing", "active", "releasing"])
            .await
            .iter()
            .any(|a| a.team_id.0 == team && a.over_budget)
    }
}

async fn run(url: &str, seed: u64, steps: usize) {
    let w = world(url, seed).await;
    let mut rng = Lcg(seed);
    for step in 0..steps {
        w.step(&mut rng).await;
        w.check(seed, step).await;
    }
}

/// How many random histories and steps: `TESSERA_RULES_CASES` (default 40 on SQLite, 10 on
/// PostgreSQL) × 80 steps.
fn cases(default: u64) -> u64 {
    std::env::var("TESSERA_RULES_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariants_hold_under_random_interleavings() {
    let dir = tempfile::tempdir().expect("dir");
    for seed in 1..=cases(40) {
        let url = format!("sqlite://{}/r{seed}.db?mode=rwc", dir.path().display());
        run(&url, seed, 80).await;
    }
    if let Ok(pg) = std::env::var("TESSERA_TEST_PG_URL") {
        for seed in 100..100 + cases(10) {
            let url = Store::create_postgres_database(&pg)
                .await
                .expect("database");
            run(&url, seed, 80).await;
        }
    }
}
