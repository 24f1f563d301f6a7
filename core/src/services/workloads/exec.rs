//! `tessera exec`: who may run a command inside a running workload, and where it runs.
//! The session itself (the WebSockets, the agent) is the server's; this decides and
//! audits.

use super::{Workloads, found};
use crate::auth::Principal;
use tessera_domain::audit::AuditAction;
use tessera_domain::error::AppError;
use tessera_domain::ids::{NodeId, TeamId, WorkloadId};
use tessera_domain::workload::WorkloadState;

/// Longest command line `exec` accepts (bytes, all arguments together).
pub const MAX_EXEC_COMMAND: usize = 16 * 1024;

/// Where an exec session runs: the workload (a gang member for `rank` > 0) and its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecTarget {
    /// The workload the command runs in (its run on the node).
    pub workload_id: WorkloadId,
    pub node_id: NodeId,
    /// The workload asked for (rank 0 of a gang), its rank and its team: how the
    /// Kubernetes executor finds the pod.
    pub job: WorkloadId,
    pub rank: u32,
    pub team_id: TeamId,
}

impl Workloads {
    /// Authorizes `argv` in rank `rank` of the workload `id` (its owner, a team admin of
    /// its team, a platform admin: as for stopping it; another team's member gets
    /// `NotFound`, other members `Forbidden`), checks that it runs, and audits
    /// `workload.exec` with the command (never its input or output).
    pub async fn exec_target(
        &self,
        p: &Principal,
        id: WorkloadId,
        rank: u32,
        argv: &[String],
        tty: bool,
    ) -> Result<ExecTarget, AppError> {
        // Authorizes (actionable) before anything about the request is judged.
        let target = self.rank_id(p, id, rank).await?;
        if argv.is_empty() || argv[0].is_empty() {
            return Err(AppError::invalid("command", "give the command to run"));
        }
        if argv.iter().map(String::len).sum::<usize>() > MAX_EXEC_COMMAND {
            return Err(AppError::invalid(
                "command",
                format!("the command is longer than {MAX_EXEC_COMMAND} bytes"),
            ));
        }
        if argv.iter().any(|a| a.contains('\0')) {
            return Err(AppError::invalid(
                "command",
                "the command contains a NUL byte",
            ));
        }
        let row = found("loading workload", self.store.workload(target).await)?;
        let kind = row.w.kind.as_str();
        let state = row.w.state;
        if state != WorkloadState::Running {
            return Err(AppError::conflict(if state.is_terminal() {
                format!("the {kind} has ended ({})", state.label().to_lowercase())
            } else {
                format!(
                    "the {kind} is not running ({}); try again once it runs",
                    state.label().to_lowercase()
                )
            }));
        }
        let node_id = row
            .w
            .node_id
            .ok_or_else(|| AppError::conflict(format!("the {kind} is on no node")))?;
        let rank_note = if rank > 0 {
            format!(" on rank {rank}")
        } else {
            String::new()
        };
        let msg = format!(
            "exec{rank_note}{} by {}: {}",
            if tty { " (tty)" } else { "" },
            p.username(),
            shell_words(argv)
        );
        self.audit(
            Some(p.username().as_str()),
            AuditAction::WorkloadExec,
            id,
            row.w.team_id,
            &msg,
        )
        .await;
        Ok(ExecTarget {
            workload_id: target,
            node_id,
            job: id,
            rank,
            team_id: row.w.team_id,
        })
    }
}

/// `argv` as one line a reader can paste into a shell (quoted where needed).
fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::shell_words;

    #[test]
    fn commands_are_audited_as_a_shell_would_read_them() {
        let argv = ["sh", "-c", "echo 'hi' && exit 7", ""].map(String::from);
        assert_eq!(shell_words(&argv), r"sh -c 'echo '\''hi'\'' && exit 7' ''");
    }
}
