//! OCI images for workloads (issue 36): the per-node content-addressed store
//! ([`store`]: single-flight pulls, progress, pins, LRU collection) on top of the
//! registry client and safe unpacking of `tessera-registry`.

pub mod store;

pub use store::{Image, ImageStore, StoreLimits};
pub use tessera_registry::{Credentials, ImageConfig, PullError, client, unpack};
