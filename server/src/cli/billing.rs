//! `tessera usage` and `tessera export chargeback`: usage decoded into [`UsageReport`],
//! and the chargeback CSV streamed as the server writes it.

use super::{CliError, Client, Output, R, Remote, Tabular, encode, print, unreachable};
use chrono::{Datelike, NaiveDate};
use clap::{Args, Subcommand};
use std::io::Write;
use tessera_domain::billing::{UsageReport, UsageRow};

#[derive(Debug, Clone, Args)]
pub struct UsageArgs {
    /// A team's id; default: every team you may see.
    #[arg(long)]
    team: Option<String>,
    /// First day, `YYYY-MM-DD` (UTC); default the first of this month.
    #[arg(long)]
    from: Option<String>,
    /// Last day, inclusive; default today.
    #[arg(long)]
    to: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ExportCommand {
    /// The chargeback CSV for a month (team admins: their team; platform admins: every
    /// team or one), byte for byte as `GET /api/v1/exports/chargeback.csv` sends it.
    Chargeback {
        /// `YYYY-MM` (UTC).
        #[arg(long)]
        month: String,
        /// One team's id.
        #[arg(long)]
        team: Option<String>,
    },
}

/// The period query for `from`..=`to` and maybe one team.
fn period(team: Option<&str>, from: Option<&str>, to: Option<&str>) -> String {
    let mut q = Vec::new();
    for (k, v) in [("team", team), ("from", from), ("to", to)] {
        if let Some(v) = v {
            q.push(format!("{k}={}", encode(v)));
        }
    }
    if q.is_empty() {
        String::new()
    } else {
        format!("?{}", q.join("&"))
    }
}

/// `YYYY-MM` → its first and last day.
fn month_days(month: &str) -> Option<(NaiveDate, NaiveDate)> {
    let (y, m) = month.split_once('-')?;
    if y.len() != 4 || m.len() != 2 {
        return None;
    }
    let first = NaiveDate::from_ymd_opt(y.parse().ok()?, m.parse().ok()?, 1)?;
    let next = if first.month() == 12 {
        NaiveDate::from_ymd_opt(first.year() + 1, 1, 1)?
    } else {
        NaiveDate::from_ymd_opt(first.year(), first.month() + 1, 1)?
    };
    Some((first, next.pred_opt()?))
}

/// A usage line with the group it belongs to (`team`, `kind`, `user`, `day`, `total`).
struct Line<'a>(&'a str, &'a UsageRow);

/// Milli-GPU-seconds as GPU-hours with two decimals.
fn gpu_hours(ms: i64) -> String {
    let centi = ms / 36_000;
    format!("{}.{:02}", centi / 100, (centi % 100).abs())
}

fn money(minor: i64) -> String {
    let sign = if minor < 0 { "-" } else { "" };
    format!("{sign}{}.{:02}", minor.abs() / 100, minor.abs() % 100)
}

impl Tabular for Line<'_> {
    const HEADER: &'static [&'static str] = &[
        "group",
        "key",
        "label",
        "gpu_hours",
        "active_gpu_hours",
        "efficiency_pct",
        "cost",
    ];
    fn cells(&self) -> Vec<String> {
        let t = &self.1.totals;
        vec![
            self.0.to_owned(),
            self.1.key.clone(),
            self.1.label.clone(),
            gpu_hours(t.gpu_ms),
            gpu_hours(t.active_gpu_ms),
            t.efficiency_pct().to_string(),
            money(t.cost_minor),
        ]
    }
}

pub async fn usage(remote: &Remote, args: UsageArgs) -> R<i32> {
    let c = Client::new(remote)?;
    let q = period(
        args.team.as_deref(),
        args.from.as_deref(),
        args.to.as_deref(),
    );
    let report: UsageReport = c.get(&format!("/api/v1/usage{q}")).await?;
    let total = UsageRow {
        key: String::new(),
        label: format!(
            "{} to {} ({})",
            report.from.date_naive(),
            report.to.date_naive(),
            report.currency
        ),
        totals: report.total.clone(),
    };
    let mut lines = vec![Line("total", &total)];
    // A table for people leaves the days out; CSV has every line of the report.
    let groups: [(&str, &[UsageRow]); 4] = [
        ("team", &report.teams),
        ("kind", &report.kinds),
        ("user", &report.users),
        ("day", &report.days),
    ];
    for (group, rows) in groups {
        if group == "day" && c.output == Output::Table {
            continue;
        }
        lines.extend(rows.iter().map(|r| Line(group, r)));
    }
    print(c.output, &report, &lines, "")
}

pub async fn export(remote: &Remote, cmd: ExportCommand) -> R<i32> {
    let c = Client::new(remote)?;
    let ExportCommand::Chargeback { month, team } = cmd;
    let (from, to) = month_days(&month)
        .ok_or_else(|| CliError::usage(format!("--month {month}: write YYYY-MM, e.g. 2026-11")))?;
    let q = period(
        team.as_deref(),
        Some(&from.to_string()),
        Some(&to.to_string()),
    );
    let mut resp = c
        .send(
            reqwest::Method::GET,
            &format!("/api/v1/exports/chargeback.csv{q}"),
            None,
        )
        .await?;
    let mut out = std::io::stdout().lock();
    let broken = |e: std::io::Error| CliError::usage(format!("writing the CSV: {e}"));
    // A body cut short (the server failed midway) is an error, never a silent partial file.
    while let Some(chunk) = resp.chunk().await.map_err(|e| CliError {
        code: super::exit::SERVER_FAILED,
        message: format!("the export broke off: {}", unreachable(e).message),
    })? {
        out.write_all(&chunk).map_err(broken)?;
    }
    out.flush().map_err(broken)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::{gpu_hours, money, month_days};

    #[test]
    fn a_month_runs_from_its_first_to_its_last_day() {
        let days = |m| month_days(m).map(|(a, b)| (a.to_string(), b.to_string()));
        assert_eq!(
            days("2026-11"),
            Some(("2026-11-01".into(), "2026-11-30".into()))
        );
        assert_eq!(
            days("2026-12"),
            Some(("2026-12-01".into(), "2026-12-31".into()))
        );
        assert_eq!(
            days("2028-02"),
            Some(("2028-02-01".into(), "2028-02-29".into()))
        );
        for bad in ["2026-13", "2026-1", "26-11", "november", ""] {
            assert_eq!(days(bad), None, "{bad}");
        }
    }

    #[test]
    fn hours_and_money_print_two_decimals() {
        assert_eq!(gpu_hours(5_400_000), "1.50");
        assert_eq!(gpu_hours(0), "0.00");
        assert_eq!(money(12_345), "123.45");
        assert_eq!(money(-5), "-0.05");
    }
}
