//! The plan: where each request goes, which GPUs change, and why the rest
//! wait.

use serde::{Deserialize, Serialize};

use super::input::GpuMode;
use crate::mig::Instance;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub assignments: Vec<Assignment>,
    pub reconfigurations: Vec<Reconfiguration>,
    pub pending: Vec<Pending>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub request: String,
    pub node: String,
    /// The (first) GPU; absent for CPU-only requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// All GPUs of a multi-GPU request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<u8>,
    /// Milli-GPU of a time-sliced share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub milli: Option<u32>,
    /// A gang's members in rank order (`node`/`gpu`/`gpus` above repeat member 0's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<GangMember>,
}

/// One member of a placed gang: its node and what it holds there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangMember {
    pub node: String,
    /// Whole GPUs (indexes on the node).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// MIG instances.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<MemberSlice>,
}

/// One MIG instance of a gang member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberSlice {
    pub gpu: u32,
    pub profile: String,
    pub start: u8,
}

/// Changes to one GPU. Busy instances never appear in `destroy`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconfiguration {
    pub node: String,
    pub gpu: u32,
    /// The GPU's mode after the change.
    pub mode: GpuMode,
    /// The mode before, when it changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_mode: Option<GpuMode>,
    pub destroy: Vec<Instance>,
    pub create: Vec<Instance>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub request: String,
    pub reason: String,
}
