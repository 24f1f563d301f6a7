//! Workloads on an allocation: notebooks (JupyterLab behind the server's proxy) and
//! training jobs.
//!
//! A workload always runs inside one `active` allocation and sees only that allocation's
//! devices. It is submitted either onto an active allocation of its user's, or with a GPU
//! request of its own: then it owns that allocation, waits `queued` (on no node) until the
//! allocation is active, and the allocation is released when the workload ends. The server decides *what* should run (the desired set per node, see
//! [`crate::wire::WorkloadSpec`]); an executor (the node agent's process executor, or
//! Kubernetes) makes it so and reports back ([`crate::wire::WorkloadReport`]).
//!
//! States and transitions:
//!
//! ```text
//! queued ──▶ pending       (its own allocation became active: it has a node now)
//! queued ──▶ cancelled | stopped | failed   (stopped while waiting; its GPU request ended)
//! pending ──▶ starting ──▶ running ──▶ succeeded | failed        (exit code 0 / non-zero)
//!    │            │           │
//!    └────────────┴───────────┴──▶ stopping ──▶ stopped | cancelled   (user, idle reclaim,
//!                                                                       allocation ended)
//! any non-terminal ──▶ lost   (the executor no longer knows the process)
//! pending | starting ──▶ failed  (could not start)
//! ```
//!
//! A notebook is `running` once its HTTP endpoint answers (not merely once the process
//! exists); a job is `running` once its process exists.

use crate::error::AppError;
use crate::ids::{AllocationId, TeamId, UserId, WorkloadId};
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use std::str::FromStr;
use uuid::Uuid;

/// Notebook or training job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum WorkloadKind {
    Notebook,
    Job,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Notebook => "notebook",
            WorkloadKind::Job => "job",
        }
    }
}

impl FromStr for WorkloadKind {
    type Err = AppError;
    fn from_str(s: &str) -> Result<Self, AppError> {
        match s.trim() {
            "notebook" => Ok(WorkloadKind::Notebook),
            "job" => Ok(WorkloadKind::Job),
            other => Err(AppError::invalid("kind", format!("unknown kind {other}"))),
        }
    }
}

/// Where a workload is in its life (table in the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum WorkloadState {
    /// Waiting for its own allocation to become active; on no node yet.
    Queued,
    /// Stored; the executor has not started it yet.
    Pending,
    /// The process exists; a notebook is not answering yet.
    Starting,
    /// A job's process runs, or a notebook answers.
    Running,
    /// Asked to stop; the executor has not confirmed yet.
    Stopping,
    /// A job exited 0.
    Succeeded,
    /// A job exited non-zero, or the workload could not start.
    Failed,
    /// A notebook was stopped (by its user, idle reclaim or the allocation ending).
    Stopped,
    /// A job was cancelled.
    Cancelled,
    /// The executor lost track of it (node gone, process vanished without an exit code).
    Lost,
}

impl WorkloadState {
    pub const ALL: [WorkloadState; 10] = [
        WorkloadState::Queued,
        WorkloadState::Pending,
        WorkloadState::Starting,
        WorkloadState::Running,
        WorkloadState::Stopping,
        WorkloadState::Succeeded,
        WorkloadState::Failed,
        WorkloadState::Stopped,
        WorkloadState::Cancelled,
        WorkloadState::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadState::Queued => "queued",
            WorkloadState::Pending => "pending",
            WorkloadState::Starting => "starting",
            WorkloadState::Running => "running",
            WorkloadState::Stopping => "stopping",
            WorkloadState::Succeeded => "succeeded",
            WorkloadState::Failed => "failed",
            WorkloadState::Stopped => "stopped",
            WorkloadState::Cancelled => "cancelled",
            WorkloadState::Lost => "lost",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            WorkloadState::Queued => "Waiting for GPU",
            WorkloadState::Pending => "Pending",
            WorkloadState::Starting => "Starting",
            WorkloadState::Running => "Running",
            WorkloadState::Stopping => "Stopping",
            WorkloadState::Succeeded => "Succeeded",
            WorkloadState::Failed => "Failed",
            WorkloadState::Stopped => "Stopped",
            WorkloadState::Cancelled => "Cancelled",
            WorkloadState::Lost => "Lost",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            WorkloadState::Succeeded
                | WorkloadState::Failed
                | WorkloadState::Stopped
                | WorkloadState::Cancelled
                | WorkloadState::Lost
        )
    }

    /// Whether the table in the module docs allows `self → to`.
    pub fn can_transition(self, to: WorkloadState) -> bool {
        use WorkloadState::*;
        if self.is_terminal() {
            return false;
        }
        match (self, to) {
            (Queued, Pending | Cancelled | Stopped | Failed) => true,
            (Queued, _) => false,
            (_, Lost | Stopping) => self != Stopping || to == Lost,
            (Pending, Starting | Running | Failed | Succeeded) => true,
            (Starting, Running | Failed | Succeeded) => true,
            (Running, Succeeded | Failed) => true,
            (Stopping, Stopped | Cancelled | Succeeded | Failed) => true,
            _ => false,
        }
    }

    /// Still holds a process (or will): everything but the terminal states.
    pub fn is_live(self) -> bool {
        !self.is_terminal()
    }
}

