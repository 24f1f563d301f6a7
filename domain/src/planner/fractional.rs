//! Node and GPU choice for time-sliced (fractional) GPU shares.
//!
//! A policy sees one node at a time as a [`NodeView`] (free CPU, memory and
//! free milli-GPU of each eligible GPU) and scores placing a [`ShareAsk`]
//! there; the caller keeps the highest score, ties going to the node seen
//! first. The same code drives the planner's shared GPUs and the openb
//! benchmark (bench/), so the benchmark measures what the planner does.
//!
//! `Fragmentation` is FGD's measure (Weng et al., ATC'23) plus a stranding
//! term: for each request type of the expected workload, weighted by how
//! often it occurs, the free milli-GPU of the node that the type could not
//! use; plus the free milli-GPU that the node's CPU or memory could not feed
//! at the workload's average CPU and memory per milli-GPU. A placement is
//! scored by how much it changes that sum, squashed as FGD's artifact does
//! (`trunc(100 · sigmoid(−Δ/1000))`): small differences tie and ties go to
//! the caller's node order, which packs better than ranking finely
//! (docs/benchmarks.md).

use serde::{Deserialize, Serialize};

/// Free capacity of one node, restricted to GPUs the ask may use.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    pub cpu_free: u64,
    pub mem_free: u64,
    /// Milli-GPU free on each eligible GPU, in GPU index order.
    pub gpu_free: &'a [u32],
    /// The node's GPU model, as an index into the caller's model list
    /// (used to match [`ShareType::models`]).
    pub model: u16,
}

/// `count` GPUs with `milli` each (a 1000-milli share needs a free GPU;
/// `count > 1` is only meaningful with 1000), plus CPU and memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareAsk {
    pub cpu: u64,
    pub mem: u64,
    pub count: u32,
    pub milli: u32,
}

/// A kind of request in the expected workload, with its weight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareType {
    pub cpu: u64,
    pub mem: u64,
    pub count: u32,
    pub milli: u32,
    /// Bit `i` set: model `i` allowed. `u64::MAX` means any.
    pub models: u64,
    pub weight: u64,
}

/// Where to put one share on a node: the GPU positions (into
/// [`NodeView::gpu_free`]) and the score (higher is better).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub score: i64,
    pub gpus: Vec<usize>,
}

/// The policies Tessera implements. `BestFit` reproduces the scoring of the
/// FGD paper's artifact (for the fidelity check); `Fragmentation` is
/// Tessera's own (see docs/planner.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    BestFit,
    Fragmentation(Workload),
}

/// The expected mix of requests, e.g. the pending queue or a trace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    pub types: Vec<ShareType>,
    /// CPU milli per 1000 milli-GPU the GPU requests ask for, on average
    /// (0: CPU never strands GPUs).
    pub cpu_per_gpu: u64,
    /// Memory MiB per 1000 milli-GPU, likewise.
    pub mem_per_gpu: u64,
}

impl Workload {
    /// Groups identical asks, weighting each type by how often it occurs
    /// (FGD's popularity). Weighting by GPU demand instead lets the few
    /// 8-GPU types dominate: the policy then keeps 8-GPU nodes empty for them
    /// and fills small nodes whose models constrained requests need.
    pub fn from_asks(asks: impl IntoIterator<Item = (ShareAsk, u64)>) -> Self {
        Self::from_weighted(asks.into_iter().map(|(a, models)| (a, models, 1)))
    }

    /// As [`Workload::from_asks`], each ask counted `weight` times.
    pub fn from_weighted(asks: impl IntoIterator<Item = (ShareAsk, u64, u64)>) -> Self {
        let mut types: Vec<ShareType> = Vec::new();
        let (mut cpu, mut mem, mut gpu) = (0u64, 0u64, 0u64);
        for (a, models, weight) in asks {
            if a.count == 0 || a.milli == 0 || weight == 0 {
                continue;
            }
            cpu += a.cpu * weight;
            mem += a.mem * weight;
            gpu += u64::from(a.count) * u64::from(a.milli) * weight;
            match types.iter_mut().find(|t| {
                t.cpu == a.cpu
                    && t.mem == a.mem
                    && t.count == a.count
                    && t.milli == a.milli
                    && t.models == models
            }) {
                Some(t) => t.weight += weight,
                None => types.push(ShareType {
                    cpu: a.cpu,
                    mem: a.mem,
                    count: a.count,
                    milli: a.milli,
                    models,
                    weight,
                }),
            }
        }
        // Grouped by (count, milli) so `fragmentation` computes the per-GPU
        // part once per group.
        types.sort_by_key(|t| (t.count, t.milli, t.models, t.cpu, t.mem));
        Workload {
            types,
            cpu_per_gpu: (cpu * 1000).checked_div(gpu).unwrap_or(0),
            mem_per_gpu: (mem * 1000).checked_div(gpu).unwrap_or(0),
        }
    }
}

