//! Sign-in, sessions, CSRF and throttling, on both databases.

use crate::on_both_databases;
use crate::support::{ADMIN_PASSWORD, Db, TestApp, error_kind, session_cookie, set_cookies};

on_both_databases!(
    wrong_then_right_password,
    unknown_users_get_the_same_answer_as_wrong_passwords,
    session_id_is_cycled_at_login,
    logout_deletes_the_session_on_the_server,
    cookie_flags_over_plain_http,
    cookie_flags_over_https_use_the_host_prefix,
    cross_site_posts_are_refused,
    get_never_signs_in,
    repeated_failures_throttle_the_attacker_but_not_the_owner,
    changing_password_signs_out_other_sessions,
    password_change_errors_name_the_field,
    plain_form_posts_redirect_and_carry_errors,
    absolute_timeout_ends_sessions,
);

async fn wrong_then_right_password(db: Db) {
    let app = TestApp::spawn(db).await;
    let b = app.browser();
    assert_eq!(b.whoami().await, None);
    let (status, body) = error_kind(b.login("admin", "not the password").await).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["kind"], "invalid_credentials");
    assert_eq!(b.whoami().await, None);
    let r = b.login("admin", ADMIN_PASSWORD).await;
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(b.whoami().await.as_deref(), Some("admin"));
}

async fn unknown_users_get_the_same_answer_as_wrong_passwords(db: Db) {
    let app = TestApp::spawn(db).await;
    let b = app.browser();
    let wrong = error_kind(b.login("admin", "wrong-password-1").await).await;
    let unknown = error_kind(b.login("nobody", "wrong-password-1").await).await;
    let malformed = error_kind(b.login("!!", "wrong-password-1").await).await;
    // Same status, same error; only the echo of the typed username differs.
    assert_eq!(
        (wrong.0, &wrong.1["error"]),
        (unknown.0, &unknown.1["error"])
    );
    assert_eq!(
        (wrong.0, &wrong.1["error"]),
        (malformed.0, &malformed.1["error"])
    );
    let missing = error_kind(b.login("admin", "").await).await;
    assert_eq!(missing.0, 422);
    assert_eq!(missing.1["error"]["field"], "password");
}

async fn session_id_is_cycled_at_login(db: Db) {
    let app = TestApp::spawn(db).await;
    let b = app.browser();
    let first = session_cookie(&b.login("admin", ADMIN_PASSWORD).await).expect("cookie");
    let second = session_cookie(&b.login("admin", ADMIN_PASSWORD).await).expect("cookie");
    assert_ne!(first, second, "a new session id at each sign-in");
    // The old id no longer works.
    let r = app_call_with_cookie(&app, &first).await;
    assert_eq!(r, None);
    assert_eq!(
        app_call_with_cookie(&app, &second).await.as_deref(),
        Some("admin")
    );
}

async fn app_call_with_cookie(app: &TestApp, cookie: &str) -> Option<String> {
    let r = reqwest::Client::new()
        .post(app.url("/fn/current_user"))
        .header("origin", &app.base)
        .header("cookie", cookie)
        .send()
        .await
        .expect("request");
    let v: serde_json::Value = r.json().await.expect("json");
    v.get("username")
        .and_then(|u| u.as_str())
        .map(str::to_owned)
}

async fn logout_deletes_the_session_on_the_server(db: Db) {
    let app = TestApp::spawn(db).await;
    let b = app.browser();
    let cookie = session_cookie(&b.login("admin", ADMIN_PASSWORD).await).expect("cookie");
    let r = b.call("logout", &[]).await;
    assert!(r.status().is_success());
    assert_eq!(b.whoami().await, None);
    // Replaying the old cookie does not bring the session back.
    assert_eq!(app_call_with_cookie(&app, &cookie).await, None);
}

async fn cookie_flags_over_plain_http(db: Db) {
    let app = TestApp::spawn(db).await;
    let r = app.browser().login("admin", ADMIN_PASSWORD).await;
    let c = set_cookies(&r).join("\n");
    assert!(c.starts_with("tessera_session="), "{c}");
    assert!(c.contains("HttpOnly"), "{c}");
    assert!(c.contains("SameSite=Lax"), "{c}");
    assert!(c.contains("Path=/"), "{c}");
    assert!(!c.contains("Secure"), "{c}");
}

