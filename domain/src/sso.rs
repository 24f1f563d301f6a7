//! Single sign-on rules: what an identity provider's group claim grants, and the username a
//! first sign-in gets.
//!
//! The group map is an administrator's setting (`TESSERA_OIDC_GROUP_MAP`):
//! `gpu-vision-admins=vision:team_admin; gpu-vision=vision:member; gpu-ops=platform_admin`.
//! Every team the map names is *managed by the identity provider* for users who sign in
//! through it: at each sign-in their membership in those teams is set to what their groups
//! grant (joined, role changed or removed). Teams the map does not name are left to local
//! team admins. A group the map does not name grants nothing.

use crate::account::Username;
use crate::error::AppError;
use crate::tenancy::{TeamName, TeamRole};
use std::collections::BTreeMap;

/// What one group grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    Team { team: TeamName, role: TeamRole },
    PlatformAdmin,
}

/// The administrator's mapping from identity-provider groups to teams and roles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupMap {
    entries: Vec<(String, Grant)>,
}

/// What a user's groups grant under a [`GroupMap`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    pub platform_admin: bool,
    /// Lowercased name of every team the map manages → the role the groups grant there
    /// (`None`: not a member). A team granted by several groups gets the most privileged
    /// role.
    pub teams: BTreeMap<String, Option<TeamRole>>,
    /// Groups in the claim that the map does not name (ignored; shown in the log).
    pub unknown_groups: Vec<String>,
}

impl GroupMap {
    pub const SETTING: &'static str = "TESSERA_OIDC_GROUP_MAP";

