//! Metering and the chargeback export through the service layer, on SQLite and (with
//! `TESSERA_BENCH_PG_URL`) PostgreSQL.
//!
//! 1,000 teams each ran one whole H100 for the 30 days (720 hours) before the last full
//! hour: one metering pass turns that into 720,000 metered allocation-hours, each with two
//! ledger entries (allocation-hours/s); then the chargeback CSV for the period is streamed
//! (720,000 rows, read from the ledger in pages) and its BilledCost total checked against
//! the ledger, with the time and the resident memory the export added at its peak.
//! `TEAMS` and `DAYS` shrink it. Run: `cargo bench -p tessera-core --bench billing`.
// A benchmark: a setup that fails should stop it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Tests and benches stand outside the use cases: they read the wall clock to set up.
#![allow(clippy::disallowed_methods)]

mod support;

use chrono::{Duration as Days, TimeZone, Utc};
use std::time::Instant;
use support::{Bench, Scratch, env_or, err};
use tessera_core::services::billing::UsageQuery;
use tessera_core::store::{AllocationRow, Change, RateRow, Store, Transition};
use tessera_domain::alloc::AllocState;
use tessera_domain::ids::{TeamId, UserId};

use uuid::Uuid;

fn main() -> anyhow::Result<()> {
    let rt = support::runtime()?;
    let scratch = Scratch::new("billing")?;
    for (name, url) in rt.block_on(support::targets(&scratch, "bench"))? {
        rt.block_on(run(name, &url))?;
    }
    Ok(())
}

async fn run(name: &str, url: &str) -> anyhow::Result<()> {
    let teams = env_or("TEAMS", 1000);
    let days = env_or("DAYS", 30);
    let b = Bench::open(url).await?;
    let (store, services, p) = (&b.store, &b.services, &b.admin);
    let admin_id = p.user_id().0;
    let now = Utc::now();
    let last_hour = Utc
        .timestamp_opt(now.timestamp() - now.timestamp().rem_euclid(3600), 0)
        .single()
        .ok_or_else(|| anyhow::anyhow!("time"))?;
    let start = last_hour - Days::days(days);
    store
        .set_rate(
            &RateRow {
                id: Uuid::new_v4(),
                kind: "H100-80GB:whole".parse()?,
                model: "H100-80GB".into(),
                price_minor_per_hour: 700,
                preemptible_discount_pct: 0,
                high_premium_pct: 0,
                effective_from: start - Days::days(1),
                created_at: now,
                created_by: None,
            },
            UserId(admin_id),
            true,
        )
        .await?;
    let t = Instant::now();
    for i in 0..teams {
        let team = services
            .tenancy
            .create_team(p, &format!("bench-{i:04}"))
            .await
            .map_err(err)?;
        seed(store, team.id.0, admin_id, start, last_hour).await?;
    }
    println!(
        "{name}: seeded {teams} teams × {days} days in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    let report = services
        .billing
        .meter(&b.system, now, None)
        .await
        .map_err(err)?;
    let meter = t.elapsed();
    let hours = teams * days * 24;
    anyhow::ensure!(
        i64::from(report.hours) == hours,
        "metered {report:?}, expected {hours}"
    );
    let (balance, entries) = store.ledger_balance().await?;
    anyhow::ensure!(
        balance == 0 && entries == 2 * hours,
        "ledger {balance} / {entries}"
    );

    // The ledger pages alone, without the CSV: how much of the export is reading rows.
    let t = Instant::now();
    let (mut cursor, mut fetched) = (None, 0usize);
    loop {
        let page = store
            .charges_after(None, start, last_hour + Days::hours(1), cursor, 5_000)
            .await?;
        let Some(last) = page.last() else { break };
        cursor = Some((last.hour_start, last.id));
        fetched += page.len();
    }
    println!(
        "{name}: reading the {fetched} ledger rows alone (pages of 5,000): {:.2} s",
        t.elapsed().as_secs_f64()
    );

    let rss_before = rss_kib();
    let mut peak = rss_before;
    let t = Instant::now();
    let query = UsageQuery {
        team: None,
        from: Some(start.date_naive()),
        to: Some(last_hour.date_naive()),
    };
    let mut csv = services.billing.chargeback(p, &query).await.map_err(err)?;
    let (mut bytes, mut rows, mut total) = (0usize, 0i64, 0i64);
    let mut billed_col = None;
    while let Some(chunk) = csv.next_chunk().await.map_err(err)? {
        bytes += chunk.len();
        for line in chunk.lines() {
            let fields: Vec<&str> = line.split(',').collect();
            match billed_col {
                None => billed_col = fields.iter().position(|f| *f == "BilledCost"),
                Some(c) => {
                    rows += 1;
                    total += fields[c].replace('.', "").parse::<i64>()?;
                }
            }
        }
        peak = peak.max(rss_kib());
    }
    let export = t.elapsed();
    let ledger = store
        .team_charges(None, start, last_hour + Days::hours(1))
        .await?
        .iter()
        .map(|r| r.1)
        .sum::<i64>();
    anyhow::ensure!(rows == hours, "exported {rows} rows");
    anyhow::ensure!(total == ledger, "CSV total {total} ≠ ledger {ledger}");
    println!(
        "{name}: metering {hours} allocation-hours in {:.1} s ({:.0} allocation-hours/s); \
         chargeback CSV {rows} rows, {:.0} MB in {:.2} s ({:.0} rows/s), total = ledger = {}.{:02}; \
         resident memory {} MiB before the export, peak {} MiB during it (+{} MiB)",
        meter.as_secs_f64(),
        hours as f64 / meter.as_secs_f64(),
        bytes as f64 / 1e6,
        export.as_secs_f64(),
        rows as f64 / export.as_secs_f64(),
        total / 100,
        total % 100,
        rss_before / 1024,
        peak / 1024,
        (peak - rss_before) / 1024,
    );
    Ok(())
}

/// One whole H100 active over `[from, to)`, ended.
async fn seed(
    store: &Store,
    team: Uuid,
    user: Uuid,
    from: chrono::DateTime<Utc>,
    to: chrono::DateTime<Utc>,
) -> anyhow::Result<()> {
    let row = AllocationRow::queued(
        TeamId(team),
        UserId(user),
        &"H100-80GB:whole".parse()?,
        (1, 7),
        from,
    );
    let id = row.id;
    store.insert_allocation(&row, "bench").await?;
    for (f, t, at) in [
        (AllocState::Queued, AllocState::Placing, from),
        (AllocState::Placing, AllocState::Active, from),
        (AllocState::Active, AllocState::Releasing, to),
        (AllocState::Releasing, AllocState::Ended, to),
    ] {
        let change = Change {
            active_at: (t == AllocState::Active).then_some(at),
            devices: (t == AllocState::Active).then(|| {
                format!(
                    r#"[{{"node_id":"{}","hostname":"bench","gpu_uuid":"GPU-{id}"}}]"#,
                    Uuid::nil()
                )
            }),
            ..Change::default()
        };
        store
            .transition(&Transition::plain(id, (f, t), at, change))
            .await?;
    }
    Ok(())
}

/// Resident memory of this process, KiB (Linux; 0 elsewhere).
fn rss_kib() -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
