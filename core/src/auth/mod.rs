//! Credentials: password hashing under load, and throttling of failed sign-ins.

pub mod limiter;
pub mod principal;
pub use principal::Principal;
pub mod password;
pub mod secret;