impl FromStr for WorkloadState {
    type Err = AppError;
    fn from_str(s: &str) -> Result<Self, AppError> {
        let s = s.trim();
        WorkloadState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| AppError::invalid("state", format!("unknown state {s}")))
    }
}

/// A notebook server's name, unique per user among live notebooks: it is part of the
/// proxy path `/user/{username}/{name}/`. Lowercase letters, digits and `-`, 1–32
/// characters, starting with a letter or digit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerName(String);

impl ServerName {
    pub fn parse(raw: &str) -> Result<Self, AppError> {
        let s = raw.trim();
        let err = |m: &str| Err(AppError::invalid("name", m));
        if s.is_empty() {
            return err("give the notebook a name, e.g. `default`");
        }
        if s.len() > 32 {
            return err("at most 32 characters");
        }
        if !s
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return err("use lowercase letters, digits and `-` only");
        }
        if s.starts_with('-') {
            return err("start with a letter or digit");
        }
        Ok(ServerName(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A job's command line, run by `/bin/sh -c` in the team workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCommand(String);

pub const MAX_COMMAND_LEN: usize = 8192;

impl JobCommand {
    pub fn parse(raw: &str) -> Result<Self, AppError> {
        let s = raw.trim();
        if s.is_empty() {
            return Err(AppError::invalid(
                "command",
                "enter the command to run, e.g. `python train.py`",
            ));
        }
        if s.len() > MAX_COMMAND_LEN {
            return Err(AppError::invalid(
                "command",
                format!("at most {MAX_COMMAND_LEN} characters"),
            ));
        }
        if s.contains('\0') {
            return Err(AppError::invalid("command", "contains a NUL character"));
        }
        Ok(JobCommand(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Working directory of a job, relative to the team workspace: no absolute paths, no
/// `..`, so a job cannot start outside its team's files.
pub fn parse_workdir(raw: &str) -> Result<String, AppError> {
    let s = raw.trim().trim_end_matches('/');
    if s.is_empty() || s == "." {
        return Ok(String::new());
    }
    let bad = |m: &str| Err(AppError::invalid("workdir", m));
    if s.starts_with('/') {
        return bad("give a folder inside the team workspace, e.g. `projects/resnet`");
    }
    if s.len() > 512 {
        return bad("at most 512 characters");
    }
    if s.split('/').any(|p| p == ".." || p.is_empty()) || s.contains('\0') {
        return bad("`..` and empty path parts are not allowed");
    }
    Ok(s.to_owned())
}

/// One environment variable of a workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnvVar {
    pub name: String,
    pub value: String,
}

/// Names the executor sets itself; a request may not override them.
pub const RESERVED_ENV: [&str; 4] = [
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "JUPYTER_TOKEN",
    "TESSERA_WORKSPACE",
];

/// Parses `NAME=value` lines (blank lines and `#` comments skipped), as a form gives them.
/// Names follow POSIX (`[A-Za-z_][A-Za-z0-9_]*`); reserved names and duplicates are
/// refused. Errors name the line.
pub fn parse_env(text: &str) -> Result<Vec<EnvVar>, AppError> {
    let mut out: Vec<EnvVar> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |m: String| AppError::invalid("env", format!("line {}: {m}", i + 1));
        let (name, value) = line
            .split_once('=')
            .ok_or_else(|| at("write NAME=value".into()))?;
        push_env(&mut out, name.trim(), value).map_err(at)?;
    }
    env_size(out)
}

/// The environment as the REST API gives it (`{"NAME": "value"}`), under the same rules as
/// [`parse_env`], values without line breaks. Errors name the variable.
pub fn env_from_pairs<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Vec<EnvVar>, AppError> {
    let mut out: Vec<EnvVar> = Vec::new();
    for (name, value) in pairs {
        let at = |m: String| AppError::invalid("env", format!("`{}`: {m}", name.escape_debug()));
        if value.contains(['\n', '\r']) {
            return Err(at("values cannot contain line breaks".into()));
        }
        push_env(&mut out, name, value).map_err(at)?;
    }
    env_size(out)
}

/// Checks one variable against the rules and those before it, then adds it.
fn push_env(out: &mut Vec<EnvVar>, name: &str, value: &str) -> Result<(), String> {
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!(
            "`{}` is not a valid variable name",
            name.escape_debug()
        ));
    }
    if name == crate::drain::SIGNAL_VAR {
        // The one variable of Tessera's a job sets: its warning signal (the deadline
        // channel, docs/operations.md).
        if crate::drain::signal_of(value).is_none() {
            return Err(format!(
                "`{name}` names the signal that warns of an early stop: one of {}",
                crate::drain::SIGNALS.join(", ")
            ));
        }
    } else if RESERVED_ENV.contains(&name) || name.starts_with("TESSERA_") {
        return Err(format!("`{name}` is set by Tessera"));
    }
    if out.iter().any(|v| v.name == name) {
        return Err(format!("`{name}` is set twice"));
    }
    if value.contains('\0') {
        return Err("contains a NUL character".into());
    }
    out.push(EnvVar {
        name: name.to_owned(),
        value: value.to_owned(),
    });
    Ok(())
}

fn env_size(out: Vec<EnvVar>) -> Result<Vec<EnvVar>, AppError> {
    if out.len() > 100 {
        return Err(AppError::invalid("env", "at most 100 variables"));
    }
    Ok(out)
}

/// Environment list back to the `NAME=value` text [`parse_env`] reads.
pub fn env_text(vars: &[EnvVar]) -> String {
    vars.iter()
        .map(|v| format!("{}={}", v.name, v.value))
        .collect::<Vec<_>>()
        .join("\n")
}

/// How many times a failed job is started again (0–5).
pub fn parse_retries(raw: &str) -> Result<u32, AppError> {
    let s = raw.trim();
    if s.is_empty() {
        return Ok(0);
    }
    s.parse::<u32>()
        .map_err(|_| AppError::invalid("retries", "a number from 0 to 5"))
        .and_then(check_retries)
}

/// How many times a failed job may run again: 0 to 5.
pub fn check_retries(n: u32) -> Result<u32, AppError> {
    if n <= 5 {
        Ok(n)
    } else {
        Err(AppError::invalid("retries", "a number from 0 to 5"))
    }
}

// ---------------------------------------------------------------------------------------
// Idle reclaim
// ---------------------------------------------------------------------------------------

/// When a notebook counts as idle. Both signals must be quiet: the kernel (Jupyter's
/// `last_activity`) and the GPU (the allocation's device utilisation from telemetry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdlePolicy {
    /// Idle this long → stopped.
    pub idle_after: Duration,
    /// The user is warned this long before the stop.
    pub warn_before: Duration,
    /// Utilisation at or above this (percent) counts as GPU activity.
    pub busy_pct: u32,
}

impl Default for IdlePolicy {
    fn default() -> Self {
        IdlePolicy {
            idle_after: Duration::minutes(60),
            warn_before: Duration::minutes(10),
            busy_pct: 5,
        }
    }
}

/// The two activity signals of a notebook, as last known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ActivitySignals {
    /// Jupyter's `last_activity` (kernels and API use), if the executor could read it.
    pub kernel_last_activity: Option<DateTime<Utc>>,
    /// Whether a kernel is executing right now (`execution_state: busy`).
    #[serde(default)]
    pub kernel_busy: bool,
    /// Last telemetry sample in which the device was busy.
    pub gpu_last_busy: Option<DateTime<Utc>>,
    /// Whether any telemetry for the device was seen in the idle window at all.
    #[serde(default)]
    pub gpu_has_data: bool,
}

/// What idle reclaim does with a notebook now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum IdleDecision {
    /// In use (or idle for less than the warning point).
    Active { idle_since: DateTime<Utc> },
    /// Idle; stopped at `stop_at` unless activity resumes.
    Warn {
        idle_since: DateTime<Utc>,
        stop_at: DateTime<Utc>,
    },
    /// Idle for the whole window: stop it.
    Reclaim { idle_since: DateTime<Utc> },
}

