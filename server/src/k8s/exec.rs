//! `tessera exec` with the Kubernetes executor: the command runs in the workload's pod
//! through the API server's exec subresource (what `kubectl exec` uses: a WebSocket with
//! Kubernetes' channel protocol), and the user's session speaks Tessera's exec frames
//! (`tessera_domain::wire::exec_frame`) as with a node agent.

use super::{COMPLETION_INDEX, CONTAINER, KubeExecutor, LABEL_GANG, LABEL_WORKLOAD};
use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Api, AttachParams, AttachedProcess, ListParams};

/// The pod that runs workload `job`'s rank `rank` in `team`'s namespace: a gang's pod of
/// that completion index, else the workload's newest running pod.
pub(crate) async fn find_pod(
    ex: &KubeExecutor,
    team: &str,
    job: &str,
    rank: u32,
) -> anyhow::Result<Option<(String, String)>> {
    let ns = super::namespace_name(&ex.s, team);
    let api: Api<Pod> = Api::namespaced(ex.client.clone(), &ns);
    let pods = api
        .list(&ListParams::default().labels(&format!("{LABEL_WORKLOAD}={job}")))
        .await
        .context("listing the workload's pods")?
        .items;
    let running = |p: &&Pod| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            && p.metadata.deletion_timestamp.is_none()
    };
    let index = rank.to_string();
    let pod = pods
        .iter()
        .filter(running)
        .filter(|p| {
            let labels = p.metadata.labels.as_ref();
            match labels.and_then(|l| l.get(LABEL_GANG)) {
                Some(_) => {
                    p.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(COMPLETION_INDEX))
                        == Some(&index)
                }
                None => rank == 0,
            }
        })
        .max_by_key(|p| p.metadata.creation_timestamp.clone());
    Ok(pod.and_then(|p| p.metadata.name.clone()).map(|n| (ns, n)))
}

impl KubeExecutor {
    /// Starts `argv` in the main container of pod `name` in `ns` (stdin open; with `tty`, a
    /// terminal, whose output all comes on stdout).
    pub async fn exec(
        &self,
        ns: &str,
        name: &str,
        argv: &[String],
        tty: bool,
    ) -> anyhow::Result<AttachedProcess> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let params = AttachParams::default()
            .container(CONTAINER)
            .stdin(true)
            .stdout(true)
            .stderr(!tty)
            .tty(tty);
        api.exec(name, argv.iter().map(String::as_str), &params)
            .await
            .context("the API server's exec")
    }
}

/// The exit code a finished exec's `Status` tells: 0 for `Success`, the `ExitCode`
/// cause for a command that failed, 126 when it says nothing (it could not start).
pub fn exit_code(status: Option<&Status>) -> i32 {
    let Some(s) = status else { return 126 };
    if s.status.as_deref() == Some("Success") {
        return 0;
    }
    s.details
        .as_ref()
        .and_then(|d| d.causes.as_ref())
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.reason.as_deref() == Some("ExitCode"))
                .and_then(|c| c.message.as_deref()?.parse().ok())
        })
        .unwrap_or(126)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_code_comes_from_the_status() {
        let ok: Status = serde_json::from_value(serde_json::json!({"status": "Success"})).unwrap();
        assert_eq!(exit_code(Some(&ok)), 0);
        let failed: Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}
        }))
        .unwrap();
        assert_eq!(exit_code(Some(&failed)), 3);
        let odd: Status = serde_json::from_value(
            serde_json::json!({"status": "Failure", "message": "no such container"}),
        )
        .unwrap();
        assert_eq!(exit_code(Some(&odd)), 126);
        assert_eq!(exit_code(None), 126);
    }
}
