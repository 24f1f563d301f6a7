//! The OCI distribution API, pull side only: manifests (OCI and Docker v2 schema 2, an
//! image index or manifest list narrowed to this node's platform) and blobs, with bearer
//! tokens (`WWW-Authenticate: Bearer realm=…`) or basic auth, on the agent's reqwest.
//!
//! Plain `http://` is spoken only to loopback registries (a local mirror, the tests);
//! everything else is `https://`. Every byte is checked against its digest: a manifest's
//! body before it is parsed, a blob while it streams to disk (and it is renamed into the
//! content-addressed store only when the digest and size match).

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use reqwest::StatusCode;
use reqwest::header::{ACCEPT, HeaderValue, WWW_AUTHENTICATE};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use tessera_domain::image::{Digest, ImageRef};
use tokio::io::AsyncWriteExt;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// Largest manifest or image config accepted (they are JSON documents of a few KiB).
const MAX_DOCUMENT: u64 = 4 << 20;

/// Registry credentials for one pull. Never logged: `Debug` shows the username only.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Why a pull failed. The texts name the registry, repository and digests, never a
/// credential or token.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("registry {registry}: {message}")]
    Registry { registry: String, message: String },
    #[error("registry {registry}: {what} needs credentials that it accepts (HTTP {status})")]
    Unauthorized {
        registry: String,
        what: String,
        status: u16,
    },
    #[error("{what}: content does not match its digest {expected} (got {got})")]
    DigestMismatch {
        what: String,
        expected: String,
        got: String,
    },
    #[error("image refused: {0}")]
    Refused(String),
    #[error(transparent)]
    Unpack(#[from] crate::unpack::UnpackError),
    #[error("image store: {0}")]
    Io(#[from] std::io::Error),
}

/// A content descriptor (manifest, config or layer).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
}

/// An image manifest or an index, as one shape (the fields say which).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
}

/// One platform's image manifest, with its digest.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// What the reference resolves to: this manifest's digest, or the index's it was
    /// chosen from (what a catalog pins, so every platform of the image stays reachable).
    pub top: Digest,
    pub digest: Digest,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// This node's platform in OCI words.
pub fn node_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// A pull session against one repository: the scheme, and the token once one was issued.
pub struct Session<'a> {
    http: &'a reqwest::Client,
    base: String,
    image: &'a ImageRef,
    creds: Option<&'a Credentials>,
    auth: Option<HeaderValue>,
}

impl<'a> Session<'a> {
    pub fn new(
        http: &'a reqwest::Client,
        image: &'a ImageRef,
        creds: Option<&'a Credentials>,
    ) -> Self {
        let host = image.api_host();
        let scheme = if is_loopback_host(host) {
            "http"
        } else {
            "https"
        };
        Session {
            http,
            base: format!("{scheme}://{host}/v2/{}", image.repository()),
            image,
            creds,
            auth: None,
        }
    }

    fn err(&self, message: impl Into<String>) -> PullError {
        PullError::Registry {
            registry: self.image.registry().to_string(),
            message: message.into(),
        }
    }

    /// GET with the session's authorization, answering one 401 challenge.
    async fn get(
        &mut self,
        url: &str,
        accept: &str,
        what: &str,
    ) -> Result<reqwest::Response, PullError> {
        let send = |auth: Option<&HeaderValue>| {
            let mut req = self.http.get(url).header(ACCEPT, accept);
            if let Some(a) = auth {
                req = req.header(reqwest::header::AUTHORIZATION, a.clone());
            }
            req.send()
        };
        let resp = send(self.auth.as_ref())
            .await
            .map_err(|e| self.err(format!("{what}: {}", describe(e))))?;
        if resp.status() != StatusCode::UNAUTHORIZED || self.auth.is_some() {
            return self.check(resp, what);
        }
        let challenge = resp
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        self.auth = Some(self.authorize(&challenge, what).await?);
        let resp = send(self.auth.as_ref())
            .await
            .map_err(|e| self.err(format!("{what}: {}", describe(e))))?;
        self.check(resp, what)
    }

