//! The Kubernetes executor (`TESSERA_EXECUTOR=kubernetes`), the only `kube` import in the
//! tree. It speaks the same executor protocol as a node agent's process executor
//! (`Workloads::sync`: reports in, desired workloads out), but turns the desired set into
//! Kubernetes objects instead of processes:
//!
//! - per team, a namespace with a ResourceQuota (GPU resources = what its running
//!   workloads were allotted), a default-deny NetworkPolicy plus one letting the server's
//!   proxy reach notebooks, and a ReadWriteMany workspace claim;
//! - a Pod per notebook and a Job per training run on the allocation's node, asking for
//!   the allocation's devices as NVIDIA device plugin resources ("mixed" strategy:
//!   `nvidia.com/mig-1g.10gb`, `nvidia.com/gpu`);
//! - status from the pods (phase, readiness, exit code), logs from the pods' log API.
//!
//! Each round lists the executor's objects once (label `app.kubernetes.io/managed-by`),
//! reports per node, syncs, then creates what is missing and deletes what is no longer
//! wanted. Everything it does is idempotent (a create that finds the object is fine), so a
//! restart just continues.

pub mod exec;
mod objects;

use anyhow::Context;
use clap::Args;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolumeClaim, Pod, ResourceQuota, Secret, Service,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
pub use objects::*;
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tessera_core::Services;
use tessera_core::auth::SystemActor;
use tessera_core::services::nodes::NodeIdentity;
use tessera_domain::wire::{
    GangLauncher, LogPiece, RegistryLogin, WorkloadPhase, WorkloadReport, WorkloadReports,
    WorkloadSpec,
};
use tessera_domain::workload::WorkloadKind;
use tokio::sync::Mutex;
use tracing::instrument::WithSubscriber;

/// Settings of the Kubernetes executor (used only with `TESSERA_EXECUTOR=kubernetes`).
#[derive(Debug, Clone, Args)]
pub struct KubeSettings {
    /// Kubeconfig of the cluster that runs workloads. Default: `KUBECONFIG` or
    /// `~/.kube/config`, else the pod's service account (in-cluster).
    #[arg(long = "kubeconfig", env = "TESSERA_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Container image of notebooks and jobs (notebooks need `jupyter lab` in it).
    #[arg(
        long = "k8s-image",
        env = "TESSERA_K8S_IMAGE",
        default_value = "quay.io/jupyter/pytorch-notebook:cuda12-latest"
    )]
    pub image: String,
    /// A team's namespace is this prefix followed by the team's id.
    #[arg(
        long = "k8s-namespace-prefix",
        env = "TESSERA_K8S_NAMESPACE_PREFIX",
        default_value = "tessera-team-"
    )]
    pub namespace_prefix: String,
    /// The namespace the server runs in: its pods (label
    /// `app.kubernetes.io/name=tessera-server`) may reach notebooks.
    #[arg(
        long = "k8s-server-namespace",
        env = "TESSERA_K8S_SERVER_NAMESPACE",
        default_value = "tessera"
    )]
    pub server_namespace: String,
    /// Size of each team's workspace volume (a Kubernetes quantity).
    #[arg(
        long = "k8s-workspace-size",
        env = "TESSERA_K8S_WORKSPACE_SIZE",
        default_value = "50Gi"
    )]
    pub workspace_size: String,
    /// Storage class of team workspaces (must offer ReadWriteMany). Default: the
    /// cluster's default class.
    #[arg(long = "k8s-storage-class", env = "TESSERA_K8S_STORAGE_CLASS")]
    pub storage_class: Option<String>,
    /// Most pods a team's namespace may hold (its ResourceQuota).
    #[arg(
        long = "k8s-max-pods",
        env = "TESSERA_K8S_MAX_PODS",
        default_value_t = 50
    )]
    pub max_pods: u32,
    /// How often the executor reconciles.
    #[arg(long = "k8s-interval", env = "TESSERA_K8S_INTERVAL", default_value = "2s",
          value_parser = crate::settings::parse_duration)]
    pub interval: Duration,
}

