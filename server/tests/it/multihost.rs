//! Tessera across hosts without Kubernetes, on this one machine: network namespaces stand
//! in for a "server host" and two "GPU nodes", joined by a bridge in the server host and
//! a veth pair per node. Addresses come from the benchmarking range 198.18.0.0/15 and
//! exist only inside those namespaces; no namespace has a route out, and the machine's
//! own network is not touched (nothing is created outside the three namespaces, which
//! the test removes). The server terminates TLS with a certificate from a test CA, and
//! the agents join over HTTPS, as README's bare-metal section has it.
//!
//! Needs root and `ip`/`nsenter`; skips with a message elsewhere (fails instead with
//! `TESSERA_REQUIRE_NETNS`, as `cargo xtask test` sets).

use crate::support::wait_until;
use crate::workloads::{WorkloadAgent, execute_on};
use reqwest::Method;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SERVER_IP: &str = "198.18.0.1";
const NODES: [(&str, &str); 2] = [("gpu-node-1", "198.18.0.2"), ("gpu-node-2", "198.18.0.3")];
const PORT: u16 = 3443;
const ADMIN_PW: &str = "multi-host-admin-pw";
const MEMBER_PW: &str = "multi-host-member-pw";

/// Three network namespaces: `[server, node 1, node 2]`, removed on drop.
struct Lab {
    names: Vec<String>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Lab {
    fn create() -> Result<Lab, String> {
        let tag = format!("tsr{}", std::process::id());
        let lab = Lab {
            names: ["srv", "n1", "n2"]
                .iter()
                .map(|n| format!("{tag}-{n}"))
                .collect(),
        };
        for n in &lab.names {
            ip(&["netns", "add", n])?;
        }
        let srv = lab.names[0].as_str();
        let cidr = format!("{SERVER_IP}/24");
        for args in [
            vec!["-n", srv, "link", "add", "br0", "type", "bridge"],
            vec!["-n", srv, "addr", "add", &cidr, "dev", "br0"],
            vec!["-n", srv, "link", "set", "br0", "up"],
            vec!["-n", srv, "link", "set", "lo", "up"],
        ] {
            ip(&args)?;
        }
        for (i, (_, addr)) in NODES.iter().enumerate() {
            let node = lab.names[i + 1].as_str();
            let veth = format!("v{}", i + 1);
            let cidr = format!("{addr}/24");
            for args in [
                vec![
                    "-n", srv, "link", "add", &veth, "type", "veth", "peer", "name", "eth0",
                    "netns", node,
                ],
                vec!["-n", srv, "link", "set", &veth, "master", "br0", "up"],
                vec!["-n", node, "addr", "add", &cidr, "dev", "eth0"],
                vec!["-n", node, "link", "set", "eth0", "up"],
                vec!["-n", node, "link", "set", "lo", "up"],
            ] {
                ip(&args)?;
            }
        }
        Ok(lab)
    }

    fn path(&self, i: usize) -> String {
        format!("/run/netns/{}", self.names[i])
    }

    /// The prefix that runs a program on host `i`.
    fn on_host(&self, i: usize) -> Vec<String> {
        vec!["nsenter".into(), format!("--net={}", self.path(i))]
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

/// A test CA, and the server's certificate from it: the server's address, and the
/// notebooks' wildcard domain.
struct Pki {
    ca_pem: String,
    ca_file: PathBuf,
    cert_file: PathBuf,
    key_file: PathBuf,
}

pub(crate) fn test_ca(name: &str) -> (rcgen::Certificate, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = rcgen::KeyPair::generate().expect("ca key");
    let cert = params.self_signed(&key).expect("ca cert");
    (cert, rcgen::Issuer::new(params, key))
}

/// A server certificate for `names` (DNS names or IP addresses) signed by `issuer`:
/// `(chain PEM, key PEM)`.
pub(crate) fn server_cert(
    names: &[&str],
    issuer: &rcgen::Issuer<'static, rcgen::KeyPair>,
) -> (String, String) {
    let params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .expect("params");
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, issuer).expect("sign");
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let (ca, issuer) = test_ca("Tessera multi-host test CA");
        let (cert, key) = server_cert(&[SERVER_IP, "*.nb.lab.test"], &issuer);
        let pki = Pki {
            ca_pem: ca.pem(),
            ca_file: dir.join("ca.pem"),
            cert_file: dir.join("server.pem"),
            key_file: dir.join("server.key"),
        };
        std::fs::write(&pki.ca_file, &pki.ca_pem).expect("write ca");
        std::fs::write(&pki.cert_file, cert).expect("write cert");
        std::fs::write(&pki.key_file, key).expect("write key");
        pki
    }

    /// An HTTPS client trusting the test CA only.
    fn client(&self, resolve: &[(&str, std::net::SocketAddr)]) -> reqwest::Client {
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(
                reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).expect("ca"),
            )
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(30));
        for (host, addr) in resolve {
            b = b.resolve(host, *addr);
        }
        b.build().expect("client")
    }
}

