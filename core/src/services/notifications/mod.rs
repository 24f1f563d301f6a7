//! Notifications (docs/notifications.md): a user's address and preferences, a team's
//! webhooks, and the delivery worker's steps that need rules: who gets an event and how
//! ([`Notifications::fan_out`]), nodes that stopped reporting, and where a webhook may
//! go. Sending itself (SMTP, HTTP) is the server's (`server/src/notify/`).

use super::authz::{self, Need};
use super::{found, internal};
use crate::at_rest::DataKeys;
use crate::auth::{Principal, SystemActor};
use crate::clock::Clock;
use crate::store::{Deliveries, NewDelivery, NewEvent, OutboxRow, Recipient, Store, WebhookRow};
use chrono::{DateTime, Duration, Utc};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use tessera_domain::error::AppError;
use tessera_domain::ids::{TeamId, UserId};
use tessera_domain::notify::{
    self, DeliveryView, EventKind, EventPayload, NotificationSettings, NotificationSettingsInput,
    NotifyMode, PreferenceView, WebhookCreated, WebhookInput, WebhookView,
};
use uuid::Uuid;

mod webhooks;

pub use webhooks::WebhookTestSender;

/// How many deliveries a webhook's log shows.
const LOG_LENGTH: i64 = 50;

#[derive(Clone)]
pub struct Notifications {
    store: Store,
    clock: Clock,
    keys: Arc<DataKeys>,
    /// Webhooks may go to loopback, link-local and private addresses (tests, labs).
    allow_private: bool,
    /// The hour (UTC) digests are sent at.
    digest_hour: u32,
}

/// Whose webhooks: a team's (its team admins manage them) or the platform's (platform
/// admins; they get every team's events and the platform's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookScope {
    Team(TeamId),
    Platform,
}

impl HookScope {
    /// The team, `None` for the platform's.
    pub fn team(self) -> Option<TeamId> {
        match self {
            HookScope::Team(t) => Some(t),
            HookScope::Platform => None,
        }
    }
}

impl From<TeamId> for HookScope {
    fn from(team: TeamId) -> Self {
        HookScope::Team(team)
    }
}

/// How long a verification link works.
const VERIFICATION_VALID: Duration = Duration::hours(24);

/// The sealing context of a verification token.
fn verification_context(user: UserId) -> String {
    format!("email_verifications.token:{user}")
}

impl Notifications {
    pub fn new(store: Store) -> Self {
        Notifications {
            store,
            clock: Clock::system(),
            keys: Arc::new(DataKeys::ephemeral()),
            allow_private: false,
            digest_hour: 7,
        }
    }

    /// Reads the time from `clock` instead of the system's.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The keys webhook secrets are sealed with (the server's data keys).
    pub fn with_data_keys(mut self, keys: Arc<DataKeys>) -> Self {
        self.keys = keys;
        self
    }

    /// Lets webhooks reach loopback, link-local and private addresses.
    pub fn allowing_private_webhooks(mut self, allow: bool) -> Self {
        self.allow_private = allow;
        self
    }

    /// Sends digests at this hour (UTC).
    pub fn with_digest_hour(mut self, hour: u32) -> Self {
        self.digest_hour = hour.min(23);
        self
    }

    // ---- My account ----

    /// The caller's address and a choice for every event kind.
    pub async fn settings(&self, p: &Principal) -> Result<NotificationSettings, AppError> {
        let me = found("loading user", self.store.recipient(p.user_id()).await)?;
        let chosen = self.modes(p.user_id()).await?;
        Ok(NotificationSettings {
            email: me.email,
            email_verified: me.email_verified,
            preferences: EventKind::ALL
                .into_iter()
                .filter(|k| k.has_preference())
                .filter(|k| *k != EventKind::NodeLost || p.is_admin())
                .map(|k| PreferenceView {
                    kind: k,
                    label: k.label().to_owned(),
                    mode: chosen.get(&k).copied().unwrap_or(k.default_mode()),
                    default: !chosen.contains_key(&k),
                })
                .collect(),
        })
    }