impl KubeSettings {
    pub fn validate(&self) -> Result<(), String> {
        let p = &self.namespace_prefix;
        let ok = !p.is_empty()
            && p.len() <= 26
            && p.starts_with(|c: char| c.is_ascii_lowercase())
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !ok {
            return Err(
                "TESSERA_K8S_NAMESPACE_PREFIX must be 1-26 lowercase letters, digits or '-', \
                 starting with a letter"
                    .into(),
            );
        }
        if self.image.trim().is_empty() {
            return Err("TESSERA_K8S_IMAGE must name a container image".into());
        }
        Ok(())
    }
}

/// Log bytes fetched per workload and round.
const LOG_CHUNK: u64 = 256 * 1024;

/// What a round did, for the log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    pub created: u32,
    pub deleted: u32,
}

pub struct KubeExecutor {
    client: Client,
    s: KubeSettings,
    http: reqwest::Client,
    memory: Mutex<Memory>,
}

/// What the executor remembers between rounds (all of it can be lost: a restart costs
/// one round of catching up, never a workload).
#[derive(Default)]
struct Memory {
    /// Per node, the desired set of the last round (run id → spec).
    desired: HashMap<tessera_domain::ids::NodeId, HashMap<String, WorkloadSpec>>,
    /// How much of each run's log the server holds.
    acked: HashMap<String, u64>,
    /// Teams whose namespace and fixtures exist.
    teams: HashSet<String>,
    /// The GPU part of each team's quota as last written.
    quotas: HashMap<String, BTreeMap<String, i64>>,
    /// Gangs whose Job, Service and NetworkPolicy exist.
    gangs: HashSet<String>,
}

/// The objects of one run as observed this round.
#[derive(Default)]
struct Observed<'a> {
    pod: Option<&'a Pod>,
    job: Option<&'a Job>,
    /// The node the run was placed on (its objects' label; a gang member's from its
    /// Job's annotation).
    node: Option<&'a str>,
    /// A gang member's gang (job id): its Job is the whole gang's.
    gang: Option<&'a str>,
}

impl KubeExecutor {
    /// Connects with the configured kubeconfig, or infers one (env, home, in-cluster).
    pub async fn connect(s: KubeSettings) -> anyhow::Result<KubeExecutor> {
        let config = match &s.kubeconfig {
            Some(path) => {
                let kc = Kubeconfig::read_from(path)
                    .with_context(|| format!("reading TESSERA_KUBECONFIG {}", path.display()))?;
                Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                    .await
                    .context("TESSERA_KUBECONFIG")?
            }
            None => Config::infer().await.context(
                "no Kubernetes configuration (KUBECONFIG, ~/.kube/config or in-cluster)",
            )?,
        };
        let client = Client::try_from(config).context("Kubernetes client")?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .context("HTTP client")?;
        Ok(KubeExecutor {
            client,
            s,
            http,
            memory: Mutex::new(Memory::default()),
        })
    }

    /// The executor's Pods and Jobs, across namespaces.
    async fn list_objects(&self) -> anyhow::Result<(Vec<Pod>, Vec<Job>)> {
        let lp = ListParams::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
        let pods = Api::<Pod>::all(self.client.clone())
            .list(&lp)
            .await
            .context("listing pods")?
            .items;
        let jobs = Api::<Job>::all(self.client.clone())
            .list(&lp)
            .await
            .context("listing jobs")?
            .items;
        Ok((pods, jobs))
    }

    /// Brings the cluster to `desired` without asking the server what should run: the
    /// second half of a [`round`](Self::round), for driving the executor with specs built
    /// by hand (the integration tests of what one spec becomes).
    pub async fn reconcile(
        &self,
        desired: &[(NodeIdentity, WorkloadSpec)],
    ) -> anyhow::Result<Round> {
        let mut mem = self.memory.lock().await;
        let (pods, jobs) = self.list_objects().await?;
        let seen = observe(&pods, &jobs);
        self.apply(&mut mem, desired, &seen).await
    }

