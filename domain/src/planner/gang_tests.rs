//! Gangs in the planner: all-or-nothing, distinct nodes, group-local first, pending
//! reasons, priority order with single requests.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::mig::Catalog;

fn gpu(index: u32, mode: GpuMode, busy: bool) -> Gpu {
    Gpu {
        index,
        model: "H100-80GB".into(),
        mode,
        reconfigurable: true,
        instances: Vec::new(),
        busy,
        used_milli: 0,
    }
}

/// A node of `n` idle whole H100s in `group`.
fn node(name: &str, n: u32, group: Option<&str>) -> Node {
    Node {
        group: group.map(str::to_owned),
        ..Node::gpus_only(
            name,
            (0..n).map(|i| gpu(i, GpuMode::Whole, false)).collect(),
        )
    }
}

fn cluster(nodes: Vec<Node>) -> Cluster {
    Cluster {
        nodes,
        ..Cluster::default()
    }
}

fn gang(id: &str, nodes: u32, gpus: u32) -> Request {
    Request {
        gpus: Some(gpus),
        models: vec!["H100-80GB".into()],
        gang: Some(Gang { nodes, per_node: 1 }),
        ..Request::new(id)
    }
}

fn single(id: &str, gpus: u32) -> Request {
    Request {
        gpus: Some(gpus),
        models: vec!["H100-80GB".into()],
        ..Request::new(id)
    }
}

fn run(c: &Cluster, rs: &[Request]) -> Plan {
    plan(c, rs, &Catalog::builtin()).unwrap()
}

fn assignment<'p>(p: &'p Plan, id: &str) -> Option<&'p Assignment> {
    p.assignments.iter().find(|a| a.request == id)
}

fn reason<'p>(p: &'p Plan, id: &str) -> Option<&'p str> {
    p.pending
        .iter()
        .find(|x| x.request == id)
        .map(|x| x.reason.as_str())
}

fn member_nodes(a: &Assignment) -> Vec<&str> {
    a.members.iter().map(|m| m.node.as_str()).collect()
}

#[test]
fn two_by_eight_goes_to_two_distinct_nodes() {
    let c = cluster(vec![
        node("n1", 8, None),
        node("n2", 8, None),
        node("n3", 8, None),
    ]);
    let p = run(&c, &[gang("g", 2, 8)]);
    let a = assignment(&p, "g").unwrap();
    let nodes = member_nodes(a);
    assert_eq!(nodes.len(), 2);
    assert_ne!(nodes[0], nodes[1]);
    for m in &a.members {
        let mut gpus = m.gpus.clone();
        gpus.sort();
        gpus.dedup();
        assert_eq!(gpus.len(), 8, "{m:?}");
    }
    assert_eq!(a.node, nodes[0]);
    // The third node keeps its eight GPUs: a single 8-GPU request still fits.
    let p = run(&c, &[gang("g", 2, 8), single("s", 8)]);
    let s = assignment(&p, "s").unwrap();
    assert!(!nodes.contains(&s.node.as_str()), "{p:?}");
}

#[test]
fn a_gang_never_uses_one_node_twice() {
    // 2 × 4 GPUs would fit on n1 alone (8 free), but n2 has only 2.
    let c = cluster(vec![node("n1", 8, None), node("n2", 2, None)]);
    let p = run(&c, &[gang("g", 2, 4)]);
    assert!(p.assignments.is_empty(), "{p:?}");
    assert!(p.reconfigurations.is_empty());
    assert_eq!(
        reason(&p, "g"),
        Some("needs 2 nodes with 4 free H100-80GB; 1 has them now")
    );
    // With a second big node, it places.
    let c = cluster(vec![
        node("n1", 8, None),
        node("n2", 2, None),
        node("n3", 4, None),
    ]);
    let p = run(&c, &[gang("g", 2, 4)]);
    assert_eq!(member_nodes(assignment(&p, "g").unwrap()), ["n3", "n1"]);
}

