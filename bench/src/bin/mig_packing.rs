//! `cargo run --release -p tessera-bench --bin mig-packing -- [trace]`
//! The openb pods mapped onto H100-80GB MIG (docs/benchmarks.md): Tessera's
//! planner against first-fit and best-fit, with and without reconfiguration.

use tessera_bench::{Rng, data, openb};
use tessera_domain::mig::{Catalog, GpuModel, Occupancy, ProfileIdx, Slot};
use tessera_domain::planner::{Cluster, Engine, Gpu, GpuMode, MigInstance, Node, Request};

/// Smallest H100 profile (no `+me`) whose memory holds `milli` of 80 GiB;
/// 1000 milli stays a whole GPU (`None`).
fn profile_for(h100: &GpuModel, milli: u32) -> Option<ProfileIdx> {
    if milli >= 1000 {
        return None;
    }
    let need = u64::from(milli) * 81_920 / 1000;
    let mut ps: Vec<_> = h100
        .indexed()
        .filter(|(_, p)| !p.name.contains('+'))
        .collect();
    ps.sort_by_key(|(_, p)| (p.memory_mib, p.compute_slices));
    ps.iter()
        .find(|(_, p)| p.memory_mib >= need)
        .or(ps.last())
        .map(|(i, _)| *i)
}

#[derive(Clone, Copy, PartialEq)]
enum Baseline {
    FirstFit,
    BestFit,
}

struct Sim {
    cpu: Vec<u64>,
    mem: Vec<u64>,
    /// Per node, per GPU: None = taken whole, Some(occupancy).
    gpus: Vec<Vec<Option<Occupancy>>>,
}

impl Sim {
    fn place(
        &mut self,
        h100: &GpuModel,
        order: &[usize],
        pod: &openb::Pod,
        p: Option<ProfileIdx>,
        how: Baseline,
    ) -> bool {
        let mut best: Option<(u32, usize, usize, u8)> = None;
        for &n in order {
            if self.cpu[n] < pod.cpu || self.mem[n] < pod.mem || self.gpus[n].is_empty() {
                continue;
            }
            match p {
                Some(p) => {
                    for (g, occ) in self.gpus[n].iter().enumerate() {
                        let Some(occ) = occ else { continue };
                        for pl in &h100.profile(p).placements {
                            let slot = Slot {
                                profile: p,
                                start: pl.start,
                            };
                            if occ.fits(h100, slot) {
                                let free =
                                    8 - (occ.mask | ((1 << pl.size) - 1) << pl.start).count_ones();
                                let key = if how == Baseline::BestFit { free } else { 0 };
                                if best.is_none_or(|b| key < b.0) {
                                    best = Some((key, n, g, pl.start));
                                }
                                break;
                            }
                        }
                        if how == Baseline::FirstFit && best.is_some() {
                            break;
                        }
                    }
                }
                None => {
                    let empty = self.gpus[n]
                        .iter()
                        .filter(|o| o.is_some_and(|o| o.mask == 0))
                        .count() as u32;
                    if empty >= pod.num_gpu {
                        let key = if how == Baseline::BestFit { empty } else { 0 };
                        if best.is_none_or(|b| key < b.0) {
                            best = Some((key, n, 0, 0));
                        }
                    }
                }
            }
            if how == Baseline::FirstFit && best.is_some() {
                break;
            }
        }
        let Some((_, n, g, start)) = best else {
            return false;
        };
        self.cpu[n] -= pod.cpu;
        self.mem[n] -= pod.mem;
        match p {
            Some(p) => {
                if let Some(occ) = &mut self.gpus[n][g] {
                    occ.add(h100, Slot { profile: p, start });
                }
            }
            None => {
                let mut k = pod.num_gpu;
                for o in self.gpus[n].iter_mut() {
                    if k > 0 && o.is_some_and(|o| o.mask == 0) {
                        *o = None;
                        k -= 1;
                    }
                }
            }
        }
        true
    }
}

