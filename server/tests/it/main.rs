//! Integration tests: the real router on port 0 against a fresh database, on SQLite and
//! (when `TESSERA_TEST_PG_URL` is set, as `cargo xtask test` does) PostgreSQL.
// A test: a step that fails should fail it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod accounts;
mod agent_bin;
mod aiosmtpd;
mod allocations;
mod at_rest;
mod authz;
mod billing;
mod bookings;
mod cli;
mod cuda_placement;
mod deadline;
mod deploy;
mod drain;
mod events;
mod exec;
mod gangs;
mod hops;
mod images;
mod kube_fake;
mod kube_gangs;
mod kube_images;
mod kubernetes;
mod monitoring;
mod multihost;
mod nodes;
mod notifications;
mod platform;
mod queue;
mod replicas;
mod rolling;
mod rules;
mod setup;
mod shares;
mod spares;
mod sso;
mod support;
mod tenancy;
mod tls;
mod upgrade;
mod workloads;
mod ws_connect;
