//! `/metrics` as the monitoring in `deploy/monitoring/` reads it: per-GPU and per-MIG
//! telemetry from a real simulated agent under dcgm-exporter's names and labels, and every
//! metric the alerting rules and the Grafana dashboard query is really exported.

use crate::allocations::{request, set_quota, team, wait_for_state};
use crate::billing::put_budget;
use crate::on_both_databases;
use crate::support::sim_agent;
use crate::support::{AdminClient, Db, TestApp};
use reqwest::Method;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;
use tessera_server::config::Secret;

on_both_databases!(
    dcgm_series_and_every_metric_the_rules_and_dashboard_use_are_exported,
    team_data_needs_the_scrape_token_and_methods_cannot_grow_series
);

/// What the Prometheus in `deploy/monitoring/` sends (`authorization: credentials`).
const SCRAPE_TOKEN: &str = "scrape-token-for-tests-0123456789";

async fn with_scrape_token(db: Db) -> AdminClient {
    let app = TestApp::spawn_with(db, |c| {
        c.metrics_token = Some(Secret::new(SCRAPE_TOKEN));
    })
    .await;
    AdminClient::with_app(app).await
}

/// A soft monthly budget of 10.00, so the team has budget series.
async fn set_budget(a: &AdminClient, team: &str) {
    let (s, v) = put_budget(a, team, json!({"monthly_minor": 1000, "hard": false})).await;
    assert_eq!(s, 200, "{v}");
}

