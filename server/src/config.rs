//! Every setting, as one `clap` struct: `tessera --help` documents each flag and its
//! `TESSERA_*` environment variable. Bad values fail at start naming the setting.

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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

    /// The URL users reach the portal at. `https://` makes session cookies `Secure` with a
    /// `__Host-` name. Defaults to `http://` + the bind address.
    #[arg(long, env = "TESSERA_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// Folder holding the built UI assets (`pkg/tessera.js`, `.wasm`, `.css`).
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

    /// The currency prices, charges and budgets are in (ISO 4217, e.g. `EUR`). Amounts are
    /// stored in its minor unit (cents); don't change it once charges exist.
    #[arg(long, env = "TESSERA_CURRENCY", default_value = "USD")]
    pub currency: String,

    /// Command line that starts a notebook (split on whitespace): `{base_path}` becomes
    /// the notebook's proxy path, `{port}` the port the node's executor picks.
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
            .unwrap_or_else(|| format!("http://{}", self.bind))
            .trim_end_matches('/')
            .to_owned()
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
        ])
        .serve
    }
}

/// A string that never shows in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

/// `90s`, `30m`, `8h`, `7d`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration like 90s, 30m, 8h or 7d"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => return Err(format!("'{s}': unknown unit '{unit}' (use s, m, h or d)")),
    };
    if secs == 0 {
        return Err("must be greater than zero".into());
    }
    Ok(Duration::from_secs(secs))
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
