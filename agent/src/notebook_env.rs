//! The notebook environment: a Python environment with JupyterLab that notebooks start
//! from (`--notebook-env DIR`, `TESSERA_AGENT_NOTEBOOK_ENV`).
//!
//! The server's notebook command names its program without a folder (`jupyter lab …`,
//! the same command a Kubernetes pod runs in its image). With a notebook environment, a
//! notebook whose program has no `/` in its name gets `DIR/bin/<program>` when that is
//! an executable file: `jupyter` becomes e.g. `/srv/tessera/.venv-jupyter/bin/jupyter`,
//! whose kernels then run with the environment's own `python`. Nothing else changes: no
//! `PATH` is set or extended, a program the environment does not have is looked up on
//! the workload's `PATH` as before, a command naming a path
//! (`TESSERA_NOTEBOOK_COMMAND="/opt/conda/bin/jupyter lab …"`) is used as it is, and jobs
//! are never affected.
//!
//! In the sandbox the environment is mounted read-only at its own path (its scripts
//! name their interpreter by absolute path), and so is the Python installation a
//! virtual environment's `python` links to, unless a system folder (`/usr`, `/opt`, …)
//! holds it already: see [`NotebookEnv::read_only_paths`].

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::sandbox::SYSTEM_PATHS;

/// A Python environment (a virtual environment, or any prefix with a `bin/` folder).
#[derive(Debug, Clone)]
pub struct NotebookEnv {
    /// Absolute, as given (not resolved: the scripts' `#!` lines use this spelling).
    dir: PathBuf,
}

impl NotebookEnv {
    /// `dir` made absolute; refused when it has no `bin/` folder.
    pub fn open(dir: &Path) -> Result<NotebookEnv, String> {
        let dir = std::path::absolute(dir)
            .map_err(|e| format!("notebook environment {}: {e}", dir.display()))?;
        if !dir.join("bin").is_dir() {
            return Err(format!(
                "notebook environment {}: not a Python environment (it has no bin/ folder)",
                dir.display()
            ));
        }
        Ok(NotebookEnv { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The program a notebook's `argv[0]` stands for: `<dir>/bin/<program>` when
    /// `program` is a bare name (no `/`) and that file is executable; otherwise `None`
    /// (the program is used as it is).
    pub fn program(&self, program: &str) -> Option<PathBuf> {
        if program.is_empty() || program.contains('/') || program == "." || program == ".." {
            return None;
        }
        let p = self.dir.join("bin").join(program);
        is_executable(&p).then_some(p)
    }

    /// What a sandboxed notebook must see read-only to run from this environment: the
    /// environment itself (and its resolved path, when it is reached through a link),
    /// and the installation its `python` comes from: the parent of `home` in
    /// `pyvenv.cfg` and the prefix of the interpreter `bin/python` finally links to
    /// (`<prefix>/bin/python3.X`). Paths a system folder of the sandbox holds already are
    /// left out.
    pub fn read_only_paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.dir.clone()];
        if let Ok(real) = self.dir.canonicalize() {
            paths.push(real);
        }
        if let Some(home) = fs::read_to_string(self.dir.join("pyvenv.cfg"))
            .ok()
            .as_deref()
            .and_then(pyvenv_home)
            && let Some(prefix) = home.parent()
        {
            paths.push(prefix.to_path_buf());
        }
        for name in ["python", "python3"] {
            if let Ok(real) = self.dir.join("bin").join(name).canonicalize()
                && let Some(prefix) = real.parent().and_then(Path::parent)
            {
                paths.push(prefix.to_path_buf());
            }
        }
        let mut out: Vec<PathBuf> = Vec::new();
        for p in paths {
            let covered = p.parent().is_none()
                || SYSTEM_PATHS.iter().any(|s| p.starts_with(s))
                || out.contains(&p);
            if !covered {
                out.push(p);
            }
        }
        out
    }
}

/// The `home` key of a virtual environment's `pyvenv.cfg` (the folder of the
/// interpreter it was made from), when it is an absolute path.
pub fn pyvenv_home(cfg: &str) -> Option<PathBuf> {
    cfg.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        let value = value.trim();
        (key.trim() == "home" && value.starts_with('/')).then(|| PathBuf::from(value))
    })
}

