//! Container image references (issue 36), parsed once.
//!
//! A reference is `[registry/]repository[:tag][@sha256:<64 hex>]`, read the way `docker pull`
//! reads it: no registry means Docker Hub (`docker.io`), and a one-part Hub repository lives
//! under `library/` (`ubuntu` → `docker.io/library/ubuntu:latest`). The first `/`-separated
//! part is a registry only when it looks like a host (has a `.` or a `:port`, is
//! `localhost`, or has a capital letter), exactly docker's rule, so `team/model` stays a Hub
//! repository. Repository parts are lowercase `[a-z0-9]` words joined by `.`, `_`, `__` or
//! dashes; a tag is `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`; the only digest accepted is
//! `sha256:` with 64 lowercase hex digits (what every registry serves). Every error names
//! the field `image` (422). Pure: no I/O, builds for wasm.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::AppError;

/// Docker Hub, as references name it.
pub const DOCKER_HUB: &str = "docker.io";
/// The host Docker Hub's distribution API answers on.
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// The tag a reference with neither tag nor digest means.
pub const DEFAULT_TAG: &str = "latest";
/// Longest accepted reference (docker's name limit is 255; a tag and digest add to it).
pub const MAX_REFERENCE_LEN: usize = 512;

const FIELD: &str = "image";

fn bad(message: impl Into<String>) -> AppError {
    AppError::invalid(FIELD, message)
}

/// A content digest: `sha256:` and 64 lowercase hex digits.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// Reads `sha256:<64 lowercase hex>`; anything else is an `image` error.
    pub fn parse(text: &str) -> Result<Self, AppError> {
        let Some(hex) = text.strip_prefix("sha256:") else {
            return Err(bad(
                "the digest must be sha256:<64 hex digits> (no other algorithm is accepted)",
            ));
        };
        Self::from_hex(hex)
    }

    /// A digest from its 64 lowercase hex digits.
    pub fn from_hex(hex: &str) -> Result<Self, AppError> {
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad(
                "the digest must be sha256: and 64 lowercase hex digits",
            ));
        }
        Ok(Digest(format!("sha256:{hex}")))
    }

    /// The 64 hex digits (safe as a file name: checked on parse).
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.0)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Digest::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A parsed image reference. At least one of `tag` and `digest` is set (a bare name gets
/// `latest`); a reference with a digest is pinned, whatever its tag says.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ImageRef {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<Digest>,
}

impl ImageRef {
    /// Parses a reference (see the module doc). Surrounding whitespace is not accepted:
    /// the text is a value, not a form line.
    pub fn parse(text: &str) -> Result<Self, AppError> {
        if text.is_empty() {
            return Err(bad("must not be empty"));
        }
        if text.len() > MAX_REFERENCE_LEN {
            return Err(bad(format!("at most {MAX_REFERENCE_LEN} characters")));
        }
        if let Some(c) = text
            .chars()
            .find(|c| !c.is_ascii() || c.is_ascii_control() || c.is_ascii_whitespace())
        {
            return Err(bad(format!(
                "contains {}, which no image reference may",
                c.escape_debug()
            )));
        }
        let (rest, digest) = match text.split_once('@') {
            Some((rest, d)) => (rest, Some(Digest::parse(d)?)),
            None => (text, None),
        };
        // A tag follows the last `:` after the last `/` (a `:` before it is a port).
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => {
                let at = last_slash + i;
                (&rest[..at], Some(parse_tag(&rest[at + 1..])?))
            }
            None => (rest, None),
        };
        if name.is_empty() {
            return Err(bad("the repository name is missing"));
        }
        let (registry, path) = split_registry(name);
        if let Some(registry) = registry {
            check_registry(registry)?;
        }
        check_repository(path)?;
        let registry = match registry {
            None | Some("index.docker.io") => DOCKER_HUB.to_string(),
            Some(r) => r.to_string(),
        };
        let repository = if registry == DOCKER_HUB && !path.contains('/') {
            format!("library/{path}")
        } else {
            path.to_string()
        };
        if registry.len() + 1 + repository.len() > 255 {
            return Err(bad("the name is longer than 255 characters"));
        }
        let tag = match (&tag, &digest) {
            (None, None) => Some(DEFAULT_TAG.to_string()),
            _ => tag,
        };
        Ok(ImageRef {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The registry as the reference names it (`docker.io` for Docker Hub).
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The host (and port) whose distribution API serves this image.
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// The repository path, e.g. `library/ubuntu`.
    pub fn repository(&self) -> &str {
        &self.repository
    }

    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// Whether the reference names exactly one image (has a digest).
    pub fn is_pinned(&self) -> bool {
        self.digest.is_some()
    }

    /// What to ask the registry's manifest endpoint for: the digest when pinned, else the tag.
    pub fn manifest_reference(&self) -> &str {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.as_str(),
            (None, Some(t)) => t,
            (None, None) => DEFAULT_TAG,
        }
    }

    /// The same image pinned to `digest` (the tag is dropped: a pinned reference never
    /// names a tag that could move).
    pub fn pinned(&self, digest: Digest) -> Self {
        ImageRef {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            tag: None,
            digest: Some(digest),
        }
    }
}

impl fmt::Display for ImageRef {
    /// The canonical text: `registry/repository[:tag][@digest]`; parsing it gives the same value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ImageRef({self})")
    }
}

