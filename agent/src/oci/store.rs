//! The node's image store: content-addressed, one pull per image at a time, a size limit
//! with least-recently-used collection that never removes an image in use.
//!
//! ```text
//! <dir>/blobs/sha256/<hex>       verified image configs
//! <dir>/roots/<hex>/rootfs       an image's unpacked root, per manifest digest
//! <dir>/roots/<hex>/image.json   its config (Env, WorkingDir, Entrypoint, Cmd) and size
//! <dir>/tmp/<hex>-<n>/           a root being built, its verified layer blobs beside it
//!                                (removed once unpacked); roots being collected
//!
//! Pulls wait for one another per reference and then per manifest digest, so a tag and
//! a digest naming one image build it once.
//! ```
//!
//! The directory is 0700: workloads see an image only as the root the sandbox mounts.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use tessera_domain::image::{Digest, ImageRef};

use tessera_registry::ImageConfig;
use tessera_registry::client::{Credentials, PullError, Session};
use tessera_registry::unpack::{self, Limits, Tally};

/// The config's `rootfs.diff_ids`: the digests of the layers' uncompressed tar streams.
fn diff_ids(json: &[u8]) -> Result<Vec<String>, PullError> {
    #[derive(Deserialize)]
    struct Doc {
        rootfs: Rootfs,
    }
    #[derive(Deserialize)]
    struct Rootfs {
        #[serde(default)]
        diff_ids: Vec<String>,
    }
    serde_json::from_slice::<Doc>(json)
        .map(|d| d.rootfs.diff_ids)
        .map_err(|e| PullError::Refused(format!("the image config has no rootfs: {e}")))
}

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    config: ImageConfig,
    bytes: u64,
    /// The index digest the image was pulled by, when it came from an index (what a
    /// catalog pins): a later pull by it finds the image without asking the registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    index: Option<Digest>,
}

/// Settings of a store.
#[derive(Debug, Clone, Copy)]
pub struct StoreLimits {
    /// Per image: what its layers may unpack to.
    pub image: Limits,
    /// All unpacked roots together; past it, unused images are collected oldest first.
    pub cache_bytes: u64,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            image: Limits::default(),
            cache_bytes: 100 << 30,
        }
    }
}

/// Bytes received of bytes to fetch, for one pull in flight.
#[derive(Debug, Default)]
pub struct Progress {
    pub done: AtomicU64,
    pub total: AtomicU64,
}

struct Flight {
    lock: tokio::sync::Mutex<()>,
    progress: Arc<Progress>,
}

struct Cached {
    config: ImageConfig,
    bytes: u64,
    last_used: u64,
    pins: usize,
}

#[derive(Default)]
struct State {
    images: HashMap<Digest, Cached>,
    /// Index digest → the manifest digest of this node's platform, for stored images.
    aliases: HashMap<Digest, Digest>,
    clock: u64,
}

struct Inner {
    dir: PathBuf,
    limits: StoreLimits,
    http: reqwest::Client,
    state: Mutex<State>,
    flights: Mutex<HashMap<String, Arc<Flight>>>,
    seq: AtomicU64,
}

/// The image store (cheap to clone; clones share everything).
#[derive(Clone)]
pub struct ImageStore(Arc<Inner>);

/// An image held for use: its root is never collected while this lives.
pub struct Image {
    store: Arc<Inner>,
    digest: Digest,
    root: PathBuf,
    config: ImageConfig,
}

impl Image {
    /// The manifest digest (what the image is, whatever tag named it).
    pub fn digest(&self) -> &Digest {
        &self.digest
    }
    /// The unpacked root: mount it read-only, never write in it.
    pub fn rootfs(&self) -> &Path {
        &self.root
    }
    pub fn config(&self) -> &ImageConfig {
        &self.config
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let mut st = lock(&self.store.state);
        if let Some(c) = st.images.get_mut(&self.digest) {
            c.pins = c.pins.saturating_sub(1);
        }
    }
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Image({})", self.digest)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A flight joined; left on drop. The last one out removes it from the map (others may
/// still wait on it).
struct Boarded {
    store: Arc<Inner>,
    key: String,
    flight: Arc<Flight>,
}

impl std::ops::Deref for Boarded {
    type Target = Flight;
    fn deref(&self) -> &Flight {
        &self.flight
    }
}

impl Drop for Boarded {
    fn drop(&mut self) {
        let mut flights = lock(&self.store.flights);
        if Arc::strong_count(&self.flight) == 2 {
            flights.remove(&self.key);
        }
    }
}

/// A root being built under `tmp/`: removed if the build is dropped half-way (a
/// cancelled pull) unless [`BuildDir::keep`] took it.
struct BuildDir(Option<PathBuf>);

impl BuildDir {
    fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }
    fn keep(mut self) -> PathBuf {
        self.0.take().unwrap_or_default()
    }
}

