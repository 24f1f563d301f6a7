//! The planner's input: the cluster as observed and the pending requests,
//! in the JSON shape of `tessera plan` (docs/planner.md).

use serde::{Deserialize, Serialize};

use crate::image::CudaVersion;
use crate::mig::GpuModel;
pub use crate::wire::DriverInfo;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    pub nodes: Vec<Node>,
    /// Profile tables read from devices; they take precedence over the
    /// built-in catalog for GPUs of the same model name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<GpuModel>,
    /// GPUs are shared only where the input says so (`mode: shared`, chosen by an
    /// admin): the planner never switches a GPU to shared mode itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fixed_sharing: bool,
    /// The requests that came lately and how often each kind came: the mix
    /// the fractional policy keeps room for (FGD's target workload). Empty:
    /// the mix of the pending requests themselves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub demand: Vec<Demand>,
}

/// A kind of request and how many of it came lately (`weight`). Only
/// `gpus` and `gpu_milli` requests shape the policy; others are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Demand {
    pub request: Request,
    pub weight: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// CPU already taken by running work (default 0).
    #[serde(default)]
    pub cpu_used_milli: u64,
    /// Memory already taken by running work (default 0).
    #[serde(default)]
    pub memory_used_mib: u64,
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    /// The NVIDIA driver the node reports; absent: unknown, so a request with
    /// `needs_cuda` never goes there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<DriverInfo>,
    /// A placement group (rack, switch) an admin gave the node: a gang stays inside one
    /// group when one can hold it. Absent: no group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl Node {
    /// A node whose CPU and memory never limit a placement (the server schedules GPUs
    /// only), holding `gpus`.
    pub fn gpus_only(name: impl Into<String>, gpus: Vec<Gpu>) -> Node {
        Node {
            name: name.into(),
            cpu_milli: 1 << 40,
            memory_mib: 1 << 40,
            cpu_used_milli: 0,
            memory_used_mib: 0,
            gpus,
            driver: None,
            group: None,
        }
    }
}

/// How a GPU is offered: partitioned with MIG, handed out whole, or
/// time-sliced in milli-GPU shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuMode {
    Mig,
    Whole,
    Shared,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    pub index: u32,
    pub model: String,
    pub mode: GpuMode,
    /// Whether the planner may create or destroy instances or change the
    /// mode of this GPU now (default false: only existing capacity is used).
    #[serde(default)]
    pub reconfigurable: bool,
    /// `mig` mode: the current GPU instances.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<MigInstance>,
    /// `whole` mode: whether the GPU is in use.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub busy: bool,
    /// `shared` mode: milli-GPU already handed out (0..=1000).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub used_milli: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigInstance {
    pub profile: String,
    pub start: u8,
    #[serde(default)]
    pub busy: bool,
}

/// A pending request. At most one of `mig`, `gpus` and `gpu_milli`; none of
/// them asks for CPU and memory only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    #[serde(default)]
    pub priority: i32,
    /// A MIG profile name, e.g. `1g.10gb`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<String>,
    /// Whole GPUs, all on one node and of one model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// A time-sliced share of one GPU, 1..=1000 milli-GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_milli: Option<u32>,
    #[serde(default)]
    pub cpu_milli: u64,
    #[serde(default)]
    pub memory_mib: u64,
    /// Allowed GPU models; empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// The CUDA version the node's driver must support (`"12.4"`): nodes whose
    /// driver is older, or that report none, are not chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs_cuda: Option<CudaVersion>,
    /// A gang: `nodes` members, each on its own node, each taking the request's ask
    /// (`gpus`, or `per_node` instances of `mig`) and its `cpu_milli`/`memory_mib`;
    /// placed all-or-nothing (docs/planner.md, "Gangs").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<Gang>,
}

/// How a gang request spreads over nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gang {
    /// Members, each on a distinct node (at least 1).
    pub nodes: u32,
    /// For a `mig` ask: instances each member takes, all on its node (default 1). Must be
    /// 1 for `gpus` asks, whose member size is `gpus`.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub per_node: u32,
}

fn one() -> u32 {
    1
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

/// A semantic error in the input, located by a JSON path such as
/// `nodes[0].gpus[1].instances[0]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct InputError {
    pub path: String,
    pub message: String,
}

impl InputError {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        InputError {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// What a request asks for, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ask {
    Cpu,
    Mig(String),
    Whole(u32),
    Share(u32),
}

impl Request {
    /// A request named `id` for no team, at priority 0, asking for nothing yet (no GPU,
    /// CPU or memory) on any model: set `mig`, `gpus` or `gpu_milli`.
    pub fn new(id: impl Into<String>) -> Request {
        Request {
            id: id.into(),
            team: None,
            priority: 0,
            mig: None,
            gpus: None,
            gpu_milli: None,
            cpu_milli: 0,
            memory_mib: 0,
            models: Vec::new(),
            needs_cuda: None,
            gang: None,
        }
    }

    pub(crate) fn ask(&self, position: usize) -> Result<Ask, InputError> {
        let path = |field: &str| format!("[{position}].{field}");
        let given = [
            self.mig.is_some(),
            self.gpus.is_some(),
            self.gpu_milli.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if given > 1 {
            return Err(InputError::new(
                format!("[{position}]"),
                "give at most one of mig, gpus and gpu_milli",
            ));
        }
        if self.id.is_empty() {
            return Err(InputError::new(path("id"), "must not be empty"));
        }
        Ok(match (&self.mig, self.gpus, self.gpu_milli) {
            (Some(p), _, _) => Ask::Mig(p.clone()),
            (_, Some(0), _) => return Err(InputError::new(path("gpus"), "must be at least 1")),
            (_, Some(n), _) => Ask::Whole(n),
            (_, _, Some(m)) if m == 0 || m > 1000 => {
                return Err(InputError::new(path("gpu_milli"), "must be 1..=1000"));
            }
            (_, _, Some(m)) => Ask::Share(m),
            _ => Ask::Cpu,
        })
    }
}