/// Whether the node can host the ask at all, and on which GPUs: the
/// fullest GPU that still fits a fractional share (ties: lowest index), or
/// the first `count` free GPUs.
pub fn fit(node: &NodeView<'_>, ask: &ShareAsk) -> Option<Vec<usize>> {
    if ask.cpu > node.cpu_free || ask.mem > node.mem_free {
        return None;
    }
    if ask.count == 0 || ask.milli == 0 {
        return Some(Vec::new());
    }
    if ask.count == 1 {
        let mut best: Option<(u32, usize)> = None;
        for (i, &free) in node.gpu_free.iter().enumerate() {
            if free >= ask.milli && best.is_none_or(|(b, _)| free < b) {
                best = Some((free, i));
            }
        }
        return best.map(|(_, i)| vec![i]);
    }
    let whole: Vec<usize> = node
        .gpu_free
        .iter()
        .enumerate()
        .filter(|(_, f)| **f >= ask.milli)
        .map(|(i, _)| i)
        .take(ask.count as usize)
        .collect();
    (whole.len() == ask.count as usize).then_some(whole)
}

impl Policy {
    /// Scores placing `ask` on `node`; `None` when it does not fit.
    pub fn choose(&self, node: &NodeView<'_>, ask: &ShareAsk) -> Option<Choice> {
        match self {
            Policy::BestFit => {
                let gpus = fit(node, ask)?;
                Some(Choice {
                    score: best_fit_score(node, ask),
                    gpus,
                })
            }
            Policy::Fragmentation(w) => w.choose(node, ask),
        }
    }
}

/// The artifact's BestFit: `s = ½·cpuLeftAfter/128 cores + ½·gpuLeftAfter/8
/// GPUs`, score `trunc((1 − s)·100)`. Floats on purpose: the truncation of
/// the artifact's float expression decides ties.
fn best_fit_score(node: &NodeView<'_>, ask: &ShareAsk) -> i64 {
    let gpu_left: u64 = node.gpu_free.iter().map(|&f| u64::from(f)).sum();
    let cpu_after = node.cpu_free.saturating_sub(ask.cpu) as f64;
    let gpu_after = gpu_left.saturating_sub(u64::from(ask.count) * u64::from(ask.milli)) as f64;
    let s = 0.5 * cpu_after / 128_000.0 + 0.5 * gpu_after / 8000.0;
    ((1.0 - s) * 100.0) as i64
}

/// `SIGMOID_STEPS[k − 1]` = `round(10⁶ · ln(100/k − 1))`: a change `x` (in
/// units of 1000 milli-GPU, scaled by 10⁶) scores at least `k` out of 100
/// iff `x ≤ SIGMOID_STEPS[k − 1]`, i.e. `trunc(100 / (1 + eˣ)) ≥ k`. Integer
/// thresholds keep the policy exact and identical on every target.
const SIGMOID_STEPS: [i64; 99] = [
    4595120, 3891820, 3476099, 3178054, 2944439, 2751535, 2586689, 2442347, 2313635, 2197225,
    2090741, 1992430, 1900959, 1815290, 1734601, 1658228, 1585627, 1516347, 1450010, 1386294,
    1324925, 1265666, 1208311, 1152680, 1098612, 1045969, 994623, 944462, 895384, 847298, 800119,
    753772, 708185, 663294, 619039, 575364, 532217, 489548, 447312, 405465, 363965, 322773, 281851,
    241162, 200671, 160343, 120144, 80043, 40005, 0, -40005, -80043, -120144, -160343, -200671,
    -241162, -281851, -322773, -363965, -405465, -447312, -489548, -532217, -575364, -619039,
    -663294, -708185, -753772, -800119, -847298, -895384, -944462, -994623, -1045969, -1098612,
    -1152680, -1208311, -1265666, -1324925, -1386294, -1450010, -1516347, -1585627, -1658228,
    -1734601, -1815290, -1900959, -1992430, -2090741, -2197225, -2313635, -2442347, -2586689,
    -2751535, -2944439, -3178054, -3476099, -3891820, -4595120,
];

