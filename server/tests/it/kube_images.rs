//! The Kubernetes executor and workloads in images of their own (issue 36), driven with
//! specs built here against the fake API server (`kube_fake.rs`): the pod runs the pinned
//! reference with `IfNotPresent`, a team's registry login becomes a
//! `kubernetes.io/dockerconfigjson` Secret in the team's namespace that the pod names,
//! another team's pods never name it, a spec without an image keeps the server-wide
//! image, and the password reaches no log line and no error text. End to end (both
//! stores): a member's job naming a catalog image of a private registry on loopback runs,
//! on the Kubernetes executor, as a Job whose pod names the team's login.

use crate::allocations::{SimAgent, request, set_quota, team, wait_for_state};
use crate::kube_fake::FakeKube;
use crate::kubernetes::{assert_restricted, on_fake_cluster, role_use};
use crate::on_both_databases;
use crate::support::{Db, call_with_token, post_as};
use k8s_openapi::ByteString;
use reqwest::Method;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use tessera_core::services::nodes::NodeIdentity;
use tessera_domain::wire::{ImageSpec, RegistryLogin, WorkloadSpec};
use tessera_domain::workload::WorkloadKind;
use tessera_registry::testkit::htpasswd;
use tessera_server::config::ServeConfig;
use tessera_server::k8s::{KubeExecutor, pull_secret_name};
use tracing::instrument::WithSubscriber;

/// What the pull secrets need of the server's ClusterRole (server-side apply; `create`
/// when the secret is new). `kubernetes.rs` counts these among what the role must grant.
pub const PULL_SECRET_GRANTS: [(&str, &str, &str); 2] =
    [("", "secrets", "create"), ("", "secrets", "patch")];

const SERVER_WIDE: &str = "registry.example/server-wide:1";
const REGISTRY: &str = "registry.example:5000";
const DIGEST: &str = "sha256:4b825dc642cb6eb9a060e54bf8d69288fbee4904a0c1c3e0c8b1a1d9c1a2b3c4";
const PASSWORD_A: &str = "s3cret-pw-A";
const PASSWORD_B: &str = "other-pw-B";

fn reference(registry: &str, repo: &str) -> String {
    format!("{registry}/{repo}@{DIGEST}")
}

fn login(user: &str, password: &str) -> RegistryLogin {
    RegistryLogin {
        username: user.into(),
        password: password.into(),
    }
}

fn spec(id: &str, team: &str, image: Option<ImageSpec>) -> WorkloadSpec {
    WorkloadSpec {
        resources: vec!["nvidia.com/mig-1g.10gb".into()],
        allocation_id: "alloc-1".into(),
        image,
        ..WorkloadSpec::job(
            id,
            team,
            &["MIG-1"],
            &["/bin/sh", "-c", "python train.py --epochs {port}"],
        )
    }
}

fn image(reference: String, login: Option<RegistryLogin>) -> Option<ImageSpec> {
    Some(ImageSpec {
        reference,
        requires_cuda: None,
        login,
    })
}

/// Every tracing event (all levels, every target) emitted while the future runs, as
/// text: the executor's own lines, kube's and the HTTP client's.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned()
    }

    async fn run<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        let sink = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish();
        f.with_subscriber(subscriber).await
    }
}

/// An executor (the server's settings, `SERVER_WIDE` as the image) on a fresh fake API
/// server.
async fn executor() -> (FakeKube, tempfile::TempDir, KubeExecutor) {
    let kube = FakeKube::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = ServeConfig::for_tests("sqlite::memory:").kubernetes;
    s.kubeconfig = Some(kube.kubeconfig(dir.path()));
    s.image = SERVER_WIDE.into();
    let ex = KubeExecutor::connect(s).await.expect("connect");
    (kube, dir, ex)
}

/// The node the executor reports for (as the platform: only the holder of a
/// `SystemActor` names one).
async fn node() -> NodeIdentity {
    let store = tessera_core::store::Store::connect("sqlite::memory:")
        .await
        .expect("store");
    let (_, system) = crate::support::services_over(store);
    NodeIdentity::for_executor(
        &system,
        tessera_domain::ids::NodeId(uuid::Uuid::from_u128(7)),
        "gpu-a",
    )
}

