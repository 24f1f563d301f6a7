//! Safe layer unpacking: a layer is a tar archive (plain or gzip) applied on top of an
//! image root. Nothing from the archive decides where a write lands outside that root.
//!
//! - A path with `..` or a leading `/` refuses the whole layer (no image needs one).
//! - Every parent directory of an entry is looked up one component at a time with
//!   `symlink_metadata` from the root: a parent that is a symlink refuses the layer (so a
//!   symlink in the image, pointing anywhere, can never be written *through*; at run time
//!   symlinks resolve inside the container, whose root is the image). A missing parent is
//!   created as a directory.
//! - The entry itself replaces whatever was at its path (a symlink there is removed, not
//!   followed; files are created with `O_EXCL`, which does not follow links).
//! - Hard links must name a regular file already in the root, found the same way.
//! - setuid, setgid (and sticky on files) are stripped; devices, FIFOs and other special
//!   files are skipped; owners, xattrs (file capabilities too) and times are not applied:
//!   everything belongs to the agent's user, and the workload runs as its team's uid.
//! - Whiteouts (`.wh.<name>`) remove `<name>` from lower layers; an opaque marker
//!   (`.wh..wh..opq`) empties its directory of what lower layers put there.
//! - A cap on the bytes and entries one image may unpack to; past it the layer fails (the
//!   caller removes the half-built root).
//!
//! The unpack runs before any workload can see the root, and only the agent writes in it,
//! so the checks cannot be raced by the image.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Why a layer was refused.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("layer refused: {0}")]
    Hostile(String),
    #[error("the image unpacks to more than the cap of {cap} bytes")]
    TooLarge { cap: u64 },
    #[error("the image has more than {cap} files")]
    TooManyEntries { cap: u64 },
    #[error("layer compression not supported: {0}")]
    Unsupported(String),
    #[error("unpacking failed: {0}")]
    Io(#[from] io::Error),
}

fn hostile(m: impl Into<String>) -> UnpackError {
    UnpackError::Hostile(m.into())
}

/// Limits for one image (all its layers together).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_bytes: u64,
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 20 << 30,
            max_entries: 2_000_000,
        }
    }
}

/// What unpacking an image's layers did so far (carried from layer to layer).
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Bytes of entry data read (regular files written, and what skipped entries carried).
    pub bytes: u64,
    pub entries: u64,
    /// Special files (devices, FIFOs, …) that were skipped.
    pub skipped_special: u64,
    /// Entries whose setuid/setgid/sticky bits were dropped.
    pub stripped_modes: u64,
}

/// Applies one layer file (gzip or plain tar, told by its first bytes) to `root`; answers
/// the sha256 (hex) of the uncompressed tar stream, the layer's `diff_id`.
pub fn apply_layer_file(
    root: &Path,
    layer: &Path,
    limits: Limits,
    tally: &mut Tally,
) -> Result<String, UnpackError> {
    let mut file = BufReader::with_capacity(1 << 20, File::open(layer)?);
    let mut magic = [0u8; 4];
    let n = read_up_to(&mut file, &mut magic)?;
    let head = io::Cursor::new(magic[..n].to_vec());
    let reader = head.chain(file);
    let hashed = match magic[..n] {
        [0x1f, 0x8b, ..] => apply_tar(
            root,
            Hashing::new(flate2::read::GzDecoder::new(reader)),
            limits,
            tally,
        )?
        .finish()?,
        [0x28, 0xb5, 0x2f, 0xfd] => return Err(UnpackError::Unsupported("zstd".into())),
        _ => apply_tar(root, Hashing::new(reader), limits, tally)?.finish()?,
    };
    Ok(hashed)
}

/// A reader that hashes what passes through it.
struct Hashing<R> {
    inner: R,
    hasher: sha2::Sha256,
}

impl<R: Read> Hashing<R> {
    fn new(inner: R) -> Self {
        Hashing {
            inner,
            hasher: sha2::Digest::new(),
        }
    }