/// `trunc(100 · sigmoid(−num / den / 1000))` for a change of `num / den`
/// milli-GPU (`den > 0`), computed exactly on integers.
fn squash(num: i128, den: i128) -> i64 {
    // Thresholds decrease with k: count those the change is within.
    let x = num * 1000;
    SIGMOID_STEPS.partition_point(|&t| x <= i128::from(t) * den) as i64
}

impl Workload {
    /// Milli-GPU of the node that each type could not use, times its
    /// weight, summed: the node's expected fragmentation.
    pub fn fragmentation(&self, model: u16, cpu: u64, mem: u64, gpu_free: &[u32]) -> u64 {
        let total: u64 = gpu_free.iter().map(|&f| u64::from(f)).sum();
        if total == 0 {
            return 0;
        }
        let model_bit = 1u64.checked_shl(u32::from(model)).unwrap_or(0);
        let mut frag = 0u64;
        // (milli, milli-GPU on GPUs with less free than that) of the last
        // single-GPU group, reused while the types share `milli`.
        let mut memo: Option<(u32, u64)> = None;
        for t in &self.types {
            let lost =
                if t.cpu > cpu || t.mem > mem || (model_bit != 0 && t.models & model_bit == 0) {
                    total
                } else if t.count == 1 {
                    match memo {
                        Some((m, lost)) if m == t.milli => lost,
                        _ => {
                            let lost = gpu_free
                                .iter()
                                .filter(|&&f| f < t.milli)
                                .map(|&f| u64::from(f))
                                .sum();
                            memo = Some((t.milli, lost));
                            lost
                        }
                    }
                } else {
                    let fitting = gpu_free.iter().filter(|&&f| f >= t.milli).count() as u64;
                    let by_cpu = cpu.checked_div(t.cpu).unwrap_or(u64::MAX);
                    let by_mem = mem.checked_div(t.mem).unwrap_or(u64::MAX);
                    let hosts = (fitting / u64::from(t.count)).min(by_cpu).min(by_mem);
                    total - hosts * u64::from(t.count) * u64::from(t.milli)
                };
            frag += lost * t.weight;
        }
        frag
    }

    /// Free milli-GPU (`gpu`) beyond what `cpu` and `mem` can feed at the
    /// workload's average ratios: GPUs that will strand once the node's CPU
    /// or memory runs out.
    pub fn stranded(&self, cpu: u64, mem: u64, gpu: u64) -> u64 {
        let by_cpu = (cpu * 1000)
            .checked_div(self.cpu_per_gpu)
            .unwrap_or(u64::MAX);
        let by_mem = (mem * 1000)
            .checked_div(self.mem_per_gpu)
            .unwrap_or(u64::MAX);
        gpu.saturating_sub(by_cpu.min(by_mem))
    }

    fn choose(&self, node: &NodeView<'_>, ask: &ShareAsk) -> Option<Choice> {
        let first = fit(node, ask)?;
        let total: u64 = node.gpu_free.iter().map(|&f| u64::from(f)).sum();
        let frag_before =
            self.fragmentation(node.model, node.cpu_free, node.mem_free, node.gpu_free);
        let strand_before = self.stranded(node.cpu_free, node.mem_free, total);
        let cpu = node.cpu_free - ask.cpu;
        let mem = node.mem_free - ask.mem;
        let left = total - u64::from(ask.count) * u64::from(ask.milli);
        let strand = i128::from(self.stranded(cpu, mem, left)) - i128::from(strand_before);
        let mut free = node.gpu_free.to_vec();
        let candidates: Vec<Vec<usize>> = if ask.count == 1 {
            // Every distinct free amount that fits is a different outcome.
            let mut seen: Vec<u32> = Vec::new();
            let mut c = Vec::new();
            for (i, &f) in node.gpu_free.iter().enumerate() {
                if f >= ask.milli && !seen.contains(&f) {
                    seen.push(f);
                    c.push(vec![i]);
                }
            }
            c
        } else {
            vec![first]
        };
        let wsum = i128::from(self.types.iter().map(|t| t.weight).sum::<u64>().max(1));
        let mut best: Option<(i64, Vec<usize>)> = None;
        for gpus in candidates {
            for &g in &gpus {
                free[g] -= ask.milli;
            }
            let frag_after = self.fragmentation(node.model, cpu, mem, &free);
            for &g in &gpus {
                free[g] += ask.milli;
            }
            // Expected milli-GPU the placement makes unusable, as a
            // fraction over `wsum`.
            let change = i128::from(frag_after) - i128::from(frag_before) + strand * wsum;
            let score = squash(change, wsum);
            if best.as_ref().is_none_or(|(s, _)| score > *s) {
                best = Some((score, gpus));
            }
        }
        best.map(|(score, gpus)| Choice { score, gpus })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn view(cpu: u64, free: &[u32]) -> NodeView<'_> {
        NodeView {
            cpu_free: cpu,
            mem_free: 1 << 20,
            gpu_free: free,
            model: 0,
        }
    }

