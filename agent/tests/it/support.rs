//! Shared fixtures: simulated nodes in a given state, a fake server.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tessera_agent::link::{LinkError, ServerLink};
use tessera_agent::reconcile::{Outcome, reconcile_gpu};
use tessera_agent::run::RunConfig;
use tessera_agent::sim::{Arch, SimNode};
use tessera_domain::wire::{
    ChangeMark, DesiredGpuState, DesiredInstance, DesiredState, Heartbeat, LogAck, MigMode,
    StatusReport, TelemetryAck, TelemetryBatch, TelemetrySample, WorkloadReports, WorkloadSpec,
    WorkloadSync,
};

pub const A100: &str = "A100-SXM4-40GB";

/// Seven instances of a one-slice profile, at every placement: a full A100 or H100.
pub const fn sevens(profile: &'static str) -> [(&'static str, u8); 7] {
    let p = profile;
    [(p, 0), (p, 1), (p, 2), (p, 3), (p, 4), (p, 5), (p, 6)]
}
pub const H100: &str = "H100-80GB";

/// A one-GPU node with MIG enabled (reset applied on Ampere) and `layout`
/// created with full compute instances.
pub fn node_with(model: &str, layout: &[(&str, u8)]) -> (SimNode, String) {
    let node = SimNode::new(&[model], 7).unwrap();
    let gpu = node.gpu_uuids()[0].clone();
    node.operator_set_mig_mode(&gpu, MigMode::Enabled).unwrap();
    if node.arch(&gpu) == Some(Arch::Ampere) {
        node.reset_gpu(&gpu).unwrap();
    }
    for (p, s) in layout {
        node.operator_create(&gpu, p, *s, true).unwrap();
    }
    (node, gpu)
}

pub fn desired(gpu: &str, layout: &[(&str, u8)], version: u64) -> DesiredGpuState {
    DesiredGpuState {
        gpu_uuid: gpu.to_owned(),
        mode: MigMode::Enabled,
        layout: layout
            .iter()
            .map(|(p, s)| DesiredInstance {
                profile: (*p).to_owned(),
                start: *s,
            })
            .collect(),
        sharing: None,
        version,
    }
}

pub fn sorted(layout: &[(&str, u8)]) -> Vec<(String, u8)> {
    let mut v: Vec<(String, u8)> = layout.iter().map(|(p, s)| ((*p).to_owned(), *s)).collect();
    v.sort();
    v
}

pub fn apply(node: &SimNode, d: &DesiredGpuState) -> Outcome {
    reconcile_gpu(node, d, true, &mut |_| {})
}

/// MIG UUIDs of the node's first GPU, by `profile@start`.
pub fn mig_uuids(node: &SimNode, gpu: &str) -> BTreeMap<String, String> {
    use tessera_agent::backend::GpuBackend;
    node.instances(gpu)
        .unwrap()
        .into_iter()
        .flat_map(|i| {
            let at = format!("{}@{}", i.profile, i.start);
            i.compute_instances
                .into_iter()
                .filter_map(move |c| c.uuid.map(|u| (at.clone(), u)))
        })
        .collect()
}

/// An in-memory server: stores what the agent sends, deduplicates samples
/// on seq, and can be taken down or made to lose acknowledgements. For
/// workloads it answers with `workloads` and stores log pieces that continue
/// what it holds, acknowledging through the end of them.
#[derive(Default)]
pub struct FakeServer {
    pub inner: Mutex<FakeState>,
    /// Answers a held long poll with "changed" (`notify_one`).
    pub changes: tokio::sync::Notify,
}

#[derive(Default)]
pub struct FakeState {
    pub down: bool,
    /// Answer 401 to heartbeats, as for a revoked node.
    pub reject: bool,
    /// Heartbeats attempted, accepted or not.
    pub heartbeat_attempts: u64,
    /// Store samples but fail the response, as if the connection dropped.
    pub lose_acks: bool,
    pub desired: DesiredState,
    pub heartbeats: Vec<Heartbeat>,
    pub statuses: Vec<StatusReport>,
    pub samples: BTreeMap<u64, TelemetrySample>,
    pub duplicates: u64,
    pub dropped_total: u64,
    /// The desired workload set sent with every workload answer.
    pub workloads: Vec<WorkloadSpec>,
    pub workload_reports: Vec<WorkloadReports>,
    /// Workload logs as stored, by id.
    pub logs: BTreeMap<String, StoredLog>,
}

#[derive(Debug, Default, Clone)]
pub struct StoredLog {
    /// Bytes stored (the offset the next piece must start at).
    pub through: u64,
    pub text: String,
    /// Pieces that did not start at `through` (resent or out of order).
    pub ignored: u64,
}

impl FakeServer {
    pub fn with<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        f(&mut self.inner.lock().unwrap())
    }

    fn gate(&self) -> Result<(), LinkError> {
        if self.with(|s| s.down) {
            Err(LinkError::Unreachable("fake server is down".into()))
        } else {
            Ok(())
        }
    }
}

impl ServerLink for &FakeServer {
    async fn heartbeat(&self, hb: &Heartbeat) -> Result<(), LinkError> {
        self.with(|s| s.heartbeat_attempts += 1);
        self.gate()?;
        if self.with(|s| s.reject) {
            return Err(LinkError::Unauthorized);
        }
        self.with(|s| s.heartbeats.push(hb.clone()));
        Ok(())
    }

