//! Workloads in OCI images through the agent (issue 36): a real registry on loopback
//! (`tessera_registry::testkit`, Debian's `docker-registry`; TLS with a CA made here and
//! basic auth for the credentials cases), images built by the tests, real `crun`
//! containers over a simulated H100. The pull runs beside the agent's loop and is
//! reported; the job sees its image and the simulated driver's stand-in files; ten
//! workloads on one image fetch each blob once; an image in use is never collected; a
//! wrong login fails to start without the password anywhere; a stop during a pull
//! cancels it. Needs root and crun (`cargo xtask test` has both).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_agent::backend::{GpuBackend, inventory};
use tessera_agent::driver_files::DriverFiles;
use tessera_agent::oci::unpack::Limits;
use tessera_agent::oci::{ImageStore, PullError, StoreLimits};
use tessera_agent::run::{Agent, RunConfig};
use tessera_agent::sandbox::Sandbox;
use tessera_agent::sim::{SimNode, write_device_files};
use tessera_agent::spool::Spool;
use tessera_agent::telemetry::Telemetry;
use tessera_agent::workloads::LocalExecutor;
use tessera_domain::image::{CudaVersion, ImageRef};
use tessera_domain::wire::{
    DriverInfo, ImageSpec, RegistryLogin, WorkloadPhase, WorkloadReport, WorkloadSpec,
};
use tessera_registry::testkit::{
    Built, Registry, Tls, build_image, htpasswd, push, registry_available,
};

use crate::support::{FakeServer, H100, run_config, sync};

const WAIT: Duration = Duration::from_secs(60);
const FIRST_UID: u32 = 320_000;

/// Whether this machine can run the tests (root, crun, busybox, the registry); they
/// are skipped, saying why, only outside CI.
fn can_run() -> bool {
    if !registry_available() {
        return false;
    }
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid() == 0
    });
    let ok = root && which("crun").is_some() && Path::new("/bin/busybox").exists();
    if !ok {
        assert!(
            std::env::var_os("TESSERA_REQUIRE_REGISTRY").is_none() || !root,
            "as root in CI, crun and busybox-static must be installed"
        );
        eprintln!("SKIPPED: image workloads need root, crun and busybox-static");
    }
    ok
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

/// A simulated one-GPU node with a sandbox whose image workloads get the simulated
/// driver's stand-in files, and an image store.
struct Node {
    dir: tempfile::TempDir,
    sim: SimNode,
    gpu: String,
}

impl Node {
    fn new() -> Node {
        let sim = SimNode::new(&[H100], 21).unwrap();
        let gpu = sim.gpu_uuids()[0].clone();
        let dir = tempfile::tempdir().unwrap();
        write_device_files(&dir.path().join("dev"), &[0]).unwrap();
        Node { dir, sim, gpu }
    }

    fn state(&self) -> &Path {
        self.dir.path()
    }

    fn sandbox(&self, uid_first: u32) -> Sandbox {
        let dev = self.state().join("dev");
        let mut s = crate::support::sandbox_settings(uid_first, 4, 128, (64, 600), dev);
        s.network = None;
        s.driver_files =
            DriverFiles::write_stand_ins(&self.state().join("sim-nvidia"), "550.54.15", "12.4")
                .unwrap();
        Sandbox::open(s, Arc::new(self.sim.clone()), &self.state().join("sandbox"))
            .unwrap_or_else(|e| panic!("the image tests need root and crun: {e}"))
    }

    fn store(&self, cache_bytes: u64, http: reqwest::Client) -> ImageStore {
        let limits = StoreLimits {
            image: Limits {
                max_bytes: 64 << 20,
                max_entries: 10_000,
            },
            cache_bytes,
        };
        ImageStore::open(&self.state().join("workloads/images"), limits, http).unwrap()
    }

    fn executor(&self, store: ImageStore, uid_first: u32) -> LocalExecutor {
        LocalExecutor::open(&self.state().join("workloads"), "127.0.0.1")
            .unwrap()
            .with_sandbox(self.sandbox(uid_first))
            .with_images(store)
    }

