//! `tessera-agent`: see `agent/README.md`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tessera_agent::backend::{GpuBackend, inventory};
use tessera_agent::driver_files::DriverFiles;
use tessera_agent::link::{Credentials, HttpLink, Transport, UrlVerdict};
use tessera_agent::mps::{
    MpsControl, NvidiaMps, SIM_CONTEXT_SUBCOMMAND, SIM_SUBCOMMAND, SimMps, sim_context_main,
    sim_control_main,
};
use tessera_agent::network::{Ipv4Range, NetworkSettings};
use tessera_agent::notebook_env::NotebookEnv;
use tessera_agent::nvml::NvmlBackend;
use tessera_agent::oci::unpack::Limits;
use tessera_agent::oci::{ImageStore, StoreLimits};
use tessera_agent::run::{Agent, RunConfig};
use tessera_agent::sandbox::{Sandbox, SandboxSettings};
use tessera_agent::sim::SimNode;
use tessera_agent::spool::Spool;
use tessera_agent::telemetry::Telemetry;
use tessera_agent::workloads::LocalExecutor;
use tessera_domain::wire::RegisterRequest;

#[derive(Parser, Debug)]
#[command(
    name = "tessera-agent",
    version,
    about = "Tessera node agent",
    args_override_self = true
)]
struct Cli {
    #[command(flatten)]
    backend: BackendArgs,
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the GPUs, MIG modes, profile tables, placements and instances,
    /// without changing anything.
    Inventory {
        /// JSON (the `Inventory` wire type) instead of a summary.
        #[arg(long)]
        json: bool,
        /// Also read one telemetry sample per GPU (what heartbeats report); with `--json`
        /// the output is then `{"inventory": …, "samples": […]}`.
        #[arg(long)]
        samples: bool,
    },
}

