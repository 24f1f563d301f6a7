//! `tessera booking create|list|cancel`: capacity a team holds for a future window
//! (docs/operations.md), decoded into [`BookingView`]. Team admins and platform admins
//! book and cancel; everyone reads the calendar, where another team's booking shows only
//! that the capacity is taken.

use super::{CliError, Client, R, Remote, Tabular, encode, opt, print};
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use clap::Subcommand;
use tessera_domain::booking::BookingView;
use tessera_domain::tenancy::{Page, TeamView};

#[derive(Debug, Subcommand)]
pub enum BookingCommand {
    /// Book capacity for a team (team admins, platform admins): admitted now against the
    /// team's quota for the window and the capacity other bookings hold, or refused with
    /// the reason.
    Create {
        /// The team's id or name (default: your only team).
        #[arg(long)]
        team: Option<String>,
        /// `H100-80GB:whole` or a MIG kind such as `H100-80GB:1g.10gb`.
        #[arg(long)]
        kind: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// Start, UTC: RFC 3339 or `YYYY-MM-DDTHH:MM`.
        #[arg(long, value_name = "TIME")]
        from: String,
        /// End, UTC, same forms.
        #[arg(long, value_name = "TIME")]
        to: String,
        /// What it is for.
        #[arg(long, default_value = "")]
        purpose: String,
    },
    /// The calendar: bookings overlapping a range (default: the next 7 days).
    List {
        /// Start of the range, UTC: RFC 3339, `YYYY-MM-DDTHH:MM` or `YYYY-MM-DD` (default now).
        #[arg(long, value_name = "TIME")]
        from: Option<String>,
        /// End of the range, same forms (default 7 days after the start; at most 62).
        #[arg(long, value_name = "TIME")]
        to: Option<String>,
        /// Only this GPU model's (`H100-80GB`).
        #[arg(long)]
        model: Option<String>,
    },
    /// Cancel a booking (team admins of its team, platform admins): the capacity is free
    /// again, and its allocation, if it started, released.
    Cancel {
        /// The booking's id.
        id: String,
    },
}

impl Tabular for BookingView {
    const HEADER: &'static [&'static str] = &[
        "id",
        "team",
        "kind",
        "count",
        "starts_at",
        "ends_at",
        "state",
        "purpose",
    ];
    fn cells(&self) -> Vec<String> {
        vec![
            opt(self.id),
            self.team_name
                .clone()
                .unwrap_or_else(|| "(another team)".to_owned()),
            self.kind.clone(),
            self.count.to_string(),
            self.starts_at.to_rfc3339(),
            self.ends_at.to_rfc3339(),
            self.state.clone(),
            self.purpose.clone(),
        ]
    }
}

/// A time given on the command line, UTC: RFC 3339, `YYYY-MM-DDTHH:MM[:SS]` or a date
/// (its midnight).
fn parse_time(flag: &str, raw: &str) -> R<DateTime<Utc>> {
    let raw = raw.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
        return Ok(t.with_timezone(&Utc));
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(raw, f).ok())
        .or_else(|| {
            NaiveDate::parse_from_str(raw, "%Y-%m-%d")
                .ok()
                .map(|d| d.and_time(chrono::NaiveTime::MIN))
        })
        .map(|t| t.and_utc())
        .ok_or_else(|| {
            CliError::usage(format!(
                "--{flag}: not a time: {raw} (use 2026-05-01T14:00, UTC, or RFC 3339)"
            ))
        })
}

/// A team's id from its id or name; the caller's only team when absent.
pub(super) async fn team_id(c: &Client, team: Option<String>) -> R<String> {
    let Some(team) = team else {
        return c.team_or_only(None).await;
    };
    if uuid::Uuid::parse_str(&team).is_ok() {
        return Ok(team);
    }
    let page: Page<TeamView> = c.get("/api/v1/teams?limit=200").await?;
    page.items
        .iter()
        .find(|t| t.name == team)
        .map(|t| t.id.to_string())
        .ok_or_else(|| CliError {
            code: super::exit::NOT_FOUND,
            message: format!("no team named {team} that you may see"),
        })
}

pub async fn booking(remote: &Remote, cmd: BookingCommand) -> R<i32> {
    let c = Client::new(remote)?;
    match cmd {
        BookingCommand::Create {
            team,
            kind,
            count,
            from,
            to,
            purpose,
        } => {
            let team_id = team_id(&c, team).await?;
            let body = serde_json::json!({"team_id": team_id, "kind": kind, "count": count,
                "starts_at": from, "ends_at": to, "purpose": purpose});
            let v: BookingView = c
                .call(reqwest::Method::POST, "/api/v1/bookings", Some(body))
                .await?;
            print(c.output, &v, std::slice::from_ref(&v), "")
        }
        BookingCommand::List { from, to, model } => {
            let from = from.map(|f| parse_time("from", &f)).transpose()?;
            let to = to.map(|t| parse_time("to", &t)).transpose()?;
            let mut query: Vec<String> = Vec::new();
            if let Some(f) = from {
                query.push(format!("from={}", encode(&f.to_rfc3339())));
            }
            if let Some(t) = to {
                query.push(format!("to={}", encode(&t.to_rfc3339())));
            }
            if let Some(m) = model {
                query.push(format!("model={}", encode(&m)));
            }
            let path = if query.is_empty() {
                "/api/v1/bookings".to_owned()
            } else {
                format!("/api/v1/bookings?{}", query.join("&"))
            };
            let items: Vec<BookingView> = c.get(&path).await?;
            print(c.output, &items, &items, "nothing booked in that range")
        }
        BookingCommand::Cancel { id } => {
            let v: BookingView = c
                .call(
                    reqwest::Method::POST,
                    &format!("/api/v1/bookings/{}/cancel", encode(&id)),
                    None,
                )
                .await?;
            print(c.output, &v, std::slice::from_ref(&v), "")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_time;

    #[test]
    fn times_are_read_in_utc_in_the_forms_the_server_takes() {
        let want = |s: &str| {
            chrono::DateTime::parse_from_rfc3339(s)
                .expect("a time")
                .with_timezone(&chrono::Utc)
        };
        let ok = |raw: &str| parse_time("from", raw).ok();
        assert_eq!(ok("2026-05-01T14:00"), Some(want("2026-05-01T14:00:00Z")));
        assert_eq!(
            ok("2026-05-01T16:00:00+02:00"),
            Some(want("2026-05-01T14:00:00Z"))
        );
        assert_eq!(ok("2026-05-01"), Some(want("2026-05-01T00:00:00Z")));
        let err = parse_time("to", "tomorrow").expect_err("refused");
        assert!(err.message.starts_with("--to: "), "{}", err.message);
    }
}
