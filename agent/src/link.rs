//! The agent's view of the server: a small trait so the loops can be tested
//! against a fake, and [`HttpLink`], its HTTP implementation.
//!
//! HTTP protocol (JSON bodies; types in `tessera_domain::wire`; every route
//! except `register` needs `Authorization: Bearer <credential>`):
//!
//! | route | request | response |
//! |---|---|---|
//! | `POST /agent/v1/register` | `RegisterRequest` | `RegisterResponse` |
//! | `POST /agent/v1/heartbeat` | `Heartbeat` | any 2xx |
//! | `GET /agent/v1/desired` | — | `DesiredState` |
//! | `GET /agent/v1/wait?epoch=&generation=&timeout_s=` | — | `ChangeMark` (a long poll) |
//! | `POST /agent/v1/status` | `StatusReport` | any 2xx |
//! | `POST /agent/v1/telemetry` | `TelemetryBatch` | `TelemetryAck` |
//! | `POST /agent/v1/workloads` | `WorkloadReports` | `WorkloadSync` |
//! | `GET /agent/v1/exec/{session}` (WebSocket; `X-Tessera-Exec-Secret`) | `exec_frame`s | `exec_frame`s |
//!
//! 401 means the credential is no longer valid.

use std::future::Future;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tessera_domain::wire::{
    ChangeMark, DesiredState, ExecRequest, Heartbeat, RegisterRequest, RegisterResponse,
    StatusReport, TelemetryAck, TelemetryBatch, WorkloadReports, WorkloadSync,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("server unreachable: {0}")]
    Unreachable(String),
    #[error("server rejected the node credential (401)")]
    Unauthorized,
    #[error("server answered {status}: {body}")]
    Rejected { status: u16, body: String },
    #[error("unexpected response: {0}")]
    Decode(String),
}

/// Everything the agent sends to or asks of the server after registration.
pub trait ServerLink: Send + Sync {
    fn heartbeat(&self, hb: &Heartbeat) -> impl Future<Output = Result<(), LinkError>> + Send;

    fn desired_state(&self) -> impl Future<Output = Result<DesiredState, LinkError>> + Send;

    fn post_status(
        &self,
        report: &StatusReport,
    ) -> impl Future<Output = Result<(), LinkError>> + Send;

    /// The server stores the samples, deduplicating on `(node, seq)`, and
    /// acknowledges through the highest sequence number it holds.
    fn post_telemetry(
        &self,
        batch: &TelemetryBatch,
    ) -> impl Future<Output = Result<TelemetryAck, LinkError>> + Send;

    /// Holds a long poll until something changed for this node since `since` (the last
    /// answer; `None` at first) or `timeout_s` passes.
    fn wait_for_change(
        &self,
        since: Option<&ChangeMark>,
        timeout_s: u64,
    ) -> impl Future<Output = Result<ChangeMark, LinkError>> + Send;

    /// Reports every workload the agent knows; the server answers with the complete
    /// desired set and how much of each log it holds.
    fn sync_workloads(
        &self,
        reports: &WorkloadReports,
    ) -> impl Future<Output = Result<WorkloadSync, LinkError>> + Send;

    /// Takes a `tessera exec` session: opens `GET /agent/v1/exec/{session}` as a
    /// WebSocket and hands back the upgraded connection (links without one refuse).
    fn open_exec(
        &self,
        req: &ExecRequest,
    ) -> impl Future<Output = Result<crate::exec::ExecStream, LinkError>> + Send {
        let _ = req;
        async {
            Err(LinkError::Unreachable(
                "this link cannot open exec sessions".into(),
            ))
        }
    }
}

/// What registration yields; saved to the state directory.
#[derive(Clone, Serialize, Deserialize)]
pub struct Credentials {
    pub server: String,
    pub node_id: String,
    pub credential: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("server", &self.server)
            .field("node_id", &self.node_id)
            .field("credential", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    pub fn load(path: &Path) -> std::io::Result<Option<Credentials>> {
        match std::fs::read(path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(std::io::Error::other),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes the file readable by its owner only.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        use std::io::Write;
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts.open(path)?;
        f.write_all(&serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)?;
        f.sync_all()
    }
}

/// [`ServerLink`] over HTTP with `reqwest`.
#[derive(Debug, Clone)]
pub struct HttpLink {
    client: reqwest::Client,
    /// For exec sessions: no overall time limit (they last as long as the user's).
    exec_client: reqwest::Client,
    base: String,
    credential: String,
}

fn unreachable(e: reqwest::Error) -> LinkError {
    LinkError::Unreachable(e.to_string())
}

async fn check(resp: reqwest::Response) -> Result<reqwest::Response, LinkError> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return Err(LinkError::Unauthorized);
    }
    let body = resp.text().await.unwrap_or_default();
    Err(LinkError::Rejected {
        status: status.as_u16(),
        body: body.chars().take(500).collect(),
    })
}

