//! Notifications: the events Tessera tells people about, who wants them how, and the
//! shapes a webhook receives (docs/notifications.md).
//!
//! An event is written to the outbox in the same transaction as the change it tells of
//! (`core/src/store/outbox.rs`); the server's delivery worker turns it into one delivery
//! per channel and recipient and sends each at most once. This module holds only the pure
//! parts: the kinds and their defaults, the payload, the webhook body, and the checks on
//! what users type (an email address, a webhook URL).

use crate::alloc::PreemptCause;
use crate::error::AppError;
use chrono::{DateTime, Duration, NaiveTime, Utc};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use uuid::Uuid;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum EventKind {
    /// A job exited 0.
    #[serde(rename = "workload.succeeded")]
    WorkloadSucceeded,
    /// A job exited non-zero, could not start, or was lost with its node.
    #[serde(rename = "workload.failed")]
    WorkloadFailed,
    /// A notebook or job was stopped or cancelled.
    #[serde(rename = "workload.stopped")]
    WorkloadStopped,
    /// A workload was stopped because its allocation's time ran out.
    #[serde(rename = "workload.time_limit")]
    WorkloadTimeLimit,
    /// A request waits for approval (to those who may approve it).
    #[serde(rename = "request.needs_approval")]
    RequestNeedsApproval,
    /// A request was approved (to its requester).
    #[serde(rename = "request.approved")]
    RequestApproved,
    /// A request was denied (to its requester).
    #[serde(rename = "request.denied")]
    RequestDenied,
    /// A team's spend this month reached 50, 80 or 100 % of its budget (to team admins).
    #[serde(rename = "budget.threshold")]
    BudgetThreshold,
    /// A node stopped reporting (to platform admins).
    #[serde(rename = "node.lost")]
    NodeLost,
    /// A test delivery a team admin asked for (webhooks only).
    #[serde(rename = "webhook.test")]
    WebhookTest,
    /// A job that waited in the queue for its own GPU left it and is starting.
    #[serde(rename = "workload.started")]
    WorkloadStarted,
    /// A notebook is idle and will be stopped at a stated time unless it is used.
    #[serde(rename = "workload.idle_warning")]
    IdleWarning,
    /// An allocation will be preempted (capacity reclaimed, node drained, GPU unhealthy)
    /// at a stated deadline.
    #[serde(rename = "allocation.preemption_warning")]
    PreemptionWarning,
    /// An allocation was preempted.
    #[serde(rename = "allocation.preempted")]
    Preempted,
    /// An allocation ends soon (with a link to extend it).
    #[serde(rename = "allocation.expiring")]
    Expiring,
    /// A platform admin changed a team's quota (to the team's admins).
    #[serde(rename = "quota.changed")]
    QuotaChanged,
    /// A link that proves a user owns the address they gave (to that address only,
    /// whatever their preferences).
    #[serde(rename = "account.verify_email")]
    VerifyEmail,
}

