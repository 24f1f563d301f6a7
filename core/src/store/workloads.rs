//! `workloads`, `workload_logs`.
//!
//! Every state change is `UPDATE … WHERE state = <expected>`, so two writers (the agent's
//! report and a user's stop) never both win. Log chunks are keyed by their byte offset and
//! appended only at the end of what is stored, so a chunk the agent resends after a lost
//! answer is stored once.

use super::{
    JsonText, NullableId, NullableText, Store, StoreError, db, in_tx, json_text, on_pool,
    placeholders, undecodable,
};
use crate::at_rest::Sealed;
use chrono::{DateTime, Utc};
use tessera_domain::alloc::{AllocState, AllocatedDevice, GpuKind, PreemptCause, Ranks};
use tessera_domain::drain::DeadlineCause;
use tessera_domain::ids::{AllocationId, NodeId, TeamId, UserId, WorkloadId};
use tessera_domain::wire::GangLauncher;
use tessera_domain::workload::{AttemptEnd, AttemptView, WorkloadKind, WorkloadState};
use uuid::Uuid;

const COLS: &str = "w.id, w.kind, w.name, w.allocation_id, w.team_id, w.user_id, w.node_id, \
    w.hostname, w.devices, w.state, w.command, w.workdir, w.env, w.retries, w.attempt, w.token, \
    w.endpoint, w.exit_code, w.message, w.stop_state, w.created_at, w.started_at, w.ready_at, \
    w.ended_at, w.synced_at, w.kernel_activity, w.kernel_busy, w.log_base, w.log_stored, \
    w.log_start, w.log_complete, w.idempotency_key, w.owns_allocation, w.image, w.image_cuda, \
    w.pull_done, w.pull_total, w.gang_job, w.gang_rank, w.gang_size, w.gang_launcher, \
    w.gang_addr, w.gang_via, w.gang_ranks";

const LIVE: &str = "('queued', 'pending', 'starting', 'running', 'stopping')";

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct WorkloadRow {
    #[sqlx(try_from = "Uuid")]
    pub id: WorkloadId,
    #[sqlx(try_from = "String")]
    pub kind: WorkloadKind,
    pub name: String,
    #[sqlx(try_from = "Uuid")]
    pub allocation_id: AllocationId,
    #[sqlx(try_from = "Uuid")]
    pub team_id: TeamId,
    #[sqlx(try_from = "Uuid")]
    pub user_id: UserId,
    /// `None` while `queued` for its own allocation (then `hostname` is empty).
    #[sqlx(try_from = "NullableId")]
    pub node_id: Option<NodeId>,
    pub hostname: String,
    /// The allocation's devices on its node (a JSON list in the table).
    #[sqlx(try_from = "JsonText")]
    pub devices: Vec<AllocatedDevice>,
    #[sqlx(try_from = "String")]
    pub state: WorkloadState,
    pub command: String,
    pub workdir: String,
    /// JSON list of `EnvVar`, sealed (values may be secrets).
    pub env: Sealed,
    pub retries: i64,
    pub attempt: i64,
    /// The notebook's secret, sealed.
    pub token: Option<Sealed>,
    pub endpoint: Option<String>,
    pub exit_code: Option<i64>,
    pub message: Option<String>,
    /// While `stopping`: the state it ends in (`stopped` or `cancelled`).
    #[sqlx(try_from = "NullableText")]
    pub stop_state: Option<WorkloadState>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub ready_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    pub synced_at: Option<DateTime<Utc>>,
    pub kernel_activity: Option<DateTime<Utc>>,
    pub kernel_busy: bool,
    pub log_base: i64,
    pub log_stored: i64,
    pub log_start: i64,
    pub log_complete: bool,
    pub idempotency_key: Option<String>,
    /// It requested its own allocation, released when it ends.
    pub owns_allocation: bool,
    /// The image it runs in, pinned (`registry/repository@sha256:…`); `None`: the node's
    /// own environment.
    pub image: Option<String>,
    /// The CUDA version the image needs (`12.4`), when it says.
    pub image_cuda: Option<String>,
    /// While its node pulls the image: bytes done and in all.
    pub pull_done: Option<i64>,
    pub pull_total: Option<i64>,
    /// Gang members of rank 1 and up: the job (rank 0's id) they belong to (migration 0028).
    #[sqlx(try_from = "NullableId")]
    pub gang_job: Option<WorkloadId>,
    /// Its rank in its gang (0 for the job itself and for workloads not in a gang).
    pub gang_rank: i64,
    /// Set on every member of a gang: how many members (nodes) it has.
    pub gang_size: Option<i64>,
    /// Who runs the command (`each` or `rank0` in the table).
    #[sqlx(try_from = "NullableText")]
    pub gang_launcher: Option<GangLauncher>,
    /// The member's own address and its node's, once its sandbox is ready.
    pub gang_addr: Option<String>,
    pub gang_via: Option<String>,
    /// `per_gpu` when the gang starts one process per GPU (migration 0029); `None`: one
    /// per node.
    #[sqlx(try_from = "NullableText")]
    pub gang_ranks: Option<Ranks>,
}

/// An ended attempt's columns, in [`Store::workload_attempts`]' order.
type AttemptColumns = (
    i64,
    String,
    Option<DateTime<Utc>>,
    DateTime<Utc>,
    Option<i64>,
    String,
    bool,
    i64,
);

