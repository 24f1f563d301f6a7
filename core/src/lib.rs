//! Tessera's use cases and what they stand on: the services (business rules and
//! authorization), the store (the only SQL), password hashing and browser sessions.
//!
//! Both adapters call into this crate directly: the UI's server functions (`tessera-app`
//! with `ssr`) and the REST handlers (`tessera-server`). Nothing here knows about routers,
//! HTML or JSON shapes; [`request`] is the one place that reads a request (its session and
//! client address) to find out who is calling.

pub mod at_rest;
pub mod auth;
pub mod clock;
pub mod request;
pub mod services;
pub mod sessions;
pub mod signals;
pub mod store;

use services::{
    accounts::Accounts, allocations::Allocations, billing::Billing, changes::Changes, nodes::Nodes,
    notifications::Notifications, tenancy::Tenancy, tokens::Tokens, workloads::Workloads,
};
use std::sync::Arc;
use std::time::Duration;
use store::Store;

/// The use cases, wired to their dependencies; shared as `Arc<Services>` by every adapter.
/// It holds no store of its own: the adapters reach rows only through the services,
/// which authorize.
pub struct Services {
    /// What the replicas coordinate through (leader lease, wake-ups, readiness).
    pub coordination: store::Coordination,
    pub accounts: Accounts,
    pub tenancy: Tenancy,
    pub tokens: Tokens,
    pub nodes: Nodes,
    pub allocations: Allocations,
    pub billing: Billing,
    pub workloads: Workloads,
    /// The image catalog, registry allow-list and teams' registry logins.
    pub images: services::images::Images,
    pub changes: Changes,
    pub notifications: Notifications,
    /// Wake-ups for the agents' long polls (`signals`).
    pub signals: Arc<signals::NodeSignals>,
    /// A browser session ends this long after sign-in, whatever its activity.
    pub session_absolute_timeout: Duration,
    /// Where every use case reads the time.
    pub clock: clock::Clock,
}

impl Services {
    /// The services, and the [`SystemActor`](auth::SystemActor) their background passes
    /// run as: given only here, to whoever builds them, before they are shared.
    pub fn new(
        store: Store,
        hasher: auth::password::Hasher,
        limiter: Arc<auth::limiter::LoginLimiter>,
        session_absolute_timeout: Duration,
    ) -> (Self, auth::SystemActor) {
        Self::with_clock(
            store,
            hasher,
            limiter,
            session_absolute_timeout,
            clock::Clock::system(),
        )
    }

    /// [`Services::new`] on `clock`: every use case reads the time from it.
    pub fn with_clock(
        store: Store,
        hasher: auth::password::Hasher,
        limiter: Arc<auth::limiter::LoginLimiter>,
        session_absolute_timeout: Duration,
        clock: clock::Clock,
    ) -> (Self, auth::SystemActor) {
        let catalog = Arc::new(tessera_domain::mig::Catalog::builtin());
        let billing = Billing::new(store.clone(), catalog.clone()).with_clock(clock.clone());
        let signals = Arc::new(signals::NodeSignals::new());
        let allocations = Allocations::new(store.clone(), catalog)
            .with_clock(clock.clone())
            .with_budgets(billing.clone())
            .with_signals(signals.clone());
        let tokens = Tokens::new(store.clone()).with_clock(clock.clone());
        let images = services::images::Images::new(store.clone()).with_clock(clock.clone());
        let services = Services {
            accounts: Accounts::new(store.clone(), hasher.clone(), limiter)
                .with_clock(clock.clone()),
            tenancy: Tenancy::new(store.clone(), hasher)
                .with_clock(clock.clone())
                .forgetting(tokens.verified()),
            tokens,
            nodes: Nodes::new(store.clone())
                .with_clock(clock.clone())
                .with_signals(signals.clone(), allocations.changed()),
            changes: Changes::new(store.clone()).with_clock(clock.clone()),
            notifications: Notifications::new(store.clone()).with_clock(clock.clone()),
            workloads: Workloads::new(store.clone(), allocations.clone())
                .with_clock(clock.clone())
                .with_images(images.clone()),
            images,
            allocations,
            billing,
            coordination: store::Coordination::new(store),
            signals,
            session_absolute_timeout,
            clock,
        };
        (services, auth::SystemActor::new())
    }

    /// Turns on single sign-on.
    pub fn with_sso(mut self, policy: services::accounts::SsoPolicy) -> Self {
        self.accounts = self.accounts.with_sso(policy);
        self
    }

    /// Seals secrets at rest under `keys` (workload tokens and environments, registry
    /// logins, webhook secrets): every service that seals or opens gets the same keys.
    pub fn with_data_keys(mut self, keys: Arc<at_rest::DataKeys>) -> Self {
        self.images = self.images.clone().with_data_keys(keys.clone());
        self.workloads = self
            .workloads
            .clone()
            .with_data_keys(keys.clone())
            .with_images(self.images.clone());
        self.notifications = self.notifications.clone().with_data_keys(keys);
        self
    }

    /// Sets the currency of prices and charges (ISO 4217).
    pub fn with_currency(mut self, currency: &str) -> Self {
        self.billing = self.billing.with_currency(currency);
        self.allocations = self.allocations.with_budgets(self.billing.clone());
        self
    }
}
