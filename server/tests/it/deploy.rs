//! The deployment files. `deploy/systemd/`: units and environment templates that fit the
//! binaries (at the end). The Kubernetes manifests under `deploy/kubernetes/`: every file
//! the kustomization lists parses into its typed Kubernetes object (k8s-openapi), and they
//! fit the code: images, probes on `/healthz` and `/readyz`, selectors that select, the
//! settings the server and agent read, the secret keys they name. That the server's ClusterRole grants exactly what
//! the Kubernetes executor does is checked in `kubernetes.rs`, against its real requests.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes"))
}

fn yaml_docs(text: &str, what: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap_or_else(|e| panic!("{what}: not YAML: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// Every object of the kustomization's resources, with the file it came from.
pub fn manifests() -> Vec<(String, Value)> {
    let k = std::fs::read_to_string(dir().join("kustomization.yaml")).expect("kustomization");
    let k = yaml_docs(&k, "kustomization.yaml").remove(0);
    let mut out = Vec::new();
    for f in k["resources"].as_array().expect("resources") {
        let f = f.as_str().expect("file name");
        let text = std::fs::read_to_string(dir().join(f))
            .unwrap_or_else(|e| panic!("kustomization lists {f}: {e}"));
        for doc in yaml_docs(&text, f) {
            out.push((f.to_owned(), doc));
        }
    }
    out
}

fn typed<T: DeserializeOwned>(file: &str, v: &Value) -> T {
    serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{file}: {} does not parse: {e}", v["kind"]))
}

fn one<T: DeserializeOwned>(all: &[(String, Value)], kind: &str) -> T {
    let found: Vec<_> = all.iter().filter(|(_, v)| v["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind}");
    typed(&found[0].0, &found[0].1)
}

/// `(API group, resource, verb)` the server's ClusterRole grants.
pub fn server_role_grants() -> BTreeSet<(String, String, String)> {
    let role: ClusterRole = one(&manifests(), "ClusterRole");
    let mut out = BTreeSet::new();
    for r in role.rules.unwrap_or_default() {
        for g in r.api_groups.clone().unwrap_or_default() {
            for res in r.resources.clone().unwrap_or_default() {
                for v in &r.verbs {
                    out.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    out
}

fn env(c: &Container) -> BTreeMap<String, k8s_openapi::api::core::v1::EnvVar> {
    c.env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name.clone(), e))
        .collect()
}

fn secret_key(e: &k8s_openapi::api::core::v1::EnvVar) -> (String, String) {
    let r = e
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .unwrap_or_else(|| panic!("{} comes from a secret", e.name));
    (r.name.clone(), r.key.clone())
}

fn selects(selector: &Option<BTreeMap<String, String>>, labels: &Option<BTreeMap<String, String>>) {
    let s = selector.as_ref().expect("selector");
    let l = labels.as_ref().expect("labels");
    assert!(!s.is_empty());
    for (k, v) in s {
        assert_eq!(l.get(k), Some(v), "selector {k}={v} does not select {l:?}");
    }
}

fn template_labels(
    t: &k8s_openapi::api::core::v1::PodTemplateSpec,
) -> Option<BTreeMap<String, String>> {
    t.metadata.as_ref().and_then(|m| m.labels.clone())
}

#[test]
fn manifests_parse_into_typed_objects_and_fit_the_code() {
    let all = manifests();
    let kinds: BTreeSet<&str> = all.iter().filter_map(|(_, v)| v["kind"].as_str()).collect();
    for (file, v) in &all {
        match v["kind"].as_str().unwrap_or("") {
            "Namespace" => drop(typed::<Namespace>(file, v)),
            "Secret" => drop(typed::<Secret>(file, v)),
            "ServiceAccount" => drop(typed::<ServiceAccount>(file, v)),
            "ClusterRole" => drop(typed::<ClusterRole>(file, v)),
            "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(file, v)),
            "Deployment" => drop(typed::<Deployment>(file, v)),
            "Service" => drop(typed::<Service>(file, v)),
            "DaemonSet" => drop(typed::<DaemonSet>(file, v)),
            "PodDisruptionBudget" => drop(typed::<PodDisruptionBudget>(file, v)),
            other => panic!("{file}: unexpected kind {other:?}"),
        }
    }
    assert_eq!(kinds.len(), 9, "{kinds:?}");
    let ns: Namespace = one(&all, "Namespace");
    let ns = ns.metadata.name.expect("namespace name");
    let secret: Secret = one(&all, "Secret");
    let secret_keys: BTreeSet<String> =
        secret.string_data.unwrap_or_default().into_keys().collect();
    let secret_name = secret.metadata.name.expect("secret name");

    // The server: image, probes, settings, service account, selected by its Service.
    let d: Deployment = one(&all, "Deployment");
    let spec = d.spec.expect("deployment spec");
    selects(
        &spec.selector.match_labels,
        &template_labels(&spec.template),
    );
    let pod_labels = template_labels(&spec.template).expect("pod labels");
    // Two replicas rolled one at a time, a disruption budget that keeps one, and a drain
    // that fits in the grace period.
    assert_eq!(spec.replicas, Some(2));
    let strategy = spec.strategy.clone().expect("strategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        strategy.rolling_update.and_then(|r| r.max_unavailable),
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0))
    );
    let pdb: PodDisruptionBudget = one(&all, "PodDisruptionBudget");
    let pdb = pdb.spec.expect("pdb spec");
    selects(
        &pdb.selector.and_then(|s| s.match_labels),
        &Some(pod_labels.clone()),
    );
    assert_eq!(
        pdb.min_available,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
    // Team NetworkPolicies (server/src/k8s/objects.rs) let exactly this label in.
    assert_eq!(pod_labels["app.kubernetes.io/name"], "tessera-server");
    let pod: PodSpec = spec.template.spec.expect("pod spec");
    let sa: ServiceAccount = one(&all, "ServiceAccount");
    assert_eq!(pod.service_account_name, sa.metadata.name);
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some("tessera/server"));
    let port = c.ports.as_ref().expect("ports")[0].clone();
    assert_eq!(port.name.as_deref(), Some("http"));
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        let g = p
            .as_ref()
            .and_then(|p| p.http_get.clone())
            .expect("http probe");
        assert_eq!(
            g.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("http".into())
        );
        g.path.expect("path")
    };
    assert_eq!(probe_path(&c.readiness_probe), "/readyz");
    assert_eq!(probe_path(&c.liveness_probe), "/healthz");
    assert!(
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .is_some()
    );
    let e = env(c);
    assert_eq!(e["TESSERA_BIND"].value.as_deref(), Some("0.0.0.0:3000"));
    assert!(port.container_port == 3000);
    assert_eq!(e["TESSERA_EXECUTOR"].value.as_deref(), Some("kubernetes"));
    assert_eq!(e["TESSERA_NO_SIM"].value.as_deref(), Some("true"));
    assert_eq!(
        e["TESSERA_K8S_SERVER_NAMESPACE"].value.as_deref(),
        Some(ns.as_str())
    );
    let (sname, skey) = secret_key(&e["TESSERA_DATABASE_URL"]);
    assert_eq!(sname, secret_name);
    assert!(secret_keys.contains(&skey), "{skey} not in the secret");
    // PostgreSQL needs the data keys, from the Secret too.
    let (sname, skey) = secret_key(&e["TESSERA_DATA_KEY"]);
    assert_eq!(sname, secret_name);
    assert!(secret_keys.contains(&skey), "{skey} not in the secret");
    // Shutdown: the drain and the WebSocket grace fit in the pod's grace period.
    let secs = |k: &str| -> i64 {
        e[k].value
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k}"))
    };
    let grace = pod
        .termination_grace_period_seconds
        .expect("termination grace");
    assert!(
        secs("TESSERA_DRAIN_SECONDS") + secs("TESSERA_SHUTDOWN_GRACE_SECONDS") < grace,
        "drain + grace must fit in terminationGracePeriodSeconds"
    );
    // Every variable the server is given is one it reads.
    let known = tessera_server_settings();
    for name in e.keys() {
        assert!(known.contains(name), "the server has no setting {name}");
    }

    let service: Service = one(&all, "Service");
    let svc = service.spec.clone().expect("service spec");
    selects(&svc.selector, &Some(pod_labels.clone()));
    assert_eq!(
        svc.ports.expect("ports")[0].target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("http".into()))
    );

    // The binding gives the role to the server's account in the server's namespace.
    let b: ClusterRoleBinding = one(&all, "ClusterRoleBinding");
    let role: ClusterRole = one(&all, "ClusterRole");
    assert_eq!(Some(b.role_ref.name.clone()), role.metadata.name);
    let subj = &b.subjects.expect("subjects")[0];
    assert_eq!(subj.kind, "ServiceAccount");
    assert_eq!(Some(subj.name.clone()), sa.metadata.name);
    assert_eq!(subj.namespace.as_deref(), Some(ns.as_str()));

    // The agent: GPU nodes only, MIG management off, the node's name as its hostname.
    let ds: DaemonSet = one(&all, "DaemonSet");
    let spec = ds.spec.expect("daemonset spec");
    selects(
        &spec.selector.match_labels,
        &template_labels(&spec.template),
    );
    let pod = spec.template.spec.expect("pod spec");
    assert_eq!(
        pod.node_selector
            .as_ref()
            .and_then(|n| n.get("nvidia.com/gpu.present"))
            .map(String::as_str),
        Some("true")
    );
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some("tessera/agent"));
    let e = env(c);
    assert_eq!(
        e["TESSERA_AGENT_MANAGE_MIG"].value.as_deref(),
        Some("false")
    );
    assert_eq!(
        e["TESSERA_AGENT_HOSTNAME"]
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("spec.nodeName")
    );
    let (sname, skey) = secret_key(&e["TESSERA_JOIN_TOKEN"]);
    assert_eq!(sname, secret_name);
    assert!(secret_keys.contains(&skey), "{skey} not in the secret");
    let state_dir = e["TESSERA_AGENT_STATE_DIR"]
        .value
        .clone()
        .expect("state dir");
    assert!(
        c.volume_mounts
            .clone()
            .unwrap_or_default()
            .iter()
            .any(|m| m.mount_path == state_dir),
        "the agent's state folder is on a volume (its credential survives restarts)"
    );
    let server_url = e["TESSERA_SERVER"].value.clone().expect("server url");
    assert!(
        server_url.starts_with(&format!(
            "http://{}.{ns}.svc",
            service.metadata.name.clone().expect("service name")
        )),
        "{server_url}"
    );
    // The agent refuses plain HTTP to a non-loopback server unless told so explicitly.
    assert_eq!(
        e.get("TESSERA_AGENT_INSECURE_HTTP")
            .and_then(|v| v.value.as_deref()),
        Some("true"),
        "plain http:// to the Service needs TESSERA_AGENT_INSECURE_HTTP"
    );
    let agent_settings = settings_in_help(&crate::support::agent_bin(), &["--help"]);
    for name in e.keys().filter(|n| n.starts_with("TESSERA_")) {
        assert!(
            agent_settings.contains(name),
            "agent.yaml sets {name}, which tessera-agent does not read"
        );
    }
}

