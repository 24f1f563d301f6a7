//! `cargo run --release -p tessera-bench --bin gangs` (`RUNS=n`, default 20)
//! Issue 42's figure: admission + placement of 100 gangs of 4 nodes × 8 whole
//! H100-80GB in one `planner::plan` pass on the 777-node simulated cluster (the openb
//! trace's 6,212 GPUs packed 8 to a node, as `throughput` builds it; all whole, so
//! node-0776 has 4 GPUs and can hold no member). Scenarios: empty; half the GPUs busy
//! with single-GPU work placed by the planner first (packed) or at random (scattered);
//! 3,106 single-GPU requests pending in the same pass; racks of 16 nodes. Every plan is
//! checked: each gang fully placed (4 distinct nodes, 8 distinct GPUs each, no GPU used
//! twice in the plan or busy in the input) or pending with a reason and no assignment.
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use tessera_bench::Rng;
use tessera_domain::mig::Catalog;
use tessera_domain::planner::{Cluster, Engine, Gang, GpuMode, Plan, Request, plan};

const GPUS_TOTAL: usize = 6212;
const GANGS: usize = 100;
const MEMBERS: usize = 4;
const PER_NODE: u32 = 8;
const RACK: usize = 16;

fn cluster(racks: bool) -> Cluster {
    let mut nodes = common::h100_nodes(GPUS_TOTAL, |_| GpuMode::Whole);
    for (i, node) in nodes.iter_mut().enumerate() {
        node.group = racks.then(|| format!("rack-{:02}", i / RACK));
    }
    Cluster {
        nodes,
        models: Vec::new(),
        fixed_sharing: false,
        demand: Vec::new(),
    }
}

fn single(id: String) -> Request {
    Request {
        gpus: Some(1),
        ..Request::new(id)
    }
}

fn gangs() -> Vec<Request> {
    (0..GANGS)
        .map(|i| Request {
            gpus: Some(PER_NODE),
            gang: Some(Gang {
                nodes: MEMBERS as u32,
                per_node: 1,
            }),
            ..Request::new(format!("gang-{i:03}"))
        })
        .collect()
}

/// Half the GPUs taken by single-GPU requests placed one by one by the planner's engine.
fn packed(c: &Cluster, catalog: &Catalog) -> Cluster {
    let mut e = Engine::new(c, catalog).expect("valid cluster");
    for i in 0..GPUS_TOTAL / 2 {
        e.place(&single(format!("bg-{i}")))
            .expect("valid request")
            .expect("half the cluster is free");
    }
    e.snapshot()
}

/// Half the GPUs busy, chosen at random (seed 42): work placed over time, long gone
/// from any one plan.
fn scattered(c: &Cluster) -> Cluster {
    let mut c = c.clone();
    let mut all: Vec<(usize, usize)> = c
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(n, node)| (0..node.gpus.len()).map(move |g| (n, g)))
        .collect();
    Rng::new(42).shuffle(&mut all);
    for &(n, g) in &all[..GPUS_TOTAL / 2] {
        c.nodes[n].gpus[g].busy = true;
    }
    c
}

struct Checked {
    placed: usize,
    in_one_group: usize,
    reason: Option<String>,
    singles_placed: usize,
}

