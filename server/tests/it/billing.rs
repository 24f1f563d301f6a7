//! Metering and money on both stores: allocation histories (written through the store, with
//! times in the future so the metering pass can be given its clock) are metered hour by hour
//! at the rate in force, a mid-period rate change bills each side at its own price, reruns
//! and a pass stopped part-way (a crash) never double-charge, the ledger always balances
//! and refuses edits, the chargeback CSV's total equals the ledger, reversals credit once,
//! and a hard budget sends requests to a platform admin.

use crate::allocations::{Team, request, request_for, set_quota, team};
use crate::on_both_databases;
use crate::support::{AdminClient, Db, TestApp, call_with_token, get_as, post_as};
use chrono::{DateTime, Duration, TimeZone, Utc};
use reqwest::Method;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use tessera_core::Services;
use tessera_core::auth::SystemActor;
use tessera_core::store::{AllocationRow, Change, Store, Transition};
use tessera_domain::ids::AllocationId;
use uuid::Uuid;

/// Services of the test's own over `app`'s database, with the store under them (for
/// rows no service writes: history seeded in the past, a tampered ledger).
pub(crate) async fn services(app: &TestApp) -> (Services, SystemActor, Store) {
    let store = Store::connect(&app.database_url).await.expect("store");
    let (services, system) = crate::support::services_over(store.clone());
    (services, system, store)
}

pub(crate) fn next_hour() -> DateTime<Utc> {
    let now = Utc::now().timestamp();
    Utc.timestamp_opt(now - now.rem_euclid(3600) + 3600, 0)
        .single()
        .expect("time")
}

pub(crate) async fn member_id(a: &AdminClient, team: &str) -> Uuid {
    let (_, v) = a.get(&format!("/api/v1/teams/{team}/members")).await;
    let id = v["items"]
        .as_array()
        .expect("members")
        .iter()
        .find(|m| m["role"] == "member")
        .and_then(|m| m["user_id"].as_str())
        .expect("member");
    Uuid::parse_str(id).expect("uuid")
}

#[allow(clippy::too_many_arguments)]
/// Writes an allocation that was active over `[start, end)` (`end = None`: still active),
/// through the same store transitions the scheduler uses.
pub(crate) async fn history(
    store: &Store,
    team: Uuid,
    user: Uuid,
    kind: &str,
    count: i64,
    units: i64,
    priority: &str,
    start: DateTime<Utc>,
    end: Option<DateTime<Utc>>,
) -> AllocationId {
    let id = AllocationId(Uuid::new_v4());
    let created = start - Duration::minutes(1);
    let row = AllocationRow {
        id,
        priority: priority.parse().expect("priority"),
        purpose: "billing test".into(),
        duration_minutes: 60 * 24,
        ..AllocationRow::queued(
            tessera_domain::ids::TeamId(team),
            tessera_domain::ids::UserId(user),
            &kind.parse().expect("kind"),
            (count, units),
            created,
        )
    };
    store.insert_allocation(&row, "test").await.expect("insert");
    let step = |from: &'static str, to: &'static str, at: DateTime<Utc>, change: Change| {
        let store = store.clone();
        async move {
            let (from, to) = (from.parse().expect("state"), to.parse().expect("state"));
            let t = Transition::plain(id, (from, to), at, change);
            assert!(
                store.transition(&t).await.expect("transition"),
                "{from} → {to}"
            );
        }
    };
    step("queued", "placing", created, Change::default()).await;
    // Placed devices are recorded with the activation, as the scheduler does.
    let devices = json!([{"node_id": Uuid::nil(), "hostname": "sim-bill", "gpu_uuid": format!("GPU-{id}"),
        "profile": null, "start": null, "mig_uuid": format!("MIG-{id}")}]);
    let active = Change {
        active_at: Some(start),
        devices: Some(devices.to_string()),
        ..Change::default()
    };
    step("placing", "active", start, active).await;
    if let Some(end) = end {
        step("active", "releasing", end, Change::default()).await;
        step("releasing", "ended", end, Change::default()).await;
    }
    id
}

/// Sets `team`'s budget to `body`, as the platform admin: `(status, budget)`.
pub(crate) async fn put_budget(a: &AdminClient, team: &str, body: Value) -> (u16, Value) {
    a.put(&format!("/api/v1/teams/{team}/budget"), body).await
}

