//! Every setting, as one `clap` struct: `tessera --help` documents each flag and its
//! `TESSERA_*` environment variable. Bad values fail at start naming the setting.

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

pub use crate::settings::{Secret, parse_duration};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tessera_domain::ids::WorkloadId;

#[derive(Debug, Parser)]
#[command(
    name = "tessera",
    version,
    about = "Tessera: a self-service GPU portal"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the portal (web UI, REST API, agent API).
    Serve(Box<ServeConfig>),
    /// Plan placements offline: prints the plan for a cluster and pending requests as JSON
    /// (schema: docs/planner.md). Bad input exits with code 2 naming file, line and field.
    Plan(PlanArgs),
    /// Writes a consistent copy of the SQLite store to PATH while the server runs (for
    /// PostgreSQL use pg_dump; README: Backups).
    Backup(BackupArgs),
    /// Replaces the SQLite store with a backup made by `tessera backup` (the server must
    /// be stopped; it migrates the restored database forward when it starts).
    Restore(BackupArgs),
    /// Training jobs from a terminal (REST with an API token: TESSERA_URL, TESSERA_TOKEN).
    Job {
        #[command(flatten)]
        remote: crate::cli::Remote,
        #[command(subcommand)]
        command: crate::cli::JobCommand,
    },
    /// Notebooks from a terminal (REST with an API token: TESSERA_URL, TESSERA_TOKEN).
    Notebook {
        #[command(flatten)]
        remote: crate::cli::Remote,
        #[command(subcommand)]
        command: crate::cli::NotebookCommand,
    },
    /// Checks an API token and stores it with the portal's URL for the commands below
    /// (in your config dir, readable by you only).
    Login(crate::cli::LoginArgs),
    /// GPU allocations: request, list, show, release, extend.
    Alloc {
        #[command(flatten)]
        remote: crate::cli::Remote,
        #[command(subcommand)]
        command: crate::cli::AllocCommand,
    },
    /// Team quotas: show, set (platform admins).
    Quota {
        #[command(flatten)]
        remote: crate::cli::Remote,
        #[command(subcommand)]
        command: crate::cli::QuotaCommand,
    },
    /// GPU-hours and cost over a period, per team, kind, user and day.
    Usage {
        #[command(flatten)]
        remote: crate::cli::Remote,
        #[command(flatten)]
        args: crate::cli::UsageArgs,
    },
    /// Exports: `export chargeback --month YYYY-MM` writes the CSV to standard output.
    Export {
        #[command(flatten)]
        remote: crate::cli::Remote,
        #[command(subcommand)]
        command: crate::cli::ExportCommand,
    },
    /// GPU nodes: list.
    Node {
        #[command(flatten)]
        remote: crate::cli::Remote,
        #[command(subcommand)]
        command: crate::cli::NodeCommand,
    },
    /// Runs a command inside a running job or notebook (`exec JOB -- cmd`, `exec -it JOB --
    /// bash`); exits with its exit code.
    Exec {
        #[command(flatten)]
        remote: crate::cli::Remote,
        #[command(flatten)]
        args: crate::cli::ExecArgs,
    },
    /// Bookings of capacity for a future window: create, list (the calendar), cancel.
    Booking {
        #[command(flatten)]
        remote: crate::cli::Remote,
        #[command(subcommand)]
        command: crate::cli::BookingCommand,
    },
    /// Images workloads run in: the catalog, allowed registries, teams' registry logins.
    Image {
        #[command(flatten)]
        remote: crate::cli::Remote,
        #[command(subcommand)]
        command: crate::cli::ImageCommand,
    },
    /// Prints a shell completion script: `tessera completions bash`.
    Completions(crate::cli::CompletionsArgs),
}