/// Tells workload `$id`'s owner in `$tx` that it left the queue (`workload.started`).
macro_rules! started_event {
    ($tx:expr, $id:expr, $now:expr) => {{
        let id: WorkloadId = $id;
        let (kind, name, team, user): (String, String, Uuid, Uuid) =
            sqlx::query_as("SELECT kind, name, team_id, user_id FROM workloads WHERE id = $1")
                .bind(id.0)
                .fetch_one(&mut *$tx)
                .await?;
        let payload = tessera_domain::notify::workload_payload(
            (id.0, &kind, &name),
            "pending",
            user,
            None,
            None,
        );
        let event = super::outbox::NewEvent::new(
            tessera_domain::notify::EventKind::WorkloadStarted,
            Some(team),
            ("workload", id.0),
            payload,
            $now,
        );
        super::outbox::record_event!($tx, &event);
    }};
}

/// An ended attempt's row as its view; an attempt number no release wrote fails the read.
fn attempt_view(c: AttemptColumns) -> Result<AttemptView, StoreError> {
    let attempt = u32::try_from(c.0).map_err(undecodable)?;
    let end = AttemptEnd {
        hostname: c.1,
        started_at: c.2,
        ended_at: c.3,
        exit_code: c.4,
        reason: c.5,
        preempted: c.6,
        gpu_ms: c.7,
    };
    Ok(AttemptView { attempt, end })
}

/// Records attempt `$attempt` of workload `$id` as `$ended` ([`AttemptEnd`]) in `$tx`
/// (once: a second record of the same attempt is dropped).
macro_rules! record_attempt {
    ($tx:expr, $id:expr, $attempt:expr, $ended:expr) => {{
        let e: &AttemptEnd = $ended;
        sqlx::query(
            "INSERT INTO workload_attempts (workload_id, attempt, hostname, started_at, ended_at, \
             exit_code, reason, preempted, gpu_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (workload_id, attempt) DO NOTHING",
        )
        .bind($id)
        .bind($attempt)
        .bind(&e.hostname)
        .bind(e.started_at)
        .bind(e.ended_at)
        .bind(e.exit_code)
        .bind(&e.reason)
        .bind(e.preempted)
        .bind(e.gpu_ms)
        .execute(&mut *$tx)
        .await?;
    }};
}

impl WorkloadRow {
    /// A new workload as first written: in `state`, first attempt, no command, place,
    /// token or report yet.
    pub fn new(
        kind: WorkloadKind,
        name: &str,
        (allocation_id, team_id, user_id): (AllocationId, TeamId, UserId),
        state: WorkloadState,
        created_at: DateTime<Utc>,
    ) -> WorkloadRow {
        WorkloadRow {
            id: WorkloadId(Uuid::now_v7()),
            kind,
            name: name.to_owned(),
            allocation_id,
            team_id,
            user_id,
            node_id: None,
            hostname: String::new(),
            devices: Vec::new(),
            state,
            command: String::new(),
            workdir: String::new(),
            env: Sealed::clear("[]"),
            retries: 0,
            attempt: 1,
            token: None,
            endpoint: None,
            exit_code: None,
            message: None,
            stop_state: None,
            created_at,
            started_at: None,
            ready_at: None,
            ended_at: None,
            synced_at: None,
            kernel_activity: None,
            kernel_busy: false,
            log_base: 0,
            log_stored: 0,
            log_start: 0,
            log_complete: false,
            idempotency_key: None,
            owns_allocation: false,
            image: None,
            image_cuda: None,
            pull_done: None,
            pull_total: None,
            gang_job: None,
            gang_rank: 0,
            gang_size: None,
            gang_launcher: None,
            gang_addr: None,
            gang_via: None,
            gang_ranks: None,
        }
    }
}

/// A notebook code or pass as read back: whom it was for, when it was issued, until when
/// it is good.
pub type Grant = (Uuid, DateTime<Utc>, DateTime<Utc>);

/// A workload with the names views show and its allocation's state.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct WorkloadListRow {
    #[sqlx(flatten)]
    pub w: WorkloadRow,
    pub team_name: String,
    pub username: String,
    #[sqlx(try_from = "String")]
    pub alloc_state: AllocState,
    /// The allocation's kind (`H100-80GB:share:250` gives the workload its share limits).
    #[sqlx(try_from = "String")]
    pub alloc_kind: GpuKind,
    /// The allocation's end, and its preemption or drain deadline with the cause (the
    /// deadline channel).
    #[sqlx(default)]
    pub alloc_ends_at: Option<DateTime<Utc>>,
    #[sqlx(default)]
    pub alloc_preempt_at: Option<DateTime<Utc>>,
    #[sqlx(default, try_from = "NullableText")]
    pub alloc_preempt_cause: Option<PreemptCause>,
    /// A deadline the workload service told this workload (`idle`, `stop`), and when.
    #[sqlx(default)]
    pub deadline_at: Option<DateTime<Utc>>,
    #[sqlx(default, try_from = "NullableText")]
    pub deadline_cause: Option<DeadlineCause>,
    /// Its team's own grace in seconds (`None`: the platform maximum).
    #[sqlx(default)]
    pub team_grace_secs: Option<i64>,
}

/// A team's notebook profile, with the team's name.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ProfileRow {
    pub id: Uuid,
    #[sqlx(try_from = "Uuid")]
    pub team_id: TeamId,
    pub team_name: String,
    pub name: String,
    #[sqlx(try_from = "String")]
    pub kind: GpuKind,
    pub duration_minutes: i64,
    pub image_id: Option<Uuid>,
    pub image_name: Option<String>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LogChunkRow {
    pub offset_b: i64,
    pub len_b: i64,
    pub text: String,
}

