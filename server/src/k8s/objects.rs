//! The Kubernetes objects the executor creates, built from a [`WorkloadSpec`] and the
//! settings: pure functions, so what is sent to the API server is unit-tested here and
//! checked object by object against a fake API server in `tests/it/kubernetes.rs`.

use super::KubeSettings;
use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, DownwardAPIVolumeFile,
    DownwardAPIVolumeSource, EnvVar, EnvVarSource, LocalObjectReference, Namespace, NodeAffinity,
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectFieldSelector,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod,
    PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceQuota, ResourceQuotaSpec, ResourceRequirements, SeccompProfile, Secret,
    SecurityContext, Service, ServiceSpec, TCPSocketAction, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;
use tessera_domain::error::AppError;
use tessera_domain::image::{DOCKER_HUB, ImageRef};
use tessera_domain::wire::{ImageSpec, RegistryLogin, WorkloadSpec};
use tessera_domain::workload::WorkloadKind;

/// Every object the executor makes carries this label; it lists only those.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "tessera");
pub const LABEL_WORKLOAD: &str = "tessera.io/workload";
/// The run (`<workload id>` or `<workload id>.<attempt>` for job retries).
pub const LABEL_RUN: &str = "tessera.io/run";
pub const LABEL_ALLOCATION: &str = "tessera.io/allocation";
pub const LABEL_TEAM: &str = "tessera.io/team";
pub const LABEL_NODE: &str = "tessera.io/node";
pub const LABEL_KIND: &str = "tessera.io/kind";
/// A gang's objects (its Indexed Job, pods, Service, NetworkPolicy): the gang's job id.
pub const LABEL_GANG: &str = "tessera.io/gang";
/// On a gang's Job: its members' run ids, by rank, comma-separated.
pub const GANG_MEMBERS_ANNOTATION: &str = "tessera.io/gang-members";
/// On a gang's Job: the node each member was placed on (node ids, by rank).
pub const GANG_NODES_ANNOTATION: &str = "tessera.io/gang-nodes";
/// The Job controller's annotation (and label) of an Indexed Job's pod: its index.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// The port JupyterLab listens on inside its pod.
pub const NOTEBOOK_PORT: i32 = 8888;
/// The one container of every workload pod.
pub const CONTAINER: &str = "main";
/// The team workspace volume claim, and where it is mounted.
pub const WORKSPACE_CLAIM: &str = "tessera-workspace";
pub const WORKSPACE_MOUNT: &str = "/workspace";
pub const QUOTA_NAME: &str = "tessera";
pub const DENY_POLICY: &str = "tessera-default-deny";
pub const PROXY_POLICY: &str = "tessera-allow-proxy";

/// The namespace of a team (`spec.workspace` is the team id).
pub fn namespace_name(s: &KubeSettings, team: &str) -> String {
    format!("{}{team}", s.namespace_prefix)
}

/// The Pod (notebook) or Job (training run) name of a run: `nb-<id>` / `job-<id>[-<attempt>]`.
pub fn object_name(spec: &WorkloadSpec) -> String {
    let run = spec.id.replace('.', "-");
    match spec.kind {
        WorkloadKind::Notebook => format!("nb-{run}"),
        WorkloadKind::Job => format!("job-{run}"),
    }
}

fn meta(name: &str, namespace: Option<&str>, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        labels: Some(labels),
        ..ObjectMeta::default()
    }
}

fn team_labels(team: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
        (LABEL_TEAM.to_owned(), team.to_owned()),
    ])
}

/// Labels of a workload's Pod or Job (and, through the Job's template, of its pods).
pub fn workload_labels(spec: &WorkloadSpec, team: &str, node: &str) -> BTreeMap<String, String> {
    let mut l = team_labels(team);
    let workload = spec.id.split('.').next().unwrap_or(&spec.id);
    l.insert(LABEL_WORKLOAD.to_owned(), workload.to_owned());
    l.insert(LABEL_RUN.to_owned(), spec.id.clone());
    l.insert(LABEL_ALLOCATION.to_owned(), spec.allocation_id.clone());
    l.insert(LABEL_NODE.to_owned(), node.to_owned());
    l.insert(LABEL_KIND.to_owned(), spec.kind.as_str().to_owned());
    l
}

