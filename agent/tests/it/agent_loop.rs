//! The agent's rounds against a fake server: inventory, desired state,
//! status reports, telemetry; and a second agent taking over the same GPUs.

use std::sync::Arc;
use std::time::Duration;

use tessera_agent::run::{Agent, RunConfig};
use tessera_agent::sim::SimNode;
use tessera_agent::spool::Spool;
use tessera_agent::telemetry::Telemetry;
use tessera_domain::wire::{ApplyState, DesiredState};

use crate::support::{FakeServer, H100, desired, run_config};

fn agent<'a>(
    node: &SimNode,
    server: &'a FakeServer,
    dir: &std::path::Path,
    manage: bool,
) -> Agent<&'a FakeServer> {
    Agent::new(
        Arc::new(node.clone()),
        server,
        RunConfig {
            manage_mig: manage,
            ..run_config()
        },
        Telemetry::new(Spool::open(dir, 60, 10).unwrap()),
    )
}

#[tokio::test]
async fn applies_the_servers_layout_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = SimNode::new(&[H100, "nomig:L4"], 11).unwrap();
    let gpu = node.gpu_uuids()[0].clone();
    let server = FakeServer::default();
    let want: Vec<(&str, u8)> = (0..7).map(|s| ("1g.10gb", s)).collect();
    server.with(|s| {
        s.desired = DesiredState {
            gpus: vec![desired(&gpu, &want, 3)],
        }
    });
    let mut a = agent(&node, &server, dir.path(), true);
    a.heartbeat().await.unwrap();
    a.reconcile_round(0).await.unwrap();
    a.heartbeat().await.unwrap();
    a.telemetry_round(1_700_000_000_000).await.unwrap();

    server.with(|s| {
        let states: Vec<ApplyState> = s
            .statuses
            .iter()
            .flat_map(|r| r.statuses.iter().map(|x| x.state))
            .collect();
        assert_eq!(states, [ApplyState::Applying, ApplyState::Success]);
        let inv = &s.heartbeats[1].inventory;
        assert_eq!(inv.gpus.len(), 2);
        assert!(s.heartbeats[1].manages_mig);
        let h100 = &inv.gpus[0];
        assert_eq!(h100.instances.len(), 7);
        assert!(h100.instances.iter().all(|i| {
            i.compute_instances[0]
                .uuid
                .as_deref()
                .is_some_and(|u| u.starts_with("MIG-"))
        }));
        assert!(
            h100.profiles
                .iter()
                .any(|p| p.name == "1g.10gb" && p.id == 19)
        );
        assert_eq!(inv.gpus[1].mig_mode, None);
        let sample = &s.samples[&1];
        assert_eq!(sample.at_unix_ms, 1_700_000_000_000);
        assert_eq!(sample.gpus[0].mig_devices.len(), 7);
    });
}

#[tokio::test]
async fn read_only_agent_reports_pending_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = SimNode::new(&[H100], 11).unwrap();
    let gpu = node.gpu_uuids()[0].clone();
    let server = FakeServer::default();
    server.with(|s| {
        s.desired = DesiredState {
            gpus: vec![desired(&gpu, &[("7g.80gb", 0)], 1)],
        }
    });
    let mut a = agent(&node, &server, dir.path(), false);
    a.reconcile_round(0).await.unwrap();
    assert!(node.layout(&gpu).is_empty());
    server.with(|s| assert_eq!(s.statuses[0].statuses[0].state, ApplyState::Pending));
}