/// `deploy/systemd/`: both units pass `systemd-analyze verify` (where systemd is
/// installed) with no unknown setting, run the installed binaries, and every setting
/// their environment templates name is one that binary reads.
#[test]
fn systemd_units_and_environment_templates_fit_the_binaries() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/systemd"));
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("deploy/systemd/{f}: {e}"))
    };
    // (unit, what it runs, its environment template, where that is installed, the
    // binary, the arguments that list its settings)
    let units = [
        (
            "tessera.service",
            "/usr/local/bin/tessera serve",
            "tessera.env",
            "/etc/tessera/tessera.env",
            PathBuf::from(env!("CARGO_BIN_EXE_tessera")),
            &["serve", "--help"][..],
        ),
        (
            "tessera-agent.service",
            "/usr/local/bin/tessera-agent",
            "tessera-agent.env",
            "/etc/tessera/agent.env",
            crate::support::agent_bin(),
            &["--help"][..],
        ),
    ];
    let scratch = tempfile::tempdir().expect("tempdir");
    for (unit, exec, env_file, installed, bin, help) in &units {
        let text = read(unit);
        let exec_line = format!("ExecStart={exec}");
        assert!(text.lines().any(|l| l == exec_line), "{unit} runs `{exec}`");
        assert!(
            text.lines()
                .any(|l| l == format!("EnvironmentFile={installed}")),
            "{unit} reads {installed}"
        );
        // Every TESSERA_ variable the template sets or shows (commented out) is real.
        let known = settings_in_help(bin, help);
        let template = read(env_file);
        for line in template.lines() {
            let line = line.trim_start_matches('#').trim_start();
            if let Some((name, _)) = line.split_once('=')
                && name.starts_with("TESSERA_")
            {
                assert!(
                    known.contains(name),
                    "{env_file}: {name} is not a setting of {unit}"
                );
            }
        }
        for line in text.lines() {
            if let Some(kv) = line.strip_prefix("Environment=")
                && let Some((name, _)) = kv.split_once('=')
            {
                assert!(known.contains(name), "{unit}: {name} is not a setting");
            }
        }
        // systemd's own check, on a copy that runs the binary this build made.
        let copy = scratch.path().join(unit);
        let program = exec.split(' ').next().unwrap_or_default();
        let runnable = text.replace(
            &format!("ExecStart={program}"),
            &format!("ExecStart={}", bin.display()),
        );
        std::fs::write(&copy, runnable).expect("copy");
        match std::process::Command::new("systemd-analyze")
            .arg("verify")
            .arg(&copy)
            .output()
        {
            Ok(out) => {
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(out.status.success(), "systemd-analyze verify {unit}: {err}");
                assert!(
                    !err.contains("Unknown") && !err.contains("ignoring"),
                    "systemd-analyze verify {unit}: {err}"
                );
            }
            Err(e) => {
                eprintln!("systemd-analyze not run ({e}): the units were checked as text only")
            }
        }
    }
    // The templates describe the secure way: HTTPS to the portal, TLS on the server.
    let agent_env = read("tessera-agent.env");
    assert!(
        agent_env.contains("\nTESSERA_SERVER=https://"),
        "{agent_env}"
    );
    let server_env = read("tessera.env");
    for needed in [
        "\nTESSERA_TLS_CERT=",
        "\nTESSERA_TLS_KEY=",
        "\nTESSERA_PUBLIC_URL=https://",
    ] {
        assert!(server_env.contains(needed), "tessera.env lacks {needed}");
    }
}

