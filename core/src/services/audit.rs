//! Writing the audit trail: the one way every service records an entry.

use crate::store::Store;
use chrono::{DateTime, Utc};
use tessera_domain::audit::AuditAction;
use tessera_domain::audit::AuditEntryView;
use tessera_domain::ids::TeamId;
use uuid::Uuid;

/// An entry to record: who (`None`: the system), what, on which object of which team, and
/// the object's fields before and after as JSON.
pub(crate) struct Entry<'a> {
    actor: Option<&'a str>,
    action: AuditAction,
    object: (&'a str, String),
    team: Option<TeamId>,
    before: Option<String>,
    after: Option<String>,
}

impl<'a> Entry<'a> {
    pub(crate) fn new(
        actor: Option<&'a str>,
        action: AuditAction,
        object_type: &'a str,
        object_id: impl ToString,
    ) -> Self {
        Entry {
            actor,
            action,
            object: (object_type, object_id.to_string()),
            team: None,
            before: None,
            after: None,
        }
    }

    pub(crate) fn team(mut self, team: Option<TeamId>) -> Self {
        self.team = team;
        self
    }

    pub(crate) fn before(mut self, json: Option<String>) -> Self {
        self.before = json;
        self
    }

    pub(crate) fn after(mut self, json: Option<String>) -> Self {
        self.after = json;
        self
    }

    /// `after` as `{"note": note}`.
    pub(crate) fn note(self, note: &str) -> Self {
        self.after(Some(serde_json::json!({ "note": note }).to_string()))
    }

    /// Records it at `at`. A failure to write it is logged, never the caller's error: the
    /// change it tells of has happened.
    pub(crate) async fn record(self, store: &Store, at: DateTime<Utc>) {
        let (object_type, object_id) = self.object;
        let row = AuditEntryView {
            id: Uuid::new_v4(),
            at,
            actor: self.actor.map(str::to_owned),
            action: self.action.as_str().to_owned(),
            object_type: object_type.to_owned(),
            object_id,
            team_id: self.team,
            before: self.before,
            after: self.after,
        };
        if let Err(e) = store.audit(&row).await {
            tracing::error!(error = %e, action = %self.action, "writing audit entry");
        }
    }
}
