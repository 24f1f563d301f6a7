//! Layouts and the validator (mig.md §1.3): every instance starts at an
//! allowed placement of its profile, memory ranges are disjoint, per-profile
//! counts stay within `max_count`, and compute slices fit the GPU.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::catalog::{GpuModel, MAX_PROFILES, ProfileIdx, range_mask};

/// A GPU instance named the way users and the driver name it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Instance {
    pub profile: String,
    pub start: u8,
}

/// A GPU instance by profile index: the compact form the planner works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Slot {
    pub profile: ProfileIdx,
    pub start: u8,
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.profile, self.start)
    }
}

/// Why a layout is invalid. `instance` is the position of the offending
/// instance in the input; `at` is it written as `profile@start`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum LayoutError {
    #[error("instance {instance} ({at}): {model} has no profile of that name")]
    UnknownProfile {
        instance: usize,
        at: String,
        model: String,
    },
    #[error("instance {instance} ({at}): not an allowed placement; allowed starts are {allowed:?}")]
    BadPlacement {
        instance: usize,
        at: String,
        allowed: Vec<u8>,
    },
    #[error("instance {instance} ({at}): memory slices overlap instance {other} ({other_at})")]
    Overlap {
        instance: usize,
        at: String,
        other: usize,
        other_at: String,
    },
    #[error("instance {instance} ({at}): more than {max} instances of this profile")]
    TooMany {
        instance: usize,
        at: String,
        max: u8,
    },
    #[error(
        "instance {instance} ({at}): needs more compute slices than the {capacity} the GPU has"
    )]
    ComputeExceeded {
        instance: usize,
        at: String,
        capacity: u8,
    },
}

/// What a layout occupies: memory mask, compute slices and per-profile
/// counts. Adding and removing are O(1), so the planner can try placements
/// without rebuilding anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Occupancy {
    pub mask: u32,
    pub compute: u8,
    pub counts: [u8; MAX_PROFILES],
}

/// Why one slot cannot be added to an occupancy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Misfit {
    Placement,
    Overlap,
    Count,
    Compute,
}

impl Occupancy {
    pub(crate) fn misfit(&self, model: &GpuModel, slot: Slot) -> Option<Misfit> {
        let p = model.profile(slot.profile);
        if !p.placements.iter().any(|pl| pl.start == slot.start) {
            return Some(Misfit::Placement);
        }
        if self.mask & range_mask(slot.start, p.memory_slices) != 0 {
            return Some(Misfit::Overlap);
        }
        if self.counts[usize::from(slot.profile.0)] >= p.max_count {
            return Some(Misfit::Count);
        }
        if self.compute + p.compute_slices > model.compute_slices() {
            return Some(Misfit::Compute);
        }
        None
    }

    /// Whether `slot` can be added without breaking any rule.
    pub fn fits(&self, model: &GpuModel, slot: Slot) -> bool {
        self.misfit(model, slot).is_none()
    }

    /// Adds a slot; the caller has checked [`Occupancy::fits`].
    pub fn add(&mut self, model: &GpuModel, slot: Slot) {
        let p = model.profile(slot.profile);
        self.mask |= range_mask(slot.start, p.memory_slices);
        self.compute += p.compute_slices;
        self.counts[usize::from(slot.profile.0)] += 1;
    }

    /// Removes a slot previously added.
    pub fn remove(&mut self, model: &GpuModel, slot: Slot) {
        let p = model.profile(slot.profile);
        self.mask &= !range_mask(slot.start, p.memory_slices);
        self.compute -= p.compute_slices;
        self.counts[usize::from(slot.profile.0)] -= 1;
    }

    /// Number of `(profile, start)` pairs that could still be added: a cheap
    /// measure of how many options a layout leaves open.
    pub fn options(&self, model: &GpuModel) -> u32 {
        let mut n = 0;
        for (idx, p) in model.indexed() {
            for pl in &p.placements {
                if self.fits(
                    model,
                    Slot {
                        profile: idx,
                        start: pl.start,
                    },
                ) {
                    n += 1;
                }
            }
        }
        n
    }
}