async fn cookie_flags_over_https_use_the_host_prefix(db: Db) {
    let app = TestApp::spawn_with(db, |c| {
        c.public_url = Some("https://gpu.example.org".into());
    })
    .await;
    let r = app.browser().login("admin", ADMIN_PASSWORD).await;
    let c = set_cookies(&r).join("\n");
    assert!(c.starts_with("__Host-tessera_session="), "{c}");
    assert!(
        c.contains("Secure") && c.contains("HttpOnly") && c.contains("Path=/"),
        "{c}"
    );
    assert!(!c.contains("Domain"), "{c}");
}

async fn cross_site_posts_are_refused(db: Db) {
    let app = TestApp::spawn(db).await;
    let form = [("username", "admin"), ("password", ADMIN_PASSWORD)];
    let c = reqwest::Client::new();
    let url = app.url("/fn/login");
    let no_origin = c.post(&url).form(&form).send().await.expect("req");
    assert_eq!(no_origin.status(), 403);
    let evil = c
        .post(&url)
        .header("origin", "https://evil.example")
        .form(&form)
        .send()
        .await
        .expect("req");
    assert_eq!(evil.status(), 403);
    assert!(session_cookie(&evil).is_none());
    let cross = c
        .post(&url)
        .header("sec-fetch-site", "cross-site")
        .header("origin", &app.base)
        .form(&form)
        .send()
        .await
        .expect("req");
    assert_eq!(cross.status(), 403);
    // A signed-in victim's logout cannot be forged either.
    let b = app.browser();
    let cookie = session_cookie(&b.login("admin", ADMIN_PASSWORD).await).expect("cookie");
    let forged = c
        .post(app.url("/fn/logout"))
        .header("origin", "https://evil.example")
        .header("cookie", &cookie)
        .send()
        .await
        .expect("req");
    assert_eq!(forged.status(), 403);
    assert_eq!(b.whoami().await.as_deref(), Some("admin"));
}

async fn get_never_signs_in(db: Db) {
    let app = TestApp::spawn(db).await;
    let r = reqwest::Client::new()
        .get(app.url(&format!(
            "/fn/login?username=admin&password={ADMIN_PASSWORD}"
        )))
        .send()
        .await
        .expect("req");
    assert!(!r.status().is_success(), "{}", r.status());
    assert!(session_cookie(&r).is_none());
}

async fn repeated_failures_throttle_the_attacker_but_not_the_owner(db: Db) {
    let app = TestApp::spawn_with(db, |c| c.trust_proxy_headers = true).await;
    let attacker = app.browser();
    let login_from = |ip: &'static str, pw: &'static str| {
        let c = attacker.client.clone();
        let url = app.url("/fn/login");
        async move {
            c.post(url)
                .header("x-forwarded-for", ip)
                .form(&[("username", "admin"), ("password", pw)])
                .send()
                .await
                .expect("req")
        }
    };
    for _ in 0..5 {
        assert_eq!(
            login_from("203.0.113.9", "guess-guess-guess")
                .await
                .status(),
            401
        );
    }
    let r = login_from("203.0.113.9", "guess-guess-guess").await;
    assert_eq!(r.status(), 429);
    let retry: u64 = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!(retry >= 1);
    // Even the right password is refused from the throttled address...
    assert_eq!(
        login_from("203.0.113.9", ADMIN_PASSWORD).await.status(),
        429
    );
    // ...while the owner, from her own address, signs in at once.
    assert!(
        login_from("198.51.100.7", ADMIN_PASSWORD)
            .await
            .status()
            .is_success()
    );
}