    fn agent<'a>(&self, server: &'a FakeServer, ex: LocalExecutor) -> Agent<&'a FakeServer> {
        Agent::new(
            Arc::new(self.sim.clone()),
            server,
            RunConfig {
                workload_every: Duration::from_millis(50),
                ..run_config()
            },
            Telemetry::new(Spool::open(&self.state().join("spool"), 60, 10).unwrap()),
        )
        .with_workloads(ex)
    }
}

/// A job running `script` (the image's entrypoint is `/bin/sh -c`) in `image`.
fn image_job(id: &str, devices: &[&str], image: &str, script: &str) -> WorkloadSpec {
    WorkloadSpec {
        image: Some(ImageSpec {
            reference: image.to_owned(),
            requires_cuda: None,
            login: None,
        }),
        ..WorkloadSpec::job(id, "team-img", devices, &[script])
    }
}

/// A loopback registry (no login) holding image `marker` (`extra` bytes of filler) as
/// `repo:v1`.
async fn registry_with(marker: &str, extra: usize, repo: &str) -> (Registry, Built) {
    let reg = Registry::start(None);
    let built = build_image(marker, extra);
    push(&reqwest::Client::new(), &reg, repo, "v1", &built, None).await;
    (reg, built)
}

fn pinned(reg: &Registry, repo: &str, image: &Built) -> String {
    format!("{}/{repo}@{}", reg.addr, image.digest())
}

/// Every report the fake server got for `id`, in order.
fn reports_of(server: &FakeServer, id: &str) -> Vec<WorkloadReport> {
    server.with(|s| {
        s.workload_reports
            .iter()
            .flat_map(|r| r.workloads.iter().filter(|w| w.id == id).cloned())
            .collect()
    })
}

fn ended(r: &WorkloadReport) -> bool {
    matches!(
        r.phase,
        WorkloadPhase::Exited | WorkloadPhase::FailedToStart | WorkloadPhase::Lost
    ) && r.log_complete
}

