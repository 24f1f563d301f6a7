//! GPU allocations: what a team asks for, what it costs against its quota, who must
//! approve it, where it waits, whom it may preempt, and how it is shown.
//!
//! # Kinds and units
//!
//! A [`GpuKind`] names one unit of an allocation. Forms and REST use one string form:
//!
//! | kind string | meaning | units (H100-80GB) |
//! |---|---|---|
//! | `H100-80GB:1g.10gb` | one MIG instance of profile `1g.10gb` | 1 |
//! | `H100-80GB:whole` | one whole GPU | 7 |
//! | `H100-80GB:share:250` | 250 milli-GPU (a quarter) of a shared GPU | 250 (of `H100-80GB:shared`) |
//!
//! An allocation is `count` of a kind (2 × `1g.10gb`, 4 whole GPUs); a share is always
//! count 1. Quota is counted per [`GpuKind::quota_key`]: MIG slices and whole GPUs of a
//! model count in **units = compute slices of the model** (7 on A100/H100/H200/B200, 4 on
//! A30) against the model's quota (`H100-80GB`): a MIG profile costs its compute slices, a
//! whole GPU all of the model's. Shares count exactly, in **milli-GPU**, against the
//! model's shared quota (`H100-80GB:shared`): a share of `m` milli costs `m`.
//!
//! # Lifecycle
//!
//! | from | may go to |
//! |---|---|
//! | `pending_approval` | `queued`, `denied`, `cancelled` |
//! | `queued` | `placing`, `cancelled`, `failed` |
//! | `placing` | `active`, `queued` (placement undone), `failed`, `cancelled` |
//! | `active` | `releasing`, `failed` |
//! | `releasing` | `ended`, `expired`, `preempted`, `failed` |
//! | `ended`, `denied`, `cancelled`, `expired`, `preempted`, `failed` | nothing (terminal) |
//!
//! Leaving `active` always goes through `releasing`; the [`ReleaseCause`] recorded then
//! (released, expired, preempted) names the terminal state once the GPU is torn down.
//! `queued`, `placing`, `active` and `releasing` hold quota; `pending_approval` does not.
//!
//! # Admission
//!
//! A team's [`Quota`] on a model has a `guaranteed` share, a `limit` it may borrow up to,
//! and a `per_user` cap. [`admit`] admits an ask that keeps the team within its limit and
//! the user within the per-user cap; units beyond the guarantee are *borrowed* (and may be
//! preempted). Otherwise a team admin approves if the team stays within its guarantee
//! (only the per-user cap is exceeded), else a platform admin.
//!
//! # Queue order
//!
//! [`order_queue`] sorts by priority class (high first), then by fair share ascending,
//! then by age (older first), then by id. A team's fair share is
//!
//! ```text
//! share = recent usage (unit-seconds over the last 7 days) / guaranteed units
//! ```
//!
//! compared exactly by `u128` cross-multiplication; a team with no guarantee sorts after
//! every team with one (and among themselves by recent usage).
//!
//! # Preemption
//!
//! A team that asks within its guarantee may reclaim units that other teams borrow:
//! [`select_victims`] takes preemptible allocations before normal before high, newest
//! first, never drives a team below its guarantee, and returns `None` rather than
//! preempting in vain.

use crate::error::AppError;
use crate::ids::{TeamId, UserId};
use crate::mig::{Catalog, GpuModel};
use chrono::{DateTime, NaiveDateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use uuid::Uuid;

// ---------------------------------------------------------------------------------------
// Kinds and units
// ---------------------------------------------------------------------------------------

/// The most milli-GPU one share may have (a whole GPU's worth).
pub const SHARE_MILLI_MAX: u32 = 1000;

/// What one unit of an allocation is. The string form (see the module docs) round-trips
/// through [`FromStr`] and [`Display`](fmt::Display); serde uses it too.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum GpuKind {
    /// A MIG instance of `profile` (e.g. `1g.10gb`).
    Mig { model: String, profile: String },
    /// A whole GPU.
    Whole { model: String },
    /// `milli` (1..=1000) milli-GPU of a time-shared GPU.
    Share { model: String, milli: u32 },
}

const KIND_FORMAT: &str =
    "use MODEL:PROFILE, MODEL:whole or MODEL:share:MILLI, e.g. H100-80GB:1g.10gb";

fn share_range_error() -> AppError {
    AppError::invalid(
        "kind",
        "a share is 1 to 1000 milli-GPU, e.g. H100-80GB:share:250",
    )
}

impl FromStr for GpuKind {
    type Err = AppError;

    /// Parses the syntax only; [`GpuKind::canonical`] checks it against a catalog.
    fn from_str(s: &str) -> Result<Self, AppError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(AppError::invalid("kind", "is required"));
        }
        let bad = || AppError::invalid("kind", KIND_FORMAT);
        let mut parts = s.split(':').map(str::trim);
        let model = parts
            .next()
            .filter(|m| !m.is_empty())
            .ok_or_else(bad)?
            .to_owned();
        let what = parts.next().filter(|p| !p.is_empty()).ok_or_else(bad)?;
        let arg = parts.next();
        if parts.next().is_some() {
            return Err(bad());
        }
        match arg {
            None if what.eq_ignore_ascii_case("whole") => Ok(GpuKind::Whole { model }),
            None if what.eq_ignore_ascii_case("share") => Err(share_range_error()),
            None => Ok(GpuKind::Mig {
                model,
                profile: what.to_owned(),
            }),
            Some(milli) if what.eq_ignore_ascii_case("share") => {
                let milli = milli
                    .parse::<u32>()
                    .ok()
                    .filter(|m| (1..=SHARE_MILLI_MAX).contains(m))
                    .ok_or_else(share_range_error)?;
                Ok(GpuKind::Share { model, milli })
            }
            Some(_) => Err(bad()),
        }
    }
}

impl fmt::Display for GpuKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuKind::Mig { model, profile } => write!(f, "{model}:{profile}"),
            GpuKind::Whole { model } => write!(f, "{model}:whole"),
            GpuKind::Share { model, milli } => write!(f, "{model}:share:{milli}"),
        }
    }
}

impl TryFrom<String> for GpuKind {
    type Error = AppError;
    fn try_from(s: String) -> Result<Self, AppError> {
        s.parse()
    }
}

impl From<GpuKind> for String {
    fn from(k: GpuKind) -> Self {
        k.to_string()
    }
}

impl GpuKind {
    /// The model as written (canonical after [`GpuKind::canonical`]).
    pub fn model(&self) -> &str {
        match self {
            GpuKind::Mig { model, .. }
            | GpuKind::Whole { model }
            | GpuKind::Share { model, .. } => model,
        }
    }

    /// Words for people: `1g.10gb on H100-80GB`, `whole H100-80GB`, `25% share of H100-80GB`.
    pub fn label(&self) -> String {
        match self {
            GpuKind::Mig { model, profile } => format!("{profile} on {model}"),
            GpuKind::Whole { model } => format!("whole {model}"),
            GpuKind::Share { model, milli } => {
                let (whole, tenth) = (milli / 10, milli % 10);
                if tenth == 0 {
                    format!("{whole}% share of {model}")
                } else {
                    format!("{whole}.{tenth}% share of {model}")
                }
            }
        }
    }

    /// The same kind with the catalog's spelling of model and profile
    /// (`H100-SXM5-80GB:1G.10GB` → `H100-80GB:1g.10gb`); errors on `kind` if the model
    /// or profile is unknown or a share is out of range.
    pub fn canonical(&self, catalog: &Catalog) -> Result<GpuKind, AppError> {
        let model = find_model(catalog, self.model())?;
        let name = model.name().to_owned();
        Ok(match self {
            GpuKind::Mig { profile, .. } => GpuKind::Mig {
                model: name,
                profile: find_profile(model, profile)?.name.clone(),
            },
            GpuKind::Whole { .. } => GpuKind::Whole { model: name },
            GpuKind::Share { milli, .. } => {
                check_milli(*milli)?;
                GpuKind::Share {
                    model: name,
                    milli: *milli,
                }
            }
        })
    }

    /// The quota line this kind counts against: the model (`H100-80GB`) for MIG slices
    /// and whole GPUs, in compute slices; the model's shared quota (`H100-80GB:shared`)
    /// for shares, in milli-GPU.
    pub fn quota_key(&self) -> String {
        match self {
            GpuKind::Share { model, .. } => shared_quota_key(model),
            GpuKind::Mig { model, .. } | GpuKind::Whole { model } => model.clone(),
        }
    }