#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// The cluster: nodes, GPUs, modes, MIG instances (CLUSTER.json).
    #[arg(long)]
    pub cluster: PathBuf,
    /// Pending requests (REQUESTS.json).
    #[arg(long)]
    pub requests: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct BackupArgs {
    /// The database (as for `tessera serve`).
    #[arg(
        long,
        env = "TESSERA_DATABASE_URL",
        default_value = "sqlite://data/tessera.db?mode=rwc"
    )]
    pub database_url: Secret,
    /// The backup file.
    pub path: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Executor {
    Local,
    Kubernetes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IdleAllocation {
    Release,
    Keep,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Address to listen on.
    #[arg(long, env = "TESSERA_BIND", default_value = "127.0.0.1:3000")]
    pub bind: SocketAddr,

    /// Database URL: `sqlite:PATH?mode=rwc` (embedded default) or `postgres://…`.
    #[arg(
        long,
        env = "TESSERA_DATABASE_URL",
        default_value = "sqlite://data/tessera.db?mode=rwc"
    )]
    pub database_url: Secret,

    /// Password for the `admin` account created on an empty database. When unset, a random
    /// password is generated and printed once. Must meet the password policy (≥ 12 chars).
    #[arg(long, env = "TESSERA_ADMIN_PASSWORD", hide_env_values = true)]
    pub admin_password: Option<Secret>,

    /// Serve HTTPS with this certificate chain (PEM, leaf first), for a lab without a
    /// reverse proxy. Re-read when the file changes. Needs TESSERA_TLS_KEY.
    #[arg(long, env = "TESSERA_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key (PEM) of TESSERA_TLS_CERT; re-read with it.
    #[arg(long, env = "TESSERA_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// The URL users reach the portal at. `https://` makes session cookies `Secure` with a
    /// `__Host-` name. Defaults to `http://` (`https://` with TESSERA_TLS_CERT) + the bind
    /// address.
    #[arg(long, env = "TESSERA_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// Folder holding the built UI assets (`pkg/tessera.<hash>.js`, `_bg.wasm`, `.css`).
    #[arg(long, env = "TESSERA_SITE_ROOT", default_value = "target/site")]
    pub site_root: PathBuf,

    /// Log format.
    #[arg(long, env = "TESSERA_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// How often the allocation scheduler runs when nothing wakes it (e.g. `2s`).
    #[arg(long, env = "TESSERA_SCHEDULER_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub scheduler_interval: Duration,

    /// How long a team borrowing beyond its guarantee is warned before that allocation is
    /// preempted for a team claiming its guaranteed share (e.g. `10m`).
    #[arg(long, env = "TESSERA_PREEMPTION_GRACE", default_value = "10m", value_parser = parse_duration)]
    pub preemption_grace: Duration,

    /// How long a node may stay silent (no heartbeat) before its allocations fail with
    /// the reason (e.g. `3m`; the node shows offline after 90 s either way).
    #[arg(long, env = "TESSERA_NODE_GRACE", default_value = "3m", value_parser = parse_duration)]
    pub node_grace: Duration,

    /// How long an allocation may stay `placing` (its node not yet reporting the MIG
    /// instance or GPU) before it fails with the node's last error (e.g. `10m`).
    #[arg(long, env = "TESSERA_PLACING_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub placing_timeout: Duration,

    /// How often GPU usage is metered into the ledger (complete hours, and allocations that
    /// ended). Metering is idempotent, so any interval is safe (e.g. `1m`).
    #[arg(long, env = "TESSERA_METERING_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub metering_interval: Duration,

    /// A PEM bundle of extra CAs to trust when resolving catalog images at registries (a
    /// lab registry with a private CA); the system's and Mozilla's roots are always trusted.
    #[arg(long, env = "TESSERA_REGISTRY_CA")]
    pub registry_ca: Option<std::path::PathBuf>,

    /// The currency prices, charges and budgets are in (ISO 4217, e.g. `EUR`). Amounts are
    /// stored in its minor unit (cents); don't change it once charges exist.
    #[arg(long, env = "TESSERA_CURRENCY", default_value = "USD")]
    pub currency: String,

    /// Command line that starts a notebook (split on whitespace): `{base_path}` becomes
    /// the notebook's proxy path, `{port}` the port the node's executor picks, `{host}`
    /// the node's workload address (the agent's `--workload-host`).
    #[arg(long, env = "TESSERA_NOTEBOOK_COMMAND", default_value = tessera_core::services::workloads::DEFAULT_NOTEBOOK_COMMAND)]
    pub notebook_command: String,

    /// A notebook whose kernel and GPU stay idle this long is stopped (e.g. `60m`).
    #[arg(long, env = "TESSERA_IDLE_AFTER", default_value = "60m", value_parser = parse_duration)]
    pub idle_after: Duration,

    /// Idle notebooks show a warning this long before they are stopped (e.g. `10m`).
    #[arg(long, env = "TESSERA_IDLE_WARN", default_value = "10m", value_parser = parse_duration)]
    pub idle_warn: Duration,

    /// What idle reclaim does with the notebook's allocation: `release` it (the GPU goes
    /// back to the pool) or `keep` it.
    #[arg(
        long,
        env = "TESSERA_IDLE_ALLOCATION",
        value_enum,
        default_value = "release"
    )]
    pub idle_allocation: IdleAllocation,

    /// Who runs notebooks and jobs: `local` (each node's agent starts them as processes)
    /// or `kubernetes` (Pods and Jobs through the Kubernetes API, `TESSERA_K8S_*`; agents
    /// still report inventory and apply MIG layouts).
    #[arg(long, env = "TESSERA_EXECUTOR", value_enum, default_value = "local")]
    pub executor: Executor,

    #[command(flatten)]
    pub kubernetes: crate::k8s::KubeSettings,

    #[command(flatten)]
    pub oidc: crate::oidc::OidcSettings,

    #[command(flatten)]
    pub notify: crate::notify::NotifySettings,

    /// Sign a session out after this much inactivity (e.g. `30m`, `8h`).
    #[arg(long, env = "TESSERA_SESSION_IDLE_TIMEOUT", default_value = "8h", value_parser = parse_duration)]
    pub session_idle_timeout: Duration,

    /// Sign a session out this long after sign-in, active or not (e.g. `24h`, `7d`).
    #[arg(long, env = "TESSERA_SESSION_ABSOLUTE_TIMEOUT", default_value = "24h", value_parser = parse_duration)]
    pub session_absolute_timeout: Duration,

    /// Password hashes computed at once (each uses ~19 MiB and one core). Default: cores.
    #[arg(long, env = "TESSERA_LOGIN_CONCURRENCY")]
    pub login_concurrency: Option<usize>,

    /// Sign-ins allowed to wait for a hashing slot; beyond this they get 429.
    #[arg(long, env = "TESSERA_LOGIN_QUEUE", default_value_t = 16)]
    pub login_queue: usize,

    /// Do not start the simulated GPU nodes of the embedded default.
    #[arg(long, env = "TESSERA_NO_SIM", value_parser = BoolishValueParser::new(), action = ArgAction::SetTrue)]
    pub no_sim: bool,

    /// Simulated nodes to start (each a real `tessera-agent --simulate` process speaking
    /// the agent protocol): `NAME=MODEL*COUNT[+MODEL*COUNT];…`.
    #[arg(
        long,
        env = "TESSERA_SIM_NODES",
        default_value = "sim-a100=A100-SXM4-40GB*4;sim-h100=H100-80GB*2"
    )]
    pub sim_nodes: String,

    /// Where simulated agents keep their credentials and telemetry spools.
    #[arg(long, env = "TESSERA_SIM_STATE_DIR", default_value = "data/sim")]
    pub sim_state_dir: PathBuf,

    /// The `tessera-agent` binary for simulated nodes (default: next to `tessera`).
    #[arg(long, env = "TESSERA_AGENT_BIN")]
    pub agent_bin: Option<PathBuf>,

    /// The wildcard domain notebooks are served under, each on its own origin
    /// `nb-<id>.<domain>` (e.g. `nb.gpu.example.org`, with DNS `*.nb.gpu.example.org` and a
    /// wildcard certificate; a port may follow). Default: `localhost` when the portal is
    /// on a loopback address; elsewhere notebooks cannot be opened in a browser until this
    /// is set (API tokens still reach them).
    #[arg(long, env = "TESSERA_NOTEBOOK_HOST")]
    pub notebook_host: Option<String>,

    /// Serve notebooks on the portal's own origin. UNSAFE: any page a notebook serves runs
    /// with the portal's origin and can act as whoever opens it (an admin included).
    #[arg(long, env = "TESSERA_NOTEBOOK_SAME_ORIGIN_UNSAFE", value_parser = BoolishValueParser::new(), action = ArgAction::SetTrue)]
    pub notebook_same_origin_unsafe: bool,

    /// The data keys that seal notebook tokens and workload environments at rest: base64
    /// of 32 random bytes each (`openssl rand -base64 32`), separated by commas, the newest
    /// first (it seals; the others still open). With PostgreSQL this or
    /// TESSERA_DATA_KEY_FILE is required, the same on every replica (docs/security.md:
    /// Data at rest).
    #[arg(
        long,
        env = "TESSERA_DATA_KEY",
        hide_env_values = true,
        conflicts_with = "data_key_file"
    )]
    pub data_key: Option<Secret>,

    /// A file with the data keys, one a line, the newest first; readable by its owner only.
    /// Default with SQLite: `<database>.key` beside the database, generated when missing.
    #[arg(long, env = "TESSERA_DATA_KEY_FILE")]
    pub data_key_file: Option<PathBuf>,

    /// Bearer token a Prometheus scraper sends to `/metrics` to see per-team series (spend,
    /// budget); without it `/metrics` shows no team data.
    #[arg(long, env = "TESSERA_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<Secret>,

    /// This replica's name in logs and in the `tessera_leader` gauge (default: host name
    /// and process id).
    #[arg(long, env = "TESSERA_REPLICA_NAME")]
    pub replica_name: Option<String>,

    /// Seconds between the start of shutdown (readiness turns false, the leader lease is
    /// given up) and closing the listener, so that load balancers stop sending first (5 on
    /// Kubernetes).
    #[arg(long, env = "TESSERA_DRAIN_SECONDS", default_value_t = 0)]
    pub drain_seconds: u64,

    /// Seconds that proxied WebSockets (notebook kernels) get to end after the listener
    /// closes on shutdown.
    #[arg(long, env = "TESSERA_SHUTDOWN_GRACE_SECONDS", default_value_t = 10)]
    pub shutdown_grace_seconds: u64,

    /// A `tessera exec` session with no traffic either way for this many minutes is closed.
    #[arg(long, env = "TESSERA_EXEC_IDLE_MINUTES", default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..))]
    pub exec_idle_minutes: u64,

    /// Take the client address from the last `X-Forwarded-For` hop (only behind a proxy
    /// you run; otherwise clients could forge it to dodge sign-in throttling).
    #[arg(long, env = "TESSERA_TRUST_PROXY_HEADERS", value_parser = BoolishValueParser::new(), action = ArgAction::SetTrue)]
    pub trust_proxy_headers: bool,
}