/// The uid and gid workload containers run as (the Jupyter Docker Stacks' `jovyan`:
/// uid 1000, group `users` 100), whatever the image says.
/// The annotation that carries a workload's deadline (the deadline file's text,
/// docs/operations.md); the pod sees it as the file [`DEADLINE_FILE`] through a downward
/// API volume, which the kubelet refreshes when the annotation changes.
pub const DEADLINE_ANNOTATION: &str = "tessera.io/deadline";
/// Where the deadline file is inside the pod (the local executor's path too).
pub const DEADLINE_FILE: &str = tessera_domain::drain::DEADLINE_FILE;
/// How long a stopped pod has between SIGTERM and SIGKILL (`terminationGracePeriodSeconds`).
pub const STOP_GRACE_SECONDS: i64 = 30;

/// The deadline annotation a workload's pod should carry (`None`: none).
pub fn deadline_annotation(spec: &WorkloadSpec) -> Option<String> {
    spec.deadline.as_ref().map(|d| d.file_text())
}

pub const WORKLOAD_UID: i64 = 1000;
pub const WORKLOAD_GID: i64 = 100;

/// The team's namespace, enforcing the Pod Security `restricted` standard: the API server
/// itself refuses any pod in it that could run as root, escalate, keep capabilities or
/// leave the default seccomp profile.
pub fn namespace(s: &KubeSettings, team: &str) -> Namespace {
    let mut labels = team_labels(team);
    for mode in ["enforce", "audit", "warn"] {
        labels.insert(
            format!("pod-security.kubernetes.io/{mode}"),
            "restricted".into(),
        );
        labels.insert(
            format!("pod-security.kubernetes.io/{mode}-version"),
            "latest".into(),
        );
    }
    Namespace {
        metadata: meta(&namespace_name(s, team), None, labels),
        ..Namespace::default()
    }
}

/// What the `restricted` Pod Security standard asks of a container.
fn restricted_container() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        }),
        ..SecurityContext::default()
    }
}

/// Deny all traffic in and out of the team's pods by default …
pub fn deny_all(s: &KubeSettings, team: &str) -> NetworkPolicy {
    let ns = namespace_name(s, team);
    NetworkPolicy {
        metadata: meta(DENY_POLICY, Some(&ns), team_labels(team)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector::default()),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ..NetworkPolicySpec::default()
        }),
    }
}

/// … except the server's pods (its notebook proxy) reaching notebooks on their port.
pub fn allow_proxy(s: &KubeSettings, team: &str) -> NetworkPolicy {
    let ns = namespace_name(s, team);
    NetworkPolicy {
        metadata: meta(PROXY_POLICY, Some(&ns), team_labels(team)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    LABEL_KIND.to_owned(),
                    WorkloadKind::Notebook.as_str().to_owned(),
                )])),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    namespace_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([(
                            "kubernetes.io/metadata.name".to_owned(),
                            s.server_namespace.clone(),
                        )])),
                        ..LabelSelector::default()
                    }),
                    pod_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([(
                            "app.kubernetes.io/name".to_owned(),
                            "tessera-server".to_owned(),
                        )])),
                        ..LabelSelector::default()
                    }),
                    ..NetworkPolicyPeer::default()
                }]),
                ports: Some(vec![NetworkPolicyPort {
                    port: Some(IntOrString::Int(NOTEBOOK_PORT)),
                    protocol: Some("TCP".into()),
                    ..NetworkPolicyPort::default()
                }]),
            }]),
            ..NetworkPolicySpec::default()
        }),
    }
}

