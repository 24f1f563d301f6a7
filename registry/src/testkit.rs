//! Test support (feature `testkit`): a real registry on loopback (Debian's
//! `docker-registry`, the CNCF distribution registry, started with a config of our own)
//! and small images built in memory (an `/etc/os-release` marker and, when
//! `busybox-static` is installed, `/bin/busybox`), pushed with the distribution push API.
//! Used by the agent's and the server's tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

use crate::Credentials;

pub const REGISTRY: &str = "/usr/bin/docker-registry";

pub fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn registry_available() -> bool {
    if Path::new(REGISTRY).exists() {
        return true;
    }
    if std::env::var_os("TESSERA_REQUIRE_REGISTRY").is_some() {
        panic!(
            "TESSERA_REQUIRE_REGISTRY is set but {REGISTRY} is missing (apt install docker-registry)"
        );
    }
    eprintln!("SKIPPED: {REGISTRY} is not installed (Debian package docker-registry)");
    false
}

/// A registry process on 127.0.0.1:<free port>, its storage and log in a temp dir.
pub struct Registry {
    child: Child,
    pub dir: tempfile::TempDir,
    /// What image references name it by: `127.0.0.1:<port>`, or `<tls name>:<port>`.
    pub addr: String,
    /// Where it listens (`127.0.0.1:<port>`): for a client's `resolve` under TLS.
    pub listen: std::net::SocketAddr,
    /// `http`, or `https` when started with TLS.
    pub scheme: &'static str,
}

/// TLS for a test registry: a certificate (chain, PEM) and key (PEM) for `name`, a DNS
/// name the clients resolve to 127.0.0.1 themselves (`reqwest::ClientBuilder::resolve`):
/// the pull client speaks plain http to loopback addresses, https to every other name.
pub struct Tls<'a> {
    pub name: &'a str,
    pub cert_pem: &'a str,
    pub key_pem: &'a str,
}

impl Registry {
    pub fn start(htpasswd: Option<&Path>) -> Registry {
        Registry::start_with(htpasswd, None)
    }

    /// As [`Registry::start`], with TLS on when `tls` is given.
    pub fn start_with(htpasswd: Option<&Path>, tls: Option<Tls<'_>>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let auth = htpasswd.map_or(String::new(), |p| {
            format!(
                "auth:\n  htpasswd:\n    realm: tessera-test\n    path: {}\n",
                p.display()
            )
        });
        let tls_config = tls.as_ref().map_or(String::new(), |t| {
            let cert = dir.path().join("tls.crt");
            let key = dir.path().join("tls.key");
            std::fs::write(&cert, t.cert_pem).unwrap();
            std::fs::write(&key, t.key_pem).unwrap();
            format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            )
        });
        let config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: {listen}\n{tls_config}{auth}",
            dir.path().join("data").display()
        );
        let (addr, scheme) = match &tls {
            Some(t) => (format!("{}:{port}", t.name), "https"),
            None => (listen.to_string(), "http"),
        };
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(REGISTRY)
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let r = Registry {
            child,
            dir,
            addr,
            listen,
            scheme,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(r.listen).is_err() {
            assert!(
                Instant::now() < deadline,
                "registry did not start: {}",
                r.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// How many GETs of blob `digest` the registry answered (its access log).
    pub fn blob_gets(&self, digest: &str) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains(&format!("/blobs/{digest} ")))
            .count()
    }

    /// Where the registry keeps blob `digest`'s bytes (filesystem driver layout).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An image built here: its blobs and manifest, ready to push.
pub struct Built {
    pub layer: Vec<u8>,
    pub config: Vec<u8>,
    pub manifest: Vec<u8>,
}

impl Built {
    pub fn layer_digest(&self) -> String {
        format!("sha256:{}", sha256(&self.layer))
    }
    pub fn config_digest(&self) -> String {
        format!("sha256:{}", sha256(&self.config))
    }
    pub fn digest(&self) -> String {
        format!("sha256:{}", sha256(&self.manifest))
    }
}

pub fn file_header(path: &str, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_path(path).unwrap();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(mode);
    h.set_size(size);
    h.set_cksum();
    h
}

/// A one-layer image: `/etc/os-release` with `marker`, busybox if the host has it, and
/// `extra` bytes of incompressible filler (for size tests).
pub fn build_image(marker: &str, extra: usize) -> Built {
    build_image_with(marker, extra, false)
}

/// As [`build_image`], the filler zeros when `zeros` (a layer far smaller than its files).
pub fn build_image_with(marker: &str, extra: usize, zeros: bool) -> Built {
    build_image_full(marker, extra, zeros, &[], true)
}

/// As [`build_image`] with more `KEY=value` entries in the config's `Env` (e.g.
/// `NVIDIA_REQUIRE_CUDA=cuda>=12.4`).
pub fn build_image_env(marker: &str, env: &[&str]) -> Built {
    build_image_full(marker, 0, false, env, true)
}

/// As [`build_image_env`] without an `Entrypoint` (like most framework images): a
/// workload's own command runs as it is.
pub fn build_image_plain(marker: &str, env: &[&str]) -> Built {
    build_image_full(marker, 0, false, env, false)
}

fn build_image_full(
    marker: &str,
    extra: usize,
    zeros: bool,
    env: &[&str],
    entrypoint: bool,
) -> Built {
    let mut tar = tar::Builder::new(Vec::new());
    let os_release = format!("ID={marker}\nPRETTY_NAME=\"Tessera test image {marker}\"\n");
    tar.append(
        &file_header("etc/os-release", 0o644, os_release.len() as u64),
        os_release.as_bytes(),
    )
    .unwrap();
    if let Ok(busybox) = std::fs::read("/bin/busybox") {
        tar.append(
            &file_header("bin/busybox", 0o755, busybox.len() as u64),
            &busybox[..],
        )
        .unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_path("bin/sh").unwrap();
        h.set_link_name("busybox").unwrap();
        h.set_mode(0o777);
        h.set_size(0);
        h.set_cksum();
        tar.append(&h, std::io::empty()).unwrap();
    }
    if extra > 0 {
        let mut filler = vec![0u8; extra];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for b in filler.iter_mut().filter(|_| !zeros) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        tar.append(&file_header("opt/filler", 0o644, extra as u64), &filler[..])
            .unwrap();
    }
    let raw = tar.into_inner().unwrap();
    let mut image_env: Vec<String> = vec!["PATH=/bin".to_string(), format!("MARKER={marker}")];
    image_env.extend(env.iter().map(|e| e.to_string()));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw).unwrap();
    let layer = gz.finish().unwrap();
    assemble(&raw, layer, true, &image_env, entrypoint)
}

