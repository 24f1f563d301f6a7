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
//! | `POST /agent/v1/status` | `StatusReport` | any 2xx |
//! | `POST /agent/v1/telemetry` | `TelemetryBatch` | `TelemetryAck` |
//! | `POST /agent/v1/workloads` | `WorkloadReports` | `WorkloadSync` |
//!
//! 401 means the credential is no longer valid.

use std::future::Future;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tessera_domain::wire::{
    DesiredState, Heartbeat, RegisterRequest, RegisterResponse, StatusReport, TelemetryAck,
    TelemetryBatch, WorkloadReports, WorkloadSync,
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

    /// Reports every workload the agent knows; the server answers with the complete
    /// desired set and how much of each log it holds.
    fn sync_workloads(
        &self,
        reports: &WorkloadReports,
    ) -> impl Future<Output = Result<WorkloadSync, LinkError>> + Send;
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

fn client() -> Result<reqwest::Client, LinkError> {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(unreachable)
}

impl HttpLink {
    pub fn new(creds: &Credentials) -> Result<HttpLink, LinkError> {
        Ok(HttpLink {
            client: client()?,
            base: creds.server.trim_end_matches('/').to_owned(),
            credential: creds.credential.clone(),
        })
    }

    /// Trades a join token for a node credential.
    pub async fn register(server: &str, req: &RegisterRequest) -> Result<Credentials, LinkError> {
        let base = server.trim_end_matches('/');
        let resp = client()?
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

impl ServerLink for HttpLink {
    async fn heartbeat(&self, hb: &Heartbeat) -> Result<(), LinkError> {
        self.post("/agent/v1/heartbeat", hb).await.map(|_| ())
    }

    async fn desired_state(&self) -> Result<DesiredState, LinkError> {
        let resp = self
            .client
            .get(format!("{}/agent/v1/desired", self.base))
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

    async fn sync_workloads(&self, reports: &WorkloadReports) -> Result<WorkloadSync, LinkError> {
        self.post("/agent/v1/workloads", reports)
            .await?
            .json()
            .await
            .map_err(|e| LinkError::Decode(e.to_string()))
    }
}
