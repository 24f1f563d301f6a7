//! What the service-layer benches share: the stores to run on, a fresh store with the
//! bootstrap admin, and simulated nodes written straight to the store.
#![allow(dead_code)] // each bench uses part of it

use chrono::{DateTime, Utc};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tessera_core::Services;
use tessera_core::auth::{Principal, SystemActor};
use tessera_core::auth::{limiter::LoginLimiter, password::Hasher};
use tessera_core::store::{NodeRow, Store};
use tessera_domain::account::NewPassword;
use tessera_domain::alloc::{AllocationView, NewAllocation};
use tessera_domain::ids::{NodeId, TeamId};
use tessera_domain::wire::{GpuInfo, Inventory, MigInstance, MigMode, MigModeState};
use uuid::Uuid;

/// The multi-threaded Tokio runtime a bench's `main` runs on.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Node `n`'s GPU `i`: an H100 with MIG `mig` (now and pending), holding `instances`.
pub fn h100(n: usize, i: usize, mig: MigMode, instances: Vec<MigInstance>) -> GpuInfo {
    GpuInfo {
        index: i as u32,
        uuid: format!("GPU-{n:04}-{i}-{}", Uuid::new_v4().simple()),
        name: "NVIDIA H100 80GB HBM3".into(),
        memory_mib: 81_559,
        mig_mode: Some(MigModeState {
            current: mig,
            pending: mig,
        }),
        profiles: vec![],
        profiles_error: None,
        health: None,
        sharing: None,
        instances,
    }
}

/// A scratch folder for SQLite files, removed on drop unless `KEEP_DB` is set.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let d = std::env::temp_dir().join(format!("tessera-bench-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d)?;
        Ok(Scratch(d))
    }

    /// A fresh SQLite database URL in this folder.
    pub fn sqlite(&self, file: &str) -> String {
        format!("sqlite://{}/{file}.db?mode=rwc", self.0.display())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("KEEP_DB").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Where to run: a fresh SQLite file always, and a fresh PostgreSQL database when
/// `TESSERA_BENCH_PG_URL` is set. Call again for another set of fresh databases.
pub async fn targets(scratch: &Scratch, tag: &str) -> anyhow::Result<Vec<(&'static str, String)>> {
    let mut out = vec![("SQLite", scratch.sqlite(tag))];
    if let Ok(pg) = std::env::var("TESSERA_BENCH_PG_URL") {
        out.push(("PostgreSQL", Store::create_postgres_database(&pg).await?));
    }
    Ok(out)
}

/// A migrated store, its services and the bootstrap admin.
pub struct Bench {
    pub store: Store,
    pub services: Services,
    /// What the benchmarked passes run as.
    pub system: SystemActor,
    pub admin: Principal,
}

impl Bench {
    pub async fn open(url: &str) -> anyhow::Result<Self> {
        let store = Store::connect(url).await?;
        store.migrate().await?;
        let (services, system) = Services::new(
            store.clone(),
            Hasher::new(2, 16)?,
            Arc::new(LoginLimiter::new(Default::default())),
            Duration::from_secs(86400),
        );
        services
            .accounts
            .bootstrap_admin(
                &system,
                Some(&NewPassword::parse("bench-admin-password", "password").map_err(err)?),
            )
            .await?;
        let admin = services.accounts.principal_of("admin").await?;
        Ok(Bench {
            store,
            services,
            system,
            admin,
        })
    }

    /// A new team (a random name) with an H100-80GB quota line of `guaranteed`, `limit`
    /// and `per_user` units.
    pub async fn team(&self, guaranteed: u32, limit: u32, per_user: u32) -> anyhow::Result<TeamId> {
        let team = self
            .services
            .tenancy
            .create_team(&self.admin, &format!("bench-{}", Uuid::new_v4().simple()))
            .await
            .map_err(err)?;
        self.services
            .allocations
            .set_quota(
                &self.admin,
                team.id,
                "H100-80GB",
                guaranteed,
                limit,
                per_user,
            )
            .await
            .map_err(err)?;
        Ok(team.id)
    }

    /// A node named `hostname` that reports `gpus` and last beat at `now`.
    pub async fn add_node(
        &self,
        hostname: &str,
        gpus: Vec<GpuInfo>,
        now: DateTime<Utc>,
    ) -> anyhow::Result<NodeId> {
        let id = NodeId(Uuid::new_v4());
        self.store
            .insert_node(&NodeRow {
                id,
                hostname: hostname.to_owned(),
                credential_hash: Uuid::new_v4().to_string(),
                join_token_id: None,
                registered_at: now,
                last_heartbeat_at: Some(now),
                agent_version: "bench".into(),
                manages_mig: true,
                workload_sandbox: true,
                inventory: serde_json::to_string(&Inventory { gpus, driver: None })?,
                revoked_at: None,
                inventory_version: 0,
                node_group: None,
            })
            .await?;
        Ok(id)
    }
}

/// The variable `name` as a number, or `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl Bench {
    /// One `kind` for `team`, as its admin asks through the service (one of it, no end, no
    /// start time).
    pub async fn request(&self, team: TeamId, kind: &str) -> anyhow::Result<AllocationView> {
        self.services
            .allocations
            .request(
                &self.admin,
                &NewAllocation {
                    team_id: team.to_string(),
                    kind: kind.to_owned(),
                    count: 1,
                    duration_minutes: None,
                    starts_at: None,
                    priority: None,
                    purpose: String::new(),
                    needs_cuda: None,
                    nodes: None,
                },
                None,
            )
            .await
            .map_err(err)
    }
}

pub fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}
