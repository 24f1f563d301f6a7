//! `outbox_events`, `notification_deliveries`, `notification_preferences`,
//! `team_webhooks`, and the users' `email` (docs/notifications.md).
//!
//! An event is inserted by [`record_event!`] inside the transaction of the change it tells
//! of, so it exists exactly when the change does. The delivery worker then writes one
//! delivery per channel and recipient ([`Store::fan_out`], one transaction, unique per
//! event × channel × recipient), takes each due one with a conditional `UPDATE`
//! (`pending` → `sending` under its claim, [`Store::claim_delivery`]) and records the outcome
//! only under that claim, so two workers never both send one delivery.

use super::{JsonText, NullableId, Store, StoreError, db, from_driver, in_tx, json_text};
use crate::at_rest::Sealed;
use chrono::{DateTime, Utc};
use tessera_domain::ids::{TeamId, UserId};
use tessera_domain::notify::{EventKind, EventPayload, NotifyMode};
use uuid::Uuid;

/// An event to write.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub id: Uuid,
    pub kind: EventKind,
    pub team_id: Option<TeamId>,
    pub subject_kind: &'static str,
    pub subject_id: Uuid,
    pub payload: EventPayload,
    /// Keeps an event a pass may find twice to one row.
    pub dedupe_key: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl NewEvent {
    pub fn new(
        kind: EventKind,
        team_id: Option<Uuid>,
        (subject_kind, subject_id): (&'static str, Uuid),
        payload: EventPayload,
        at: DateTime<Utc>,
    ) -> NewEvent {
        NewEvent {
            id: Uuid::now_v7(),
            kind,
            team_id: team_id.map(TeamId),
            subject_kind,
            subject_id,
            payload,
            dedupe_key: None,
            created_at: at,
        }
    }

    pub fn payload_json(&self) -> String {
        // A struct of strings and ids always serializes.
        serde_json::to_string(&self.payload).unwrap_or_else(|_| "{}".into())
    }
}

pub(super) const EVENT_INSERT: &str = "INSERT INTO outbox_events (id, kind, team_id, subject_kind, \
    subject_id, payload, dedupe_key, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
    ON CONFLICT (dedupe_key) DO NOTHING";

/// Inserts `$event` (a [`NewEvent`]) in the transaction `$tx`.
macro_rules! record_event {
    ($tx:expr, $event:expr) => {{
        let e: &$crate::store::outbox::NewEvent = $event;
        sqlx::query($crate::store::outbox::EVENT_INSERT_PUB)
            .bind(e.id)
            .bind(e.kind.as_str())
            .bind(e.team_id.map(|v| v.0))
            .bind(e.subject_kind)
            .bind(e.subject_id)
            .bind(e.payload_json())
            .bind(&e.dedupe_key)
            .bind(e.created_at)
            .execute(&mut *$tx)
            .await?;
    }};
}
pub(crate) use record_event;

/// Records a request's approval event `$kind` about allocation `$id` in `$tx`, with the
/// approver (`team_admin`/`platform_admin`) for `needs_approval`.
macro_rules! request_event {
    ($tx:expr, $id:expr, $kind:expr, $note:expr, $approver:expr, $at:expr) => {{
        let id: tessera_domain::ids::AllocationId = $id;
        let id = id.0;
        let (team, user, gpu_kind, count, username, team_name): (
            uuid::Uuid,
            uuid::Uuid,
            String,
            i64,
            String,
            String,
        ) = sqlx::query_as(
            "SELECT a.team_id, a.user_id, a.kind, a.count, u.username, t.name \
             FROM allocations a JOIN users u ON u.id = a.user_id \
             JOIN teams t ON t.id = a.team_id WHERE a.id = $1",
        )
        .bind(id)
        .fetch_one(&mut *$tx)
        .await?;
        let payload = tessera_domain::notify::request_payload(
            $kind,
            id,
            (user, &username, &team_name),
            (&gpu_kind, count),
            $note,
            $approver,
        );
        let event = $crate::store::outbox::NewEvent::new(
            $kind,
            Some(team),
            ("allocation", id),
            payload,
            $at,
        );
        $crate::store::outbox::record_event!($tx, &event);
    }};
}
pub(crate) use request_event;

/// Records event `$kind` about allocation `$id` for its owner in `$tx` ([`tessera_domain::notify::allocation_payload`]:
/// a preemption warning with its deadline, a preemption, an expiry warning), keyed by
/// `$key` when one is given (a pass that finds it twice writes one row).
macro_rules! allocation_event {
    ($tx:expr, $id:expr, $kind:expr, $at:expr, $detail:expr, $key:expr, $now:expr) => {{
        let id: tessera_domain::ids::AllocationId = $id;
        let id = id.0;
        let (team, user, gpu_kind, count): (uuid::Uuid, uuid::Uuid, String, i64) =
            sqlx::query_as("SELECT team_id, user_id, kind, count FROM allocations WHERE id = $1")
                .bind(id)
                .fetch_one(&mut *$tx)
                .await?;
        let payload = tessera_domain::notify::allocation_payload(
            $kind,
            id,
            user,
            (&gpu_kind, count),
            $at,
            $detail,
        );
        let mut event = $crate::store::outbox::NewEvent::new(
            $kind,
            Some(team),
            ("allocation", id),
            payload,
            $now,
        );
        event.dedupe_key = $key;
        $crate::store::outbox::record_event!($tx, &event);
    }};
}
pub(crate) use allocation_event;

/// Records the budget thresholds team `$team` reached in the month starting `$month`
/// (a `NaiveDate`), once each (keyed by team, month and threshold), in `$tx`.
macro_rules! budget_events {
    ($tx:expr, $team:expr, $month:expr, $now:expr) => {{
        let team: uuid::Uuid = $team;
        let budget: Option<(i64, String)> = sqlx::query_as(
            "SELECT b.monthly_minor, t.name FROM budgets b JOIN teams t ON t.id = b.team_id \
             WHERE b.team_id = $1",
        )
        .bind(team)
        .fetch_optional(&mut *$tx)
        .await?;
        if let Some((monthly, team_name)) = budget {
            let (from, to) = tessera_domain::billing::month_bounds($month);
            let spent: i64 = sqlx::query_scalar(
                "SELECT CAST(COALESCE(SUM(amount_minor), 0) AS BIGINT) FROM ledger_entries \
                 WHERE account <> 'platform' AND team_id = $1 AND hour_start >= $2 \
                 AND hour_start < $3",
            )
            .bind(team)
            .bind(from)
            .bind(to)
            .fetch_one(&mut *$tx)
            .await?;
            let month = from.format("%Y-%m").to_string();
            for pct in tessera_domain::notify::budget_thresholds_reached(spent, monthly) {
                let payload = tessera_domain::notify::EventPayload {
                    summary: format!(
                        "Team {team_name} has spent {pct} % of its budget for {month}"
                    ),
                    path: format!("/teams/{team}"),
                    user_id: None,
                    detail: Some(format!("{spent} of {monthly} (minor units)")),
                    team_name: Some(team_name.clone()),
                    audience: Some("team_admins".into()),
                };
                let mut event = $crate::store::outbox::NewEvent::new(
                    tessera_domain::notify::EventKind::BudgetThreshold,
                    Some(team),
                    ("team", team),
                    payload,
                    $now,
                );
                event.dedupe_key = Some(format!("budget:{team}:{month}:{pct}"));
                $crate::store::outbox::record_event!($tx, &event);
            }
        }
    }};
}
pub(crate) use budget_events;

pub(crate) const EVENT_INSERT_PUB: &str = EVENT_INSERT;

/// An event as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxRow {
    pub id: Uuid,
    #[sqlx(try_from = "String")]
    pub kind: EventKind,
    #[sqlx(try_from = "NullableId")]
    pub team_id: Option<TeamId>,
    pub subject_kind: String,
    pub subject_id: Uuid,
    pub payload: String,
    pub created_at: DateTime<Utc>,
}

