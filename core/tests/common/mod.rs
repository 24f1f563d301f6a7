//! What the core integration tests share: a seeded generator and services on a migrated
//! store. (Each test includes this module; not every test uses every item.)
#![allow(dead_code)]

use std::sync::Arc;
use tessera_core::Services;
use tessera_core::auth::{SystemActor, limiter::LoginLimiter, password::Hasher};
use tessera_core::store::Store;
use tessera_domain::account::NewPassword;

/// A tiny seeded generator (no dependency, reproducible).
pub struct Lcg(pub u64);

impl Lcg {
    /// The next number in `0..n`.
    pub fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }

    /// One of `xs`, chosen by [`Lcg::next`].
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[usize::try_from(self.next(xs.len() as u64)).unwrap_or(0)]
    }
}

/// The migrated store at `url` and services over it, with the bootstrap admin's password
/// `admin_pw`, and the actor their passes run as.
pub async fn services_with_admin(url: &str, admin_pw: &str) -> (Store, Services, SystemActor) {
    let store = Store::connect(url).await.expect("connect");
    store.migrate().await.expect("migrate");
    let (services, system) = Services::new(
        store.clone(),
        Hasher::new(1, 4).expect("hasher"),
        Arc::new(LoginLimiter::new(Default::default())),
        std::time::Duration::from_secs(3600),
    );
    let pw = NewPassword::parse(admin_pw, "p").expect("pw");
    services
        .accounts
        .bootstrap_admin(&system, Some(&pw))
        .await
        .expect("admin");
    (store, services, system)
}