impl GpuModel {
    /// Parses named instances into slots and validates the layout.
    pub fn validate(&self, instances: &[Instance]) -> Result<Vec<Slot>, LayoutError> {
        let slots = instances
            .iter()
            .enumerate()
            .map(|(i, inst)| {
                self.profile_by_name(&inst.profile)
                    .map(|(profile, _)| Slot {
                        profile,
                        start: inst.start,
                    })
                    .ok_or_else(|| LayoutError::UnknownProfile {
                        instance: i,
                        at: inst.to_string(),
                        model: self.name().to_owned(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.validate_slots(&slots)?;
        Ok(slots)
    }

    /// Validates a layout given by profile index.
    pub fn validate_slots(&self, slots: &[Slot]) -> Result<(), LayoutError> {
        let mut occ = Occupancy::default();
        for (i, &slot) in slots.iter().enumerate() {
            let at = self.slot_name(slot);
            match occ.misfit(self, slot) {
                None => occ.add(self, slot),
                Some(Misfit::Placement) => {
                    return Err(LayoutError::BadPlacement {
                        instance: i,
                        at,
                        allowed: self
                            .profile(slot.profile)
                            .placements
                            .iter()
                            .map(|p| p.start)
                            .collect(),
                    });
                }
                Some(Misfit::Overlap) => {
                    let size = self.profile(slot.profile).memory_slices;
                    let mine = range_mask(slot.start, size);
                    let other = slots[..i]
                        .iter()
                        .position(|s| {
                            range_mask(s.start, self.profile(s.profile).memory_slices) & mine != 0
                        })
                        .unwrap_or(0);
                    return Err(LayoutError::Overlap {
                        instance: i,
                        at,
                        other,
                        other_at: self.slot_name(slots[other]),
                    });
                }
                Some(Misfit::Count) => {
                    return Err(LayoutError::TooMany {
                        instance: i,
                        at,
                        max: self.profile(slot.profile).max_count,
                    });
                }
                Some(Misfit::Compute) => {
                    return Err(LayoutError::ComputeExceeded {
                        instance: i,
                        at,
                        capacity: self.compute_slices(),
                    });
                }
            }
        }
        Ok(())
    }

    /// `profile@start`, for messages.
    pub fn slot_name(&self, slot: Slot) -> String {
        format!("{}@{}", self.profile(slot.profile).name, slot.start)
    }

    /// The named form of a slot.
    pub fn instance(&self, slot: Slot) -> Instance {
        Instance {
            profile: self.profile(slot.profile).name.clone(),
            start: slot.start,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::mig::Catalog;

    fn inst(profile: &str, start: u8) -> Instance {
        Instance {
            profile: profile.to_owned(),
            start,
        }
    }

    #[test]
    fn a_full_h100_layout_is_valid() {
        let c = Catalog::builtin();
        let h100 = c.get("H100-80GB").unwrap();
        let layout = [inst("4g.40gb", 0), inst("2g.20gb", 4), inst("1g.10gb", 6)];
        assert_eq!(h100.validate(&layout).unwrap().len(), 3);
    }

    #[test]
    fn a_1g_after_a_3g_at_zero_cannot_start_at_three() {
        let c = Catalog::builtin();
        let a100 = c.get("A100-SXM4-40GB").unwrap();
        let err = a100
            .validate(&[inst("3g.20gb", 0), inst("1g.5gb", 3)])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "instance 1 (1g.5gb@3): memory slices overlap instance 0 (3g.20gb@0)"
        );
    }

    #[test]
    fn errors_name_the_offending_instance() {
        let c = Catalog::builtin();
        let a100 = c.get("A100-SXM4-40GB").unwrap();
        let err = a100.validate(&[inst("1g.5gb", 7)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "instance 0 (1g.5gb@7): not an allowed placement; allowed starts are [0, 1, 2, 3, 4, 5, 6]"
        );
        let err = a100
            .validate(&[inst("1g.5gb+me", 0), inst("1g.5gb+me", 1)])
            .unwrap_err();
        assert!(
            matches!(
                err,
                LayoutError::TooMany {
                    instance: 1,
                    max: 1,
                    ..
                }
            ),
            "{err}"
        );
        let err = a100.validate(&[inst("9g.99gb", 0)]).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("instance 0 (9g.99gb@0): A100-SXM4-40GB has no")
        );
    }

    #[test]
    fn occupancy_add_then_remove_restores_it() {
        let c = Catalog::builtin();
        let m = c.get("A30-24GB").unwrap();
        let (idx, _) = m.profile_by_name("2g.12gb").unwrap();
        let mut occ = Occupancy::default();
        let before = occ;
        let slot = Slot {
            profile: idx,
            start: 2,
        };
        assert!(occ.fits(m, slot));
        occ.add(m, slot);
        assert!(!occ.fits(m, slot));
        occ.remove(m, slot);
        assert_eq!(occ, before);
    }
}
