//! Build helper: `cargo xtask run` and `cargo xtask test` (see README).
//!
//! Why an xtask instead of cargo-leptos: everything it needs comes from crates.io through
//! Cargo (wasm-bindgen runs in-process as a library), so a fresh machine needs no pinned tool
//! installs (cargo-leptos costs ~17 minutes of those here).

mod bundle;
mod invariants;
mod jax;
mod jupyter;

use anyhow::{Context, Result, bail};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const WASM_TARGET: &str = "wasm32-unknown-unknown";
const OUTPUT_NAME: &str = "tessera";

fn main() {
    if let Err(e) = main_inner() {
        // `{:#}` and no backtrace: CI shows the tail of the output, and a backtrace of the
        // xtask itself would push the useful part (the digest of failures) out of it.
        eprintln!("\nError: {e:#}");
        std::process::exit(1);
    }
}

fn main_inner() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root()?;
    std::env::set_current_dir(&root)?;
    let release = args.iter().any(|a| a == "--release");
    let rest: Vec<String> = args
        .iter()
        .skip(1)
        .filter(|a| *a != "--release")
        .cloned()
        .collect();
    match args.first().map(String::as_str) {
        Some("build") => build(release, release).map(|_| ()),
        Some("bundle") => {
            ensure_tools(false)?;
            build_wasm(!args.iter().any(|a| a == "--debug"))
        }
        Some("run") => run(release, &rest),
        Some("test") => test(),
        Some("invariants") => invariants::check(&workspace_root()?),
        Some("e2e") => {
            build(false, true)?;
            ensure_jupyterlab()?;
            e2e()
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <command>\n\n  \
                 build [--release]   build the server and the wasm UI bundle\n  \
                 bundle [--debug]    build only the UI bundle (release: wasm-opt'd)\n  \
                 run [--release] [-- ARGS]   build, then `tessera serve ARGS`\n  \
                 test                fmt, promtool rule tests, clippy (ssr + hydrate), unit +\n                      \
                 integration tests on SQLite and PostgreSQL, browser e2e\n  \
                 e2e                 only the browser tests"
            );
            bail!("unknown or missing command")
        }
    }
}

fn workspace_root() -> Result<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    Ok(dir
        .parent()
        .context("xtask has no parent folder")?
        .to_path_buf())
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
}