/// The environment variables `tessera serve` reads (from its `--help`).
fn tessera_server_settings() -> BTreeSet<String> {
    settings_in_help(
        std::path::Path::new(env!("CARGO_BIN_EXE_tessera")),
        &["serve", "--help"],
    )
}

/// The `TESSERA_` environment variables a binary's help names.
fn settings_in_help(bin: &std::path::Path, args: &[&str]) -> BTreeSet<String> {
    let out = std::process::Command::new(bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{} {args:?}: {e}", bin.display()));
    let help = String::from_utf8_lossy(&out.stdout);
    help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("TESSERA_"))
        .map(str::to_owned)
        .collect()
}

/// `deploy/kubernetes/device-plugin-sharing.yaml`: the device plugin configurations a
/// cluster needs for shares advertise exactly the resource the executor asks for, and
/// keep the MIG strategy the executor's slices need.
#[test]
fn the_device_plugin_sharing_config_fits_the_executor() {
    let text = std::fs::read_to_string(dir().join("device-plugin-sharing.yaml"))
        .expect("device-plugin-sharing.yaml");
    let docs = yaml_docs(&text, "device-plugin-sharing.yaml");
    assert_eq!(docs.len(), 1);
    let cm: k8s_openapi::api::core::v1::ConfigMap = typed("device-plugin-sharing.yaml", &docs[0]);
    let data = cm.data.expect("data");
    let mut sharing_methods = BTreeSet::new();
    for (name, config) in &data {
        let c: Value = serde_saphyr::from_str(config)
            .unwrap_or_else(|e| panic!("config {name}: not YAML: {e}"));
        assert_eq!(c["version"], "v1", "{name}");
        assert_eq!(
            c["flags"]["migStrategy"], "mixed",
            "{name}: MIG slices need it"
        );
        let Some(sharing) = c["sharing"].as_object() else {
            continue;
        };
        for (method, s) in sharing {
            sharing_methods.insert(method.clone());
            assert_eq!(s["renameByDefault"], true, "{name}");
            let r = &s["resources"][0];
            let renamed = format!("{}.shared", r["name"].as_str().expect("resource name"));
            assert_eq!(
                renamed,
                tessera_domain::workload::SHARED_GPU_RESOURCE,
                "{name}: the executor asks for what the plugin advertises"
            );
            assert!(
                r["replicas"].as_u64().is_some_and(|n| n >= 2),
                "{name}: {r}"
            );
        }
    }
    assert_eq!(
        sharing_methods,
        BTreeSet::from(["mps".to_owned(), "timeSlicing".to_owned()]),
        "both of Tessera's sharing methods have a configuration"
    );
}
