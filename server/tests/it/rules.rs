//! Rules that hold, tried as hostile users would: a team admin cannot approve past the
//! team's limit, a member cannot take `high` priority without the team's grant, a hard
//! budget counts every open allocation and every extension (parallel requests included),
//! and a disabled user's work ends and stays ended.

use crate::allocations::{SimAgent, request, request_for, set_quota, team, wait_for_state};
use crate::billing::{next_hour, put_budget, set_rate};
use crate::on_both_databases;
use crate::support::{AdminClient, Db, call_with_token, post_as, put_as};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::Duration;

async fn quota_line(a: &AdminClient, team: &str, model: &str) -> Value {
    let (s, v) = a.get(&format!("/api/v1/teams/{team}/quotas")).await;
    assert_eq!(s, 200, "{v}");
    v.as_array()
        .and_then(|q| q.iter().find(|q| q["model"] == model).cloned())
        .expect("quota line")
}

/// Guaranteed 2 / limit 2 / per-user 1, three 2-unit requests: a team admin approves the
/// first only; the second goes on to platform admins, who must say it is an override.
async fn a_team_admin_approves_only_within_the_limit(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "limit").await;
    set_quota(&a, &t.id, "H100-80GB", 2, 2, 1).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (s, v) = request(&a.app, &t.member, &t.id, "H100-80GB:2g.20gb").await;
        assert_eq!(s, 201, "{v}");
        assert_eq!(
            (&v["state"], &v["approver"]),
            (&json!("pending_approval"), &json!("team_admin")),
            "{v}"
        );
        ids.push(v["id"].as_str().expect("id").to_owned());
    }
    let approve = |id: &str| format!("/api/v1/allocations/{id}/approve");
    // The team admin approves request `id`, saying "ok".
    let approve_ok = async |id: &str| {
        post_as(&a.app, &t.team_admin, &approve(id), json!({"reason": "ok"})).await
    };
    let (s, v) = approve_ok(&ids[0]).await;
    assert_eq!((s, &v["state"]), (200, &json!("queued")), "{v}");
    let (s, v) = approve_ok(&ids[1]).await;
    assert_eq!(s, 409, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("needs a platform admin: the team would hold 4 of its limit 2"),
        "{v}"
    );
    // It now waits for a platform admin; the team admin can no longer decide it.
    let (_, v) = a.get(&format!("/api/v1/allocations/{}", ids[1])).await;
    assert_eq!(
        (&v["state"], &v["approver"]),
        (&json!("pending_approval"), &json!("platform_admin"))
    );
    let (s, _) = post_as(&a.app, &t.team_admin, &approve(&ids[2]), json!({})).await;
    assert_eq!(s, 409, "the third would be over the limit too");
    let (s, _) = post_as(
        &a.app,
        &t.team_admin,
        &approve(&ids[1]),
        json!({"override": true}),
    )
    .await;
    assert_eq!(s, 403, "a team admin has no override");
    let line = quota_line(&a, &t.id, "H100-80GB").await;
    assert_eq!((&line["used"], &line["limit"]), (&json!(2), &json!(2)));
    // A platform admin, too, must say it is an override.
    let (s, v) = a.post(&approve(&ids[1]), json!({})).await;
    assert_eq!(s, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("override"))
    );
    let (s, v) = a
        .call(
            Method::POST,
            &approve(&ids[1]),
            Some(json!({"override": true, "reason": "conference deadline"})),
        )
        .await;
    assert_eq!((s, &v["state"]), (200, &json!("queued")), "{v}");
    assert_eq!(
        (&v["over_limit"], &v["over_budget"]),
        (&json!(true), &json!(false))
    );
    let line = quota_line(&a, &t.id, "H100-80GB").await;
    assert_eq!(
        (&line["used"], &line["overridden"]),
        (&json!(4), &json!(2)),
        "the quota view shows the override as such: {line}"
    );
    let (_, audit) = a.get("/api/v1/audit?action=allocation.override").await;
    assert_eq!(audit["items"][0]["object_id"], ids[1].as_str());
    assert_eq!(audit["items"][0]["actor"], "admin");
    // An unknown field is an error, not silently dropped.
    let (s, v) = a.post(&approve(&ids[2]), json!({"overide": true})).await;
    assert_eq!(s, 422, "{v}");
}

