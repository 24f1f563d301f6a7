//! Gang jobs on the Kubernetes executor (issue 42), against the fake API server: nothing
//! is created while the gang is not wholly placed; then one Indexed Job (a pod per member,
//! each on one of the members' nodes, never two on one node, its rank from its completion
//! index), a headless Service giving the pods the DNS names the launch environment names,
//! a NetworkPolicy letting only the gang's pods reach each other, and the team's quota
//! covering every member. Each pod reports as its member; `tessera exec` reaches a rank's
//! pod through the API server's exec; one failing ends the gang and the Job (Service and
//! policy with it); `launcher: rank0` is refused with a reason.

use crate::allocations::{SimAgent, set_quota, team};
use crate::exec::{open_rank, read, send};
use crate::gangs::{log, post_job, ranks_ended, wait_until_used};
use crate::kubernetes::{env_var, on_fake_cluster, wait_for};
use crate::on_both_databases;
use crate::support::{AdminClient, Db};
use crate::workloads::{get, wait_workload};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tessera_domain::wire::exec_frame::Channel;

on_both_databases!(a_gang_is_one_indexed_job_behind_a_headless_service);

/// What gangs and `tessera exec` need of the server's ClusterRole beyond the rest:
/// headless Services and exec (the WebSocket upgrade is authorized as `create` on
/// `pods/exec`; clusters before Kubernetes 1.31 checked `get`).
pub const GANG_GRANTS: [(&str, &str, &str); 3] = [
    ("", "services", "create"),
    ("", "pods/exec", "create"),
    ("", "pods/exec", "get"),
];

/// Nodes online with their GPUs, by hostname prefix.
async fn online(a: &AdminClient, prefix: &str) -> usize {
    let (_, nodes) = a.call(Method::GET, "/api/v1/nodes", None).await;
    nodes["items"]
        .as_array()
        .or_else(|| nodes.as_array())
        .map_or(0, |n| {
            n.iter()
                .filter(|n| {
                    n["hostname"]
                        .as_str()
                        .is_some_and(|h| h.starts_with(prefix))
                })
                .filter(|n| n["gpus"].as_array().is_some_and(|g| !g.is_empty()))
                .count()
        })
}

async fn wait_online(a: &AdminClient, prefix: &str, want: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while online(a, prefix).await < want {
        assert!(Instant::now() < deadline, "{want} nodes never came online");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether `peer` (of a policy in namespace `ns`) is a pod labelled `labels` in `pod_ns`:
/// no namespace selector means the policy's own namespace.
fn peer_is(peer: &Value, ns: &str, pod_ns: &str, labels: &Value) -> bool {
    let ns_ok = match peer["namespaceSelector"]["matchLabels"].as_object() {
        Some(m) => m
            .iter()
            .all(|(k, v)| k == "kubernetes.io/metadata.name" && v == pod_ns),
        None => peer["namespaceSelector"].is_null() && ns == pod_ns,
    };
    let pod_ok = peer["podSelector"]["matchLabels"]
        .as_object()
        .is_none_or(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)));
    ns_ok && pod_ok && peer["ipBlock"].is_null()
}

/// Whether pod `from` (namespace, labels) reaches pod `to` on `port`, every policy of
/// both namespaces applied as a NetworkPolicy-enforcing CNI does: the sender's egress and
/// the receiver's ingress must both allow it.
fn reaches(policies: &[Value], from: (&str, &Value), to: (&str, &Value), port: i64) -> bool {
    let allowed = |dir: &str, (ns, pod): (&str, &Value), (other_ns, other): (&str, &Value)| {
        let key = if dir == "Ingress" { "from" } else { "to" };
        let mine: Vec<&Value> = policies
            .iter()
            .filter(|p| p["metadata"]["namespace"] == ns)
            .filter(|p| {
                p["spec"]["podSelector"]["matchLabels"]
                    .as_object()
                    .is_none_or(|m| m.iter().all(|(k, v)| pod.get(k) == Some(v)))
            })
            .filter(|p| {
                p["spec"]["policyTypes"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|t| t == dir))
            })
            .collect();
        mine.is_empty()
            || mine.iter().any(|p| {
                p["spec"][dir.to_lowercase()]
                    .as_array()
                    .is_some_and(|rules| {
                        rules.iter().any(|r| {
                            r[key].as_array().is_none_or(|peers| {
                                peers.iter().any(|peer| peer_is(peer, ns, other_ns, other))
                            }) && r["ports"].as_array().is_none_or(|ps| {
                                ps.iter().any(|p| p["port"].as_i64() == Some(port))
                            })
                        })
                    })
            })
    };
    allowed("Egress", from, to) && allowed("Ingress", to, from)
}

