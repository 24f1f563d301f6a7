//! Booking admission at scale, through the service layer, on SQLite and (with
//! `TESSERA_BENCH_PG_URL`) PostgreSQL: a 6,212-GPU cluster (777 nodes × 8 H100), 50 teams,
//! 10,000 bookings of 1–8 whole GPUs for 1–8 h spread over the next 29 days, then 1,000
//! more admitted one after another at 10,000 existing (bookings/s, p50/p99 latency).
//! Run: `cargo bench -p tessera-core --bench bookings` (`TESSERA_BENCH_BOOKINGS` sets the
//! number that exist first).
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Tests and benches stand outside the use cases: they read the wall clock to set up.
#![allow(clippy::disallowed_methods)]

mod support;

use chrono::{Duration, Utc};
use std::time::Instant;
use support::{Bench, Scratch, env_or, err as anyhow_err, h100};
use tessera_domain::booking::NewBooking;
use tessera_domain::wire::MigMode;

const NODES: usize = 777;
const GPUS_PER_NODE: usize = 8;
const TEAMS: usize = 50;
const MEASURED: usize = 1000;

fn main() -> anyhow::Result<()> {
    let rt = support::runtime()?;
    let scratch = Scratch::new("bookings")?;
    let existing: usize = env_or("TESSERA_BENCH_BOOKINGS", 10_000);
    println!(
        "{existing} bookings, then {MEASURED} more; {} GPUs on {NODES} nodes, {TEAMS} teams",
        NODES * GPUS_PER_NODE
    );
    for (name, url) in rt.block_on(support::targets(&scratch, "bench"))? {
        rt.block_on(run(name, &url, existing))?;
    }
    Ok(())
}

/// A deterministic spread of windows (a linear congruential generator: no dependency).
struct Spread(u64);

impl Spread {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

async fn run(name: &str, url: &str, existing: usize) -> anyhow::Result<()> {
    let b = Bench::open(url).await?;
    let (services, p) = (&b.services, &b.admin);
    let mut teams = Vec::new();
    for _ in 0..TEAMS {
        teams.push(b.team(0, 1_000_000, 1_000_000).await?);
    }
    let now = Utc::now();
    for n in 0..NODES {
        let gpus = (0..GPUS_PER_NODE)
            .map(|i| h100(n, i, MigMode::Disabled, vec![]))
            .collect();
        b.add_node(&format!("bench-{n:04}"), gpus, now).await?;
    }
    // One pass: the capacity bookings are admitted against.
    services
        .allocations
        .tick(&b.system, Utc::now())
        .await
        .map_err(anyhow_err)?;
    let mut spread = Spread(42);
    let mut one = |i: usize| {
        let start = now
            + Duration::hours(1)
            + Duration::minutes(i64::try_from(spread.next(29 * 24 * 60)).unwrap_or(0));
        let hours = 1 + i64::try_from(spread.next(8)).unwrap_or(0);
        NewBooking {
            team_id: teams[i % TEAMS].to_string(),
            kind: "H100-80GB:whole".into(),
            count: 1 + u32::try_from(spread.next(8)).unwrap_or(0),
            starts_at: start.to_rfc3339(),
            ends_at: (start + Duration::hours(hours)).to_rfc3339(),
            purpose: String::new(),
        }
    };
    let seeding = Instant::now();
    for i in 0..existing {
        services
            .allocations
            .book(p, &one(i))
            .await
            .map_err(anyhow_err)?;
    }
    let seeded = seeding.elapsed();
    let mut latencies = Vec::with_capacity(MEASURED);
    let started = Instant::now();
    for i in existing..existing + MEASURED {
        let input = one(i);
        let t = Instant::now();
        services
            .allocations
            .book(p, &input)
            .await
            .map_err(anyhow_err)?;
        latencies.push(t.elapsed());
    }
    let total = started.elapsed();
    latencies.sort();
    let pct = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q) as usize];
    println!(
        "{name}: seeding {existing} bookings took {:.1} s ({:.0}/s); at {existing} existing: \
         {:.0} bookings/s (p50 {:.2} ms, p99 {:.2} ms, each returns the full view)",
        seeded.as_secs_f64(),
        existing as f64 / seeded.as_secs_f64(),
        MEASURED as f64 / total.as_secs_f64(),
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
    );
    Ok(())
}
