//! MIG (Multi-Instance GPU) facts and rules: which GPU-instance profiles a
//! GPU model offers, where each may be placed, whether a layout is valid,
//! which layouts are maximal, and what share of a GPU a profile is worth.
//!
//! Placements are counted in *memory slices* (NVML's `{start,size}`), so a
//! layout is a set of `(profile, start)` pairs whose memory ranges must not
//! overlap. The built-in tables ([`Catalog::builtin`]) come from NVIDIA's MIG
//! user guide and `nvidia-smi mig -lgip/-lgipp` captures; a node agent that
//! reads a device's real table builds a [`GpuModel`] from it with
//! [`GpuModel::new`] and [`Catalog::insert`]s it, which takes precedence.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod catalog;
mod enumerate;
mod layout;
mod share;

pub(crate) use catalog::range_mask as range_mask_of;
pub use catalog::{
    Catalog, CatalogError, GpuModel, GpuModelSpec, MAX_PROFILES, Placement, Profile, ProfileIdx,
};
pub use layout::Occupancy;
pub use layout::{Instance, LayoutError, Slot};
pub use share::GpuShare;
