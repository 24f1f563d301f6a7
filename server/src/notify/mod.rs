//! The notification delivery worker (docs/notifications.md), run by the leader only.
//!
//! Each pass: write the deliveries of new outbox events (`Notifications::fan_out`), note
//! nodes that stopped reporting, give back deliveries a dead leader took and never
//! finished, then send what is due: each delivery is taken with one conditional `UPDATE`
//! under this worker's claim before it is sent, and its outcome is recorded only under
//! that claim, so two leaders (an old one not yet stopped, a new one) never both send it.
//! A failed try is retried with backoff ([`tessera_domain::notify::retry_after`]) up to
//! [`MAX_ATTEMPTS`]; a webhook that fails [`WEBHOOK_DISABLE_AFTER`] times in a row is
//! turned off and its team admins are told. Digests: every due `digest` delivery of a
//! user goes into one mail.

pub mod mail;
pub mod webhook;

use crate::config::ServeConfig;
use crate::settings::Secret;
use chrono::{DateTime, Utc};
use clap::Args;
use clap::builder::BoolishValueParser;
use futures_util::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tessera_core::Services;
use tessera_core::auth::SystemActor;
use tessera_core::store::DeliveryRow;
use tessera_domain::ids::UserId;
use tessera_domain::notify::{MAX_ATTEMPTS, WEBHOOK_DISABLE_AFTER, retry_after};
use uuid::Uuid;

/// Notification settings (`TESSERA_SMTP_URL`, `TESSERA_MAIL_FROM`, …).
#[derive(Debug, Clone, Args)]
pub struct NotifySettings {
    /// The SMTP server notification mail goes through: `smtp://host:25` (plain, or
    /// STARTTLS with `?tls=required`), `smtps://host:465` (TLS), with
    /// `user:password@` when it asks for a login. Without it no mail is sent (webhooks
    /// still are).
    #[arg(long, env = "TESSERA_SMTP_URL", hide_env_values = true)]
    pub smtp_url: Option<Secret>,

    /// The sender of notification mail, e.g. `Tessera <gpu@example.org>`.
    #[arg(
        long,
        env = "TESSERA_MAIL_FROM",
        default_value = "Tessera <tessera@localhost>"
    )]
    pub mail_from: String,

    /// Let team webhooks reach loopback, link-local and private addresses (tests and
    /// closed labs only: otherwise a team admin could make the server call internal
    /// services).
    #[arg(long, env = "TESSERA_WEBHOOK_ALLOW_PRIVATE", value_parser = BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub webhook_allow_private: bool,

    /// How often the delivery worker looks for due notifications (e.g. `2s`).
    #[arg(long, env = "TESSERA_NOTIFY_INTERVAL", default_value = "2s", value_parser = crate::settings::parse_duration)]
    pub notify_interval: Duration,

    /// How long before its end an allocation's owner is warned (with a link to extend
    /// it); a short allocation is warned a quarter of its length before its end instead.
    #[arg(long, env = "TESSERA_EXPIRY_WARNING", default_value = "1h", value_parser = crate::settings::parse_duration)]
    pub expiry_warning: Duration,

    /// The hour (UTC, 0–23) daily digests are sent at.
    #[arg(long, env = "TESSERA_DIGEST_HOUR", default_value_t = 7, value_parser = clap::value_parser!(u32).range(0..24))]
    pub digest_hour: u32,
}

/// A delivery taken under another claim and not finished after this long is given back
/// (its worker died between taking and recording it). Longer than any one send.
pub const STALE_CLAIM: Duration = Duration::from_secs(60);

/// Deliveries one pass sends at most (and new events it fans out).
const BATCH: i64 = 200;

/// Deliveries sent at once.
const SENDERS: usize = 16;

/// What sends: the services, the mail transport, the HTTP client, and this worker's claim.
#[derive(Clone)]
pub struct Notifier {
    services: Arc<Services>,
    /// What the worker runs as.
    system: SystemActor,
    mailer: Option<mail::Mailer>,
    http: reqwest::Client,
    /// The portal's address, for links.
    public_url: String,
    /// This worker's claim on the deliveries it takes (new each start).
    claim: Uuid,
    node_grace: chrono::Duration,
    stale_claim: chrono::Duration,
    expiry_warning: chrono::Duration,
}

impl Notifier {
    pub fn new(
        services: Arc<Services>,
        system: SystemActor,
        config: &ServeConfig,
    ) -> anyhow::Result<Notifier> {
        let mailer = config
            .notify
            .smtp_url
            .as_ref()
            .map(|u| mail::Mailer::new(u.expose(), &config.notify.mail_from))
            .transpose()?;
        Ok(Notifier {
            services,
            system,
            mailer,
            http: webhook::client(config.notify.webhook_allow_private)?,
            public_url: config.public_url(),
            claim: Uuid::new_v4(),
            node_grace: chrono::Duration::from_std(config.node_grace)
                .unwrap_or(chrono::Duration::minutes(3)),
            stale_claim: chrono::Duration::from_std(STALE_CLAIM)
                .unwrap_or(chrono::Duration::minutes(1)),
            expiry_warning: chrono::Duration::from_std(config.notify.expiry_warning)
                .unwrap_or(chrono::Duration::hours(1)),
        })
    }

