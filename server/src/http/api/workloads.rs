//! Notebooks, notebook profiles and jobs.

use super::*;
use tessera_domain::ids::AllocationId;
use tessera_domain::workload::{self as wl, EnvVar};

#[derive(Deserialize, utoipa::IntoParams)]
pub(super) struct WorkloadQuery {
    /// `notebook` or `job`.
    kind: Option<WorkloadKind>,
    /// Only this team's.
    team: Option<Uuid>,
    /// Only those on this allocation.
    allocation: Option<Uuid>,
    /// Only the caller's own.
    #[serde(default)]
    mine: bool,
    /// Only those not ended.
    #[serde(default)]
    live: bool,
    #[serde(default)]
    offset: u32,
    #[serde(default = "default_limit")]
    limit: u32,
}

#[utoipa::path(get, path = "/api/v1/workloads", tag = "workloads", params(WorkloadQuery),
    description = "Notebooks and jobs the caller may see (their teams'; platform admins: all), newest first.",
    responses((status = 200, description = "OK", body = Page<WorkloadView>), NotFound, Invalid))]
pub(super) async fn list_workloads(
    Call(s, p): Call,
    Query(q): Query<WorkloadQuery>,
) -> ApiResult<Page<WorkloadView>> {
    let filter = WorkloadFilter {
        kind: q.kind,
        team: q.team.map(TeamId),
        allocation: q.allocation.map(AllocationId),
        mine: q.mine,
        live: q.live,
    };
    ok(s.workloads
        .list(&p, &filter, PageRequest::new(q.offset, q.limit))
        .await)
}

/// Environment variables as `{"NAME": "value"}` (values without line breaks).
fn env_of(env: &std::collections::BTreeMap<String, String>) -> Result<Vec<EnvVar>, AppError> {
    wl::env_from_pairs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// A GPU request of a workload's own, instead of an `allocation_id`: the workload waits
/// `queued` until it is active (same quota, approval and queue as any request) and gives it
/// back when it ends.
#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct OwnGpu {
    /// `H100-80GB:1g.10gb` or `H100-80GB:whole`.
    gpu: Option<String>,
    /// How many of `gpu`; 1 when absent.
    #[serde(default)]
    count: Option<u32>,
    /// The team that pays; the caller's only team when absent.
    #[serde(default)]
    team_id: Option<String>,
    /// `high`, `normal` (default) or `preemptible`.
    #[serde(default)]
    priority: Option<String>,
    /// Longest run in minutes (the allocation's duration); the policy's default when absent.
    #[serde(default)]
    time_limit_minutes: Option<u32>,
    /// Jobs: run on this many nodes at once (a gang), each with `gpus_per_node` (or
    /// `count`) of `gpu`; placed all together or not at all.
    #[serde(default)]
    nodes: Option<u32>,
    /// With `nodes`: how many of `gpu` each node gets (the same as `count`).
    #[serde(default)]
    gpus_per_node: Option<u32>,
}

