//! Accounts: bootstrap, sign-in, session validation and password changes.

use super::internal;
use crate::auth::limiter::LoginLimiter;
use crate::auth::password::Hasher;
use crate::auth::{Principal, SystemActor};
use crate::clock::Clock;
use crate::store::{NO_PASSWORD, SsoOutcome, SsoSignIn, Store, UserRow};
use chrono::{DateTime, Utc};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;
use tessera_domain::account::{NewPassword, SetupChecklist, SetupFacts, SignInOptions, Username};
use tessera_domain::error::AppError;
use tessera_domain::ids::UserId;
use tessera_domain::sso::{GroupMap, numbered_username, username_candidate};
use uuid::Uuid;

/// The name of the platform administrator created on an empty database.
pub const BOOTSTRAP_ADMIN: &str = "admin";

#[derive(Clone)]
pub struct Accounts {
    store: Store,
    clock: Clock,
    hasher: Hasher,
    limiter: Arc<LoginLimiter>,
    sso: Option<Arc<SsoPolicy>>,
}

/// Single sign-on as the administrator configured it: the provider's display name, its
/// issuer, and what its groups grant.
#[derive(Debug, Clone)]
pub struct SsoPolicy {
    pub provider_name: String,
    pub issuer: String,
    pub groups: GroupMap,
}

/// A person the identity provider of the [`SsoPolicy`] vouched for. The caller has
/// verified the ID token (signature, issuer, audience, expiry, nonce); the policy's issuer
/// and `subject` identify the person.
#[derive(Debug, Clone)]
pub struct ExternalIdentity {
    pub subject: String,
    pub preferred_username: Option<String>,
    pub email: Option<String>,
    /// The provider vouches for `email` (its `email_verified` claim).
    pub email_verified: bool,
    pub groups: Vec<String>,
}

/// A successful sign-in: who, and when (sessions older than a password change are void).
#[derive(Debug, Clone)]
pub struct SignedIn {
    pub principal: Principal,
    pub at: DateTime<Utc>,
}

impl Accounts {
    pub fn new(store: Store, hasher: Hasher, limiter: Arc<LoginLimiter>) -> Self {
        Self {
            store,
            clock: Clock::system(),
            hasher,
            limiter,
            sso: None,
        }
    }

    /// Reads the time from `clock` instead of the system's.
    /// The principal of stored user `username`, for trusted server code that acts as that
    /// user without a request (the simulator's admin, tests). No request path calls this:
    /// the xtask checks that only `server/src/sim.rs`, tests and benches do. A disabled
    /// user has none.
    pub async fn principal_of(&self, username: &str) -> Result<Principal, AppError> {
        let user = self
            .store
            .user_by_username(username)
            .await
            .map_err(internal("loading user"))?
            .filter(|u| !u.disabled)
            .ok_or(AppError::NotFound)?;
        principal(&user)
    }

    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Turns on single sign-on with `policy`.
    pub fn with_sso(mut self, policy: SsoPolicy) -> Self {
        self.sso = Some(Arc::new(policy));
        self
    }

    /// What the sign-in page offers besides a password (anyone may ask).
    /// A platform admin's first-run checklist (others: `Forbidden`).
    pub async fn setup_checklist(&self, p: &Principal) -> Result<SetupChecklist, AppError> {
        if !p.is_admin() {
            return Err(AppError::Forbidden);
        }
        let (teams, quotas, people, nodes, rates, dismissed) = self
            .store
            .setup_facts(p.user_id())
            .await
            .map_err(internal("loading setup facts"))?;
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        let facts = SetupFacts {
            teams: n(teams),
            quotas: n(quotas),
            people: n(people),
            sso: self.sso.is_some(),
            nodes: n(nodes),
            rates: n(rates),
        };
        Ok(SetupChecklist::from_facts(facts, dismissed))
    }

    /// Puts the checklist away for this admin.
    pub async fn dismiss_setup(&self, p: &Principal) -> Result<SetupChecklist, AppError> {
        if !p.is_admin() {
            return Err(AppError::Forbidden);
        }
        self.store
            .dismiss_setup(p.user_id())
            .await
            .map_err(internal("dismissing the checklist"))?;
        self.setup_checklist(p).await
    }

    pub fn sign_in_options(&self) -> SignInOptions {
        SignInOptions {
            sso_provider: self.sso.as_ref().map(|p| p.provider_name.clone()),
        }
    }

