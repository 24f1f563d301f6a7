//! Admission and placement through the service layer, on SQLite and (with
//! `TESSERA_BENCH_PG_URL`) PostgreSQL: 1,000 requests admitted one after another (latency
//! p50/p99, requests/s), then one scheduler pass that places all of them with the planner
//! on a simulated 6,212-GPU cluster (777 nodes × 8 H100, MIG on, empty), writing the
//! desired MIG layouts. Run: `cargo bench -p tessera-core --bench admission`.
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Tests and benches stand outside the use cases: they read the wall clock to set up.
#![allow(clippy::disallowed_methods)]

mod support;

use chrono::Utc;
use std::time::Instant;
use support::{Bench, Scratch, err as anyhow_err, h100};
use tessera_domain::wire::MigMode;

const NODES: usize = 777;
const GPUS_PER_NODE: usize = 8;
const REQUESTS: usize = 1000;

fn main() -> anyhow::Result<()> {
    let rt = support::runtime()?;
    let scratch = Scratch::new("admission")?;
    println!(
        "{REQUESTS} requests, {} GPUs on {NODES} nodes",
        NODES * GPUS_PER_NODE
    );
    for (name, url) in rt.block_on(support::targets(&scratch, "bench"))? {
        rt.block_on(run(name, &url))?;
    }
    Ok(())
}

async fn run(name: &str, url: &str) -> anyhow::Result<()> {
    let b = Bench::open(url).await?;
    let services = &b.services;
    let team = b.team(100_000, 100_000, 100_000).await?;
    let now = Utc::now();
    for n in 0..NODES {
        let gpus = (0..GPUS_PER_NODE)
            .map(|i| h100(n, i, MigMode::Enabled, vec![]))
            .collect();
        b.add_node(&format!("bench-{n:04}"), gpus, now).await?;
    }

    let mut latencies = Vec::with_capacity(REQUESTS);
    let started = Instant::now();
    for _ in 0..REQUESTS {
        let t = Instant::now();
        b.request(team, "H100-80GB:1g.10gb").await?;
        latencies.push(t.elapsed());
    }
    let admit_total = started.elapsed();
    latencies.sort();
    let pct = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q) as usize];

    let t = Instant::now();
    let report = services
        .allocations
        .tick(&b.system, Utc::now())
        .await
        .map_err(anyhow_err)?;
    let place = t.elapsed();
    println!(
        "{name}: admission {:.0} requests/s (p50 {:.2} ms, p99 {:.2} ms, each returns the full view); \
         one scheduler pass placed {} of {REQUESTS} and wrote {} layouts in {:.2} s ({:.0} placements/s)",
        REQUESTS as f64 / admit_total.as_secs_f64(),
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        report.placed,
        report.reconfigured,
        place.as_secs_f64(),
        f64::from(report.placed) / place.as_secs_f64(),
    );
    anyhow::ensure!(report.placed as usize == REQUESTS, "not all placed");
    Ok(())
}