    /// Changes the caller's address (`""` removes it) and choices.
    pub async fn update_settings(
        &self,
        p: &Principal,
        input: &NotificationSettingsInput,
    ) -> Result<NotificationSettings, AppError> {
        let email = match input.email.as_deref().map(str::trim) {
            None => None,
            Some("") => Some(None),
            Some(e) => Some(Some(notify::parse_email(e, "email")?)),
        };
        if let Some(pref) = input.preferences.iter().find(|p| !p.kind.has_preference()) {
            return Err(AppError::invalid(
                "preferences",
                format!("{} is not a choice people make", pref.kind.as_str()),
            ));
        }
        if let Some(email) = email {
            let before = self
                .store
                .recipient(p.user_id())
                .await
                .map_err(internal("loading user"))?
                .and_then(|r| r.email);
            self.store
                .set_user_email(p.user_id(), email.as_deref())
                .await
                .map_err(internal("setting email"))?;
            if let Some(new) = email.filter(|e| before.as_deref() != Some(e.as_str())) {
                self.send_verification(p.user_id(), &new, self.clock.now())
                    .await?;
            }
        }
        for pref in &input.preferences {
            self.store
                .set_preference(p.user_id(), pref.kind, pref.mode)
                .await
                .map_err(internal("setting preference"))?;
        }
        self.settings(p).await
    }

    /// Mails a new link to the caller's unverified address (the last one stops working).
    /// At most one a minute.
    pub async fn resend_verification(&self, p: &Principal) -> Result<(), AppError> {
        let me = found("loading user", self.store.recipient(p.user_id()).await)?;
        let Some(email) = me.email.filter(|e| !e.is_empty()) else {
            return Err(AppError::invalid("email", "set an address first"));
        };
        if me.email_verified {
            return Err(AppError::conflict("the address is already verified"));
        }
        let now = self.clock.now();
        let open = self
            .store
            .email_verification(me.id)
            .await
            .map_err(internal("loading verification"))?;
        if open.is_some_and(|v| v.email == email && now - v.created_at < Duration::minutes(1)) {
            return Err(AppError::conflict(
                "a link was sent less than a minute ago; look for it, or ask again in a minute",
            ));
        }
        self.send_verification(me.id, &email, now).await
    }

    async fn send_verification(
        &self,
        user: UserId,
        email: &str,
        now: DateTime<Utc>,
    ) -> Result<(), AppError> {
        let token = crate::auth::secret::generate("tev").0;
        let sealed = self
            .keys
            .seal(&verification_context(user), &token)
            .map_err(|_| AppError::Internal)?;
        let payload = EventPayload {
            summary: "Verify your email address for Tessera".into(),
            path: "/account".into(),
            user_id: Some(user.0),
            detail: Some(format!(
                "Someone (we hope you) gave {email} as their address on Tessera. Open the link \
                 within {} hours to receive notifications there; ignore this mail otherwise.",
                VERIFICATION_VALID.num_hours()
            )),
            team_name: None,
            audience: None,
        };
        let event = NewEvent::new(EventKind::VerifyEmail, None, ("user", user.0), payload, now);
        self.store
            .start_email_verification(user, email, &sealed, now + VERIFICATION_VALID, &event)
            .await
            .map_err(internal("starting verification"))
    }

    /// Where the verification mail of `user` goes and the token its link carries, while
    /// the verification is open (the delivery worker writes the mail).
    pub async fn verification_mail(
        &self,
        user: UserId,
        now: DateTime<Utc>,
    ) -> Result<Option<(String, String)>, AppError> {
        let Some(v) = self
            .store
            .email_verification(user)
            .await
            .map_err(internal("loading verification"))?
            .filter(|v| v.expires_at > now)
        else {
            return Ok(None);
        };
        let token = self
            .keys
            .open(&verification_context(user), &v.token)
            .map_err(|e| {
                tracing::error!(user = %user, error = %e, "verification token does not open");
                AppError::Internal
            })?;
        Ok(Some((v.email, token)))
    }

