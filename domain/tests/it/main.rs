//! Integration tests of tessera-domain's planner, MIG catalog and allocation rules.

mod alloc_props;
mod docs_example;
mod hardware;
mod planner_props;
