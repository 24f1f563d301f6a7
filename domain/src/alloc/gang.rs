//! Gang requests (issue 42, step 1): `nodes` × `gpus_per_node` of one kind, every member
//! on its own node, placed all-or-nothing by the planner ([`crate::planner::Gang`]).
//!
//! Only the request, its validation and its quota units live here; nothing stores,
//! admits or launches a gang yet (the wiring into core, the REST API and the agents is a
//! later step of issue 42).

use super::*;
use crate::planner;
use crate::workload::EnvVar;

/// The most nodes one gang may span.
pub const GANG_NODES_MAX: u32 = 64;

/// How many processes a gang's launcher starts: one per node (`torchrun`, `mpirun`
/// launchers) or one per GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ranks {
    #[default]
    PerNode,
    PerGpu,
}

impl Ranks {
    pub fn as_str(self) -> &'static str {
        match self {
            Ranks::PerNode => "per_node",
            Ranks::PerGpu => "per_gpu",
        }
    }

    /// `per_node` or `per_gpu`; anything else is a 422 naming `ranks`.
    pub fn parse(s: &str) -> Result<Self, AppError> {
        match s.trim() {
            "per_node" | "per-node" => Ok(Ranks::PerNode),
            "per_gpu" | "per-gpu" => Ok(Ranks::PerGpu),
            other => Err(AppError::invalid(
                "ranks",
                format!(
                    "`{other}` is not `per_node` (one process per node) or `per_gpu` (one per GPU)"
                ),
            )),
        }
    }
}

/// The command line of a member whose gang runs one process per GPU (`ranks: per_gpu`):
/// a POSIX shell starts `command` once per device of the member, each with its own
/// `LOCAL_RANK` (0..G), `RANK` (node rank × G + local rank), `WORLD_SIZE` (nodes × G),
/// `LOCAL_WORLD_SIZE` (G), the same for JAX (`JAX_PROCESS_ID`, `JAX_NUM_PROCESSES`), and
/// `CUDA_VISIBLE_DEVICES` narrowed to its one device. One process failing stops the
/// others and the member exits with its code; a stop of the member stops them all.
/// G, the node rank and the nodes come from the launch environment ([`launch_env`]).
pub fn per_gpu_argv(command: &str) -> Vec<String> {
    vec![
        "/bin/sh".into(),
        "-c".into(),
        PER_GPU_SCRIPT.into(),
        "tessera-ranks".into(),
        command.into(),
    ]
}

/// The per-GPU launcher. Stopping the ranks: when it leads its process group (as a
/// container's first process does: crun and runc make it a session leader), SIGTERM to
/// the whole group, which reaches every process the ranks started, even one forked at
/// that moment. Otherwise each rank and what it started, found through /proc (each
/// process's `PPid`: no `ps`, `pkill` or `setsid` needed in the image), children first;
/// a process forked while that walk runs can escape it.
const PER_GPU_SCRIPT: &str = r#"n=${TESSERA_GANG_GPUS_PER_NODE:-1}; nodes=${TESSERA_GANG_SIZE:-1}; node=${NODE_RANK:-0}
devs=${CUDA_VISIBLE_DEVICES:-}; rcfile=$(mktemp); pids=; i=0
tree() {
  for s in /proc/[0-9]*/status; do
    while read -r k v; do
      if [ "$k" = "PPid:" ]; then
        if [ "$v" = "$1" ]; then c=${s#/proc/}; tree "${c%/status}"; fi
        break
      fi
    done 2>/dev/null < "$s"
  done
  kill -TERM "$1" 2>/dev/null
}
read -r _ _ _ _ pgrp _ < /proc/$$/stat
end() {
  trap '' TERM INT USR1
  if [ "$pgrp" = "$$" ]; then kill -TERM 0; else for p in $pids; do tree "$p"; done; fi
  wait; rm -f "$rcfile"; exit "$1"
}
trap 'end 143' TERM INT
trap 'end "$(cat "$rcfile" 2>/dev/null || echo 1)"' USR1
while [ "$i" -lt "$n" ]; do
  (
    r=$((node * n + i)); export LOCAL_RANK=$i LOCAL_WORLD_SIZE=$n RANK=$r WORLD_SIZE=$((nodes * n))
    export JAX_PROCESS_ID=$r JAX_NUM_PROCESSES=$((nodes * n))
    if [ -n "$devs" ]; then export CUDA_VISIBLE_DEVICES="$(echo "$devs" | cut -d, -f$((i + 1)))"
    else export CUDA_VISIBLE_DEVICES=$i; fi
    trap - TERM INT USR1; /bin/sh -c "$1"; rc=$?
    if [ "$rc" -ne 0 ]; then [ -s "$rcfile" ] || echo "$rc" > "$rcfile"; kill -USR1 $$; fi
    exit "$rc"
  ) &
  pids="$pids $!"; i=$((i + 1))
done
for p in $pids; do wait "$p"; done
rm -f "$rcfile"; exit 0"#;

/// A gang as a user asks for it: `nodes` members, each with `gpus_per_node` of `kind`
/// (whole GPUs, or MIG instances of one profile all on the member's node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GangRequest {
    pub kind: GpuKind,
    pub nodes: u32,
    pub gpus_per_node: u32,
    #[serde(default)]
    pub ranks: Ranks,
}

