//! `tessera-agent`: the node agent. It reports a node's GPUs to the Tessera
//! server, applies the MIG layout the server wants, ships telemetry, and runs
//! the server's workloads (notebooks, training jobs) as local processes.
//!
//! - [`backend`]: the [`backend::GpuBackend`] trait, the only view of a GPU
//!   driver; [`nvml`] (real GPUs) and [`sim`] (simulated GPUs) implement it.
//! - [`reconcile`]: observe → diff → act → report, per GPU, with back-off.
//! - [`telemetry`] and [`spool`]: sampling and the on-disk queue of samples
//!   the server has not acknowledged.
//! - [`link`]: the [`link::ServerLink`] trait and its HTTP client.
//! - [`workloads`]: the local process executor for notebooks and training jobs;
//!   [`notebook_env`]: the Python environment notebooks' `jupyter` comes from.
//! - [`oci`]: images for workloads (the node's image store); [`driver_files`]: the
//!   NVIDIA driver's user-space files mounted into image workloads.
//! - [`sandbox`]: the workload sandbox (a crun container per workload) and
//!   [`seccomp`]: its syscall filter, [`network`]: its network namespace and policy.
//! - [`mps`]: shared GPUs: the MPS control daemon per GPU (real and simulated), its
//!   supervision, and what the heartbeat reports of every shared GPU.
//! - [`gang_rsh`]: `tessera-rsh`, a gang job's remote agent (Open MPI's `ssh`).
//! - [`xid`]: critical Xid events per GPU, counted by [`nvml`]'s event thread for health.
//! - [`run`]: the process loop tying these together.

pub mod backend;
pub mod driver_files;
pub mod exec;
pub mod gang_rsh;
pub mod link;
pub mod mps;
pub mod network;
pub mod notebook_env;
pub mod nvml;
pub mod oci;
pub mod reconcile;
pub mod run;
pub mod sandbox;
pub mod seccomp;
pub mod sim;
pub mod spool;
pub mod telemetry;
pub mod workloads;
pub mod xid;
