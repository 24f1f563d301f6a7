//! Integration tests for the agent: simulator conformance, reconcile,
//! crash points, spool and the agent loop against a fake server.

mod agent_loop;
mod crash;
mod reconcile;
mod sim;
mod spool;
mod support;
