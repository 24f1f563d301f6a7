//! OCI images over the distribution API, pull side (issue 36):
//!
//! - [`client`]: the registry client (manifests, an index narrowed to this node's
//!   platform, blobs; bearer-token and basic auth; [`client::Credentials`] never printed).
//! - [`unpack`]: applying a layer to an image root without anything landing outside it.
//! - [`config`]: what an image's config says about running it.
//!
//! The agent's image store (`tessera_agent::oci`) pulls and unpacks with it; the server
//! resolves catalog entries to digests with it. Why our own client and not the
//! `oci-client` crate or `skopeo` + `umoci`: see ARCHITECTURE.md ("OCI images").

pub mod client;
pub mod config;
pub mod resolve;
pub mod unpack;

pub use client::{Credentials, PullError};
pub use config::ImageConfig;
pub use resolve::{Resolved, resolve};
#[cfg(feature = "testkit")]
pub mod testkit;
