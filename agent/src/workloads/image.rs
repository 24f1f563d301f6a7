//! Workloads in an OCI image (issue 36): the spec names an image pinned by digest
//! (`registry/repo@sha256:…`), with the team's registry login when it has one.
//!
//! - [`LocalExecutor::apply`] does not start such a workload at once: it spawns the pull
//!   ([`crate::oci::ImageStore::pull`], one per image on the node: concurrent workloads on
//!   one image wait for the same fetch) and the workload is [`Status::Pulling`]. The agent's
//!   loop goes on; each report says `starting` with the pull's bytes done and to do.
//! - Each [`LocalExecutor::reports`] round first looks at finished pulls: a pulled image is
//!   held (pinned against collection) for the workload's life and the workload starts in
//!   the sandbox with the image as its read-only root; a failed pull is `failed_to_start`
//!   with the image and the reason (never a credential: [`crate::oci::PullError`]'s texts
//!   name registries and digests only).
//! - A stop (or the server forgetting it) while it pulls drops the pull, which cancels it.
//! - The login is used for the pull only: it is in memory while the pull runs, never in
//!   `state.json` or any other file, and never logged.
//! - Unused images are collected (least recently used first, past the cache size) when an
//!   image workload ends and every [`COLLECT_EVERY`]; a held image never is.
//!
//! In the image: the image's `Entrypoint` then the workload's command (or the image's
//! `Cmd`), the image's `Env` under the workload's variables (the node's environment is
//! not inherited), always the team's uid. It starts in the spec's folder of the team
//! workspace; a spec that names none starts in the image's `WorkingDir` when that is a
//! folder of the image (or of the workspace, for `/workspace/…`), else in the workspace.

use std::ffi::OsString;
use std::path::{Component, Path};
use std::time::{Duration, Instant};

use tessera_domain::image::ImageRef;
use tessera_domain::wire::{PullProgress, WorkloadSpec};

use super::{LocalExecutor, Status, WORKSPACE_MOUNT, Workload, image_env};
use crate::driver_files::driver_env;
use crate::oci::{Credentials, Image, ImageStore, PullError};
use crate::sandbox::Sandbox;

/// Why an image workload cannot run without the sandbox.
pub const NEEDS_SANDBOX: &str = "a workload in an image needs the workload sandbox (this \
     agent runs with --sandbox off)";

/// How often unused images are collected besides when an image workload ends.
pub const COLLECT_EVERY: Duration = Duration::from_secs(300);

/// `PATH` in an image that sets none (docker's default).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// An image pull for one workload; dropping it cancels the pull.
pub(super) struct Pull {
    /// The spec, without the login.
    spec: WorkloadSpec,
    reference: ImageRef,
    task: tokio::task::JoinHandle<Result<Image, PullError>>,
}

impl Drop for Pull {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Pull {
    /// Bytes done of bytes to do (0 of 0 until the manifest is read).
    pub(super) fn progress(&self, store: Option<&ImageStore>) -> PullProgress {
        let (done, total) = store
            .and_then(|s| s.progress(&self.reference))
            .unwrap_or((0, 0));
        PullProgress {
            done_bytes: done.min(total),
            total_bytes: total,
        }
    }

    /// A newer deadline for the workload, told once it runs.
    pub(super) fn set_deadline(&mut self, d: Option<&tessera_domain::drain::Deadline>) {
        self.spec.deadline = d.cloned();
    }

    /// A gang member's peers sent while its image is pulled: it starts with them.
    pub(super) fn set_gang(&mut self, spec: &WorkloadSpec) {
        if spec.gang.is_some() {
            self.spec.gang = spec.gang.clone();
            self.spec.env = spec.env.clone();
        }
    }
}

/// `spec` without its registry login (what is kept once the pull has it).
pub(super) fn without_login(spec: &WorkloadSpec) -> WorkloadSpec {
    let mut s = spec.clone();
    if let Some(i) = &mut s.image {
        i.login = None;
    }
    s
}

impl LocalExecutor {
    /// Runs workloads that name an image in images from `store` (without a store they
    /// fail to start). Workloads adopted after a restart hold their images again.
    pub fn with_images(mut self, store: ImageStore) -> Self {
        for (id, w) in &mut self.workloads {
            // A prepared gang member holds its image too.
            if let Status::Prepared(p) = &mut w.status
                && let Some(d) = p
                    .image_digest
                    .take()
                    .and_then(|d| tessera_domain::image::Digest::parse(&d).ok())
            {
                match store.hold(&d) {
                    Some(img) => p.image = Some(img),
                    None => {
                        tracing::warn!(id, image = %d, "a prepared gang member's image is not in the store")
                    }
                }
            }
            if let Some(d) = w.image_digest.take().filter(|_| w.is_live()) {
                match store.hold(&d) {
                    Some(img) => w.image = Some(img),
                    None => {
                        tracing::warn!(id, image = %d, "an adopted workload's image is not in the store")
                    }
                }
            }
        }
        self.images = Some(store);
        self
    }

    /// The image store, when this executor has one.
    pub fn images(&self) -> Option<&ImageStore> {
        self.images.as_ref()
    }

    /// Starts pulling `spec`'s image; any refusal becomes a `FailedToStart` workload.
    pub(super) fn start_pull(&self, spec: &WorkloadSpec) -> Workload {
        match self.try_pull(spec) {
            Ok(pull) => {
                tracing::info!(id = spec.id, image = %pull.reference, "pulling the workload's image");
                Workload::new(self.run_dir(&spec.id), Status::Pulling(Box::new(pull)))
            }
            Err(message) => {
                tracing::warn!(id = spec.id, message, "workload failed to start");
                Workload::new(self.run_dir(&spec.id), Status::FailedToStart(message))
            }
        }
    }