impl OutboxRow {
    /// The payload (an older or damaged one reads as its summary only).
    pub fn payload(&self) -> EventPayload {
        serde_json::from_str(&self.payload).unwrap_or_else(|e| {
            tracing::warn!(event = %self.id, error = %e,
                "an event's payload does not parse: it is delivered as its summary only");
            self.summary_only()
        })
    }

    fn summary_only(&self) -> EventPayload {
        EventPayload {
            summary: self.kind.as_str().to_owned(),
            path: "/".into(),
            user_id: None,
            detail: None,
            team_name: None,
            audience: None,
        }
    }
}

const EVENT_COLS: &str =
    "e.id, e.kind, e.team_id, e.subject_kind, e.subject_id, e.payload, e.created_at";

/// A delivery to write.
#[derive(Debug, Clone)]
pub struct NewDelivery {
    pub channel: &'static str,
    pub recipient: Uuid,
    pub next_try_at: DateTime<Utc>,
}

/// A delivery with its event, as a worker sends it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct DeliveryRow {
    #[sqlx(rename = "delivery_id")]
    pub id: Uuid,
    pub channel: String,
    pub recipient: Uuid,
    pub state: String,
    pub attempts: i64,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub sent_at: Option<DateTime<Utc>>,
    pub delivery_created_at: DateTime<Utc>,
    #[sqlx(flatten)]
    pub event: OutboxRow,
}