/// How the agent reaches the server. HTTPS (rustls) trusts the system's certificate
/// store, the Mozilla roots built in, and the PEM certificates of `--ca-file` (a lab's
/// private CA). Plain `http://` carries the node credential in clear text: it is accepted
/// only to a loopback address, or anywhere with `--insecure-http`.
#[derive(Debug, Clone, Default)]
pub struct Transport {
    /// Extra trusted root certificates (PEM bundle).
    pub ca_pem: Option<Vec<u8>>,
    pub insecure_http: bool,
}

/// Why a server address was refused (or the warning it deserves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UrlVerdict {
    Ok,
    /// Plain HTTP beyond this machine, allowed by `--insecure-http`: warn.
    InsecureAllowed,
    Refused(String),
}

impl Transport {
    /// Checks `server` before anything is sent to it.
    pub fn check(&self, server: &str) -> UrlVerdict {
        let url = match reqwest::Url::parse(server) {
            Ok(u) => u,
            Err(e) => return UrlVerdict::Refused(format!("--server {server}: {e}")),
        };
        match url.scheme() {
            "https" => UrlVerdict::Ok,
            "http" if is_loopback(&url) => UrlVerdict::Ok,
            "http" if self.insecure_http => UrlVerdict::InsecureAllowed,
            "http" => UrlVerdict::Refused(format!(
                "--server {server}: plain http:// to another machine would send this \
                 node's credential in clear text; use https:// (with --ca-file for a \
                 private CA), or pass --insecure-http on a network you trust"
            )),
            other => UrlVerdict::Refused(format!(
                "--server {server}: unsupported scheme {other}:// (use https://)"
            )),
        }
    }

    fn client(&self) -> Result<reqwest::Client, LinkError> {
        self.client_with(Some(std::time::Duration::from_secs(30)))
    }

    fn client_with(
        &self,
        timeout: Option<std::time::Duration>,
    ) -> Result<reqwest::Client, LinkError> {
        let mut b = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(30))
            .use_rustls_tls();
        if let Some(t) = timeout {
            b = b.timeout(t);
        }
        if let Some(pem) = &self.ca_pem {
            for cert in reqwest::Certificate::from_pem_bundle(pem).map_err(unreachable)? {
                b = b.add_root_certificate(cert);
            }
        }
        b.build().map_err(unreachable)
    }
}

/// `localhost`, `127.0.0.0/8` and `::1`: traffic that never leaves the machine.
fn is_loopback(url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or("").trim_matches(['[', ']']);
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl HttpLink {
    pub fn new(creds: &Credentials, transport: &Transport) -> Result<HttpLink, LinkError> {
        Ok(HttpLink {
            client: transport.client()?,
            exec_client: transport.client_with(None)?,
            base: creds.server.trim_end_matches('/').to_owned(),
            credential: creds.credential.clone(),
        })
    }

    /// Trades a join token for a node credential.
    pub async fn register(
        server: &str,
        req: &RegisterRequest,
        transport: &Transport,
    ) -> Result<Credentials, LinkError> {
        let base = server.trim_end_matches('/');
        let resp = transport
            .client()?
            .post(format!("{base}/agent/v1/register"))
            .json(req)
            .send()
            .await
            .map_err(unreachable)?;
        let r: RegisterResponse = check(resp)
            .await?
            .json()
            .await
            .map_err(|e| LinkError::Decode(e.to_string()))?;
        Ok(Credentials {
            server: base.to_owned(),
            node_id: r.node_id,
            credential: r.credential,
        })
    }

    async fn post<T: Serialize + Sync>(
        &self,
        path: &str,
        body: &T,
    ) -> Result<reqwest::Response, LinkError> {
        let resp = self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.credential)
            .json(body)
            .send()
            .await
            .map_err(unreachable)?;
        check(resp).await
    }
}

