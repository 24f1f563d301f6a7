//! The openb protocol of the FGD paper's artifact
//! (shared/reference/openb-protocol.md), driving the planner's fractional
//! policies.

use std::collections::BTreeMap;
use std::path::Path;

use tessera_domain::planner::fractional::{NodeView, Policy, ShareAsk, Workload};

use crate::{Rng, read_csv};

#[derive(Debug, Clone)]
pub struct SimNode {
    pub name: String,
    pub cpu: u64,
    pub mem: u64,
    pub model: u16,
    pub gpus: u32,
}

#[derive(Debug, Clone)]
pub struct Pod {
    pub name: String,
    pub cpu: u64,
    pub mem: u64,
    pub num_gpu: u32,
    pub milli: u32,
    /// Allowed model indices (bit mask); `u64::MAX` means any.
    pub models: u64,
}

impl Pod {
    pub fn ask(&self) -> ShareAsk {
        ShareAsk {
            cpu: self.cpu,
            mem: self.mem,
            count: self.num_gpu,
            milli: if self.num_gpu == 0 { 0 } else { self.milli },
        }
    }
    pub fn gpu_milli(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(if self.num_gpu == 0 { 0 } else { self.milli })
    }
}

pub struct Trace {
    pub nodes: Vec<SimNode>,
    pub pods: Vec<Pod>,
    pub model_names: Vec<String>,
}

fn num(row: &BTreeMap<String, String>, k: &str) -> u64 {
    row.get(k).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

pub fn load(nodes: &Path, pods: &Path) -> Result<Trace, String> {
    let mut model_names: Vec<String> = Vec::new();
    let mut model_id = |m: &str| -> u16 {
        if let Some(i) = model_names.iter().position(|x| x == m) {
            return i as u16;
        }
        model_names.push(m.to_owned());
        (model_names.len() - 1) as u16
    };
    let mut ns: Vec<SimNode> = read_csv(nodes)?
        .iter()
        .map(|r| SimNode {
            name: r.get("sn").cloned().unwrap_or_default(),
            cpu: num(r, "cpu_milli"),
            mem: num(r, "memory_mib"),
            model: model_id(r.get("model").map(String::as_str).unwrap_or("")),
            gpus: num(r, "gpu") as u32,
        })
        .collect();
    ns.sort_by(|a, b| a.name.cmp(&b.name));
    let mut ps: Vec<Pod> = read_csv(pods)?
        .iter()
        .map(|r| {
            let spec = r.get("gpu_spec").map(String::as_str).unwrap_or("").trim();
            let models = if spec.is_empty() {
                u64::MAX
            } else {
                spec.split('|')
                    .fold(0u64, |m, name| m | 1 << model_id(name.trim()))
            };
            Pod {
                name: r.get("name").cloned().unwrap_or_default(),
                cpu: num(r, "cpu_milli"),
                mem: num(r, "memory_mib"),
                num_gpu: num(r, "num_gpu") as u32,
                milli: num(r, "gpu_milli").min(1000) as u32,
                models,
            }
        })
        .collect();
    ps.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Trace {
        nodes: ns,
        pods: ps,
        model_names,
    })
}

impl Trace {
    /// The variant a Tessera server can run as it stands: GPUs only (the server does not
    /// track CPU or memory), one model (`model`; the trace's models are not in the
    /// catalog and its pods name none), and only the pods that fit one GPU, each a share
    /// of `gpu_milli` (a whole single-GPU pod is a 1000-milli share). CPU-only and
    /// multi-GPU pods are left out (1,088 and 75 of the default trace's 8,152).
    pub fn single_gpu_variant(&self, model: &str) -> Trace {
        Trace {
            nodes: self
                .nodes
                .iter()
                .map(|n| SimNode {
                    cpu: 1 << 40,
                    mem: 1 << 40,
                    model: 0,
                    ..n.clone()
                })
                .collect(),
            pods: self
                .pods
                .iter()
                .filter(|p| p.num_gpu == 1)
                .map(|p| Pod {
                    cpu: 0,
                    mem: 0,
                    models: u64::MAX,
                    ..p.clone()
                })
                .collect(),
            model_names: vec![model.to_owned()],
        }
    }

    /// Every `k`-th node (by name) and the same pods: a smaller cluster the same pods
    /// saturate sooner, for runs that cost more per pod (the server path).
    pub fn every_nth_node(&self, k: usize) -> Trace {
        Trace {
            nodes: self.nodes.iter().step_by(k.max(1)).cloned().collect(),
            pods: self.pods.clone(),
            model_names: self.model_names.clone(),
        }
    }

    pub fn total_gpu_milli(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.gpus) * 1000).sum()
    }

    /// The trace's request mix, for the fragmentation policy.
    pub fn workload(&self) -> Workload {
        Workload::from_asks(self.pods.iter().map(|p| (p.ask(), p.models)))
    }

    /// Steps 3–4 of the protocol: shuffle the name-sorted pods with `seed`,
    /// then append random copies until GPU demand reaches 130 %.
    pub fn arrivals(&self, rng: &mut Rng) -> Vec<Pod> {
        let mut pods = self.pods.clone();
        rng.shuffle(&mut pods);
        let target = self.total_gpu_milli() * 13 / 10;
        let mut total: u64 = pods.iter().map(Pod::gpu_milli).sum();
        loop {
            let p = &self.pods[rng.below(self.pods.len())];
            let per_gpu = if p.num_gpu == 0 {
                0
            } else {
                u64::from(p.milli)
            };
            if total + per_gpu > target {
                break;
            }
            total += p.gpu_milli();
            pods.push(p.clone());
        }
        pods
    }
}