async fn high_priority_is_granted_per_team(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "prio").await;
    set_quota(&a, &t.id, "H100-80GB", 14, 14, 14).await;
    let ask = async |kind: &str, priority: &str| {
        call_with_token(
            &a.app,
            &t.member,
            Method::POST,
            "/api/v1/allocations",
            Some(json!({"team_id": t.id, "kind": kind, "priority": priority})),
        )
        .await
    };
    let (s, v) = ask("H100-80GB:1g.10gb", "high").await;
    assert_eq!((s, &v["error"]["field"]), (422, &json!("priority")), "{v}");
    let (_, list) = a.call(Method::GET, "/api/v1/allocations", None).await;
    assert_eq!(list["total"], 0, "nothing stored");
    // Preemptible stays open to all.
    let (s, _) = ask("H100-80GB:1g.10gb", "preemptible").await;
    assert_eq!(s, 201);
    // A team admin cannot grant it; a platform admin can, with a cap.
    let grant = format!("/api/v1/teams/{}/priority", t.id);
    let (s, _) = put_as(&a.app, &t.team_admin, &grant, json!({"high": true})).await;
    assert_eq!(s, 403);
    let (s, v) = a.put(&grant, json!({"high": true, "cap": 7})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["high_priority"], json!({"cap": 7}));
    let (s, v) = ask("H100-80GB:1g.10gb", "high").await;
    assert_eq!((s, &v["priority"]), (201, &json!("high")), "{v}");
    // 1 + 7 units at high would pass the cap of 7.
    let (s, v) = ask("H100-80GB:whole", "high").await;
    assert_eq!((s, &v["error"]["field"]), (422, &json!("priority")), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("at most 7"))
    );
    let (s, v) = a.put(&grant, json!({"high": true, "kap": 1})).await;
    assert_eq!(s, 422, "{v}");
    let (s, _) = a.put(&grant, json!({"high": false})).await;
    assert_eq!(s, 200);
    let (s, _) = ask("H100-80GB:1g.10gb", "high").await;
    assert_eq!(s, 422, "withdrawn");
    let (_, audit) = a.get("/api/v1/audit?action=priority.grant").await;
    assert_eq!(audit["total"], 1);
    // `high` has its own price on the rate card: a premium on top of the rate.
    let hour = next_hour() - chrono::Duration::hours(1);
    let rate = json!({"kind": "H100-80GB:whole", "price_minor_per_hour": 700,
                      "high_premium_pct": 50, "effective_from": hour});
    let (s, v) = a.post("/api/v1/rates", rate).await;
    assert_eq!((s, &v["high_premium_pct"]), (201, &json!(50)), "{v}");
    for (priority, minor) in [("normal", 200), ("high", 300)] {
        let (s, v) = call_with_token(
            &a.app,
            &t.member,
            Method::GET,
            &format!(
                "/api/v1/estimate?kind=H100-80GB:1g.10gb&duration_hours=2&priority={priority}"
            ),
            None,
        )
        .await;
        assert_eq!((s, &v["minor"]), (200, &json!(minor)), "{priority}: {v}");
    }
    let rate = json!({"kind": "H100-80GB:whole", "price_minor_per_hour": 700,
                      "high_premium_pct": 5000});
    let (s, v) = a.post("/api/v1/rates", rate).await;
    assert_eq!(
        (s, &v["error"]["field"]),
        (422, &json!("high_premium_pct")),
        "{v}"
    );
}

/// 7.00 per whole H100-hour (a 1g.10gb slice 1.00/h), a hard budget of 5.00.
async fn priced_team(a: &AdminClient, name: &str) -> crate::allocations::Team {
    let t = team(a, name).await;
    set_quota(a, &t.id, "H100-80GB", 7, 7, 7).await;
    let hour = next_hour() - chrono::Duration::hours(1);
    set_rate(a, "H100-80GB:whole", 700, 0, hour).await;
    let (s, b) = put_budget(a, &t.id, json!({"monthly_minor": 500, "hard": true})).await;
    assert_eq!(s, 200, "{b}");
    t
}

