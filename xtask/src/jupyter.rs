//! JupyterLab for the notebooks of the embedded default's simulated nodes, in a
//! project-local virtual environment (`<repo>/.venv-jupyter`, git-ignored), never in the
//! system Python. `cargo xtask run`, `test` and `e2e` provision it (a no-op once it holds
//! the pinned version) and hand it to the agents as their notebook environment
//! (`TESSERA_AGENT_NOTEBOOK_ENV`, see `agent/src/notebook_env.rs`): the agent takes the
//! notebook command's `jupyter` from its `bin/` and mounts it read-only in the sandbox.

use anyhow::{Context, Result, bail};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{apt_install, have, is_root, step};

/// The JupyterLab release installed (PyPI).
pub const VERSION: &str = "4.6.6";
/// The virtual environment's folder, under the workspace root.
pub const DIR: &str = ".venv-jupyter";
/// The agent setting that names it.
pub const AGENT_ENV_VAR: &str = "TESSERA_AGENT_NOTEBOOK_ENV";
/// What a check of the result runs with: no trace of the environment in `PATH`.
const PLAIN_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The project's JupyterLab environment, if it has been provisioned (`bin/jupyter` is there).
pub fn project_env(root: &Path) -> Option<PathBuf> {
    let venv = root.join(DIR);
    is_executable(&venv.join("bin/jupyter")).then_some(venv)
}

/// Makes `venv` a virtual environment (of `python3`) with JupyterLab `version`. Returns
/// whether anything was done: nothing when it already holds that version.
pub fn provision(venv: &Path, version: &str) -> Result<bool> {
    if installed_version(venv).as_deref() == Some(version) {
        return Ok(false);
    }
    install_into(venv, &format!("jupyterlab=={version}"), "JupyterLab")?;
    let answer = Command::new(venv.join("bin/jupyter"))
        .args(["lab", "--version"])
        .env("PATH", PLAIN_PATH)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}/bin/jupyter lab --version", venv.display()))?;
    let answered = String::from_utf8_lossy(&answer.stdout).trim().to_owned();
    if !answer.status.success() || answered != version {
        bail!(
            "{}/bin/jupyter lab --version answered `{answered}` ({}), not {version}",
            venv.display(),
            answer.status
        );
    }
    eprintln!("    JupyterLab {version} is in {}", venv.display());
    Ok(true)
}

/// The JupyterLab version installed in `venv`, if its `python` and `jupyter` work.
fn installed_version(venv: &Path) -> Option<String> {
    if !is_executable(&venv.join("bin/jupyter")) {
        return None;
    }
    let out = Command::new(venv.join("bin/python"))
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('jupyterlab'))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Whether `venv`'s interpreter runs (it is gone, or broken when the Python it was made
/// from changed).
/// Installs `spec` with pip into the virtual environment `venv` (made first when it does
/// not work), then makes the whole environment readable to everyone: sandboxed workloads
/// run as other uids (200000+) and must read it whatever the umask was.
pub(crate) fn install_into(venv: &Path, spec: &str, name: &str) -> Result<()> {
    if !python_works(venv) {
        create_venv(venv)?;
    }
    step(
        &format!("pip install {spec} (into {})", venv.display()),
        &mut pip_install(venv.join("bin/python"), spec),
    )?;
    step(
        &format!("make the {name} environment readable by the workload sandbox"),
        Command::new("chmod").arg("-R").arg("a+rX").arg(venv),
    )
}

/// `python -m pip install` of `spec`, quietly.
pub(crate) fn pip_install(python: impl AsRef<std::ffi::OsStr>, spec: &str) -> Command {
    let mut pip = Command::new(python);
    let quiet = ["--quiet", "--disable-pip-version-check"];
    pip.args(["-m", "pip", "install"]).args(quiet).arg(spec);
    pip
}

fn python_works(venv: &Path) -> bool {
    Command::new(venv.join("bin/python"))
        .args(["-c", "import sys; sys.exit(sys.prefix == sys.base_prefix)"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `python3 -m venv`, installing Debian's `python3-venv` first when that is what is
/// missing and we are root.
fn create_venv(venv: &Path) -> Result<()> {
    let attempt = || -> Result<std::process::Output> {
        if venv.exists() {
            std::fs::remove_dir_all(venv)
                .with_context(|| format!("removing the broken {}", venv.display()))?;
        }
        Command::new("python3")
            .args(["-m", "venv"])
            .arg(venv)
            .output()
            .context("running python3 -m venv (is python3 installed?)")
    };
    eprintln!("\n==> python3 -m venv {}", venv.display());
    let mut out = attempt()?;
    if !out.status.success() && is_root() && have("apt-get") {
        eprintln!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        apt_install(&["python3-venv"])?;
        out = attempt()?;
    }
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(venv);
        bail!(
            "python3 -m venv {} failed ({}): {}{}\ninstall Python's venv module (Debian: \
             apt-get install python3-venv) and try again",
            venv.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim(),
        );
    }
    Ok(())
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// The provisioning step on its own, from nothing (PyPI; about a minute): a fresh
    /// virtual environment whose `bin/jupyter lab` answers with the pinned version without
    /// any help from `PATH`, readable by other uids, and a second run that does nothing.
    #[test]
    fn jupyterlab_is_provisioned_in_a_virtual_environment_and_reused() {
        let dir = std::env::temp_dir().join(format!("xtask-jupyter-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let venv = dir.join(DIR);
        assert_eq!(project_env(&dir), None);
        assert!(provision(&venv, VERSION).expect("provisioning"));
        assert_eq!(project_env(&dir), Some(venv.clone()));

        let out = Command::new(venv.join("bin/jupyter"))
            .args(["lab", "--version"])
            .env("PATH", PLAIN_PATH)
            .output()
            .expect("bin/jupyter runs");
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), VERSION);
        // A virtual environment, not the system Python.
        assert!(python_works(&venv));
        assert!(venv.join("pyvenv.cfg").is_file());
        // The sandbox's uids can read and run it.
        let mode = std::fs::metadata(venv.join("bin/jupyter"))
            .expect("bin/jupyter")
            .permissions()
            .mode();
        assert_eq!(mode & 0o005, 0o005, "{mode:o}");

        let started = Instant::now();
        assert!(!provision(&venv, VERSION).expect("second run"));
        assert!(started.elapsed() < Duration::from_secs(10));

        // A broken environment (its interpreter gone) is seen as such, so the next run
        // makes it again.
        std::fs::remove_file(venv.join("bin/python")).expect("remove bin/python");
        assert_eq!(installed_version(&venv), None);
        assert!(!python_works(&venv));

        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
