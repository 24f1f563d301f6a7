//! Tessera's pure core: values in, values out.
//!
//! No I/O, no clock (time is a parameter), no randomness without a seed; builds for
//! `wasm32-unknown-unknown` so the UI can share these types with the server.
#![deny(clippy::unwrap_used)]

pub mod account;
pub mod alloc;
pub mod audit;
pub mod billing;
pub mod cluster;
pub mod error;
pub mod ids;
pub mod mig;
pub mod planner;
pub mod sso;
pub mod tenancy;
pub mod wire;
pub mod workload;
