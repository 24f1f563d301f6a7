//! Node and GPU choice for time-sliced (fractional) GPU shares.
//!
//! A policy sees one node at a time as a [`NodeView`] (free CPU, memory and
//! free milli-GPU of each eligible GPU) and scores placing a [`ShareAsk`]
//! there; the caller keeps the highest score, ties going to the node seen
//! first. The same code drives the planner's shared GPUs and the openb
//! benchmark (bench/), so the benchmark measures what the planner does.

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
    /// Weight of packing against fragmentation: how many milli-GPU left
    /// free on the node cost as much as 1/1000 milli-GPU of expected
    /// fragmentation per request (0: packing only breaks ties).
    #[serde(default)]
    pub pack: i64,
}

impl Workload {
    /// Groups identical asks, weighting each type by its total GPU demand
    /// (count × milli × occurrences): large requests matter more to the
    /// allocation ratio than their count suggests.
    pub fn from_asks(asks: impl IntoIterator<Item = (ShareAsk, u64)>) -> Self {
        let mut types: Vec<ShareType> = Vec::new();
        for (a, models) in asks {
            if a.count == 0 || a.milli == 0 {
                continue;
            }
            let w = u64::from(a.count) * u64::from(a.milli);
            match types.iter_mut().find(|t| {
                t.cpu == a.cpu
                    && t.mem == a.mem
                    && t.count == a.count
                    && t.milli == a.milli
                    && t.models == models
            }) {
                Some(t) => t.weight += w,
                None => types.push(ShareType {
                    cpu: a.cpu,
                    mem: a.mem,
                    count: a.count,
                    milli: a.milli,
                    models,
                    weight: w,
                }),
            }
        }
        // Grouped by (count, milli) so `fragmentation` computes the per-GPU
        // part once per group.
        types.sort_by_key(|t| (t.count, t.milli, t.models, t.cpu, t.mem));
        Workload { types, pack: 0 }
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

    fn choose(&self, node: &NodeView<'_>, ask: &ShareAsk) -> Option<Choice> {
        let first = fit(node, ask)?;
        let before = self.fragmentation(node.model, node.cpu_free, node.mem_free, node.gpu_free);
        let cpu = node.cpu_free - ask.cpu;
        let mem = node.mem_free - ask.mem;
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
            let after = self.fragmentation(node.model, cpu, mem, &free);
            let left: u64 = free.iter().map(|&f| u64::from(f)).sum();
            for &g in &gpus {
                free[g] += ask.milli;
            }
            // Expected milli-GPU lost per request (×1000) the placement adds;
            // then pack (less free GPU left on the node) so empty nodes stay
            // empty for big asks.
            let delta = (after as i128 - before as i128) * 1000 * 1000 / wsum;
            let frag = i64::try_from(delta).unwrap_or(i64::MAX);
            let score = -frag.saturating_mul(16) - (left as i64 * self.pack.max(1)) / 1000;
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