/// Decides idle reclaim from the signals. Idle since = the latest of the notebook's
/// start, the kernel's last activity and the GPU's last busy sample; a busy kernel is
/// never idle. A GPU without telemetry does not hold a notebook open (the kernel signal
/// decides alone), and the UI says so.
pub fn idle_decision(
    now: DateTime<Utc>,
    started_at: DateTime<Utc>,
    s: &ActivitySignals,
    policy: &IdlePolicy,
) -> IdleDecision {
    if s.kernel_busy {
        return IdleDecision::Active { idle_since: now };
    }
    let idle_since = [Some(started_at), s.kernel_last_activity, s.gpu_last_busy]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(started_at)
        .min(now);
    let stop_at = idle_since + policy.idle_after;
    if now >= stop_at {
        IdleDecision::Reclaim { idle_since }
    } else if now >= stop_at - policy.warn_before {
        IdleDecision::Warn {
            idle_since,
            stop_at,
        }
    } else {
        IdleDecision::Active { idle_since }
    }
}

// ---------------------------------------------------------------------------------------
// Views
// ---------------------------------------------------------------------------------------

/// A workload as users see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkloadView {
    pub id: WorkloadId,
    pub kind: WorkloadKind,
    /// The notebook's server name, or the job's name.
    pub name: String,
    pub allocation_id: AllocationId,
    pub team_id: TeamId,
    pub team_name: String,
    pub user_id: UserId,
    pub username: String,
    pub state: WorkloadState,
    /// Jobs: the shell command. Notebooks: empty.
    pub command: String,
    /// Jobs: folder inside the team workspace.
    pub workdir: String,
    pub env: Vec<EnvVar>,
    /// Jobs: how many more times a failure is retried; `attempt` counts from 1.
    pub retries: u32,
    pub attempt: u32,
    pub exit_code: Option<i32>,
    /// Why it failed, was stopped or was lost, in plain words.
    pub message: Option<String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub ready_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    /// Where the allocation's device is: hostname and MIG or GPU UUID.
    pub hostname: Option<String>,
    pub device: Option<String>,
    /// Notebooks that answer: the path to open (through the server's proxy).
    pub url: Option<String>,
    /// Notebooks: the idle-reclaim signals and decision, once running.
    pub activity: Option<ActivitySignals>,
    pub idle: Option<IdleDecision>,
    /// It brought its own GPU request: `allocation_id` is that allocation, released when the
    /// workload ends.
    #[serde(default)]
    pub owns_allocation: bool,
    /// While `queued`: why its allocation is not active yet, in plain words.
    #[serde(default)]
    pub waiting: Option<String>,
    /// Jobs, one workload's page: each earlier attempt and how it ended (a retry after a
    /// failure, a requeue after a preemption); the current one is the workload itself.
    #[serde(default)]
    pub attempts: Vec<AttemptView>,
    /// The image it runs in, pinned (`registry/repository@sha256:…`); `None`: the node's
    /// own environment.
    #[serde(default)]
    pub image: Option<String>,
    /// While its node pulls the image: bytes done and in all.
    #[serde(default)]
    pub pull: Option<PullView>,
    /// A multi-node job: every member (rank), rank 0 being the job itself. Empty for
    /// single-node workloads and while the gang waits in the queue.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankView>,
}