impl GangRequest {
    /// Checks the request against the catalog and `most_per_node` (what
    /// [`most_per_node`] says the cluster holds on one node) and returns it with the
    /// catalog's spelling of the kind. Errors name the field: `nodes` (1..=64),
    /// `gpus_per_node` (1..=most on one node), `kind` (unknown, or a share).
    pub fn validate(&self, catalog: &Catalog, most_per_node: u32) -> Result<Self, AppError> {
        if matches!(self.kind, GpuKind::Share { .. }) {
            return Err(AppError::invalid(
                "kind",
                "a gang takes whole GPUs or MIG instances, not shares, e.g. H100-80GB:whole",
            ));
        }
        let kind = self.kind.canonical(catalog)?;
        if !(1..=GANG_NODES_MAX).contains(&self.nodes) {
            return Err(AppError::invalid(
                "nodes",
                format!("must be 1 to {GANG_NODES_MAX}"),
            ));
        }
        if self.gpus_per_node == 0 {
            return Err(AppError::invalid("gpus_per_node", "must be at least 1"));
        }
        if self.gpus_per_node > most_per_node {
            let what = match &kind {
                GpuKind::Whole { model } => format!("{model} GPUs"),
                other => other.label(),
            };
            return Err(AppError::invalid(
                "gpus_per_node",
                format!(
                    "at most {most_per_node}: no node holds more {what} (asked {})",
                    self.gpus_per_node
                ),
            ));
        }
        self.units(catalog)?;
        Ok(GangRequest {
            kind,
            nodes: self.nodes,
            gpus_per_node: self.gpus_per_node,
            ranks: self.ranks,
        })
    }

    /// Units the gang costs on its kind's quota line: nodes × gpus_per_node × the
    /// kind's unit cost (a whole H100 is 7, a `1g.10gb` 1).
    pub fn units(&self, catalog: &Catalog) -> Result<u32, AppError> {
        let count = self
            .nodes
            .checked_mul(self.gpus_per_node)
            .ok_or_else(|| AppError::invalid("gpus_per_node", "is too large"))?;
        self.kind.units(count, catalog).map_err(|e| match e {
            AppError::Invalid { field, message } if field == "count" => {
                AppError::invalid("gpus_per_node", message)
            }
            e => e,
        })
    }

    /// The planner's request for this gang, named `id` (the kind should be canonical).
    pub fn to_planner(&self, id: impl Into<String>) -> planner::Request {
        let (gpus, mig, per_node) = match &self.kind {
            GpuKind::Whole { .. } => (Some(self.gpus_per_node), None, 1),
            GpuKind::Mig { profile, .. } => (None, Some(profile.clone()), self.gpus_per_node),
            GpuKind::Share { .. } => (None, None, 1),
        };
        planner::Request {
            gpus,
            mig,
            models: vec![self.kind.model().to_owned()],
            gang: Some(planner::Gang {
                nodes: self.nodes,
                per_node,
            }),
            ..planner::Request::new(id)
        }
    }
}