fn site_root() -> PathBuf {
    target_dir().join("site")
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn step(name: &str, cmd: &mut Command) -> Result<()> {
    eprintln!("\n==> {name}");
    let started = Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("cannot start: {cmd:?}"))?;
    if !status.success() {
        bail!("{name} failed ({status})");
    }
    eprintln!("    {name}: ok in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Like [`step`], but echoes the command's output as it comes and, if the command fails,
/// repeats the first panic messages at the end, so a log that keeps only its tail still
/// says why tests failed.
fn step_with_digest(name: &str, cmd: &mut Command) -> Result<()> {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::{Arc, Mutex};
    eprintln!("\n==> {name}");
    let started = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start: {cmd:?}"))?;
    let digest: Arc<Mutex<Vec<String>>> = Arc::default();
    let echo = |pipe: Box<dyn std::io::Read + Send>, to_stderr: bool| {
        let digest = Arc::clone(&digest);
        std::thread::spawn(move || {
            // Lines left to keep after a panic line (its message follows it).
            let mut keep = 0;
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if to_stderr {
                    let _ = writeln!(std::io::stderr(), "{line}");
                } else {
                    let _ = writeln!(std::io::stdout(), "{line}");
                }
                if line.contains("panicked at") {
                    keep = 4;
                }
                if keep > 0 {
                    keep -= 1;
                    let mut d = digest.lock().unwrap_or_else(|e| e.into_inner());
                    if d.len() < 120 {
                        d.push(line);
                    }
                }
            }
        })
    };
    let out = echo(Box::new(child.stdout.take().context("stdout")?), false);
    let err = echo(Box::new(child.stderr.take().context("stderr")?), true);
    let status = child.wait()?;
    let _ = out.join();
    let _ = err.join();
    if !status.success() {
        let d = digest.lock().unwrap_or_else(|e| e.into_inner());
        if !d.is_empty() {
            eprintln!("\n==> first panics of {name}:");
            for line in d.iter() {
                eprintln!("{line}");
            }
        }
        bail!("{name} failed ({status})");
    }
    eprintln!("    {name}: ok in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Installs what a fresh machine lacks: the wasm target, rustfmt/clippy, Debian packages.
fn ensure_tools(for_tests: bool) -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(WASM_TARGET))
        .unwrap_or(false);
    if !installed {
        step(
            "rustup target add wasm32-unknown-unknown",
            Command::new("rustup").args(["target", "add", WASM_TARGET]),
        )?;
    }
    // The workload sandbox of the simulated nodes' agents.
    if !have("crun") && is_root() {
        apt_install(&["crun"])?;
    }
    // Its per-workload networks (docs/security.md).
    if !have("nft") && is_root() {
        apt_install(&["nftables", "iproute2"])?;
    }
    prepare_cgroups()?;
    if !for_tests {
        return Ok(());
    }
    let components = Command::new("rustup")
        .args(["component", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    for c in ["rustfmt", "clippy"] {
        if !components.contains(c) {
            step(
                &format!("rustup component add {c}"),
                Command::new("rustup").args(["component", "add", c]),
            )?;
        }
    }
    // What the tests need from Debian, each with what shows it is there already.
    let debian: [(bool, &[&str]); 11] = [
        (
            Path::new("/usr/bin/chromium").exists(),
            &["chromium", "chromium-driver"],
        ),
        (
            have("initdb") || Path::new(&pg_bin("initdb")).exists(),
            &["postgresql"],
        ),
        (have("npm"), &["nodejs", "npm"]),
        (have("promtool"), &["prometheus"]),
        // The multi-host test's network namespaces (`ip netns`, `nsenter`).
        (have("ip"), &["iproute2"]),
        (have("nsenter"), &["util-linux"]),
        // The image pull tests' registry, the busybox their images carry, and htpasswd
        // for the registry's basic auth (agent/tests/oci_registry.rs).
        (
            Path::new("/usr/bin/docker-registry").exists(),
            &["docker-registry"],
        ),
        (Path::new("/bin/busybox").exists(), &["busybox-static"]),
        (have("htpasswd"), &["apache2-utils"]),
        // The gang tests' MPI job (e2e/gang/allreduce.py, Debian's python3).
        (have("mpirun"), &["openmpi-bin"]),
        (
            Path::new("/usr/lib/python3/dist-packages/mpi4py").exists(),
            &["python3-mpi4py"],
        ),
    ];
    let packages: Vec<&str> = debian
        .iter()
        .filter(|(there, _)| !there)
        .flat_map(|(_, p)| p.iter().copied())
        .collect();
    if !packages.is_empty() {
        apt_install(&packages)?;
    }
    // The notification tests' SMTP server (server/tests/it/notifications.rs).
    pip_install("aiosmtpd", "aiosmtpd==1.4.6")?;
    Ok(())
}

fn apt_install(packages: &[&str]) -> Result<()> {
    let sudo = if is_root() { "" } else { "sudo " };
    step(
        &format!("apt-get install {}", packages.join(" ")),
        Command::new("sh").args([
            "-c",
            &format!(
                "{sudo}apt-get update -q && DEBIAN_FRONTEND=noninteractive {sudo}apt-get \
                 install -y -q {}",
                packages.join(" ")
            ),
        ]),
    )
}

/// crun cannot use a host that mounts cgroup v1 hierarchies beside a v2 one that holds
/// controllers (this sandbox's layout: `hugetlb` on v2). Mounting each such controller
/// as a v1 hierarchy of its own puts every controller on one side (docs/security.md).
fn prepare_cgroups() -> Result<()> {
    let unified = Path::new("/sys/fs/cgroup/unified/cgroup.controllers");
    let Ok(controllers) = std::fs::read_to_string(unified) else {
        return Ok(());
    };
    if controllers.trim().is_empty() || !is_root() {
        return Ok(());
    }
    for c in controllers.split_whitespace() {
        let dir = format!("/sys/fs/cgroup/{c}");
        step(
            &format!("mount the {c} cgroup controller as a v1 hierarchy (for crun)"),
            Command::new("sh").args([
                "-c",
                &format!("mkdir -p {dir} && mount -t cgroup -o {c} cgroup {dir}"),
            ]),
        )?;
    }
    Ok(())
}

/// Read-only paths the sandboxed workloads need besides the system folders: the Python
/// installation `python3` comes from (for jobs; and pyenv's shims, when that is how it is reached).
/// The notebooks' JupyterLab environment is the agent's own setting, which it mounts
/// itself (with the installation its `python` links to).
fn sandbox_read_only() -> String {
    let mut paths = Vec::new();
    let out = |cmd: &mut Command| {
        cmd.stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    if let Some(p) = out(Command::new("python3").args([
        "-c",
        "import sys; print(sys.prefix); print(sys.base_prefix)",
    ])) {
        paths.extend(p.lines().map(str::to_owned));
    }
    if let Some(p) = out(Command::new("pyenv").arg("root")) {
        paths.push(p);
    }
    paths.retain(|p| !p.starts_with("/usr") && p != "/");
    paths.sort();
    paths.dedup();
    paths.join(",")
}

/// The environment the simulated nodes' agents get their sandbox settings and their
/// notebook environment (the project's JupyterLab, once provisioned) from.
fn sandbox_env(cmd: &mut Command) {
    cmd.env("TESSERA_AGENT_SANDBOX_RO", sandbox_read_only());
    // One set by hand (another JupyterLab) wins.
    if std::env::var_os(jupyter::AGENT_ENV_VAR).is_none()
        && let Some(venv) = workspace_root().ok().and_then(|r| jupyter::project_env(&r))
    {
        cmd.env(jupyter::AGENT_ENV_VAR, venv);
    }
    if !is_root() {
        eprintln!(
            "\n!!! not running as root: the simulated nodes run workloads WITHOUT the sandbox \
             (TESSERA_AGENT_SANDBOX=off); every workload can read every team's files. Run as \
             root for the isolation a real deployment has."
        );
        cmd.env("TESSERA_AGENT_SANDBOX", "off");
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Builds the wasm bundle into `<target>/site/pkg` and the server binary. The browser
/// tests use a debug server with the release bundle (wasm-opt'd, as users get it): that is
/// what proves hydration survives wasm-opt, and it loads far faster than a debug bundle.
fn build(release: bool, release_bundle: bool) -> Result<PathBuf> {
    ensure_tools(false)?;
    build_wasm(release_bundle)?;
    let mut cmd = cargo();
    cmd.args([
        "build",
        "-p",
        "tessera-server",
        "-p",
        "tessera-agent",
        "--bins",
    ]);
    if release {
        cmd.arg("--release");
    }
    step("build server", &mut cmd)?;
    Ok(target_dir()
        .join(if release { "release" } else { "debug" })
        .join("tessera"))
}

fn build_wasm(release: bool) -> Result<()> {
    let wasm_target_dir = target_dir().join(if release { "wasm-release" } else { "wasm" });
    let mut cmd = cargo();
    cmd.args([
        "rustc",
        "-p",
        "tessera-app",
        "--lib",
        "--crate-type",
        "cdylib",
        "--features",
        "hydrate",
        "--target",
        WASM_TARGET,
    ])
    .arg("--target-dir")
    .arg(&wasm_target_dir);
    if release {
        cmd.args(["--profile", "wasm-release"]);
    }
    // wasm-split needs the linker's relocations to move code between modules; only the
    // final link changes, so the dependencies stay built.
    cmd.args(["--", "-C", "link-arg=--emit-relocs"]);
    step("build wasm UI bundle", &mut cmd)?;
    let profile_dir = if release { "wasm-release" } else { "debug" };
    let raw = wasm_target_dir
        .join(WASM_TARGET)
        .join(profile_dir)
        .join("tessera_app.wasm");
    let stage = target_dir().join("site-stage");
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(&stage)?;
    // Debug builds are split too: the lazy routes' code calls its loader either way.
    let (chunk_stems, loader, needs) = split_wasm(&raw, &stage)?;
    let input = stage.join("main.wasm");
    eprintln!("==> wasm-bindgen {}", input.display());
    wasm_bindgen_cli_support::Bindgen::new()
        .input_path(&input)
        .out_name(OUTPUT_NAME)
        .web(true)?
        .debug(!release)
        // The split chunks link against the main module's exports.
        .keep_lld_exports(true)
        .generate(&stage)
        .context("wasm-bindgen")?;
    let wasm = stage.join(format!("{OUTPUT_NAME}_bg.wasm"));
    let chunk_file = |stem: &str| stage.join(format!("{stem}.wasm"));
    if release {
        let mut all = vec![wasm.clone()];
        all.extend(chunk_stems.iter().map(|stem| chunk_file(stem)));
        wasm_opt(&all)?;
    }
    let chunks = chunk_stems
        .into_iter()
        .map(|stem| {
            let bytes = std::fs::read(chunk_file(&stem))?;
            Ok((stem, bytes))
        })
        .collect::<Result<Vec<_>>>()?;
    bundle::publish(
        &bundle::Parts {
            js: std::fs::read(stage.join(format!("{OUTPUT_NAME}.js")))?,
            wasm: std::fs::read(&wasm)?,
            css: std::fs::read("style/main.css").context("reading style/main.css")?,
            split: Some(bundle::Split {
                loader,
                chunks,
                needs,
            }),
        },
        OUTPUT_NAME,
        &site_root().join("pkg"),
        release,
    )
}

/// The chunk files' stems, the loader module, and for each split point the chunk stems it
/// needs.
type SplitOutput = (
    Vec<String>,
    Vec<u8>,
    std::collections::BTreeMap<String, Vec<String>>,
);

/// Splits the wasm at the app's groups of lazily loaded pages (`#[leptos::lazy]`,
/// `app/src/pages.rs`): `stage/main.wasm` keeps what every page needs, each group's own
/// code goes to a module of its own, and code some groups share to chunks, all in `stage`.
fn split_wasm(raw: &Path, stage: &Path) -> Result<SplitOutput> {
    eprintln!("==> wasm-split {}", raw.display());
    let started = Instant::now();
    let input = std::fs::read(raw).with_context(|| format!("reading {}", raw.display()))?;
    let main = stage.join("main.wasm");
    let mut opts = wasm_split_cli_support::Options::new(&input);
    opts.output_dir = stage;
    opts.main_out_path = &main;
    opts.link_name = bundle::LOADER_PLACEHOLDER;
    opts.main_module = bundle::MAIN_PLACEHOLDER;
    let out = wasm_split_cli_support::transform(opts)
        .map_err(|e| anyhow::anyhow!("wasm-split: {e:#}"))?;
    let loader = std::fs::read(stage.join(bundle::LOADER_PLACEHOLDER))?;
    let mut stems = out
        .split_modules
        .iter()
        .map(|path| {
            path.file_stem()
                .and_then(|s| s.to_str())
                .map(str::to_owned)
                .context("chunk file name")
        })
        .collect::<Result<Vec<_>>>()?;
    stems.sort();
    eprintln!(
        "    wasm-split: {} chunks in {:.1}s",
        stems.len(),
        started.elapsed().as_secs_f64()
    );
    Ok((stems, loader, out.prefetch_map.into_iter().collect()))
}

/// Shrinks the release wasm with binaryen's `wasm-opt` from npm (`e2e/package.json` pins
/// it: Debian's older wasm-opt breaks hydration). Without Node.js the bundle ships
/// unoptimised, with a warning.
fn wasm_opt(files: &[PathBuf]) -> Result<()> {
    if let Err(e) = ensure_e2e_packages() {
        eprintln!("warning: no wasm-opt ({e:#}); the UI bundle is not size-optimised");
        return Ok(());
    }
    for wasm in files {
        let before = std::fs::metadata(wasm)?.len();
        let out = wasm.with_extension("opt.wasm");
        step(
            "wasm-opt -Oz (binaryen from npm)",
            Command::new("node")
                .arg(Path::new("e2e/node_modules/binaryen/bin/wasm-opt"))
                .args([
                    "-Oz",
                    "--enable-bulk-memory",
                    "--enable-nontrapping-float-to-int",
                ])
                .args([
                    "--enable-sign-ext",
                    "--enable-mutable-globals",
                    "--enable-reference-types",
                ])
                .arg(wasm)
                .arg("-o")
                .arg(&out),
        )?;
        std::fs::rename(&out, wasm)?;
        let after = std::fs::metadata(wasm)?.len();
        eprintln!(
            "    wasm-opt {}: {} KiB -> {} KiB",
            wasm.file_name().unwrap_or_default().to_string_lossy(),
            before / 1024,
            after / 1024
        );
    }
    Ok(())
}

fn run(release: bool, args: &[String]) -> Result<()> {
    let bin = build(release, release)?;
    // Notebooks need it; the rest of the portal does not, so a failure only warns.
    if let Err(e) = ensure_jupyterlab() {
        eprintln!(
            "\n!!! JupyterLab could not be provisioned ({e:#}): notebooks will fail to start \
             until it is (the next `cargo xtask run` tries again)."
        );
    }
    let mut cmd = Command::new(bin);
    sandbox_env(&mut cmd);
    cmd.arg("serve").arg("--site-root").arg(site_root());
    cmd.args(args.iter().filter(|a| *a != "--"));
    eprintln!("\n==> tessera serve (Ctrl-C to stop)");
    let status = cmd.status()?;
    if !status.success() {
        bail!("tessera exited with {status}");
    }
    Ok(())
}

fn test() -> Result<()> {
    let started = Instant::now();
    ensure_tools(true)?;
    step(
        "cargo fmt --check",
        cargo().args(["fmt", "--all", "--", "--check"]),
    )?;
    step(
        "promtool check rules (deploy/monitoring)",
        Command::new("promtool").args(["check", "rules", "deploy/monitoring/tessera-rules.yml"]),
    )?;
    step(
        "promtool test rules (deploy/monitoring/tests)",
        Command::new("promtool").args([
            "test",
            "rules",
            "deploy/monitoring/tests/tessera-rules.test.yml",
        ]),
    )?;
    step(
        "clippy (server side: domain, app/ssr, server, agent, xtask)",
        cargo().args([
            "clippy",
            "--workspace",
            "--exclude",
            "tessera-app",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    let wasm_clippy = |args: &[&str]| {
        let mut cmd = cargo();
        cmd.arg("clippy")
            .args(args)
            .args(["--target", WASM_TARGET, "--target-dir"])
            .arg(target_dir().join("wasm"))
            .args(["--", "-D", "warnings"]);
        cmd
    };
    step(
        "clippy (browser side: app/hydrate on wasm32)",
        &mut wasm_clippy(&["-p", "tessera-app", "--features", "hydrate"]),
    )?;
    // On its own, so the UI's features cannot hide a domain dependency that needs I/O.
    step(
        "clippy (domain alone on wasm32: stays pure)",
        &mut wasm_clippy(&["-p", "tessera-domain"]),
    )?;
    check_dependency_direction()?;
    invariants::check(&workspace_root()?)?;
    ensure_jupyterlab()?;
    let jax_python = jax::provision(&workspace_root()?.join(jax::DIR))?;
    // The single sign-on tests start the OpenID Provider from e2e/node_modules.
    ensure_e2e_packages()?;
    let pg = Postgres::start()?;
    let url = pg.url();
    step_with_digest(
        "unit and integration tests (SQLite and PostgreSQL)",
        {
            let mut c = cargo();
            sandbox_env(&mut c);
            c
        }
        .args(["test", "--workspace", "--exclude", "tessera-app"])
        .env("TESSERA_TEST_PG_URL", &url)
        .env(jax::TEST_ENV_VAR, &jax_python)
        .env("TESSERA_REQUIRE_PG", "1")
        .env("TESSERA_REQUIRE_REGISTRY", "1")
        // The multi-host test runs here (root: network namespaces) instead of skipping.
        .envs(is_root().then_some(("TESSERA_REQUIRE_NETNS", "1"))),
    )?;
    drop(pg);
    step(
        "UI unit tests (app with ssr)",
        cargo().args(["test", "-p", "tessera-app", "--features", "ssr"]),
    )?;
    build(false, true)?;
    e2e()?;
    fuzz_api()?;
    eprintln!(
        "\nAll checks passed in {:.0}s.",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The crate graph points one way (ARCHITECTURE.md): `domain ← core ← app(ssr) ← server`,
/// `domain ← registry ← agent`, `registry ← core` (the server reaches the registry through
/// core; only its tests use it directly), and the browser build of `app` pulls in neither
/// `core` nor a database driver. Checked on `cargo tree`'s normal (non-dev) edges.
fn check_dependency_direction() -> Result<()> {
    eprintln!("\n==> dependency direction (cargo tree)");
    // Forbidden dependencies, each crate's as a space-separated list (read with `split`).
    let rules: [(&str, &[&str], &str); 6] = [
        (
            "tessera-domain",
            &[],
            "tessera-core tessera-app tessera-server tessera-agent sqlx tokio",
        ),
        (
            "tessera-core",
            &[],
            "tessera-app tessera-server tessera-agent leptos axum kube openidconnect",
        ),
        (
            "tessera-app",
            &["--features", "ssr"],
            "tessera-server tessera-agent",
        ),
        (
            "tessera-app",
            &["--features", "hydrate", "--target", WASM_TARGET],
            "tessera-core tessera-server tessera-agent sqlx tokio",
        ),
        (
            "tessera-registry",
            &[],
            "tessera-core tessera-app tessera-server tessera-agent sqlx leptos kube",
        ),
        (
            "tessera-agent",
            &[],
            "tessera-core tessera-app tessera-server sqlx leptos kube openidconnect",
        ),
    ];
    for (krate, args, forbidden) in rules {
        let out = cargo()
            .args([
                "tree", "-q", "-p", krate, "-e", "normal", "--prefix", "none",
            ])
            .args(["--format", "{p}"])
            .args(args)
            .output()
            .context("cargo tree")?;
        if !out.status.success() {
            bail!(
                "cargo tree -p {krate} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let tree = String::from_utf8_lossy(&out.stdout);
        for dep in forbidden.split(' ') {
            if tree
                .lines()
                .any(|l| l.split_whitespace().next() == Some(dep))
            {
                bail!(
                    "{krate} {} depends on {dep}: see ARCHITECTURE.md",
                    args.join(" ")
                );
            }
        }
    }
    eprintln!("    dependency direction: ok");
    Ok(())
}

/// Starts a fresh server on a free port and runs the browser tests against it.
fn e2e() -> Result<()> {
    let e2e_dir = Path::new("e2e");
    ensure_e2e_packages()?;
    let password = "e2e-admin-password-1";
    let port = free_port()?;
    let data = tempfile_dir("tessera-e2e")?;
    let (idp, issuer) = start_identity_provider(port, &data)?;
    let sso = [
        ("TESSERA_OIDC_ISSUER", issuer.clone()),
        ("TESSERA_OIDC_CLIENT_ID", E2E_CLIENT_ID.to_owned()),
        ("TESSERA_OIDC_CLIENT_SECRET", E2E_CLIENT_SECRET.to_owned()),
        ("TESSERA_OIDC_PROVIDER_NAME", "Test IdP".to_owned()),
        (
            "TESSERA_OIDC_GROUP_MAP",
            "gpu-vision-admins=SSO Vision:team_admin".to_owned(),
        ),
    ];
    let (server, base) = serve_for_tests(&data, password, port, &sso)?;
    validate_openapi(&base)?;
    let result = step(
        "browser tests (headless Chromium)",
        Command::new("node")
            .args(["--test", "--test-concurrency=1", "tests/"])
            .current_dir(e2e_dir)
            .env("TESSERA_URL", &base)
            .env("TESSERA_IDP_URL", &issuer)
            .env("TESSERA_ADMIN_PASSWORD", password),
    );
    drop(server);
    drop(idp);
    if result.is_err() {
        eprintln!(
            "server log: {}\nscreenshots: e2e/artifacts/",
            data.join("server.log").display()
        );
    }
    result
}

const E2E_CLIENT_ID: &str = "tessera-e2e";
const E2E_CLIENT_SECRET: &str = "e2e-client-secret-0123456789abcdef";

/// The npm packages of the browser tests and the test identity provider (oidc-provider 9
/// needs Node.js 20 or later).
fn ensure_e2e_packages() -> Result<()> {
    let e2e_dir = Path::new("e2e");
    let version = Command::new("node")
        .arg("--version")
        .output()
        .context("running node --version")?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    if node_major(&version).is_none_or(|major| major < 20) {
        bail!(
            "Node.js {version} is too old for the test identity provider (oidc-provider 9): \
             install Node.js 20 or later"
        );
    }
    let installed = ["playwright-core", "oidc-provider", "binaryen", "axe-core"]
        .iter()
        .all(|p| e2e_dir.join("node_modules").join(p).exists());
    if installed {
        return Ok(());
    }
    step(
        "npm ci (e2e)",
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(e2e_dir),
    )
}

/// `v20.20.2` → 20.
fn node_major(version: &str) -> Option<u32> {
    version
        .trim_start_matches('v')
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Starts the test OpenID Provider (`e2e/oidc/provider.mjs`, oidc-provider from npm) for
/// a Tessera on `port`; returns it and its issuer URL. Its log goes to `data/idp.log`.
fn start_identity_provider(port: u16, data: &Path) -> Result<(KillOnDrop, String)> {
    use std::io::BufRead;
    let log = std::fs::File::create(data.join("idp.log"))?;
    let mut child = Command::new("node")
        .arg("e2e/oidc/provider.mjs")
        .args([
            "--redirect-uri",
            &format!("http://127.0.0.1:{port}/auth/oidc/callback"),
        ])
        .args([
            "--client-id",
            E2E_CLIENT_ID,
            "--client-secret",
            E2E_CLIENT_SECRET,
        ])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("starting node e2e/oidc/provider.mjs")?;
    let stdout = child.stdout.take().context("provider stdout")?;
    let idp = KillOnDrop(child);
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    let issuer = line
        .split("\"issuer\":\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .with_context(|| {
            format!(
                "the identity provider did not start (see {})",
                data.join("idp.log").display()
            )
        })?
        .to_owned();
    Ok((idp, issuer))
}

/// Starts `tessera serve` (debug build) on `port` with a fresh SQLite database in `data`,
/// the embedded simulated nodes, `password` for the bootstrap admin and the extra settings
/// `env`; returns the running server and its base URL (its log is `data/server.log`).
fn serve_for_tests(
    data: &Path,
    password: &str,
    port: u16,
    env: &[(&str, String)],
) -> Result<(KillOnDrop, String)> {
    let base = format!("http://127.0.0.1:{port}");
    let bin = target_dir().join("debug").join("tessera");
    let log = std::fs::File::create(data.join("server.log"))?;
    let mut server = Command::new(&bin);
    sandbox_env(&mut server);
    let server = server
        .arg("serve")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("TESSERA_BIND", format!("127.0.0.1:{port}"))
        .env(
            "TESSERA_DATABASE_URL",
            format!("sqlite://{}/tessera.db?mode=rwc", data.display()),
        )
        .env("TESSERA_ADMIN_PASSWORD", password)
        .env("TESSERA_SITE_ROOT", site_root())
        .env("TESSERA_SIM_STATE_DIR", data.join("sim"))
        // The billing journey sees its charge within seconds of releasing a slice.
        .env("TESSERA_METERING_INTERVAL", "1s")
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let server = KillOnDrop(server);
    wait_for_http(&format!("127.0.0.1:{port}"), Duration::from_secs(60))?;
    Ok((server, base))
}

/// Fuzzes the REST API of a fresh server with Schemathesis (PyPI, installed when missing)
/// as a platform admin and as a member: no 5xx, every response as documented
/// (`e2e/fuzz_api.py`).
fn fuzz_api() -> Result<()> {
    pip_install("schemathesis", "schemathesis==4.32.5")?;
    let password = "fuzz-admin-password-1";
    let data = tempfile_dir("tessera-fuzz")?;
    let (server, base) = serve_for_tests(&data, password, free_port()?, &[])?;
    let result = step(
        "API fuzzing (Schemathesis: no 5xx, responses match the OpenAPI document)",
        Command::new("python3").args(["e2e/fuzz_api.py", &base, password]),
    );
    drop(server);
    if result.is_err() {
        eprintln!("server log: {}", data.join("server.log").display());
    }
    result
}

/// Checks the served OpenAPI document against the OpenAPI 3 schema with the reference
/// validator from PyPI (installed when missing).
fn validate_openapi(base: &str) -> Result<()> {
    pip_install("openapi_spec_validator", "openapi-spec-validator")?;
    let script = "import json, sys, urllib.request\n\
                  from openapi_spec_validator import validate\n\
                  doc = json.load(urllib.request.urlopen(sys.argv[1] + '/api/v1/openapi.json'))\n\
                  validate(doc)\n\
                  print('    OpenAPI', doc['openapi'], 'document:', len(doc['paths']), 'paths valid')\n";
    step(
        "validate the OpenAPI document",
        Command::new("python3").args(["-c", script, base]),
    )
}

/// Installs `spec` from PyPI unless `python3` can already import `module`.
fn pip_install(module: &str, spec: &str) -> Result<()> {
    let have = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if have {
        return Ok(());
    }
    step(
        &format!("pip install {spec}"),
        &mut jupyter::pip_install("python3", spec),
    )
}

/// JupyterLab (PyPI) for the simulated nodes' notebooks, in the project's virtual
/// environment `.venv-jupyter` (see `jupyter.rs`); a no-op once it is there.
fn ensure_jupyterlab() -> Result<()> {
    let venv = workspace_root()?.join(jupyter::DIR);
    jupyter::provision(&venv, jupyter::VERSION)?;
    Ok(())
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    /// Asks the server to shut down (SIGTERM) so it can stop its simulated agents, and only
    /// kills it if it has not exited after 15 s.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_for_http(addr: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(addr).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("server did not start listening on {addr} within {timeout:?}")
}

fn tempfile_dir(prefix: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn pg_bin(name: &str) -> String {
    format!("/usr/lib/postgresql/15/bin/{name}")
}

fn pg_tool(name: &str) -> String {
    if have(name) {
        name.to_owned()
    } else {
        pg_bin(name)
    }
}

/// A throwaway PostgreSQL cluster (initdb + pg_ctl), stopped on drop. As root, it runs as
/// the `postgres` user, since initdb refuses to run as root.
struct Postgres {
    dir: PathBuf,
    port: u16,
    external: Option<String>,
}

impl Postgres {
    fn start() -> Result<Self> {
        if let Ok(url) = std::env::var("TESSERA_TEST_PG_URL") {
            eprintln!("==> using PostgreSQL at TESSERA_TEST_PG_URL");
            return Ok(Self {
                dir: PathBuf::new(),
                port: 0,
                external: Some(url),
            });
        }
        let dir = tempfile_dir("tessera-pg")?;
        let port = free_port()?;
        let run_as = |args: &[&str]| -> Command {
            if is_root() {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).args(args);
                c
            } else {
                let mut c = Command::new(args[0]);
                c.args(&args[1..]);
                c
            }
        };
        if is_root() {
            step(
                "prepare PostgreSQL folder",
                Command::new("chown").arg("postgres:postgres").arg(&dir),
            )?;
        }
        let data = dir.join("data");
        let data_s = data.to_string_lossy().to_string();
        let initdb = pg_tool("initdb");
        step(
            "initdb (throwaway PostgreSQL)",
            run_as(&[&initdb, "-D", &data_s, "-A", "trust", "-U", "tessera"]).stdout(Stdio::null()),
        )?;
        let opts = format!(
            "-k {} -p {port} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            dir.display()
        );
        let log = dir.join("log").to_string_lossy().to_string();
        let pg_ctl = pg_tool("pg_ctl");
        step(
            "start PostgreSQL",
            run_as(&[
                &pg_ctl, "-D", &data_s, "-o", &opts, "-l", &log, "start", "-w",
            ])
            .stdout(Stdio::null()),
        )?;
        Ok(Self {
            dir,
            port,
            external: None,
        })
    }

    fn url(&self) -> String {
        match &self.external {
            Some(u) => u.clone(),
            None => format!("postgres://tessera@127.0.0.1:{}/postgres", self.port),
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.external.is_some() {
            return;
        }
        let data = self.dir.join("data").to_string_lossy().to_string();
        let pg_ctl = pg_tool("pg_ctl");
        let mut c = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", &pg_ctl]);
            c
        } else {
            Command::new(&pg_ctl)
        };
        let _ = c
            .args(["-D", &data, "stop", "-m", "fast"])
            .stdout(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::node_major;

    #[test]
    fn node_versions_parse() {
        assert_eq!(node_major("v20.20.2"), Some(20));
        assert_eq!(node_major("v18.19.0\n".trim()), Some(18));
        assert_eq!(node_major("not a version"), None);
    }
}
