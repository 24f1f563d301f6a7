//! A team's webhooks and the platform's: who may see and change them, where they may point
//! (no private address unless allowed), and their test delivery.

use super::*;

/// The sealing context of a webhook's secret.
fn secret_context(id: Uuid) -> String {
    format!("team_webhooks.secret:{id}")
}

fn hook_view(w: &WebhookRow) -> WebhookView {
    WebhookView {
        id: w.id,
        team_id: w.team_id.map(|t| t.0),
        url: w.url.clone(),
        events: w.event_kinds(),
        enabled: w.enabled,
        consecutive_failures: w.consecutive_failures,
        last_status: w.last_status,
        last_error: w.last_error.clone(),
        last_delivery_at: w.last_delivery_at,
        created_at: w.created_at,
    }
}

/// The kinds' names, sorted, each once.
fn event_names(kinds: &[EventKind]) -> Vec<String> {
    let mut names: Vec<String> = kinds.iter().map(|k| k.as_str().to_owned()).collect();
    names.sort_unstable();
    names.dedup();
    names
}

impl Notifications {
    // ---- team webhooks (team admins) ----

    /// A scope's webhooks: a team's (its team admins) or the platform's (platform admins).
    pub async fn webhooks(
        &self,
        p: &Principal,
        scope: impl Into<HookScope>,
    ) -> Result<Vec<WebhookView>, AppError> {
        let scope = scope.into();
        self.authorize(p, scope).await?;
        Ok(self
            .store
            .scope_webhooks(scope.team())
            .await
            .map_err(internal("loading webhooks"))?
            .iter()
            .map(hook_view)
            .collect())
    }

    /// Adds a webhook; its signing secret is in the answer, once.
    pub async fn create_webhook(
        &self,
        p: &Principal,
        scope: impl Into<HookScope>,
        input: &WebhookInput,
    ) -> Result<WebhookCreated, AppError> {
        let scope = scope.into();
        if let Some(archived) = self.authorize(p, scope).await?
            && archived
        {
            return Err(AppError::conflict("the team is archived"));
        }
        let url = notify::parse_webhook_url(&input.url)?;
        self.check_destination(&url).await?;
        let id = Uuid::now_v7();
        let secret = crate::auth::secret::generate("whsec").0;
        let sealed = self
            .keys
            .seal(&secret_context(id), &secret)
            .map_err(|_| AppError::Internal)?;
        let row = WebhookRow {
            id,
            team_id: scope.team(),
            url,
            secret: sealed,
            events: event_names(&input.events),
            enabled: input.enabled,
            consecutive_failures: 0,
            last_status: None,
            last_error: None,
            last_delivery_at: None,
            created_at: self.clock.now(),
        };
        self.store
            .insert_webhook(&row)
            .await
            .map_err(internal("adding webhook"))?;
        Ok(WebhookCreated {
            webhook: hook_view(&row),
            secret,
        })
    }

    /// Whether `p` manages `scope`'s webhooks; for a team, whether it is archived.
    async fn authorize(&self, p: &Principal, scope: HookScope) -> Result<Option<bool>, AppError> {
        match scope {
            HookScope::Team(team) => {
                let access = authz::team(&self.store, p, team, Need::ManageMembers).await?;
                Ok(Some(access.team.archived))
            }
            HookScope::Platform => authz::admin(p).map(|_| None),
        }
    }

    /// A scope's hook, for those who manage the scope (another team's, or a team's asked
    /// for as the platform's, is `NotFound`).
    async fn team_hook(
        &self,
        p: &Principal,
        scope: impl Into<HookScope>,
        id: Uuid,
    ) -> Result<WebhookRow, AppError> {
        let scope = scope.into();
        self.authorize(p, scope).await?;
        self.store
            .webhook(id)
            .await
            .map_err(internal("loading webhook"))?
            .filter(|w| w.team_id == scope.team())
            .ok_or(AppError::NotFound)
    }

    pub async fn webhook(
        &self,
        p: &Principal,
        scope: impl Into<HookScope> + Copy,
        id: Uuid,
    ) -> Result<WebhookView, AppError> {
        Ok(hook_view(&self.team_hook(p, scope, id).await?))
    }

    pub async fn update_webhook(
        &self,
        p: &Principal,
        scope: impl Into<HookScope> + Copy,
        id: Uuid,
        input: &WebhookInput,
    ) -> Result<WebhookView, AppError> {
        self.team_hook(p, scope, id).await?;
        let url = notify::parse_webhook_url(&input.url)?;
        self.check_destination(&url).await?;
        self.store
            .update_webhook(id, &url, &event_names(&input.events), input.enabled)
            .await
            .map_err(internal("changing webhook"))?;
        self.webhook(p, scope, id).await
    }

    pub async fn delete_webhook(
        &self,
        p: &Principal,
        scope: impl Into<HookScope> + Copy,
        id: Uuid,
    ) -> Result<(), AppError> {
        self.team_hook(p, scope, id).await?;
        self.store
            .delete_webhook(id)
            .await
            .map_err(internal("removing webhook"))?;
        Ok(())
    }

