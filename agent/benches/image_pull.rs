//! Cold pull + unpack of one ~100 MB image from a loopback registry: Tessera's image store
//! against `skopeo copy` + `umoci unpack`, alternated in the same run.
//!
//! `cargo bench -p tessera-agent --bench image_pull [-- RUNS]` (default 3 each way) needs
//! Debian's `docker-registry`; the comparison runs when `skopeo` and `umoci` are installed
//! (and as root, umoci's default). The image is generated here: three gzip layers
//! (level 6, as docker writes them) holding 2,001 files, 40 % random bytes (like shared
//! libraries) and 60 % text-like bytes. Every run starts from an empty store / layout;
//! the registry's files are in the page cache for both. Then, as root with crun and
//! busybox-static, the warm start of `/bin/sh -c true` in a cached image against the node's
//! folders, in the sandbox, alternated (4 × RUNS each).
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};
use tessera_agent::oci::unpack::Limits;
use tessera_agent::oci::{ImageStore, StoreLimits};
use tessera_domain::image::ImageRef;

fn sha256(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn have(p: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {p}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

struct Registry(Child);
impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_registry(dir: &Path) -> (Registry, String) {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(5000);
    let addr = format!("127.0.0.1:{port}");
    let config = format!(
        "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n\
         storage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
        dir.join("data").display()
    );
    std::fs::write(dir.join("config.yml"), config).unwrap_or_else(|e| panic!("{e}"));
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(dir.join("config.yml"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("docker-registry: {e}"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "registry did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    (Registry(child), addr)
}

/// Three layers of ~33 MB each, uncompressed.
fn layers() -> Vec<Vec<u8>> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let words: Vec<&str> = "import torch numpy def class return self for in if else while \
        the of and to a is that with as on by this be are from"
        .split(' ')
        .collect();
    (0..3)
        .map(|l| {
            let mut tar = tar::Builder::new(Vec::new());
            for f in 0..667 {
                let size = 50_000usize;
                let mut body = Vec::with_capacity(size);
                if f % 5 < 2 {
                    while body.len() < size {
                        body.extend_from_slice(&next().to_le_bytes());
                    }
                } else {
                    while body.len() < size {
                        body.extend_from_slice(
                            words[(next() % words.len() as u64) as usize].as_bytes(),
                        );
                        body.push(if next() % 9 == 0 { b'\n' } else { b' ' });
                    }
                }
                body.truncate(size);
                let mut h = tar::Header::new_gnu();
                h.set_path(format!("usr/lib/l{l}/d{}/f{f}", f % 20))
                    .unwrap_or_else(|e| panic!("{e}"));
                h.set_mode(0o644);
                h.set_size(size as u64);
                h.set_cksum();
                tar.append(&h, &body[..]).unwrap_or_else(|e| panic!("{e}"));
            }
            tar.into_inner().unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

async fn upload(http: &reqwest::Client, base: &str, blob: &[u8]) {
    let r = http
        .post(format!("{base}/blobs/uploads/"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let loc = r.headers()["location"]
        .to_str()
        .unwrap_or_default()
        .to_string();
    let mut url = reqwest::Url::parse(base)
        .and_then(|b| b.join(&loc))
        .unwrap_or_else(|e| panic!("{e}"));
    url.query_pairs_mut()
        .append_pair("digest", &format!("sha256:{}", sha256(blob)));
    let r = http
        .put(url)
        .body(blob.to_vec())
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status(), 201);
}

/// Pushes an image of `raw` layers as `<repo>:v1`; answers (uncompressed, compressed) bytes.
async fn push(addr: &str, repo: &str, raw: Vec<Vec<u8>>) -> (usize, usize) {
    let http = reqwest::Client::new();
    let base = format!("http://{addr}/v2/{repo}");
    let mut descs = Vec::new();
    let mut diff_ids = Vec::new();
    let mut compressed = 0;
    for t in &raw {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
        gz.write_all(t).unwrap_or_else(|e| panic!("{e}"));
        let gz = gz.finish().unwrap_or_else(|e| panic!("{e}"));
        compressed += gz.len();
        upload(&http, &base, &gz).await;
        descs.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": format!("sha256:{}", sha256(&gz)), "size": gz.len()}));
        diff_ids.push(format!("sha256:{}", sha256(t)));
    }
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": tessera_agent::oci::client::node_architecture(), "os": "linux",
        "config": {"Env": ["PATH=/usr/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids}}))
    .unwrap_or_default();
    upload(&http, &base, &config).await;
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": format!("sha256:{}", sha256(&config)), "size": config.len()},
        "layers": descs}))
    .unwrap_or_default();
    let r = http
        .put(format!("{base}/manifests/v1"))
        .header("content-type", "application/vnd.oci.image.manifest.v1+json")
        .body(manifest)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.status(), 201);
    (raw.iter().map(Vec::len).sum(), compressed)
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn summary(name: &str, mut v: Vec<Duration>) -> f64 {
    v.sort();
    let med = v[v.len() / 2].as_secs_f64();
    println!(
        "{name:<28} median {:>8.1} ms   min {:>8.1} ms   max {:>8.1} ms   (n = {})",
        med * 1000.0,
        v[0].as_secs_f64() * 1000.0,
        v[v.len() - 1].as_secs_f64() * 1000.0,
        v.len()
    );
    med
}

#[tokio::main]
async fn main() {
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(3);
    if !have("docker-registry") {
        println!("skipped: docker-registry is not installed");
        return;
    }
    let work = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (_registry, addr) = start_registry(work.path());
    let (raw, gz) = push(&addr, "bench/img", layers()).await;
    println!(
        "image: {:.1} MB in 3 layers, {:.1} MB gzip, 2,001 files",
        raw as f64 / 1e6,
        gz as f64 / 1e6
    );
    let compare = have("skopeo") && have("umoci");
    if !compare {
        println!("skopeo or umoci not installed: Tessera alone");
    }
    let image = ImageRef::parse(&format!("{addr}/bench/img:v1")).unwrap_or_else(|e| panic!("{e}"));
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let dir = work.path().join(format!("store-{i}"));
        let limits = StoreLimits {
            image: Limits {
                max_bytes: 1 << 30,
                max_entries: 100_000,
            },
            cache_bytes: 1 << 40,
        };
        let t0 = Instant::now();
        let store = ImageStore::open(&dir, limits, reqwest::Client::new())
            .unwrap_or_else(|e| panic!("{e}"));
        let held = store
            .pull(&image, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        ours.push(t0.elapsed());
        assert!(held.rootfs().join("usr/lib/l2/d0/f0").exists());
        drop(held);
        let _ = std::fs::remove_dir_all(&dir);

        if compare {
            let layout = work.path().join(format!("layout-{i}"));
            let bundle = work.path().join(format!("bundle-{i}"));
            let t0 = Instant::now();
            run(Command::new("skopeo").args([
                "copy",
                "--quiet",
                "--src-tls-verify=false",
                &format!("docker://{addr}/bench/img:v1"),
                &format!("oci:{}:v1", layout.display()),
            ]));
            run(Command::new("umoci").args([
                "unpack",
                "--image",
                &format!("{}:v1", layout.display()),
                &bundle.display().to_string(),
            ]));
            theirs.push(t0.elapsed());
            assert!(bundle.join("rootfs/usr/lib/l2/d0/f0").exists());
            let _ = std::fs::remove_dir_all(&layout);
            let _ = std::fs::remove_dir_all(&bundle);
        }
    }
    let a = summary("tessera (pull + unpack)", ours);
    if compare {
        let b = summary("skopeo copy + umoci unpack", theirs);
        println!("ratio tessera / skopeo+umoci: {:.2}x", a / b);
    }
    warm_start(&addr, work.path(), runs * 4).await;
}

/// A job's start in a cached image against today's start on the node's folders: both in
/// the crun sandbox (node's network, so only the root differs), `/bin/sh -c true`,
/// alternated; "started" is `Sandbox::start` returning, "exited" adds the wait until the
/// container's process is gone.
async fn warm_start(addr: &str, work: &Path, runs: usize) {
    use std::sync::Arc;
    use tessera_agent::sandbox::{Access, Process, Sandbox, SandboxSettings};

    let root = std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid() == 0
    });
    let Ok(busybox) = std::fs::read("/bin/busybox") else {
        println!("warm start skipped: busybox-static is not installed");
        return;
    };
    if !root || !have("crun") {
        println!("warm start skipped: needs root and crun");
        return;
    }
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_path("bin/busybox").unwrap_or_else(|e| panic!("{e}"));
    h.set_mode(0o755);
    h.set_size(busybox.len() as u64);
    h.set_cksum();
    tar.append(&h, &busybox[..])
        .unwrap_or_else(|e| panic!("{e}"));
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_path("bin/sh").unwrap_or_else(|e| panic!("{e}"));
    h.set_link_name("busybox").unwrap_or_else(|e| panic!("{e}"));
    h.set_size(0);
    h.set_cksum();
    tar.append(&h, std::io::empty())
        .unwrap_or_else(|e| panic!("{e}"));
    push(
        addr,
        "bench/busybox",
        vec![tar.into_inner().unwrap_or_default()],
    )
    .await;
    let store = ImageStore::open(
        &work.join("warm-store"),
        StoreLimits::default(),
        reqwest::Client::new(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let image =
        ImageRef::parse(&format!("{addr}/bench/busybox:v1")).unwrap_or_else(|e| panic!("{e}"));
    let held = store
        .pull(&image, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let sim = tessera_agent::sim::SimNode::new(&["H100-80GB"], 7).unwrap_or_else(|e| panic!("{e}"));
    let dev = work.join("dev");
    tessera_agent::sim::write_device_files(&dev, &[0]).unwrap_or_else(|e| panic!("{e}"));
    let mut settings = SandboxSettings::new(std::path::PathBuf::from("crun"));
    settings.uid_first = 320_000;
    settings.uid_count = 4;
    settings.memory_mib = Some(256);
    settings.network = None;
    settings.simulated_devices(dev);
    let sandbox = Sandbox::open(settings, Arc::new(sim), &work.join("sandbox"))
        .unwrap_or_else(|e| panic!("{e}"));
    let workspace = work.join("workspace");
    std::fs::create_dir_all(&workspace).unwrap_or_else(|e| panic!("{e}"));
    let uid = sandbox.uid_for("bench").unwrap_or_else(|e| panic!("{e}"));
    sandbox
        .own_workspace(&workspace, uid)
        .unwrap_or_else(|e| panic!("{e}"));
    let argv: Vec<String> = ["/bin/sh", "-c", "true"].map(String::from).to_vec();
    let env = [(
        std::ffi::OsString::from("PATH"),
        std::ffi::OsString::from("/bin:/usr/bin"),
    )];
    let (mut host, mut img) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for i in 0..runs * 2 {
        let in_image = i % 2 == 1;
        let run = work.join(format!("run-{i}"));
        std::fs::create_dir_all(&run).unwrap_or_else(|e| panic!("{e}"));
        let log = std::fs::File::create(run.join("output.log")).unwrap_or_else(|e| panic!("{e}"));
        let access = Access {
            devices: &[],
            binds: &[],
            gpu_fraction: None,
            port: None,
            image: in_image.then(|| held.rootfs()),
        };
        let id = format!("warm-{i}");
        let what = Process {
            id: &id,
            run: &run,
            workspace: &workspace,
            uid,
            cwd: "/workspace",
            argv: &argv,
            env: &env,
            access: &access,
        };
        let t0 = Instant::now();
        let started = sandbox
            .start(&what, &log)
            .unwrap_or_else(|e| panic!("start: {e}"));
        let t_started = t0.elapsed();
        loop {
            let stat =
                std::fs::read_to_string(format!("/proc/{}/stat", started.pid)).unwrap_or_default();
            if stat.is_empty() || stat.contains(") Z") {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let t_exited = t0.elapsed();
        started.container.delete();
        let into = if in_image { &mut img } else { &mut host };
        into.0.push(t_started);
        into.1.push(t_exited);
    }
    let h = summary("host folders: started", host.0);
    let i = summary("cached image: started", img.0);
    let he = summary("host folders: exited", host.1);
    let ie = summary("cached image: exited", img.1);
    println!(
        "image - host, medians: started {:+.1} ms, exited {:+.1} ms",
        (i - h) * 1000.0,
        (ie - he) * 1000.0
    );
}