/// Fails loudly unless every gang is all-or-nothing and no GPU is used twice.
fn check(c: &Cluster, requests: &[Request], p: &Plan) -> Checked {
    let group: BTreeMap<&str, Option<&str>> = c
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.group.as_deref()))
        .collect();
    let mut used: BTreeSet<(String, u32)> = c
        .nodes
        .iter()
        .flat_map(|n| {
            n.gpus
                .iter()
                .filter(|g| g.busy)
                .map(|g| (n.name.clone(), g.index))
        })
        .collect();
    let mut take = |node: &str, gpu: u32, who: &str| {
        assert!(
            used.insert((node.to_owned(), gpu)),
            "{who}: GPU {node}/{gpu} is busy or used twice in the plan"
        );
    };
    let pending: BTreeMap<&str, &str> = p
        .pending
        .iter()
        .map(|x| (x.request.as_str(), x.reason.as_str()))
        .collect();
    let mut seen = BTreeSet::new();
    let (mut placed, mut in_one_group, mut singles_placed) = (0, 0, 0);
    for a in &p.assignments {
        let who = a.request.as_str();
        assert!(seen.insert(who), "{who} assigned twice");
        assert!(
            !pending.contains_key(who),
            "{who} both assigned and pending"
        );
        let gang = requests
            .iter()
            .find(|r| r.id == who)
            .unwrap_or_else(|| panic!("{who} is not a request"))
            .gang
            .is_some();
        if !gang {
            assert!(a.members.is_empty(), "{who}: a single request has members");
            let gpus = if a.gpus.is_empty() {
                a.gpu.into_iter().collect()
            } else {
                a.gpus.clone()
            };
            assert_eq!(gpus.len(), 1, "{who}: a 1-GPU request got {gpus:?}");
            take(&a.node, gpus[0], who);
            singles_placed += 1;
            continue;
        }
        assert_eq!(
            a.members.len(),
            MEMBERS,
            "{who}: partial gang, {} of {MEMBERS} members",
            a.members.len()
        );
        let nodes: BTreeSet<&str> = a.members.iter().map(|m| m.node.as_str()).collect();
        assert_eq!(nodes.len(), MEMBERS, "{who}: two members on one node");
        assert_eq!(a.node, a.members[0].node, "{who}: node is not member 0's");
        for m in &a.members {
            assert!(m.slices.is_empty(), "{who}: MIG slices in a whole-GPU gang");
            let distinct: BTreeSet<u32> = m.gpus.iter().copied().collect();
            assert_eq!(
                (m.gpus.len(), distinct.len()),
                (PER_NODE as usize, PER_NODE as usize),
                "{who}: member on {} holds {:?}",
                m.node,
                m.gpus
            );
            for &g in &m.gpus {
                take(&m.node, g, who);
            }
        }
        let groups: BTreeSet<Option<&str>> = nodes.iter().map(|n| group[n]).collect();
        if groups.len() == 1 && groups.first().is_some_and(Option::is_some) {
            in_one_group += 1;
        }
        placed += 1;
    }
    let mut reason = None;
    for r in requests {
        let id = r.id.as_str();
        if !seen.contains(id) {
            let why = pending
                .get(id)
                .unwrap_or_else(|| panic!("{id}: neither assigned nor pending"));
            assert!(!why.is_empty(), "{id}: pending without a reason");
            if r.gang.is_some() && reason.is_none() {
                reason = Some((*why).to_owned());
            }
        }
    }
    assert!(
        p.reconfigurations.is_empty(),
        "whole GPUs only: no reconfiguration expected, got {}",
        p.reconfigurations.len()
    );
    Checked {
        placed,
        in_one_group,
        reason,
        singles_placed,
    }
}

fn main() {
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let catalog = Catalog::builtin();
    let flat = cluster(false);
    let racked = cluster(true);
    let full_nodes = flat.nodes.iter().filter(|n| n.gpus.len() == 8).count();
    println!(
        "cluster: {} nodes, {} H100-80GB (whole), {full_nodes} nodes with 8; {GANGS} gangs of {MEMBERS} × {PER_NODE}; {runs} runs each",
        flat.nodes.len(),
        flat.nodes.iter().map(|n| n.gpus.len()).sum::<usize>(),
    );
    let gang_reqs = gangs();
    let mut with_singles = gang_reqs.clone();
    with_singles.extend((0..GPUS_TOTAL / 2).map(|i| single(format!("one-{i}"))));
    let scenarios: Vec<(&str, Cluster, &[Request])> = vec![
        ("empty", flat.clone(), &gang_reqs),
        ("half busy, packed", packed(&flat, &catalog), &gang_reqs),
        ("half busy, scattered", scattered(&flat), &gang_reqs),
        ("+3,106 singles pending", flat.clone(), &with_singles),
        ("racks of 16, empty", racked.clone(), &gang_reqs),
        (
            "racks of 16, half busy, packed",
            packed(&racked, &catalog),
            &gang_reqs,
        ),
        (
            "racks of 16, +3,106 singles pending",
            racked.clone(),
            &with_singles,
        ),
    ];
    for (name, c, reqs) in &scenarios {
        let busy = c
            .nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .filter(|g| g.busy)
            .count();
        let idle_nodes = c
            .nodes
            .iter()
            .filter(|n| n.gpus.len() == 8 && n.gpus.iter().all(|g| !g.busy))
            .count();
        let mut times = Vec::with_capacity(runs);
        let mut first: Option<Plan> = None;
        for _ in 0..runs {
            let t = Instant::now();
            let p = plan(c, reqs, &catalog).expect("valid input");
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            check(c, reqs, &p);
            match &first {
                None => first = Some(p),
                Some(f) => assert_eq!(f, &p, "{name}: plan() is not deterministic"),
            }
        }
        let k = check(c, reqs, first.as_ref().expect("runs ≥ 1"));
        times.sort_by(f64::total_cmp);
        let q =
            |f: f64| times[((times.len() as f64 * f).ceil() as usize).clamp(1, times.len()) - 1];
        let groups = if c.nodes[0].group.is_some() {
            format!(", {} inside one rack", k.in_one_group)
        } else {
            String::new()
        };
        let singles = if reqs.len() > GANGS {
            format!(", {} singles placed", k.singles_placed)
        } else {
            String::new()
        };
        println!(
            "{name}: {busy} GPUs busy, {idle_nodes} idle 8-GPU nodes; pass p50 {:.1} ms, p95 {:.1} ms; {} of {GANGS} gangs placed{groups}{singles}; no partial holds",
            q(0.5),
            q(0.95),
            k.placed,
        );
        if let Some(r) = k.reason {
            println!("  waiting gang: {r}");
        }
    }
}
