//! A request that needs a CUDA version goes only to nodes whose driver supports it, and
//! when it waits for that reason, the reason says so.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::image::CudaVersion;

fn cuda(v: &str) -> CudaVersion {
    CudaVersion::parse(v).unwrap()
}

fn driver(version: &str, v: &str) -> Option<DriverInfo> {
    Some(DriverInfo {
        version: version.into(),
        cuda: cuda(v),
    })
}

/// A node of idle H100s: whole (`busy` as given), MIG (empty, reconfigurable) or shared.
fn node(name: &str, mode: GpuMode, busy: bool, driver: Option<DriverInfo>) -> Node {
    let gpu = Gpu {
        index: 0,
        model: "H100-80GB".into(),
        mode,
        reconfigurable: mode == GpuMode::Mig,
        instances: Vec::new(),
        busy,
        used_milli: 0,
    };
    Node {
        driver,
        ..Node::gpus_only(name, vec![gpu])
    }
}

fn cluster(nodes: Vec<Node>) -> Cluster {
    Cluster {
        nodes,
        fixed_sharing: true,
        ..Cluster::default()
    }
}

fn whole(id: &str, need: Option<&str>) -> Request {
    Request {
        gpus: Some(1),
        models: vec!["H100-80GB".into()],
        needs_cuda: need.map(cuda),
        ..Request::new(id)
    }
}

fn run(c: &Cluster, rs: &[Request]) -> Plan {
    plan(c, rs, &Catalog::builtin()).unwrap()
}

fn placed_on<'p>(p: &'p Plan, id: &str) -> Option<&'p str> {
    p.assignments
        .iter()
        .find(|a| a.request == id)
        .map(|a| a.node.as_str())
}

fn reason<'p>(p: &'p Plan, id: &str) -> &'p str {
    &p.pending.iter().find(|w| w.request == id).unwrap().reason
}

const OLD: &str = "535.104.05";

#[test]
fn an_older_driver_keeps_the_request_waiting_with_the_reason() {
    let c = cluster(vec![node(
        "old",
        GpuMode::Whole,
        false,
        driver(OLD, "12.2"),
    )]);
    let p = run(&c, &[whole("a", Some("12.4"))]);
    assert!(p.assignments.is_empty(), "{p:?}");
    assert_eq!(
        reason(&p, "a"),
        "needs CUDA ≥ 12.4; nodes with free H100-80GB run driver 535.104.05 (CUDA 12.2)"
    );
}

#[test]
fn a_request_without_a_need_goes_to_the_old_node() {
    let c = cluster(vec![node(
        "old",
        GpuMode::Whole,
        false,
        driver(OLD, "12.2"),
    )]);
    let p = run(&c, &[whole("a", None)]);
    assert_eq!(placed_on(&p, "a"), Some("old"));
}

#[test]
fn a_new_enough_driver_takes_it_even_after_an_old_node() {
    let c = cluster(vec![
        node("old", GpuMode::Whole, false, driver(OLD, "12.2")),
        node("new", GpuMode::Whole, false, driver("550.54.15", "12.4")),
    ]);
    let p = run(&c, &[whole("a", Some("12.4")), whole("b", None)]);
    assert_eq!(placed_on(&p, "a"), Some("new"));
    assert_eq!(placed_on(&p, "b"), Some("old"));
}

#[test]
fn the_need_is_at_least_not_exactly() {
    let c = cluster(vec![node(
        "n",
        GpuMode::Whole,
        false,
        driver("580.65.06", "13.0"),
    )]);
    for need in ["12.4", "12.9", "13.0"] {
        let p = run(&c, &[whole("a", Some(need))]);
        assert_eq!(placed_on(&p, "a"), Some("n"), "needs {need}");
    }
    let p = run(&c, &[whole("a", Some("13.1"))]);
    assert_eq!(placed_on(&p, "a"), None);
}