const DELIVERY_COLS: &str = "d.id AS delivery_id, d.channel, d.recipient, d.state, d.attempts, d.last_status, \
    d.last_error, d.sent_at, d.created_at AS delivery_created_at";

/// A person who may get mail.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Recipient {
    #[sqlx(try_from = "Uuid")]
    pub id: UserId,
    pub username: String,
    pub email: Option<String>,
    pub email_verified: bool,
}

/// An open email verification.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EmailVerification {
    #[sqlx(try_from = "Uuid")]
    pub user_id: UserId,
    pub email: String,
    pub token: Sealed,
    pub expires_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
}

/// A team webhook as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct WebhookRow {
    pub id: Uuid,
    /// `None`: a platform-wide hook.
    #[sqlx(try_from = "NullableId")]
    pub team_id: Option<TeamId>,
    pub url: String,
    pub secret: Sealed,
    /// The event kinds' names (a JSON list in the table, read as such: a list that does not
    /// parse fails the read); empty: all.
    #[sqlx(try_from = "JsonText")]
    pub events: Vec<String>,
    pub enabled: bool,
    pub consecutive_failures: i64,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub last_delivery_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

impl WebhookRow {
    /// The kinds it asked for that this release knows (a kind a later release dropped is
    /// left out).
    pub fn event_kinds(&self) -> Vec<EventKind> {
        self.events
            .iter()
            .filter_map(|k| EventKind::parse(k).ok())
            .collect()
    }

    /// Whether it gets events of `kind`: all when it named none; only those it named
    /// otherwise (a hook that named only kinds unknown here gets nothing, not everything).
    pub fn wants(&self, kind: EventKind) -> bool {
        self.events.is_empty() || self.event_kinds().contains(&kind)
    }
}

const HOOK_COLS: &str = "id, team_id, url, secret, events, enabled, consecutive_failures, \
    last_status, last_error, last_delivery_at, created_at";

impl Store {
    /// Writes an event on its own (a pass's finding, keyed by its `dedupe_key`); `false`
    /// if one with that key exists.
    pub async fn record_event(&self, e: &NewEvent) -> Result<bool, StoreError> {
        db!(self, pool => sqlx::query(EVENT_INSERT)
            .bind(e.id).bind(e.kind.as_str()).bind(e.team_id.map(|v| v.0)).bind(e.subject_kind)
            .bind(e.subject_id).bind(e.payload_json()).bind(&e.dedupe_key).bind(e.created_at)
            .execute(pool).await.map(|r| r.rows_affected() == 1))
    }

