//! Kill the agent between any two backend calls, start a new one against the
//! same GPUs, and check it converges without touching busy instances.

use tessera_agent::sim::SimNode;
use tessera_domain::wire::{ApplyState, DesiredGpuState, MigMode};

use crate::support::{A100, H100, apply, desired, mig_uuids, node_with, sevens};

type Layout = &'static [(&'static str, u8)];

struct Scenario {
    model: &'static str,
    mig_on: bool,
    start: Layout,
    /// Instances (by `profile@start`) that run a process throughout.
    busy: &'static [&'static str],
    want_mode: MigMode,
    /// The layout to converge to, as `profile@start` instances separated by spaces.
    want: &'static str,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        model: A100,
        mig_on: true,
        start: &sevens("1g.5gb"),
        busy: &[],
        want_mode: MigMode::Enabled,
        want: "4g.20gb@0 3g.20gb@4",
    },
    Scenario {
        model: A100,
        mig_on: true,
        start: &[("4g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)],
        busy: &["1g.5gb@6"],
        want_mode: MigMode::Enabled,
        want: "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 2g.10gb@4 1g.5gb@6",
    },
    Scenario {
        // The busy 2g@4 blocks 3g@4: the end state is "failed: busy" with
        // everything else done.
        model: A100,
        mig_on: true,
        start: &[("4g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)],
        busy: &["2g.10gb@4"],
        want_mode: MigMode::Enabled,
        want: "1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3 3g.20gb@4",
    },
    Scenario {
        model: H100,
        mig_on: false,
        start: &[],
        busy: &[],
        want_mode: MigMode::Enabled,
        want: "1g.10gb@0 1g.10gb@1 1g.10gb@2 1g.10gb@3 1g.10gb@4 1g.10gb@5 1g.10gb@6",
    },
    Scenario {
        model: H100,
        mig_on: true,
        start: &sevens("1g.10gb"),
        busy: &["1g.10gb@3"],
        want_mode: MigMode::Enabled,
        want: "2g.20gb@0 1g.10gb@2 1g.10gb@3 3g.40gb@4",
    },
    Scenario {
        model: H100,
        mig_on: true,
        start: &[("3g.40gb", 0), ("3g.40gb", 4)],
        busy: &[],
        want_mode: MigMode::Disabled,
        want: "",
    },
];

/// A fresh node in the scenario's start state; returns the busy UUIDs.
fn setup(sc: &Scenario) -> (SimNode, String, Vec<String>) {
    let (node, gpu) = if sc.mig_on {
        node_with(sc.model, sc.start)
    } else {
        let node = SimNode::new(&[sc.model], 7).unwrap();
        let gpu = node.gpu_uuids()[0].clone();
        (node, gpu)
    };
    let uuids = mig_uuids(&node, &gpu);
    let busy: Vec<String> = sc.busy.iter().map(|b| uuids[*b].clone()).collect();
    for b in &busy {
        node.attach_process(b, 1000).unwrap();
    }
    (node, gpu, busy)
}

/// `profile@start` instances separated by spaces, as a layout.
fn instances(names: &'static str) -> Vec<(&'static str, u8)> {
    names
        .split_whitespace()
        .map(|i| {
            let (profile, start) = i.split_once('@').expect("profile@start");
            (profile, start.parse().expect("start"))
        })
        .collect()
}

fn want(sc: &Scenario, gpu: &str) -> DesiredGpuState {
    DesiredGpuState {
        mode: sc.want_mode,
        ..desired(gpu, &instances(sc.want), 1)
    }
}

/// splitmix64, so the "random" crash points are the same on every run.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn check_end(
    sc: &Scenario,
    node: &SimNode,
    gpu: &str,
    busy: &[String],
    reference: &(ApplyState, Vec<(String, u8)>),
    case: &str,
) {
    let uuids = mig_uuids(node, gpu);
    for b in busy {
        assert!(
            uuids.values().any(|u| u == b),
            "{case}: busy {b} was destroyed"
        );
    }
    assert_eq!(
        node.busy_destroy_attempts(),
        0,
        "{case}: tried to destroy a busy instance"
    );
    assert_eq!(&node.layout(gpu), &reference.1, "{case}: layout");
    let _ = sc;
}

#[test]
fn crash_at_any_point_then_restart_converges_without_touching_busy_instances() {
    let mut single = 0u64;
    let mut double = 0u64;
    let mut rng = 0x7e55_e7a0_u64;
    for (n, sc) in SCENARIOS.iter().enumerate() {
        // Reference: an uninterrupted run.
        let (node, gpu, busy) = setup(sc);
        let before = node.calls();
        let out = apply(&node, &want(sc, &gpu));
        let calls = node.calls() - before;
        let reference = (out.state, node.layout(&gpu));
        let expected = if sc
            .busy
            .iter()
            .any(|b| !sc.want.split_whitespace().any(|w| w == *b))
        {
            ApplyState::Failed
        } else {
            ApplyState::Success
        };
        assert_eq!(out.state, expected, "scenario {n}: {out:?}");
        let case = format!("scenario {n} reference");
        check_end(sc, &node, &gpu, &busy, &reference, &case);

        // One crash after k calls, for every k.
        for k in 0..calls {
            let (node, gpu, busy) = setup(sc);
            node.crash_after(k);
            let crashed = apply(&node, &want(sc, &gpu));
            assert_eq!(crashed.state, ApplyState::Failed, "scenario {n} k={k}");
            node.revive();
            let out = apply(&node, &want(sc, &gpu));
            assert_eq!(out.state, reference.0, "scenario {n} k={k}: {out:?}");
            let case = format!("scenario {n} k={k}");
            check_end(sc, &node, &gpu, &busy, &reference, &case);
            single += 1;
        }

        // Two crashes in a row at seeded random points.
        for _ in 0..40 {
            let (node, gpu, busy) = setup(sc);
            let k1 = next(&mut rng) % calls;
            let k2 = next(&mut rng) % calls;
            node.crash_after(k1);
            let _ = apply(&node, &want(sc, &gpu));
            node.revive();
            node.crash_after(k2);
            let _ = apply(&node, &want(sc, &gpu));
            node.revive();
            let out = apply(&node, &want(sc, &gpu));
            let case = format!("scenario {n} k1={k1} k2={k2}");
            assert_eq!(out.state, reference.0, "{case}: {out:?}");
            check_end(sc, &node, &gpu, &busy, &reference, &case);
            double += 1;
        }
    }
    println!(
        "crash-point cases: {} ({single} single-crash at every call boundary, {double} seeded double-crash)",
        single + double
    );
    assert!(single > 100);
}
