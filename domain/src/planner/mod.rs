//! The cluster planner: decides where every pending request goes, which
//! idle GPUs to re-partition, and why the rest wait. Pure and
//! deterministic; docs/planner.md describes the algorithm, its cost and the
//! JSON schema of `tessera plan`.

pub mod cli;
#[cfg(test)]
mod driver_tests;
mod engine;
pub mod fractional;
#[cfg(test)]
mod gang_tests;
mod input;
mod output;

use std::cmp::Reverse;
use std::collections::BTreeSet;

pub use engine::{Decision, Engine, GangPlacement, Unplaced};
pub use input::{
    Cluster, Demand, DriverInfo, Gang, Gpu, GpuMode, InputError, MigInstance, Node, Request,
};
pub use output::{Assignment, GangMember, MemberSlice, Pending, Plan, Reconfiguration};

use crate::mig::Catalog;
use fractional::{Policy, ShareAsk, Workload};
use input::Ask;

/// How a pending reason starts when the request waits for a node whose driver supports
/// the CUDA version it needs ([`waits_for_driver`]).
pub const DRIVER_REASON: &str = "needs CUDA ≥ ";

/// Whether a pending reason says the request waits for a new enough driver: then no end
/// time of running work frees what it needs.
pub fn waits_for_driver(reason: &str) -> bool {
    reason.trim_start().starts_with(DRIVER_REASON)
}

/// Plans `requests` onto `cluster`: highest priority first, then larger
/// asks, then input order; each placed where it costs the fewest
/// reconfigurations and leaves the most options open.
pub fn plan(
    cluster: &Cluster,
    requests: &[Request],
    catalog: &Catalog,
) -> Result<Plan, InputError> {
    let mut engine = Engine::new(cluster, catalog)?;
    let initial = engine.clone();
    let resolved = requests
        .iter()
        .enumerate()
        .map(|(i, r)| engine.resolve(r, i))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ids = BTreeSet::new();
    for (i, r) in requests.iter().enumerate() {
        if !ids.insert(r.id.as_str()) {
            return Err(InputError::new(
                format!("[{i}].id"),
                format!("request id {} appears twice", r.id),
            ));
        }
    }
    // With fixed sharing whole GPUs never come from shared ones: whole asks do not
    // shape where shares go.
    let shapes =
        |r: &engine::Resolved| !(cluster.fixed_sharing && matches!(r.ask(), Ask::Whole(_)));
    let workload = if cluster.demand.is_empty() {
        Workload::from_asks(
            resolved
                .iter()
                .filter(|r| shapes(r))
                .filter_map(|r| r.share_ask().map(|a| (a, r.model_mask()))),
        )
    } else {
        let mut kinds = Vec::with_capacity(cluster.demand.len());
        for (i, d) in cluster.demand.iter().enumerate() {
            let r = engine.resolve(&d.request, i).map_err(|e| {
                // `[i].field` → `demand[i].request.field`
                let field = e.path.strip_prefix(&format!("[{i}]")).unwrap_or_default();
                InputError {
                    path: format!("demand[{i}].request{field}"),
                    ..e
                }
            })?;
            if let Some(a) = r.share_ask().filter(|_| shapes(&r)) {
                kinds.push((a, r.model_mask(), u64::from(d.weight)));
            }
        }
        Workload::from_weighted(kinds)
    };
    engine.set_policy(Policy::Fragmentation(workload));

    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| {
        (
            Reverse(requests[i].priority),
            Reverse(resolved[i].size_milli()),
            i,
        )
    });
    let mut outcomes = vec![None; requests.len()];
    for i in order {
        outcomes[i] = Some(if resolved[i].is_gang() {
            match engine.place_gang_resolved(&resolved[i]) {
                Some(g) => Outcome::Gang(g),
                None => Outcome::GangWaits,
            }
        } else {
            Outcome::One(engine.place_resolved(&resolved[i]))
        });
    }

    let summary = engine.summary();
    let mut plan = Plan::default();
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let request = requests[i].id.clone();
        match outcome {
            Some(Outcome::Gang(g)) => {
                let members: Vec<GangMember> =
                    g.members.iter().map(|m| gang_member(&engine, m)).collect();
                let first = members.first().cloned();
                plan.assignments.push(Assignment {
                    request,
                    node: first.as_ref().map(|m| m.node.clone()).unwrap_or_default(),
                    gpu: first
                        .as_ref()
                        .and_then(|m| m.gpus.first().copied())
                        .or_else(|| first.as_ref()?.slices.first().map(|s| s.gpu)),
                    gpus: first
                        .as_ref()
                        .filter(|m| m.gpus.len() > 1)
                        .map(|m| m.gpus.clone())
                        .unwrap_or_default(),
                    profile: None,
                    start: None,
                    milli: None,
                    members,
                });
            }
            Some(Outcome::GangWaits) => plan.pending.push(Pending {
                request,
                reason: engine.gang_reason(&resolved[i]),
            }),
            Some(Outcome::One(Ok(d))) => {
                let p = engine.decision_parts(&d);
                plan.assignments.push(Assignment {
                    request,
                    node: engine.node_name(p.node).to_owned(),
                    gpu: p.gpus.first().copied(),
                    gpus: if p.gpus.len() > 1 { p.gpus } else { Vec::new() },
                    profile: p.profile,
                    start: p.start,
                    milli: p.milli,
                    members: Vec::new(),
                });
            }
            Some(Outcome::One(Err(u))) => plan.pending.push(Pending {
                request,
                reason: engine.reason(&resolved[i], u, &summary),
            }),
            None => {}
        }
    }
    for g in 0..engine.gpu_count() {
        let (mode0, before) = initial.gpu_layout(g);
        let (mode1, after) = engine.gpu_layout(g);
        if mode0 == mode1 && before == after {
            continue;
        }
        let (node, index) = engine.gpu_ref(g);
        plan.reconfigurations.push(Reconfiguration {
            node: engine.node_name(node).to_owned(),
            gpu: index,
            mode: mode1,
            from_mode: (mode0 != mode1).then_some(mode0),
            destroy: before
                .iter()
                .filter(|i| !after.contains(i))
                .cloned()
                .collect(),
            create: after
                .iter()
                .filter(|i| !before.contains(i))
                .cloned()
                .collect(),
        });
    }
    Ok(plan)
}