    fn check(&self, resp: reqwest::Response, what: &str) -> Result<reqwest::Response, PullError> {
        match resp.status() {
            s if s.is_success() => Ok(resp),
            s @ (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => {
                Err(PullError::Unauthorized {
                    registry: self.image.registry().to_string(),
                    what: what.to_string(),
                    status: s.as_u16(),
                })
            }
            StatusCode::NOT_FOUND => Err(self.err(format!("{what}: not found"))),
            s => Err(self.err(format!("{what}: HTTP {}", s.as_u16()))),
        }
    }

    /// The Authorization value a challenge asks for.
    async fn authorize(&self, challenge: &str, what: &str) -> Result<HeaderValue, PullError> {
        let (scheme, params) = parse_challenge(challenge);
        let unauthorized = || PullError::Unauthorized {
            registry: self.image.registry().to_string(),
            what: what.to_string(),
            status: 401,
        };
        if scheme.eq_ignore_ascii_case("basic") {
            let c = self.creds.ok_or_else(unauthorized)?;
            return Ok(basic(c));
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(self.err(format!("{what}: unsupported authentication `{scheme}`")));
        }
        let realm = params
            .iter()
            .find(|(k, _)| k == "realm")
            .map(|(_, v)| v.clone())
            .ok_or_else(|| self.err("a bearer challenge without a realm"))?;
        let mut url = reqwest::Url::parse(&realm)
            .map_err(|_| self.err("a bearer challenge with a bad realm"))?;
        let host = url.host_str().unwrap_or("").to_string();
        if url.scheme() != "https" && !(url.scheme() == "http" && is_loopback_host(&host)) {
            // Credentials go to the realm: never in clear text beyond this machine.
            return Err(self.err(format!("token realm {realm} is not https")));
        }
        {
            let mut q = url.query_pairs_mut();
            for (k, v) in &params {
                if k == "service" || k == "scope" {
                    q.append_pair(k, v);
                }
            }
            if !params.iter().any(|(k, _)| k == "scope") {
                q.append_pair(
                    "scope",
                    &format!("repository:{}:pull", self.image.repository()),
                );
            }
        }
        let mut req = self.http.get(url);
        if let Some(c) = self.creds {
            req = req.header(reqwest::header::AUTHORIZATION, basic(c));
        }
        let resp = req
            .send()
            .await
            .map_err(|e| self.err(format!("token: {}", describe(e))))?;
        if matches!(
            resp.status(),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) {
            return Err(unauthorized());
        }
        if !resp.status().is_success() {
            return Err(self.err(format!("token: HTTP {}", resp.status().as_u16())));
        }
        #[derive(Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let body = read_capped(resp, MAX_DOCUMENT)
            .await
            .map_err(|e| self.err(format!("token: {e}")))?;
        let t: Token =
            serde_json::from_slice(&body).map_err(|_| self.err("token: not a token answer"))?;
        let token = t
            .token
            .or(t.access_token)
            .ok_or_else(|| self.err("token: no token in the answer"))?;
        let mut v = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| self.err("token: not a header value"))?;
        v.set_sensitive(true);
        Ok(v)
    }

