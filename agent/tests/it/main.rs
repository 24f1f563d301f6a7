//! Integration tests for the agent: simulator conformance, reconcile,
//! crash points, spool, the agent loop against a fake server, and the
//! workload executor with real processes.

mod agent_loop;
mod crash;
mod reconcile;
mod sandbox;
mod sim;
mod spool;
mod support;
mod workloads;
