//! The one place `core` reads the wall clock.
//!
//! Use cases take the time from their service's [`Clock`], so a test can hold it still or
//! move it ([`Clock::manual`]); `core/clippy.toml` forbids `Utc::now` everywhere else in
//! the crate.

use chrono::{DateTime, Duration, Utc};
use std::fmt;
use std::sync::{Arc, Mutex};

/// Where a service reads the time: the system's clock, or one a test sets.
#[derive(Clone)]
pub struct Clock(Source);

#[derive(Clone)]
enum Source {
    System,
    Manual(Arc<Mutex<DateTime<Utc>>>),
}

impl Clock {
    /// The system's clock.
    pub fn system() -> Self {
        Clock(Source::System)
    }

    /// A clock that stands at `at` until [`Clock::set`] or [`Clock::advance`] moves it;
    /// its clones move with it.
    pub fn manual(at: DateTime<Utc>) -> Self {
        Clock(Source::Manual(Arc::new(Mutex::new(at))))
    }

    pub fn now(&self) -> DateTime<Utc> {
        match &self.0 {
            #[allow(clippy::disallowed_methods)] // the one place
            Source::System => Utc::now(),
            Source::Manual(at) => *at.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Sets a manual clock to `at`; the system clock does not move.
    pub fn set(&self, at: DateTime<Utc>) {
        if let Source::Manual(cur) = &self.0 {
            *cur.lock().unwrap_or_else(|e| e.into_inner()) = at;
        }
    }

    /// Moves a manual clock on by `by`.
    pub fn advance(&self, by: Duration) {
        let at = self.now() + by;
        self.set(at);
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Source::System => f.write_str("Clock::system()"),
            Source::Manual(_) => write!(f, "Clock::manual({})", self.now()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_its_clones_with_it() {
        let at = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap_or_default();
        let c = Clock::manual(at);
        let twin = c.clone();
        assert_eq!(c.now(), at);
        c.advance(Duration::minutes(5));
        assert_eq!(twin.now(), at + Duration::minutes(5));
        twin.set(at);
        assert_eq!(c.now(), at);
    }
}