    /// Events whose deliveries are not written yet, oldest first.
    pub async fn unfanned_events(&self, limit: i64) -> Result<Vec<OutboxRow>, StoreError> {
        let sql = format!(
            "SELECT {EVENT_COLS} FROM outbox_events e WHERE NOT e.fanned_out \
             ORDER BY e.created_at, e.id LIMIT $1"
        );
        db!(self, pool => sqlx::query_as::<_, OutboxRow>(&sql).bind(limit).fetch_all(pool).await)
    }

    /// Writes an event's deliveries and marks it fanned out, in one transaction (a rerun
    /// after a crash writes none twice).
    pub async fn fan_out(
        &self,
        event: Uuid,
        deliveries: &[NewDelivery],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let sql = "INSERT INTO notification_deliveries (id, event_id, channel, recipient, state, \
                   next_try_at, created_at) VALUES ($1, $2, $3, $4, 'pending', $5, $6) \
                   ON CONFLICT (event_id, channel, recipient) DO NOTHING";
        let r: Result<(), sqlx::Error> = in_tx!(self, tx => {
            for d in deliveries {
                sqlx::query(sql).bind(Uuid::now_v7()).bind(event).bind(d.channel)
                    .bind(d.recipient).bind(d.next_try_at).bind(now)
                    .execute(&mut *tx).await?;
            }
            sqlx::query("UPDATE outbox_events SET fanned_out = TRUE WHERE id = $1")
                .bind(event).execute(&mut *tx).await?;
        });
        from_driver(r)
    }

    /// An event's delivery on `channel` to `recipient`.
    pub async fn delivery_by_event(
        &self,
        event: Uuid,
        channel: &str,
        recipient: Uuid,
    ) -> Result<Option<DeliveryRow>, StoreError> {
        let sql = format!(
            "SELECT {DELIVERY_COLS}, {EVENT_COLS} FROM notification_deliveries d \
             JOIN outbox_events e ON e.id = d.event_id \
             WHERE d.event_id = $1 AND d.channel = $2 AND d.recipient = $3"
        );
        db!(self, pool => sqlx::query_as::<_, DeliveryRow>(&sql).bind(event).bind(channel)
            .bind(recipient).fetch_optional(pool).await)
    }

    /// A delivery with its event.
    pub async fn delivery(&self, id: Uuid) -> Result<Option<DeliveryRow>, StoreError> {
        let sql = format!(
            "SELECT {DELIVERY_COLS}, {EVENT_COLS} FROM notification_deliveries d \
             JOIN outbox_events e ON e.id = d.event_id WHERE d.id = $1"
        );
        db!(self, pool => sqlx::query_as::<_, DeliveryRow>(&sql).bind(id).fetch_optional(pool).await)
    }

    // ---- recipients and preferences ----

    /// A user as a recipient (enabled users only).
    pub async fn recipient(&self, user: UserId) -> Result<Option<Recipient>, StoreError> {
        let sql = "SELECT id, username, email, email_verified FROM users \
                   WHERE id = $1 AND NOT disabled";
        db!(self, pool => sqlx::query_as::<_, Recipient>(sql).bind(user.0).fetch_optional(pool).await)
    }

    /// A team's admins (enabled users).
    pub async fn team_admin_recipients(&self, team: TeamId) -> Result<Vec<Recipient>, StoreError> {
        let sql = "SELECT u.id, u.username, u.email, u.email_verified FROM memberships m \
                   JOIN users u ON u.id = m.user_id \
                   WHERE m.team_id = $1 AND m.role = 'team_admin' AND NOT u.disabled \
                   ORDER BY u.username";
        db!(self, pool => sqlx::query_as::<_, Recipient>(sql).bind(team.0).fetch_all(pool).await)
    }

    /// The platform admins (enabled users).
    pub async fn platform_admin_recipients(&self) -> Result<Vec<Recipient>, StoreError> {
        let sql = "SELECT id, username, email, email_verified FROM users \
                   WHERE is_admin AND NOT disabled ORDER BY username";
        db!(self, pool => sqlx::query_as::<_, Recipient>(sql).fetch_all(pool).await)
    }