    /// The image manifest for this node's platform (through an index if the reference
    /// names one), its body checked against its digest.
    pub async fn manifest(&mut self) -> Result<Manifest, PullError> {
        let accept = [OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST].join(", ");
        let reference = self.image.manifest_reference().to_string();
        let expected = self.image.digest().cloned();
        let (digest, doc) = self
            .document(&reference, &accept, expected.as_ref())
            .await?;
        if doc.manifests.is_none() {
            return self.image_manifest(digest.clone(), digest, doc);
        }
        let top = digest;
        let arch = node_architecture();
        let chosen = doc
            .manifests
            .unwrap_or_default()
            .into_iter()
            .find(|m| {
                m.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == arch)
            })
            .ok_or_else(|| PullError::Refused(format!("the image has no linux/{arch} variant")))?;
        let want = Digest::parse(&chosen.digest)
            .map_err(|_| self.err(format!("index names a bad digest {}", chosen.digest)))?;
        let accept = [OCI_MANIFEST, DOCKER_MANIFEST].join(", ");
        let (digest, doc) = self.document(want.as_str(), &accept, Some(&want)).await?;
        if doc.manifests.is_some() {
            return Err(PullError::Refused("an index inside an index".into()));
        }
        self.image_manifest(top, digest, doc)
    }

    /// A small JSON blob (an image config) read into memory, checked against its digest.
    pub async fn document_blob(&mut self, d: &Descriptor) -> Result<Vec<u8>, PullError> {
        let digest = Digest::parse(&d.digest)
            .map_err(|_| PullError::Refused(format!("bad digest {}", d.digest)))?;
        if d.size > MAX_DOCUMENT {
            return Err(PullError::Refused(format!(
                "blob {digest} is {} bytes, more than a config may be",
                d.size
            )));
        }
        let url = format!("{}/blobs/{digest}", self.base);
        let what = format!("blob {digest}");
        let resp = self.get(&url, "*/*", &what).await?;
        let body = read_capped(resp, MAX_DOCUMENT)
            .await
            .map_err(|e| self.err(format!("{what}: {e}")))?;
        let got = hex(&Sha256::digest(&body));
        if digest.hex() != got {
            return Err(PullError::DigestMismatch {
                what,
                expected: digest.to_string(),
                got: format!("sha256:{got}"),
            });
        }
        Ok(body)
    }

    fn image_manifest(
        &self,
        top: Digest,
        digest: Digest,
        doc: Document,
    ) -> Result<Manifest, PullError> {
        if let Some(t) = &doc.media_type
            && t != OCI_MANIFEST
            && t != DOCKER_MANIFEST
        {
            return Err(PullError::Refused(format!("unsupported manifest type {t}")));
        }
        let config = doc
            .config
            .ok_or_else(|| PullError::Refused("the manifest has no config".into()))?;
        let layers = doc.layers.unwrap_or_default();
        for l in &layers {
            Digest::parse(&l.digest)
                .map_err(|_| PullError::Refused(format!("bad layer digest {}", l.digest)))?;
            let ok = l
                .media_type
                .starts_with("application/vnd.oci.image.layer.v1.tar")
                || l.media_type == "application/vnd.docker.image.rootfs.diff.tar.gzip"
                || l.media_type == "application/vnd.docker.image.rootfs.diff.tar";
            if !ok || l.media_type.ends_with("+zstd") {
                return Err(PullError::Refused(format!(
                    "unsupported layer type {}",
                    l.media_type
                )));
            }
        }
        Digest::parse(&config.digest)
            .map_err(|_| PullError::Refused(format!("bad config digest {}", config.digest)))?;
        Ok(Manifest {
            top,
            digest,
            config,
            layers,
        })
    }

    async fn document(
        &mut self,
        reference: &str,
        accept: &str,
        expected: Option<&Digest>,
    ) -> Result<(Digest, Document), PullError> {
        let url = format!("{}/manifests/{reference}", self.base);
        let what = format!("manifest {}", self.image);
        let resp = self.get(&url, accept, &what).await?;
        let header_digest = resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = read_capped(resp, MAX_DOCUMENT)
            .await
            .map_err(|e| self.err(format!("{what}: {e}")))?;
        let got = Digest::from_hex(&hex(&Sha256::digest(&body)))
            .map_err(|_| self.err("unreachable digest"))?;
        for want in expected
            .map(|d| d.as_str().to_string())
            .into_iter()
            .chain(header_digest.filter(|h| h.starts_with("sha256:")))
        {
            if want != got.as_str() {
                return Err(PullError::DigestMismatch {
                    what,
                    expected: want,
                    got: got.to_string(),
                });
            }
        }
        let doc: Document = serde_json::from_slice(&body)
            .map_err(|e| PullError::Refused(format!("{what} is not a manifest: {e}")))?;
        Ok((got, doc))
    }

    /// Streams blob `d` into `dest` (through a `.partial` file beside it), hashing as it goes; `dest`
    /// appears only when the size and digest match. `done` grows by the bytes received.
    pub async fn blob(
        &mut self,
        d: &Descriptor,
        dest: &Path,
        done: &AtomicU64,
    ) -> Result<(), PullError> {
        let digest = Digest::parse(&d.digest)
            .map_err(|_| PullError::Refused(format!("bad digest {}", d.digest)))?;
        let url = format!("{}/blobs/{digest}", self.base);
        let what = format!("blob {digest}");
        let mut resp = self.get(&url, "*/*", &what).await?;
        // Unique per write: two pulls may fetch the same config at once; the rename is atomic.
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let partial = dest.with_extension(format!(
            "{}.{}.partial",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let mut file = tokio::fs::File::create(&partial).await?;
        let mut hasher = Sha256::new();
        let mut len = 0u64;
        let result = async {
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| self.err(format!("{what}: {}", describe(e))))?
            {
                len += chunk.len() as u64;
                if len > d.size {
                    return Err(PullError::DigestMismatch {
                        what: what.clone(),
                        expected: format!("{digest} ({} bytes)", d.size),
                        got: format!("more than {} bytes", d.size),
                    });
                }
                hasher.update(&chunk);
                file.write_all(&chunk).await?;
                done.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
            file.flush().await?;
            let got = format!("sha256:{}", hex(&hasher.finalize_reset()));
            if got != digest.as_str() || len != d.size {
                return Err(PullError::DigestMismatch {
                    what: what.clone(),
                    expected: format!("{digest} ({} bytes)", d.size),
                    got: format!("{got} ({len} bytes)"),
                });
            }
            Ok(())
        }
        .await;
        drop(file);
        match result {
            Ok(()) => Ok(tokio::fs::rename(&partial, dest).await?),
            Err(e) => {
                let _ = tokio::fs::remove_file(&partial).await;
                Err(e)
            }
        }
    }
}

/// The HTTP client pulls use: rustls trusting the system's store and the Mozilla roots,
/// plus the certificates of `extra_ca_pem` (a PEM bundle: a lab registry's private CA,
/// the agent's `--registry-ca`). A builder, so a caller can add its own settings.
pub fn http_client_builder(extra_ca_pem: Option<&[u8]>) -> Result<reqwest::ClientBuilder, String> {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .connect_timeout(std::time::Duration::from_secs(30));
    if let Some(pem) = extra_ca_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| format!("not a PEM certificate bundle: {}", describe(e)))?;
        if certs.is_empty() {
            return Err("no PEM certificate in it".to_owned());
        }
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    Ok(b)
}