impl EventKind {
    pub const ALL: [EventKind; 17] = [
        EventKind::WorkloadSucceeded,
        EventKind::WorkloadFailed,
        EventKind::WorkloadStopped,
        EventKind::WorkloadTimeLimit,
        EventKind::RequestNeedsApproval,
        EventKind::RequestApproved,
        EventKind::RequestDenied,
        EventKind::BudgetThreshold,
        EventKind::NodeLost,
        EventKind::WebhookTest,
        EventKind::WorkloadStarted,
        EventKind::IdleWarning,
        EventKind::PreemptionWarning,
        EventKind::Preempted,
        EventKind::Expiring,
        EventKind::QuotaChanged,
        EventKind::VerifyEmail,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::WorkloadSucceeded => "workload.succeeded",
            EventKind::WorkloadFailed => "workload.failed",
            EventKind::WorkloadStopped => "workload.stopped",
            EventKind::WorkloadTimeLimit => "workload.time_limit",
            EventKind::RequestNeedsApproval => "request.needs_approval",
            EventKind::RequestApproved => "request.approved",
            EventKind::RequestDenied => "request.denied",
            EventKind::BudgetThreshold => "budget.threshold",
            EventKind::NodeLost => "node.lost",
            EventKind::WebhookTest => "webhook.test",
            EventKind::WorkloadStarted => "workload.started",
            EventKind::IdleWarning => "workload.idle_warning",
            EventKind::PreemptionWarning => "allocation.preemption_warning",
            EventKind::Preempted => "allocation.preempted",
            EventKind::Expiring => "allocation.expiring",
            EventKind::QuotaChanged => "quota.changed",
            EventKind::VerifyEmail => "account.verify_email",
        }
    }

    /// Words for the preferences page.
    pub fn label(self) -> &'static str {
        match self {
            EventKind::WorkloadSucceeded => "My job succeeded",
            EventKind::WorkloadFailed => "My job or notebook failed",
            EventKind::WorkloadStopped => "My job or notebook was stopped",
            EventKind::WorkloadTimeLimit => "My job or notebook reached its time limit",
            EventKind::RequestNeedsApproval => "A request waits for my approval",
            EventKind::RequestApproved => "My request was approved",
            EventKind::RequestDenied => "My request was denied",
            EventKind::BudgetThreshold => "My team's budget reached 50/80/100 %",
            EventKind::NodeLost => "A node stopped reporting (platform admins)",
            EventKind::WebhookTest => "A webhook test",
            EventKind::WorkloadStarted => "My queued job left the queue and is starting",
            EventKind::IdleWarning => "My notebook is idle and will be stopped",
            EventKind::PreemptionWarning => "My allocation will be preempted",
            EventKind::Preempted => "My allocation was preempted",
            EventKind::Expiring => "My allocation ends soon",
            EventKind::QuotaChanged => "My team's quota changed",
            EventKind::VerifyEmail => "The link that verifies my address",
        }
    }

    /// How a user gets it until they choose: what needs attention at once, the rest in
    /// the daily digest.
    pub fn default_mode(self) -> NotifyMode {
        match self {
            EventKind::WorkloadSucceeded | EventKind::WorkloadStopped | EventKind::QuotaChanged => {
                NotifyMode::Digest
            }
            // Starting is good news nobody waits on by mail (Slurm's `BEGIN` is opt-in too).
            EventKind::WorkloadStarted | EventKind::WebhookTest => NotifyMode::Off,
            _ => NotifyMode::Immediate,
        }
    }

    /// Whether people choose how they get it (the preferences page lists it). A webhook
    /// test goes to webhooks only; an address check to the address, always at once.
    pub fn has_preference(self) -> bool {
        !matches!(self, EventKind::WebhookTest | EventKind::VerifyEmail)
    }

    /// Whether team and platform webhooks may get it (never an address check's link).
    pub fn goes_to_webhooks(self) -> bool {
        self != EventKind::VerifyEmail
    }

    pub fn parse(s: &str) -> Result<EventKind, AppError> {
        EventKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| AppError::invalid("kind", format!("unknown event kind '{s}'")))
    }
}

impl TryFrom<String> for EventKind {
    type Error = AppError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        EventKind::parse(&s)
    }
}

/// How a user wants an event kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum NotifyMode {
    /// One mail as soon as it happens.
    Immediate,
    /// Collected into one mail a day.
    Digest,
    /// Not at all.
    Off,
}

impl NotifyMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyMode::Immediate => "immediate",
            NotifyMode::Digest => "digest",
            NotifyMode::Off => "off",
        }
    }

    pub fn parse(s: &str) -> Result<NotifyMode, AppError> {
        match s {
            "immediate" => Ok(NotifyMode::Immediate),
            "digest" => Ok(NotifyMode::Digest),
            "off" => Ok(NotifyMode::Off),
            _ => Err(AppError::invalid(
                "mode",
                "must be immediate, digest or off",
            )),
        }
    }
}

impl TryFrom<String> for NotifyMode {
    type Error = AppError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        NotifyMode::parse(&s)
    }
}

/// What an outbox event carries (stored as JSON): enough to write the mail and the
/// webhook body without reading the object again, which may have changed since.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventPayload {
    /// One line for people: the mail's subject and the webhook's `text`.
    pub summary: String,
    /// The portal page of the object, as a path (`/workloads/<id>`).
    pub path: String,
    /// The user the event is about (a workload's owner, a request's requester).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<Uuid>,
    /// More words: a failure's reason, a denial's note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The team's name, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_name: Option<String>,
    /// Who is told besides `user_id`: `team_admins` or `platform_admins`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
}

