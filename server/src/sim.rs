//! The embedded default's simulated GPU nodes.
//!
//! Each simulated node is a real `tessera-agent --simulate` process that registers with a
//! join token and then speaks the same HTTP protocol as an agent on a GPU server, so a
//! newcomer sees a cluster at once and the code paths are the production ones.

use crate::AppState;
use anyhow::Context;
use std::net::SocketAddr;
use std::path::PathBuf;
use tessera_core::auth::Principal;
use tessera_core::services::authz;
use tessera_domain::mig::Catalog;
use tessera_domain::tenancy::PageRequest;
use tokio::process::{Child, Command};

/// One simulated node: a name and its GPU models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimNodeSpec {
    pub name: String,
    pub gpus: Vec<String>,
}

/// Parses `NAME=MODEL*COUNT[+MODEL*COUNT];…` (models from the MIG catalog).
pub fn parse_nodes(spec: &str) -> Result<Vec<SimNodeSpec>, String> {
    let catalog = Catalog::builtin();
    let mut out = Vec::new();
    for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, gpus) = part
            .split_once('=')
            .ok_or_else(|| format!("'{part}': expected NAME=MODEL*COUNT"))?;
        let name = name.trim();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(format!(
                "'{name}': node names use letters, digits, '-' and '_'"
            ));
        }
        let mut models = Vec::new();
        for g in gpus.split('+').map(str::trim) {
            let (model, count) = g.split_once('*').unwrap_or((g, "1"));
            let model = model.trim();
            if catalog.get(model).is_none() {
                return Err(format!("'{model}' is not a known GPU model"));
            }
            let count: usize = count
                .trim()
                .parse()
                .ok()
                .filter(|n| (1..=16).contains(n))
                .ok_or_else(|| format!("'{g}': count must be 1 to 16"))?;
            models.extend(std::iter::repeat_n(model.to_owned(), count));
        }
        out.push(SimNodeSpec {
            name: name.to_owned(),
            gpus: models,
        });
    }
    Ok(out)
}

/// Starts one agent process per simulated node; [`stop`] ends them (and their workloads),
/// and they are killed when the returned children are dropped.
pub async fn start(state: &AppState, addr: SocketAddr) -> anyhow::Result<Vec<Child>> {
    let specs = parse_nodes(&state.config.sim_nodes).map_err(anyhow::Error::msg)?;
    let bin = match &state.config.agent_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("the tessera binary has no folder")?
            .join("tessera-agent"),
    };
    if !bin.exists() {
        anyhow::bail!(
            "simulated nodes need {} (build it with `cargo xtask build`, set \
             TESSERA_AGENT_BIN, or turn them off with --no-sim)",
            bin.display()
        );
    }
    let host = if addr.ip().is_unspecified() {
        format!("127.0.0.1:{}", addr.port())
    } else {
        addr.to_string()
    };
    // Under TLS the agents check the server's certificate like any other: they trust
    // its own file (enough for a self-signed certificate that names 127.0.0.1) and
    // whatever TESSERA_AGENT_CA_FILE they inherit.
    let server = match &state.config.tls_cert {
        Some(_) => format!("https://{host}"),
        None => format!("http://{host}"),
    };
    // An inherited TESSERA_AGENT_CA_FILE wins over the server's own certificate file.
    let ca_file = state
        .config
        .tls_cert
        .as_ref()
        .filter(|_| std::env::var_os("TESSERA_AGENT_CA_FILE").is_none());
    let admin = system_principal(state).await?;
    let mut children = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let dir: PathBuf = state.config.sim_state_dir.join(&spec.name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut cmd = Command::new(&bin);
        cmd.arg("--simulate")
            .arg("--gpus")
            .arg(spec.gpus.join(","))
            .arg("--sim-seed")
            .arg((i + 1).to_string())
            .arg("--server")
            .arg(&server)
            .arg("--state-dir")
            .arg(&dir)
            .arg("--hostname")
            .arg(&spec.name)
            .arg("--manage-mig")
            .arg("--exit-with-pid")
            .arg(std::process::id().to_string())
            .args([
                "--heartbeat-interval-s",
                "10",
                "--reconcile-interval-s",
                "5",
            ])
            // Workloads (notebooks, jobs) run as this machine's processes, with the
            // simulated MIG UUIDs in CUDA_VISIBLE_DEVICES; they stop with the server.
            .arg("--workload-root")
            .arg(dir.join("workloads"))
            .arg("--stop-workloads-on-exit")
            .kill_on_drop(true)
            .stdin(std::process::Stdio::null());
        if let Some(cert) = ca_file {
            cmd.arg("--ca-file").arg(cert);
        }
        let cred_file = dir.join("credential.json");
        let registered = known_credential(state, &cred_file, &server).await;
        if !registered {
            // A credential this database does not know (another database, a revoked node)
            // would be refused forever: start over with a join token.
            let _ = std::fs::remove_file(&cred_file);
            let token = state
                .services
                .nodes
                .create_join_token(&admin, &format!("simulated node {}", spec.name), 1, 1)
                .await
                .map_err(|e| anyhow::anyhow!("creating a join token for {}: {e}", spec.name))?;
            cmd.env("TESSERA_JOIN_TOKEN", token.secret);
            tokio::spawn(demo_layouts(
                state.clone(),
                admin.clone(),
                spec.name.clone(),
            ));
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        tracing::info!(node = %spec.name, gpus = %spec.gpus.join(","), "simulated node started");
        children.push(child);
    }
    Ok(children)
}

