//! `TestApp::spawn(Db::Sqlite)` boots the whole app on a fresh database.

use reqwest::header::{HeaderMap, HeaderValue};
use tessera_server::config::{Secret, ServeConfig};
use tokio::sync::oneshot;

pub const ADMIN_PASSWORD: &str = "integration-admin-pw";
/// The data key of PostgreSQL test servers (every replica of one database needs the same);
/// SQLite ones generate theirs beside the database, as the embedded default does.
pub const TEST_DATA_KEY: &str = "HcROzxrmpf2OqVvT6xHCt3zygxviuKsr5vruiDhAvRg=";

#[derive(Debug, Clone, Copy)]
pub enum Db {
    Sqlite,
    Postgres,
}

pub struct TestApp {
    pub base: String,
    pub database_url: String,
    config: ServeConfig,
    pub addr: std::net::SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
    /// Whether dropping this app drops its PostgreSQL database (not for a replica).
    owns_database: bool,
}

/// Runs each listed test body once per database backend.
#[macro_export]
macro_rules! on_both_databases {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name($crate::support::Db::Sqlite).await } )*
        }
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() {
                   if $crate::support::postgres_url().is_none() { return; }
                   super::$name($crate::support::Db::Postgres).await
               } )*
        }
    };
}

/// The PostgreSQL server to test against. With `TESSERA_REQUIRE_PG` set (CI), its absence
/// fails the run instead of skipping.
pub fn postgres_url() -> Option<String> {
    match std::env::var("TESSERA_TEST_PG_URL") {
        Ok(u) => Some(u),
        Err(_) if std::env::var_os("TESSERA_REQUIRE_PG").is_some() => {
            panic!("TESSERA_REQUIRE_PG is set but TESSERA_TEST_PG_URL is not")
        }
        Err(_) => {
            eprintln!("PostgreSQL tests skipped: set TESSERA_TEST_PG_URL (cargo xtask test does)");
            None
        }
    }
}

/// A fresh, empty database on the configured PostgreSQL server.
pub async fn fresh_pg_database() -> String {
    use sqlx::Connection;
    let url = postgres_url().expect("postgres url");
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(&url)
        .await
        .expect("connect to PostgreSQL");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .expect("create database");
    let (base, _) = url.rsplit_once('/').expect("url has a database part");
    format!("{base}/{name}")
}

/// Drops a PostgreSQL test database (closing whatever still uses it), so a run's throwaway
/// cluster does not grow by a database per test. Runs on its own thread: `Drop` cannot
/// await, and the test's runtime may be shutting down.
fn drop_pg_database(url: &str) {
    use sqlx::Connection;
    let (Some(admin), Some((_, name))) = (postgres_url(), url.rsplit_once('/')) else {
        return;
    };
    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
    let done = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        rt.block_on(async {
            let mut conn = sqlx::PgConnection::connect(&admin).await.ok()?;
            sqlx::query(&sql).execute(&mut conn).await.ok()
        })
    })
    .join();
    if !matches!(done, Ok(Some(_))) {
        eprintln!("note: could not drop test database {name}");
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if self.owns_database && self.database_url.starts_with("postgres") {
            drop_pg_database(&self.database_url);
        }
    }
}

impl TestApp {
    pub async fn spawn(db: Db) -> TestApp {
        Self::spawn_with(db, |_| {}).await
    }

