//! Invariants of the planner over random clusters and request streams.

use proptest::prelude::*;
use tessera_domain::image::CudaVersion;
use tessera_domain::mig::{Catalog, Instance};
use tessera_domain::planner::{
    Cluster, Demand, DriverInfo, Engine, Gpu, GpuMode, MigInstance, Node, Request, plan,
};

/// CUDA versions nodes run and requests need: `None` (no driver reported, no need),
/// 12.2, 12.4.
fn cuda(i: u8) -> Option<CudaVersion> {
    match i {
        1 => Some(CudaVersion {
            major: 12,
            minor: 2,
        }),
        2 => Some(CudaVersion {
            major: 12,
            minor: 4,
        }),
        _ => None,
    }
}

const MODELS: [&str; 4] = ["H100-80GB", "A100-SXM4-40GB", "A30-24GB", "V100-32GB"];
const PROFILES: [&str; 8] = [
    "1g.10gb",
    "3g.40gb",
    "1g.5gb",
    "2g.10gb",
    "7g.80gb",
    "4g.24gb",
    "1g.6gb+me",
    "3g.20gb",
];

/// A random GPU: mode, and for MIG a random valid layout built by adding
/// random `(profile, start)` pairs that fit, each busy or idle.
fn gpu(index: u32) -> impl Strategy<Value = Gpu> {
    (
        0..MODELS.len(),
        0..3u8,
        any::<bool>(),
        any::<bool>(),
        0..=1000u32,
        prop::collection::vec((0..16usize, 0..8u8, any::<bool>()), 0..6),
    )
        .prop_map(move |(m, mode, reconfigurable, busy, used, tries)| {
            let catalog = Catalog::builtin();
            let model = MODELS[m];
            let table = catalog.get(model);
            let mode = match (mode, table) {
                (0, Some(_)) => GpuMode::Mig,
                (1, _) => GpuMode::Whole,
                _ => GpuMode::Shared,
            };
            let mut instances: Vec<MigInstance> = Vec::new();
            if let (GpuMode::Mig, Some(t)) = (mode, table) {
                let mut named: Vec<Instance> = Vec::new();
                for (p, start, busy) in tries {
                    let profile = &t.profiles()[p % t.profiles().len()];
                    let cand = Instance {
                        profile: profile.name.clone(),
                        start,
                    };
                    named.push(cand.clone());
                    if t.validate(&named).is_ok() {
                        instances.push(MigInstance {
                            profile: cand.profile,
                            start,
                            busy,
                        });
                    } else {
                        named.pop();
                    }
                }
            }
            Gpu {
                index,
                model: model.to_owned(),
                mode,
                reconfigurable,
                instances,
                busy: mode == GpuMode::Whole && busy,
                used_milli: if mode == GpuMode::Shared { used } else { 0 },
            }
        })
}

fn node(i: usize) -> impl Strategy<Value = Node> {
    (1..5u64, 0..=100u64, 0..5usize, 0..3u8)
        .prop_flat_map(move |(cores, used_pct, n, driver)| {
            let gpus: Vec<_> = (0..n as u32).map(gpu).collect();
            (Just(cores), Just(used_pct), gpus, Just(driver))
        })
        .prop_map(move |(cores, used_pct, gpus, driver)| Node {
            name: format!("n{i}"),
            cpu_milli: cores * 8000,
            memory_mib: cores * 32768,
            cpu_used_milli: cores * 8000 * used_pct / 100,
            memory_used_mib: 0,
            gpus,
            driver: cuda(driver).map(|cuda| DriverInfo {
                version: format!("5{}0.1", cuda.minor),
                cuda,
            }),
            group: None,
        })
}

fn cluster() -> impl Strategy<Value = Cluster> {
    (1..5usize)
        .prop_flat_map(|n| (0..n).map(node).collect::<Vec<_>>())
        .prop_map(|nodes| Cluster {
            nodes,
            models: Vec::new(),
            fixed_sharing: false,
            demand: Vec::new(),
        })
}

