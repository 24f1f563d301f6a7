//! What the benches share: signing in and calling the REST API of a running server.
//! (Each bench includes this module; not every bench uses every function.)
#![allow(dead_code)]

use serde_json::{Value, json};
use std::time::Duration;

/// `name` from the environment as a number, else `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A free port on loopback (bound and released; fine for a bench).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port")
}

/// `tessera serve` (this build, no simulated nodes, no UI bundle) on a free local port,
/// on `database_url`, its bootstrap admin's password `pw`, with `extra` arguments;
/// killed when dropped. Returns the port and the process.
pub fn serve(database_url: &str, pw: &str, extra: &[&str]) -> (u16, tokio::process::Child) {
    serve_bin(env!("CARGO_BIN_EXE_tessera"), database_url, pw, extra)
}

/// What [`serve`] does, with the `tessera` binary at `bin`.
pub fn serve_bin(
    bin: &str,
    database_url: &str,
    pw: &str,
    extra: &[&str],
) -> (u16, tokio::process::Child) {
    let port = free_port();
    let child = tokio::process::Command::new(bin)
        .args(["serve", "--no-sim", "--bind", &format!("127.0.0.1:{port}")])
        .args([
            "--database-url",
            database_url,
            "--site-root",
            "/nonexistent",
        ])
        .args(extra)
        .env("TESSERA_ADMIN_PASSWORD", pw)
        // Replicas of one PostgreSQL database share their data key.
        .env(
            "TESSERA_DATA_KEY",
            "HcROzxrmpf2OqVvT6xHCt3zygxviuKsr5vruiDhAvRg=",
        )
        .env("RUST_LOG", "error")
        .kill_on_drop(true)
        .spawn()
        .expect("start tessera serve");
    (port, child)
}

/// Waits (at most a minute) until the server at `base` answers `/readyz` with 200.
pub async fn wait_ready(base: &str) {
    let t0 = std::time::Instant::now();
    while !reqwest::get(format!("{base}/readyz"))
        .await
        .is_ok_and(|r| r.status() == 200)
    {
        assert!(t0.elapsed() < Duration::from_secs(60), "server not ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Signs `user` in (retrying while the server is still starting); the session cookie.
pub async fn login(base: &str, user: &str, pw: &str) -> String {
    loop {
        let r = reqwest::Client::new()
            .post(format!("{base}/fn/login"))
            .header("origin", base)
            .form(&[("username", user), ("password", pw)])
            .send()
            .await
            .expect("login");
        if let Some(c) = r
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|c| c.contains("tessera_session="))
            .and_then(|c| c.split(';').next())
        {
            return c.to_owned();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A REST call with a session cookie or an API token: `(status, JSON body or null)`.
pub async fn call(
    base: &str,
    auth: &str,
    m: reqwest::Method,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let mut rb = reqwest::Client::new()
        .request(m, format!("{base}{path}"))
        .header("origin", base);
    rb = if auth.starts_with("tessera_session=") {
        rb.header("cookie", auth)
    } else {
        rb.bearer_auth(auth)
    };
    if !body.is_null() {
        rb = rb.json(&body);
    }
    let r = rb.send().await.expect("request");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Creates user `name` (password `pw`) as `admin` and adds them to `team` as `role`.
pub async fn add_user(base: &str, admin: &str, team: &str, name: &str, pw: &str, role: &str) {
    let (s, v) = call(
        base,
        admin,
        reqwest::Method::POST,
        "/api/v1/users",
        json!({"username": name, "password": pw}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = call(
        base,
        admin,
        reqwest::Method::POST,
        &format!("/api/v1/teams/{team}/members"),
        json!({"username": name, "role": role}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
}

/// A user's API token (signs in once to make it).
pub async fn token_for(base: &str, user: &str, pw: &str) -> String {
    let cookie = login(base, user, pw).await;
    let (s, v) = call(
        base,
        &cookie,
        reqwest::Method::POST,
        "/api/v1/tokens",
        json!({"name": "bench"}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    v["secret"].as_str().expect("secret").to_owned()
}

/// A server run in this process on a fresh SQLite file in `dir`, with one simulated H100
/// node (`tessera-agent` at `agent`, a real `--simulate` process), its bootstrap admin's
/// password `pw`; stopped by [`InProcess::stop`].
pub struct InProcess {
    /// `127.0.0.1:port`.
    pub addr: String,
    /// Its database URL.
    pub url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<()>,
}

impl InProcess {
    pub async fn start(dir: &std::path::Path, pw: &str, agent: std::path::PathBuf) -> InProcess {
        use tessera_server::config::{Secret, ServeConfig};
        let url = format!("sqlite://{}/bench.db?mode=rwc", dir.display());
        let mut config = ServeConfig::for_tests(&url);
        config.admin_password = Some(Secret::new(pw));
        config.site_root = dir.join("site");
        config.no_sim = false;
        config.sim_nodes = "bench-h100=H100-80GB*1".into();
        config.sim_state_dir = dir.join("sim");
        config.agent_bin = Some(agent);
        config.scheduler_interval = Duration::from_millis(200);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            tessera_server::run(config, listener, async {
                let _ = rx.await;
            })
            .await
            .expect("server");
        });
        InProcess {
            addr,
            url,
            stop,
            server,
        }
    }

    /// `http://127.0.0.1:port`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Shuts the server down (waiting at most 20 s).
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(20), self.server).await;
    }
}