#[derive(Args, Debug)]
struct BackendArgs {
    /// Use simulated GPUs instead of NVML.
    #[arg(long, global = true, env = "TESSERA_AGENT_SIMULATE")]
    simulate: bool,
    /// Simulated GPU models, comma-separated (catalog names such as
    /// A100-SXM4-40GB or H100-80GB; `nomig:<name>` for a GPU without MIG).
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "A100-SXM4-40GB,H100-80GB",
        env = "TESSERA_AGENT_SIM_GPUS"
    )]
    gpus: Vec<String>,
    /// Seed for simulated UUIDs.
    #[arg(long, global = true, default_value_t = 1)]
    sim_seed: u64,
    /// The driver version simulated GPUs report.
    #[arg(long, global = true, default_value = tessera_agent::sim::SIM_DRIVER_VERSION,
          env = "TESSERA_AGENT_SIM_DRIVER_VERSION")]
    sim_driver_version: String,
    /// The newest CUDA version the simulated driver supports (`12.4`).
    #[arg(
        long,
        global = true,
        default_value = "12.4",
        env = "TESSERA_AGENT_SIM_CUDA"
    )]
    sim_cuda: String,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Server base URL, e.g. http://tessera.example:3000.
    #[arg(long, env = "TESSERA_SERVER")]
    server: Option<String>,
    /// PEM file of extra root certificates to trust for an https:// server (a lab's
    /// private CA), besides the system's store and the Mozilla roots.
    #[arg(long, env = "TESSERA_AGENT_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Allow a plain http:// server on another machine. The node credential then
    /// crosses the network in clear text: only on a network you trust.
    #[arg(long, env = "TESSERA_AGENT_INSECURE_HTTP")]
    insecure_http: bool,
    /// One-time join token from the server; needed only until the node
    /// credential is saved in the state directory.
    #[arg(long, env = "TESSERA_JOIN_TOKEN", hide_env_values = true)]
    join_token: Option<String>,
    /// Where the credential and the telemetry spool live.
    #[arg(
        long,
        env = "TESSERA_AGENT_STATE_DIR",
        default_value = "/var/lib/tessera-agent"
    )]
    state_dir: PathBuf,
    /// The name this node registers under (default: /etc/hostname).
    #[arg(long, env = "TESSERA_AGENT_HOSTNAME")]
    hostname: Option<String>,
    /// Allow the agent to change MIG mode and instances. Without it the
    /// agent only reports.
    #[arg(long, env = "TESSERA_AGENT_MANAGE_MIG")]
    manage_mig: bool,
    /// Stop when the process with this id is gone (the server passes its own id to the
    /// simulated agents it starts, so they never outlive it).
    #[arg(long, hide = true)]
    exit_with_pid: Option<u32>,
    #[arg(long, default_value_t = 10)]
    telemetry_interval_s: u64,
    #[arg(long, default_value_t = 10)]
    reconcile_interval_s: u64,
    #[arg(long, default_value_t = 30)]
    heartbeat_interval_s: u64,
    /// Unacknowledged samples kept on disk (oldest dropped and counted
    /// beyond this); the default is a day at 10 s.
    #[arg(long, default_value_t = 8640)]
    spool_capacity: usize,
    /// Where workloads live: team workspaces and per-run folders (default:
    /// <state-dir>/workloads).
    #[arg(long, env = "TESSERA_AGENT_WORKLOAD_ROOT")]
    workload_root: Option<PathBuf>,
    /// The address notebooks are reached at, reported to the server as
    /// `<host>:<port>` and used to probe them.
    #[arg(long, env = "TESSERA_AGENT_WORKLOAD_HOST", default_value = "127.0.0.1")]
    workload_host: String,
    /// How often workloads are reported and the desired set fetched.
    #[arg(
        long,
        env = "TESSERA_AGENT_WORKLOAD_INTERVAL_MS",
        default_value_t = 1000
    )]
    workload_interval_ms: u64,
    /// How much of a workload's log (stdout and stderr) is kept on this node's disk,
    /// the newest part: beyond it the oldest output is dropped, with a line in the log
    /// saying how much, unless the server already has it.
    #[arg(long, env = "TESSERA_AGENT_WORKLOAD_LOG_CAP_MIB", default_value_t = 16)]
    workload_log_cap_mib: u64,
    /// What a team's workspace on this node may hold: a workload of a team whose
    /// workspace holds this much or more does not start (checked at each start; see
    /// docs/security.md). Default: no quota.
    #[arg(long, env = "TESSERA_AGENT_WORKSPACE_QUOTA_GIB")]
    workspace_quota_gib: Option<u64>,
    /// Stop every workload when the agent exits. Without it they keep running and
    /// the next agent adopts them.
    #[arg(long, env = "TESSERA_AGENT_STOP_WORKLOADS_ON_EXIT")]
    stop_workloads_on_exit: bool,
    /// A Python environment with JupyterLab (e.g. a virtual environment): a notebook's
    /// program named without a folder (`jupyter`) is taken from its `bin/` when it is
    /// there, and the sandbox mounts it (and the Python it links to) read-only. Without
    /// it, `jupyter` must be on the workload's PATH.
    #[arg(long, env = "TESSERA_AGENT_NOTEBOOK_ENV")]
    notebook_env: Option<PathBuf>,
    #[command(flatten)]
    images: ImageArgs,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

/// Workloads in OCI images (docs/agent.md, "Images").
#[derive(Args, Debug)]
struct ImageArgs {
    /// The node's image store: pulled images, unpacked (default: <workload-root>/images).
    #[arg(long, env = "TESSERA_AGENT_IMAGE_DIR")]
    image_dir: Option<PathBuf>,
    /// What the unpacked images may take together: past it, images no workload uses are
    /// removed, least recently used first.
    #[arg(long, env = "TESSERA_AGENT_IMAGE_CACHE_GB", default_value_t = 50)]
    image_cache_gb: u64,
    /// What one image may unpack to; a larger one fails to start.
    #[arg(long, env = "TESSERA_AGENT_IMAGE_MAX_GB", default_value_t = 20)]
    image_max_gb: u64,
    /// PEM file of extra root certificates to trust for registries (a lab registry's
    /// private CA), besides the system's store and the Mozilla roots.
    #[arg(long, env = "TESSERA_AGENT_REGISTRY_CA")]
    registry_ca: Option<PathBuf>,
}