    /// Units one of this kind costs on its [`quota_key`](Self::quota_key): compute
    /// slices of its model, or a share's milli-GPU (see the module docs).
    pub fn unit_cost(&self, catalog: &Catalog) -> Result<u32, AppError> {
        let model = find_model(catalog, self.model())?;
        let slices = u32::from(model.compute_slices());
        match self {
            GpuKind::Mig { profile, .. } => {
                Ok(u32::from(find_profile(model, profile)?.compute_slices))
            }
            GpuKind::Whole { .. } => Ok(slices),
            GpuKind::Share { milli, .. } => {
                check_milli(*milli)?;
                Ok(*milli)
            }
        }
    }

    /// Units `count` of this kind cost against quota.
    pub fn units(&self, count: u32, catalog: &Catalog) -> Result<u32, AppError> {
        self.unit_cost(catalog)?
            .checked_mul(count)
            .ok_or_else(|| AppError::invalid("count", "is too large"))
    }
}

/// The quota line of `model`'s shares (milli-GPU): `H100-80GB:shared`.
pub fn shared_quota_key(model: &str) -> String {
    format!("{model}{SHARED_QUOTA_SUFFIX}")
}

/// What [`shared_quota_key`] appends.
pub const SHARED_QUOTA_SUFFIX: &str = ":shared";

/// The model of a quota line and whether it is the shared one (`H100-80GB:shared` →
/// `("H100-80GB", true)`).
pub fn split_quota_key(key: &str) -> (&str, bool) {
    match key.strip_suffix(SHARED_QUOTA_SUFFIX) {
        Some(model) => (model, true),
        None => (key, false),
    }
}

fn check_milli(milli: u32) -> Result<(), AppError> {
    if (1..=SHARE_MILLI_MAX).contains(&milli) {
        Ok(())
    } else {
        Err(share_range_error())
    }
}

fn find_model<'c>(catalog: &'c Catalog, name: &str) -> Result<&'c GpuModel, AppError> {
    catalog.get(name).ok_or_else(|| {
        let known: Vec<&str> = catalog.models().map(GpuModel::name).collect();
        AppError::invalid(
            "kind",
            format!(
                "unknown GPU model {name}; known models: {}",
                known.join(", ")
            ),
        )
    })
}

fn find_profile<'m>(
    model: &'m GpuModel,
    profile: &str,
) -> Result<&'m crate::mig::Profile, AppError> {
    model
        .profiles()
        .iter()
        .find(|p| p.name.eq_ignore_ascii_case(profile))
        .ok_or_else(|| {
            let offered: Vec<&str> = model.profiles().iter().map(|p| p.name.as_str()).collect();
            AppError::invalid(
                "kind",
                format!(
                    "{} has no MIG profile {profile}; it offers {}",
                    model.name(),
                    offered.join(", ")
                ),
            )
        })
}

// ---------------------------------------------------------------------------------------
// Priority
// ---------------------------------------------------------------------------------------

/// How urgent an allocation is; orders as `High > Normal > Preemptible`.
///
/// Who may ask for `High` is an authorization question for the server, not decided here.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum PriorityClass {
    /// Runs on spare capacity and is the first to be preempted.
    Preemptible,
    #[default]
    Normal,
    High,
}

impl PriorityClass {
    pub const ALL: [PriorityClass; 3] = [
        PriorityClass::High,
        PriorityClass::Normal,
        PriorityClass::Preemptible,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PriorityClass::High => "high",
            PriorityClass::Normal => "normal",
            PriorityClass::Preemptible => "preemptible",
        }
    }
}

impl FromStr for PriorityClass {
    type Err = AppError;
    fn from_str(s: &str) -> Result<Self, AppError> {
        match s.trim() {
            "high" => Ok(PriorityClass::High),
            "normal" => Ok(PriorityClass::Normal),
            "preemptible" => Ok(PriorityClass::Preemptible),
            _ => Err(AppError::invalid(
                "priority",
                "must be high, normal or preemptible",
            )),
        }
    }
}

impl fmt::Display for PriorityClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------------------
// State machine
// ---------------------------------------------------------------------------------------

/// Where an allocation is in its life; the transition table is in the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AllocState {
    /// Beyond what may be admitted at once; waits for a team or platform admin.
    PendingApproval,
    /// Admitted; waits for the planner to find room.
    Queued,
    /// The planner chose a place; the agent is setting it up.
    Placing,
    /// Running on its GPU.
    Active,
    /// Being torn down; the recorded [`ReleaseCause`] names the end state.
    Releasing,
    /// Released by its user (or at its end time, once torn down normally).
    Ended,
    Denied,
    Cancelled,
    Preempted,
    Expired,
    Failed,
}

impl AllocState {
    pub const ALL: [AllocState; 11] = [
        AllocState::PendingApproval,
        AllocState::Queued,
        AllocState::Placing,
        AllocState::Active,
        AllocState::Releasing,
        AllocState::Ended,
        AllocState::Denied,
        AllocState::Cancelled,
        AllocState::Preempted,
        AllocState::Expired,
        AllocState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AllocState::PendingApproval => "pending_approval",
            AllocState::Queued => "queued",
            AllocState::Placing => "placing",
            AllocState::Active => "active",
            AllocState::Releasing => "releasing",
            AllocState::Ended => "ended",
            AllocState::Denied => "denied",
            AllocState::Cancelled => "cancelled",
            AllocState::Preempted => "preempted",
            AllocState::Expired => "expired",
            AllocState::Failed => "failed",
        }
    }

    /// Words for people: `Pending approval`, `Queued`, ….
    pub fn label(self) -> &'static str {
        match self {
            AllocState::PendingApproval => "Pending approval",
            AllocState::Queued => "Queued",
            AllocState::Placing => "Placing",
            AllocState::Active => "Active",
            AllocState::Releasing => "Releasing",
            AllocState::Ended => "Ended",
            AllocState::Denied => "Denied",
            AllocState::Cancelled => "Cancelled",
            AllocState::Preempted => "Preempted",
            AllocState::Expired => "Expired",
            AllocState::Failed => "Failed",
        }
    }

    /// Whether the table in the module docs allows `self → to`.
    pub fn can_transition(self, to: AllocState) -> bool {
        use AllocState::*;
        matches!(
            (self, to),
            (PendingApproval, Queued | Denied | Cancelled)
                | (Queued, Placing | Cancelled | Failed)
                | (Placing, Active | Queued | Failed | Cancelled)
                | (Active, Releasing | Failed)
                | (Releasing, Ended | Expired | Preempted | Failed)
        )
    }

    /// [`AllocState::can_transition`] as a `Conflict` the server can return as is.
    pub fn check_transition(self, to: AllocState) -> Result<(), AppError> {
        if self.can_transition(to) {
            Ok(())
        } else {
            Err(AppError::conflict(format!(
                "an allocation that is {} cannot become {}",
                self.label().to_lowercase(),
                to.label().to_lowercase()
            )))
        }
    }

    /// No transition leaves this state.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            AllocState::Ended
                | AllocState::Denied
                | AllocState::Cancelled
                | AllocState::Preempted
                | AllocState::Expired
                | AllocState::Failed
        )
    }

    /// Counts against the team's quota: queued, placing, active, releasing.
    pub fn holds_quota(self) -> bool {
        matches!(
            self,
            AllocState::Queued | AllocState::Placing | AllocState::Active | AllocState::Releasing
        )
    }

    /// Still waiting to run: pending approval, queued, placing.
    pub fn is_pending(self) -> bool {
        matches!(
            self,
            AllocState::PendingApproval | AllocState::Queued | AllocState::Placing
        )
    }
}

impl FromStr for AllocState {
    type Err = AppError;
    fn from_str(s: &str) -> Result<Self, AppError> {
        let s = s.trim();
        AllocState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| AppError::invalid("state", format!("unknown state {s}")))
    }
}

