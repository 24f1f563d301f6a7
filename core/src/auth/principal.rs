//! Who is making a request, sealed: a [`Principal`] is built only inside `core`, by the
//! session, token and password verifiers (and [`Accounts::principal_of`] for trusted
//! server code acting as a stored user). It has no public constructor, no `Deserialize`
//! and no public fields, so no handler can make one up or raise its rights.
//!
//! [`Accounts::principal_of`]: crate::services::accounts::Accounts::principal_of

use tessera_domain::account::{Me, Username};
use tessera_domain::ids::UserId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    user_id: UserId,
    username: Username,
    is_admin: bool,
}

impl Principal {
    /// A stored user as the verifiers found them.
    pub(crate) fn of_user(user_id: UserId, username: Username, is_admin: bool) -> Self {
        Principal {
            user_id,
            username,
            is_admin,
        }
    }

    pub fn user_id(&self) -> UserId {
        self.user_id
    }

    pub fn username(&self) -> &Username {
        &self.username
    }

    /// Platform administrator: sits above teams.
    pub fn is_admin(&self) -> bool {
        self.is_admin
    }
}

impl From<&Principal> for Me {
    fn from(p: &Principal) -> Self {
        Me {
            username: p.username.to_string(),
            is_admin: p.is_admin,
        }
    }
}