impl HttpLink {
    async fn get<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<T, LinkError> {
        let resp = self
            .client
            .get(format!("{}{path}", self.base))
            .query(query)
            .bearer_auth(&self.credential)
            .send()
            .await
            .map_err(unreachable)?;
        check(resp)
            .await?
            .json()
            .await
            .map_err(|e| LinkError::Decode(e.to_string()))
    }
}

impl ServerLink for HttpLink {
    async fn heartbeat(&self, hb: &Heartbeat) -> Result<(), LinkError> {
        self.post("/agent/v1/heartbeat", hb).await.map(|_| ())
    }

    async fn desired_state(&self) -> Result<DesiredState, LinkError> {
        self.get("/agent/v1/desired", &[]).await
    }

    async fn wait_for_change(
        &self,
        since: Option<&ChangeMark>,
        timeout_s: u64,
    ) -> Result<ChangeMark, LinkError> {
        let mut query = vec![("timeout_s", timeout_s.to_string())];
        if let Some(m) = since {
            query.push(("epoch", m.epoch.clone()));
            query.push(("generation", m.generation.to_string()));
        }
        self.get("/agent/v1/wait", &query).await
    }

    async fn post_status(&self, report: &StatusReport) -> Result<(), LinkError> {
        self.post("/agent/v1/status", report).await.map(|_| ())
    }

    async fn post_telemetry(&self, batch: &TelemetryBatch) -> Result<TelemetryAck, LinkError> {
        self.post("/agent/v1/telemetry", batch)
            .await?
            .json()
            .await
            .map_err(|e| LinkError::Decode(e.to_string()))
    }

    async fn open_exec(&self, req: &ExecRequest) -> Result<crate::exec::ExecStream, LinkError> {
        let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
        let request = self
            .exec_client
            .get(format!("{}/agent/v1/exec/{}", self.base, req.session))
            .bearer_auth(&self.credential)
            .header("x-tessera-exec-secret", &req.secret);
        let resp = tessera_domain::wire::exec_frame::upgrade_headers(key)
            .into_iter()
            .fold(request, |r, (name, value)| r.header(name, value))
            .send()
            .await
            .map_err(unreachable)?;
        if resp.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
            return Err(match check(resp).await {
                Err(e) => e,
                Ok(r) => LinkError::Decode(format!("no WebSocket upgrade ({})", r.status())),
            });
        }
        let upgraded = resp.upgrade().await.map_err(unreachable)?;
        Ok(Box::new(upgraded))
    }

    async fn sync_workloads(&self, reports: &WorkloadReports) -> Result<WorkloadSync, LinkError> {
        self.post("/agent/v1/workloads", reports)
            .await?
            .json()
            .await
            .map_err(|e| LinkError::Decode(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_to_loopback_unless_allowed() {
        let strict = Transport::default();
        for ok in [
            "https://tessera.example.org",
            "https://198.18.0.1:3443/",
            "http://127.0.0.1:3000",
            "http://127.8.0.1",
            "http://localhost:3000",
            "http://[::1]:3000",
        ] {
            assert_eq!(strict.check(ok), UrlVerdict::Ok, "{ok}");
        }
        for refused in [
            "http://tessera:3000",
            "http://198.18.0.1:3000",
            "http://[2001:db8::1]/",
            "http://localhost.example.org",
            "ftp://tessera",
            "tessera:3000",
        ] {
            assert!(
                matches!(strict.check(refused), UrlVerdict::Refused(_)),
                "{refused}"
            );
        }
        let UrlVerdict::Refused(why) = strict.check("http://tessera:3000") else {
            unreachable!()
        };
        assert!(why.contains("--insecure-http"), "{why}");
        let lax = Transport {
            insecure_http: true,
            ..Transport::default()
        };
        assert_eq!(
            lax.check("http://tessera:3000"),
            UrlVerdict::InsecureAllowed
        );
        assert_eq!(lax.check("http://127.0.0.1:3000"), UrlVerdict::Ok);
        assert!(matches!(lax.check("ftp://tessera"), UrlVerdict::Refused(_)));
    }

    #[test]
    fn a_ca_file_that_is_not_pem_is_an_error() {
        let t = Transport {
            ca_pem: Some(
                b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n".to_vec(),
            ),
            insecure_http: false,
        };
        assert!(t.client().is_err());
    }
}
