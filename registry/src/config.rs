//! The parts of an OCI/Docker image config document that say how to run the image.

use serde::{Deserialize, Serialize};

use crate::client::PullError;

/// What the image's config says about how to run it (the parts the sandbox applies;
/// `User` is read only to be ignored: a workload always runs as its team's uid).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(rename = "Env", default)]
    pub env: Vec<String>,
    #[serde(rename = "WorkingDir", default)]
    pub working_dir: String,
    #[serde(rename = "Entrypoint", default)]
    pub entrypoint: Vec<String>,
    #[serde(rename = "Cmd", default)]
    pub cmd: Vec<String>,
    #[serde(rename = "User", default)]
    pub user: String,
}

impl ImageConfig {
    /// Reads the `config` object of an OCI/Docker image config document.
    pub fn from_document(json: &[u8]) -> Result<ImageConfig, PullError> {
        #[derive(Deserialize)]
        struct Doc {
            #[serde(default)]
            config: Option<Nullable>,
        }
        #[derive(Deserialize, Default)]
        struct Nullable {
            #[serde(rename = "Env", default)]
            env: Option<Vec<String>>,
            #[serde(rename = "WorkingDir", default)]
            working_dir: Option<String>,
            #[serde(rename = "Entrypoint", default)]
            entrypoint: Option<Vec<String>>,
            #[serde(rename = "Cmd", default)]
            cmd: Option<Vec<String>>,
            #[serde(rename = "User", default)]
            user: Option<String>,
        }
        let doc: Doc = serde_json::from_slice(json)
            .map_err(|e| PullError::Refused(format!("the image config is not JSON: {e}")))?;
        let c = doc.config.unwrap_or_default();
        Ok(ImageConfig {
            env: c.env.unwrap_or_default(),
            working_dir: c.working_dir.unwrap_or_default(),
            entrypoint: c.entrypoint.unwrap_or_default(),
            cmd: c.cmd.unwrap_or_default(),
            user: c.user.unwrap_or_default(),
        })
    }
}
