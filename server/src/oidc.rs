//! OpenID Connect single sign-on, the relying party's half (the only `openidconnect`
//! import): discovery from the issuer URL, the authorization code flow with PKCE, state and
//! nonce, and ID token verification (signature against the provider's published keys,
//! issuer, audience, expiry, nonce). What a verified identity may do is decided in
//! `tessera-core` (`Accounts::sign_in_sso`); the routes are in `http/sso.rs`.

use crate::settings::Secret;
use chrono::{DateTime, Utc};
use clap::Args;
use openidconnect::core::{
    CoreAuthDisplay, CoreAuthPrompt, CoreErrorResponseType, CoreGenderClaim, CoreJsonWebKey,
    CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm, CoreProviderMetadata,
    CoreResponseType, CoreRevocableToken, CoreRevocationErrorResponse,
    CoreTokenIntrospectionResponse, CoreTokenType,
};
use openidconnect::{
    AdditionalClaims, AuthenticationFlow, AuthorizationCode, Client, ClientId, ClientSecret,
    CsrfToken, EmptyExtraTokenFields, EndpointMaybeSet, EndpointNotSet, EndpointSet, IdTokenFields,
    IssuerUrl, Nonce, OAuth2TokenResponse, PkceCodeChallenge, PkceCodeVerifier, RedirectUrl, Scope,
    StandardErrorResponse, StandardTokenResponse, TokenResponse, UserInfoClaims,
};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use tessera_core::services::accounts::{ExternalIdentity, SsoPolicy};
use tessera_domain::sso::GroupMap;
use tokio::sync::Mutex;

/// Single sign-on settings (`TESSERA_OIDC_*`). Setting the issuer turns it on.
#[derive(Debug, Clone, Args)]
pub struct OidcSettings {
    /// OpenID Connect issuer URL; turns on "Sign in with <provider>" (discovery reads
    /// `<issuer>/.well-known/openid-configuration`). Must be https except on loopback.
    #[arg(long = "oidc-issuer", env = "TESSERA_OIDC_ISSUER")]
    pub issuer: Option<String>,

    /// The client id registered at the provider (redirect URI:
    /// `<TESSERA_PUBLIC_URL>/auth/oidc/callback`).
    #[arg(long = "oidc-client-id", env = "TESSERA_OIDC_CLIENT_ID")]
    pub client_id: Option<String>,

    /// The client secret (confidential client, `client_secret_basic`).
    #[arg(
        long = "oidc-client-secret",
        env = "TESSERA_OIDC_CLIENT_SECRET",
        hide_env_values = true
    )]
    pub client_secret: Option<Secret>,

    /// The provider's name on the sign-in button ("Sign in with <name>").
    #[arg(
        long = "oidc-provider-name",
        env = "TESSERA_OIDC_PROVIDER_NAME",
        default_value = "SSO"
    )]
    pub provider_name: String,

    /// Scopes to ask for, space-separated; must include `openid`.
    #[arg(
        long = "oidc-scopes",
        env = "TESSERA_OIDC_SCOPES",
        default_value = "openid profile email groups"
    )]
    pub scopes: String,

    /// The ID token claim that lists the user's groups (a list of strings, or one string).
    #[arg(
        long = "oidc-groups-claim",
        env = "TESSERA_OIDC_GROUPS_CLAIM",
        default_value = "groups"
    )]
    pub groups_claim: String,

    /// Groups → teams and roles, applied at every sign-in:
    /// `gpu-vision-admins=vision:team_admin; gpu-vision=vision:member; gpu-ops=platform_admin`.
    #[arg(
        long = "oidc-group-map",
        env = "TESSERA_OIDC_GROUP_MAP",
        default_value = ""
    )]
    pub group_map: String,
}

