//! Request validation.

use super::*;
use crate::image::CudaVersion;

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

impl AllocPolicy {
    /// The longest an allocation (or a booking) may last.
    pub fn duration_bound(&self) -> TimeDelta {
        TimeDelta::minutes(i64::from(self.max_duration_minutes))
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
    /// The CUDA version its work needs of the node's driver, e.g. `12.4`: only nodes whose
    /// driver supports at least this are chosen. Absent: any node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs_cuda: Option<String>,
    /// A gang (issue 42): this many nodes, each with `count` of `kind` (whole GPUs or MIG
    /// instances), placed all at once or not at all. Absent: one node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
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
            needs_cuda: None,
            nodes: None,
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
    needs_cuda: Option<CudaVersion>,
    nodes: Option<u32>,
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
    /// A gang's node count (`count` is then per node); `None`: one node. Stored
    /// allocations hold [`devices`](Self::devices) as their count.
    pub fn nodes(&self) -> Option<u32> {
        self.nodes
    }
    /// Devices of the whole allocation: `count`, times the nodes of a gang.
    pub fn devices(&self) -> u32 {
        self.count.saturating_mul(self.nodes.unwrap_or(1))
    }
    /// Quota units of the whole allocation (`count` × the kind's unit cost, × the nodes
    /// of a gang).
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
    /// The CUDA version a node's driver must support; `None`: any node.
    pub fn needs_cuda(&self) -> Option<CudaVersion> {
        self.needs_cuda
    }
    /// When it ends if it becomes active at `started_at`.
    pub fn ends_at(&self, started_at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        started_at.checked_add_signed(self.duration())
    }
}

/// Parses and checks a request against `policy` and `catalog` at `now`. The first problem
/// found is returned as a field error (`team_id`, `kind`, `count`, `duration_minutes`,
/// `starts_at`, `priority`, `purpose`, `needs_cuda`).
pub fn validate(
    input: &NewAllocation,
    policy: &AllocPolicy,
    catalog: &Catalog,
    now: DateTime<Utc>,
) -> Result<ValidAllocation, AppError> {
    validate_typed(&parse(input, policy, catalog, now)?, policy, catalog, now)
}

/// A request's text parsed into domain types, with [`validate`]'s errors in the form's
/// order; the server then completes it in domain types (a launch's image's CUDA need) and
/// checks it with [`validate_typed`].
pub fn parse(
    input: &NewAllocation,
    policy: &AllocPolicy,
    catalog: &Catalog,
    now: DateTime<Utc>,
) -> Result<TypedRequest, AppError> {
    let team = input.team_id.trim();
    if team.is_empty() {
        return Err(AppError::invalid("team_id", "is required"));
    }
    let team_id = TeamId::parse(team)
        .ok_or_else(|| AppError::invalid("team_id", "is not a valid team id"))?;

    let kind = input.kind.parse::<GpuKind>()?.canonical(catalog)?;
    // Checked here as well as by `validate_typed`, so the first problem reported is the
    // first in the form's order.
    check_size(
        &kind,
        (input.count, input.nodes, input.duration_minutes),
        policy,
        catalog,
    )?;

    let starts_at = match input.starts_at.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(raw) => {
            let at = parse_start(raw)?;
            check_start(at, policy, now)?;
            Some(at)
        }
    };

    let priority = match input.priority.as_deref().map(str::trim) {
        None | Some("") => PriorityClass::default(),
        Some(p) => p.parse()?,
    };

    check_purpose(&input.purpose)?;

    let needs_cuda = match input.needs_cuda.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(raw) => Some(CudaVersion::parse(raw).map_err(|_| {
            AppError::invalid(
                "needs_cuda",
                format!("{raw:?} is not a CUDA version like 12.4"),
            )
        })?),
    };

    Ok(TypedRequest {
        team_id,
        kind,
        count: input.count,
        duration_minutes: input.duration_minutes,
        starts_at,
        priority,
        purpose: input.purpose.clone(),
        needs_cuda,
        nodes: input.nodes,
    })
}

/// A request already in domain types, as the server's own passes make one (a job queued
/// again from its old allocation, a notebook profile's GPU): its kind, size, start and
/// purpose are checked by [`validate`]'s rules against today's `policy` and `catalog`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypedRequest {
    pub team_id: TeamId,
    pub kind: GpuKind,
    /// Per node for a gang, as a request asks.
    pub count: u32,
    /// The policy's default when `None`.
    pub duration_minutes: Option<u32>,
    pub starts_at: Option<DateTime<Utc>>,
    pub priority: PriorityClass,
    pub purpose: String,
    pub needs_cuda: Option<CudaVersion>,
    pub nodes: Option<u32>,
}

/// [`validate`] for a [`TypedRequest`]: nothing to parse, the same checks.
pub fn validate_typed(
    input: &TypedRequest,
    policy: &AllocPolicy,
    catalog: &Catalog,
    now: DateTime<Utc>,
) -> Result<ValidAllocation, AppError> {
    let kind = input.kind.canonical(catalog)?;
    let size = check_size(
        &kind,
        (input.count, input.nodes, input.duration_minutes),
        policy,
        catalog,
    )?;
    let starts_at = match input.starts_at {
        None => None,
        Some(at) => check_start(at, policy, now)?,
    };
    Ok(ValidAllocation {
        team_id: input.team_id,
        kind,
        count: size.count,
        units: size.units,
        priority: input.priority,
        duration_minutes: size.duration_minutes,
        starts_at,
        purpose: check_purpose(&input.purpose)?,
        needs_cuda: input.needs_cuda,
        nodes: size.nodes,
    })
}

/// How much a request asks for, checked: `count` of its kind (on each of `nodes`), for
/// `duration_minutes`.
struct Size {
    count: u32,
    nodes: Option<u32>,
    /// Quota units of the whole request (every node's part).
    units: u32,
    duration_minutes: u32,
}

/// Checks the count (per node), nodes and duration asked for `kind` against `policy`;
/// the policy's default duration when none is asked.
fn check_size(
    kind: &GpuKind,
    (count, nodes, duration_minutes): (u32, Option<u32>, Option<u32>),
    policy: &AllocPolicy,
    catalog: &Catalog,
) -> Result<Size, AppError> {
    if count == 0 {
        return Err(AppError::invalid("count", "must be at least 1"));
    }
    match kind {
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
    let nodes = match nodes {
        None => None,
        Some(n) => {
            if matches!(kind, GpuKind::Share { .. }) {
                return Err(AppError::invalid(
                    "nodes",
                    "a multi-node job takes whole GPUs or MIG instances, not shares",
                ));
            }
            if !(1..=super::gang::GANG_NODES_MAX).contains(&n) {
                return Err(AppError::invalid(
                    "nodes",
                    format!("must be 1 to {}", super::gang::GANG_NODES_MAX),
                ));
            }
            Some(n)
        }
    };
    let units = kind
        .units(count.saturating_mul(nodes.unwrap_or(1)), catalog)
        .map_err(|e| match (nodes, e) {
            (Some(_), AppError::Invalid { message, .. }) => AppError::invalid("nodes", message),
            (_, e) => e,
        })?;

    let duration_minutes = duration_minutes.unwrap_or(policy.default_duration_minutes);
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
    Ok(Size {
        count,
        nodes,
        units,
        duration_minutes,
    })
}

/// The purpose, trimmed: at most [`PURPOSE_MAX_CHARS`], no control characters but line
/// breaks and tabs.
fn check_purpose(purpose: &str) -> Result<String, AppError> {
    let purpose = purpose.trim();
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
    Ok(purpose.to_owned())
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
