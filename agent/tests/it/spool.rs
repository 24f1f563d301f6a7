//! The telemetry spool: bounded, drops counted, survives restarts, resends.

use tessera_agent::spool::Spool;
use tessera_agent::telemetry::Telemetry;

use crate::support::{FakeServer, H100, node_with};

#[test]
fn sequence_numbers_increase_and_survive_restart_and_full_ack() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(dir.path(), 4, 10).unwrap();
    for i in 0..6 {
        assert_eq!(spool.push(i, vec![]).unwrap(), i as u64 + 1);
    }
    spool.ack(6).unwrap();
    assert!(spool.is_empty());
    drop(spool);
    let mut spool = Spool::open(dir.path(), 4, 10).unwrap();
    assert_eq!(spool.push(0, vec![]).unwrap(), 7, "never reuse a seq");
    drop(spool);
    let spool = Spool::open(dir.path(), 4, 10).unwrap();
    assert_eq!(
        spool.pending(10).iter().map(|s| s.seq).collect::<Vec<_>>(),
        [7]
    );
}

#[test]
fn unacked_samples_survive_a_restart_and_a_torn_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(dir.path(), 3, 10).unwrap();
    for i in 0..5 {
        spool.push(i, vec![]).unwrap();
    }
    spool.ack(2).unwrap();
    drop(spool);
    // A crash mid-write leaves half a line at the end of the last segment.
    let last = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .max()
        .unwrap();
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(&last)
        .unwrap()
        .write_all(b"{\"seq\":6,\"at_un")
        .unwrap();
    let mut spool = Spool::open(dir.path(), 3, 10).unwrap();
    let seqs: Vec<u64> = spool.pending(100).iter().map(|s| s.seq).collect();
    assert_eq!(seqs, [3, 4, 5]);
    assert_eq!(spool.push(0, vec![]).unwrap(), 6);
}

#[test]
fn the_bound_drops_oldest_and_counts_every_drop() {
    let dir = tempfile::tempdir().unwrap();
    // 5 segments of 2: at most 10 samples.
    let mut spool = Spool::open(dir.path(), 2, 5).unwrap();
    assert_eq!(spool.capacity(), 10);
    for i in 0..15 {
        spool.push(i, vec![]).unwrap();
        assert!(spool.len() <= spool.capacity());
    }
    let seqs: Vec<u64> = spool.pending(100).iter().map(|s| s.seq).collect();
    assert_eq!(spool.dropped_total(), 15 - seqs.len() as u64);
    assert_eq!(seqs, (7..=15).collect::<Vec<u64>>(), "the newest are kept");
    assert_eq!(spool.dropped_total(), 6);
    drop(spool);
    let spool = Spool::open(dir.path(), 2, 5).unwrap();
    assert_eq!(spool.dropped_total(), 6, "the count survives a restart");
}

#[tokio::test]
async fn outage_and_restarts_lose_nothing_and_duplicates_are_dedupable() {
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = node_with(H100, &[("7g.80gb", 0)]);
    let server = FakeServer::default();
    let link = &server;
    let mut t = Telemetry::new(Spool::open(dir.path(), 10, 100).unwrap());
    for i in 0..3 {
        t.sample(&node, 1_000 * i).unwrap();
        t.flush(&link).await.unwrap();
    }
    assert_eq!(server.with(|s| s.samples.len()), 3);

    // Outage: samples pile up in the spool, and the agent restarts.
    server.with(|s| s.down = true);
    for i in 3..30 {
        t.sample(&node, 1_000 * i).unwrap();
        assert!(t.flush(&link).await.is_err());
    }
    assert_eq!(t.spool().len(), 27);
    drop(t);
    let mut t = Telemetry::new(Spool::open(dir.path(), 10, 100).unwrap());
    assert_eq!(t.spool().len(), 27);

    // The server is back but the first acknowledgement is lost: the batch is
    // sent twice, and the server sees the same seqs again.
    server.with(|s| {
        s.down = false;
        s.lose_acks = true;
    });
    t.sample(&node, 30_000).unwrap();
    assert!(t.flush(&link).await.is_err());
    server.with(|s| s.lose_acks = false);
    assert_eq!(t.flush(&link).await.unwrap(), 28);
    assert!(t.spool().is_empty());
    server.with(|s| {
        assert_eq!(
            s.samples.keys().copied().collect::<Vec<u64>>(),
            (1..=31).collect::<Vec<u64>>()
        );
        assert_eq!(s.duplicates, 28);
        assert_eq!(s.dropped_total, 0);
        assert_eq!(s.samples[&31].gpus.len(), 1);
        assert_eq!(s.samples[&31].gpus[0].mig_devices.len(), 1);
    });
}
