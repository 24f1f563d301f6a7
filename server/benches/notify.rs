//! The notification outbox (docs/notifications.md) under a burst: `NOTIFY_EVENTS` (10,000)
//! events made through the product's own path, delivered by a release `tessera serve` to a
//! real SMTP server (aiosmtpd, as in `server/tests/it/notifications.rs`) and to a team
//! webhook on a loopback receiver in this bench.
//!
//! `cargo bench -p tessera-server --bench notify`, configured by environment:
//! `NOTIFY_DB` (`sqlite`, default, or `postgres` with `TESSERA_BENCH_PG_URL`),
//! `NOTIFY_EVENTS` (10000), `NOTIFY_INTERVALS` (`2s`: the worker's
//! `TESSERA_NOTIFY_INTERVAL`; a comma list runs the whole bench once per value, each on a
//! fresh server and database), `NOTIFY_PRODUCERS` (8 concurrent requesters making the
//! events), `NOTIFY_ADMIT_SECONDS` (20), `NOTIFY_ADMIT_CLIENTS` (4), `NOTIFY_RATE` (20
//! events/s) and `NOTIFY_PACED_SECONDS` (30), `NOTIFY_TIMEOUT` (1200 s to wait for
//! delivery), `NOTIFY_SERVER_BIN` (a `tessera` binary to run instead of this build's).
//! Needs `python3 -m aiosmtpd` (`cargo xtask test` installs it).
//!
//! The events are `request.needs_approval`: a member of a team whose quota gives each user
//! nothing without approval asks for a 1g.10gb slice (`POST /api/v1/allocations`); the
//! admission transaction writes the allocation and its event. Each event is mailed to the
//! team admin (one mail) and posted to the team's one webhook: two deliveries per event.
//! Commit time is the event's `created_at` (stamped inside the admission transaction, so
//! at most that transaction's last statements before the commit); receipt is the clock of
//! this machine when the receiver got the message (the SMTP server's `DATA`, the webhook's
//! request), matched to the event by the delivery id (`Message-ID: <id@tessera>`,
//! `X-Tessera-Delivery`).
//!
//! Per interval:
//! 1. **Admission, idle**: `NOTIFY_ADMIT_CLIENTS` clients of another team (no approval
//!    needed, no event written) each request a slice and release it, as fast as answered,
//!    for `NOTIFY_ADMIT_SECONDS`: admissions/s (and p50/p99 of both calls).
//! 2. **Burst**: `NOTIFY_EVENTS` approval requests as fast as `NOTIFY_PRODUCERS` clients
//!    get answers.
//! 3. **Admission while delivering**: the same as 1, at once after the burst, while the
//!    worker drains it (the deliveries received inside the window are printed).
//! 4. Waits for every delivery: throughput and commit → receipt p50/p99/max per channel.
//! 5. **Admission, idle after** (the database now larger): the same as 1.
//! 6. **Paced**: `NOTIFY_RATE` events/s for `NOTIFY_PACED_SECONDS`, then commit → receipt
//!    of those: the latency at a rate the worker keeps up with.
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/it/aiosmtpd.rs"]
mod aiosmtpd;
mod support;

use aiosmtpd::Aiosmtpd;
use support::env_usize;

use axum::http::HeaderMap;
use chrono::{DateTime, Utc};
use reqwest::Method;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{call, login, token_for};
use uuid::Uuid;

const PW: &str = "notify-bench-password-1";
const SLICE: &str = "H100-80GB:1g.10gb";

// ---- the SMTP server ----

/// aiosmtpd writing one line per message: its `Message-ID` and the arrival time (Unix
/// seconds, float), flushed at once.
const SMTPD: &str = r#"
import sys, time
from email.parser import BytesHeaderParser
from aiosmtpd.controller import Controller
port, out = int(sys.argv[1]), open(sys.argv[2], "a")
parser = BytesHeaderParser()
class Handler:
    async def handle_DATA(self, server, session, envelope):
        at = time.time()
        mid = parser.parsebytes(envelope.original_content or envelope.content).get("Message-ID", "")
        out.write("%s %.6f\n" % (mid.strip().strip("<>").split("@")[0], at))
        out.flush()
        return "250 OK"
"#;

struct Smtpd {
    server: Aiosmtpd,
    log: std::path::PathBuf,
}

impl Smtpd {
    fn start(dir: &std::path::Path) -> Smtpd {
        let log = dir.join("mail.log");
        let server = Aiosmtpd::start(SMTPD, &log);
        Smtpd { server, log }
    }