    /// A user's stored choices.
    pub async fn preferences(&self, user: UserId) -> Result<Vec<(String, String)>, StoreError> {
        let sql = "SELECT event_kind, mode FROM notification_preferences WHERE user_id = $1";
        db!(self, pool => sqlx::query_as::<_, (String, String)>(sql).bind(user.0).fetch_all(pool).await)
    }

    /// Sets a user's address (`None` removes it); a changed address is not verified.
    pub async fn set_user_email(
        &self,
        user: UserId,
        email: Option<&str>,
    ) -> Result<(), StoreError> {
        let sql = "UPDATE users SET email_verified = CASE WHEN email = $2 THEN email_verified ELSE FALSE END, \
                   email = $2 WHERE id = $1";
        db!(self, pool => sqlx::query(sql).bind(user.0).bind(email).execute(pool).await.map(|_| ()))
    }

    /// Opens (or replaces) `user`'s verification of `email` with the sealed `token`, and
    /// writes the event that mails the link, in one transaction.
    pub async fn start_email_verification(
        &self,
        user: UserId,
        email: &str,
        token: &Sealed,
        expires_at: DateTime<Utc>,
        event: &NewEvent,
    ) -> Result<(), StoreError> {
        let sql = "INSERT INTO email_verifications (user_id, email, token, expires_at, created_at) \
                   VALUES ($1, $2, $3, $4, $5) ON CONFLICT (user_id) DO UPDATE SET \
                   email = excluded.email, token = excluded.token, \
                   expires_at = excluded.expires_at, created_at = excluded.created_at";
        in_tx!(self, tx => {
            sqlx::query(sql).bind(user.0).bind(email).bind(token).bind(expires_at)
                .bind(event.created_at).execute(&mut *tx).await?;
            record_event!(tx, event);
        })
    }

    /// `user`'s open verification.
    pub async fn email_verification(
        &self,
        user: UserId,
    ) -> Result<Option<EmailVerification>, StoreError> {
        let sql = "SELECT user_id, email, token, expires_at, created_at FROM email_verifications \
                   WHERE user_id = $1";
        db!(self, pool => sqlx::query_as::<_, EmailVerification>(sql).bind(user.0).fetch_optional(pool).await)
    }

    /// Marks `user`'s address verified if it is still `email`, and closes the
    /// verification; `false` if the address changed meanwhile.
    pub async fn confirm_email(&self, user: UserId, email: &str) -> Result<bool, StoreError> {
        in_tx!(self, tx => {
            let done = sqlx::query("UPDATE users SET email_verified = TRUE WHERE id = $1 AND email = $2")
                .bind(user.0).bind(email).execute(&mut *tx).await?.rows_affected() == 1;
            sqlx::query("DELETE FROM email_verifications WHERE user_id = $1")
                .bind(user.0).execute(&mut *tx).await?;
            done
        })
    }

    /// Takes an address the identity provider vouches for (`email_verified` claim) as
    /// `user`'s verified address, unless they set another one themselves.
    pub async fn adopt_idp_email(&self, user: UserId, email: &str) -> Result<(), StoreError> {
        let sql = "UPDATE users SET email = $2, email_verified = TRUE \
                   WHERE id = $1 AND (email IS NULL OR email = '' OR email = $2)";
        db!(self, pool => sqlx::query(sql).bind(user.0).bind(email).execute(pool).await.map(|_| ()))
    }

    /// Stores a user's choice for `kind`.
    pub async fn set_preference(
        &self,
        user: UserId,
        kind: EventKind,
        mode: NotifyMode,
    ) -> Result<(), StoreError> {
        let sql = "INSERT INTO notification_preferences (user_id, event_kind, mode) \
                   VALUES ($1, $2, $3) ON CONFLICT (user_id, event_kind) DO UPDATE \
                   SET mode = excluded.mode";
        db!(self, pool => sqlx::query(sql).bind(user.0).bind(kind.as_str()).bind(mode.as_str())
            .execute(pool).await.map(|_| ()))
    }

