//! Integration tests of tessera-domain's planner, MIG catalog and allocation rules.
// A test: a step that fails should fail it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod alloc_props;
mod docs_example;
mod hardware;
mod planner_props;
