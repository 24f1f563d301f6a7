//! Who acts: a verified [`Principal`] or the platform's own [`SystemActor`]; and
//! credentials: password hashing under load, and throttling of failed sign-ins.

pub mod limiter;
pub mod principal;
pub use principal::Principal;
pub mod system;
pub use system::SystemActor;
pub mod password;
pub mod secret;
