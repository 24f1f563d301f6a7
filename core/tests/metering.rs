//! Metering of random allocation histories on SQLite (and PostgreSQL with
//! `TESSERA_TEST_PG_URL`): the ledger equals a brute-force, second-by-second ground truth
//! priced hour by hour, whatever the crash points (passes stopped after a random number of
//! allocations), reruns and concurrent passes; it always balances.
// A test: a step that fails should fail it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Tests and benches stand outside the use cases: they read the wall clock to set up.
#![allow(clippy::disallowed_methods)]

mod common;

use chrono::{DateTime, Duration, TimeZone, Utc};
use common::{Lcg, services_with_admin};
use std::collections::BTreeMap;
use tessera_core::Services;
use tessera_core::auth::{Principal, SystemActor};
use tessera_core::store::{AllocationRow, Change, RateRow, Store, Transition};
use tessera_domain::alloc::{AllocState, GpuKind, PriorityClass};
use tessera_domain::billing::{self, Rate, RateCard};
use tessera_domain::ids::{AllocationId, TeamId};
use tessera_domain::mig::Catalog;
use uuid::Uuid;

struct Spec {
    kind: &'static str,
    count: u32,
    priority: PriorityClass,
    /// Seconds from the origin: `[start, end)`, `end = None` still active.
    start: i64,
    end: Option<i64>,
}

const KINDS: [(&str, u32); 4] = [
    ("H100-80GB:1g.10gb", 1),
    ("H100-80GB:3g.40gb", 3),
    ("H100-80GB:whole", 7),
    ("A100-SXM4-40GB:2g.10gb", 2),
];

/// The store, services over it, what their passes run as, the admin and a new team.
async fn world(url: &str) -> (Store, Services, SystemActor, Principal, Uuid) {
    let (store, services, system) = services_with_admin(url, "metering-test-password").await;
    let p = services
        .accounts
        .principal_of("admin")
        .await
        .expect("admin");
    let team = services
        .tenancy
        .create_team(&p, &format!("meter-{}", Uuid::new_v4().simple()))
        .await
        .expect("team");
    (store, services, system, p, team.id.0)
}

async fn write(
    store: &Store,
    team: Uuid,
    user: Uuid,
    origin: DateTime<Utc>,
    s: &Spec,
) -> AllocationId {
    let id = AllocationId(Uuid::new_v4());
    let units = KINDS.iter().find(|k| k.0 == s.kind).expect("kind").1 * s.count;
    let start = origin + Duration::seconds(s.start);
    let row = AllocationRow {
        id,
        priority: s.priority,
        ..AllocationRow::queued(
            tessera_domain::ids::TeamId(team),
            tessera_domain::ids::UserId(user),
            &s.kind.parse().expect("kind"),
            (i64::from(s.count), i64::from(units)),
            start,
        )
    };
    store.insert_allocation(&row, "test").await.expect("insert");
    use AllocState::*;
    let mut steps = vec![(Queued, Placing, start), (Placing, Active, start)];
    if let Some(end) = s.end {
        let end = origin + Duration::seconds(end);
        steps.push((Active, Releasing, end));
        steps.push((Releasing, Ended, end));
    }
    for (from, to, at) in steps {
        let change = Change {
            active_at: (to == Active).then_some(at),
            ..Change::default()
        };
        let t = Transition::plain(id, (from, to), at, change);
        assert!(store.transition(&t).await.expect("transition"));
    }
    id
}

/// Second by second: which hour each active second falls in, then each hour priced.
fn ground_truth(specs: &[Spec], origin: DateTime<Utc>, now: i64, card: &RateCard) -> i64 {
    let catalog = Catalog::builtin();
    let mut total = 0;
    for s in specs {
        let last = s.end.unwrap_or(now).min(now);
        let done = s.end.is_some_and(|e| e <= now);
        let mut per_hour: BTreeMap<i64, i64> = BTreeMap::new();
        for sec in s.start..last {
            *per_hour.entry(sec.div_euclid(3600)).or_default() += 1000;
        }
        let kind: GpuKind = s.kind.parse().expect("kind");
        for (hour, ms) in per_hour {
            if !done && (hour + 1) * 3600 > now {
                continue; // the running hour is billed once it is complete
            }
            let at = origin + Duration::hours(hour);
            if let Some(p) = card.price(&kind, &catalog, at) {
                total += billing::cost(&p, s.count, ms, s.priority).1;
            }
        }
    }
    total
}