    // ---- webhooks ----

    pub async fn insert_webhook(&self, w: &WebhookRow) -> Result<(), StoreError> {
        let sql = "INSERT INTO team_webhooks (id, team_id, url, secret, events, enabled, created_at) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7)";
        let events = json_text(&w.events)?;
        db!(self, pool => sqlx::query(sql).bind(w.id).bind(w.team_id.map(|v| v.0)).bind(&w.url).bind(&w.secret)
            .bind(&events).bind(w.enabled).bind(w.created_at).execute(pool).await.map(|_| ()))
    }

    /// Changes a hook's URL, events and switch; turning it on again clears its failures.
    pub async fn update_webhook(
        &self,
        id: Uuid,
        url: &str,
        events: &[String],
        enabled: bool,
    ) -> Result<bool, StoreError> {
        let events = json_text(events)?;
        let sql = "UPDATE team_webhooks SET url = $2, events = $3, \
                   consecutive_failures = CASE WHEN $4 AND NOT enabled THEN 0 ELSE consecutive_failures END, \
                   enabled = $4 WHERE id = $1";
        db!(self, pool => sqlx::query(sql).bind(id).bind(url).bind(&events).bind(enabled)
            .execute(pool).await.map(|r| r.rows_affected() == 1))
    }

    pub async fn delete_webhook(&self, id: Uuid) -> Result<bool, StoreError> {
        db!(self, pool => sqlx::query("DELETE FROM team_webhooks WHERE id = $1").bind(id)
            .execute(pool).await.map(|r| r.rows_affected() == 1))
    }

    pub async fn webhook(&self, id: Uuid) -> Result<Option<WebhookRow>, StoreError> {
        let sql = format!("SELECT {HOOK_COLS} FROM team_webhooks WHERE id = $1");
        db!(self, pool => sqlx::query_as::<_, WebhookRow>(&sql).bind(id).fetch_optional(pool).await)
    }

    /// A team's hooks, or (`None`) the platform's.
    pub async fn scope_webhooks(
        &self,
        team: Option<TeamId>,
    ) -> Result<Vec<WebhookRow>, StoreError> {
        let sql = format!(
            "SELECT {HOOK_COLS} FROM team_webhooks WHERE team_id = $1 OR ($1 IS NULL AND team_id IS NULL) \
             ORDER BY created_at, id"
        );
        db!(self, pool => sqlx::query_as::<_, WebhookRow>(&sql).bind(team.map(|v| v.0)).fetch_all(pool).await)
    }

    /// The hooks an event of `team` (`None`: a platform event) goes to: the team's and
    /// the platform's.
    pub async fn hooks_for_event(
        &self,
        team: Option<TeamId>,
    ) -> Result<Vec<WebhookRow>, StoreError> {
        let sql = format!(
            "SELECT {HOOK_COLS} FROM team_webhooks WHERE team_id IS NULL OR team_id = $1 \
             ORDER BY created_at, id"
        );
        db!(self, pool => sqlx::query_as::<_, WebhookRow>(&sql).bind(team.map(|v| v.0)).fetch_all(pool).await)
    }

    /// A webhook's latest deliveries, newest first.
    pub async fn webhook_deliveries(
        &self,
        hook: Uuid,
        limit: i64,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        let sql = format!(
            "SELECT {DELIVERY_COLS}, {EVENT_COLS} FROM notification_deliveries d \
             JOIN outbox_events e ON e.id = d.event_id \
             WHERE d.channel = 'webhook' AND d.recipient = $1 \
             ORDER BY d.created_at DESC, d.id DESC LIMIT $2"
        );
        db!(self, pool => sqlx::query_as::<_, DeliveryRow>(&sql).bind(hook).bind(limit).fetch_all(pool).await)
    }

    // ---- what passes find ----

