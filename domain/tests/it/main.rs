//! Integration tests of tessera-domain's planner and MIG catalog.

mod docs_example;
mod planner_props;