/// The event kind of a workload that ended in `state` (`None`: not an end).
pub fn workload_end_kind(state: &str, message: Option<&str>) -> Option<EventKind> {
    let time_limit = message.is_some_and(|m| m.contains("time limit"));
    match state {
        "succeeded" => Some(EventKind::WorkloadSucceeded),
        "failed" | "lost" => Some(EventKind::WorkloadFailed),
        "stopped" | "cancelled" if time_limit => Some(EventKind::WorkloadTimeLimit),
        "stopped" | "cancelled" => Some(EventKind::WorkloadStopped),
        _ => None,
    }
}

/// The payload of a workload's step to `state`: its end, or `pending` (it left the queue).
pub fn workload_payload(
    (id, kind, name): (Uuid, &str, &str),
    state: &str,
    user: Uuid,
    exit_code: Option<i64>,
    message: Option<&str>,
) -> EventPayload {
    let code = exit_code
        .map(|c| format!(" (exit code {c})"))
        .unwrap_or_default();
    let summary = match state {
        "succeeded" => format!("Your {kind} `{name}` succeeded"),
        "failed" => format!("Your {kind} `{name}` failed{code}"),
        "lost" => format!("Your {kind} `{name}` was lost"),
        "cancelled" => format!("Your {kind} `{name}` was cancelled"),
        "pending" => format!("Your {kind} `{name}` left the queue and is starting"),
        _ => format!("Your {kind} `{name}` was stopped"),
    };
    EventPayload {
        summary,
        path: format!("/workloads/{id}"),
        user_id: Some(user),
        // A queued workload's message is why it waited: over now.
        detail: message
            .map(str::to_owned)
            .filter(|m| !m.is_empty() && state != "pending"),
        team_name: None,
        audience: None,
    }
}

/// The payload of a request's approval events: `needs_approval` goes to `approver`
/// (`team_admin` or `platform_admin`), `approved`/`denied` to the requester.
pub fn request_payload(
    kind: EventKind,
    id: Uuid,
    (user, username, team_name): (Uuid, &str, &str),
    (gpu_kind, count): (&str, i64),
    note: Option<&str>,
    approver: Option<&str>,
) -> EventPayload {
    let what = format!("{count}× {gpu_kind}");
    let summary = match kind {
        EventKind::RequestNeedsApproval => {
            format!("{username} asks for {what} in team {team_name}: approval needed")
        }
        EventKind::RequestApproved => format!("Your request for {what} was approved"),
        _ => format!("Your request for {what} was denied"),
    };
    EventPayload {
        summary,
        path: format!("/allocations/{id}"),
        user_id: (kind != EventKind::RequestNeedsApproval).then_some(user),
        detail: note.map(str::to_owned).filter(|n| !n.is_empty()),
        team_name: Some(team_name.to_owned()),
        audience: match (kind, approver) {
            (EventKind::RequestNeedsApproval, Some("platform_admin")) => {
                Some("platform_admins".into())
            }
            (EventKind::RequestNeedsApproval, _) => Some("team_admins".into()),
            _ => None,
        },
    }
}

fn utc_minute(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// Why an allocation was released at its preemption deadline (`None`: no cause recorded,
/// as a reclaim), for its history: the past-tense twin of [`preempt_cause_words`].
pub fn preempted_words(cause: Option<PreemptCause>) -> &'static str {
    match cause {
        Some(PreemptCause::Drain) => "its node was drained by a platform admin",
        Some(PreemptCause::Health) => {
            "its GPU turned unhealthy (a critical Xid or an uncorrectable ECC error) and was \
             taken out of service"
        }
        Some(PreemptCause::Booking) => "its capacity is booked by a team from this time on",
        Some(PreemptCause::Reclaim) | None => {
            "borrowed capacity reclaimed for a team's guaranteed share"
        }
    }
}

