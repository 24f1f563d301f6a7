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

/// A CUDA version as the driver reports what it supports (`nvidia-smi`'s "CUDA Version",
/// NVML's `sys_cuda_driver_version`) and as an image says what it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CudaVersion {
    pub major: u16,
    pub minor: u16,
}

impl CudaVersion {
    /// `12.4` or `12.4.1` (the patch is ignored: drivers support whole minor versions).
    pub fn parse(text: &str) -> Result<Self, AppError> {
        let bad = || AppError::invalid("cuda", format!("{text:?} is not a CUDA version like 12.4"));
        let mut parts = text.trim().split('.');
        let num = |p: Option<&str>| -> Result<u16, AppError> {
            let p = p.ok_or_else(bad)?;
            if p.is_empty() || p.len() > 4 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            p.parse().map_err(|_| bad())
        };
        let major = num(parts.next())?;
        let minor = num(parts.next())?;
        if let Some(patch) = parts.next() {
            num(Some(patch))?;
        }
        if parts.next().is_some() || major == 0 {
            return Err(bad());
        }
        Ok(CudaVersion { major, minor })
    }

    /// From NVML's integer form (`12040` = 12.4).
    pub fn from_nvml(v: i32) -> Option<Self> {
        (v > 0).then(|| CudaVersion {
            major: u16::try_from(v / 1000).unwrap_or(u16::MAX),
            minor: u16::try_from((v % 1000) / 10).unwrap_or(0),
        })
    }

    /// What an image needs, from its config's `Env`: NVIDIA's images say it in
    /// `NVIDIA_REQUIRE_CUDA` (`cuda>=12.4 brand=tesla,driver>=470,…`; the first `cuda>=`
    /// term counts), older ones only in `CUDA_VERSION` (`12.4.1`). `None`: the image says
    /// nothing (it runs on any driver, or has no CUDA).
    pub fn required_by(env: &[String]) -> Option<Self> {
        let get = |key: &str| {
            env.iter()
                .find_map(|e| e.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        };
        if let Some(req) = get("NVIDIA_REQUIRE_CUDA")
            && let Some(v) = req
                .split([' ', ','])
                .find_map(|t| t.strip_prefix("cuda>="))
                .and_then(|v| CudaVersion::parse(v).ok())
        {
            return Some(v);
        }
        get("CUDA_VERSION").and_then(|v| CudaVersion::parse(v).ok())
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl TryFrom<String> for CudaVersion {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        CudaVersion::parse(&s).map_err(|e| e.to_string())
    }
}

impl From<CudaVersion> for String {
    fn from(v: CudaVersion) -> String {
        v.to_string()
    }
}

/// Where images may come from: platform admins list `registry` or `registry/repository
/// prefix` entries (`ghcr.io/acme`, `nvcr.io/nvidia`); an image is allowed when one entry
/// is its registry and a whole-part prefix of its repository (`ghcr.io/acme` allows
/// `ghcr.io/acme/torch`, not `ghcr.io/acme-evil/x`). An empty list allows nothing.
pub fn allowed_by(entries: &[String], image: &ImageRef) -> Result<(), AppError> {
    let ok = entries.iter().any(|e| {
        let (registry, prefix) = e.split_once('/').unwrap_or((e.as_str(), ""));
        registry.eq_ignore_ascii_case(image.registry())
            && (prefix.is_empty()
                || image.repository() == prefix
                || image
                    .repository()
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('/')))
    });
    if ok {
        return Ok(());
    }
    let allowed = if entries.is_empty() {
        "no registry is allowed yet (a platform admin adds them under Admin → Images)".to_owned()
    } else {
        format!("allowed: {}", entries.join(", "))
    };
    Err(bad(format!(
        "{}/{} is not from an allowed registry; {allowed}",
        image.registry(),
        image.repository()
    )))
}

/// One allow-list entry, as a platform admin types it: a registry host (with an optional
/// port) and optionally a repository prefix, e.g. `ghcr.io/acme` or `127.0.0.1:5000`.
pub fn parse_allowed_entry(text: &str) -> Result<String, AppError> {
    let t = text.trim().trim_end_matches('/');
    let bad = |m: &str| AppError::invalid("registry", format!("{t:?}: {m}"));
    if t.is_empty() || t.len() > 255 {
        return Err(bad("1 to 255 characters"));
    }
    // Parsed as an image under it, so the registry and repository rules are docker's.
    let probe = if t.contains('/') {
        format!("{t}/x")
    } else {
        format!("{t}/x/y")
    };
    let r = ImageRef::parse(&probe).map_err(|_| bad("not a registry host or repository prefix"))?;
    if !t.starts_with(r.registry()) || r.registry() == DOCKER_HUB && !t.starts_with(DOCKER_HUB) {
        return Err(bad(
            "name the registry host first, e.g. docker.io/library or ghcr.io/acme",
        ));
    }
    Ok(t.to_owned())
}

/// A catalog entry's display name: 1–60 characters, no control characters.
pub fn parse_catalog_name(raw: &str) -> Result<String, AppError> {
    let name = raw.trim();
    if name.is_empty() || name.chars().count() > 60 {
        return Err(AppError::invalid("name", "1 to 60 characters"));
    }
    if name.chars().any(char::is_control) {
        return Err(AppError::invalid(
            "name",
            "no line breaks or control characters",
        ));
    }
    Ok(name.to_owned())
}

/// An image in a team's catalog: a platform-wide entry (`team_id` none, added by platform
/// admins) or a team's own (added by its admins). Pinned when added: `pinned` is
/// `registry/repository@sha256:…` and is what runs; `reference` is what was typed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CatalogImage {
    pub id: uuid::Uuid,
    /// `None`: a platform-wide entry every team sees.
    pub team_id: Option<uuid::Uuid>,
    pub team_name: Option<String>,
    pub name: String,
    pub reference: String,
    pub pinned: String,
    /// The CUDA version the image needs (from its config), when it says.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub requires_cuda: Option<CudaVersion>,
    pub added_by: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// A team's login to one registry, as shown back: never the password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RegistryLoginView {
    pub team_id: crate::ids::TeamId,
    pub registry: String,
    pub username: String,
    pub updated_at: chrono::DateTime<chrono::Utc>,
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