    /// (delivery id, arrival) of every mail so far.
    fn received(&self) -> Vec<(Uuid, DateTime<Utc>)> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (id, at) = l.split_once(' ')?;
                let at: f64 = at.parse().ok()?;
                Some((
                    id.parse().ok()?,
                    DateTime::from_timestamp_micros((at * 1e6) as i64)?,
                ))
            })
            .collect()
    }
}

// ---- the webhook receiver ----

/// Every webhook post: (delivery id, arrival).
type Hooks = Arc<Mutex<Vec<(Uuid, DateTime<Utc>)>>>;

async fn start_receiver() -> (String, Hooks) {
    let hooks: Hooks = Arc::default();
    let h = hooks.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap| {
            let at = Utc::now();
            let h = h.clone();
            async move {
                if let Some(id) = headers
                    .get("x-tessera-delivery")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                {
                    h.lock().expect("lock").push((id, at));
                }
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://127.0.0.1:{port}/hook"), hooks)
}

// ---- figures ----

/// `(p50, p99, max)` of `v` (sorted here).
fn percentiles(v: &mut [f64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[(((v.len() - 1) as f64) * p).round() as usize];
    (at(0.5), at(0.99), at(1.0))
}

/// A delivery as stored: (delivery id, channel, allocation, event's created_at, state).
type DeliveryInfo = (Uuid, String, Uuid, DateTime<Utc>, String);

async fn deliveries(url: &str) -> Vec<DeliveryInfo> {
    let sql = "SELECT d.id, d.channel, e.subject_id, e.created_at, d.state \
               FROM notification_deliveries d JOIN outbox_events e ON e.id = d.event_id \
               WHERE d.channel IN ('email', 'webhook')";
    let store = tessera_core::store::Store::connect(url)
        .await
        .expect("store");
    let rows = match &store {
        tessera_core::store::Store::Sqlite(p) => sqlx::query_as(sql).fetch_all(p).await,
        tessera_core::store::Store::Postgres(p) => sqlx::query_as(sql).fetch_all(p).await,
    }
    .expect("deliveries");
    store.close().await;
    rows
}

/// Marks every address as verified (mail goes only to verified addresses; the bench
/// skips the link in the verification mail).
async fn verify_addresses(url: &str) {
    let sql = "UPDATE users SET email_verified = TRUE WHERE email IS NOT NULL";
    let store = tessera_core::store::Store::connect(url)
        .await
        .expect("store");
    match &store {
        tessera_core::store::Store::Sqlite(p) => sqlx::query(sql).execute(p).await.map(|_| ()),
        tessera_core::store::Store::Postgres(p) => sqlx::query(sql).execute(p).await.map(|_| ()),
    }
    .expect("verify addresses");
    store.close().await;
}

/// First arrival per delivery id and how many arrivals repeated one.
fn first_arrivals(all: &[(Uuid, DateTime<Utc>)]) -> (HashMap<Uuid, DateTime<Utc>>, usize) {
    let mut first = HashMap::new();
    let mut repeats = 0;
    for (id, at) in all {
        match first.get(id) {
            Some(_) => repeats += 1,
            None => {
                first.insert(*id, *at);
            }
        }
    }
    (first, repeats)
}

struct Received {
    smtp: Smtpd,
    hooks: Hooks,
}

impl Received {
    fn all(&self) -> (HashMap<Uuid, DateTime<Utc>>, usize) {
        let mut v = self.smtp.received();
        v.extend(self.hooks.lock().expect("lock").iter().copied());
        first_arrivals(&v)
    }

    /// Waits until `n` distinct deliveries arrived (at most `timeout`); how many did.
    async fn wait_for(&self, n: usize, timeout: Duration) -> usize {
        let t0 = Instant::now();
        let mut last_print = Instant::now();
        loop {
            let got = self.all().0.len();
            if got >= n || t0.elapsed() > timeout {
                return got;
            }
            if last_print.elapsed() > Duration::from_secs(30) {
                println!(
                    "  … {got} of {n} deliveries received after {:.0} s",
                    t0.elapsed().as_secs_f64()
                );
                last_print = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Commit → receipt of the deliveries of `allocations`: prints a table row per channel
/// and both; returns (deliveries received, first commit, last receipt).
fn latency_report(
    label: &str,
    rows: &[DeliveryInfo],
    allocations: &HashSet<Uuid>,
    arrivals: &HashMap<Uuid, DateTime<Utc>>,
) -> (usize, Option<DateTime<Utc>>, Option<DateTime<Utc>>) {
    let mut by: HashMap<&str, Vec<f64>> = HashMap::new();
    let mut missing: HashMap<String, usize> = HashMap::new();
    let (mut first, mut last): (Option<DateTime<Utc>>, Option<DateTime<Utc>>) = (None, None);
    for (id, channel, alloc, created, state) in rows {
        if !allocations.contains(alloc) {
            continue;
        }
        first = Some(first.map_or(*created, |f| f.min(*created)));
        match arrivals.get(id) {
            Some(at) => {
                let s = (*at - *created).num_microseconds().unwrap_or(0) as f64 / 1e6;
                by.entry(channel.as_str()).or_default().push(s);
                by.entry("both").or_default().push(s);
                last = Some(last.map_or(*at, |l| l.max(*at)));
            }
            None => *missing.entry(format!("{channel} ({state})")).or_default() += 1,
        }
    }
    println!("| {label} | deliveries | p50 | p99 | max |\n|---|---:|---:|---:|---:|");
    for ch in ["email", "webhook", "both"] {
        let mut v = by.remove(ch).unwrap_or_default();
        let n = v.len();
        let (p50, p99, max) = percentiles(&mut v);
        println!("| {ch} | {n} | {p50:.2} s | {p99:.2} s | {max:.2} s |");
    }
    if !missing.is_empty() {
        println!("not received (state in the database): {missing:?}");
    }
    let received = rows
        .iter()
        .filter(|r| allocations.contains(&r.2) && arrivals.contains_key(&r.0))
        .count();
    (received, first, last)
}

// ---- the request path ----

/// Admission as fast as answered: each client requests a slice (admitted: the team needs
/// no approval) and releases it. Returns admissions/s.
async fn admissions(label: &str, base: &str, clients: &[(String, String)], seconds: u64) -> f64 {
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let stop = Arc::new(AtomicBool::new(false));
    let lat: Arc<Mutex<(Vec<f64>, Vec<f64>)>> = Arc::default();
    let errors: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let admitted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (token, team) in clients {
        let (c, stop, lat, errors, admitted) = (
            c.clone(),
            stop.clone(),
            lat.clone(),
            errors.clone(),
            admitted.clone(),
        );
        let (base, token, team) = (base.to_owned(), token.clone(), team.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let r = c
                    .post(format!("{base}/api/v1/allocations"))
                    .bearer_auth(&token)
                    .json(&json!({"team_id": team, "kind": SLICE}))
                    .send()
                    .await;
                let (status, v) = match r {
                    Ok(r) => (r.status().as_u16(), r.json::<Value>().await.ok()),
                    Err(e) => (0, Some(json!({"error": e.to_string()}))),
                };
                let took = t0.elapsed().as_secs_f64() * 1000.0;
                let v = v.unwrap_or(Value::Null);
                let Some(id) = v["id"].as_str().filter(|_| status == 201) else {
                    *errors
                        .lock()
                        .expect("lock")
                        .entry(format!("request: {status}"))
                        .or_default() += 1;
                    continue;
                };
                if v["state"] == "pending_approval" {
                    *errors
                        .lock()
                        .expect("lock")
                        .entry("request: needs approval".into())
                        .or_default() += 1;
                } else {
                    admitted.fetch_add(1, Ordering::Relaxed);
                    lat.lock().expect("lock").0.push(took);
                }
                let t1 = Instant::now();
                let r = c
                    .post(format!("{base}/api/v1/allocations/{id}/release"))
                    .bearer_auth(&token)
                    .send()
                    .await;
                let took = t1.elapsed().as_secs_f64() * 1000.0;
                match r {
                    Ok(r) if r.status().is_success() => lat.lock().expect("lock").1.push(took),
                    Ok(r) => {
                        *errors
                            .lock()
                            .expect("lock")
                            .entry(format!("release: {}", r.status()))
                            .or_default() += 1
                    }
                    Err(e) => {
                        *errors
                            .lock()
                            .expect("lock")
                            .entry(format!("release: {e}"))
                            .or_default() += 1
                    }
                }
            }
        }));
    }
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        let _ = t.await;
    }
    let took = t0.elapsed().as_secs_f64();
    let n = admitted.load(Ordering::SeqCst);
    let rate = n as f64 / took;
    let mut l = lat.lock().expect("lock");
    let (r50, r99, _) = percentiles(&mut l.0);
    let (x50, x99, _) = percentiles(&mut l.1);
    println!(
        "admission, {label}: {n} admitted in {took:.1} s = {rate:.1} admissions/s \
         (request p50/p99 {r50:.1}/{r99:.1} ms, release p50/p99 {x50:.1}/{x99:.1} ms), \
         errors: {:?}",
        errors.lock().expect("lock")
    );
    rate
}

/// One approval request (the event's change); the allocation's id.
async fn ask(c: &reqwest::Client, base: &str, token: &str, team: &str) -> Option<Uuid> {
    let r = c
        .post(format!("{base}/api/v1/allocations"))
        .bearer_auth(token)
        .json(&json!({"team_id": team, "kind": SLICE}))
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    let v: Value = r.json().await.ok()?;
    if status != 201 || v["state"] != "pending_approval" {
        eprintln!("approval request: {status} {v}");
        return None;
    }
    v["id"].as_str()?.parse().ok()
}

// ---- one run ----

struct Config {
    db: String,
    events: usize,
    producers: usize,
    admit_seconds: u64,
    admit_clients: usize,
    rate: usize,
    paced_seconds: u64,
    timeout: Duration,
}

async fn team_with(base: &str, admin: &str, name: &str, per_user: u32) -> String {
    let (s, v) = call(
        base,
        admin,
        Method::POST,
        "/api/v1/teams",
        json!({"name": name}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    let (s, v) = call(
        base,
        admin,
        Method::PUT,
        &format!("/api/v1/teams/{id}/quotas/H100-80GB"),
        json!({"guaranteed": 100_000, "limit": 100_000, "per_user": per_user}),
    )
    .await;
    assert!(s < 300, "quota of {name}: {s} {v}");
    id
}

async fn user_in(base: &str, admin: &str, team: &str, name: &str, role: &str) -> String {
    support::add_user(base, admin, team, name, PW, role).await;
    token_for(base, name, PW).await
}

async fn set_email(base: &str, token: &str, email: &str) {
    let (s, v) = call(
        base,
        token,
        Method::PUT,
        "/api/v1/me/notifications",
        json!({"email": email}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
}

async fn run(cfg: &Config, interval: &str) {
    println!(
        "\n## notify: {}, interval {interval}, {} events",
        cfg.db, cfg.events
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let url = if cfg.db == "postgres" {
        let admin = std::env::var("TESSERA_BENCH_PG_URL").expect("TESSERA_BENCH_PG_URL");
        tessera_core::store::Store::create_postgres_database(&admin)
            .await
            .expect("create database")
    } else {
        format!("sqlite://{}/notify.db?mode=rwc", dir.path().display())
    };
    let smtp = Smtpd::start(dir.path());
    let (hook_url, hooks) = start_receiver().await;
    let smtp_url = smtp.server.url();
    let args = [
        "--smtp-url",
        &smtp_url,
        "--webhook-allow-private",
        "--notify-interval",
        interval,
    ];
    let (port, mut server) = match std::env::var("NOTIFY_SERVER_BIN") {
        Ok(bin) => support::serve_bin(&bin, &url, PW, &args),
        Err(_) => support::serve(&url, PW, &args),
    };
    let base = format!("http://127.0.0.1:{port}");
    support::wait_ready(&base).await;
    let received = Received { smtp, hooks };

    // Team "events": its members need approval for anything; its admin has an address and
    // the team one webhook. Team "admit": room for every client, no approval.
    let admin = login(&base, "admin", PW).await;
    let events_team = team_with(&base, &admin, "events", 0).await;
    let lead = user_in(&base, &admin, &events_team, "lead", "team_admin").await;
    set_email(&base, &lead, "lead@example.org").await;
    // If the requests go on to platform admins instead, the platform admin is mailed.
    set_email(&base, &admin, "admin@example.org").await;
    verify_addresses(&url).await;
    let requester = user_in(&base, &admin, &events_team, "requester", "member").await;
    let (s, v) = call(
        &base,
        &lead,
        Method::POST,
        &format!("/api/v1/teams/{events_team}/webhooks"),
        json!({"url": hook_url, "events": []}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let admit_team = team_with(&base, &admin, "admit", 1).await;
    let mut admit_clients = Vec::new();
    for i in 0..cfg.admit_clients {
        let t = user_in(&base, &admin, &admit_team, &format!("admit-{i}"), "member").await;
        admit_clients.push((t, admit_team.clone()));
    }

    // 1. Admission with the worker idle.
    let idle = admissions("worker idle", &base, &admit_clients, cfg.admit_seconds).await;

    // 2. The burst. (Mail received before it, such as address verification, is not
    // counted.)
    let baseline = received.all().0.len();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let made: Arc<Mutex<HashSet<Uuid>>> = Arc::default();
    let next = Arc::new(AtomicUsize::new(0));
    let t_burst = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..cfg.producers {
        let (c, made, next, base, token, team) = (
            c.clone(),
            made.clone(),
            next.clone(),
            base.clone(),
            requester.clone(),
            events_team.clone(),
        );
        let n = cfg.events;
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::SeqCst) < n {
                if let Some(id) = ask(&c, &base, &token, &team).await {
                    made.lock().expect("lock").insert(id);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let burst = made.lock().expect("lock").clone();
    let burst_took = t_burst.elapsed().as_secs_f64();
    println!(
        "burst: {} events committed in {burst_took:.1} s ({:.0} approval requests/s); \
         {} deliveries received meanwhile",
        burst.len(),
        burst.len() as f64 / burst_took,
        received.all().0.len() - baseline
    );

    // 3. Admission while the worker delivers.
    let before = received.all().0.len();
    let busy = admissions("while delivering", &base, &admit_clients, cfg.admit_seconds).await;
    let during = received.all().0.len() - before;
    println!(
        "  deliveries received during that window: {during} ({:.1}/s)",
        during as f64 / cfg.admit_seconds as f64
    );

    // 4. Every delivery of the burst.
    let expected = 2 * burst.len();
    let got = received.wait_for(baseline + expected, cfg.timeout).await - baseline;
    let rows = deliveries(&url).await;
    let (arrivals, repeats) = received.all();
    println!(
        "burst delivered: {got} of {expected} expected deliveries received \
         ({} of its delivery rows in the database), {repeats} repeated",
        rows.iter().filter(|r| burst.contains(&r.2)).count()
    );
    let (n, first, last) = latency_report("burst: commit → receipt", &rows, &burst, &arrivals);
    if let (Some(f), Some(l)) = (first, last) {
        let span = (l - f).num_milliseconds() as f64 / 1000.0;
        println!(
            "burst throughput: {n} deliveries from the first commit to the last receipt in \
             {span:.1} s = {:.1} deliveries/s ({:.1} events/s)",
            n as f64 / span,
            n as f64 / 2.0 / span
        );
    }

    // 5. Admission with the worker idle again.
    let after = admissions(
        "after waiting for delivery (idle if all arrived)",
        &base,
        &admit_clients,
        cfg.admit_seconds,
    )
    .await;
    println!(
        "admission while delivering vs idle before: {:+.1} %; vs idle after: {:+.1} %",
        (busy / idle - 1.0) * 100.0,
        (busy / after - 1.0) * 100.0
    );

    // 6. Paced events.
    if cfg.rate > 0 && cfg.paced_seconds > 0 {
        let paced: Arc<Mutex<HashSet<Uuid>>> = Arc::default();
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / cfg.rate as f64));
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        while t0.elapsed() < Duration::from_secs(cfg.paced_seconds) {
            tick.tick().await;
            let (c, paced, base, token, team) = (
                c.clone(),
                paced.clone(),
                base.clone(),
                requester.clone(),
                events_team.clone(),
            );
            tasks.push(tokio::spawn(async move {
                if let Some(id) = ask(&c, &base, &token, &team).await {
                    paced.lock().expect("lock").insert(id);
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        let paced = paced.lock().expect("lock").clone();
        let got = received
            .wait_for(
                baseline + expected + 2 * paced.len(),
                Duration::from_secs(120),
            )
            .await
            - baseline;
        println!(
            "paced: {} events at {} events/s for {} s; {} of {} deliveries received",
            paced.len(),
            cfg.rate,
            cfg.paced_seconds,
            got - expected.min(got),
            2 * paced.len()
        );
        let rows = deliveries(&url).await;
        let (arrivals, _) = received.all();
        latency_report("paced: commit → receipt", &rows, &paced, &arrivals);
    }
    let _ = server.start_kill();
    let _ = server.wait().await;
}

#[tokio::main]
async fn main() {
    let cfg = Config {
        db: std::env::var("NOTIFY_DB").unwrap_or_else(|_| "sqlite".into()),
        events: env_usize("NOTIFY_EVENTS", 10_000),
        producers: env_usize("NOTIFY_PRODUCERS", 8),
        admit_seconds: env_usize("NOTIFY_ADMIT_SECONDS", 20) as u64,
        admit_clients: env_usize("NOTIFY_ADMIT_CLIENTS", 4),
        rate: env_usize("NOTIFY_RATE", 20),
        paced_seconds: env_usize("NOTIFY_PACED_SECONDS", 30) as u64,
        timeout: Duration::from_secs(env_usize("NOTIFY_TIMEOUT", 1200) as u64),
    };
    let intervals = std::env::var("NOTIFY_INTERVALS").unwrap_or_else(|_| "2s".into());
    for interval in intervals
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        run(&cfg, interval).await;
    }
}