/// Why an allocation is preempted, for people.
pub fn preempt_cause_words(cause: PreemptCause) -> &'static str {
    match cause {
        PreemptCause::Drain => "its node is drained by a platform admin",
        PreemptCause::Health => "its GPU turned unhealthy and is taken out of service",
        PreemptCause::Booking => "its capacity is booked by a team from this time on",
        PreemptCause::Reclaim => "borrowed capacity is reclaimed for a team's guaranteed share",
    }
}

/// The payload of an event about an allocation, told to its owner `user`: a preemption
/// warning (deadline `at`, `detail` the cause), a preemption (`detail` the reason), or
/// an expiry warning (end `at`; the page has the extend form).
pub fn allocation_payload(
    kind: EventKind,
    id: Uuid,
    user: Uuid,
    (gpu_kind, count): (&str, i64),
    at: Option<DateTime<Utc>>,
    detail: Option<&str>,
) -> EventPayload {
    let what = format!("{count}× {gpu_kind}");
    let when = at.map(utc_minute).unwrap_or_default();
    let summary = match kind {
        EventKind::PreemptionWarning => {
            format!("Your allocation of {what} will be preempted at {when}")
        }
        EventKind::Expiring => {
            format!(
                "Your allocation of {what} ends at {when}: extend it on its page if you need more time"
            )
        }
        _ => format!("Your allocation of {what} was preempted"),
    };
    EventPayload {
        summary,
        path: format!("/allocations/{id}"),
        user_id: Some(user),
        detail: detail.map(str::to_owned).filter(|d| !d.is_empty()),
        team_name: None,
        audience: None,
    }
}

/// When an allocation running from `active_at` to `ends_at` is warned of its end: `lead`
/// before it, or a quarter of its length before it when that is shorter (a 30-minute
/// allocation is warned after 22½ minutes, not as it starts).
pub fn expiry_warning_at(
    active_at: DateTime<Utc>,
    ends_at: DateTime<Utc>,
    lead: Duration,
) -> DateTime<Utc> {
    let quarter = (ends_at - active_at) / 4;
    ends_at - lead.min(quarter).max(Duration::zero())
}

/// The payload of a notebook's idle warning: stopped at `stop_at` unless used.
pub fn idle_warning_payload(
    (id, name): (Uuid, &str),
    user: Uuid,
    idle_since: DateTime<Utc>,
    stop_at: DateTime<Utc>,
) -> EventPayload {
    EventPayload {
        summary: format!(
            "Your notebook `{name}` is idle and will be stopped at {}",
            utc_minute(stop_at)
        ),
        path: format!("/workloads/{id}"),
        user_id: Some(user),
        detail: Some(format!(
            "No kernel or GPU activity since {}. Use it (run a cell) to keep it.",
            utc_minute(idle_since)
        )),
        team_name: None,
        audience: None,
    }
}

/// A quota line's numbers: guaranteed, limit, per user.
pub type QuotaNumbers = (i64, i64, i64);

/// The payload of a quota change on team `team`'s line `model` (to its admins).
pub fn quota_payload(
    (team, team_name): (Uuid, &str),
    model: &str,
    before: Option<QuotaNumbers>,
    after: QuotaNumbers,
) -> EventPayload {
    let show = |(g, l, u): QuotaNumbers| format!("guaranteed {g}, limit {l}, per user {u}");
    EventPayload {
        summary: format!("Team {team_name}'s quota on {model} changed"),
        path: format!("/teams/{team}"),
        user_id: None,
        detail: Some(match before {
            Some(b) => format!("{} → {}", show(b), show(after)),
            None => format!("new line: {}", show(after)),
        }),
        team_name: Some(team_name.to_owned()),
        audience: Some("team_admins".into()),
    }
}

/// The budget thresholds that tell team admins, in percent.
pub const BUDGET_THRESHOLDS: [i64; 3] = [50, 80, 100];

/// The thresholds `spent` reached on a budget of `budget` (both minor units).
pub fn budget_thresholds_reached(spent: i64, budget: i64) -> Vec<i64> {
    if budget <= 0 {
        return Vec::new();
    }
    BUDGET_THRESHOLDS
        .into_iter()
        .filter(|t| i128::from(spent) * 100 >= i128::from(budget) * i128::from(*t))
        .collect()
}

