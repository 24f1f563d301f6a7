//! `tessera node list`: the GPU nodes, decoded into [`NodeView`]. Draining a node is not
//! in the REST API yet (issue 37), so neither is `node drain`.

use super::{Client, R, Remote, Tabular, opt, print};
use clap::Subcommand;
use tessera_domain::cluster::NodeView;
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
}

impl Tabular for NodeView {
    const HEADER: &'static [&'static str] = &[
        "id",
        "hostname",
        "online",
        "revoked",
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
            models.join(" "),
            self.agent_version.clone(),
            opt(self.last_heartbeat_at.map(|t| t.to_rfc3339())),
        ]
    }
}

pub async fn node(remote: &Remote, cmd: NodeCommand) -> R<i32> {
    let c = Client::new(remote)?;
    let NodeCommand::List { limit, offset } = cmd;
    let page: Page<NodeView> = c
        .get(&format!("/api/v1/nodes?limit={limit}&offset={offset}"))
        .await?;
    print(c.output, &page, &page.items, "no nodes yet")
}
