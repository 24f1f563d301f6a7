//! Tessera's pure core: values in, values out.
//!
//! No I/O, no clock (time is a parameter), no randomness without a seed; builds for
//! `wasm32-unknown-unknown` so the UI can share these types with the server.

pub mod account;
pub mod alloc;
pub mod audit;
pub mod billing;
pub mod booking;
pub mod cluster;
pub mod drain;
pub mod error;
pub mod health;
pub mod ids;
pub mod image;
pub mod mig;
pub mod notify;
pub mod planner;
pub mod spares;
pub mod sso;
pub mod tenancy;
pub mod text;
pub mod wire;
pub mod workload;

/// `TryFrom<String>` through the type's parser, so the store reads these enums straight
/// from their text columns (`#[sqlx(try_from = "String")]`): a value no release wrote
/// fails the read loudly instead of quietly becoming some fallback state.
macro_rules! stored_as_text {
    ($($t:ty => $parse:path),* $(,)?) => {
        $(impl TryFrom<String> for $t {
            type Error = error::AppError;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                $parse(&s)
            }
        })*
    };
}

stored_as_text!(
    alloc::AllocState => str::parse,
    alloc::PriorityClass => str::parse,
    alloc::Approver => str::parse,
    alloc::ReleaseCause => str::parse,
    alloc::PreemptCause => str::parse,
    alloc::Ranks => alloc::Ranks::parse,
    wire::GangLauncher => wire::GangLauncher::parse,
    drain::DeadlineCause => str::parse,
    wire::MigMode => wire::MigMode::parse_stored,
    wire::ShareMethod => wire::ShareMethod::parse_stored,
    billing::EntryType => str::parse,
    workload::WorkloadState => str::parse,
    workload::WorkloadKind => str::parse,
    tenancy::TeamRole => tenancy::TeamRole::parse,
);
