//! A profile's share of a GPU, for billing in GPU-equivalents.

use serde::{Deserialize, Serialize};

use super::catalog::{GpuModel, ProfileIdx};

/// An exact fraction of one GPU: `compute_slices / model compute slices`
/// (x/7 on A100/H100/H200/B200, x/4 on A30). Kept exact; round only once,
/// at the end, with [`GpuShare::milli_seconds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuShare {
    pub numerator: u32,
    pub denominator: u32,
}

impl GpuShare {
    pub const WHOLE: GpuShare = GpuShare {
        numerator: 1,
        denominator: 1,
    };

    /// The share in milli-GPU, rounded half up (1g of 7 = 143, 3g of 7 =
    /// 429). For display; sums of rounded shares may drift by a milli, so
    /// bill with [`GpuShare::milli_seconds`].
    pub fn milli(self) -> u32 {
        let d = u64::from(self.denominator.max(1));
        let v = (u64::from(self.numerator) * 2000 + d) / (2 * d);
        u32::try_from(v).unwrap_or(u32::MAX)
    }

    /// GPU-equivalent milli-GPU-seconds for `seconds` of use, floored once:
    /// `seconds × 1000 × numerator / denominator`.
    pub fn milli_seconds(self, seconds: u64) -> u64 {
        let d = u128::from(self.denominator.max(1));
        let v = u128::from(seconds) * 1000 * u128::from(self.numerator) / d;
        u64::try_from(v).unwrap_or(u64::MAX)
    }
}

impl GpuModel {
    /// The share of the GPU that one instance of `profile` is worth.
    pub fn share(&self, profile: ProfileIdx) -> GpuShare {
        GpuShare {
            numerator: u32::from(self.profile(profile).compute_slices),
            denominator: u32::from(self.compute_slices()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::mig::Catalog;

    #[test]
    fn shares_are_compute_slices_over_the_gpu() {
        let c = Catalog::builtin();
        let h100 = c.get("H100-80GB").unwrap();
        let a30 = c.get("A30-24GB").unwrap();
        let one = |m: &GpuModel, n: &str| m.share(m.profile_by_name(n).unwrap().0);
        assert_eq!(one(h100, "1g.10gb").milli(), 143);
        assert_eq!(one(h100, "3g.40gb").milli(), 429);
        assert_eq!(one(h100, "7g.80gb").milli(), 1000);
        assert_eq!(one(h100, "1g.20gb").milli(), 143, "memory does not count");
        assert_eq!(one(a30, "2g.12gb").milli(), 500);
        assert_eq!(one(a30, "1g.6gb").milli(), 250);
        // Exact: seven 1g instances for an hour bill exactly one GPU-hour.
        assert_eq!(
            7 * one(h100, "1g.10gb").milli_seconds(3600 * 7) / 7,
            3_600_000
        );
        assert_eq!(one(h100, "1g.10gb").milli_seconds(7), 1000);
        assert_eq!(GpuShare::WHOLE.milli_seconds(2), 2000);
    }
}
