//! Drain and the deadline channel (docs/operations.md).
//!
//! A platform admin drains a node, or one GPU of it, with a deadline: nothing new is placed
//! there, and what runs is warned and released at the deadline (jobs are queued again
//! elsewhere). Every early stop first warns the workload through one channel: a signal, a
//! file and an environment variable naming it ([`Deadline`]). The rules here are pure; the
//! scheduler and the executors apply them.

use crate::alloc::PreemptCause;
use crate::error::AppError;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

/// The longest a drain may wait before it takes work off (a week).
pub const MAX_DRAIN_MINUTES: i64 = 7 * 24 * 60;
/// How long before an allocation's end its workloads are warned.
pub const END_WARNING: Duration = Duration::minutes(10);
/// The signal a job may ask to be warned with (then SIGTERM at the deadline and SIGKILL
/// after the stop grace), as Slurm's `--signal` does. Opt-in, as in Slurm: a program that
/// does not trap it would die of it.
pub const DEFAULT_SIGNAL: &str = "USR1";
/// The job's environment variable that asks for the warning signal.
pub const SIGNAL_VAR: &str = "TESSERA_DEADLINE_SIGNAL";
/// Where a sandboxed workload finds the deadline (the agent's control folder); the
/// environment variable [`DEADLINE_FILE_VAR`] names it in every executor.
pub const DEADLINE_FILE: &str = "/run/tessera/deadline";
pub const DEADLINE_FILE_VAR: &str = "TESSERA_DEADLINE_FILE";
/// The attempt a job's process is (1 first, 2 after one requeue…).
pub const ATTEMPT_VAR: &str = "TESSERA_ATTEMPT";
/// Signals a workload may ask to be warned with.
pub const SIGNALS: &[&str] = &["USR1", "USR2", "TERM", "INT", "HUP", "URG"];

/// The signal named by `value` (`USR1`, `SIGUSR1`, `usr1`), if it is one a job may ask for.
pub fn signal_of(value: &str) -> Option<&'static str> {
    let v = value.trim().to_ascii_uppercase();
    let v = v.strip_prefix("SIG").unwrap_or(&v);
    SIGNALS.iter().copied().find(|s| *s == v)
}

/// What a drain asks. Either `deadline` (RFC 3339) or `minutes` from now (default 30).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// Drain one GPU (`GPU-…`) of the node instead of all of it.
    #[serde(default)]
    pub gpu: Option<String>,
    #[serde(default)]
    pub deadline: Option<DateTime<Utc>>,
    #[serde(default)]
    pub minutes: Option<i64>,
    /// Shown to the owners of the work it moves, and on the Nodes page.
    #[serde(default)]
    pub reason: String,
}

/// A drain that passed [`validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidDrain {
    pub gpu: Option<String>,
    pub deadline: DateTime<Utc>,
    pub reason: String,
}

/// Checks a drain request at `now`; errors name the field.
pub fn validate(req: &DrainRequest, now: DateTime<Utc>) -> Result<ValidDrain, AppError> {
    let deadline = match (req.deadline, req.minutes) {
        (Some(_), Some(_)) => {
            return Err(AppError::invalid(
                "minutes",
                "give either a deadline or minutes, not both",
            ));
        }
        (Some(d), None) => {
            if d < now {
                return Err(AppError::invalid("deadline", "the deadline is in the past"));
            }
            d
        }
        (None, m) => {
            let m = m.unwrap_or(30);
            if !(0..=MAX_DRAIN_MINUTES).contains(&m) {
                return Err(AppError::invalid(
                    "minutes",
                    format!("minutes must be between 0 and {MAX_DRAIN_MINUTES} (a week)"),
                ));
            }
            now + Duration::minutes(m)
        }
    };
    if deadline - now > Duration::minutes(MAX_DRAIN_MINUTES) {
        return Err(AppError::invalid(
            "deadline",
            "the deadline is more than a week away",
        ));
    }
    let reason = req.reason.trim();
    if reason.chars().count() > 200 {
        return Err(AppError::invalid("reason", "at most 200 characters"));
    }
    let gpu = match req.gpu.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(g) if g.starts_with("GPU-") && g.len() <= 64 => Some(g.to_owned()),
        Some(_) => {
            return Err(AppError::invalid(
                "gpu",
                "a GPU UUID as the node reports it (GPU-…)",
            ));
        }
    };
    Ok(ValidDrain {
        gpu,
        deadline,
        reason: if reason.is_empty() {
            "maintenance".to_owned()
        } else {
            reason.to_owned()
        },
    })
}

