//! Accounts: usernames, password policy, and what the UI shows of the signed-in user
//! (the principal itself is `core`'s: `tessera_core::auth::Principal`).
//!
//! Parse, don't validate: a [`Username`] or [`NewPassword`] is valid by construction, so the
//! rest of the code never re-checks.

use crate::error::AppError;

use serde::{Deserialize, Serialize};
use std::fmt;

/// A login name: 2–64 characters of lowercase ASCII letters, digits, `.`, `_` or `-`,
/// starting with a letter. Input is trimmed and lowercased.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Username(String);

impl Username {
    pub const FIELD: &'static str = "username";

    pub fn parse(raw: &str) -> Result<Self, AppError> {
        let s = raw.trim().to_ascii_lowercase();
        let err = |m: &str| Err(AppError::invalid(Self::FIELD, m));
        if s.is_empty() {
            return err("is required");
        }
        if s.len() < 2 || s.len() > 64 {
            return err("must be 2 to 64 characters");
        }
        if !s.starts_with(|c: char| c.is_ascii_lowercase()) {
            return err("must start with a letter");
        }
        if !s
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
        {
            return err("may contain only letters, digits, '.', '_' and '-'");
        }
        Ok(Self(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Username {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A password that meets the policy: 12–256 characters and not only one repeated character.
/// Length beats composition rules (NIST SP 800-63B), so there are no "one digit" rules.
#[derive(Clone, PartialEq, Eq)]
pub struct NewPassword(String);

impl NewPassword {
    pub const MIN_LEN: usize = 12;
    pub const MAX_LEN: usize = 256;

    /// `field` names the form field so the error lands next to it.
    pub fn parse(raw: &str, field: &str) -> Result<Self, AppError> {
        let n = raw.chars().count();
        if n < Self::MIN_LEN {
            return Err(AppError::invalid(
                field,
                format!("must be at least {} characters", Self::MIN_LEN),
            ));
        }
        if n > Self::MAX_LEN {
            return Err(AppError::invalid(
                field,
                format!("must be at most {} characters", Self::MAX_LEN),
            ));
        }
        let mut chars = raw.chars();
        let first = chars.next();
        if chars.all(|c| Some(c) == first) {
            return Err(AppError::invalid(
                field,
                "must not be one repeated character",
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for NewPassword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NewPassword(***)")
    }
}

/// One step of a fresh install's setup, for the first-run checklist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SetupStep {
    /// Stable key: `team`, `quota`, `people`, `nodes`, `prices`.
    pub key: String,
    pub title: String,
    /// What to do, in a sentence.
    pub hint: String,
    /// Where it is done.
    pub href: String,
    pub done: bool,
}

/// A platform admin's first-run checklist: what a working install still lacks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SetupChecklist {
    pub steps: Vec<SetupStep>,
    /// This admin put it away.
    pub dismissed: bool,
}

/// Counts a checklist is made from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetupFacts {
    pub teams: u64,
    pub quotas: u64,
    /// Users who are not platform admins.
    pub people: u64,
    pub sso: bool,
    pub nodes: u64,
    pub rates: u64,
}

impl SetupChecklist {
    /// The steps, in the order an admin takes them, each ticked from `facts`.
    pub fn from_facts(f: SetupFacts, dismissed: bool) -> Self {
        let step = |key: &str, title: &str, hint: &str, href: &str, done: bool| SetupStep {
            key: key.into(),
            title: title.into(),
            hint: hint.into(),
            href: href.into(),
            done,
        };
        SetupChecklist {
            steps: vec![
                step(
                    "team",
                    "Create a team",
                    "Teams own GPU quota and pay for what their members use.",
                    "/teams",
                    f.teams > 0,
                ),
                step(
                    "quota",
                    "Give a team a GPU quota",
                    "On the team's page: how many slices of each GPU model it may hold.",
                    "/teams",
                    f.quotas > 0,
                ),
                step(
                    "people",
                    if f.sso {
                        "Add people (single sign-on is on)"
                    } else {
                        "Add people"
                    },
                    if f.sso {
                        "People sign in with your identity provider; their groups can grant teams."
                    } else {
                        "Create accounts, then add them to a team as members or team admins."
                    },
                    "/admin/users",
                    f.people > 0 || f.sso,
                ),
                step(
                    "nodes",
                    "Add GPU nodes",
                    "Create a join token and start `tessera-agent` with it on each GPU server.",
                    "/admin/join-tokens",
                    f.nodes > 0,
                ),
                step(
                    "prices",
                    "Set prices",
                    "A rate card per GPU kind, so usage shows up on statements and chargeback.",
                    "/admin/billing",
                    f.rates > 0,
                ),
            ],
            dismissed,
        }
    }

    /// Whether it has anything left to say.
    pub fn shows(&self) -> bool {
        !self.dismissed && self.steps.iter().any(|s| !s.done)
    }
}

/// What the sign-in page offers besides a username and password.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignInOptions {
    /// The identity provider's display name when single sign-on is configured.
    pub sso_provider: Option<String>,
}

/// What the UI shows about the signed-in user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Me {
    pub username: String,
    pub is_admin: bool,
}

/// Where to go after signing in: `next` when it is a path on this site (not another
/// host, not the sign-in page itself), else the dashboard. Never an open redirect.
pub fn after_sign_in(next: Option<&str>) -> String {
    let local = next.filter(|n| {
        n.starts_with('/')
            && !n.starts_with("//")
            && !n.starts_with("/login")
            && n.len() <= 2048
            && !n.contains('\\')
            && !n.chars().any(|c| c.is_control())
    });
    local.unwrap_or("/").to_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sign_in_goes_back_to_local_paths_only() {
        use super::after_sign_in as a;
        assert_eq!(
            a(Some("/allocations?state=active")),
            "/allocations?state=active"
        );
        assert_eq!(a(None), "/");
        for bad in [
            "//evil.example/x",
            "https://evil.example/",
            "evil",
            "/\\evil.example",
            "/login?next=/login",
            "/a\nb",
            "",
        ] {
            assert_eq!(a(Some(bad)), "/", "{bad:?}");
        }
    }

    use super::*;

    #[test]
    fn usernames_are_normalised() {
        let u = Username::parse("  Alice.Smith ").expect("valid");
        assert_eq!(u.as_str(), "alice.smith");
    }

    #[test]
    fn bad_usernames_name_the_field() {
        for bad in ["", "a", "1abc", "al ice", "bob!", &"x".repeat(65)] {
            let e = Username::parse(bad).expect_err(bad);
            assert_eq!(e.field(), Some("username"), "{bad}");
        }
    }

    #[test]
    fn password_policy() {
        assert!(NewPassword::parse("short", "new_password").is_err());
        assert!(NewPassword::parse(&"a".repeat(20), "new_password").is_err());
        assert!(NewPassword::parse(&"ab".repeat(200), "new_password").is_err());
        let ok = NewPassword::parse("correct horse battery", "new_password").expect("valid");
        assert_eq!(ok.expose(), "correct horse battery");
        assert_eq!(format!("{ok:?}"), "NewPassword(***)");
        let e = NewPassword::parse("short", "pw").expect_err("short");
        assert_eq!(e.field(), Some("pw"));
    }
}

#[cfg(test)]
mod setup_tests {
    use super::*;

    #[test]
    fn a_fresh_install_lists_every_step_and_a_set_up_one_nothing() {
        let fresh = SetupChecklist::from_facts(SetupFacts::default(), false);
        assert!(fresh.shows());
        assert!(fresh.steps.iter().all(|s| !s.done));
        let keys: Vec<&str> = fresh.steps.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, ["team", "quota", "people", "nodes", "prices"]);
        let done = SetupFacts {
            teams: 1,
            quotas: 1,
            people: 0,
            sso: true,
            nodes: 2,
            rates: 3,
        };
        let all = SetupChecklist::from_facts(done, false);
        assert!(
            all.steps.iter().all(|s| s.done),
            "single sign-on counts as people"
        );
        assert!(!all.shows());
        let dismissed = SetupChecklist::from_facts(SetupFacts::default(), true);
        assert!(!dismissed.shows());
    }
}
