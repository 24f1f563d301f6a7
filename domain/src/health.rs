//! GPU health (docs/operations.md): when a GPU's error counters say it must be taken out.
//!
//! The node reports counters ([`GpuHealth`]); the server keeps, per GPU, the counters a
//! platform admin last cleared at (the baseline). A critical Xid or an uncorrectable ECC
//! error beyond the baseline, or pages/rows waiting for retirement, make the GPU
//! unhealthy until an admin clears it (after repair or a reset). Counters restart from zero
//! when the agent restarts (Xid) or the GPU resets (volatile ECC): a baseline above the
//! reported counter falls to it, so the next error still counts.

use crate::wire::GpuHealth;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Xids that user code causes on a healthy GPU (a bad kernel's exception or page fault,
/// a stopped or cleaned-up context, …): not GPU faults. NVIDIA's Kubernetes device plugin
/// skips the same ones by default. A node does not count them against the GPU's health.
pub const APPLICATION_XIDS: &[u64] = &[13, 31, 43, 45, 68, 109];

/// Whether an Xid (`None`: NVML's "unknown") counts against the GPU's health.
pub fn is_fault_xid(code: Option<u64>) -> bool {
    code.is_none_or(|c| !APPLICATION_XIDS.contains(&c))
}

/// How long the work on a GPU that turned unhealthy has to stop (its deadline, told
/// through the deadline channel) before it is moved off.
pub const GRACE_SECS: i64 = 30;

/// The counters at the last clear.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Baseline {
    pub xid_count: u64,
    pub ecc_uncorrected: u64,
}

/// What a report means against `base`: the fault (in words) if any, and the baseline to
/// keep (lowered where the counters restarted).
pub fn judge(h: &GpuHealth, base: Baseline) -> (Option<String>, Baseline) {
    let kept = Baseline {
        xid_count: base.xid_count.min(h.xid_count),
        ecc_uncorrected: base.ecc_uncorrected.min(h.ecc_uncorrected),
    };
    let fault = if h.xid_count > kept.xid_count {
        Some(match h.last_xid {
            Some(code) => format!("critical Xid {code} ({})", xid_meaning(code)),
            None => "a critical Xid error".to_owned(),
        })
    } else if h.ecc_uncorrected > kept.ecc_uncorrected {
        Some(format!(
            "{} uncorrectable ECC error{}",
            h.ecc_uncorrected - kept.ecc_uncorrected,
            if h.ecc_uncorrected - kept.ecc_uncorrected == 1 {
                ""
            } else {
                "s"
            }
        ))
    } else if h.retirement_pending {
        Some("memory pages or rows wait for retirement (a GPU reset is due)".to_owned())
    } else {
        None
    };
    (fault, kept)
}

/// The few Xids worth naming (NVIDIA's Xid catalog).
pub fn xid_meaning(code: u64) -> &'static str {
    match code {
        13 => "graphics engine exception",
        68 => "video processor exception",
        109 => "context switch timeout",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup",
        48 => "double-bit ECC error",
        61 | 62 => "internal micro-controller error",
        63 | 64 => "ECC page retirement or row remapping",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 | 120 => "GSP error",
        _ => "see NVIDIA's Xid catalog",
    }
}

/// An unhealthy GPU as the Nodes page shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HealthView {
    pub reason: String,
    pub since: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(xid: u64, ecc: u64, pending: bool) -> GpuHealth {
        GpuHealth {
            xid_count: xid,
            last_xid: (xid > 0).then_some(79),
            ecc_uncorrected: ecc,
            retirement_pending: pending,
        }
    }

    #[test]
    fn new_errors_beyond_the_baseline_are_faults() {
        let zero = Baseline::default();
        assert_eq!(judge(&h(0, 0, false), zero).0, None);
        let (f, _) = judge(&h(1, 0, false), zero);
        assert_eq!(
            f.as_deref(),
            Some("critical Xid 79 (GPU has fallen off the bus)")
        );
        let (f, _) = judge(&h(0, 2, false), zero);
        assert_eq!(f.as_deref(), Some("2 uncorrectable ECC errors"));
        assert!(judge(&h(0, 0, true), zero).0.is_some());
        // Cleared at 3 Xids and 2 ECC errors: the same counters are fine, one more is not.
        let base = Baseline {
            xid_count: 3,
            ecc_uncorrected: 2,
        };
        assert_eq!(judge(&h(3, 2, false), base).0, None);
        assert_eq!(
            judge(&h(3, 3, false), base).0.as_deref(),
            Some("1 uncorrectable ECC error")
        );
    }

    #[test]
    fn counters_that_restarted_lower_the_baseline() {
        let base = Baseline {
            xid_count: 5,
            ecc_uncorrected: 4,
        };
        // The agent restarted: no Xid since; the baseline falls so the next one counts.
        let (f, kept) = judge(&h(0, 4, false), base);
        assert_eq!(f, None);
        assert_eq!(kept.xid_count, 0);
        assert!(judge(&h(1, 4, false), kept).0.is_some());
    }
}