    /// A hook's latest deliveries, newest first.
    pub async fn webhook_deliveries(
        &self,
        p: &Principal,
        scope: impl Into<HookScope> + Copy,
        id: Uuid,
    ) -> Result<Vec<DeliveryView>, AppError> {
        self.team_hook(p, scope, id).await?;
        Ok(self
            .store
            .webhook_deliveries(id, LOG_LENGTH)
            .await
            .map_err(internal("loading deliveries"))?
            .into_iter()
            .map(|d| DeliveryView {
                id: d.id,
                event_id: d.event.id,
                kind: d.event.kind,
                state: d.state,
                attempts: d.attempts,
                last_status: d.last_status,
                last_error: d.last_error,
                created_at: d.delivery_created_at,
                sent_at: d.sent_at,
            })
            .collect())
    }

    /// A hook and its secret in clear, for a test delivery its team admin asked for.
    pub async fn webhook_for_test(
        &self,
        p: &Principal,
        scope: impl Into<HookScope> + Copy,
        id: Uuid,
    ) -> Result<(WebhookRow, String), AppError> {
        let hook = self.team_hook(p, scope, id).await?;
        self.check_destination(&hook.url).await?;
        let secret = self.webhook_secret(&hook)?;
        Ok((hook, secret))
    }

    /// A hook's signing secret in clear (the delivery worker signs with it).
    pub fn webhook_secret(&self, hook: &WebhookRow) -> Result<String, AppError> {
        self.keys
            .open(&secret_context(hook.id), &hook.secret)
            .map_err(|e| {
                tracing::error!(webhook = %hook.id, error = %e, "webhook secret does not open");
                AppError::Internal
            })
    }

    /// Checks that `url`'s host resolves only to addresses a webhook may reach: public
    /// ones, unless the platform allows private ones. Errors name `url`.
    pub async fn check_destination(&self, url: &str) -> Result<(), AppError> {
        let addrs = resolve(url).await?;
        if self.allow_private {
            return Ok(());
        }
        if let Some(ip) = addrs.iter().find(|ip| !notify::address_is_public(**ip)) {
            return Err(AppError::invalid(
                "url",
                format!(
                    "resolves to {ip}, a loopback, link-local or private address; webhooks go \
                     only to public addresses unless a platform admin allows private ones \
                     (TESSERA_WEBHOOK_ALLOW_PRIVATE)"
                ),
            ));
        }
        Ok(())
    }

    /// Posts a `webhook.test` event to a team's hook now, with `sender` (the server's
    /// HTTP), and answers what its receiver said: not counted as a failure, not logged.
    /// The REST API and the team page's button both come here.
    pub async fn test_webhook(
        &self,
        p: &Principal,
        scope: impl Into<HookScope> + Copy,
        id: Uuid,
        sender: &dyn WebhookTestSender,
    ) -> Result<notify::WebhookTestResult, AppError> {
        let (hook, secret) = self.webhook_for_test(p, scope, id).await?;
        Ok(sender
            .send_test(hook.team_id.map(|t| t.0), &hook.url, &secret)
            .await)
    }
}

/// Sends a webhook's test delivery. Sending is the server's (it owns the HTTP client
/// and the public URL); it hands the REST handler one, and the UI's server functions
/// find the same in context as an `Arc<dyn WebhookTestSender>`.
pub trait WebhookTestSender: Send + Sync {
    /// Posts a signed `webhook.test` event of `team` (`None`: the platform's) to `url`.
    fn send_test<'a>(
        &'a self,
        team: Option<Uuid>,
        url: &'a str,
        secret: &'a str,
    ) -> std::pin::Pin<Box<dyn Future<Output = notify::WebhookTestResult> + Send + 'a>>;
}

/// The addresses `url`'s host resolves to (an IP literal is itself).
async fn resolve(url: &str) -> Result<Vec<IpAddr>, AppError> {
    let rest = url
        .strip_prefix("https://")
        .map(|r| (r, 443))
        .or_else(|| url.strip_prefix("http://").map(|r| (r, 80)));
    let Some((rest, default_port)) = rest else {
        return Err(AppError::invalid(
            "url",
            "must start with http:// or https://",
        ));
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (h, after) = v6.split_once(']').unwrap_or((v6, ""));
            (
                h,
                after
                    .strip_prefix(':')
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(default_port),
            )
        }
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .map_err(|_| AppError::invalid("url", "has a port that is not a number"))?,
            ),
            None => (authority, default_port),
        },
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let found: Vec<IpAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|_| AppError::invalid("url", format!("the host {host} does not resolve")))?
        .map(|a| a.ip())
        .collect();
    if found.is_empty() {
        return Err(AppError::invalid(
            "url",
            format!("the host {host} does not resolve"),
        ));
    }
    Ok(found)
}
