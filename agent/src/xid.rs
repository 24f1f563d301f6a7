//! Critical Xid events per GPU: the bookkeeping between the NVML event thread
//! ([`crate::nvml`]) and [`GpuBackend::health`](crate::backend::GpuBackend::health).
//!
//! The thread [`record`](XidLog::record)s every critical Xid NVML delivers for a GPU
//! (`nvmlEventTypeXidCriticalError`); `health()` reads the count since the agent started
//! and the last code. Which Xids make a GPU unhealthy is the server's rule
//! (`domain::health::judge`): every counted Xid past the admin's baseline does, so the
//! agent counts what NVML calls critical and leaves nothing out. The count restarts when
//! the agent does, which the server's baseline allows for.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard};

use tessera_domain::wire::GpuHealth;

/// What registering a GPU for critical Xid events gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// Registered: its critical Xids are counted.
    Watching,
    /// The GPU or driver does not deliver critical Xid events
    /// (`NVML_ERROR_NOT_SUPPORTED`, or the event type missing from its supported set).
    NotSupported,
    /// Registration failed otherwise (the NVML error, in words).
    Failed(String),
}

impl fmt::Display for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Registration::Watching => f.write_str("watching critical Xid events"),
            Registration::NotSupported => {
                f.write_str("not supported (critical Xid events are not delivered)")
            }
            Registration::Failed(e) => write!(f, "registration failed: {e}"),
        }
    }
}

/// A GPU's critical Xids since the agent started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XidCounts {
    pub count: u64,
    /// The last one's code; `None` when NVML could not say which (its 999, "unknown").
    pub last: Option<u64>,
}

#[derive(Debug, Default)]
struct Entry {
    registration: Option<Registration>,
    counts: XidCounts,
}

/// Per GPU UUID: the registration result and the critical Xids seen. Shared between the
/// event thread (writer) and `health()` (reader).
#[derive(Debug, Default)]
pub struct XidLog {
    gpus: Mutex<HashMap<String, Entry>>,
}

