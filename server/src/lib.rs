//! The Tessera server: configuration, HTTP (pages, server functions, REST, agent API),
//! metrics and the embedded default's simulated nodes. The use cases live in `tessera-core`.
//!
//! [`run`] takes a bound listener and a shutdown future, so tests boot the whole app on port 0
//! against a fresh database.
#![deny(clippy::unwrap_used)]

pub mod cli;
pub mod config;
pub mod data_keys;
mod http;
pub mod k8s;
mod leader;
pub mod notify;
pub mod observability;
pub mod oidc;
mod scheduler;
pub mod settings;
pub mod sim;
pub mod tls;

use anyhow::Context;
use config::ServeConfig;
use leptos::config::LeptosOptions;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tessera_core::store::Store;
use tessera_core::{Services, auth, sessions};
use tessera_domain::account::NewPassword;
use tokio::net::TcpListener;
use tower_sessions::ExpiredDeletion;

/// Everything a request handler may need; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<ServeConfig>,
    pub services: Arc<Services>,
    pub leptos_options: LeptosOptions,
    /// Single sign-on, when configured.
    pub oidc: Option<Arc<oidc::Oidc>>,
    /// Where browsers open notebooks.
    pub notebooks: Arc<config::NotebookOrigins>,
    /// Set once shutdown begins: `/readyz` answers 503 so load balancers stop sending.
    pub draining: Arc<AtomicBool>,
    /// True while this replica leads the background passes.
    pub leading: Arc<AtomicBool>,
    /// What could be on someone's screen, for the live-update streams (`/events`).
    pub changes: tokio::sync::watch::Receiver<Arc<tessera_core::services::changes::Snapshot>>,
    /// The Kubernetes executor (`TESSERA_EXECUTOR=kubernetes`): `tessera exec` goes through
    /// its API server.
    pub kube: Option<Arc<k8s::KubeExecutor>>,
}

