//! The steady-state scheduler pass: 777 simulated nodes × 8 H100 (6,216 GPUs, MIG on, seven
//! `1g.10gb` instances each) holding 2,000 and then 10,000 active allocations, nothing
//! queued and nothing due: the time of one [`Allocations::tick`] that only looks (median and
//! worst of `PASSES` passes), and of a new leader's first pass (fresh services on the same
//! store: it loads every live allocation), on SQLite and (with `TESSERA_BENCH_PG_URL`)
//! PostgreSQL.
//! Run: `cargo bench -p tessera-core --bench pass` (`LIVE=2000,10000`, `PASSES=10`).
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Tests and benches stand outside the use cases: they read the wall clock to set up.
#![allow(clippy::disallowed_methods)]

mod support;

use chrono::Utc;
use std::time::{Duration, Instant};
use support::{Bench, Scratch, env_or, err as anyhow_err, h100};
use tessera_domain::wire::{ComputeInstanceInfo, GpuInfo, MigInstance, MigMode};
use uuid::Uuid;

const NODES: usize = 777;
const GPUS_PER_NODE: usize = 8;

fn main() -> anyhow::Result<()> {
    let rt = support::runtime()?;
    let scratch = Scratch::new("pass")?;
    let live: Vec<usize> = std::env::var("LIVE")
        .unwrap_or_else(|_| "2000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let passes: usize = env_or("PASSES", 10);
    println!(
        "{} GPUs on {NODES} nodes, {passes} steady-state passes each",
        NODES * GPUS_PER_NODE
    );
    for n in live {
        for (name, url) in rt.block_on(support::targets(&scratch, &format!("pass{n}")))? {
            rt.block_on(run(name, &url, n, passes))?;
        }
    }
    Ok(())
}

/// A GPU with seven idle `1g.10gb` instances.
fn gpu(n: usize, i: usize) -> GpuInfo {
    let instances = (0..7u8)
        .map(|s| MigInstance {
            profile_id: 19,
            profile: "1g.10gb".into(),
            start: s,
            size: 1,
            gi_id: u32::from(s) + 1,
            compute_instances: vec![ComputeInstanceInfo {
                ci_id: 0,
                profile_id: 0,
                full_size: true,
                uuid: Some(format!("MIG-{}", Uuid::new_v4())),
                process_count: Some(0),
            }],
        })
        .collect();
    h100(n, i, MigMode::Enabled, instances)
}

async fn run(name: &str, url: &str, live: usize, passes: usize) -> anyhow::Result<()> {
    let b = Bench::open(url).await?;
    let services = &b.services;
    let team = b.team(100_000, 100_000, 100_000).await?;
    let now = Utc::now();
    for n in 0..NODES {
        let gpus = (0..GPUS_PER_NODE).map(|i| gpu(n, i)).collect();
        b.add_node(&format!("bench-{n:04}"), gpus, now).await?;
    }
    let setup = Instant::now();
    for _ in 0..live {
        b.request(team, "H100-80GB:1g.10gb").await?;
    }
    // Placed on the existing instances, then activated: the agents report them.
    let placed = services
        .allocations
        .tick(&b.system, Utc::now())
        .await
        .map_err(anyhow_err)?;
    let activated = services
        .allocations
        .tick(&b.system, Utc::now())
        .await
        .map_err(anyhow_err)?;
    anyhow::ensure!(
        placed.placed as usize == live && activated.activated as usize == live,
        "placed {} and activated {} of {live}",
        placed.placed,
        activated.activated
    );
    let setup = setup.elapsed();
    let mut times: Vec<Duration> = Vec::with_capacity(passes);
    for _ in 0..passes {
        let t = Instant::now();
        let r = services
            .allocations
            .tick(&b.system, Utc::now())
            .await
            .map_err(anyhow_err)?;
        times.push(t.elapsed());
        anyhow::ensure!(
            r.placed + r.activated + r.expired + r.failed + r.preempted == 0,
            "a steady-state pass changed something"
        );
    }
    times.sort();
    // A new leader: fresh services on the same store, whose first pass loads everything.
    let (fresh, system) = tessera_core::Services::new(
        b.store.clone(),
        tessera_core::auth::password::Hasher::new(2, 16)?,
        std::sync::Arc::new(tessera_core::auth::limiter::LoginLimiter::new(
            Default::default(),
        )),
        Duration::from_secs(86400),
    );
    let t = Instant::now();
    fresh
        .allocations
        .tick(&system, Utc::now())
        .await
        .map_err(anyhow_err)?;
    let cold = t.elapsed();
    println!(
        "{name}, {live} active allocations: pass median {:.1} ms, worst {:.1} ms, best {:.1} ms; \
         a new leader's first pass {:.1} ms (setup {:.1} s)",
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3,
        cold.as_secs_f64() * 1e3,
        setup.as_secs_f64(),
    );
    Ok(())
}