impl ServeConfig {
    /// Checks settings that clap cannot check alone.
    pub fn validate(&self) -> Result<(), String> {
        if self.executor == Executor::Kubernetes {
            self.kubernetes.validate()?;
        }
        self.oidc.validate()?;
        let url = self.database_url.expose();
        if !(url.starts_with("sqlite:")
            || url.starts_with("postgres://")
            || url.starts_with("postgresql://"))
        {
            return Err(
                "TESSERA_DATABASE_URL (--database-url) must start with sqlite: or postgres://"
                    .into(),
            );
        }
        if let Some(p) = &self.admin_password {
            tessera_domain::account::NewPassword::parse(p.expose(), "TESSERA_ADMIN_PASSWORD")
                .map_err(|e| format!("{e} (--admin-password)"))?;
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err("TESSERA_TLS_CERT and TESSERA_TLS_KEY go together".into());
        }
        if let Some(u) = &self.public_url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            return Err(
                "TESSERA_PUBLIC_URL (--public-url) must start with http:// or https://".into(),
            );
        }
        if !tessera_domain::billing::is_currency_code(&self.currency) {
            return Err(
                "TESSERA_CURRENCY (--currency) must be an ISO 4217 code such as USD or EUR".into(),
            );
        }
        if self.session_absolute_timeout < self.session_idle_timeout {
            return Err(
                "TESSERA_SESSION_ABSOLUTE_TIMEOUT (--session-absolute-timeout) must \
                        not be shorter than TESSERA_SESSION_IDLE_TIMEOUT"
                    .into(),
            );
        }
        if !self.no_sim {
            crate::sim::parse_nodes(&self.sim_nodes)
                .map_err(|e| format!("TESSERA_SIM_NODES (--sim-nodes): {e}"))?;
        }
        if self.notebook_host.is_some() && self.notebook_same_origin_unsafe {
            return Err("set either TESSERA_NOTEBOOK_HOST (--notebook-host) or \
                 TESSERA_NOTEBOOK_SAME_ORIGIN_UNSAFE, not both"
                .into());
        }
        if let Some(h) = &self.notebook_host {
            parse_notebook_host(h)
                .map_err(|e| format!("TESSERA_NOTEBOOK_HOST (--notebook-host): {e}"))?;
        }
        if self
            .metrics_token
            .as_ref()
            .is_some_and(|t| t.expose().len() < 16)
        {
            return Err(
                "TESSERA_METRICS_TOKEN (--metrics-token) must be at least 16 characters".into(),
            );
        }
        if self.login_concurrency == Some(0) {
            return Err(
                "TESSERA_LOGIN_CONCURRENCY (--login-concurrency) must be at least 1".into(),
            );
        }
        Ok(())
    }

    /// The workload service's settings.
    pub fn workload_config(&self) -> tessera_core::services::workloads::WorkloadConfig {
        use tessera_core::services::workloads::WorkloadConfig;
        let d = WorkloadConfig::default();
        let dur = |x: Duration| chrono::Duration::from_std(x).unwrap_or(chrono::Duration::MAX);
        WorkloadConfig {
            notebook_command: self.notebook_command.clone(),
            idle: tessera_domain::workload::IdlePolicy {
                idle_after: dur(self.idle_after),
                warn_before: dur(self.idle_warn.min(self.idle_after)),
                ..d.idle
            },
            idle_release_allocation: self.idle_allocation == IdleAllocation::Release,
            ..d
        }
    }

    pub fn public_url(&self) -> String {
        self.public_url
            .clone()
            .unwrap_or_else(|| {
                let scheme = if self.tls_cert.is_some() {
                    "https"
                } else {
                    "http"
                };
                format!("{scheme}://{}", self.bind)
            })
            .trim_end_matches('/')
            .to_owned()
    }

    /// Where browsers open notebooks, for a portal listening on `addr`.
    pub fn notebook_origins(&self, addr: SocketAddr) -> NotebookOrigins {
        if self.notebook_same_origin_unsafe {
            return NotebookOrigins::SameOriginUnsafe;
        }
        let public = self
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{addr}"));
        let (scheme, rest) = public.split_once("://").unwrap_or(("http", &public));
        let (host, port) = split_host_port(rest.split('/').next().unwrap_or(""));
        let scheme = scheme.to_ascii_lowercase();
        if let Some(h) = &self.notebook_host
            && let Ok((domain, own_port)) = parse_notebook_host(h)
        {
            return NotebookOrigins::Isolated {
                scheme,
                domain,
                port: own_port.or(port),
            };
        }
        if is_loopback_host(&host) {
            return NotebookOrigins::Isolated {
                scheme,
                domain: "localhost".into(),
                port,
            };
        }
        NotebookOrigins::Unconfigured
    }

    /// The certificate files to terminate TLS with, if set.
    pub fn tls_files(&self) -> Option<crate::tls::TlsFiles> {
        Some(crate::tls::TlsFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            poll: Duration::from_secs(2),
        })
    }

    /// Served over https: `Secure` cookies with a `__Host-` name.
    pub fn secure_cookies(&self) -> bool {
        self.public_url().starts_with("https://")
    }

    /// A configuration for tests: defaults, no simulated nodes, port 0.
    pub fn for_tests(database_url: &str) -> Self {
        #[derive(Parser)]
        struct ServeOnly {
            #[command(flatten)]
            serve: ServeConfig,
        }
        ServeOnly::parse_from([
            "tessera",
            "--database-url",
            database_url,
            "--bind",
            "127.0.0.1:0",
            "--no-sim",
            "--shutdown-grace-seconds",
            "1",
        ])
        .serve
    }
}

