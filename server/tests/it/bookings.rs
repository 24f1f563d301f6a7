//! Bookings (docs/operations.md): a team admin books capacity for a future window; it is
//! refused with the reason when it cannot be honoured, and at its start the capacity is
//! there: a borrower on it is warned through the deadline channel and preempted in time.
//! A real `tessera-agent --simulate` node (one H100: 7 units) supplies the capacity.

use crate::allocations::{SimAgent, Team, request, set_quota, team, wait_for_state};
use crate::on_both_databases;
use crate::support::{AdminClient, Db, TestApp, call_with_token, get_as};
use chrono::{DateTime, Duration as Span, Utc};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

on_both_databases!(
    a_booking_preempts_its_borrower_and_is_active_at_its_start,
    bookings_that_cannot_be_honoured_are_refused_with_the_reason,
);

fn at(t: DateTime<Utc>) -> String {
    t.to_rfc3339()
}

async fn book(
    app: &TestApp,
    token: &str,
    team: &str,
    kind: &str,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
) -> (u16, Value) {
    call_with_token(
        app,
        token,
        Method::POST,
        "/api/v1/bookings",
        Some(json!({"team_id": team, "kind": kind, "count": 1,
                    "starts_at": at(from), "ends_at": at(to), "purpose": "workshop"})),
    )
    .await
}

/// The cluster's H100 capacity, once the scheduler has seen the node.
async fn wait_for_capacity(a: &AdminClient) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (s, v) = a.call(Method::GET, "/api/v1/cluster/free", None).await;
        assert_eq!(s, 200, "{v}");
        if v.as_object().is_some_and(|m| !m.is_empty()) {
            return;
        }
        assert!(Instant::now() < deadline, "the node never counted: {v}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn two_teams(a: &AdminClient, prefix: &str) -> (Team, Team) {
    let one = team(a, &format!("{prefix}-one")).await;
    let two = team(a, &format!("{prefix}-two")).await;
    for t in [&one, &two] {
        set_quota(a, &t.id, "H100-80GB", 0, 7, 7).await;
    }
    (one, two)
}