impl ImageArgs {
    /// Opens the store (mode 0700) in its folder.
    fn open(&self, workload_root: &std::path::Path) -> anyhow::Result<ImageStore> {
        let ca = match &self.registry_ca {
            Some(p) => {
                Some(std::fs::read(p).with_context(|| format!("--registry-ca {}", p.display()))?)
            }
            None => None,
        };
        let http = tessera_agent::oci::client::http_client_builder(ca.as_deref())
            .map_err(|e| anyhow::anyhow!("--registry-ca: {e}"))?
            .build()
            .context("the registry client")?;
        let dir = std::path::absolute(
            self.image_dir
                .clone()
                .unwrap_or_else(|| workload_root.join("images")),
        )
        .context("resolving the image dir")?;
        let limits = StoreLimits {
            image: Limits {
                max_bytes: self.image_max_gb.saturating_mul(1 << 30),
                ..Limits::default()
            },
            cache_bytes: self.image_cache_gb.saturating_mul(1 << 30),
        };
        let store = ImageStore::open(&dir, limits, http)
            .with_context(|| format!("opening the image store {}", dir.display()))?;
        tracing::info!(dir = %dir.display(), images = store.images().len(), "image store");
        Ok(store)
    }
}

/// The workload sandbox (docs/security.md).
#[derive(Args, Debug)]
struct SandboxArgs {
    /// `on` (the default): every workload in a container of its own. `off`: workloads run
    /// as the agent's own user with no isolation between teams; only for a one-person lab.
    #[arg(long = "sandbox", env = "TESSERA_AGENT_SANDBOX", default_value = "on",
          value_parser = ["on", "off"])]
    switch: String,
    /// The OCI runtime that makes the containers.
    #[arg(
        long = "sandbox-runtime",
        env = "TESSERA_AGENT_SANDBOX_RUNTIME",
        default_value = "crun"
    )]
    runtime: PathBuf,
    /// Extra host paths every workload sees read-only (a Python or conda installation,
    /// shared datasets), besides /usr, /etc, /opt and the other system folders.
    #[arg(
        long = "sandbox-ro",
        env = "TESSERA_AGENT_SANDBOX_RO",
        value_delimiter = ','
    )]
    read_only: Vec<PathBuf>,
    /// The uids (= gids) teams' workloads run as, `FIRST-LAST`; never 0.
    #[arg(
        long = "sandbox-uids",
        env = "TESSERA_AGENT_SANDBOX_UIDS",
        default_value = "200000-265535"
    )]
    uids: String,
    /// Memory limit of every workload; default: its allocation's share of the node's memory.
    #[arg(long = "sandbox-memory-mib", env = "TESSERA_AGENT_SANDBOX_MEMORY_MIB")]
    memory_mib: Option<u64>,
    /// CPU limit of every workload; default: its allocation's share of the node's CPUs.
    #[arg(long = "sandbox-cpus", env = "TESSERA_AGENT_SANDBOX_CPUS")]
    cpus: Option<f64>,
    /// Process limit of every workload.
    #[arg(
        long = "sandbox-pids",
        env = "TESSERA_AGENT_SANDBOX_PIDS",
        default_value_t = 4096
    )]
    pids: u64,
    /// Size of every workload's private /tmp (and /dev/shm).
    #[arg(
        long = "sandbox-tmp-mib",
        env = "TESSERA_AGENT_SANDBOX_TMP_MIB",
        default_value_t = 1024
    )]
    tmp_mib: u64,
    /// Open files per process of every workload (RLIMIT_NOFILE, soft = hard).
    #[arg(
        long = "sandbox-nofile",
        env = "TESSERA_AGENT_SANDBOX_NOFILE",
        default_value_t = 65_536
    )]
    nofile: u64,
    /// Processes of one team on this node, all its workloads together (RLIMIT_NPROC,
    /// counted per uid by the kernel); each workload also has --sandbox-pids.
    #[arg(
        long = "sandbox-nproc",
        env = "TESSERA_AGENT_SANDBOX_NPROC",
        default_value_t = 16_384
    )]
    nproc: u64,
    /// `on` (the default): every workload in a network namespace of its own, reaching
    /// neither the node nor other workloads (docs/security.md). `off`: workloads share
    /// the node's network and reach everything listening on it.
    #[arg(long = "sandbox-network", env = "TESSERA_AGENT_SANDBOX_NETWORK",
          default_value = "on", value_parser = ["on", "off"])]
    network: String,
    /// The node's workload addresses: a /30 per workload. Give each node its own range
    /// where servers elsewhere should reach workloads directly.
    #[arg(
        long = "sandbox-net",
        env = "TESSERA_AGENT_SANDBOX_NET",
        default_value = tessera_agent::network::DEFAULT_RANGE
    )]
    net: String,
    /// Whether workloads may open connections beyond the node (the internet, other
    /// hosts); the node itself, other workloads and link-local addresses (a cloud's
    /// metadata service) stay refused either way.
    #[arg(long = "sandbox-internet", env = "TESSERA_AGENT_SANDBOX_INTERNET",
          default_value = "on", value_parser = ["on", "off"])]
    internet: String,
}