    #[test]
    fn fit_takes_the_fullest_gpu_that_fits() {
        let free = [1000, 300, 600, 300];
        let ask = ShareAsk {
            cpu: 0,
            mem: 0,
            count: 1,
            milli: 250,
        };
        assert_eq!(fit(&view(0, &free), &ask), Some(vec![1]));
        let whole = ShareAsk {
            cpu: 0,
            mem: 0,
            count: 2,
            milli: 1000,
        };
        assert_eq!(fit(&view(0, &free), &whole), None);
    }

    #[test]
    fn best_fit_prefers_the_fuller_node() {
        let ask = ShareAsk {
            cpu: 1000,
            mem: 0,
            count: 1,
            milli: 500,
        };
        let a = Policy::BestFit
            .choose(&view(8000, &[1000, 1000]), &ask)
            .unwrap();
        let b = Policy::BestFit.choose(&view(8000, &[500]), &ask).unwrap();
        assert!(b.score > a.score);
    }

    #[test]
    fn squash_matches_the_float_sigmoid() {
        for change in (-6000i128..=6000).step_by(7) {
            let want = (100.0 / (1.0 + (change as f64 / 1000.0).exp())) as i64;
            // Off by one only where the float rounds across a threshold.
            let got = squash(change * 3, 3);
            assert!((got - want).abs() <= 1, "{change}: {got} vs {want}");
        }
        assert_eq!(squash(0, 1), 50);
        assert_eq!(squash(-40_006, 1000), 51);
        assert_eq!(squash(1_000_000, 1), 0);
        assert_eq!(squash(-1_000_000, 1), 99);
    }

    #[test]
    fn cpu_that_cannot_feed_the_free_gpus_counts_as_stranded() {
        let w = Workload {
            types: Vec::new(),
            cpu_per_gpu: 10_000,
            mem_per_gpu: 0,
        };
        // 2 free GPUs need 20 cores at 10 cores per GPU; 15 feed 1.5.
        assert_eq!(w.stranded(15_000, 0, 2000), 500);
        assert_eq!(w.stranded(30_000, 0, 2000), 0);
    }

    #[test]
    fn cpu_only_asks_go_where_cpu_is_spare() {
        let gpu_ask = ShareAsk {
            cpu: 10_000,
            mem: 0,
            count: 1,
            milli: 1000,
        };
        let w = Workload::from_asks([(gpu_ask, u64::MAX)]);
        let cpu_only = ShareAsk {
            cpu: 12_000,
            mem: 0,
            count: 0,
            milli: 0,
        };
        let policy = Policy::Fragmentation(w);
        // 8 GPUs with 80 cores (just enough) vs 2 GPUs with 104 cores.
        let tight = policy.choose(&view(80_000, &[1000; 8]), &cpu_only).unwrap();
        let spare = policy
            .choose(&view(104_000, &[1000; 2]), &cpu_only)
            .unwrap();
        assert!(spare.score > tight.score);
    }

    #[test]
    fn fragmentation_policy_avoids_leaving_unusable_slivers() {
        // Typical asks are 500 milli: a 500 share belongs on the GPU with
        // 500 free, not on the one with 700 (that would leave 200 useless).
        let w = Workload::from_asks([(
            ShareAsk {
                cpu: 0,
                mem: 0,
                count: 1,
                milli: 500,
            },
            u64::MAX,
        )]);
        let ask = ShareAsk {
            cpu: 0,
            mem: 0,
            count: 1,
            milli: 500,
        };
        let free = [700, 500];
        let c = Policy::Fragmentation(w)
            .choose(&view(0, &free), &ask)
            .unwrap();
        assert_eq!(c.gpus, vec![1]);
    }
}
