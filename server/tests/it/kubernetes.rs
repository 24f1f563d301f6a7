//! The Kubernetes executor against a fake API server (`kube_fake.rs`): a member's
//! notebook and job on a 1g.10gb slice of a simulated H100 become the exact objects a
//! cluster needs (team namespace, quota, network policies, workspace claim, Pod / Job on
//! the allocation's node with the MIG resource); pod status and logs flow back; a stop
//! deletes the pod, a finished job is cleaned up.

use crate::allocations::{SimAgent, request, set_quota, team, wait_for_state};
use crate::kube_fake::FakeKube;
use crate::on_both_databases;
use crate::support::{AdminClient, Db, TestApp, call_with_token};
use crate::workloads::{get, job_on, logs_from, stop_workload, wait_workload};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tessera_server::config::{Executor, ServeConfig};

pub(crate) async fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A server whose executor is the Kubernetes one, on a fresh fake API server (its
/// kubeconfig in the returned folder), rounds every 150 ms; `tweak` sets the rest.
pub async fn on_fake_cluster(
    db: Db,
    tweak: impl FnOnce(&mut ServeConfig),
) -> (FakeKube, tempfile::TempDir, AdminClient) {
    let kube = FakeKube::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = kube.kubeconfig(dir.path());
    let app = TestApp::spawn_with(db, |c| {
        c.executor = Executor::Kubernetes;
        c.kubernetes.kubeconfig = Some(kubeconfig);
        c.kubernetes.interval = Duration::from_millis(150);
        tweak(c);
    })
    .await;
    (kube, dir, AdminClient::with_app(app).await)
}

async fn notebooks_and_jobs_become_pods_and_jobs_on_the_allocations_node(db: Db) {
    let (kube, _dir, a) = on_fake_cluster(db, |c| {
        c.kubernetes.image = "registry.example/notebook:1".into();
    })
    .await;
    let t = team(&a, "kube").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let _agent = SimAgent::start(&a, "gpu-node-1").await;
    let (s, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let alloc = v["id"].as_str().expect("id").to_owned();
    let active = wait_for_state(&a, &alloc, "active").await;
    let node_id = active["devices"][0]["node_id"]
        .as_str()
        .expect("node id")
        .to_owned();
    let app = &a.app;

    // A notebook: the team's namespace and fixtures, then a Pod.
    let (s, nb) = call_with_token(
        app,
        &t.member,
        Method::POST,
        "/api/v1/notebooks",
        Some(json!({"allocation_id": alloc, "name": "lab", "env": {"EPOCHS": "3"}})),
    )
    .await;
    assert_eq!(s, 201, "{nb}");
    let nb_id = nb["id"].as_str().expect("id").to_owned();
    let sel = format!("tessera.io/workload={nb_id}");
    let pod = wait_for("the notebook pod", || kube.list("pods", &sel).pop()).await;

    let ns = format!("tessera-team-{}", t.id);
    let namespace = kube
        .get(&format!("/api/v1/namespaces/{ns}"))
        .expect("team namespace");
    assert_eq!(namespace["metadata"]["labels"]["tessera.io/team"], t.id);
    // Pod Security `restricted` is enforced on the team's namespace.
    for mode in ["enforce", "audit", "warn"] {
        assert_eq!(
            namespace["metadata"]["labels"][format!("pod-security.kubernetes.io/{mode}")],
            "restricted"
        );
    }
    let quota = kube
        .get(&format!("/api/v1/namespaces/{ns}/resourcequotas/tessera"))
        .expect("quota");
    assert_eq!(
        quota["spec"]["hard"]["requests.nvidia.com/mig-1g.10gb"], "1",
        "{quota}"
    );
    assert_eq!(quota["spec"]["hard"]["requests.nvidia.com/gpu"], "0");
    let deny = kube
        .get(&format!(
            "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/tessera-default-deny"
        ))
        .expect("default-deny policy");
    assert_eq!(deny["spec"]["podSelector"], json!({}));
    assert_eq!(deny["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    let allow = kube
        .get(&format!(
            "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/tessera-allow-proxy"
        ))
        .expect("proxy policy");
    assert_eq!(allow["spec"]["ingress"][0]["ports"][0]["port"], 8888);
    // What these policies let through, as a NetworkPolicy-enforcing CNI reads them: a pod
    // of another team (every team gets the same objects) reaches neither this team's
    // notebook nor, from this team's pods, anything at all: not the metadata address,
    // not another team. Only the server's namespace reaches the notebook's port.
    let policies = [deny.clone(), allow.clone()];
    let notebook = json!({"tessera.io/kind": "notebook"});
    let other_team = "tessera-team-someone-else";
    let server_ns = "tessera";
    assert!(!ingress_allowed(&policies, &notebook, other_team, 8888));
    assert!(!ingress_allowed(&policies, &notebook, &ns, 8888));
    assert!(ingress_allowed(&policies, &notebook, server_ns, 8888));
    assert!(!ingress_allowed(&policies, &notebook, server_ns, 22));
    for dest in ["169.254.169.254", "10.0.0.1"] {
        assert!(!egress_allowed(&policies, &notebook, dest), "{dest}");
    }
    let claim = kube
        .get(&format!(
            "/api/v1/namespaces/{ns}/persistentvolumeclaims/tessera-workspace"
        ))
        .expect("workspace claim");
    assert_eq!(claim["spec"]["accessModes"], json!(["ReadWriteMany"]));

    assert_eq!(pod["metadata"]["namespace"], ns);
    let labels = &pod["metadata"]["labels"];
    assert_eq!(labels["tessera.io/allocation"], alloc);
    assert_eq!(labels["tessera.io/node"], node_id);
    assert_eq!(labels["tessera.io/kind"], "notebook");
    assert_eq!(labels["app.kubernetes.io/managed-by"], "tessera");
    let spec = &pod["spec"];
    assert_eq!(spec["nodeSelector"]["kubernetes.io/hostname"], "gpu-node-1");
    assert_eq!(spec["restartPolicy"], "Never");
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_restricted(spec);
    let c = &spec["containers"][0];
    assert_eq!(c["image"], "registry.example/notebook:1");
    assert_eq!(
        c["resources"]["limits"],
        json!({"nvidia.com/mig-1g.10gb": "1"})
    );
    let cmd: Vec<&str> = c["command"]
        .as_array()
        .expect("command")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(cmd.contains(&"--ServerApp.ip=0.0.0.0"), "{cmd:?}");
    assert!(cmd.contains(&"--ServerApp.port=8888"), "{cmd:?}");
    assert!(
        cmd.contains(&"--ServerApp.base_url=/user/kube-member/lab/"),
        "{cmd:?}"
    );
    let var = |n: &str| env_var(c, n);
    assert_eq!(var("EPOCHS"), Some(json!("3")));
    assert_eq!(var("TESSERA_WORKSPACE"), Some(json!("/workspace")));
    assert!(var("JUPYTER_TOKEN").is_some_and(|t| t.as_str().is_some_and(|t| t.len() >= 32)));
    assert_eq!(c["volumeMounts"][0]["mountPath"], "/workspace");
    assert_eq!(
        spec["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "tessera-workspace"
    );
    // The kubelet starts it: a pending pod is `starting`, and so is a running pod whose
    // JupyterLab is not ready; ready at the pod's address, it is `running`.
    kube.set_pod_status(
        &pod,
        json!({"phase": "Pending", "containerStatuses": [
        {"name": "main", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
         "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
    );
    wait_workload(app, &t.member, &nb_id, "starting", 30).await;
    kube.set_pod_status(
        &pod,
        json!({"phase": "Running", "podIP": "10.20.0.7",
        "conditions": [{"type": "Ready", "status": "False"}]}),
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(get(app, &t.member, &nb_id).await["state"], "starting");
    kube.set_pod_status(
        &pod,
        json!({"phase": "Running", "podIP": "10.20.0.7",
        "conditions": [{"type": "Ready", "status": "True"}]}),
    );
    wait_workload(app, &t.member, &nb_id, "running", 30).await;

    // The deadline channel on Kubernetes: the pod reads its deadline from a file the
    // kubelet fills from an annotation. Draining the node sets it (the executor patches
    // the pod); undraining takes it back.
    assert_eq!(spec["terminationGracePeriodSeconds"], 30);
    assert_eq!(
        var("TESSERA_DEADLINE_FILE"),
        Some(json!("/run/tessera/deadline"))
    );
    assert_eq!(c["volumeMounts"][1]["mountPath"], "/run/tessera");
    assert_eq!(
        spec["volumes"][1]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
        "metadata.annotations['tessera.io/deadline']"
    );
    let pod_path = format!(
        "/api/v1/namespaces/{}/pods/{}",
        pod["metadata"]["namespace"].as_str().expect("ns"),
        pod["metadata"]["name"].as_str().expect("name")
    );
    let (s, v) = a
        .call(
            Method::POST,
            &format!("/api/v1/nodes/{node_id}/drain"),
            Some(json!({"minutes": 60, "reason": "new fans"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let told = wait_for("the deadline annotation", || {
        kube.get(&pod_path).and_then(|p| {
            p["metadata"]["annotations"]["tessera.io/deadline"]
                .as_str()
                .map(str::to_owned)
        })
    })
    .await;
    assert!(
        told.contains("cause=drain") && told.contains("deadline="),
        "{told}"
    );
    let patched = kube.get(&pod_path).expect("pod");
    assert_eq!(
        patched["metadata"]["uid"], pod["metadata"]["uid"],
        "the same pod"
    );
    let (s, v) = a.delete(&format!("/api/v1/nodes/{node_id}/drain")).await;
    assert_eq!(s, 200, "{v}");
    wait_for("the deadline withdrawn", || {
        kube.get(&pod_path)
            .filter(|p| p["metadata"]["annotations"]["tessera.io/deadline"].is_null())
    })
    .await;
    kube.set_log(&pod, "[I] Jupyter Server is running\n");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, l) = logs_from(app, &t.member, &nb_id, 0).await;
        if l["text"]
            .as_str()
            .is_some_and(|t| t.contains("Jupyter Server is running"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "log never arrived: {l}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }

    // Stop: the pod is deleted and the notebook ends `stopped`.
    let (s, v) = stop_workload(app, &t.member, &nb_id).await;
    assert_eq!(s, 200, "{v}");
    wait_for("the pod's deletion", || {
        kube.list("pods", &sel).is_empty().then_some(())
    })
    .await;
    wait_workload(app, &t.member, &nb_id, "stopped", 30).await;
    // Nothing runs: the team's MIG allotment goes back to zero (and stays capped).
    let quota_path = format!("/api/v1/namespaces/{ns}/resourcequotas/tessera");
    wait_for("the quota back at zero", || {
        kube.get(&quota_path)
            .filter(|q| q["spec"]["hard"]["requests.nvidia.com/mig-1g.10gb"] == "0")
    })
    .await;
    assert!(
        kube.requests()
            .iter()
            .any(|r| r == &format!("DELETE /api/v1/namespaces/{ns}/pods/nb-{nb_id}")),
        "{:?}",
        kube.requests()
    );

    // A job: a Job with no retries of its own; its pod's exit code and output come back.
    let (s, job) = call_with_token(
        app,
        &t.member,
        Method::POST,
        "/api/v1/jobs",
        Some(json!({"allocation_id": alloc, "command": "python train.py", "workdir": "runs"})),
    )
    .await;
    assert_eq!(s, 201, "{job}");
    let job_id = job["id"].as_str().expect("id").to_owned();
    let jsel = format!("tessera.io/workload={job_id}");
    let kjob = wait_for("the job", || kube.list("jobs", &jsel).pop()).await;
    assert_eq!(kjob["spec"]["backoffLimit"], 0);
    assert_restricted(&kjob["spec"]["template"]["spec"]);
    let tmpl = &kjob["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(tmpl["command"], json!(["/bin/sh", "-c", "python train.py"]));
    assert_eq!(tmpl["workingDir"], "/workspace/runs");
    assert_eq!(
        tmpl["resources"]["limits"],
        json!({"nvidia.com/mig-1g.10gb": "1"})
    );
    let jpod = wait_for("the job's pod", || kube.list("pods", &jsel).pop()).await;
    assert_eq!(
        jpod["metadata"]["labels"]["job-name"],
        kjob["metadata"]["name"]
    );
    kube.set_pod_status(&jpod, json!({"phase": "Running"}));
    wait_workload(app, &t.member, &job_id, "running", 30).await;
    kube.set_log(&jpod, "epoch 1\nepoch 2\n");
    kube.set_pod_status(
        &jpod,
        json!({"phase": "Failed", "containerStatuses": [
        {"name": "main", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
         "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]}),
    );
    let done = wait_workload(app, &t.member, &job_id, "failed", 30).await;
    assert_eq!(done["exit_code"], 3, "{done}");
    let (_, l) = logs_from(app, &t.member, &job_id, 0).await;
    assert_eq!(l["text"], "epoch 1\nepoch 2\n", "{l}");
    // A finished job's objects are cleaned up (its log is kept by the server).
    wait_for("the job's deletion", || {
        (kube.list("jobs", &jsel).is_empty() && kube.list("pods", &jsel).is_empty()).then_some(())
    })
    .await;

    // The server's ClusterRole (deploy/kubernetes) grants exactly what the executor did
    // here and, for the pull secrets, in `kube_images.rs`, for gangs and exec in
    // `kube_gangs.rs` (which check those grants).
    let mut used = role_use(&kube);
    used.extend(
        crate::kube_images::PULL_SECRET_GRANTS
            .into_iter()
            .chain(crate::kube_gangs::GANG_GRANTS)
            .map(|(g, r, v)| (g.to_owned(), r.to_owned(), v.to_owned())),
    );
    assert_eq!(crate::deploy::server_role_grants(), used);
}

/// `(API group, resource, verb)` of every request the fake API server was sent, as RBAC
/// names them.
pub fn role_use(kube: &FakeKube) -> std::collections::BTreeSet<(String, String, String)> {
    let mut used = std::collections::BTreeSet::new();
    for r in kube.requests() {
        let (method, path) = r.split_once(' ').expect("request line");
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, rest) = if segs[0] == "api" {
            ("", &segs[2..])
        } else {
            (segs[1], &segs[3..])
        };
        let (resource, named) = match rest {
            ["namespaces", _, plural, name, sub] => (format!("{plural}/{sub}"), !name.is_empty()),
            ["namespaces", _, plural, _] => ((*plural).to_owned(), true),
            ["namespaces", _, plural] => ((*plural).to_owned(), false),
            [plural, _] => ((*plural).to_owned(), true),
            [plural] => ((*plural).to_owned(), false),
            other => panic!("unexpected path {other:?}"),
        };
        let verb = match (method, named) {
            ("POST" | "CONNECT", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", _) => "delete",
            ("GET", true) => "get",
            ("GET", false) => "list",
            other => panic!("unexpected {other:?}"),
        };
        used.insert((group.to_owned(), resource, verb.to_owned()));
    }
    used
}

on_both_databases!(
    notebooks_and_jobs_become_pods_and_jobs_on_the_allocations_node,
    a_share_asks_the_device_plugin_for_a_shared_gpu,
);

/// A job on a 250-milli share of a shared (time-sliced) H100 becomes a Job whose pod asks
/// for one `nvidia.com/gpu.shared` (the device plugin's shared replica) on the share's
/// node, says its fraction in its environment, and the team's quota allows exactly that.
async fn a_share_asks_the_device_plugin_for_a_shared_gpu(db: Db) {
    let (kube, _dir, a) = on_fake_cluster(db, |_| {}).await;
    let t = team(&a, "kshare").await;
    set_quota(&a, &t.id, "H100-80GB:shared", 1000, 1000, 1000).await;
    let _agent = SimAgent::start(&a, "gpu-node-2").await;
    let (node, gpu) = wait_for_async_gpu(&a).await;
    let (s, v) = a
        .call(
            Method::PUT,
            &format!("/api/v1/nodes/{node}/gpus/{gpu}/sharing"),
            Some(json!({"sharing": "time_slice"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = request(&a.app, &t.member, &t.id, "H100-80GB:share:250").await;
    assert_eq!(s, 201, "{v}");
    let alloc = v["id"].as_str().expect("id").to_owned();
    wait_for_state(&a, &alloc, "active").await;
    let (s, job) = job_on(&a.app, &t.member, &alloc, "python train.py").await;
    assert_eq!(s, 201, "{job}");
    let id = job["id"].as_str().expect("id").to_owned();
    let sel = format!("tessera.io/workload={id}");
    let job = wait_for("the share's Job", || kube.list("jobs", &sel).pop()).await;
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["kubernetes.io/hostname"], "gpu-node-2");
    let c = &pod["containers"][0];
    assert_eq!(
        c["resources"]["limits"],
        json!({"nvidia.com/gpu.shared": "1"}),
        "{c}"
    );
    let var = |n: &str| env_var(c, n);
    assert_eq!(var("TESSERA_GPU_SHARE_MILLI"), Some(json!("250")));
    assert_eq!(var("TESSERA_GPU_SHARE_METHOD"), Some(json!("time_slice")));
    let ns = format!("tessera-team-{}", t.id);
    let quota = kube
        .get(&format!("/api/v1/namespaces/{ns}/resourcequotas/tessera"))
        .expect("quota");
    assert_eq!(
        quota["spec"]["hard"]["requests.nvidia.com/gpu.shared"], "1",
        "{quota}"
    );
    assert_eq!(quota["spec"]["hard"]["requests.nvidia.com/gpu"], "0");
}

/// The value of the container `c`'s environment variable `name`.
pub(crate) fn env_var(c: &Value, name: &str) -> Option<Value> {
    c["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].clone())
}

/// The simulated node's GPU, once reported: `(node id, GPU UUID)`.
async fn wait_for_async_gpu(a: &AdminClient) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, nodes) = a.call(Method::GET, "/api/v1/nodes", None).await;
        if let (Some(n), Some(g)) = (
            nodes["items"][0]["id"].as_str(),
            nodes["items"][0]["gpus"][0]["uuid"].as_str(),
        ) {
            return (n.to_owned(), g.to_owned());
        }
        assert!(Instant::now() < deadline, "no GPU reported: {nodes}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A pod spec that passes the `restricted` Pod Security standard: non-root with a fixed
/// uid, no privilege escalation, no capabilities, the runtime's default seccomp profile.
pub fn assert_restricted(spec: &Value) {
    let pod = &spec["securityContext"];
    assert_eq!(pod["runAsNonRoot"], true, "{spec}");
    assert_eq!(pod["runAsUser"], 1000);
    assert_eq!(pod["seccompProfile"]["type"], "RuntimeDefault");
    let c = &spec["containers"][0]["securityContext"];
    assert_eq!(c["runAsNonRoot"], true, "{spec}");
    assert_eq!(c["allowPrivilegeEscalation"], false);
    assert_eq!(c["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(c["seccompProfile"]["type"], "RuntimeDefault");
}

/// Whether a pod labelled `labels` is selected by a policy's `podSelector` (matchLabels
/// only, which is all Tessera writes).
fn selects(policy: &Value, labels: &Value) -> bool {
    let want = &policy["spec"]["podSelector"]["matchLabels"];
    want.as_object()
        .is_none_or(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// The policies that select a pod labelled `labels` and govern its `kind` (`Ingress` or
/// `Egress`) traffic.
fn policies_for<'a>(policies: &'a [Value], labels: &Value, kind: &str) -> Vec<&'a Value> {
    policies
        .iter()
        .filter(|p| selects(p, labels))
        .filter(|p| {
            p["spec"]["policyTypes"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t == kind))
        })
        .collect()
}

/// Whether a connection from a pod in namespace `from_ns` reaches port `port` of a pod
/// labelled `labels` in the policies' namespace, by NetworkPolicy's rules: once a policy
/// with `Ingress` selects the pod, only what some ingress rule of such a policy allows.
fn ingress_allowed(policies: &[Value], labels: &Value, from_ns: &str, port: i64) -> bool {
    let mine = policies_for(policies, labels, "Ingress");
    if mine.is_empty() {
        return true;
    }
    mine.iter().any(|p| {
        p["spec"]["ingress"].as_array().is_some_and(|rules| {
            rules.iter().any(|r| {
                let from_ok = r["from"].as_array().is_none_or(|peers| {
                    peers.iter().any(|peer| {
                        peer["namespaceSelector"]["matchLabels"]
                            .as_object()
                            .is_some_and(|m| {
                                m.iter().all(|(k, v)| {
                                    k == "kubernetes.io/metadata.name" && v == from_ns
                                })
                            })
                            && peer["ipBlock"].is_null()
                    })
                });
                let port_ok = r["ports"]
                    .as_array()
                    .is_none_or(|ports| ports.iter().any(|p| p["port"].as_i64() == Some(port)));
                from_ok && port_ok
            })
        })
    })
}

/// Whether a pod labelled `labels` in the policies' namespace may send to `ip`: once a
/// policy with `Egress` selects it, only what some egress rule allows (a rule without `to`
/// allows every address; an `ipBlock` its CIDR less its exceptions; other peers are pods,
/// never an outside address).
fn egress_allowed(policies: &[Value], labels: &Value, ip: &str) -> bool {
    let ip: std::net::Ipv4Addr = ip.parse().expect("IPv4");
    let within = |cidr: &str| {
        let (net, bits) = cidr.split_once('/').expect("CIDR");
        let net: std::net::Ipv4Addr = net.parse().expect("net");
        let bits: u32 = bits.parse().expect("bits");
        let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
        u32::from(ip) & mask == u32::from(net) & mask
    };
    let mine = policies_for(policies, labels, "Egress");
    if mine.is_empty() {
        return true;
    }
    mine.iter().any(|p| {
        p["spec"]["egress"].as_array().is_some_and(|rules| {
            rules.iter().any(|r| match r["to"].as_array() {
                None => true,
                Some(peers) => peers.iter().any(|peer| {
                    peer["ipBlock"]["cidr"].as_str().is_some_and(within)
                        && !peer["ipBlock"]["except"]
                            .as_array()
                            .is_some_and(|ex| ex.iter().filter_map(Value::as_str).any(within))
                }),
            })
        })
    })
}