impl OidcSettings {
    /// Checks the settings that clap cannot.
    pub fn validate(&self) -> Result<(), String> {
        let Some(issuer) = &self.issuer else {
            if self.client_id.is_some() || !self.group_map.trim().is_empty() {
                return Err(
                    "TESSERA_OIDC_CLIENT_ID or TESSERA_OIDC_GROUP_MAP is set but \
                            TESSERA_OIDC_ISSUER (--oidc-issuer) is not"
                        .into(),
                );
            }
            return Ok(());
        };
        let url = IssuerUrl::new(issuer.clone())
            .map_err(|e| format!("TESSERA_OIDC_ISSUER (--oidc-issuer): {e}"))?;
        let parsed = url.url();
        let loopback = matches!(parsed.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
        if parsed.scheme() != "https" && !(parsed.scheme() == "http" && loopback) {
            return Err(
                "TESSERA_OIDC_ISSUER (--oidc-issuer) must be an https:// URL (http only on loopback)"
                    .into(),
            );
        }
        if self
            .client_id
            .as_deref()
            .is_none_or(|c| c.trim().is_empty())
        {
            return Err(
                "TESSERA_OIDC_CLIENT_ID (--oidc-client-id) is required with TESSERA_OIDC_ISSUER"
                    .into(),
            );
        }
        if !self.scopes.split_whitespace().any(|s| s == "openid") {
            return Err("TESSERA_OIDC_SCOPES (--oidc-scopes) must include openid".into());
        }
        if self.groups_claim.trim().is_empty() {
            return Err("TESSERA_OIDC_GROUPS_CLAIM (--oidc-groups-claim) must not be empty".into());
        }
        if self.provider_name.trim().is_empty() {
            return Err(
                "TESSERA_OIDC_PROVIDER_NAME (--oidc-provider-name) must not be empty".into(),
            );
        }
        GroupMap::parse(&self.group_map).map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// Every claim of the ID token beyond the standard ones (the group claim is among them; its
/// name is a setting).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OtherClaims {
    #[serde(flatten)]
    claims: serde_json::Map<String, serde_json::Value>,
}
impl AdditionalClaims for OtherClaims {}

type IdFields = IdTokenFields<
    OtherClaims,
    EmptyExtraTokenFields,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
>;
type OidcClient = Client<
    OtherClaims,
    CoreAuthDisplay,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJsonWebKey,
    CoreAuthPrompt,
    StandardErrorResponse<CoreErrorResponseType>,
    StandardTokenResponse<IdFields, CoreTokenType>,
    CoreTokenIntrospectionResponse,
    CoreRevocableToken,
    CoreRevocationErrorResponse,
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// A sign-in in progress, kept in the browser's (anonymous) session between the redirect
/// to the provider and its answer. Used once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingLogin {
    state: String,
    nonce: String,
    pkce_verifier: String,
    started_at: DateTime<Utc>,
}

impl PendingLogin {
    /// Whether `answer` carries this sign-in's state (compared in constant time) and came
    /// within [`PENDING_MINUTES`].
    fn answered_by(&self, answer: &CallbackQuery, now: DateTime<Utc>) -> bool {
        let state_ok = answer
            .state
            .as_deref()
            .is_some_and(|s| constant_time_eq(s.as_bytes(), self.state.as_bytes()));
        state_ok && now - self.started_at <= chrono::Duration::minutes(PENDING_MINUTES)
    }
}

/// How long a user may spend at the provider before the answer is refused (and the
/// anonymous session that carries the pending sign-in expires).
pub const PENDING_MINUTES: i64 = 10;
/// How long discovery (metadata and signing keys) is reused before it is fetched again.
const DISCOVERY_TTL: Duration = Duration::from_secs(300);

/// Why a sign-in failed; each maps to a message on the sign-in page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SsoFailure {
    /// The answer does not belong to a sign-in this browser started (state), or came too late.
    State,
    /// The provider refused (the user cancelled, or is not allowed to use this client).
    Denied,
    /// The code exchange or the ID token's checks failed.
    Failed,
    /// The provider could not be reached.
    Unavailable,
    /// The account is disabled here.
    Disabled,
}

impl SsoFailure {
    /// The `sso_error` value the sign-in page understands.
    pub fn code(self) -> &'static str {
        match self {
            SsoFailure::State => "state",
            SsoFailure::Denied => "denied",
            SsoFailure::Failed => "failed",
            SsoFailure::Unavailable => "unavailable",
            SsoFailure::Disabled => "disabled",
        }
    }
}

/// The relying party: settings, an HTTP client that never follows redirects (SSRF), and
/// the provider's discovered metadata and keys, cached for [`DISCOVERY_TTL`].
pub struct Oidc {
    settings: OidcSettings,
    groups: GroupMap,
    issuer: IssuerUrl,
    redirect: RedirectUrl,
    http: openidconnect::reqwest::Client,
    discovered: Mutex<Option<(Instant, CoreProviderMetadata)>>,
}

