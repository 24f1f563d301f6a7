//! Users, teams and memberships: the rules beyond who may call what.

use crate::on_both_databases;
use crate::support::{AdminClient, Db, TestApp, call_with_token};
use reqwest::Method;
use serde_json::{Value, json};

async fn user(api: &AdminClient, name: &str) -> String {
    let (s, v) = api
        .call(
            Method::POST,
            "/api/v1/users",
            Some(json!({"username": name, "password": "user-password-1"})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    v["id"].as_str().expect("id").to_owned()
}

on_both_databases!(
    disabling_a_user_ends_their_sessions_and_tokens,
    revoked_tokens_and_disabled_users_stop_within_a_second_everywhere,
    a_team_keeps_at_least_one_team_admin,
    archived_teams_are_read_only,
    lists_paginate,
    bad_input_names_the_field,
);

async fn disabling_a_user_ends_their_sessions_and_tokens(db: Db) {
    let api = AdminClient::new(db).await;
    let id = user(&api, "dana").await;
    let dana = api.app.browser();
    assert!(
        dana.login("dana", "user-password-1")
            .await
            .status()
            .is_success()
    );
    let r = dana
        .client
        .post(api.app.url("/api/v1/tokens"))
        .json(&json!({"name": "cli"}))
        .send()
        .await
        .expect("req");
    let token = r.json::<Value>().await.expect("json")["secret"]
        .as_str()
        .expect("secret")
        .to_owned();
    assert_eq!(
        call_with_token(&api.app, &token, Method::GET, "/api/v1/me", None)
            .await
            .0,
        200
    );

    let (s, v) = api
        .call(Method::POST, &format!("/api/v1/users/{id}/disable"), None)
        .await;
    assert_eq!((s, v["disabled"].clone()), (200, json!(true)));
    assert_eq!(dana.whoami().await, None, "session ended");
    assert_eq!(
        call_with_token(&api.app, &token, Method::GET, "/api/v1/me", None)
            .await
            .0,
        401,
        "token stopped"
    );
    assert_eq!(
        api.app
            .browser()
            .login("dana", "user-password-1")
            .await
            .status(),
        401
    );

    // Enabling again does not revive the old session or token.
    assert_eq!(
        api.call(Method::POST, &format!("/api/v1/users/{id}/enable"), None)
            .await
            .0,
        200
    );
    assert_eq!(dana.whoami().await, None);
    assert_eq!(
        call_with_token(&api.app, &token, Method::GET, "/api/v1/me", None)
            .await
            .0,
        401
    );
    assert!(
        api.app
            .browser()
            .login("dana", "user-password-1")
            .await
            .status()
            .is_success()
    );

    // An admin cannot lock themselves out.
    let admin_id = api.user("admin").await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(
        api.call(
            Method::POST,
            &format!("/api/v1/users/{admin_id}/disable"),
            None
        )
        .await
        .0,
        409
    );
}

async fn me(app: &TestApp, token: &str) -> u16 {
    call_with_token(app, token, Method::GET, "/api/v1/me", None)
        .await
        .0
}

/// Polls until `token` is refused; fails when it is still accepted a second later.
async fn gone_within_a_second(app: &TestApp, token: &str) -> std::time::Duration {
    let t0 = std::time::Instant::now();
    while me(app, token).await != 401 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(1),
            "still accepted a second later"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    t0.elapsed()
}

/// Tokens are trusted for `VERIFIED_FOR` between database checks, yet a revoked token
/// and a disabled user's token stop at once on the replica that made the change and
/// within a second on every other (PostgreSQL: a second replica; SQLite: one process).
async fn revoked_tokens_and_disabled_users_stop_within_a_second_everywhere(db: Db) {
    let api = AdminClient::new(db).await;
    let other = match db {
        Db::Postgres => Some(TestApp::replica_of(&api.app, |_| {}).await),
        Db::Sqlite => None,
    };
    let there = other.as_ref().unwrap_or(&api.app);
    let id = user(&api, "rita").await;
    let rita = api.app.browser();
    assert!(
        rita.login("rita", "user-password-1")
            .await
            .status()
            .is_success()
    );
    let mut tokens = Vec::new();
    for name in ["one", "two"] {
        let v: Value = rita
            .client
            .post(api.app.url("/api/v1/tokens"))
            .json(&json!({"name": name}))
            .send()
            .await
            .expect("req")
            .json()
            .await
            .expect("json");
        tokens.push((
            v["token"]["id"].as_str().expect("id").to_owned(),
            v["secret"].as_str().expect("secret").to_owned(),
        ));
    }
    // Both servers have just verified both tokens.
    for (_, secret) in &tokens {
        assert_eq!(me(&api.app, secret).await, 200);
        assert_eq!(me(there, secret).await, 200);
    }
    let r = rita
        .client
        .delete(api.app.url(&format!("/api/v1/tokens/{}", tokens[0].0)))
        .send()
        .await
        .expect("revoke");
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(
        me(&api.app, &tokens[0].1).await,
        401,
        "revoked: stops here at once"
    );
    let took = gone_within_a_second(there, &tokens[0].1).await;
    eprintln!("revoked token refused elsewhere after {took:?}");

    let (s, _) = api
        .call(Method::POST, &format!("/api/v1/users/{id}/disable"), None)
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        me(&api.app, &tokens[1].1).await,
        401,
        "disabled: stops here at once"
    );
    let took = gone_within_a_second(there, &tokens[1].1).await;
    eprintln!("disabled user's token refused elsewhere after {took:?}");
}

async fn a_team_keeps_at_least_one_team_admin(db: Db) {
    let api = AdminClient::new(db).await;
    let (_, team) = api.post("/api/v1/teams", json!({"name": "Vision"})).await;
    let team = team["id"].as_str().expect("id").to_owned();
    let lead = user(&api, "lead").await;
    let (s, _) = api
        .call(
            Method::POST,
            &format!("/api/v1/teams/{team}/members"),
            Some(json!({"username": "lead", "role": "team_admin"})),
        )
        .await;
    assert_eq!(s, 201);
    let member = format!("/api/v1/teams/{team}/members/{lead}");
    let (s, v) = api.put(&member, json!({"role": "member"})).await;
    assert_eq!(s, 409, "{v}");
    assert!(
        v["message"]
            .as_str()
            .expect("msg")
            .contains("at least one team admin")
    );
    assert_eq!(api.call(Method::DELETE, &member, None).await.0, 409);
    // With a second team admin, the first may step down.
    user(&api, "second").await;
    api.call(
        Method::POST,
        &format!("/api/v1/teams/{team}/members"),
        Some(json!({"username": "second", "role": "team_admin"})),
    )
    .await;
    assert_eq!(
        api.call(Method::PUT, &member, Some(json!({"role": "viewer"})))
            .await
            .0,
        200
    );
    let (_, members) = api.get(&format!("/api/v1/teams/{team}/members")).await;
    assert_eq!(members["total"], 2);
}

async fn archived_teams_are_read_only(db: Db) {
    let api = AdminClient::new(db).await;
    let (_, team) = api.post("/api/v1/teams", json!({"name": "Old Lab"})).await;
    let team = team["id"].as_str().expect("id").to_owned();
    user(&api, "late").await;
    let (s, v) = api
        .call(Method::POST, &format!("/api/v1/teams/{team}/archive"), None)
        .await;
    assert_eq!((s, v["archived"].clone()), (200, json!(true)));
    let (s, _) = api
        .call(
            Method::POST,
            &format!("/api/v1/teams/{team}/members"),
            Some(json!({"username": "late", "role": "member"})),
        )
        .await;
    assert_eq!(s, 409);
    assert_eq!(
        api.call(
            Method::PATCH,
            &format!("/api/v1/teams/{team}"),
            Some(json!({"name": "New"}))
        )
        .await
        .0,
        409
    );
    assert_eq!(
        api.call(Method::GET, &format!("/api/v1/teams/{team}"), None)
            .await
            .0,
        200,
        "still readable"
    );
    api.call(
        Method::POST,
        &format!("/api/v1/teams/{team}/unarchive"),
        None,
    )
    .await;
    assert_eq!(
        api.call(
            Method::POST,
            &format!("/api/v1/teams/{team}/members"),
            Some(json!({"username": "late", "role": "member"}))
        )
        .await
        .0,
        201
    );
}

async fn lists_paginate(db: Db) {
    let api = AdminClient::new(db).await;
    for i in 0..7 {
        api.call(
            Method::POST,
            "/api/v1/teams",
            Some(json!({"name": format!("Team {i:02}")})),
        )
        .await;
    }
    let mut seen = Vec::new();
    for offset in [0, 3, 6] {
        let (_, page) = api
            .get(&format!("/api/v1/teams?offset={offset}&limit=3"))
            .await;
        assert_eq!(page["total"], 7);
        for t in page["items"].as_array().expect("items") {
            seen.push(t["name"].as_str().expect("name").to_owned());
        }
    }
    let expected: Vec<String> = (0..7).map(|i| format!("Team {i:02}")).collect();
    assert_eq!(seen, expected, "pages are disjoint, ordered and complete");
    let (_, capped) = api.get("/api/v1/teams?limit=100000").await;
    assert_eq!(capped["limit"], 200);
}

async fn bad_input_names_the_field(db: Db) {
    let api = AdminClient::new(db).await;
    let cases = [
        (
            "/api/v1/users",
            json!({"username": "9lives", "password": "long enough pw"}),
            "username",
        ),
        (
            "/api/v1/users",
            json!({"username": "fine", "password": "short"}),
            "password",
        ),
        ("/api/v1/teams", json!({"name": "x"}), "name"),
        (
            "/api/v1/tokens",
            json!({"name": "t", "expires_in_days": 0}),
            "expires_in_days",
        ),
        ("/api/v1/join-tokens", json!({"max_uses": 0}), "max_uses"),
        (
            "/api/v1/join-tokens",
            json!({"expires_in_hours": 100000}),
            "expires_in_hours",
        ),
    ];
    for (path, body, field) in cases {
        let (s, v) = api.call(Method::POST, path, Some(body)).await;
        assert_eq!(s, 422, "{path}: {v}");
        assert_eq!(v["error"]["field"], field, "{path}: {v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let (s, v) = api.post("/api/v1/teams", json!({"nom": "typo"})).await;
    assert_eq!(
        (s, v["error"]["field"].clone()),
        (422, json!("body")),
        "{v}"
    );
    let (_, users) = api.call(Method::GET, "/api/v1/users", None).await;
    assert_eq!(users["total"], 1, "nothing was created by bad input");
}