/// Whether the saved credential belongs to a live node of this server's database.
async fn known_credential(state: &AppState, file: &std::path::Path, server: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Saved {
        server: String,
        credential: String,
    }
    let Some(saved) = std::fs::read_to_string(file)
        .ok()
        .and_then(|t| serde_json::from_str::<Saved>(&t).ok())
    else {
        return false;
    };
    if saved.server.trim_end_matches('/') != server {
        return false;
    }
    state
        .services
        .nodes
        .authenticate(&saved.credential)
        .await
        .is_ok()
}

/// On a simulated node's first registration, gives its Hopper GPUs MIG layouts so a
/// newcomer sees MIG at work: a mixed layout on the first, seven 1g slices on the second.
/// (Ampere GPUs stay whole: their MIG mode change waits for a GPU reset, as on hardware.)
async fn demo_layouts(state: AppState, admin: Principal, hostname: String) {
    use tessera_domain::wire::{DesiredInstance, MigMode};
    let layouts: [&[(&str, u8)]; 2] = [
        &[("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)],
        &(0..7).map(|at| ("1g.10gb", at)).collect::<Vec<_>>(),
    ];
    for _ in 0..120 {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let all = PageRequest {
            offset: 0,
            limit: PageRequest::MAX_LIMIT,
        };
        let Ok(nodes) = state.services.nodes.list(&admin, all).await else {
            continue;
        };
        let Some(node) = nodes
            .items
            .iter()
            .find(|n| n.hostname == hostname && !n.revoked && n.last_heartbeat_at.is_some())
        else {
            continue;
        };
        let hopper = node.gpus.iter().filter(|g| {
            g.model
                .as_deref()
                .is_some_and(|m| m.starts_with("H1") || m.starts_with("H2"))
        });
        for (gpu, layout) in hopper.zip(layouts) {
            let layout = layout
                .iter()
                .map(|(p, s)| DesiredInstance {
                    profile: (*p).to_owned(),
                    start: *s,
                })
                .collect();
            if let Err(e) = state
                .services
                .nodes
                .set_desired_layout(&admin, node.id, &gpu.uuid, MigMode::Enabled, layout)
                .await
            {
                tracing::warn!(node = %hostname, gpu = %gpu.uuid, "demo layout not set: {e}");
            }
        }
        return;
    }
}

/// The platform admin on whose behalf simulated nodes' join tokens are made.
async fn system_principal(state: &AppState) -> anyhow::Result<Principal> {
    let p = state
        .services
        .accounts
        .principal_of(tessera_core::services::accounts::BOOTSTRAP_ADMIN)
        .await
        .map_err(|e| anyhow::anyhow!("the bootstrap admin is missing: {e}"))?;
    authz::admin(&p).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(p)
}

/// Stops the simulated agents: SIGINT first, so each stops its workloads' process groups,
/// then a kill after 10 s for any still running.
pub async fn stop(children: &mut [Child]) {
    for c in children.iter() {
        if let Some(pid) = c.id() {
            let _ = std::process::Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status();
        }
    }
    for c in children.iter_mut() {
        if tokio::time::timeout(std::time::Duration::from_secs(10), c.wait())
            .await
            .is_err()
        {
            let _ = c.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_default_and_rejects_unknown_models() {
        let nodes = parse_nodes("sim-a100=A100-SXM4-40GB*4;sim-h100=H100-80GB*2").expect("ok");
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].gpus.len(), 4);
        assert_eq!(nodes[1].gpus, vec!["H100-80GB", "H100-80GB"]);
        let mixed = parse_nodes("n=A30-24GB+H100-80GB*2").expect("ok");
        assert_eq!(mixed[0].gpus.len(), 3);
        assert!(parse_nodes("x=V100*2").is_err());
        assert!(parse_nodes("bad name=A30-24GB").is_err());
        assert!(parse_nodes("n=A30-24GB*0").is_err());
    }
}