/// Where a drain stands: work still runs there, or none is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DrainState {
    Draining,
    Drained,
}

/// A drain as the Nodes page and `why pending` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DrainView {
    pub state: DrainState,
    pub deadline: DateTime<Utc>,
    pub reason: String,
    pub since: DateTime<Utc>,
}

/// Why a workload must stop early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DeadlineCause {
    /// Borrowed capacity a team's guarantee asks back.
    Preempted,
    /// Its node or GPU is drained.
    Drain,
    /// Its allocation's time runs out.
    TimeLimit,
    /// Its GPU turned unhealthy (a critical Xid, an uncorrectable ECC error).
    Health,
    /// Its capacity is booked by a team from this time on.
    Booking,
    /// An idle notebook is stopped by the platform's idle rule.
    Idle,
    /// Its owner, a team admin or a platform admin stopped it.
    Stop,
}

impl DeadlineCause {
    pub const ALL: [DeadlineCause; 7] = [
        DeadlineCause::Preempted,
        DeadlineCause::Drain,
        DeadlineCause::TimeLimit,
        DeadlineCause::Health,
        DeadlineCause::Booking,
        DeadlineCause::Idle,
        DeadlineCause::Stop,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeadlineCause::Preempted => "preempted",
            DeadlineCause::Drain => "drain",
            DeadlineCause::TimeLimit => "time_limit",
            DeadlineCause::Health => "health",
            DeadlineCause::Booking => "booking",
            DeadlineCause::Idle => "idle",
            DeadlineCause::Stop => "stop",
        }
    }

    /// The deadline cause behind a preemption's (none recorded: a reclaim).
    pub fn of_preemption(cause: Option<PreemptCause>) -> DeadlineCause {
        match cause {
            Some(PreemptCause::Drain) => DeadlineCause::Drain,
            Some(PreemptCause::Health) => DeadlineCause::Health,
            Some(PreemptCause::Booking) => DeadlineCause::Booking,
            Some(PreemptCause::Reclaim) | None => DeadlineCause::Preempted,
        }
    }
}

impl std::str::FromStr for DeadlineCause {
    type Err = AppError;
    fn from_str(s: &str) -> Result<Self, AppError> {
        DeadlineCause::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| {
                AppError::invalid("deadline_cause", format!("unknown deadline cause {s}"))
            })
    }
}

/// The deadline a workload is told (agent wire, and the file's JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Deadline {
    pub cause: DeadlineCause,
    /// When it is stopped (SIGTERM; SIGKILL after the stop grace).
    pub at: DateTime<Utc>,
    /// The signal sent once, when the deadline is first told (`USR1`…).
    pub signal: String,
    /// For people: why, in words.
    pub message: String,
}

impl Deadline {
    /// The file's text: `cause`, `deadline` (RFC 3339) and `message` lines, easy to read
    /// from a shell (`. $TESSERA_DEADLINE_FILE` is not needed: `grep ^deadline=`).
    pub fn file_text(&self) -> String {
        format!(
            "cause={}\ndeadline={}\nmessage={}\n",
            self.cause.as_str(),
            self.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            self.message.replace('\n', " ")
        )
    }
}

/// What a running allocation's workloads are told at `now`, if anything: a preemption or
/// drain deadline as soon as it is set; the allocation's end once it is [`END_WARNING`]
/// away. The earlier one wins.
pub fn deadline_for(
    ends_at: Option<DateTime<Utc>>,
    preempt_at: Option<DateTime<Utc>>,
    preempt_cause: Option<PreemptCause>,
    now: DateTime<Utc>,
) -> Option<(DateTime<Utc>, DeadlineCause)> {
    let preempt = preempt_at.map(|at| (at, DeadlineCause::of_preemption(preempt_cause)));
    let end = ends_at
        .filter(|e| *e - now <= END_WARNING)
        .map(|e| (e, DeadlineCause::TimeLimit));
    match (preempt, end) {
        (Some(p), Some(e)) => Some(if e.0 < p.0 { e } else { p }),
        (p, e) => p.or(e),
    }
}