#[tokio::test]
async fn a_new_agent_finishes_what_a_dead_one_started() {
    let dir = tempfile::tempdir().unwrap();
    let node = SimNode::new(&[H100], 11).unwrap();
    let gpu = node.gpu_uuids()[0].clone();
    let server = FakeServer::default();
    let want = [("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)];
    server.with(|s| {
        s.desired = DesiredState {
            gpus: vec![desired(&gpu, &want, 1)],
        }
    });
    // The first agent dies after a few driver calls.
    node.crash_after(9);
    let mut a = agent(&node, &server, dir.path(), true);
    a.reconcile_round(0).await.unwrap();
    drop(a);
    assert_ne!(node.layout(&gpu).len(), 3);
    node.revive();
    // Unreachable server: the new agent has no desired state yet and
    // changes nothing; then the server comes back.
    server.with(|s| s.down = true);
    let mut b = agent(&node, &server, dir.path(), true);
    b.reconcile_round(0).await.unwrap();
    server.with(|s| s.down = false);
    b.reconcile_round(10_000).await.unwrap();
    let mut got = node.layout(&gpu);
    got.sort();
    assert_eq!(got, crate::support::sorted(&want));
    server.with(|s| {
        let last = s.statuses.last().unwrap().statuses.last().unwrap().clone();
        assert_eq!(last.state, ApplyState::Success);
    });
}

#[tokio::test(start_paused = true)]
async fn a_rejected_credential_backs_off_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let node = SimNode::new(&[H100], 5).unwrap();
    let server = FakeServer::default();
    server.with(|s| s.reject = true);
    let a = agent(&node, &server, dir.path(), false);
    let run = a.run(async {
        // 20 minutes rejected, then 5 minutes accepted again.
        tokio::time::sleep(Duration::from_secs(20 * 60)).await;
        server.with(|s| {
            assert!(
                s.heartbeat_attempts <= 8,
                "backs off instead of sending every 30 s: {} attempts",
                s.heartbeat_attempts
            );
            assert!(
                s.heartbeat_attempts >= 4,
                "keeps trying: {}",
                s.heartbeat_attempts
            );
            s.reject = false;
        });
        tokio::time::sleep(Duration::from_secs(5 * 60)).await;
    });
    run.await.unwrap();
    server.with(|s| {
        // At most one backed-off wait (≤ 300 s), then every 30 s again.
        assert!(!s.heartbeats.is_empty(), "accepted again");
        assert!(s.heartbeats.len() <= 10, "{}", s.heartbeats.len());
    });
}

/// With every timer at an hour, a change the server announces on the long poll is
/// fetched and applied at once, and the heartbeat that follows shows the new instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_announced_on_the_long_poll_is_applied_without_the_timers() {
    let dir = tempfile::tempdir().unwrap();
    let node = SimNode::new(&[H100], 4).unwrap();
    let gpu = node.gpu_uuids()[0].clone();
    let server = FakeServer::default();
    let hour = Duration::from_secs(3600);
    let a = Agent::new(
        Arc::new(node.clone()),
        &server,
        RunConfig {
            manage_mig: true,
            reconcile_every: hour,
            telemetry_every: hour,
            heartbeat_every: hour,
            workload_every: hour,
            ..run_config()
        },
        Telemetry::new(Spool::open(dir.path(), 60, 10).unwrap()),
    );
    let want = [("3g.40gb", 0), ("1g.10gb", 6)];
    let run = a.run(async {
        // The start-up rounds (every timer fires once at start) are over.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let beats = server.with(|s| s.heartbeats.len());
        assert!(node.layout(&gpu).is_empty());
        server.with(|s| {
            s.desired = DesiredState {
                gpus: vec![desired(&gpu, &want, 1)],
            }
        });
        server.changes.notify_one();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while server.with(|s| s.heartbeats.len()) == beats {
            assert!(
                std::time::Instant::now() < deadline,
                "no heartbeat after the change was applied"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    run.await.unwrap();
    let mut got = node.layout(&gpu);
    got.sort();
    assert_eq!(got, crate::support::sorted(&want));
    server.with(|s| {
        let last = s.heartbeats.last().expect("a heartbeat");
        assert_eq!(last.inventory.gpus[0].instances.len(), 2, "{last:?}");
        let states: Vec<ApplyState> = s
            .statuses
            .iter()
            .flat_map(|r| r.statuses.iter().map(|x| x.state))
            .collect();
        assert_eq!(states.last(), Some(&ApplyState::Success), "{states:?}");
    });
}
