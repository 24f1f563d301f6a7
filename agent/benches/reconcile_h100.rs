//! Time to reconcile a simulated H100-80GB to the full 7× 1g.10gb layout.
//!
//! `cargo bench -p tessera-agent --bench reconcile_h100 [-- ITERATIONS]`
//! prints median and p99 per reconcile for three starting points. This
//! measures the agent's own work (observe, validate, diff, 14 create calls,
//! re-read) against the simulator; real NVML instance creation takes far
//! longer and dominates on hardware.
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use tessera_agent::reconcile::reconcile_gpu;
use tessera_agent::sim::SimNode;
use tessera_domain::wire::{ApplyState, DesiredGpuState, DesiredInstance, MigMode};

/// Puts a fresh node into a starting state.
type Prepare = fn(&SimNode, &str);

fn seven(gpu: &str) -> DesiredGpuState {
    DesiredGpuState {
        gpu_uuid: gpu.to_owned(),
        mode: MigMode::Enabled,
        layout: (0..7)
            .map(|start| DesiredInstance {
                profile: "1g.10gb".to_owned(),
                start,
            })
            .collect(),
        sharing: None,
        version: 1,
    }
}

fn report(label: &str, mut times: Vec<Duration>, calls: u64) {
    times.sort();
    let median = times[times.len() / 2];
    let p99 = times[(times.len() * 99 / 100).min(times.len() - 1)];
    println!(
        "{label:<48} median {:>9.1} µs   p99 {:>9.1} µs   {calls} backend calls",
        median.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6
    );
}

fn main() {
    let iters: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2000);
    println!("H100-80GB, desired 7x 1g.10gb, {iters} iterations each");
    let cases: [(&str, Prepare); 3] = [
        ("MIG disabled -> enable + 7 instances", |_, _| {}),
        ("MIG enabled, empty -> 7 instances", |n, g| {
            n.operator_set_mig_mode(g, MigMode::Enabled).unwrap();
        }),
        ("7g.80gb -> destroy + 7 instances", |n, g| {
            n.operator_set_mig_mode(g, MigMode::Enabled).unwrap();
            n.operator_create(g, "7g.80gb", 0, true).unwrap();
        }),
    ];
    for (label, prepare) in cases {
        let mut times = Vec::new();
        let mut calls = 0;
        for i in 0..iters {
            let node = SimNode::new(&["H100-80GB"], i).unwrap();
            let gpu = node.gpu_uuids()[0].clone();
            prepare(&node, &gpu);
            let d = seven(&gpu);
            let before = node.calls();
            let t = Instant::now();
            let out = reconcile_gpu(&node, &d, true, &mut |_| {});
            times.push(t.elapsed());
            calls = node.calls() - before;
            assert_eq!(out.state, ApplyState::Success);
            assert_eq!(node.layout(&gpu).len(), 7);
        }
        report(label, times, calls);
    }
    // Steady state: the check every round makes once converged.
    let node = SimNode::new(&["H100-80GB"], 1).unwrap();
    let gpu = node.gpu_uuids()[0].clone();
    let d = seven(&gpu);
    reconcile_gpu(&node, &d, true, &mut |_| {});
    let before = node.calls();
    let times: Vec<Duration> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            reconcile_gpu(&node, &d, true, &mut |_| {});
            t.elapsed()
        })
        .collect();
    report(
        "converged -> no-op check",
        times,
        (node.calls() - before) / iters,
    );
}
