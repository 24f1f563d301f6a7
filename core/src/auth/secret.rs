//! Bearer secrets (API tokens, join tokens, node credentials): 256 random bits, stored only
//! as a SHA-256 hash. A fast hash is right here: the secrets are not guessable, unlike
//! passwords.

use rand_core::{OsRng, RngCore};
use sha2::{Digest, Sha256};

/// A fresh secret `<kind>_<64 hex chars>` and its hash.
pub fn generate(kind: &str) -> (String, String) {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    let secret = format!("{kind}_{}", hex(&bytes));
    let hash = hash(&secret);
    (secret, hash)
}

/// `bytes` random bytes as hex, for values that are never stored (a CSP nonce).
pub fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    OsRng.fill_bytes(&mut b);
    hex(&b)
}

pub fn hash(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes()))
}

/// What lists show to tell secrets apart: the kind and 6 characters.
pub fn prefix(secret: &str) -> String {
    secret.chars().take(10).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_are_unique_and_hash_stably() {
        let (a, ha) = super::generate("tsk");
        let (b, _) = super::generate("tsk");
        assert_ne!(a, b);
        assert!(a.starts_with("tsk_") && a.len() == 68);
        assert_eq!(super::hash(&a), ha);
        assert_eq!(super::prefix(&a).len(), 10);
    }
}