fn joined(filter: &str) -> String {
    format!(
        "SELECT {COLS}, t.name AS team_name, u.username AS username, a.state AS alloc_state, \
         a.kind AS alloc_kind, a.ends_at AS alloc_ends_at, a.preempt_at AS alloc_preempt_at, \
         CASE WHEN a.preempt_booking IS NOT NULL THEN 'booking' ELSE a.preempt_cause END AS alloc_preempt_cause, w.deadline_at AS deadline_at, \
         w.deadline_cause AS deadline_cause, t.preemption_grace_secs AS team_grace_secs \
         FROM workloads w JOIN teams t ON t.id = w.team_id JOIN users u ON u.id = w.user_id \
         JOIN allocations a ON a.id = w.allocation_id {filter}"
    )
}

/// What changes when a workload moves on.
#[derive(Debug, Clone, Default)]
pub struct WorkloadChange {
    pub started_at: Option<DateTime<Utc>>,
    pub ready_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
    pub exit_code: Option<i64>,
    pub message: Option<String>,
    pub stop_state: Option<WorkloadState>,
}

impl Store {
    /// Tells workload `id` a deadline (`idle`, `stop`) while it is in `state`; `false`
    /// when it moved on.
    pub async fn set_workload_deadline(
        &self,
        id: WorkloadId,
        state: &str,
        at: DateTime<Utc>,
        cause: DeadlineCause,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE workloads SET deadline_at = $3, deadline_cause = $4 \
                   WHERE id = $1 AND state = $2";
        let n = on_pool!(self, pool => sqlx::query(sql).bind(id.0).bind(state).bind(at).bind(cause.as_str())
            .execute(pool).await?.rows_affected());
        Ok(n == 1)
    }

    /// Withdraws workload `id`'s deadline if it is still the `cause` one.
    pub async fn clear_workload_deadline(
        &self,
        id: WorkloadId,
        cause: DeadlineCause,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE workloads SET deadline_at = NULL, deadline_cause = NULL \
                   WHERE id = $1 AND deadline_cause = $2";
        let n = on_pool!(self, pool => sqlx::query(sql).bind(id.0).bind(cause.as_str())
            .execute(pool).await?.rows_affected());
        Ok(n == 1)
    }