impl std::str::FromStr for ImageRef {
    type Err = AppError;
    fn from_str(s: &str) -> Result<Self, AppError> {
        ImageRef::parse(s)
    }
}

impl Serialize for ImageRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ImageRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ImageRef::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Docker's rule: the first part is a registry when it has a `.` or `:`, is `localhost`,
/// or has a capital letter; otherwise the whole name is a Docker Hub repository.
fn split_registry(name: &str) -> (Option<&str>, &str) {
    match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.bytes().any(|b| b.is_ascii_uppercase()) =>
        {
            (Some(first), rest)
        }
        _ => (None, name),
    }
}

fn check_registry(registry: &str) -> Result<(), AppError> {
    let (host, port) = match registry.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (registry, None),
    };
    if let Some(p) = port
        && (p.is_empty()
            || p.len() > 5
            || !p.bytes().all(|b| b.is_ascii_digit())
            || p.parse::<u32>().map_or(true, |n| n == 0 || n > 65535))
    {
        return Err(bad(format!(
            "the registry's port `{p}` is not a port number"
        )));
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
        return Err(bad(format!("`{registry}` is not a registry host name")));
    }
    Ok(())
}

fn check_repository(path: &str) -> Result<(), AppError> {
    for part in path.split('/') {
        if !repository_part_ok(part) {
            return Err(bad(format!(
                "`{part}` is not a repository name part (lowercase letters and digits, \
                 joined by `.`, `_`, `__` or dashes)"
            )));
        }
    }
    Ok(())
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
fn repository_part_ok(part: &str) -> bool {
    let b = part.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &part[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-')) {
            return false;
        }
    }
    true
}

