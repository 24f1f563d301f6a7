//! Personal API tokens and bearer authentication.

use super::internal;
use super::tenancy::paged;
use crate::auth::secret;
use crate::store::{ApiTokenRow, Store};
use chrono::{Duration, Utc};
use tessera_domain::account::{Principal, Username};
use tessera_domain::error::AppError;
use tessera_domain::ids::UserId;
use tessera_domain::tenancy::{ApiTokenView, CreatedSecret, Page, PageRequest, parse_token_name};
use uuid::Uuid;

/// Longest allowed token lifetime.
pub const MAX_DAYS: u32 = 366;

#[derive(Clone)]
pub struct Tokens {
    store: Store,
}

impl Tokens {
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    pub async fn list(
        &self,
        p: &Principal,
        page: PageRequest,
    ) -> Result<Page<ApiTokenView>, AppError> {
        let page = page.clamped();
        let (rows, total) = self
            .store
            .list_api_tokens(p.user_id.0, page.offset, page.limit)
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
        let now = Utc::now();
        let row = ApiTokenRow {
            id: Uuid::new_v4(),
            user_id: p.user_id.0,
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
        tracing::info!(user = %p.username, token = %row.prefix, "API token created");
        Ok(CreatedSecret {
            token: view(&row),
            secret,
        })
    }

    pub async fn revoke(&self, p: &Principal, id: Uuid) -> Result<(), AppError> {
        if self
            .store
            .revoke_api_token(p.user_id.0, id, Utc::now())
            .await
            .map_err(internal("revoking token"))?
        {
            Ok(())
        } else {
            Err(AppError::NotFound)
        }
    }

    /// The principal behind `Authorization: Bearer <secret>`, or `Unauthorized`. Expired
    /// and revoked tokens, and tokens of disabled users, do not work.
    pub async fn authenticate(&self, bearer: &str) -> Result<Principal, AppError> {
        let now = Utc::now();
        let Some(token) = self
            .store
            .api_token_by_hash(&secret::hash(bearer))
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
        Ok(Principal {
            user_id: UserId(user.id),
            username: Username::parse(&user.username).map_err(|_| AppError::Internal)?,
            is_admin: user.is_admin,
        })
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