async fn changing_password_signs_out_other_sessions(db: Db) {
    let app = TestApp::spawn(db).await;
    let laptop = app.browser();
    let phone = app.browser();
    assert!(
        laptop
            .login("admin", ADMIN_PASSWORD)
            .await
            .status()
            .is_success()
    );
    assert!(
        phone
            .login("admin", ADMIN_PASSWORD)
            .await
            .status()
            .is_success()
    );
    let new_pw = "a much better password";
    let r = laptop
        .call(
            "change_password",
            &[
                ("current_password", ADMIN_PASSWORD),
                ("new_password", new_pw),
                ("confirm_password", new_pw),
            ],
        )
        .await;
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(
        laptop.whoami().await.as_deref(),
        Some("admin"),
        "this session stays"
    );
    assert_eq!(phone.whoami().await, None, "other sessions are signed out");
    let fresh = app.browser();
    assert_eq!(fresh.login("admin", ADMIN_PASSWORD).await.status(), 401);
    assert!(fresh.login("admin", new_pw).await.status().is_success());
}

async fn password_change_errors_name_the_field(db: Db) {
    let app = TestApp::spawn(db).await;
    let b = app.browser();
    let anon = b
        .call(
            "change_password",
            &[
                ("current_password", ADMIN_PASSWORD),
                ("new_password", "x"),
                ("confirm_password", "x"),
            ],
        )
        .await;
    assert_eq!(anon.status(), 401);
    assert!(b.login("admin", ADMIN_PASSWORD).await.status().is_success());
    let cases = [
        (
            "wrong current password!",
            "brand new password",
            "brand new password",
            "current_password",
        ),
        (ADMIN_PASSWORD, "short", "short", "new_password"),
        (
            ADMIN_PASSWORD,
            "brand new password",
            "something else entirely",
            "confirm_password",
        ),
        (
            ADMIN_PASSWORD,
            ADMIN_PASSWORD,
            ADMIN_PASSWORD,
            "new_password",
        ),
    ];
    for (cur, new, confirm, field) in cases {
        let (status, body) = error_kind(
            b.call(
                "change_password",
                &[
                    ("current_password", cur),
                    ("new_password", new),
                    ("confirm_password", confirm),
                ],
            )
            .await,
        )
        .await;
        assert_eq!(status, 422, "{field}: {body}");
        assert_eq!(body["error"]["field"], field, "{body}");
    }
    // Nothing changed: the original password still works.
    assert!(
        app.browser()
            .login("admin", ADMIN_PASSWORD)
            .await
            .status()
            .is_success()
    );
}

async fn plain_form_posts_redirect_and_carry_errors(db: Db) {
    // Before hydration a form is a plain HTML post: the answer is a redirect back to the
    // page with the error (and the typed username) encoded in the URL.
    let app = TestApp::spawn(db).await;
    let b = app.browser();
    let login_page = app.url("/login");
    let r = b
        .client
        .post(app.url("/fn/login"))
        .header("accept", "text/html")
        .header("referer", &login_page)
        .form(&[("username", "Admin"), ("password", "nope-nope-nope")])
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 302);
    let location = r.headers()["location"]
        .to_str()
        .expect("location")
        .to_owned();
    assert!(
        location.starts_with(&login_page) && location.contains("__err="),
        "{location}"
    );
    let page = b.page(&location).await;
    assert!(page.contains("invalid username or password"), "error shown");
    assert!(page.contains("value=\"Admin\""), "typed username kept");

    let ok = b
        .client
        .post(app.url("/fn/login"))
        .header("accept", "text/html")
        .header("referer", &login_page)
        .form(&[("username", "admin"), ("password", ADMIN_PASSWORD)])
        .send()
        .await
        .expect("req");
    assert_eq!(ok.status(), 302);
    assert_eq!(ok.headers()["location"], "/");
    assert_eq!(b.whoami().await.as_deref(), Some("admin"));
}

async fn absolute_timeout_ends_sessions(db: Db) {
    let app = TestApp::spawn_with(db, |c| {
        c.session_absolute_timeout = std::time::Duration::from_secs(1);
        c.session_idle_timeout = std::time::Duration::from_secs(1);
    })
    .await;
    let b = app.browser();
    assert!(b.login("admin", ADMIN_PASSWORD).await.status().is_success());
    assert_eq!(b.whoami().await.as_deref(), Some("admin"));
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    assert_eq!(b.whoami().await, None);
}