fn ns(team: &str) -> String {
    format!("tessera-team-{team}")
}

/// The pod template of the Job made for run `id`.
fn job_pod_spec(kube: &FakeKube, id: &str) -> Value {
    let jobs = kube.list("jobs", &format!("tessera.io/run={id}"));
    assert_eq!(jobs.len(), 1, "one Job for {id}: {jobs:?}");
    jobs[0]["spec"]["template"]["spec"].clone()
}

/// A pull secret's `.dockerconfigjson`, decoded (base64 by Kubernetes' own codec).
fn docker_config(secret: &Value) -> Value {
    let data: ByteString =
        serde_json::from_value(secret["data"][".dockerconfigjson"].clone()).expect("base64");
    serde_json::from_slice(&data.0).expect("JSON")
}

fn decoded(b64: &Value) -> String {
    let data: ByteString = serde_json::from_value(b64.clone()).expect("base64");
    String::from_utf8(data.0).expect("UTF-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_runs_by_digest_with_its_teams_pull_secret() {
    let (kube, _dir, ex) = executor().await;
    let log = Captured::default();
    let hub = format!("docker.io/team/private@{DIGEST}");
    let desired = vec![
        // Team A: a job in a private image with A's login; one on Docker Hub with a login;
        // a job with no image of its own.
        spec(
            "a-1",
            "team-a",
            image(
                reference(REGISTRY, "lab/torch"),
                Some(login("alice", PASSWORD_A)),
            ),
        ),
        spec(
            "a-2",
            "team-a",
            image(hub.clone(), Some(login("alice", PASSWORD_A))),
        ),
        spec("a-3", "team-a", None),
        // Team B: the same registry with B's own login, and a public image (no login).
        spec(
            "b-1",
            "team-b",
            image(
                reference(REGISTRY, "lab/torch"),
                Some(login("bob", PASSWORD_B)),
            ),
        ),
        spec(
            "b-2",
            "team-b",
            image(reference(REGISTRY, "public/r"), None),
        ),
    ];
    let node = node().await;
    let desired: Vec<_> = desired.into_iter().map(|w| (node.clone(), w)).collect();
    let round = log.run(ex.reconcile(&desired)).await.expect("round");
    assert_eq!(round.created, 5, "{round:?}");

    // A's image job: the pinned reference, pulled if not present, with A's pull secret;
    // the image keeps its entrypoint (the command is its arguments); still the team uid.
    let a_secret = pull_secret_name("team-a", REGISTRY);
    assert!(
        a_secret
            .strip_prefix("tessera-pull-")
            .is_some_and(|h| h.len() == 12 && h.bytes().all(|b| b.is_ascii_hexdigit())),
        "{a_secret}"
    );
    let pod = job_pod_spec(&kube, "a-1");
    let c = &pod["containers"][0];
    assert_eq!(c["image"], reference(REGISTRY, "lab/torch"));
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    assert_eq!(pod["imagePullSecrets"], json!([{"name": a_secret}]));
    assert!(c["command"].is_null(), "{c}");
    assert_eq!(
        c["args"],
        json!(["/bin/sh", "-c", "python train.py --epochs 8888"])
    );
    assert_restricted(&pod);
    // The Job controller's pod carries the same (what the kubelet pulls with).
    let pods = kube.list("pods", "tessera.io/run=a-1");
    assert_eq!(
        pods[0]["spec"]["imagePullSecrets"],
        json!([{"name": a_secret}])
    );
    assert_eq!(pods[0]["metadata"]["namespace"], ns("team-a"));

    // A's secret: in A's namespace, Tessera's, of the docker config type, exactly A's login.
    let secret = kube
        .get(&format!(
            "/api/v1/namespaces/{}/secrets/{a_secret}",
            ns("team-a")
        ))
        .expect("A's pull secret");
    assert_eq!(secret["type"], "kubernetes.io/dockerconfigjson");
    assert_eq!(
        secret["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "tessera"
    );
    assert_eq!(secret["metadata"]["labels"]["tessera.io/team"], "team-a");
    assert_eq!(
        secret["metadata"]["annotations"]["tessera.io/registry"],
        REGISTRY
    );
    let config = docker_config(&secret);
    assert_eq!(
        config,
        json!({"auths": {REGISTRY: {
            "username": "alice",
            "password": PASSWORD_A,
            "auth": "YWxpY2U6czNjcmV0LXB3LUE=",
        }}})
    );
    assert_eq!(
        decoded(&config["auths"][REGISTRY]["auth"]),
        format!("alice:{PASSWORD_A}")
    );

    // Docker Hub's login is under the key docker writes for it.
    let hub_secret = pull_secret_name("team-a", "docker.io");
    assert_ne!(hub_secret, a_secret);
    let pod = job_pod_spec(&kube, "a-2");
    assert_eq!(pod["containers"][0]["image"], hub);
    assert_eq!(pod["imagePullSecrets"], json!([{"name": hub_secret}]));
    let secret = kube
        .get(&format!(
            "/api/v1/namespaces/{}/secrets/{hub_secret}",
            ns("team-a")
        ))
        .expect("A's Docker Hub pull secret");
    let auths = docker_config(&secret)["auths"].clone();
    assert_eq!(
        auths
            .as_object()
            .map(|m| m.keys().cloned().collect::<Vec<_>>()),
        Some(vec!["https://index.docker.io/v1/".to_owned()])
    );

    // No image of its own: the server-wide image, as before (its command as is, the
    // cluster's pull policy, no pull secret).
    let pod = job_pod_spec(&kube, "a-3");
    let c = &pod["containers"][0];
    assert_eq!(c["image"], SERVER_WIDE);
    assert!(c["imagePullPolicy"].is_null(), "{c}");
    assert!(pod["imagePullSecrets"].is_null(), "{pod}");
    assert_eq!(
        c["command"],
        json!(["/bin/sh", "-c", "python train.py --epochs 8888"])
    );
    assert!(c["args"].is_null(), "{c}");

    // Team B: its own secret (another name, in its own namespace) with its own login; its
    // public image names none. Nothing of B's names A's secret or holds A's password.
    let b_secret = pull_secret_name("team-b", REGISTRY);
    assert_ne!(b_secret, a_secret);
    let pod = job_pod_spec(&kube, "b-1");
    assert_eq!(pod["imagePullSecrets"], json!([{"name": b_secret}]));
    let secret = kube
        .get(&format!(
            "/api/v1/namespaces/{}/secrets/{b_secret}",
            ns("team-b")
        ))
        .expect("B's pull secret");
    assert_eq!(docker_config(&secret)["auths"][REGISTRY]["username"], "bob");
    let pod = job_pod_spec(&kube, "b-2");
    assert_eq!(pod["containers"][0]["imagePullPolicy"], "IfNotPresent");
    assert!(pod["imagePullSecrets"].is_null(), "{pod}");
    let a_auth = "YWxpY2U6czNjcmV0LXB3LUE=";
    for plural in ["secrets", "pods", "jobs"] {
        for o in kube.list(plural, "tessera.io/team=team-b") {
            assert_eq!(o["metadata"]["namespace"], ns("team-b"), "{o}");
            let text = o.to_string();
            assert!(
                !text.contains(&a_secret) && !text.contains(&hub_secret),
                "{text}"
            );
            let plain = if plural == "secrets" {
                docker_config(&o).to_string()
            } else {
                text
            };
            assert!(
                !plain.contains(PASSWORD_A) && !plain.contains(a_auth),
                "{plain}"
            );
        }
    }
    // B's namespace holds exactly B's one secret; A's holds A's two.
    let names = |team: &str| -> Vec<String> {
        let mut v: Vec<String> = kube
            .list("secrets", &format!("tessera.io/team={team}"))
            .iter()
            .map(|s| s["metadata"]["name"].as_str().expect("name").to_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names("team-b"), vec![b_secret.clone()]);
    let mut want = vec![a_secret.clone(), hub_secret.clone()];
    want.sort();
    assert_eq!(names("team-a"), want);

    // A's login changes: the next pod in that registry brings the same secret (same
    // object) up to date before it is made.
    let path = format!("/api/v1/namespaces/{}/secrets/{a_secret}", ns("team-a"));
    let uid = kube.get(&path).expect("secret")["metadata"]["uid"].clone();
    let mut more = desired.clone();
    more.push((
        node,
        spec(
            "a-4",
            "team-a",
            image(
                reference(REGISTRY, "lab/torch"),
                Some(login("alice", "rotated-pw")),
            ),
        ),
    ));
    let round = log.run(ex.reconcile(&more)).await.expect("round");
    assert_eq!(round.created, 1, "{round:?}");
    let secret = kube.get(&path).expect("secret");
    assert_eq!(secret["metadata"]["uid"], uid, "the same secret, updated");
    assert_eq!(
        docker_config(&secret)["auths"][REGISTRY]["password"],
        "rotated-pw"
    );

    // Written by server-side apply, as Tessera's field manager; a job with no login wrote
    // no secret.
    let applies: Vec<String> = kube
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("PATCH ") && r.contains("/secrets/"))
        .collect();
    assert_eq!(applies.len(), 4, "{applies:?}");
    let used = role_use(&kube);
    let grants = crate::deploy::server_role_grants();
    for (g, r, v) in PULL_SECRET_GRANTS {
        assert!(
            used.contains(&(g.to_owned(), r.to_owned(), v.to_owned())),
            "{used:?}"
        );
    }
    assert!(used.is_subset(&grants), "{used:?} ⊄ {grants:?}");

    // No log line holds a password or its encodings.
    let text = log.text();
    assert!(
        text.contains("DEBUG") || text.contains("TRACE"),
        "captured: {text}"
    );
    assert_no_secret(&text, &[PASSWORD_A, PASSWORD_B, "rotated-pw"]);
}

/// A pull secret the API server refuses (an admission webhook that quotes the request it
/// denies, password and all) stops the pod from being made; the warning that says so
/// names the secret and the refusal but not the password in any encoding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_pull_secret_keeps_the_pod_back_and_the_password_out_of_the_log() {
    let (kube, _dir, ex) = executor().await;
    kube.refuse_writes("secrets");
    let log = Captured::default();
    let w = spec(
        "a-1",
        "team-a",
        image(
            reference(REGISTRY, "lab/torch"),
            Some(login("alice", PASSWORD_A)),
        ),
    );
    let round = log
        .run(ex.reconcile(&[(node().await, w)]))
        .await
        .expect("round");
    assert_eq!(round.created, 0);
    assert!(kube.list("jobs", "tessera.io/run=a-1").is_empty());
    assert!(kube.list("secrets", "").is_empty());
    let text = log.text();
    let warning = text
        .lines()
        .find(|l| l.contains("WARN") && l.contains("creating the workload"))
        .unwrap_or_else(|| panic!("no warning: {text}"));
    assert!(
        warning.contains(&pull_secret_name("team-a", REGISTRY))
            && warning.contains("denied the request")
            && warning.contains("<redacted>"),
        "{warning}"
    );
    assert_no_secret(&text, &[PASSWORD_A]);
    // What the webhook quoted: the secret's data, the whole config in base64.
    let quoted = serde_json::to_value(ByteString(tessera_server::k8s::docker_config_json(
        REGISTRY,
        &login("alice", PASSWORD_A),
    )))
    .expect("base64");
    let quoted = quoted.as_str().expect("a string");
    assert!(
        !text.contains(quoted),
        "the secret's data in the log:\n{text}"
    );
}

/// A spec with an unpinned or unreadable reference makes no pod (the server sends only
/// pinned ones; a tag could move under `IfNotPresent`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpinned_image_makes_no_pod() {
    let (kube, _dir, ex) = executor().await;
    let mut w = spec(
        "a-1",
        "team-a",
        image(format!("{REGISTRY}/lab/torch:2.4"), None),
    );
    w.kind = WorkloadKind::Notebook;
    let round = ex.reconcile(&[(node().await, w)]).await.expect("round");
    assert_eq!(round.created, 0);
    assert!(kube.list("pods", "").is_empty());
}

