//! OCI images for workloads (issue 36): pull over the distribution API, verify, unpack
//! safely into a per-node content-addressed store.
//!
//! - [`client`]: the registry client (manifests, an index narrowed to this node's
//!   platform, blobs; bearer-token and basic auth; [`client::Credentials`] never printed).
//! - [`unpack`]: applying a layer to an image root without anything landing outside it.
//! - [`store`]: the store (single-flight pulls, progress, pins, LRU collection).
//!
//! Why our own client and not the `oci-client` crate or `skopeo` + `umoci`: see
//! ARCHITECTURE.md ("OCI images").

pub mod client;
pub mod store;
pub mod unpack;

pub use client::{Credentials, PullError};
pub use store::{Image, ImageConfig, ImageStore, StoreLimits};
