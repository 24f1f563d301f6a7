//! A bounded on-disk queue of telemetry samples the server has not yet
//! acknowledged.
//!
//! Samples are appended as JSON lines to segment files (`seg-<first seq>.jsonl`)
//! of `segment_len` samples; `meta.json` holds the highest acknowledged
//! sequence number and the count of dropped samples. When more than
//! `max_segments` segments exist the oldest segment is deleted and its
//! unacknowledged samples are added to `dropped_total`, which is never reset
//! and is sent with every batch, so a gap is always accounted for.
//!
//! Sequence numbers never repeat for the life of the state directory, even
//! across crashes: on open, the next number is above everything spooled or
//! acknowledged. A torn last line (crash mid-write) is skipped on open.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tessera_domain::wire::{GpuSample, TelemetrySample};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Meta {
    acked_through: u64,
    dropped_total: u64,
    next_seq: u64,
}

#[derive(Debug)]
struct Segment {
    path: PathBuf,
    /// Unacknowledged samples of this segment, oldest first.
    samples: VecDeque<TelemetrySample>,
    /// Samples ever written to the file (acked ones included).
    written: usize,
}

#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    segment_len: usize,
    max_segments: usize,
    segments: VecDeque<Segment>,
    meta: Meta,
}

fn seg_name(first_seq: u64) -> String {
    format!("seg-{first_seq:020}.jsonl")
}

impl Spool {
    /// Opens (or creates) the spool in `dir`. It holds at most
    /// `max_segments * segment_len` unacknowledged samples.
    pub fn open(dir: &Path, segment_len: usize, max_segments: usize) -> io::Result<Spool> {
        fs::create_dir_all(dir)?;
        let meta: Meta = match fs::read(dir.join("meta.json")) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_default(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Meta::default(),
            Err(e) => return Err(e),
        };
        let mut names: Vec<PathBuf> = fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("seg-") && n.ends_with(".jsonl"))
            })
            .collect();
        names.sort();
        let mut segments = VecDeque::new();
        let mut max_seq = 0;
        for path in names {
            let mut samples = VecDeque::new();
            let mut written = 0;
            for line in BufReader::new(File::open(&path)?).lines() {
                let line = line?;
                let Ok(sample) = serde_json::from_str::<TelemetrySample>(&line) else {
                    continue;
                };
                written += 1;
                max_seq = max_seq.max(sample.seq);
                if sample.seq > meta.acked_through {
                    samples.push_back(sample);
                }
            }
            segments.push_back(Segment {
                path,
                samples,
                written,
            });
        }
        let mut spool = Spool {
            dir: dir.to_owned(),
            segment_len: segment_len.max(1),
            max_segments: max_segments.max(1),
            segments,
            meta,
        };
        spool.meta.next_seq = spool
            .meta
            .next_seq
            .max(max_seq + 1)
            .max(spool.meta.acked_through + 1);
        spool.remove_acked_segments()?;
        Ok(spool)
    }

    pub fn capacity(&self) -> usize {
        self.segment_len * self.max_segments
    }

    /// Unacknowledged samples held.
    pub fn len(&self) -> usize {
        self.segments.iter().map(|s| s.samples.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dropped_total(&self) -> u64 {
        self.meta.dropped_total
    }

    pub fn acked_through(&self) -> u64 {
        self.meta.acked_through
    }

    /// Stores a new sample and returns its sequence number.
    pub fn push(&mut self, at_unix_ms: i64, gpus: Vec<GpuSample>) -> io::Result<u64> {
        let seq = self.meta.next_seq;
        let sample = TelemetrySample {
            seq,
            at_unix_ms,
            gpus,
        };
        let need_new = self
            .segments
            .back()
            .is_none_or(|s| s.written >= self.segment_len);
        if need_new {
            self.segments.push_back(Segment {
                path: self.dir.join(seg_name(seq)),
                samples: VecDeque::new(),
                written: 0,
            });
        }
        let mut line = serde_json::to_vec(&sample).map_err(io::Error::other)?;
        line.push(b'\n');
        if let Some(seg) = self.segments.back_mut() {
            let mut f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&seg.path)?;
            f.write_all(&line)?;
            seg.written += 1;
            seg.samples.push_back(sample);
        }
        self.meta.next_seq = seq + 1;
        let mut meta_dirty = need_new;
        while self.segments.len() > self.max_segments {
            if let Some(old) = self.segments.pop_front() {
                self.meta.dropped_total += old.samples.len() as u64;
                remove_if_exists(&old.path)?;
                meta_dirty = true;
            }
        }
        if meta_dirty {
            self.write_meta()?;
        }
        Ok(seq)
    }

    /// Up to `limit` unacknowledged samples, oldest first.
    pub fn pending(&self, limit: usize) -> Vec<TelemetrySample> {
        self.segments
            .iter()
            .flat_map(|s| s.samples.iter())
            .take(limit)
            .cloned()
            .collect()
    }

    /// Forgets every sample with `seq <= through`.
    pub fn ack(&mut self, through: u64) -> io::Result<()> {
        if through <= self.meta.acked_through {
            return Ok(());
        }
        self.meta.acked_through = through;
        self.meta.next_seq = self.meta.next_seq.max(through + 1);
        for seg in &mut self.segments {
            while seg.samples.front().is_some_and(|s| s.seq <= through) {
                seg.samples.pop_front();
            }
        }
        self.write_meta()?;
        self.remove_acked_segments()
    }

    /// Deletes full segments with nothing left to send (keeps the one being
    /// appended to).
    fn remove_acked_segments(&mut self) -> io::Result<()> {
        while self.segments.len() > 1 && self.segments.front().is_some_and(|s| s.samples.is_empty())
        {
            if let Some(old) = self.segments.pop_front() {
                remove_if_exists(&old.path)?;
            }
        }
        if let Some(last) = self.segments.back()
            && last.samples.is_empty()
            && last.written >= self.segment_len
        {
            remove_if_exists(&last.path)?;
            self.segments.pop_back();
        }
        Ok(())
    }

    fn write_meta(&self) -> io::Result<()> {
        let tmp = self.dir.join("meta.json.tmp");
        let bytes = serde_json::to_vec(&self.meta).map_err(io::Error::other)?;
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        fs::rename(tmp, self.dir.join("meta.json"))
    }
}

fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