#[test]
fn two_gangs_of_three_quarters_never_both_hold_part() {
    let c = cluster((1..=4).map(|i| node(&format!("n{i}"), 8, None)).collect());
    let p = run(&c, &[gang("a", 3, 8), gang("b", 3, 8)]);
    let a = assignment(&p, "a").unwrap();
    assert_eq!(a.members.len(), 3);
    assert!(assignment(&p, "b").is_none(), "{p:?}");
    assert_eq!(
        reason(&p, "b"),
        Some("needs 3 nodes with 8 free H100-80GB; 1 has them now")
    );
    // What the plan holds is exactly gang a's 24 GPUs: b holds nothing.
    let held: usize = p
        .assignments
        .iter()
        .flat_map(|a| &a.members)
        .map(|m| m.gpus.len())
        .sum();
    assert_eq!(held, 24);
    // The free node is still whole: an 8-GPU single takes it.
    let p = run(&c, &[gang("a", 3, 8), gang("b", 3, 8), single("s", 8)]);
    assert!(assignment(&p, "s").is_some(), "{p:?}");
}

#[test]
fn a_gang_stays_inside_one_group_when_it_can() {
    // Without groups the first two nodes (n1, n2) take it; with groups, r2 holds it.
    let plain = cluster(vec![
        node("n1", 8, None),
        node("n2", 8, None),
        node("n3", 8, None),
    ]);
    assert_eq!(
        member_nodes(assignment(&run(&plain, &[gang("g", 2, 8)]), "g").unwrap()),
        ["n1", "n2"]
    );
    let racks = cluster(vec![
        node("n1", 8, Some("r1")),
        node("n2", 8, Some("r2")),
        node("n3", 8, Some("r2")),
    ]);
    let p = run(&racks, &[gang("g", 2, 8)]);
    assert_eq!(member_nodes(assignment(&p, "g").unwrap()), ["n2", "n3"]);
}

#[test]
fn the_group_with_the_least_leftover_wins_else_the_gang_spans() {
    let c = cluster(vec![
        node("a1", 8, Some("big")),
        node("a2", 8, Some("big")),
        node("a3", 8, Some("big")),
        node("b1", 8, Some("small")),
        node("b2", 8, Some("small")),
    ]);
    let p = run(&c, &[gang("g", 2, 8)]);
    assert_eq!(member_nodes(assignment(&p, "g").unwrap()), ["b1", "b2"]);
    // No group has three nodes: the gang spans groups.
    let p = run(&c, &[gang("g", 4, 8)]);
    let a = assignment(&p, "g").unwrap();
    let mut nodes = member_nodes(a);
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 4);
    assert!(nodes.iter().any(|n| n.starts_with('a')) && nodes.iter().any(|n| n.starts_with('b')));
}

#[test]
fn a_mig_gang_takes_its_slices_on_one_node_per_member() {
    let mig_node = |name: &str| Node::gpus_only(name, vec![gpu(0, GpuMode::Mig, false)]);
    let c = cluster(vec![mig_node("m1"), mig_node("m2"), mig_node("m3")]);
    let ask = |id: &str, nodes: u32, per_node: u32| Request {
        mig: Some("3g.40gb".into()),
        models: vec!["H100-80GB".into()],
        gang: Some(Gang { nodes, per_node }),
        ..Request::new(id)
    };
    let p = run(&c, &[ask("g", 3, 2)]);
    let a = assignment(&p, "g").unwrap();
    assert_eq!(member_nodes(a), ["m1", "m2", "m3"]);
    for m in &a.members {
        assert!(m.gpus.is_empty());
        assert_eq!(m.slices.len(), 2, "{m:?}");
        let mut starts: Vec<u8> = m.slices.iter().map(|s| s.start).collect();
        starts.sort();
        assert_eq!(starts, [0, 4]);
        assert!(m.slices.iter().all(|s| s.profile == "3g.40gb"));
    }
    assert_eq!(p.reconfigurations.len(), 3);
    // Three 3g.40gb do not fit on one H100: the gang waits and changes nothing.
    let p = run(&c, &[ask("g", 2, 3)]);
    assert!(
        p.assignments.is_empty() && p.reconfigurations.is_empty(),
        "{p:?}"
    );
    assert_eq!(
        reason(&p, "g"),
        Some("needs 2 nodes with 3 × 3g.40gb free (H100-80GB); 0 have them now")
    );
}

