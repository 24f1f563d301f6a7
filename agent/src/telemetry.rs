//! Telemetry: sample every GPU, spool the sample, send what the server has
//! not acknowledged.
//!
//! Sampling and sending are separate so an outage only grows the spool;
//! when the server is back, [`Telemetry::flush`] resends oldest first, in
//! batches, with the same sequence numbers (the server deduplicates on
//! `(node, seq)`).

use std::io;

use tessera_domain::wire::TelemetryBatch;

use crate::backend::GpuBackend;
use crate::link::{LinkError, ServerLink};
use crate::spool::Spool;

/// Samples per request when catching up after an outage.
pub const BATCH_MAX: usize = 100;

#[derive(Debug)]
pub struct Telemetry {
    spool: Spool,
}

impl Telemetry {
    pub fn new(spool: Spool) -> Self {
        Telemetry { spool }
    }

    pub fn spool(&self) -> &Spool {
        &self.spool
    }

    /// Takes one sample of every reachable GPU and spools it. A GPU that
    /// fails to sample is left out of this sample (and logged).
    pub fn sample(&mut self, backend: &dyn GpuBackend, at_unix_ms: i64) -> io::Result<u64> {
        let mut gpus = Vec::new();
        match backend.devices() {
            Ok(devices) => {
                for d in devices {
                    match backend.sample(&d.uuid) {
                        Ok(s) => gpus.push(s),
                        Err(e) => tracing::warn!(gpu = %d.uuid, error = %e, "sampling failed"),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot enumerate GPUs for telemetry"),
        }
        self.spool.push(at_unix_ms, gpus)
    }

    /// Sends everything unacknowledged; returns how many samples the server
    /// acknowledged. Stops at the first error, leaving the rest spooled.
    pub async fn flush<L: ServerLink>(&mut self, link: &L) -> Result<usize, FlushError> {
        let mut acked = 0;
        loop {
            let samples = self.spool.pending(BATCH_MAX);
            let Some(last) = samples.last().map(|s| s.seq) else {
                return Ok(acked);
            };
            let before = self.spool.len();
            let batch = TelemetryBatch {
                samples,
                dropped_total: self.spool.dropped_total(),
            };
            let ack = link.post_telemetry(&batch).await?;
            self.spool.ack(ack.acked_through.min(last))?;
            let done = before - self.spool.len();
            acked += done;
            if done == 0 {
                // The server acknowledged nothing new; try again next round
                // rather than spin.
                return Ok(acked);
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("spool: {0}")]
    Spool(#[from] io::Error),
}
