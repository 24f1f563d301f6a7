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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tessera_core::Services;
use tessera_core::services::changes::{Mark, Snapshot, Viewer};
use tokio::sync::watch;

/// How often the watcher looks for changes (and so the latency of an update).
pub const EVERY: Duration = Duration::from_secs(1);
/// How often a stream checks that its caller may still follow it.
const RECHECK: Duration = Duration::from_secs(30);

/// Streams open in this process.
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// Takes snapshots while any stream is open, until the replica drains. While none is, the
/// last snapshot is dropped (quietly): the next stream's baseline is a fresh one, not one
/// from before a quiet spell, which would announce a change nobody made since.
pub async fn watch(
    services: Arc<Services>,
    tx: watch::Sender<Arc<Snapshot>>,
    draining: Arc<AtomicBool>,
) {
    while !draining.load(Ordering::SeqCst) {
        if OPEN.load(Ordering::SeqCst) == 0 {
            tx.send_if_modified(|cur| {
                if cur.is_taken() {
                    *cur = Arc::default();
                }
                false
            });
        } else {
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
    // Until the replica's first snapshot there is nothing to compare with: the first one
    // becomes the baseline instead of an event.
    let last = {
        let now = rx.borrow_and_update();
        now.is_taken().then(|| viewer.mark(&now))
    };
    OPEN.fetch_add(1, Ordering::SeqCst);
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
    /// What the viewer was last told (None: no snapshot yet).
    last: Option<Mark>,
    recheck_at: tokio::time::Instant,
}

impl Drop for Follower {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn next(mut s: Follower) -> Option<(Result<Event, Infallible>, Follower)> {
    loop {
        tokio::select! {
            changed = s.rx.changed() => {
                changed.ok()?;
                let now = s.viewer.mark(&s.rx.borrow_and_update());
                let Some(last) = s.last.replace(now) else {
                    continue;
                };
                let moved: Vec<&str> = [
                    ("work", now.work != last.work),
                    ("nodes", now.nodes != last.nodes),
                ]
                .into_iter()
                .filter_map(|(name, moved)| moved.then_some(name))
                .collect();
                if !moved.is_empty() {
                    let event = Event::default().event("change").data(moved.join(","));
                    return Some((Ok(event), s));
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