fn is_executable(p: &Path) -> bool {
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn touch(p: &Path, mode: u32) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, "#!/bin/sh\n").unwrap();
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn pyvenv_cfg_names_the_base_interpreters_folder() {
        let cfg = "home = /root/.pyenv/versions/3.11.7/bin\n\
                   include-system-site-packages = false\nversion = 3.11.7\n\
                   executable = /root/.pyenv/versions/3.11.7/bin/python3.11\n";
        assert_eq!(
            pyvenv_home(cfg),
            Some(PathBuf::from("/root/.pyenv/versions/3.11.7/bin"))
        );
        assert_eq!(
            pyvenv_home("home=/usr/bin"),
            Some(PathBuf::from("/usr/bin"))
        );
        assert_eq!(pyvenv_home("homestead = /x\nversion = 3"), None);
        assert_eq!(pyvenv_home("home = relative/bin"), None);
        assert_eq!(pyvenv_home(""), None);
    }

    #[test]
    fn a_bare_program_name_is_taken_from_the_environments_bin() {
        let dir = tempfile::tempdir().unwrap();
        let env_dir = dir.path().join("venv");
        touch(&env_dir.join("bin/jupyter"), 0o755);
        touch(&env_dir.join("bin/not-executable"), 0o644);
        fs::create_dir_all(env_dir.join("bin/a-folder")).unwrap();
        let env = NotebookEnv::open(&env_dir).unwrap();
        assert_eq!(env.program("jupyter"), Some(env_dir.join("bin/jupyter")));
        // Not there, not executable, not a file: used as it is (looked up on PATH).
        assert_eq!(env.program("jupyter-lab"), None);
        assert_eq!(env.program("not-executable"), None);
        assert_eq!(env.program("a-folder"), None);
        // A path (an override such as /opt/conda/bin/jupyter) is never rewritten.
        assert_eq!(env.program("/opt/conda/bin/jupyter"), None);
        assert_eq!(env.program("bin/jupyter"), None);
        assert_eq!(env.program("./jupyter"), None);
        assert_eq!(env.program(""), None);
        assert_eq!(env.program(".."), None);
    }

    #[test]
    fn only_a_folder_with_bin_is_an_environment() {
        let dir = tempfile::tempdir().unwrap();
        let err = NotebookEnv::open(&dir.path().join("missing")).unwrap_err();
        assert!(err.contains("has no bin/ folder"), "{err}");
        fs::create_dir_all(dir.path().join("venv/bin")).unwrap();
        let env = NotebookEnv::open(&dir.path().join("venv")).unwrap();
        assert_eq!(env.dir(), dir.path().join("venv"));
    }

    #[test]
    fn the_sandbox_sees_the_environment_and_the_installation_it_links_to() {
        let dir = tempfile::tempdir().unwrap();
        // A base installation outside the system folders (pyenv-like), and a venv whose
        // python links to it through a second link, as `python3 -m venv` makes it.
        let base = dir.path().join("pyenv/versions/3.11.7");
        touch(&base.join("bin/python3.11"), 0o755);
        symlink("python3.11", base.join("bin/python3")).unwrap();
        let venv = dir.path().join("venv");
        fs::create_dir_all(venv.join("bin")).unwrap();
        symlink(base.join("bin/python3"), venv.join("bin/python")).unwrap();
        symlink("python", venv.join("bin/python3")).unwrap();
        fs::write(
            venv.join("pyvenv.cfg"),
            format!("home = {}\nversion = 3.11.7\n", base.join("bin").display()),
        )
        .unwrap();
        // Reached through a link: both spellings are mounted.
        let link = dir.path().join("current");
        symlink(&venv, &link).unwrap();
        let env = NotebookEnv::open(&link).unwrap();
        let real = |p: &Path| p.canonicalize().unwrap();
        assert_eq!(
            env.read_only_paths(),
            [link.clone(), real(&venv), real(&base)]
        );

        // Debian's python3 in /usr: only the environment itself.
        let venv2 = dir.path().join("venv2");
        fs::create_dir_all(venv2.join("bin")).unwrap();
        fs::write(venv2.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        symlink("/usr/bin/python3", venv2.join("bin/python")).unwrap();
        let env2 = NotebookEnv::open(&venv2).unwrap();
        assert_eq!(env2.read_only_paths(), [real(&venv2)]);

        // An environment inside a system folder needs nothing more.
        assert!(
            NotebookEnv {
                dir: PathBuf::from("/opt/tessera/jupyter")
            }
            .read_only_paths()
            .is_empty()
        );
    }
}