async fn a_gang_is_one_indexed_job_behind_a_headless_service(db: Db) {
    let (kube, _dir, a) = on_fake_cluster(db, |_| {}).await;
    let app = &a.app;
    let t = team(&a, "kgang").await;
    set_quota(&a, &t.id, "H100-80GB", 28, 28, 28).await;
    let ns = format!("tessera-team-{}", t.id);
    let _n1 = SimAgent::start(&a, "kgang-node-1").await;
    wait_online(&a, "kgang-node-", 1).await;

    // One node for a two-node gang: it waits, and nothing exists in the cluster for it.
    let (s, job) = post_job(
        app,
        &t.member,
        json!({"command": "python train.py", "name": "ddp", "gpu": "H100-80GB:whole",
               "nodes": 2, "env": {"EPOCHS": "3"}}),
    )
    .await;
    assert_eq!(s, 201, "{job}");
    let id = job["id"].as_str().expect("id").to_owned();
    let sel = format!("tessera.io/gang={id}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(get(app, &t.member, &id).await["state"], "queued");
    assert!(kube.list("jobs", &sel).is_empty());
    assert!(kube.list("pods", &sel).is_empty());

    // A second node: the gang is placed, and only then made, as one Indexed Job.
    let _n2 = SimAgent::start(&a, "kgang-node-2").await;
    let kjob = wait_for("the gang's Job", || kube.list("jobs", &sel).pop()).await;
    let name = format!("gang-{id}");
    assert_eq!(kjob["metadata"]["name"], name);
    assert_eq!(kjob["metadata"]["namespace"], ns);
    let spec = &kjob["spec"];
    assert_eq!(spec["completionMode"], "Indexed");
    assert_eq!(spec["completions"], 2);
    assert_eq!(spec["parallelism"], 2);
    assert_eq!(spec["backoffLimit"], 0);
    let members: Vec<&str> = kjob["metadata"]["annotations"]["tessera.io/gang-members"]
        .as_str()
        .expect("members")
        .split(',')
        .collect();
    assert_eq!(members.len(), 2);
    assert_eq!(members[0], id, "rank 0 is the job");
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["subdomain"], name);
    assert!(pod["nodeSelector"].is_null(), "{pod}");
    let mut hosts: Vec<&str> = pod["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
        ["matchExpressions"][0]["values"]
        .as_array()
        .expect("hosts")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    hosts.sort_unstable();
    assert_eq!(hosts, ["kgang-node-1", "kgang-node-2"]);
    let anti =
        &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(anti["labelSelector"]["matchLabels"]["tessera.io/gang"], id);
    let c = &pod["containers"][0];
    assert_eq!(c["resources"]["limits"], json!({"nvidia.com/gpu": "1"}));
    let var = |n: &str| env_var(c, n);
    let master = format!("{name}-0.{name}.{ns}.svc");
    assert_eq!(var("MASTER_ADDR"), Some(json!(master)));
    assert_eq!(var("MASTER_PORT"), Some(json!("29500")));
    assert_eq!(var("WORLD_SIZE"), Some(json!("2")));
    assert_eq!(
        var("JAX_COORDINATOR_ADDRESS"),
        Some(json!(format!("{master}:29501")))
    );
    assert_eq!(var("EPOCHS"), Some(json!("3")));
    let addrs = var("TESSERA_GANG_ADDRS").expect("addrs");
    assert_eq!(addrs, json!(format!("{master},{name}-1.{name}.{ns}.svc")));
    // The rank is the pod's completion index, through the downward API.
    for rank_var in [
        "RANK",
        "NODE_RANK",
        "PET_NODE_RANK",
        "JAX_PROCESS_ID",
        "TESSERA_GANG_RANK",
    ] {
        let e = c["env"]
            .as_array()
            .expect("env")
            .iter()
            .find(|e| e["name"] == rank_var)
            .expect(rank_var);
        assert!(e["value"].is_null(), "{e}");
        assert_eq!(
            e["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        );
    }
    // The headless Service and the gang's hole in the default deny, owned by the Job.
    let svc = wait_for("the gang's Service", || {
        kube.get(&format!("/api/v1/namespaces/{ns}/services/{name}"))
    })
    .await;
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert_eq!(svc["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(svc["spec"]["selector"], json!({"tessera.io/gang": id}));
    assert_eq!(
        svc["metadata"]["ownerReferences"][0]["uid"],
        kjob["metadata"]["uid"]
    );
    let policy_path = format!("/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}");
    let gang_policy = wait_for("the gang's policy", || kube.get(&policy_path)).await;
    assert_eq!(
        gang_policy["metadata"]["ownerReferences"][0]["uid"],
        kjob["metadata"]["uid"]
    );
    let policies: Vec<Value> = kube
        .list("networkpolicies", "app.kubernetes.io/managed-by=tessera")
        .into_iter()
        .collect();
    let member = json!({"tessera.io/gang": id, "tessera.io/kind": "job"});
    let lone_job = json!({"tessera.io/kind": "job"});
    let other_gang = json!({"tessera.io/gang": "someone-else", "tessera.io/kind": "job"});
    let dns = json!({"k8s-app": "kube-dns"});
    assert!(reaches(&policies, (&ns, &member), (&ns, &member), 29500));
    assert!(reaches(
        &policies,
        (&ns, &member),
        ("kube-system", &dns),
        53
    ));
    assert!(!reaches(
        &policies,
        (&ns, &member),
        ("kube-system", &dns),
        443
    ));
    for (who, labels) in [
        ("a job of the team", &lone_job),
        ("another gang", &other_gang),
    ] {
        assert!(
            !reaches(&policies, (&ns, labels), (&ns, &member), 29500),
            "{who}"
        );
        assert!(
            !reaches(&policies, (&ns, &member), (&ns, labels), 29500),
            "{who}"
        );
    }
    let stranger = "tessera-team-someone-else";
    assert!(!reaches(
        &policies,
        (stranger, &member),
        (&ns, &member),
        29500
    ));
    // The team's quota covers both pods.
    let quota = kube
        .get(&format!("/api/v1/namespaces/{ns}/resourcequotas/tessera"))
        .expect("quota");
    assert_eq!(
        quota["spec"]["hard"]["requests.nvidia.com/gpu"], "2",
        "{quota}"
    );

    // The Job controller made a pod per index; the kubelet runs both: the job runs, every
    // rank with it, and each pod's log is its rank's.
    let pods = wait_for("both pods", || {
        let p = kube.list("pods", &sel);
        (p.len() == 2).then_some(p)
    })
    .await;
    let by_index = |i: &str| {
        pods.iter()
            .find(|p| p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == i)
            .expect("pod of index")
            .clone()
    };
    let (p0, p1) = (by_index("0"), by_index("1"));
    assert_eq!(p1["spec"]["hostname"], format!("{name}-1"));
    for p in [&p0, &p1] {
        kube.set_pod_status(p, json!({"phase": "Running", "podIP": "10.20.0.9"}));
    }
    kube.set_log(&p1, "rank 1 says hello\n");
    let running = wait_workload(app, &t.member, &id, "running", 30).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = get(app, &t.member, &id).await;
        let all = v["ranks"]
            .as_array()
            .is_some_and(|r| r.len() == 2 && r.iter().all(|r| r["state"] == "running"));
        if all {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "every rank running: {v}\n{running}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, text) = log(app, &t.member, &id, 1).await;
        assert_eq!(s, 200, "{text}");
        if text.contains("rank 1 says hello") {
            break;
        }
        assert!(Instant::now() < deadline, "rank 1's log: {text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // `tessera exec` goes through the API server's exec subresource into the rank's pod
    // (the fake plays the kubelet: the command runs on this host): output, input, the
    // exit code; the wrong rank is refused; another team's member gets 404.
    let mut ws = open_rank(
        app,
        &t.member,
        &id,
        1,
        &["sh", "-c", "echo in-pod; exit 3"],
        false,
    )
    .await
    .unwrap_or_else(|e| panic!("exec refused: {e:?}"));
    send(&mut ws, Channel::Stdin, b"").await;
    let out = read(&mut ws, None).await;
    assert_eq!(out.stdout, "in-pod\n", "{out:?}");
    assert_eq!(out.code, Some(3), "{out:?}");
    let p1_path = format!(
        "CONNECT /api/v1/namespaces/{ns}/pods/{}/exec",
        p1["metadata"]["name"].as_str().expect("name")
    );
    assert!(kube.requests().contains(&p1_path), "{:?}", kube.requests());
    let mut ws = open_rank(app, &t.member, &id, 0, &["cat"], false)
        .await
        .unwrap_or_else(|e| panic!("exec refused: {e:?}"));
    send(&mut ws, Channel::Stdin, b"typed\n").await;
    let echoed = read(&mut ws, Some("typed")).await;
    assert_eq!(echoed.stdout, "typed\n");
    send(&mut ws, Channel::Stdin, b"").await;
    let done = read(&mut ws, None).await;
    assert_eq!(done.code, Some(0), "{done:?}");
    let p0_path = format!(
        "CONNECT /api/v1/namespaces/{ns}/pods/{}/exec",
        p0["metadata"]["name"].as_str().expect("name")
    );
    assert!(kube.requests().contains(&p0_path), "{:?}", kube.requests());
    let (s, _) = open_rank(app, &t.member, &id, 2, &["true"], false)
        .await
        .map(|_| (101, String::new()))
        .unwrap_or_else(|e| e);
    assert_eq!(s, 422, "no rank 2");
    let stranger = team(&a, "kgang-other").await;
    let (s, _) = open_rank(app, &stranger.member, &id, 1, &["true"], false)
        .await
        .map(|_| (101, String::new()))
        .unwrap_or_else(|e| e);
    assert_eq!(s, 404);

    // Rank 1's pod fails: the job fails naming it, the Job goes (its Service and policy
    // with it), and the GPUs are back.
    kube.set_pod_status(
        &p1,
        json!({"phase": "Failed", "containerStatuses": [
            {"name": "main", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
             "state": {"terminated": {"exitCode": 3}}}]}),
    );
    wait_workload(app, &t.member, &id, "failed", 60).await;
    let failed = ranks_ended(app, &t.member, &id).await;
    let message = failed["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("rank 1") && message.contains("exit code 3"),
        "{failed}"
    );
    wait_for("the gang's objects deleted", || {
        (kube.list("jobs", &sel).is_empty()
            && kube.list("pods", &sel).is_empty()
            && kube
                .get(&format!("/api/v1/namespaces/{ns}/services/{name}"))
                .is_none()
            && kube.get(&policy_path).is_none())
        .then_some(())
    })
    .await;
    wait_until_used(&a, &t.id, 0).await;

    // `launcher: rank0` needs Tessera's remote agent in every member: refused, nothing made.
    let (s, job) = post_job(
        app,
        &t.member,
        json!({"command": "mpirun hostname", "gpu": "H100-80GB:whole", "nodes": 2,
               "launcher": "rank0"}),
    )
    .await;
    assert_eq!(s, 201, "{job}");
    let mpi = job["id"].as_str().expect("id").to_owned();
    let v = wait_workload(app, &t.member, &mpi, "failed", 60).await;
    let v = if v["message"].is_null() {
        ranks_ended(app, &t.member, &mpi).await
    } else {
        v
    };
    assert!(
        v["message"]
            .as_str()
            .unwrap_or_default()
            .contains("launcher: each"),
        "{v}"
    );
    assert!(
        kube.list("jobs", &format!("tessera.io/gang={mpi}"))
            .is_empty()
    );
    wait_until_used(&a, &t.id, 0).await;

    // The server's ClusterRole grants all of it (`kubernetes.rs` holds it to exactly what
    // the executor uses, these grants included).
    let used = crate::kubernetes::role_use(&kube);
    let grants = crate::deploy::server_role_grants();
    assert!(used.is_subset(&grants), "{used:?} ⊄ {grants:?}");
    for (g, r, v) in GANG_GRANTS {
        let grant = (g.to_owned(), r.to_owned(), v.to_owned());
        assert!(grants.contains(&grant), "{grant:?}");
        let older_clusters = r == "pods/exec" && v == "get";
        assert!(used.contains(&grant) || older_clusters, "{grant:?} unused");
    }
}