    /// Signs in a person the identity provider vouched for: the first time, creates their
    /// user (no password; the username from their claims, numbered when taken); every
    /// time, sets their membership in each team the group map manages, and platform admin
    /// where the map grants it, to what their groups say now (see `domain::sso`). A
    /// disabled user gets [`AppError::Forbidden`] and nothing changes.
    pub async fn sign_in_sso(&self, who: &ExternalIdentity) -> Result<SignedIn, AppError> {
        let policy = self.sso.as_ref().ok_or(AppError::NotFound)?;
        let grants = policy.groups.resolve(&who.groups);
        let base = username_candidate(
            who.preferred_username.as_deref(),
            who.email.as_deref(),
            &who.subject,
        );
        let groups_json = serde_json::to_string(&who.groups).map_err(|_| AppError::Internal)?;
        let sign_in = SsoSignIn {
            issuer: &policy.issuer,
            subject: &who.subject,
            email: who.email.as_deref(),
            groups_json: &groups_json,
            usernames: (1..=100)
                .map(|n| numbered_username(&base, n).as_str().to_owned())
                .collect(),
            teams: grants
                .teams
                .iter()
                .map(|(team, role)| (team.clone(), role.map(|r| r.as_str())))
                .collect(),
            manages_admin: policy.groups.manages_platform_admin(),
            grants_admin: grants.platform_admin,
            now: self.clock.now(),
        };
        let outcome = self
            .store
            .sso_sign_in(&sign_in)
            .await
            .map_err(internal("single sign-on"))?;
        let (user, changes) = match outcome {
            SsoOutcome::SignedIn { user, changes } => (user, changes),
            SsoOutcome::Disabled => {
                tracing::info!(subject = %who.subject, "single sign-on refused: user disabled");
                return Err(AppError::Forbidden);
            }
        };
        // An address the provider vouches for is the user's verified notification address,
        // unless they gave one of their own.
        if let (Some(email), true) = (who.email.as_deref(), who.email_verified)
            && let Ok(email) = tessera_domain::notify::parse_email(email, "email")
        {
            self.store
                .adopt_idp_email(user.id, &email)
                .await
                .map_err(internal("taking the provider's address"))?;
        }
        if !grants.unknown_groups.is_empty() {
            tracing::debug!(user = %user.username, groups = ?grants.unknown_groups, "groups the map does not name");
        }
        if !changes.missing_teams.is_empty() {
            tracing::warn!(user = %user.username, teams = ?changes.missing_teams,
                "the group map names teams that do not exist");
        }
        tracing::info!(user = %user.username, created = changes.created,
            teams = ?changes.teams, admin = ?changes.admin, "signed in through single sign-on");
        Ok(SignedIn {
            principal: principal(&user)?,
            // Not `sign_in.now`: a concurrent first sign-in may have created the user (and
            // its `sessions_valid_after`) after this one read the clock.
            at: self.clock.now().max(user.sessions_valid_after),
        })
    }

    /// On an empty database, creates the platform admin `admin` with `password`, or with a
    /// generated password that is returned so the caller can print it once. Only whoever
    /// built the services (the platform) does this.
    pub async fn bootstrap_admin(
        &self,
        _: &SystemActor,
        password: Option<&NewPassword>,
    ) -> anyhow::Result<Option<Bootstrapped>> {
        if self.store.count_users().await? > 0 {
            return Ok(None);
        }
        let (password, generated) = match password {
            Some(p) => (p.expose().to_owned(), false),
            None => (generate_password(), true),
        };
        let hash = self
            .hasher
            .hash(&password)
            .await
            .map_err(|e| anyhow::anyhow!("hashing the admin password failed: {e:?}"))?;
        let now = self.clock.now();
        let created = self
            .store
            .insert_user(&UserRow {
                id: UserId(Uuid::new_v4()),
                username: BOOTSTRAP_ADMIN.to_owned(),
                password_hash: hash,
                is_admin: true,
                disabled: false,
                sessions_valid_after: now,
                created_at: now,
            })
            .await?;
        Ok(created.then_some(Bootstrapped {
            generated_password: generated.then_some(password),
        }))
    }

    /// Verifies a username and password. Unknown users, disabled users and wrong passwords
    /// all take the same time and get the same [`AppError::InvalidCredentials`].
    pub async fn login(
        &self,
        username: &str,
        password: &str,
        client: IpAddr,
    ) -> Result<SignedIn, AppError> {
        if username.trim().is_empty() {
            return Err(AppError::invalid("username", "is required"));
        }
        if password.is_empty() {
            return Err(AppError::invalid("password", "is required"));
        }
        let key = username.trim().to_ascii_lowercase();
        self.limiter
            .check(&key, client, Instant::now())
            .map_err(|wait| AppError::RateLimited {
                retry_after_secs: wait.as_secs().max(1),
            })?;
        let user = match Username::parse(&key) {
            Ok(name) => self
                .store
                .user_by_username(name.as_str())
                .await
                .map_err(internal("loading user for login"))?,
            Err(_) => None,
        };
        // Users of single sign-on have no password here: they take the unknown-user path.
        let usable = user
            .as_ref()
            .filter(|u| !u.disabled && u.password_hash != NO_PASSWORD);
        let ok = self
            .hasher
            .verify(password, usable.map(|u| u.password_hash.as_str()))
            .await?;
        match (ok, usable) {
            (true, Some(u)) => {
                self.limiter.record_success(&key, client);
                Ok(SignedIn {
                    principal: principal(u)?,
                    at: self.clock.now(),
                })
            }
            _ => {
                self.limiter.record_failure(&key, client, Instant::now());
                tracing::info!(username = %key, %client, "failed sign-in");
                Err(AppError::InvalidCredentials)
            }
        }
    }