pub(crate) async fn set_rate(
    a: &AdminClient,
    kind: &str,
    price: i64,
    discount: u8,
    from: DateTime<Utc>,
) {
    let (s, v) = a
        .call(
            Method::POST,
            "/api/v1/rates",
            Some(json!({"kind": kind, "price_minor_per_hour": price,
                "preemptible_discount_pct": discount, "effective_from": from})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
}

/// `12.34` → 1234.
fn minor(text: &str) -> i64 {
    let neg = text.starts_with('-');
    let (w, f) = text
        .trim_start_matches('-')
        .split_once('.')
        .unwrap_or((text, "0"));
    let v = w.parse::<i64>().expect("whole") * 100
        + format!("{f:0<2}")[..2].parse::<i64>().expect("cents");
    if neg { -v } else { v }
}

/// The chargeback CSV's rows (header checked) and its BilledCost total.
pub(crate) async fn chargeback(
    app: &TestApp,
    token: &str,
    query: &str,
) -> (u16, Vec<Vec<String>>, i64) {
    let r = reqwest::Client::new()
        .get(app.url(&format!("/api/v1/exports/chargeback.csv?{query}")))
        .bearer_auth(token)
        .send()
        .await
        .expect("export");
    let status = r.status().as_u16();
    if status != 200 {
        return (status, Vec::new(), 0);
    }
    assert!(
        r.headers()["content-type"]
            .to_str()
            .expect("type")
            .starts_with("text/csv")
    );
    let text = r.text().await.expect("body");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    assert_eq!(
        header[..4],
        [
            "BillingPeriodStart",
            "BillingPeriodEnd",
            "ChargePeriodStart",
            "ChargePeriodEnd"
        ]
    );
    let billed = header
        .iter()
        .position(|h| *h == "BilledCost")
        .expect("BilledCost");
    let rows: Vec<Vec<String>> = lines.map(split_csv).collect();
    for r in &rows {
        assert_eq!(r.len(), header.len(), "{r:?}");
    }
    let total = rows.iter().map(|r| minor(&r[billed])).sum();
    (status, rows, total)
}

/// One CSV line's fields (quotes handled; the test data has no newlines in fields).
fn split_csv(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

async fn balance(store: &Store) -> (i64, i64) {
    store.ledger_balance().await.expect("balance")
}

async fn metering_bills_each_hour_once_at_its_rate(db: Db) {
    let a = AdminClient::new(db).await;
    let t: Team = team(&a, "meter").await;
    let team_id = Uuid::parse_str(&t.id).expect("team");
    let user = member_id(&a, &t.id).await;
    let (s, system, store) = services(&a.app).await;
    let h = next_hour();
    // Whole H100s: 7.00/h from `h`, 14.00/h from `h + 3h`; preemptible half price.
    set_rate(&a, "H100-80GB:whole", 700, 50, h).await;
    set_rate(&a, "H100-80GB:whole", 1400, 50, h + Duration::hours(3)).await;
    // Two 1g.10gb (priced pro rata: 1/7 of a whole H100 each) from h+1:30 to h+4:15.
    let slices = history(
        &store,
        team_id,
        user,
        "H100-80GB:1g.10gb",
        2,
        2,
        "normal",
        h + Duration::minutes(90),
        Some(h + Duration::minutes(255)),
    )
    .await;
    // A preemptible whole H100 from h+2h, still active.
    history(
        &store,
        team_id,
        user,
        "H100-80GB:whole",
        1,
        7,
        "preemptible",
        h + Duration::hours(2),
        None,
    )
    .await;
    let now = h + Duration::hours(6);
    // Slices: 0.5 h × 2.00 + 1 h × 2.00 + 1 h × 4.00 + 0.25 h × 4.00 = 8.00.
    // Whole (half price): 3.50 + 3 × 7.00 = 24.50 for the four complete hours.
    let expected = 800 + 2450;

    // A pass stopped after each allocation (a crash between allocations), then rerun, then
    // two passes at once: every hour is billed exactly once.
    let r = s.billing.meter(&system, now, Some(1)).await.expect("meter");
    assert_eq!((r.allocations, r.hours), (1, 4), "{r:?}");
    let (first, second) = tokio::join!(
        s.billing.meter(&system, now, None),
        s.billing.meter(&system, now, None)
    );
    let written = first.expect("meter").hours + second.expect("meter").hours;
    assert_eq!(
        written, 4,
        "the other allocation's four hours, written once"
    );
    let again = s.billing.meter(&system, now, None).await.expect("meter");
    assert_eq!(again.hours, 0, "{again:?}");
    assert_eq!(
        balance(&store).await,
        (0, 16),
        "8 charges, 2 entries each, summing to 0"
    );
    let team = tessera_domain::ids::TeamId(team_id);
    let charged = store
        .team_charges(Some(team), h - Duration::days(1), now + Duration::days(1))
        .await
        .expect("charges");
    assert_eq!(charged, vec![(team, expected)]);

    // Usage as the team admin: the whole team; as the member: their own (the same here).
    let q = format!(
        "team={}&from={}&to={}",
        t.id,
        h.format("%Y-%m-%d"),
        now.format("%Y-%m-%d")
    );
    let (st, u) = get_as(&a.app, &t.team_admin, &format!("/api/v1/usage?{q}")).await;
    assert_eq!(st, 200, "{u}");
    assert_eq!(u["total"]["cost_minor"], expected);
    assert_eq!(u["own_only"], false);
    let kinds: BTreeSet<&str> = u["kinds"]
        .as_array()
        .expect("kinds")
        .iter()
        .filter_map(|k| k["key"].as_str())
        .collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["H100-80GB:1g.10gb", "H100-80GB:whole"])
    );
    // 2 slices × 2.75 h = 5.5 slice-hours = 0.7857 GPU-hours; 4 whole GPU-hours.
    let gpu_ms = u["total"]["gpu_ms"].as_i64().expect("gpu_ms");
    assert!(
        (4 * 3_600_000 + 2_828_570..=4 * 3_600_000 + 2_828_573).contains(&gpu_ms),
        "{gpu_ms}"
    );
    let (st, own) = get_as(&a.app, &t.member, &format!("/api/v1/usage?{q}")).await;
    assert_eq!(st, 200);
    assert_eq!(own["own_only"], true);
    assert_eq!(own["total"]["cost_minor"], expected);

    // The chargeback CSV: one row per allocation-hour, its total equal to the ledger's.
    let (st, rows, total) = chargeback(&a.app, &t.team_admin, &q).await;
    assert_eq!(st, 200);
    assert_eq!((rows.len(), total), (8, expected));
    assert!(
        rows.iter()
            .any(|r| r.iter().any(|f| f == &format!("MIG-{slices}")))
    );
    // The statement(s) of the month(s) these hours fall in add up to the same.
    let months: BTreeSet<String> = [h, now - Duration::hours(1)]
        .iter()
        .map(|d| d.format("%Y-%m").to_string())
        .collect();
    let mut statement_total = 0;
    for m in &months {
        let (st, v) = call_with_token(
            &a.app,
            &t.team_admin,
            Method::GET,
            &format!("/api/v1/teams/{}/statements/{m}", t.id),
            None,
        )
        .await;
        assert_eq!(st, 200, "{v}");
        statement_total += v["total_minor"].as_i64().expect("total");
    }
    assert_eq!(statement_total, expected);

    // A reversal credits one charge once; the ledger still balances; nothing is edited.
    let (_, ledger) = a.get(&format!("/api/v1/ledger?{q}&limit=200")).await;
    let charge = ledger["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|e| e["account"] != "platform" && e["allocation_id"] == slices.to_string())
        .expect("a charge")
        .clone();
    let txn = charge["txn_id"].as_str().expect("txn");
    let amount = charge["amount_minor"].as_i64().expect("amount");
    let path = format!("/api/v1/ledger/{txn}/reverse");
    let (st, v) = post_as(&a.app, &t.team_admin, &path, json!({"reason": "no"})).await;
    assert_eq!(st, 403, "{v}");
    let (st, v) = a.post(&path, json!({"reason": ""})).await;
    assert_eq!((st, v["error"]["field"].as_str()), (422, Some("reason")));
    let (st, v) = a
        .post(&path, json!({"reason": "job crashed on a bad node"}))
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, _) = a.post(&path, json!({"reason": "again"})).await;
    assert_eq!(st, 409);
    assert_eq!(balance(&store).await, (0, 18));
    let (_, _, after) = chargeback(&a.app, &t.team_admin, &q).await;
    assert_eq!(after, expected - amount);
    assert_eq!(
        s.billing
            .meter(&system, now, None)
            .await
            .expect("meter")
            .hours,
        0,
        "a reversed hour is not billed again"
    );
    let refused = match &store {
        Store::Sqlite(p) => sqlx::query("UPDATE ledger_entries SET amount_minor = 0")
            .execute(p)
            .await
            .err(),
        Store::Postgres(p) => sqlx::query("DELETE FROM ledger_entries")
            .execute(p)
            .await
            .err(),
    };
    assert!(refused.is_some_and(|e| e.to_string().contains("append-only")));
    assert_eq!(balance(&store).await, (0, 18));

    // Rate changes and budget changes are audited.
    let (_, audit) = a.get("/api/v1/audit?action=rate.set").await;
    assert_eq!(audit["total"], 2);
    let (_, audit) = a.get("/api/v1/audit?action=ledger.reverse").await;
    assert_eq!(audit["total"], 1);
}

async fn rates_and_exports_reject_bad_input_and_other_teams(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "rates").await;
    let other = team(&a, "others").await;
    let h = next_hour();
    for (body, field) in [
        (
            json!({"kind": "H100-80GB:whole", "price_minor_per_hour": 100, "effective_from": h - Duration::hours(2)}),
            "effective_from",
        ),
        (
            json!({"kind": "H100-80GB:whole", "price_minor_per_hour": 100, "effective_from": h + Duration::minutes(30)}),
            "effective_from",
        ),
        (
            json!({"kind": "H100-80GB:9g.99gb", "price_minor_per_hour": 100}),
            "kind",
        ),
        (
            json!({"kind": "H100-80GB:whole", "price_minor_per_hour": -1}),
            "price_minor_per_hour",
        ),
        (
            json!({"kind": "H100-80GB:whole", "price_minor_per_hour": 1, "preemptible_discount_pct": 101}),
            "preemptible_discount_pct",
        ),
    ] {
        let (s, v) = a.post("/api/v1/rates", body.clone()).await;
        assert_eq!(
            (s, v["error"]["field"].as_str()),
            (422, Some(field)),
            "{body}: {v}"
        );
    }
    let (_, rates) = a.call(Method::GET, "/api/v1/rates", None).await;
    assert_eq!(rates, json!([]), "nothing stored");
    let (s, v) = call_with_token(
        &a.app,
        &t.member,
        Method::POST,
        "/api/v1/rates",
        Some(json!({"kind": "H100-80GB:whole", "price_minor_per_hour": 1})),
    )
    .await;
    assert_eq!(s, 403, "{v}");
    // Exports: a team admin gets their own team, another team is a 404, members are refused,
    // and a bad period names the field.
    let own = format!("team={}", t.id);
    assert_eq!(chargeback(&a.app, &t.team_admin, &own).await.0, 200);
    assert_eq!(chargeback(&a.app, &other.team_admin, &own).await.0, 404);
    assert_eq!(chargeback(&a.app, &t.member, &own).await.0, 403);
    assert_eq!(chargeback(&a.app, &t.team_admin, "").await.0, 422);
    let (s, v) = call_with_token(
        &a.app,
        &t.team_admin,
        Method::GET,
        &format!("/api/v1/usage?team={}&from=2026-02-30", t.id),
        None,
    )
    .await;
    assert_eq!((s, v["error"]["field"].as_str()), (422, Some("from")));
    let (s, v) = call_with_token(
        &a.app,
        &t.team_admin,
        Method::GET,
        &format!("/api/v1/teams/{}/statements/13-2026", t.id),
        None,
    )
    .await;
    assert_eq!((s, v["error"]["field"].as_str()), (422, Some("month")));
    let (s, _) = call_with_token(
        &a.app,
        &other.team_admin,
        Method::GET,
        &format!("/api/v1/teams/{}/statements/2026-11", t.id),
        None,
    )
    .await;
    assert_eq!(s, 404);
    let (s, v) = put_budget(&a, &t.id, json!({"monthly_minor": -5})).await;
    assert_eq!(
        (s, v["error"]["field"].as_str()),
        (422, Some("monthly_minor"))
    );
}