    /// Reads the rest (the archive's end blocks and any padding) and answers the hex digest.
    fn finish(mut self) -> io::Result<String> {
        io::copy(&mut self, &mut io::sink())?;
        Ok(crate::client::hex(&sha2::Digest::finalize(self.hasher)))
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        sha2::Digest::update(&mut self.hasher, &buf[..n]);
        Ok(n)
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Applies one uncompressed tar stream to `root` (see the module doc).
pub fn apply_layer(
    root: &Path,
    reader: impl Read,
    limits: Limits,
    tally: &mut Tally,
) -> Result<(), UnpackError> {
    apply_tar(root, reader, limits, tally).map(drop)
}

/// [`apply_layer`], giving the reader back (positioned after the last entry).
fn apply_tar<R: Read>(
    root: &Path,
    reader: R,
    limits: Limits,
    tally: &mut Tally,
) -> Result<R, UnpackError> {
    let mut archive = tar::Archive::new(reader);
    // Paths this layer wrote: an opaque marker or whiteout only hides lower layers.
    let mut this_layer: HashSet<PathBuf> = HashSet::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader | tar::EntryType::GNULongName
        ) {
            continue;
        }
        tally.entries += 1;
        if tally.entries > limits.max_entries {
            return Err(UnpackError::TooManyEntries {
                cap: limits.max_entries,
            });
        }
        // Every entry's data counts, a skipped one's too (it is still decompressed and read).
        let size = entry.size();
        if tally.bytes.saturating_add(size) > limits.max_bytes {
            return Err(UnpackError::TooLarge {
                cap: limits.max_bytes,
            });
        }
        tally.bytes += size;
        let raw = entry.path()?.into_owned();
        let rel = clean(&raw)?;
        let Some(name) = rel.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            // The root itself (`./`): nothing to do; its mode stays the store's.
            continue;
        };
        let parent_rel = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        let parent = walk_parents(root, &parent_rel)?;

        if name == ".wh..wh..opq" {
            opaque(&parent, &parent_rel, &this_layer)?;
            continue;
        }
        if let Some(hidden) = name.strip_prefix(".wh.") {
            if hidden.is_empty() || hidden == "." || hidden == ".." || hidden.contains('/') {
                return Err(hostile(format!("bad whiteout {}", raw.display())));
            }
            let target = parent.join(hidden);
            if !this_layer.contains(&parent_rel.join(hidden)) {
                remove_any(&target)?;
            }
            continue;
        }

        let dest = parent.join(&name);
        let mode = entry.header().mode().unwrap_or(0o644);
        let keep = if kind == tar::EntryType::Directory {
            0o1777
        } else {
            0o777
        };
        if mode & !keep & 0o7777 != 0 {
            tally.stripped_modes += 1;
        }
        let mode = mode & keep;
        match kind {
            tar::EntryType::Directory => {
                match fs::symlink_metadata(&dest) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        remove_any(&dest)?;
                        fs::create_dir(&dest)?;
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir(&dest)?,
                    Err(e) => return Err(e.into()),
                }
                // The agent (owner) keeps rwx so later layers can write beneath it.
                fs::set_permissions(&dest, fs::Permissions::from_mode(mode | 0o700))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                remove_any(&dest)?;
                let mut out = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .mode(0o600)
                    .open(&dest)?;
                io::copy(&mut (&mut entry).take(size), &mut out)?;
                out.set_permissions(fs::Permissions::from_mode(mode))?;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()?
                    .ok_or_else(|| hostile(format!("symlink {} has no target", raw.display())))?;
                remove_any(&dest)?;
                std::os::unix::fs::symlink(&target, &dest)?;
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()?
                    .ok_or_else(|| hostile(format!("hard link {} has no target", raw.display())))?;
                let target_rel = clean(&target)?;
                let target_parent =
                    walk_parents(root, target_rel.parent().unwrap_or(Path::new("")))?;
                let source = match target_rel.file_name() {
                    Some(n) => target_parent.join(n),
                    None => return Err(hostile("hard link to the image root")),
                };
                match fs::symlink_metadata(&source) {
                    Ok(m) if m.file_type().is_file() => {}
                    _ => {
                        return Err(hostile(format!(
                            "hard link {} to {}, which is not a file of the image",
                            raw.display(),
                            target.display()
                        )));
                    }
                }
                if source != dest {
                    remove_any(&dest)?;
                    fs::hard_link(&source, &dest)?;
                }
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                tally.skipped_special += 1;
                continue;
            }
            other => {
                return Err(hostile(format!(
                    "entry {} of unsupported type {other:?}",
                    raw.display()
                )));
            }
        }
        this_layer.insert(rel);
    }
    Ok(archive.into_inner())
}

