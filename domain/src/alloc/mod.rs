//! GPU allocations: what a team asks for, what it costs against its quota, who must
//! approve it, where it waits, whom it may preempt, and how it is shown.
//!
//! # Kinds and units
//!
//! A [`GpuKind`] names one unit of an allocation. Forms and REST use one string form:
//!
//! | kind string | meaning | units (H100-80GB) |
//! |---|---|---|
//! | `H100-80GB:1g.10gb` | one MIG instance of profile `1g.10gb` | 1 |
//! | `H100-80GB:whole` | one whole GPU | 7 |
//! | `H100-80GB:share:250` | 250 milli-GPU (a quarter) of a shared GPU | 250 (of `H100-80GB:shared`) |
//!
//! An allocation is `count` of a kind (2 × `1g.10gb`, 4 whole GPUs); a share is always
//! count 1. Quota is counted per [`GpuKind::quota_key`]: MIG slices and whole GPUs of a
//! model count in **units = compute slices of the model** (7 on A100/H100/H200/B200, 4 on
//! A30) against the model's quota (`H100-80GB`): a MIG profile costs its compute slices, a
//! whole GPU all of the model's. Shares count exactly, in **milli-GPU**, against the
//! model's shared quota (`H100-80GB:shared`): a share of `m` milli costs `m`.
//!
//! # Lifecycle
//!
//! | from | may go to |
//! |---|---|
//! | `pending_approval` | `queued`, `denied`, `cancelled` |
//! | `queued` | `placing`, `cancelled`, `failed` |
//! | `placing` | `active`, `queued` (placement undone), `failed`, `cancelled` |
//! | `active` | `releasing`, `failed` |
//! | `releasing` | `ended`, `expired`, `preempted`, `failed` |
//! | `ended`, `denied`, `cancelled`, `expired`, `preempted`, `failed` | nothing (terminal) |
//!
//! Leaving `active` always goes through `releasing`; the [`ReleaseCause`] recorded then
//! (released, expired, preempted) names the terminal state once the GPU is torn down.
//! `queued`, `placing`, `active` and `releasing` hold quota; `pending_approval` does not.
//!
//! # Admission
//!
//! A team's [`Quota`] on a model has a `guaranteed` share, a `limit` it may borrow up to,
//! and a `per_user` cap. [`admit`] admits an ask that keeps the team within its limit and
//! the user within the per-user cap; units beyond the guarantee are *borrowed* (and may be
//! preempted). Otherwise a team admin approves if the team stays within its guarantee
//! (only the per-user cap is exceeded), else a platform admin.
//!
//! # Queue order
//!
//! [`order_queue`] sorts by priority class (high first), then by fair share ascending,
//! then by age (older first), then by id. A team's fair share is
//!
//! ```text
//! share = recent usage (unit-seconds over the last 7 days) / guaranteed units
//! ```
//!
//! compared exactly by `u128` cross-multiplication; a team with no guarantee sorts after
//! every team with one (and among themselves by recent usage).
//!
//! # Preemption
//!
//! A team that asks within its guarantee may reclaim units that other teams borrow:
//! [`select_victims`] takes preemptible allocations before normal before high, newest
//! first, never drives a team below its guarantee, and returns `None` rather than
//! preempting in vain.

use crate::error::AppError;
use crate::ids::{TeamId, UserId};
use crate::mig::{Catalog, GpuModel};
use chrono::{DateTime, NaiveDateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

mod admission;
mod gang;
mod kind;
mod pending;
mod preemption;
mod priority;
mod queue;
mod request;
mod state;
mod view;

pub use admission::*;
pub use gang::*;
pub use kind::*;
pub use pending::*;
pub use preemption::*;
pub use priority::*;
pub use queue::*;
pub use request::*;
pub use state::*;
pub use view::*;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