/// Runs workload rounds until every one of `ids` has ended with all its log.
async fn run_until_ended(a: &mut Agent<&FakeServer>, server: &FakeServer, ids: &[&str]) {
    let deadline = Instant::now() + WAIT;
    loop {
        a.workload_round().await.unwrap();
        if ids
            .iter()
            .all(|id| reports_of(server, id).last().is_some_and(ended))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not ended: {:#?}",
            ids.iter()
                .map(|id| reports_of(server, id).pop())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs workload rounds until `done()` holds; fails showing the latest report.
async fn rounds_until(a: &mut Agent<&FakeServer>, server: &FakeServer, done: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        a.workload_round().await.unwrap();
        if done() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{:#?}",
            server.with(|s| s.workload_reports.last().cloned())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn log_of(server: &FakeServer, id: &str) -> String {
    server.with(|s| s.logs.get(id).map(|l| l.text.clone()).unwrap_or_default())
}

/// Files under `dir` containing `needle` (`grep -r -l`).
fn files_with(dir: &Path, needle: &str) -> String {
    let out = Command::new("grep")
        .args(["-r", "-l", "-a", needle])
        .arg(dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_in_an_image_sees_the_image_and_the_drivers_files_and_its_pull_is_reported() {
    if !can_run() {
        return;
    }
    // Filler, so the pull has bytes to count.
    let (reg, built) = registry_with("tessera-itimage", 4 << 20, "team/it").await;
    let node = Node::new();
    let ex = node.executor(node.store(1 << 40, reqwest::Client::new()), FIRST_UID);
    let server = FakeServer::default();
    let mut a = node.agent(&server, ex);
    let image = pinned(&reg, "team/it", &built);
    let script = "grep ^ID= /etc/os-release; cat /usr/local/nvidia/lib64/libcuda.so.1; \
                  nvidia-smi; echo \"LD=$LD_LIBRARY_PATH\"; echo \"PATH=$PATH\"; \
                  echo \"uid=$(id -u) pwd=$(pwd)\"; \
                  (echo x > /usr/local/nvidia/lib64/x) 2>/dev/null && echo DRIVER-WRITABLE; exit 0";
    let gpu_job = image_job("img-gpu", &[&node.gpu], &image, script);
    let cpu_job = image_job(
        "img-cpu",
        &[],
        &image,
        "test -e /usr/local/nvidia/lib64/libcuda.so.1 && echo HAS-DRIVER || echo no-driver",
    );
    server.with(|s| s.workloads = vec![gpu_job.clone(), cpu_job.clone()]);
    run_until_ended(&mut a, &server, &["img-gpu", "img-cpu"]).await;

    // Reported as starting with the pull's progress before it ran; never past the total.
    let reports = reports_of(&server, "img-gpu");
    let first_run = reports
        .iter()
        .position(|r| r.phase != WorkloadPhase::Starting)
        .unwrap();
    let pulls: Vec<_> = reports[..first_run].iter().filter_map(|r| r.pull).collect();
    assert!(!pulls.is_empty(), "no pull reported: {reports:#?}");
    // No output yet, and more to come.
    assert!(
        reports[..first_run]
            .iter()
            .all(|r| !r.log_complete && r.log.is_none())
    );
    let blobs = (built.layer.len() + built.config.len()) as u64;
    for p in &pulls {
        assert!(p.done_bytes <= p.total_bytes, "{p:?}");
        assert!(
            p.total_bytes == 0 || p.total_bytes == blobs,
            "{p:?} of {blobs}"
        );
    }
    assert!(reports[first_run..].iter().all(|r| r.pull.is_none()));

    let last = reports.last().unwrap();
    assert_eq!(
        (last.phase, last.exit_code),
        (WorkloadPhase::Exited, Some(0)),
        "{last:?}"
    );
    let log = log_of(&server, "img-gpu");
    let host_id = std::fs::read_to_string("/etc/os-release")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("ID="))
        .unwrap()
        .to_owned();
    assert!(log.contains("ID=tessera-itimage\n"), "{log}");
    assert!(!log.lines().any(|l| l == host_id), "{log}");
    // The simulated driver's files, read-only, on the search paths.
    assert!(
        log.contains("tessera simulated NVIDIA driver 550.54.15 (CUDA 12.4)"),
        "{log}"
    );
    assert!(
        log.contains("Driver Version: 550.54.15  CUDA Version: 12.4"),
        "{log}"
    );
    assert!(log.contains("LD=/usr/local/nvidia/lib64\n"), "{log}");
    assert!(
        log.contains("PATH=/bin:/usr/local/nvidia/bin\n"),
        "the image's PATH and the driver's: {log}"
    );
    assert!(!log.contains("DRIVER-WRITABLE"), "{log}");
    // The team's uid; the image's WorkingDir (/work) is not in the image: the workspace.
    assert!(
        log.contains(&format!("uid={FIRST_UID} pwd=/workspace")),
        "{log}"
    );
    // No GPU, no driver files.
    assert!(log_of(&server, "img-cpu").contains("no-driver"));
    // One image, pulled once for both, no longer held; the store's root untouched.
    let store = a.workloads().unwrap().images().unwrap().clone();
    assert_eq!(store.images().len(), 1);
    assert_eq!(reg.blob_gets(&built.layer_digest()), 1);
    let root = node
        .state()
        .join("workloads/images/roots")
        .join(&built.digest()[7..])
        .join("rootfs");
    assert!(!root.join("usr/local/nvidia/lib64").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_workloads_on_one_image_fetch_it_once_and_an_image_in_use_is_never_collected() {
    if !can_run() {
        return;
    }
    let reg = Registry::start(None);
    let http = reqwest::Client::new();
    let shared = build_image("tessera-shared", 1 << 20);
    let other = build_image("tessera-other", 0);
    push(&http, &reg, "team/shared", "v1", &shared, None).await;
    push(&http, &reg, "team/other", "v1", &other, None).await;
    let node = Node::new();
    // A cache of nothing: every image not in use goes at the first collection.
    let ex = node.executor(node.store(0, reqwest::Client::new()), FIRST_UID + 4);
    let server = FakeServer::default();
    let mut a = node.agent(&server, ex);
    let ten: Vec<WorkloadSpec> = (0..10)
        .map(|i| {
            image_job(
                &format!("shared-{i}"),
                &[],
                &pinned(&reg, "team/shared", &shared),
                "grep ^ID= /etc/os-release; sleep 300",
            )
        })
        .collect();
    let brief = image_job(
        "brief",
        &[],
        &pinned(&reg, "team/other", &other),
        "grep ^ID= /etc/os-release",
    );
    let mut all = ten.clone();
    all.push(brief.clone());
    server.with(|s| s.workloads = all.clone());
    rounds_until(&mut a, &server, || {
        let running = ten.iter().all(|s| {
            reports_of(&server, &s.id)
                .last()
                .is_some_and(|r| r.phase == WorkloadPhase::Running)
        });
        running && reports_of(&server, "brief").last().is_some_and(ended)
    })
    .await;
    for blob in [shared.layer_digest(), shared.config_digest()] {
        assert_eq!(reg.blob_gets(&blob), 1, "{blob}");
    }
    let store = a.workloads().unwrap().images().unwrap().clone();
    let roots = node.state().join("workloads/images/roots");
    // The ended job's image goes (collected off the loop), the one in use stays.
    let deadline = Instant::now() + WAIT;
    while roots.join(&other.digest()[7..]).exists() {
        assert!(
            Instant::now() < deadline,
            "the unused image was not collected"
        );
        a.workload_round().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held: Vec<(String, bool)> = store
        .images()
        .into_iter()
        .map(|(d, used)| (d.to_string(), used))
        .collect();
    assert_eq!(held, [(shared.digest(), true)]);
    assert!(
        roots
            .join(&shared.digest()[7..])
            .join("rootfs/etc/os-release")
            .exists()
    );
    assert!(
        store.collect().is_empty(),
        "an image in use is never collected"
    );

    // Once they are stopped and gone, it goes too.
    server.with(|s| {
        s.workloads = all
            .iter()
            .map(|w| WorkloadSpec {
                run: false,
                ..w.clone()
            })
            .collect()
    });
    let deadline = Instant::now() + WAIT;
    while roots.join(&shared.digest()[7..]).exists() {
        assert!(
            Instant::now() < deadline,
            "the image was not collected after its workloads"
        );
        a.workload_round().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(store.images().is_empty());
    assert!(log_of(&server, "shared-3").contains("ID=tessera-shared"));
}

/// A test CA and a certificate for `name` signed by it: (CA PEM, cert PEM, key PEM).
fn test_pki(name: &str) -> (String, String, String) {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "tessera test registry CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

/// Captures every log line of the agent (this thread's subscriber: the test runs on one
/// thread, so the pull tasks log here too).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn over_tls_with_the_registry_ca_the_right_login_pulls_and_a_wrong_one_fails_without_the_password()
 {
    if !can_run() {
        return;
    }
    const GOOD: &str = "R1ght-pull-Word-4471";
    const BAD: &str = "Wr0ng-pull-Word-9923";
    let captured = Captured::default();
    let sink = captured.clone();
    let _log = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish(),
    );
    let secrets = tempfile::tempdir().unwrap();
    let Some(file) = htpasswd(secrets.path(), "robot", GOOD) else {
        return;
    };
    let name = "registry.tessera.test";
    let (ca, cert, key) = test_pki(name);
    let reg = Registry::start_with(
        Some(&file),
        Some(Tls {
            name,
            cert_pem: &cert,
            key_pem: &key,
        }),
    );
    // What `--registry-ca` builds, plus the test's own name resolution.
    let trusting = tessera_registry::client::http_client_builder(Some(ca.as_bytes()))
        .unwrap()
        .resolve(name, reg.listen)
        .build()
        .unwrap();
    let built = build_image("tessera-private-tls", 0);
    let login = tessera_agent::oci::Credentials {
        username: "robot".into(),
        password: GOOD.into(),
    };
    push(&trusting, &reg, "team/private", "v1", &built, Some(&login)).await;
    let image = pinned(&reg, "team/private", &built);

    // Without the CA the pull fails, saying why.
    let untrusting = tessera_registry::client::http_client_builder(None)
        .unwrap()
        .resolve(name, reg.listen)
        .build()
        .unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let plain = ImageStore::open(elsewhere.path(), StoreLimits::default(), untrusting).unwrap();
    let err = plain
        .pull(&ImageRef::parse(&image).unwrap(), Some(&login))
        .await
        .unwrap_err();
    assert!(matches!(err, PullError::Registry { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(name) && text.contains("certificate") && text.contains("UnknownIssuer"),
        "{text}"
    );
    assert!(!text.contains(GOOD), "{text}");
    // A CA bundle that is not one is refused up front.
    assert!(tessera_registry::client::http_client_builder(Some(b"no pem here")).is_err());

    let node = Node::new();
    let ex = node.executor(node.store(1 << 40, trusting), FIRST_UID + 8);
    let server = FakeServer::default();
    let mut a = node.agent(&server, ex);
    let with_login = |id: &str, password: &str| WorkloadSpec {
        image: Some(ImageSpec {
            reference: image.clone(),
            requires_cuda: None,
            login: Some(RegistryLogin {
                username: "robot".into(),
                password: password.into(),
            }),
        }),
        ..WorkloadSpec::job(
            id,
            "team-img",
            &[],
            &["grep ^ID= /etc/os-release; sleep 300"],
        )
    };
    let wrong = with_login("wrong-login", BAD);
    let right = with_login("right-login", GOOD);
    server.with(|s| s.workloads = vec![wrong.clone(), right.clone()]);
    rounds_until(&mut a, &server, || {
        let failed = reports_of(&server, "wrong-login").last().is_some_and(ended);
        let runs = log_of(&server, "right-login").contains("ID=tessera-private-tls");
        failed && runs
    })
    .await;
    let r = reports_of(&server, "wrong-login").pop().unwrap();
    assert_eq!(r.phase, WorkloadPhase::FailedToStart);
    let message = r.message.unwrap();
    assert!(
        message.contains(&format!("cannot pull image {image}"))
            && message.contains("needs credentials that it accepts"),
        "{message}"
    );
    // The passwords are in no report, no log line, no file of the agent's state (the
    // running workload's state.json included) and nothing the workload can read.
    let reported = server.with(|s| serde_json::to_string(&s.workload_reports).unwrap());
    let log = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(
        log.contains("workload failed to start") && log.contains("wrong-login"),
        "{log}"
    );
    for secret in [GOOD, BAD] {
        assert!(!reported.contains(secret));
        assert!(!log.contains(secret), "{log}");
        assert_eq!(files_with(node.state(), secret), "", "{secret}");
    }
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(node.state().join("workloads/runs/right-login/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["spec"]["image"]["reference"], image.as_str());
    assert!(state["spec"]["image"].get("login").is_none(), "{state}");
    server.with(|s| s.workloads.clear());
    let deadline = Instant::now() + WAIT;
    while a.workloads().unwrap().any_running() {
        assert!(Instant::now() < deadline);
        a.workload_round().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_stop_during_the_pull_cancels_it_and_the_workload_ends() {
    if !can_run() {
        return;
    }
    let (reg, built) = registry_with("tessera-cancelled", 1 << 20, "team/cancel").await;
    let node = Node::new();
    let mut ex = node.executor(node.store(1 << 40, reqwest::Client::new()), FIRST_UID + 12);
    let spec = image_job(
        "cancelled",
        &[],
        &pinned(&reg, "team/cancel", &built),
        "true",
    );
    assert_eq!(ex.apply(&sync(std::slice::from_ref(&spec))), 1);
    // On this thread the pull has not run yet: the stop finds it pulling.
    ex.apply(&sync(&[WorkloadSpec {
        run: false,
        ..spec.clone()
    }]));
    let r = ex.reports().await.pop().unwrap();
    assert_eq!(
        (r.phase, r.message.as_deref(), r.pull),
        (
            WorkloadPhase::Exited,
            Some("stopped while its image was pulled"),
            None
        )
    );
    // Cancelled: nothing fetched, nothing stored, nothing half-built.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(reg.blob_gets(&built.layer_digest()), 0);
    assert!(ex.images().unwrap().images().is_empty());
    let tmp = node.state().join("workloads/images/tmp");
    assert_eq!(std::fs::read_dir(tmp).unwrap().count(), 0);
    // Forgotten when the server no longer lists it.
    ex.apply(&sync(&[]));
    assert!(ex.ids().is_empty());
}

/// Reports every 50 ms until `id`'s report satisfies `done` (at most [`WAIT`]).
async fn until(
    ex: &mut LocalExecutor,
    id: &str,
    done: impl Fn(&WorkloadReport) -> bool,
) -> WorkloadReport {
    let deadline = Instant::now() + WAIT;
    loop {
        let reports = ex.reports().await;
        if let Some(r) = reports.iter().find(|r| r.id == id)
            && done(r)
        {
            return r.clone();
        }
        assert!(Instant::now() < deadline, "{id}: {reports:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_holds_the_images_of_the_workloads_it_adopts() {
    if !can_run() {
        return;
    }
    let (reg, built) = registry_with("tessera-adopted", 0, "team/adopted").await;
    let node = Node::new();
    let uids = FIRST_UID + 16;
    // A cache of nothing: whatever is not held goes at the first collection.
    let mut ex = node.executor(node.store(0, reqwest::Client::new()), uids);
    let spec = image_job(
        "adopted",
        &[],
        &pinned(&reg, "team/adopted", &built),
        "exec sleep 300",
    );
    ex.apply(&sync(std::slice::from_ref(&spec)));
    until(&mut ex, "adopted", |r| r.phase == WorkloadPhase::Running).await;
    let pid = ex.pid("adopted").unwrap();
    drop(ex);

    // A new agent: the store finds the root, the executor adopts the workload and holds
    // its image again, so collection leaves it.
    let store = node.store(0, reqwest::Client::new());
    let digest = built.digest();
    let held = |s: &ImageStore| -> Vec<(String, bool)> {
        s.images()
            .into_iter()
            .map(|(d, used)| (d.to_string(), used))
            .collect()
    };
    assert_eq!(held(&store), [(digest.clone(), false)]);
    let mut ex = node.executor(store.clone(), uids);
    assert_eq!(ex.pid("adopted"), Some(pid));
    assert_eq!(held(&store), [(digest.clone(), true)]);
    assert!(store.collect().is_empty());

    // Stopped, it lets go, and the image is collected.
    ex.apply(&sync(&[WorkloadSpec {
        run: false,
        ..spec.clone()
    }]));
    until(&mut ex, "adopted", |r| r.phase == WorkloadPhase::Exited).await;
    let root = node
        .state()
        .join("workloads/images/roots")
        .join(&digest[7..]);
    let deadline = Instant::now() + WAIT;
    while root.exists() {
        assert!(Instant::now() < deadline, "not collected");
        let _ = ex.reports().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(store.images().is_empty());
}

#[test]
fn the_simulated_node_reports_its_driver() {
    let sim = SimNode::new(&[H100], 5).unwrap();
    let cuda = |t: &str| CudaVersion::parse(t).unwrap();
    assert_eq!(
        inventory(&sim).unwrap().driver,
        Some(DriverInfo {
            version: "550.54.15".into(),
            cuda: cuda("12.4"),
        })
    );
    sim.set_driver(DriverInfo {
        version: "535.183.01".into(),
        cuda: cuda("12.2"),
    });
    assert_eq!(
        sim.driver(),
        Some(DriverInfo {
            version: "535.183.01".into(),
            cuda: cuda("12.2"),
        })
    );
    assert_eq!(inventory(&sim).unwrap().driver, sim.driver());
}
