//! Integration tests for the agent: simulator conformance, reconcile,
//! crash points, spool, the agent loop against a fake server, the workload
//! executor with real processes, and shared GPUs (MPS daemons, time-slicing).
// A test: a step that fails should fail it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_loop;
mod crash;
mod gang;
mod images;
mod reconcile;
mod sandbox;
mod shares;
mod sim;
mod spool;
mod support;
mod workloads;