impl XidLog {
    pub fn new() -> XidLog {
        XidLog::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // Every update is one statement: a panic elsewhere leaves the map consistent.
        self.gpus.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes how registering `gpu` went (a later registration replaces it; the counts stay).
    pub fn registered(&self, gpu: &str, r: Registration) {
        self.lock().entry(gpu.to_owned()).or_default().registration = Some(r);
    }

    /// One critical Xid on `gpu`; `code` is `None` when NVML reported it as unknown. Xids
    /// that user code causes (`tessera_domain::health::APPLICATION_XIDS`) are not counted:
    /// one tenant's faulting kernel must not take the GPU away from everyone.
    pub fn record(&self, gpu: &str, code: Option<u64>) {
        if !tessera_domain::health::is_fault_xid(code) {
            tracing::info!(gpu, code, "application Xid (not a GPU fault)");
            return;
        }
        let mut gpus = self.lock();
        let c = &mut gpus.entry(gpu.to_owned()).or_default().counts;
        c.count = c.count.saturating_add(1);
        c.last = code;
    }

    pub fn registration(&self, gpu: &str) -> Option<Registration> {
        self.lock().get(gpu).and_then(|e| e.registration.clone())
    }

    /// The counts for `gpu` when they mean something: it is watched, or Xids were seen on
    /// it. `None` for a GPU whose Xids nobody can see, so that no "0" is claimed for it.
    pub fn counts(&self, gpu: &str) -> Option<XidCounts> {
        let gpus = self.lock();
        let e = gpus.get(gpu)?;
        (e.registration == Some(Registration::Watching) || e.counts.count > 0).then_some(e.counts)
    }
}

/// The health report from what could be read: Xid counts (`None`: not watched), volatile
/// uncorrectable ECC errors and pending retirement (`None`: unreadable). `None` when
/// nothing could be read, since "no errors" would then be a guess.
pub fn gpu_health(
    xid: Option<XidCounts>,
    ecc_uncorrected: Option<u64>,
    retirement_pending: Option<bool>,
) -> Option<GpuHealth> {
    if xid.is_none() && ecc_uncorrected.is_none() && retirement_pending.is_none() {
        return None;
    }
    let xid = xid.unwrap_or_default();
    Some(GpuHealth {
        xid_count: xid.count,
        last_xid: xid.last,
        ecc_uncorrected: ecc_uncorrected.unwrap_or(0),
        retirement_pending: retirement_pending.unwrap_or(false),
    })
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tessera_domain::health::{Baseline, judge};

    #[test]
    fn application_xids_do_not_count_against_the_gpu() {
        let log = XidLog::new();
        log.registered("GPU-a", Registration::Watching);
        for code in [13, 31, 43, 45, 68, 109] {
            log.record("GPU-a", Some(code));
        }
        assert_eq!(log.counts("GPU-a").map(|c| c.count), Some(0));
        log.record("GPU-a", Some(79));
        log.record("GPU-a", Some(43));
        let c = log.counts("GPU-a").expect("watched");
        assert_eq!((c.count, c.last), (1, Some(79)));
    }

    const A: &str = "GPU-aaaa";
    const B: &str = "GPU-bbbb";

    #[test]
    fn counts_per_gpu_with_the_last_code() {
        let log = XidLog::new();
        log.registered(A, Registration::Watching);
        log.registered(B, Registration::Watching);
        assert_eq!(log.counts(A), Some(XidCounts::default()));
        log.record(A, Some(48));
        log.record(A, Some(79));
        assert_eq!(
            log.counts(A),
            Some(XidCounts {
                count: 2,
                last: Some(79)
            })
        );
        // Another GPU's events are its own.
        assert_eq!(log.counts(B), Some(XidCounts::default()));
        // An Xid NVML could not name still counts; the last code is then unknown.
        log.record(A, None);
        assert_eq!(
            log.counts(A),
            Some(XidCounts {
                count: 3,
                last: None
            })
        );
    }

    #[test]
    fn an_unwatched_gpu_claims_no_count() {
        let log = XidLog::new();
        assert_eq!(log.counts(A), None);
        log.registered(A, Registration::NotSupported);
        assert_eq!(log.counts(A), None);
        assert_eq!(log.registration(A), Some(Registration::NotSupported));
        log.registered(B, Registration::Failed("Unknown Error".into()));
        assert_eq!(log.counts(B), None);
        // An event for it all the same (e.g. its registration failed after a rebuild
        // while the old one still delivered) is not thrown away.
        log.record(B, Some(48));
        assert_eq!(
            log.counts(B),
            Some(XidCounts {
                count: 1,
                last: Some(48)
            })
        );
    }

    #[test]
    fn re_registering_keeps_the_counts() {
        let log = XidLog::new();
        log.registered(A, Registration::Watching);
        log.record(A, Some(79));
        log.registered(A, Registration::Watching);
        assert_eq!(log.counts(A).map(|c| c.count), Some(1));
    }

    #[test]
    fn health_reports_what_was_read() {
        assert_eq!(gpu_health(None, None, None), None);
        let watched = XidCounts {
            count: 1,
            last: Some(79),
        };
        assert_eq!(
            gpu_health(Some(watched), None, None),
            Some(GpuHealth {
                xid_count: 1,
                last_xid: Some(79),
                ecc_uncorrected: 0,
                retirement_pending: false,
            })
        );
        assert_eq!(
            gpu_health(None, Some(2), Some(true)),
            Some(GpuHealth {
                xid_count: 0,
                last_xid: None,
                ecc_uncorrected: 2,
                retirement_pending: true,
            })
        );
    }

    #[test]
    fn the_server_sees_a_recorded_xid_as_a_fault() {
        // What the agent reports is what `domain::health::judge` needs: a count past the
        // baseline, and the code to name.
        let log = XidLog::new();
        log.registered(A, Registration::Watching);
        let before = gpu_health(log.counts(A), Some(0), Some(false)).expect("read");
        assert_eq!(judge(&before, Baseline::default()).0, None);
        log.record(A, Some(79));
        let after = gpu_health(log.counts(A), Some(0), Some(false)).expect("read");
        assert_eq!(
            judge(&after, Baseline::default()).0.as_deref(),
            Some("critical Xid 79 (GPU has fallen off the bus)")
        );
    }

    #[test]
    fn the_event_thread_and_health_share_the_log() {
        let log = Arc::new(XidLog::new());
        log.registered(A, Registration::Watching);
        let writer = {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    log.record(A, Some(94));
                }
            })
        };
        for _ in 0..100 {
            let c = log.counts(A).expect("watched");
            assert!(c.count <= 1000);
        }
        writer.join().expect("writer");
        assert_eq!(log.counts(A).map(|c| c.count), Some(1000));
    }
}