    /// Verifies `user`'s address with the token from the mailed link (no sign-in: the
    /// token proves the mailbox). Errors name `token`.
    pub async fn verify_email(&self, user: UserId, token: &str) -> Result<(), AppError> {
        let invalid = || {
            AppError::invalid(
                "token",
                "this link is not valid: it expired, was used, or a newer one was sent \
                 (ask for a new one under My account → Notifications)",
            )
        };
        let (email, expected) = self
            .verification_mail(user, self.clock.now())
            .await?
            .ok_or_else(invalid)?;
        // Hashes compared: the time taken says nothing about the token.
        if crate::auth::secret::hash(token) != crate::auth::secret::hash(&expected) {
            return Err(invalid());
        }
        if !self
            .store
            .confirm_email(user, &email)
            .await
            .map_err(internal("verifying email"))?
        {
            return Err(invalid());
        }
        tracing::info!(user = %user, "email address verified");
        Ok(())
    }

    async fn modes(&self, user: UserId) -> Result<HashMap<EventKind, NotifyMode>, AppError> {
        Ok(self
            .store
            .preferences(user)
            .await
            .map_err(internal("loading preferences"))?
            .into_iter()
            .filter_map(|(k, m)| Some((EventKind::parse(&k).ok()?, NotifyMode::parse(&m).ok()?)))
            .collect())
    }

    // ---- the delivery worker's steps ----