async fn a_hard_budget_sends_requests_to_a_platform_admin(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "budget").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    // 7.00 per whole H100-hour from the current hour: a 1g.10gb costs 1.00/h.
    let now = Utc::now().timestamp();
    let current = Utc
        .timestamp_opt(now - now.rem_euclid(3600), 0)
        .single()
        .expect("time");
    set_rate(&a, "H100-80GB:whole", 700, 0, current).await;
    let (s, b) = put_budget(&a, &t.id, json!({"monthly_minor": 500, "hard": true})).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        (
            b["monthly_minor"].as_i64(),
            b["spent_minor"].as_i64(),
            b["alert"].is_null()
        ),
        (Some(500), Some(0), true)
    );
    // 8 h of one slice (8.00) would exceed the 5.00 budget: a platform admin decides.
    let (s, v) = request_for(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb", 480).await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["state"], "pending_approval");
    assert_eq!(v["approver"], "platform_admin");
    assert!(
        v["approval_reason"]
            .as_str()
            .is_some_and(|r| r.contains("budget") && r.contains("8.00")),
        "{v}"
    );
    // 2 h (2.00) fits: queued at once.
    let (s, v) = request_for(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb", 120).await;
    assert_eq!(s, 201);
    assert_ne!(v["state"], "pending_approval", "{v}");
    // A soft budget only alerts.
    let (s, _) = put_budget(&a, &t.id, json!({"monthly_minor": 500, "hard": false})).await;
    assert_eq!(s, 200);
    let (_, v) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_ne!(v["state"], "pending_approval", "{v}");
    // Budgets are visible to the team, listed for admins, and audited.
    let (s, v) = get_as(&a.app, &t.member, &format!("/api/v1/teams/{}/budget", t.id)).await;
    assert_eq!((s, v["monthly_minor"].as_i64()), (200, Some(500)));
    let (_, all) = a.call(Method::GET, "/api/v1/budgets", None).await;
    assert!(
        all.as_array()
            .expect("budgets")
            .iter()
            .any(|b| b["team_id"] == t.id.as_str())
    );
    let (_, audit) = a.get("/api/v1/audit?action=budget.set").await;
    assert_eq!(audit["total"], 2);
}

/// The request form's estimate is a use case with its own route: today's price pro rata
/// for a slice, the preemptible discount, nothing for open-ended or unpriced requests, and
/// bad input named (who may ask: the authorization matrix).
async fn an_estimate_prices_a_request_at_todays_rate(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "estimate").await;
    let (s, v) = a
        .call(
            Method::POST,
            "/api/v1/rates",
            Some(json!({"kind": "H100-80GB:whole", "price_minor_per_hour": 700,
                "preemptible_discount_pct": 50, "effective_from": next_hour() - Duration::hours(1)})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let estimate =
        async |query: &str| get_as(&a.app, &t.member, &format!("/api/v1/estimate?{query}")).await;
    // A 1g.10gb slice is 1/7 of an H100: 100 an hour, × 2 slices × 3 hours.
    let (s, v) = estimate("kind=H100-80GB:1g.10gb&count=2&duration_hours=3").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["minor"], 600, "{v}");
    let currency = v["currency"].as_str().expect("currency").to_owned();
    assert_eq!(v["text"], format!("6.00 {currency}"));
    let (_, v) =
        estimate("kind=H100-80GB:1g.10gb&count=2&duration_hours=3&priority=preemptible").await;
    assert_eq!(v["minor"], 300, "{v}");
    for unpriced in [
        "kind=H100-80GB:1g.10gb",
        "kind=H100-80GB:whole&duration_hours=0",
        "kind=A100-SXM4-40GB:whole&duration_hours=5",
    ] {
        let (s, v) = estimate(unpriced).await;
        assert_eq!(
            (s, &v["minor"], &v["text"]),
            (200, &json!(0), &json!("")),
            "{unpriced}"
        );
    }
    for (query, field) in [
        ("kind=H100-80GB:9g.99gb&duration_hours=1", "kind"),
        ("kind=NoSuchGPU:whole&duration_hours=1", "kind"),
        ("kind=H100-80GB:whole&count=0&duration_hours=1", "count"),
        (
            "kind=H100-80GB:whole&duration_hours=1&priority=urgent",
            "priority",
        ),
    ] {
        let (s, v) = estimate(query).await;
        assert_eq!(
            (s, v["error"]["field"].as_str()),
            (422, Some(field)),
            "{query}: {v}"
        );
    }
}

/// The id of the member of `team` with `role`.
async fn user_with_role(a: &AdminClient, team: &str, role: &str) -> Uuid {
    let (_, v) = a.get(&format!("/api/v1/teams/{team}/members")).await;
    let id = v["items"]
        .as_array()
        .expect("members")
        .iter()
        .find(|m| m["role"] == role)
        .and_then(|m| m["user_id"].as_str())
        .expect("member");
    Uuid::parse_str(id).expect("uuid")
}

/// The dashboard's "my usage this month": the caller's own allocations in every team of
/// theirs, never a teammate's (not even for a team admin) nor another team's.
async fn own_usage_is_the_callers_own_and_nobody_elses(db: Db) {
    let a = AdminClient::new(db).await;
    let mine = team(&a, "own-a").await;
    let other = team(&a, "own-b").await;
    let member = user_with_role(&a, &mine.id, "member").await;
    let lead = user_with_role(&a, &mine.id, "team_admin").await;
    let stranger = user_with_role(&a, &other.id, "member").await;
    // The member is in the other team too, and uses GPUs there as well.
    let (st, v) = a
        .call(
            Method::POST,
            &format!("/api/v1/teams/{}/members", other.id),
            Some(json!({"username": "own-a-member", "role": "member"})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let (s, system, store) = services(&a.app).await;
    // One day wholly in one month, in the future (the pass is given its clock).
    let day = next_hour() + Duration::days(2);
    let day = day - Duration::hours(i64::from(chrono::Timelike::hour(&day)));
    set_rate(&a, "H100-80GB:whole", 700, 0, day).await;
    let id = |t: &Team| Uuid::parse_str(&t.id).expect("team");
    let at = |h: i64| day + Duration::hours(h);
    // member: 2 h in her team, 1 h in the other (21.00); lead 3 h; stranger 4 h.
    for (team, user, from, to) in [
        (id(&mine), member, 1, 3),
        (id(&other), member, 3, 4),
        (id(&mine), lead, 1, 4),
        (id(&other), stranger, 1, 5),
    ] {
        history(
            &store,
            team,
            user,
            "H100-80GB:whole",
            1,
            7,
            "normal",
            at(from),
            Some(at(to)),
        )
        .await;
    }
    let now = at(6);
    s.billing.meter(&system, now, None).await.expect("meter");
    let principal = async |name: &str| s.accounts.principal_of(name).await.expect("principal");
    let r = s
        .billing
        .own_usage(&principal("own-a-member").await, now)
        .await
        .expect("own usage");
    assert!(r.own_only);
    assert_eq!(r.total.cost_minor, 2100, "{r:?}");
    assert_eq!(r.total.gpu_ms, 3 * 3_600_000);
    let users: Vec<&str> = r.users.iter().map(|u| u.label.as_str()).collect();
    assert_eq!(users, ["own-a-member"]);
    let teams: BTreeSet<&str> = r.teams.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(teams, BTreeSet::from([mine.id.as_str(), other.id.as_str()]));
    // A team admin's own usage is theirs alone, not the team's.
    let r = s
        .billing
        .own_usage(&principal("own-a-lead").await, now)
        .await
        .expect("own usage");
    assert_eq!(r.total.cost_minor, 2100);
    assert_eq!(r.users.len(), 1);
    assert_eq!(r.teams.len(), 1);
    // The other team's member: theirs only (4 h).
    let r = s
        .billing
        .own_usage(&principal("own-b-member").await, now)
        .await
        .expect("own usage");
    assert_eq!(r.total.cost_minor, 2800, "{r:?}");
    assert_eq!(r.teams.len(), 1);
    // A platform admin who used nothing has nothing of their own, not every team's.
    let admin = principal("admin").await;
    let r = s.billing.own_usage(&admin, now).await.expect("own usage");
    assert_eq!((r.total.cost_minor, r.users.len()), (0, 0), "{r:?}");
}

on_both_databases!(
    own_usage_is_the_callers_own_and_nobody_elses,
    metering_bills_each_hour_once_at_its_rate,
    an_estimate_prices_a_request_at_todays_rate,
    rates_and_exports_reject_bad_input_and_other_teams,
    a_hard_budget_sends_requests_to_a_platform_admin,
);
