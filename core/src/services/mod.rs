//! Use cases: the one place where business rules and authorization live.
//!
//! Every function that acts for a user takes the caller's [`Principal`] first and authorizes
//! (through the capabilities in [`authz`]) before it touches data. HTTP handlers and server
//! functions only translate.
//!
//! [`Principal`]: tessera_domain::account::Principal

pub mod accounts;
pub mod allocations;
pub mod authz;
pub mod billing;
pub mod nodes;
pub mod tenancy;
pub mod tokens;
pub mod workloads;

use tessera_domain::error::AppError;

/// Logs an infrastructure error and hides it behind [`AppError::Internal`].
pub(crate) fn internal(context: &'static str) -> impl FnOnce(sqlx::Error) -> AppError {
    move |e| {
        tracing::error!(error = %e, "{context}");
        AppError::Internal
    }
}
