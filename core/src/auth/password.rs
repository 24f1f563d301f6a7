//! Argon2id hashing on blocking threads, with bounded concurrency and load shedding.
//!
//! Each hash costs ~19 MiB and tens of milliseconds of CPU. At most `workers` run at once;
//! up to `queue` more may wait; anything beyond is refused immediately with
//! [`Busy`], which the service turns into 429 + `Retry-After`. A login flood therefore
//! cannot starve other requests of CPU, memory or the async runtime.

use argon2::password_hash::{PasswordHash, PasswordHasher as _, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use rand_core::OsRng;
use std::sync::Arc;
use tessera_domain::account::NewPassword;
use tessera_domain::error::AppError;
use tokio::sync::Semaphore;

/// The hasher is saturated; try again shortly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

#[derive(Clone)]
pub struct Hasher {
    admission: Arc<Semaphore>,
    workers: Arc<Semaphore>,
    params: Params,
    /// Verified against for unknown usernames so their timing matches real accounts.
    dummy_hash: Arc<str>,
}

impl Hasher {
    /// OWASP's argon2id baseline: m = 19 MiB, t = 2, p = 1.
    pub fn new(workers: usize, queue: usize) -> anyhow::Result<Self> {
        let params = Params::new(19 * 1024, 2, 1, None)
            .map_err(|e| anyhow::anyhow!("argon2 parameters: {e}"))?;
        let dummy_hash = hash_now(&params, "tessera dummy password for timing")
            .map_err(|e| anyhow::anyhow!("argon2: {e}"))?;
        Ok(Self {
            admission: Arc::new(Semaphore::new(workers + queue)),
            workers: Arc::new(Semaphore::new(workers)),
            params,
            dummy_hash: dummy_hash.into(),
        })
    }

    pub async fn hash(&self, password: &str) -> Result<String, HashError> {
        let params = self.params.clone();
        let password = password.to_owned();
        self.run(move || hash_now(&params, &password).map_err(|_| HashError::Internal))
            .await?
    }

    /// A new password checked against the rules (`field` names it in the error), hashed.
    pub async fn hash_new(&self, raw: &str, field: &str) -> Result<String, AppError> {
        let password = NewPassword::parse(raw, field)?;
        Ok(self.hash(password.expose()).await?)
    }

    /// Verifies `password` against `phc`; with `phc = None` verifies against a dummy hash
    /// (and always fails) so unknown users cost the same time as known ones.
    pub async fn verify(&self, password: &str, phc: Option<&str>) -> Result<bool, HashError> {
        let known = phc.is_some();
        let phc = phc
            .map(str::to_owned)
            .unwrap_or_else(|| self.dummy_hash.to_string());
        let password = password.to_owned();
        let ok = self
            .run(move || {
                let parsed = PasswordHash::new(&phc).map_err(|_| HashError::Internal)?;
                Ok::<_, HashError>(
                    Argon2::default()
                        .verify_password(password.as_bytes(), &parsed)
                        .is_ok(),
                )
            })
            .await??;
        Ok(known && ok)
    }

    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, HashError> {
        let _admitted = self
            .admission
            .clone()
            .try_acquire_owned()
            .map_err(|_| HashError::Busy(Busy))?;
        let _worker = self
            .workers
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| HashError::Internal)?;
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|_| HashError::Internal)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashError {
    Busy(Busy),
    Internal,
}

/// A saturated hasher asks the caller to come back in a second; a failure is logged.
impl From<HashError> for AppError {
    fn from(e: HashError) -> Self {
        match e {
            HashError::Busy(_) => AppError::RateLimited {
                retry_after_secs: 1,
            },
            HashError::Internal => {
                tracing::error!("password hashing failed");
                AppError::Internal
            }
        }
    }
}

fn hash_now(params: &Params, password: &str) -> Result<String, argon2::password_hash::Error> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params.clone())
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn hashes_verify_and_unknown_users_never_verify() {
        let h = Hasher::new(1, 1).expect("hasher");
        let phc = h.hash("correct horse battery").await.expect("hash");
        assert!(phc.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{phc}");
        assert!(
            h.verify("correct horse battery", Some(&phc))
                .await
                .expect("verify")
        );
        assert!(!h.verify("wrong", Some(&phc)).await.expect("verify"));
        assert!(
            !h.verify("tessera dummy password for timing", None)
                .await
                .expect("verify")
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn excess_work_is_refused_not_queued() {
        let h = Hasher::new(1, 0).expect("hasher");
        let phc = h.hash("correct horse battery").await.expect("hash");
        let a = {
            let h = h.clone();
            let phc = phc.clone();
            tokio::spawn(async move { h.verify("x", Some(&phc)).await })
        };
        // Wait until the first verification holds the only slot.
        while h.admission.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(h.verify("y", Some(&phc)).await, Err(HashError::Busy(Busy)));
        assert_eq!(a.await.expect("join"), Ok(false));
    }
}