    /// Gives back deliveries taken under other claims at once (a test that simulates a
    /// dead leader; the worker waits [`STALE_CLAIM`]).
    pub fn with_stale_claim(mut self, after: chrono::Duration) -> Self {
        self.stale_claim = after;
        self
    }

    /// One pass at `now` (digests included); returns how many deliveries it finished.
    pub async fn pass(&self, now: DateTime<Utc>) -> usize {
        self.pass_and_more(now).await.0
    }

    /// One pass; also whether it left work behind (a full batch of events or sends).
    async fn pass_and_more(&self, now: DateTime<Utc>) -> (usize, bool) {
        let n = &self.services.notifications;
        if let Err(e) = n.find_lost_nodes(&self.system, now, self.node_grace).await {
            tracing::warn!(error = %e, "notifications: looking for lost nodes failed");
        }
        if let Err(e) = n
            .find_expiring(&self.system, now, self.expiry_warning)
            .await
        {
            tracing::warn!(error = %e, "notifications: looking for ending allocations failed");
        }
        // One batch of new events per pass, then sending: under a burst, fan-out and
        // sending take turns (the loop runs the next pass at once while work is left).
        let fanned = match n.fan_out(&self.system, now, BATCH).await {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e, "notifications: writing deliveries failed");
                0
            }
        };
        let deliveries = n.deliveries(&self.system);
        let store = &deliveries;
        match store
            .reclaim_stale_deliveries(self.claim, now - self.stale_claim)
            .await
        {
            Ok(0) => {}
            Ok(k) => tracing::warn!(
                deliveries = k,
                "notifications: deliveries a stopped leader took but did not finish are due again"
            ),
            Err(e) => tracing::warn!(error = %e, "notifications: reclaiming deliveries failed"),
        }
        let due = match store.due_deliveries(now, BATCH).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "notifications: loading due deliveries failed");
                return (0, false);
            }
        };
        // Up to SENDERS at once: a send waits on a remote server far longer than on the
        // database.
        let done: usize = futures_util::stream::iter(due)
            .map(|d| async move {
                match store.claim_delivery(d.id, self.claim, Utc::now()).await {
                    Ok(true) => {
                        self.send_one(&d).await;
                        1
                    }
                    Ok(false) => 0,
                    Err(e) => {
                        tracing::warn!(error = %e, "notifications: taking a delivery failed");
                        0
                    }
                }
            })
            .buffer_unordered(SENDERS)
            .fold(0, |sum, k| async move { sum + k })
            .await;
        let more = fanned as i64 == BATCH || done as i64 == BATCH;
        (done + self.digests(now).await, more)
    }

    /// Sends one delivery this worker has taken and records the outcome.
    async fn send_one(&self, d: &DeliveryRow) {
        let result = match d.channel.as_str() {
            "email" => self.mail_one(d).await,
            "webhook" => self.webhook_one(d).await,
            other => Err((None, format!("unknown channel {other}"))),
        };
        let store = self.services.notifications.deliveries(&self.system);
        let now = Utc::now();
        let recorded = match result {
            Ok(status) => store.delivery_sent(d.id, self.claim, status, now).await,
            Err((status, error)) => {
                let attempts = d.attempts + 1;
                let retry = (attempts < MAX_ATTEMPTS).then(|| now + retry_after(attempts));
                tracing::info!(delivery = %d.id, channel = %d.channel, attempts, error = %error, "notification not delivered");
                store
                    .delivery_failed(d.id, self.claim, (status, &error), retry)
                    .await
            }
        };
        match recorded {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(delivery = %d.id, "notification outcome not recorded: the delivery was taken back meanwhile")
            }
            Err(e) => tracing::warn!(error = %e, "notifications: recording a delivery failed"),
        }
    }

    async fn mail_one(&self, d: &DeliveryRow) -> Result<Option<i64>, (Option<i64>, String)> {
        let Some(mailer) = &self.mailer else {
            return Err((None, "no SMTP server configured (TESSERA_SMTP_URL)".into()));
        };
        if d.event.kind == tessera_domain::notify::EventKind::VerifyEmail {
            let open = self
                .services
                .notifications
                .verification_mail(d.recipient.into(), Utc::now())
                .await
                .map_err(|e| (None, e.to_string()))?;
            let Some((to, token)) = open else {
                return Err((
                    None,
                    "no open verification (verified, expired or replaced)".into(),
                ));
            };
            let msg = mail::verification_mail(&d.event, d.recipient, &token, &self.public_url);
            return mailer
                .send(&to, &msg, d.id)
                .await
                .map(|()| None)
                .map_err(|e| (None, e));
        }
        let to = self.address_of(d.recipient.into()).await?;
        let msg = mail::event_mail(&d.event, &self.public_url);
        mailer
            .send(&to, &msg, d.id)
            .await
            .map(|()| None)
            .map_err(|e| (None, e))
    }

    async fn address_of(&self, user: UserId) -> Result<String, (Option<i64>, String)> {
        match self
            .services
            .notifications
            .deliveries(&self.system)
            .recipient(user)
            .await
        {
            Ok(Some(r)) if !r.email_verified => {
                Err((None, "the user's address is not verified".into()))
            }
            Ok(Some(r)) => r
                .email
                .filter(|e| !e.is_empty())
                .ok_or((None, "the user has no email address".into())),
            Ok(None) => Err((None, "the user is gone or disabled".into())),
            Err(e) => Err((None, format!("loading the user failed: {e}"))),
        }
    }

    async fn webhook_one(&self, d: &DeliveryRow) -> Result<Option<i64>, (Option<i64>, String)> {
        let n = &self.services.notifications;
        let hook = match n.deliveries(&self.system).webhook(d.recipient).await {
            Ok(Some(h)) if h.enabled => h,
            Ok(Some(_)) => return Err((None, "the webhook is disabled".into())),
            Ok(None) => return Err((None, "the webhook was removed".into())),
            Err(e) => return Err((None, format!("loading the webhook failed: {e}"))),
        };
        let result = match (
            n.check_destination(&hook.url).await,
            n.webhook_secret(&hook),
        ) {
            (Err(e), _) => Err((None, e.to_string())),
            (_, Err(e)) => Err((None, e.to_string())),
            (Ok(()), Ok(secret)) => {
                let body = webhook::body(&d.event, &self.public_url);
                webhook::send(&self.http, &hook.url, &secret, d.id, &body).await
            }
        };
        let (ok, status, error) = match &result {
            Ok(s) => (true, *s, None),
            Err((s, e)) => (false, *s, Some(e.as_str())),
        };
        match n
            .deliveries(&self.system)
            .webhook_result(
                hook.id,
                ok,
                (status, error),
                WEBHOOK_DISABLE_AFTER,
                Utc::now(),
            )
            .await
        {
            Ok(true) => {
                tracing::warn!(webhook = %hook.id, team = ?hook.team_id, "webhook disabled after {WEBHOOK_DISABLE_AFTER} failures in a row");
                self.tell_disabled(&hook).await;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "notifications: recording a webhook's result failed")
            }
        }
        result
    }

    /// Mails the team admins (a platform hook: the platform admins) that a hook was turned off (directly, not through the
    /// outbox: a note about the notification system itself).
    async fn tell_disabled(&self, hook: &tessera_core::store::WebhookRow) {
        let Some(mailer) = &self.mailer else { return };
        let store = self.services.notifications.deliveries(&self.system);
        let admins = store.hook_admins(hook.team_id).await;
        let Ok(admins) = admins else {
            return;
        };
        let msg = mail::hook_disabled_mail(hook, &self.public_url);
        for a in admins {
            if let Some(to) = a.email.filter(|e| !e.is_empty())
                && let Err(e) = mailer.send(&to, &msg, Uuid::new_v4()).await
            {
                tracing::warn!(error = %e, "could not tell a team admin that a webhook was disabled");
            }
        }
    }

    /// Sends every due digest: one mail per user with all their collected events.
    pub async fn digests(&self, now: DateTime<Utc>) -> usize {
        let store = self.services.notifications.deliveries(&self.system);
        let taken = match store.claim_digests(self.claim, now).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "notifications: taking digests failed");
                return 0;
            }
        };
        let mut by_user: BTreeMap<Uuid, Vec<DeliveryRow>> = BTreeMap::new();
        for d in taken {
            by_user.entry(d.recipient).or_default().push(d);
        }
        let mut done = 0;
        for (user, items) in by_user {
            let result = match (&self.mailer, self.address_of(user.into()).await) {
                (None, _) => Err("no SMTP server configured (TESSERA_SMTP_URL)".to_owned()),
                (_, Err((_, e))) => Err(e),
                (Some(m), Ok(to)) => {
                    let events: Vec<_> = items.iter().map(|d| d.event.clone()).collect();
                    let msg = mail::digest_mail(&events, &self.public_url);
                    m.send(&to, &msg, items[0].id).await
                }
            };
            let now = Utc::now();
            for d in &items {
                let r = match &result {
                    Ok(()) => store.delivery_sent(d.id, self.claim, None, now).await,
                    Err(e) => {
                        let attempts = d.attempts + 1;
                        let retry = (attempts < MAX_ATTEMPTS).then(|| now + retry_after(attempts));
                        store
                            .delivery_failed(d.id, self.claim, (None, e), retry)
                            .await
                    }
                };
                if let Err(e) = r {
                    tracing::warn!(error = %e, "notifications: recording a digest failed");
                }
            }
            done += items.len();
        }
        done
    }
}

/// The leader's delivery loop.
pub async fn run(services: Arc<Services>, system: SystemActor, config: Arc<ServeConfig>) {
    let notifier = match Notifier::new(services, system, &config) {
        Ok(n) => n,
        Err(e) => {
            tracing::error!(error = %e, "notifications are off: the SMTP settings do not work");
            return;
        }
    };
    loop {
        // A pass that filled a batch left work behind: the next one starts at once.
        if !notifier.pass_and_more(Utc::now()).await.1 {
            tokio::time::sleep(config.notify.notify_interval).await;
        }
    }
}