/// `text` holds none of `passwords`, nor `user:password` in base64 for the test's users.
fn assert_no_secret(text: &str, passwords: &[&str]) {
    for p in passwords {
        assert!(!text.contains(p), "a password in the log:\n{text}");
    }
    for user in ["alice", "bob"] {
        for p in passwords {
            let auth = tessera_server::k8s::docker_auth(&login(user, p));
            assert!(!text.contains(&auth), "an auth field in the log:\n{text}");
        }
    }
}

on_both_databases!(a_catalog_image_reaches_the_pod_with_the_teams_login);

/// Through the REST API: the platform admin allows a registry on loopback (basic auth),
/// the team admin sets the team's login and adds the image (pinned to its digest), a
/// member's job names it, and the Kubernetes executor makes a Job whose pod runs the
/// pinned reference and names the pull secret holding exactly that login.
async fn a_catalog_image_reaches_the_pod_with_the_teams_login(db: Db) {
    use tessera_registry::testkit::{Registry, build_image_plain, push, registry_available};
    if !registry_available() {
        return;
    }
    let secrets = tempfile::tempdir().expect("tempdir");
    let Some(htpasswd) = htpasswd(secrets.path(), "robot", PASSWORD_A) else {
        return;
    };
    let reg = Registry::start(Some(&htpasswd));
    let creds = tessera_registry::Credentials {
        username: "robot".into(),
        password: PASSWORD_A.into(),
    };
    let img = build_image_plain("tessera-k8s-img", &[]);
    push(
        &reqwest::Client::new(),
        &reg,
        "lab/torch",
        "2",
        &img,
        Some(&creds),
    )
    .await;

    let (kube, _dir, a) = on_fake_cluster(db, |c| c.kubernetes.image = SERVER_WIDE.into()).await;
    let admin = a.token().await;
    let t = team(&a, "kimg").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let _agent = SimAgent::start(&a, "gpu-node-3").await;
    let app = &a.app;
    let (s, v) = post_as(
        app,
        &admin,
        "/api/v1/registries",
        json!({"entry": reg.addr}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = call_with_token(
        app,
        &t.team_admin,
        Method::PUT,
        &format!("/api/v1/teams/{}/registry-logins", t.id),
        Some(json!({"registry": reg.addr, "username": "robot", "password": PASSWORD_A})),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = call_with_token(
        app,
        &t.team_admin,
        Method::POST,
        "/api/v1/images",
        Some(json!({"team_id": t.id, "name": "Torch",
                    "reference": format!("{}/lab/torch:2", reg.addr)})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let pinned = format!("{}/lab/torch@{}", reg.addr, img.digest());
    assert_eq!(v["pinned"], pinned);

    let (s, v) = request(app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let alloc = v["id"].as_str().expect("id").to_owned();
    wait_for_state(&a, &alloc, "active").await;
    let (s, job) = call_with_token(
        app,
        &t.member,
        Method::POST,
        "/api/v1/jobs",
        Some(json!({"allocation_id": alloc, "image": "Torch", "command": "python train.py"})),
    )
    .await;
    assert_eq!(s, 201, "{job}");
    let id = job["id"].as_str().expect("id").to_owned();
    let sel = format!("tessera.io/workload={id}");
    let kjob = wait_for_job(&kube, &sel).await;
    let pod = &kjob["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["image"], pinned);
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    assert_eq!(c["args"], json!(["/bin/sh", "-c", "python train.py"]));
    assert_restricted(pod);
    let name = pull_secret_name(&t.id, &reg.addr);
    assert_eq!(pod["imagePullSecrets"], json!([{"name": name}]));
    let secret = kube
        .get(&format!("/api/v1/namespaces/{}/secrets/{name}", ns(&t.id)))
        .expect("the team's pull secret");
    assert_eq!(secret["type"], "kubernetes.io/dockerconfigjson");
    let config = docker_config(&secret);
    assert_eq!(
        config,
        json!({"auths": {reg.addr.clone(): {
            "username": "robot",
            "password": PASSWORD_A,
            "auth": tessera_server::k8s::docker_auth(&login("robot", PASSWORD_A)),
        }}})
    );
    assert_eq!(
        decoded(&config["auths"][reg.addr.as_str()]["auth"]),
        format!("robot:{PASSWORD_A}")
    );
}

async fn wait_for_job(kube: &FakeKube, sel: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(j) = kube.list("jobs", sel).pop() {
            return j;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no Job {sel}: {:?}",
            kube.requests()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