/// Several requests at once, each under the budget alone: committed spend counts every
/// open one, so at most 5.00 is admitted.
async fn a_hard_budget_holds_against_parallel_requests(db: Db) {
    let a = AdminClient::new(db).await;
    let t = priced_team(&a, "parallel").await;
    let url = a.app.url("/api/v1/allocations");
    let calls: Vec<_> = (0..6)
        .map(|_| {
            let (url, token, team) = (url.clone(), t.member.clone(), t.id.clone());
            tokio::spawn(async move {
                let r = reqwest::Client::new()
                    .post(url)
                    .bearer_auth(token)
                    .json(&json!({"team_id": team, "kind": "H100-80GB:1g.10gb",
                        "duration_minutes": 120}))
                    .send()
                    .await
                    .expect("request");
                assert_eq!(r.status(), 201);
                r.json::<Value>().await.expect("json")
            })
        })
        .collect();
    let mut admitted = 0;
    for c in calls {
        let v = c.await.expect("task");
        if v["state"] == "pending_approval" {
            assert!(
                v["approval_reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("budget")),
                "{v}"
            );
        } else {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 2, "2 × 2.00 fit in 5.00, a third does not");
}

/// An extension is weighed like a request: an active 2-hour slice (2.00) may grow by 3
/// hours (5.00 in all), not by 4.
async fn a_hard_budget_holds_against_extensions(db: Db) {
    let a = AdminClient::new(db).await;
    let t = priced_team(&a, "extend").await;
    let _agent = SimAgent::start(&a, "budget-h100").await;
    let (s, v) = request_for(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb", 120).await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    wait_for_state(&a, &id, "active").await;
    let extend = format!("/api/v1/allocations/{id}/extend");
    let (s, v) = post_as(&a.app, &t.member, &extend, json!({"minutes": 240})).await;
    assert_eq!((s, &v["error"]["field"]), (422, &json!("minutes")), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("hard monthly budget is 5.00")),
        "{v}"
    );
    let (s, v) = post_as(&a.app, &t.member, &extend, json!({"minutes": 180})).await;
    assert_eq!(s, 200, "{v}");
    // Now nothing more fits: even a short request waits for a platform admin.
    let (_, v) = request_for(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb", 60).await;
    assert_eq!(v["state"], "pending_approval", "{v}");
}

async fn a_disabled_users_work_ends_and_stays_ended(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "gone").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 1).await;
    let (_, queued) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    let (_, waiting) = request(&a.app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(queued["state"], "queued");
    assert_eq!(waiting["state"], "pending_approval");
    let (_, members) = a.get(&format!("/api/v1/teams/{}/members", t.id)).await;
    let user = members["items"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["username"] == "gone-member"))
        .and_then(|m| m["user_id"].as_str())
        .expect("member")
        .to_owned();
    let (s, _) = a
        .call(Method::POST, &format!("/api/v1/users/{user}/disable"), None)
        .await;
    assert_eq!(s, 200);
    for v in [&queued, &waiting] {
        let id = v["id"].as_str().expect("id");
        let v = wait_for_state(&a, id, "cancelled").await;
        let last = v["history"].as_array().and_then(|h| h.last()).cloned();
        assert_eq!(
            last.map(|l| l["note"].clone()),
            Some(json!("its owner's account was disabled"))
        );
    }
    assert_eq!(quota_line(&a, &t.id, "H100-80GB").await["used"], 0);
    let (s, _) = a
        .call(Method::POST, &format!("/api/v1/users/{user}/enable"), None)
        .await;
    assert_eq!(s, 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, v) = a
        .call(
            Method::GET,
            &format!("/api/v1/allocations/{}", queued["id"].as_str().expect("id")),
            None,
        )
        .await;
    assert_eq!(v["state"], "cancelled", "re-enabling brings nothing back");
}

on_both_databases!(
    a_team_admin_approves_only_within_the_limit,
    high_priority_is_granted_per_team,
    a_hard_budget_holds_against_parallel_requests,
    a_hard_budget_holds_against_extensions,
    a_disabled_users_work_ends_and_stays_ended,
);