fn request(i: usize) -> impl Strategy<Value = Request> {
    (
        0..4u8,
        0..PROFILES.len(),
        1..4u32,
        1..=1000u32,
        0..12000u64,
        0..3i32,
        prop::option::of(0..MODELS.len()),
        0..4u8,
    )
        .prop_map(
            move |(kind, p, gpus, milli, cpu, priority, model, need)| Request {
                id: format!("r{i}"),
                team: None,
                priority,
                mig: (kind == 0).then(|| PROFILES[p].to_owned()),
                gpus: (kind == 1).then_some(gpus),
                gpu_milli: (kind == 2).then_some(milli),
                cpu_milli: cpu,
                memory_mib: cpu * 2,
                models: model
                    .map(|m| vec![MODELS[m].to_owned()])
                    .unwrap_or_default(),
                // Half the requests need nothing.
                needs_cuda: cuda(need.saturating_sub(1)),
                gang: None,
            },
        )
}

fn requests() -> impl Strategy<Value = Vec<Request>> {
    (0..14usize).prop_flat_map(|n| (0..n).map(request).collect::<Vec<_>>())
}

fn busy_instances(c: &Cluster) -> Vec<(String, u32, String, u8)> {
    let mut out = Vec::new();
    for n in &c.nodes {
        for g in &n.gpus {
            for i in g.instances.iter().filter(|i| i.busy) {
                out.push((n.name.clone(), g.index, i.profile.clone(), i.start));
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn every_state_the_planner_reaches_is_valid(c in cluster(), rs in requests()) {
        let catalog = Catalog::builtin();
        let mut engine = Engine::new(&c, &catalog).unwrap();
        for r in &rs {
            let _ = engine.place(r).unwrap();
            let snap = engine.snapshot();
            // Re-parsing checks every MIG layout, CPU and memory within the
            // node, and used_milli within 0..=1000.
            prop_assert!(Engine::new(&snap, &catalog).is_ok(), "{:?}", Engine::new(&snap, &catalog).err());
            for n in &snap.nodes {
                for g in n.gpus.iter().filter(|g| g.mode == GpuMode::Mig) {
                    let t = catalog.get(&g.model).unwrap();
                    let layout: Vec<Instance> = g.instances.iter()
                        .map(|i| Instance { profile: i.profile.clone(), start: i.start }).collect();
                    prop_assert!(t.validate(&layout).is_ok());
                }
            }
            // No busy instance is destroyed or moved.
            let after = busy_instances(&snap);
            for b in busy_instances(&c) {
                prop_assert!(after.contains(&b), "busy instance {:?} disappeared", b);
            }
        }
    }

    #[test]
    fn placing_then_releasing_restores_the_cluster(c in cluster(), rs in requests()) {
        let catalog = Catalog::builtin();
        let mut engine = Engine::new(&c, &catalog).unwrap();
        let before = engine.clone();
        let decisions: Vec<_> = rs.iter().filter_map(|r| engine.place(r).unwrap().ok()).collect();
        for d in decisions.into_iter().rev() {
            engine.release(d);
        }
        prop_assert!(engine == before);
        prop_assert_eq!(engine.snapshot(), before.snapshot());
    }

    #[test]
    fn plans_are_deterministic_and_never_destroy_busy_instances(c in cluster(), rs in requests()) {
        let catalog = Catalog::builtin();
        let p = plan(&c, &rs, &catalog).unwrap();
        prop_assert_eq!(&p, &plan(&c, &rs, &catalog).unwrap());
        prop_assert_eq!(p.assignments.len() + p.pending.len(), rs.len());
        let busy = busy_instances(&c);
        for r in &p.reconfigurations {
            for d in &r.destroy {
                prop_assert!(!busy.contains(&(r.node.clone(), r.gpu, d.profile.clone(), d.start)));
            }
        }
        for pending in &p.pending {
            prop_assert!(!pending.reason.is_empty());
        }
        // A request that needs a CUDA version goes only to a node whose driver supports it.
        for a in &p.assignments {
            let r = rs.iter().find(|r| r.id == a.request).unwrap();
            let n = c.nodes.iter().find(|n| n.name == a.node).unwrap();
            if let Some(need) = r.needs_cuda {
                prop_assert!(
                    n.driver.as_ref().is_some_and(|d| d.cuda >= need),
                    "{} needs CUDA {} and went to {} with {:?}", r.id, need, n.name, n.driver
                );
            }
        }
        // CPU handed out on each node stays within what was free.
        for n in &c.nodes {
            let cpu: u64 = p.assignments.iter().filter(|a| a.node == n.name)
                .map(|a| rs.iter().find(|r| r.id == a.request).map_or(0, |r| r.cpu_milli)).sum();
            prop_assert!(n.cpu_used_milli + cpu <= n.cpu_milli);
        }
        // Shares on one GPU never exceed 1000 milli.
        for n in &c.nodes {
            for g in &n.gpus {
                let added: u32 = p.assignments.iter()
                    .filter(|a| a.node == n.name && a.gpu == Some(g.index))
                    .filter_map(|a| a.milli).sum();
                prop_assert!(g.used_milli + added <= 1000 || g.mode != GpuMode::Shared);
                prop_assert!(added <= 1000);
            }
        }
    }
}

/// With `fixed_sharing` (the server: admins choose the shared GPUs) a share goes only to
/// a GPU already shared, and waits with a reason rather than converting an idle one.
#[test]
fn with_fixed_sharing_only_shared_gpus_take_shares() {
    let gpu = |index: u32, mode: GpuMode, used_milli: u32| Gpu {
        index,
        model: "H100-80GB".into(),
        mode,
        reconfigurable: true,
        instances: Vec::new(),
        busy: false,
        used_milli,
    };
    let cluster = |fixed_sharing: bool| Cluster {
        nodes: vec![Node::gpus_only(
            "n",
            vec![gpu(0, GpuMode::Whole, 0), gpu(1, GpuMode::Shared, 750)],
        )],
        models: Vec::new(),
        fixed_sharing,
        demand: Vec::new(),
    };
    let ask = |id: &str| Request {
        gpu_milli: Some(250),
        ..Request::new(id)
    };
    let asks = [ask("a"), ask("b")];
    let catalog = Catalog::builtin();
    let fixed = plan(&cluster(true), &asks, &catalog).expect("plan");
    assert_eq!(fixed.assignments.len(), 1, "{fixed:?}");
    assert_eq!(fixed.assignments[0].gpu, Some(1));
    assert!(fixed.reconfigurations.is_empty(), "{fixed:?}");
    assert_eq!(fixed.pending.len(), 1);
    assert!(
        fixed.pending[0].reason.contains("one shared GPU")
            && fixed.pending[0].reason.contains("is 0"),
        "{}",
        fixed.pending[0].reason
    );
    // Left to itself the planner converts the idle GPU.
    let free = plan(&cluster(false), &asks, &catalog).expect("plan");
    assert_eq!(free.assignments.len(), 2, "{free:?}");
}

/// The demand the server learned (recent requests by kind) decides which shared GPU a
/// share takes: the one that keeps room for the kinds that come most often.
#[test]
fn recent_demand_steers_shares() {
    let gpu = |index: u32, used_milli: u32| Gpu {
        index,
        model: "T4-16GB".into(),
        mode: GpuMode::Shared,
        reconfigurable: false,
        instances: Vec::new(),
        busy: false,
        used_milli,
    };
    let share = |id: &str, milli: u32| Request {
        gpu_milli: Some(milli),
        models: vec!["T4-16GB".into()],
        ..Request::new(id)
    };
    // GPU 0 has 500 milli free, GPU 1 750.
    let cluster = |demand: Vec<Demand>| Cluster {
        nodes: vec![Node::gpus_only("n", vec![gpu(0, 500), gpu(1, 250)])],
        models: Vec::new(),
        fixed_sharing: true,
        demand,
    };
    let came = |milli: u32, weight: u32| Demand {
        request: share("kind", milli),
        weight,
    };
    let catalog = Catalog::builtin();
    let gpu_for = |demand| {
        let p = plan(&cluster(demand), &[share("r", 250)], &catalog).expect("plan");
        assert_eq!(p.assignments.len(), 1, "{p:?}");
        p.assignments[0].gpu
    };
    // Mostly halves came lately: 250 on GPU 1 leaves both GPUs able to take a half.
    assert_eq!(gpu_for(vec![came(500, 9), came(750, 1)]), Some(1));
    // Mostly three quarters: only GPU 1 can take one, so the 250 goes to GPU 0.
    assert_eq!(gpu_for(vec![came(500, 1), came(750, 9)]), Some(0));
    // A demand entry the planner cannot read is an input error, located.
    let mut bad = came(500, 1);
    bad.request.gpu_milli = Some(0);
    let e = plan(&cluster(vec![bad]), &[share("r", 250)], &catalog).expect_err("bad demand");
    assert_eq!(e.path, "demand[0].request.gpu_milli", "{e}");
}