/// Where browsers open notebooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotebookOrigins {
    /// Each notebook on an origin of its own: `{scheme}://nb-<id>.{domain}[:{port}]`.
    Isolated {
        scheme: String,
        domain: String,
        port: Option<u16>,
    },
    /// Not on a loopback address and no `TESSERA_NOTEBOOK_HOST`: browsers are told to ask
    /// an admin; API tokens still reach notebooks on the portal's origin.
    Unconfigured,
    /// On the portal's origin (`TESSERA_NOTEBOOK_SAME_ORIGIN_UNSAFE`).
    SameOriginUnsafe,
}

impl NotebookOrigins {
    /// The origin (`scheme://host[:port]`) of a notebook, when notebooks have their own.
    pub fn origin_of(&self, workload: WorkloadId) -> Option<String> {
        let NotebookOrigins::Isolated {
            scheme,
            domain,
            port,
        } = self
        else {
            return None;
        };
        let label = tessera_domain::workload::notebook_host_label(workload);
        Some(match port {
            Some(p) => format!("{scheme}://{label}.{domain}:{p}"),
            None => format!("{scheme}://{label}.{domain}"),
        })
    }

    /// What a request's `Host` names: `Some(Some(id))` a notebook's origin, `Some(None)`
    /// another name under the notebook domain (nothing is served there), `None` the portal.
    pub fn classify(&self, host: &str) -> Option<Option<WorkloadId>> {
        let NotebookOrigins::Isolated { domain, .. } = self else {
            return None;
        };
        let (name, _) = split_host_port(host);
        let under = name
            .strip_suffix(domain.as_str())
            .and_then(|rest| rest.strip_suffix('.'))?;
        Some(tessera_domain::workload::parse_notebook_host_label(under))
    }
}