impl Oidc {
    /// `None` when single sign-on is not configured. `public_url` is where browsers reach
    /// Tessera (the redirect URI hangs off it).
    pub fn new(settings: &OidcSettings, public_url: &str) -> anyhow::Result<Option<Oidc>> {
        let Some(issuer) = &settings.issuer else {
            return Ok(None);
        };
        let http = openidconnect::reqwest::Client::builder()
            .redirect(openidconnect::reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()?;
        Ok(Some(Oidc {
            settings: settings.clone(),
            groups: GroupMap::parse(&settings.group_map).map_err(|e| anyhow::anyhow!("{e}"))?,
            issuer: IssuerUrl::new(issuer.clone())?,
            redirect: RedirectUrl::new(format!("{public_url}/auth/oidc/callback"))?,
            http,
            discovered: Mutex::new(None),
        }))
    }

    /// What core needs to decide about a verified identity.
    pub fn policy(&self) -> SsoPolicy {
        SsoPolicy {
            provider_name: self.settings.provider_name.trim().to_owned(),
            issuer: self.issuer.as_str().to_owned(),
            groups: self.groups.clone(),
        }
    }

    async fn client(&self) -> Result<OidcClient, SsoFailure> {
        self.client_discovered_within(DISCOVERY_TTL).await
    }

    /// A client from discovery no older than `max_age` (`Duration::ZERO`: discover now).
    async fn client_discovered_within(&self, max_age: Duration) -> Result<OidcClient, SsoFailure> {
        let mut cached = self.discovered.lock().await;
        let fresh = cached
            .as_ref()
            .filter(|(at, _)| at.elapsed() < max_age)
            .map(|(_, m)| m.clone());
        let metadata = match fresh {
            Some(m) => m,
            None => {
                let m = CoreProviderMetadata::discover_async(self.issuer.clone(), &self.http)
                    .await
                    .map_err(|e| {
                        tracing::warn!(issuer = %self.issuer.as_str(), error = %error_chain(&e),
                            "OpenID Connect discovery failed");
                        SsoFailure::Unavailable
                    })?;
                *cached = Some((Instant::now(), m.clone()));
                m
            }
        };
        let secret = self
            .settings
            .client_secret
            .as_ref()
            .map(|s| ClientSecret::new(s.expose().to_owned()));
        let client_id = ClientId::new(self.settings.client_id.clone().unwrap_or_default());
        Ok(
            OidcClient::from_provider_metadata(metadata, client_id, secret)
                .set_redirect_uri(self.redirect.clone()),
        )
    }

    /// Starts a sign-in: the provider's authorization URL to send the browser to, and what
    /// to keep in the session until the provider answers.
    pub async fn begin(&self, now: DateTime<Utc>) -> Result<(String, PendingLogin), SsoFailure> {
        let client = self.client().await?;
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut request = client
            .authorize_url(
                AuthenticationFlow::<CoreResponseType>::AuthorizationCode,
                CsrfToken::new_random,
                Nonce::new_random,
            )
            .set_pkce_challenge(challenge);
        for scope in self
            .settings
            .scopes
            .split_whitespace()
            .filter(|s| *s != "openid")
        {
            request = request.add_scope(Scope::new(scope.to_owned()));
        }
        let (url, state, nonce) = request.url();
        let pending = PendingLogin {
            state: state.secret().clone(),
            nonce: nonce.secret().clone(),
            pkce_verifier: verifier.secret().clone(),
            started_at: now,
        };
        Ok((url.to_string(), pending))
    }

    /// Checks the provider's answer against the pending sign-in, exchanges the code (with
    /// the PKCE verifier) and verifies the ID token; returns who signed in.
    pub async fn finish(
        &self,
        pending: PendingLogin,
        answer: &CallbackQuery,
        now: DateTime<Utc>,
    ) -> Result<ExternalIdentity, SsoFailure> {
        if !pending.answered_by(answer, now) {
            return Err(SsoFailure::State);
        }
        if let Some(error) = &answer.error {
            tracing::info!(%error, description = answer.error_description.as_deref().unwrap_or(""),
                "the identity provider refused the sign-in");
            return Err(SsoFailure::Denied);
        }
        // RFC 9207: an answer naming another issuer is a mix-up attack.
        if answer
            .iss
            .as_deref()
            .is_some_and(|iss| iss != self.issuer.as_str())
        {
            tracing::warn!(iss = ?answer.iss, "authorization response from another issuer");
            return Err(SsoFailure::Failed);
        }
        let code = answer.code.clone().ok_or(SsoFailure::Failed)?;
        let client = self.client().await?;
        let tokens = client
            .exchange_code(AuthorizationCode::new(code))
            .map_err(|e| {
                tracing::error!(error = %e, "the provider has no token endpoint");
                SsoFailure::Failed
            })?
            .set_pkce_verifier(PkceCodeVerifier::new(pending.pkce_verifier))
            .request_async(&self.http)
            .await
            .map_err(|e| {
                tracing::warn!(error = %error_chain(&e), "code exchange refused");
                SsoFailure::Failed
            })?;
        let id_token = tokens.id_token().ok_or_else(|| {
            tracing::warn!("the token response has no ID token");
            SsoFailure::Failed
        })?;
        let nonce = Nonce::new(pending.nonce);
        let verified = id_token
            .claims(&client.id_token_verifier(), &nonce)
            .map_err(|e| error_chain(&e));
        let (client, claims) = match verified {
            Ok(claims) => (client, claims),
            // The provider may have rotated its signing keys since discovery: look again
            // once. (The token came straight from the token endpoint for a code this
            // browser's sign-in asked for, so a stranger cannot make this refetch happen.)
            Err(first) => {
                tracing::info!(error = %first, "ID token not verified with the cached keys; discovering again");
                let client = self.client_discovered_within(Duration::ZERO).await?;
                let claims = id_token
                    .claims(&client.id_token_verifier(), &nonce)
                    .map_err(|e| {
                        tracing::warn!(error = %error_chain(&e), "ID token rejected");
                        SsoFailure::Failed
                    })?;
                (client, claims)
            }
        };
        let mut who = ExternalIdentity {
            subject: claims.subject().as_str().to_owned(),
            preferred_username: claims.preferred_username().map(|u| u.as_str().to_owned()),
            email: claims.email().map(|e| e.as_str().to_owned()),
            email_verified: claims.email_verified().unwrap_or(false),
            groups: Vec::new(),
        };
        let mut groups = claims
            .additional_claims()
            .claims
            .get(&self.settings.groups_claim)
            .cloned();
        // Providers that keep profile claims out of the ID token (`openid` + code flow, as
        // the spec has it) answer them at the userinfo endpoint, for the same subject.
        if groups.is_none()
            && let Ok(request) = client.user_info(
                tokens.access_token().clone(),
                Some(claims.subject().clone()),
            )
        {
            let info: UserInfoClaims<OtherClaims, CoreGenderClaim> =
                request.request_async(&self.http).await.map_err(|e| {
                    tracing::warn!(error = %error_chain(&e), "userinfo request failed");
                    SsoFailure::Failed
                })?;
            groups = info
                .additional_claims()
                .claims
                .get(&self.settings.groups_claim)
                .cloned();
            who.preferred_username = who
                .preferred_username
                .or_else(|| info.preferred_username().map(|u| u.as_str().to_owned()));
            if who.email.is_none() {
                who.email = info.email().map(|e| e.as_str().to_owned());
                who.email_verified = info.email_verified().unwrap_or(false);
            }
        }
        who.groups = self.group_list(groups);
        Ok(who)
    }

    /// The group claim's value as a list (a provider may send one group as a string).
    fn group_list(&self, claim: Option<serde_json::Value>) -> Vec<String> {
        match claim {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::String(g)) => vec![g],
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .filter_map(|g| g.as_str().map(str::to_owned))
                .collect(),
            Some(other) => {
                tracing::warn!(claim = %self.settings.groups_claim, value = %other,
                    "the groups claim is neither a string nor a list; ignored");
                Vec::new()
            }
        }
    }
}