impl SandboxArgs {
    fn settings(&self) -> anyhow::Result<SandboxSettings> {
        let (first, last) = self
            .uids
            .split_once('-')
            .and_then(|(a, b)| Some((a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?)))
            .filter(|(a, b)| *a > 0 && a <= b)
            .context("--sandbox-uids must be FIRST-LAST with 0 < FIRST <= LAST")?;
        let mut s = SandboxSettings::new(self.runtime.clone());
        s.read_only = self.read_only.clone();
        s.uid_first = first;
        s.uid_count = last - first + 1;
        s.memory_mib = self.memory_mib;
        s.cpus = self.cpus;
        s.pids = self.pids;
        s.tmp_mib = self.tmp_mib;
        s.nofile = self.nofile;
        s.nproc = self.nproc;
        s.network = if self.network == "on" {
            let mut n = NetworkSettings::new();
            n.range = Ipv4Range::parse(&self.net).map_err(anyhow::Error::msg)?;
            n.internet = self.internet == "on";
            Some(n)
        } else {
            None
        };
        Ok(s)
    }
}

/// The addresses `server` (a URL) resolves to, with its port; none when it does not
/// resolve (notebooks are then reachable from this node only).
fn server_addresses(server: &str) -> Vec<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let rest = server.split_once("://").map_or(server, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    let https = server.starts_with("https://");
    let with_port = if authority.rsplit_once(':').is_some_and(|(h, p)| {
        !h.ends_with(':') && p.parse::<u16>().is_ok() && (!h.contains(':') || h.ends_with(']'))
    }) {
        authority.to_owned()
    } else {
        format!("{authority}:{}", if https { 443 } else { 80 })
    };
    match with_port.to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => {
            tracing::warn!(server, error = %e, "cannot resolve the server: notebooks are \
                reachable from this node only");
            Vec::new()
        }
    }
}

/// The GPUs, and the simulated node when they are simulated.
fn backend(args: &BackendArgs) -> anyhow::Result<(Arc<dyn GpuBackend>, Option<SimNode>)> {
    if args.simulate {
        let node = SimNode::new(&args.gpus, args.sim_seed)?;
        let cuda = tessera_domain::image::CudaVersion::parse(&args.sim_cuda)
            .map_err(|e| anyhow::anyhow!("--sim-cuda: {e}"))?;
        node.set_driver(tessera_domain::wire::DriverInfo {
            version: args.sim_driver_version.clone(),
            cuda,
        });
        Ok((Arc::new(node.clone()), Some(node)))
    } else {
        Ok((Arc::new(NvmlBackend::init()?), None))
    }
}

/// Compares the table read from the device with the built-in catalog's, which the
/// planner falls back on and the simulator follows.
fn print_catalog_check(catalog: &tessera_domain::mig::Catalog, g: &tessera_domain::wire::GpuInfo) {
    let Some(builtin) = catalog.get(&g.name) else {
        println!("  catalog: no built-in model for {:?}", g.name);
        return;
    };
    if g.profiles.is_empty() {
        println!(
            "  catalog: built-in {} (no table read to compare)",
            builtin.name()
        );
        return;
    }
    match tessera_domain::wire::model_from_profiles(&g.name, &g.profiles) {
        Err(e) => println!("  catalog: the table read is not a valid model: {e}"),
        Ok(read) => {
            let diffs = builtin.differences_from(&read);
            if diffs.is_empty() {
                println!(
                    "  catalog: the table read matches built-in {}",
                    builtin.name()
                );
            }
            for d in diffs {
                println!("  catalog: {}: {d}", builtin.name());
            }
        }
    }
}