    #[test]
    fn cuda_versions_parse_compare_and_come_from_an_image_env() {
        let v = |t: &str| CudaVersion::parse(t).unwrap();
        assert_eq!(
            v("12.4"),
            CudaVersion {
                major: 12,
                minor: 4
            }
        );
        assert_eq!(v("12.4.1").to_string(), "12.4");
        assert!(v("12.10") > v("12.4"));
        assert!(v("11.8") < v("12.0"));
        for bad in [
            "", "12", "12.", ".4", "12.4.1.0", "0.1", "12.x", "-1.2", "12.4 ", "99999.1",
        ] {
            assert!(
                CudaVersion::parse(bad).is_err() || bad.trim() != bad,
                "{bad:?}"
            );
        }
        assert_eq!(CudaVersion::from_nvml(12040), Some(v("12.4")));
        assert_eq!(CudaVersion::from_nvml(12020), Some(v("12.2")));
        assert_eq!(CudaVersion::from_nvml(0), None);
        let env = |e: &[&str]| e.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            CudaVersion::required_by(&env(&[
                "PATH=/usr/bin",
                "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471",
                "CUDA_VERSION=12.4.1",
            ])),
            Some(v("12.4"))
        );
        assert_eq!(
            CudaVersion::required_by(&env(&["CUDA_VERSION=11.8.0"])),
            Some(v("11.8"))
        );
        assert_eq!(
            CudaVersion::required_by(&env(&["PATH=/bin", "CUDA_VERSIONX=1.2"])),
            None
        );
        let json = serde_json::to_string(&v("12.4")).unwrap();
        assert_eq!(json, "\"12.4\"");
        assert!(serde_json::from_str::<CudaVersion>("\"twelve\"").is_err());
    }

    #[test]
    fn the_allow_list_matches_registries_and_whole_repository_parts() {
        let img = |t: &str| ImageRef::parse(t).unwrap();
        let list = vec!["ghcr.io/acme".to_string(), "127.0.0.1:5000".to_string()];
        assert!(allowed_by(&list, &img("ghcr.io/acme/torch:2.3")).is_ok());
        assert!(allowed_by(&list, &img("ghcr.io/acme")).is_ok());
        assert!(allowed_by(&list, &img("127.0.0.1:5000/any/thing")).is_ok());
        let e = allowed_by(&list, &img("ghcr.io/acme-evil/x")).unwrap_err();
        assert!(
            e.to_string().contains("not from an allowed registry"),
            "{e}"
        );
        assert!(allowed_by(&list, &img("ghcr.io/other/x")).is_err());
        assert!(allowed_by(&list, &img("ubuntu")).is_err());
        assert!(allowed_by(&list, &img("127.0.0.1:5001/x")).is_err());
        let none = allowed_by(&[], &img("ubuntu")).unwrap_err();
        assert!(
            none.to_string().contains("no registry is allowed yet"),
            "{none}"
        );
        let hub = vec!["docker.io/library".to_string()];
        assert!(allowed_by(&hub, &img("ubuntu")).is_ok());
        assert!(allowed_by(&hub, &img("team/model")).is_err());
    }

    #[test]
    fn allow_list_entries_are_registries_with_optional_prefixes() {
        assert_eq!(
            parse_allowed_entry(" ghcr.io/acme/ ").unwrap(),
            "ghcr.io/acme"
        );
        assert_eq!(
            parse_allowed_entry("127.0.0.1:5000").unwrap(),
            "127.0.0.1:5000"
        );
        assert_eq!(
            parse_allowed_entry("docker.io/library").unwrap(),
            "docker.io/library"
        );
        for bad in [
            "",
            "acme",
            "acme/torch",
            "ghcr.io/ACME",
            "ghcr.io/a b",
            "ghcr.io/../x",
            "http://ghcr.io",
        ] {
            let e = parse_allowed_entry(bad).unwrap_err();
            assert!(format!("{e:?}").contains("registry"), "{bad:?}: {e:?}");
        }
    }
}
