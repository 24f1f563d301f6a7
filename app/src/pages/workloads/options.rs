//! What a workload may start on: the caller's free allocations, or a new GPU of their own.

use super::*;

/// One allocation a workload may start on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Choice {
    pub(super) id: String,
    pub(super) label: String,
}

/// What the launch form offers, and the labels of the caller's allocations for the list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct LaunchOptions {
    /// Active, the caller's own, and no live workload on it.
    pub(super) free: Vec<Choice>,
    /// Active allocations that already run a workload.
    pub(super) busy: usize,
    /// Requests still waiting.
    pub(super) pending: usize,
    /// Allocation id → e.g. `1g.10gb on H100-80GB`.
    pub(super) labels: BTreeMap<String, String>,
    /// GPU kinds a workload may request for itself (value, label): those of the models the
    /// caller's teams have a quota on.
    pub(super) gpus: Vec<(String, String)>,
    /// Teams that may pay for such a request (id, name); a choice only when several.
    pub(super) teams: Vec<(String, String)>,
    /// One of those teams may ask for `high` priority (a platform admin granted it).
    pub(super) high: bool,
    /// Devices free right now per kind (as of the last scheduler pass).
    pub(super) free_now: BTreeMap<String, u32>,
    /// The caller's teams' notebook profiles (value `profile:<id>`).
    pub(super) profiles: Vec<Choice>,
    /// The catalog images the caller's teams may run (platform entries first).
    pub(super) images: Vec<tessera_domain::image::CatalogImage>,
    /// The form's idempotency key (a double submit launches one workload).
    pub(super) key: String,
}

pub(super) fn choice_label(a: &AllocationView) -> String {
    let place = a
        .devices
        .first()
        .map(|d| {
            let dev = d.mig_uuid.clone().unwrap_or_else(|| d.gpu_uuid.clone());
            format!(" · {} · {dev}", d.hostname)
        })
        .unwrap_or_default();
    format!("{}{place} ({})", a.kind_label, a.team_name)
}

pub(super) async fn load_options() -> Result<LaunchOptions, UiError> {
    let all = PageRequest::new(0, PageRequest::MAX_LIMIT);
    let allocations = api::list_allocations(String::new(), String::new(), true, all).await?;
    let live = api::list_workloads(None, None, None, true, true, all).await?;
    let taken: Vec<String> = live
        .items
        .iter()
        .map(|w| w.allocation_id.to_string())
        .collect();
    let mut free = Vec::new();
    let mut busy = 0;
    let mut pending = 0;
    let mut labels = BTreeMap::new();
    for a in &allocations.items {
        let id = a.id.to_string();
        labels.insert(id.clone(), a.kind_label.clone());
        if a.state == AllocState::Active {
            if taken.contains(&id) {
                busy += 1;
            } else {
                free.push(Choice {
                    id,
                    label: choice_label(a),
                });
            }
        } else if a.state.is_pending() {
            pending += 1;
        }
    }
    let (gpus, teams, high) = requestable().await?;
    // Not fatal: the form works without the "free now" hints.
    let free_now = api::free_now().await.unwrap_or_default();
    let profiles = api::notebook_profiles(String::new())
        .await?
        .into_iter()
        .map(|p| Choice {
            id: format!("{}{}", api::PROFILE_PREFIX, p.id),
            label: format!(
                "Profile {}: {}, {} h ({})",
                p.name, p.kind_label, p.hours, p.team_name
            ),
        })
        .collect();
    Ok(LaunchOptions {
        free,
        busy,
        pending,
        labels,
        gpus,
        teams,
        high,
        free_now,
        profiles,
        // Not fatal: without the catalog the form offers the node's environment only.
        images: api::list_images(String::new()).await.unwrap_or_default(),
        key: crate::components::new_key(),
    })
}

/// The GPU kinds the caller may request (of the models their teams have a quota on), those
/// teams, and whether one of them may use `high` priority; viewers and archived teams
/// request nothing.
pub(super) async fn requestable()
-> Result<(Vec<(String, String)>, Vec<(String, String)>, bool), UiError> {
    let teams = api::list_teams(PageRequest::new(0, PageRequest::MAX_LIMIT)).await?;
    let mut models = Vec::new();
    let mut payers = Vec::new();
    let mut high = false;
    for team in teams.items {
        if team.archived || team.my_role.is_none_or(|r| r == TeamRole::Viewer) {
            continue;
        }
        let quotas = api::list_quotas(team.id.to_string()).await?;
        let mut any = false;
        for q in quotas.into_iter().filter(|q| q.limit > 0) {
            models.push(q.model);
            any = true;
        }
        if any {
            high |= team.high_priority.is_some();
            payers.push((team.id.to_string(), team.name));
        }
    }
    models.sort();
    models.dedup();
    let catalog = Catalog::builtin();
    let gpus = models
        .iter()
        .flat_map(|m| crate::components::kind_options(&catalog, m))
        .collect();
    Ok((gpus, payers, high))
}