/// Words for a deadline's cause, for the file and the job page.
pub fn deadline_message(cause: DeadlineCause, detail: &str) -> String {
    let base = match cause {
        DeadlineCause::Preempted => {
            "its GPU is preempted: borrowed capacity goes back to a team's guaranteed share"
        }
        DeadlineCause::Drain => "its node is drained by a platform admin",
        DeadlineCause::TimeLimit => "its allocation's time runs out",
        DeadlineCause::Health => "its GPU turned unhealthy and is taken out of service",
        DeadlineCause::Booking => "its capacity is booked by a team from this time on",
        DeadlineCause::Idle => "the notebook has been idle and is stopped by the idle rule",
        DeadlineCause::Stop => "it was stopped by its owner or an admin",
    };
    if detail.is_empty() {
        base.to_owned()
    } else {
        format!("{base} ({detail})")
    }
}

/// The longest warning a user's or admin's stop gives (docs/operations.md): a stop is
/// meant to be quick; preemptions and bookings use the team's whole grace.
pub const MAX_STOP_GRACE: Duration = Duration::seconds(30);

/// What a team admin sets (`PUT /api/v1/teams/{id}/grace`): the team's own warning before
/// an early stop, in seconds, within the platform maximum. `null` (or absent) goes back to
/// the platform maximum.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GraceRequest {
    #[serde(default)]
    pub preemption_grace_secs: Option<i64>,
}

/// A team's grace as its page and the API show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TeamGrace {
    /// What the team set (`None`: the platform maximum applies).
    pub preemption_grace_secs: Option<i64>,
    /// What applies: the team's grace, or the platform maximum.
    pub effective_secs: i64,
    /// The platform maximum (`TESSERA_PREEMPTION_GRACE`).
    pub max_secs: i64,
}

/// Checks a team's grace against the platform maximum; the error names the field.
pub fn validate_grace(req: &GraceRequest, max: Duration) -> Result<Option<i64>, AppError> {
    let Some(secs) = req.preemption_grace_secs else {
        return Ok(None);
    };
    if secs < 0 {
        return Err(AppError::invalid(
            "preemption_grace_secs",
            "the grace cannot be negative",
        ));
    }
    if secs > max.num_seconds() {
        return Err(AppError::invalid(
            "preemption_grace_secs",
            format!(
                "at most the platform maximum, {} s (TESSERA_PREEMPTION_GRACE)",
                max.num_seconds()
            ),
        ));
    }
    Ok(Some(secs))
}

/// The grace that applies to a team: its own (never above the maximum), else the maximum.
pub fn effective_grace(team_secs: Option<i64>, max: Duration) -> Duration {
    team_secs.map_or(max, |s| Duration::seconds(s.max(0)).min(max))
}