/// The coordinator's port for `torch.distributed` (`MASTER_PORT`). Every member has a
/// network of its own, so fixed ports never collide between gangs.
pub const MASTER_PORT: u16 = 29500;
/// JAX's coordinator port (`JAX_COORDINATOR_ADDRESS`).
pub const JAX_PORT: u16 = 29501;
/// Where every member's remote agent (`tessera-rsh serve`) listens.
pub const RSH_PORT: u16 = 29502;

/// The launch environment of member `rank` of gang `job`, whose members (by rank) are at
/// `addrs`, each with `gpus` devices: torchrun's (`MASTER_ADDR`, `MASTER_PORT`,
/// `WORLD_SIZE`, `RANK`, `NODE_RANK`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, for one process
/// per node, and the `PET_*` defaults `torchrun` reads for `--nnodes`, `--node-rank`,
/// `--nproc-per-node` and the rendezvous), JAX's (`JAX_COORDINATOR_ADDRESS`,
/// `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`) and Tessera's (`TESSERA_GANG_*`).
pub fn launch_env(job: &str, rank: u32, addrs: &[String], gpus: u32) -> Vec<EnvVar> {
    let size = addrs.len().to_string();
    let master = addrs.first().cloned().unwrap_or_default();
    let rank = rank.to_string();
    let gpus = gpus.to_string();
    [
        ("MASTER_ADDR", master.clone()),
        ("MASTER_PORT", MASTER_PORT.to_string()),
        ("WORLD_SIZE", size.clone()),
        ("RANK", rank.clone()),
        ("NODE_RANK", rank.clone()),
        ("LOCAL_RANK", "0".into()),
        ("LOCAL_WORLD_SIZE", "1".into()),
        ("PET_NNODES", size.clone()),
        ("PET_NODE_RANK", rank.clone()),
        ("PET_NPROC_PER_NODE", gpus.clone()),
        ("PET_MASTER_ADDR", master.clone()),
        ("PET_MASTER_PORT", MASTER_PORT.to_string()),
        ("JAX_COORDINATOR_ADDRESS", format!("{master}:{JAX_PORT}")),
        ("JAX_NUM_PROCESSES", size.clone()),
        ("JAX_PROCESS_ID", rank.clone()),
        ("TESSERA_GANG_JOB", job.to_owned()),
        ("TESSERA_GANG_RANK", rank),
        ("TESSERA_GANG_SIZE", size),
        ("TESSERA_GANG_ADDRS", addrs.join(",")),
        ("TESSERA_GANG_GPUS_PER_NODE", gpus),
    ]
    .into_iter()
    .map(|(name, value)| EnvVar {
        name: name.to_owned(),
        value,
    })
    .collect()
}

/// The variables of [`launch_env`] that differ between a gang's members (all say the
/// member's rank); every other one is the same for all. An executor that starts every
/// member from one template (a Kubernetes Indexed Job) fills these from the member's
/// index.
pub const RANK_VARS: [&str; 5] = [
    "RANK",
    "NODE_RANK",
    "PET_NODE_RANK",
    "JAX_PROCESS_ID",
    "TESSERA_GANG_RANK",
];