#[test]
fn a_node_that_reports_no_driver_is_not_chosen() {
    let c = cluster(vec![node("quiet", GpuMode::Whole, false, None)]);
    let p = run(&c, &[whole("a", Some("12.4")), whole("b", None)]);
    assert_eq!(placed_on(&p, "b"), Some("quiet"));
    let p = run(&c, &[whole("a", Some("12.4"))]);
    assert_eq!(
        reason(&p, "a"),
        "needs CUDA ≥ 12.4; nodes with free H100-80GB report no driver version, so none is \
         known to run it"
    );
    let c = cluster(vec![
        node("quiet", GpuMode::Whole, false, None),
        node("old", GpuMode::Whole, false, driver(OLD, "12.2")),
    ]);
    let p = run(&c, &[whole("a", Some("12.4"))]);
    assert_eq!(
        reason(&p, "a"),
        "needs CUDA ≥ 12.4; nodes with free H100-80GB run driver 535.104.05 (CUDA 12.2), or \
         report no driver"
    );
}

#[test]
fn mig_and_share_asks_follow_the_driver_too() {
    let mig = |id: &str| Request {
        mig: Some("1g.10gb".into()),
        models: vec!["H100-80GB".into()],
        needs_cuda: Some(cuda("12.4")),
        ..Request::new(id)
    };
    let share = |id: &str| Request {
        gpu_milli: Some(250),
        models: vec!["H100-80GB".into()],
        needs_cuda: Some(cuda("12.4")),
        ..Request::new(id)
    };
    for mode in [GpuMode::Mig, GpuMode::Shared] {
        let ask = if mode == GpuMode::Mig {
            mig("a")
        } else {
            share("a")
        };
        let old = node("old", mode, false, driver(OLD, "12.2"));
        let p = run(&cluster(vec![old.clone()]), std::slice::from_ref(&ask));
        assert!(p.assignments.is_empty(), "{mode:?}: {p:?}");
        assert!(p.reconfigurations.is_empty(), "{mode:?}: {p:?}");
        assert_eq!(
            reason(&p, "a"),
            "needs CUDA ≥ 12.4; nodes with free H100-80GB run driver 535.104.05 (CUDA 12.2)",
            "{mode:?}"
        );
        let new = node("new", mode, false, driver("550.54.15", "12.4"));
        let p = run(&cluster(vec![old, new]), &[ask]);
        assert_eq!(placed_on(&p, "a"), Some("new"), "{mode:?}");
    }
}

#[test]
fn a_full_new_node_and_a_free_old_one_say_the_driver() {
    let c = cluster(vec![
        node("new", GpuMode::Whole, true, driver("550.54.15", "12.4")),
        node("old", GpuMode::Whole, false, driver(OLD, "12.2")),
    ]);
    let p = run(&c, &[whole("a", Some("12.4"))]);
    assert_eq!(
        reason(&p, "a"),
        "needs CUDA ≥ 12.4; nodes with free H100-80GB run driver 535.104.05 (CUDA 12.2)"
    );
    // With no room anywhere the reason is the usual one.
    let c = cluster(vec![
        node("new", GpuMode::Whole, true, driver("550.54.15", "12.4")),
        node("old", GpuMode::Whole, true, driver(OLD, "12.2")),
    ]);
    let p = run(&c, &[whole("a", Some("12.4"))]);
    assert!(
        reason(&p, "a").starts_with("needs 1 GPU of one model"),
        "{p:?}"
    );
}

#[test]
fn the_json_input_carries_driver_and_need() {
    let c: Cluster = serde_json::from_str(
        r#"{"nodes":[{"name":"n","cpu_milli":1,"memory_mib":1,
            "driver":{"version":"535.104.05","cuda":"12.2"},
            "gpus":[{"index":0,"model":"H100-80GB","mode":"whole"}]}]}"#,
    )
    .unwrap();
    assert_eq!(c.nodes[0].driver, driver(OLD, "12.2"));
    let r: Vec<Request> =
        serde_json::from_str(r#"[{"id":"a","gpus":1,"needs_cuda":"12.4"}]"#).unwrap();
    assert_eq!(r[0].needs_cuda, Some(cuda("12.4")));
    assert!(serde_json::from_str::<Vec<Request>>(r#"[{"id":"a","needs_cuda":"x"}]"#).is_err());
    let p = run(&c, &r);
    assert!(p.assignments.is_empty(), "{p:?}");
}
