//! Placement quality for shares through the server path, against the offline openb bench.
//!
//! The openb default trace (docs/benchmarks.md §1) in the variant a Tessera server can run
//! (`openb::Trace::single_gpu_variant`: GPUs only, one model, the pods that fit one GPU as
//! shares). Per seed, the same arrivals and node order go two ways:
//! - offline: `openb::run`, the planner's fractional policy with the pod list's mix as the
//!   expected workload (as FGD uses it), and BestFit for scale;
//! - through the server: every GPU of the cluster (simulated nodes of T4s, in the seed's
//!   node order) is shared by an admin; each pod is a `T4-16GB:share:MILLI` request
//!   admitted by `Allocations::request`, followed by one scheduler pass (`tick`); a request
//!   the pass could not place is withdrawn, as the protocol drops a pod that does not fit.
//!   The server knows no pod list: it learns the mix from its latest requests.
//!
//! A pass reads every live allocation several times, so its cost grows with them: the
//! cluster is every 4th node of the trace's by default (`EVERY=1`: the whole cluster,
//! about an hour a seed on a 2-core machine), on both sides alike.
//!
//! Run: `cargo bench -p tessera-core --bench openb_shares` (`SEEDS=n` seeds from 42, default
//! 3; `TESSERA_BENCH_PG_URL` adds PostgreSQL; `ARRIVALS=n` stops each run early).
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Tests and benches stand outside the use cases: they read the wall clock to set up.
#![allow(clippy::disallowed_methods)]

mod support;

use chrono::Utc;
use std::time::Instant;
use support::{Bench, Scratch, env_or, err};
use tessera_bench::{data, openb};
use tessera_core::services::nodes::NodeIdentity;
use tessera_domain::alloc::AllocState;
use tessera_domain::planner::fractional::Policy;
use tessera_domain::wire::{
    ApplyState, ApplyStatus, GpuInfo, ShareMethod, SharingState, StatusReport,
};
use uuid::Uuid;

const MODEL: &str = "T4-16GB";

fn main() -> anyhow::Result<()> {
    let rt = support::runtime()?;
    let trace = openb::load(
        &data("openb_node_list_gpu_node.csv"),
        &data("openb_pod_list_default.csv"),
    )
    .map_err(err)?
    .single_gpu_variant(MODEL)
    .every_nth_node(env_or("EVERY", 4));
    let gpus: u32 = trace.nodes.iter().map(|n| n.gpus).sum();
    println!(
        "openb default, single-GPU variant, every {}th node: {} pods, {} nodes, {gpus} GPUs",
        env_or("EVERY", 4),
        trace.pods.len(),
        trace.nodes.len()
    );
    let scratch = Scratch::new("openb")?;
    let fragmentation = Policy::Fragmentation(trace.workload());
    let mut rows: Vec<(String, Vec<f64>)> = Vec::new();
    for seed in 42..42 + env_or("SEEDS", 3) as u64 {
        rows.push((
            format!("seed {seed} offline BestFit"),
            openb::run(&trace, &Policy::BestFit, seed),
        ));
        rows.push((
            format!("seed {seed} offline Tessera"),
            openb::run(&trace, &fragmentation, seed),
        ));
        for (store, url) in rt.block_on(support::targets(&scratch, &format!("seed{seed}")))? {
            let t = Instant::now();
            let (curve, arrivals) = rt.block_on(through_server(&url, &trace, seed))?;
            println!(
                "seed {seed} {store}: {arrivals} requests and scheduler passes, {:.0} s in all",
                t.elapsed().as_secs_f64(),
            );
            rows.push((format!("seed {seed} server ({store})"), curve));
        }
    }
    // The mean of each way over the seeds, after the seeds themselves.
    let mut means: Vec<(String, Vec<f64>)> = Vec::new();
    for (name, c) in &rows {
        let way = name.split_once(' ').map_or(name.as_str(), |(_, w)| {
            w.split_once(' ').map_or(w, |(_, w)| w)
        });
        let label = format!("mean {way}");
        match means.iter_mut().find(|(l, _)| *l == label) {
            Some((_, m)) => m.extend_from_slice(c),
            None => means.push((label, c.clone())),
        }
    }
    let points = rows.first().map_or(0, |(_, c)| c.len());
    for (_, all) in &mut means {
        let n = (all.len() / points.max(1)) as f64;
        *all = (0..points)
            .map(|x| all.iter().skip(x).step_by(points).sum::<f64>() / n)
            .collect();
    }
    rows.extend(means);
    println!("allocation % at arrived 50 / 80 / 90 / 100 / 110 / 130 %");
    for (name, c) in &rows {
        let at = |x: usize| c.get(x).copied().unwrap_or(f64::NAN);
        println!(
            "{name:32} {:6.2} {:6.2} {:6.2} {:6.2} {:6.2} {:6.2}",
            at(50),
            at(80),
            at(90),
            at(100),
            at(110),
            at(130)
        );
    }
    Ok(())
}