#[test]
fn a_failed_gang_leaves_the_engine_as_it_was() {
    // Reconfigurable MIG GPUs: a partial gang would have converted some.
    let c = cluster(vec![
        Node::gpus_only(
            "m1",
            vec![gpu(0, GpuMode::Mig, false), gpu(1, GpuMode::Shared, false)],
        ),
        Node::gpus_only("m2", vec![gpu(0, GpuMode::Whole, true)]),
    ]);
    let g = gang("g", 2, 1);
    let mut engine = Engine::new(&c, &Catalog::builtin()).unwrap();
    let before = engine.clone();
    let why = engine.place_gang(&g).unwrap().unwrap_err();
    assert_eq!(why, "needs 2 nodes with 1 free H100-80GB; 1 has them now");
    assert!(engine == before);
    assert_eq!(engine.snapshot(), before.snapshot());
    // A following single request places exactly as it would without the gang.
    let s = Request {
        mig: Some("1g.10gb".into()),
        ..Request::new("s")
    };
    let with = run(&c, &[g.clone(), s.clone()]);
    let without = run(&c, std::slice::from_ref(&s));
    assert_eq!(with.assignments, without.assignments);
    assert_eq!(with.reconfigurations, without.reconfigurations);
    assert!(reason(&with, "g").is_some());
    // Placed, then released: the engine is as before too.
    let c2 = cluster(vec![node("n1", 2, None), node("n2", 2, None)]);
    let mut engine = Engine::new(&c2, &Catalog::builtin()).unwrap();
    let before = engine.clone();
    let placed = engine.place_gang(&gang("g", 2, 2)).unwrap().unwrap();
    assert_eq!(placed.members.len(), 2);
    assert!(engine != before);
    engine.release_gang(placed);
    assert!(engine == before);
}

#[test]
fn gangs_take_their_turn_in_priority_order() {
    let c = cluster(vec![node("n1", 8, None), node("n2", 8, None)]);
    // A single of higher priority takes a node first: the gang waits.
    let s = Request {
        priority: 10,
        ..single("s", 4)
    };
    let p = run(&c, &[gang("g", 2, 8), s.clone()]);
    assert!(assignment(&p, "s").is_some());
    assert!(assignment(&p, "g").is_none(), "{p:?}");
    // The gang of higher priority goes first; the single then waits.
    let g = Request {
        priority: 10,
        ..gang("g", 2, 8)
    };
    let p = run(&c, &[g, single("s", 4)]);
    assert_eq!(assignment(&p, "g").unwrap().members.len(), 2);
    assert!(reason(&p, "s").is_some());
    // Same priority: the gang is one larger ask (16 GPUs), placed before the 8-GPU single.
    let p = run(&c, &[single("s", 8), gang("g", 2, 8)]);
    assert!(assignment(&p, "g").is_some(), "{p:?}");
    assert!(assignment(&p, "s").is_none());
}

#[test]
fn gang_input_is_checked_and_old_json_still_reads() {
    let c = cluster(vec![node("n1", 8, None)]);
    let err = plan(&c, &[gang("g", 0, 8)], &Catalog::builtin()).unwrap_err();
    assert_eq!(err.path, "[0].gang.nodes");
    let share = Request {
        gpu_milli: Some(500),
        gang: Some(Gang {
            nodes: 2,
            per_node: 1,
        }),
        ..Request::new("s")
    };
    assert_eq!(
        plan(&c, &[share], &Catalog::builtin()).unwrap_err().path,
        "[0].gang"
    );
    let wide = Request {
        gang: Some(Gang {
            nodes: 2,
            per_node: 2,
        }),
        ..single("w", 4)
    };
    assert_eq!(
        plan(&c, &[wide], &Catalog::builtin()).unwrap_err().path,
        "[0].gang.per_node"
    );
    // `tessera plan` JSON: gang and group are optional; output lists members.
    let cluster_json = r#"{"nodes":[
        {"name":"a","cpu_milli":1000,"memory_mib":1000,"group":"r1","gpus":[
          {"index":0,"model":"H100-80GB","mode":"whole"}]},
        {"name":"b","cpu_milli":1000,"memory_mib":1000,"gpus":[
          {"index":0,"model":"H100-80GB","mode":"whole"}]}]}"#;
    let requests_json = r#"[{"id":"g","gpus":1,"gang":{"nodes":2}},{"id":"s","gpus":1}]"#;
    let out = cli::run_plan(cluster_json, "c.json", requests_json, "r.json").unwrap();
    let planned: Plan = serde_json::from_str(&out).unwrap();
    let a = assignment(&planned, "g").unwrap();
    assert_eq!(member_nodes(a), ["a", "b"]);
    assert!(out.contains("\"members\""));
    assert!(reason(&planned, "s").is_some());
    let bad = r#"[{"id":"g","gpus":1,"gang":{"nodes":2,"racks":1}}]"#;
    assert!(cli::run_plan(cluster_json, "c.json", bad, "r.json").is_err());
}
