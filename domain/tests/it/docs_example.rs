//! The worked example of docs/planner.md, run for real: the plan printed
//! there must be what `run_plan` returns for docs/examples/*.json.

use tessera_domain::planner::cli::run_plan;

const CLUSTER: &str = include_str!("../../../docs/examples/cluster.json");
const REQUESTS: &str = include_str!("../../../docs/examples/requests.json");
const PLAN: &str = include_str!("../../../docs/examples/plan.json");
const DOC: &str = include_str!("../../../docs/planner.md");

#[test]
fn the_documented_example_plan_is_what_the_planner_prints() {
    let plan = run_plan(CLUSTER, "cluster.json", REQUESTS, "requests.json").unwrap();
    if std::env::var_os("UPDATE_EXAMPLE").is_some() {
        println!("{plan}");
    }
    assert_eq!(plan.trim(), PLAN.trim());
}

#[test]
fn the_doc_shows_the_example_files_verbatim() {
    for (name, text) in [
        ("cluster.json", CLUSTER),
        ("requests.json", REQUESTS),
        ("plan.json", PLAN),
    ] {
        assert!(
            DOC.contains(text.trim()),
            "docs/planner.md does not show docs/examples/{name} verbatim"
        );
    }
}