/// The provider's answer at `/auth/oidc/callback`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CallbackQuery {
    pub code: Option<String>,
    pub state: Option<String>,
    pub iss: Option<String>,
    pub error: Option<String>,
    pub error_description: Option<String>,
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(issuer: Option<&str>) -> OidcSettings {
        OidcSettings {
            issuer: issuer.map(str::to_owned),
            client_id: Some("tessera".into()),
            client_secret: None,
            provider_name: "Lab IdP".into(),
            scopes: "openid profile groups".into(),
            groups_claim: "groups".into(),
            group_map: "g=vision:member".into(),
        }
    }

    #[test]
    fn settings_are_checked() {
        assert!(
            settings(Some("https://idp.example.org/realms/lab"))
                .validate()
                .is_ok()
        );
        assert!(settings(Some("http://127.0.0.1:8080")).validate().is_ok());
        let e = settings(Some("http://idp.example.org"))
            .validate()
            .expect_err("plain http");
        assert!(e.contains("https"), "{e}");
        let mut s = settings(Some("https://idp.example.org"));
        s.client_id = None;
        assert!(s.validate().expect_err("no client").contains("CLIENT_ID"));
        let mut s = settings(Some("https://idp.example.org"));
        s.scopes = "profile".into();
        assert!(s.validate().expect_err("no openid").contains("openid"));
        let mut s = settings(Some("https://idp.example.org"));
        s.group_map = "nonsense".into();
        assert!(
            s.validate()
                .expect_err("bad map")
                .contains("TESSERA_OIDC_GROUP_MAP")
        );
        let e = settings(None).validate().expect_err("map without issuer");
        assert!(e.contains("TESSERA_OIDC_ISSUER"), "{e}");
        let mut s = settings(None);
        s.client_id = None;
        s.group_map = String::new();
        assert!(s.validate().is_ok());
    }

    #[test]
    fn state_comparison_is_exact() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
