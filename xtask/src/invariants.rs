//! ARCHITECTURE.md's invariants that a grep can hold (the rest are held by tests, by
//! clippy — `core/clippy.toml` keeps `Utc::now` to `core/src/clock.rs` — and by the
//! dependency-direction check).

use anyhow::{Result, bail};
use std::path::{Path, PathBuf};

/// Store-row fields that hold a domain type: none may be read as text again.
const TYPED_FIELDS: [&str; 17] = [
    "kind",
    "alloc_kind",
    "approver",
    "release_cause",
    "priority",
    "state",
    "stop_state",
    "preempt_cause",
    "alloc_preempt_cause",
    "deadline_cause",
    "gang_launcher",
    "gang_ranks",
    "entry_type",
    "mode",
    "sharing",
    "layout",
    "needs_cuda",
];

/// Store rows whose `state` column is not an allocation's or a workload's (a delivery's).
const OTHER_STATES: [&str; 1] = ["core/src/store/outbox.rs"];

/// Where an adapter may hold the store itself: the server's composition root, which opens,
/// migrates and backs up the database and hands it to `Services` (which keeps none).
const STORE_HOLDERS: [&str; 1] = ["server/src/lib.rs"];

/// Store-row fields that hold an allocation's, a workload's, a node's, a team's or a
/// user's id: read as `AllocationId`, `WorkloadId`, `NodeId`, `TeamId` or `UserId`, never
/// a bare `Uuid`.
const ID_FIELDS: [&str; 6] = [
    "allocation_id",
    "workload_id",
    "gang_job",
    "node_id",
    "team_id",
    "user_id",
];

/// The store's parameters (and fields) that name a team or a user.
const PARTY_PARAMS: [&str; 8] = [
    "team",
    "teams",
    "user",
    "by",
    "viewer",
    "owner",
    "created_by",
    "updated_by",
];

/// `team: Uuid`, `teams: &[Uuid]`, `user: Option<Uuid>`… on a line of a store file: the
/// parameter's name.
fn bare_party_param(line: &str) -> Option<&'static str> {
    PARTY_PARAMS.into_iter().find(|p| {
        line.split([',', '(']).any(|part| {
            let part = part.trim().trim_start_matches("pub ");
            part.strip_prefix(p)
                .and_then(|rest| rest.trim_start().strip_prefix(':'))
                .map(|ty| {
                    ty.trim()
                        .trim_start_matches("Option<")
                        .trim_start_matches("&[")
                })
                .is_some_and(|ty| ty.starts_with("Uuid"))
        })
    })
}

/// Where the server holds the `SystemActor` its background passes run as: the composition
/// root and the passes it starts. No request handler (nor the UI) gets one.
const SYSTEM_ACTOR_HOLDERS: [&str; 5] = [
    "server/src/lib.rs",
    "server/src/leader.rs",
    "server/src/scheduler.rs",
    "server/src/notify/mod.rs",
    "server/src/k8s/mod.rs",
];

/// Where trusted code may act as a stored user without a request.
const PRINCIPAL_OF_CALLERS: [&str; 2] = ["core/src/services/accounts.rs", "server/src/sim.rs"];

pub fn check(root: &Path) -> Result<()> {
    eprintln!("\n==> invariants (ARCHITECTURE.md)");
    let mut broken = Vec::new();
    for file in rust_files(&root.join("core/src/store"))? {
        let rel = relative(root, &file);
        let text = std::fs::read_to_string(&file)?;
        for (n, line) in text.lines().enumerate() {
            if let Some(param) = bare_party_param(line) {
                broken.push(format!(
                    "{rel}:{}: store parameter `{param}` is a bare Uuid; take a TeamId/UserId",
                    n + 1
                ));
            }
            let Some((name, ty)) = line
                .trim()
                .strip_prefix("pub ")
                .and_then(|f| f.split_once(':'))
            else {
                continue;
            };
            let ty = ty.trim().trim_end_matches(',');
            let text_typed = ty == "String" || ty == "Option<String>";
            let exempt = name == "state" && OTHER_STATES.contains(&rel.as_str());
            if TYPED_FIELDS.contains(&name) && text_typed && !exempt {
                broken.push(format!(
                    "{rel}:{}: store row field `{name}` is text; read it as its domain type",
                    n + 1
                ));
            }
            if ID_FIELDS.contains(&name) && (ty == "Uuid" || ty == "Option<Uuid>") {
                broken.push(format!(
                    "{rel}:{}: store row field `{name}` is a bare Uuid; read it as its id type",
                    n + 1
                ));
            }
        }
    }
    for dir in ["core/src", "server/src", "app/src"] {
        for file in rust_files(&root.join(dir))? {
            let rel = relative(root, &file);
            let text = std::fs::read_to_string(&file)?;
            let opens_store = text.contains("store::Store") || text.contains("Store::connect");
            if dir != "core/src" && opens_store && !STORE_HOLDERS.contains(&rel.as_str()) {
                broken.push(format!(
                    "{rel}: holds the store; adapters reach rows through the services"
                ));
            }
            if dir != "core/src"
                && text.contains("SystemActor")
                && !SYSTEM_ACTOR_HOLDERS.contains(&rel.as_str())
            {
                broken.push(format!(
                    "{rel}: holds the SystemActor; only the composition root and its background \
                     passes run as the platform"
                ));
            }
            if text.contains("principal_of(") && !PRINCIPAL_OF_CALLERS.contains(&rel.as_str()) {
                broken.push(format!(
                    "{rel}: calls `Accounts::principal_of`; a request's principal comes from its \
                     session or token"
                ));
            }
        }
    }
    if !broken.is_empty() {
        bail!("invariants broken:\n  {}", broken.join("\n  "));
    }
    eprintln!("    invariants: ok");
    Ok(())
}

fn relative(root: &Path, file: &Path) -> String {
    file.strip_prefix(root)
        .unwrap_or(file)
        .to_string_lossy()
        .replace('\\', "/")
}

fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::bare_party_param;

    #[test]
    fn a_bare_uuid_for_a_team_or_user_parameter_is_found() {
        let bare = [
            (
                "    pub async fn quota(&self, team: Uuid, model: &str) -> R {",
                "team",
            ),
            ("        user: Option<Uuid>,", "user"),
            ("        teams: Option<&[Uuid]>,", "teams"),
            ("    pub team: Uuid,", "team"),
            ("    fn f(&self, viewer: Uuid) {", "viewer"),
            ("    pub created_by: Option<Uuid>,", "created_by"),
        ];
        for (line, param) in bare {
            assert_eq!(bare_party_param(line), Some(param), "{line}");
        }
        let typed = [
            "    pub async fn quota(&self, team: TeamId, model: &str) -> R {",
            "        user: Option<UserId>,",
            "        teams: Option<&[TeamId]>,",
            "    pub team_id: Uuid,",
            "    fn f(&self, id: Uuid, byte: Uuid) {",
        ];
        for line in typed {
            assert_eq!(bare_party_param(line), None, "{line}");
        }
    }
}