    fn try_pull(&self, spec: &WorkloadSpec) -> Result<Pull, String> {
        let Some(image) = &spec.image else {
            return Err("the workload names no image".to_owned());
        };
        if self.sandbox.is_none() {
            return Err(NEEDS_SANDBOX.to_owned());
        }
        let store = self
            .images
            .clone()
            .ok_or("this agent has no image store for workloads in an image")?;
        let reference = ImageRef::parse(&image.reference)
            .map_err(|e| format!("image {:?}: {e}", image.reference))?;
        if reference.digest().is_none() {
            return Err(format!(
                "image {reference} is not pinned by a digest (repository@sha256:…)"
            ));
        }
        let creds = image.login.as_ref().map(|l| Credentials {
            username: l.username.clone(),
            password: l.password.clone(),
        });
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "no runtime to pull the image on".to_owned())?;
        let r = reference.clone();
        let task = runtime.spawn(async move { store.pull(&r, creds.as_ref()).await });
        Ok(Pull {
            spec: without_login(spec),
            reference,
            task,
        })
    }

    /// Starts the workloads whose pull finished (or says why they cannot start).
    pub(super) async fn finish_pulls(&mut self) {
        let done: Vec<String> = self
            .workloads
            .iter()
            .filter(|(_, w)| matches!(&w.status, Status::Pulling(p) if p.task.is_finished()))
            .map(|(id, _)| id.clone())
            .collect();
        for id in done {
            let Some(mut old) = self.workloads.remove(&id) else {
                continue;
            };
            let Status::Pulling(mut pull) =
                std::mem::replace(&mut old.status, Status::Lost(String::new()))
            else {
                continue;
            };
            let result = (&mut pull.task).await;
            let spec = pull.spec.clone();
            let reference = pull.reference.clone();
            drop(pull);
            let mut w = match result {
                Ok(Ok(image)) => {
                    tracing::info!(id, image = %reference, digest = %image.digest(), "image ready");
                    match &spec.gang {
                        // A gang member waits for its peers in its sandbox.
                        Some(_) => self.prepare_or_launch(&spec, Some(image)),
                        None => self.start(&spec, Some(image)),
                    }
                }
                Ok(Err(e)) => self.failed(&id, format!("cannot pull image {reference}: {e}")),
                Err(e) => self.failed(&id, format!("the pull of image {reference} ended: {e}")),
            };
            w.acked = old.acked;
            w.tell_deadline(&id, spec.deadline.as_ref());
            self.workloads.insert(id, w);
        }
    }

    fn failed(&self, id: &str, message: String) -> Workload {
        tracing::warn!(id, message, "workload failed to start");
        Workload::new(self.run_dir(id), Status::FailedToStart(message))
    }

    /// Lets go of the images of workloads that ended, and collects unused images when one
    /// did or [`COLLECT_EVERY`] passed (off the loop's thread).
    pub(super) fn release_images(&mut self) {
        let mut released = false;
        for w in self.workloads.values_mut() {
            if !w.is_live() && w.image.take().is_some() {
                released = true;
            }
        }
        let Some(store) = &self.images else {
            return;
        };
        if !released && self.collected.elapsed() < COLLECT_EVERY {
            return;
        }
        self.collected = Instant::now();
        let store = store.clone();
        let collect = move || {
            for d in store.collect() {
                tracing::info!(image = %d, "unused image removed from the store");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(collect)),
            Err(_) => collect(),
        }
    }
}

/// The environment in an image: the image's `Env` under the workload's variables
/// ([`image_env`]), a default `PATH` if neither sets one, and the NVIDIA driver's folders
/// when it has a GPU and the node mounts the driver's files.
pub(super) fn env_in_image(
    img: &Image,
    env: &[(OsString, OsString)],
    devices: &[String],
    sandbox: Option<&Sandbox>,
) -> Vec<(OsString, OsString)> {
    let mut env = image_env(img.config(), env);
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), DEFAULT_PATH.into()));
    }
    if !devices.is_empty() && sandbox.is_some_and(|s| !s.driver_files().is_empty()) {
        driver_env(&mut env);
    }
    env
}

/// Where a workload in `image` starts, inside its container: `workdir` in the workspace
/// when the spec names one; else the image's `WorkingDir` when it is a plain absolute
/// path to a folder of the image (no symlink on the way) or of the workspace; else the
/// workspace.
pub(super) fn container_cwd(workdir: &str, image: &Image, workspace: &Path) -> String {
    if !workdir.is_empty() {
        return Path::new(WORKSPACE_MOUNT)
            .join(workdir)
            .to_string_lossy()
            .into_owned();
    }
    let wd = Path::new(&image.config().working_dir);
    let mut parts = wd.components();
    let plain = parts.next() == Some(Component::RootDir)
        && parts.clone().next().is_some()
        && parts.all(|c| matches!(c, Component::Normal(_)));
    if !plain {
        return WORKSPACE_MOUNT.to_owned();
    }
    let found = match wd.strip_prefix(WORKSPACE_MOUNT) {
        Ok(rest) => workspace.join(rest).is_dir(),
        Err(_) => real_dir_in(image.rootfs(), wd),
    };
    if found {
        wd.to_string_lossy().into_owned()
    } else {
        WORKSPACE_MOUNT.to_owned()
    }
}

/// Whether `abs` names a directory inside `root` through directories only.
fn real_dir_in(root: &Path, abs: &Path) -> bool {
    let mut at = root.to_path_buf();
    for c in abs.components().skip(1) {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            _ => return false,
        }
    }
    true
}