/// The team workspace: one ReadWriteMany volume mounted into every workload of the team.
pub fn workspace_claim(s: &KubeSettings, team: &str) -> PersistentVolumeClaim {
    let ns = namespace_name(s, team);
    PersistentVolumeClaim {
        metadata: meta(WORKSPACE_CLAIM, Some(&ns), team_labels(team)),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteMany".into()]),
            storage_class_name: s.storage_class.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(s.workspace_size.clone()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

/// What the team's namespace may hold: `max_pods` pods, and of each GPU resource exactly
/// what its running workloads were allotted (`gpus`, resource → count), so a pod made in
/// the namespace behind Tessera's back cannot take more. `nvidia.com/gpu` and
/// `nvidia.com/gpu.shared` are always capped.
pub fn resource_quota(s: &KubeSettings, team: &str, gpus: &BTreeMap<String, i64>) -> ResourceQuota {
    let ns = namespace_name(s, team);
    let mut hard = BTreeMap::from([
        ("count/pods".to_owned(), Quantity(s.max_pods.to_string())),
        ("requests.nvidia.com/gpu".to_owned(), Quantity("0".into())),
        (
            format!("requests.{}", tessera_domain::workload::SHARED_GPU_RESOURCE),
            Quantity("0".into()),
        ),
    ]);
    for (resource, n) in gpus {
        hard.insert(format!("requests.{resource}"), Quantity(n.to_string()));
    }
    ResourceQuota {
        metadata: meta(QUOTA_NAME, Some(&ns), team_labels(team)),
        spec: Some(ResourceQuotaSpec {
            hard: Some(hard),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    }
}

/// A team's registry login as the kubelet reads it: a `kubernetes.io/dockerconfigjson`
/// Secret in the team's namespace, named per team and registry, that the pods of the
/// team's workloads in that registry's images name in `imagePullSecrets`.
pub const PULL_SECRET_PREFIX: &str = "tessera-pull-";
pub const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
/// Docker Hub's key in a docker config's `auths` (what `docker login` writes).
pub const DOCKER_HUB_AUTH_KEY: &str = "https://index.docker.io/v1/";
/// The registry a pull secret is for (an annotation: `host:port` is no label value).
pub const REGISTRY_ANNOTATION: &str = "tessera.io/registry";

/// The registry an image spec's reference names (`docker.io` for Docker Hub); a reference
/// that does not parse is an `image` error (the server sends only pinned, parsed ones).
pub fn image_registry(image: &ImageSpec) -> Result<String, AppError> {
    let r = ImageRef::parse(&image.reference)?;
    if !r.is_pinned() {
        return Err(AppError::invalid(
            "image",
            "the Kubernetes executor runs only images pinned by digest",
        ));
    }
    Ok(r.registry().to_owned())
}

/// Where a docker config keeps `registry`'s login: the host (and port), or Docker Hub's
/// historical key.
pub fn docker_config_key(registry: &str) -> &str {
    if registry == DOCKER_HUB {
        DOCKER_HUB_AUTH_KEY
    } else {
        registry
    }
}

/// The pull secret's name for `team` and `registry`: `tessera-pull-` and 12 hex digits of
/// a SHA-256 of both, so the same pair always gives the same name and no two teams share
/// one, even in a shared namespace.
pub fn pull_secret_name(team: &str, registry: &str) -> String {
    let d = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{team}\n{registry}").as_bytes(),
    );
    let hex: String = d.as_ref()[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{PULL_SECRET_PREFIX}{hex}")
}

/// The name of the pull secret a spec's pod names, when its image comes with a login.
pub fn pull_secret_of(spec: &WorkloadSpec) -> Option<String> {
    let image = spec.image.as_ref()?;
    image.login.as_ref()?;
    let registry = image_registry(image).ok()?;
    Some(pull_secret_name(&spec.workspace, &registry))
}

/// `{"auths":{"<key>":{"username":…,"password":…,"auth":base64(user:pass)}}}`.
pub fn docker_config_json(registry: &str, login: &RegistryLogin) -> Vec<u8> {
    let auth = docker_auth(login);
    let config = serde_json::json!({"auths": {docker_config_key(registry): {
        "username": login.username,
        "password": login.password,
        "auth": auth,
    }}});
    config.to_string().into_bytes()
}

/// A docker config's `auth`: base64 of `username:password`.
pub fn docker_auth(login: &RegistryLogin) -> String {
    base64(format!("{}:{}", login.username, login.password).as_bytes())
}

/// The pull secret of `team`'s login to `registry`. Its `Debug` prints the data: never
/// log it.
pub fn pull_secret(s: &KubeSettings, team: &str, registry: &str, login: &RegistryLogin) -> Secret {
    let ns = namespace_name(s, team);
    Secret {
        metadata: ObjectMeta {
            annotations: Some(BTreeMap::from([(
                REGISTRY_ANNOTATION.to_owned(),
                registry.to_owned(),
            )])),
            ..meta(
                &pull_secret_name(team, registry),
                Some(&ns),
                team_labels(team),
            )
        },
        type_: Some(DOCKER_CONFIG_JSON_TYPE.into()),
        data: Some(BTreeMap::from([(
            DOCKER_CONFIG_JSON_KEY.to_owned(),
            ByteString(docker_config_json(registry, login)),
        )])),
        ..Secret::default()
    }
}

/// Standard base64 with padding (RFC 4648 §4), as docker's `auth` field holds it.
pub(super) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let byte = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let n = (byte(0) << 16) | (byte(1) << 8) | byte(2);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The GPU resources a spec asks for, resource → count.
pub fn gpu_requests(spec: &WorkloadSpec) -> BTreeMap<String, Quantity> {
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    for r in &spec.resources {
        *counts.entry(r.clone()).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(r, n)| (r, Quantity(n.to_string())))
        .collect()
}

/// The command line inside the pod: `{port}` becomes [`NOTEBOOK_PORT`], `{host}` the
/// pod's every address, and a notebook
/// listens on the pod's address (the proxy reaches it there), not on loopback.
fn command(spec: &WorkloadSpec) -> Vec<String> {
    spec.argv
        .iter()
        .map(|a| {
            let a = a
                .replace("{port}", &NOTEBOOK_PORT.to_string())
                .replace("{host}", "0.0.0.0");
            if spec.kind == WorkloadKind::Notebook && a.starts_with("--ServerApp.ip=") {
                "--ServerApp.ip=0.0.0.0".to_owned()
            } else {
                a
            }
        })
        .collect()
}

fn env(spec: &WorkloadSpec) -> Vec<EnvVar> {
    let var = |name: &str, value: &str| EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        ..EnvVar::default()
    };
    let mut out: Vec<EnvVar> = spec.env.iter().map(|e| var(&e.name, &e.value)).collect();
    out.push(var("TESSERA_WORKSPACE", WORKSPACE_MOUNT));
    out.push(var(tessera_domain::drain::DEADLINE_FILE_VAR, DEADLINE_FILE));
    out.push(var("TESSERA_WORKLOAD_ID", &spec.id));
    if let Some(t) = &spec.token {
        out.push(var("JUPYTER_TOKEN", t));
    }
    // A share: what it was given (the device plugin's replica is what limits it).
    if let Some(share) = &spec.share {
        out.push(var("TESSERA_GPU_SHARE_METHOD", share.method.as_str()));
        out.push(var("TESSERA_GPU_SHARE_MILLI", &share.milli.to_string()));
        out.push(var("TESSERA_GPU_MEMORY_MIB", &share.memory_mib.to_string()));
    }
    out
}

fn pod_spec(s: &KubeSettings, spec: &WorkloadSpec, hostname: &str) -> PodSpec {
    let gpus = gpu_requests(spec);
    let workdir = if spec.workdir.is_empty() {
        WORKSPACE_MOUNT.to_owned()
    } else {
        format!("{WORKSPACE_MOUNT}/{}", spec.workdir)
    };
    let notebook = spec.kind == WorkloadKind::Notebook;
    let deadline_dir = DEADLINE_FILE
        .rsplit_once('/')
        .map_or("/run/tessera", |(d, _)| d);
    PodSpec {
        restart_policy: Some("Never".into()),
        termination_grace_period_seconds: Some(STOP_GRACE_SECONDS),
        // The allocation's node: the planner chose it and its agent set up the slice.
        node_selector: Some(BTreeMap::from([(
            "kubernetes.io/hostname".to_owned(),
            hostname.to_owned(),
        )])),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(WORKLOAD_UID),
            run_as_group: Some(WORKLOAD_GID),
            fs_group: Some(WORKLOAD_GID),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        // An image of the workload's own, by digest: pulled once per node. Its login, if
        // any, is the team's pull secret in the same namespace (a pod can name no other).
        image_pull_secrets: pull_secret_of(spec).map(|name| vec![LocalObjectReference { name }]),
        containers: vec![Container {
            security_context: Some(restricted_container()),
            name: CONTAINER.into(),
            image: Some(
                spec.image
                    .as_ref()
                    .map_or_else(|| s.image.clone(), |i| i.reference.clone()),
            ),
            image_pull_policy: spec.image.as_ref().map(|_| "IfNotPresent".into()),
            // The server-wide image runs the command as is; a workload's own image keeps
            // its entrypoint and the command replaces its `Cmd` (the node agent runs
            // images the same way: Entrypoint + command, or Cmd when there is none).
            command: spec.image.is_none().then(|| command(spec)),
            args: spec
                .image
                .as_ref()
                .filter(|_| !spec.argv.is_empty())
                .map(|_| command(spec)),
            env: Some(env(spec)),
            working_dir: Some(workdir),
            ports: notebook.then(|| {
                vec![ContainerPort {
                    container_port: NOTEBOOK_PORT,
                    name: Some("http".into()),
                    ..ContainerPort::default()
                }]
            }),
            readiness_probe: notebook.then(|| Probe {
                tcp_socket: Some(TCPSocketAction {
                    port: IntOrString::Int(NOTEBOOK_PORT),
                    ..TCPSocketAction::default()
                }),
                period_seconds: Some(2),
                ..Probe::default()
            }),
            // Extended resources: requests equal limits, so giving limits is enough.
            resources: Some(ResourceRequirements {
                limits: Some(gpus),
                ..ResourceRequirements::default()
            }),
            volume_mounts: Some(vec![
                VolumeMount {
                    name: "workspace".into(),
                    mount_path: WORKSPACE_MOUNT.into(),
                    ..VolumeMount::default()
                },
                VolumeMount {
                    name: "deadline".into(),
                    mount_path: deadline_dir.into(),
                    read_only: Some(true),
                    ..VolumeMount::default()
                },
            ]),
            ..Container::default()
        }],
        volumes: Some(vec![
            Volume {
                name: "workspace".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: WORKSPACE_CLAIM.into(),
                    ..PersistentVolumeClaimVolumeSource::default()
                }),
                ..Volume::default()
            },
            // The deadline channel: the annotation as a file (empty while there is none).
            Volume {
                name: "deadline".into(),
                downward_api: Some(DownwardAPIVolumeSource {
                    items: Some(vec![DownwardAPIVolumeFile {
                        path: "deadline".into(),
                        field_ref: Some(ObjectFieldSelector {
                            field_path: format!("metadata.annotations['{DEADLINE_ANNOTATION}']"),
                            ..ObjectFieldSelector::default()
                        }),
                        ..DownwardAPIVolumeFile::default()
                    }]),
                    ..DownwardAPIVolumeSource::default()
                }),
                ..Volume::default()
            },
        ]),
        ..PodSpec::default()
    }
}

fn annotations(spec: &WorkloadSpec) -> Option<BTreeMap<String, String>> {
    deadline_annotation(spec).map(|t| BTreeMap::from([(DEADLINE_ANNOTATION.to_owned(), t)]))
}

/// A notebook: a bare Pod (never restarted: a stop is a stop).
pub fn notebook_pod(s: &KubeSettings, spec: &WorkloadSpec, node: &str, hostname: &str) -> Pod {
    let ns = namespace_name(s, &spec.workspace);
    Pod {
        metadata: ObjectMeta {
            annotations: annotations(spec),
            ..meta(
                &object_name(spec),
                Some(&ns),
                workload_labels(spec, &spec.workspace, node),
            )
        },
        spec: Some(pod_spec(s, spec, hostname)),
        ..Pod::default()
    }
}

/// A training run: a Job with one pod and no retries of its own (Tessera's retries are new
/// runs, so each attempt's exit code is seen).
pub fn job(s: &KubeSettings, spec: &WorkloadSpec, node: &str, hostname: &str) -> Job {
    let ns = namespace_name(s, &spec.workspace);
    let labels = workload_labels(spec, &spec.workspace, node);
    Job {
        metadata: meta(&object_name(spec), Some(&ns), labels.clone()),
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            completions: Some(1),
            parallelism: Some(1),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: annotations(spec),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec(s, spec, hostname)),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    }
}

/// A gang attempt's key, the value of its objects' [`LABEL_GANG`]: the job's id, and after
/// a retry its attempt as run ids carry it (`<job>.<attempt>`, from a member's run id). A
/// retried gang's objects never share a name with the last attempt's, which may still be
/// going away.
pub fn gang_key(gang_job: &str, member_run: &str) -> String {
    match member_run.split_once('.') {
        Some((_, attempt)) => format!("{gang_job}.{attempt}"),
        None => gang_job.to_owned(),
    }
}

/// The name of a gang's Indexed Job, headless Service and NetworkPolicy (`key`:
/// [`gang_key`]).
pub fn gang_name(key: &str) -> String {
    format!("gang-{}", key.replace('.', "-"))
}

/// Member `rank`'s address: its pod's DNS name (the pod's hostname `<job>-<index>`
/// under the headless Service of the same name), known before the pod exists.
pub fn gang_member_addr(s: &KubeSettings, team: &str, key: &str, rank: u32) -> String {
    let name = gang_name(key);
    format!("{name}-{rank}.{name}.{}.svc", namespace_name(s, team))
}

/// One member of a gang as the executor creates it: its run id, node id and hostname.
pub struct GangMember<'a> {
    pub run: &'a str,
    pub node: &'a str,
    pub hostname: &'a str,
}

