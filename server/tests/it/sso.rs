//! Single sign-on against a real OpenID Provider: `oidc-provider` from npm (a certified
//! Node implementation), started per test on loopback by `e2e/oidc/provider.mjs` with a
//! test client, users and group claims. Needs `node` and `npm ci` in `e2e/` (`cargo xtask
//! test` does both).
//!
//! The group map used throughout: `gpu-vision-admins` → vision as team admin,
//! `gpu-vision` → vision as member, `gpu-ops` → platform admin, `gpu-nlp` → a team that
//! does not exist.

use crate::on_both_databases;
use crate::support::{ADMIN_PASSWORD, AdminClient, Browser, Db, TestApp};
use reqwest::Method;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};

const CLIENT_ID: &str = "tessera";
const CLIENT_SECRET: &str = "sso-test-client-secret-0123456789";
const GROUP_MAP: &str = "gpu-vision-admins=vision:team_admin; gpu-vision=vision:member; \
                         gpu-ops=platform_admin; gpu-nlp=nlp:member";

/// The identity provider process (killed when dropped).
struct Idp {
    issuer: String,
    _child: tokio::process::Child,
}

impl Idp {
    async fn start(redirect_uri: &str, extra: &[&str]) -> Idp {
        let e2e = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../e2e");
        assert!(
            e2e.join("node_modules/oidc-provider").exists(),
            "oidc-provider is not installed: run `npm ci` in e2e/ (cargo xtask test does)"
        );
        let mut child = tokio::process::Command::new("node")
            .arg(e2e.join("oidc/provider.mjs"))
            .args(["--redirect-uri", redirect_uri])
            .args(["--client-id", CLIENT_ID, "--client-secret", CLIENT_SECRET])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start node e2e/oidc/provider.mjs");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(30),
            BufReader::new(stdout).read_line(&mut line),
        )
        .await
        .expect("identity provider started in time")
        .expect("read its first line");
        let v: Value = serde_json::from_str(&line).expect("JSON first line");
        Idp {
            issuer: v["issuer"].as_str().expect("issuer").to_owned(),
            _child: child,
        }
    }

    async fn control(&self, path: &str, body: Value) {
        let r = reqwest::Client::new()
            .post(format!("{}{path}", self.issuer))
            .json(&body)
            .send()
            .await
            .expect("control request");
        assert!(r.status().is_success(), "{path}: {}", r.status());
    }

    async fn set_groups(&self, user: &str, groups: &[&str]) {
        self.control(
            "/__test/users",
            json!({"username": user, "password": format!("{user}-password"), "groups": groups}),
        )
        .await;
    }

    async fn fault(&self, mode: &str) {
        self.control("/__test/fault", json!({"mode": mode})).await;
    }
}

/// A Tessera with single sign-on through a fresh provider.
async fn start(db: Db) -> (AdminClient, Idp) {
    start_with(db, &[]).await
}

/// [`start`], with extra `provider.mjs` options.
async fn start_with(db: Db, idp_options: &[&str]) -> (AdminClient, Idp) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let idp = Idp::start(&format!("{base}/auth/oidc/callback"), idp_options).await;
    let issuer = idp.issuer.clone();
    let app = TestApp::spawn_on(db, listener, |c| {
        c.public_url = Some(base.clone());
        c.oidc.issuer = Some(issuer);
        c.oidc.client_id = Some(CLIENT_ID.into());
        c.oidc.client_secret = Some(tessera_server::config::Secret::new(CLIENT_SECRET));
        c.oidc.provider_name = "Test IdP".into();
        c.oidc.group_map = GROUP_MAP.into();
    })
    .await;
    let api = AdminClient::with_app(app).await;
    let (s, v) = api.post("/api/v1/teams", json!({"name": "Vision"})).await;
    assert_eq!(s, 201, "{v}");
    (api, idp)
}

fn location(r: &reqwest::Response, base: &str) -> String {
    let loc = r
        .headers()
        .get("location")
        .unwrap_or_else(|| panic!("no Location on {} {}", r.status(), r.url()))
        .to_str()
        .expect("ascii location");
    if loc.starts_with('/') {
        format!("{base}{loc}")
    } else {
        loc.to_owned()
    }
}

/// The browser's side of a sign-in, up to the provider's answer: starts it at Tessera,
/// signs in at the provider's login page when it shows one, and returns the callback URL
/// the provider redirects to (not yet followed).
async fn authorize(b: &Browser, idp: &Idp, user: &str) -> String {
    authorize_with_cookie(b, idp, user).await.0
}

