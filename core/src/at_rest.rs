//! Secrets at rest: values the server must read back in clear (a notebook's token, a
//! workload's environment) are sealed with AES-256-GCM (ring) under the server's data keys
//! before they are stored, so the database and its backups hold only ciphertext.
//!
//! A sealed value is `tsx1.<key id>.<base64url(nonce ‖ ciphertext ‖ tag)>` with a random
//! 96-bit nonce. The key id is derived from the key (the first 4 bytes of a SHA-256 over it,
//! in hex), so rotating is adding a key: the first key seals, every key opens, and
//! [`DataKeys::is_current`] finds what an older key sealed. The additional data names what
//! the value is and whose (`workloads.token:<id>`), so a ciphertext copied to another row or
//! column does not open. A stored value without the prefix was written in clear by an older
//! release: it reads as it is until it is sealed (`Workloads::seal_at_rest`).

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use rand_core::{OsRng, RngCore};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};
use std::fmt;

/// What every sealed value starts with (the format's version).
const PREFIX: &str = "tsx1.";
/// Bytes in a data key (AES-256).
pub const KEY_LEN: usize = 32;

/// The server's data keys: the first seals, all of them open.
pub struct DataKeys {
    keys: Vec<DataKey>,
}

struct DataKey {
    id: String,
    key: LessSafeKey,
}

/// A value as it is stored: sealed, or in clear from an older release. Only
/// [`DataKeys::open`] gives the value; `Debug` shows which key sealed it, never the value.
#[derive(Clone, PartialEq, Eq, sqlx::Type)]
#[sqlx(transparent)]
pub struct Sealed(String);

/// Why a stored value does not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("sealed with key {0}, which is not among the configured data keys")]
    UnknownKey(String),
    #[error("does not open with key {0}: damaged, or sealed for another value")]
    Damaged(String),
}

/// Sealing failed (the system's random source failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("sealing a value failed")]
pub struct SealError;

impl Sealed {
    /// A value stored in clear (an older release's row, or a test's).
    pub fn clear(value: &str) -> Sealed {
        Sealed(value.to_owned())
    }

    /// The stored text.
    pub fn as_stored(&self) -> &str {
        &self.0
    }

    /// The id of the key that sealed it; `None` for a value in clear.
    pub fn key_id(&self) -> Option<&str> {
        self.0
            .strip_prefix(PREFIX)?
            .split_once('.')
            .map(|(id, _)| id)
    }
}

impl fmt::Debug for Sealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.key_id() {
            Some(id) => write!(f, "Sealed(key {id})"),
            None => f.write_str("Sealed(in clear)"),
        }
    }
}

impl fmt::Debug for DataKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|k| &k.id))
            .finish()
    }
}

impl DataKeys {
    /// Reads keys from text: base64 of 32 bytes each, separated by commas, blanks or lines
    /// (`#` starts a comment), the newest first. At least one.
    pub fn parse(text: &str) -> Result<DataKeys, String> {
        let mut keys = Vec::new();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            for word in line
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|w| !w.is_empty())
            {
                let n = keys.len() + 1;
                let bytes = STANDARD
                    .decode(word)
                    .map_err(|_| format!("key {n} is not base64"))?;
                let key = DataKey::new(&bytes).ok_or_else(|| {
                    format!("key {n} is not {KEY_LEN} bytes (base64 of 32 random bytes)")
                })?;
                if keys.iter().any(|k: &DataKey| k.id == key.id) {
                    return Err(format!("key {n} is given twice"));
                }
                keys.push(key);
            }
        }
        if keys.is_empty() {
            return Err("no key given".into());
        }
        Ok(DataKeys { keys })
    }

    /// A new random key, as [`DataKeys::parse`] reads it.
    pub fn generate() -> String {
        STANDARD.encode(random_key())
    }

    /// One new random key that lives as long as the process: for tests and benchmarks that
    /// configure none (the server always does).
    pub fn ephemeral() -> DataKeys {
        DataKeys {
            keys: DataKey::new(&random_key()).into_iter().collect(),
        }
    }

    /// The keys' ids, the sealing key first.
    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.id.as_str()).collect()
    }

    /// The prefix of every value the current key seals.
    pub fn current_prefix(&self) -> String {
        format!("{PREFIX}{}.", self.current().id)
    }

    fn current(&self) -> &DataKey {
        // Never empty: `parse` refuses no keys, and 32 random bytes always make a key.
        &self.keys[0]
    }

    /// Seals `value` for `context` (what it is and whose) under the current key.
    pub fn seal(&self, context: &str, value: &str) -> Result<Sealed, SealError> {
        let key = self.current();
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| SealError)?;
        let mut data = value.as_bytes().to_vec();
        key.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context.as_bytes()),
                &mut data,
            )
            .map_err(|_| SealError)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        Ok(Sealed(format!(
            "{PREFIX}{}.{}",
            key.id,
            URL_SAFE_NO_PAD.encode(out)
        )))
    }

    /// The value sealed for `context`, or the stored text when it is in clear.
    pub fn open(&self, context: &str, sealed: &Sealed) -> Result<String, OpenError> {
        let Some(rest) = sealed.0.strip_prefix(PREFIX) else {
            return Ok(sealed.0.clone());
        };
        let (id, body) = rest.split_once('.').unwrap_or((rest, ""));
        let key = self
            .keys
            .iter()
            .find(|k| k.id == id)
            .ok_or_else(|| OpenError::UnknownKey(id.to_owned()))?;
        let damaged = || OpenError::Damaged(id.to_owned());
        let mut bytes = URL_SAFE_NO_PAD.decode(body).map_err(|_| damaged())?;
        if bytes.len() < NONCE_LEN {
            return Err(damaged());
        }
        let mut data = bytes.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&bytes).map_err(|_| damaged())?;
        let plain = key
            .key
            .open_in_place(nonce, Aad::from(context.as_bytes()), &mut data)
            .map_err(|_| damaged())?;
        String::from_utf8(plain.to_vec()).map_err(|_| damaged())
    }

    /// Whether `sealed` is sealed under the current key (not in clear, not an older key).
    pub fn is_current(&self, sealed: &Sealed) -> bool {
        sealed.key_id() == Some(self.current().id.as_str())
    }
}