    /// Inserts a workload; `false` when a live notebook of the same user already has its
    /// name, or the idempotency key was used.
    pub async fn insert_workload(&self, w: &WorkloadRow) -> Result<bool, StoreError> {
        let devices = json_text(&w.devices)?;
        let sql = "INSERT INTO workloads (id, kind, name, allocation_id, team_id, user_id, \
                   node_id, hostname, devices, state, command, workdir, env, retries, attempt, \
                   token, created_at, idempotency_key, owns_allocation, image, image_cuda, \
                   gang_job, gang_rank, gang_size, gang_launcher, gang_ranks) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
                   $17, $18, $19, $20, $21, $22, $23, $24, $25, $26) \
                   ON CONFLICT DO NOTHING";
        on_pool!(self, pool => {
            let r = sqlx::query(sql)
                .bind(w.id.0).bind(w.kind.as_str()).bind(&w.name).bind(w.allocation_id.0).bind(w.team_id.0)
                .bind(w.user_id.0).bind(w.node_id.map(|n| n.0)).bind(&w.hostname).bind(&devices)
                .bind(w.state.as_str()).bind(&w.command).bind(&w.workdir).bind(&w.env).bind(w.retries)
                .bind(w.attempt).bind(&w.token).bind(w.created_at).bind(&w.idempotency_key)
                .bind(w.owns_allocation).bind(&w.image).bind(&w.image_cuda).bind(w.gang_job.map(|g| g.0))
                .bind(w.gang_rank).bind(w.gang_size).bind(w.gang_launcher.map(GangLauncher::as_str)).bind(w.gang_ranks.map(Ranks::as_str))
                .execute(pool).await?;
            Ok(r.rows_affected() == 1)
        })
    }

    pub async fn workload(&self, id: WorkloadId) -> Result<Option<WorkloadListRow>, StoreError> {
        let sql = joined("WHERE w.id = $1");
        db!(self, pool => sqlx::query_as::<_, WorkloadListRow>(&sql).bind(id.0).fetch_optional(pool).await)
    }

    pub async fn workload_by_key(
        &self,
        user: UserId,
        key: &str,
    ) -> Result<Option<WorkloadId>, StoreError> {
        let sql = "SELECT id FROM workloads WHERE user_id = $1 AND idempotency_key = $2";
        db!(self, pool => sqlx::query_scalar::<_, Uuid>(sql).bind(user.0).bind(key).fetch_optional(pool).await.map(|id| id.map(WorkloadId)))
    }

    /// The live notebook at `/user/{username}/{name}/`.
    pub async fn live_notebook(
        &self,
        username: &str,
        name: &str,
    ) -> Result<Option<WorkloadListRow>, StoreError> {
        let sql = joined(&format!(
            "WHERE u.username = $1 AND w.name = $2 AND w.kind = 'notebook' AND w.state IN {LIVE}"
        ));
        db!(self, pool => sqlx::query_as::<_, WorkloadListRow>(&sql).bind(username).bind(name).fetch_optional(pool).await)
    }

    /// A page of workloads, newest first. `teams`: only these (`None`: all); `user`: only
    /// this user's; `kind`, `allocation`: filters; `live`: only non-terminal ones.
    #[allow(clippy::too_many_arguments)]
    pub async fn list_workloads(
        &self,
        teams: Option<&[TeamId]>,
        user: Option<UserId>,
        kind: Option<&str>,
        allocation: Option<AllocationId>,
        live: bool,
        offset: u32,
        limit: u32,
    ) -> Result<(Vec<WorkloadListRow>, u64), StoreError> {
        // A gang job is listed once (rank 0); its other members show on its page.
        let mut filter = String::from("WHERE w.gang_job IS NULL");
        let mut n = 0;
        let mut next = || {
            n += 1;
            n
        };
        if let Some(ts) = teams {
            let ps: Vec<String> = ts.iter().map(|_| format!("${}", next())).collect();
            if ps.is_empty() {
                filter.push_str(" AND 1 = 0");
            } else {
                filter.push_str(&format!(" AND w.team_id IN ({})", ps.join(", ")));
            }
        }
        if user.is_some() {
            filter.push_str(&format!(" AND w.user_id = ${}", next()));
        }
        if kind.is_some() {
            filter.push_str(&format!(" AND w.kind = ${}", next()));
        }
        if allocation.is_some() {
            filter.push_str(&format!(" AND w.allocation_id = ${}", next()));
        }
        if live {
            filter.push_str(&format!(" AND w.state IN {LIVE}"));
        }
        let lim = next();
        let off = next();
        let sql = joined(&format!(
            "{filter} ORDER BY w.created_at DESC, w.id LIMIT ${lim} OFFSET ${off}"
        ));
        let count = format!("SELECT COUNT(*) FROM workloads w {filter}");
        on_pool!(self, pool => {
            let mut q = sqlx::query_as::<_, WorkloadListRow>(&sql);
            let mut c = sqlx::query_scalar::<_, i64>(&count);
            for t in teams.unwrap_or(&[]) {
                q = q.bind(t.0);
                c = c.bind(t.0);
            }
            if let Some(u) = user {
                q = q.bind(u.0);
                c = c.bind(u.0);
            }
            if let Some(k) = kind {
                q = q.bind(k);
                c = c.bind(k);
            }
            if let Some(a) = allocation {
                q = q.bind(a.0);
                c = c.bind(a.0);
            }
            let rows = q.bind(i64::from(limit)).bind(i64::from(offset)).fetch_all(pool).await?;
            let total = c.fetch_one(pool).await?;
            Ok((rows, u64::try_from(total).unwrap_or(0)))
        })
    }

    /// What a node's executor must know about: its live workloads, and ended ones whose
    /// log has not fully arrived (for at most `log_grace_since`).
    pub async fn node_workloads(
        &self,
        node: NodeId,
        log_grace_since: DateTime<Utc>,
    ) -> Result<Vec<WorkloadListRow>, StoreError> {
        let sql = joined(&format!(
            "WHERE w.node_id = $1 AND (w.state IN {LIVE} OR (w.log_complete = FALSE \
             AND w.ended_at >= $2)) ORDER BY w.created_at"
        ));
        db!(self, pool => sqlx::query_as::<_, WorkloadListRow>(&sql).bind(node.0).bind(log_grace_since).fetch_all(pool).await)
    }

    /// Every live workload, with its allocation's state (the scheduler pass).
    pub async fn live_workloads(&self) -> Result<Vec<WorkloadListRow>, StoreError> {
        let sql = joined(&format!("WHERE w.state IN {LIVE} ORDER BY w.created_at"));
        db!(self, pool => sqlx::query_as::<_, WorkloadListRow>(&sql).fetch_all(pool).await)
    }

    /// Up to `limit` workloads after `after` (by id) whose token or environment is not
    /// sealed under the current key (`prefix`, `tsx1.<key id>.`): in clear from an older
    /// release, or under an older key.
    pub async fn workload_secrets_to_seal(
        &self,
        prefix: &str,
        after: WorkloadId,
        limit: i64,
    ) -> Result<Vec<(WorkloadId, Option<Sealed>, Sealed)>, StoreError> {
        let sql = "SELECT id, token, env FROM workloads WHERE id > $1 \
                   AND (env NOT LIKE $2 OR (token IS NOT NULL AND token NOT LIKE $2)) \
                   ORDER BY id LIMIT $3";
        let pattern = format!("{prefix}%");
        let rows = db!(self, pool => sqlx::query_as::<_, (Uuid, Option<Sealed>, Sealed)>(sql)
            .bind(after.0).bind(&pattern).bind(limit).fetch_all(pool).await)?;
        Ok(rows
            .into_iter()
            .map(|(id, token, env)| (WorkloadId(id), token, env))
            .collect())
    }

    /// Replaces a workload's token and environment with the same values sealed anew, unless
    /// its environment is no longer `was` (another replica sealed it first); `false` then.
    pub async fn reseal_workload_secrets(
        &self,
        id: WorkloadId,
        was: &Sealed,
        token: Option<&Sealed>,
        env: &Sealed,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE workloads SET token = $1, env = $2 WHERE id = $3 AND env = $4";
        db!(self, pool => sqlx::query(sql).bind(token).bind(env).bind(id.0).bind(was)
            .execute(pool).await.map(|r| r.rows_affected() == 1))
    }

    /// Live workloads counted by kind and state (a gang job once).
    pub async fn live_workload_counts(&self) -> Result<Vec<(String, String, i64)>, StoreError> {
        let sql = format!(
            "SELECT kind, state, COUNT(*) FROM workloads WHERE state IN {LIVE} AND gang_job IS NULL \
             GROUP BY kind, state"
        );
        db!(self, pool => sqlx::query_as::<_, (String, String, i64)>(&sql).fetch_all(pool).await)
    }

    /// A queued workload's allocation is active: it gets the node and devices it runs on and
    /// becomes `pending`; `false` if it was no longer queued.
    pub async fn place_queued_workload(
        &self,
        id: WorkloadId,
        node: NodeId,
        hostname: &str,
        devices: &[AllocatedDevice],
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let devices = json_text(devices)?;
        let sql = "UPDATE workloads SET state = 'pending', node_id = $2, hostname = $3, \
                   devices = $4 WHERE id = $1 AND state = 'queued'";
        // Leaving the queue is told to its owner (`workload.started`), in the same
        // transaction.
        in_tx!(self, tx => {
            let moved = sqlx::query(sql).bind(id.0).bind(node.0).bind(hostname).bind(&devices)
                .execute(&mut *tx).await?.rows_affected() == 1;
            if moved {
                started_event!(tx, id, now);
            }
            moved
        })
    }

    /// Allocations that ended workloads still hold: `(allocation, workload name, workload
    /// state)` for every workload that owns its allocation, has ended, and whose allocation
    /// still holds quota or waits for it, once no workload on it is live (a gang's other
    /// members). Read from the (few) live allocations.
    pub async fn allocations_of_ended_workloads(
        &self,
    ) -> Result<Vec<(AllocationId, String, String)>, StoreError> {
        let sql = format!(
            "SELECT a.id, w.name, w.state FROM allocations a \
             JOIN workloads w ON w.allocation_id = a.id \
             WHERE a.state IN ('pending_approval', 'queued', 'placing', 'active') \
               AND w.owns_allocation AND w.state NOT IN {LIVE} \
               AND NOT EXISTS (SELECT 1 FROM workloads m WHERE m.allocation_id = a.id \
                               AND m.state IN {LIVE})"
        );
        let rows = db!(self, pool => sqlx::query_as::<_, (Uuid, String, String)>(&sql).fetch_all(pool).await)?;
        Ok(rows
            .into_iter()
            .map(|(id, name, state)| (AllocationId(id), name, state))
            .collect())
    }

    /// The notebook profiles of `teams`, by team name then profile name.
    pub async fn notebook_profiles(&self, teams: &[TeamId]) -> Result<Vec<ProfileRow>, StoreError> {
        if teams.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT p.id, p.team_id, t.name AS team_name, p.name, p.kind, p.duration_minutes, \
             p.image_id, c.name AS image_name \
             FROM notebook_profiles p JOIN teams t ON t.id = p.team_id \
             LEFT JOIN image_catalog c ON c.id = p.image_id \
             WHERE p.team_id IN ({}) ORDER BY lower(t.name), lower(p.name)",
            placeholders(1, teams.len())
        );
        db!(self, pool => {
            let mut q = sqlx::query_as::<_, ProfileRow>(&sql);
            for t in teams {
                q = q.bind(t.0);
            }
            q.fetch_all(pool).await
        })
    }

    /// Stores a team's profile; one of the same name is replaced (its id kept).
    #[allow(clippy::too_many_arguments)]
    pub async fn save_notebook_profile(
        &self,
        id: Uuid,
        team: TeamId,
        name: &str,
        kind: &str,
        duration_minutes: i64,
        image: Option<Uuid>,
        at: DateTime<Utc>,
        by: UserId,
    ) -> Result<Uuid, StoreError> {
        let sql = "INSERT INTO notebook_profiles (id, team_id, name, kind, duration_minutes, \
                   created_at, created_by, image_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                   ON CONFLICT (team_id, name) DO UPDATE SET kind = excluded.kind, \
                   duration_minutes = excluded.duration_minutes, image_id = excluded.image_id \
                   RETURNING id";
        db!(self, pool => sqlx::query_scalar::<_, Uuid>(sql).bind(id).bind(team.0).bind(name)
            .bind(kind).bind(duration_minutes).bind(at).bind(by.0).bind(image).fetch_one(pool).await)
    }

    /// Deletes a team's profile; `false` if the team has no such profile.
    pub async fn delete_notebook_profile(
        &self,
        team: TeamId,
        id: Uuid,
    ) -> Result<bool, StoreError> {
        let sql = "DELETE FROM notebook_profiles WHERE id = $1 AND team_id = $2";
        on_pool!(self, pool => {
            let r = sqlx::query(sql).bind(id).bind(team.0).execute(pool).await?;
            Ok(r.rows_affected() == 1)
        })
    }

    pub async fn notebook_profile(&self, id: Uuid) -> Result<Option<ProfileRow>, StoreError> {
        let sql = "SELECT p.id, p.team_id, t.name AS team_name, p.name, p.kind, p.duration_minutes, \
                   p.image_id, c.name AS image_name \
                   FROM notebook_profiles p JOIN teams t ON t.id = p.team_id \
                   LEFT JOIN image_catalog c ON c.id = p.image_id WHERE p.id = $1";
        db!(self, pool => sqlx::query_as::<_, ProfileRow>(sql).bind(id).fetch_optional(pool).await)
    }

    /// Moves a workload from `from` to `to` at `now`; `false` if it was not in `from` any
    /// more.
    pub async fn workload_step(
        &self,
        id: WorkloadId,
        from: &str,
        to: &str,
        c: &WorkloadChange,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE workloads SET state = $3, \
                   started_at = COALESCE(started_at, $4), ready_at = COALESCE(ready_at, $5), \
                   ended_at = COALESCE($6, ended_at), exit_code = COALESCE($7, exit_code), \
                   message = COALESCE($8, message), stop_state = COALESCE($9, stop_state) \
                   WHERE id = $1 AND state = $2";
        // An end is told to its owner (docs/notifications.md): the event is written in the
        // same transaction as the state.
        let told = tessera_domain::notify::workload_end_kind(to, None).is_some();
        in_tx!(self, tx => {
            let r = sqlx::query(sql)
                .bind(id.0).bind(from).bind(to).bind(c.started_at).bind(c.ready_at)
                .bind(c.ended_at).bind(c.exit_code).bind(&c.message).bind(c.stop_state.map(|s| s.as_str()))
                .execute(&mut *tx).await?;
            let moved = r.rows_affected() == 1;
            if moved && told {
                let (kind, name, team, user, exit_code, message): (String, String, Uuid, Uuid, Option<i64>, Option<String>) =
                    sqlx::query_as("SELECT kind, name, team_id, user_id, exit_code, message \
                                    FROM workloads WHERE id = $1")
                        .bind(id.0).fetch_one(&mut *tx).await?;
                if let Some(event_kind) = tessera_domain::notify::workload_end_kind(to, message.as_deref()) {
                    let payload = tessera_domain::notify::workload_payload(
                        (id.0, &kind, &name), to, user, exit_code, message.as_deref());
                    let event = super::outbox::NewEvent::new(
                        event_kind, Some(team), ("workload", id.0), payload,
                        c.ended_at.unwrap_or(now));
                    super::outbox::record_event!(tx, &event);
                }
            }
            moved
        })
    }

    /// Starts the next attempt of a failed job: back to `pending`, the log continues
    /// where the last attempt's ended.
    /// The attempt that ended is recorded (`ended`) in the same transaction.
    pub async fn workload_retry(
        &self,
        id: WorkloadId,
        from: &str,
        attempt: i64,
        note: &str,
        ended: &AttemptEnd,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE workloads SET state = 'pending', attempt = $3, log_base = log_stored, \
                   endpoint = NULL, exit_code = NULL, message = $4 \
                   WHERE id = $1 AND state = $2 AND attempt = $3 - 1";
        in_tx!(self, tx => {
            let moved = sqlx::query(sql).bind(id.0).bind(from).bind(attempt).bind(note)
                .execute(&mut *tx).await?.rows_affected() == 1;
            if moved {
                record_attempt!(tx, id.0, attempt - 1, ended);
            }
            moved
        })
    }

    /// GPU-milliseconds of attempts ended by preemption, ever.
    pub async fn preempted_gpu_ms(&self) -> Result<i64, StoreError> {
        let sql = "SELECT CAST(COALESCE(SUM(gpu_ms), 0) AS BIGINT) FROM workload_attempts \
                   WHERE preempted";
        db!(self, pool => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await)
    }

    /// A job's ended attempts, oldest first.
    pub async fn workload_attempts(&self, id: WorkloadId) -> Result<Vec<AttemptView>, StoreError> {
        let sql = "SELECT attempt, hostname, started_at, ended_at, exit_code, reason, preempted, \
                   gpu_ms FROM workload_attempts WHERE workload_id = $1 ORDER BY attempt";
        let rows = db!(self, pool => sqlx::query_as::<_, AttemptColumns>(sql).bind(id.0).fetch_all(pool).await)?;
        rows.into_iter().map(attempt_view).collect()
    }

    /// When a job's current attempt began: the later of its first start and its previous
    /// attempt's end (a workload's `started_at` is its first attempt's).
    pub async fn attempt_began(
        &self,
        id: WorkloadId,
        started_at: Option<DateTime<Utc>>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let sql = "SELECT MAX(ended_at) FROM workload_attempts WHERE workload_id = $1";
        let last: Option<DateTime<Utc>> =
            db!(self, pool => sqlx::query_scalar(sql).bind(id.0).fetch_one(pool).await)?;
        Ok(match (started_at, last) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        })
    }

    /// A running job whose own allocation was preempted goes back to `queued` on a new
    /// allocation, as its next attempt: off its node (whose executor then stops the old run,
    /// no longer wanted), its log continuing after what was stored. `false` if it moved on.
    #[allow(clippy::too_many_arguments)]
    pub async fn requeue_workload(
        &self,
        id: WorkloadId,
        from: &str,
        old_allocation: AllocationId,
        new_allocation: AllocationId,
        attempt: i64,
        note: &str,
        ended: &AttemptEnd,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE workloads SET state = 'queued', allocation_id = $4, node_id = NULL, \
                   hostname = '', devices = '[]', attempt = $5, log_base = log_stored, \
                   endpoint = NULL, exit_code = NULL, synced_at = NULL, stop_state = NULL, \
                   ended_at = NULL, message = $6 \
                   WHERE id = $1 AND state = $2 AND allocation_id = $3 AND attempt = $5 - 1 \
                     AND owns_allocation";
        in_tx!(self, tx => {
            let moved = sqlx::query(sql).bind(id.0).bind(from).bind(old_allocation.0)
                .bind(new_allocation.0).bind(attempt).bind(note)
                .execute(&mut *tx).await?.rows_affected() == 1;
            if moved {
                record_attempt!(tx, id.0, attempt - 1, ended);
            }
            moved
        })
    }

    /// Records what the executor reported besides the state.
    pub async fn workload_seen(
        &self,
        id: WorkloadId,
        at: DateTime<Utc>,
        endpoint: Option<&str>,
        kernel_activity: Option<DateTime<Utc>>,
        kernel_busy: bool,
    ) -> Result<(), StoreError> {
        let sql = "UPDATE workloads SET synced_at = $2, endpoint = COALESCE($3, endpoint), \
                   kernel_activity = COALESCE($4, kernel_activity), kernel_busy = $5 WHERE id = $1";
        db!(self, pool => sqlx::query(sql).bind(id.0).bind(at).bind(endpoint).bind(kernel_activity).bind(kernel_busy).execute(pool).await.map(|_| ()))
    }

    /// Appends `len` bytes of the current attempt's log at the attempt's `offset` (a piece
    /// that is already stored is skipped), drops the oldest chunks beyond `cap` bytes, and
    /// marks the log complete when `complete`. Returns how far the attempt's log is stored.
    pub async fn append_log(
        &self,
        id: WorkloadId,
        offset: u64,
        len: u64,
        text: &str,
        complete: bool,
        cap: u64,
    ) -> Result<u64, StoreError> {
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        let len = i64::try_from(len).unwrap_or(0);
        let cap = i64::try_from(cap).unwrap_or(i64::MAX);
        in_tx!(self, tx => {
            // Write first (see `set_quota`): the read below then cannot go stale on SQLite.
            sqlx::query("UPDATE workloads SET log_stored = log_stored WHERE id = $1")
                .bind(id.0).execute(&mut *tx).await?;
            let Some((base, stored)) = sqlx::query_as::<_, (i64, i64)>(
                "SELECT log_base, log_stored FROM workloads WHERE id = $1",
            )
            .bind(id.0)
            .fetch_optional(&mut *tx)
            .await?
            else {
                return Ok(0);
            };
            let at = base.saturating_add(offset);
            let mut stored_now = stored;
            // A piece at or beyond the end is new (beyond: output the node could not send
            // was lost; the gap shows as a jump in offsets). One before the end was stored.
            if len > 0 && at >= stored {
                sqlx::query("INSERT INTO workload_logs (workload_id, offset_b, len_b, text) \
                             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING")
                    .bind(id.0).bind(at).bind(len).bind(text)
                    .execute(&mut *tx).await?;
                stored_now = at + len;
                let keep_from = stored_now - cap;
                if keep_from > 0 {
                    sqlx::query("DELETE FROM workload_logs WHERE workload_id = $1 \
                                 AND offset_b + len_b <= $2")
                        .bind(id.0).bind(keep_from).execute(&mut *tx).await?;
                }
                sqlx::query("UPDATE workloads SET log_stored = $2, log_start = COALESCE(\
                             (SELECT MIN(offset_b) FROM workload_logs WHERE workload_id = $1), $2) \
                             WHERE id = $1")
                    .bind(id.0).bind(stored_now).execute(&mut *tx).await?;
            }
            if complete && at.saturating_add(len) >= stored_now {
                sqlx::query("UPDATE workloads SET log_complete = TRUE WHERE id = $1")
                    .bind(id.0).execute(&mut *tx).await?;
            }
            u64::try_from(stored_now - base).unwrap_or(0)
        })
    }

    /// Marks a workload's log complete without more output (lost workloads).
    pub async fn close_log(&self, id: WorkloadId) -> Result<(), StoreError> {
        db!(self, pool => sqlx::query("UPDATE workloads SET log_complete = TRUE WHERE id = $1").bind(id.0).execute(pool).await.map(|_| ()))
    }

    /// Log chunks that end after `from`, in order, until about `max_bytes`.
    pub async fn log_chunks(
        &self,
        id: WorkloadId,
        from: u64,
        max_bytes: u64,
    ) -> Result<Vec<LogChunkRow>, StoreError> {
        let from = i64::try_from(from).unwrap_or(i64::MAX);
        // Chunks are at most 256 KiB, so this many always cover `max_bytes`.
        let limit = i64::try_from(max_bytes / 1024 + 4).unwrap_or(64);
        let sql = "SELECT offset_b, len_b, text FROM workload_logs WHERE workload_id = $1 \
                   AND offset_b + len_b > $2 ORDER BY offset_b LIMIT $3";
        on_pool!(self, pool => {
            let rows = sqlx::query_as::<_, LogChunkRow>(sql).bind(id.0).bind(from).bind(limit).fetch_all(pool).await?;
            let mut out = Vec::new();
            let mut total = 0i64;
            for r in rows {
                total += r.len_b;
                out.push(r);
                if u64::try_from(total).unwrap_or(u64::MAX) >= max_bytes {
                    break;
                }
            }
            Ok(out)
        })
    }

    // ---- notebook grants (the notebook origin's one-time codes and cookie passes) ----

    #[allow(clippy::too_many_arguments)]
    pub async fn insert_notebook_grant(
        &self,
        hash: &str,
        kind: &str,
        workload: WorkloadId,
        user: UserId,
        issued_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        db!(self, pool => sqlx::query(
            "INSERT INTO notebook_grants (secret_hash, kind, workload_id, user_id, issued_at, \
             expires_at) VALUES ($1, $2, $3, $4, $5, $6)")
            .bind(hash).bind(kind).bind(workload.0).bind(user.0).bind(issued_at).bind(expires_at)
            .execute(pool).await.map(|_| ()))
    }

    /// Removes a one-time code for `workload` and returns who it was for, when it was
    /// issued and until when it was good: two redeemers of one code never both get it.
    pub async fn take_notebook_code(
        &self,
        hash: &str,
        workload: WorkloadId,
    ) -> Result<Option<Grant>, StoreError> {
        db!(self, pool => sqlx::query_as::<_, Grant>(
            "DELETE FROM notebook_grants WHERE secret_hash = $1 AND kind = 'code' \
             AND workload_id = $2 RETURNING user_id, issued_at, expires_at")
            .bind(hash).bind(workload.0).fetch_optional(pool).await)
    }

    /// A cookie pass for `workload`: its user, when it was issued, until when it is good.
    pub async fn notebook_pass(
        &self,
        hash: &str,
        workload: WorkloadId,
    ) -> Result<Option<Grant>, StoreError> {
        db!(self, pool => sqlx::query_as::<_, Grant>(
            "SELECT user_id, issued_at, expires_at FROM notebook_grants WHERE secret_hash = $1 \
             AND kind = 'cookie' AND workload_id = $2")
            .bind(hash).bind(workload.0).fetch_optional(pool).await)
    }

    /// Forgets codes and passes past their time, and those of notebooks that ended.
    pub async fn prune_notebook_grants(&self, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let sql = format!(
            "DELETE FROM notebook_grants WHERE expires_at < $1 OR workload_id IN \
             (SELECT id FROM workloads WHERE state NOT IN {LIVE})"
        );
        db!(self, pool => sqlx::query(&sql).bind(now).execute(pool).await.map(|r| r.rows_affected()))
    }
}