async fn team_data_needs_the_scrape_token_and_methods_cannot_grow_series(db: Db) {
    let a = with_scrape_token(db).await;
    let name = format!("spendy{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let t = team(&a, &name).await;
    set_budget(&a, &t.id).await;
    // The scraper sees the team's series; anyone else, before and after, does not.
    let c = reqwest::Client::new();
    let anonymous = || async {
        let r = c.get(a.app.url("/metrics")).send().await.expect("scrape");
        assert_eq!(r.status(), 200);
        r.text().await.expect("body")
    };
    let before = anonymous().await;
    let body = scrape(&a).await;
    assert!(
        body.contains(&name),
        "the scraper sees team series:\n{body}"
    );
    let after = anonymous().await;
    for b in [&before, &after] {
        assert!(!b.contains(&name), "a team name leaked:\n{b}");
        assert!(!b.contains("tessera_team_"), "team series leaked:\n{b}");
        assert!(b.contains("tessera_http_requests_total"), "{b}");
    }
    // A wrong token is refused outright; a signed-in admin's cookie is no scrape token.
    let r = c
        .get(a.app.url("/metrics"))
        .bearer_auth("not-the-token-at-all")
        .send()
        .await
        .expect("scrape");
    assert_eq!(r.status(), 401);
    // Made-up methods all count as OTHER: no new series per method.
    for i in 0..20 {
        let m = Method::from_bytes(format!("FUZZ{i}").as_bytes()).expect("method");
        let _ = c.request(m, a.app.url("/healthz")).send().await;
    }
    let body = anonymous().await;
    assert!(!body.contains("FUZZ"), "{body}");
    assert!(body.contains(r#"method="OTHER""#), "{body}");
}

async fn dcgm_series_and_every_metric_the_rules_and_dashboard_use_are_exported(db: Db) {
    let a = with_scrape_token(db).await;
    // Unique per backend: the recorder is shared by every app in this test process.
    let host = format!("mon-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let t = team(&a, &format!("mon{}", &host[4..])).await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    set_budget(&a, &t.id).await;
    let (s, jt) = a
        .post("/api/v1/join-tokens", json!({"note": "monitoring"}))
        .await;
    assert_eq!(s, 201, "{jt}");
    let state = tempfile::tempdir().expect("tempdir");
    let _agent = sim_agent(&a.app.base, "H100-80GB,A100-SXM4-40GB", &host, state.path())
        .arg("--join-token")
        .arg(jt["secret"].as_str().expect("secret"))
        .args(["--manage-mig", "--telemetry-interval-s", "1"])
        .spawn()
        .expect("start tessera-agent");
    // A slice on the H100: the scheduler enables MIG and places it (a placement wait is
    // observed), and the H100's samples then carry a MIG device.
    let (s, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    let active = wait_for_state(&a, &id, "active").await;
    let h100 = active["devices"][0]["gpu_uuid"]
        .as_str()
        .expect("GPU UUID")
        .to_owned();

    // Gauges are only set when /metrics is scraped, and one set stays for a minute: so
    // scrape only once the node reports the slice in its inventory and its newest sample
    // shows the H100 with MIG on (no whole-GPU utilization) and the A100 without.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mig_devices = loop {
        if let Some(n) = settled(&a, &host, &h100).await {
            break n;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "telemetry with the MIG device never arrived"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let body = scrape(&a).await;
    let series = parse(&body);
    let of = |name: &str| -> Vec<&BTreeMap<String, String>> {
        series
            .iter()
            .filter(|(n, l)| n == name && l.get("Hostname") == Some(&host))
            .map(|(_, l)| l)
            .collect()
    };

    // Both GPUs report temperature, power and memory, labelled as dcgm-exporter does.
    let temps = of("DCGM_FI_DEV_GPU_TEMP");
    assert_eq!(temps.len(), 2, "{body}");
    let mut models: Vec<&str> = temps.iter().map(|l| l["modelName"].as_str()).collect();
    models.sort();
    assert!(models[0].contains("A100"), "{models:?}");
    assert!(models[1].contains("H100"), "{models:?}");
    for l in &temps {
        let gpu = &l["gpu"];
        assert!(gpu.parse::<u32>().is_ok(), "{l:?}");
        assert_eq!(l["device"], format!("nvidia{gpu}"));
        assert!(l["UUID"].starts_with("GPU-"), "{l:?}");
        assert!(!l.contains_key("GPU_I_ID"), "{l:?}");
    }
    assert_eq!(of("DCGM_FI_DEV_POWER_USAGE").len(), 2, "{body}");
    let whole_fb: Vec<_> = of("DCGM_FI_DEV_FB_USED")
        .into_iter()
        .filter(|l| !l.contains_key("GPU_I_ID"))
        .collect();
    assert_eq!(whole_fb.len(), 2, "{body}");
    assert_eq!(
        of("DCGM_FI_DEV_FB_FREE").len(),
        2 + mig_devices,
        "per GPU and per MIG device: {body}"
    );
    // Utilization only for the A100: with MIG on, the driver gives none for the H100,
    // and none is made up.
    let util = of("DCGM_FI_DEV_GPU_UTIL");
    assert_eq!(util.len(), 1, "{body}");
    assert!(util[0]["modelName"].contains("A100"), "{util:?}");
    assert_ne!(util[0]["UUID"], h100);
    // MIG devices: the parent GPU's labels plus the GPU instance's profile and id.
    let mig = of("DCGM_FI_PROF_GR_ENGINE_ACTIVE");
    assert_eq!(mig.len(), mig_devices, "{body}");
    for l in &mig {
        assert_eq!(l["UUID"], h100);
        assert!(l["modelName"].contains("H100"), "{l:?}");
        assert!(l["GPU_I_ID"].parse::<u32>().is_ok(), "{l:?}");
    }
    assert!(
        mig.iter().any(|l| l["GPU_I_PROFILE"] == "1g.10gb"),
        "{mig:?}"
    );
    assert_eq!(
        of("DCGM_FI_DEV_FB_USED")
            .iter()
            .filter(|l| l.contains_key("GPU_I_ID"))
            .count(),
        mig_devices
    );
    for line in body
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_PROF_GR_ENGINE_ACTIVE{") && l.contains(&host))
    {
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("value");
        assert!((0.0..=1.0).contains(&value), "{line}");
    }
    // Per node: heartbeat age and the agent's drop counter.
    let node = |name: &str| {
        series
            .iter()
            .filter(|(n, l)| n == name && l.get("hostname") == Some(&host))
            .count()
    };
    assert_eq!(node("tessera_node_last_seen_seconds"), 1, "{body}");
    assert_eq!(node("tessera_telemetry_samples_dropped_total"), 1, "{body}");

    // Every metric a rule or a dashboard panel queries is exported right now.
    let exported: BTreeSet<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring");
    let mut queried = BTreeSet::new();
    let rules = std::fs::read_to_string(root.join("tessera-rules.yml")).expect("rules");
    let mut exprs = 0;
    for line in rules.lines() {
        if let Some(expr) = line.trim().strip_prefix("expr:") {
            exprs += 1;
            queried.extend(metric_names(expr));
        }
    }
    assert_eq!(exprs, 7, "one expr per alert");
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("grafana-dashboard.json")).expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    assert_eq!(dash["schemaVersion"], 39);
    let panels = dash["panels"].as_array().expect("panels");
    let mut graphs = 0;
    for p in panels {
        let title = p["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "a panel without a title: {p}");
        if p["type"] == "row" {
            continue;
        }
        graphs += 1;
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        assert!(!targets.is_empty(), "panel {title} has no query");
        for t in targets {
            let expr = t["expr"].as_str().expect("a PromQL expr");
            assert!(t["datasource"]["uid"] == "${DS_PROMETHEUS}", "{title}");
            queried.extend(metric_names(expr));
        }
    }
    assert!(graphs >= 10, "{graphs} panels");
    for v in dash["templating"]["list"].as_array().expect("variables") {
        if let Some(q) = v["query"]["query"].as_str() {
            // label_values(metric, label): only the first argument is a metric.
            let q = q
                .strip_prefix("label_values(")
                .and_then(|r| r.split_once(','))
                .map_or(q, |(m, _)| m);
            queried.extend(metric_names(q));
        }
    }
    for must in [
        "DCGM_FI_DEV_GPU_UTIL",
        "tessera_team_budget_used_ratio",
        "tessera_allocation_placement_wait_seconds_bucket",
        "tessera_http_request_duration_seconds_bucket",
    ] {
        assert!(queried.contains(must), "{must} not found in {queried:?}");
    }
    let missing: Vec<_> = queried
        .iter()
        .filter(|m| !exported.contains(m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "queried but not exported: {missing:?}\n{body}"
    );
}

/// The number of MIG devices in the H100's newest sample, once the node's inventory
/// shows the slice, and that sample has MIG on and the A100 whole.
async fn settled(a: &AdminClient, host: &str, h100: &str) -> Option<usize> {
    let (_, nodes) = a.call(Method::GET, "/api/v1/nodes", None).await;
    let node = nodes["items"]
        .as_array()?
        .iter()
        .find(|n| n["hostname"] == host)?;
    let gpu = node["gpus"]
        .as_array()?
        .iter()
        .find(|g| g["uuid"] == h100)?;
    let instances = gpu["instances"].as_array()?;
    if !instances.iter().any(|i| i["profile"] == "1g.10gb") {
        return None;
    }
    let path = format!("/api/v1/nodes/{}/telemetry?limit=1", node["id"].as_str()?);
    let (_, t) = a.call(Method::GET, &path, None).await;
    let latest = |want: &dyn Fn(&Value) -> bool| {
        t["gpus"]
            .as_array()?
            .iter()
            .find(|s| want(&s["gpu_uuid"]))?["points"]
            .as_array()?
            .last()
            .cloned()
    };
    let h = latest(&|u| u == h100)?;
    let other = latest(&|u| u != h100)?;
    let n = usize::try_from(h["mig_devices"].as_u64()?).ok()?;
    (n >= instances.len() && h["utilization_pct"].is_null() && other["utilization_pct"].is_u64())
        .then_some(n)
}

async fn scrape(a: &AdminClient) -> String {
    let r = reqwest::Client::new()
        .get(a.app.url("/metrics"))
        .bearer_auth(SCRAPE_TOKEN)
        .send()
        .await
        .expect("scrape");
    assert!(r.status().is_success());
    r.text().await.expect("body")
}

/// `(name, labels)` of every sample line of the Prometheus text format.
fn parse(body: &str) -> Vec<(String, BTreeMap<String, String>)> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let name = line[..name_end].to_owned();
            let mut labels = BTreeMap::new();
            if line[name_end..].starts_with('{') {
                let inner = &line[name_end + 1..line.rfind('}').expect("closing brace")];
                let mut rest = inner;
                while let Some(eq) = rest.find("=\"") {
                    let key = rest[..eq].trim_start_matches(',').to_owned();
                    let after = &rest[eq + 2..];
                    let mut value = String::new();
                    let mut chars = after.char_indices();
                    let mut end = after.len();
                    while let Some((i, c)) = chars.next() {
                        match c {
                            '\\' => {
                                if let Some((_, e)) = chars.next() {
                                    value.push(if e == 'n' { '\n' } else { e });
                                }
                            }
                            '"' => {
                                end = i + 1;
                                break;
                            }
                            c => value.push(c),
                        }
                    }
                    labels.insert(key, value);
                    rest = &after[end..];
                }
            }
            (name, labels)
        })
        .collect()
}

/// The metric names a PromQL expression selects: label matchers, strings, ranges and
/// `by (…)`-style label lists are cut out first, then every identifier that is not a
/// function call, a keyword or a Grafana variable is a metric name.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: [&str; 14] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "inf",
        "nan",
        "atan2",
    ];
    // Drop "…" strings, {…} matchers and […] ranges.
    let mut flat = String::new();
    let mut skip_until: Option<char> = None;
    for c in expr.chars() {
        match (skip_until, c) {
            (Some(end), c) if c == end => skip_until = None,
            (Some(_), _) => {}
            (None, '"') => skip_until = Some('"'),
            (None, '{') => skip_until = Some('}'),
            (None, '[') => skip_until = Some(']'),
            (None, c) => flat.push(c),
        }
    }
    // Drop the label lists of by/without/on/ignoring/group_left/group_right.
    let mut out = String::new();
    let mut rest = flat.as_str();
    'scan: while !rest.is_empty() {
        for kw in KEYWORDS[..6].iter() {
            if let Some(after) = rest.strip_prefix(kw)
                && !out.ends_with(|c: char| c.is_alphanumeric() || c == '_')
                && after.trim_start().starts_with('(')
            {
                let open = after.find('(').expect("paren");
                let close = after[open..]
                    .find(')')
                    .map_or(after.len(), |i| open + i + 1);
                out.push(' ');
                rest = &after[close..];
                continue 'scan;
            }
        }
        let c = rest.chars().next().expect("char");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    let mut names = BTreeSet::new();
    let bytes: Vec<char> = out.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let starts = c.is_ascii_alphabetic() || c == '_' || c == ':';
        let prev = i.checked_sub(1).map(|p| bytes[p]);
        let glued =
            prev.is_some_and(|p| p.is_ascii_alphanumeric() || p == '_' || p == '$' || p == '.');
        if starts && !glued {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == '_' || bytes[i] == ':')
            {
                i += 1;
            }
            let ident: String = bytes[start..i].iter().collect();
            let call = bytes[i..].iter().find(|c| !c.is_whitespace()) == Some(&'(');
            if !call && !KEYWORDS.contains(&ident.to_lowercase().as_str()) {
                names.insert(ident);
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn metric_names_are_read_out_of_promql() {
    let names = |e: &str| metric_names(e).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names(
            r#"histogram_quantile(0.99, sum by (le, route) (rate(x_bucket{a="b c"}[$__rate_interval])))"#
        ),
        ["x_bucket"]
    );
    assert_eq!(
        names("increase(tessera_telemetry_samples_dropped_total[10m]) > 0"),
        ["tessera_telemetry_samples_dropped_total"]
    );
    assert_eq!(
        names("a / on (x) group_left (y) b and c offset 5m > 1e3"),
        ["a", "b", "c"]
    );
    assert_eq!(
        names(r#"DCGM_FI_DEV_FB_USED{Hostname=~"$Hostname",GPU_I_ID=""}"#),
        ["DCGM_FI_DEV_FB_USED"]
    );
}