    /// One reconciliation round over every node.
    pub async fn round(&self, services: &Services, system: &SystemActor) -> anyhow::Result<Round> {
        let mut mem = self.memory.lock().await;
        let (pods, jobs) = self.list_objects().await?;
        let seen = observe(&pods, &jobs);

        let nodes = services.nodes.metrics_now().await?;
        let now_ms = chrono::Utc::now().timestamp_millis();
        let mut desired: Vec<(NodeIdentity, WorkloadSpec)> = Vec::new();
        for n in nodes {
            let node = NodeIdentity::for_executor(system, n.id, &n.hostname);
            let node_label = n.id.to_string();
            let mut runs: BTreeMap<String, Option<&WorkloadSpec>> = BTreeMap::new();
            for (run, o) in &seen {
                if o.node == Some(node_label.as_str()) {
                    runs.insert(run.clone(), None);
                }
            }
            let last = mem.desired.remove(&n.id).unwrap_or_default();
            for (run, spec) in &last {
                runs.insert(run.clone(), Some(spec));
            }
            let mut reports = Vec::new();
            for (run, spec) in runs {
                let o = seen.get(&run);
                let acked = mem.acked.get(&run).copied();
                if let Some(r) = self.report(&run, spec, o, acked).await {
                    reports.push(r);
                }
            }
            let sync = services
                .workloads
                .sync(
                    &node,
                    tessera_core::services::workloads::Reporter::Executor,
                    &WorkloadReports {
                        at_unix_ms: now_ms,
                        workloads: reports,
                    },
                )
                .await?;
            for a in &sync.log_acks {
                mem.acked.insert(a.id.clone(), a.stored_through);
            }
            let wanted: HashMap<String, WorkloadSpec> = sync
                .workloads
                .iter()
                .map(|w| (w.id.clone(), w.clone()))
                .collect();
            desired.extend(sync.workloads.into_iter().map(|w| (node.clone(), w)));
            mem.desired.insert(n.id, wanted);
        }
        self.apply(&mut mem, &desired, &seen).await
    }