impl Drop for BuildDir {
    fn drop(&mut self) {
        if let Some(p) = self.0.take()
            && let Err(e) = remove_any(&p)
        {
            tracing::warn!(dir = %p.display(), error = %e, "image store: removing a cancelled build");
        }
    }
}

impl ImageStore {
    /// Opens (or creates) the store in `dir`: half-built roots and partial blobs of an
    /// earlier run are removed, finished roots are taken back (oldest-used first by the
    /// time of their `image.json`).
    pub fn open(dir: &Path, limits: StoreLimits, http: reqwest::Client) -> std::io::Result<Self> {
        for sub in ["blobs/sha256", "roots", "tmp"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        let tmp = dir.join("tmp");
        for e in fs::read_dir(&tmp)? {
            remove_any(&e?.path())?;
        }
        for e in fs::read_dir(dir.join("blobs/sha256"))? {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "partial") {
                fs::remove_file(p)?;
            }
        }
        let mut found = Vec::new();
        for e in fs::read_dir(dir.join("roots"))? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let meta = fs::read(e.path().join("image.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<Meta>(&b).ok());
            match (Digest::from_hex(&name), meta) {
                (Ok(d), Some(m)) => {
                    // Mount points added since the root was unpacked (idempotent).
                    unpack::make_mount_points(
                        &e.path().join("rootfs"),
                        crate::sandbox::IMAGE_MOUNT_POINTS,
                    )?;
                    let when = fs::metadata(e.path().join("image.json"))
                        .and_then(|m| m.modified())
                        .ok();
                    found.push((when, d, m));
                }
                _ => remove_any(&e.path())?,
            }
        }
        found.sort_by_key(|(w, _, _)| *w);
        let mut state = State::default();
        for (_, d, m) in found {
            if let Some(index) = m.index {
                state.aliases.insert(index, d.clone());
            }
            state.clock += 1;
            state.images.insert(
                d,
                Cached {
                    config: m.config,
                    bytes: m.bytes,
                    last_used: state.clock,
                    pins: 0,
                },
            );
        }
        Ok(ImageStore(Arc::new(Inner {
            dir: dir.to_path_buf(),
            limits,
            http,
            state: Mutex::new(state),
            flights: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(0),
        })))
    }

    /// Bytes done and to do of the pull of `image` in flight, if one is.
    pub fn progress(&self, image: &ImageRef) -> Option<(u64, u64)> {
        let flights = lock(&self.0.flights);
        let f = flights.get(&image.to_string())?;
        Some((
            f.progress.done.load(Ordering::Relaxed),
            f.progress.total.load(Ordering::Relaxed),
        ))
    }

    /// The digests of the images stored, with whether each is in use.
    pub fn images(&self) -> Vec<(Digest, bool)> {
        let st = lock(&self.0.state);
        let mut v: Vec<_> = st
            .images
            .iter()
            .map(|(d, c)| (d.clone(), c.pins > 0))
            .collect();
        v.sort();
        v
    }

    /// Bytes of all unpacked roots.
    pub fn used_bytes(&self) -> u64 {
        lock(&self.0.state).images.values().map(|c| c.bytes).sum()
    }

    /// Pulls `image` (unless stored) and holds it. Concurrent pulls of the same reference
    /// wait for one another: the first fetches, the others then find it stored.
    /// `creds` go only to this image's registry (and its token realm).
    pub async fn pull(
        &self,
        image: &ImageRef,
        creds: Option<&Credentials>,
    ) -> Result<Image, PullError> {
        if let Some(d) = image.digest()
            && let Some(img) = self.hold(d)
        {
            return Ok(img);
        }
        let flight = self.flight(&image.to_string());
        let result = {
            let _turn = flight.lock.lock().await;
            match image.digest().and_then(|d| self.hold(d)) {
                Some(img) => Ok(img),
                None => self.fetch(image, creds, &flight.progress).await,
            }
        };
        drop(flight);
        let img = result?;
        self.collect();
        Ok(img)
    }

    /// The flight for `key`, joined or started; left when the answer is dropped (also
    /// when the pull is cancelled: a workload stopped while its image is pulled).
    fn flight(&self, key: &str) -> Boarded {
        let flight = lock(&self.0.flights)
            .entry(key.to_string())
            .or_insert_with(|| {
                Arc::new(Flight {
                    lock: tokio::sync::Mutex::new(()),
                    progress: Arc::new(Progress::default()),
                })
            })
            .clone();
        Boarded {
            store: self.0.clone(),
            key: key.to_string(),
            flight,
        }
    }

    /// Holds a stored image, if it is there.
    /// `digest` is the image's manifest digest or the digest of the index it was pulled
    /// from.
    pub fn hold(&self, digest: &Digest) -> Option<Image> {
        let mut st = lock(&self.0.state);
        st.clock += 1;
        let now = st.clock;
        let digest = match st.aliases.get(digest) {
            Some(manifest) => manifest.clone(),
            None => digest.clone(),
        };
        let c = st.images.get_mut(&digest)?;
        c.pins += 1;
        c.last_used = now;
        Some(Image {
            store: self.0.clone(),
            digest: digest.clone(),
            root: self.0.dir.join("roots").join(digest.hex()).join("rootfs"),
            config: c.config.clone(),
        })
    }

    async fn fetch(
        &self,
        image: &ImageRef,
        creds: Option<&Credentials>,
        progress: &Progress,
    ) -> Result<Image, PullError> {
        let mut session = Session::new(&self.0.http, image, creds);
        let manifest = session.manifest().await?;
        if manifest.top != manifest.digest {
            lock(&self.0.state)
                .aliases
                .insert(manifest.top.clone(), manifest.digest.clone());
        }
        // Two references (a tag and a digest) naming one image: one builds it, per digest.
        let same = self.flight(manifest.digest.as_str());
        let _turn = same.lock.lock().await;
        match self.hold(&manifest.digest) {
            Some(img) => Ok(img),
            None => self.build(&mut session, manifest, progress).await,
        }
    }

    async fn build(
        &self,
        session: &mut Session<'_>,
        manifest: super::client::Manifest,
        progress: &Progress,
    ) -> Result<Image, PullError> {
        let cap = self.0.limits.image.max_bytes;
        let total: u64 = manifest
            .layers
            .iter()
            .map(|l| l.size)
            .fold(manifest.config.size, u64::saturating_add);
        if total > cap {
            return Err(PullError::Refused(format!(
                "its layers are {total} bytes, past the cap of {cap}"
            )));
        }
        // From zero: an earlier try on this flight (failed, or cancelled) counted too.
        progress.done.store(0, Ordering::Relaxed);
        progress.total.store(total, Ordering::Relaxed);
        // Layers go to the root's build folder and go with it; configs stay in blobs/.
        let n = self.0.seq.fetch_add(1, Ordering::Relaxed);
        let mut build = BuildDir(Some(
            self.0
                .dir
                .join("tmp")
                .join(format!("{}-{n}", manifest.digest.hex())),
        ));
        let build_path = build.path().to_path_buf();
        tokio::fs::create_dir_all(build_path.join("layers")).await?;
        let blobs = self.0.dir.join("blobs/sha256");
        let config_path = blobs.join(manifest.config.digest.trim_start_matches("sha256:"));
        let built = self
            .fetch_and_unpack(session, &manifest, progress, &config_path, &build_path)
            .await;
        let (config, bytes) = match built {
            Ok(b) => b,
            Err(e) => {
                if let Some(b) = build.0.take() {
                    let _ = tokio::task::spawn_blocking(move || remove_any(&b)).await;
                }
                return Err(e);
            }
        };
        let build = build.keep();
        let meta = Meta {
            config: config.clone(),
            bytes,
            index: (manifest.top != manifest.digest).then(|| manifest.top.clone()),
        };
        fs::write(
            build.join("image.json"),
            serde_json::to_vec(&meta).map_err(|e| PullError::Io(std::io::Error::other(e)))?,
        )?;
        remove_any(&build.join("layers"))?;
        let root = self.0.dir.join("roots").join(manifest.digest.hex());
        remove_any(&root)?;
        fs::rename(&build, &root)?;
        let mut st = lock(&self.0.state);
        st.clock += 1;
        let now = st.clock;
        st.images.insert(
            manifest.digest.clone(),
            Cached {
                config: config.clone(),
                bytes,
                last_used: now,
                pins: 1,
            },
        );
        Ok(Image {
            store: self.0.clone(),
            digest: manifest.digest,
            root: root.join("rootfs"),
            config,
        })
    }

    /// Fetches the config (unless stored) and the layers into `build/layers`, and unpacks
    /// them into `build/rootfs`: the config and the bytes unpacked.
    async fn fetch_and_unpack(
        &self,
        session: &mut Session<'_>,
        manifest: &super::client::Manifest,
        progress: &Progress,
        config_path: &Path,
        build: &Path,
    ) -> Result<(ImageConfig, u64), PullError> {
        if !config_path.exists() {
            session
                .blob(&manifest.config, config_path, &progress.done)
                .await?;
        } else {
            progress
                .done
                .fetch_add(manifest.config.size, Ordering::Relaxed);
        }
        let document = tokio::fs::read(config_path).await?;
        let config = ImageConfig::from_document(&document)?;
        let diff_ids = diff_ids(&document)?;
        if diff_ids.len() != manifest.layers.len() {
            return Err(PullError::Refused(format!(
                "the config names {} layers, the manifest {}",
                diff_ids.len(),
                manifest.layers.len()
            )));
        }
        let mut layers = Vec::new();
        for (i, l) in manifest.layers.iter().enumerate() {
            let p = build.join("layers").join(i.to_string());
            session.blob(l, &p, &progress.done).await?;
            layers.push(p);
        }
        let limits = self.0.limits.image;
        let root = build.join("rootfs");
        let unpacked = tokio::task::spawn_blocking(move || -> Result<u64, PullError> {
            fs::create_dir_all(&root)?;
            fs::set_permissions(&root, fs::Permissions::from_mode(0o755))?;
            let mut tally = Tally::default();
            for (i, (l, want)) in layers.iter().zip(&diff_ids).enumerate() {
                let got = unpack::apply_layer_file(&root, l, limits, &mut tally)?;
                if want.strip_prefix("sha256:") != Some(got.as_str()) {
                    return Err(PullError::DigestMismatch {
                        what: format!("layer {i}'s uncompressed content"),
                        expected: want.clone(),
                        got: format!("sha256:{got}"),
                    });
                }
            }
            unpack::make_mount_points(&root, crate::sandbox::IMAGE_MOUNT_POINTS)?;
            Ok(tally.bytes)
        })
        .await
        .map_err(|e| PullError::Io(std::io::Error::other(e)))??;
        Ok((config, unpacked))
    }

    /// Removes least-recently-used images not in use until the roots fit the cache size.
    /// Answers the digests removed.
    pub fn collect(&self) -> Vec<Digest> {
        let mut gone = Vec::new();
        let mut st = lock(&self.0.state);
        let mut used: u64 = st.images.values().map(|c| c.bytes).sum();
        while used > self.0.limits.cache_bytes {
            let Some(victim) = st
                .images
                .iter()
                .filter(|(_, c)| c.pins == 0)
                .min_by_key(|(_, c)| c.last_used)
                .map(|(d, _)| d.clone())
            else {
                break;
            };
            if let Some(c) = st.images.remove(&victim) {
                used -= c.bytes;
            }
            st.aliases.retain(|_, manifest| *manifest != victim);
            // Moved aside under the lock, so a new pull of it never meets a half-removed root.
            let n = self.0.seq.fetch_add(1, Ordering::Relaxed);
            let aside = self
                .0
                .dir
                .join("tmp")
                .join(format!("gc-{}-{n}", victim.hex()));
            let root = self.0.dir.join("roots").join(victim.hex());
            match fs::rename(&root, &aside) {
                Ok(()) => {
                    if let Err(e) = remove_any(&aside) {
                        tracing::warn!(image = %victim, error = %e, "image store: removing a collected root");
                    }
                }
                Err(e) => {
                    tracing::warn!(image = %victim, error = %e, "image store: collecting a root");
                }
            }
            gone.push(victim);
        }
        gone
    }
}

fn remove_any(path: &Path) -> std::io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_nulls_and_ignores_the_rest() {
        let c = ImageConfig::from_document(
            br#"{"architecture":"amd64","config":{"Env":["PATH=/bin"],"Cmd":null,"User":"0","WorkingDir":"/w"}}"#,
        )
        .unwrap();
        assert_eq!(c.env, ["PATH=/bin"]);
        assert!(c.cmd.is_empty() && c.entrypoint.is_empty());
        assert_eq!((c.working_dir.as_str(), c.user.as_str()), ("/w", "0"));
        assert_eq!(
            ImageConfig::from_document(b"{}").unwrap(),
            ImageConfig::default()
        );
        assert!(ImageConfig::from_document(b"not json").is_err());
    }
}