/// [`authorize`], also returning the session cookie the start of the sign-in set.
async fn authorize_with_cookie(b: &Browser, idp: &Idp, user: &str) -> (String, String) {
    let r = b
        .client
        .post(format!("{}/auth/oidc/login", b.base))
        .send()
        .await
        .expect("start sign-in");
    assert_eq!(r.status(), 303, "start sign-in");
    let pending = crate::support::session_cookie(&r).expect("a session for the pending sign-in");
    let mut next = location(&r, &b.base);
    assert!(
        next.starts_with(&idp.issuer),
        "sent to the provider: {next}"
    );
    for _ in 0..10 {
        if next.starts_with(&format!("{}/auth/oidc/callback", b.base)) {
            return (next, pending);
        }
        let r = b.client.get(&next).send().await.expect("provider");
        if r.status().is_redirection() {
            next = location(&r, &idp.issuer);
            continue;
        }
        assert_eq!(r.status(), 200, "provider page {next}");
        let page = r.text().await.expect("login page");
        let action = page
            .split("action=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .expect("login form");
        let r = b
            .client
            .post(format!("{}{action}", idp.issuer))
            .form(&[
                ("username", user.to_owned()),
                ("password", format!("{user}-password")),
            ])
            .send()
            .await
            .expect("provider login");
        assert!(
            r.status().is_redirection(),
            "login accepted: {}",
            r.status()
        );
        next = location(&r, &idp.issuer);
    }
    panic!("no answer from the provider");
}

/// A query parameter of `url` (the provider's answer), decoded.
fn param(url: &str, name: &str) -> String {
    reqwest::Url::parse(url)
        .expect("url")
        .query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| panic!("no {name} in {url}"))
}

/// Follows the provider's answer; returns where Tessera sends the browser next.
async fn answer(b: &Browser, callback: &str) -> String {
    let r = b.client.get(callback).send().await.expect("callback");
    assert_eq!(r.status(), 303, "callback");
    location(&r, &b.base)
}

async fn sign_in(app: &TestApp, idp: &Idp, user: &str) -> Browser {
    let b = app.browser();
    let callback = authorize(&b, idp, user).await;
    assert_eq!(
        answer(&b, &callback).await,
        app.url("/"),
        "{user} signed in"
    );
    assert_eq!(b.whoami().await.as_deref(), Some(user));
    b
}