    /// How one run stands, from its objects; `None` when there is nothing to say yet.
    async fn report(
        &self,
        run: &str,
        spec: Option<&WorkloadSpec>,
        o: Option<&Observed<'_>>,
        acked: Option<u64>,
    ) -> Option<WorkloadReport> {
        let mut r = WorkloadReport {
            id: run.to_owned(),
            phase: WorkloadPhase::Starting,
            exit_code: None,
            message: None,
            endpoint: None,
            kernel_last_activity_ms: None,
            kernel_busy: false,
            log_complete: false,
            log: None,
            pull: None,
            gang_addr: None,
            gang_via: None,
        };
        if let Some(spec) = spec
            && let Some(g) = &spec.gang
        {
            // A member's address is its pod's DNS name, known before anything exists: the
            // server sends the peers (and the gang is created) once every member has one.
            let key = gang_key(&g.job, &spec.id);
            let addr = gang_member_addr(&self.s, &spec.workspace, &key, g.rank);
            r.gang_addr = Some(addr.clone());
            r.gang_via = Some(addr);
            if g.launcher == GangLauncher::Rank0 {
                r.phase = WorkloadPhase::FailedToStart;
                r.message = Some(
                    "`launcher: rank0` starts the other members through Tessera's remote agent, \
                     which the Kubernetes executor does not run: use `launcher: each` (every \
                     pod runs the command, e.g. torchrun)"
                        .into(),
                );
                return Some(r);
            }
        }
        let Some(o) = o.filter(|o| o.pod.is_some() || o.job.is_some()) else {
            // Gone: deleted on the server's request (a stop), or by someone else.
            let spec = spec?;
            if spec.run {
                // Created this round; a gang member waiting for its peers says its address.
                return spec.gang.is_some().then_some(r);
            }
            r.phase = WorkloadPhase::Exited;
            r.log_complete = true;
            return Some(r);
        };
        let Some(pod) = o.pod else {
            // A job whose pod does not exist yet, or was removed with the job's failure.
            if let Some(reason) = o.job.and_then(job_failure) {
                r.phase = WorkloadPhase::Exited;
                r.message = Some(reason);
                r.log_complete = true;
            }
            return Some(r);
        };
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        let main = status
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.name == CONTAINER));
        let mut started = true;
        match phase {
            "Pending" => {
                started = false;
                let waiting = main
                    .and_then(|c| c.state.as_ref())
                    .and_then(|s| s.waiting.as_ref());
                if let Some(w) = waiting {
                    let reason = w.reason.as_deref().unwrap_or("");
                    if matches!(
                        reason,
                        "ErrImagePull"
                            | "ImagePullBackOff"
                            | "InvalidImageName"
                            | "CreateContainerConfigError"
                            | "CreateContainerError"
                    ) {
                        r.phase = WorkloadPhase::FailedToStart;
                        r.message = Some(format!(
                            "{reason}: {}",
                            w.message
                                .as_deref()
                                .unwrap_or("the container did not start")
                        ));
                        return Some(r);
                    }
                }
            }
            "Running" => {
                let ready = status
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                let is_notebook = label(&pod.metadata.labels, LABEL_KIND)
                    == Some(WorkloadKind::Notebook.as_str());
                if !is_notebook || ready {
                    r.phase = WorkloadPhase::Running;
                }
                if is_notebook && let Some(ip) = status.and_then(|s| s.pod_ip.as_deref()) {
                    let endpoint = format!("{ip}:{NOTEBOOK_PORT}");
                    if ready && let Some(spec) = spec {
                        self.probe_kernel(&mut r, &endpoint, spec).await;
                    }
                    r.endpoint = Some(endpoint);
                }
            }
            "Succeeded" | "Failed" => {
                r.phase = WorkloadPhase::Exited;
                r.exit_code = main
                    .and_then(|c| c.state.as_ref())
                    .and_then(|s| s.terminated.as_ref())
                    .map(|t| t.exit_code);
                if r.exit_code.is_none() {
                    r.message = status.and_then(|s| s.reason.clone());
                }
            }
            _ => {}
        }
        if started && let Some(from) = acked {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let name = pod.metadata.name.as_deref().unwrap_or("");
            let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            let lp = LogParams {
                container: Some(CONTAINER.into()),
                limit_bytes: i64::try_from(from + LOG_CHUNK).ok(),
                ..LogParams::default()
            };
            match api.logs(name, &lp).await {
                Ok(text) => {
                    let bytes = text.as_bytes();
                    let total = bytes.len() as u64;
                    if total > from {
                        let start = usize::try_from(from).unwrap_or(usize::MAX);
                        let piece = String::from_utf8_lossy(&bytes[start.min(bytes.len())..]);
                        r.log = Some(LogPiece {
                            offset: from,
                            len: total - from,
                            text: piece.into_owned(),
                        });
                    }
                    r.log_complete = r.phase == WorkloadPhase::Exited && total < from + LOG_CHUNK;
                }
                Err(e) => tracing::debug!(run, "pod log: {e}"),
            }
        }
        Some(r)
    }

    /// Jupyter's own view of its kernels: `last_activity` and whether one is busy.
    async fn probe_kernel(&self, r: &mut WorkloadReport, endpoint: &str, spec: &WorkloadSpec) {
        let (Some(base), Some(token)) = (&spec.base_path, &spec.token) else {
            return;
        };
        let get = |path: &str| {
            self.http
                .get(format!("http://{endpoint}{base}{path}"))
                .header("authorization", format!("token {token}"))
                .send()
        };
        if let Ok(resp) = get("api/status").await
            && let Ok(v) = resp.json::<serde_json::Value>().await
        {
            r.kernel_last_activity_ms = v["last_activity"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.timestamp_millis());
        }
        if let Ok(resp) = get("api/kernels").await
            && let Ok(v) = resp.json::<Vec<serde_json::Value>>().await
        {
            r.kernel_busy = v.iter().any(|k| k["execution_state"] == "busy");
        }
    }

    /// Creates what is wanted and missing, deletes what is not wanted.
    async fn apply(
        &self,
        mem: &mut Memory,
        desired: &[(NodeIdentity, WorkloadSpec)],
        seen: &HashMap<String, Observed<'_>>,
    ) -> anyhow::Result<Round> {
        let mut round = Round::default();
        // Each team's GPU allotment: what its workloads that should run ask for.
        let mut teams: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
        for (_, w) in desired.iter().filter(|(_, w)| w.run) {
            let t = teams.entry(w.workspace.clone()).or_default();
            for r in &w.resources {
                *t.entry(r.clone()).or_default() += 1;
            }
        }
        // Teams with nothing running any more go back to a zero allotment.
        for team in &mem.teams {
            teams.entry(team.clone()).or_default();
        }
        for (team, gpus) in &teams {
            if let Err(e) = self.ensure_team(mem, team, gpus).await {
                tracing::warn!(team, "preparing the team's namespace: {e:#}");
            }
        }
        // Gangs: one Indexed Job for all members. A gang's objects stay while any member
        // should run (a rank that finished first must not take the others with it).
        let mut gangs: BTreeMap<String, Vec<(&NodeIdentity, &WorkloadSpec)>> = BTreeMap::new();
        for (node, w) in desired {
            if let Some(g) = &w.gang {
                gangs
                    .entry(gang_key(&g.job, &w.id))
                    .or_default()
                    .push((node, w));
            }
        }
        let live_gangs: HashSet<&str> = gangs
            .iter()
            .filter(|(_, ms)| ms.iter().any(|(_, w)| w.run))
            .map(|(g, _)| g.as_str())
            .collect();
        for (gang, members) in &gangs {
            match self.ensure_gang(mem, gang, members, seen).await {
                Ok(created) => round.created += created,
                Err(e) => tracing::warn!(gang, "creating the gang's objects: {e:#}"),
            }
        }
        let mut keep: HashSet<&str> = HashSet::new();
        let mut deleted_gangs: HashSet<&str> = HashSet::new();
        // Deletes `o`'s objects, a gang's only when none of it should run any more (and
        // once per round).
        fn may_delete<'s>(
            o: Option<&Observed<'s>>,
            live: &HashSet<&str>,
            deleted: &mut HashSet<&'s str>,
        ) -> bool {
            match o.and_then(|o| o.gang) {
                Some(g) => !live.contains(g) && deleted.insert(g),
                None => true,
            }
        }
        for (node, w) in desired {
            keep.insert(w.id.as_str());
            let o = seen.get(&w.id);
            let exists = o.is_some_and(|o| o.pod.is_some() || o.job.is_some());
            if w.gang.is_some() && w.run {
                // Created by `ensure_gang`; only the deadline channel below applies.
            } else if w.run && !exists {
                if !mem.teams.contains(&w.workspace) {
                    continue; // its namespace is not there yet; next round
                }
                match self.create_workload(w, node).await {
                    Ok(()) => round.created += 1,
                    Err(e) => tracing::warn!(run = w.id, "creating the workload: {e:#}"),
                }
            } else if !w.run && exists {
                if may_delete(o, &live_gangs, &mut deleted_gangs) {
                    round.deleted += self.delete_run(o).await;
                }
                continue;
            }
            if let Some(pod) = o.and_then(|o| o.pod)
                && w.run
            {
                // The deadline channel: a deadline set, moved or withdrawn since the pod
                // was made reaches it as its annotation (and so its deadline file).
                let want = deadline_annotation(w);
                let has = pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DEADLINE_ANNOTATION));
                if want.as_ref() != has
                    && let Err(e) = self.annotate_deadline(pod, want.as_deref()).await
                {
                    tracing::warn!(run = w.id, "telling the pod its deadline: {e:#}");
                }
            }
        }
        for (run, o) in seen {
            if !keep.contains(run.as_str()) && may_delete(Some(o), &live_gangs, &mut deleted_gangs)
            {
                round.deleted += self.delete_run(Some(o)).await;
                mem.acked.remove(run);
            }
        }
        mem.gangs.retain(|g| live_gangs.contains(g.as_str()));
        Ok(round)
    }

    /// Creates gang `gang`'s Indexed Job once every member should run and knows its peers
    /// (the server sends the peers only when the whole gang is placed), then its headless
    /// Service and NetworkPolicy, owned by the Job. Answers how many Jobs it created.
    async fn ensure_gang(
        &self,
        mem: &mut Memory,
        gang: &str,
        members: &[(&NodeIdentity, &WorkloadSpec)],
        seen: &HashMap<String, Observed<'_>>,
    ) -> anyhow::Result<u32> {
        if mem.gangs.contains(gang) {
            return Ok(0);
        }
        let Some((_, rank0)) = members
            .iter()
            .find(|(_, w)| w.gang.as_ref().is_some_and(|g| g.rank == 0))
        else {
            return Ok(0);
        };
        let size = rank0.gang.as_ref().map_or(0, |g| g.size);
        let mut ranked: Vec<Option<&(&NodeIdentity, &WorkloadSpec)>> =
            vec![None; usize::try_from(size).unwrap_or(0)];
        for m in members {
            if let Some(g) = &m.1.gang
                && let Some(slot) = ranked.get_mut(usize::try_from(g.rank).unwrap_or(usize::MAX))
            {
                *slot = Some(m);
            }
        }
        let ready = ranked.iter().all(|m| {
            m.is_some_and(|(_, w)| w.run && w.gang.as_ref().is_some_and(|g| g.peers.is_some()))
        });
        if !ready || !mem.teams.contains(&rank0.workspace) {
            return Ok(0);
        }
        let ns = namespace_name(&self.s, &rank0.workspace);
        let api = Api::<Job>::namespaced(self.client.clone(), &ns);
        let name = gang_name(gang);
        let mut created = 0;
        let job = match seen.get(&rank0.id).and_then(|o| o.job) {
            Some(j) => j.clone(),
            None => {
                if let Some(image) = &rank0.image
                    && let Some(login) = &image.login
                {
                    let registry = image_registry(image).map_err(|e| anyhow::anyhow!("{e}"))?;
                    self.apply_pull_secret(&rank0.workspace, &registry, login)
                        .await?;
                }
                let ids: Vec<(String, String)> = ranked
                    .iter()
                    .flatten()
                    .map(|(n, _)| (n.id().to_string(), n.hostname().to_owned()))
                    .collect();
                let list: Vec<GangMember<'_>> = ranked
                    .iter()
                    .flatten()
                    .zip(&ids)
                    .map(|((_, w), (node, hostname))| GangMember {
                        run: &w.id,
                        node,
                        hostname,
                    })
                    .collect();
                let want = gang_job(&self.s, rank0, &list);
                match api.create(&PostParams::default(), &want).await {
                    Ok(j) => {
                        created = 1;
                        j
                    }
                    // Made by a round this executor forgot (a restart): the next round
                    // lists it and makes its Service and policy.
                    Err(kube::Error::Api(e)) if e.code == 409 => return Ok(0),
                    Err(e) => {
                        return Err(anyhow::Error::new(e).context(format!("creating Job {name}")));
                    }
                }
            }
        };
        let team = &rank0.workspace;
        create(
            &Api::<Service>::namespaced(self.client.clone(), &ns),
            &gang_service(&self.s, &job, team, gang),
        )
        .await?;
        create(
            &Api::<NetworkPolicy>::namespaced(self.client.clone(), &ns),
            &gang_policy(&self.s, &job, team, gang),
        )
        .await?;
        mem.gangs.insert(gang.to_owned());
        Ok(created)
    }

    async fn ensure_team(
        &self,
        mem: &mut Memory,
        team: &str,
        gpus: &BTreeMap<String, i64>,
    ) -> anyhow::Result<()> {
        let s = &self.s;
        let ns = namespace_name(s, team);
        if !mem.teams.contains(team) {
            create(
                &Api::<Namespace>::all(self.client.clone()),
                &namespace(s, team),
            )
            .await?;
            let nps: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), &ns);
            create(&nps, &deny_all(s, team)).await?;
            create(&nps, &allow_proxy(s, team)).await?;
            create(
                &Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &ns),
                &workspace_claim(s, team),
            )
            .await?;
        }
        if mem.quotas.get(team) != Some(gpus) || !mem.teams.contains(team) {
            let api: Api<ResourceQuota> = Api::namespaced(self.client.clone(), &ns);
            let mut q = resource_quota(s, team, gpus);
            match api.get_opt(QUOTA_NAME).await? {
                None => create(&api, &q).await?,
                Some(old) => {
                    let old_hard = old.spec.and_then(|sp| sp.hard).unwrap_or_default();
                    if let Some(hard) = q.spec.as_mut().and_then(|sp| sp.hard.as_mut()) {
                        // A resource the team no longer holds stays capped, at zero.
                        for k in old_hard.keys() {
                            hard.entry(k.clone()).or_insert_with(|| {
                                k8s_openapi::apimachinery::pkg::api::resource::Quantity("0".into())
                            });
                        }
                        if *hard != old_hard {
                            q.metadata.resource_version = old.metadata.resource_version;
                            api.replace(QUOTA_NAME, &PostParams::default(), &q).await?;
                        }
                    }
                }
            }
            mem.quotas.insert(team.to_owned(), gpus.clone());
        }
        mem.teams.insert(team.to_owned());
        Ok(())
    }

    async fn create_workload(&self, w: &WorkloadSpec, node: &NodeIdentity) -> anyhow::Result<()> {
        let ns = namespace_name(&self.s, &w.workspace);
        let node_id = node.id().to_string();
        if let Some(image) = &w.image {
            let registry = image_registry(image).map_err(|e| anyhow::anyhow!("{e}"))?;
            if let Some(login) = &image.login {
                self.apply_pull_secret(&w.workspace, &registry, login)
                    .await?;
            }
        }
        match w.kind {
            WorkloadKind::Notebook => {
                let pod = notebook_pod(&self.s, w, &node_id, node.hostname());
                create(&Api::<Pod>::namespaced(self.client.clone(), &ns), &pod).await
            }
            WorkloadKind::Job => {
                let job = job(&self.s, w, &node_id, node.hostname());
                create(&Api::<Job>::namespaced(self.client.clone(), &ns), &job).await
            }
        }
    }

    /// Writes the team's pull secret for `registry` (server-side apply: created, or
    /// brought up to date when the login changed, in one request). The login is in no
    /// error this returns: the API server's answer is scrubbed of it before it is told.
    async fn apply_pull_secret(
        &self,
        team: &str,
        registry: &str,
        login: &RegistryLogin,
    ) -> anyhow::Result<()> {
        let secret = pull_secret(&self.s, team, registry, login);
        let name = pull_secret_name(team, registry);
        let ns = namespace_name(&self.s, team);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        // kube logs an unsuccessful answer's `Status` at debug level, and an admission
        // webhook may quote the request (the secret's data) in it: kube logs nothing of
        // this one request, and its error is told below, redacted.
        let answer = Api::<Secret>::namespaced(self.client.clone(), &ns)
            .patch(&name, &params, &Patch::Apply(&secret))
            .with_subscriber(tracing::subscriber::NoSubscriber::default())
            .await;
        match answer {
            Ok(_) => Ok(()),
            Err(e) => {
                let text = redact(&e.to_string(), registry, login);
                Err(anyhow::anyhow!(
                    "writing the pull secret {name} for {registry} in {ns}: {text}"
                ))
            }
        }
    }

    /// Sets a pod's deadline annotation (a JSON merge patch of its metadata only).
    async fn annotate_deadline(&self, pod: &Pod, text: Option<&str>) -> anyhow::Result<()> {
        let (Some(name), Some(ns)) = (&pod.metadata.name, &pod.metadata.namespace) else {
            return Ok(());
        };
        let patch = serde_json::json!({
            "metadata": {"annotations": {DEADLINE_ANNOTATION: text}}
        });
        Api::<Pod>::namespaced(self.client.clone(), ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Deletes a run's Job (its pods go with it) or Pod; 1 if something was deleted.
    async fn delete_run(&self, o: Option<&Observed<'_>>) -> u32 {
        let Some(o) = o else { return 0 };
        let dp = DeleteParams::background();
        let result = if let Some(j) = o.job {
            if j.metadata.deletion_timestamp.is_some() {
                return 0;
            }
            let ns = j.metadata.namespace.as_deref().unwrap_or("default");
            let name = j.metadata.name.as_deref().unwrap_or("");
            Api::<Job>::namespaced(self.client.clone(), ns)
                .delete(name, &dp)
                .await
                .map(|_| ())
        } else if let Some(p) = o.pod {
            if p.metadata.deletion_timestamp.is_some() {
                return 0;
            }
            let ns = p.metadata.namespace.as_deref().unwrap_or("default");
            let name = p.metadata.name.as_deref().unwrap_or("");
            Api::<Pod>::namespaced(self.client.clone(), ns)
                .delete(name, &dp)
                .await
                .map(|_| ())
        } else {
            return 0;
        };
        match result {
            Ok(()) => 1,
            Err(kube::Error::Api(s)) if s.code == 404 => 0,
            Err(e) => {
                tracing::warn!("deleting a workload object: {e}");
                0
            }
        }
    }
}

/// Creates `obj`; one that already exists is fine (every create here is idempotent).
async fn create<K>(api: &Api<K>, obj: &K) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(anyhow::Error::new(e).context(format!(
            "creating {} {}",
            K::kind(&()),
            obj.meta().name.as_deref().unwrap_or("?")
        ))),
    }
}

