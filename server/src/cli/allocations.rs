//! `tessera alloc …` and `tessera quota …`: allocations and team quotas, decoded into
//! [`AllocationView`] and [`QuotaView`].

use super::{CliError, Client, R, Remote, Tabular, encode, opt, print, word};
use clap::{Args, Subcommand};
use serde_json::json;
use tessera_domain::alloc::{AllocationView, NewAllocation, QuotaView};
use tessera_domain::tenancy::Page;

#[derive(Debug, Subcommand)]
pub enum AllocCommand {
    /// Requests GPUs: `tessera alloc request --kind H100-80GB:1g.10gb --hours 4`.
    Request(RequestArgs),
    /// Allocations you may see, newest first.
    List(AllocListArgs),
    /// One allocation, with its history and, while pending, why it waits.
    Show { id: String },
    /// Releases an active allocation or cancels a pending one.
    Release { id: String },
    /// Extends an active allocation.
    Extend {
        id: String,
        /// Minutes to add to its end time.
        #[arg(long)]
        minutes: u32,
    },
}

#[derive(Debug, Clone, Args)]
pub struct RequestArgs {
    /// `H100-80GB:1g.10gb`, `H100-80GB:whole` or `H100-80GB:share:250`.
    #[arg(long)]
    kind: String,
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// The team that pays (its id); default: your only team.
    #[arg(long)]
    team: Option<String>,
    /// How long it runs once started, in minutes; default: the portal's policy.
    #[arg(long, conflicts_with = "hours")]
    minutes: Option<u32>,
    /// How long it runs once started, in hours.
    #[arg(long)]
    hours: Option<u32>,
    /// Earliest start, RFC 3339 or `YYYY-MM-DDTHH:MM` (UTC); default: as soon as possible.
    #[arg(long)]
    starts_at: Option<String>,
    /// `high`, `normal` or `preemptible`.
    #[arg(long)]
    priority: Option<String>,
    /// What it is for.
    #[arg(long, default_value = "")]
    purpose: String,
}

#[derive(Debug, Clone, Args)]
pub struct AllocListArgs {
    /// Only this team's.
    #[arg(long)]
    team: Option<String>,
    /// A state (`active`, `queued`, …) or `pending`, `current`, `ended`, `all`.
    #[arg(long)]
    state: Option<String>,
    /// Only your own.
    #[arg(long)]
    mine: bool,
    #[arg(long, default_value_t = 50)]
    limit: u32,
    #[arg(long, default_value_t = 0)]
    offset: u32,
}

impl Tabular for AllocationView {
    const HEADER: &'static [&'static str] = &[
        "id", "state", "kind", "count", "team", "user", "priority", "ends_at", "waiting",
    ];
    fn cells(&self) -> Vec<String> {
        vec![
            self.id.to_string(),
            self.state.to_string(),
            self.kind.clone(),
            self.count.to_string(),
            self.team_name.clone(),
            self.username.clone(),
            self.priority.to_string(),
            opt(self.ends_at.map(|t| t.to_rfc3339())),
            self.pending
                .as_ref()
                .map(|p| p.reason.clone())
                .unwrap_or_default(),
        ]
    }
}

impl Tabular for QuotaView {
    const HEADER: &'static [&'static str] = &[
        "team",
        "model",
        "guaranteed",
        "limit",
        "per_user",
        "used",
        "borrowed",
        "overridden",
    ];
    fn cells(&self) -> Vec<String> {
        vec![
            self.team_name.clone(),
            self.model.clone(),
            self.guaranteed.to_string(),
            self.limit.to_string(),
            self.per_user.to_string(),
            self.used.to_string(),
            self.borrowed.to_string(),
            self.overridden.to_string(),
        ]
    }
}

fn one(c: &Client, v: &AllocationView) -> R<i32> {
    print(c.output, v, std::slice::from_ref(v), "")
}