impl fmt::Display for AllocState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an active allocation is being released; recorded when it enters `releasing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ReleaseCause {
    /// Its user (or an admin) released it.
    Released,
    /// Its end time passed.
    Expired,
    /// Another team reclaimed its guaranteed share.
    Preempted,
}

impl ReleaseCause {
    /// The terminal state `releasing` goes to once the GPU is torn down.
    pub fn final_state(self) -> AllocState {
        match self {
            ReleaseCause::Released => AllocState::Ended,
            ReleaseCause::Expired => AllocState::Expired,
            ReleaseCause::Preempted => AllocState::Preempted,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Request validation
// ---------------------------------------------------------------------------------------

/// Limits a new allocation must respect. [`Default`] is the platform's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocPolicy {
    /// Used when the request names no duration (8 hours).
    pub default_duration_minutes: u32,
    /// Longest allowed duration (7 days).
    pub max_duration_minutes: u32,
    /// Most whole GPUs in one allocation (8).
    pub max_whole_count: u32,
    /// Most MIG instances in one allocation (7).
    pub max_mig_count: u32,
    /// How far ahead a start time may lie (30 days).
    pub max_start_ahead_minutes: u32,
    /// How far in the past a start time may lie, for clock skew and slow forms (60 s);
    /// such a start means "now".
    pub start_grace_secs: u32,
}

impl Default for AllocPolicy {
    fn default() -> Self {
        Self {
            default_duration_minutes: 8 * 60,
            max_duration_minutes: 7 * 24 * 60,
            max_whole_count: 8,
            max_mig_count: 7,
            max_start_ahead_minutes: 30 * 24 * 60,
            start_grace_secs: 60,
        }
    }
}

/// Most characters in an allocation's purpose.
pub const PURPOSE_MAX_CHARS: usize = 500;

/// An allocation request as a form or REST client sends it; [`validate`] parses it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NewAllocation {
    /// The team that pays, as a UUID.
    pub team_id: String,
    /// `H100-80GB:1g.10gb`, `H100-80GB:whole` or `H100-80GB:share:250`.
    pub kind: String,
    /// How many of `kind`; 1 when absent.
    #[serde(default = "one")]
    pub count: u32,
    /// How long it runs once started; the policy's default (8 h) when absent.
    #[serde(default)]
    pub duration_minutes: Option<u32>,
    /// Earliest start, RFC 3339 or `YYYY-MM-DDTHH:MM` in UTC; as soon as possible when
    /// absent or empty.
    #[serde(default)]
    pub starts_at: Option<String>,
    /// `high`, `normal` or `preemptible`; `normal` when absent or empty.
    #[serde(default)]
    pub priority: Option<String>,
    /// What it is for, at most 500 characters.
    #[serde(default)]
    pub purpose: String,
}

fn one() -> u32 {
    1
}

/// The request form's fields as typed, before [`NewAllocation::from_form`] reads them.
#[derive(Debug, Clone, Default)]
pub struct AllocationForm {
    pub team_id: String,
    pub kind: String,
    /// Empty: 1.
    pub count: String,
    /// Whole hours; empty: the policy's default.
    pub duration_hours: String,
    pub starts_at: String,
    pub priority: String,
    pub purpose: String,
}

impl NewAllocation {
    /// Reads the request form; errors name the form's field. [`validate`] checks the rest.
    pub fn from_form(form: AllocationForm) -> Result<NewAllocation, AppError> {
        let whole = |raw: &str, field: &str| match raw.trim() {
            "" => Ok(None),
            t => t
                .parse::<u32>()
                .map(Some)
                .map_err(|_| AppError::invalid(field, "must be a whole number")),
        };
        Ok(NewAllocation {
            count: whole(&form.count, "count")?.unwrap_or(1),
            duration_minutes: whole(&form.duration_hours, "duration_hours")?
                .map(|h| h.saturating_mul(60)),
            team_id: form.team_id,
            kind: form.kind,
            starts_at: Some(form.starts_at),
            priority: Some(form.priority),
            purpose: form.purpose,
        })
    }
}

/// A request that passed [`validate`]: valid by construction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidAllocation {
    team_id: TeamId,
    kind: GpuKind,
    count: u32,
    units: u32,
    priority: PriorityClass,
    duration_minutes: u32,
    starts_at: Option<DateTime<Utc>>,
    purpose: String,
}

impl ValidAllocation {
    pub fn team_id(&self) -> TeamId {
        self.team_id
    }
    /// With the catalog's spelling of model and profile.
    pub fn kind(&self) -> &GpuKind {
        &self.kind
    }
    pub fn count(&self) -> u32 {
        self.count
    }
    /// Quota units of the whole allocation (`count` × the kind's unit cost).
    pub fn units(&self) -> u32 {
        self.units
    }
    pub fn priority(&self) -> PriorityClass {
        self.priority
    }
    pub fn duration_minutes(&self) -> u32 {
        self.duration_minutes
    }
    pub fn duration(&self) -> TimeDelta {
        TimeDelta::minutes(i64::from(self.duration_minutes))
    }
    /// Earliest start; `None` means as soon as possible.
    pub fn starts_at(&self) -> Option<DateTime<Utc>> {
        self.starts_at
    }
    /// Trimmed; may be empty.
    pub fn purpose(&self) -> &str {
        &self.purpose
    }
    /// When it ends if it becomes active at `started_at`.
    pub fn ends_at(&self, started_at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        started_at.checked_add_signed(self.duration())
    }
}

/// Parses and checks a request against `policy` and `catalog` at `now`. The first problem
/// found is returned as a field error (`team_id`, `kind`, `count`, `duration_minutes`,
/// `starts_at`, `priority`, `purpose`).
pub fn validate(
    input: &NewAllocation,
    policy: &AllocPolicy,
    catalog: &Catalog,
    now: DateTime<Utc>,
) -> Result<ValidAllocation, AppError> {
    let team = input.team_id.trim();
    if team.is_empty() {
        return Err(AppError::invalid("team_id", "is required"));
    }
    let team_id = TeamId::parse(team)
        .ok_or_else(|| AppError::invalid("team_id", "is not a valid team id"))?;

    let kind = input.kind.parse::<GpuKind>()?.canonical(catalog)?;

    let count = input.count;
    if count == 0 {
        return Err(AppError::invalid("count", "must be at least 1"));
    }
    match &kind {
        GpuKind::Share { .. } if count != 1 => {
            return Err(AppError::invalid(
                "count",
                "a share is always 1; ask for a larger share instead",
            ));
        }
        GpuKind::Whole { .. } if count > policy.max_whole_count => {
            return Err(AppError::invalid(
                "count",
                format!(
                    "at most {} whole GPUs per allocation",
                    policy.max_whole_count
                ),
            ));
        }
        GpuKind::Mig { .. } if count > policy.max_mig_count => {
            return Err(AppError::invalid(
                "count",
                format!(
                    "at most {} MIG instances per allocation",
                    policy.max_mig_count
                ),
            ));
        }
        _ => {}
    }
    let units = kind.units(count, catalog)?;

    let duration_minutes = input
        .duration_minutes
        .unwrap_or(policy.default_duration_minutes);
    if duration_minutes == 0 {
        return Err(AppError::invalid(
            "duration_minutes",
            "must be at least 1 minute",
        ));
    }
    if duration_minutes > policy.max_duration_minutes {
        return Err(AppError::invalid(
            "duration_minutes",
            format!(
                "must be at most {}",
                human_minutes(policy.max_duration_minutes)
            ),
        ));
    }

    let starts_at = match input.starts_at.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(raw) => check_start(parse_start(raw)?, policy, now)?,
    };

    let priority = match input.priority.as_deref().map(str::trim) {
        None | Some("") => PriorityClass::default(),
        Some(p) => p.parse()?,
    };

    let purpose = input.purpose.trim();
    if purpose.chars().count() > PURPOSE_MAX_CHARS {
        return Err(AppError::invalid(
            "purpose",
            format!("must be at most {PURPOSE_MAX_CHARS} characters"),
        ));
    }
    if purpose
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
    {
        return Err(AppError::invalid(
            "purpose",
            "must not contain control characters",
        ));
    }

    Ok(ValidAllocation {
        team_id,
        kind,
        count,
        units,
        priority,
        duration_minutes,
        starts_at,
        purpose: purpose.to_owned(),
    })
}

/// RFC 3339, or a zone-less `YYYY-MM-DDTHH:MM[:SS]` (what `<input type=datetime-local>`
/// sends) read as UTC.
fn parse_start(raw: &str) -> Result<DateTime<Utc>, AppError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
        return Ok(t.with_timezone(&Utc));
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(raw, f).ok())
        .map(|t| t.and_utc())
        .ok_or_else(|| {
            AppError::invalid(
                "starts_at",
                "must be a UTC date and time like 2025-05-01T14:00",
            )
        })
}

/// `None` when the start is now or within the grace period before now.
fn check_start(
    at: DateTime<Utc>,
    policy: &AllocPolicy,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, AppError> {
    let grace = TimeDelta::seconds(i64::from(policy.start_grace_secs));
    if now
        .checked_sub_signed(grace)
        .is_some_and(|earliest| at < earliest)
    {
        return Err(AppError::invalid("starts_at", "is in the past"));
    }
    let ahead = TimeDelta::minutes(i64::from(policy.max_start_ahead_minutes));
    if now
        .checked_add_signed(ahead)
        .is_some_and(|latest| at > latest)
    {
        return Err(AppError::invalid(
            "starts_at",
            format!(
                "must be within {} from now",
                human_minutes(policy.max_start_ahead_minutes)
            ),
        ));
    }
    Ok((at > now).then_some(at))
}

/// `7 days`, `8 hours`, `90 minutes`.
fn human_minutes(m: u32) -> String {
    let plural = |n: u32, unit: &str| {
        if n == 1 {
            format!("1 {unit}")
        } else {
            format!("{n} {unit}s")
        }
    };
    if m > 0 && m.is_multiple_of(24 * 60) {
        plural(m / (24 * 60), "day")
    } else if m > 0 && m.is_multiple_of(60) {
        plural(m / 60, "hour")
    } else {
        plural(m, "minute")
    }
}

// ---------------------------------------------------------------------------------------
// Quota and admission
// ---------------------------------------------------------------------------------------

/// A team's quota on one model, in units (compute slices). Valid by construction:
/// `guaranteed ≤ limit` and `per_user ≤ limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    guaranteed: u32,
    limit: u32,
    per_user: u32,
}

