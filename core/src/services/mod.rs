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
pub mod changes;
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

/// A node's stored inventory, parsed. Every scheduler pass, cluster summary and capacity
/// check reads every node's inventory (tens of kilobytes of JSON each, rewritten on each
/// heartbeat but rarely changed): parsing it again each time was most of the server's CPU
/// under load (docs/benchmarks.md §10). Parsed values are kept per node with the text
/// they came from and reused while the text is the same, so a cached value is always what
/// parsing would give.
pub(crate) fn parsed_inventory(
    node: uuid::Uuid,
    json: &str,
) -> std::sync::Arc<tessera_domain::wire::Inventory> {
    use std::collections::HashMap;
    use std::sync::{Arc, LazyLock, Mutex};
    type Parsed = HashMap<uuid::Uuid, (String, Arc<tessera_domain::wire::Inventory>)>;
    /// More nodes than any cluster has: beyond it the cache starts over.
    const MAX_NODES: usize = 50_000;
    static PARSED: LazyLock<Mutex<Parsed>> = LazyLock::new(Mutex::default);
    if let Ok(cache) = PARSED.lock()
        && let Some((text, inv)) = cache.get(&node)
        && text == json
    {
        return inv.clone();
    }
    let inv = Arc::new(serde_json::from_str(json).unwrap_or_else(|e| {
        tracing::error!(%node, error = %e, "stored inventory is not valid JSON");
        tessera_domain::wire::Inventory::default()
    }));
    if let Ok(mut cache) = PARSED.lock() {
        if cache.len() >= MAX_NODES {
            cache.clear();
        }
        cache.insert(node, (json.to_owned(), inv.clone()));
    }
    inv
}