/// Gang jobs (issue 42): members, their addresses.
impl Store {
    /// Rank 0 (`job`, queued) takes its node and devices and becomes `pending`, and the
    /// other `members` (rows of ranks 1.., `pending` on their nodes) are stored, all in
    /// one transaction: either the whole gang leaves the queue or nothing changes.
    /// `false` if the job was no longer queued.
    pub async fn place_gang(
        &self,
        job: WorkloadId,
        (node, hostname, devices): (NodeId, &str, &[AllocatedDevice]),
        members: &[WorkloadRow],
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let devices = json_text(devices)?;
        let member_devices = members
            .iter()
            .map(|w| json_text(&w.devices))
            .collect::<Result<Vec<_>, _>>()?;
        let sql = "UPDATE workloads SET state = 'pending', node_id = $2, hostname = $3, \
                   devices = $4 WHERE id = $1 AND state = 'queued'";
        let insert = "INSERT INTO workloads (id, kind, name, allocation_id, team_id, user_id, \
                   node_id, hostname, devices, state, command, workdir, env, retries, attempt, \
                   token, created_at, idempotency_key, owns_allocation, image, image_cuda, \
                   gang_job, gang_rank, gang_size, gang_launcher, gang_ranks) \
                   VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
                   $17, $18, $19, $20, $21, $22, $23, $24, $25, $26)";
        in_tx!(self, tx => {
            let moved = sqlx::query(sql).bind(job.0).bind(node.0).bind(hostname).bind(&devices)
                .execute(&mut *tx).await?.rows_affected() == 1;
            if !moved {
                return Ok(false);
            }
            for (w, devices) in members.iter().zip(&member_devices) {
                sqlx::query(insert)
                    .bind(w.id.0).bind(w.kind.as_str()).bind(&w.name).bind(w.allocation_id.0).bind(w.team_id.0)
                    .bind(w.user_id.0).bind(w.node_id.map(|n| n.0)).bind(&w.hostname).bind(devices)
                    .bind(w.state.as_str()).bind(&w.command).bind(&w.workdir).bind(&w.env).bind(w.retries)
                    .bind(w.attempt).bind(&w.token).bind(w.created_at).bind(&w.idempotency_key)
                    .bind(w.owns_allocation).bind(&w.image).bind(&w.image_cuda).bind(w.gang_job.map(|g| g.0))
                    .bind(w.gang_rank).bind(w.gang_size).bind(w.gang_launcher.map(GangLauncher::as_str)).bind(w.gang_ranks.map(Ranks::as_str))
                    .execute(&mut *tx).await?;
            }
            started_event!(tx, job, now);
            true
        })
    }

    /// Every member of gang `job` (rank 0 first), whatever their state.
    pub async fn gang_members(&self, job: WorkloadId) -> Result<Vec<WorkloadListRow>, StoreError> {
        let sql = joined("WHERE w.id = $1 OR w.gang_job = $1 ORDER BY w.gang_rank");
        db!(self, pool => sqlx::query_as::<_, WorkloadListRow>(&sql).bind(job.0).fetch_all(pool).await)
    }

    /// Records a member's address and its node's as its agent reported them; `true` when
    /// they changed.
    pub async fn set_gang_addr(
        &self,
        id: WorkloadId,
        addr: &str,
        via: &str,
    ) -> Result<bool, StoreError> {
        let sql = "UPDATE workloads SET gang_addr = $2, gang_via = $3 WHERE id = $1 \
                   AND (gang_addr IS NULL OR gang_addr <> $2 OR gang_via IS NULL OR gang_via <> $3)";
        db!(self, pool => sqlx::query(sql).bind(id.0).bind(addr).bind(via)
            .execute(pool).await.map(|r| r.rows_affected() == 1))
    }
}