    async fn desired_state(&self) -> Result<DesiredState, LinkError> {
        self.gate()?;
        Ok(self.with(|s| s.desired.clone()))
    }

    /// Held until a test calls `changes.notify_one()`.
    async fn wait_for_change(
        &self,
        since: Option<&ChangeMark>,
        _timeout_s: u64,
    ) -> Result<ChangeMark, LinkError> {
        self.gate()?;
        self.changes.notified().await;
        Ok(ChangeMark {
            epoch: "fake".into(),
            generation: since.map_or(1, |m| m.generation + 1),
            changed: true,
        })
    }

    async fn post_status(&self, report: &StatusReport) -> Result<(), LinkError> {
        self.gate()?;
        self.with(|s| s.statuses.push(report.clone()));
        Ok(())
    }

    async fn post_telemetry(&self, batch: &TelemetryBatch) -> Result<TelemetryAck, LinkError> {
        self.gate()?;
        self.with(|s| {
            s.dropped_total = batch.dropped_total;
            for sample in &batch.samples {
                if s.samples.insert(sample.seq, sample.clone()).is_some() {
                    s.duplicates += 1;
                }
            }
            if s.lose_acks {
                return Err(LinkError::Unreachable("response lost".into()));
            }
            Ok(TelemetryAck {
                acked_through: batch.samples.iter().map(|x| x.seq).max().unwrap_or(0),
            })
        })
    }

    async fn sync_workloads(&self, r: &WorkloadReports) -> Result<WorkloadSync, LinkError> {
        self.gate()?;
        Ok(self.with(|s| {
            s.workload_reports.push(r.clone());
            let mut log_acks = Vec::new();
            for w in &r.workloads {
                let stored = s.logs.entry(w.id.clone()).or_default();
                if let Some(piece) = &w.log {
                    if piece.offset == stored.through {
                        stored.text.push_str(&piece.text);
                        stored.through += piece.len;
                    } else {
                        stored.ignored += 1;
                    }
                }
                log_acks.push(LogAck {
                    id: w.id.clone(),
                    stored_through: stored.through,
                });
            }
            WorkloadSync {
                workloads: s.workloads.clone(),
                execs: Vec::new(),
                log_acks,
            }
        }))
    }
}

/// The desired workloads as the server answers them, no logs acknowledged.
pub fn sync(workloads: &[WorkloadSpec]) -> WorkloadSync {
    WorkloadSync {
        workloads: workloads.to_vec(),
        execs: Vec::new(),
        log_acks: vec![],
    }
}

/// An agent loop's settings for tests: no MIG management, slow periodic rounds (tests
/// drive what they look at), workloads every second, workloads left running on exit.
pub fn run_config() -> RunConfig {
    RunConfig {
        manage_mig: false,
        reconcile_every: std::time::Duration::from_secs(10),
        telemetry_every: std::time::Duration::from_secs(10),
        heartbeat_every: std::time::Duration::from_secs(30),
        workload_every: std::time::Duration::from_secs(1),
        stop_workloads_on_exit: false,
    }
}

/// `ex`'s reports every 50 ms until `done` holds for the report of `id` (at most `wait`).
pub async fn report_until(
    ex: &mut tessera_agent::workloads::LocalExecutor,
    id: &str,
    what: &str,
    wait: std::time::Duration,
    done: impl Fn(&tessera_domain::wire::WorkloadReport) -> bool,
) -> tessera_domain::wire::WorkloadReport {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let reports = ex.reports().await;
        if let Some(r) = reports.iter().find(|r| r.id == id)
            && done(r)
        {
            return r.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {id} to be {what}: {reports:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The text of `path` once it exists and ends with a line break (at most `wait`).
pub async fn whole_file(path: &std::path::Path, wait: std::time::Duration) -> String {
    let deadline = std::time::Instant::now() + wait;
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Runs this test binary again in a fresh network namespace (`unshare --net`), the
/// ignored tests `filter` selects one at a time with `env` set to `1`; asserts that it
/// passed and returns its output.
pub fn run_in_own_netns(filter: &[&str], env: &str) -> String {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("unshare")
        .args(["--net", "--"])
        .arg(&exe)
        .args(filter)
        .args(["--ignored", "--nocapture", "--test-threads=1"])
        .env(env, "1")
        .output()
        .expect("run unshare");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    text
}

/// Sandbox settings for a test: crun, `uid_count` ids from `uid_first`, `memory_mib` MiB,
/// `pids` and `nproc` processes, a 16 MiB /tmp, 1024 open files, simulated devices in
/// `dev`.
pub fn sandbox_settings(
    uid_first: u32,
    uid_count: u32,
    memory_mib: u64,
    (pids, nproc): (u64, u64),
    dev: std::path::PathBuf,
) -> tessera_agent::sandbox::SandboxSettings {
    let mut s = tessera_agent::sandbox::SandboxSettings::new(std::path::PathBuf::from("crun"));
    s.uid_first = uid_first;
    s.uid_count = uid_count;
    s.memory_mib = Some(memory_mib);
    s.pids = pids;
    s.tmp_mib = 16;
    s.nofile = 1024;
    s.nproc = nproc;
    s.simulated_devices(dev);
    s
}
