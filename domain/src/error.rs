//! The one error type every layer agrees on.
//!
//! Services return it, REST maps it to a status code and JSON body, and the UI matches on it
//! to put a message next to the right form field. Infrastructure failures become an opaque
//! [`AppError::Internal`]; the server logs the cause and never shows it to the user.

use serde::{Deserialize, Serialize};

/// What went wrong, in terms a user (or a client program) can act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AppError {
    /// No valid session or token.
    #[error("please sign in")]
    Unauthorized,
    /// Signed in, but the role does not allow this.
    #[error("you do not have permission to do this")]
    Forbidden,
    /// Missing, or belongs to another team: both look exactly the same.
    #[error("not found")]
    NotFound,
    /// Bad input; `field` names the form field or JSON field at fault.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    /// Sign-in failed. Deliberately says nothing about which part was wrong.
    #[error("invalid username or password")]
    InvalidCredentials,
    /// Too many attempts; try again after `retry_after_secs`.
    #[error("too many attempts, try again in {retry_after_secs} s")]
    RateLimited { retry_after_secs: u64 },
    /// The request conflicts with the current state (e.g. the last team admin).
    #[error("{message}")]
    Conflict { message: String },
    /// Something failed on the server; details are in the server log only.
    #[error("internal error, please try again")]
    Internal,
}

impl AppError {
    /// Shorthand for a field error.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        AppError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Shorthand for a conflict with the current state.
    pub fn conflict(message: impl Into<String>) -> Self {
        AppError::Conflict {
            message: message.into(),
        }
    }

    /// The form field this error belongs to, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            AppError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }

    /// HTTP status code for this error (kept here so REST and server functions agree).
    pub fn status(&self) -> u16 {
        match self {
            AppError::Unauthorized | AppError::InvalidCredentials => 401,
            AppError::Forbidden => 403,
            AppError::NotFound => 404,
            AppError::Invalid { .. } => 422,
            AppError::Conflict { .. } => 409,
            AppError::RateLimited { .. } => 429,
            AppError::Internal => 500,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_serialize_with_a_stable_kind_tag() {
        let json = serde_json::to_string(&AppError::invalid("username", "is required"))
            .expect("serializes");
        assert_eq!(
            json,
            r#"{"kind":"invalid","field":"username","message":"is required"}"#
        );
        let back: AppError = serde_json::from_str(&json).expect("round-trips");
        assert_eq!(back.field(), Some("username"));
    }

    #[test]
    fn every_variant_serializes() {
        // Internally tagged enums cannot carry bare strings: this would fail at run time.
        for e in [
            AppError::Unauthorized,
            AppError::Forbidden,
            AppError::NotFound,
            AppError::invalid("f", "m"),
            AppError::InvalidCredentials,
            AppError::RateLimited {
                retry_after_secs: 3,
            },
            AppError::conflict("busy"),
            AppError::Internal,
        ] {
            let json = serde_json::to_string(&e).expect("serializes");
            let back: AppError = serde_json::from_str(&json).expect("round-trips");
            assert_eq!(back, e);
        }
    }

    #[test]
    fn credentials_error_does_not_say_which_part_was_wrong() {
        assert_eq!(
            AppError::InvalidCredentials.to_string(),
            "invalid username or password"
        );
        assert_eq!(AppError::InvalidCredentials.status(), 401);
    }
}
