//! Reconcile from many start states to many desired states.

use tessera_agent::backend::{ErrorKind, GpuBackend};
use tessera_agent::reconcile::{BACKOFF_MIN_MS, Controller, reconcile_gpu};
use tessera_agent::sim::SimNode;
use tessera_domain::wire::{
    ApplyState, ApplyStatus, DesiredGpuState, DesiredState, FailureKind, MigMode,
};

use crate::support::{A100, H100, apply, desired, mig_uuids, node_with, sevens, sorted};

type Layout = &'static [(&'static str, u8)];

const A100_LAYOUTS: &[Layout] = &[
    &[],
    &[("7g.40gb", 0)],
    &[("4g.20gb", 0), ("3g.20gb", 4)],
    &[("3g.20gb", 0), ("3g.20gb", 4)],
    &[
        ("2g.10gb", 0),
        ("2g.10gb", 2),
        ("2g.10gb", 4),
        ("1g.5gb", 6),
    ],
    &sevens("1g.5gb"),
    &[
        ("1g.10gb", 0),
        ("1g.10gb", 2),
        ("1g.10gb", 4),
        ("1g.10gb", 6),
    ],
    &[
        ("1g.5gb+me", 0),
        ("1g.5gb", 1),
        ("2g.10gb", 2),
        ("3g.20gb", 4),
    ],
    &[("2g.10gb", 2)],
];