impl Quota {
    /// `guaranteed`: never preempted below this. `limit`: most the team may hold,
    /// borrowing beyond `guaranteed`. `per_user`: most one member may hold without a team
    /// admin's approval (0: every request needs approval).
    pub fn new(guaranteed: u32, limit: u32, per_user: u32) -> Result<Self, AppError> {
        if guaranteed > limit {
            return Err(AppError::invalid(
                "guaranteed",
                format!("must not exceed the limit ({limit})"),
            ));
        }
        if per_user > limit {
            return Err(AppError::invalid(
                "per_user",
                format!("must not exceed the limit ({limit})"),
            ));
        }
        Ok(Self {
            guaranteed,
            limit,
            per_user,
        })
    }

    pub fn guaranteed(&self) -> u32 {
        self.guaranteed
    }
    pub fn limit(&self) -> u32 {
        self.limit
    }
    pub fn per_user(&self) -> u32 {
        self.per_user
    }

    /// Units of `used` beyond the guarantee.
    pub fn borrowed(&self, used: u32) -> u32 {
        used.saturating_sub(self.guaranteed)
    }
}

/// Units a team and the asking user hold on one model now: the sum over their
/// allocations whose state [holds quota](AllocState::holds_quota).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub team: u32,
    pub user: u32,
}

/// Who must approve an allocation that cannot be admitted at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Approver {
    TeamAdmin,
    PlatformAdmin,
}

/// What [`admit`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Goes to the queue. `borrowed`: units of this ask beyond the team's guarantee
    /// (these may be preempted).
    Admit { borrowed: u32 },
    /// Goes to `pending_approval`; `reason` says in plain words why.
    NeedsApproval { by: Approver, reason: String },
    /// The team has no quota (or a limit of 0) on the model; `reason` says so.
    NotEntitled { reason: String },
}

/// Decides whether an ask of `ask` units on `model` may be admitted. `quota` is the
/// team's quota on that model, `None` if it has none.
pub fn admit(model: &str, quota: Option<&Quota>, used: Usage, ask: u32) -> Admission {
    let Some(q) = quota.filter(|q| q.limit > 0) else {
        return Admission::NotEntitled {
            reason: format!("the team has no quota on {model}"),
        };
    };
    // In u64 so that no sum of two u32 can wrap or saturate into "fits".
    let team_after = u64::from(used.team) + u64::from(ask);
    let user_after = u64::from(used.user) + u64::from(ask);
    let team_ok = team_after <= u64::from(q.limit);
    let user_ok = user_after <= u64::from(q.per_user);
    if team_ok && user_ok {
        let beyond = team_after.saturating_sub(u64::from(q.guaranteed));
        return Admission::Admit {
            borrowed: u32::try_from(beyond).unwrap_or(u32::MAX).min(ask),
        };
    }
    let per_user = format!(
        "you would use {user_after} of your {}-slice per-user limit on {model}",
        q.per_user
    );
    if team_after <= u64::from(q.guaranteed) {
        return Admission::NeedsApproval {
            by: Approver::TeamAdmin,
            reason: per_user,
        };
    }
    let reason = if team_ok {
        format!(
            "{per_user}, and the team would borrow beyond its {}-slice guarantee",
            q.guaranteed
        )
    } else {
        format!(
            "the team would use {team_after} of its {}-slice limit on {model}",
            q.limit
        )
    };
    Admission::NeedsApproval {
        by: Approver::PlatformAdmin,
        reason,
    }
}

// ---------------------------------------------------------------------------------------
// Queue order with fair share
// ---------------------------------------------------------------------------------------

/// How far back recent usage counts for fair share.
pub const FAIR_SHARE_WINDOW: TimeDelta = TimeDelta::days(7);

/// Unit-seconds an allocation of `units` that ran from `started_at` to `ended_at` (still
/// running: `None`) used within the fair-share window ending at `now`.
pub fn unit_seconds_in_window(
    units: u32,
    started_at: DateTime<Utc>,
    ended_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> u64 {
    let from = now
        .checked_sub_signed(FAIR_SHARE_WINDOW)
        .map_or(started_at, |w| w.max(started_at));
    let to = ended_at.map_or(now, |e| e.min(now));
    let secs = u64::try_from((to - from).num_seconds()).unwrap_or(0);
    secs.saturating_mul(u64::from(units))
}

/// A team's standing for fair share on one model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FairShare {
    /// Unit-seconds used within [`FAIR_SHARE_WINDOW`] (see [`unit_seconds_in_window`]).
    pub recent_unit_seconds: u64,
    /// The team's guaranteed units on the model.
    pub guaranteed: u32,
}

impl FairShare {
    /// Orders by `recent_unit_seconds / guaranteed`, exactly; teams without a guarantee
    /// come after all teams with one, and among themselves by recent usage.
    pub fn cmp_share(&self, other: &FairShare) -> Ordering {
        match (self.guaranteed, other.guaranteed) {
            (0, 0) => self.recent_unit_seconds.cmp(&other.recent_unit_seconds),
            (0, _) => Ordering::Greater,
            (_, 0) => Ordering::Less,
            (ga, gb) => {
                let a = u128::from(self.recent_unit_seconds) * u128::from(gb);
                let b = u128::from(other.recent_unit_seconds) * u128::from(ga);
                a.cmp(&b)
            }
        }
    }
}

/// A waiting allocation as the queue sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueEntry {
    pub id: Uuid,
    /// The queue it waits in: one per (canonical) model.
    pub model: String,
    pub team: TeamId,
    pub priority: PriorityClass,
    pub created_at: DateTime<Utc>,
}

fn queue_cmp(a: &QueueEntry, b: &QueueEntry, usage: &BTreeMap<TeamId, FairShare>) -> Ordering {
    let share = |t: &TeamId| usage.get(t).copied().unwrap_or_default();
    b.priority
        .cmp(&a.priority)
        .then_with(|| share(&a.team).cmp_share(&share(&b.team)))
        .then_with(|| a.created_at.cmp(&b.created_at))
        .then_with(|| a.id.cmp(&b.id))
}

/// Ids of `entries` in the order they should be served: priority class (high first),
/// fair share ascending, older first, then id. Teams missing from `usage` count as
/// having no guarantee.
pub fn order_queue(entries: &[QueueEntry], usage: &BTreeMap<TeamId, FairShare>) -> Vec<Uuid> {
    let mut sorted: Vec<&QueueEntry> = entries.iter().collect();
    sorted.sort_by(|a, b| queue_cmp(a, b, usage));
    sorted.into_iter().map(|e| e.id).collect()
}

/// 1-based position of `id` within its model's queue; `None` if it is not in `entries`.
pub fn position(
    entries: &[QueueEntry],
    usage: &BTreeMap<TeamId, FairShare>,
    id: Uuid,
) -> Option<u32> {
    let me = entries.iter().find(|e| e.id == id)?;
    let ahead = entries
        .iter()
        .filter(|e| e.model == me.model && queue_cmp(e, me, usage) == Ordering::Less)
        .count();
    u32::try_from(ahead).ok()?.checked_add(1)
}

// ---------------------------------------------------------------------------------------
// Preemption
// ---------------------------------------------------------------------------------------

/// The team that wants units back on a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub team: TeamId,
    /// Units the team holds on the model now.
    pub used: u32,
    pub guaranteed: u32,
    /// Units of the waiting allocation.
    pub ask: u32,
}