/// One member of a multi-node job: where it runs and how it stands. Its log is the
/// job's log with `?rank=`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RankView {
    pub rank: u32,
    /// The member's own workload id.
    pub id: WorkloadId,
    pub state: WorkloadState,
    pub hostname: String,
    /// Its devices (MIG or GPU UUIDs).
    pub devices: Vec<String>,
    /// Its address in the gang (once its sandbox is ready).
    #[serde(default)]
    pub addr: Option<String>,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub message: Option<String>,
    /// When its process was seen running.
    #[serde(default)]
    pub ready_at: Option<DateTime<Utc>>,
}

/// How far a workload's image pull has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PullView {
    pub done_bytes: u64,
    pub total_bytes: u64,
}

impl PullView {
    /// `Pulling image 43 %` (rounded down; 0 % until the size is known).
    pub fn label(&self) -> String {
        let pct = (self.done_bytes.min(self.total_bytes) * 100)
            .checked_div(self.total_bytes)
            .unwrap_or(0);
        format!("Pulling image {pct} %")
    }
}

/// A job's attempt for people: `2 of 3` while within the retries a failure may spend;
/// just `3 (requeued)` once requeues after preemptions (which spend no retry) took it past
/// them, instead of an impossible "3 of 2".
pub fn attempt_label(attempt: u32, retries: u32) -> String {
    let allowed = retries.saturating_add(1);
    if attempt > allowed {
        format!("{attempt} (requeued)")
    } else {
        format!("{attempt} of {allowed}")
    }
}

