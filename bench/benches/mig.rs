//! Criterion benches: the layout validator and a single-GPU layout search.
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use tessera_domain::mig::{Catalog, Instance};
use tessera_domain::planner::{Cluster, Engine, Gpu, GpuMode, Node, Request};

fn validator(c: &mut Criterion) {
    let catalog = Catalog::builtin();
    let h100 = catalog.get("H100-80GB").expect("built-in");
    let layout: Vec<Instance> = [
        ("2g.20gb", 0),
        ("1g.10gb", 2),
        ("1g.10gb", 3),
        ("2g.20gb", 4),
        ("1g.10gb", 6),
    ]
    .iter()
    .map(|(p, s)| Instance {
        profile: (*p).to_owned(),
        start: *s,
    })
    .collect();
    c.bench_function("validate 5-instance H100 layout", |b| {
        b.iter(|| h100.validate(black_box(&layout)))
    });
    let all: Vec<_> = h100.indexed().map(|(i, _)| i).collect();
    c.bench_function("enumerate maximal layouts, all 7 H100 profiles", |b| {
        b.iter(|| h100.maximal_layouts(black_box(&all)).len())
    });
}

fn single_gpu_search(c: &mut Criterion) {
    let catalog = Catalog::builtin();
    let cluster = Cluster {
        nodes: vec![Node::gpus_only(
            "n",
            vec![Gpu {
                index: 0,
                model: "H100-80GB".into(),
                mode: GpuMode::Mig,
                reconfigurable: true,
                instances: Vec::new(),
                busy: false,
                used_milli: 0,
            }],
        )],
        models: Vec::new(),
        fixed_sharing: false,
        demand: Vec::new(),
    };
    let engine = Engine::new(&cluster, &catalog).expect("valid");
    let asks: Vec<Request> = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut r = Request::new(format!("r{i}"));
            r.mig = Some((*p).to_owned());
            r
        })
        .collect();
    c.bench_function("place 4 MIG instances on one H100, then undo", |b| {
        b.iter(|| {
            let mut e = engine.clone();
            let ds: Vec<_> = asks
                .iter()
                .filter_map(|r| e.place(r).ok().and_then(Result::ok))
                .collect();
            for d in ds.into_iter().rev() {
                e.release(d);
            }
            e
        })
    });
}

criterion_group!(benches, validator, single_gpu_search);
criterion_main!(benches);
