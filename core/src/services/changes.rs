//! What a viewer may see change, for the UI's live updates (the server's `/events`
//! stream): a fingerprint of each team's live allocations and workloads (their states,
//! why they wait, preemption warnings, ends, devices, readiness) and one of the cluster
//! every user sees (nodes, their GPU layouts, its used capacity). A replica takes a
//! [`Snapshot`] every second while streams are open; each stream compares the [`Mark`] of
//! what its viewer may read with the one it sent last. A mark says only *that* something the viewer may read changed, never
//! what: the page then reloads its data through the authorized calls it always uses.

use crate::auth::Principal;
use crate::clock::Clock;
use crate::services::authz::readable_teams;
use crate::services::internal;
use crate::store::Store;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use tessera_domain::error::AppError;
use tessera_domain::ids::TeamId;
use uuid::Uuid;

#[derive(Clone)]
pub struct Changes {
    store: Store,
    clock: Clock,
}

/// The fingerprints at one moment (opaque; see [`Viewer::mark`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Per team with anything live.
    teams: HashMap<Uuid, u64>,
    /// Over every team (what a platform admin sees).
    all: u64,
    nodes: u64,
    /// False for the placeholder before the first snapshot: nothing to compare with.
    taken: bool,
}

/// What one viewer may see of a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    /// Allocations and workloads of the viewer's teams (and so queues and dashboards).
    pub work: u64,
    /// The cluster: nodes, their GPU layouts, its used capacity (every signed-in user
    /// sees the cluster).
    pub nodes: u64,
}

/// A signed-in viewer's scope: their teams, or every team for a platform admin.
#[derive(Clone, Debug)]
pub struct Viewer {
    teams: Option<Vec<TeamId>>,
}

impl Changes {
    pub fn new(store: Store) -> Self {
        Changes {
            store,
            clock: Clock::system(),
        }
    }

    /// Reads the time from `clock` instead of the system's.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The fingerprints now. Not authorized by itself: it leaves the server only as the
    /// [`Mark`] of a [`Viewer`].
    pub async fn snapshot(&self) -> Result<Snapshot, AppError> {
        let (allocations, workloads, layouts) = self
            .store
            .change_marks()
            .await
            .map_err(internal("reading what changed"))?;
        // Rows come in no particular order: per-row hashes, summed, do not care.
        let mut teams: HashMap<Uuid, u64> = HashMap::new();
        for (team, row) in allocations
            .iter()
            .map(|a| (a.0, hash(a)))
            .chain(workloads.iter().map(|w| (w.0, hash(w))))
        {
            let t = teams.entry(team).or_default();
            *t = t.wrapping_add(row);
        }
        let mut sorted: Vec<(&Uuid, &u64)> = teams.iter().collect();
        sorted.sort_unstable();
        Ok(Snapshot {
            all: hash(&sorted),
            nodes: hash(&layouts),
            teams,
            taken: true,
        })
    }

    /// Whose changes `p` may follow: the teams they may read.
    pub async fn viewer(&self, p: &Principal) -> Result<Viewer, AppError> {
        Ok(Viewer {
            teams: readable_teams(&self.store, p, None).await?,
        })
    }
}

impl Snapshot {
    /// A real snapshot, not the placeholder before the first one.
    pub fn is_taken(&self) -> bool {
        self.taken
    }
}

impl Viewer {
    pub fn mark(&self, s: &Snapshot) -> Mark {
        let work = match &self.teams {
            None => s.all,
            Some(teams) => hash(
                &teams
                    .iter()
                    .map(|t| s.teams.get(&t.0).copied().unwrap_or(0))
                    .collect::<Vec<_>>(),
            ),
        };
        Mark {
            work,
            nodes: s.nodes,
        }
    }
}

fn hash(v: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}