#[test]
fn a_lab_of_three_hosts_over_tls() {
    let lab = match Lab::create() {
        Ok(lab) => lab,
        Err(why) => {
            assert!(
                std::env::var_os("TESSERA_REQUIRE_NETNS").is_none(),
                "TESSERA_REQUIRE_NETNS is set but network namespaces cannot be made: {why}"
            );
            eprintln!(
                "multi-host test skipped: network namespaces cannot be made here ({why}); \
                 it needs root, `ip` and `nsenter`"
            );
            return;
        }
    };
    let run = std::thread::spawn(move || {
        // From here on this thread, and every thread and process it starts, is on the
        // server host.
        enter_network_namespace(&lab.path(0));
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(on_the_server_host(&lab));
        drop(lab);
    });
    if let Err(panic) = run.join() {
        std::panic::resume_unwind(panic);
    }
}

/// Moves the calling thread (only) into the network namespace at `path`; threads and
/// processes it starts afterwards are born there.
#[allow(unsafe_code)]
fn enter_network_namespace(path: &str) {
    let ns = std::fs::File::open(path).expect("namespace file");
    // SAFETY: `ns` is an open namespace file for the duration of the call; setns with
    // CLONE_NEWNET changes this thread's network namespace and nothing else.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
}

/// `(status, JSON or null)` for a bearer-token call.
async fn call(
    c: &reqwest::Client,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let rb = c
        .request(method, format!("https://{SERVER_IP}:{PORT}{path}"))
        .bearer_auth(token);
    crate::support::json_call(rb, body).await
}

/// `POST body` to `path` with a bearer token: `(status, JSON or null)`.
async fn post(c: &reqwest::Client, token: &str, path: &str, body: Value) -> (u16, Value) {
    call(c, token, Method::POST, path, Some(body)).await
}

/// `PUT body` to `path` with a bearer token: `(status, JSON or null)`.
async fn put(c: &reqwest::Client, token: &str, path: &str, body: Value) -> (u16, Value) {
    call(c, token, Method::PUT, path, Some(body)).await
}

/// `GET path` with a bearer token: `(status, JSON or null)`.
async fn get(c: &reqwest::Client, token: &str, path: &str) -> (u16, Value) {
    call(c, token, Method::GET, path, None).await
}

/// Signs in through the login server function: the session cookie.
async fn sign_in(c: &reqwest::Client, user: &str, pw: &str) -> String {
    let base = format!("https://{SERVER_IP}:{PORT}");
    let r = c
        .post(format!("{base}/fn/login"))
        .header("origin", &base)
        .form(&[("username", user), ("password", pw)])
        .send()
        .await
        .expect("login");
    assert!(r.status().is_success(), "login {user}: {}", r.status());
    let cookie = crate::support::set_cookies(&r)
        .into_iter()
        .find(|c| c.contains("tessera_session="))
        .expect("session cookie");
    assert!(
        cookie.starts_with("__Host-") && cookie.contains("Secure"),
        "over https the session cookie is Secure and host-only: {cookie}"
    );
    cookie.split(';').next().expect("name=value").to_owned()
}