fn parse_tag(tag: &str) -> Result<String, AppError> {
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let b = tag.as_bytes();
    if b.is_empty()
        || b.len() > 128
        || !word(b[0])
        || !b.iter().all(|&c| word(c) || c == b'.' || c == b'-')
    {
        return Err(bad(format!(
            "`{tag}` is not a tag (letters, digits, `_`, `.`, `-`; at most 128, not starting \
             with `.` or `-`)"
        )));
    }
    Ok(tag.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn parse(s: &str) -> ImageRef {
        ImageRef::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn refused(s: &str) -> String {
        match ImageRef::parse(s) {
            Ok(r) => panic!("{s:?} was accepted as {r}"),
            Err(e) => {
                assert_eq!(e.field(), Some("image"), "{s:?}: {e}");
                e.to_string()
            }
        }
    }

    #[test]
    fn docker_defaults() {
        let r = parse("ubuntu");
        assert_eq!(
            (r.registry(), r.repository(), r.tag(), r.digest()),
            (DOCKER_HUB, "library/ubuntu", Some("latest"), None)
        );
        assert_eq!(r.api_host(), DOCKER_HUB_API);
        assert_eq!(r.to_string(), "docker.io/library/ubuntu:latest");
        let r = parse("team/model:v2");
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            (DOCKER_HUB, "team/model", Some("v2"))
        );
        let r = parse("index.docker.io/pytorch");
        assert_eq!(
            (r.registry(), r.repository()),
            (DOCKER_HUB, "library/pytorch")
        );
    }

    #[test]
    fn registries_ports_tags_and_digests() {
        let r = parse("localhost:5000/a/b:1.0");
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("localhost:5000", "a/b", Some("1.0"))
        );
        assert_eq!(r.api_host(), "localhost:5000");
        let r = parse("localhost/x");
        assert_eq!((r.registry(), r.repository()), ("localhost", "x"));
        let r = parse("nvcr.io/nvidia/pytorch:24.05-py3");
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("nvcr.io", "nvidia/pytorch", Some("24.05-py3"))
        );
        // A capital letter in the first part makes it a host, as in docker.
        let r = parse("Registry/x");
        assert_eq!(r.registry(), "Registry");

        let pinned = parse(&format!("ghcr.io/org/img@sha256:{HEX}"));
        assert_eq!(pinned.tag(), None);
        assert!(pinned.is_pinned());
        assert_eq!(pinned.digest().unwrap().hex(), HEX);
        assert_eq!(pinned.manifest_reference(), format!("sha256:{HEX}"));
        let both = parse(&format!("127.0.0.1:5000/img:v1@sha256:{HEX}"));
        assert_eq!((both.tag(), both.is_pinned()), (Some("v1"), true));
        assert_eq!(both.manifest_reference(), format!("sha256:{HEX}"));
        assert_eq!(parse("img:v1").manifest_reference(), "v1");

        let moved = parse("img:v1").pinned(Digest::from_hex(HEX).unwrap());
        assert_eq!(
            moved.to_string(),
            format!("docker.io/library/img@sha256:{HEX}")
        );
    }

    #[test]
    fn canonical_text_round_trips() {
        for s in [
            "ubuntu",
            "a.b/c/d-e__f.g:T_1.x-y",
            "localhost:5000/x:1",
            &format!("r.io:443/x/y:t@sha256:{HEX}"),
        ] {
            let r = parse(s);
            assert_eq!(parse(&r.to_string()), r, "{s}");
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<ImageRef>(&json).unwrap(), r);
        }
        assert!(serde_json::from_str::<ImageRef>("\"UPPER\"").is_err());
    }

    #[test]
    fn bad_text_names_the_field() {
        let cases = [
            "",
            " ubuntu",
            "ubuntu ",
            "ubu ntu",
            "UPPER",
            "team/Upper",
            "a//b",
            "/abs",
            "trailing/",
            "-lead",
            "a..b",
            "a___b",
            "x:",
            "x:-tag",
            "x:.tag",
            "x:t/ag",
            "x@",
            "x@sha256:abc",
            "x@sha512:abc",
            "x@md5:00",
            "r.io:0/x",
            "r.io:99999/x",
            "r.io:p0rt/x",
            "-r.io/x",
            "r..io/x",
            "../etc/passwd",
            "docker.io/../../x",
            "x/./y",
            "x\u{0}y",
            "x\ny",
            "x\u{202e}y",
            "imäge",
            "x%2f..",
        ];
        for s in cases {
            refused(s);
        }
        refused(&format!("x@sha256:{}", HEX.to_uppercase()));
        refused(&format!("x@sha256:{HEX}0"));
        refused(&format!("x:{}", "t".repeat(129)));
        refused(&"a".repeat(MAX_REFERENCE_LEN + 1));
        refused(&format!("{}/x", "r".repeat(64) + ".io"));
        assert!(refused("x@sha512:abc").contains("sha256"));
    }

    #[test]
    fn digests() {
        let d = Digest::parse(&format!("sha256:{HEX}")).unwrap();
        assert_eq!(d.as_str(), format!("sha256:{HEX}"));
        assert_eq!(format!("{d:?}"), format!("Digest(sha256:{HEX})"));
        for bad in [
            "",
            "sha256:",
            &format!("sha256:{}", &HEX[1..]),
            &format!("sha256:{}../", &HEX[3..]),
        ] {
            assert_eq!(Digest::parse(bad).unwrap_err().field(), Some("image"));
        }
    }
}