/// An active allocation of another team on the same model, a possible victim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub id: Uuid,
    pub team: TeamId,
    pub units: u32,
    pub started_at: DateTime<Utc>,
    pub priority: PriorityClass,
    /// Units its team holds on the model now (the same for all of a team's entries).
    pub team_used: u32,
    pub team_guaranteed: u32,
}

/// Allocations to preempt and the units that frees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    pub victims: Vec<Uuid>,
    pub freed: u32,
}

/// Chooses allocations to preempt so that `needed` units are freed for `claim`.
///
/// Only a claim within its team's guarantee (`used + ask ≤ guaranteed`) may preempt, and
/// only allocations of other teams that borrow (hold more than their guarantee). Victims
/// are taken preemptible first, then normal, then high, newest first within a class; one
/// is skipped if taking it would drop its team below its guarantee. Stops as soon as
/// `freed ≥ needed`; `None` if the claim may not preempt or all eligible victims would not
/// free enough (never preempt in vain). `needed = 0` gives an empty preemption.
pub fn select_victims(claim: &Claim, needed: u32, running: &[Running]) -> Option<Preemption> {
    if claim.used.saturating_add(claim.ask) > claim.guaranteed {
        return None;
    }
    if needed == 0 {
        return Some(Preemption {
            victims: Vec::new(),
            freed: 0,
        });
    }
    let others: Vec<&Running> = running
        .iter()
        .filter(|r| r.team != claim.team && r.units > 0)
        .collect();
    // What each team can lose and stay at its guarantee; the smallest figure if entries
    // disagree, so a team is never driven below its guarantee.
    let mut spare: BTreeMap<TeamId, u32> = BTreeMap::new();
    for r in &others {
        let s = r.team_used.saturating_sub(r.team_guaranteed);
        spare
            .entry(r.team)
            .and_modify(|v| *v = (*v).min(s))
            .or_insert(s);
    }
    let mut order = others;
    order.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then_with(|| b.started_at.cmp(&a.started_at))
            .then_with(|| a.id.cmp(&b.id))
    });
    let mut victims = Vec::new();
    let mut freed = 0u32;
    for r in order {
        let Some(left) = spare.get_mut(&r.team) else {
            continue;
        };
        if r.units > *left {
            continue;
        }
        *left -= r.units;
        freed = freed.saturating_add(r.units);
        victims.push(r.id);
        if freed >= needed {
            return Some(Preemption { victims, freed });
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// Why pending, and when
// ---------------------------------------------------------------------------------------

/// The earliest known end time at which `free_now` plus the units freed by allocations
/// ending by then reach `needed`. `None` when no known end frees enough, or when enough
/// is already free (then units do not explain the wait, e.g. free slices are on the
/// wrong GPUs, and there is no honest estimate).
pub fn eta(needed: u32, free_now: u32, ends: &[(DateTime<Utc>, u32)]) -> Option<DateTime<Utc>> {
    if free_now >= needed {
        return None;
    }
    let mut ends: Vec<(DateTime<Utc>, u32)> = ends.to_vec();
    ends.sort();
    let mut free = free_now;
    for (at, units) in ends {
        free = free.saturating_add(units);
        if free >= needed {
            return Some(at);
        }
    }
    None
}

/// Plain words on why an allocation waits, e.g. `2nd in the H100-80GB queue. No free
/// 1g.10gb. Expected by 14:00 UTC.` Parts: the queue position (if queued), the planner's
/// reason (if any), and the ETA (time only when it is today at `now`, else with the date).
pub fn pending_explanation(
    position: Option<u32>,
    model: &str,
    reason: Option<&str>,
    eta: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> String {
    let mut parts = Vec::new();
    if let Some(p) = position {
        parts.push(format!("{} in the {model} queue", ordinal(p)));
    }
    if let Some(r) = reason
        .map(|r| r.trim().trim_end_matches('.'))
        .filter(|r| !r.is_empty())
    {
        parts.push(r.to_owned());
    }
    parts.push(match eta {
        Some(t) if t.date_naive() == now.date_naive() => {
            format!("expected by {} UTC", t.format("%H:%M"))
        }
        Some(t) => format!("expected by {} UTC", t.format("%Y-%m-%d %H:%M")),
        None => "no known end time frees enough: ETA unknown".to_owned(),
    });
    let sentences: Vec<String> = parts.iter().map(|p| capitalize(p)).collect();
    format!("{}.", sentences.join(". "))
}

fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

// ---------------------------------------------------------------------------------------
// Views
// ---------------------------------------------------------------------------------------

/// Why and how long a pending allocation waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PendingInfo {
    /// 1-based place in its model's queue; `None` while pending approval.
    pub position: Option<u32>,
    /// Plain words, from [`pending_explanation`].
    pub reason: String,
    /// `None` when unknown; never a guess.
    pub eta: Option<DateTime<Utc>>,
}

impl PendingInfo {
    /// Composes the reason with [`pending_explanation`].
    pub fn new(
        position: Option<u32>,
        model: &str,
        planner_reason: Option<&str>,
        eta: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Self {
        Self {
            position,
            reason: pending_explanation(position, model, planner_reason, eta, now),
            eta,
        }
    }
}

/// One step in an allocation's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Transition {
    pub at: DateTime<Utc>,
    /// `None` for the creation step.
    pub from: Option<AllocState>,
    pub to: AllocState,
    /// Username of whoever caused it; `None` for the system.
    pub by: Option<String>,
    pub note: Option<String>,
}

/// An allocation as the UI and REST API show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AllocationView {
    pub id: Uuid,
    pub team_id: TeamId,
    pub team_name: String,
    pub user_id: UserId,
    pub username: String,
    /// Canonical kind string, e.g. `H100-80GB:1g.10gb`.
    pub kind: String,
    /// e.g. `1g.10gb on H100-80GB`.
    pub kind_label: String,
    pub count: u32,
    /// Quota units (compute slices) of the whole allocation.
    pub units: u32,
    pub priority: PriorityClass,
    pub state: AllocState,
    pub purpose: String,
    pub created_at: DateTime<Utc>,
    pub starts_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
    /// Where it runs: one entry per MIG instance or whole GPU; empty until placed.
    pub devices: Vec<AllocatedDevice>,
    /// Who must approve it while `pending_approval`.
    pub approver: Option<Approver>,
    /// Why it needs approval, or the approver's reason for the decision.
    pub approval_reason: Option<String>,
    /// Present while pending.
    pub pending: Option<PendingInfo>,
    /// When a preemption warning runs out and the allocation is released.
    pub preempt_at: Option<DateTime<Utc>>,
    /// Oldest first.
    pub history: Vec<Transition>,
}

/// One device of an allocation: a MIG instance (`profile`, `start`, and `mig_uuid` once
/// the agent reports it) or a whole GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AllocatedDevice {
    pub node_id: Uuid,
    pub hostname: String,
    pub gpu_uuid: String,
    #[serde(default)]
    pub profile: Option<String>,
    #[serde(default)]
    pub start: Option<u8>,
    #[serde(default)]
    pub mig_uuid: Option<String>,
}

/// A team's quota on one model and how much of it is in use, in units.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaView {
    pub team_id: TeamId,
    pub team_name: String,
    pub model: String,
    pub guaranteed: u32,
    pub limit: u32,
    pub per_user: u32,
    /// Units held by allocations that hold quota.
    pub used: u32,
    /// Units of `used` beyond `guaranteed`.
    pub borrowed: u32,
}