/// `host[:port]` (IPv6 in brackets) → lowercase host, port.
fn split_host_port(authority: &str) -> (String, Option<u16>) {
    let a = authority.trim().to_ascii_lowercase();
    if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']').unwrap_or((rest, ""));
        let port = after.strip_prefix(':').and_then(|p| p.parse().ok());
        return (format!("[{h}]"), port);
    }
    match a.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) && !p.is_empty() => {
            (h.to_owned(), p.parse().ok())
        }
        _ => (a, None),
    }
}

fn is_loopback_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host.ends_with(".localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `nb.example.org`, `*.nb.example.org` or `nb.example.org:8443` → domain, port.
fn parse_notebook_host(raw: &str) -> Result<(String, Option<u16>), String> {
    let raw = raw.trim().trim_start_matches("*.");
    let (domain, port) = split_host_port(raw);
    let domain = domain.trim_end_matches('.').to_owned();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
    };
    if domain.is_empty() || !domain.split('.').all(label_ok) {
        return Err(format!(
            "'{raw}' is not a domain name like nb.gpu.example.org"
        ));
    }
    if domain.parse::<std::net::Ipv4Addr>().is_ok() {
        return Err("must be a domain name (notebooks get subdomains), not an IP address".into());
    }
    if domain.len() + 36 > 253 {
        return Err("too long for a notebook subdomain under it".into());
    }
    Ok((domain, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert!(parse_duration("5 weeks").is_err());
        assert!(parse_duration("0s").is_err());
    }

    #[test]
    fn secrets_do_not_leak_into_debug_output() {
        let mut c = ServeConfig::for_tests("postgres://u:hunter2@db/tessera");
        c.admin_password = Some(Secret::new("topsecretpassword"));
        let dbg = format!("{c:?}");
        assert!(
            !dbg.contains("hunter2") && !dbg.contains("topsecret"),
            "{dbg}"
        );
    }

    #[test]
    fn notebooks_get_their_own_origin() {
        let addr: SocketAddr = "127.0.0.1:4321".parse().expect("addr");
        let mut c = ServeConfig::for_tests("sqlite::memory:");
        let id = WorkloadId(uuid::Uuid::now_v7());
        let label = tessera_domain::workload::notebook_host_label(id);
        // Loopback: *.localhost on the same port, out of the box.
        let o = c.notebook_origins(addr);
        assert_eq!(
            o.origin_of(id),
            Some(format!("http://{label}.localhost:4321"))
        );
        assert_eq!(
            o.classify(&format!("{label}.localhost:4321")),
            Some(Some(id))
        );
        assert_eq!(
            o.classify(&format!("{}.LOCALHOST", label.to_uppercase())),
            Some(Some(id))
        );
        assert_eq!(o.classify("evil.localhost:4321"), Some(None));
        assert_eq!(o.classify("127.0.0.1:4321"), None);
        assert_eq!(o.classify("localhost:4321"), None);
        // A public portal needs the setting.
        c.public_url = Some("https://gpu.example.org".into());
        assert_eq!(c.notebook_origins(addr), NotebookOrigins::Unconfigured);
        c.notebook_host = Some("*.nb.example.org".into());
        let o = c.notebook_origins(addr);
        assert_eq!(
            o.origin_of(id),
            Some(format!("https://{label}.nb.example.org"))
        );
        assert_eq!(
            o.classify(&format!("{label}.nb.example.org")),
            Some(Some(id))
        );
        assert_eq!(o.classify("gpu.example.org"), None);
        assert_eq!(
            o.classify(&format!("{label}.nb.example.org.evil.com")),
            None
        );
        assert_eq!(o.classify(&format!("{label}xnb.example.org")), None);
        c.notebook_host = Some("nb.example.org:8443".into());
        assert_eq!(
            c.notebook_origins(addr).origin_of(id),
            Some(format!("https://{label}.nb.example.org:8443"))
        );
        c.notebook_same_origin_unsafe = true;
        assert!(c.validate().is_err(), "both settings at once");
        c.notebook_host = None;
        assert_eq!(c.notebook_origins(addr), NotebookOrigins::SameOriginUnsafe);
        for bad in [
            "",
            "nb example.org",
            "10.0.0.1",
            "nb.example.org/x",
            "-x.org",
        ] {
            assert!(parse_notebook_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_settings_are_named() {
        let mut c = ServeConfig::for_tests("mysql://x");
        let e = c.validate().expect_err("mysql is not supported");
        assert!(e.contains("TESSERA_DATABASE_URL"), "{e}");
        c = ServeConfig::for_tests("sqlite::memory:");
        c.admin_password = Some(Secret::new("short"));
        let e = c.validate().expect_err("short admin password");
        assert!(e.contains("TESSERA_ADMIN_PASSWORD"), "{e}");
    }
}