/// The field manager of the executor's server-side applies.
const FIELD_MANAGER: &str = "tessera";

/// `text` with a login's password, and every encoding of it a pull secret carries (the
/// `auth` field, the base64 of the whole config), replaced by `<redacted>`.
fn redact(text: &str, registry: &str, login: &RegistryLogin) -> String {
    let config = objects::base64(&docker_config_json(registry, login));
    let auth = docker_auth(login);
    let mut out = text.to_owned();
    for s in [config.as_str(), auth.as_str(), login.password.as_str()] {
        if !s.is_empty() {
            out = out.replace(s, "<redacted>");
        }
    }
    out
}

/// Each run's objects: its Job, and its (newest) pod. A gang's Job stands for every
/// member (its annotations list them and their nodes, by rank); its pod of index `r` is
/// member `r`'s.
fn observe<'a>(pods: &'a [Pod], jobs: &'a [Job]) -> HashMap<String, Observed<'a>> {
    let mut seen: HashMap<String, Observed<'a>> = HashMap::new();
    let mut gangs: HashMap<&'a str, Vec<&'a str>> = HashMap::new();
    for j in jobs {
        if let Some(gang) = label(&j.metadata.labels, LABEL_GANG) {
            let note = |key: &str| -> Vec<&'a str> {
                j.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(key))
                    .map(|v| v.split(',').collect())
                    .unwrap_or_default()
            };
            let (runs, nodes) = (note(GANG_MEMBERS_ANNOTATION), note(GANG_NODES_ANNOTATION));
            for (i, run) in runs.iter().enumerate() {
                let o = seen.entry((*run).to_owned()).or_default();
                o.job = Some(j);
                o.node = nodes.get(i).copied();
                o.gang = Some(gang);
            }
            gangs.insert(gang, runs);
        } else if let Some(run) = label(&j.metadata.labels, LABEL_RUN) {
            let o = seen.entry(run.to_owned()).or_default();
            o.job = Some(j);
            o.node = label(&j.metadata.labels, LABEL_NODE);
        }
    }
    for p in pods {
        let run = match label(&p.metadata.labels, LABEL_GANG) {
            Some(gang) => {
                let index = label(&p.metadata.annotations, COMPLETION_INDEX)
                    .and_then(|i| i.parse::<usize>().ok());
                match (gangs.get(gang), index) {
                    (Some(runs), Some(i)) => runs.get(i).copied(),
                    _ => None, // its Job is gone: the pod goes with it
                }
            }
            None => label(&p.metadata.labels, LABEL_RUN),
        };
        if let Some(run) = run {
            let o = seen.entry(run.to_owned()).or_default();
            // A job's newest pod speaks for it.
            if o.pod.is_none_or(|q| created(q) < created(p)) {
                o.pod = Some(p);
            }
            if o.node.is_none() {
                o.node = label(&p.metadata.labels, LABEL_NODE);
            }
        }
    }
    seen
}

fn label<'a>(labels: &'a Option<BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
    labels.as_ref()?.get(key).map(String::as_str)
}

fn created(p: &Pod) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
    p.metadata.creation_timestamp.as_ref()
}

/// Why a job failed without a pod to say so (e.g. its deadline passed).
fn job_failure(j: &Job) -> Option<String> {
    j.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Failed" && c.status == "True")
        .map(|c| {
            c.message
                .clone()
                .or(c.reason.clone())
                .unwrap_or_else(|| "the job failed".into())
        })
}

/// The executor's loop: a round every `interval`, for as long as the server runs.
pub async fn run(services: Arc<Services>, system: SystemActor, executor: Arc<KubeExecutor>) {
    let every = executor.s.interval;
    loop {
        match executor.round(&services, &system).await {
            Ok(r) if r.created + r.deleted > 0 => {
                tracing::info!(
                    created = r.created,
                    deleted = r.deleted,
                    "kubernetes executor round"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("kubernetes executor round failed: {e:#}"),
        }
        tokio::time::sleep(every).await;
    }
}
