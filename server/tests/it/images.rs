//! Images (issue 36) end to end: a real registry on loopback (Debian's `docker-registry`,
//! started by `tessera_registry::testkit`), images built and pushed by the test, the
//! server's catalog pinning them, and a real `tessera-agent --simulate` pulling and running
//! a job in one.
//!
//! Skipped only when the registry is missing and `TESSERA_REQUIRE_REGISTRY` is unset
//! (`cargo xtask test` installs it and sets it).

use crate::allocations::{request, set_quota, team, wait_for_state};
use crate::gangs::post_job;
use crate::on_both_databases;
use crate::support::{AdminClient, Db, assert_invalid, call_with_token};
use crate::workloads::{WorkloadAgent, get, stop_workload, wait_workload};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tessera_registry::Credentials;
use tessera_registry::testkit::{
    Registry, build_image_env, build_image_plain, image_from_tar, push, registry_available,
};

const PULL_USER: &str = "robot";
const PULL_PASSWORD: &str = "s3cret-pull-word-36";

/// An htpasswd file for [`PULL_USER`] and the folder it is in; `None` (the test skips)
/// where the registry or `htpasswd` is not installed.
fn pull_htpasswd() -> Option<(tempfile::TempDir, std::path::PathBuf)> {
    if !registry_available() {
        return None;
    }
    let secrets = tempfile::tempdir().expect("tempdir");
    let Some(file) = tessera_registry::testkit::htpasswd(secrets.path(), PULL_USER, PULL_PASSWORD)
    else {
        eprintln!("SKIPPED: htpasswd is not installed");
        return None;
    };
    Some((secrets, file))
}

async fn call(
    a: &AdminClient,
    token: &str,
    m: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    call_with_token(&a.app, token, m, path, body).await
}

/// Adds catalog entry `name` for `reference` to `team`'s catalog (the platform's when
/// `None`), as `token`.
async fn add_image(
    a: &AdminClient,
    token: &str,
    team: Option<&str>,
    name: &str,
    reference: &str,
) -> (u16, Value) {
    let mut body = json!({"name": name, "reference": reference});
    if let Some(team) = team {
        body["team_id"] = json!(team);
    }
    call(a, token, Method::POST, "/api/v1/images", Some(body)).await
}

/// `POST /api/v1/registries` (the allow-list) with `body`, as `token`.
async fn post_registry(a: &AdminClient, token: &str, body: Value) -> (u16, Value) {
    call(a, token, Method::POST, "/api/v1/registries", Some(body)).await
}

/// Sets the pull robot's login for `registry` at `logins` (a team's registry logins), as
/// `token`.
async fn set_login(a: &AdminClient, token: &str, logins: &str, registry: &str) -> (u16, Value) {
    let body = json!({"registry": registry, "username": PULL_USER, "password": PULL_PASSWORD});
    call(a, token, Method::PUT, logins, Some(body)).await
}

/// `DELETE path` as `token`.
async fn delete(a: &AdminClient, token: &str, path: &str) -> (u16, Value) {
    call(a, token, Method::DELETE, path, None).await
}