/// How long a user's or admin's stop warns a running workload before SIGTERM: only when
/// the workload asked for the warning signal or its team set a grace, at most
/// [`MAX_STOP_GRACE`] and never above the team's grace; `None`: it stops at once (also
/// when the request asks for an immediate stop).
pub fn stop_grace(
    team_secs: Option<i64>,
    max: Duration,
    asked_signal: bool,
    immediate: bool,
) -> Option<Duration> {
    if immediate || (!asked_signal && team_secs.is_none()) {
        return None;
    }
    let g = effective_grace(team_secs, max).min(MAX_STOP_GRACE);
    (g > Duration::zero()).then_some(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(min: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 26, 12, 0, 0)
            .single()
            .expect("valid")
            + Duration::minutes(min)
    }

    #[test]
    fn drain_deadline_from_minutes_or_time() {
        let v = validate(&DrainRequest::default(), t(0)).expect("valid");
        assert_eq!(v.deadline, t(30));
        assert_eq!(v.reason, "maintenance");
        let v = validate(
            &DrainRequest {
                minutes: Some(0),
                reason: " new PSU ".into(),
                gpu: Some("GPU-1".into()),
                ..DrainRequest::default()
            },
            t(0),
        )
        .expect("valid");
        assert_eq!((v.deadline, v.reason.as_str()), (t(0), "new PSU"));
        assert_eq!(v.gpu.as_deref(), Some("GPU-1"));
        let v = validate(
            &DrainRequest {
                deadline: Some(t(90)),
                ..DrainRequest::default()
            },
            t(0),
        )
        .expect("valid");
        assert_eq!(v.deadline, t(90));
    }

    #[test]
    fn bad_drains_name_their_field() {
        let field = |r: DrainRequest| {
            validate(&r, t(0))
                .expect_err("refused")
                .field()
                .map(str::to_owned)
        };
        let past = DrainRequest {
            deadline: Some(t(-1)),
            ..DrainRequest::default()
        };
        assert_eq!(field(past).as_deref(), Some("deadline"));
        let far = DrainRequest {
            deadline: Some(t(MAX_DRAIN_MINUTES + 1)),
            ..DrainRequest::default()
        };
        assert_eq!(field(far).as_deref(), Some("deadline"));
        let neg = DrainRequest {
            minutes: Some(-5),
            ..DrainRequest::default()
        };
        assert_eq!(field(neg).as_deref(), Some("minutes"));
        let both = DrainRequest {
            minutes: Some(5),
            deadline: Some(t(5)),
            ..DrainRequest::default()
        };
        assert_eq!(field(both).as_deref(), Some("minutes"));
        let gpu = DrainRequest {
            gpu: Some("../etc".into()),
            ..DrainRequest::default()
        };
        assert_eq!(field(gpu).as_deref(), Some("gpu"));
    }

    #[test]
    fn earliest_deadline_wins_and_ends_warn_late() {
        // The end is told only once it is ten minutes away.
        assert_eq!(deadline_for(Some(t(11)), None, None, t(0)), None);
        assert_eq!(
            deadline_for(Some(t(10)), None, None, t(0)),
            Some((t(10), DeadlineCause::TimeLimit))
        );
        // A preemption is told at once, and a drain is named as one.
        assert_eq!(
            deadline_for(Some(t(600)), Some(t(10)), Some(PreemptCause::Drain), t(0)),
            Some((t(10), DeadlineCause::Drain))
        );
        assert_eq!(
            deadline_for(Some(t(5)), Some(t(10)), Some(PreemptCause::Reclaim), t(0)),
            Some((t(5), DeadlineCause::TimeLimit))
        );
        assert_eq!(
            deadline_for(None, Some(t(3)), None, t(0)),
            Some((t(3), DeadlineCause::Preempted))
        );
    }

    #[test]
    fn signals_by_any_spelling() {
        assert_eq!(signal_of("SIGUSR1"), Some("USR1"));
        assert_eq!(signal_of(" usr2 "), Some("USR2"));
        assert_eq!(signal_of("KILL"), None);
        assert_eq!(signal_of("9"), None);
    }

    #[test]
    fn the_file_reads_line_by_line() {
        let d = Deadline {
            cause: DeadlineCause::Drain,
            at: t(0),
            signal: DEFAULT_SIGNAL.into(),
            message: "two\nlines".into(),
        };
        assert_eq!(
            d.file_text(),
            "cause=drain\ndeadline=2026-11-26T12:00:00Z\nmessage=two lines\n"
        );
    }
    #[test]
    fn team_grace_within_the_maximum() {
        let max = Duration::minutes(10);
        let req = |s: Option<i64>| GraceRequest {
            preemption_grace_secs: s,
        };
        assert_eq!(validate_grace(&req(Some(120)), max), Ok(Some(120)));
        assert_eq!(validate_grace(&req(Some(600)), max), Ok(Some(600)));
        assert_eq!(validate_grace(&req(None), max), Ok(None));
        for bad in [601, -1] {
            let e = validate_grace(&req(Some(bad)), max).expect_err("refused");
            assert_eq!(e.field(), Some("preemption_grace_secs"));
        }
        assert_eq!(effective_grace(None, max), max);
        assert_eq!(effective_grace(Some(90), max), Duration::seconds(90));
        // A maximum lowered after the team set its grace caps it.
        assert_eq!(effective_grace(Some(900), max), max);
    }

    #[test]
    fn a_stop_warns_only_who_listens() {
        let max = Duration::minutes(10);
        // No signal asked, no team grace: at once, as before.
        assert_eq!(stop_grace(None, max, false, false), None);
        // Asked for the signal: the short stop grace.
        assert_eq!(stop_grace(None, max, true, false), Some(MAX_STOP_GRACE));
        // A team grace below it wins; zero means at once.
        assert_eq!(
            stop_grace(Some(5), max, false, false),
            Some(Duration::seconds(5))
        );
        assert_eq!(stop_grace(Some(0), max, true, false), None);
        // `now=true` always stops at once.
        assert_eq!(stop_grace(Some(60), max, true, true), None);
    }
}