const H100_LAYOUTS: &[Layout] = &[
    &[],
    &[("7g.80gb", 0)],
    &[("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)],
    &sevens("1g.10gb"),
    &[("1g.20gb", 0), ("1g.20gb", 2), ("3g.40gb", 4)],
];

fn assert_converged(node: &SimNode, gpu: &str, layout: &[(&str, u8)]) {
    assert_eq!(node.layout(gpu), sorted(layout));
    for inst in node.instances(gpu).unwrap() {
        assert_eq!(inst.compute_instances.len(), 1, "{inst:?}");
        assert!(inst.compute_instances[0].full_size);
    }
}

#[test]
fn every_start_reaches_every_desired_layout_and_stays_put() {
    let mut cases = 0;
    for (model, layouts) in [(A100, A100_LAYOUTS), (H100, H100_LAYOUTS)] {
        for start in layouts {
            for want in layouts {
                let (node, gpu) = node_with(model, start);
                let d = desired(&gpu, want, 1);
                let out = apply(&node, &d);
                assert_eq!(
                    out.state,
                    ApplyState::Success,
                    "{start:?} -> {want:?}: {out:?}"
                );
                assert_converged(&node, &gpu, want);
                // Idempotent: a second pass changes nothing.
                let before = mig_uuids(&node, &gpu);
                assert_eq!(apply(&node, &d).state, ApplyState::Success);
                assert_eq!(mig_uuids(&node, &gpu), before);
                // Instances that were already wanted kept their UUIDs.
                cases += 1;
            }
        }
    }
    println!("reconcile start x desired cases: {cases}");
    assert_eq!(cases, 9 * 9 + 5 * 5);
}

#[test]
fn wanted_instances_are_kept_not_recreated() {
    let (node, gpu) = node_with(H100, &[("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5)]);
    let before = mig_uuids(&node, &gpu);
    let out = apply(&node, &desired(&gpu, &[("3g.40gb", 0), ("2g.20gb", 4)], 1));
    assert_eq!(out.state, ApplyState::Success);
    assert_eq!(mig_uuids(&node, &gpu)["3g.40gb@0"], before["3g.40gb@0"]);
}

#[test]
fn enabling_mig_on_hopper_then_applying_happens_in_one_round() {
    let node = SimNode::new(&[H100], 3).unwrap();
    let gpu = node.gpu_uuids()[0].clone();
    let want = [("4g.40gb", 0), ("3g.40gb", 4)];
    let out = apply(&node, &desired(&gpu, &want, 1));
    assert_eq!(out.state, ApplyState::Success, "{out:?}");
    assert_converged(&node, &gpu, &want);
}

#[test]
fn enabling_mig_on_ampere_is_pending_until_reset() {
    let node = SimNode::new(&[A100], 3).unwrap();
    let gpu = node.gpu_uuids()[0].clone();
    let d = desired(&gpu, &[("7g.40gb", 0)], 1);
    let out = apply(&node, &d);
    assert_eq!(out.state, ApplyState::Pending);
    assert!(out.step.unwrap().contains("reset"));
    // Still pending, and no further calls to set the mode.
    assert_eq!(apply(&node, &d).state, ApplyState::Pending);
    node.reset_gpu(&gpu).unwrap();
    assert_eq!(apply(&node, &d).state, ApplyState::Success);
    assert_converged(&node, &gpu, &[("7g.40gb", 0)]);
}

#[test]
fn disabling_mig_removes_idle_instances_first() {
    let (node, gpu) = node_with(H100, &[("1g.10gb", 0)]);
    let d = DesiredGpuState {
        mode: MigMode::Disabled,
        ..desired(&gpu, &[], 2)
    };
    assert_eq!(apply(&node, &d).state, ApplyState::Success);
    assert_eq!(
        node.mig_mode(&gpu).unwrap().unwrap().current,
        MigMode::Disabled
    );
    // On Ampere the change waits for a reset.
    let (node, gpu) = node_with(A100, &[("3g.20gb", 0)]);
    let d = DesiredGpuState {
        gpu_uuid: gpu.clone(),
        ..d
    };
    assert_eq!(apply(&node, &d).state, ApplyState::Pending);
    assert!(node.layout(&gpu).is_empty());
}

#[test]
fn busy_instances_are_never_touched_and_block_only_what_they_must() {
    let (node, gpu) = node_with(A100, &[("4g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)]);
    let busy = mig_uuids(&node, &gpu)["2g.10gb@4"].clone();
    let pid = node.attach_process(&busy, 4096).unwrap();
    // Wanted: 4g@0 replaced by 1g×4; 2g@4 replaced by 3g@4 (blocked by the
    // busy 2g); 1g@6 goes (idle).
    let want = [
        ("1g.5gb", 0),
        ("1g.5gb", 1),
        ("1g.5gb", 2),
        ("1g.5gb", 3),
        ("3g.20gb", 4),
    ];
    let d = desired(&gpu, &want, 1);
    let out = apply(&node, &d);
    assert_eq!(out.state, ApplyState::Failed);
    let err = out.error.unwrap();
    assert_eq!(err.kind, FailureKind::Busy);
    assert!(err.message.contains("2g.10gb@4"), "{}", err.message);
    assert_eq!(node.busy_destroy_attempts(), 0);
    assert_eq!(mig_uuids(&node, &gpu)["2g.10gb@4"], busy);
    // Everything not blocked was done.
    assert_eq!(
        node.layout(&gpu),
        sorted(&[
            ("1g.5gb", 0),
            ("1g.5gb", 1),
            ("1g.5gb", 2),
            ("1g.5gb", 3),
            ("2g.10gb", 4)
        ])
    );
    node.detach_process(pid).unwrap();
    assert_eq!(apply(&node, &d).state, ApplyState::Success);
    assert_converged(&node, &gpu, &want);
}

#[test]
fn a_busy_gpu_cannot_switch_mode() {
    let (node, gpu) = node_with(H100, &[("7g.80gb", 0)]);
    let mig = mig_uuids(&node, &gpu)["7g.80gb@0"].clone();
    node.attach_process(&mig, 1).unwrap();
    let d = DesiredGpuState {
        mode: MigMode::Disabled,
        ..desired(&gpu, &[], 1)
    };
    let out = apply(&node, &d);
    assert_eq!(out.error.unwrap().kind, FailureKind::Busy);
    assert_eq!(node.busy_destroy_attempts(), 0);
    assert_eq!(node.layout(&gpu).len(), 1);
}

#[test]
fn impossible_layouts_are_rejected_before_any_change() {
    let (node, gpu) = node_with(A100, &[("7g.40gb", 0)]);
    let calls = |n: &SimNode| n.calls();
    for bad in [
        &[("3g.20gb", 0), ("4g.20gb", 0)][..],
        &[("1g.5gb", 7)],
        &[("5g.25gb", 0)],
        &[("1g.5gb+me", 0), ("1g.5gb+me", 1)],
    ] {
        let before = calls(&node);
        let out = apply(&node, &desired(&gpu, bad, 1));
        assert_eq!(out.state, ApplyState::Failed);
        assert_eq!(out.error.unwrap().kind, FailureKind::Impossible, "{bad:?}");
        // Only reads: devices, mig_mode, profiles, instances.
        assert_eq!(calls(&node) - before, 4);
        assert_eq!(node.layout(&gpu), sorted(&[("7g.40gb", 0)]));
    }
}

#[test]
fn read_only_agent_only_reports() {
    let (node, gpu) = node_with(H100, &[("7g.80gb", 0)]);
    let out = reconcile_gpu(
        &node,
        &desired(&gpu, &[("3g.40gb", 0)], 1),
        false,
        &mut |_| {},
    );
    assert_eq!(out.state, ApplyState::Pending);
    assert!(out.step.unwrap().contains("--manage-mig"));
    assert_eq!(node.layout(&gpu), sorted(&[("7g.80gb", 0)]));
    let out = reconcile_gpu(
        &node,
        &desired(&gpu, &[("7g.80gb", 0)], 1),
        false,
        &mut |_| {},
    );
    assert_eq!(out.state, ApplyState::Success);
}

#[test]
fn leftover_gi_without_ci_gets_its_ci() {
    let (node, gpu) = node_with(H100, &[]);
    node.operator_create(&gpu, "2g.20gb", 2, false).unwrap();
    let out = apply(&node, &desired(&gpu, &[("2g.20gb", 2)], 1));
    assert_eq!(out.state, ApplyState::Success);
    assert_converged(&node, &gpu, &[("2g.20gb", 2)]);
}

#[test]
fn driver_errors_and_lost_gpus_are_reported_with_the_step() {
    let (node, gpu) = node_with(H100, &[]);
    node.fail_next("create_full_compute_instance", ErrorKind::NoPermission);
    let out = apply(&node, &desired(&gpu, &[("7g.80gb", 0)], 1));
    assert_eq!(out.state, ApplyState::Failed);
    assert_eq!(out.step.as_deref(), Some("create 7g.80gb@0"));
    assert_eq!(out.error.unwrap().kind, FailureKind::Driver);
    node.fall_off_bus(&gpu);
    let out = apply(&node, &desired(&gpu, &[("7g.80gb", 0)], 1));
    assert_eq!(out.error.unwrap().kind, FailureKind::GpuUnavailable);
}

fn run(ctl: &mut Controller, node: &SimNode, d: &DesiredState, now: u64) -> Vec<ApplyStatus> {
    let mut out = Vec::new();
    ctl.tick(node, d, now, &mut |s| out.push(s));
    out
}

#[test]
fn controller_backs_off_after_failure_and_resets_on_a_new_version() {
    let (node, gpu) = node_with(H100, &[("7g.80gb", 0)]);
    let mig = mig_uuids(&node, &gpu)["7g.80gb@0"].clone();
    node.attach_process(&mig, 1).unwrap();
    let mut d = DesiredState {
        gpus: vec![desired(&gpu, &[("1g.10gb", 0)], 1)],
    };
    let mut ctl = Controller::new(true);
    let s = run(&mut ctl, &node, &d, 0);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].state, ApplyState::Failed);
    assert_eq!(s[0].retry_in_s, Some(BACKOFF_MIN_MS / 1000));
    // Within the back-off window nothing is even read.
    let calls = node.calls();
    assert!(run(&mut ctl, &node, &d, BACKOFF_MIN_MS - 1).is_empty());
    assert_eq!(node.calls(), calls);
    // After it, one retry; the same failure is not re-sent, the wait doubles.
    let s = run(&mut ctl, &node, &d, BACKOFF_MIN_MS);
    assert!(node.calls() > calls);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].retry_in_s, Some(2 * BACKOFF_MIN_MS / 1000));
    let calls = node.calls();
    assert!(run(&mut ctl, &node, &d, BACKOFF_MIN_MS * 3 - 1).is_empty());
    assert_eq!(node.calls(), calls);
    // A new version is tried at once.
    d.gpus[0] = desired(&gpu, &[("7g.80gb", 0)], 2);
    let s = run(&mut ctl, &node, &d, BACKOFF_MIN_MS * 3 - 1);
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].state, s[0].version), (ApplyState::Success, 2));
}

#[test]
fn controller_reports_applying_then_success_once() {
    let (node, gpu) = node_with(H100, &[]);
    let d = DesiredState {
        gpus: vec![desired(&gpu, &[("3g.40gb", 4)], 5)],
    };
    let mut ctl = Controller::new(true);
    let s = run(&mut ctl, &node, &d, 0);
    let states: Vec<ApplyState> = s.iter().map(|s| s.state).collect();
    assert_eq!(states, [ApplyState::Applying, ApplyState::Success]);
    assert_eq!(s[0].step.as_deref(), Some("create 3g.40gb@4"));
    assert!(run(&mut ctl, &node, &d, 10_000).is_empty());
    // Drift (a reboot wiped the instances) is repaired and reported.
    node.reboot();
    let s = run(&mut ctl, &node, &d, 20_000);
    assert_eq!(s.last().unwrap().state, ApplyState::Success);
    assert_eq!(node.layout(&gpu), sorted(&[("3g.40gb", 4)]));
}