pub async fn alloc(remote: &Remote, cmd: AllocCommand) -> R<i32> {
    let c = Client::new(remote)?;
    match cmd {
        AllocCommand::Request(a) => {
            let team = c.team_or_only(a.team).await?;
            let minutes = a.minutes.or(a.hours.map(|h| h.saturating_mul(60)));
            let body = NewAllocation {
                team_id: team,
                kind: a.kind,
                count: a.count,
                duration_minutes: minutes,
                starts_at: a.starts_at,
                priority: a.priority,
                purpose: a.purpose,
                needs_cuda: None,
                nodes: None,
            };
            let body = serde_json::to_value(&body).map_err(|e| CliError::usage(e.to_string()))?;
            let v: AllocationView = c
                .call(reqwest::Method::POST, "/api/v1/allocations", Some(body))
                .await?;
            one(&c, &v)
        }
        AllocCommand::List(a) => {
            let mut path = format!(
                "/api/v1/allocations?mine={}&limit={}&offset={}",
                a.mine, a.limit, a.offset
            );
            if let Some(t) = a.team {
                path.push_str(&format!("&team={}", encode(&t)));
            }
            if let Some(s) = a.state {
                path.push_str(&format!("&state={}", encode(&s)));
            }
            let page: Page<AllocationView> = c.get(&path).await?;
            print(c.output, &page, &page.items, "no allocations")
        }
        AllocCommand::Show { id } => {
            let v: AllocationView = c
                .get(&format!("/api/v1/allocations/{}", encode(&id)))
                .await?;
            if c.output == super::Output::Table {
                show(&v);
                return Ok(0);
            }
            one(&c, &v)
        }
        AllocCommand::Release { id } => {
            let v: AllocationView = c
                .call(
                    reqwest::Method::POST,
                    &format!("/api/v1/allocations/{}/release", encode(&id)),
                    None,
                )
                .await?;
            one(&c, &v)
        }
        AllocCommand::Extend { id, minutes } => {
            let v: AllocationView = c
                .call(
                    reqwest::Method::POST,
                    &format!("/api/v1/allocations/{}/extend", encode(&id)),
                    Some(json!({ "minutes": minutes })),
                )
                .await?;
            one(&c, &v)
        }
    }
}

/// One allocation for people: its fields, devices and history.
fn show(v: &AllocationView) {
    println!("id        {}", v.id);
    println!("state     {}", v.state);
    println!("kind      {} ({})", v.kind, v.kind_label);
    println!("count     {} ({} units)", v.count, v.units);
    println!("team      {} ({})", v.team_name, word(&v.team_id));
    println!("user      {}", v.username);
    println!("priority  {}", v.priority);
    if !v.purpose.is_empty() {
        println!("purpose   {}", v.purpose);
    }
    println!("starts    {}", opt(v.starts_at.map(|t| t.to_rfc3339())));
    println!("ends      {}", opt(v.ends_at.map(|t| t.to_rfc3339())));
    if let Some(p) = &v.pending {
        println!("waiting   {}", p.reason);
    }
    for d in &v.devices {
        println!(
            "device    {} {}{}",
            d.hostname,
            d.mig_uuid.as_deref().unwrap_or(&d.gpu_uuid),
            d.profile
                .as_deref()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default()
        );
    }
    for t in &v.history {
        println!(
            "history   {} {} by {}{}",
            t.at.to_rfc3339(),
            t.to,
            t.by.as_deref().unwrap_or("the system"),
            t.note
                .as_deref()
                .map(|n| format!(": {n}"))
                .unwrap_or_default()
        );
    }
}

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// A team's quotas and how much of each is in use.
    Show {
        /// The team's id; default: your only team.
        #[arg(long)]
        team: Option<String>,
    },
    /// Sets a team's quota on a GPU model (platform admins).
    Set {
        #[arg(long)]
        team: String,
        /// The GPU model (`H100-80GB`) or a shared line (`H100-80GB:shared`).
        #[arg(long)]
        model: String,
        /// Units always available to the team.
        #[arg(long)]
        guaranteed: u32,
        /// Most units the team may hold.
        #[arg(long)]
        limit: u32,
        /// Most units one member may hold.
        #[arg(long)]
        per_user: u32,
    },
}

pub async fn quota(remote: &Remote, cmd: QuotaCommand) -> R<i32> {
    let c = Client::new(remote)?;
    let quotas: Vec<QuotaView> = match cmd {
        QuotaCommand::Show { team } => {
            let team = c.team_or_only(team).await?;
            c.get(&format!("/api/v1/teams/{}/quotas", encode(&team)))
                .await?
        }
        QuotaCommand::Set {
            team,
            model,
            guaranteed,
            limit,
            per_user,
        } => {
            c.call(
                reqwest::Method::PUT,
                &format!("/api/v1/teams/{}/quotas/{}", encode(&team), encode(&model)),
                Some(json!({"guaranteed": guaranteed, "limit": limit, "per_user": per_user})),
            )
            .await?
        }
    };
    print(c.output, &quotas, &quotas, "no quotas")
}