    /// Writes the deliveries of up to `limit` new events: to each person the event is
    /// for, by their preference (an address is needed; `off` gets nothing), and to the
    /// team's enabled webhooks that want its kind. Returns how many events it handled.
    pub async fn fan_out(
        &self,
        _: &SystemActor,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<usize, AppError> {
        let events = self
            .store
            .unfanned_events(limit)
            .await
            .map_err(internal("loading outbox"))?;
        for e in &events {
            let deliveries = self.deliveries_of(e, now).await?;
            self.store
                .fan_out(e.id, &deliveries, now)
                .await
                .map_err(internal("writing deliveries"))?;
        }
        Ok(events.len())
    }

    async fn deliveries_of(
        &self,
        e: &OutboxRow,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewDelivery>, AppError> {
        let payload = e.payload();
        let mut people: BTreeMap<UserId, Recipient> = BTreeMap::new();
        if let Some(u) = payload.user_id
            && let Some(r) = self
                .store
                .recipient(UserId(u))
                .await
                .map_err(internal("loading user"))?
        {
            people.insert(r.id, r);
        }
        let audience = match (e.kind, payload.audience.as_deref()) {
            (EventKind::NodeLost, _) | (_, Some("platform_admins")) => {
                self.store.platform_admin_recipients().await
            }
            (_, Some("team_admins")) => match e.team_id {
                Some(t) => self.store.team_admin_recipients(t).await,
                None => Ok(Vec::new()),
            },
            _ => Ok(Vec::new()),
        }
        .map_err(internal("loading recipients"))?;
        people.extend(audience.into_iter().map(|r| (r.id, r)));
        let mut out = Vec::new();
        for r in people.values() {
            if e.kind == EventKind::VerifyEmail {
                // To the address being verified, whatever the preferences.
                out.push(NewDelivery {
                    channel: "email",
                    recipient: r.id.0,
                    next_try_at: now,
                });
                continue;
            }
            // Mail goes only to an address its owner proved.
            if r.email.as_deref().is_none_or(str::is_empty) || !r.email_verified {
                continue;
            }
            let mode = self
                .modes(r.id)
                .await?
                .get(&e.kind)
                .copied()
                .unwrap_or(e.kind.default_mode());
            match mode {
                NotifyMode::Off => {}
                NotifyMode::Immediate => out.push(NewDelivery {
                    channel: "email",
                    recipient: r.id.0,
                    next_try_at: now,
                }),
                NotifyMode::Digest => out.push(NewDelivery {
                    channel: "digest",
                    recipient: r.id.0,
                    next_try_at: notify::next_digest_at(e.created_at, self.digest_hour),
                }),
            }
        }
        if e.kind.goes_to_webhooks() {
            // The team's hooks and the platform's (which get every team's events).
            let hooks = self
                .store
                .hooks_for_event(e.team_id)
                .await
                .map_err(internal("loading webhooks"))?;
            out.extend(
                hooks
                    .iter()
                    .filter(|h| h.enabled && h.wants(e.kind))
                    .map(|h| NewDelivery {
                        channel: "webhook",
                        recipient: h.id,
                        next_try_at: now,
                    }),
            );
        }
        Ok(out)
    }

    /// Tells platform admins of nodes silent for longer than `grace`: one event per node
    /// and last report (a node that comes back and goes silent again is told again).
    pub async fn find_lost_nodes(
        &self,
        _: &SystemActor,
        now: DateTime<Utc>,
        grace: Duration,
    ) -> Result<usize, AppError> {
        let silent = self
            .store
            .silent_nodes(now - grace)
            .await
            .map_err(internal("loading nodes"))?;
        let mut told = 0;
        for (id, hostname, seen) in silent {
            let payload = EventPayload {
                summary: format!("Node {hostname} stopped reporting"),
                path: "/nodes".into(),
                user_id: None,
                detail: Some(format!("last report at {}", seen.to_rfc3339())),
                team_name: None,
                audience: Some("platform_admins".into()),
            };
            let event = NewEvent::new(EventKind::NodeLost, None, ("node", id), payload, now);
            let key = format!("node.lost:{id}:{}", seen.timestamp_micros());
            told += usize::from(self.record_finding(event, key).await?);
        }
        Ok(told)
    }

    /// Writes an event a pass found, keyed by `key` so finding it again writes nothing;
    /// `true` if it was new.
    async fn record_finding(&self, mut event: NewEvent, key: String) -> Result<bool, AppError> {
        event.dedupe_key = Some(key);
        self.store
            .record_event(&event)
            .await
            .map_err(internal("recording an event"))
    }

    /// Tells owners of allocations that end soon: once per allocation and end (extended,
    /// it is told again before its new end), at [`notify::expiry_warning_at`].
    pub async fn find_expiring(
        &self,
        _: &SystemActor,
        now: DateTime<Utc>,
        lead: Duration,
    ) -> Result<usize, AppError> {
        let ending = self
            .store
            .ending_allocations(now, now + lead)
            .await
            .map_err(internal("loading allocations"))?;
        let mut told = 0;
        // The query reads only allocations with both times.
        let due = ending
            .iter()
            .filter_map(|a| Some((a, a.active_at?, a.ends_at?)))
            .filter(|&(_, from, to)| notify::expiry_warning_at(from, to, lead) <= now);
        for (a, _, ends_at) in due {
            let payload = notify::allocation_payload(
                EventKind::Expiring,
                a.id.0,
                a.user_id.0,
                (&a.kind.to_string(), a.count),
                Some(ends_at),
                None,
            );
            let event = NewEvent::new(
                EventKind::Expiring,
                Some(a.team_id.0),
                ("allocation", a.id.0),
                payload,
                now,
            );
            let key = format!("expiring:{}:{}", a.id, ends_at.timestamp_micros());
            told += usize::from(self.record_finding(event, key).await?);
        }
        Ok(told)
    }

    /// The delivery queue, for the platform's delivery worker.
    pub fn deliveries(&self, _: &SystemActor) -> Deliveries {
        Deliveries::new(self.store.clone())
    }
}
