//! `cargo run --release -p tessera-bench --bin throughput`
//! 6,212 H100-80GB GPUs (half MIG, half whole), filled to 90 %, then 10,000
//! pending mixed requests placed one at a time on one thread.
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Instant;

use tessera_bench::Rng;
use tessera_domain::mig::Catalog;
use tessera_domain::planner::{Cluster, Engine, GpuMode, Request, plan};

const PROFILES: [(&str, u64); 6] = [
    ("1g.10gb", 143),
    ("1g.20gb", 143),
    ("2g.20gb", 286),
    ("3g.40gb", 429),
    ("4g.40gb", 571),
    ("7g.80gb", 1000),
];

fn request(rng: &mut Rng, i: usize) -> (Request, u64) {
    let mut r = Request {
        id: format!("r{i}"),
        team: None,
        priority: (rng.below(3)) as i32,
        mig: None,
        gpus: None,
        gpu_milli: None,
        cpu_milli: 1000 * rng.below(8) as u64,
        memory_mib: 4096 * rng.below(8) as u64,
        models: Vec::new(),
        needs_cuda: None,
        gang: None,
    };
    if rng.below(10) < 6 {
        let (p, milli) = PROFILES[rng.below(PROFILES.len())];
        r.mig = Some(p.to_owned());
        (r, milli)
    } else {
        let n = 1 + rng.below(2) as u32;
        r.gpus = Some(n);
        (r, u64::from(n) * 1000)
    }
}

fn main() {
    let gpus_total = 6212usize;
    let nodes = common::h100_nodes(gpus_total, |i| {
        if i % 2 == 0 {
            GpuMode::Mig
        } else {
            GpuMode::Whole
        }
    });
    let cluster = Cluster {
        nodes,
        models: Vec::new(),
        fixed_sharing: false,
        demand: Vec::new(),
    };
    let catalog = Catalog::builtin();
    let mut engine = Engine::new(&cluster, &catalog).expect("valid cluster");
    let mut rng = Rng::new(42);
    let capacity = gpus_total as u64 * 1000;
    let (mut used, mut misses, mut i) = (0u64, 0, 0);
    while used * 10 < capacity * 9 && misses < 10_000 {
        let (r, milli) = request(&mut rng, i);
        i += 1;
        match engine.place(&r).expect("valid request") {
            Ok(_) => used += milli,
            Err(_) => misses += 1,
        }
    }
    println!(
        "filled to {:.1}% of GPU capacity ({i} requests)",
        used as f64 * 100.0 / capacity as f64
    );

    let pending: Vec<Request> = (0..10_000)
        .map(|j| request(&mut rng, 1_000_000 + j).0)
        .collect();
    let snapshot = engine.snapshot();
    let mut times = Vec::with_capacity(pending.len());
    let mut placed = 0;
    let t0 = Instant::now();
    for r in &pending {
        let t = Instant::now();
        if let Ok(Ok(_)) = engine.place(r) {
            placed += 1;
        }
        times.push(t.elapsed().as_nanos() as u64);
    }
    let total = t0.elapsed().as_secs_f64();
    times.sort_unstable();
    let p =
        |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)] as f64 / 1000.0;
    println!(
        "engine: {} decisions ({placed} placed) in {:.3}s = {:.0} decisions/s; p50 {:.1} us, p99 {:.1} us, max {:.1} us",
        pending.len(),
        total,
        pending.len() as f64 / total,
        p(0.5),
        p(0.99),
        p(1.0)
    );
    let t1 = Instant::now();
    let planned = plan(&snapshot, &pending, &catalog).expect("valid input");
    let total = t1.elapsed().as_secs_f64();
    println!(
        "plan(): {} assignments, {} pending with reasons, {} reconfigurations in {:.3}s = {:.0} requests/s end to end",
        planned.assignments.len(),
        planned.pending.len(),
        planned.reconfigurations.len(),
        total,
        pending.len() as f64 / total
    );
}
