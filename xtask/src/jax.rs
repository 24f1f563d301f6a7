//! JAX's CPU build for the multi-host gang test (issue 42, `e2e/gang/jax_allreduce.py`),
//! in a project-local virtual environment (`<repo>/.venv-jax`, git-ignored), made like
//! JupyterLab's (`jupyter.rs`). `cargo xtask test` provisions it (a no-op once it holds
//! the pinned version) and hands its interpreter to the tests as `TESSERA_TEST_JAX_PYTHON`.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::jupyter::install_into;

/// The JAX release installed (PyPI `jax[cpu]`: jax and jaxlib of this version).
pub const VERSION: &str = "0.10.2";
/// The virtual environment's folder, under the workspace root.
pub const DIR: &str = ".venv-jax";
/// The variable the tests read the environment's interpreter from.
pub const TEST_ENV_VAR: &str = "TESSERA_TEST_JAX_PYTHON";

/// The JAX version installed in `venv`, if its `python` imports it.
fn installed_version(venv: &Path) -> Option<String> {
    let out = Command::new(venv.join("bin/python"))
        .args(["-c", "import jax; print(jax.__version__)"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Makes `venv` a virtual environment with `jax[cpu]==VERSION`; returns its interpreter.
pub fn provision(venv: &Path) -> Result<PathBuf> {
    let python = venv.join("bin/python");
    if installed_version(venv).as_deref() == Some(VERSION) {
        return Ok(python);
    }
    install_into(venv, &format!("jax[cpu]=={VERSION}"), "JAX")?;
    let got = installed_version(venv)
        .with_context(|| format!("{} cannot import jax", python.display()))?;
    if got != VERSION {
        bail!("{} has JAX {got}, not {VERSION}", venv.display());
    }
    eprintln!("    JAX {VERSION} is in {}", venv.display());
    Ok(python)
}