    /// The principal behind a session, or `None` when the user is gone, disabled, or changed
    /// their password after this session signed in.
    pub async fn principal_for_session(
        &self,
        user_id: Uuid,
        signed_in_at: DateTime<Utc>,
    ) -> Result<Option<Principal>, AppError> {
        let Some(user) = self
            .store
            .user_by_id(UserId(user_id))
            .await
            .map_err(internal("loading session user"))?
        else {
            return Ok(None);
        };
        if user.disabled || user.sessions_valid_after > signed_in_at {
            return Ok(None);
        }
        principal(&user).map(Some)
    }

    /// Changes the caller's own password. Returns the instant of the change; sessions that
    /// signed in before it are void (the caller's own session is renewed by the caller).
    pub async fn change_password(
        &self,
        who: &Principal,
        current: &str,
        new: &str,
        confirm: &str,
        client: IpAddr,
    ) -> Result<DateTime<Utc>, AppError> {
        if current.is_empty() {
            return Err(AppError::invalid("current_password", "is required"));
        }
        let new_pw = NewPassword::parse(new, "new_password")?;
        if new != confirm {
            return Err(AppError::invalid(
                "confirm_password",
                "does not match the new password",
            ));
        }
        if new == current {
            return Err(AppError::invalid(
                "new_password",
                "must differ from the current password",
            ));
        }
        let key = format!("password-change:{}", who.user_id());
        self.limiter
            .check(&key, client, Instant::now())
            .map_err(|wait| AppError::RateLimited {
                retry_after_secs: wait.as_secs().max(1),
            })?;
        let user = self
            .store
            .user_by_id(who.user_id())
            .await
            .map_err(internal("loading user for password change"))?
            .ok_or(AppError::Unauthorized)?;
        if user.password_hash == NO_PASSWORD {
            return Err(AppError::invalid(
                "current_password",
                "this account signs in through single sign-on and has no password here",
            ));
        }
        if !self
            .hasher
            .verify(current, Some(&user.password_hash))
            .await?
        {
            self.limiter.record_failure(&key, client, Instant::now());
            return Err(AppError::invalid("current_password", "is incorrect"));
        }
        let hash = self.hasher.hash(new_pw.expose()).await?;
        let at = self.clock.now();
        let changed = self
            .store
            .set_password_hash(user.id.0, &user.password_hash, &hash, at)
            .await
            .map_err(internal("storing new password"))?;
        if !changed {
            return Err(AppError::conflict(
                "the password was changed concurrently; sign in again",
            ));
        }
        self.limiter.record_success(&key, client);
        tracing::info!(user = %who.username(), "password changed");
        Ok(at)
    }
}

/// Result of [`Accounts::bootstrap_admin`].
#[derive(Debug)]
pub struct Bootstrapped {
    /// Set when no password was configured; print it once.
    pub generated_password: Option<String>,
}

fn principal(u: &UserRow) -> Result<Principal, AppError> {
    Ok(Principal::of_user(
        UserId(u.id.0),
        Username::parse(&u.username).map_err(|_| {
            tracing::error!(username = %u.username, "stored username is not valid");
            AppError::Internal
        })?,
        u.is_admin,
    ))
}

/// 20 characters from a 56-symbol alphabet without look-alikes (~116 bits).
fn generate_password() -> String {
    use rand_core::{OsRng, RngCore};
    const ALPHABET: &[u8] = b"abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut out = String::with_capacity(20);
    while out.len() < 20 {
        let b = (OsRng.next_u32() & 0xff) as usize;
        // Rejection sampling keeps the distribution uniform.
        if b < 256 - 256 % ALPHABET.len() {
            out.push(ALPHABET[b % ALPHABET.len()] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn generated_passwords_meet_the_policy_and_differ() {
        let a = super::generate_password();
        let b = super::generate_password();
        assert_eq!(a.len(), 20);
        assert_ne!(a, b);
        assert!(tessera_domain::account::NewPassword::parse(&a, "p").is_ok());
    }
}
