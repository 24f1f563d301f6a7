//! The use cases read the time from the `Clock` they are given (`Services::with_clock`),
//! not from the system: a manual clock set years away decides what they accept and show.
// A test: a step that fails should fail it at once, loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use chrono::{Duration, TimeZone, Utc};
use std::sync::Arc;
use tessera_core::Services;
use tessera_core::auth::{limiter::LoginLimiter, password::Hasher};
use tessera_core::clock::Clock;
use tessera_core::store::Store;
use tessera_domain::account::NewPassword;
use tessera_domain::billing::NewRate;

#[tokio::test]
async fn a_manual_clock_decides_which_hours_a_rate_may_start_and_which_rate_is_current() {
    // A full hour in 2040: nothing about it can be read off the system clock.
    let t0 = Utc
        .with_ymd_and_hms(2040, 3, 1, 12, 0, 0)
        .single()
        .expect("time");
    let clock = Clock::manual(t0 + Duration::minutes(30));
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::connect(&format!("sqlite:{}", dir.path().join("t.db").display()))
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    let (s, system) = Services::with_clock(
        store,
        Hasher::new(1, 4).expect("hasher"),
        Arc::new(LoginLimiter::new(Default::default())),
        std::time::Duration::from_secs(3600),
        clock.clone(),
    );
    let pw = NewPassword::parse("clock-test-password", "p").expect("pw");
    s.accounts
        .bootstrap_admin(&system, Some(&pw))
        .await
        .expect("admin");
    let admin = s.accounts.principal_of("admin").await.expect("admin");
    let rate = |from| NewRate {
        kind: "H100-80GB:whole".into(),
        price_minor_per_hour: 700,
        preemptible_discount_pct: 0,
        high_premium_pct: 0,
        effective_from: Some(from),
    };
    // The hour before the clock's is billed already: refused, though it is years ahead of
    // the system's time.
    let refused = s
        .billing
        .set_rate(&admin, &rate(t0 - Duration::hours(1)))
        .await;
    assert!(refused.is_err(), "{refused:?}");
    let next = s
        .billing
        .set_rate(&admin, &rate(t0 + Duration::hours(1)))
        .await
        .expect("the next hour is open");
    assert!(!next.current, "not in force before its hour");
    // Two hours on, by the clock alone, it is the rate in force.
    clock.advance(Duration::hours(2));
    let rates = s.billing.rates(&admin).await.expect("rates");
    let now_in_force: Vec<_> = rates.iter().filter(|r| r.current).map(|r| r.id).collect();
    assert_eq!(now_in_force, [next.id]);
    // And the hour that has now passed can no longer be priced.
    let late = s
        .billing
        .set_rate(&admin, &rate(t0 + Duration::hours(1)))
        .await;
    assert!(late.is_err(), "{late:?}");
}