/// What became of one request in [`plan`].
#[derive(Clone)]
enum Outcome {
    One(Result<Decision, Unplaced>),
    Gang(GangPlacement),
    GangWaits,
}

/// A placed gang member in wire form.
fn gang_member(engine: &Engine, decisions: &[Decision]) -> GangMember {
    let mut m = GangMember {
        node: String::new(),
        gpus: Vec::new(),
        slices: Vec::new(),
    };
    for d in decisions {
        let p = engine.decision_parts(d);
        m.node = engine.node_name(p.node).to_owned();
        match (p.profile, p.start) {
            (Some(profile), Some(start)) => m.slices.push(MemberSlice {
                gpu: p.gpus.first().copied().unwrap_or_default(),
                profile,
                start,
            }),
            _ => m.gpus.extend(p.gpus),
        }
    }
    m
}

impl engine::Resolved {
    fn share_ask(&self) -> Option<ShareAsk> {
        match self.ask() {
            Ask::Share(m) => Some(ShareAsk {
                cpu: self.cpu(),
                mem: self.mem(),
                count: 1,
                milli: *m,
            }),
            Ask::Whole(n) => Some(ShareAsk {
                cpu: self.cpu(),
                mem: self.mem(),
                count: *n,
                milli: 1000,
            }),
            _ => None,
        }
    }

    /// The ask's size in milli-GPU, to place larger asks first (a gang's: all its
    /// members').
    fn size_milli(&self) -> u32 {
        let one = match self.ask() {
            Ask::Cpu => 0,
            Ask::Share(m) => *m,
            Ask::Whole(n) => n.saturating_mul(1000),
            Ask::Mig(_) => self.mig_milli(),
        };
        match self.gang() {
            Some(g) => one.saturating_mul(g.nodes).saturating_mul(g.per_node),
            None => one,
        }
    }
}
