//! Webhook delivery: the JSON body ([`tessera_domain::notify::WebhookBody`]), signed with
//! the hook's secret (HMAC-SHA256 over `<timestamp>.<body>`), posted with a timeout and
//! without following redirects (a redirect could lead to an address the check refused).

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use ring::hmac;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tessera_core::store::OutboxRow;
use tessera_domain::notify::address_is_public;
use tessera_domain::notify::{EventKind, EventPayload, WebhookBody, WebhookTestResult};
use uuid::Uuid;

/// The signature header: `t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
pub const SIGNATURE_HEADER: &str = "X-Tessera-Signature";
/// The event kind header.
pub const EVENT_HEADER: &str = "X-Tessera-Event";
/// The delivery id header: the same on every retry of one delivery.
pub const DELIVERY_HEADER: &str = "X-Tessera-Delivery";
/// How long a receiver has to answer.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP client webhooks are posted with. Its resolver is [`PublicOnly`]: the address
/// a hook's host names is checked when the connection is made, so a host that resolved
/// to a public address when it was checked and to an internal one a moment later (DNS
/// rebinding) is not reached.
pub fn client(allow_private: bool) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(TIMEOUT)
        .dns_resolver(Arc::new(PublicOnly { allow_private }))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("Tessera-Webhook/", env!("CARGO_PKG_VERSION")))
        .build()?)
}

/// Resolves a webhook's host to the addresses a webhook may reach: public ones, unless
/// the platform allows private ones (`TESSERA_WEBHOOK_ALLOW_PRIVATE`). An IP literal in
/// the URL is not resolved; it is checked when the hook is saved and before each send.
pub struct PublicOnly {
    pub allow_private: bool,
}

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        let allow = self.allow_private;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let usable: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| allow || address_is_public(a.ip()))
                .collect();
            if usable.is_empty() {
                return Err(format!(
                    "{host} resolves to no public address ({} found); webhooks go only to public \
                     addresses",
                    found.len()
                )
                .into());
            }
            Ok(Box::new(usable.into_iter()) as Addrs)
        })
    }
}

/// The body an event is posted as.
pub fn body(e: &OutboxRow, public_url: &str) -> WebhookBody {
    let payload = e.payload();
    WebhookBody {
        id: e.id,
        kind: e.kind,
        team_id: e.team_id.map(|t| t.0),
        subject_kind: e.subject_kind.clone(),
        subject_id: e.subject_id,
        created_at: e.created_at,
        text: payload.summary.clone(),
        link: format!("{public_url}{}", payload.path),
        payload,
    }
}

/// The signature header's value for `body` sent at `timestamp`.
pub fn signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(timestamp.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    let tag = ctx.sign();
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("t={timestamp},v1={hex}")
}

/// Posts `body` to `url`, signed; the answer's status when it is 2xx, else why not.
pub async fn send(
    http: &reqwest::Client,
    url: &str,
    secret: &str,
    delivery: Uuid,
    body: &WebhookBody,
) -> Result<Option<i64>, (Option<i64>, String)> {
    let bytes = serde_json::to_vec(body).map_err(|e| (None, format!("encoding: {e}")))?;
    let ts = chrono::Utc::now().timestamp();
    let r = http
        .post(url)
        .header("content-type", "application/json")
        .header(EVENT_HEADER, body.kind.as_str())
        .header(DELIVERY_HEADER, delivery.to_string())
        .header(SIGNATURE_HEADER, signature(secret, ts, &bytes))
        .body(bytes)
        .send()
        .await
        .map_err(|e| (None, format!("{e}")))?;
    let status = i64::from(r.status().as_u16());
    if r.status().is_success() {
        Ok(Some(status))
    } else {
        Err((
            Some(status),
            format!("the receiver answered {}", r.status()),
        ))
    }
}

/// Test deliveries (`Notifications::test_webhook`): a `webhook.test` event of the team,
/// posted as any event is. The REST handler and the team page's button share it.
pub struct TestSender {
    public_url: String,
    allow_private: bool,
}

impl TestSender {
    pub fn new(public_url: String) -> Self {
        TestSender {
            public_url,
            allow_private: false,
        }
    }

    /// Lets test deliveries reach private addresses (`TESSERA_WEBHOOK_ALLOW_PRIVATE`).
    pub fn allowing_private(mut self, allow: bool) -> Self {
        self.allow_private = allow;
        self
    }

    async fn post_test(&self, team: Option<Uuid>, url: &str, secret: &str) -> WebhookTestResult {
        let public_url = &self.public_url;
        let (subject_kind, subject_id, path) = match team {
            Some(t) => ("team", t, format!("/teams/{t}")),
            None => ("platform", Uuid::nil(), "/webhooks".to_owned()),
        };
        let body = WebhookBody {
            id: Uuid::now_v7(),
            kind: EventKind::WebhookTest,
            team_id: team,
            subject_kind: subject_kind.into(),
            subject_id,
            created_at: chrono::Utc::now(),
            text: format!("Test delivery from Tessera to {url}"),
            link: format!("{public_url}{path}"),
            payload: EventPayload {
                summary: "Test delivery".into(),
                path,
                user_id: None,
                detail: None,
                team_name: None,
                audience: None,
            },
        };
        let sent = match client(self.allow_private) {
            Ok(http) => send(&http, url, secret, body.id, &body).await,
            Err(e) => Err((None, format!("no HTTP client: {e}"))),
        };
        match sent {
            Ok(status) => WebhookTestResult {
                delivered: true,
                status,
                error: None,
            },
            Err((status, error)) => WebhookTestResult {
                delivered: false,
                status,
                error: Some(error),
            },
        }
    }
}

impl tessera_core::services::notifications::WebhookTestSender for TestSender {
    fn send_test<'a>(
        &'a self,
        team: Option<Uuid>,
        url: &'a str,
        secret: &'a str,
    ) -> std::pin::Pin<Box<dyn Future<Output = WebhookTestResult> + Send + 'a>> {
        Box::pin(self.post_test(team, url, secret))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check happens at connect time: a host that resolves to loopback is not
    /// reached by the webhook client, whatever was checked before (DNS rebinding), and is
    /// reached when private addresses are allowed.
    #[tokio::test]
    async fn the_client_connects_only_to_public_addresses() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(|| async { axum::http::StatusCode::NO_CONTENT }),
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let url = format!("http://localhost:{port}/hook");
        let refused = client(false)
            .expect("client")
            .post(&url)
            .send()
            .await
            .expect_err("loopback refused");
        let chain = format!("{:?}", refused);
        assert!(chain.contains("no public address"), "{chain}");
        let ok = client(true)
            .expect("client")
            .post(&url)
            .send()
            .await
            .expect("allowed");
        assert_eq!(ok.status().as_u16(), 204);
    }

    #[test]
    fn signature_matches_a_known_hmac() {
        // HMAC-SHA256("key", "1700000000.{}") computed independently (Python hmac).
        let s = signature("key", 1_700_000_000, b"{}");
        assert!(s.starts_with("t=1700000000,v1="), "{s}");
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"key");
        let hex = s.split("v1=").nth(1).expect("v1");
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect();
        assert!(hmac::verify(&key, b"1700000000.{}", &bytes).is_ok());
        assert!(hmac::verify(&key, b"1700000001.{}", &bytes).is_err());
    }
}
