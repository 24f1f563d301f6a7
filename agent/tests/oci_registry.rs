//! The agent's image pull against a real registry on loopback: Debian's `docker-registry`
//! (the CNCF distribution registry), started here with a config of our own. Images are
//! built here (a layer with an `/etc/os-release` marker and, when `busybox-static` is
//! installed, `/bin/busybox`), pushed with the distribution push API, then pulled by
//! `tessera_agent::oci::ImageStore`.
//!
//! Skipped (with the reason printed) only when the binary is missing and
//! `TESSERA_REQUIRE_REGISTRY` is unset; `cargo xtask test` sets it and installs the package.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tessera_agent::oci::unpack::Limits;
use tessera_agent::oci::{Credentials, ImageStore, PullError, StoreLimits};
use tessera_domain::image::ImageRef;
use tessera_registry::testkit::{
    Registry, build_image, build_image_with, htpasswd, push, registry_available, sha256,
};

fn store(dir: &Path, cache_bytes: u64) -> ImageStore {
    let limits = StoreLimits {
        image: Limits {
            max_bytes: 64 << 20,
            max_entries: 10_000,
        },
        cache_bytes,
    };
    ImageStore::open(dir, limits, reqwest::Client::new()).unwrap()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pull_verify_unpack_single_flight_and_gc() {
    if !registry_available() {
        return;
    }
    let reg = Registry::start(None);
    let http = reqwest::Client::new();
    let alpha = build_image("tessera-alpha", 0);
    let beta = build_image("tessera-beta", 256 << 10);
    push(&http, &reg, "team/alpha", "v1", &alpha, None).await;
    push(&http, &reg, "team/beta", "v1", &beta, None).await;

    let work = tempfile::tempdir().unwrap();
    let store_dir = work.path().join("images");
    let images = store(&store_dir, 1 << 40);

    // A tag pull: resolved to the manifest's digest, unpacked, config applied.
    let a_ref = ImageRef::parse(&format!("{}/team/alpha:v1", reg.addr)).unwrap();
    let a = images.pull(&a_ref, None).await.unwrap();
    assert_eq!(a.digest().as_str(), alpha.digest());
    let root = a.rootfs();
    assert_eq!(
        std::fs::read_to_string(root.join("etc/os-release")).unwrap(),
        "ID=tessera-alpha\nPRETTY_NAME=\"Tessera test image tessera-alpha\"\n"
    );
    if Path::new("/bin/busybox").exists() {
        let meta = std::fs::metadata(root.join("bin/busybox")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
        assert_eq!(
            std::fs::read_link(root.join("bin/sh")).unwrap(),
            Path::new("busybox")
        );
        // The unpacked busybox is the host's, byte for byte.
        assert_eq!(
            sha256(&std::fs::read(root.join("bin/busybox")).unwrap()),
            sha256(&std::fs::read("/bin/busybox").unwrap())
        );
    } else {
        eprintln!("busybox-static not installed: the image carries only the marker");
    }
    let c = a.config();
    assert_eq!(c.env, ["PATH=/bin", "MARKER=tessera-alpha"]);
    assert_eq!((c.working_dir.as_str(), c.user.as_str()), ("/work", "0"));
    assert_eq!(c.entrypoint, ["/bin/sh", "-c"]);
    assert_eq!(c.cmd, ["cat /etc/os-release"]);
    // The layer blob is gone once unpacked; the store holds only its own folders.
    assert_eq!(names(&store_dir), ["blobs", "roots", "tmp"]);
    assert!(
        !store_dir
            .join("blobs/sha256")
            .join(&alpha.layer_digest()[7..])
            .exists()
    );
    assert!(
        store_dir
            .join("blobs/sha256")
            .join(&alpha.config_digest()[7..])
            .exists()
    );
    assert_eq!(names(&store_dir.join("tmp")), Vec::<String>::new());
    assert_eq!(
        std::fs::metadata(&store_dir).unwrap().permissions().mode() & 0o777,
        0o700
    );

    // By digest, the stored image is held without asking the registry.
    let gets_before = reg.blob_gets(&alpha.layer_digest());
    let pinned = ImageRef::parse(&format!("{}/team/alpha@{}", reg.addr, alpha.digest())).unwrap();
    let again = images.pull(&pinned, None).await.unwrap();
    assert_eq!(again.rootfs(), a.rootfs());
    assert_eq!(reg.blob_gets(&alpha.layer_digest()), gets_before);
    assert_eq!(gets_before, 1);

    // Ten concurrent pulls of one image: each blob is fetched once.
    let b_ref = ImageRef::parse(&format!("{}/team/beta:v1", reg.addr)).unwrap();
    let pulls: Vec<_> = (0..10)
        .map(|_| {
            let images = images.clone();
            let r = b_ref.clone();
            tokio::spawn(async move { images.pull(&r, None).await })
        })
        .collect();
    let mut seen_progress = None;
    while seen_progress.is_none() && !pulls.iter().all(|p| p.is_finished()) {
        seen_progress = images.progress(&b_ref).filter(|(_, total)| *total > 0);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut held = Vec::new();
    for p in pulls {
        held.push(p.await.unwrap().unwrap());
    }
    assert!(held.iter().all(|i| i.digest().as_str() == beta.digest()));
    assert_eq!(reg.blob_gets(&beta.layer_digest()), 1, "{}", reg.log());
    assert_eq!(reg.blob_gets(&beta.config_digest()), 1);
    if let Some((done, total)) = seen_progress {
        assert_eq!(total, (beta.layer.len() + beta.config.len()) as u64);
        assert!(done <= total);
    }
    assert_eq!(images.progress(&b_ref), None, "no pull in flight any more");
    assert_eq!(
        std::fs::read_to_string(held[0].rootfs().join("etc/os-release"))
            .unwrap()
            .lines()
            .next(),
        Some("ID=tessera-beta")
    );
    assert_eq!(
        std::fs::metadata(held[0].rootfs().join("opt/filler"))
            .unwrap()
            .len(),
        256 << 10
    );
    drop(held);

    // A tag and the digest it names, pulled at once: still one fetch of each blob.
    let delta = build_image("tessera-delta", 64 << 10);
    push(&http, &reg, "team/delta", "v1", &delta, None).await;
    let by_tag = ImageRef::parse(&format!("{}/team/delta:v1", reg.addr)).unwrap();
    let by_digest =
        ImageRef::parse(&format!("{}/team/delta@{}", reg.addr, delta.digest())).unwrap();
    let pulls: Vec<_> = (0..6)
        .map(|i| {
            let images = images.clone();
            let r = if i % 2 == 0 {
                by_tag.clone()
            } else {
                by_digest.clone()
            };
            tokio::spawn(async move { images.pull(&r, None).await })
        })
        .collect();
    for p in pulls {
        assert_eq!(p.await.unwrap().unwrap().digest().as_str(), delta.digest());
    }
    assert_eq!(reg.blob_gets(&delta.layer_digest()), 1, "{}", reg.log());
    assert_eq!(reg.blob_gets(&delta.config_digest()), 1);

    // GC: a store whose cache fits nothing keeps what is held and drops the rest.
    let small_dir = work.path().join("small");
    let small = store(&small_dir, 1);
    let kept = small.pull(&a_ref, None).await.unwrap();
    let other = small.pull(&b_ref, None).await.unwrap();
    assert_eq!(small.collect(), vec![], "both are in use");
    drop(other);
    let gone = small.collect();
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].as_str(), beta.digest());
    assert_eq!(names(&small_dir.join("roots")), [&alpha.digest()[7..]]);
    assert!(kept.rootfs().join("etc/os-release").exists());
    // Reopened, the store finds the kept root again.
    drop(kept);
    let reopened = store(&small_dir, 1 << 40);
    assert_eq!(reopened.images().len(), 1);
    assert!(
        reopened
            .hold(&tessera_domain::image::Digest::parse(&alpha.digest()).unwrap())
            .is_some()
    );
    drop(reopened);
    let gone = small.collect();
    assert_eq!(gone.len(), 1, "unused now, and past the cache size");
    assert_eq!(names(&small_dir.join("roots")), Vec::<String>::new());
    assert_eq!(names(&small_dir.join("tmp")), Vec::<String>::new());

    // A blob whose bytes do not match its digest (corrupted in the registry's storage):
    // refused, nothing unpacked, no partial file left.
    let gamma = build_image("tessera-gamma", 0);
    push(&http, &reg, "team/gamma", "v1", &gamma, None).await;
    let on_disk = reg.blob_file(&gamma.layer_digest());
    let mut bytes = std::fs::read(&on_disk).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&on_disk, &bytes).unwrap();
    let g_ref = ImageRef::parse(&format!("{}/team/gamma:v1", reg.addr)).unwrap();
    let err = images.pull(&g_ref, None).await.unwrap_err();
    assert!(matches!(err, PullError::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains(&gamma.layer_digest()), "{err}");
    assert!(
        images
            .images()
            .iter()
            .all(|(d, _)| d.as_str() != gamma.digest())
    );
    let blob_names = names(&store_dir.join("blobs/sha256"));
    assert!(
        blob_names
            .iter()
            .all(|n| !n.ends_with(".partial") && n != &gamma.layer_digest()[7..])
    );
    assert_eq!(names(&store_dir.join("tmp")), Vec::<String>::new());
    assert!(!store_dir.join("roots").join(&gamma.digest()[7..]).exists());

    // A pinned reference whose digest the registry does not have: not found, not "latest".
    let missing = ImageRef::parse(&format!(
        "{}/team/alpha@sha256:{}",
        reg.addr,
        "0".repeat(64)
    ))
    .unwrap();
    let err = images.pull(&missing, None).await.unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_past_the_image_cap_is_refused_and_cleaned_up() {
    if !registry_available() {
        return;
    }
    let reg = Registry::start(None);
    let http = reqwest::Client::new();
    let big = build_image("tessera-big", 4 << 20);
    push(&http, &reg, "team/big", "v1", &big, None).await;
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("images");
    let limits = StoreLimits {
        image: Limits {
            // Past busybox (when present) and a layer's worth of zeros' gzip.
            max_bytes: 3 << 20,
            max_entries: 100,
        },
        cache_bytes: 1 << 40,
    };
    let images = ImageStore::open(&dir, limits, reqwest::Client::new()).unwrap();
    let r = ImageRef::parse(&format!("{}/team/big:v1", reg.addr)).unwrap();
    let err = images.pull(&r, None).await.unwrap_err();
    assert!(err.to_string().contains("cap"), "{err}");
    assert_eq!(names(&dir.join("roots")), Vec::<String>::new());
    assert_eq!(names(&dir.join("tmp")), Vec::<String>::new());
    assert!(images.images().is_empty());

    // A small layer that expands past the cap: downloaded, then the unpack stops at the
    // cap and the half-built root is removed.
    let bomb = build_image_with("tessera-bomb", 8 << 20, true);
    assert!(bomb.layer.len() < 3 << 20, "{}", bomb.layer.len());
    push(&http, &reg, "team/bomb", "v1", &bomb, None).await;
    let r = ImageRef::parse(&format!("{}/team/bomb:v1", reg.addr)).unwrap();
    let err = images.pull(&r, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            PullError::Unpack(tessera_agent::oci::unpack::UnpackError::TooLarge { .. })
        ),
        "{err}"
    );
    assert_eq!(names(&dir.join("roots")), Vec::<String>::new());
    assert_eq!(names(&dir.join("tmp")), Vec::<String>::new());
    assert!(
        !dir.join("blobs/sha256")
            .join(&bomb.layer_digest()[7..])
            .exists()
    );
    assert!(images.images().is_empty());

    // A config whose diff_id does not match the layer's uncompressed content: refused.
    let mut lying = build_image("tessera-lying", 0);
    let mut config: serde_json::Value = serde_json::from_slice(&lying.config).unwrap();
    config["rootfs"]["diff_ids"][0] = format!("sha256:{}", sha256(b"another layer")).into();
    lying.config = serde_json::to_vec(&config).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_slice(&lying.manifest).unwrap();
    manifest["config"]["digest"] = lying.config_digest().into();
    manifest["config"]["size"] = lying.config.len().into();
    lying.manifest = serde_json::to_vec(&manifest).unwrap();
    push(&http, &reg, "team/lying", "v1", &lying, None).await;
    let r = ImageRef::parse(&format!("{}/team/lying:v1", reg.addr)).unwrap();
    let err = images.pull(&r, None).await.unwrap_err();
    assert!(matches!(err, PullError::DigestMismatch { .. }), "{err}");
    assert!(err.to_string().contains("uncompressed"), "{err}");
    assert_eq!(names(&dir.join("roots")), Vec::<String>::new());
    assert_eq!(names(&dir.join("tmp")), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_credentials_pull_and_wrong_ones_fail() {
    if !registry_available() {
        return;
    }
    let secrets = tempfile::tempdir().unwrap();
    let Some(file) = htpasswd(secrets.path(), "robot", "s3cret-pull-word") else {
        return;
    };
    let reg = Registry::start(Some(&file));
    let good = Credentials {
        username: "robot".into(),
        password: "s3cret-pull-word".into(),
    };
    let http = reqwest::Client::new();
    let private = build_image("tessera-private", 0);
    push(&http, &reg, "team/private", "v1", &private, Some(&good)).await;

    let work = tempfile::tempdir().unwrap();
    let images = store(&work.path().join("images"), 1 << 40);
    let r = ImageRef::parse(&format!("{}/team/private:v1", reg.addr)).unwrap();
    for (creds, what) in [
        (None, "no credentials"),
        (
            Some(Credentials {
                username: "robot".into(),
                password: "wrong".into(),
            }),
            "a wrong password",
        ),
    ] {
        let err = images.pull(&r, creds.as_ref()).await.unwrap_err();
        assert!(
            matches!(err, PullError::Unauthorized { .. }),
            "{what}: {err}"
        );
        assert!(!err.to_string().contains("wrong"), "{err}");
    }
    assert!(images.images().is_empty());
    let img = images.pull(&r, Some(&good)).await.unwrap();
    assert_eq!(img.digest().as_str(), private.digest());
    assert!(
        std::fs::read_to_string(img.rootfs().join("etc/os-release"))
            .unwrap()
            .starts_with("ID=tessera-private")
    );
    // The password is in no log line of the registry and no file of the store.
    assert!(!reg.log().contains("s3cret-pull-word"));
    let listing = Command::new("grep")
        .args(["-r", "-l", "s3cret-pull-word"])
        .arg(work.path())
        .output()
        .unwrap();
    assert!(
        listing.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&listing.stdout)
    );
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

/// A job in an image pulled from the registry runs in the crun sandbox with that image
/// as its read-only root: it sees the image's `/etc/os-release`, not the node's, gets the
/// image's environment, runs as the team's uid whatever the image's `User` says, and can
/// write only its workspace and `/tmp`. Needs root, crun and busybox (CI has all three).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_in_its_image_as_the_team_uid() {
    use std::ffi::OsString;
    use std::sync::Arc;
    use tessera_agent::sandbox::{
        Access, CONTROL_MOUNT, Process, Sandbox, SandboxSettings, WORKSPACE_MOUNT, image_argv,
        image_env,
    };

    if !registry_available() {
        return;
    }
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid() == 0
    });
    if !root || which("crun").is_none() || !Path::new("/bin/busybox").exists() {
        assert!(
            std::env::var_os("TESSERA_REQUIRE_REGISTRY").is_none() || !root,
            "as root in CI, crun and busybox-static must be installed"
        );
        eprintln!("SKIPPED: running a job in an image needs root, crun and busybox-static");
        return;
    }
    let reg = Registry::start(None);
    let http = reqwest::Client::new();
    let image = build_image("tessera-jobimage", 0);
    push(&http, &reg, "team/job", "v1", &image, None).await;
    let work = tempfile::tempdir().unwrap();
    let images = store(&work.path().join("images"), 1 << 40);
    let r = ImageRef::parse(&format!("{}/team/job:v1", reg.addr)).unwrap();
    let held = images.pull(&r, None).await.unwrap();

    let sim = tessera_agent::sim::SimNode::new(&["H100-80GB"], 7).unwrap();
    let dev = work.path().join("dev");
    tessera_agent::sim::write_device_files(&dev, &[0]).unwrap();
    let mut settings = SandboxSettings::new(PathBuf::from("crun"));
    settings.uid_first = 310_000;
    settings.uid_count = 10;
    settings.memory_mib = Some(128);
    settings.pids = 32;
    settings.tmp_mib = 16;
    settings.nofile = 1024;
    settings.nproc = 300;
    settings.network = None;
    settings.simulated_devices(dev);
    let sandbox = Sandbox::open(settings, Arc::new(sim), &work.path().join("sandbox"))
        .unwrap_or_else(|e| panic!("sandbox: {e}"));
    let workspace = work.path().join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    let uid = sandbox.uid_for("team-a").unwrap();
    sandbox.own_workspace(&workspace, uid).unwrap();
    let run = work.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let log_path = run.join("output.log");
    let log = std::fs::File::create(&log_path).unwrap();

    let script = format!(
        "cat /etc/os-release; echo \"MARKER=$MARKER PATH=$PATH\"; echo \"uid=$(id -u)\"; \
         (echo x > /etc/pwn) 2>/dev/null && echo ROOT-WRITABLE || echo root-read-only; \
         echo ok > {WORKSPACE_MOUNT}/out && echo workspace-writable; \
         echo ok > /tmp/t && echo tmp-writable; \
         test -e /usr/lib/os-release && echo HOST-USR || echo no-host-usr; \
         echo done > {CONTROL_MOUNT}/exit"
    );
    let argv = image_argv(held.config(), &[script]);
    assert_eq!(&argv[..2], ["/bin/sh", "-c"]);
    let env = image_env(
        held.config(),
        &[(
            OsString::from("PATH"),
            OsString::from("/usr/bin:/host-only"),
        )],
    );
    let access = Access {
        devices: &[],
        binds: &[],
        gpu_fraction: None,
        port: None,
        image: Some(held.rootfs()),
    };
    let what = Process {
        id: "oci-job-1",
        run: &run,
        workspace: &workspace,
        uid,
        cwd: WORKSPACE_MOUNT,
        argv: &argv,
        env: &env,
        access: &access,
    };
    let started = sandbox
        .start(&what, &log)
        .unwrap_or_else(|e| panic!("start: {e}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while Path::new(&format!("/proc/{}", started.pid)).exists() {
        // The container's init is our child's child: reap nothing, wait for it to go.
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", started.pid)).unwrap_or_default();
        if stat.contains(") Z") {
            break;
        }
        assert!(Instant::now() < deadline, "the job did not end");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.container.delete();
    let out = std::fs::read_to_string(&log_path).unwrap();
    assert!(out.contains("ID=tessera-jobimage"), "{out}");
    assert!(
        out.contains("MARKER=tessera-jobimage PATH=/bin"),
        "the image's PATH: {out}"
    );
    assert!(out.contains(&format!("uid={uid}")), "{out}");
    assert!(
        out.contains("root-read-only") && !out.contains("ROOT-WRITABLE"),
        "{out}"
    );
    assert!(
        out.contains("workspace-writable") && out.contains("tmp-writable"),
        "{out}"
    );
    assert!(out.contains("no-host-usr"), "{out}");
    assert_eq!(
        std::fs::read_to_string(workspace.join("out")).unwrap(),
        "ok\n"
    );
    // The image root is as pulled: nothing the job did is in it.
    assert!(!held.rootfs().join("etc/pwn").exists());
    assert!(!held.rootfs().join("tmp/t").exists());
}

/// A pull dropped half-way (a workload stopped while its image downloads) leaves no
/// half-built root and no stale flight: the next pull starts over, counts its progress
/// from zero and builds the image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_cancelled_half_way_leaves_nothing_and_the_next_one_builds_it() {
    if !registry_available() {
        return;
    }
    let reg = Registry::start(None);
    let http = reqwest::Client::new();
    let big = build_image("tessera-cancel", 40 << 20);
    push(&http, &reg, "team/cancel", "v1", &big, None).await;
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("images");
    let images = store(&dir, 1 << 40);
    let r = ImageRef::parse(&format!("{}/team/cancel@{}", reg.addr, big.digest())).unwrap();
    let total = (big.layer.len() + big.config.len()) as u64;

    let (s, r2) = (images.clone(), r.clone());
    let pull = tokio::spawn(async move { s.pull(&r2, None).await });
    // Aborted while the layer streams in.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((done, of)) = images.progress(&r)
            && done > big.config.len() as u64
        {
            assert_eq!(of, total);
            assert!(
                done < total,
                "the download finished before the test could cancel it"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the pull never started");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    pull.abort();
    assert!(pull.await.unwrap_err().is_cancelled());
    assert_eq!(images.progress(&r), None, "the flight is gone");
    assert_eq!(names(&dir.join("tmp")), Vec::<String>::new());
    assert_eq!(names(&dir.join("roots")), Vec::<String>::new());
    assert!(images.images().is_empty());

    let img = images.pull(&r, None).await.unwrap();
    assert_eq!(img.digest().as_str(), big.digest());
    assert!(img.rootfs().join("opt/filler").exists());
    assert_eq!(reg.blob_gets(&big.layer_digest()), 2);
    assert_eq!(names(&dir.join("tmp")), Vec::<String>::new());
}

/// An image pinned by its index's digest (what a catalog pins): pulled through the index
/// to this node's manifest, then found again by the index digest without the registry,
/// also by a store reopened after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_pinned_by_its_index_is_found_again_without_the_registry() {
    use tessera_agent::oci::client::{OCI_INDEX, OCI_MANIFEST, node_architecture};
    if !registry_available() {
        return;
    }
    let reg = Registry::start(None);
    let http = reqwest::Client::new();
    let image = build_image("tessera-indexed", 0);
    push(&http, &reg, "team/indexed", "v1", &image, None).await;
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [{
            "mediaType": OCI_MANIFEST,
            "digest": image.digest(),
            "size": image.manifest.len(),
            "platform": {"architecture": node_architecture(), "os": "linux"},
        }],
    }))
    .unwrap();
    let resp = http
        .put(format!(
            "http://{}/v2/team/indexed/manifests/multi",
            reg.addr
        ))
        .header("content-type", OCI_INDEX)
        .body(index.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
    let by_index = ImageRef::parse(&format!(
        "{}/team/indexed@sha256:{}",
        reg.addr,
        sha256(&index)
    ))
    .unwrap();

    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("images");
    let images = store(&dir, 1 << 40);
    let img = images.pull(&by_index, None).await.unwrap();
    assert_eq!(
        img.digest().as_str(),
        image.digest(),
        "this node's manifest"
    );
    drop(img);
    drop(reg);
    let again = images.pull(&by_index, None).await.unwrap();
    assert_eq!(again.digest().as_str(), image.digest());
    drop(again);
    drop(images);
    let reopened = store(&dir, 1 << 40);
    let held = reopened.pull(&by_index, None).await.unwrap();
    assert_eq!(held.digest().as_str(), image.digest());
    assert!(held.rootfs().join("etc/os-release").exists());
}