impl OwnGpu {
    fn request(&self) -> Result<Option<NewAllocation>, AppError> {
        let Some(gpu) = self.gpu.as_deref() else {
            for (field, set) in [
                ("nodes", self.nodes.is_some()),
                ("gpus_per_node", self.gpus_per_node.is_some()),
            ] {
                if set {
                    return Err(AppError::invalid(
                        field,
                        "needs `gpu` (the kind each node gets)",
                    ));
                }
            }
            return Ok(None);
        };
        let count = match (self.count, self.gpus_per_node) {
            (Some(c), Some(g)) if c != g => {
                return Err(AppError::invalid(
                    "gpus_per_node",
                    "give `gpus_per_node` or `count`, not two different numbers",
                ));
            }
            (_, Some(_)) if self.nodes.is_none() => {
                return Err(AppError::invalid("gpus_per_node", "only with `nodes`"));
            }
            (c, g) => g.or(c).unwrap_or(1),
        };
        Ok(Some(NewAllocation {
            team_id: self.team_id.clone().unwrap_or_default(),
            kind: gpu.to_owned(),
            count,
            duration_minutes: self.time_limit_minutes,
            starts_at: None,
            priority: self.priority.clone(),
            purpose: String::new(),
            needs_cuda: None,
            nodes: self.nodes,
        }))
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct NewNotebookBody {
    /// An active allocation of the caller's; or give `gpu` or `profile_id` instead.
    #[serde(default)]
    allocation_id: Option<Uuid>,
    /// One of the caller's teams' notebook profiles (its GPU and hours, its team pays).
    #[serde(default)]
    profile_id: Option<Uuid>,
    #[serde(flatten)]
    own: OwnGpu,
    /// The notebook's name (its URL is `/user/{username}/{name}/lab`); lowercase letters,
    /// digits and `-`.
    name: String,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    /// An image of the team's catalog (`GET /api/v1/images`: its id, name or pinned
    /// reference) to run JupyterLab from; absent: the profile's image, else the node's
    /// environment.
    #[serde(default)]
    image: Option<String>,
    /// Anything else: refused (422 naming it), never silently dropped.
    #[serde(flatten)]
    #[schema(ignore)]
    unknown: std::collections::BTreeMap<String, serde_json::Value>,
}

#[utoipa::path(post, path = "/api/v1/notebooks", tag = "workloads", request_body = NewNotebookBody,
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeating a request with the same key returns the notebook the first one made.")),
    description = "Launches JupyterLab on one of the caller's active allocations, or with a GPU \
                   request of its own (`gpu`): then it is `queued` until that GPU is active and \
                   gives it back when stopped. It is `pending`, then `starting`, then `running` \
                   once it answers; open its `url` (through the server's authenticated proxy).",
    responses((status = 201, description = "Created", body = WorkloadView), Invalid, Conflict))]
pub(super) async fn launch_notebook(
    Call(s, p): Call,
    headers: http::HeaderMap,
    JsonBody(b): JsonBody<NewNotebookBody>,
) -> Created<WorkloadView> {
    refuse_unknown(&b.unknown)?;
    let req = NewNotebook {
        allocation_id: b.allocation_id.map(AllocationId),
        gpu: b.own.request()?,
        profile_id: b.profile_id,
        name: b.name,
        env: env_of(&b.env)?,
        image: b.image,
        idempotency_key: headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    };
    created(s.workloads.launch_notebook(&p, &req).await)
}

#[utoipa::path(get, path = "/api/v1/teams/{id}/notebook-profiles", tag = "workloads",
    description = "The team's named notebook profiles (GPU and hours a member starts a notebook \
                   with in one click: `POST /api/v1/notebooks {profile_id}`).",
    responses((status = 200, description = "OK", body = Vec<NotebookProfile>), NotFound))]
pub(super) async fn list_notebook_profiles(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
) -> ApiResult<Vec<NotebookProfile>> {
    ok(s.workloads.profiles(&p, Some(TeamId(team))).await)
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct NewProfile {
    /// E.g. `Small`; a profile of the same name is replaced.
    name: String,
    /// `H100-80GB:1g.10gb`, `H100-80GB:whole`.
    kind: String,
    /// How long its notebooks may run.
    hours: u32,
    /// An image of the team's catalog its notebooks run in (id or name); absent: the
    /// node's environment.
    #[serde(default)]
    image: Option<String>,
}

#[utoipa::path(post, path = "/api/v1/teams/{id}/notebook-profiles", tag = "workloads",
    request_body = NewProfile, description = "Adds (or replaces by name) a notebook profile \
    of the team: team admins and platform admins.",
    responses((status = 201, description = "Created", body = NotebookProfile), Forbidden, NotFound, Invalid))]