/// Connects to the database, migrates, bootstraps the admin, then serves on `listener`
/// until `shutdown` completes.
pub async fn run(
    config: ServeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.validate().map_err(anyhow::Error::msg)?;
    let addr = listener.local_addr()?;
    // A certificate that does not load stops the start here, before anything else.
    let listener = match config.tls_files() {
        Some(files) => Serving::Tls(tls::TlsListener::new(listener, files)?),
        None => Serving::Plain(listener),
    };
    // SQLite is one process: a second server on the same file would race the first's
    // passes. The lock goes with this function (and with the process, however it ends).
    let _single_process = match tessera_core::store::sqlite_file(config.database_url.expose()) {
        Some(file) => {
            let lock = lock_sqlite(&file)?;
            create_private(&file)?;
            Some(lock)
        }
        None => None,
    };
    let data_keys = Arc::new(data_keys::load(&config)?);
    let store = Store::connect(config.database_url.expose())
        .await
        .context("TESSERA_DATABASE_URL (--database-url)")?;
    store
        .migrate()
        .await
        .context("running database migrations")?;
    let session_store = sessions::AnySessionStore::new(&store)
        .await
        .context("preparing the session table")?;

    let workers = config.login_concurrency.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    });
    let hasher = auth::password::Hasher::new(workers, config.login_queue)?;
    let limiter = Arc::new(auth::limiter::LoginLimiter::new(Default::default()));
    // The background passes run as `system`; the handlers get only `Arc<Services>`.
    let (services, system) = Services::new(
        store.clone(),
        hasher,
        limiter,
        config.session_absolute_timeout,
    );
    let mut services = services.with_currency(&config.currency);
    let oidc = oidc::Oidc::new(&config.oidc, &config.public_url())?.map(Arc::new);
    if let Some(o) = &oidc {
        services = services.with_sso(o.policy());
    }
    services.allocations = services
        .allocations
        .with_preemption_grace(config.preemption_grace)
        .with_node_grace(config.node_grace)
        .with_placing_timeout(config.placing_timeout);
    services.workloads = services
        .workloads
        .clone()
        .with_config(config.workload_config());
    let mut services = services.with_data_keys(data_keys.clone());
    if let Some(path) = &config.registry_ca {
        let pem = std::fs::read(path)
            .with_context(|| format!("TESSERA_REGISTRY_CA {}", path.display()))?;
        let http = tessera_core::services::images::Images::http(Some(&pem))
            .map_err(|e| anyhow::anyhow!("TESSERA_REGISTRY_CA {}: {e}", path.display()))?;
        services.images = services.images.clone().with_http(http);
        services.workloads = services
            .workloads
            .clone()
            .with_images(services.images.clone());
    }
    services.notifications = services
        .notifications
        .clone()
        .allowing_private_webhooks(config.notify.webhook_allow_private)
        .with_digest_hour(config.notify.digest_hour);
    let services = Arc::new(services);
    let sealed = services
        .workloads
        .seal_at_rest(&system)
        .await
        .context("sealing workload secrets with the data keys (TESSERA_DATA_KEY)")?;
    if sealed > 0 {
        tracing::info!(sealed, keys = ?data_keys, "sealed workload secrets under the newest data key");
    }

    let admin_password = config
        .admin_password
        .as_ref()
        .map(|p| NewPassword::parse(p.expose(), "TESSERA_ADMIN_PASSWORD"))
        .transpose()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(b) = services
        .accounts
        .bootstrap_admin(&system, admin_password.as_ref())
        .await?
    {
        match b.generated_password {
            Some(pw) => {
                // Printed once, to the console only (not through the log pipeline).
                println!(
                    "\n  Created platform admin 'admin' with generated password: {pw}\n  \
                     Sign in and change it under My account. It will not be shown again.\n"
                );
            }
            None => tracing::info!("created platform admin 'admin' from TESSERA_ADMIN_PASSWORD"),
        }
    }

    // Links, redirects and origin checks need the real address when none was given.
    let mut config = config;
    if config.public_url.is_none() {
        let scheme = match listener {
            Serving::Tls(_) => "https",
            Serving::Plain(_) => "http",
        };
        config.public_url = Some(format!("{scheme}://{addr}"));
    }
    let site_root = config.site_root.clone();
    let bundle = http::bundle::name(&site_root.join("pkg"));
    if bundle.is_none() {
        tracing::warn!(
            site_root = %site_root.display(),
            "UI bundle not found: pages render but will not hydrate (build it with `cargo xtask build`)"
        );
    }
    let leptos_options = LeptosOptions::builder()
        .output_name(bundle.unwrap_or_else(|| tessera_app::OUTPUT_NAME.to_owned()))
        .site_root(site_root.to_string_lossy().to_string())
        .site_pkg_dir("pkg")
        .site_addr(addr)
        .build();

    let _ = observability::metrics_handle();
    let cleanup = tokio::spawn(
        session_store
            .clone()
            .continuously_delete_expired(tokio::time::Duration::from_secs(300)),
    );

    let notebooks = config.notebook_origins(addr);
    match &notebooks {
        config::NotebookOrigins::Isolated { .. } => tracing::info!(
            example = notebooks
                .origin_of(tessera_domain::ids::WorkloadId(uuid::Uuid::nil()))
                .unwrap_or_default(),
            "notebooks are served each on its own origin"
        ),
        config::NotebookOrigins::Unconfigured => tracing::warn!(
            "notebooks cannot be opened in a browser: set TESSERA_NOTEBOOK_HOST to a wildcard \
             domain for them (README: Notebooks); API tokens still reach them"
        ),
        config::NotebookOrigins::SameOriginUnsafe => tracing::warn!(
            "UNSAFE: notebooks are served on the portal's own origin \
             (TESSERA_NOTEBOOK_SAME_ORIGIN_UNSAFE): a page a notebook serves can act as \
             whoever opens it"
        ),
    }
    let kube = match config.executor {
        config::Executor::Local => None,
        config::Executor::Kubernetes => Some(Arc::new(
            k8s::KubeExecutor::connect(config.kubernetes.clone())
                .await
                .context("TESSERA_EXECUTOR=kubernetes")?,
        )),
    };
    let (changes_tx, changes) = tokio::sync::watch::channel(Arc::default());
    let state = AppState {
        config: Arc::new(config.clone()),
        services,
        leptos_options,
        oidc,
        notebooks: Arc::new(notebooks),
        draining: Arc::new(AtomicBool::new(false)),
        leading: Arc::new(AtomicBool::new(false)),
        changes,
        kube: kube.clone(),
    };
    tokio::spawn(http::events::watch(
        state.services.clone(),
        changes_tx,
        state.draining.clone(),
    ));
    let relay = tokio::spawn(leader::relay_node_signals(state.services.clone()));
    let (stop_leading, stop_rx) = tokio::sync::watch::channel(false);
    let leader = tokio::spawn(
        leader::Leader {
            services: state.services.clone(),
            system,
            config: state.config.clone(),
            kube,
            replica: config
                .replica_name
                .clone()
                .unwrap_or_else(leader::replica_name),
            leading: state.leading.clone(),
            report_now: Arc::new(tokio::sync::Notify::new()),
        }
        .run(stop_rx),
    );
    let router = http::router(state.clone(), http::session_layer(session_store, &config));
    // Simulated nodes start once the server accepts connections (they register at once).
    let sim_nodes = if config.no_sim {
        None
    } else {
        let state = state.clone();
        Some(tokio::spawn(async move {
            match sim::start(&state, addr).await {
                Ok(children) => Some(children),
                Err(e) => {
                    tracing::warn!("simulated nodes not started: {e:#}");
                    None
                }
            }
        }))
    };

    tracing::info!(%addr, backend = store.backend_name(), "Tessera is listening on {}", config.public_url());
    // Shutting down: readiness turns false and the leader lease is given up at once; after
    // the drain delay (load balancers notice) the listener closes and in-flight requests
    // finish; proxied WebSockets get the grace period to end.
    let drain = Duration::from_secs(config.drain_seconds);
    let draining = state.draining.clone();
    let signals = state.services.signals.clone();
    let graceful = async move {
        shutdown.await;
        draining.store(true, Ordering::SeqCst);
        // Agents' held long polls answer now (they retry elsewhere or after the restart).
        signals.close();
        let _ = stop_leading.send(true);
        if !drain.is_zero() {
            tracing::info!("shutting down: not ready any more; draining for {drain:?}");
            tokio::time::sleep(drain).await;
        }
    };
    let result = match listener {
        Serving::Tls(tls) => {
            axum::serve(
                tls,
                router.into_make_service_with_connect_info::<tls::TlsPeer>(),
            )
            .with_graceful_shutdown(graceful)
            .await
        }
        Serving::Plain(plain) => {
            axum::serve(
                plain,
                router.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(graceful)
            .await
        }
    };
    http::wait_for_sockets(Duration::from_secs(config.shutdown_grace_seconds)).await;
    cleanup.abort();
    relay.abort();
    let _ = tokio::time::timeout(Duration::from_secs(5), leader).await;
    if let Some(task) = sim_nodes
        && let Ok(Some(mut children)) = task.await
    {
        sim::stop(&mut children).await;
    }
    result.context("HTTP server")
}

