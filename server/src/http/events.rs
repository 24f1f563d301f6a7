//! `GET /events`: the UI's live updates, one Server-Sent Events stream per browser tab.
//!
//! A task per replica ([`watch`]) takes a [`Snapshot`] of what could be on someone's
//! screen every second; each stream turns it into the [`Mark`] of what its viewer may
//! read (their teams' allocations and workloads, or every team's for a platform admin, and
//! the cluster: nodes, layouts, used capacity) and sends `event: change` with the parts that moved (`work`,
//! `nodes`) when it differs from the last one sent. Pages then reload their data through
//! the same authorized calls as always, so a stream never carries anything but "look
//! again". Every 30 s a stream checks its caller again (a revoked token, a disabled user
//! or an ended session end it) and reloads which teams they may read. When the replica
//! shuts down, the watcher stops and every stream ends; browsers reconnect to another.

use super::auth::Caller;
use super::error::ApiError;
use crate::AppState;
use axum::extract::{FromRequestParts, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use http::request::Parts;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tessera_core::Services;
use tessera_core::services::changes::{Mark, Snapshot, Viewer};
use tokio::sync::watch;

/// How often the watcher looks for changes (and so the latency of an update).
pub const EVERY: Duration = Duration::from_secs(1);
/// How often a stream checks that its caller may still follow it.
const RECHECK: Duration = Duration::from_secs(30);

/// Takes snapshots while any stream is open, until the replica drains.
pub async fn watch(
    services: Arc<Services>,
    tx: watch::Sender<Arc<Snapshot>>,
    draining: Arc<AtomicBool>,
) {
    while !draining.load(Ordering::SeqCst) {
        if tx.receiver_count() > 1 {
            match services.changes.snapshot().await {
                Ok(now) => {
                    tx.send_if_modified(|cur| {
                        let changed = **cur != now;
                        if changed {
                            *cur = Arc::new(now);
                        }
                        changed
                    });
                }
                Err(e) => tracing::warn!("live updates: {e}"),
            }
        }
        tokio::time::sleep(EVERY).await;
    }
}

pub async fn events(
    State(s): State<AppState>,
    mut parts: Parts,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let Caller(p) = Caller::from_request_parts(&mut parts, &s).await?;
    let viewer = s.services.changes.viewer(&p).await?;
    let mut rx = s.changes.clone();
    let last = viewer.mark(&rx.borrow_and_update());
    let follower = Follower {
        state: s,
        parts,
        viewer,
        rx,
        last,
        recheck_at: tokio::time::Instant::now() + RECHECK,
    };
    Ok(Sse::new(futures_util::stream::unfold(follower, next)).keep_alive(KeepAlive::default()))
}

struct Follower {
    state: AppState,
    /// The request's headers and session, to check the caller again.
    parts: Parts,
    viewer: Viewer,
    rx: watch::Receiver<Arc<Snapshot>>,
    last: Mark,
    recheck_at: tokio::time::Instant,
}

async fn next(mut s: Follower) -> Option<(Result<Event, Infallible>, Follower)> {
    loop {
        tokio::select! {
            changed = s.rx.changed() => {
                changed.ok()?;
                let now = s.viewer.mark(&s.rx.borrow_and_update());
                if now != s.last {
                    let parts: Vec<&str> = [("work", now.work != s.last.work), ("nodes", now.nodes != s.last.nodes)]
                        .into_iter()
                        .filter_map(|(name, moved)| moved.then_some(name))
                        .collect();
                    s.last = now;
                    return Some((Ok(Event::default().event("change").data(parts.join(","))), s));
                }
            }
            () = tokio::time::sleep_until(s.recheck_at) => {
                s.recheck_at += RECHECK;
                let Caller(p) = Caller::from_request_parts(&mut s.parts, &s.state).await.ok()?;
                s.viewer = s.state.services.changes.viewer(&p).await.ok()?;
            }
        }
    }
}