pub(super) async fn save_notebook_profile(
    Call(s, p): Call,
    Path(team): Path<Uuid>,
    JsonBody(b): JsonBody<NewProfile>,
) -> Created<NotebookProfile> {
    created(
        s.workloads
            .save_profile(
                &p,
                TeamId(team),
                &b.name,
                &b.kind,
                b.hours,
                b.image.as_deref(),
            )
            .await,
    )
}

#[utoipa::path(delete, path = "/api/v1/teams/{id}/notebook-profiles/{profile_id}", tag = "workloads",
    responses((status = 204, description = "Done"), Forbidden, NotFound))]
pub(super) async fn delete_notebook_profile(
    Call(s, p): Call,
    Path((team, id)): Path<(Uuid, Uuid)>,
) -> Result<StatusCode, ApiError> {
    s.workloads.delete_profile(&p, TeamId(team), id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, utoipa::ToSchema)]
pub(super) struct NewJobBody {
    /// An active allocation of the caller's; or give `gpu` instead.
    #[serde(default)]
    allocation_id: Option<Uuid>,
    #[serde(flatten)]
    own: OwnGpu,
    /// Shell command (`/bin/sh -c`), run in the team workspace.
    command: String,
    /// Default: the start of the command.
    #[serde(default)]
    name: String,
    /// Folder inside the team workspace (must exist).
    #[serde(default)]
    workdir: String,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    /// Times a failed run is started again (0–5).
    #[serde(default)]
    retries: u32,
    /// One task of a sweep (`tessera job submit --array`): its index, which the run gets as
    /// `TESSERA_ARRAY_INDEX`.
    #[serde(default)]
    array_index: Option<u32>,
    /// An image of the team's catalog (`GET /api/v1/images`: its id, name or pinned
    /// reference) to run in; absent: the node's environment.
    #[serde(default)]
    image: Option<String>,
    /// A multi-node job (`nodes`): `each` (default: every node runs the command, e.g.
    /// `torchrun`) or `rank0` (only rank 0 runs it, e.g. `mpirun --hostfile
    /// $TESSERA_HOSTFILE`, which reaches the other nodes through `tessera-rsh`).
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    launcher: Option<String>,
    /// A multi-node job with the `each` launcher: `per_node` (default: one process per
    /// node, e.g. `torchrun --nproc-per-node`) or `per_gpu` (one process per GPU, each with
    /// its own `RANK`, `LOCAL_RANK`, `WORLD_SIZE` and `CUDA_VISIBLE_DEVICES`).
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    ranks: Option<String>,
    /// Anything else: refused (422 naming it), never silently dropped.
    #[serde(flatten)]
    #[schema(ignore)]
    unknown: std::collections::BTreeMap<String, serde_json::Value>,
}

/// A body's first field the server does not know, as a 422 naming it.
fn refuse_unknown(
    unknown: &std::collections::BTreeMap<String, serde_json::Value>,
) -> Result<(), AppError> {
    match unknown.keys().next() {
        Some(k) => Err(AppError::invalid(k, "is not a field the server knows")),
        None => Ok(()),
    }
}

#[utoipa::path(post, path = "/api/v1/jobs", tag = "workloads", request_body = NewJobBody,
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeating a request with the same key returns the job the first one made.")),
    description = "Runs a command on one of the caller's active allocations, or with a GPU request \
                   of its own (`gpu`, `count`, `priority`, `time_limit_minutes`): then it waits \
                   `queued` (see `waiting`) until that GPU is active and gives it back when it \
                   ends. `pending → running → succeeded | failed` (with its exit code), or \
                   `cancelled`. Logs: `/api/v1/workloads/{id}/logs`.",
    responses((status = 201, description = "Created", body = WorkloadView), Invalid, Conflict))]
