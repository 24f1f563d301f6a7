//! The data keys that seal secrets at rest (`tessera_core::at_rest`): `TESSERA_DATA_KEY`,
//! `TESSERA_DATA_KEY_FILE`, or for the embedded default `<database>.key` beside the SQLite
//! database, generated (mode 0600) on the first start. A key never goes into the database,
//! so a copy of the database alone opens nothing.

use crate::config::ServeConfig;
use anyhow::{Context, anyhow, bail};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tessera_core::at_rest::DataKeys;

/// The keys `config` names; generates the embedded default's key file when missing.
pub fn load(config: &ServeConfig) -> anyhow::Result<DataKeys> {
    if let Some(k) = &config.data_key {
        return DataKeys::parse(k.expose())
            .map_err(|e| anyhow!("TESSERA_DATA_KEY (--data-key): {e}"));
    }
    if let Some(f) = &config.data_key_file {
        return read(f).context("TESSERA_DATA_KEY_FILE (--data-key-file)");
    }
    let url = config.database_url.expose();
    if url.starts_with("sqlite:") && url.contains(":memory:") {
        // The database ends with the process; so may its key.
        return Ok(DataKeys::ephemeral());
    }
    let Some(db) = tessera_core::store::sqlite_file(url) else {
        bail!(
            "TESSERA_DATA_KEY or TESSERA_DATA_KEY_FILE is required with PostgreSQL, the same on \
             every replica: make a key with `openssl rand -base64 32` (docs/security.md: Data at rest)"
        );
    };
    let file = default_file(&db);
    if !file.exists() {
        generate(&file)?;
        tracing::info!(file = %file.display(), "generated the data key file: back it up apart from the database");
    }
    read(&file)
}

/// The embedded default's key file: `<database>.key`.
pub fn default_file(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".key");
    PathBuf::from(name)
}

fn read(path: &Path) -> anyhow::Result<DataKeys> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        bail!(
            "{} is open to other users (mode {:o}): `chmod 600` it",
            path.display(),
            mode & 0o777
        );
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    DataKeys::parse(&text).map_err(|e| anyhow!("{}: {e}", path.display()))
}

fn generate(path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create folder {}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    writeln!(
        f,
        "# Tessera's data keys (docs/security.md: Data at rest), the newest first.\n{}",
        DataKeys::generate()
    )
    .and_then(|()| f.sync_all())
    .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> ServeConfig {
        ServeConfig::for_tests(url)
    }

    #[test]
    fn the_embedded_default_keeps_its_key_beside_the_database() {
        let dir = tempfile::tempdir().expect("dir");
        let c = config(&format!(
            "sqlite://{}/db/t.db?mode=rwc",
            dir.path().display()
        ));
        let keys = load(&c).expect("generated");
        let file = dir.path().join("db/t.db.key");
        let mode = std::fs::metadata(&file)
            .expect("key file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // The next start reads the same key.
        assert_eq!(load(&c).expect("again").ids(), keys.ids());
        // A key file others may read is refused.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let e = format!("{:#}", load(&c).expect_err("0644"));
        assert!(e.contains("chmod 600"), "{e}");
    }

    #[test]
    fn postgres_needs_a_configured_key() {
        let mut c = config("postgres://u@db/tessera");
        let e = format!("{:#}", load(&c).expect_err("no key"));
        assert!(e.contains("TESSERA_DATA_KEY"), "{e}");
        let (new, old) = (DataKeys::generate(), DataKeys::generate());
        c.data_key = Some(crate::config::Secret::new(format!("{new},{old}")));
        assert_eq!(load(&c).expect("keys").ids().len(), 2);
        c.data_key = Some(crate::config::Secret::new("nope"));
        let e = format!("{:#}", load(&c).expect_err("bad key"));
        assert!(
            e.contains("TESSERA_DATA_KEY") && e.contains("base64"),
            "{e}"
        );
        assert!(!e.contains("nope"), "the value is not echoed: {e}");
    }
}