async fn run(url: &str, seed: u64) {
    let (store, services, system, p, team) = world(url).await;
    let store = &store;
    let mut rng = Lcg(seed);
    // Hours in the future, so the passes below can be given their own clock.
    let t = Utc::now().timestamp() + 2 * 3600;
    let origin = Utc
        .timestamp_opt(t - t.rem_euclid(3600), 0)
        .single()
        .expect("time");
    // Prices: a whole-H100 rate that changes twice, a 1g.10gb rate of its own from hour 3,
    // and a whole-A100 rate (its MIG profiles priced pro rata).
    let rates = [
        ("H100-80GB:whole", 700, 40, 0),
        ("H100-80GB:whole", 1_050, 40, 5),
        ("H100-80GB:whole", 333, 15, 9),
        ("H100-80GB:1g.10gb", 170, 0, 3),
        ("A100-SXM4-40GB:whole", 410, 25, 1),
    ];
    let mut domain_rates = Vec::new();
    for (kind, price, disc, hour) in rates {
        let r = RateRow {
            id: Uuid::new_v4(),
            kind: kind.parse().expect("kind"),
            model: kind.split(':').next().expect("model").into(),
            price_minor_per_hour: price,
            preemptible_discount_pct: disc,
            high_premium_pct: 2 * disc,
            effective_from: origin + Duration::hours(hour),
            created_at: Utc::now(),
            created_by: None,
        };
        assert!(store.set_rate(&r, p.user_id(), true).await.expect("rate"));
        domain_rates.push(Rate {
            id: r.id,
            kind: r.kind.to_string(),
            price_minor_per_hour: price,
            preemptible_discount_pct: u8::try_from(disc).expect("pct"),
            high_premium_pct: u16::try_from(2 * disc).expect("pct"),
            effective_from: r.effective_from,
        });
    }
    let card = RateCard::new(domain_rates);
    let n = 6 + rng.next(10) as usize;
    let specs: Vec<Spec> = (0..n)
        .map(|_| {
            let start = rng.next(12 * 3600) as i64;
            let len = 1 + rng.next(6 * 3600) as i64;
            Spec {
                kind: KINDS[rng.next(KINDS.len() as u64) as usize].0,
                count: 1 + rng.next(3) as u32,
                priority: PriorityClass::ALL[rng.next(3) as usize],
                start,
                end: (rng.next(4) != 0).then_some(start + len),
            }
        })
        .collect();
    for s in &specs {
        write(store, team, p.user_id().0, origin, s).await;
    }
    // Three clocks: part-way, later, at the end. At each, passes stop after a random number
    // of allocations (a crash) and are rerun, twice at once at the end.
    for now in [4 * 3600 + rng.next(3600) as i64, 9 * 3600 + 17, 20 * 3600] {
        let clock = origin + Duration::seconds(now);
        loop {
            let stop = rng.next(n as u64 + 1) as u32;
            let r = services
                .billing
                .meter(&system, clock, Some(stop))
                .await
                .expect("meter");
            if r.allocations < stop || stop as usize >= n {
                break;
            }
            if rng.next(2) == 0 {
                break;
            }
        }
        let (a, b) = tokio::join!(
            services.billing.meter(&system, clock, None),
            services.billing.meter(&system, clock, None)
        );
        a.expect("meter");
        b.expect("meter");
        let again = services
            .billing
            .meter(&system, clock, None)
            .await
            .expect("meter");
        assert_eq!(again.hours, 0, "seed {seed}: a rerun wrote {again:?}");
        let charged: i64 = store
            .team_charges(
                Some(TeamId(team)),
                origin - Duration::days(1),
                origin + Duration::days(2),
            )
            .await
            .expect("charges")
            .iter()
            .map(|r| r.1)
            .sum();
        assert_eq!(
            charged,
            ground_truth(&specs, origin, now, &card),
            "seed {seed} at +{now} s"
        );
        assert_eq!(store.ledger_balance().await.expect("balance").0, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metering_random_histories_matches_ground_truth_through_crashes_and_reruns() {
    let dir = tempfile::tempdir().expect("dir");
    for seed in 1..=6u64 {
        let url = format!("sqlite://{}/m{seed}.db?mode=rwc", dir.path().display());
        run(&url, seed).await;
    }
    if let Ok(pg) = std::env::var("TESSERA_TEST_PG_URL") {
        for seed in 7..=9u64 {
            let url = Store::create_postgres_database(&pg)
                .await
                .expect("database");
            run(&url, seed).await;
        }
    }
}

/// A state no release wrote (a hand edit, a botched migration) fails the read loudly: the
/// service answers Internal and logs it, where the row used to read back as `failed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_state_in_the_store_is_an_error_not_a_fallback() {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}/s.db?mode=rwc", dir.path().display());
    let (store, services, _, p, team) = world(&url).await;
    let spec = Spec {
        kind: "H100-80GB:1g.10gb",
        count: 1,
        priority: PriorityClass::Normal,
        start: 0,
        end: None,
    };
    let id = write(&store, team, p.user_id().0, Utc::now(), &spec).await;
    let view = services.allocations.get(&p, id).await.expect("readable");
    assert_eq!(view.state, AllocState::Active);
    let Store::Sqlite(pool) = &store else {
        panic!("a SQLite store")
    };
    sqlx::query("UPDATE allocations SET state = 'finished' WHERE id = $1")
        .bind(id.0)
        .execute(pool)
        .await
        .expect("update");
    let e = store.allocation(id).await.expect_err("undecodable");
    assert!(e.is_bad_data(), "{e}");
    assert_eq!(
        services
            .allocations
            .get(&p, id)
            .await
            .expect_err("internal"),
        tessera_domain::error::AppError::Internal
    );
}