    /// Registered nodes that have not reported since `before`, with their last report.
    pub async fn silent_nodes(
        &self,
        before: DateTime<Utc>,
    ) -> Result<Vec<(Uuid, String, DateTime<Utc>)>, StoreError> {
        let sql = "SELECT id, hostname, last_heartbeat_at FROM nodes \
                   WHERE revoked_at IS NULL AND last_heartbeat_at IS NOT NULL \
                   AND last_heartbeat_at < $1";
        db!(self, pool => sqlx::query_as::<_, (Uuid, String, DateTime<Utc>)>(sql).bind(before).fetch_all(pool).await)
    }
}

/// The outbox's delivery queue as the delivery worker (in the server) works it: what is due,
/// taking a delivery, its outcome, digests, a webhook's result, and whom to send to. The
/// worker holds this, not the store.
#[derive(Clone)]
pub struct Deliveries(Store);

impl Deliveries {
    pub fn new(store: Store) -> Self {
        Deliveries(store)
    }

    /// Due immediate deliveries (`email`, `webhook`), oldest first: candidates for
    /// [`Store::claim_delivery`].
    pub async fn due_deliveries(
        &self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        let sql = format!(
            "SELECT {DELIVERY_COLS}, {EVENT_COLS} FROM notification_deliveries d \
             JOIN outbox_events e ON e.id = d.event_id \
             WHERE d.state = 'pending' AND d.channel IN ('email', 'webhook') \
             AND d.next_try_at <= $1 ORDER BY d.next_try_at, d.id LIMIT $2"
        );
        db!(&self.0, pool => sqlx::query_as::<_, DeliveryRow>(&sql).bind(now).bind(limit).fetch_all(pool).await)
    }

    /// Takes a pending delivery for sending under `claim`; `false` if another worker took
    /// it (or it was sent) meanwhile.
    pub async fn claim_delivery(
        &self,
        id: Uuid,
        claim: Uuid,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE notification_deliveries SET state = 'sending', claimed_by = $2, \
                   claimed_at = $3, attempts = attempts + 1 WHERE id = $1 AND state = 'pending'";
        db!(&self.0, pool => sqlx::query(sql).bind(id).bind(claim).bind(now).execute(pool).await
            .map(|r| r.rows_affected() == 1))
    }

    /// Gives back deliveries a worker took before `before` under another claim and never
    /// finished (its process died between taking and recording): they are due again.
    pub async fn reclaim_stale_deliveries(
        &self,
        mine: Uuid,
        before: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        let sql = "UPDATE notification_deliveries SET state = 'pending', claimed_by = NULL \
                   WHERE state = 'sending' AND claimed_by <> $1 AND claimed_at < $2";
        db!(&self.0, pool => sqlx::query(sql).bind(mine).bind(before).execute(pool).await
            .map(|r| r.rows_affected()))
    }

    /// Records a delivery sent (only under the claim that took it).
    pub async fn delivery_sent(
        &self,
        id: Uuid,
        claim: Uuid,
        status: Option<i64>,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE notification_deliveries SET state = 'sent', sent_at = $3, \
                   last_status = $4, last_error = NULL WHERE id = $1 AND state = 'sending' \
                   AND claimed_by = $2";
        db!(&self.0, pool => sqlx::query(sql).bind(id).bind(claim).bind(now).bind(status)
            .execute(pool).await.map(|r| r.rows_affected() == 1))
    }

    /// Records a failed try: due again at `retry_at`, or given up (`None`).
    pub async fn delivery_failed(
        &self,
        id: Uuid,
        claim: Uuid,
        (status, error): (Option<i64>, &str),
        retry_at: Option<DateTime<Utc>>,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE notification_deliveries SET \
                   state = CASE WHEN $3 THEN 'pending' ELSE 'failed' END, \
                   next_try_at = COALESCE($4, next_try_at), last_status = $5, last_error = $6, \
                   claimed_by = NULL WHERE id = $1 AND state = 'sending' AND claimed_by = $2";
        db!(&self.0, pool => sqlx::query(sql).bind(id).bind(claim).bind(retry_at.is_some())
            .bind(retry_at).bind(status).bind(error).execute(pool).await
            .map(|r| r.rows_affected() == 1))
    }