/// A transport error in words, with its causes ("invalid peer certificate: UnknownIssuer"),
/// without the URL.
fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

fn basic(c: &Credentials) -> HeaderValue {
    use base64::Engine as _;
    let raw = format!("{}:{}", c.username, c.password);
    let mut v = HeaderValue::from_str(&format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    ))
    .unwrap_or_else(|_| HeaderValue::from_static(""));
    v.set_sensitive(true);
    v
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn read_capped(mut resp: reqwest::Response, cap: u64) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(describe)? {
        if (body.len() + chunk.len()) as u64 > cap {
            return Err(format!("larger than {cap} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `localhost`, `127.0.0.0/8` or `::1`, with or without a port.
pub fn is_loopback_host(host_port: &str) -> bool {
    let host = match host_port.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) && !h.ends_with(':') => h,
        _ => host_port,
    };
    let host = host.trim_matches(['[', ']']);
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `Bearer realm="…",service="…"` → ("Bearer", [(realm, …), (service, …)]).
fn parse_challenge(header: &str) -> (String, Vec<(String, String)>) {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    let mut params = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.peek().copied() {
                if c == ',' {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        params.push((key.trim().to_ascii_lowercase(), value));
    }
    (scheme.to_string(), params)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse() {
        let (s, p) = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(s, "Bearer");
        assert_eq!(
            p,
            [
                (
                    "realm".to_string(),
                    "https://auth.example/token".to_string()
                ),
                ("service".to_string(), "registry.example".to_string()),
                ("scope".to_string(), "repository:a/b:pull,push".to_string()),
            ]
        );
        let (s, p) = parse_challenge(r#"Basic realm="Registry Realm""#);
        assert_eq!((s.as_str(), p.len()), ("Basic", 1));
    }

    #[test]
    fn credentials_never_print_the_password() {
        let c = Credentials {
            username: "robot".into(),
            password: "hunter2-secret".into(),
        };
        let shown = format!("{c:?} {c:#?}");
        assert!(
            shown.contains("robot") && !shown.contains("hunter2"),
            "{shown}"
        );
        assert!(basic(&c).is_sensitive());
    }

    #[test]
    fn loopback_hosts() {
        for h in [
            "localhost:5000",
            "127.0.0.1:5000",
            "127.0.0.1",
            "[::1]:5000",
            "localhost",
        ] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "registry.example:5000",
            "10.0.0.1:5000",
            "docker.io",
            "localhost.evil.io",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }
}