async fn a_booking_preempts_its_borrower_and_is_active_at_its_start(db: Db) {
    let app = TestApp::spawn_with(db, |c| {
        c.scheduler_interval = Duration::from_millis(300);
        c.preemption_grace = Duration::from_secs(3);
    })
    .await;
    let a = AdminClient::with_app(app).await;
    let (borrower, booker) = two_teams(&a, "bk-start").await;
    let _node = SimAgent::start(&a, "bk-start-node").await;
    wait_for_capacity(&a).await;

    // The borrower holds the whole GPU.
    let (s, v) = request(&a.app, &borrower.member, &borrower.id, "H100-80GB:whole").await;
    assert_eq!(s, 201, "{v}");
    let held = v["id"].as_str().expect("id").to_owned();
    wait_for_state(&a, &held, "active").await;

    // The other team books it from 30 s on.
    let start = Utc::now() + Span::seconds(30);
    let (s, b) = book(
        &a.app,
        &booker.team_admin,
        &booker.id,
        "H100-80GB:whole",
        (start, start + Span::minutes(10)),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["state"], "booked", "{b}");
    assert_eq!(b["units"], 7, "{b}");
    let booking = b["id"].as_str().expect("id").to_owned();

    // Within the grace before the start, the borrower is warned, to be gone before it.
    let deadline = Instant::now() + Duration::from_secs(40);
    let warned = loop {
        let (_, v) = a.get(&format!("/api/v1/allocations/{held}")).await;
        if let Some(p) = v["preempt_at"].as_str() {
            break p.parse::<DateTime<Utc>>().expect("preempt_at");
        }
        assert!(
            Instant::now() < deadline,
            "the borrower was never warned: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        warned < start,
        "warned to go at {warned}, after the start {start}"
    );
    assert!(warned > start - Span::seconds(60), "{warned}");

    // The borrower is preempted, with the reason; the booking's allocation is active by
    // its start (one pass of slack).
    let gone = wait_for_state(&a, &held, "preempted").await;
    assert!(
        gone.to_string().contains("booked"),
        "the reason names the booking: {gone}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let alloc = loop {
        let (s, v) = call_with_token(
            &a.app,
            &booker.team_admin,
            Method::GET,
            &format!("/api/v1/bookings/{booking}"),
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        if let Some(id) = v["allocation_id"].as_str() {
            assert_eq!(v["state"], "started", "{v}");
            break id.to_owned();
        }
        assert!(Instant::now() < deadline, "the booking never started: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let active = wait_for_state(&a, &alloc, "active").await;
    let active_at: DateTime<Utc> = active["history"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|h| h["to"] == "active")
        .and_then(|h| h["at"].as_str())
        .expect("became active")
        .parse()
        .expect("time");
    eprintln!(
        "booking start {start}; borrower warned to go at {warned}; booking active at {active_at} \
         ({} ms after the start)",
        (active_at - start).num_milliseconds()
    );
    assert!(
        active_at <= start + Span::seconds(2),
        "active at {active_at}, start {start}"
    );
    assert_eq!(active["team_id"], booker.id.as_str(), "{active}");

    // The borrower's team holds nothing now; the booker's holds the GPU.
    let (s, q) = a
        .get(&format!("/api/v1/teams/{}/quotas", borrower.id))
        .await;
    assert_eq!(s, 200);
    assert_eq!(q[0]["used"], 0, "{q}");
    let (s, q) = a.get(&format!("/api/v1/teams/{}/quotas", booker.id)).await;
    assert_eq!(s, 200);
    assert_eq!(q[0]["used"], 7, "{q}");

    // Cancelling a started booking releases its allocation.
    let (s, v) = call_with_token(
        &a.app,
        &booker.team_admin,
        Method::POST,
        &format!("/api/v1/bookings/{booking}/cancel"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "cancelled", "{v}");
    let ended = wait_for_state(&a, &alloc, "ended").await;
    assert!(
        ended.to_string().contains("its booking was cancelled"),
        "{ended}"
    );
}

async fn bookings_that_cannot_be_honoured_are_refused_with_the_reason(db: Db) {
    let app = TestApp::spawn_with(db, |c| {
        c.scheduler_interval = Duration::from_millis(300);
    })
    .await;
    let a = AdminClient::with_app(app).await;
    let (one, two) = two_teams(&a, "bk-refuse").await;
    let _node = SimAgent::start(&a, "bk-refuse-node").await;
    wait_for_capacity(&a).await;
    let t0 = Utc::now() + Span::hours(1);
    let window = (t0, t0 + Span::hours(1));

    // Bad input names the field; nothing is booked by it.
    let field = |v: &Value| v["error"]["field"].as_str().unwrap_or_default().to_owned();
    let post = |body: Value| {
        let app = &a.app;
        let token = one.team_admin.clone();
        async move { call_with_token(app, &token, Method::POST, "/api/v1/bookings", Some(body)).await }
    };
    let base = json!({"team_id": one.id, "kind": "H100-80GB:whole", "count": 1,
                      "starts_at": at(t0), "ends_at": at(t0 + Span::hours(1))});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    for (body, name) in [
        (with("ends_at", json!(at(t0 - Span::minutes(5)))), "ends_at"),
        (
            with("starts_at", json!(at(Utc::now() - Span::hours(2)))),
            "starts_at",
        ),
        (with("count", json!(2)), "count"),
        (with("kind", json!("H100-80GB:share:250")), "kind"),
        (with("colour", json!("blue")), "colour"),
    ] {
        let (s, v) = post(body.clone()).await;
        assert_eq!(s, 422, "{body} → {v}");
        if name != "colour" {
            assert_eq!(field(&v), name, "{body} → {v}");
        }
    }
    let (s, v) = post(with("count", json!(2))).await;
    assert!(
        v.to_string().contains("more than the cluster has"),
        "{s} {v}"
    );

    // Members do not book; a stranger's team is not there.
    let (s, v) = book(&a.app, &one.member, &one.id, "H100-80GB:whole", window).await;
    assert_eq!(s, 403, "{v}");
    let (s, v) = book(&a.app, &two.team_admin, &one.id, "H100-80GB:whole", window).await;
    assert_eq!(s, 404, "{v}");

    // The whole GPU booked by team one: team two's overlapping booking is refused with the
    // reason; the window right after it is free.
    let (s, mine) = book(&a.app, &one.team_admin, &one.id, "H100-80GB:whole", window).await;
    assert_eq!(s, 201, "{mine}");
    let id = mine["id"].as_str().expect("id").to_owned();
    let late = (t0 + Span::minutes(30), t0 + Span::minutes(90));
    let (s, v) = book(&a.app, &two.team_admin, &two.id, "H100-80GB:1g.10gb", late).await;
    assert_eq!(s, 409, "{v}");
    assert!(v.to_string().contains("fully booked"), "{v}");
    let after = (t0 + Span::hours(1), t0 + Span::hours(2));
    let (s, v) = book(&a.app, &two.team_admin, &two.id, "H100-80GB:whole", after).await;
    assert_eq!(s, 201, "{v}");

    // Another team's booking is 404; on the calendar it shows only that the GPU is taken.
    for (method, path) in [
        (Method::GET, format!("/api/v1/bookings/{id}")),
        (Method::POST, format!("/api/v1/bookings/{id}/cancel")),
    ] {
        let (s, v) = call_with_token(&a.app, &two.team_admin, method, &path, None).await;
        assert_eq!(s, 404, "{path}: {v}");
    }
    let calendar = format!(
        "/api/v1/bookings?from={}&to={}&model=H100-80GB",
        urlencode(&at(t0 - Span::hours(1))),
        urlencode(&at(t0 + Span::hours(3)))
    );
    let (s, cal) = call_with_token(&a.app, &two.team_admin, Method::GET, &calendar, None).await;
    assert_eq!(s, 200, "{cal}");
    let cal = cal.as_array().expect("list").clone();
    assert_eq!(cal.len(), 2, "{cal:?}");
    assert!(
        cal[0]["id"].is_null() && cal[0]["team_name"].is_null(),
        "{cal:?}"
    );
    assert_eq!(cal[0]["purpose"], "", "{cal:?}");
    assert_eq!(cal[1]["team_id"], two.id.as_str(), "{cal:?}");
    let (s, all) = a.call(Method::GET, &calendar, None).await;
    assert_eq!(s, 200);
    assert_eq!(
        all[0]["id"],
        id.as_str(),
        "a platform admin sees whose: {all}"
    );
    let (s, v) = get_as(&a.app, &one.member, &format!("/api/v1/bookings/{id}")).await;
    assert_eq!(s, 200, "its own team's member reads it: {v}");
    assert_eq!(v["booked_by"], "bk-refuse-one-lead", "{v}");

    // Only its team's admins cancel; then the window is free for team two.
    let cancel = format!("/api/v1/bookings/{id}/cancel");
    let (s, v) = call_with_token(&a.app, &one.member, Method::POST, &cancel, None).await;
    assert_eq!(s, 403, "{v}");
    let (s, v) = call_with_token(&a.app, &one.team_admin, Method::POST, &cancel, None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["state"], "cancelled");
    let (s, v) = call_with_token(&a.app, &one.team_admin, Method::POST, &cancel, None).await;
    assert_eq!(s, 409, "{v}");
    let (s, v) = book(
        &a.app,
        &two.team_admin,
        &two.id,
        "H100-80GB:1g.10gb",
        window,
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = a.get("/api/v1/audit?action=booking.cancel").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["items"][0]["object_id"], id.as_str(), "audited: {v}");
}

fn urlencode(s: &str) -> String {
    s.replace('+', "%2B").replace(':', "%3A")
}
