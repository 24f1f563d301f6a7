//! The first-run checklist: what a fresh install still lacks, ticked as an admin works
//! through it, on the dashboard until done or put away; only platform admins see it.

use crate::allocations::{set_quota, team};
use crate::on_both_databases;
use crate::support::{ADMIN_PASSWORD, AdminClient, Db, call_with_token};
use reqwest::Method;
use serde_json::Value;

on_both_databases!(a_fresh_install_walks_its_admin_through_setup);

fn done(list: &Value, key: &str) -> bool {
    list["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["key"] == key)
        .unwrap_or_else(|| panic!("no step {key}: {list}"))["done"]
        == true
}

async fn a_fresh_install_walks_its_admin_through_setup(db: Db) {
    let a = AdminClient::new(db).await;
    let (s, fresh) = a.call(Method::GET, "/api/v1/setup", None).await;
    assert_eq!(s, 200, "{fresh}");
    for key in ["team", "quota", "people", "nodes", "prices"] {
        assert!(!done(&fresh, key), "{key} done on a fresh install: {fresh}");
    }
    assert_eq!(fresh["dismissed"], false);

    // The dashboard shows it to the admin, with a link per step.
    let browser = a.app.browser();
    let r = browser.login("admin", ADMIN_PASSWORD).await;
    assert!(
        r.status().is_success() || r.status().is_redirection(),
        "{}",
        r.status()
    );
    let page = browser.page("/").await;
    assert!(
        page.contains("data-testid=\"setup-checklist\""),
        "no checklist on the dashboard"
    );
    assert!(
        page.contains("href=\"/admin/join-tokens\""),
        "no link to add nodes"
    );

    // Each step is ticked once done.
    let t = team(&a, "setup").await;
    set_quota(&a, &t.id, "H100-80GB", 1, 1, 1).await;
    let (_, now) = a.call(Method::GET, "/api/v1/setup", None).await;
    assert!(
        done(&now, "team") && done(&now, "quota") && done(&now, "people"),
        "{now}"
    );
    assert!(!done(&now, "nodes") && !done(&now, "prices"), "{now}");

    // Members do not get it at all.
    let (s, _) = call_with_token(&a.app, &t.member, Method::GET, "/api/v1/setup", None).await;
    assert_eq!(s, 403);

    // Put away, it stays away for this admin.
    let (s, v) = a.call(Method::POST, "/api/v1/setup/dismiss", None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["dismissed"], true);
    let page = browser.page("/").await;
    assert!(
        !page.contains("data-testid=\"setup-checklist\""),
        "the checklist came back"
    );
}