async fn api_token(c: &reqwest::Client, cookie: &str) -> String {
    let base = format!("https://{SERVER_IP}:{PORT}");
    crate::support::mint_token(c, &base, cookie, "multi-host").await
}

/// The workload `id` once its state is one of `states` (within `secs`).
async fn settled(c: &reqwest::Client, token: &str, id: &str, states: &[&str], secs: u64) -> Value {
    let path = format!("/api/v1/workloads/{id}");
    wait_until(
        &format!("{id} never reached {states:?}"),
        secs,
        400,
        || async {
            let (_, v) = call(c, token, Method::GET, &path, None).await;
            let state = v["state"].as_str().unwrap_or("");
            (states.contains(&state), v)
        },
    )
    .await
}

async fn on_the_server_host(lab: &Lab) {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let public = format!("https://{SERVER_IP}:{PORT}");
    // README, "Many nodes without Kubernetes": the server with its certificate.
    let mut server = tokio::process::Command::new(&lab.on_host(0)[0])
        .args(&lab.on_host(0)[1..])
        .arg(env!("CARGO_BIN_EXE_tessera"))
        .arg("serve")
        .env("TESSERA_BIND", format!("{SERVER_IP}:{PORT}"))
        .env("TESSERA_PUBLIC_URL", &public)
        .env("TESSERA_TLS_CERT", &pki.cert_file)
        .env("TESSERA_TLS_KEY", &pki.key_file)
        .env("TESSERA_NOTEBOOK_HOST", format!("nb.lab.test:{PORT}"))
        .env(
            "TESSERA_DATABASE_URL",
            format!("sqlite://{}/tessera.db?mode=rwc", dir.path().display()),
        )
        .env("TESSERA_ADMIN_PASSWORD", ADMIN_PW)
        .env("TESSERA_NO_SIM", "true")
        .env("TESSERA_SITE_ROOT", dir.path().join("site"))
        .env("TESSERA_SCHEDULER_INTERVAL", "1s")
        .kill_on_drop(true)
        .spawn()
        .expect("start tessera serve");
    let c = pki.client(&[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !c
        .get(format!("{public}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        if let Ok(Some(exit)) = server.try_wait() {
            panic!("tessera serve exited: {exit}");
        }
        assert!(
            Instant::now() < deadline,
            "the server never became ready over https"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Only TLS on that port.
    let plain = reqwest::Client::new()
        .get(format!("http://{SERVER_IP}:{PORT}/healthz"))
        .send()
        .await;
    assert!(
        plain.map(|r| !r.status().is_success()).unwrap_or(true),
        "plain HTTP is not served"
    );

    let admin = api_token(&c, &sign_in(&c, "admin", ADMIN_PW).await).await;
    let (s, team) = post(&c, &admin, "/api/v1/teams", json!({"name": "lab"})).await;
    assert_eq!(s, 201, "{team}");
    let team = team["id"].as_str().expect("team id").to_owned();
    let user = json!({"username": "researcher", "password": MEMBER_PW});
    let (s, v) = post(&c, &admin, "/api/v1/users", user).await;
    assert_eq!(s, 201, "{v}");
    let members = format!("/api/v1/teams/{team}/members");
    let role = json!({"username": "researcher", "role": "member"});
    let (s, v) = post(&c, &admin, &members, role).await;
    assert_eq!(s, 201, "{v}");
    let quota = format!("/api/v1/teams/{team}/quotas/H100-80GB");
    let limits = json!({"guaranteed": 14, "limit": 14, "per_user": 14});
    let (s, v) = put(&c, &admin, &quota, limits).await;
    assert_eq!(s, 200, "{v}");

    // Each GPU node: a join token, and the agent over HTTPS trusting the lab's CA.
    let mut tokens = Vec::new();
    for (name, _) in NODES {
        let (s, jt) = post(&c, &admin, "/api/v1/join-tokens", json!({"note": name})).await;
        assert_eq!(s, 201, "{jt}");
        tokens.push(jt["secret"].as_str().expect("secret").to_owned());
    }
    // Plain HTTP across the network is refused before the join token is spent.
    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(&lab.on_host(1)[0])
            .args(&lab.on_host(1)[1..])
            .arg(crate::support::agent_bin())
            .args(["--simulate", "--gpus", "H100-80GB"])
            .args(["--server", &format!("http://{SERVER_IP}:{PORT}")])
            .args(["--join-token", &tokens[0]])
            .args([
                "--state-dir",
                &dir.path().join("refused").display().to_string(),
            ])
            .output(),
    )
    .await
    .expect("the agent answers at once")
    .expect("run tessera-agent");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("--insecure-http"), "{stderr}");

    let server_url = public.clone();
    let agents: Vec<WorkloadAgent> = NODES
        .iter()
        .enumerate()
        .map(|(i, (name, addr))| {
            WorkloadAgent::start_with(
                &server_url,
                &tokens[i],
                name,
                &lab.on_host(i + 1),
                &[
                    "--ca-file".into(),
                    pki.ca_file.display().to_string(),
                    "--workload-host".into(),
                    (*addr).into(),
                    // Each node's workloads in a range of their own, to tell them apart.
                    "--sandbox-net".into(),
                    format!("10.213.{}.0/24", i + 1),
                    // The gang scripts and JAX's environment, read-only in the sandbox.
                    "--sandbox-ro".into(),
                    gang_read_only(),
                ],
            )
        })
        .collect();
    wait_until("both nodes report in", 90, 400, || async {
        let (_, nodes) = call(&c, &admin, Method::GET, "/api/v1/nodes", None).await;
        let online = nodes
            .as_array()
            .or_else(|| nodes["items"].as_array())
            .map(|n| {
                n.iter()
                    .filter(|n| n["gpus"].as_array().is_some_and(|g| !g.is_empty()))
                    .count()
            })
            .unwrap_or(0);
        (online == NODES.len(), nodes)
    })
    .await;

    // The researcher: a whole-GPU-sized slice lands on each node.
    let member = api_token(&c, &sign_in(&c, "researcher", MEMBER_PW).await).await;
    let mut on_node = std::collections::BTreeMap::new();
    for _ in NODES {
        let (s, a) = post(
            &c,
            &member,
            "/api/v1/allocations",
            json!({"team_id": team, "kind": "H100-80GB:7g.80gb", "purpose": "lab"}),
        )
        .await;
        assert_eq!(s, 201, "{a}");
        let id = a["id"].as_str().expect("id").to_owned();
        let active = wait_until("the slice never became active", 120, 400, || async {
            let (_, v) = get(&c, &member, &format!("/api/v1/allocations/{id}")).await;
            (v["state"] == "active", v)
        })
        .await;
        assert!(active["devices"][0]["mig_uuid"].is_string(), "{active}");
        let host = active["devices"][0]["hostname"]
            .as_str()
            .expect("hostname")
            .to_owned();
        on_node.insert(host, id);
    }
    assert_eq!(on_node.len(), 2, "one slice on each node: {on_node:?}");

    // A job on each node runs there, in a network of its own: it sees only its own address
    // in that node's workload range, nothing of the node's or the other node's.
    for (i, (name, addr)) in NODES.iter().enumerate() {
        let (s, job) = post(
            &c,
            &member,
            "/api/v1/jobs",
            json!({"allocation_id": on_node[*name], "command": "cat /proc/net/fib_trie"}),
        )
        .await;
        assert_eq!(s, 201, "{job}");
        let id = job["id"].as_str().expect("id").to_owned();
        let done = settled(
            &c,
            &member,
            &id,
            &["succeeded", "failed", "lost", "cancelled"],
            120,
        )
        .await;
        let (_, log) = get(&c, &member, &format!("/api/v1/workloads/{id}/logs?from=0")).await;
        assert_eq!(done["state"], "succeeded", "{done}\n{log}");
        let text = log["text"].as_str().unwrap_or("");
        let seen: std::collections::BTreeSet<&str> = text.split_whitespace().collect();
        let mine = format!("10.213.{}.", i + 1);
        assert!(
            seen.iter().any(|w| w.starts_with(&mine)),
            "{name}'s job ran elsewhere: {text}"
        );
        assert!(
            !seen.contains(addr),
            "{name}'s job sees its node's address: {text}"
        );
        for (j, (other, other_addr)) in NODES.iter().enumerate() {
            if other != name {
                let theirs = format!("10.213.{}.", j + 1);
                assert!(
                    !seen.contains(other_addr) && !seen.iter().any(|w| w.starts_with(&theirs)),
                    "{name}'s job saw {other}: {text}"
                );
            }
        }
    }

    // A notebook on node 2 answers through the server's proxy, over TLS.
    let (node2, _) = NODES[1];
    let (s, nb) = post(
        &c,
        &member,
        "/api/v1/notebooks",
        json!({"allocation_id": on_node[node2], "name": "lab"}),
    )
    .await;
    assert_eq!(s, 201, "{nb}");
    let id = nb["id"].as_str().expect("id").to_owned();
    let running = settled(&c, &member, &id, &["running", "failed", "lost"], 180).await;
    assert_eq!(running["state"], "running", "{running}");
    let base = "/user/researcher/lab/";
    let (s, contents) = get(&c, &member, &format!("{base}api/contents")).await;
    assert_eq!(s, 200, "{contents}");
    assert_eq!(contents["type"], "directory", "{contents}");

    // In a browser: the portal sends the member to the notebook's own https origin.
    let cookie = sign_in(&c, "researcher", MEMBER_PW).await;
    let r = c
        .get(format!("{public}{base}lab"))
        .header("cookie", &cookie)
        .header("accept", "text/html")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 303);
    let entry = reqwest::Url::parse(r.headers()["location"].to_str().expect("location"))
        .expect("entry url");
    assert_eq!(entry.scheme(), "https", "{entry}");
    let nb_host = entry.host_str().expect("host").to_owned();
    assert!(nb_host.ends_with(".nb.lab.test"), "{entry}");
    let server_addr: std::net::SocketAddr = format!("{SERVER_IP}:{PORT}").parse().expect("addr");
    let browser = pki.client(&[(&nb_host, server_addr)]);
    let r = browser.get(entry.as_str()).send().await.expect("enter");
    assert_eq!(r.status(), 303);
    let pass = crate::support::set_cookies(&r)
        .into_iter()
        .next()
        .expect("a pass for the notebook's origin");
    assert!(pass.contains("Secure"), "{pass}");
    let r = browser
        .get(format!("https://{nb_host}:{PORT}{base}api/contents"))
        .header("cookie", pass.split(';').next().expect("name=value"))
        .send()
        .await
        .expect("contents");
    assert_eq!(r.status(), 200);

    // A kernel on node 2, driven over a WebSocket through the TLS proxy.
    let (s, kernel) = post(
        &c,
        &member,
        &format!("{base}api/kernels"),
        json!({"name": "python3"}),
    )
    .await;
    assert_eq!(s, 201, "{kernel}");
    let kernel = kernel["id"].as_str().expect("kernel id");
    let mut ws = wss(
        &pki,
        &format!("wss://{SERVER_IP}:{PORT}{base}api/kernels/{kernel}/channels"),
        &member,
    )
    .await;
    let code = "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
                s.connect(('198.18.0.1', 9)); s.getsockname()[0]";
    let seen = execute_on(&mut ws, code, Duration::from_secs(60))
        .await
        .expect("the kernel answers");
    // Its own address in node 2's workload range (the node routes it).
    assert!(
        seen.starts_with("'10.213.2."),
        "the kernel runs on node 2, in its own network: {seen}"
    );

    // A gang across the two hosts: MPI through tessera-rsh, then JAX's distributed
    // runtime. The slices and the notebook go first.
    let stop = format!("/api/v1/workloads/{id}/stop");
    let (s, v) = call(&c, &member, Method::POST, &stop, None).await;
    assert_eq!(s, 200, "{v}");
    for alloc in on_node.values() {
        let release = format!("/api/v1/allocations/{alloc}/release");
        let (s, v) = call(&c, &member, Method::POST, &release, None).await;
        assert_eq!(s, 200, "{v}");
    }
    gang_across_hosts(&c, &member, &admin, &team).await;

    for a in agents {
        a.stop().await;
    }
}

/// The repository's gang scripts, and JAX's environment when the tests have one, for the
/// agents' `--sandbox-ro` (besides what the environment already lists).
fn gang_read_only() -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository")
        .to_path_buf();
    let mut paths: Vec<String> = std::env::var("TESSERA_AGENT_SANDBOX_RO")
        .ok()
        .map(|v| {
            v.split(',')
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    paths.push(repo.join("e2e/gang").display().to_string());
    if let Some(venv) = jax_venv() {
        paths.push(venv.display().to_string());
    }
    paths.join(",")
}

/// `.venv-jax` (`TESSERA_TEST_JAX_PYTHON` is its `bin/python`, as `cargo xtask test` sets).
fn jax_venv() -> Option<PathBuf> {
    let python = PathBuf::from(std::env::var_os("TESSERA_TEST_JAX_PYTHON")?);
    Some(python.parent()?.parent()?.to_path_buf())
}

/// The first line of `text` that parses as a JSON object with `key`.
fn json_line(text: &str, key: &str) -> Option<Value> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .find(|v| v.get(key).is_some())
}

/// A 2-node gang job (one 7g.80gb slice on each host), run to success; its view.
async fn gang_job(
    c: &reqwest::Client,
    member: &str,
    team: &str,
    name: &str,
    launcher: &str,
    command: &str,
) -> Value {
    let (s, job) = post(
        c,
        member,
        "/api/v1/jobs",
        json!({"team_id": team, "name": name, "command": command,
                    "gpu": "H100-80GB:7g.80gb", "nodes": 2, "gpus_per_node": 1,
                    "launcher": launcher, "time_limit_minutes": 30}),
    )
    .await;
    assert_eq!(s, 201, "{job}");
    let id = job["id"].as_str().expect("id").to_owned();
    let done = settled(
        c,
        member,
        &id,
        &["succeeded", "failed", "lost", "cancelled"],
        300,
    )
    .await;
    if done["state"] != "succeeded" {
        let mut logs = String::new();
        for rank in 0..2 {
            let (_, log) = get(
                c,
                member,
                &format!("/api/v1/workloads/{id}/logs?from=0&rank={rank}"),
            )
            .await;
            logs.push_str(&format!(
                "--- rank {rank}\n{}\n",
                log["text"].as_str().unwrap_or("")
            ));
        }
        panic!("the {name} gang did not succeed: {done}\n{logs}");
    }
    done
}

async fn gang_log(c: &reqwest::Client, member: &str, id: &str, rank: u32) -> String {
    let (s, log) = get(
        c,
        member,
        &format!("/api/v1/workloads/{id}/logs?from=0&rank={rank}"),
    )
    .await;
    assert_eq!(s, 200, "{log}");
    log["text"].as_str().unwrap_or_default().to_owned()
}

async fn gang_across_hosts(c: &reqwest::Client, member: &str, admin: &str, team: &str) {
    // Both slices are given back before the gang asks for the same capacity.
    wait_until("the slices were never given back", 120, 400, || async {
        let (_, q) = get(c, admin, &format!("/api/v1/teams/{team}/quotas")).await;
        let used = q
            .as_array()
            .and_then(|q| q.first())
            .and_then(|q| q["used"].as_u64());
        (used == Some(0), q)
    })
    .await;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository");
    let scripts = repo.join("e2e/gang");

    // MPI: rank 0 runs mpirun; Open MPI starts rank 1's daemon on the other host through
    // tessera-rsh, inside the other member's sandbox.
    let done = gang_job(
        c,
        member,
        team,
        "mpi",
        "rank0",
        &format!(
            "mpirun --hostfile \"$TESSERA_HOSTFILE\" -np 2 /usr/bin/python3 {}",
            scripts.join("allreduce.py").display()
        ),
    )
    .await;
    let ranks = done["ranks"].as_array().expect("ranks").clone();
    assert_eq!(ranks.len(), 2, "{done}");
    let addrs: Vec<String> = ranks
        .iter()
        .map(|r| r["addr"].as_str().expect("addr").to_owned())
        .collect();
    for addr in &addrs {
        assert!(
            addr.starts_with("10.213."),
            "a member's own address: {done}"
        );
    }
    let hosts: std::collections::BTreeSet<&str> = ranks
        .iter()
        .filter_map(|r| r["hostname"].as_str())
        .collect();
    assert_eq!(hosts.len(), 2, "one member on each host: {done}");
    let id = done["id"].as_str().expect("id");
    let log = gang_log(c, member, id, 0).await;
    let out = json_line(&log, "world_size").unwrap_or_else(|| panic!("no MPI result: {log}"));
    assert_eq!(out["world_size"], 2, "{out}");
    assert_eq!(out["sum"], out["expected_sum"], "{out}");
    let seen = rank_ips(&out);
    let want: std::collections::BTreeSet<String> = addrs.iter().cloned().collect();
    assert_eq!(
        seen, want,
        "each MPI rank ran in its own member, on its own host: {out}"
    );
    // Each in its sandbox: the team's uid (not root), and its own member's slice.
    let mpi_ranks = out["ranks"].as_array().expect("ranks");
    for r in mpi_ranks {
        let uid = r["uid"].as_u64().expect("uid");
        assert!(
            uid != 0 && uid == mpi_ranks[0]["uid"].as_u64().unwrap_or(0),
            "{out}"
        );
        let member_devices = ranks
            .iter()
            .find(|m| m["addr"] == r["ip"])
            .map(|m| m["devices"].clone())
            .expect("the rank's member");
        assert_eq!(
            json!([r["cuda_visible_devices"]]),
            member_devices,
            "each rank sees its own member's slice: {out}"
        );
    }

    // JAX: every member runs the script; jax.distributed joins them with Tessera's
    // variables and a cross-process collective proves both took part.
    let Some(venv) = jax_venv() else {
        assert!(
            std::env::var_os("TESSERA_REQUIRE_NETNS").is_none(),
            "TESSERA_TEST_JAX_PYTHON is not set (cargo xtask test provisions .venv-jax)"
        );
        eprintln!("the JAX gang is skipped: TESSERA_TEST_JAX_PYTHON is not set");
        return;
    };
    let done = gang_job(
        c,
        member,
        team,
        "jax",
        "each",
        &format!(
            "{} {}",
            venv.join("bin/python").display(),
            scripts.join("jax_allreduce.py").display()
        ),
    )
    .await;
    let id = done["id"].as_str().expect("id");
    let ranks = done["ranks"].as_array().expect("ranks").clone();
    let addrs: std::collections::BTreeSet<String> = ranks
        .iter()
        .filter_map(|r| r["addr"].as_str().map(str::to_owned))
        .collect();
    for rank in 0..2u32 {
        let log = gang_log(c, member, id, rank).await;
        let out =
            json_line(&log, "process_count").unwrap_or_else(|| panic!("no JAX result: {log}"));
        assert_eq!(out["process_count"], 2, "{out}");
        assert_eq!(out["process_id"], rank, "{out}");
        assert_eq!(out["sum"], 30, "{out}");
        let seen = rank_ips(&out);
        assert_eq!(
            seen, addrs,
            "both processes joined, each from its member: {out}"
        );
    }
}

/// The addresses a gang's ranks report in `out["ranks"]`.
fn rank_ips(out: &Value) -> std::collections::BTreeSet<String> {
    out["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .filter_map(|r| r["ip"].as_str().map(str::to_owned))
        .collect()
}

/// A WebSocket over TLS to the server, trusting the test CA only.
async fn wss(
    pki: &Pki,
    url: &str,
    token: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    let ca =
        rustls::pki_types::CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).expect("ca der");
    roots.add(ca).expect("trust the ca");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect((SERVER_IP, PORT))
        .await
        .expect("tcp");
    let name = rustls::pki_types::ServerName::try_from(SERVER_IP).expect("server name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS to the server");
    let req = crate::ws_connect::bearer_request(url, token);
    let (ws, resp) = tokio_tungstenite::client_async(req, tls)
        .await
        .expect("websocket through the TLS proxy");
    assert_eq!(resp.status(), 101);
    ws
}