/// Plain HTTP, or TLS terminated here (`TESSERA_TLS_CERT`).
enum Serving {
    Plain(TcpListener),
    Tls(tls::TlsListener),
}

/// Takes an exclusive lock on `<database>.lock` for as long as the returned file lives;
/// fails with a clear message when another server holds it.
fn lock_sqlite(db: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    let path = std::path::PathBuf::from(name);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create database folder {}", dir.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "another Tessera server is already using the SQLite database {} (it holds {}). \
             SQLite serves one server process; stop the other one, or use PostgreSQL \
             (TESSERA_DATABASE_URL=postgres://…) to run several replicas",
            db.display(),
            path.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
}

/// Creates a new SQLite database file readable by its owner only, as its key file and its
/// backups are (SQLite gives the `-wal` and `-shm` files the database's mode). An existing
/// file keeps the mode its operator gave it.
fn create_private(db: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(db)
    {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(e).with_context(|| format!("cannot create {}", db.display()))
        }
        _ => Ok(()),
    }
}

/// `tessera backup`: a consistent online copy of the SQLite store, readable by its owner
/// only. It holds password hashes and sealed secrets, never a session id or a data key.
/// SQLite writes it inside a folder only its owner may enter (mode 0700), where it is made
/// 0600 before it is moved into place, so no other user can ever open it: what a umask of
/// 077 would give, without changing the process's umask.
pub async fn backup(database_url: &str, to: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    anyhow::ensure!(
        !to.exists(),
        "{} exists already; choose a new file",
        to.display()
    );
    let name = to
        .file_name()
        .with_context(|| format!("{} is not a file name", to.display()))?;
    let mut staging = std::ffi::OsString::from(".");
    staging.push(name);
    staging.push(".partial");
    let staging = to.with_file_name(staging);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .with_context(|| format!("cannot create {}", staging.display()))?;
    let staged = staging.join("backup.db");
    let written = async {
        let store = Store::connect(database_url)
            .await
            .context("TESSERA_DATABASE_URL (--database-url)")?;
        let result = store.backup_to(&staged).await;
        store.close().await;
        result?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        anyhow::ensure!(
            !to.exists(),
            "{} exists already; choose a new file",
            to.display()
        );
        std::fs::rename(&staged, to)
            .with_context(|| format!("moving the backup to {}", to.display()))
    }
    .await;
    let _ = std::fs::remove_dir_all(&staging);
    written
}