fn random_key() -> [u8; KEY_LEN] {
    let mut bytes = [0u8; KEY_LEN];
    OsRng.fill_bytes(&mut bytes);
    bytes
}

impl DataKey {
    fn new(bytes: &[u8]) -> Option<DataKey> {
        if bytes.len() != KEY_LEN {
            return None;
        }
        let digest = Sha256::new()
            .chain_update(b"tessera data key id\0")
            .chain_update(bytes)
            .finalize();
        let id = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).ok()?);
        Some(DataKey { id, key })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> String {
        DataKeys::generate()
    }

    #[test]
    fn a_sealed_value_opens_for_its_context_only() {
        let keys = DataKeys::parse(&key()).expect("keys");
        let s = keys
            .seal("workloads.token:1", "hunter2hunter2")
            .expect("seal");
        assert!(!s.as_stored().contains("hunter2"), "{}", s.as_stored());
        assert!(s.as_stored().starts_with(&keys.current_prefix()));
        assert!(keys.is_current(&s));
        assert_eq!(
            keys.open("workloads.token:1", &s).as_deref(),
            Ok("hunter2hunter2")
        );
        assert!(matches!(
            keys.open("workloads.token:2", &s),
            Err(OpenError::Damaged(_))
        ));
        assert!(matches!(
            keys.open("workloads.env:1", &s),
            Err(OpenError::Damaged(_))
        ));
        // Two seals of one value differ (fresh nonces).
        let t = keys
            .seal("workloads.token:1", "hunter2hunter2")
            .expect("seal");
        assert_ne!(s, t);
        assert!(!format!("{s:?}").contains("hunter2"));
    }

    #[test]
    fn the_wrong_key_does_not_open() {
        let a = DataKeys::parse(&key()).expect("a");
        let b = DataKeys::parse(&key()).expect("b");
        let s = a.seal("c", "secret value").expect("seal");
        assert_eq!(
            b.open("c", &s),
            Err(OpenError::UnknownKey(a.ids()[0].to_owned()))
        );
        // Even under the right key id, another key's bytes fail the tag.
        let forged = Sealed(s.as_stored().replacen(a.ids()[0], b.ids()[0], 1));
        assert!(matches!(b.open("c", &forged), Err(OpenError::Damaged(_))));
    }

    #[test]
    fn tampering_is_detected() {
        let keys = DataKeys::parse(&key()).expect("keys");
        let s = keys.seal("c", "secret value").expect("seal");
        let stored = s.as_stored();
        let (head, body) = stored.rsplit_once('.').expect("body");
        let mut bytes = URL_SAFE_NO_PAD.decode(body).expect("base64");
        for i in [0, NONCE_LEN, bytes.len() - 1] {
            bytes[i] ^= 1;
            let t = Sealed(format!("{head}.{}", URL_SAFE_NO_PAD.encode(&bytes)));
            assert!(
                matches!(keys.open("c", &t), Err(OpenError::Damaged(_))),
                "{i}"
            );
            bytes[i] ^= 1;
        }
        for bad in [format!("{head}."), format!("{head}.!!"), head.to_owned()] {
            assert!(keys.open("c", &Sealed(bad.clone())).is_err(), "{bad}");
        }
    }

    #[test]
    fn rotation_seals_with_the_newest_and_opens_with_all() {
        let (old, new) = (key(), key());
        let before = DataKeys::parse(&old).expect("old");
        let sealed_before = before.seal("c", "one").expect("seal");
        // The new key first, the old one kept (a file, newest first, with a comment).
        let after = DataKeys::parse(&format!("# rotated\n{new}\n{old} # retired\n")).expect("both");
        assert_eq!(after.ids().len(), 2);
        assert_eq!(after.open("c", &sealed_before).as_deref(), Ok("one"));
        assert!(!after.is_current(&sealed_before));
        let sealed_after = after.seal("c", "two").expect("seal");
        assert!(after.is_current(&sealed_after));
        assert_eq!(sealed_after.key_id(), Some(after.ids()[0]));
        // The old configuration cannot read what the new key sealed.
        assert!(matches!(
            before.open("c", &sealed_after),
            Err(OpenError::UnknownKey(_))
        ));
        // Commas work as well as lines (an environment variable).
        assert_eq!(
            DataKeys::parse(&format!("{new},{old}"))
                .expect("comma")
                .ids(),
            after.ids()
        );
    }

    #[test]
    fn values_in_clear_read_as_they_are() {
        let keys = DataKeys::parse(&key()).expect("keys");
        let clear = Sealed::clear("[{\"name\":\"A\",\"value\":\"b\"}]");
        assert_eq!(clear.key_id(), None);
        assert!(!keys.is_current(&clear));
        assert_eq!(
            keys.open("anything", &clear).as_deref(),
            Ok(clear.as_stored())
        );
    }

    #[test]
    fn bad_keys_are_refused() {
        assert!(DataKeys::parse("").is_err());
        assert!(DataKeys::parse("# only a comment").is_err());
        assert!(DataKeys::parse("not base64!").is_err());
        assert!(
            DataKeys::parse(&STANDARD.encode([1u8; 16])).is_err(),
            "too short"
        );
        let k = key();
        assert!(DataKeys::parse(&format!("{k}\n{k}")).is_err(), "twice");
    }
}