pub(super) async fn submit_job(
    Call(s, p): Call,
    headers: http::HeaderMap,
    JsonBody(b): JsonBody<NewJobBody>,
) -> Created<WorkloadView> {
    refuse_unknown(&b.unknown)?;
    let req = NewJob {
        allocation_id: b.allocation_id.map(AllocationId),
        gpu: b.own.request()?,
        array_index: b.array_index,
        name: b.name,
        command: b.command,
        workdir: b.workdir,
        env: env_of(&b.env)?,
        retries: b.retries,
        image: b.image,
        launcher: b
            .launcher
            .as_deref()
            .map(tessera_domain::wire::GangLauncher::parse)
            .transpose()?,
        ranks: b
            .ranks
            .as_deref()
            .map(tessera_domain::alloc::Ranks::parse)
            .transpose()?,
        idempotency_key: headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    };
    created(s.workloads.submit_job(&p, &req).await)
}

#[utoipa::path(get, path = "/api/v1/workloads/{id}", tag = "workloads",
    description = "A notebook or job; running notebooks include their idle-reclaim signals and decision.",
    responses((status = 200, description = "OK", body = WorkloadView), NotFound))]
pub(super) async fn get_workload(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
) -> ApiResult<WorkloadView> {
    ok(s.workloads.get(&p, id.into()).await)
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(super) struct StopQuery {
    /// Stop at once, without the warning (also what a second stop during the warning does).
    #[serde(default)]
    now: bool,
}

#[utoipa::path(post, path = "/api/v1/workloads/{id}/stop", tag = "workloads", params(StopQuery),
    description = "Stops a notebook or cancels a job (owner, team admin, platform admin); its \
                   process group is killed on the node. A running workload that asked for the \
                   warning signal (`TESSERA_DEADLINE_SIGNAL`), or whose team set a grace, is \
                   warned first (deadline file with cause `stop`, the signal) and stays \
                   `stopping` for up to 30 s (never more than the team's grace) before SIGTERM; \
                   `?now=true`, or a second stop meanwhile, stops it at once.",
    responses((status = 200, description = "OK", body = WorkloadView), Forbidden, NotFound, Conflict))]
pub(super) async fn stop_workload(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
    Query(q): Query<StopQuery>,
) -> ApiResult<WorkloadView> {
    ok(s.workloads.stop_with(&p, id.into(), q.now).await)
}

#[derive(Deserialize, utoipa::IntoParams)]
pub(super) struct LogQuery {
    /// Byte offset to read from (a previous answer's `next`); default: the last `max` bytes.
    from: Option<u64>,
    /// Bytes to return at most (1 KiB–1 MiB, default 64 KiB).
    #[serde(default = "default_log_max")]
    max: u64,
    /// A multi-node job's member (`ranks[].rank`); default 0, the job itself.
    #[serde(default)]
    rank: u32,
}

fn default_log_max() -> u64 {
    64 * 1024
}

#[utoipa::path(get, path = "/api/v1/workloads/{id}/logs", tag = "workloads", params(LogQuery),
    description = "Output (stdout and stderr) from byte `from`; poll with `from = next` to follow. \
                   `complete` once the workload ended and all its output arrived. Owner, team \
                   admin, platform admin.",
    responses((status = 200, description = "OK", body = LogSlice), Forbidden, NotFound, Invalid))]
pub(super) async fn workload_logs(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
    Query(q): Query<LogQuery>,
) -> ApiResult<LogSlice> {
    let id = s.workloads.rank_id(&p, id.into(), q.rank).await?;
    ok(s.workloads.logs(&p, id, q.from, q.max).await)
}

#[utoipa::path(get, path = "/api/v1/workloads/{id}/log.txt", tag = "workloads",
    description = "The whole log kept (the newest 4 MiB), as a download.",
    responses((status = 200, description = "Log", content_type = "text/plain", body = String), Forbidden, NotFound))]
pub(super) async fn workload_log_file(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
) -> Result<axum::response::Response, ApiError> {
    let (file, text) = s.workloads.log_text(&p, id.into()).await?;
    let mut res = axum::response::IntoResponse::into_response(text);
    let h = res.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(v) = http::HeaderValue::from_str(&format!("attachment; filename=\"{file}\"")) {
        h.insert(http::header::CONTENT_DISPOSITION, v);
    }
    Ok(res)
}