fn gang_selector(gang_job: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(
            LABEL_GANG.to_owned(),
            gang_job.to_owned(),
        )])),
        ..LabelSelector::default()
    }
}

/// A gang job: one Indexed Job (`completions` = `parallelism` = the members, no retries
/// of its own: one pod failing fails the Job), built from rank 0's spec. Every pod runs
/// on one of the members' nodes and no two on the same node; a pod's rank is its
/// completion index, which the rank variables ([`tessera_domain::alloc::RANK_VARS`])
/// read through the downward API. Its pods are `<job>-<index>` under the headless
/// Service [`gang_service`], the addresses [`gang_member_addr`] told the members.
pub fn gang_job(s: &KubeSettings, rank0: &WorkloadSpec, members: &[GangMember<'_>]) -> Job {
    let key = rank0
        .gang
        .as_ref()
        .map_or_else(|| rank0.id.clone(), |g| gang_key(&g.job, &rank0.id));
    let gang = key.as_str();
    let name = gang_name(gang);
    let ns = namespace_name(s, &rank0.workspace);
    let node0 = members.first().map_or("", |m| m.node);
    let mut labels = workload_labels(rank0, &rank0.workspace, node0);
    labels.insert(LABEL_GANG.to_owned(), gang.to_owned());
    let size = i32::try_from(members.len()).unwrap_or(i32::MAX);
    let mut pod = pod_spec(s, rank0, members.first().map_or("", |m| m.hostname));
    pod.node_selector = None;
    pod.subdomain = Some(name.clone());
    pod.affinity = Some(Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: "kubernetes.io/hostname".into(),
                        operator: "In".into(),
                        values: Some(members.iter().map(|m| m.hostname.to_owned()).collect()),
                    }]),
                    ..NodeSelectorTerm::default()
                }],
            }),
            ..NodeAffinity::default()
        }),
        pod_anti_affinity: Some(PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                label_selector: Some(gang_selector(gang)),
                topology_key: "kubernetes.io/hostname".into(),
                ..PodAffinityTerm::default()
            }]),
            ..PodAntiAffinity::default()
        }),
        ..Affinity::default()
    });
    for c in &mut pod.containers {
        for v in c.env.iter_mut().flatten() {
            if tessera_domain::alloc::RANK_VARS.contains(&v.name.as_str()) {
                v.value = None;
                v.value_from = Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: format!("metadata.annotations['{COMPLETION_INDEX}']"),
                        ..ObjectFieldSelector::default()
                    }),
                    ..EnvVarSource::default()
                });
            }
        }
    }
    let members_note = members.iter().map(|m| m.run).collect::<Vec<_>>().join(",");
    let nodes_note = members.iter().map(|m| m.node).collect::<Vec<_>>().join(",");
    Job {
        metadata: ObjectMeta {
            annotations: Some(BTreeMap::from([
                (GANG_MEMBERS_ANNOTATION.to_owned(), members_note),
                (GANG_NODES_ANNOTATION.to_owned(), nodes_note),
            ])),
            ..meta(&name, Some(&ns), labels.clone())
        },
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".into()),
            completions: Some(size),
            parallelism: Some(size),
            backoff_limit: Some(0),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: annotations(rank0),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    }
}

