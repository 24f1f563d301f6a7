//! The simulator follows the driver's MIG rules (mig.md §1.3, §2).

use tessera_agent::backend::{ComputeInstanceId, ErrorKind, GpuBackend, GpuInstanceAt, ModeChange};
use tessera_agent::sim::SimNode;
use tessera_domain::mig::Catalog;
use tessera_domain::wire::{MigMode, MigModeState};

use crate::support::{A100, H100, node_with};

fn kind<T: std::fmt::Debug>(r: Result<T, tessera_agent::backend::BackendError>) -> ErrorKind {
    r.unwrap_err().kind
}

fn id(node: &SimNode, gpu: &str, name: &str) -> (u32, u8) {
    let p = node
        .profiles(gpu)
        .unwrap()
        .into_iter()
        .find(|p| p.name == name)
        .unwrap();
    (p.id, p.memory_slices)
}

#[test]
fn profile_tables_are_the_catalogs() {
    let node = SimNode::new(&[A100, H100, "A30-24GB"], 1).unwrap();
    let catalog = Catalog::builtin();
    for (gpu, model) in node.gpu_uuids().iter().zip([A100, H100, "A30-24GB"]) {
        let table = node.profiles(gpu).unwrap();
        let m = catalog.get(model).unwrap();
        assert_eq!(table.len(), m.profiles().len());
        for (got, want) in table.iter().zip(m.profiles()) {
            assert_eq!((got.id, got.name.as_str()), (want.id, want.name.as_str()));
            assert_eq!(got.max_count, want.max_count);
            let starts: Vec<u8> = got.placements.iter().map(|p| p.start).collect();
            let want_starts: Vec<u8> = want.placements.iter().map(|p| p.start).collect();
            assert_eq!(starts, want_starts);
        }
    }
    // IDs differ between families: 1g.10gb is 15 on A100-40GB, 19 on H100.
    let a100 = &node.gpu_uuids()[0];
    let h100 = &node.gpu_uuids()[1];
    assert_eq!(id(&node, a100, "1g.10gb").0, 15);
    assert_eq!(id(&node, h100, "1g.10gb").0, 19);
}

#[test]
fn unknown_model_is_rejected_and_nomig_has_no_mig() {
    assert!(SimNode::new(&["GeForce 9000"], 1).is_err());
    let node = SimNode::new(&["nomig:L4"], 1).unwrap();
    let gpu = &node.gpu_uuids()[0];
    assert_eq!(node.mig_mode(gpu).unwrap(), None);
    assert_eq!(
        kind(node.set_mig_mode(gpu, MigMode::Enabled)),
        ErrorKind::NotSupported
    );
}

#[test]
fn instances_need_mig_enabled() {
    let node = SimNode::new(&[H100], 1).unwrap();
    let gpu = &node.gpu_uuids()[0];
    let (pid, size) = id(&node, gpu, "1g.10gb");
    assert_eq!(
        kind(node.create_gpu_instance(
            gpu,
            GpuInstanceAt {
                profile_id: pid,
                start: 0,
                size
            }
        )),
        ErrorKind::NotSupported
    );
}

#[test]
fn overlap_and_exhausted_counts_are_insufficient_resources() {
    let (node, gpu) = node_with(A100, &[("3g.20gb", 4)]);
    let (one, one_size) = id(&node, &gpu, "1g.5gb");
    let (me, me_size) = id(&node, &gpu, "1g.5gb+me");
    let (four, four_size) = id(&node, &gpu, "4g.20gb");
    // 1g@5 lies inside 3g@4's memory slices 4..8.
    assert_eq!(
        kind(node.create_gpu_instance(
            &gpu,
            GpuInstanceAt {
                profile_id: one,
                start: 5,
                size: one_size
            }
        )),
        ErrorKind::InsufficientResources
    );
    // 4g@0 fits next to 3g@4 ...
    node.create_gpu_instance(
        &gpu,
        GpuInstanceAt {
            profile_id: four,
            start: 0,
            size: four_size,
        },
    )
    .unwrap();
    // ... and then nothing else does.
    assert_eq!(
        kind(node.create_gpu_instance(
            &gpu,
            GpuInstanceAt {
                profile_id: one,
                start: 0,
                size: one_size
            }
        )),
        ErrorKind::InsufficientResources
    );
    // +me exists once per GPU although it has seven placements.
    let (node, gpu) = node_with(A100, &[]);
    node.create_gpu_instance(
        &gpu,
        GpuInstanceAt {
            profile_id: me,
            start: 0,
            size: me_size,
        },
    )
    .unwrap();
    assert_eq!(
        kind(node.create_gpu_instance(
            &gpu,
            GpuInstanceAt {
                profile_id: me,
                start: 1,
                size: me_size
            }
        )),
        ErrorKind::InsufficientResources
    );
}

