//! Opening a notebook: where it listens, for whom, and the one-time code and pass of its own origin.

use super::*;
use tessera_domain::audit::AuditAction;
use tessera_domain::ids::UserId;

impl Workloads {
    /// Where the proxy sends `/user/{username}/{name}/…`: the owner's live notebook.
    /// Platform admins get through too (audited once an hour per notebook); anyone else,
    /// and a notebook that does not exist, is `NotFound`. `Ok(Err(_))`: it exists but
    /// does not answer yet.
    pub async fn proxy_target(
        &self,
        p: &Principal,
        username: &str,
        name: &str,
    ) -> Result<Result<ProxyTarget, NotReady>, AppError> {
        let row = found(
            "loading notebook",
            self.store.live_notebook(username, name).await,
        )?;
        self.may_open(p, &row).await?;
        Ok(target_of(&row, self.notebook_token(&row.w)?))
    }

    /// The same, for the notebook a notebook origin names by its workload id.
    pub async fn notebook_target(
        &self,
        p: &Principal,
        workload: WorkloadId,
    ) -> Result<Result<ProxyTarget, NotReady>, AppError> {
        let row = self
            .store
            .workload(workload)
            .await
            .map_err(internal("loading notebook"))?
            .filter(|r| r.w.kind == WorkloadKind::Notebook && r.w.state.is_live())
            .ok_or(AppError::NotFound)?;
        self.may_open(p, &row).await?;
        Ok(target_of(&row, self.notebook_token(&row.w)?))
    }

    /// A one-time code that lets the caller's browser into the notebook's own origin
    /// (the portal redirects there with it; [`Self::redeem_notebook_code`] swaps it for a
    /// pass). Who may have one: as [`Self::proxy_target`].
    pub async fn notebook_code(
        &self,
        p: &Principal,
        username: &str,
        name: &str,
    ) -> Result<Result<NotebookEntry, NotReady>, AppError> {
        let target = match self.proxy_target(p, username, name).await? {
            Ok(t) => t,
            Err(not_ready) => return Ok(Err(not_ready)),
        };
        let now = self.clock.now();
        let (code, hash) = secret::generate("tnc");
        self.store
            .insert_notebook_grant(
                &hash,
                "code",
                target.workload_id,
                p.user_id(),
                now,
                now + Duration::seconds(NOTEBOOK_CODE_TTL_SECS),
            )
            .await
            .map_err(internal("storing notebook code"))?;
        Ok(Ok(NotebookEntry {
            workload_id: target.workload_id,
            code,
            base_path: target.base_path,
        }))
    }

    /// Swaps a one-time code for `workload` (single use, within a minute) for a notebook
    /// pass: the secret the notebook origin keeps in its cookie. `NotFound` for a code
    /// that is unknown, used, expired or for another notebook.
    pub async fn redeem_notebook_code(
        &self,
        workload: WorkloadId,
        code: &str,
    ) -> Result<String, AppError> {
        let now = self.clock.now();
        let (user, _, expires) = found(
            "redeeming notebook code",
            self.store
                .take_notebook_code(&secret::hash(code), workload)
                .await,
        )?;
        if expires < now {
            return Err(AppError::NotFound);
        }
        if let Err(e) = self.store.prune_notebook_grants(now).await {
            tracing::warn!(error = %e, "pruning notebook grants failed");
        }
        let (pass, hash) = secret::generate("tnp");
        self.store
            .insert_notebook_grant(
                &hash,
                "cookie",
                workload,
                UserId(user),
                now,
                now + Duration::hours(NOTEBOOK_PASS_TTL_HOURS),
            )
            .await
            .map_err(internal("storing notebook pass"))?;
        Ok(pass)
    }

    /// Whose notebook pass this is for `workload`, and when it was issued (so a password
    /// change or disabling voids it like a session): `Unauthorized` when it is not a
    /// valid pass for that notebook.
    pub async fn notebook_pass(
        &self,
        workload: WorkloadId,
        pass: &str,
    ) -> Result<(Uuid, DateTime<Utc>), AppError> {
        let (user, issued, expires) = self
            .store
            .notebook_pass(&secret::hash(pass), workload)
            .await
            .map_err(internal("loading notebook pass"))?
            .ok_or(AppError::Unauthorized)?;
        if expires < self.clock.now() {
            return Err(AppError::Unauthorized);
        }
        Ok((user, issued))
    }

    /// Who may open a live notebook: its owner while still a member of its team, and
    /// platform admins (audited). Anyone else gets the 404 of a notebook that does not
    /// exist.
    async fn may_open(&self, p: &Principal, row: &WorkloadListRow) -> Result<(), AppError> {
        if row.w.user_id == p.user_id() {
            let member = self
                .store
                .membership(row.w.team_id, p.user_id())
                .await
                .map_err(internal("loading membership"))?
                .is_some();
            if member || p.is_admin() {
                return Ok(());
            }
            return Err(AppError::NotFound);
        }
        if !p.is_admin() {
            return Err(AppError::NotFound);
        }
        self.audit_admin_proxy(p, &row.w).await;
        Ok(())
    }

    async fn audit_admin_proxy(&self, p: &Principal, w: &WorkloadRow) {
        let now = self.clock.now();
        let due = {
            let Ok(mut seen) = self.admin_audited.lock() else {
                return;
            };
            seen.retain(|_, at| now - *at < Duration::hours(1));
            let fresh = !seen.contains_key(&(p.user_id(), w.id));
            if fresh {
                seen.insert((p.user_id(), w.id), now);
            }
            fresh
        };
        if due {
            self.audit(
                Some(p.username().as_str()),
                AuditAction::NotebookAdminAccess,
                w.id,
                w.team_id,
                &format!("opened {}'s notebook {}", w.user_id, w.name),
            )
            .await;
        }
    }
}
