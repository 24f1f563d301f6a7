//! Use cases: the one place where business rules and authorization live.
//!
//! Every function that acts for a user takes the caller's [`Principal`] first and authorizes
//! (through the capabilities in [`authz`]) before it touches data. HTTP handlers and server
//! functions only translate.
//!
//! [`Principal`]: crate::auth::Principal

pub mod accounts;
pub mod allocations;
mod audit;
pub mod authz;
pub mod billing;
pub mod changes;
pub mod images;
pub mod nodes;
pub mod notifications;
pub mod tenancy;
pub mod tokens;
pub mod workloads;

use tessera_domain::error::AppError;

/// Logs an infrastructure error and hides it behind [`AppError::Internal`].
pub(crate) fn internal(context: &'static str) -> impl FnOnce(crate::store::StoreError) -> AppError {
    move |e| {
        tracing::error!(error = %e, "{context}");
        AppError::Internal
    }
}

/// A store read of one object as a use case answers it: missing is [`AppError::NotFound`],
/// and a failure is logged with `context` and becomes [`AppError::Internal`].
pub(crate) fn found<T>(
    context: &'static str,
    read: Result<Option<T>, crate::store::StoreError>,
) -> Result<T, AppError> {
    read.map_err(internal(context))?.ok_or(AppError::NotFound)
}

/// Registered, unrevoked nodes with their parsed inventories, for the passes that look at
/// every node each time (the scheduler, capacity checks). An inventory's text is read from
/// the database only when its `inventory_version` moved since this process last parsed it:
/// reading every node's tens of kilobytes on every pass was what a pass cost with 1,000
/// nodes (docs/benchmarks.md §10). Versions only grow, and a copy is kept under the version
/// it was read at, so a cached inventory is never older than the version the pass saw.
pub(crate) async fn active_nodes_with_inventories(
    store: &crate::store::Store,
) -> Result<
    (
        Vec<crate::store::NodeRow>,
        std::collections::HashMap<
            tessera_domain::ids::NodeId,
            std::sync::Arc<tessera_domain::wire::Inventory>,
        >,
    ),
    AppError,
> {
    use std::collections::HashMap;
    use std::sync::{Arc, LazyLock, Mutex};
    type Parsed = HashMap<tessera_domain::ids::NodeId, (i64, Arc<tessera_domain::wire::Inventory>)>;
    static PARSED: LazyLock<Mutex<Parsed>> = LazyLock::new(Mutex::default);
    let nodes = store
        .active_nodes_lean()
        .await
        .map_err(internal("loading nodes"))?;
    let mut out = HashMap::with_capacity(nodes.len());
    let mut stale = Vec::new();
    {
        let cache = PARSED.lock().map_err(|_| AppError::Internal)?;
        for n in &nodes {
            match cache.get(&n.id) {
                Some((v, inv)) if *v >= n.inventory_version => {
                    out.insert(n.id, inv.clone());
                }
                _ => stale.push(n.id),
            }
        }
    }
    if !stale.is_empty() {
        let read = store
            .node_inventories(&stale)
            .await
            .map_err(internal("loading inventories"))?;
        let mut cache = PARSED.lock().map_err(|_| AppError::Internal)?;
        if cache.len() > 2 * nodes.len() + 1_000 {
            // Nodes come and go (revoked ones are never asked for again).
            cache.retain(|id, _| out.contains_key(id));
        }
        for (id, version, text) in read {
            let inv = Arc::new(serde_json::from_str(&text).unwrap_or_else(|e| {
                tracing::error!(node = %id, error = %e, "stored inventory is not valid JSON");
                tessera_domain::wire::Inventory::default()
            }));
            cache.insert(id, (version, inv.clone()));
            out.insert(id, inv);
        }
    }
    Ok((nodes, out))
}

/// A node's stored inventory, parsed, where its text was read anyway (one node's page,
/// the metrics scrape; the passes over every node use [`active_nodes_with_inventories`]).
/// Inventories are tens of kilobytes of JSON each, rewritten on each heartbeat but rarely
/// changed: parsing them again each time was most of the server's CPU under load
/// (docs/benchmarks.md §10). Parsed values are kept per node with the text
/// they came from and reused while the text is the same, so a cached value is always what
/// parsing would give.
pub(crate) fn parsed_inventory(
    node: tessera_domain::ids::NodeId,
    json: &str,
) -> std::sync::Arc<tessera_domain::wire::Inventory> {
    use std::collections::HashMap;
    use std::sync::{Arc, LazyLock, Mutex};
    type Parsed =
        HashMap<tessera_domain::ids::NodeId, (String, Arc<tessera_domain::wire::Inventory>)>;
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
