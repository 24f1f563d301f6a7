//! `tessera node list|drain|undrain`: the GPU nodes, decoded into [`NodeView`]; draining
//! (platform admins) takes a node or one GPU out of placement by a deadline; `node spares`
//! lists and (platform admins) sets the hot spares kept per GPU model.

use super::{CliError, Client, R, Remote, Tabular, encode, opt, print};
use clap::Subcommand;
use tessera_domain::cluster::NodeView;
use tessera_domain::spares::SpareView;
use tessera_domain::tenancy::Page;

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// The GPU nodes and their GPUs.
    List {
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[arg(long, default_value_t = 0)]
        offset: u32,
    },
    /// Drain a node (platform admins): nothing new is placed there; running work is warned
    /// now and moved off at the deadline (jobs are queued again elsewhere).
    Drain {
        /// The node's id or hostname.
        node: String,
        /// Minutes until work is moved off (default 30).
        #[arg(long = "in", value_name = "MINUTES")]
        minutes: Option<i64>,
        /// Shown to the owners of the work it moves.
        #[arg(long, default_value = "")]
        reason: String,
        /// Drain only this GPU (`GPU-…`).
        #[arg(long)]
        gpu: Option<String>,
    },
    /// Put a node in a group, a rack or switch (platform admins): a multi-node job stays
    /// inside one group when one can hold it. Without GROUP, the node leaves its group.
    Group {
        /// The node's id or hostname.
        node: String,
        group: Option<String>,
    },
    /// End a node's drain (platform admins).
    Undrain {
        /// The node's id or hostname.
        node: String,
        /// End only this GPU's drain.
        #[arg(long)]
        gpu: Option<String>,
    },
    /// Hot spares per GPU model: `list` (default), `set`, `clear` (platform admins).
    Spares {
        #[command(subcommand)]
        command: Option<SpareCommand>,
    },
}

#[derive(Debug, Subcommand)]
pub enum SpareCommand {
    /// Each model's rule and the GPUs kept idle as spares now.
    List,
    /// Keep `--gpus N` GPUs, or `--percent P` (0–50) of the model's in-service GPUs, idle
    /// as hot spares (platform admins).
    Set {
        /// A GPU model of the catalog (`H100-80GB`).
        model: String,
        #[arg(long, conflicts_with = "percent")]
        gpus: Option<i64>,
        #[arg(long)]
        percent: Option<i64>,
    },
    /// Keep no spares of the model any more (platform admins).
    Clear { model: String },
}

impl Tabular for SpareView {
    const HEADER: &'static [&'static str] = &["model", "rule", "wanted", "spare_gpus"];
    fn cells(&self) -> Vec<String> {
        let rule = match (self.gpus, self.percent) {
            (Some(n), _) => format!("{n} GPUs"),
            (_, Some(p)) => format!("{p} %"),
            _ => String::new(),
        };
        vec![
            self.model.clone(),
            rule,
            self.wanted.to_string(),
            self.spare_gpus.join(" "),
        ]
    }
}

impl Tabular for NodeView {
    const HEADER: &'static [&'static str] = &[
        "id",
        "hostname",
        "online",
        "revoked",
        "drain",
        "gpus",
        "agent_version",
        "last_heartbeat_at",
    ];
    fn cells(&self) -> Vec<String> {
        let models: Vec<String> = self
            .gpus
            .iter()
            .map(|g| g.model.clone().unwrap_or_else(|| g.name.clone()))
            .collect();
        vec![
            self.id.to_string(),
            self.hostname.clone(),
            self.online.to_string(),
            self.revoked.to_string(),
            opt(self.drain.as_ref().map(|d| {
                let state = serde_json::to_value(d.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                format!("{state} until {}", d.deadline.to_rfc3339())
            })),
            models.join(" "),
            self.agent_version.clone(),
            opt(self.last_heartbeat_at.map(|t| t.to_rfc3339())),
        ]
    }
}

pub async fn node(remote: &Remote, cmd: NodeCommand) -> R<i32> {
    let c = Client::new(remote)?;
    match cmd {
        NodeCommand::List { limit, offset } => {
            let page: Page<NodeView> = c
                .get(&format!("/api/v1/nodes?limit={limit}&offset={offset}"))
                .await?;
            print(c.output, &page, &page.items, "no nodes yet")
        }
        NodeCommand::Drain {
            node,
            minutes,
            reason,
            gpu,
        } => {
            let id = node_id(&c, &node).await?;
            let body = serde_json::json!({"minutes": minutes, "reason": reason, "gpu": gpu});
            let v: NodeView = c
                .call(
                    reqwest::Method::POST,
                    &format!("/api/v1/nodes/{}/drain", encode(&id)),
                    Some(body),
                )
                .await?;
            print(c.output, &v, std::slice::from_ref(&v), "")
        }
        NodeCommand::Group { node, group } => {
            let id = node_id(&c, &node).await?;
            let v: NodeView = c
                .call(
                    reqwest::Method::PUT,
                    &format!("/api/v1/nodes/{}/group", encode(&id)),
                    Some(serde_json::json!({ "group": group })),
                )
                .await?;
            print(c.output, &v, std::slice::from_ref(&v), "")
        }
        NodeCommand::Undrain { node, gpu } => {
            let id = node_id(&c, &node).await?;
            let query = gpu
                .map(|g| format!("?gpu={}", encode(&g)))
                .unwrap_or_default();
            let v: NodeView = c
                .call(
                    reqwest::Method::DELETE,
                    &format!("/api/v1/nodes/{}/drain{query}", encode(&id)),
                    None,
                )
                .await?;
            print(c.output, &v, std::slice::from_ref(&v), "")
        }
        NodeCommand::Spares { command } => {
            let spares: Vec<SpareView> = match command.unwrap_or(SpareCommand::List) {
                SpareCommand::List => c.get("/api/v1/spares").await?,
                SpareCommand::Set {
                    model,
                    gpus,
                    percent,
                } => {
                    let body = serde_json::json!({"gpus": gpus, "percent": percent});
                    c.call(
                        reqwest::Method::PUT,
                        &format!("/api/v1/spares/{}", encode(&model)),
                        Some(body),
                    )
                    .await?
                }
                SpareCommand::Clear { model } => {
                    c.send(
                        reqwest::Method::DELETE,
                        &format!("/api/v1/spares/{}", encode(&model)),
                        None,
                    )
                    .await?;
                    c.get("/api/v1/spares").await?
                }
            };
            print(c.output, &spares, &spares, "no hot spares kept")
        }
    }
}

/// A node's id from its id or hostname.
async fn node_id(c: &Client, node: &str) -> R<String> {
    if uuid::Uuid::parse_str(node).is_ok() {
        return Ok(node.to_owned());
    }
    let mut offset: u32 = 0;
    loop {
        let page: Page<NodeView> = c
            .get(&format!("/api/v1/nodes?limit=200&offset={offset}"))
            .await?;
        if let Some(n) = page.items.iter().find(|n| n.hostname == node) {
            return Ok(n.id.to_string());
        }
        offset += 200;
        if page.items.is_empty() || u64::from(offset) >= page.total {
            return Err(CliError {
                code: super::exit::NOT_FOUND,
                message: format!("no node named {node}"),
            });
        }
    }
}