    pub async fn spawn_with(db: Db, tweak: impl FnOnce(&mut ServeConfig)) -> TestApp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        Self::spawn_on(db, listener, tweak).await
    }

    /// Boots on a listener the test bound itself (when something must know the address
    /// before the app starts, such as an identity provider's redirect URI).
    pub async fn spawn_on(
        db: Db,
        listener: tokio::net::TcpListener,
        tweak: impl FnOnce(&mut ServeConfig),
    ) -> TestApp {
        let url = match db {
            Db::Sqlite => None,
            Db::Postgres => Some(fresh_pg_database().await),
        };
        Self::boot(url, true, listener, tweak).await
    }

    /// A server on the existing database at `url` (migrated forward as it starts), which
    /// it owns from then on (a PostgreSQL database is dropped with it).
    pub async fn spawn_existing(url: String) -> TestApp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        Self::boot(Some(url), true, listener, |_| {}).await
    }

    /// Another server on `other`'s database: a second replica (PostgreSQL).
    pub async fn replica_of(other: &TestApp, tweak: impl FnOnce(&mut ServeConfig)) -> TestApp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        Self::boot(Some(other.database_url.clone()), false, listener, tweak).await
    }

    /// Boots on `listener` against `url` (`None`: a fresh SQLite file in its own folder).
    async fn boot(
        url: Option<String>,
        owns_database: bool,
        listener: tokio::net::TcpListener,
        tweak: impl FnOnce(&mut ServeConfig),
    ) -> TestApp {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = url.unwrap_or_else(|| format!("sqlite://{}/t.db?mode=rwc", dir.path().display()));
        let mut config = ServeConfig::for_tests(&url);
        config.admin_password = Some(Secret::new(ADMIN_PASSWORD));
        config.site_root = dir.path().join("site");
        if url.starts_with("postgres") {
            config.data_key = Some(Secret::new(TEST_DATA_KEY));
        }
        tweak(&mut config);
        let addr = listener.local_addr().expect("addr");
        let scheme = if config.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        let mut app = TestApp {
            base: format!("{scheme}://{addr}"),
            database_url: url,
            config,
            addr,
            shutdown: None,
            server: None,
            _dir: dir,
            owns_database,
        };
        app.serve(listener).await;
        app
    }

    async fn serve(&mut self, listener: tokio::net::TcpListener) {
        let (tx, rx) = oneshot::channel::<()>();
        let config = self.config.clone();
        self.server = Some(tokio::spawn(async move {
            if let Err(e) = tessera_server::run(config, listener, async {
                let _ = rx.await;
            })
            .await
            {
                panic!("server failed: {e:#}");
            }
        }));
        self.shutdown = Some(tx);
        self.wait_ready().await;
    }

    /// Shuts the server down (gracefully) and waits until it has stopped.
    pub async fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.server.take() {
            h.await.expect("server task");
        }
    }

    /// Starts the server again on the same address and database.
    pub async fn start_again(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .expect("rebind");
        self.serve(listener).await;
    }

    async fn wait_ready(&self) {
        // Only "is it up": a TLS test checks the certificate with clients of its own.
        let c = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
            .expect("client");
        for _ in 0..300 {
            if let Ok(r) = c.get(format!("{}/readyz", self.base)).send().await
                && r.status().is_success()
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("app did not become ready");
    }

    /// A browser-like client: keeps cookies, sends a same-origin `Origin`.
    pub fn browser(&self) -> Browser {
        let mut h = HeaderMap::new();
        h.insert("origin", HeaderValue::from_str(&self.base).expect("origin"));
        Browser {
            client: reqwest::Client::builder()
                .cookie_store(true)
                .redirect(reqwest::redirect::Policy::none())
                .default_headers(h)
                // A request that never answers fails its test instead of stalling the suite.
                .timeout(std::time::Duration::from_secs(120))
                .build()
                .expect("client"),
            base: self.base.clone(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The Prometheus text at `/metrics`.
    pub async fn metrics(&self) -> String {
        reqwest::get(self.url("/metrics"))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    }

    /// A second set of services over this app's database, for driving a pass with a
    /// clock of the test's choosing (`tick(later)`).
    pub async fn side_services(&self) -> (tessera_core::Services, tessera_core::auth::SystemActor) {
        let store = tessera_core::store::Store::connect(&self.database_url)
            .await
            .expect("store");
        let (services, system) = services_over(store);
        (
            services.with_data_keys(std::sync::Arc::new(self.data_keys())),
            system,
        )
    }

    /// The data keys this app seals secrets with.
    pub fn data_keys(&self) -> tessera_core::at_rest::DataKeys {
        tessera_server::data_keys::load(&self.config).expect("data keys")
    }
}

pub struct Browser {
    pub client: reqwest::Client,
    pub base: String,
}

impl Browser {
    /// Calls a server function the way the hydrated UI does (form-encoded in, JSON out).
    pub async fn call(&self, name: &str, form: &[(&str, &str)]) -> reqwest::Response {
        self.client
            .post(format!("{}/fn/{name}", self.base))
            .form(form)
            .send()
            .await
            .expect("request")
    }

    pub async fn login(&self, username: &str, password: &str) -> reqwest::Response {
        self.call("login", &[("username", username), ("password", password)])
            .await
    }

    /// The HTML of the page at `path` (a path on this server, or a URL).
    pub async fn page(&self, path: &str) -> String {
        let url = if path.starts_with('/') {
            format!("{}{path}", self.base)
        } else {
            path.to_owned()
        };
        self.client
            .get(url)
            .send()
            .await
            .expect("page")
            .text()
            .await
            .expect("body")
    }

    /// `Some(username)` when the session is signed in.
    pub async fn whoami(&self) -> Option<String> {
        let r = self.call("current_user", &[]).await;
        assert!(r.status().is_success(), "current_user: {}", r.status());
        let v: serde_json::Value = r.json().await.expect("json");
        v.get("username")
            .and_then(|u| u.as_str())
            .map(str::to_owned)
    }
}

/// The session cookie (`name=value`) a response sets, if any.
pub fn session_cookie(r: &reqwest::Response) -> Option<String> {
    set_cookies(r)
        .into_iter()
        .find(|c| c.contains("tessera_session="))
        .and_then(|c| c.split(';').next().map(str::to_owned))
}

pub fn set_cookies(r: &reqwest::Response) -> Vec<String> {
    r.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect()
}

pub async fn error_kind(r: reqwest::Response) -> (u16, serde_json::Value) {
    let status = r.status().as_u16();
    let v: serde_json::Value = r.json().await.expect("json error body");
    (status, v)
}

/// Signs in through the login server function; returns the session cookie.
pub async fn login(app: &TestApp, user: &str, pw: &str) -> String {
    let r = reqwest::Client::new()
        .post(app.url("/fn/login"))
        .header("origin", &app.base)
        .form(&[("username", user), ("password", pw)])
        .send()
        .await
        .expect("request");
    assert!(r.status().is_success(), "login {user}: {}", r.status());
    session_cookie(&r).expect("session cookie")
}

/// A new API token named `name`, minted with the session `cookie` through `c` at `base`.
pub async fn mint_token(c: &reqwest::Client, base: &str, cookie: &str, name: &str) -> String {
    let r = c
        .post(format!("{base}/api/v1/tokens"))
        .header("origin", base)
        .header("cookie", cookie)
        .json(&serde_json::json!({"name": name}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 201);
    r.json::<serde_json::Value>().await.expect("json")["secret"]
        .as_str()
        .expect("secret")
        .to_owned()
}

/// The platform admin, calling the REST API with a browser session.
pub struct AdminClient {
    pub app: TestApp,
    cookie: String,
}

impl AdminClient {
    pub async fn new(db: Db) -> AdminClient {
        AdminClient::with_app(TestApp::spawn(db).await).await
    }

    pub async fn with_app(app: TestApp) -> AdminClient {
        let cookie = login(&app, "admin", ADMIN_PASSWORD).await;
        AdminClient { app, cookie }
    }

    /// The admin's session cookie (`name=value`).
    pub fn cookie(&self) -> &str {
        &self.cookie
    }

    /// The user named `username`, as `GET /api/v1/users` lists them.
    pub async fn user(&self, username: &str) -> serde_json::Value {
        let (s, users) = self
            .call(reqwest::Method::GET, "/api/v1/users?limit=200", None)
            .await;
        assert_eq!(s, 200, "{users}");
        users["items"]
            .as_array()
            .expect("items")
            .iter()
            .find(|u| u["username"] == username)
            .cloned()
            .unwrap_or_else(|| panic!("{username} is not listed: {users}"))
    }

    /// A new API token of the admin's.
    pub async fn token(&self) -> String {
        let (s, t) = self
            .call(
                reqwest::Method::POST,
                "/api/v1/tokens",
                Some(serde_json::json!({"name": "admin token"})),
            )
            .await;
        assert_eq!(s, 201, "{t}");
        t["secret"].as_str().expect("secret").to_owned()
    }

    /// `GET path`: `(status, JSON body or null)`.
    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        self.call(reqwest::Method::GET, path, None).await
    }

    /// `POST body` to `path`: `(status, JSON body or null)`.
    pub async fn post(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    /// `PUT body` to `path`: `(status, JSON body or null)`.
    pub async fn put(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        self.call(reqwest::Method::PUT, path, Some(body)).await
    }

    /// `DELETE path`: `(status, JSON body or null)`.
    pub async fn delete(&self, path: &str) -> (u16, serde_json::Value) {
        self.call(reqwest::Method::DELETE, path, None).await
    }

    /// `(status, JSON body or null)`.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let rb = reqwest::Client::new()
            .request(method, self.app.url(path))
            .header("origin", &self.app.base)
            .header("cookie", &self.cookie);
        json_call(rb, body).await
    }
}

/// A REST call authenticated with an API token: `(status, JSON body or null)`.
pub async fn call_with_token(
    app: &TestApp,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let rb = reqwest::Client::new()
        .request(method, app.url(path))
        .bearer_auth(token);
    json_call(rb, body).await
}

/// `GET path` with an API token: `(status, JSON body or null)`.
pub async fn get_as(app: &TestApp, token: &str, path: &str) -> (u16, serde_json::Value) {
    call_with_token(app, token, reqwest::Method::GET, path, None).await
}

/// `POST body` to `path` with an API token: `(status, JSON body or null)`.
pub async fn post_as(
    app: &TestApp,
    token: &str,
    path: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    call_with_token(app, token, reqwest::Method::POST, path, Some(body)).await
}

/// `PUT body` to `path` with an API token: `(status, JSON body or null)`.
pub async fn put_as(
    app: &TestApp,
    token: &str,
    path: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    call_with_token(app, token, reqwest::Method::PUT, path, Some(body)).await
}

pub async fn json_call(
    mut rb: reqwest::RequestBuilder,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let r = rb.send().await.expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

/// Asserts that `(status, body)` is a 422 naming `field`, its message saying `says`.
#[track_caller]
pub fn assert_invalid(status: u16, body: &serde_json::Value, field: &str, says: &str) {
    assert_eq!(
        (status, &body["error"]["field"]),
        (422, &serde_json::json!(field)),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains(says),
        "{body}"
    );
}

/// Calls `probe` every `every_ms` milliseconds until it answers `(true, v)`: that `v`.
/// Past `secs` seconds, fails saying `what` and the last `v`.
pub async fn wait_until<F, Fut>(
    what: &str,
    secs: u64,
    every_ms: u64,
    mut probe: F,
) -> serde_json::Value
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = (bool, serde_json::Value)>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let (done, v) = probe().await;
        if done {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {v}");
        tokio::time::sleep(std::time::Duration::from_millis(every_ms)).await;
    }
}

/// Asserts that `v["message"]` (a workload's or an allocation's) contains `text`.
#[track_caller]
pub fn assert_message_contains(v: &serde_json::Value, text: &str) {
    assert!(v["message"].as_str().unwrap_or("").contains(text), "{v}");
}

/// A REST client whose every request gives up after 10 seconds (for clients that retry).
pub fn client_with_timeout() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .expect("client")
}

/// Runs `tessera ARGS` against the server at `base` as `token`; its standard output, after
/// asserting that it succeeded.
pub fn tessera_ok(base: &str, token: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env("TESSERA_URL", base)
        .env("TESSERA_TOKEN", token)
        .output()
        .expect("run tessera");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{args:?}: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

pub use crate::agent_bin::agent_bin;

/// `tessera-agent --simulate` with `gpus` (catalog names, comma-separated) as node
/// `hostname` of `server`, its state in `state`, heartbeats and layout rounds every
/// second, killed when dropped; callers add a join token and what they test.
pub fn sim_agent(
    server: &str,
    gpus: &str,
    hostname: &str,
    state: &std::path::Path,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(agent_bin());
    cmd.args(["--simulate", "--gpus", gpus, "--hostname", hostname])
        .args(["--server", server, "--state-dir"])
        .arg(state)
        .args(["--heartbeat-interval-s", "1", "--reconcile-interval-s", "1"])
        .kill_on_drop(true);
    cmd
}

/// Services over `store` (a cheap password hasher, default login limits) and the
/// platform's `SystemActor` that comes with them.
pub fn services_over(
    store: tessera_core::store::Store,
) -> (tessera_core::Services, tessera_core::auth::SystemActor) {
    tessera_core::Services::new(
        store,
        tessera_core::auth::password::Hasher::new(1, 1).expect("hasher"),
        std::sync::Arc::new(tessera_core::auth::limiter::LoginLimiter::new(
            Default::default(),
        )),
        std::time::Duration::from_secs(3600),
    )
}