/// One seed through the service layer; returns the curve and how many pods arrived.
async fn through_server(
    url: &str,
    trace: &openb::Trace,
    seed: u64,
) -> anyhow::Result<(Vec<f64>, usize)> {
    let b = Bench::open(url).await?;
    let p = &b.admin;
    let team = b
        .services
        .tenancy
        .create_team(p, "openb")
        .await
        .map_err(err)?;
    let line = format!("{MODEL}:shared");
    b.services
        .allocations
        .set_quota(p, team.id, &line, u32::MAX / 2, u32::MAX / 2, u32::MAX / 2)
        .await
        .map_err(err)?;
    let (pods, order) = openb::seeded(trace, seed);
    let now = Utc::now();
    let setup = Instant::now();
    // Host names sort in the seed's node order: the planner breaks ties by it, as the
    // offline run does.
    for (rank, &n) in order.iter().enumerate() {
        let gpus: Vec<GpuInfo> = (0..trace.nodes[n].gpus)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-{}", Uuid::new_v4()),
                name: "Tesla T4".into(),
                memory_mib: 15_360,
                mig_mode: None,
                profiles: vec![],
                profiles_error: None,
                // As the agent reports a GPU it shares: shares placed on it become active
                // at the next pass.
                health: None,
                sharing: Some(SharingState {
                    method: ShareMethod::TimeSlice,
                    ready: true,
                    error: None,
                    daemon_restarts: 0,
                }),
                instances: vec![],
            })
            .collect();
        let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
        let hostname = format!("n{rank:05}");
        let node = b.add_node(&hostname, gpus, now).await?;
        let mut statuses = Vec::new();
        for uuid in uuids {
            b.services
                .nodes
                .set_gpu_sharing(p, node, &uuid, Some(ShareMethod::TimeSlice))
                .await
                .map_err(err)?;
            // The agent's answer: the desired state (version 1) is applied.
            statuses.push(ApplyStatus {
                gpu_uuid: uuid,
                version: 1,
                state: ApplyState::Success,
                step: None,
                error: None,
                retry_in_s: None,
            });
        }
        b.services
            .nodes
            .record_status(
                &NodeIdentity::for_executor(&b.system, node, &hostname),
                &StatusReport { statuses },
            )
            .await
            .map_err(err)?;
    }
    println!(
        "  cluster set up (nodes written, every GPU shared) in {:.0} s",
        setup.elapsed().as_secs_f64()
    );
    let limit = env_or("ARRIVALS", usize::MAX);
    let started = Instant::now();
    let mut curve = openb::Curve::new(trace);
    let (mut arrived, mut placed_count) = (0, 0);
    for pod in pods.iter().take(limit) {
        if curve.complete() {
            break;
        }
        let view = b
            .request(team.id, &format!("{MODEL}:share:{}", pod.milli))
            .await?;
        // The same instant every pass: nothing times out while the bench runs.
        b.services
            .allocations
            .tick(&b.system, now)
            .await
            .map_err(err)?;
        let row = b
            .store
            .allocation(view.id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("allocation {} vanished", view.id))?;
        let placed = match row.a.state {
            AllocState::Placing | AllocState::Active => u64::from(pod.milli),
            AllocState::Queued => {
                b.services
                    .allocations
                    .release(p, view.id)
                    .await
                    .map_err(err)?;
                0
            }
            other => anyhow::bail!("allocation {} is {other} after a pass", view.id),
        };
        anyhow::ensure!(
            placed > 0 || arrived > 0,
            "the first request on an empty cluster was not placed: the bench's cluster is wrong"
        );
        curve.record(pod, placed);
        arrived += 1;
        placed_count += usize::from(placed > 0);
        if arrived % 1000 == 0 {
            println!(
                "  {arrived} requests, {:.1} ms per request + pass",
                started.elapsed().as_secs_f64() * 1e3 / arrived as f64
            );
        }
    }
    println!("  placed {placed_count} of {arrived} requests");
    Ok((curve.finish(), arrived))
}