/// One seed's arrivals and node order (steps 3–5 of the protocol): the pods in
/// arrival order, and the order in which nodes are tried (ties go to the earlier).
pub fn seeded(trace: &Trace, seed: u64) -> (Vec<Pod>, Vec<usize>) {
    let mut rng = Rng::new(seed);
    let pods = trace.arrivals(&mut rng);
    let mut order: Vec<usize> = (0..trace.nodes.len()).collect();
    rng.shuffle(&mut order);
    (pods, order)
}

/// The allocation curve of one run: allocation % averaged per rounded arrived %.
pub struct Curve {
    total: f64,
    arrived: u64,
    used: u64,
    sums: Vec<(f64, u32)>,
}

impl Curve {
    pub fn new(trace: &Trace) -> Self {
        Curve {
            total: trace.total_gpu_milli() as f64,
            arrived: 0,
            used: 0,
            sums: vec![(0.0, 0); 140],
        }
    }

    /// Records that `pod` arrived and `placed` milli-GPU of it were allocated.
    pub fn record(&mut self, pod: &Pod, placed: u64) {
        self.used += placed;
        self.arrived += pod.gpu_milli();
        let arrive = (self.arrived as f64 / self.total * 100.0).round() as usize;
        let alloc = (self.used as f64 / self.total * 100.0 * 100.0).round() / 100.0;
        if arrive < self.sums.len() {
            self.sums[arrive].0 += alloc;
            self.sums[arrive].1 += 1;
        }
    }

    /// Whether arrivals have passed 130 % of the cluster: the curve is complete.
    pub fn complete(&self) -> bool {
        self.arrived as f64 > self.total * 1.305
    }

    /// Allocation % at arrived 0..=130 %.
    pub fn finish(&self) -> Vec<f64> {
        let sums = &self.sums;
        (0..=130)
            .map(|x| {
                if sums[x].1 > 0 {
                    sums[x].0 / f64::from(sums[x].1)
                } else {
                    let lo = x.saturating_sub(1);
                    let (s, c) = sums[lo..=x + 1]
                        .iter()
                        .fold((0.0, 0), |(s, c), v| (s + v.0, c + v.1));
                    if c > 0 { s / f64::from(c) } else { f64::NAN }
                }
            })
            .collect()
    }
}

/// Runs one seed; returns the curve: allocation % at arrived 0..=130 %.
pub fn run(trace: &Trace, policy: &Policy, seed: u64) -> Vec<f64> {
    let (pods, order) = seeded(trace, seed);
    let mut cpu: Vec<u64> = trace.nodes.iter().map(|n| n.cpu).collect();
    let mut mem: Vec<u64> = trace.nodes.iter().map(|n| n.mem).collect();
    let mut free: Vec<Vec<u32>> = trace
        .nodes
        .iter()
        .map(|n| vec![1000; n.gpus as usize])
        .collect();
    let mut curve = Curve::new(trace);
    for pod in &pods {
        let ask = pod.ask();
        let mut best: Option<(i64, usize, Vec<usize>)> = None;
        for &n in &order {
            let node = &trace.nodes[n];
            if pod.num_gpu > 0 && (node.gpus == 0 || pod.models & (1 << node.model) == 0) {
                continue;
            }
            let view = NodeView {
                cpu_free: cpu[n],
                mem_free: mem[n],
                gpu_free: &free[n],
                model: node.model,
            };
            if let Some(c) = policy.choose(&view, &ask)
                && best.as_ref().is_none_or(|(s, _, _)| c.score > *s)
            {
                best = Some((c.score, n, c.gpus));
            }
        }
        let mut placed = 0;
        if let Some((_, n, gpus)) = best {
            cpu[n] -= ask.cpu;
            mem[n] -= ask.mem;
            for g in gpus {
                free[n][g] -= ask.milli;
                placed += u64::from(ask.milli);
            }
        }
        curve.record(pod, placed);
    }
    curve.finish()
}

/// Curve points by (workload, policy): alloc mean per arrived %.
pub type Curves = BTreeMap<(String, String), BTreeMap<u32, f64>>;

/// The published curves (`fgd_published_alloc_by_policy.csv`).
pub fn published(path: &Path) -> Result<Curves, String> {
    let mut out = Curves::new();
    for r in read_csv(path)? {
        let (Some(w), Some(p)) = (r.get("workload"), r.get("sc_policy")) else {
            continue;
        };
        let x = num(&r, "arrived_pct") as u32;
        let v: f64 = r
            .get("alloc_pct_mean")
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN);
        out.entry((w.clone(), p.clone())).or_default().insert(x, v);
    }
    Ok(out)
}