/// The archive path as components under the root: `.` dropped, `..` or an absolute path
/// refused.
fn clean(path: &Path) -> Result<PathBuf, UnpackError> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(hostile(format!("path {} climbs with ..", path.display())));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(hostile(format!("absolute path {}", path.display())));
            }
        }
    }
    Ok(out)
}

/// The directory `rel` (already clean) under `root`, each component checked without
/// following links: an existing symlink refuses, a missing directory is created.
fn walk_parents(root: &Path, rel: &Path) -> Result<PathBuf, UnpackError> {
    let mut at = root.to_path_buf();
    for c in rel.components() {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(m) if m.file_type().is_symlink() => {
                return Err(hostile(format!(
                    "{} is a symlink; nothing is written through one",
                    rel.display()
                )));
            }
            Ok(_) => {
                return Err(hostile(format!("{} is not a directory", rel.display())));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&at)?;
                fs::set_permissions(&at, fs::Permissions::from_mode(0o755))?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(at)
}

/// Makes each of `dirs` (relative, clean) a plain directory in `root`, whatever the image
/// put there: a symlink or file on the way is replaced, never followed. The sandbox mounts
/// over these, so the runtime has nothing to create or resolve in a shared root.
pub fn make_mount_points(root: &Path, dirs: &[&str]) -> io::Result<()> {
    for d in dirs {
        let mut at = root.to_path_buf();
        for c in Path::new(d).components() {
            let Component::Normal(c) = c else {
                return Err(io::Error::other(format!(
                    "mount point {d} is not a plain path"
                )));
            };
            at.push(c);
            match fs::symlink_metadata(&at) {
                Ok(m) if m.is_dir() => continue,
                Ok(_) => remove_any(&at)?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            fs::create_dir(&at)?;
            fs::set_permissions(&at, fs::Permissions::from_mode(0o755))?;
        }
    }
    Ok(())
}

/// Removes whatever is at `path` (a directory with its contents; a symlink itself, never
/// its target). Missing is fine.
fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn opaque(dir: &Path, dir_rel: &Path, this_layer: &HashSet<PathBuf>) -> io::Result<()> {
    for child in fs::read_dir(dir)? {
        let child = child?;
        if !this_layer.contains(&dir_rel.join(child.file_name())) {
            remove_any(&child.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A tar archive built in memory, entry by entry, with headers written raw so hostile
    /// names get through (the tar crate's `append_path` would refuse `..`).
    struct Layer(tar::Builder<Vec<u8>>);

    impl Layer {
        fn new() -> Self {
            Layer(tar::Builder::new(Vec::new()))
        }
        fn header(kind: tar::EntryType, path: &str, mode: u32, size: u64) -> tar::Header {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            // set_path refuses `..`; write the name bytes directly.
            let name = &mut h.as_old_mut().name;
            name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_mode(mode);
            h.set_size(size);
            h.set_cksum();
            h
        }
        fn file(mut self, path: &str, mode: u32, body: &[u8]) -> Self {
            let h = Self::header(tar::EntryType::Regular, path, mode, body.len() as u64);
            self.0.append(&h, body).unwrap();
            self
        }
        fn dir(mut self, path: &str) -> Self {
            let h = Self::header(tar::EntryType::Directory, path, 0o755, 0);
            self.0.append(&h, io::empty()).unwrap();
            self
        }
        fn link(mut self, kind: tar::EntryType, path: &str, target: &str) -> Self {
            let mut h = Self::header(kind, path, 0o777, 0);
            let name = &mut h.as_old_mut().linkname;
            name[..target.len()].copy_from_slice(target.as_bytes());
            h.set_cksum();
            self.0.append(&h, io::empty()).unwrap();
            self
        }
        fn special(mut self, kind: tar::EntryType, path: &str) -> Self {
            let h = Self::header(kind, path, 0o666, 0);
            self.0.append(&h, io::empty()).unwrap();
            self
        }
        fn bytes(self) -> Vec<u8> {
            self.0.into_inner().unwrap()
        }
    }

    /// A temp dir holding the image root and, beside it, a host file the layers aim at.
    struct Scene {
        dir: tempfile::TempDir,
    }

    impl Scene {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            fs::create_dir(dir.path().join("root")).unwrap();
            fs::write(dir.path().join("host-secret"), b"host").unwrap();
            Scene { dir }
        }
        fn root(&self) -> PathBuf {
            self.dir.path().join("root")
        }
        fn apply(&self, layer: Layer) -> Result<Tally, UnpackError> {
            self.apply_with(layer, Limits::default())
        }
        fn apply_with(&self, layer: Layer, limits: Limits) -> Result<Tally, UnpackError> {
            let mut t = Tally::default();
            apply_layer(&self.root(), io::Cursor::new(layer.bytes()), limits, &mut t).map(|()| t)
        }
        /// Every path under the temp dir outside the root, with the host file's content:
        /// what a layer must never change.
        fn outside(&self) -> Vec<String> {
            let mut names: Vec<String> = fs::read_dir(self.dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names.push(fs::read_to_string(self.dir.path().join("host-secret")).unwrap());
            names
        }
        fn assert_untouched(&self) {
            assert_eq!(self.outside(), ["host-secret", "root", "host"]);
        }
    }

    fn refused(r: Result<Tally, UnpackError>) -> String {
        match r {
            Err(e @ UnpackError::Hostile(_)) => e.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn plain_layers_unpack() {
        let s = Scene::new();
        let t = s
            .apply(
                Layer::new()
                    .dir("./etc/")
                    .file("./etc/os-release", 0o644, b"ID=tessera\n")
                    .file("bin/tool", 0o755, b"#!/bin/sh\n")
                    .link(tar::EntryType::Symlink, "bin/alias", "/bin/tool")
                    .link(tar::EntryType::Link, "bin/hard", "bin/tool"),
            )
            .unwrap();
        let root = s.root();
        assert_eq!(
            fs::read_to_string(root.join("etc/os-release")).unwrap(),
            "ID=tessera\n"
        );
        assert_eq!(
            fs::metadata(root.join("bin/tool")).unwrap().mode() & 0o7777,
            0o755
        );
        assert_eq!(
            fs::read_link(root.join("bin/alias")).unwrap(),
            Path::new("/bin/tool")
        );
        assert_eq!(
            fs::metadata(root.join("bin/hard")).unwrap().ino(),
            fs::metadata(root.join("bin/tool")).unwrap().ino()
        );
        assert_eq!((t.bytes, t.entries), (21, 5));
        s.assert_untouched();
    }

    #[test]
    fn parent_paths_are_refused() {
        let s = Scene::new();
        let e = refused(s.apply(Layer::new().file("../host-secret", 0o644, b"pwned")));
        assert!(e.contains(".."), "{e}");
        refused(s.apply(Layer::new().file("a/../../host-secret", 0o644, b"pwned")));
        s.assert_untouched();
    }

    #[test]
    fn absolute_paths_are_refused() {
        let s = Scene::new();
        let target = s.dir.path().join("host-secret");
        let e = refused(s.apply(Layer::new().file(target.to_str().unwrap(), 0o644, b"pwned")));
        assert!(e.contains("absolute"), "{e}");
        s.assert_untouched();
    }

    #[test]
    fn writing_through_a_symlink_is_refused() {
        let s = Scene::new();
        let outside = s.dir.path().to_str().unwrap().to_string();
        // Same layer: a symlink to the host dir, then a file through it.
        let e = refused(
            s.apply(
                Layer::new()
                    .link(tar::EntryType::Symlink, "escape", &outside)
                    .file("escape/host-secret", 0o644, b"pwned"),
            ),
        );
        assert!(e.contains("symlink"), "{e}");
        // Across layers, and with a relative target.
        let s = Scene::new();
        s.apply(Layer::new().link(tar::EntryType::Symlink, "up", ".."))
            .unwrap();
        refused(s.apply(Layer::new().file("up/host-secret", 0o644, b"pwned")));
        refused(s.apply(Layer::new().dir("up/new")));
        // A whiteout through a symlink removes nothing outside.
        refused(s.apply(Layer::new().file("up/.wh.host-secret", 0o644, b"")));
        s.assert_untouched();
        // Replacing the symlink itself is fine and does not touch its target.
        s.apply(Layer::new().file("up", 0o644, b"now a file"))
            .unwrap();
        assert_eq!(
            fs::read_to_string(s.root().join("up")).unwrap(),
            "now a file"
        );
        s.assert_untouched();
    }

    #[test]
    fn a_file_replacing_a_symlink_does_not_follow_it() {
        let s = Scene::new();
        let target = s.dir.path().join("host-secret");
        s.apply(Layer::new().link(tar::EntryType::Symlink, "f", target.to_str().unwrap()))
            .unwrap();
        s.apply(Layer::new().file("f", 0o644, b"pwned")).unwrap();
        assert_eq!(fs::read_to_string(s.root().join("f")).unwrap(), "pwned");
        s.assert_untouched();
    }

    #[test]
    fn hard_links_to_host_files_are_refused() {
        let s = Scene::new();
        let host = s.dir.path().join("host-secret");
        refused(s.apply(Layer::new().link(tar::EntryType::Link, "h", host.to_str().unwrap())));
        refused(s.apply(Layer::new().link(tar::EntryType::Link, "h", "../host-secret")));
        // Through a symlinked directory inside the image.
        s.apply(Layer::new().link(tar::EntryType::Symlink, "up", ".."))
            .unwrap();
        refused(s.apply(Layer::new().link(tar::EntryType::Link, "h", "up/host-secret")));
        // To something that is not a file of the image.
        refused(s.apply(Layer::new().link(tar::EntryType::Link, "h", "missing")));
        assert!(fs::symlink_metadata(s.root().join("h")).is_err());
        s.assert_untouched();
    }

    #[test]
    fn setuid_and_setgid_are_stripped() {
        let s = Scene::new();
        let t = s
            .apply(
                Layer::new()
                    .file("bin/su", 0o4755, b"x")
                    .file("bin/wall", 0o2755, b"x")
                    .dir("tmp/"),
            )
            .unwrap();
        let mode = |p: &str| fs::metadata(s.root().join(p)).unwrap().mode() & 0o7777;
        assert_eq!((mode("bin/su"), mode("bin/wall")), (0o755, 0o755));
        assert_eq!(t.stripped_modes, 2);
    }

    #[test]
    fn devices_and_fifos_are_skipped() {
        let s = Scene::new();
        let t = s
            .apply(
                Layer::new()
                    .special(tar::EntryType::Char, "dev/mem")
                    .special(tar::EntryType::Block, "dev/sda")
                    .special(tar::EntryType::Fifo, "pipe")
                    .file("ok", 0o644, b"x"),
            )
            .unwrap();
        assert_eq!(t.skipped_special, 3);
        for p in ["dev/mem", "dev/sda", "pipe"] {
            assert!(fs::symlink_metadata(s.root().join(p)).is_err(), "{p}");
        }
        assert!(s.root().join("ok").is_file());
    }

    #[test]
    fn a_layer_past_the_cap_fails() {
        let s = Scene::new();
        let limits = Limits {
            max_bytes: 1000,
            max_entries: 100,
        };
        let big = vec![7u8; 600];
        let r = s.apply_with(
            Layer::new().file("a", 0o644, &big).file("b", 0o644, &big),
            limits,
        );
        assert!(
            matches!(r, Err(UnpackError::TooLarge { cap: 1000 })),
            "{r:?}"
        );
        // The second file was never written.
        assert!(fs::symlink_metadata(s.root().join("b")).is_err());
        // Data carried by an entry that is skipped counts too.
        let mut h = Layer::header(tar::EntryType::Char, "dev/big", 0o666, 1200);
        h.set_cksum();
        let mut l = Layer::new();
        l.0.append(&h, &vec![0u8; 1200][..]).unwrap();
        let r = s.apply_with(l, limits);
        assert!(
            matches!(r, Err(UnpackError::TooLarge { cap: 1000 })),
            "{r:?}"
        );
        let mut many = Layer::new();
        for i in 0..101 {
            many = many.file(&format!("f{i}"), 0o644, b"");
        }
        let r = s.apply_with(many, limits);
        assert!(
            matches!(r, Err(UnpackError::TooManyEntries { cap: 100 })),
            "{r:?}"
        );
        s.assert_untouched();
    }

    #[test]
    fn whiteouts_and_opaque_dirs() {
        let s = Scene::new();
        s.apply(
            Layer::new()
                .file("etc/keep", 0o644, b"1")
                .file("etc/gone", 0o644, b"1")
                .file("etc/sub/deep", 0o644, b"1")
                .file("opt/old", 0o644, b"1"),
        )
        .unwrap();
        s.apply(
            Layer::new()
                .file("etc/.wh.gone", 0o644, b"")
                .file("etc/.wh.sub", 0o644, b"")
                .file("opt/new", 0o644, b"2")
                .file("opt/.wh..wh..opq", 0o644, b""),
        )
        .unwrap();
        let root = s.root();
        assert!(root.join("etc/keep").exists());
        assert!(!root.join("etc/gone").exists());
        assert!(!root.join("etc/sub").exists());
        assert!(!root.join("opt/old").exists());
        assert!(
            root.join("opt/new").exists(),
            "the opaque layer's own files stay"
        );
        assert!(!root.join("etc/.wh.gone").exists());
        refused(s.apply(Layer::new().file("etc/.wh...", 0o644, b"")));
        s.assert_untouched();
    }

    #[test]
    fn mount_points_become_plain_directories() {
        let s = Scene::new();
        let outside = s.dir.path().to_str().unwrap().to_string();
        s.apply(
            Layer::new()
                .link(tar::EntryType::Symlink, "tmp", &outside)
                .link(tar::EntryType::Symlink, "run", "/")
                .file("workspace", 0o644, b"x"),
        )
        .unwrap();
        make_mount_points(&s.root(), &["proc", "tmp", "workspace", "run/tessera"]).unwrap();
        for d in ["proc", "tmp", "workspace", "run", "run/tessera"] {
            let m = fs::symlink_metadata(s.root().join(d)).unwrap();
            assert!(m.is_dir() && !m.file_type().is_symlink(), "{d}");
        }
        s.assert_untouched();
    }

    #[test]
    fn gzip_layers_are_read_by_their_magic() {
        let s = Scene::new();
        let tar = Layer::new().file("z", 0o644, b"zipped").bytes();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, &tar).unwrap();
        let path = s.dir.path().join("layer.gz");
        fs::write(&path, gz.finish().unwrap()).unwrap();
        let diff_id =
            apply_layer_file(&s.root(), &path, Limits::default(), &mut Tally::default()).unwrap();
        // The diff_id is the digest of the whole uncompressed stream, end blocks included.
        assert_eq!(
            diff_id,
            crate::client::hex(&sha2::Digest::finalize(
                <sha2::Sha256 as sha2::Digest>::new_with_prefix(&tar)
            ))
        );
        assert_eq!(fs::read_to_string(s.root().join("z")).unwrap(), "zipped");
        fs::write(&path, [0x28, 0xb5, 0x2f, 0xfd, 0, 0]).unwrap();
        let r = apply_layer_file(&s.root(), &path, Limits::default(), &mut Tally::default());
        assert!(matches!(r, Err(UnpackError::Unsupported(_))), "{r:?}");
    }
}