impl QuotaView {
    /// The view of `quota` with `used` units held; `borrowed` is derived.
    pub fn new(
        team_id: TeamId,
        team_name: String,
        model: String,
        quota: &Quota,
        used: u32,
    ) -> Self {
        Self {
            team_id,
            team_name,
            model,
            guaranteed: quota.guaranteed,
            limit: quota.limit,
            per_user: quota.per_user,
            used,
            borrowed: quota.borrowed(used),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn the_request_form_is_read_with_defaults_and_field_errors() {
        let form = AllocationForm {
            team_id: "t".into(),
            kind: "H100-80GB:1g.10gb".into(),
            ..AllocationForm::default()
        };
        let a = NewAllocation::from_form(form.clone()).unwrap();
        assert_eq!((a.count, a.duration_minutes), (1, None));
        let a = NewAllocation::from_form(AllocationForm {
            count: " 3 ".into(),
            duration_hours: "2".into(),
            ..form.clone()
        })
        .unwrap();
        assert_eq!((a.count, a.duration_minutes), (3, Some(120)));
        for (count, hours, field) in [("x", "", "count"), ("1", "1.5", "duration_hours")] {
            let e = NewAllocation::from_form(AllocationForm {
                count: count.into(),
                duration_hours: hours.into(),
                ..form.clone()
            })
            .unwrap_err();
            assert!(
                matches!(&e, AppError::Invalid { field: f, .. } if f == field),
                "{e:?}"
            );
        }
    }

    fn t(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2025, 5, 1, h, m, 0).unwrap()
    }

    fn team(n: u128) -> TeamId {
        TeamId(Uuid::from_u128(n))
    }

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn kind(s: &str) -> GpuKind {
        s.parse().unwrap()
    }

    // --- kinds and units

    #[test]
    fn kind_strings_round_trip() {
        for s in [
            "H100-80GB:1g.10gb",
            "H100-80GB:1g.10gb+me",
            "H100-80GB:whole",
            "H100-80GB:share:250",
            "A30-24GB:share:1000",
        ] {
            let k = kind(s);
            assert_eq!(k.to_string(), s);
            assert_eq!(k.to_string().parse::<GpuKind>().unwrap(), k);
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{s}\""));
            assert_eq!(serde_json::from_str::<GpuKind>(&json).unwrap(), k);
        }
        assert_eq!(
            kind(" H100-80GB : WHOLE "),
            GpuKind::Whole {
                model: "H100-80GB".into()
            }
        );
    }

    #[test]
    fn malformed_kind_strings_are_field_errors() {
        for s in [
            "",
            "H100-80GB",
            ":1g.10gb",
            "H100-80GB:",
            "H100-80GB:share",
            "H100-80GB:share:0",
            "H100-80GB:share:1001",
            "H100-80GB:share:x",
            "H100-80GB:whole:2",
            "H100-80GB:1g.10gb:3",
        ] {
            let e = s.parse::<GpuKind>().expect_err(s);
            assert_eq!(e.field(), Some("kind"), "{s}");
        }
        assert!(serde_json::from_str::<GpuKind>("\"H100-80GB\"").is_err());
    }

    #[test]
    fn units_are_compute_slices_or_milli_for_shares() {
        let c = Catalog::builtin();
        assert_eq!(kind("H100-80GB:1g.10gb").units(7, &c), Ok(7));
        assert_eq!(kind("H100-80GB:1g.20gb").units(1, &c), Ok(1));
        assert_eq!(kind("H100-80GB:2g.20gb").units(2, &c), Ok(4));
        assert_eq!(kind("H100-80GB:3g.40gb").units(2, &c), Ok(6));
        assert_eq!(kind("H100-80GB:4g.40gb").units(1, &c), Ok(4));
        assert_eq!(kind("H100-80GB:7g.80gb").units(1, &c), Ok(7));
        assert_eq!(kind("H100-80GB:whole").units(2, &c), Ok(14));
        assert_eq!(kind("A30-24GB:whole").units(1, &c), Ok(4));
        assert_eq!(kind("A30-24GB:2g.12gb").units(1, &c), Ok(2));
        // Shares count exactly, in milli-GPU, on the model's shared quota line.
        assert_eq!(kind("H100-80GB:share:250").units(1, &c), Ok(250));
        assert_eq!(kind("A30-24GB:share:250").units(1, &c), Ok(250));
        assert_eq!(kind("H100-80GB:share:250").quota_key(), "H100-80GB:shared");
        assert_eq!(kind("H100-80GB:1g.10gb").quota_key(), "H100-80GB");
        assert_eq!(split_quota_key("H100-80GB:shared"), ("H100-80GB", true));
        assert_eq!(split_quota_key("H100-80GB"), ("H100-80GB", false));
        assert_eq!(kind("H100-80GB:share:1").units(1, &c), Ok(1));
        assert_eq!(kind("H100-80GB:share:1000").units(1, &c), Ok(1000));
        // Aliases and case resolve through the catalog.
        assert_eq!(kind("H100-SXM5-80GB:1G.10GB").units(1, &c), Ok(1));
    }

    #[test]
    fn unknown_models_and_profiles_are_kind_errors() {
        let c = Catalog::builtin();
        let e = kind("V100-32GB:whole").units(1, &c).unwrap_err();
        assert_eq!(e.field(), Some("kind"));
        assert!(e.to_string().contains("H100-80GB"), "{e}");
        let e = kind("H100-80GB:1g.5gb").units(1, &c).unwrap_err();
        assert_eq!(e.field(), Some("kind"));
        assert!(e.to_string().contains("1g.10gb"), "lists offered: {e}");
        let bad_share = GpuKind::Share {
            model: "H100-80GB".into(),
            milli: 0,
        };
        assert_eq!(bad_share.units(1, &c).unwrap_err().field(), Some("kind"));
    }

    #[test]
    fn canonical_kinds_use_the_catalog_spelling() {
        let c = Catalog::builtin();
        assert_eq!(
            kind("h100-sxm5-80gb:1G.10GB+ME").canonical(&c).unwrap(),
            kind("H100-80GB:1g.10gb+me")
        );
        assert_eq!(
            kind("H200:whole").canonical(&c).unwrap().to_string(),
            "H200-141GB:whole"
        );
    }

    #[test]
    fn kind_labels() {
        assert_eq!(kind("H100-80GB:1g.10gb").label(), "1g.10gb on H100-80GB");
        assert_eq!(kind("H100-80GB:whole").label(), "whole H100-80GB");
        assert_eq!(
            kind("H100-80GB:share:250").label(),
            "25% share of H100-80GB"
        );
        assert_eq!(
            kind("H100-80GB:share:125").label(),
            "12.5% share of H100-80GB"
        );
    }

    // --- priority and states

    #[test]
    fn priorities_order_and_parse() {
        assert!(PriorityClass::High > PriorityClass::Normal);
        assert!(PriorityClass::Normal > PriorityClass::Preemptible);
        for p in PriorityClass::ALL {
            assert_eq!(p.as_str().parse::<PriorityClass>(), Ok(p));
            assert_eq!(
                serde_json::to_string(&p).unwrap(),
                format!("\"{}\"", p.as_str())
            );
        }
        assert_eq!(
            "urgent".parse::<PriorityClass>().unwrap_err().field(),
            Some("priority")
        );
    }

    #[test]
    fn states_round_trip() {
        for s in AllocState::ALL {
            assert_eq!(s.as_str().parse::<AllocState>(), Ok(s));
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
        assert!("running".parse::<AllocState>().is_err());
    }

    #[test]
    fn transitions_follow_the_table() {
        use AllocState::*;
        let allowed = [
            (PendingApproval, Queued),
            (PendingApproval, Denied),
            (PendingApproval, Cancelled),
            (Queued, Placing),
            (Queued, Cancelled),
            (Queued, Failed),
            (Placing, Active),
            (Placing, Queued),
            (Placing, Failed),
            (Placing, Cancelled),
            (Active, Releasing),
            (Active, Failed),
            (Releasing, Ended),
            (Releasing, Expired),
            (Releasing, Preempted),
            (Releasing, Failed),
        ];
        for from in AllocState::ALL {
            for to in AllocState::ALL {
                assert_eq!(
                    from.can_transition(to),
                    allowed.contains(&(from, to)),
                    "{from} → {to}"
                );
            }
            // Terminal states are exactly those with no way out.
            assert_eq!(
                from.is_terminal(),
                AllocState::ALL.iter().all(|to| !from.can_transition(*to)),
                "{from}"
            );
        }
        assert!(matches!(
            Active.check_transition(Queued),
            Err(AppError::Conflict { .. })
        ));
        assert_eq!(Releasing.check_transition(Ended), Ok(()));
        for cause in [
            ReleaseCause::Released,
            ReleaseCause::Expired,
            ReleaseCause::Preempted,
        ] {
            assert!(Releasing.can_transition(cause.final_state()));
            assert!(cause.final_state().is_terminal());
        }
    }

    #[test]
    fn quota_holding_and_pending_states() {
        use AllocState::*;
        let holds: Vec<_> = AllocState::ALL
            .into_iter()
            .filter(|s| s.holds_quota())
            .collect();
        assert_eq!(holds, [Queued, Placing, Active, Releasing]);
        let pending: Vec<_> = AllocState::ALL
            .into_iter()
            .filter(|s| s.is_pending())
            .collect();
        assert_eq!(pending, [PendingApproval, Queued, Placing]);
    }

    // --- validation

    fn input(kind: &str, count: u32) -> NewAllocation {
        NewAllocation {
            team_id: team(1).to_string(),
            kind: kind.into(),
            count,
            duration_minutes: None,
            starts_at: None,
            priority: None,
            purpose: "  train a model ".into(),
        }
    }

    fn check(i: &NewAllocation) -> Result<ValidAllocation, AppError> {
        validate(i, &AllocPolicy::default(), &Catalog::builtin(), t(12, 0))
    }

    fn field(i: &NewAllocation) -> String {
        check(i).unwrap_err().field().unwrap_or("").to_owned()
    }

    #[test]
    fn a_valid_request_gets_defaults() {
        let v = check(&input("H100-SXM5-80GB:1g.10gb", 2)).unwrap();
        assert_eq!(v.team_id(), team(1));
        assert_eq!(v.kind().to_string(), "H100-80GB:1g.10gb");
        assert_eq!(v.count(), 2);
        assert_eq!(v.units(), 2);
        assert_eq!(v.priority(), PriorityClass::Normal);
        assert_eq!(v.duration_minutes(), 480);
        assert_eq!(v.starts_at(), None);
        assert_eq!(v.purpose(), "train a model");
        assert_eq!(v.ends_at(t(12, 0)), Some(t(20, 0)));
    }

    #[test]
    fn each_bad_field_is_named() {
        let mut i = input("H100-80GB:whole", 1);
        i.team_id = "nope".into();
        assert_eq!(field(&i), "team_id");
        i.team_id = " ".into();
        assert_eq!(field(&i), "team_id");

        assert_eq!(field(&input("H100-80GB:9g.90gb", 1)), "kind");
        assert_eq!(field(&input("H100-80GB:whole", 0)), "count");
        assert_eq!(field(&input("H100-80GB:whole", 9)), "count");
        assert!(check(&input("H100-80GB:whole", 8)).is_ok());
        assert_eq!(field(&input("H100-80GB:1g.10gb", 8)), "count");
        assert!(check(&input("H100-80GB:1g.10gb", 7)).is_ok());
        assert_eq!(field(&input("H100-80GB:share:500", 2)), "count");

        let mut i = input("H100-80GB:whole", 1);
        i.duration_minutes = Some(0);
        assert_eq!(field(&i), "duration_minutes");
        i.duration_minutes = Some(7 * 24 * 60 + 1);
        assert_eq!(
            check(&i).unwrap_err().to_string(),
            "duration_minutes: must be at most 7 days"
        );
        i.duration_minutes = Some(7 * 24 * 60);
        assert!(check(&i).is_ok());

        let mut i = input("H100-80GB:whole", 1);
        i.priority = Some("urgent".into());
        assert_eq!(field(&i), "priority");
        i.priority = Some("preemptible".into());
        assert_eq!(check(&i).unwrap().priority(), PriorityClass::Preemptible);

        let mut i = input("H100-80GB:whole", 1);
        i.purpose = "x".repeat(501);
        assert_eq!(field(&i), "purpose");
        i.purpose = "é".repeat(500);
        assert!(check(&i).is_ok(), "counts characters, not bytes");
        i.purpose = "a\u{7}b".into();
        assert_eq!(field(&i), "purpose");
        i.purpose = "line one\r\nline two".into();
        assert!(check(&i).is_ok());
    }

    #[test]
    fn start_times_must_be_near_and_not_past() {
        let mut i = input("H100-80GB:whole", 1);
        let at = |i: &mut NewAllocation, s: &str| i.starts_at = Some(s.into());
        at(&mut i, "2025-05-01T14:00");
        assert_eq!(check(&i).unwrap().starts_at(), Some(t(14, 0)));
        at(&mut i, "2025-05-01T16:00:00+02:00");
        assert_eq!(check(&i).unwrap().starts_at(), Some(t(14, 0)));
        // Within the grace minute: means now.
        at(&mut i, "2025-05-01T11:59:30Z");
        assert_eq!(check(&i).unwrap().starts_at(), None);
        at(&mut i, "2025-05-01T11:58");
        assert_eq!(
            check(&i).unwrap_err().to_string(),
            "starts_at: is in the past"
        );
        at(&mut i, "2025-05-31T12:00");
        assert!(check(&i).is_ok());
        at(&mut i, "2025-05-31T12:01");
        assert_eq!(
            check(&i).unwrap_err().to_string(),
            "starts_at: must be within 30 days from now"
        );
        at(&mut i, "tomorrow");
        assert_eq!(field(&i), "starts_at");
        at(&mut i, " ");
        assert_eq!(check(&i).unwrap().starts_at(), None);
    }

    #[test]
    fn new_allocation_json_defaults() {
        let i: NewAllocation = serde_json::from_str(&format!(
            r#"{{"team_id":"{}","kind":"H100-80GB:whole"}}"#,
            team(1)
        ))
        .unwrap();
        assert_eq!(i.count, 1);
        assert!(check(&i).is_ok());
    }

    // --- quota and admission

    fn quota(g: u32, l: u32, u: u32) -> Quota {
        Quota::new(g, l, u).unwrap()
    }

    fn used(team: u32, user: u32) -> Usage {
        Usage { team, user }
    }

    #[test]
    fn quotas_are_consistent() {
        assert_eq!(Quota::new(9, 8, 8).unwrap_err().field(), Some("guaranteed"));
        assert_eq!(Quota::new(4, 8, 9).unwrap_err().field(), Some("per_user"));
        assert!(Quota::new(0, 0, 0).is_ok());
        assert_eq!(quota(4, 8, 8).borrowed(3), 0);
        assert_eq!(quota(4, 8, 8).borrowed(6), 2);
    }

    #[test]
    fn admits_exactly_up_to_the_limit() {
        let q = quota(4, 8, 8);
        assert_eq!(
            admit("H100-80GB", Some(&q), used(0, 0), 4),
            Admission::Admit { borrowed: 0 }
        );
        assert_eq!(
            admit("H100-80GB", Some(&q), used(3, 3), 2),
            Admission::Admit { borrowed: 1 }
        );
        assert_eq!(
            admit("H100-80GB", Some(&q), used(6, 6), 2),
            Admission::Admit { borrowed: 2 }
        );
        assert_eq!(
            admit("H100-80GB", Some(&q), used(7, 7), 2),
            Admission::NeedsApproval {
                by: Approver::PlatformAdmin,
                reason: "the team would use 9 of its 8-slice limit on H100-80GB".into()
            }
        );
    }

    #[test]
    fn the_approver_depends_on_the_guarantee() {
        let q = quota(6, 10, 2);
        // Team stays within its guarantee; only the per-user cap is exceeded.
        assert_eq!(
            admit("H100-80GB", Some(&q), used(2, 1), 3),
            Admission::NeedsApproval {
                by: Approver::TeamAdmin,
                reason: "you would use 4 of your 2-slice per-user limit on H100-80GB".into()
            }
        );
        // Per-user cap exceeded and the team would borrow: platform admin.
        let Admission::NeedsApproval { by, reason } = admit("H100-80GB", Some(&q), used(5, 0), 3)
        else {
            panic!("needs approval")
        };
        assert_eq!(by, Approver::PlatformAdmin);
        assert!(reason.contains("6-slice guarantee"), "{reason}");
        // Over the limit: platform admin.
        let Admission::NeedsApproval { by, .. } = admit("H100-80GB", Some(&q), used(9, 0), 2)
        else {
            panic!("needs approval")
        };
        assert_eq!(by, Approver::PlatformAdmin);
    }

    #[test]
    fn no_quota_means_not_entitled() {
        assert!(matches!(
            admit("H100-80GB", None, used(0, 0), 1),
            Admission::NotEntitled { .. }
        ));
        assert!(matches!(
            admit("H100-80GB", Some(&quota(0, 0, 0)), used(0, 0), 1),
            Admission::NotEntitled { .. }
        ));
    }

    #[test]
    fn admission_never_overflows() {
        let q = quota(u32::MAX, u32::MAX, u32::MAX);
        assert!(matches!(
            admit("H100-80GB", Some(&q), used(u32::MAX, u32::MAX), 1),
            Admission::NeedsApproval { .. }
        ));
    }

    // --- queue

    fn entry(n: u128, tm: u128, p: PriorityClass, at: DateTime<Utc>) -> QueueEntry {
        QueueEntry {
            id: id(n),
            model: "H100-80GB".into(),
            team: team(tm),
            priority: p,
            created_at: at,
        }
    }

    fn share(used: u64, g: u32) -> FairShare {
        FairShare {
            recent_unit_seconds: used,
            guaranteed: g,
        }
    }

    #[test]
    fn queue_orders_by_priority_then_fair_share_then_age() {
        use PriorityClass::*;
        // Team 1 used 100 per guaranteed unit, team 2 only 50: team 2 goes first.
        let usage = BTreeMap::from([(team(1), share(400, 4)), (team(2), share(100, 2))]);
        let entries = [
            entry(1, 1, Normal, t(9, 0)),
            entry(2, 2, Normal, t(10, 0)),
            entry(3, 1, High, t(11, 0)),
            entry(4, 2, Preemptible, t(8, 0)),
            entry(5, 2, Normal, t(9, 30)),
            entry(6, 3, Normal, t(7, 0)), // no guarantee: after all guaranteed teams
        ];
        assert_eq!(
            order_queue(&entries, &usage),
            [id(3), id(5), id(2), id(1), id(6), id(4)]
        );
        assert_eq!(position(&entries, &usage, id(5)), Some(2));
        assert_eq!(position(&entries, &usage, id(4)), Some(6));
        assert_eq!(position(&entries, &usage, id(99)), None);
    }

    #[test]
    fn positions_count_only_the_same_model() {
        let usage = BTreeMap::new();
        let mut other = entry(1, 1, PriorityClass::High, t(8, 0));
        other.model = "A30-24GB".into();
        let entries = [other, entry(2, 1, PriorityClass::Normal, t(9, 0))];
        assert_eq!(position(&entries, &usage, id(2)), Some(1));
        assert_eq!(position(&entries, &usage, id(1)), Some(1));
    }

    #[test]
    fn fair_share_compares_exactly() {
        // 1/3 vs 333_333/1_000_000: a float might call these equal at low precision.
        assert_eq!(
            share(1, 3).cmp_share(&share(333_333, 1_000_000)),
            Ordering::Greater
        );
        assert_eq!(share(2, 4).cmp_share(&share(1, 2)), Ordering::Equal);
        assert_eq!(share(u64::MAX, 1).cmp_share(&share(0, 0)), Ordering::Less);
        assert_eq!(share(5, 0).cmp_share(&share(7, 0)), Ordering::Less);
    }

    #[test]
    fn usage_counts_only_inside_the_window() {
        let now = t(12, 0);
        assert_eq!(unit_seconds_in_window(2, t(11, 0), None, now), 2 * 3600);
        assert_eq!(
            unit_seconds_in_window(1, t(10, 0), Some(t(11, 0)), now),
            3600
        );
        let long_ago = now - TimeDelta::days(30);
        assert_eq!(
            unit_seconds_in_window(1, long_ago, None, now),
            7 * 24 * 3600
        );
        assert_eq!(
            unit_seconds_in_window(1, long_ago, Some(long_ago + TimeDelta::days(1)), now),
            0
        );
    }

    // --- preemption

    fn running(
        n: u128,
        tm: u128,
        units: u32,
        started: DateTime<Utc>,
        p: PriorityClass,
        team_used: u32,
        team_guaranteed: u32,
    ) -> Running {
        Running {
            id: id(n),
            team: team(tm),
            units,
            started_at: started,
            priority: p,
            team_used,
            team_guaranteed,
        }
    }

    fn claim(used: u32, guaranteed: u32, ask: u32) -> Claim {
        Claim {
            team: team(1),
            used,
            guaranteed,
            ask,
        }
    }

    #[test]
    fn preemption_takes_preemptible_then_newest_borrowed_units() {
        use PriorityClass::*;
        // Team 2 holds 6 with a guarantee of 2: 4 borrowed.
        let r = [
            running(10, 2, 2, t(8, 0), Normal, 6, 2),
            running(11, 2, 2, t(9, 0), Normal, 6, 2),
            running(12, 2, 2, t(7, 0), Preemptible, 6, 2),
        ];
        let p = select_victims(&claim(0, 4, 3), 3, &r).unwrap();
        assert_eq!(p.victims, [id(12), id(11)]);
        assert_eq!(p.freed, 4);
    }

    #[test]
    fn preemption_never_drives_a_team_below_its_guarantee() {
        use PriorityClass::*;
        // Team 2 borrows 1 unit only; its 2-unit allocations cannot go. Team 3 borrows 3.
        let r = [
            running(10, 2, 2, t(10, 0), Preemptible, 5, 4),
            running(11, 3, 1, t(9, 0), Normal, 4, 1),
            running(12, 3, 2, t(8, 0), Normal, 4, 1),
            running(13, 3, 1, t(7, 0), Normal, 4, 1),
        ];
        let p = select_victims(&claim(0, 7, 3), 3, &r).unwrap();
        assert_eq!(p.victims, [id(11), id(12)]);
        // Needing 4 would take team 3 below its guarantee: no preemption at all.
        assert_eq!(select_victims(&claim(0, 7, 4), 4, &r), None);
    }

    #[test]
    fn only_a_claim_within_its_guarantee_may_preempt() {
        let r = [running(10, 2, 7, t(8, 0), PriorityClass::Normal, 7, 0)];
        assert!(select_victims(&claim(3, 4, 1), 1, &r).is_some());
        assert_eq!(select_victims(&claim(3, 4, 2), 1, &r), None);
        // Never its own team.
        let own = [running(10, 1, 7, t(8, 0), PriorityClass::Normal, 7, 0)];
        assert_eq!(select_victims(&claim(0, 4, 1), 1, &own), None);
        assert_eq!(
            select_victims(&claim(0, 4, 1), 0, &own),
            Some(Preemption {
                victims: vec![],
                freed: 0
            })
        );
    }

    // --- eta and explanation

    #[test]
    fn eta_is_the_first_end_that_frees_enough() {
        let ends = [(t(15, 0), 2), (t(13, 0), 1), (t(14, 0), 1)];
        assert_eq!(eta(3, 1, &ends), Some(t(14, 0)));
        assert_eq!(eta(2, 1, &ends), Some(t(13, 0)));
        assert_eq!(eta(5, 1, &ends), Some(t(15, 0)));
        assert_eq!(eta(6, 1, &ends), None, "not enough ends in sight");
        assert_eq!(
            eta(1, 1, &ends),
            None,
            "units alone do not explain the wait"
        );
        assert_eq!(eta(1, 0, &[]), None);
    }

    #[test]
    fn explanations_in_plain_words() {
        assert_eq!(
            pending_explanation(
                Some(2),
                "H100-80GB",
                Some("no free 1g.10gb; free after this plan: 1 × 3g.40gb on H100-80GB"),
                Some(t(14, 0)),
                t(12, 0)
            ),
            "2nd in the H100-80GB queue. No free 1g.10gb; free after this plan: 1 × 3g.40gb on H100-80GB. Expected by 14:00 UTC."
        );
        assert_eq!(
            pending_explanation(Some(11), "A30-24GB", None, None, t(12, 0)),
            "11th in the A30-24GB queue. No known end time frees enough: ETA unknown."
        );
        let tomorrow = t(9, 0) + TimeDelta::days(1);
        assert_eq!(
            PendingInfo::new(
                None,
                "H100-80GB",
                Some("waiting for a team admin."),
                Some(tomorrow),
                t(12, 0)
            )
            .reason,
            "Waiting for a team admin. Expected by 2025-05-02 09:00 UTC."
        );
        assert_eq!(
            [1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111].map(ordinal),
            [
                "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd",
                "101st", "111th"
            ]
        );
    }

    #[test]
    fn views_serialize_round_trip() {
        let v = AllocationView {
            id: id(1),
            team_id: team(1),
            team_name: "Vision".into(),
            user_id: UserId(Uuid::from_u128(7)),
            username: "ada".into(),
            kind: "H100-80GB:1g.10gb".into(),
            kind_label: kind("H100-80GB:1g.10gb").label(),
            count: 2,
            units: 2,
            priority: PriorityClass::Normal,
            state: AllocState::Queued,
            purpose: String::new(),
            created_at: t(9, 0),
            starts_at: None,
            ends_at: None,
            devices: Vec::new(),
            approver: None,
            approval_reason: None,
            pending: Some(PendingInfo::new(Some(1), "H100-80GB", None, None, t(9, 0))),
            preempt_at: None,
            history: vec![Transition {
                at: t(9, 0),
                from: None,
                to: AllocState::Queued,
                by: Some("ada".into()),
                note: None,
            }],
        };
        let json = serde_json::to_string(&v).unwrap();
        assert!(json.contains(r#""state":"queued""#), "{json}");
        assert_eq!(serde_json::from_str::<AllocationView>(&json).unwrap(), v);
        let q = QuotaView::new(
            team(1),
            "Vision".into(),
            "H100-80GB".into(),
            &quota(4, 8, 8),
            6,
        );
        assert_eq!(q.borrowed, 2);
    }
}