/// An ended attempt of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptView {
    pub attempt: u32,
    #[serde(flatten)]
    pub end: AttemptEnd,
}

/// How an attempt of a job ended, as recorded when the next one begins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptEnd {
    /// Where it ran.
    pub hostname: String,
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: DateTime<Utc>,
    pub exit_code: Option<i64>,
    /// Why it ended.
    pub reason: String,
    /// Ended by a preemption (capacity reclaimed, a drain, an unhealthy GPU).
    pub preempted: bool,
    /// GPU-milliseconds its allocation held during the attempt (for a preempted one, what
    /// the preemption cost).
    pub gpu_ms: i64,
}

/// A team's named notebook profile: the GPU and hours a member starts a notebook with in
/// one click (like JupyterHub's profile list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NotebookProfile {
    pub id: Uuid,
    pub team_id: TeamId,
    pub team_name: String,
    /// E.g. `Small`; unique within the team.
    pub name: String,
    /// `H100-80GB:1g.10gb`, `H100-80GB:whole`.
    pub kind: String,
    /// E.g. `1g.10gb on H100-80GB`.
    pub kind_label: String,
    pub hours: u32,
    /// The catalog image its notebooks run in (`None`: the node's environment).
    #[serde(default)]
    pub image_id: Option<Uuid>,
    #[serde(default)]
    pub image_name: Option<String>,
}

/// A profile's name: 1–40 characters, no line breaks or other control characters.
pub fn parse_profile_name(raw: &str) -> Result<String, AppError> {
    let name = raw.trim();
    if name.is_empty() || name.chars().count() > 40 {
        return Err(AppError::invalid("name", "1 to 40 characters"));
    }
    if name.chars().any(char::is_control) {
        return Err(AppError::invalid(
            "name",
            "no line breaks or control characters",
        ));
    }
    Ok(name.to_owned())
}

/// Proxy path prefix of a notebook: `/user/{username}/{name}/`.
/// The Kubernetes extended resource that stands for one allocated device in NVIDIA's
/// device plugin "mixed" strategy: `nvidia.com/mig-<profile>` for a MIG slice,
/// `nvidia.com/gpu` for a whole GPU.
/// What a share asks a Kubernetes node for: one replica of a GPU that NVIDIA's device
/// plugin shares (time-slicing or MPS, `renameByDefault: true`; see
/// `deploy/kubernetes/device-plugin-sharing.yaml`).
pub const SHARED_GPU_RESOURCE: &str = "nvidia.com/gpu.shared";

pub fn device_resource(mig_profile: Option<&str>) -> String {
    match mig_profile {
        Some(p) => format!("nvidia.com/mig-{p}"),
        None => "nvidia.com/gpu".to_owned(),
    }
}

pub fn notebook_base_path(username: &str, name: &str) -> String {
    format!("/user/{username}/{name}/")
}

/// The DNS label of a notebook's own origin: `nb-` and its workload id (35 characters, a
/// valid label whatever the user and notebook are called). A relaunch is a new workload,
/// so it gets a fresh origin: nothing a stopped notebook's pages stored carries over.
pub fn notebook_host_label(workload: WorkloadId) -> String {
    format!("nb-{}", workload.0.simple())
}

/// The workload a notebook origin's first DNS label names, if it is one.
pub fn parse_notebook_host_label(label: &str) -> Option<WorkloadId> {
    let hex = label.strip_prefix("nb-")?;
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    uuid::Uuid::try_parse(hex).ok().map(WorkloadId)
}

/// Whether `path` (as the client sent it, still percent-encoded) stays inside the
/// notebook's `base` path: it starts with it and has no `.`/`..` segment, empty segment,
/// backslash or encoded slash that a server behind the proxy could resolve elsewhere.
pub fn path_within(path: &str, base: &str) -> bool {
    if path == base.trim_end_matches('/') {
        return true;
    }
    let Some(rest) = path.strip_prefix(base) else {
        return false;
    };
    if path.contains('\\') {
        return false;
    }
    let segments: Vec<&str> = rest.split('/').collect();
    segments.iter().enumerate().all(|(i, seg)| {
        let lower = seg.to_ascii_lowercase();
        // An empty segment only as the last one: a trailing slash.
        let not_empty = !seg.is_empty() || i + 1 == segments.len();
        let dots = matches!(lower.replace("%2e", ".").as_str(), "." | "..");
        let smuggled = ["%2f", "%5c", "%00"].iter().any(|b| lower.contains(b));
        not_empty && !dots && !smuggled
    })
}

