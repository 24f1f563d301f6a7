//! Enumeration of maximal layouts: layouts to which no further instance of
//! the chosen profiles can be added.

use super::catalog::{GpuModel, ProfileIdx};
use super::layout::{Occupancy, Slot};

impl GpuModel {
    /// Every maximal layout built from `profiles`, each sorted by start.
    /// Exponential in the worst case, but a GPU has at most a few dozen
    /// `(profile, start)` pairs and the rules prune hard: the seven A100
    /// profiles take well under a millisecond.
    pub fn maximal_layouts(&self, profiles: &[ProfileIdx]) -> Vec<Vec<Slot>> {
        let mut candidates: Vec<Slot> = profiles
            .iter()
            .flat_map(|&profile| {
                self.profile(profile).placements.iter().map(move |pl| Slot {
                    profile,
                    start: pl.start,
                })
            })
            .collect();
        candidates.sort();
        candidates.dedup();
        let mut out = Vec::new();
        let mut chosen = Vec::new();
        self.extend(&candidates, 0, Occupancy::default(), &mut chosen, &mut out);
        for layout in &mut out {
            layout.sort_by_key(|s| (s.start, s.profile));
        }
        out.sort();
        out
    }

    fn extend(
        &self,
        candidates: &[Slot],
        from: usize,
        occ: Occupancy,
        chosen: &mut Vec<Slot>,
        out: &mut Vec<Vec<Slot>>,
    ) {
        if !candidates.iter().any(|&s| occ.fits(self, s)) {
            out.push(chosen.clone());
            return;
        }
        for (i, &slot) in candidates.iter().enumerate().skip(from) {
            if occ.fits(self, slot) {
                let mut next = occ;
                next.add(self, slot);
                chosen.push(slot);
                self.extend(candidates, i + 1, next, chosen, out);
                chosen.pop();
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeSet;

    use crate::mig::Catalog;

    #[test]
    fn a100_40gb_base_profiles_have_19_maximal_layouts_and_14_multisets() {
        let c = Catalog::builtin();
        let m = c.get("A100-SXM4-40GB").unwrap();
        let base: Vec<_> = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
            .iter()
            .map(|n| m.profile_by_name(n).unwrap().0)
            .collect();
        let layouts = m.maximal_layouts(&base);
        let written: BTreeSet<String> = layouts
            .iter()
            .map(|l| {
                l.iter()
                    .map(|s| {
                        let name = &m.profile(s.profile).name;
                        format!("{}@{}", &name[..2], s.start)
                    })
                    .collect::<Vec<_>>()
                    .join("+")
            })
            .collect();
        // The 19 layouts of mig.md §1.4, written out.
        let expected: BTreeSet<String> = [
            "7g@0",
            "4g@0+3g@4",
            "4g@0+2g@4+1g@6",
            "4g@0+1g@4+1g@5+1g@6",
            "3g@0+3g@4",
            "3g@0+2g@4+1g@6",
            "3g@0+1g@4+1g@5+1g@6",
            "1g@0+1g@1+1g@2+1g@3+3g@4",
            "1g@0+1g@1+2g@2+3g@4",
            "2g@0+1g@2+1g@3+3g@4",
            "2g@0+2g@2+3g@4",
            "2g@0+2g@2+2g@4+1g@6",
            "2g@0+2g@2+1g@4+1g@5+1g@6",
            "2g@0+1g@2+1g@3+2g@4+1g@6",
            "2g@0+1g@2+1g@3+1g@4+1g@5+1g@6",
            "1g@0+1g@1+2g@2+2g@4+1g@6",
            "1g@0+1g@1+2g@2+1g@4+1g@5+1g@6",
            "1g@0+1g@1+1g@2+1g@3+2g@4+1g@6",
            "1g@0+1g@1+1g@2+1g@3+1g@4+1g@5+1g@6",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        assert_eq!(layouts.len(), 19);
        assert_eq!(written, expected);

        let multisets: BTreeSet<Vec<_>> = layouts
            .iter()
            .map(|l| {
                let mut p: Vec<_> = l.iter().map(|s| s.profile).collect();
                p.sort();
                p
            })
            .collect();
        assert_eq!(multisets.len(), 14);
        for l in &layouts {
            m.validate_slots(l).unwrap();
        }
    }
}