    /// Takes every due digest delivery under `claim` (one statement) and returns them with
    /// their events, by recipient then time.
    pub async fn claim_digests(
        &self,
        claim: Uuid,
        now: DateTime<Utc>,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        let take = "UPDATE notification_deliveries SET state = 'sending', claimed_by = $1, \
                    claimed_at = $2, attempts = attempts + 1 \
                    WHERE channel = 'digest' AND state = 'pending' AND next_try_at <= $2";
        let read = format!(
            "SELECT {DELIVERY_COLS}, {EVENT_COLS} FROM notification_deliveries d \
             JOIN outbox_events e ON e.id = d.event_id \
             WHERE d.claimed_by = $1 AND d.state = 'sending' \
             ORDER BY d.recipient, e.created_at, e.id"
        );
        db!(&self.0, pool => {
            sqlx::query(take).bind(claim).bind(now).execute(pool).await?;
            sqlx::query_as::<_, DeliveryRow>(&read).bind(claim).fetch_all(pool).await
        })
    }

    /// Records a webhook delivery's outcome on the hook; a failure that makes
    /// `disable_after` in a row turns it off. Returns whether this turned it off.
    pub async fn webhook_result(
        &self,
        id: Uuid,
        ok: bool,
        (status, error): (Option<i64>, Option<&str>),
        disable_after: i64,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE team_webhooks SET \
                   consecutive_failures = CASE WHEN $2 THEN 0 ELSE consecutive_failures + 1 END, \
                   enabled = enabled AND ($2 OR consecutive_failures + 1 < $5), \
                   last_status = $3, last_error = $4, last_delivery_at = $6 \
                   WHERE id = $1 RETURNING enabled";
        let before = self.0.webhook(id).await?.is_some_and(|w| w.enabled);
        let after: Option<bool> = db!(&self.0, pool => sqlx::query_scalar(sql).bind(id).bind(ok)
            .bind(status).bind(error).bind(disable_after).bind(now).fetch_optional(pool).await)?;
        Ok(before && after == Some(false))
    }

    /// A user's address, if they may be written to (see [`Store::recipient`]).
    pub async fn recipient(&self, user: UserId) -> Result<Option<Recipient>, StoreError> {
        self.0.recipient(user).await
    }

    /// The webhook a delivery goes to.
    pub async fn webhook(&self, id: Uuid) -> Result<Option<WebhookRow>, StoreError> {
        self.0.webhook(id).await
    }

    /// Whom to tell that a team's hook (`Some(team)`) or a platform hook was turned off.
    pub async fn hook_admins(&self, team: Option<TeamId>) -> Result<Vec<Recipient>, StoreError> {
        match team {
            Some(team) => self.0.team_admin_recipients(team).await,
            None => self.0.platform_admin_recipients().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{JsonText, WebhookRow};
    use crate::at_rest::Sealed;
    use tessera_domain::notify::EventKind;

    fn hook(events: &[&str]) -> WebhookRow {
        WebhookRow {
            id: uuid::Uuid::nil(),
            team_id: None,
            url: "https://hooks.example/x".into(),
            secret: Sealed::clear("s"),
            events: events.iter().map(|e| (*e).to_owned()).collect(),
            enabled: true,
            consecutive_failures: 0,
            last_status: None,
            last_error: None,
            last_delivery_at: None,
            created_at: chrono::DateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_hook_gets_what_it_named_and_nothing_when_it_named_only_unknown_kinds() {
        let kind = EventKind::NodeLost;
        assert!(hook(&[]).wants(kind), "named none: all");
        assert!(hook(&[kind.as_str()]).wants(kind));
        assert!(
            !hook(&["a.kind.from.a.later.release"]).wants(kind),
            "not everything"
        );
        let damaged = Vec::<String>::try_from(JsonText("not json".into()));
        assert!(
            damaged.is_err(),
            "a list that does not parse fails the read"
        );
    }
}