/// What a webhook receives (`POST`, JSON). `text` makes it a Slack incoming-webhook
/// message as it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookBody {
    /// The event's id: the same on every retry, so a receiver can drop a repeat.
    pub id: Uuid,
    pub kind: EventKind,
    pub team_id: Option<Uuid>,
    /// What the event is about: `workload`, `allocation`, `team` or `node`.
    pub subject_kind: String,
    pub subject_id: Uuid,
    pub created_at: DateTime<Utc>,
    /// One line for people (Slack shows it).
    pub text: String,
    /// The object's page on the portal.
    pub link: String,
    pub payload: EventPayload,
}

/// The answer to a webhook test: what the receiver said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookTestResult {
    pub delivered: bool,
    pub status: Option<i64>,
    pub error: Option<String>,
}

/// A user's notification settings (`GET /api/v1/me/notifications`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NotificationSettings {
    pub email: Option<String>,
    pub email_verified: bool,
    pub preferences: Vec<PreferenceView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PreferenceView {
    pub kind: EventKind,
    pub label: String,
    pub mode: NotifyMode,
    /// Whether `mode` is the kind's default (no choice stored).
    pub default: bool,
}

/// A change to one's notification settings (`PUT /api/v1/me/notifications`): what is
/// given changes, the rest stays. `email: ""` removes the address.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NotificationSettingsInput {
    #[serde(default)]
    pub email: Option<String>,
    #[serde(default)]
    pub preferences: Vec<PreferenceInput>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PreferenceInput {
    pub kind: EventKind,
    pub mode: NotifyMode,
}

/// A team webhook as its team admins see it (never the secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookView {
    pub id: Uuid,
    /// `None`: a platform-wide hook.
    pub team_id: Option<Uuid>,
    pub url: String,
    /// The event kinds it gets; empty: all of the team's.
    pub events: Vec<EventKind>,
    pub enabled: bool,
    pub consecutive_failures: i64,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub last_delivery_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// The token from a verification link (`POST /api/v1/email-verifications`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EmailVerificationInput {
    /// The `user` of the link.
    pub user_id: crate::ids::UserId,
    /// The `token` of the link.
    pub token: String,
}

/// A new webhook, or a change to one (`PUT`: the whole hook; the secret stays).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WebhookInput {
    pub url: String,
    #[serde(default)]
    pub events: Vec<EventKind>,
    #[serde(default = "yes")]
    pub enabled: bool,
}

fn yes() -> bool {
    true
}

/// A webhook just created: its signing secret is shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookCreated {
    pub webhook: WebhookView,
    pub secret: String,
}

/// One delivery of an event to a webhook, for its delivery log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryView {
    pub id: Uuid,
    pub event_id: Uuid,
    pub kind: EventKind,
    pub state: String,
    pub attempts: i64,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub sent_at: Option<DateTime<Utc>>,
}

/// Checks an email address the way mail servers will take it: one `@`, a local part and
/// a domain with a dot, no spaces or control characters, at most 254 characters.
pub fn parse_email(s: &str, field: &str) -> Result<String, AppError> {
    let s = s.trim();
    let bad = |why: &str| AppError::invalid(field, why);
    if s.len() > 254 {
        return Err(bad("must be at most 254 characters"));
    }
    if s.chars()
        .any(|c| c.is_whitespace() || c.is_control() || "<>()[]\\,;:\"".contains(c))
    {
        return Err(bad("is not an email address (no spaces or <>()[],;:\")"));
    }
    let Some((local, domain)) = s.split_once('@') else {
        return Err(bad("is not an email address (name@example.org)"));
    };
    let labels_ok = domain.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    });
    if local.is_empty()
        || local.len() > 64
        || domain.contains('@')
        || !domain.contains('.')
        || !labels_ok
    {
        return Err(bad("is not an email address (name@example.org)"));
    }
    Ok(s.to_owned())
}

