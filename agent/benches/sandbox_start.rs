//! Time to start a job in the workload sandbox against an unsandboxed start, same run.
//!
//! `cargo bench -p tessera-agent --bench sandbox_start [-- RUNS]` (root and crun needed)
//! starts RUNS (default 20) jobs of `/bin/sh -c true` on a simulated H100 MIG slice each
//! way, one at a time, and prints the median and max of (a) `apply` alone: the agent's
//! start work, crun included, and (b) apply until the executor reports the job exited.
//! In the sandbox twice: on the node's network (`--sandbox-network off`) and in a network
//! of its own (the default: namespace, veth pair and nftables table made and removed per
//! job). Both sandboxed ways apply the seccomp filter.
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_agent::backend::GpuBackend;
use tessera_agent::sandbox::{Sandbox, SandboxSettings};
use tessera_agent::sim::{SimNode, write_device_files};
use tessera_agent::workloads::LocalExecutor;
use tessera_domain::wire::{MigMode, WorkloadPhase, WorkloadSpec, WorkloadSync};

fn spec(id: &str, device: &str) -> WorkloadSpec {
    WorkloadSpec::job(id, "bench", &[device], &["/bin/sh", "-c", "true"])
}

fn summary(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<34} median {:>7.1} ms   max {:>7.1} ms   (n = {})",
        ms(v[v.len() / 2]),
        ms(v[v.len() - 1]),
        v.len()
    );
}

async fn measure(ex: &mut LocalExecutor, device: &str, tag: &str, runs: usize) {
    let (mut apply, mut total) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let s = spec(&format!("{tag}-{i}"), device);
        let t0 = Instant::now();
        ex.apply(&WorkloadSync {
            workloads: vec![s.clone()],
            execs: Vec::new(),
            log_acks: vec![],
        });
        apply.push(t0.elapsed());
        loop {
            let reports = ex.reports().await;
            let r = reports.iter().find(|r| r.id == s.id).expect("report");
            if r.phase == WorkloadPhase::Exited {
                assert_eq!(r.exit_code, Some(0), "{r:?}");
                break;
            }
            assert!(r.phase != WorkloadPhase::FailedToStart, "{r:?}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        total.push(t0.elapsed());
        ex.apply(&WorkloadSync::default());
    }
    summary(&format!("{tag}: apply (start work)"), apply);
    summary(&format!("{tag}: apply until exited"), total);
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20);
    let sim = SimNode::new(&["H100-80GB"], 1).expect("sim");
    let gpu = sim.gpu_uuids()[0].clone();
    sim.operator_set_mig_mode(&gpu, MigMode::Enabled)
        .expect("mig");
    sim.operator_create(&gpu, "1g.10gb", 0, true)
        .expect("slice");
    let device = sim.instances(&gpu).expect("instances")[0].compute_instances[0]
        .uuid
        .clone()
        .expect("uuid");
    let dir = tempfile::tempdir().expect("tempdir");
    write_device_files(&dir.path().join("dev"), &[0]).expect("device files");
    let mut settings = SandboxSettings::new(PathBuf::from("crun"));
    settings.simulated_devices(dir.path().join("dev"));
    let backend: Arc<dyn GpuBackend> = Arc::new(sim);
    let mut shared_net = settings.clone();
    shared_net.network = None;
    let sandbox = Sandbox::open(settings, Arc::clone(&backend), &dir.path().join("sandbox"))
        .expect("root, crun, ip and nft");
    let on_node_net =
        Sandbox::open(shared_net, backend, &dir.path().join("sandbox-2")).expect("root and crun");

    let mut plain = LocalExecutor::open(&dir.path().join("plain"), "127.0.0.1").expect("open");
    let mut boxed = LocalExecutor::open(&dir.path().join("boxed"), "127.0.0.1")
        .expect("open")
        .with_sandbox(sandbox);
    let mut boxed_node_net = LocalExecutor::open(&dir.path().join("boxed-2"), "127.0.0.1")
        .expect("open")
        .with_sandbox(on_node_net);
    println!("job `/bin/sh -c true` on a simulated 1g.10gb slice, {runs} runs each, one at a time");
    measure(&mut plain, &device, "unsandboxed", runs).await;
    measure(&mut boxed_node_net, &device, "sandboxed-node-network", runs).await;
    measure(&mut boxed, &device, "sandboxed-own-network", runs).await;
}