fn main() -> Result<(), String> {
    let trace_name = std::env::args().nth(1).unwrap_or_else(|| "default".into());
    let trace = openb::load(
        &data("openb_node_list_gpu_node.csv"),
        &data(&format!("openb_pod_list_{trace_name}.csv")),
    )?;
    let catalog = Catalog::builtin();
    let h100 = catalog.get("H100-80GB").ok_or("no H100")?.clone();
    let share = |p: Option<ProfileIdx>, pod: &openb::Pod| match p {
        Some(p) => u64::from(h100.share(p).milli()),
        None => u64::from(pod.num_gpu) * 1000,
    };
    let total = trace.total_gpu_milli() as f64;
    let seeds: Vec<u64> = (42..=44).collect();
    // Static partition: the share of GPU demand asking for whole GPUs stays
    // whole; the rest is split as mig-parted's "all-balanced" H100 layout.
    let whole_share = trace
        .pods
        .iter()
        .filter(|p| p.milli >= 1000)
        .map(openb::Pod::gpu_milli)
        .sum::<u64>() as f64
        / trace.pods.iter().map(openb::Pod::gpu_milli).sum::<u64>() as f64;
    let balanced = [
        ("1g.10gb", 0u8),
        ("1g.10gb", 1),
        ("2g.20gb", 2),
        ("3g.40gb", 4),
    ];
    println!(
        "trace {trace_name}; whole-GPU share of demand {:.2}; seeds {seeds:?}",
        whole_share
    );
    println!(
        "policy, reconfiguration, pods accepted %, GPU demand accepted %, GPU capacity allocated % (compute slices)"
    );
    for reconf in [false, true] {
        let mut rows: Vec<(&str, f64, f64, f64)> = Vec::new();
        for name in ["first-fit", "best-fit", "tessera"] {
            let (mut pods_ok, mut dem_ok, mut alloc) = (0.0, 0.0, 0.0);
            for &seed in &seeds {
                let mut rng = Rng::new(seed);
                let pods = trace.arrivals(&mut rng);
                let mut order: Vec<usize> = (0..trace.nodes.len()).collect();
                rng.shuffle(&mut order);
                let (mut n_ok, mut d_ok, mut d_all, mut a) = (0usize, 0u64, 0u64, 0u64);
                let gpu_pods: Vec<_> = pods.iter().filter(|p| p.num_gpu > 0).collect();
                if name == "tessera" || !reconf {
                    // The planner's engine; without reconfiguration the
                    // baselines use it too (only existing instances count,
                    // so every policy is first-fit on idle instances).
                    let nodes: Vec<Node> = order
                        .iter()
                        .map(|&n| {
                            let sn = &trace.nodes[n];
                            let whole = (f64::from(sn.gpus) * whole_share).round() as u32;
                            Node {
                                name: sn.name.clone(),
                                cpu_milli: sn.cpu,
                                memory_mib: sn.mem,
                                cpu_used_milli: 0,
                                memory_used_mib: 0,
                                gpus: (0..sn.gpus)
                                    .map(|i| Gpu {
                                        index: i,
                                        model: "H100-80GB".into(),
                                        mode: if reconf || i >= whole {
                                            GpuMode::Mig
                                        } else {
                                            GpuMode::Whole
                                        },
                                        reconfigurable: reconf,
                                        instances: if reconf || i < whole {
                                            Vec::new()
                                        } else {
                                            balanced
                                                .iter()
                                                .map(|(p, s)| MigInstance {
                                                    profile: (*p).into(),
                                                    start: *s,
                                                    busy: false,
                                                })
                                                .collect()
                                        },
                                        busy: false,
                                        used_milli: 0,
                                    })
                                    .collect(),
                                driver: None,
                                group: None,
                            }
                        })
                        .collect();
                    let mut engine = Engine::new(
                        &Cluster {
                            nodes,
                            models: Vec::new(),
                            fixed_sharing: false,
                            demand: Vec::new(),
                        },
                        &catalog,
                    )
                    .map_err(|e| e.to_string())?;
                    for (i, pod) in gpu_pods.iter().enumerate() {
                        let p = profile_for(&h100, pod.milli);
                        let r = Request {
                            id: format!("p{i}"),
                            team: None,
                            priority: 0,
                            mig: p.map(|p| h100.profile(p).name.clone()),
                            gpus: if p.is_none() { Some(pod.num_gpu) } else { None },
                            gpu_milli: None,
                            cpu_milli: pod.cpu,
                            memory_mib: pod.mem,
                            models: Vec::new(),
                            needs_cuda: None,
                            gang: None,
                        };
                        d_all += pod.gpu_milli();
                        if let Ok(Ok(_)) = engine.place(&r) {
                            n_ok += 1;
                            d_ok += pod.gpu_milli();
                            a += share(p, pod);
                        }
                    }
                } else {
                    let how = if name == "first-fit" {
                        Baseline::FirstFit
                    } else {
                        Baseline::BestFit
                    };
                    let mut sim = Sim {
                        cpu: trace.nodes.iter().map(|n| n.cpu).collect(),
                        mem: trace.nodes.iter().map(|n| n.mem).collect(),
                        gpus: trace
                            .nodes
                            .iter()
                            .map(|n| vec![Some(Occupancy::default()); n.gpus as usize])
                            .collect(),
                    };
                    for pod in &gpu_pods {
                        let p = profile_for(&h100, pod.milli);
                        d_all += pod.gpu_milli();
                        if sim.place(&h100, &order, pod, p, how) {
                            n_ok += 1;
                            d_ok += pod.gpu_milli();
                            a += share(p, pod);
                        }
                    }
                }
                pods_ok += n_ok as f64 * 100.0 / gpu_pods.len() as f64;
                dem_ok += d_ok as f64 * 100.0 / d_all as f64;
                alloc += a as f64 * 100.0 / total;
            }
            let k = seeds.len() as f64;
            rows.push((name, pods_ok / k, dem_ok / k, alloc / k));
        }
        for (name, a, b, c) in rows {
            println!(
                "{name}, {}, {a:.2}, {b:.2}, {c:.2}",
                if reconf {
                    "with"
                } else {
                    "without (static all-balanced)"
                }
            );
        }
    }
    Ok(())
}