async fn get(b: &Browser, path: &str) -> (u16, Value) {
    let r = b
        .client
        .get(format!("{}{path}", b.base))
        .send()
        .await
        .expect("request");
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

/// `(team name, role)` for each team the signed-in user belongs to.
async fn my_teams(b: &Browser) -> Vec<(String, String)> {
    let (s, v) = get(b, "/api/v1/teams").await;
    assert_eq!(s, 200, "{v}");
    v["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|t| !t["my_role"].is_null())
        .map(|t| {
            (
                t["name"].as_str().expect("name").to_owned(),
                t["my_role"].as_str().expect("role").to_owned(),
            )
        })
        .collect()
}

async fn is_admin(b: &Browser) -> bool {
    let (s, v) = get(b, "/api/v1/me").await;
    assert_eq!(s, 200, "{v}");
    v["is_admin"].as_bool().expect("is_admin")
}

async fn first_sign_in_creates_the_user_in_the_mapped_team(db: Db) {
    let (api, idp) = start(db).await;
    let app = &api.app;
    // The sign-in page offers the provider.
    let page = reqwest::get(app.url("/login")).await.expect("login page");
    let page = page.text().await.expect("html");
    assert!(
        page.contains("Sign in with Test IdP"),
        "button on the login page"
    );
    assert!(page.contains("action=\"/auth/oidc/login\""));

    let b = app.browser();
    let (callback, pending) = authorize_with_cookie(&b, &idp, "alice").await;
    assert!(callback.contains("code=") && callback.contains("state="));
    assert_eq!(b.whoami().await, None, "not signed in before the answer");
    let r = b.client.get(&callback).send().await.expect("callback");
    assert_eq!(r.status(), 303);
    let cookie = crate::support::session_cookie(&r).expect("a session cookie");
    let set = crate::support::set_cookies(&r).join("; ");
    assert!(
        set.contains("Max-Age=28800"),
        "the idle timeout applies: {set}"
    );
    assert_eq!(location(&r, &b.base), app.url("/"));
    assert_eq!(b.whoami().await.as_deref(), Some("alice"));
    assert_eq!(
        my_teams(&b).await,
        vec![("Vision".to_owned(), "team_admin".to_owned())]
    );
    assert!(!is_admin(&b).await);

    // A session like a password sign-in's: the id was cycled (the pending sign-in's
    // cookie is worth nothing), and the new cookie alone is signed in.
    assert_ne!(cookie, pending, "session id cycled at sign-in");
    let me = |c: String| {
        let url = app.url("/api/v1/me");
        async move {
            reqwest::Client::new()
                .get(url)
                .header("cookie", c)
                .send()
                .await
                .expect("me")
                .status()
                .as_u16()
        }
    };
    assert_eq!(me(pending).await, 401);
    assert_eq!(me(cookie).await, 200);

    // The new user has no password: password sign-in and password change both refuse.
    let (s, _) =
        crate::support::error_kind(app.browser().login("alice", "alice-password").await).await;
    assert_eq!(s, 401);
    let r = b
        .call(
            "change_password",
            &[
                ("current_password", "anything-at-all"),
                ("new_password", "a-new-password-123"),
                ("confirm_password", "a-new-password-123"),
            ],
        )
        .await;
    let body: Value = r.json().await.expect("json");
    assert!(
        body.to_string().contains("single sign-on"),
        "password change explains: {body}"
    );

    // The admin sees the user and the audit trail records the creation.
    let alice = api.user("alice").await;
    assert_eq!(alice["is_admin"], false);
    assert_eq!(
        alice["has_password"], false,
        "listed as a single sign-on user"
    );
    assert_eq!(api.user("admin").await["has_password"], true);
    let (_, audit) = api.get("/api/v1/audit?action=sso.user_created").await;
    assert_eq!(audit["total"], 1, "{audit}");

    // A second sign-in finds the same user (no duplicate).
    let again = sign_in(app, &idp, "alice").await;
    assert_eq!(my_teams(&again).await.len(), 1);
    // Signed in already: starting another sign-in just goes home.
    let r = again
        .client
        .post(app.url("/auth/oidc/login"))
        .send()
        .await
        .expect("start");
    assert_eq!(location(&r, &app.base), app.url("/"));
    // A stranger's start gets a session that lives only as long as the sign-in may take.
    let r = app
        .browser()
        .client
        .post(app.url("/auth/oidc/login"))
        .send()
        .await
        .expect("start");
    let cookies = crate::support::set_cookies(&r).join("; ");
    assert!(cookies.contains("Max-Age=600"), "{cookies}");
    let (_, users) = api.call(Method::GET, "/api/v1/users", None).await;
    assert_eq!(users["total"], 2, "admin and alice: {users}");
}

async fn an_answer_with_the_wrong_state_is_refused(db: Db) {
    let (api, idp) = start(db).await;
    let app = &api.app;
    let b = app.browser();
    let callback = authorize(&b, &idp, "bob").await;
    let forged = format!(
        "{}/auth/oidc/callback?code={}&state=not-the-state",
        app.base,
        param(&callback, "code")
    );
    assert_eq!(answer(&b, &forged).await, app.url("/login?sso_error=state"));
    assert_eq!(b.whoami().await, None);
    // The pending sign-in was used up by the failed try: the genuine answer is refused too.
    assert_eq!(
        answer(&b, &callback).await,
        app.url("/login?sso_error=state")
    );
    assert_eq!(b.whoami().await, None);
    // An answer delivered to a browser that never started a sign-in (login CSRF).
    let other = app.browser();
    let callback = authorize(&b, &idp, "bob").await;
    assert_eq!(
        answer(&other, &callback).await,
        app.url("/login?sso_error=state")
    );
    assert_eq!(other.whoami().await, None);
    // The page explains.
    let page = reqwest::get(app.url("/login?sso_error=state"))
        .await
        .expect("page")
        .text()
        .await
        .expect("html");
    assert!(
        page.contains("expired or was started in another browser"),
        "message shown"
    );
}

async fn a_replayed_code_is_refused(db: Db) {
    let (api, idp) = start(db).await;
    let app = &api.app;
    let b = app.browser();
    let first = authorize(&b, &idp, "bob").await;
    assert_eq!(answer(&b, &first).await, app.url("/"));
    let r = b.call("logout", &[]).await;
    assert!(r.status().is_success() || r.status().is_redirection());
    assert_eq!(b.whoami().await, None);

    // Replaying the same answer: the pending sign-in is gone.
    assert_eq!(answer(&b, &first).await, app.url("/login?sso_error=state"));
    // Replaying the code under a new sign-in's state: the provider refuses the used code
    // (and it was issued for another PKCE challenge).
    let fresh = authorize(&b, &idp, "bob").await;
    let replay = format!(
        "{}/auth/oidc/callback?code={}&state={}",
        app.base,
        param(&first, "code"),
        param(&fresh, "state")
    );
    assert_eq!(
        answer(&b, &replay).await,
        app.url("/login?sso_error=failed")
    );
    assert_eq!(b.whoami().await, None);
}

async fn a_forged_or_expired_id_token_is_refused(db: Db) {
    let (api, idp) = start(db).await;
    let app = &api.app;
    for fault in ["bad-signature", "expired"] {
        let b = app.browser();
        idp.fault(fault).await;
        let callback = authorize(&b, &idp, "alice").await;
        assert_eq!(
            answer(&b, &callback).await,
            app.url("/login?sso_error=failed"),
            "{fault} refused"
        );
        assert_eq!(b.whoami().await, None, "{fault}: not signed in");
    }
    let (_, users) = api.call(Method::GET, "/api/v1/users", None).await;
    assert_eq!(
        users["total"], 1,
        "no user created from a bad token: {users}"
    );
    // The same flow with an untampered token succeeds.
    sign_in(app, &idp, "alice").await;
}

async fn unknown_groups_grant_nothing(db: Db) {
    let (api, idp) = start(db).await;
    let app = &api.app;
    // carol's only group is not in the map.
    let b = sign_in(app, &idp, "carol").await;
    assert!(my_teams(&b).await.is_empty());
    assert!(!is_admin(&b).await);
    // A group mapped to a team that does not exist grants nothing either.
    idp.set_groups("carol", &["gpu-nlp"]).await;
    let b = sign_in(app, &idp, "carol").await;
    assert!(my_teams(&b).await.is_empty());
    // ...until the team exists.
    let (s, _) = api.post("/api/v1/teams", json!({"name": "NLP"})).await;
    assert_eq!(s, 201);
    let b = sign_in(app, &idp, "carol").await;
    assert_eq!(
        my_teams(&b).await,
        vec![("NLP".to_owned(), "member".to_owned())]
    );
    // The team's page answers for a member.
    let (s, _) = get(&b, "/api/v1/teams").await;
    assert_eq!(s, 200);
}

async fn roles_follow_the_provider_at_each_sign_in(db: Db) {
    let (api, idp) = start(db).await;
    let app = &api.app;
    let b = sign_in(app, &idp, "bob").await;
    assert_eq!(
        my_teams(&b).await,
        vec![("Vision".to_owned(), "member".to_owned())]
    );

    // A team the map does not manage, joined locally, is left alone by the provider.
    let (_, lab) = api.post("/api/v1/teams", json!({"name": "Lab"})).await;
    let lab = lab["id"].as_str().expect("id").to_owned();
    let (s, v) = api
        .call(
            Method::POST,
            &format!("/api/v1/teams/{lab}/members"),
            Some(json!({"username": "bob", "role": "viewer"})),
        )
        .await;
    assert_eq!(s, 201, "{v}");

    // Promoted in the provider: team admin and platform admin at the next sign-in.
    idp.set_groups("bob", &["gpu-vision-admins", "gpu-ops"])
        .await;
    let b = sign_in(app, &idp, "bob").await;
    let mut teams = my_teams(&b).await;
    teams.sort();
    assert_eq!(
        teams,
        vec![
            ("Lab".to_owned(), "viewer".to_owned()),
            ("Vision".to_owned(), "team_admin".to_owned())
        ]
    );
    assert!(is_admin(&b).await);

    // Out of every group: leaves Vision, loses what the claim gave; keeps Lab.
    idp.set_groups("bob", &[]).await;
    let b = sign_in(app, &idp, "bob").await;
    assert_eq!(
        my_teams(&b).await,
        vec![("Lab".to_owned(), "viewer".to_owned())]
    );
    assert!(!is_admin(&b).await);
    let (_, audit) = api.get("/api/v1/audit?action=sso.grants_changed").await;
    assert_eq!(audit["total"], 2, "two sign-ins changed grants: {audit}");

    // The local platform admin is untouched by any of this.
    let admin = app.browser();
    assert!(
        admin
            .login("admin", ADMIN_PASSWORD)
            .await
            .status()
            .is_success()
    );
    assert!(is_admin(&admin).await);

    // Disabling kills the session and refuses the next sign-in.
    let bob = api.user("bob").await["id"].as_str().expect("id").to_owned();
    let (s, _) = api
        .call(Method::POST, &format!("/api/v1/users/{bob}/disable"), None)
        .await;
    assert_eq!(s, 200);
    assert_eq!(b.whoami().await, None, "disabled: session ended");
    let c = app.browser();
    let callback = authorize(&c, &idp, "bob").await;
    assert_eq!(
        answer(&c, &callback).await,
        app.url("/login?sso_error=disabled")
    );
    assert_eq!(c.whoami().await, None);
}

async fn a_username_taken_locally_is_not_taken_over(db: Db) {
    let (api, idp) = start(db).await;
    let app = &api.app;
    // A local user already has the name the provider suggests.
    let (s, v) = api
        .call(
            Method::POST,
            "/api/v1/users",
            Some(json!({"username": "alice", "password": "local-alice-password"})),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let b = app.browser();
    let callback = authorize(&b, &idp, "alice").await;
    assert_eq!(answer(&b, &callback).await, app.url("/"));
    assert_eq!(b.whoami().await.as_deref(), Some("alice-2"));
    // The local alice keeps her password and gets no team from alice-2's claims.
    let local = app.browser();
    assert!(
        local
            .login("alice", "local-alice-password")
            .await
            .status()
            .is_success()
    );
    assert!(my_teams(&local).await.is_empty());
    assert_eq!(
        my_teams(&b).await,
        vec![("Vision".to_owned(), "team_admin".to_owned())]
    );
}

async fn concurrent_first_sign_ins_make_one_user(db: Db) {
    let (api, idp) = start(db).await;
    let app = &api.app;
    let browsers: Vec<Browser> = (0..4).map(|_| app.browser()).collect();
    let mut answers = Vec::new();
    for b in &browsers {
        answers.push(authorize(b, &idp, "alice").await);
    }
    let homes =
        futures_util::future::join_all(browsers.iter().zip(&answers).map(|(b, a)| answer(b, a)))
            .await;
    assert!(homes.iter().all(|h| *h == app.url("/")), "{homes:?}");
    for b in &browsers {
        assert_eq!(b.whoami().await.as_deref(), Some("alice"));
    }
    let (_, users) = api.call(Method::GET, "/api/v1/users", None).await;
    assert_eq!(users["total"], 2, "admin and one alice: {users}");
}

async fn claims_only_at_userinfo_are_read_there(db: Db) {
    // The ID token carries only `sub`; name, e-mail and groups come from userinfo.
    let (api, idp) = start_with(db, &["--claims-in", "userinfo"]).await;
    let b = sign_in(&api.app, &idp, "alice").await;
    assert_eq!(
        my_teams(&b).await,
        vec![("Vision".to_owned(), "team_admin".to_owned())]
    );
}

async fn a_key_rotation_at_the_provider_is_picked_up(db: Db) {
    let (api, idp) = start(db).await;
    // The first sign-in caches the provider's keys.
    sign_in(&api.app, &idp, "alice").await;
    // New signing key: tokens now carry a `kid` the cache has never seen.
    idp.control("/__test/rotate", json!({})).await;
    sign_in(&api.app, &idp, "alice").await;
    // A token signed with neither published key is still refused after looking again.
    idp.fault("bad-signature").await;
    let b = api.app.browser();
    let callback = authorize(&b, &idp, "alice").await;
    assert_eq!(
        answer(&b, &callback).await,
        api.app.url("/login?sso_error=failed")
    );
}

async fn refusals_and_outages_are_explained(db: Db) {
    let (api, idp) = start(db).await;
    let app = &api.app;
    // The provider answers with an error (the user cancelled, or may not use the client).
    let b = app.browser();
    let callback = authorize(&b, &idp, "alice").await;
    let refusal = format!(
        "{}/auth/oidc/callback?error=access_denied&error_description=no&state={}",
        app.base,
        param(&callback, "state")
    );
    assert_eq!(
        answer(&b, &refusal).await,
        app.url("/login?sso_error=denied")
    );
    assert_eq!(b.whoami().await, None);
    // The provider is down before anyone signed in (nothing discovered yet).
    let (api, idp) = start(db).await;
    let addr = idp.issuer.trim_start_matches("http://").to_owned();
    drop(idp);
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(&addr).await.is_err() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let r = api
        .app
        .browser()
        .client
        .post(api.app.url("/auth/oidc/login"))
        .send()
        .await
        .expect("start");
    assert_eq!(
        location(&r, &api.app.base),
        api.app.url("/login?sso_error=unavailable")
    );
}

on_both_databases!(
    refusals_and_outages_are_explained,
    a_key_rotation_at_the_provider_is_picked_up,
    claims_only_at_userinfo_are_read_there,
    concurrent_first_sign_ins_make_one_user,
    first_sign_in_creates_the_user_in_the_mapped_team,
    an_answer_with_the_wrong_state_is_refused,
    a_replayed_code_is_refused,
    a_forged_or_expired_id_token_is_refused,
    unknown_groups_grant_nothing,
    roles_follow_the_provider_at_each_sign_in,
    a_username_taken_locally_is_not_taken_over,
);