/// What a gang's Service and NetworkPolicy carry: the gang's labels, owned by its Job
/// (the garbage collector deletes them with it).
fn gang_fixture_meta(s: &KubeSettings, job: &Job, team: &str, gang: &str) -> ObjectMeta {
    let mut labels = team_labels(team);
    labels.insert(LABEL_GANG.to_owned(), gang.to_owned());
    ObjectMeta {
        owner_references: Some(vec![OwnerReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: job.metadata.name.clone().unwrap_or_default(),
            uid: job.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..meta(&gang_name(gang), Some(&namespace_name(s, team)), labels)
    }
}

/// The headless Service that gives a gang's pods their DNS names (published before they
/// are ready: the rendezvous happens while they start).
pub fn gang_service(s: &KubeSettings, job: &Job, team: &str, gang: &str) -> Service {
    Service {
        metadata: gang_fixture_meta(s, job, team, gang),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: gang_selector(gang).match_labels,
            publish_not_ready_addresses: Some(true),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// A hole in the namespace's default deny for one gang: its pods reach each other (any
/// port) and the cluster DNS (to resolve each other's names); nothing else changes.
pub fn gang_policy(s: &KubeSettings, job: &Job, team: &str, gang: &str) -> NetworkPolicy {
    let peers = || NetworkPolicyPeer {
        pod_selector: Some(gang_selector(gang)),
        ..NetworkPolicyPeer::default()
    };
    let dns = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "kubernetes.io/metadata.name".to_owned(),
                "kube-system".to_owned(),
            )])),
            ..LabelSelector::default()
        }),
        pod_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "k8s-app".to_owned(),
                "kube-dns".to_owned(),
            )])),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    };
    let port53 = |protocol: &str| NetworkPolicyPort {
        port: Some(IntOrString::Int(53)),
        protocol: Some(protocol.into()),
        ..NetworkPolicyPort::default()
    };
    NetworkPolicy {
        metadata: gang_fixture_meta(s, job, team, gang),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(gang_selector(gang)),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![peers()]),
                ports: None,
            }]),
            egress: Some(vec![
                NetworkPolicyEgressRule {
                    to: Some(vec![peers()]),
                    ports: None,
                },
                NetworkPolicyEgressRule {
                    to: Some(vec![dns]),
                    ports: Some(vec![port53("UDP"), port53("TCP")]),
                },
            ]),
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser;

    fn settings() -> KubeSettings {
        #[derive(Parser)]
        struct P {
            #[command(flatten)]
            k: KubeSettings,
        }
        P::parse_from(["t"]).k
    }

    fn spec(kind: WorkloadKind, resources: &[&str]) -> WorkloadSpec {
        WorkloadSpec {
            id: "0190a5c4-0000-7000-8000-000000000001.2".into(),
            kind,
            run: true,
            argv: vec![
                "jupyter".into(),
                "lab".into(),
                "--ServerApp.ip=127.0.0.1".into(),
                "--ServerApp.port={port}".into(),
            ],
            env: vec![],
            devices: vec![],
            workspace: "team-1".into(),
            workdir: "runs/a".into(),
            token: Some("secret".into()),
            base_path: Some("/user/ann/nb/".into()),
            allocation_id: "alloc-1".into(),
            resources: resources.iter().map(|r| (*r).to_owned()).collect(),
            share: None,
            deadline: None,
            image: None,
            gang: None,
        }
    }

    #[test]
    fn a_retried_gang_gets_names_of_its_own() {
        let s = settings();
        assert_eq!(gang_key("j1", "m1"), "j1");
        assert_eq!(gang_key("j1", "m1.2"), "j1.2");
        assert_eq!(gang_name("j1"), "gang-j1");
        assert_eq!(gang_name("j1.2"), "gang-j1-2");
        assert_eq!(
            gang_member_addr(&s, "t", "j1.2", 1),
            "gang-j1-2-1.gang-j1-2.tessera-team-t.svc"
        );
    }

    #[test]
    fn a_notebook_listens_on_the_pod_address_and_asks_for_its_slices() {
        let s = settings();
        let p = notebook_pod(
            &s,
            &spec(
                WorkloadKind::Notebook,
                &["nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.10gb"],
            ),
            "node-1",
            "gpu-a",
        );
        assert_eq!(p.metadata.namespace.as_deref(), Some("tessera-team-team-1"));
        assert_eq!(
            p.metadata.name.as_deref(),
            Some("nb-0190a5c4-0000-7000-8000-000000000001-2")
        );
        let c = &p.spec.as_ref().unwrap().containers[0];
        let cmd = c.command.as_ref().unwrap();
        assert!(
            cmd.contains(&"--ServerApp.ip=0.0.0.0".to_owned()),
            "{cmd:?}"
        );
        assert!(cmd.contains(&"--ServerApp.port=8888".to_owned()), "{cmd:?}");
        let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits.len(), 1);
        assert_eq!(limits["nvidia.com/mig-1g.10gb"], Quantity("2".into()));
        assert_eq!(c.working_dir.as_deref(), Some("/workspace/runs/a"));
        let labels = p.metadata.labels.unwrap();
        assert_eq!(
            labels[LABEL_WORKLOAD],
            "0190a5c4-0000-7000-8000-000000000001"
        );
        assert_eq!(labels[LABEL_RUN], "0190a5c4-0000-7000-8000-000000000001.2");
    }

    #[test]
    fn a_job_never_retries_by_itself_and_a_whole_gpu_is_nvidia_gpu() {
        let s = settings();
        let mut sp = spec(WorkloadKind::Job, &["nvidia.com/gpu"]);
        sp.argv = vec!["/bin/sh".into(), "-c".into(), "--ServerApp.ip=x".into()];
        let j = job(&s, &sp, "node-1", "gpu-a");
        let js = j.spec.unwrap();
        assert_eq!(js.backoff_limit, Some(0));
        let pod = js.template.spec.unwrap();
        let c = &pod.containers[0];
        // Only notebooks are rewritten.
        assert_eq!(c.command.as_ref().unwrap()[2], "--ServerApp.ip=x");
        assert!(c.ports.is_none() && c.readiness_probe.is_none());
        assert_eq!(
            c.resources.as_ref().unwrap().limits.as_ref().unwrap()["nvidia.com/gpu"],
            Quantity("1".into())
        );
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    }

    #[test]
    fn the_quota_caps_whole_gpus_even_when_none_is_allotted() {
        let s = settings();
        let q = resource_quota(
            &s,
            "t",
            &BTreeMap::from([("nvidia.com/mig-3g.40gb".to_owned(), 2)]),
        );
        let hard = q.spec.unwrap().hard.unwrap();
        assert_eq!(hard["requests.nvidia.com/gpu"], Quantity("0".into()));
        assert_eq!(
            hard["requests.nvidia.com/mig-3g.40gb"],
            Quantity("2".into())
        );
        assert_eq!(hard["count/pods"], Quantity("50".into()));
    }

    #[test]
    fn base64_is_rfc_4648() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain}");
        }
        // Every byte value, against Kubernetes' own codec (what the kubelet decodes with).
        let all: Vec<u8> = (0..=255).collect();
        let theirs = serde_json::to_value(ByteString(all.clone())).unwrap();
        assert_eq!(theirs, serde_json::Value::String(base64(&all)));
    }

    #[test]
    fn an_image_of_its_own_is_pulled_by_digest_with_the_teams_secret() {
        let s = settings();
        let digest = format!("sha256:{}", "a".repeat(64));
        let mut sp = spec(WorkloadKind::Notebook, &[]);
        sp.image = Some(ImageSpec {
            reference: format!("ghcr.io/lab/nb@{digest}"),
            requires_cuda: None,
            login: Some(RegistryLogin {
                username: "u".into(),
                password: "p".into(),
            }),
        });
        let pod = notebook_pod(&s, &sp, "node-1", "gpu-a").spec.unwrap();
        let c = &pod.containers[0];
        assert_eq!(
            c.image.as_deref(),
            Some(format!("ghcr.io/lab/nb@{digest}").as_str())
        );
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert!(c.command.is_none());
        assert!(
            c.args
                .as_ref()
                .unwrap()
                .contains(&"--ServerApp.ip=0.0.0.0".to_owned())
        );
        let name = pull_secret_name("team-1", "ghcr.io");
        assert_eq!(
            pod.image_pull_secrets.unwrap(),
            vec![LocalObjectReference { name: name.clone() }]
        );
        // One name per team and registry.
        assert_eq!(name, pull_secret_name("team-1", "ghcr.io"));
        assert_ne!(name, pull_secret_name("team-2", "ghcr.io"));
        assert_ne!(name, pull_secret_name("team-1", "quay.io"));
        // No argv: the image's own Cmd.
        sp.argv.clear();
        let pod = notebook_pod(&s, &sp, "node-1", "gpu-a").spec.unwrap();
        assert!(pod.containers[0].args.is_none() && pod.containers[0].command.is_none());
        // No login: no secret named.
        sp.image.as_mut().unwrap().login = None;
        let pod = notebook_pod(&s, &sp, "node-1", "gpu-a").spec.unwrap();
        assert!(pod.image_pull_secrets.is_none());
    }

    #[test]
    fn docker_hub_logins_go_under_dockers_own_key() {
        assert_eq!(
            docker_config_key("docker.io"),
            "https://index.docker.io/v1/"
        );
        assert_eq!(docker_config_key("r.example:5000"), "r.example:5000");
        let image = ImageSpec {
            reference: format!("ubuntu@sha256:{}", "b".repeat(64)),
            requires_cuda: None,
            login: None,
        };
        assert_eq!(image_registry(&image).unwrap(), "docker.io");
        let tagged = ImageSpec {
            reference: "ubuntu:24.04".into(),
            ..image
        };
        assert_eq!(image_registry(&tagged).unwrap_err().field(), Some("image"));
    }
}