/// Checks a webhook URL's form: `http(s)://host[:port]/…`, no user or password, at most
/// 2,000 characters. Whether its address may be reached is the server's check
/// ([`address_is_public`]), after the name is resolved.
pub fn parse_webhook_url(s: &str) -> Result<String, AppError> {
    let s = s.trim();
    let bad = |why: &str| AppError::invalid("url", why);
    if s.len() > 2000 {
        return Err(bad("must be at most 2000 characters"));
    }
    let rest = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .ok_or_else(|| bad("must start with http:// or https://"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() {
        return Err(bad("must name a host"));
    }
    if authority.contains('@') {
        return Err(bad("must not carry a user name or password"));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("must not contain spaces"));
    }
    Ok(s.to_owned())
}

/// Whether a webhook may be sent to `ip` without the platform's allow setting: not
/// loopback, link-local, private (RFC 1918, unique local), unspecified, multicast,
/// broadcast, CGNAT or documentation space, and not an IPv4 address mapped into IPv6
/// that is any of these.
pub fn address_is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (64..128).contains(&o[1])))
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return address_is_public(IpAddr::V4(v4));
            }
            let s = v6.segments();
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80)
        }
    }
}

/// When the digest that collects an event of `at` is sent: the next `hour` (UTC) after it.
pub fn next_digest_at(at: DateTime<Utc>, hour: u32) -> DateTime<Utc> {
    let time = NaiveTime::from_hms_opt(hour.min(23), 0, 0).unwrap_or(NaiveTime::MIN);
    let today = at.date_naive().and_time(time).and_utc();
    if today > at {
        today
    } else {
        today + Duration::days(1)
    }
}

/// The backoff before retry `attempt` (1 = the first retry): 30 s doubling, at most 1 h.
pub fn retry_after(attempt: i64) -> Duration {
    let n = attempt.clamp(1, 8) - 1;
    Duration::seconds((30i64 << n).min(3600))
}

/// Tries after which a delivery is given up.
pub const MAX_ATTEMPTS: i64 = 8;

