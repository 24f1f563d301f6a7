//! A workload's secrets at rest: its notebook token and its environment (whose values may
//! be secrets) are stored sealed under the server's data keys ([`crate::at_rest`]), bound
//! to the workload's id and the column, and opened only where they leave the server: the
//! proxy's upstream header, the executor's spec and the view its owner reads.

use super::*;
use crate::at_rest::{DataKeys, OpenError, Sealed};
use crate::auth::SystemActor;

/// How many rows [`Workloads::seal_at_rest`] reads at a time.
const SEAL_BATCH: i64 = 500;

fn token_context(id: WorkloadId) -> String {
    format!("workloads.token:{id}")
}

fn env_context(id: WorkloadId) -> String {
    format!("workloads.env:{id}")
}

/// A stored notebook token in clear, with `keys` (tests and benchmarks that read the
/// database themselves; the service has [`Workloads::notebook_token`]).
pub fn open_notebook_token(keys: &DataKeys, w: &WorkloadRow) -> Result<Option<String>, OpenError> {
    w.token
        .as_ref()
        .map(|t| keys.open(&token_context(w.id), t))
        .transpose()
}

impl Workloads {
    /// Seals with `keys` (the server's configured data keys) instead of the key of its own
    /// that [`Workloads::new`] made up.
    pub fn with_data_keys(mut self, keys: Arc<DataKeys>) -> Self {
        self.keys = keys;
        self
    }

    /// Seals `token` and `env` into the new row (whose id is final).
    pub(super) fn seal_secrets(
        &self,
        row: &mut WorkloadRow,
        token: Option<&str>,
        env: &[EnvVar],
    ) -> Result<(), AppError> {
        let json = serde_json::to_string(env).unwrap_or_else(|_| "[]".into());
        row.env = self.seal(&env_context(row.id), &json)?;
        row.token = token
            .map(|t| self.seal(&token_context(row.id), t))
            .transpose()?;
        Ok(())
    }

    fn seal(&self, context: &str, value: &str) -> Result<Sealed, AppError> {
        self.keys.seal(context, value).map_err(|e| {
            tracing::error!(error = %e, "sealing a workload secret");
            AppError::Internal
        })
    }

    fn open(&self, id: WorkloadId, context: &str, sealed: &Sealed) -> Result<String, AppError> {
        self.keys.open(context, sealed).map_err(|e| {
            tracing::error!(workload = %id, error = %e, "opening a workload secret (TESSERA_DATA_KEY)");
            AppError::Internal
        })
    }

    /// The notebook's token in clear (`None` for a job).
    pub fn notebook_token(&self, w: &WorkloadRow) -> Result<Option<String>, AppError> {
        w.token
            .as_ref()
            .map(|t| self.open(w.id, &token_context(w.id), t))
            .transpose()
    }

    /// The workload's environment in clear.
    pub(super) fn env_of(&self, w: &WorkloadRow) -> Result<Vec<EnvVar>, AppError> {
        let json = self.open(w.id, &env_context(w.id), &w.env)?;
        // Opened, yet not a list of variables: no release wrote that, so it is a fault,
        // not an empty environment.
        serde_json::from_str(&json).map_err(|e| {
            tracing::error!(workload = %w.id, error = %e, "a workload's environment is not a list of variables");
            AppError::Internal
        })
    }

    /// Seals every stored token and environment that is not sealed under the current key
    /// (in clear from an older release, or under a key being retired); answers how many
    /// workloads it sealed. The server runs it as it starts, so after one start with a new
    /// key no row needs the old one. A row no configured key opens stops the start here,
    /// naming the key, rather than failing its notebook later.
    pub async fn seal_at_rest(&self, _: &SystemActor) -> anyhow::Result<u64> {
        use anyhow::Context;
        let prefix = self.keys.current_prefix();
        let mut after = WorkloadId(Uuid::nil());
        let mut sealed = 0;
        loop {
            let rows = self
                .store
                .workload_secrets_to_seal(&prefix, after, SEAL_BATCH)
                .await?;
            let Some(last) = rows.last() else {
                return Ok(sealed);
            };
            after = last.0;
            for (id, token, env) in &rows {
                let reseal = |context: String, value: &Sealed| {
                    let open = self
                        .keys
                        .open(&context, value)
                        .with_context(|| format!("the secrets of workload {id}"))?;
                    Ok::<_, anyhow::Error>(self.keys.seal(&context, &open)?)
                };
                let new_env = reseal(env_context(*id), env)?;
                let new_token = token
                    .as_ref()
                    .map(|t| reseal(token_context(*id), t))
                    .transpose()?;
                if self
                    .store
                    .reseal_workload_secrets(*id, env, new_token.as_ref(), &new_env)
                    .await?
                {
                    sealed += 1;
                }
            }
        }
    }
}