/// Whether `addr` may be a gang member's address: an IP address, or (from the server's
/// own Kubernetes executor only: a cluster DNS name is stable before the pod exists) a
/// DNS name of lowercase labels.
pub fn gang_addr_ok(addr: &str, dns_allowed: bool) -> bool {
    if addr.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    dns_allowed
        && addr.len() <= 253
        && addr.split('.').all(|l| {
            (1..=63).contains(&l.len())
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// The most of `kind` one node of `cluster` holds: GPUs of the model for whole GPUs;
/// for a MIG profile, GPUs of the model times the instances of the profile one GPU can
/// hold. 0 when no node has the model.
pub fn most_per_node(kind: &GpuKind, cluster: &planner::Cluster, catalog: &Catalog) -> u32 {
    let model = catalog.get(kind.model());
    let name = model.map_or(kind.model(), GpuModel::name);
    let per_gpu = match (kind, model) {
        (GpuKind::Mig { profile, .. }, Some(m)) => m
            .profiles()
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(profile))
            .map_or(0, |p| {
                let by_compute = m.compute_slices() / p.compute_slices.max(1);
                u32::from(p.max_count.min(by_compute)).min(p.placements.len() as u32)
            }),
        (GpuKind::Mig { .. }, None) => 0,
        _ => 1,
    };
    cluster
        .nodes
        .iter()
        .map(|n| {
            let gpus = n
                .gpus
                .iter()
                .filter(|g| {
                    g.model == name || catalog.get(&g.model).is_some_and(|m| m.name() == name)
                })
                .count() as u32;
            gpus.saturating_mul(per_gpu)
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::planner::{Cluster, Gpu, GpuMode, Node};

    fn cluster(per_node: &[u32]) -> Cluster {
        let nodes = per_node
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let gpus = (0..n)
                    .map(|index| Gpu {
                        index,
                        model: "H100-80GB".into(),
                        mode: GpuMode::Whole,
                        reconfigurable: true,
                        instances: Vec::new(),
                        busy: false,
                        used_milli: 0,
                    })
                    .collect();
                Node::gpus_only(format!("n{i}"), gpus)
            })
            .collect();
        Cluster {
            nodes,
            ..Cluster::default()
        }
    }

    fn gang(kind: &str, nodes: u32, per: u32) -> GangRequest {
        GangRequest {
            kind: kind.parse().unwrap(),
            nodes,
            gpus_per_node: per,
            ranks: Ranks::PerNode,
        }
    }

    fn field(r: Result<GangRequest, AppError>) -> String {
        match r {
            Err(AppError::Invalid { field, .. }) => field,
            other => panic!("expected a 422, got {other:?}"),
        }
    }

    #[test]
    fn only_the_rank_variables_differ_between_members() {
        let addrs: Vec<String> = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
            .iter()
            .map(|a| (*a).to_owned())
            .collect();
        let r0 = launch_env("job", 0, &addrs, 8);
        let r2 = launch_env("job", 2, &addrs, 8);
        assert_eq!(r0.len(), r2.len());
        let mut differ: Vec<&str> = r0
            .iter()
            .zip(&r2)
            .inspect(|(a, b)| assert_eq!(a.name, b.name))
            .filter(|(a, b)| a.value != b.value)
            .map(|(a, _)| a.name.as_str())
            .collect();
        differ.sort_unstable();
        let mut want = RANK_VARS.to_vec();
        want.sort_unstable();
        assert_eq!(differ, want);
        for v in r2.iter().filter(|v| RANK_VARS.contains(&v.name.as_str())) {
            assert_eq!(v.value, "2", "{}", v.name);
        }
    }

    /// Runs the per-GPU launcher with a member's environment (node rank 1 of 2, two
    /// devices).
    fn per_gpu(command: &str) -> (Option<i32>, String, std::time::Duration) {
        per_gpu_on(command, Some("GPU-a,GPU-b"))
    }

    /// … with `devices` as `CUDA_VISIBLE_DEVICES` (`None`: unset, as in a Kubernetes pod
    /// that sees only its own GPUs).
    fn per_gpu_on(
        command: &str,
        devices: Option<&str>,
    ) -> (Option<i32>, String, std::time::Duration) {
        use std::os::unix::process::CommandExt;
        let argv = per_gpu_argv(command);
        let t = std::time::Instant::now();
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            // Its own process group, as a container's first process has.
            .process_group(0)
            .env("TESSERA_GANG_GPUS_PER_NODE", "2")
            .env("TESSERA_GANG_SIZE", "2")
            .env("NODE_RANK", "1")
            .env_remove("CUDA_VISIBLE_DEVICES");
        if let Some(d) = devices {
            cmd.env("CUDA_VISIBLE_DEVICES", d);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            t.elapsed(),
        )
    }

    #[test]
    fn per_gpu_ranks_start_a_process_per_device() {
        let (code, out, _) = per_gpu(
            "echo \"rank=$RANK local=$LOCAL_RANK/$LOCAL_WORLD_SIZE world=$WORLD_SIZE \
             jax=$JAX_PROCESS_ID/$JAX_NUM_PROCESSES dev=$CUDA_VISIBLE_DEVICES\"",
        );
        assert_eq!(code, Some(0), "{out}");
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort_unstable();
        assert_eq!(
            lines,
            [
                "rank=2 local=0/2 world=4 jax=2/4 dev=GPU-a",
                "rank=3 local=1/2 world=4 jax=3/4 dev=GPU-b",
            ]
        );
        // No list to narrow (a container that sees only its GPUs): by index.
        let (_, out, _) = per_gpu_on("echo \"$RANK:$CUDA_VISIBLE_DEVICES\"", None);
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort_unstable();
        assert_eq!(lines, ["2:0", "3:1"]);
    }

    #[test]
    fn one_per_gpu_process_failing_stops_the_others_with_its_code() {
        let (code, out, took) =
            per_gpu("if [ \"$LOCAL_RANK\" = 1 ]; then exit 7; fi; sleep 30; echo late");
        assert_eq!(code, Some(7), "{out}");
        assert!(!out.contains("late"), "{out}");
        assert!(took < std::time::Duration::from_secs(20), "{took:?}");
        let (code, _, _) = per_gpu("true");
        assert_eq!(code, Some(0));
        assert_eq!(Ranks::parse("per_gpu").unwrap(), Ranks::PerGpu);
        assert!(matches!(
            Ranks::parse("per_core"),
            Err(AppError::Invalid { field, .. }) if field == "ranks"
        ));
    }

    #[test]
    fn gang_addresses_are_ips_or_executor_dns_names() {
        assert!(gang_addr_ok("10.1.2.3", false));
        assert!(gang_addr_ok("fd00::1", false));
        assert!(!gang_addr_ok("job-a-0.job-a.ns.svc", false));
        assert!(gang_addr_ok("job-a-0.job-a.ns.svc", true));
        for bad in [
            "",
            "a..b",
            "-a.b",
            "a-.b",
            "Job.ns",
            "a b",
            "a;rm",
            &"x".repeat(64),
        ] {
            assert!(!gang_addr_ok(bad, true), "{bad}");
        }
    }

    #[test]
    fn validation_names_the_field() {
        let cat = Catalog::builtin();
        let c = cluster(&[8, 8, 4]);
        let most = |g: &GangRequest| most_per_node(&g.kind, &c, &cat);
        let ok = gang("h100-80gb:whole", 2, 8);
        let v = ok.validate(&cat, most(&ok)).unwrap();
        assert_eq!(v.kind.to_string(), "H100-80GB:whole");
        let zero = gang("H100-80GB:whole", 0, 8);
        assert_eq!(field(zero.validate(&cat, most(&zero))), "nodes");
        let many = gang("H100-80GB:whole", 65, 1);
        assert_eq!(field(many.validate(&cat, most(&many))), "nodes");
        let none = gang("H100-80GB:whole", 2, 0);
        assert_eq!(field(none.validate(&cat, most(&none))), "gpus_per_node");
        let big = gang("H100-80GB:whole", 2, 9);
        assert_eq!(most(&big), 8);
        let err = big.validate(&cat, most(&big)).unwrap_err().to_string();
        assert!(err.contains("at most 8"), "{err}");
        assert_eq!(field(big.validate(&cat, most(&big))), "gpus_per_node");
        let share = gang("H100-80GB:share:500", 2, 1);
        assert_eq!(field(share.validate(&cat, 8)), "kind");
        let unknown = gang("Z9000:whole", 2, 1);
        assert_eq!(field(unknown.validate(&cat, 8)), "kind");
        // A model the cluster lacks: no node holds any.
        let a100 = gang("A100-80GB:whole", 1, 1);
        assert_eq!(most(&a100), 0);
        assert_eq!(field(a100.validate(&cat, most(&a100))), "gpus_per_node");
        // Unknown fields are refused by serde.
        let extra: Result<GangRequest, _> = serde_json::from_str(
            r#"{"kind":"H100-80GB:whole","nodes":2,"gpus_per_node":8,"racks":1}"#,
        );
        assert!(extra.is_err());
        let parsed: GangRequest = serde_json::from_str(
            r#"{"kind":"H100-80GB:whole","nodes":2,"gpus_per_node":8,"ranks":"per_gpu"}"#,
        )
        .unwrap();
        assert_eq!(parsed.ranks, Ranks::PerGpu);
    }

    #[test]
    fn mig_gangs_count_slices_per_node() {
        let cat = Catalog::builtin();
        let c = cluster(&[2]);
        // 1g.10gb: 7 per H100, so 14 on a node of two.
        let g = gang("H100-80GB:1g.10gb", 2, 14);
        assert_eq!(most_per_node(&g.kind, &c, &cat), 14);
        assert!(g.validate(&cat, 14).is_ok());
        assert_eq!(
            field(gang("H100-80GB:1g.10gb", 2, 15).validate(&cat, 14)),
            "gpus_per_node"
        );
        // 3g.40gb: two per H100.
        let k: GpuKind = "H100-80GB:3g.40gb".parse().unwrap();
        assert_eq!(most_per_node(&k, &c, &cat), 4);
    }

    #[test]
    fn the_launch_environment_names_the_coordinator_and_the_rank() {
        let addrs = vec![
            "10.1.0.2".to_owned(),
            "10.2.0.6".to_owned(),
            "10.3.0.2".to_owned(),
        ];
        let env: std::collections::BTreeMap<String, String> = launch_env("job-1", 2, &addrs, 8)
            .into_iter()
            .map(|v| (v.name, v.value))
            .collect();
        let get = |k: &str| env.get(k).map(String::as_str).unwrap_or("<unset>");
        assert_eq!(get("MASTER_ADDR"), "10.1.0.2");
        assert_eq!(get("MASTER_PORT"), "29500");
        assert_eq!(get("WORLD_SIZE"), "3");
        assert_eq!(get("RANK"), "2");
        assert_eq!(get("NODE_RANK"), "2");
        assert_eq!(get("LOCAL_RANK"), "0");
        assert_eq!(get("LOCAL_WORLD_SIZE"), "1");
        assert_eq!(get("PET_NNODES"), "3");
        assert_eq!(get("PET_NODE_RANK"), "2");
        assert_eq!(get("PET_NPROC_PER_NODE"), "8");
        assert_eq!(get("JAX_COORDINATOR_ADDRESS"), "10.1.0.2:29501");
        assert_eq!(get("JAX_NUM_PROCESSES"), "3");
        assert_eq!(get("JAX_PROCESS_ID"), "2");
        assert_eq!(get("TESSERA_GANG_ADDRS"), "10.1.0.2,10.2.0.6,10.3.0.2");
        assert_eq!(get("TESSERA_GANG_JOB"), "job-1");
    }

    #[test]
    fn units_are_nodes_times_gpus_times_the_kind() {
        let cat = Catalog::builtin();
        assert_eq!(
            gang("H100-80GB:whole", 2, 8).units(&cat).unwrap(),
            2 * 8 * 7
        );
        assert_eq!(gang("H100-80GB:1g.10gb", 3, 2).units(&cat).unwrap(), 6);
        assert_eq!(gang("A30-24GB:whole", 4, 2).units(&cat).unwrap(), 4 * 2 * 4);
        let huge = gang("H100-80GB:whole", u32::MAX, 2);
        assert_eq!(field(Err(huge.units(&cat).unwrap_err())), "gpus_per_node");
    }

    #[test]
    fn to_planner_carries_the_gang() {
        let r = gang("H100-80GB:whole", 2, 8).to_planner("g");
        assert_eq!(r.gpus, Some(8));
        assert_eq!(
            r.gang,
            Some(planner::Gang {
                nodes: 2,
                per_node: 1
            })
        );
        let m = gang("H100-80GB:1g.10gb", 3, 2).to_planner("m");
        assert_eq!(m.mig.as_deref(), Some("1g.10gb"));
        assert_eq!(
            m.gang,
            Some(planner::Gang {
                nodes: 3,
                per_node: 2
            })
        );
    }
}