/// Catalog, allow-list and logins: who may do what, what is pinned, what never shows.
async fn the_catalog_pins_images_and_keeps_teams_apart(db: Db) {
    let Some((_secrets, file)) = pull_htpasswd() else {
        return;
    };
    let public = Registry::start(None);
    let private = Registry::start(Some(&file));
    let http = reqwest::Client::new();
    let base = build_image_env(
        "tessera-base",
        &["NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla"],
    );
    push(&http, &public, "lab/base", "1", &base, None).await;
    let login = Credentials {
        username: PULL_USER.into(),
        password: PULL_PASSWORD.into(),
    };
    let secret_img = build_image_plain("tessera-secret", &[]);
    push(
        &http,
        &private,
        "acme/secret",
        "v1",
        &secret_img,
        Some(&login),
    )
    .await;

    let a = AdminClient::new(db).await;
    let admin = a.token().await;
    let ta = team(&a, "img-a").await;
    let tb = team(&a, "img-b").await;
    let base_ref = format!("{}/lab/base:1", public.addr);

    // Nothing is allowed at first; only platform admins change the allow-list.
    let (s, v) = add_image(&a, &ta.team_admin, Some(&ta.id), "Base", &base_ref).await;
    assert_invalid(s, &v, "image", "no registry is allowed yet");
    let (s, _) = post_registry(&a, &ta.team_admin, json!({"entry": public.addr})).await;
    assert_eq!(s, 403);
    let (s, v) = post_registry(&a, &admin, json!({"entry": "not a registry"})).await;
    assert_eq!((s, &v["error"]["field"]), (422, &json!("registry")), "{v}");
    let (s, v) = post_registry(&a, &admin, json!({"entry": "x.io", "extra": 1})).await;
    assert_eq!(s, 422, "an unknown field is refused: {v}");
    for entry in [&public.addr, &format!("{}/acme", private.addr)] {
        let (s, v) = post_registry(&a, &admin, json!({"entry": entry})).await;
        assert_eq!(s, 200, "{v}");
    }
    let (s, v) = call(&a, &ta.member, Method::GET, "/api/v1/registries", None).await;
    assert_eq!(s, 200);
    assert_eq!(v.as_array().map(Vec::len), Some(2), "{v}");

    // A platform entry: platform admins only; pinned to the manifest's digest, with the
    // CUDA the image's config asks for.
    let (s, _) = add_image(&a, &ta.team_admin, None, "Base", &base_ref).await;
    assert_eq!(s, 403, "a team admin adds no platform entry");
    let (s, plat) = add_image(&a, &admin, None, "Base", &base_ref).await;
    assert_eq!(s, 201, "{plat}");
    assert_eq!(
        plat["pinned"],
        format!("{}/lab/base@{}", public.addr, base.digest())
    );
    assert_eq!(plat["requires_cuda"], "12.4");
    assert_eq!(plat["team_id"], Value::Null);
    let (s, v) = add_image(&a, &admin, None, "Base", &base_ref).await;
    assert_eq!(s, 409, "the name is taken: {v}");
    // A moved tag does not move the entry.
    let moved = build_image_env("tessera-base-2", &[]);
    push(&http, &public, "lab/base", "1", &moved, None).await;
    let (_, list) = call(&a, &ta.member, Method::GET, "/api/v1/images", None).await;
    assert_eq!(list[0]["pinned"], plat["pinned"], "{list}");

    // A private image: the team's login is needed, and only that team's.
    let secret_ref = format!("{}/acme/secret:v1", private.addr);
    let (s, v) = add_image(&a, &ta.team_admin, Some(&ta.id), "Secret", &secret_ref).await;
    assert_invalid(s, &v, "image", "login");
    let logins = format!("/api/v1/teams/{}/registry-logins", ta.id);
    let (s, _) = set_login(&a, &ta.member, &logins, &private.addr).await;
    assert_eq!(s, 403, "a member sets no login");
    let (s, _) = set_login(&a, &tb.team_admin, &logins, &private.addr).await;
    assert_eq!(s, 404, "another team's admin does not see the team");
    let (s, v) = set_login(&a, &ta.team_admin, &logins, &private.addr).await;
    assert_eq!(s, 200, "{v}");
    assert!(!v.to_string().contains(PULL_PASSWORD), "{v}");
    let (s, v) = call(&a, &ta.team_admin, Method::GET, &logins, None).await;
    assert_eq!(s, 200);
    assert_eq!(v[0]["username"], PULL_USER);
    assert!(
        !v.to_string().contains(PULL_PASSWORD),
        "never shown back: {v}"
    );
    let (s, secret) = add_image(&a, &ta.team_admin, Some(&ta.id), "Secret", &secret_ref).await;
    assert_eq!(s, 201, "{secret}");
    assert_eq!(
        secret["pinned"],
        format!("{}/acme/secret@{}", private.addr, secret_img.digest())
    );
    // Team B cannot use it: not by adding it (no login), not in a job (not its catalog).
    let (s, v) = add_image(&a, &tb.team_admin, Some(&tb.id), "Secret", &secret_ref).await;
    assert_eq!(s, 422, "{v}");
    let (s, v) = call(
        &a,
        &tb.member,
        Method::GET,
        &format!("/api/v1/images?team={}", ta.id),
        None,
    )
    .await;
    assert_eq!(s, 404, "{v}");
    let (_, v) = call(&a, &tb.member, Method::GET, "/api/v1/images", None).await;
    let names: Vec<&str> = v
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|i| i["name"].as_str())
        .collect();
    assert_eq!(names, ["Base"], "team B sees the platform entry only: {v}");
    set_quota(&a, &tb.id, "H100-80GB", 7, 7, 7).await;
    for named in [&secret["id"], &secret["name"], &secret["pinned"]] {
        let (s, v) = post_job(&a.app, &tb.member, json!({ "gpu": "H100-80GB:1g.10gb", "team_id": tb.id, "command": "true", "image": named})).await;
        assert_eq!(
            (s, &v["error"]["field"]),
            (422, &json!("image")),
            "{named}: {v}"
        );
    }
    // A team's other members never see the login either: not in any view or the audit.
    let (_, audit) = call(&a, &admin, Method::GET, "/api/v1/audit?limit=200", None).await;
    assert!(audit.to_string().contains("registry_login.set"), "{audit}");
    assert!(!audit.to_string().contains(PULL_PASSWORD), "{audit}");
    // Removing: a team admin not a platform entry; its team's own entry yes.
    let (s, _) = delete(
        &a,
        &ta.team_admin,
        &format!("/api/v1/images/{}", plat["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(s, 403);
    let (s, _) = delete(
        &a,
        &tb.team_admin,
        &format!("/api/v1/images/{}", secret["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(s, 404, "another team's entry is not found");
    // Disallowing a registry stops new workloads in its images.
    let (s, _) = delete(
        &a,
        &admin,
        &format!("/api/v1/registries?entry={}/acme", private.addr),
    )
    .await;
    assert_eq!(s, 200);
    set_quota(&a, &ta.id, "H100-80GB", 7, 7, 7).await;
    let (s, v) = post_job(&a.app, &ta.member, json!({ "gpu": "H100-80GB:1g.10gb", "team_id": ta.id, "command": "true", "image": "Secret"})).await;
    assert_invalid(s, &v, "image", "not from an allowed registry");
    let (s, _) = delete(
        &a,
        &ta.team_admin,
        &format!("/api/v1/images/{}", secret["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(s, 204);
}

/// Polls a workload until `done` says yes, keeping every view seen.
async fn watch(
    a: &AdminClient,
    token: &str,
    id: &str,
    secs: u64,
    done: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut seen = Vec::new();
    loop {
        let v = get(&a.app, token, id).await;
        let stop = done(&v);
        seen.push(v);
        if stop {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "gave up watching {id}: {:?}",
            seen.last()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A job runs in its catalog image on a simulated node (pulled with the team's login),
/// and an image that needs a newer CUDA than the node's driver waits for a node that
/// runs it.
async fn a_job_runs_in_its_image_and_waits_for_a_driver_that_runs_it(db: Db) {
    let Some((_secrets, file)) = pull_htpasswd() else {
        return;
    };
    let reg = Registry::start(Some(&file));
    let http = reqwest::Client::new();
    let login = Credentials {
        username: PULL_USER.into(),
        password: PULL_PASSWORD.into(),
    };
    let img = build_image_plain("tessera-img-job", &["CUDA_VERSION=12.2.0"]);
    push(&http, &reg, "team/job", "1", &img, Some(&login)).await;
    let newer = build_image_plain("tessera-img-new", &["NVIDIA_REQUIRE_CUDA=cuda>=12.6"]);
    push(&http, &reg, "team/new", "1", &newer, Some(&login)).await;

    let a = AdminClient::new(db).await;
    let admin = a.token().await;
    let t = team(&a, "imgrun").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let (s, _) = post_registry(&a, &admin, json!({"entry": reg.addr})).await;
    assert_eq!(s, 200);
    let (s, _) = set_login(
        &a,
        &t.team_admin,
        &format!("/api/v1/teams/{}/registry-logins", t.id),
        &reg.addr,
    )
    .await;
    assert_eq!(s, 200);
    for (name, repo) in [("Job", "team/job:1"), ("New", "team/new:1")] {
        let reference = format!("{}/{repo}", reg.addr);
        let (s, v) = add_image(&a, &t.team_admin, Some(&t.id), name, &reference).await;
        assert_eq!(s, 201, "{v}");
    }

    // The node's driver supports CUDA 12.4 (the simulator's default).
    let agent = WorkloadAgent::start(&a, "imgrun-node").await;
    let (s, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let alloc = v["id"].as_str().expect("id").to_owned();
    wait_for_state(&a, &alloc, "active").await;

    let (s, v) = call(&a, &t.member, Method::POST, "/api/v1/jobs", Some(json!({
        "allocation_id": alloc, "image": "Job",
        "command": "cat /etc/os-release; echo \"cuda=$CUDA_VERSION uid=$(id -u 2>/dev/null || echo ?)\""}))).await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(
        v["image"],
        format!("{}/team/job@{}", reg.addr, img.digest())
    );
    let id = v["id"].as_str().expect("id").to_owned();
    let seen = watch(&a, &t.member, &id, 60, |v| {
        v["state"] == "succeeded" || v["state"] == "failed"
    })
    .await;
    let last = seen.last().expect("a view");
    assert_eq!(last["state"], "succeeded", "{last}");
    let (_, log) = call(
        &a,
        &t.member,
        Method::GET,
        &format!("/api/v1/workloads/{id}/logs?from=0"),
        None,
    )
    .await;
    let text = log["text"].as_str().unwrap_or("");
    assert!(
        text.contains("ID=tessera-img-job"),
        "the image's os-release, not the host's: {text}"
    );
    assert!(
        text.contains("cuda=12.2.0"),
        "the image's environment: {text}"
    );
    for v in &seen {
        assert!(!v.to_string().contains(PULL_PASSWORD), "{v}");
        if let Some(p) = v.get("pull").filter(|p| !p.is_null()) {
            assert!(p["done_bytes"].as_u64() <= p["total_bytes"].as_u64(), "{v}");
        }
    }

    // An image that needs CUDA 12.6: refused on the 12.4 node's allocation, with why.
    let (s, v) = post_job(
        &a.app,
        &t.member,
        json!({ "allocation_id": alloc, "image": "New", "command": "true"}),
    )
    .await;
    assert_eq!((s, &v["error"]["field"]), (422, &json!("image")), "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("12.6") && msg.contains("12.4"), "{v}");
    // With a GPU of its own it waits, saying why, until a node with a newer driver joins.
    let (s, v) = post_job(&a.app, &t.member, json!({ "gpu": "H100-80GB:1g.10gb", "team_id": t.id, "image": "New", "command": "cat /etc/os-release"})).await;
    assert_eq!(s, 201, "{v}");
    let queued = v["id"].as_str().expect("id").to_owned();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = get(&a.app, &t.member, &queued).await;
    assert_eq!(v["state"], "queued", "{v}");
    let waiting = v["waiting"].as_str().unwrap_or("");
    assert!(waiting.contains("CUDA") && waiting.contains("12.6"), "{v}");
    let (s, jt) = call(
        &a,
        &admin,
        Method::POST,
        "/api/v1/join-tokens",
        Some(json!({"note": "new driver"})),
    )
    .await;
    assert_eq!(s, 201);
    let newer_node = WorkloadAgent::start_with(
        &a.app.base,
        jt["secret"].as_str().expect("secret"),
        "imgrun-node-new",
        &[],
        &[
            "--sim-cuda".into(),
            "12.8".into(),
            "--sim-driver-version".into(),
            "570.86.10".into(),
        ],
    );
    let done = wait_workload(&a.app, &t.member, &queued, "succeeded", 90).await;
    assert_eq!(done["hostname"], "imgrun-node-new", "{done}");
    let (_, log) = call(
        &a,
        &t.member,
        Method::GET,
        &format!("/api/v1/workloads/{queued}/logs?from=0"),
        None,
    )
    .await;
    assert!(
        log["text"]
            .as_str()
            .unwrap_or("")
            .contains("ID=tessera-img-new"),
        "{log}"
    );
    newer_node.stop().await;
    agent.stop().await;
}

/// A tar of the host's files that JupyterLab needs and nothing else of the host: the
/// notebook environment (`TESSERA_AGENT_NOTEBOOK_ENV`), the Python it was made from (its
/// standard library without tests and site-packages), the shared libraries `ldd` finds for
/// them, and busybox as `/bin/sh`. Symlinks stay symlinks; `/lib` → `usr/lib` as on the host.
fn jupyter_layer(venv: &std::path::Path) -> Vec<u8> {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};
    let python = std::fs::canonicalize(venv.join("bin/python3")).expect("the venv's python");
    let prefix = python
        .parent()
        .and_then(Path::parent)
        .expect("python's prefix")
        .to_path_buf();
    let stdlib = prefix.join("lib/python3.11");
    let skip: Vec<PathBuf> = [
        "test",
        "site-packages",
        "idlelib",
        "tkinter",
        "ensurepip",
        "lib2to3",
    ]
    .iter()
    .map(|d| stdlib.join(d))
    .collect();
    let mut files: BTreeSet<PathBuf> = BTreeSet::new();
    fn walk(dir: &Path, skip: &[PathBuf], out: &mut BTreeSet<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
            let p = e.path();
            if skip.contains(&p) {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).expect("metadata");
            if m.is_dir() {
                walk(&p, skip, out);
            } else if m.is_file() || m.file_type().is_symlink() {
                out.insert(p);
            }
        }
    }
    walk(venv, &skip, &mut files);
    walk(&prefix.join("bin"), &skip, &mut files);
    walk(&prefix.join("lib"), &skip, &mut files);
    // The shared libraries of the interpreter and of every extension module.
    let mut libs: BTreeSet<PathBuf> = BTreeSet::new();
    let objects: Vec<PathBuf> = files
        .iter()
        .filter(|p| p.to_string_lossy().contains(".so") && p.is_file())
        .cloned()
        .chain([python.clone()])
        .collect();
    for chunk in objects.chunks(200) {
        let out = std::process::Command::new("ldd")
            .args(chunk)
            .output()
            .expect("ldd");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let path = line
                .split("=>")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .or_else(|| {
                    line.split_whitespace()
                        .next()
                        .filter(|w| w.starts_with('/'))
                });
            if let Some(p) = path.filter(|p| p.starts_with('/')) {
                libs.insert(PathBuf::from(p));
            }
        }
    }
    let mut tar = tar::Builder::new(Vec::new());
    tar.follow_symlinks(false);
    let mut added: BTreeSet<PathBuf> = BTreeSet::new();
    // A path and, for a symlink, what it points at, at their real places (`/lib` is a
    // symlink here, so libraries are stored under `usr/lib`).
    fn add(tar: &mut tar::Builder<Vec<u8>>, added: &mut BTreeSet<PathBuf>, path: &Path) {
        let parent = path
            .parent()
            .map(|p| std::fs::canonicalize(p).unwrap_or(p.to_path_buf()));
        let path = match (parent, path.file_name()) {
            (Some(dir), Some(name)) => dir.join(name),
            _ => return,
        };
        // A dangling link's target (there are some in a Python tree) is left out.
        let Ok(m) = std::fs::symlink_metadata(&path) else {
            return;
        };
        if !added.insert(path.clone()) {
            return;
        }
        let name = path.strip_prefix("/").expect("absolute");
        if m.file_type().is_symlink() {
            let target = std::fs::read_link(&path).expect("link");
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            h.set_mode(0o777);
            tar.append_link(&mut h, name, &target).expect("symlink");
            let resolved = if target.is_absolute() {
                target
            } else {
                path.parent().expect("parent").join(target)
            };
            if std::fs::symlink_metadata(&resolved).is_ok_and(|m| !m.is_dir()) {
                add(tar, added, &resolved);
            }
        } else {
            tar.append_path_with_name(&path, name).expect("file");
        }
    }
    for p in files.iter().chain(libs.iter()) {
        add(&mut tar, &mut added, p);
    }
    for (link, target) in [("lib", "usr/lib"), ("lib64", "usr/lib64")] {
        if std::fs::read_link(Path::new("/").join(link)).is_ok() {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            h.set_mode(0o777);
            tar.append_link(&mut h, link, target).expect("symlink");
        }
    }
    if let Ok(bb) = std::fs::read("/bin/busybox") {
        let h = tessera_registry::testkit::file_header("bin/busybox", 0o755, bb.len() as u64);
        tar.append(&h, &bb[..]).expect("busybox");
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        tar.append_link(&mut h, "bin/sh", "busybox").expect("sh");
    }
    tar.into_inner().expect("tar")
}

/// A team's notebook profile with a catalog image starts JupyterLab from that image (one
/// the test builds with the notebook environment inside); the node's own environment is
/// not in the container, so the notebook answers only because the image has it.
async fn a_profile_notebook_runs_jupyterlab_from_its_image(db: Db) {
    if !registry_available() {
        return;
    }
    let Some(venv) = std::env::var_os("TESSERA_AGENT_NOTEBOOK_ENV").map(std::path::PathBuf::from)
    else {
        eprintln!("SKIPPED: TESSERA_AGENT_NOTEBOOK_ENV is not set (cargo xtask test sets it)");
        return;
    };
    let reg = Registry::start(None);
    let http = reqwest::Client::new();
    let raw = jupyter_layer(&venv);
    let env = vec![
        format!("PATH={}/bin:/bin", venv.display()),
        "MARKER=tessera-jupyter-image".to_owned(),
    ];
    let img = image_from_tar(raw, &env);
    push(&http, &reg, "lab/jupyter", "1", &img, None).await;

    let a = AdminClient::new(db).await;
    let admin = a.token().await;
    let t = team(&a, "imgnb").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let (s, _) = post_registry(&a, &admin, json!({"entry": reg.addr})).await;
    assert_eq!(s, 200);
    let reference = format!("{}/lab/jupyter:1", reg.addr);
    let (s, v) = add_image(&a, &t.team_admin, Some(&t.id), "Lab", &reference).await;
    assert_eq!(s, 201, "{v}");
    let (s, profile) = call(
        &a,
        &t.team_admin,
        Method::POST,
        &format!("/api/v1/teams/{}/notebook-profiles", t.id),
        Some(json!({"name": "Lab image", "kind": "H100-80GB:1g.10gb", "hours": 1, "image": "Lab"})),
    )
    .await;
    assert_eq!(s, 201, "{profile}");
    assert_eq!(profile["image_name"], "Lab", "{profile}");
    let (s, v) = call(&a, &t.team_admin, Method::POST, &format!("/api/v1/teams/{}/notebook-profiles", t.id),
        Some(json!({"name": "Bad", "kind": "H100-80GB:1g.10gb", "hours": 1, "image": "no such image"}))).await;
    assert_eq!((s, &v["error"]["field"]), (422, &json!("image")), "{v}");

    let agent = WorkloadAgent::start(&a, "imgnb-node").await;
    let (s, v) = call(
        &a,
        &t.member,
        Method::POST,
        "/api/v1/notebooks",
        Some(json!({"profile_id": profile["id"], "name": "lab"})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(
        v["image"],
        format!("{}/lab/jupyter@{}", reg.addr, img.digest()),
        "{v}"
    );
    let id = v["id"].as_str().expect("id").to_owned();
    // `running` is reported once JupyterLab answers its status probe (agent side).
    let running = wait_workload(&a.app, &t.member, &id, "running", 180).await;
    assert!(running["url"].is_string(), "{running}");
    let (s, _) = stop_workload(&a.app, &t.member, &id).await;
    assert_eq!(s, 200);
    wait_workload(&a.app, &t.member, &id, "stopped", 60).await;
    agent.stop().await;
}

on_both_databases!(
    a_profile_notebook_runs_jupyterlab_from_its_image,
    the_catalog_pins_images_and_keeps_teams_apart,
    a_job_runs_in_its_image_and_waits_for_a_driver_that_runs_it,
);