/// Consecutive failed deliveries after which a webhook is disabled.
pub const WEBHOOK_DISABLE_AFTER: i64 = 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_have_defaults() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::parse(k.as_str()).expect("parse"), k);
            let json = serde_json::to_string(&k).expect("json");
            assert_eq!(json, format!("\"{}\"", k.as_str()));
        }
        assert_eq!(
            EventKind::WorkloadFailed.default_mode(),
            NotifyMode::Immediate
        );
        assert_eq!(
            EventKind::WorkloadSucceeded.default_mode(),
            NotifyMode::Digest
        );
        assert!(EventKind::parse("job.exploded").is_err());
    }

    #[test]
    fn workload_ends_map_to_kinds() {
        assert_eq!(
            workload_end_kind("failed", None),
            Some(EventKind::WorkloadFailed)
        );
        assert_eq!(
            workload_end_kind("lost", None),
            Some(EventKind::WorkloadFailed)
        );
        assert_eq!(
            workload_end_kind("stopped", Some("its time limit was reached")),
            Some(EventKind::WorkloadTimeLimit)
        );
        assert_eq!(
            workload_end_kind("cancelled", None),
            Some(EventKind::WorkloadStopped)
        );
        assert_eq!(workload_end_kind("running", None), None);
        let p = workload_payload(
            (Uuid::nil(), "job", "train"),
            "failed",
            Uuid::nil(),
            Some(3),
            Some("exit status 3"),
        );
        assert_eq!(p.summary, "Your job `train` failed (exit code 3)");
        assert_eq!(p.detail.as_deref(), Some("exit status 3"));
    }

    #[test]
    fn thresholds() {
        assert_eq!(budget_thresholds_reached(49, 100), Vec::<i64>::new());
        assert_eq!(budget_thresholds_reached(50, 100), vec![50]);
        assert_eq!(budget_thresholds_reached(100, 100), vec![50, 80, 100]);
        assert_eq!(budget_thresholds_reached(5, 0), Vec::<i64>::new());
    }

    #[test]
    fn emails() {
        assert!(parse_email("ada@example.org", "email").is_ok());
        for bad in [
            "ada",
            "ada@",
            "@example.org",
            "ada@example",
            "a b@example.org",
            "a@b@c.org",
            "ada@-x.org",
        ] {
            let e = parse_email(bad, "email").expect_err(bad);
            assert!(
                matches!(e, AppError::Invalid { ref field, .. } if field == "email"),
                "{bad}"
            );
        }
    }

    #[test]
    fn urls_and_addresses() {
        assert!(parse_webhook_url("https://hooks.example.org/x").is_ok());
        for bad in ["ftp://x.org", "https://", "https://u:p@x.org/", "x.org"] {
            assert!(parse_webhook_url(bad).is_err(), "{bad}");
        }
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "169.254.169.254",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "100.64.0.1",
            "0.0.0.0",
        ] {
            assert!(
                !address_is_public(private.parse().expect("ip")),
                "{private}"
            );
        }
        for public in ["93.184.216.34", "2606:2800:220:1::1"] {
            assert!(address_is_public(public.parse().expect("ip")), "{public}");
        }
    }

    #[test]
    fn digests_and_backoff() {
        let at: DateTime<Utc> = "2026-03-01T10:00:00Z".parse().expect("t");
        assert_eq!(
            next_digest_at(at, 7).to_rfc3339(),
            "2026-03-02T07:00:00+00:00"
        );
        assert_eq!(
            next_digest_at(at, 18).to_rfc3339(),
            "2026-03-01T18:00:00+00:00"
        );
        assert_eq!(retry_after(1), Duration::seconds(30));
        assert_eq!(retry_after(2), Duration::seconds(60));
        assert_eq!(retry_after(20), Duration::seconds(3600));
    }

    #[test]
    fn leaving_the_queue_reads_as_starting_without_the_queue_reason() {
        assert_eq!(workload_end_kind("pending", None), None);
        assert_eq!(workload_end_kind("running", None), None);
        let id = Uuid::from_u128(7);
        let p = workload_payload(
            (id, "job", "train"),
            "pending",
            id,
            None,
            Some("waiting for 1× H100-80GB"),
        );
        assert_eq!(p.summary, "Your job `train` left the queue and is starting");
        assert_eq!(p.detail, None, "why it waited is over");
    }

    #[test]
    fn an_expiry_warning_comes_at_the_lead_or_a_quarter_before_the_end() {
        let start = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .expect("time")
            .with_timezone(&Utc);
        let lead = Duration::hours(1);
        // Eight hours: warned an hour before.
        assert_eq!(
            expiry_warning_at(start, start + Duration::hours(8), lead),
            start + Duration::hours(7)
        );
        // Thirty minutes: warned after 22½ minutes, not as it starts.
        assert_eq!(
            expiry_warning_at(start, start + Duration::minutes(30), lead),
            start + Duration::seconds(22 * 60 + 30)
        );
        // An end before the start (bad data) is warned at the end, not before it.
        assert_eq!(expiry_warning_at(start, start - lead, lead), start - lead);
    }

    #[test]
    fn the_new_kinds_have_their_audiences_and_choices() {
        assert_eq!(EventKind::WorkloadStarted.default_mode(), NotifyMode::Off);
        assert_eq!(EventKind::QuotaChanged.default_mode(), NotifyMode::Digest);
        assert_eq!(
            EventKind::PreemptionWarning.default_mode(),
            NotifyMode::Immediate
        );
        assert!(!EventKind::VerifyEmail.has_preference());
        assert!(!EventKind::VerifyEmail.goes_to_webhooks());
        assert!(!EventKind::WebhookTest.has_preference());
        assert!(EventKind::Expiring.has_preference());
        let id = Uuid::from_u128(7);
        let at = DateTime::parse_from_rfc3339("2026-01-01T10:30:00Z")
            .expect("time")
            .with_timezone(&Utc);
        let p = allocation_payload(
            EventKind::PreemptionWarning,
            id,
            id,
            ("H100-80GB", 2),
            Some(at),
            Some(preempt_cause_words(PreemptCause::Drain)),
        );
        assert_eq!(
            p.summary,
            "Your allocation of 2× H100-80GB will be preempted at 2026-01-01 10:30 UTC"
        );
        assert_eq!(p.path, format!("/allocations/{id}"));
        assert_eq!(p.user_id, Some(id));
        let q = quota_payload((id, "vision"), "H100-80GB", Some((1, 2, 1)), (1, 4, 2));
        assert_eq!(q.audience.as_deref(), Some("team_admins"));
        assert_eq!(
            q.detail.as_deref(),
            Some("guaranteed 1, limit 2, per user 1 → guaranteed 1, limit 4, per user 2")
        );
    }
}