    /// Parses `group=team:role` and `group=platform_admin` entries separated by `;` or new
    /// lines. Group names are matched exactly (case matters, as in most identity providers);
    /// team names as teams are (case-insensitively).
    pub fn parse(raw: &str) -> Result<Self, AppError> {
        let err = |m: String| AppError::invalid(Self::SETTING, m);
        let mut entries = Vec::new();
        for entry in raw
            .split([';', '\n'])
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let (group, target) = entry
                .split_once('=')
                .ok_or_else(|| err(format!("`{entry}` must look like group=team:role")))?;
            let group = group.trim();
            if group.is_empty() {
                return Err(err(format!("`{entry}` names no group")));
            }
            let target = target.trim();
            let grant = if target == "platform_admin" {
                Grant::PlatformAdmin
            } else {
                let (team, role) = target.rsplit_once(':').ok_or_else(|| {
                    err(format!(
                        "`{entry}`: the target must be team:role or platform_admin"
                    ))
                })?;
                let team = TeamName::parse(team)
                    .map_err(|e| err(format!("`{entry}`: team name {}", message(&e))))?;
                let role = TeamRole::parse(role).map_err(|_| {
                    err(format!(
                        "`{entry}`: role must be team_admin, member or viewer"
                    ))
                })?;
                Grant::Team { team, role }
            };
            if entries.iter().any(|(g, x)| g == group && *x == grant) {
                return Err(err(format!("`{entry}` is listed twice")));
            }
            entries.push((group.to_owned(), grant));
        }
        Ok(GroupMap { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The lowercased names of the teams the map manages.
    pub fn managed_teams(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .entries
            .iter()
            .filter_map(|(_, g)| match g {
                Grant::Team { team, .. } => Some(team.as_str().to_lowercase()),
                Grant::PlatformAdmin => None,
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Whether some group grants platform admin (only then can a claim take it away again).
    pub fn manages_platform_admin(&self) -> bool {
        self.entries.iter().any(|(_, g)| *g == Grant::PlatformAdmin)
    }

    /// What `groups` grant.
    pub fn resolve(&self, groups: &[String]) -> Grants {
        let mut teams: BTreeMap<String, Option<TeamRole>> = self
            .managed_teams()
            .into_iter()
            .map(|t| (t, None))
            .collect();
        let mut platform_admin = false;
        let mut unknown_groups = Vec::new();
        for group in groups {
            let mut known = false;
            for (_, grant) in self.entries.iter().filter(|(g, _)| g == group) {
                known = true;
                match grant {
                    Grant::PlatformAdmin => platform_admin = true,
                    Grant::Team { team, role } => {
                        let slot = teams.entry(team.as_str().to_lowercase()).or_default();
                        *slot = Some(slot.map_or(*role, |r| r.min(*role)));
                    }
                }
            }
            if !known && !unknown_groups.contains(group) {
                unknown_groups.push(group.clone());
            }
        }
        Grants {
            platform_admin,
            teams,
            unknown_groups,
        }
    }
}

fn message(e: &AppError) -> String {
    match e {
        AppError::Invalid { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// The username a first sign-in asks for: the provider's preferred username, else the
/// e-mail's local part, else the subject, made to fit [`Username`] (lowercase; letters,
/// digits, `.`, `_`, `-`; starting with a letter; 2–64 characters). The store adds `-2`,
/// `-3`, … when it is taken.
pub fn username_candidate(preferred: Option<&str>, email: Option<&str>, subject: &str) -> Username {
    let sources = [
        preferred.map(str::to_owned),
        email.and_then(|e| e.split('@').next()).map(str::to_owned),
        Some(subject.to_owned()),
    ];
    for raw in sources.into_iter().flatten() {
        let cleaned: String = raw
            .trim()
            .to_lowercase()
            .chars()
            .map(|c| match c {
                'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
                _ => '-',
            })
            .collect();
        let trimmed = cleaned.trim_start_matches(|c: char| !c.is_ascii_lowercase());
        let cut: String = trimmed.chars().take(56).collect();
        let cut = cut.trim_end_matches(['-', '.', '_']);
        let candidate = if cut.len() == 1 {
            format!("{cut}-user")
        } else {
            cut.to_owned()
        };
        if let Ok(u) = Username::parse(&candidate) {
            return u;
        }
    }
    // A subject with no letter at all (e.g. a number): still a valid, stable name.
    let digits: String = subject
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(48)
        .collect::<String>()
        .to_lowercase();
    Username::parse(&format!("sso-{digits}")).unwrap_or_else(|_| {
        Username::parse("sso-user").unwrap_or_else(|_| unreachable!("literal is valid"))
    })
}

/// `base`, or `base-n` cut to fit 64 characters: the `n`-th try at a free username.
pub fn numbered_username(base: &Username, n: u32) -> Username {
    if n <= 1 {
        return base.clone();
    }
    let suffix = format!("-{n}");
    let keep = 64 - suffix.len();
    let head: String = base.as_str().chars().take(keep).collect();
    Username::parse(&format!("{head}{suffix}")).unwrap_or_else(|_| base.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> GroupMap {
        GroupMap::parse(
            "gpu-vision-admins=vision:team_admin; gpu-vision=Vision:member\n\
             gpu-ops=platform_admin;gpu-nlp = NLP lab : viewer",
        )
        .expect("valid")
    }

    fn groups(g: &[&str]) -> Vec<String> {
        g.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn parses_teams_roles_and_platform_admin() {
        let m = map();
        assert_eq!(m.managed_teams(), vec!["nlp lab", "vision"]);
        assert!(m.manages_platform_admin());
        assert!(GroupMap::parse("").expect("empty").is_empty());
    }

    #[test]
    fn bad_entries_name_the_setting_and_the_entry() {
        for (raw, needle) in [
            ("gpu-vision", "must look like group=team:role"),
            ("=vision:member", "names no group"),
            ("g=vision", "team:role or platform_admin"),
            ("g=vision:owner", "role must be"),
            ("g=v:member", "team name must be 2 to 64"),
            ("g=vision:member;g=vision:member", "listed twice"),
        ] {
            let e = GroupMap::parse(raw).expect_err(raw);
            match e {
                AppError::Invalid { field, message } => {
                    assert_eq!(field, GroupMap::SETTING);
                    assert!(message.contains(needle), "{raw}: {message}");
                }
                other => panic!("{raw}: {other:?}"),
            }
        }
    }

    #[test]
    fn groups_resolve_to_the_most_privileged_role_per_team() {
        let g = map().resolve(&groups(&["gpu-vision", "gpu-vision-admins", "other"]));
        assert_eq!(g.teams["vision"], Some(TeamRole::TeamAdmin));
        assert_eq!(g.teams["nlp lab"], None);
        assert!(!g.platform_admin);
        assert_eq!(g.unknown_groups, vec!["other"]);

        let g = map().resolve(&groups(&["gpu-ops", "gpu-nlp"]));
        assert!(g.platform_admin);
        assert_eq!(g.teams["vision"], None);
        assert_eq!(g.teams["nlp lab"], Some(TeamRole::Viewer));
    }

    #[test]
    fn group_names_match_exactly() {
        let g = map().resolve(&groups(&["GPU-VISION"]));
        assert_eq!(g.teams["vision"], None);
        assert_eq!(g.unknown_groups, vec!["GPU-VISION"]);
    }

    #[test]
    fn usernames_come_from_the_claims_and_always_parse() {
        let u = |p: Option<&str>, e: Option<&str>, s: &str| {
            username_candidate(p, e, s).as_str().to_owned()
        };
        assert_eq!(u(Some("Alice.Smith"), None, "x"), "alice.smith");
        assert_eq!(u(None, Some("Bob@example.org"), "x"), "bob");
        assert_eq!(u(Some("Jürgen Groß"), None, "x"), "j-rgen-gro");
        assert_eq!(u(Some("42"), Some("7@x"), "abc"), "abc");
        assert_eq!(u(None, None, "12345"), "sso-12345");
        assert_eq!(u(Some("x"), None, "1"), "x-user");
        let long = "a".repeat(200);
        assert_eq!(u(Some(&long), None, "s").len(), 56);
    }

    #[test]
    fn numbered_usernames_stay_valid() {
        let base = Username::parse(&"a".repeat(64)).expect("valid");
        let n = numbered_username(&base, 12);
        assert_eq!(n.as_str().len(), 64);
        assert!(n.as_str().ends_with("-12"));
        assert_eq!(numbered_username(&base, 1), base);
    }

    proptest::proptest! {
        #[test]
        fn any_claims_give_a_valid_username(p in ".{0,80}", e in ".{0,80}", s in ".{1,80}") {
            let name = username_candidate(Some(&p), Some(&e), &s);
            proptest::prop_assert!(Username::parse(name.as_str()).is_ok());
            proptest::prop_assert!(Username::parse(numbered_username(&name, 99).as_str()).is_ok());
        }
    }
}