#[test]
fn a_start_outside_the_placements_is_invalid() {
    let (node, gpu) = node_with(A100, &[]);
    let (three, size) = id(&node, &gpu, "3g.20gb");
    assert_eq!(
        kind(node.create_gpu_instance(
            &gpu,
            GpuInstanceAt {
                profile_id: three,
                start: 2,
                size
            }
        )),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(node.create_gpu_instance(
            &gpu,
            GpuInstanceAt {
                profile_id: 4242,
                start: 0,
                size: 1
            }
        )),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn busy_instances_and_gis_with_cis_cannot_be_destroyed() {
    let (node, gpu) = node_with(H100, &[("2g.20gb", 0)]);
    let inst = node.instances(&gpu).unwrap().remove(0);
    let ci = &inst.compute_instances[0];
    assert!(ci.full_size);
    assert_eq!(
        kind(node.destroy_gpu_instance(&gpu, inst.gi_id)),
        ErrorKind::InUse,
        "a GI with a CI cannot go"
    );
    let pid = node
        .attach_process(ci.uuid.as_deref().unwrap(), 1024)
        .unwrap();
    assert_eq!(
        node.instances(&gpu).unwrap()[0].compute_instances[0].process_count,
        Some(1)
    );
    assert_eq!(
        kind(node.destroy_compute_instance(
            &gpu,
            ComputeInstanceId {
                gi: inst.gi_id,
                ci: ci.ci_id
            }
        )),
        ErrorKind::InUse
    );
    assert_eq!(node.busy_destroy_attempts(), 1);
    node.detach_process(pid).unwrap();
    node.destroy_compute_instance(
        &gpu,
        ComputeInstanceId {
            gi: inst.gi_id,
            ci: ci.ci_id,
        },
    )
    .unwrap();
    node.destroy_gpu_instance(&gpu, inst.gi_id).unwrap();
    assert!(node.instances(&gpu).unwrap().is_empty());
}

#[test]
fn mode_change_needs_an_idle_gpu_without_instances() {
    let node = SimNode::new(&[H100], 1).unwrap();
    let gpu = node.gpu_uuids()[0].clone();
    let pid = node.attach_process(&gpu, 512).unwrap();
    assert_eq!(
        kind(node.set_mig_mode(&gpu, MigMode::Enabled)),
        ErrorKind::InUse
    );
    node.detach_process(pid).unwrap();
    assert_eq!(
        node.set_mig_mode(&gpu, MigMode::Enabled).unwrap(),
        ModeChange::Applied
    );
    node.operator_create(&gpu, "1g.10gb", 0, true).unwrap();
    assert_eq!(
        kind(node.set_mig_mode(&gpu, MigMode::Disabled)),
        ErrorKind::InUse
    );
}

#[test]
fn ampere_mode_change_waits_for_reset_and_persists_across_reboot() {
    let node = SimNode::new(&[A100], 1).unwrap();
    let gpu = node.gpu_uuids()[0].clone();
    assert_eq!(
        node.set_mig_mode(&gpu, MigMode::Enabled).unwrap(),
        ModeChange::PendingReset
    );
    assert_eq!(
        node.mig_mode(&gpu).unwrap(),
        Some(MigModeState {
            current: MigMode::Disabled,
            pending: MigMode::Enabled
        })
    );
    node.reset_gpu(&gpu).unwrap();
    assert_eq!(
        node.mig_mode(&gpu).unwrap().unwrap().current,
        MigMode::Enabled
    );
    node.reboot();
    assert_eq!(
        node.mig_mode(&gpu).unwrap().unwrap().current,
        MigMode::Enabled
    );
}

#[test]
fn hopper_mode_change_is_immediate_and_lost_on_reboot() {
    let (node, gpu) = node_with(H100, &[("1g.10gb", 0), ("3g.40gb", 4)]);
    assert_eq!(node.layout(&gpu).len(), 2);
    node.reboot();
    assert_eq!(
        node.mig_mode(&gpu).unwrap(),
        Some(MigModeState {
            current: MigMode::Disabled,
            pending: MigMode::Disabled
        })
    );
    assert!(node.layout(&gpu).is_empty());
}

#[test]
fn instances_vanish_on_reboot_and_reset() {
    let (node, gpu) = node_with(A100, &[("3g.20gb", 0), ("3g.20gb", 4)]);
    node.reboot();
    assert!(node.instances(&gpu).unwrap().is_empty());
    node.operator_create(&gpu, "7g.40gb", 0, true).unwrap();
    node.reset_gpu(&gpu).unwrap();
    assert!(node.instances(&gpu).unwrap().is_empty());
}

#[test]
fn mig_uuids_are_stable_per_instance_and_deterministic_per_seed() {
    let (node, gpu) = node_with(H100, &[("1g.10gb", 0), ("1g.10gb", 1)]);
    let first = crate::support::mig_uuids(&node, &gpu);
    assert_eq!(first.len(), 2);
    assert_eq!(first, crate::support::mig_uuids(&node, &gpu));
    assert!(
        first
            .values()
            .all(|u| u.starts_with("MIG-") && u.len() == 40)
    );
    // The same operations on a node with the same seed give the same UUIDs.
    let (twin, twin_gpu) = node_with(H100, &[("1g.10gb", 0), ("1g.10gb", 1)]);
    assert_eq!(first, crate::support::mig_uuids(&twin, &twin_gpu));
    // A re-created instance gets a new UUID.
    let inst = node.instances(&gpu).unwrap().remove(0);
    node.destroy_compute_instance(
        &gpu,
        ComputeInstanceId {
            gi: inst.gi_id,
            ci: 0,
        },
    )
    .unwrap();
    node.create_full_compute_instance(&gpu, inst.gi_id).unwrap();
    let after = crate::support::mig_uuids(&node, &gpu);
    assert_ne!(after["1g.10gb@0"], first["1g.10gb@0"]);
    assert_eq!(after["1g.10gb@1"], first["1g.10gb@1"]);
}

#[test]
fn injected_faults_crashes_and_lost_gpus() {
    let (node, gpu) = node_with(H100, &[]);
    node.fail_next("create_gpu_instance", ErrorKind::NoPermission);
    let (pid, size) = id(&node, &gpu, "7g.80gb");
    assert_eq!(
        kind(node.create_gpu_instance(
            &gpu,
            GpuInstanceAt {
                profile_id: pid,
                start: 0,
                size
            }
        )),
        ErrorKind::NoPermission
    );
    node.create_gpu_instance(
        &gpu,
        GpuInstanceAt {
            profile_id: pid,
            start: 0,
            size,
        },
    )
    .unwrap();

    node.crash_after(2);
    node.mig_mode(&gpu).unwrap();
    node.mig_mode(&gpu).unwrap();
    assert_eq!(kind(node.mig_mode(&gpu)), ErrorKind::Crashed);
    assert_eq!(kind(node.devices()), ErrorKind::Crashed);
    node.revive();
    assert_eq!(node.devices().unwrap().len(), 1);

    node.fall_off_bus(&gpu);
    assert!(node.devices().unwrap().is_empty());
    assert_eq!(kind(node.instances(&gpu)), ErrorKind::GpuLost);
    node.reboot();
    assert_eq!(node.devices().unwrap().len(), 1);
}

#[test]
fn telemetry_reports_what_the_driver_would() {
    let (node, gpu) = node_with(A100, &[("3g.20gb", 0)]);
    let mig = crate::support::mig_uuids(&node, &gpu)["3g.20gb@0"].clone();
    node.attach_process(&mig, 2048).unwrap();
    let s = node.sample(&gpu).unwrap();
    assert_eq!(s.utilization_pct, None, "no GPU utilization with MIG on");
    assert_eq!(s.memory_used_mib, Some(2048));
    assert_eq!(s.mig_devices.len(), 1);
    assert_eq!(s.mig_devices[0].mig_uuid, mig);
    assert_eq!(s.mig_devices[0].process_count, Some(1));
    assert_eq!(s.mig_devices[0].sm_util_pct, None, "no GPM on Ampere");
    let node = SimNode::new(&["nomig:L4"], 1).unwrap();
    let gpu = node.gpu_uuids()[0].clone();
    node.attach_process(&gpu, 100).unwrap();
    assert_eq!(node.sample(&gpu).unwrap().utilization_pct, Some(50));
}