/// A piece of a workload's log, from byte `offset`; `next` is where the following read
/// starts. `start` is the first byte still kept (older output was dropped to stay within
/// the bound). `complete` once the workload ended and all its output arrived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogSlice {
    pub offset: u64,
    pub next: u64,
    pub start: u64,
    pub text: String,
    pub complete: bool,
}

/// Whether a node may report `endpoint` (`host:port`) for a notebook it runs: the host
/// must be the address the node's request came from (`peer`), or, when the node itself
/// talks over loopback (an agent on the server's host), a loopback address or a private
/// IPv4 one (RFC 1918: the notebook's own address in the agent's workload network), and
/// the port an unprivileged one. Anything else would let a node (or code that stole its
/// credential) send a notebook's proxied traffic, token included, wherever it likes.
pub fn endpoint_allowed(endpoint: &str, peer: Option<std::net::IpAddr>) -> bool {
    let Ok(addr) = endpoint.parse::<std::net::SocketAddr>() else {
        return false;
    };
    let Some(peer) = peer else {
        return false;
    };
    let peer = match peer {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, std::net::IpAddr::V4),
        v4 => v4,
    };
    let host_ok = if peer.is_loopback() {
        match addr.ip() {
            std::net::IpAddr::V4(v4) => v4.is_loopback() || v4.is_private(),
            v6 => v6.is_loopback(),
        }
    } else {
        addr.ip() == peer
    };
    host_ok && addr.port() >= 1024
}

