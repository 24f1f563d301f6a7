//! `cargo run --release -p tessera-bench --bin openb -- [trace ...]`
//! Runs BestFit and Tessera's fragmentation policy over seeds 42–51 on each
//! openb trace and writes `bench/results/openb_alloc_by_policy.csv`.

use std::fmt::Write as _;
use std::time::Instant;

use tessera_bench::{data, openb};
use tessera_domain::planner::fractional::Policy;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let traces: Vec<String> = if args.is_empty() {
        [
            "default",
            "cpu050",
            "gpushare40",
            "gpushare80",
            "gpuspec10",
            "gpuspec20",
            "multigpu20",
            "multigpu30",
        ]
        .iter()
        .map(|t| format!("openb_pod_list_{t}"))
        .collect()
    } else {
        args.iter().map(|t| format!("openb_pod_list_{t}")).collect()
    };
    let seeds: Vec<u64> = std::env::var("SEEDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or((42..=51).collect(), |n| (42..42 + n).collect());
    let published = openb::published(&data("fgd_published_alloc_by_policy.csv"))?;
    let mut csv =
        String::from("workload,sc_policy,n_seeds,arrived_pct,alloc_pct_mean,alloc_pct_sd\n");
    for trace_name in &traces {
        let trace = openb::load(
            &data("openb_node_list_gpu_node.csv"),
            &data(&format!("{trace_name}.csv")),
        )?;
        let workload = trace.workload();
        let policies = [
            ("05-BestFit", Policy::BestFit),
            ("Tessera", Policy::Fragmentation(workload)),
        ];
        let mut ours = Vec::new();
        for (name, policy) in &policies {
            let t0 = Instant::now();
            let curves: Vec<Vec<f64>> = seeds
                .iter()
                .map(|&s| openb::run(&trace, policy, s))
                .collect();
            let n = curves.len() as f64;
            let mut mean = vec![0.0; 131];
            for x in 0..=130 {
                let m = curves.iter().map(|c| c[x]).sum::<f64>() / n;
                let sd = (curves.iter().map(|c| (c[x] - m).powi(2)).sum::<f64>()
                    / (n - 1.0).max(1.0))
                .sqrt();
                mean[x] = m;
                let _ = writeln!(
                    csv,
                    "{trace_name},{name},{},{x},{m:.3},{sd:.3}",
                    curves.len()
                );
            }
            eprintln!("{trace_name} {name}: {:.1}s", t0.elapsed().as_secs_f64());
            ours.push((*name, mean));
        }
        let pubv = |p: &str, x: u32| {
            published
                .get(&(trace_name.clone(), p.to_owned()))
                .and_then(|c| c.get(&x))
                .copied()
                .unwrap_or(f64::NAN)
        };
        for x in [100u32, 130] {
            println!(
                "{trace_name} @{x}%: BestFit(ours) {:.2}  Tessera {:.2}  | published BestFit {:.2}  FGD {:.2}  DotProd {:.2}  | Tessera unallocated {:.2} vs FGD {:.2} ({:.2}x); BestFit gap {:+.2}",
                ours[0].1[x as usize],
                ours[1].1[x as usize],
                pubv("05-BestFit", x),
                pubv("06-FGD", x),
                pubv("02-DotProd", x),
                100.0 - ours[1].1[x as usize],
                100.0 - pubv("06-FGD", x),
                (100.0 - ours[1].1[x as usize]) / (100.0 - pubv("06-FGD", x)),
                ours[0].1[x as usize] - pubv("05-BestFit", x),
            );
        }
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    std::fs::write(out.join("openb_alloc_by_policy.csv"), csv).map_err(|e| e.to_string())?;
    Ok(())
}