/// An image of one uncompressed layer `raw` (a tar the caller built, e.g. of host folders)
/// with `env` as its config's whole `Env` and no `Entrypoint`.
pub fn image_from_tar(raw: Vec<u8>, env: &[String]) -> Built {
    let layer = raw.clone();
    assemble(&raw, layer, false, env, false)
}

/// Config and manifest for one layer (`layer` is `raw`, gzipped when `gzip`).
fn assemble(raw: &[u8], layer: Vec<u8>, gzip: bool, env: &[String], entrypoint: bool) -> Built {
    let diff_id = sha256(raw);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": crate::client::node_architecture(),
        "os": "linux",
        "config": {
            "Env": env,
            "WorkingDir": "/work",
            "Entrypoint": if entrypoint {
                serde_json::json!(["/bin/sh", "-c"])
            } else {
                serde_json::Value::Null
            },
            "Cmd": ["cat /etc/os-release"],
            "User": "0",
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
    }))
    .unwrap();
    let media = if gzip {
        "application/vnd.oci.image.layer.v1.tar+gzip"
    } else {
        "application/vnd.oci.image.layer.v1.tar"
    };
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{}", sha256(&config)),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": media,
            "digest": format!("sha256:{}", sha256(&layer)),
            "size": layer.len(),
        }],
    }))
    .unwrap();
    Built {
        layer,
        config,
        manifest,
    }
}

/// Pushes `image` as `<repo>:<tag>`: each blob by a monolithic POST + PUT upload, then the
/// manifest.
pub async fn push(
    http: &reqwest::Client,
    reg: &Registry,
    repo: &str,
    tag: &str,
    image: &Built,
    auth: Option<&Credentials>,
) {
    let with = |r: reqwest::RequestBuilder| match auth {
        Some(c) => r.basic_auth(&c.username, Some(&c.password)),
        None => r,
    };
    let base = format!("{}://{}", reg.scheme, reg.addr);
    for blob in [&image.layer, &image.config] {
        let resp = with(http.post(format!("{base}/v2/{repo}/blobs/uploads/")))
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            202,
            "start upload: {}",
            resp.text().await.unwrap()
        );
        let location = resp.headers()["location"].to_str().unwrap().to_string();
        let mut url = reqwest::Url::parse(&base).unwrap().join(&location).unwrap();
        url.query_pairs_mut()
            .append_pair("digest", &format!("sha256:{}", sha256(blob)));
        let resp = with(http.put(url))
            .header("content-type", "application/octet-stream")
            .body(blob.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201, "upload: {}", resp.text().await.unwrap());
    }
    let resp = with(http.put(format!("{base}/v2/{repo}/manifests/{tag}")))
        .header("content-type", "application/vnd.oci.image.manifest.v1+json")
        .body(image.manifest.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        201,
        "manifest: {}",
        resp.text().await.unwrap()
    );
    assert_eq!(
        resp.headers()["docker-content-digest"].to_str().unwrap(),
        image.digest()
    );
}

/// An htpasswd file in `dir` for one user (apache2-utils' `htpasswd`, which xtask
/// installs); `None` (the caller skips) when it is missing and `TESSERA_REQUIRE_REGISTRY`
/// is unset.
pub fn htpasswd(dir: &Path, user: &str, password: &str) -> Option<PathBuf> {
    let out = Command::new("htpasswd")
        .args(["-Bbn", user, password])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let file = dir.join("htpasswd");
            std::fs::write(&file, o.stdout).expect("htpasswd file");
            Some(file)
        }
        _ if std::env::var_os("TESSERA_REQUIRE_REGISTRY").is_some() => {
            panic!("TESSERA_REQUIRE_REGISTRY is set but htpasswd is missing (apache2-utils)")
        }
        _ => {
            eprintln!("SKIPPED: htpasswd is not installed (Debian package apache2-utils)");
            None
        }
    }
}