/// Whether a reported log piece is well formed: `len` is exactly the text's length in
/// bytes and `offset + len` neither overflows nor leaves the signed range the stores
/// keep offsets in.
pub fn log_piece_valid(offset: u64, len: u64, text: &str) -> bool {
    len == text.len() as u64
        && offset
            .checked_add(len)
            .is_some_and(|end| i64::try_from(end).is_ok())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[test]
    fn notebook_paths_stay_inside_their_base() {
        let base = "/user/alice/lab/";
        for ok in [
            "/user/alice/lab",
            "/user/alice/lab/",
            "/user/alice/lab/lab",
            "/user/alice/lab/api/contents/my%20notes.ipynb",
            "/user/alice/lab/static/lab/main.js",
        ] {
            assert!(super::path_within(ok, base), "{ok}");
        }
        for bad in [
            "/user/alice/labx",
            "/user/bob/lab/api",
            "/user/alice/lab/../../bob/lab/api",
            "/user/alice/lab/%2e%2e/other",
            "/user/alice/lab/.%2E/other",
            "/user/alice/lab/./api",
            "/user/alice/lab//etc/passwd",
            "/user/alice/lab/files/a%2F..%2Fb",
            "/user/alice/lab/files/a%5cb",
            "/user/alice/lab/files\\..\\x",
            "/user/alice/lab/a%00b",
            "/",
        ] {
            assert!(!super::path_within(bad, base), "{bad}");
        }
    }

    #[test]
    fn notebook_host_labels_round_trip() {
        let id = WorkloadId(uuid::Uuid::from_u128(
            0x0196_1f2e_3d4c_7b5a_8f69_0e1d_2c3b_4a59,
        ));
        let label = super::notebook_host_label(id);
        assert!(label.len() <= 63, "{label}");
        assert_eq!(super::parse_notebook_host_label(&label), Some(id));
        assert_eq!(super::parse_notebook_host_label("nb-xyz"), None);
        assert_eq!(super::parse_notebook_host_label("www"), None);
        assert_eq!(
            super::parse_notebook_host_label(&format!("nb-{}", "g".repeat(32))),
            None
        );
    }

    use super::*;

    #[test]
    fn attempts_past_the_retries_read_as_requeued() {
        assert_eq!(attempt_label(1, 0), "1 of 1");
        assert_eq!(attempt_label(2, 2), "2 of 3");
        assert_eq!(attempt_label(2, 0), "2 (requeued)");
    }
    use chrono::TimeZone;

    #[test]
    fn endpoints_must_be_the_reporting_node() {
        let peer = |s: &str| Some(s.parse().unwrap());
        assert!(endpoint_allowed("10.0.0.5:8888", peer("10.0.0.5")));
        assert!(!endpoint_allowed("10.0.0.6:8888", peer("10.0.0.5")));
        assert!(!endpoint_allowed("127.0.0.1:8888", peer("10.0.0.5")));
        assert!(endpoint_allowed("127.0.0.1:40000", peer("127.0.0.1")));
        assert!(endpoint_allowed("[::1]:40000", peer("127.0.0.1")));
        assert!(endpoint_allowed(
            "127.0.0.1:40000",
            peer("::ffff:127.0.0.1")
        ));
        assert!(!endpoint_allowed("203.0.113.9:8888", peer("127.0.0.1")));
        // A sandboxed notebook's own address, from an agent on the server's host; a
        // node elsewhere reports its own address (and forwards it).
        assert!(endpoint_allowed("10.213.0.2:40000", peer("127.0.0.1")));
        assert!(endpoint_allowed("192.168.1.2:40000", peer("::1")));
        assert!(!endpoint_allowed("10.213.0.2:40000", peer("10.0.0.5")));
        assert!(!endpoint_allowed("169.254.169.254:8080", peer("127.0.0.1")));
        assert!(!endpoint_allowed("10.213.0.2:80", peer("127.0.0.1")));
        assert!(!endpoint_allowed("127.0.0.1:22", peer("127.0.0.1")));
        assert!(!endpoint_allowed("evil.example:8888", peer("127.0.0.1")));
        assert!(!endpoint_allowed("127.0.0.1:8888", None));
    }

    #[test]
    fn log_pieces_must_add_up() {
        assert!(log_piece_valid(0, 5, "hello"));
        assert!(log_piece_valid(10, 2, "é"));
        assert!(!log_piece_valid(0, 4, "hello"));
        assert!(!log_piece_valid(u64::MAX, 1, "x"));
        assert!(!log_piece_valid(i64::MAX as u64, 1, "x"));
    }

    fn t(min: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 23, 12, 0, 0).unwrap() + Duration::minutes(min)
    }

    #[test]
    fn terminal_states_go_nowhere_and_live_ones_can_be_stopped_or_lost() {
        for s in WorkloadState::ALL {
            for to in WorkloadState::ALL {
                if s.is_terminal() {
                    assert!(!s.can_transition(to), "{s:?} -> {to:?}");
                }
            }
            // Only what runs on a node can be lost there; a queued workload has no node.
            if !s.is_terminal() && s != WorkloadState::Queued {
                assert!(s.can_transition(WorkloadState::Lost), "{s:?} -> lost");
            }
        }
        // Waiting for its GPU: it starts (once the allocation is active) or ends at once.
        assert!(WorkloadState::Queued.can_transition(WorkloadState::Pending));
        assert!(WorkloadState::Queued.can_transition(WorkloadState::Cancelled));
        assert!(!WorkloadState::Queued.can_transition(WorkloadState::Running));
        assert!(!WorkloadState::Queued.can_transition(WorkloadState::Lost));
        assert!(!WorkloadState::Pending.can_transition(WorkloadState::Queued));
        assert!(WorkloadState::Running.can_transition(WorkloadState::Stopping));
        assert!(!WorkloadState::Stopping.can_transition(WorkloadState::Stopping));
        assert!(!WorkloadState::Running.can_transition(WorkloadState::Pending));
        assert!(WorkloadState::Stopping.can_transition(WorkloadState::Cancelled));
        assert!(!WorkloadState::Pending.can_transition(WorkloadState::Stopped));
        for s in WorkloadState::ALL {
            assert_eq!(s.as_str().parse::<WorkloadState>().unwrap(), s);
        }
    }

    #[test]
    fn profile_names_are_short_plain_text() {
        assert_eq!(parse_profile_name("  Small GPU ").unwrap(), "Small GPU");
        assert!(parse_profile_name("").is_err());
        assert!(parse_profile_name(&"x".repeat(41)).is_err());
        assert!(parse_profile_name("a\nb").is_err());
    }

    #[test]
    fn server_names_are_path_safe() {
        assert_eq!(ServerName::parse(" default ").unwrap().as_str(), "default");
        assert!(ServerName::parse("nb-2").is_ok());
        for bad in ["", "-x", "A", "a/b", "a b", "é", &"x".repeat(33), ".."] {
            let e = ServerName::parse(bad).unwrap_err();
            assert_eq!(e.field(), Some("name"), "{bad}");
        }
    }

    #[test]
    fn env_lines_parse_with_clear_errors() {
        let v = parse_env("A=1\n# comment\n\n_B = x=y \n").unwrap();
        assert_eq!(
            v,
            vec![
                EnvVar {
                    name: "A".into(),
                    value: "1".into()
                },
                EnvVar {
                    name: "_B".into(),
                    value: " x=y".into()
                }
            ]
        );
        assert_eq!(parse_env(&env_text(&v)).unwrap(), v);
        let msg = |s: &str| parse_env(s).unwrap_err().to_string();
        assert!(msg("A=1\nnoequals").contains("line 2"));
        assert!(msg("1A=2").contains("not a valid"));
        assert!(msg("CUDA_VISIBLE_DEVICES=0").contains("set by Tessera"));
        assert!(msg("TESSERA_X=0").contains("set by Tessera"));
        assert!(msg("A=1\nA=2").contains("twice"));
    }

    #[test]
    fn env_from_json_pairs_follows_the_same_rules() {
        let v = env_from_pairs([("EPOCHS", "3"), ("_X", "a=b c")]).unwrap();
        assert_eq!(env_text(&v), "EPOCHS=3\n_X=a=b c");
        let msg = |pairs: &[(&str, &str)]| env_from_pairs(pairs.iter().copied()).unwrap_err();
        for (pairs, says) in [
            (&[("A=B", "1")][..], "not a valid"),
            (&[("A\nB", "1")][..], "not a valid"),
            (&[("NVIDIA_VISIBLE_DEVICES", "all")][..], "set by Tessera"),
            (&[("A", "1\n2")][..], "line breaks"),
            (&[("A", "x\0")][..], "NUL"),
        ] {
            let e = msg(pairs);
            assert_eq!(e.field(), Some("env"), "{pairs:?}");
            assert!(e.to_string().contains(says), "{pairs:?}: {e}");
        }
        assert_eq!(check_retries(5).unwrap(), 5);
        assert_eq!(check_retries(6).unwrap_err().field(), Some("retries"));
    }

    #[test]
    fn workdirs_stay_inside_the_workspace() {
        assert_eq!(parse_workdir("").unwrap(), "");
        assert_eq!(parse_workdir("a/b/").unwrap(), "a/b");
        for bad in ["/etc", "../x", "a/../../b", "a//b"] {
            assert!(parse_workdir(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn commands_and_retries_are_checked() {
        assert!(JobCommand::parse("  ").is_err());
        assert_eq!(JobCommand::parse(" echo hi ").unwrap().as_str(), "echo hi");
        assert!(JobCommand::parse(&"x".repeat(MAX_COMMAND_LEN + 1)).is_err());
        assert_eq!(parse_retries("").unwrap(), 0);
        assert_eq!(parse_retries("5").unwrap(), 5);
        assert!(parse_retries("6").is_err());
        assert!(parse_retries("-1").is_err());
    }

    #[test]
    fn idle_needs_both_signals_quiet_for_the_whole_window() {
        let p = IdlePolicy::default();
        let quiet = ActivitySignals {
            kernel_last_activity: Some(t(0)),
            gpu_last_busy: Some(t(-30)),
            gpu_has_data: true,
            kernel_busy: false,
        };
        assert_eq!(
            idle_decision(t(30), t(-60), &quiet, &p),
            IdleDecision::Active { idle_since: t(0) }
        );
        assert_eq!(
            idle_decision(t(50), t(-60), &quiet, &p),
            IdleDecision::Warn {
                idle_since: t(0),
                stop_at: t(60)
            }
        );
        assert_eq!(
            idle_decision(t(60), t(-60), &quiet, &p),
            IdleDecision::Reclaim { idle_since: t(0) }
        );
        // GPU busy recently keeps it alive though the kernel is quiet.
        let gpu_busy = ActivitySignals {
            gpu_last_busy: Some(t(40)),
            ..quiet
        };
        assert_eq!(
            idle_decision(t(61), t(-60), &gpu_busy, &p),
            IdleDecision::Active { idle_since: t(40) }
        );
        // A busy kernel is never idle, however old its last activity.
        let busy = ActivitySignals {
            kernel_busy: true,
            ..quiet
        };
        assert!(matches!(
            idle_decision(t(500), t(-60), &busy, &p),
            IdleDecision::Active { .. }
        ));
        // No signals at all: idle since the start.
        assert_eq!(
            idle_decision(t(60), t(0), &ActivitySignals::default(), &p),
            IdleDecision::Reclaim { idle_since: t(0) }
        );
    }
}
