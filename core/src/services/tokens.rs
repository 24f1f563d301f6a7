//! Personal API tokens and bearer authentication.

use super::internal;
use super::tenancy::paged;
use crate::auth::Principal;
use crate::auth::secret;
use crate::clock::Clock;
use crate::store::{ApiTokenRow, Store};
use chrono::{DateTime, Duration, Utc};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tessera_domain::account::Username;
use tessera_domain::error::AppError;
use tessera_domain::ids::UserId;
use tessera_domain::tenancy::{ApiTokenView, CreatedSecret, Page, PageRequest, parse_token_name};
use uuid::Uuid;

/// Longest allowed token lifetime.
pub const MAX_DAYS: u32 = 366;

/// How long a verified token is trusted without asking the database again. A token revoked
/// or a user disabled on any replica is refused everywhere within this; the replica that
/// revokes a token forgets it at once.
pub const VERIFIED_FOR: std::time::Duration = std::time::Duration::from_millis(500);

/// Verified tokens kept at most (beyond, the cache starts over: it only saves queries).
const VERIFIED_MAX: usize = 10_000;

#[derive(Clone)]
pub struct Tokens {
    store: Store,
    clock: Clock,
    verified: VerifiedTokens,
}

/// Tokens this replica verified lately, by secret hash: who they act as, until when the
/// token itself is valid, and when they were checked. Shared with the use cases that must
/// stop a token here at once (revoking it, disabling its user).
#[derive(Clone, Default)]
pub struct VerifiedTokens(Arc<Mutex<HashMap<String, Verified>>>);

impl VerifiedTokens {
    /// Forgets every verified token: the next use of each asks the database.
    pub fn forget_all(&self) {
        if let Ok(mut cache) = self.0.lock() {
            cache.clear();
        }
    }

    fn get(&self, hash: &str, now: DateTime<Utc>) -> Option<Principal> {
        let cache = self.0.lock().ok()?;
        let v = cache.get(hash)?;
        (v.checked.elapsed() < VERIFIED_FOR && v.expires_at.is_none_or(|e| e > now))
            .then(|| v.principal.clone())
    }

    fn put(&self, hash: String, v: Verified) {
        if let Ok(mut cache) = self.0.lock() {
            if cache.len() >= VERIFIED_MAX {
                cache.clear();
            }
            cache.insert(hash, v);
        }
    }
}

#[derive(Clone)]
struct Verified {
    principal: Principal,
    expires_at: Option<DateTime<Utc>>,
    checked: Instant,
}

impl Tokens {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            clock: Clock::system(),
            verified: VerifiedTokens::default(),
        }
    }

    /// Reads the time from `clock` instead of the system's.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// This replica's verified tokens (to forget them when a user is disabled).
    pub fn verified(&self) -> VerifiedTokens {
        self.verified.clone()
    }

    pub async fn list(
        &self,
        p: &Principal,
        page: PageRequest,
    ) -> Result<Page<ApiTokenView>, AppError> {
        let page = page.clamped();
        let (rows, total) = self
            .store
            .list_api_tokens(p.user_id(), page.offset, page.limit)
            .await
            .map_err(internal("listing tokens"))?;
        Ok(paged(rows.iter().map(view).collect(), total, page))
    }

    /// Creates a token acting as `p`; the secret is returned once.
    pub async fn create(
        &self,
        p: &Principal,
        name: &str,
        expires_in_days: Option<u32>,
    ) -> Result<CreatedSecret<ApiTokenView>, AppError> {
        let name = parse_token_name(name)?;
        if let Some(d) = expires_in_days
            && !(1..=MAX_DAYS).contains(&d)
        {
            return Err(AppError::invalid(
                "expires_in_days",
                format!("must be between 1 and {MAX_DAYS} days (or empty for no expiry)"),
            ));
        }
        let (secret, hash) = secret::generate("tsk");
        let now = self.clock.now();
        let row = ApiTokenRow {
            id: Uuid::new_v4(),
            user_id: p.user_id(),
            name,
            prefix: secret::prefix(&secret),
            secret_hash: hash,
            created_at: now,
            expires_at: expires_in_days.map(|d| now + Duration::days(i64::from(d))),
            last_used_at: None,
            revoked_at: None,
        };
        self.store
            .insert_api_token(&row)
            .await
            .map_err(internal("creating token"))?;
        tracing::info!(user = %p.username(), token = %row.prefix, "API token created");
        Ok(CreatedSecret {
            token: view(&row),
            secret,
        })
    }

    pub async fn revoke(&self, p: &Principal, id: Uuid) -> Result<(), AppError> {
        // Forget every verified token of this replica: the revoked one must stop here at
        // once (other replicas stop within `VERIFIED_FOR`).
        self.verified.forget_all();
        if self
            .store
            .revoke_api_token(p.user_id(), id, self.clock.now())
            .await
            .map_err(internal("revoking token"))?
        {
            Ok(())
        } else {
            Err(AppError::NotFound)
        }
    }

    /// The principal behind `Authorization: Bearer <secret>`, or `Unauthorized`. Expired
    /// and revoked tokens, and tokens of disabled users, do not work (checked in the
    /// database at most every [`VERIFIED_FOR`] per token).
    pub async fn authenticate(&self, bearer: &str) -> Result<Principal, AppError> {
        let now = self.clock.now();
        let hash = secret::hash(bearer);
        if let Some(p) = self.verified.get(&hash, now) {
            return Ok(p);
        }
        let checked = Instant::now();
        let Some(token) = self
            .store
            .api_token_by_hash(&hash)
            .await
            .map_err(internal("loading token"))?
        else {
            tracing::info!(token = %secret::prefix(bearer), "unknown or revoked API token");
            return Err(AppError::Unauthorized);
        };
        if token.expires_at.is_some_and(|e| e <= now) {
            return Err(AppError::Unauthorized);
        }
        let user = self
            .store
            .user_by_id(token.user_id)
            .await
            .map_err(internal("loading token owner"))?
            .filter(|u| !u.disabled)
            .ok_or(AppError::Unauthorized)?;
        // Record use at most once a minute: no write per request.
        if token
            .last_used_at
            .is_none_or(|t| now - t > Duration::minutes(1))
        {
            self.store
                .touch_api_token(token.id, now)
                .await
                .map_err(internal("touching token"))?;
        }
        let principal = Principal::of_user(
            UserId(user.id.0),
            Username::parse(&user.username).map_err(|_| AppError::Internal)?,
            user.is_admin,
        );
        self.verified.put(
            hash,
            Verified {
                principal: principal.clone(),
                expires_at: token.expires_at,
                checked,
            },
        );
        Ok(principal)
    }
}

fn view(r: &ApiTokenRow) -> ApiTokenView {
    ApiTokenView {
        id: r.id,
        name: r.name.clone(),
        prefix: r.prefix.clone(),
        created_at: r.created_at,
        expires_at: r.expires_at,
        last_used_at: r.last_used_at,
    }
}