fn print_summary(inv: &tessera_domain::wire::Inventory, backend: &dyn GpuBackend) {
    let catalog = tessera_domain::mig::Catalog::builtin();
    match &inv.driver {
        Some(d) => println!("driver {} (CUDA {})", d.version, d.cuda),
        None => println!("driver: not readable"),
    }
    for g in &inv.gpus {
        let mode = g
            .mig_mode
            .map(|m| format!("MIG {:?} (pending {:?})", m.current, m.pending))
            .unwrap_or_else(|| "no MIG".to_owned());
        println!(
            "GPU {} {} {} {} MiB, {mode}",
            g.index, g.uuid, g.name, g.memory_mib
        );
        for p in &g.profiles {
            let starts: Vec<String> = p.placements.iter().map(|pl| pl.start.to_string()).collect();
            println!(
                "  profile {:>3} {:<12} {}g {} mem slices, max {}, {} MiB, placements {{{}}}:{}",
                p.id,
                p.name,
                p.compute_slices,
                p.memory_slices,
                p.max_count,
                p.memory_mib,
                starts.join(","),
                p.memory_slices
            );
        }
        if let Some(e) = &g.profiles_error {
            println!("  profiles: {e}");
        }
        print_catalog_check(&catalog, g);
        match &g.health {
            Some(h) => println!(
                "  health: {} critical Xid(s) (last {}), {} uncorrectable ECC error(s), \
                 retirement pending {}",
                h.xid_count,
                h.last_xid.map_or_else(|| "-".to_owned(), |x| x.to_string()),
                h.ecc_uncorrected,
                h.retirement_pending
            ),
            None => println!("  health: not readable"),
        }
        if let Some(w) = backend.xid_watch(&g.uuid) {
            println!("  xid events: {w}");
        }
        for i in &g.instances {
            for ci in &i.compute_instances {
                println!(
                    "  instance {}@{} gi {} ci {} {} processes {:?}",
                    i.profile,
                    i.start,
                    i.gi_id,
                    ci.ci_id,
                    ci.uuid.as_deref().unwrap_or("-"),
                    ci.process_count
                );
            }
            if i.compute_instances.is_empty() {
                println!(
                    "  instance {}@{} gi {} (no compute instance)",
                    i.profile, i.start, i.gi_id
                );
            }
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let (backend, sim_node) = backend(&cli.backend)?;
    if let Some(Command::Inventory { json, samples }) = cli.command {
        let inv = inventory(backend.as_ref())?;
        let samples = if samples {
            inv.gpus
                .iter()
                .map(|g| backend.sample(&g.uuid).map_err(anyhow::Error::from))
                .collect::<anyhow::Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        if json {
            let mut out = std::io::stdout().lock();
            // One document: the `Inventory` as it is, or with the samples beside it.
            if samples.is_empty() {
                serde_json::to_writer_pretty(&mut out, &inv)?;
            } else {
                let both = serde_json::json!({ "inventory": inv, "samples": samples });
                serde_json::to_writer_pretty(&mut out, &both)?;
            }
            std::io::Write::write_all(&mut out, b"\n")?;
        } else {
            print_summary(&inv, backend.as_ref());
            for s in &samples {
                println!("sample {s:?}");
            }
        }
        return Ok(());
    }
    let args = cli.run;
    let server = args
        .server
        .context("--server is required (or use `tessera-agent inventory`)")?;
    // Checked before a join token is spent.
    let transport = Transport {
        ca_pem: match &args.ca_file {
            Some(p) => {
                Some(std::fs::read(p).with_context(|| format!("--ca-file {}", p.display()))?)
            }
            None => None,
        },
        insecure_http: args.insecure_http,
    };
    match transport.check(&server) {
        UrlVerdict::Ok => {}
        UrlVerdict::InsecureAllowed => tracing::warn!(
            %server,
            "--insecure-http: the node credential and every report cross the network \
             in clear text"
        ),
        UrlVerdict::Refused(why) => anyhow::bail!(why),
    }
    let notebook_env = match &args.notebook_env {
        Some(dir) => {
            let env = NotebookEnv::open(dir).map_err(anyhow::Error::msg)?;
            if env.program("jupyter").is_none() {
                tracing::warn!(
                    dir = %env.dir().display(),
                    "the notebook environment has no bin/jupyter"
                );
            }
            Some(env)
        }
        None => None,
    };
    // crun, the workloads and the spool see this folder from other working directories:
    // everything handed on is an absolute path (`--state-dir data/sim` is common).
    let state_dir = std::path::absolute(&args.state_dir)
        .with_context(|| format!("resolving state dir {}", args.state_dir.display()))?;
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("creating state dir {}", state_dir.display()))?;
    // The credential and the workloads' state are the agent's alone.
    std::fs::set_permissions(
        &state_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .with_context(|| format!("protecting state dir {}", state_dir.display()))?;
    let cred_path = state_dir.join("credential.json");
    let creds = match Credentials::load(&cred_path)? {
        Some(c) if c.server == server.trim_end_matches('/') => c,
        _ => {
            let token = args
                .join_token
                .context("not registered yet: pass --join-token from the server")?;
            let hostname = args.hostname.clone().unwrap_or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .map(|h| h.trim().to_owned())
                    .unwrap_or_else(|_| "unknown".to_owned())
            });
            let c = HttpLink::register(
                &server,
                &RegisterRequest {
                    join_token: token,
                    hostname,
                    agent_version: env!("CARGO_PKG_VERSION").to_owned(),
                },
                &transport,
            )
            .await?;
            c.save(&cred_path)?;
            tracing::info!(node_id = %c.node_id, "registered");
            c
        }
    };
    let link = HttpLink::new(&creds, &transport)?;
    // Segments of 60 samples (10 minutes at the default interval).
    let spool = Spool::open(
        &state_dir.join("spool"),
        60,
        args.spool_capacity.div_ceil(60).max(1),
    )?;
    let cfg = RunConfig {
        manage_mig: args.manage_mig,
        reconcile_every: Duration::from_secs(args.reconcile_interval_s.max(1)),
        telemetry_every: Duration::from_secs(args.telemetry_interval_s.max(1)),
        heartbeat_every: Duration::from_secs(args.heartbeat_interval_s.max(1)),
        workload_every: Duration::from_millis(args.workload_interval_ms.max(100)),
        stop_workloads_on_exit: args.stop_workloads_on_exit,
    };
    let workload_root = std::path::absolute(
        args.workload_root
            .clone()
            .unwrap_or_else(|| state_dir.join("workloads")),
    )
    .context("resolving the workload root")?;
    let mut executor = LocalExecutor::open(&workload_root, &args.workload_host)
        .with_context(|| format!("opening the workload root {}", workload_root.display()))?
        .with_log_cap(args.workload_log_cap_mib.saturating_mul(1024 * 1024))
        .with_workspace_quota(
            args.workspace_quota_gib
                .map(|g| g.saturating_mul(1024 * 1024 * 1024)),
        );
    if let Some(env) = &notebook_env {
        tracing::info!(dir = %env.dir().display(), "notebooks start from this environment");
        executor = executor.with_notebook_env(env.clone());
    }
    executor = executor.with_images(args.images.open(&workload_root)?);
    if args.sandbox.switch == "on" {
        let mut settings = args.sandbox.settings()?;
        if let Some(env) = &notebook_env
            && env.dir().starts_with("/tmp")
        {
            tracing::warn!(
                dir = %env.dir().display(),
                "the notebook environment is under /tmp, which every sandbox replaces with \
                 a private one: sandboxed notebooks cannot run from it"
            );
        }
        for p in notebook_env.iter().flat_map(NotebookEnv::read_only_paths) {
            if !settings.read_only.contains(&p) {
                settings.read_only.push(p);
            }
        }
        if cli.backend.simulate {
            // Stand-in device nodes with the driver's numbering, so that the device rules
            // are exercised exactly as on hardware.
            let dev = state_dir.join("sim-dev");
            let minors: Vec<u32> = backend.devices()?.iter().map(|d| d.minor).collect();
            tessera_agent::sim::write_device_files(&dev, &minors)
                .with_context(|| format!("creating simulated device nodes in {}", dev.display()))?;
            settings.simulated_devices(dev);
            // Stand-ins for the driver's user-space files, mounted as the real ones are.
            let dir = state_dir.join("sim-nvidia");
            settings.driver_files = DriverFiles::write_stand_ins(
                &dir,
                &cli.backend.sim_driver_version,
                &cli.backend.sim_cuda,
            )
            .with_context(|| {
                format!("writing the simulated driver's files in {}", dir.display())
            })?;
        } else {
            settings.driver_files = DriverFiles::discover();
        }
        tracing::info!(
            files = settings.driver_files.files.len(),
            "NVIDIA driver files for image workloads"
        );
        if let Some(net) = &mut settings.network {
            // The portal: the one host that may open notebooks from outside the node,
            // and a service workloads have no business calling.
            let portal = server_addresses(&server);
            net.proxies = portal.iter().map(std::net::SocketAddr::ip).collect();
            net.blocked = portal;
        } else {
            tracing::warn!(
                "WORKLOADS SHARE THE NODE'S NETWORK (--sandbox-network off): each can reach \
                 every service listening on the node, other teams' notebooks and the cloud's \
                 metadata address"
            );
        }
        let sandbox = Sandbox::open(settings, Arc::clone(&backend), &state_dir.join("sandbox"))
            .map_err(anyhow::Error::msg)
            .context(
                "the workload sandbox cannot work here (--sandbox off runs workloads without it)",
            )?;
        tracing::info!(cgroups = ?sandbox.cgroup_mode(), "workload sandbox on");
        executor = executor.with_sandbox(sandbox);
    } else {
        tracing::warn!(
            "THE WORKLOAD SANDBOX IS OFF (--sandbox off): every workload this agent runs \
             runs as its user, can read the node credential and every team's files, and can \
             use every GPU. Only for a one-person lab (or where workloads run as Kubernetes \
             Pods, not through this agent). The nodes page shows the warning too."
        );
    }
    // One MPS control daemon per GPU shared with MPS, under <state-dir>/mps. Simulated
    // GPUs get the stand-in: this very program, as `tessera-agent sim-mps-control`.
    let mps_root = state_dir.join("mps");
    let mps: Arc<dyn MpsControl> = if let Some(node) = &sim_node {
        // What the simulated driver enforces (compute modes), for the stand-in's
        // processes to read.
        let sim_driver = state_dir.join("sim-driver");
        node.publish_driver_state(&sim_driver).with_context(|| {
            format!(
                "publishing the simulated driver's state in {}",
                sim_driver.display()
            )
        })?;
        let me = std::env::current_exe().context("finding the agent's own program")?;
        Arc::new(SimMps::new(&me, &mps_root).with_driver(&sim_driver))
    } else {
        Arc::new(NvidiaMps::new(&mps_root))
    };
    tracing::info!(node_id = %creds.node_id, manage_mig = cfg.manage_mig, "agent started");
    let parent = args.exit_with_pid;
    Agent::new(backend, link, cfg, Telemetry::new(spool))
        .with_mps(mps)
        .with_workloads(executor)
        .run(async move {
            let parent_gone = async {
                match parent {
                    Some(pid) => {
                        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
                        while proc_dir.exists() {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                        }
                        tracing::info!(pid, "parent process is gone; stopping");
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            // SIGTERM (systemd, `kill`) stops the agent like Ctrl-C, so that
            // --stop-workloads-on-exit gets to run.
            let terminated = async {
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot listen for SIGTERM");
                        std::future::pending::<()>().await;
                    }
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                () = parent_gone => {}
                () = terminated => {}
            }
        })
        .await
}

fn main() -> anyhow::Result<()> {
    // The simulator's stand-in for `nvidia-cuda-mps-control` (tessera_agent::mps): a
    // plain process, before any runtime or logging exists.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // A gang member's remote agent (`tessera-rsh`, the same executable under another name).
    if args
        .first()
        .map(std::path::Path::new)
        .and_then(|p| p.file_name())
        == Some(std::ffi::OsStr::new(tessera_agent::gang_rsh::PROGRAM))
    {
        std::process::exit(tessera_agent::gang_rsh::main());
    }
    if args.get(1).is_some_and(|a| a == SIM_SUBCOMMAND) {
        std::process::exit(sim_control_main(&args[2..]));
    }
    // And for a CUDA program creating a context (what the tests run as a workload).
    if args.get(1).is_some_and(|a| a == SIM_CONTEXT_SUBCOMMAND) {
        std::process::exit(sim_context_main(&args[2..]));
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(Cli::parse()))
}
