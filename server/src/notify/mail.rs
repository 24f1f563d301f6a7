//! Notification mail: plain text and HTML bodies, sent over SMTP with lettre.

use lettre::message::{Mailbox, MultiPart};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use std::time::Duration;
use tessera_core::store::{OutboxRow, WebhookRow};
use uuid::Uuid;

/// A mail to send: subject, plain text, HTML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailContent {
    pub subject: String,
    pub text: String,
    pub html: String,
}

/// The SMTP transport and the sender.
#[derive(Clone)]
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
}

impl Mailer {
    /// From `TESSERA_SMTP_URL` and `TESSERA_MAIL_FROM`.
    pub fn new(url: &str, from: &str) -> anyhow::Result<Mailer> {
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
            .map_err(|e| anyhow::anyhow!("TESSERA_SMTP_URL: {e}"))?
            .timeout(Some(Duration::from_secs(20)))
            .build();
        let from = from
            .parse()
            .map_err(|e| anyhow::anyhow!("TESSERA_MAIL_FROM: {e}"))?;
        Ok(Mailer { transport, from })
    }

    /// Sends `msg` to `to`; the message id is made of `id` (the delivery), so a receiver
    /// can tell a repeat.
    pub async fn send(&self, to: &str, msg: &MailContent, id: Uuid) -> Result<(), String> {
        let to: Mailbox = to.parse().map_err(|e| format!("bad address {to}: {e}"))?;
        let email = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(&msg.subject)
            .message_id(Some(format!("<{id}@tessera>")))
            .multipart(MultiPart::alternative_plain_html(
                msg.text.clone(),
                msg.html.clone(),
            ))
            .map_err(|e| format!("building the mail: {e}"))?;
        self.transport
            .send(email)
            .await
            .map(|_| ())
            .map_err(|e| format!("SMTP: {e}"))
    }
}

/// Text for HTML.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn html_page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{}</title></head>\
         <body style=\"font-family: sans-serif\">{body}\
         <p style=\"color: #666; font-size: small\">Choose which notifications you get under \
         My account → Notifications.</p></body></html>",
        escape(title)
    )
}

/// The mail of one event.
pub fn event_mail(e: &OutboxRow, public_url: &str) -> MailContent {
    let p = e.payload();
    let link = format!("{public_url}{}", p.path);
    let detail = p.detail.clone().unwrap_or_default();
    let mut text = format!("{}\n\n", p.summary);
    if !detail.is_empty() {
        text.push_str(&format!("{detail}\n\n"));
    }
    text.push_str(&format!(
        "Open it: {link}\n\nAt {}. Choose which notifications you get under My account → \
         Notifications.\n",
        e.created_at.format("%Y-%m-%d %H:%M UTC")
    ));
    let mut body = format!("<p>{}</p>", escape(&p.summary));
    if !detail.is_empty() {
        body.push_str(&format!("<p>{}</p>", escape(&detail)));
    }
    body.push_str(&format!(
        "<p><a href=\"{}\">Open it on Tessera</a></p>",
        escape(&link)
    ));
    MailContent {
        subject: format!("[Tessera] {}", p.summary),
        text,
        html: html_page(&p.summary, &body),
    }
}

/// The mail with the link that verifies `user`'s address (the link carries `token`).
pub fn verification_mail(e: &OutboxRow, user: Uuid, token: &str, public_url: &str) -> MailContent {
    let p = e.payload();
    let link = format!("{public_url}/verify-email?user={user}&token={token}");
    let detail = p.detail.unwrap_or_default();
    MailContent {
        subject: format!("[Tessera] {}", p.summary),
        text: format!("{detail}\n\nVerify: {link}\n"),
        html: html_page(
            &p.summary,
            &format!(
                "<p>{}</p><p><a href=\"{}\">Verify this address</a></p>",
                escape(&detail),
                escape(&link)
            ),
        ),
    }
}

/// One mail with a day's events.
pub fn digest_mail(events: &[OutboxRow], public_url: &str) -> MailContent {
    let subject = format!(
        "[Tessera] Your daily digest: {}",
        tessera_domain::text::count(events.len() as u64, "notification", "notifications")
    );
    let mut text = String::from("What happened since your last digest:\n\n");
    let mut items = String::new();
    for e in events {
        let p = e.payload();
        let link = format!("{public_url}{}", p.path);
        text.push_str(&format!(
            "- {} ({})\n  {link}\n",
            p.summary,
            e.created_at.format("%Y-%m-%d %H:%M UTC")
        ));
        items.push_str(&format!(
            "<li><a href=\"{}\">{}</a> ({})</li>",
            escape(&link),
            escape(&p.summary),
            e.created_at.format("%Y-%m-%d %H:%M UTC")
        ));
    }
    MailContent {
        html: html_page(
            &subject,
            &format!("<p>What happened since your last digest:</p><ul>{items}</ul>"),
        ),
        subject,
        text,
    }
}

/// The note to team admins that a webhook was turned off.
pub fn hook_disabled_mail(hook: &WebhookRow, public_url: &str) -> MailContent {
    // A platform hook is managed where platform admins manage webhooks.
    let link = match hook.team_id {
        Some(team) => format!("{public_url}/teams/{team}"),
        None => format!("{public_url}/webhooks"),
    };
    let summary = format!(
        "A webhook of your team was disabled after {} failed deliveries in a row",
        tessera_domain::notify::WEBHOOK_DISABLE_AFTER
    );
    let text = format!(
        "{summary}: {}\nLast error: {}\n\nTurn it on again on the team page: {link}\n",
        hook.url,
        hook.last_error.as_deref().unwrap_or("-")
    );
    MailContent {
        subject: format!("[Tessera] {summary}"),
        html: html_page(
            &summary,
            &format!(
                "<p>{}: <code>{}</code></p><p><a href=\"{}\">Turn it on again on the team page</a></p>",
                escape(&summary),
                escape(&hook.url),
                escape(&link)
            ),
        ),
        text,
    }
}