/// `tessera restore`: replaces the (stopped) server's SQLite store with a backup.
pub async fn restore(database_url: &str, from: &std::path::Path) -> anyhow::Result<()> {
    let db = tessera_core::store::sqlite_file(database_url).context(
        "tessera restore replaces a SQLite store; for PostgreSQL use pg_restore (README: Backups)",
    )?;
    anyhow::ensure!(from.is_file(), "{} is not a file", from.display());
    // A backup holds password hashes and sealed secrets: one others could read may have
    // been read, or changed.
    let mode = std::os::unix::fs::PermissionsExt::mode(&from.metadata()?.permissions());
    anyhow::ensure!(
        mode & 0o077 == 0,
        "{} is open to other users (mode {:o}); a backup must be readable by its owner only: \
         check who else could have read or changed it, then `chmod 600` it",
        from.display(),
        mode & 0o777
    );
    // No server may be using the database meanwhile.
    let _lock = lock_sqlite(&db)?;
    // Check a copy first: it must be a Tessera database.
    let mut staged = db.as_os_str().to_owned();
    staged.push(".restoring");
    let staged = std::path::PathBuf::from(staged);
    std::fs::copy(from, &staged)
        .with_context(|| format!("copying {} to {}", from.display(), staged.display()))?;
    let check = async {
        let store = Store::connect(&format!("sqlite://{}", staged.display())).await?;
        let version = store.schema_version().await;
        store.close().await;
        match version {
            Ok(Some(v)) => Ok(v),
            _ => anyhow::bail!("{} is not a Tessera database backup", from.display()),
        }
    };
    if let Err(e) = check.await {
        let _ = std::fs::remove_file(&staged);
        return Err(e);
    }
    for suffix in ["-wal", "-shm"] {
        let mut side = db.as_os_str().to_owned();
        side.push(suffix);
        let _ = std::fs::remove_file(std::path::PathBuf::from(side));
    }
    std::fs::rename(&staged, &db)
        .with_context(|| format!("moving the restored database to {}", db.display()))?;
    Ok(())
}
