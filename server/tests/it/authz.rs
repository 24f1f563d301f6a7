//! The authorization matrix: every REST route and every server function × six principals
//! (anonymous, viewer, member and team admin of team A, team admin of team B, platform
//! admin), each outcome checked against the table below. The table must name exactly the
//! routes the server registers, so a new route without a row fails this test.

use crate::support::{ADMIN_PASSWORD, Db, TestApp, login};
use reqwest::Method;
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// Principals, in the order of each row's expectations.
const WHO: [&str; 6] = [
    "anonymous",
    "viewer",
    "member",
    "team_admin",
    "other_team_admin",
    "admin",
];
const PW: &str = "matrix-password-1";

/// Everything a route's path and body may refer to. Targets are per principal (index `i`)
/// so that one principal's successful mutation does not change another's outcome.
pub struct Fixture {
    app: TestApp,
    /// API tokens and session cookies per principal (`None` for anonymous).
    tokens: Vec<Option<String>>,
    cookies: Vec<Option<String>>,
    team_a: String,
    team_b: String,
    /// Users who are plain members of team A, one per principal (to change or remove).
    a_extra: Vec<String>,
    /// Users in no team, one per principal (to add, disable, reset).
    spare_ids: Vec<String>,
    spare_names: Vec<String>,
    /// A second token of the member's, to revoke.
    member_token_id: String,
    join_token_id: String,
    node_id: String,
    gpu_uuid: String,
    /// Admitted allocations of team A's member, one per principal (to read, release).
    allocs: Vec<String>,
    /// Allocations of the member waiting for a team admin's approval, one per principal.
    pending: Vec<String>,
    /// A notebook of the member's on each of `allocs` (stored directly: no allocation in
    /// the matrix becomes active), named `nb{i}`.
    workloads: Vec<String>,
    /// Webhooks of team A, one per principal (to change or remove); they point at a
    /// closed loopback port (the fixture's server allows private webhook addresses).
    webhooks: Vec<String>,
    /// Platform-wide webhooks, one per principal (to change or remove).
    platform_hooks: Vec<String>,
    /// Bookings of team A, one per principal (to read, cancel), stored directly: the
    /// matrix's node may be offline by the time a row runs, leaving no capacity to book.
    bookings: Vec<String>,
}

async fn send(
    app: &TestApp,
    method: Method,
    path: &str,
    auth: Auth<'_>,
    body: Body,
) -> reqwest::Response {
    let c = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let mut rb = c.request(method, app.url(path)).header("origin", &app.base);
    match auth {
        Auth::None => {}
        Auth::Token(t) => rb = rb.bearer_auth(t),
        Auth::Cookie(c) => rb = rb.header("cookie", c),
    }
    rb = match body {
        Body::None => rb,
        Body::Json(v) => rb.json(&v),
        Body::Form(f) => rb.form(&f),
    };
    rb.send().await.expect("request")
}

#[derive(Clone, Copy)]
enum Auth<'a> {
    None,
    Token(&'a str),
    Cookie(&'a str),
}

enum Body {
    None,
    Json(Value),
    Form(Vec<(String, String)>),
}

fn form(pairs: &[(&str, &str)]) -> Body {
    Body::Form(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
}

const PAGE: [(&str, &str); 2] = [("page[offset]", "0"), ("page[limit]", "10")];

impl Fixture {
    pub async fn new(db: Db) -> Fixture {
        let app = TestApp::spawn_with(db, |c| c.notify.webhook_allow_private = true).await;
        let admin_cookie = login(&app, "admin", ADMIN_PASSWORD).await;
        let admin_token = create_token(&app, Auth::Cookie(&admin_cookie)).await;
        let admin = Auth::Token(&admin_token);
        let mk_user = |name: String| {
            let app = &app;
            async move {
                let r = send(
                    app,
                    Method::POST,
                    "/api/v1/users",
                    admin,
                    Body::Json(json!({"username": name, "password": PW})),
                )
                .await;
                assert_eq!(r.status(), 201, "create user {name}");
                r.json::<Value>().await.expect("json")["id"]
                    .as_str()
                    .expect("id")
                    .to_owned()
            }
        };
        let mk_team = |name: &'static str| {
            let app = &app;
            async move {
                let r = send(
                    app,
                    Method::POST,
                    "/api/v1/teams",
                    admin,
                    Body::Json(json!({"name": name})),
                )
                .await;
                assert_eq!(r.status(), 201);
                r.json::<Value>().await.expect("json")["id"]
                    .as_str()
                    .expect("id")
                    .to_owned()
            }
        };
        let add = |team: String, user: String, role: &'static str| {
            let app = &app;
            async move {
                let r = send(
                    app,
                    Method::POST,
                    &format!("/api/v1/teams/{team}/members"),
                    admin,
                    Body::Json(json!({"username": user, "role": role})),
                )
                .await;
                assert_eq!(r.status(), 201, "add {user} as {role}");
            }
        };
        let team_a = mk_team("Team A").await;
        let team_b = mk_team("Team B").await;
        let mut tokens = vec![None];
        let mut cookies = vec![None];
        for (name, team, role) in [
            ("viewer-a", &team_a, "viewer"),
            ("member-a", &team_a, "member"),
            ("tadmin-a", &team_a, "team_admin"),
            ("tadmin-b", &team_b, "team_admin"),
        ] {
            mk_user(name.to_owned()).await;
            add(team.clone(), name.to_owned(), role).await;
            let cookie = login(&app, name, PW).await;
            tokens.push(Some(create_token(&app, Auth::Cookie(&cookie)).await));
            cookies.push(Some(cookie));
        }
        tokens.push(Some(admin_token.clone()));
        cookies.push(Some(admin_cookie));
        let mut a_extra = Vec::new();
        let mut spare_ids = Vec::new();
        let mut spare_names = Vec::new();
        for i in 0..WHO.len() {
            let name = format!("extra{i}");
            a_extra.push(mk_user(name.clone()).await);
            add(team_a.clone(), name, "member").await;
            let spare = format!("spare{i}");
            spare_ids.push(mk_user(spare.clone()).await);
            spare_names.push(spare);
        }
        // A second token of the member's, which only the member may revoke.
        let member_token = tokens[2].clone().expect("member token");
        let r = send(
            &app,
            Method::POST,
            "/api/v1/tokens",
            Auth::Token(&member_token),
            Body::Json(json!({"name": "target"})),
        )
        .await;
        let member_token_id = r.json::<Value>().await.expect("json")["token"]["id"]
            .as_str()
            .expect("id")
            .to_owned();
        // A node with one H100, registered and reporting through the agent API.
        let r = send(
            &app,
            Method::POST,
            "/api/v1/join-tokens",
            admin,
            Body::Json(json!({"note": "matrix", "max_uses": 2})),
        )
        .await;
        let jt: Value = r.json().await.expect("json");
        let join_token_id = jt["token"]["id"].as_str().expect("id").to_owned();
        let (node_id, credential) =
            crate::nodes::register(&app, jt["secret"].as_str().expect("secret"), "node-m").await;
        let gpu_uuid = "GPU-matrix-0".to_owned();
        crate::nodes::heartbeat(&app, &credential, &gpu_uuid).await;
        // Team A may hold 70 H100 slices, 6 per user: the member's first six requests
        // are admitted, the next six wait for a team admin.
        let r = send(
            &app,
            Method::PUT,
            &format!("/api/v1/teams/{team_a}/quotas/H100-80GB"),
            admin,
            Body::Json(json!({"guaranteed": 70, "limit": 70, "per_user": 6})),
        )
        .await;
        assert_eq!(r.status(), 200, "set quota");
        let mut made = Vec::new();
        for _ in 0..2 * WHO.len() {
            let r = send(
                &app,
                Method::POST,
                "/api/v1/allocations",
                Auth::Token(&member_token),
                Body::Json(json!({"team_id": team_a, "kind": "H100-80GB:1g.10gb"})),
            )
            .await;
            assert_eq!(r.status(), 201, "request allocation");
            made.push(
                r.json::<Value>().await.expect("json")["id"]
                    .as_str()
                    .expect("id")
                    .to_owned(),
            );
        }
        let pending = made.split_off(WHO.len());
        let workloads = notebooks(&app, &made, &node_id).await;
        let bookings = bookings(&app, &team_a).await;
        let mut webhooks = Vec::new();
        for _ in 0..WHO.len() {
            let r = send(
                &app,
                Method::POST,
                &format!("/api/v1/teams/{team_a}/webhooks"),
                admin,
                Body::Json(json!({"url": "http://127.0.0.1:9/hook"})),
            )
            .await;
            assert_eq!(r.status(), 201, "add webhook");
            webhooks.push(
                r.json::<Value>().await.expect("json")["webhook"]["id"]
                    .as_str()
                    .expect("id")
                    .to_owned(),
            );
        }
        let mut platform_hooks = Vec::new();
        for _ in 0..WHO.len() {
            let r = send(
                &app,
                Method::POST,
                "/api/v1/webhooks",
                admin,
                Body::Json(json!({"url": "http://127.0.0.1:9/platform"})),
            )
            .await;
            assert_eq!(r.status(), 201, "add platform webhook");
            platform_hooks.push(
                r.json::<Value>().await.expect("json")["webhook"]["id"]
                    .as_str()
                    .expect("id")
                    .to_owned(),
            );
        }
        Fixture {
            bookings,
            platform_hooks,
            app,
            tokens,
            cookies,
            team_a,
            team_b,
            a_extra,
            spare_ids,
            spare_names,
            member_token_id,
            join_token_id,
            node_id,
            gpu_uuid,
            allocs: made,
            pending,
            workloads,
            webhooks,
        }
    }
}

/// A pending notebook of the allocation's owner on each allocation, straight into the
/// store (the matrix has no agent, so none could start).
async fn notebooks(app: &TestApp, allocs: &[String], node: &str) -> Vec<String> {
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    let mut out = Vec::new();
    for (i, a) in allocs.iter().enumerate() {
        let alloc = tessera_domain::ids::AllocationId::parse(a).expect("uuid");
        let row = store
            .allocation(alloc)
            .await
            .expect("load")
            .expect("allocation");
        let w = tessera_core::store::WorkloadRow {
            node_id: Some(tessera_domain::ids::NodeId::parse(node).expect("uuid")),
            hostname: "node-m".into(),
            token: Some(tessera_core::at_rest::Sealed::clear("matrix-token")),
            ..tessera_core::store::WorkloadRow::new(
                tessera_domain::workload::WorkloadKind::Notebook,
                &format!("nb{i}"),
                (alloc, row.a.team_id, row.a.user_id),
                tessera_domain::workload::WorkloadState::Pending,
                chrono::Utc::now(),
            )
        };
        let id = w.id;
        assert!(store.insert_workload(&w).await.expect("insert"));
        out.push(id.to_string());
    }
    out
}

/// A booking of team A per principal, tomorrow, straight into the store.
async fn bookings(app: &TestApp, team_a: &str) -> Vec<String> {
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    let team = uuid::Uuid::parse_str(team_a).expect("uuid");
    let admin = store
        .user_by_username("admin")
        .await
        .expect("load")
        .expect("admin");
    let start = chrono::Utc::now() + chrono::Duration::days(1);
    let mut out = Vec::new();
    for i in 0..WHO.len() {
        let row = tessera_core::store::BookingRow {
            id: uuid::Uuid::new_v4(),
            team_id: tessera_domain::ids::TeamId(team),
            user_id: tessera_domain::ids::UserId(admin.id.0),
            kind: "H100-80GB:1g.10gb".parse().expect("kind"),
            model: "H100-80GB".into(),
            count: 1,
            units: 1,
            starts_at: start,
            ends_at: start + chrono::Duration::hours(1),
            purpose: format!("matrix {i}"),
            created_at: chrono::Utc::now(),
            cancelled_at: None,
            allocation_id: None,
        };
        store
            .book(&row, chrono::Duration::days(7), |_| Ok(()))
            .await
            .expect("book")
            .expect("admitted");
        out.push(row.id.to_string());
    }
    out
}

async fn create_token(app: &TestApp, auth: Auth<'_>) -> String {
    let r = send(
        app,
        Method::POST,
        "/api/v1/tokens",
        auth,
        Body::Json(json!({"name": "matrix"})),
    )
    .await;
    assert_eq!(r.status(), 201);
    r.json::<Value>().await.expect("json")["secret"]
        .as_str()
        .expect("secret")
        .to_owned()
}

type PathFn = fn(&Fixture, usize) -> String;
type BodyFn = fn(&Fixture, usize) -> Body;

struct Row {
    method: Method,
    /// The route as registered (`{id}` placeholders), for the coverage check.
    route: &'static str,
    path: PathFn,
    body: BodyFn,
    expect: [u16; 6],
}

fn none(_: &Fixture, _: usize) -> Body {
    Body::None
}

macro_rules! row {
    ($m:ident $route:literal, $path:expr, $body:expr, $expect:expr) => {
        Row {
            method: Method::$m,
            route: $route,
            path: $path,
            body: $body,
            expect: $expect,
        }
    };
}

/// Platform admin only.
const ADMIN_ONLY: [u16; 6] = [401, 403, 403, 403, 403, 200];
const ANY_USER: [u16; 6] = [401, 200, 200, 200, 200, 200];
/// Team A readable by its members and the platform admin; team B's admin sees "not found".
const TEAM_A_READ: [u16; 6] = [401, 200, 200, 200, 404, 200];
const TEAM_A_MANAGE: [u16; 6] = [401, 403, 403, 200, 404, 200];
/// Extending needs an active allocation: in the matrix none is (no agent applies the
/// layouts), so those who may act get 409, the others their usual refusal.
const EXTEND: [u16; 6] = [401, 403, 409, 409, 404, 409];
/// Workload creation on an allocation that is not active; viewers launch nothing (403).
const NOT_ACTIVE: [u16; 6] = [401, 403, 422, 422, 422, 422];
/// Stopping a workload, reading its log: its owner (the member), team A's admin, a
/// platform admin.
const WORKLOAD_ACT: [u16; 6] = [401, 403, 200, 200, 404, 200];
/// Team A's members (not viewers) and the platform admin may request.
const ALLOC_REQUEST: [u16; 6] = [401, 403, 201, 201, 404, 201];

fn rest_rows() -> Vec<Row> {
    vec![
        row!(GET "/api/v1/me", |_, _| "/api/v1/me".into(), none, [401, 200, 200, 200, 200, 200]),
        row!(GET "/api/v1/setup", |_, _| "/api/v1/setup".into(), none, ADMIN_ONLY),
        row!(POST "/api/v1/setup/dismiss", |_, _| "/api/v1/setup/dismiss".into(), none, ADMIN_ONLY),
        row!(GET "/api/v1/openapi.json", |_, _| "/api/v1/openapi.json".into(), none, [200, 200, 200, 200, 200, 200]),
        row!(GET "/api/v1/users", |_, _| "/api/v1/users".into(), none, ADMIN_ONLY),
        row!(POST "/api/v1/users", |_, _| "/api/v1/users".into(),
            |_, i| Body::Json(json!({"username": format!("new{i}"), "password": PW})), [401, 403, 403, 403, 403, 201]),
        row!(POST "/api/v1/users/{id}/disable", |f, i| format!("/api/v1/users/{}/disable", f.spare_ids[i]), none, ADMIN_ONLY),
        row!(POST "/api/v1/users/{id}/enable", |f, i| format!("/api/v1/users/{}/enable", f.spare_ids[i]), none, ADMIN_ONLY),
        row!(POST "/api/v1/users/{id}/password", |f, i| format!("/api/v1/users/{}/password", f.spare_ids[i]),
            |_, _| Body::Json(json!({"password": "a brand new password"})), ADMIN_ONLY),
        row!(GET "/api/v1/teams", |_, _| "/api/v1/teams".into(), none, ANY_USER),
        row!(POST "/api/v1/teams", |_, _| "/api/v1/teams".into(),
            |_, i| Body::Json(json!({"name": format!("Made by {i}")})), [401, 403, 403, 403, 403, 201]),
        row!(GET "/api/v1/teams/{id}", |f, _| format!("/api/v1/teams/{}", f.team_a), none, TEAM_A_READ),
        row!(PATCH "/api/v1/teams/{id}", |f, _| format!("/api/v1/teams/{}", f.team_a),
            |_, i| Body::Json(json!({"name": format!("Team A {i}")})), TEAM_A_MANAGE),
        row!(GET "/api/v1/teams/{id}/grace", |f, _| format!("/api/v1/teams/{}/grace", f.team_a), none, TEAM_A_READ),
        row!(PUT "/api/v1/teams/{id}/grace", |f, _| format!("/api/v1/teams/{}/grace", f.team_a),
            |_, i| Body::Json(json!({"preemption_grace_secs": 60 + i})), TEAM_A_MANAGE),
        row!(POST "/api/v1/teams/{id}/archive", |f, _| format!("/api/v1/teams/{}/archive", f.team_a), none, ADMIN_ONLY),
        row!(POST "/api/v1/teams/{id}/unarchive", |f, _| format!("/api/v1/teams/{}/unarchive", f.team_b), none, ADMIN_ONLY),
        row!(GET "/api/v1/teams/{id}/members", |f, _| format!("/api/v1/teams/{}/members", f.team_a), none, TEAM_A_READ),
        row!(POST "/api/v1/teams/{id}/members", |f, _| format!("/api/v1/teams/{}/members", f.team_a),
            |f, i| Body::Json(json!({"username": f.spare_names[i], "role": "viewer"})), [401, 403, 403, 201, 404, 201]),
        row!(PUT "/api/v1/teams/{id}/members/{user_id}", |f, i| format!("/api/v1/teams/{}/members/{}", f.team_a, f.a_extra[i]),
            |_, _| Body::Json(json!({"role": "viewer"})), TEAM_A_MANAGE),
        row!(DELETE "/api/v1/teams/{id}/members/{user_id}", |f, i| format!("/api/v1/teams/{}/members/{}", f.team_a, f.a_extra[i]),
            none, [401, 403, 403, 204, 404, 204]),
        row!(GET "/api/v1/tokens", |_, _| "/api/v1/tokens".into(), none, ANY_USER),
        row!(POST "/api/v1/tokens", |_, _| "/api/v1/tokens".into(),
            |_, _| Body::Json(json!({"name": "x", "expires_in_days": 30})), [401, 201, 201, 201, 201, 201]),
        row!(DELETE "/api/v1/tokens/{id}", |f, _| format!("/api/v1/tokens/{}", f.member_token_id), none,
            [401, 404, 204, 404, 404, 404]),
        row!(GET "/api/v1/join-tokens", |_, _| "/api/v1/join-tokens".into(), none, ADMIN_ONLY),
        row!(POST "/api/v1/join-tokens", |_, _| "/api/v1/join-tokens".into(),
            |_, _| Body::Json(json!({"note": "n"})), [401, 403, 403, 403, 403, 201]),
        row!(DELETE "/api/v1/join-tokens/{id}", |f, _| format!("/api/v1/join-tokens/{}", f.join_token_id), none,
            [401, 403, 403, 403, 403, 204]),
        row!(GET "/api/v1/nodes", |_, _| "/api/v1/nodes".into(), none, ANY_USER),
        row!(GET "/api/v1/nodes/{id}", |f, _| format!("/api/v1/nodes/{}", f.node_id), none, ANY_USER),
        row!(GET "/api/v1/nodes/{id}/telemetry", |f, _| format!("/api/v1/nodes/{}/telemetry?limit=5", f.node_id), none, ANY_USER),
        row!(POST "/api/v1/nodes/{id}/drain", |f, _| format!("/api/v1/nodes/{}/drain", f.node_id),
            |_, _| Body::Json(json!({"minutes": 30, "reason": "matrix"})), ADMIN_ONLY),
        row!(DELETE "/api/v1/nodes/{id}/drain", |f, _| format!("/api/v1/nodes/{}/drain", f.node_id), none, ADMIN_ONLY),
        row!(PUT "/api/v1/nodes/{id}/group", |f, _| format!("/api/v1/nodes/{}/group", f.node_id),
            |_, _| Body::Json(json!({"group": "rack-matrix"})), ADMIN_ONLY),
        // The matrix's GPU is healthy: those who may clear get 409.
        row!(POST "/api/v1/nodes/{id}/gpus/{gpu_uuid}/health/clear", |f, _| format!("/api/v1/nodes/{}/gpus/{}/health/clear", f.node_id, f.gpu_uuid),
            none, [401, 403, 403, 403, 403, 409]),
        row!(GET "/api/v1/spares", |_, _| "/api/v1/spares".into(), none, ANY_USER),
        row!(PUT "/api/v1/spares/{model}", |_, _| "/api/v1/spares/H100-80GB".into(),
            |_, _| Body::Json(json!({"gpus": 0})), ADMIN_ONLY),
        // The admin's PUT above made the rule that the admin's DELETE ends.
        row!(DELETE "/api/v1/spares/{model}", |_, _| "/api/v1/spares/H100-80GB".into(), none,
            [401, 403, 403, 403, 403, 204]),
        row!(POST "/api/v1/nodes/{id}/revoke", |f, _| format!("/api/v1/nodes/{}/revoke", f.node_id), none, ADMIN_ONLY),
        row!(PUT "/api/v1/nodes/{id}/gpus/{gpu_uuid}/layout", |f, _| format!("/api/v1/nodes/{}/gpus/{}/layout", f.node_id, f.gpu_uuid),
            |_, _| Body::Json(json!({"mode": "enabled", "layout": [{"profile": "1g.10gb", "start": 0}]})), ADMIN_ONLY),
        // `off` on an unshared GPU: the admin's call succeeds and changes nothing.
        row!(PUT "/api/v1/nodes/{id}/gpus/{gpu_uuid}/sharing", |f, _| format!("/api/v1/nodes/{}/gpus/{}/sharing", f.node_id, f.gpu_uuid),
            |_, _| Body::Json(json!({"sharing": "off"})), ADMIN_ONLY),
        row!(GET "/api/v1/cluster/summary", |_, _| "/api/v1/cluster/summary".into(), none, ANY_USER),
        row!(GET "/api/v1/cluster/free", |_, _| "/api/v1/cluster/free".into(), none, ANY_USER),
        row!(GET "/api/v1/cluster/servers", |_, _| "/api/v1/cluster/servers".into(), none, ADMIN_ONLY),
        row!(GET "/api/v1/allocations", |_, _| "/api/v1/allocations?state=current".into(), none, ANY_USER),
        row!(POST "/api/v1/allocations", |_, _| "/api/v1/allocations".into(),
            |f, _| Body::Json(json!({"team_id": f.team_a, "kind": "H100-80GB:1g.10gb"})), ALLOC_REQUEST),
        row!(GET "/api/v1/allocations/{id}", |f, _| format!("/api/v1/allocations/{}", f.allocs[0]), none, TEAM_A_READ),
        row!(POST "/api/v1/allocations/{id}/release", |f, i| format!("/api/v1/allocations/{}/release", f.allocs[i]), none,
            [401, 403, 200, 200, 404, 200]),
        row!(POST "/api/v1/allocations/{id}/extend", |f, i| format!("/api/v1/allocations/{}/extend", f.allocs[i]),
            |_, _| Body::Json(json!({"minutes": 60})), EXTEND),
        row!(POST "/api/v1/allocations/{id}/approve", |f, i| format!("/api/v1/allocations/{}/approve", f.pending[i]),
            |_, _| Body::Json(json!({"reason": "ok"})), TEAM_A_MANAGE),
        row!(POST "/api/v1/allocations/{id}/deny", |f, i| format!("/api/v1/allocations/{}/deny", f.pending[i]),
            |_, _| Body::Json(json!({"reason": "no"})), TEAM_A_MANAGE),
        row!(GET "/api/v1/bookings", |_, _| "/api/v1/bookings".into(), none, ANY_USER),
        // Two whole GPUs are more than the matrix's one H100: those who may book get 422
        // (after the check of who they are), whether or not its node still reports.
        row!(POST "/api/v1/bookings", |_, _| "/api/v1/bookings".into(),
            |f, _| Body::Json(json!({"team_id": f.team_a, "kind": "H100-80GB:whole", "count": 2,
                "starts_at": (chrono::Utc::now() + chrono::Duration::days(2)).to_rfc3339(),
                "ends_at": (chrono::Utc::now() + chrono::Duration::days(2) + chrono::Duration::hours(1)).to_rfc3339()})),
            [401, 403, 403, 422, 404, 422]),
        row!(GET "/api/v1/bookings/{id}", |f, _| format!("/api/v1/bookings/{}", f.bookings[0]), none, TEAM_A_READ),
        row!(POST "/api/v1/bookings/{id}/cancel", |f, i| format!("/api/v1/bookings/{}/cancel", f.bookings[i]), none,
            TEAM_A_MANAGE),
        row!(GET "/api/v1/teams/{id}/quotas", |f, _| format!("/api/v1/teams/{}/quotas", f.team_a), none, TEAM_A_READ),
        row!(PUT "/api/v1/teams/{id}/quotas/{model}", |f, _| format!("/api/v1/teams/{}/quotas/A100-SXM4-40GB", f.team_a),
            |_, _| Body::Json(json!({"guaranteed": 7, "limit": 14, "per_user": 7})), ADMIN_ONLY),
        row!(PUT "/api/v1/teams/{id}/priority", |f, _| format!("/api/v1/teams/{}/priority", f.team_a),
            |_, _| Body::Json(json!({"high": false})), ADMIN_ONLY),
        row!(GET "/api/v1/audit", |_, _| "/api/v1/audit?action=quota.set".into(), none, ADMIN_ONLY),
        row!(GET "/api/v1/rates", |_, _| "/api/v1/rates".into(), none, ANY_USER),
        row!(POST "/api/v1/rates", |_, _| "/api/v1/rates".into(),
            |_, _| Body::Json(json!({"kind": "A100-SXM4-40GB:whole", "price_minor_per_hour": 250})), [401, 403, 403, 403, 403, 201]),
        row!(GET "/api/v1/estimate", |_, _| "/api/v1/estimate?kind=H100-80GB:whole&duration_hours=2".into(), none, ANY_USER),
        row!(GET "/api/v1/budgets", |_, _| "/api/v1/budgets".into(), none, ADMIN_ONLY),
        row!(GET "/api/v1/teams/{id}/budget", |f, _| format!("/api/v1/teams/{}/budget", f.team_a), none, TEAM_A_READ),
        row!(PUT "/api/v1/teams/{id}/budget", |f, _| format!("/api/v1/teams/{}/budget", f.team_a),
            |_, _| Body::Json(json!({"monthly_minor": 100000, "hard": true})), ADMIN_ONLY),
        row!(GET "/api/v1/ledger", |f, _| format!("/api/v1/ledger?team={}", f.team_a), none, TEAM_A_MANAGE),
        // The fixture has no charges: those allowed to reverse one learn it does not exist.
        row!(POST "/api/v1/ledger/{txn_id}/reverse", |_, _| format!("/api/v1/ledger/{}/reverse", uuid::Uuid::new_v4()),
            |_, _| Body::Json(json!({"reason": "r"})), [401, 403, 403, 403, 403, 404]),
        row!(GET "/api/v1/usage", |f, _| format!("/api/v1/usage?team={}", f.team_a), none, TEAM_A_READ),
        row!(GET "/api/v1/teams/{id}/statements/{month}", |f, _| format!("/api/v1/teams/{}/statements/2026-11", f.team_a),
            none, TEAM_A_MANAGE),
        row!(GET "/api/v1/exports/chargeback.csv", |f, _| format!("/api/v1/exports/chargeback.csv?team={}", f.team_a),
            none, TEAM_A_MANAGE),
        row!(GET "/api/v1/exports/usage.csv", |f, _| format!("/api/v1/exports/usage.csv?team={}", f.team_a),
            none, TEAM_A_READ),
        row!(GET "/api/v1/workloads", |_, _| "/api/v1/workloads?live=true".into(), none, ANY_USER),
        // No allocation in the matrix is active: a notebook or job is refused with the
        // reason (the owner: not active; others: not theirs, or no such allocation).
        // Images: the allow-list is empty here, so an admin's add is refused (422) after
        // the authorization check, without reaching any registry.
        row!(GET "/api/v1/images", |_, _| "/api/v1/images".into(), none, ANY_USER),
        row!(POST "/api/v1/images", |_, _| "/api/v1/images".into(),
            |f, i| Body::Json(json!({"team_id": f.team_a, "name": format!("img{i}"), "reference": "127.0.0.1:1/m/x:1"})),
            [401, 403, 403, 422, 404, 422]),
        row!(DELETE "/api/v1/images/{id}", |_, _| format!("/api/v1/images/{}", uuid::Uuid::new_v4()), none,
            [401, 404, 404, 404, 404, 404]),
        row!(GET "/api/v1/registries", |_, _| "/api/v1/registries".into(), none, ANY_USER),
        row!(POST "/api/v1/registries", |_, _| "/api/v1/registries".into(),
            |_, i| Body::Json(json!({"entry": format!("r{i}.example.com")})), ADMIN_ONLY),
        row!(DELETE "/api/v1/registries", |_, _| "/api/v1/registries?entry=never.example.com".into(), none,
            [401, 403, 403, 403, 403, 404]),
        row!(GET "/api/v1/teams/{id}/registry-logins", |f, _| format!("/api/v1/teams/{}/registry-logins", f.team_a), none, TEAM_A_MANAGE),
        row!(PUT "/api/v1/teams/{id}/registry-logins", |f, _| format!("/api/v1/teams/{}/registry-logins", f.team_a),
            |_, i| Body::Json(json!({"registry": format!("r{i}.example.com"), "username": "u", "password": "p"})), TEAM_A_MANAGE),
        row!(DELETE "/api/v1/teams/{id}/registry-logins",
            |f, _| format!("/api/v1/teams/{}/registry-logins?registry=never.example.com", f.team_a), none,
            [401, 403, 403, 404, 404, 404]),
        row!(GET "/api/v1/teams/{id}/notebook-profiles", |f, _| format!("/api/v1/teams/{}/notebook-profiles", f.team_a), none, TEAM_A_READ),
        row!(POST "/api/v1/teams/{id}/notebook-profiles", |f, _| format!("/api/v1/teams/{}/notebook-profiles", f.team_a),
            |_, i| Body::Json(json!({"name": format!("p{i}"), "kind": "H100-80GB:1g.10gb", "hours": 4})), [401, 403, 403, 201, 404, 201]),
        row!(DELETE "/api/v1/teams/{id}/notebook-profiles/{profile_id}",
            |f, _| format!("/api/v1/teams/{}/notebook-profiles/{}", f.team_a, uuid::Uuid::new_v4()), none, [401, 403, 403, 404, 404, 404]),
        row!(POST "/api/v1/notebooks", |_, _| "/api/v1/notebooks".into(),
            |f, i| Body::Json(json!({"allocation_id": f.allocs[i], "name": "x"})), NOT_ACTIVE),
        row!(POST "/api/v1/jobs", |_, _| "/api/v1/jobs".into(),
            |f, i| Body::Json(json!({"allocation_id": f.allocs[i], "command": "true"})), NOT_ACTIVE),
        row!(GET "/api/v1/workloads/{id}", |f, _| format!("/api/v1/workloads/{}", f.workloads[0]), none, TEAM_A_READ),
        row!(POST "/api/v1/workloads/{id}/stop", |f, i| format!("/api/v1/workloads/{}/stop", f.workloads[i]), none, WORKLOAD_ACT),
        row!(GET "/api/v1/workloads/{id}/logs", |f, _| format!("/api/v1/workloads/{}/logs", f.workloads[0]), none, WORKLOAD_ACT),
        row!(GET "/api/v1/workloads/{id}/log.txt", |f, _| format!("/api/v1/workloads/{}/log.txt", f.workloads[0]), none, WORKLOAD_ACT),
        // Exec: authorized like stopping; the matrix's notebooks never run, so those who may
        // act hear 409 ("not running") before any WebSocket.
        row!(GET "/api/v1/workloads/{id}/exec", |f, _| format!("/api/v1/workloads/{}/exec?command=true", f.workloads[0]), none, [401, 403, 409, 409, 404, 409]),
        // The notebook proxy: the owner and platform admins reach it (the notebook is still
        // pending: 503 "starting"); everyone else gets the 404 of a missing notebook.
        row!(GET "/api/v1/me/notifications", |_, _| "/api/v1/me/notifications".into(), none, ANY_USER),
        row!(PUT "/api/v1/me/notifications", |_, _| "/api/v1/me/notifications".into(),
            |_, i| Body::Json(json!({"email": format!("p{i}@example.org"), "preferences": [{"kind": "workload.succeeded", "mode": "off"}]})), ANY_USER),
        row!(GET "/api/v1/teams/{id}/webhooks", |f, _| format!("/api/v1/teams/{}/webhooks", f.team_a), none, TEAM_A_MANAGE),
        row!(POST "/api/v1/teams/{id}/webhooks", |f, _| format!("/api/v1/teams/{}/webhooks", f.team_a),
            |_, _| Body::Json(json!({"url": "http://127.0.0.1:9/new"})), [401, 403, 403, 201, 404, 201]),
        row!(GET "/api/v1/teams/{id}/webhooks/{hook}", |f, _| format!("/api/v1/teams/{}/webhooks/{}", f.team_a, f.webhooks[0]), none, TEAM_A_MANAGE),
        row!(PUT "/api/v1/teams/{id}/webhooks/{hook}", |f, i| format!("/api/v1/teams/{}/webhooks/{}", f.team_a, f.webhooks[i]),
            |_, _| Body::Json(json!({"url": "http://127.0.0.1:9/changed", "events": ["workload.failed"]})), TEAM_A_MANAGE),
        row!(DELETE "/api/v1/teams/{id}/webhooks/{hook}", |f, i| format!("/api/v1/teams/{}/webhooks/{}", f.team_a, f.webhooks[i]),
            none, [401, 403, 403, 204, 404, 204]),
        row!(GET "/api/v1/teams/{id}/webhooks/{hook}/deliveries", |f, _| format!("/api/v1/teams/{}/webhooks/{}/deliveries", f.team_a, f.webhooks[0]),
            none, TEAM_A_MANAGE),
        // The receiver's port is closed: those allowed get 200 saying it was not delivered.
        row!(POST "/api/v1/teams/{id}/webhooks/{hook}/test", |f, _| format!("/api/v1/teams/{}/webhooks/{}/test", f.team_a, f.webhooks[0]),
            none, TEAM_A_MANAGE),
        // Each row has a fresh fixture, whose users have no address: a link to what?
        row!(POST "/api/v1/me/email/verification", |_, _| "/api/v1/me/email/verification".into(), none,
            [401, 422, 422, 422, 422, 422]),
        // No sign-in needed (the token is the proof); a wrong one names `token`.
        row!(POST "/api/v1/email-verifications", |_, _| "/api/v1/email-verifications".into(),
            |f, _| Body::Json(json!({"user_id": f.team_a, "token": "tev_wrong"})), [422; 6]),
        row!(GET "/api/v1/webhooks", |_, _| "/api/v1/webhooks".into(), none, ADMIN_ONLY),
        row!(POST "/api/v1/webhooks", |_, _| "/api/v1/webhooks".into(),
            |_, _| Body::Json(json!({"url": "http://127.0.0.1:9/p-new"})), [401, 403, 403, 403, 403, 201]),
        row!(GET "/api/v1/webhooks/{hook}", |f, _| format!("/api/v1/webhooks/{}", f.platform_hooks[0]), none, ADMIN_ONLY),
        // A team's hook is not a platform hook: 404 even for a platform admin.
        row!(GET "/api/v1/webhooks/{hook}", |f, _| format!("/api/v1/webhooks/{}", f.webhooks[0]), none,
            [401, 403, 403, 403, 403, 404]),
        row!(PUT "/api/v1/webhooks/{hook}", |f, i| format!("/api/v1/webhooks/{}", f.platform_hooks[i]),
            |_, _| Body::Json(json!({"url": "http://127.0.0.1:9/p-changed"})), ADMIN_ONLY),
        row!(DELETE "/api/v1/webhooks/{hook}", |f, i| format!("/api/v1/webhooks/{}", f.platform_hooks[i]),
            none, [401, 403, 403, 403, 403, 204]),
        row!(GET "/api/v1/webhooks/{hook}/deliveries", |f, _| format!("/api/v1/webhooks/{}/deliveries", f.platform_hooks[0]),
            none, ADMIN_ONLY),
        row!(POST "/api/v1/webhooks/{hook}/test", |f, _| format!("/api/v1/webhooks/{}/test", f.platform_hooks[0]),
            none, ADMIN_ONLY),
        // A platform hook is nobody's team hook.
        row!(GET "/api/v1/teams/{id}/webhooks/{hook}", |f, _| format!("/api/v1/teams/{}/webhooks/{}", f.team_a, f.platform_hooks[0]),
            none, [401, 403, 403, 404, 404, 404]),
        row!(GET "/user/{username}/{server}/{*rest}", |_, _| "/user/member-a/nb0/api/status".into(), none,
            [401, 404, 503, 404, 404, 503]),
    ]
}

fn fn_rows() -> Vec<Row> {
    let page = |_: &Fixture, _: usize| form(&PAGE);
    vec![
        row!(POST "/fn/current_user", |_, _| "/fn/current_user".into(), none, [200; 6]),
        row!(POST "/fn/login_options", |_, _| "/fn/login_options".into(), none, [200; 6]),
        row!(POST "/fn/setup_checklist", |_, _| "/fn/setup_checklist".into(), none, ADMIN_ONLY),
        row!(POST "/fn/dismiss_setup", |_, _| "/fn/dismiss_setup".into(), none, ADMIN_ONLY),
        row!(POST "/fn/login", |_, _| "/fn/login".into(),
            |_, i| Body::Form(vec![("username".into(), format!("nobody{i}")), ("password".into(), "not the password".into())]),
            [401; 6]),
        row!(POST "/fn/logout", |_, _| "/fn/logout".into(), none, [200; 6]),
        row!(POST "/fn/change_password", |_, _| "/fn/change_password".into(),
            |_, _| form(&[("current_password", "wrong one"), ("new_password", "x"), ("confirm_password", "x")]),
            [401, 422, 422, 422, 422, 422]),
        row!(POST "/fn/list_tokens", |_, _| "/fn/list_tokens".into(), page, ANY_USER),
        row!(POST "/fn/create_token", |_, _| "/fn/create_token".into(), |_, _| form(&[("name", "t")]), ANY_USER),
        row!(POST "/fn/revoke_token", |_, _| "/fn/revoke_token".into(),
            |f, _| Body::Form(vec![("id".into(), f.member_token_id.clone())]), [401, 404, 200, 404, 404, 404]),
        row!(POST "/fn/list_users", |_, _| "/fn/list_users".into(), page, ADMIN_ONLY),
        row!(POST "/fn/create_user", |_, _| "/fn/create_user".into(),
            |_, i| Body::Form(vec![("username".into(), format!("fnuser{i}")), ("password".into(), PW.into())]), ADMIN_ONLY),
        row!(POST "/fn/set_user_disabled", |_, _| "/fn/set_user_disabled".into(),
            |f, i| Body::Form(vec![("user_id".into(), f.spare_ids[i].clone()), ("disabled".into(), "true".into())]), ADMIN_ONLY),
        row!(POST "/fn/reset_password", |_, _| "/fn/reset_password".into(),
            |f, i| Body::Form(vec![("user_id".into(), f.spare_ids[i].clone()), ("password".into(), "a brand new password".into())]), ADMIN_ONLY),
        row!(POST "/fn/list_teams", |_, _| "/fn/list_teams".into(), page, ANY_USER),
        row!(POST "/fn/get_team", |_, _| "/fn/get_team".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone())]), TEAM_A_READ),
        row!(POST "/fn/create_team", |_, _| "/fn/create_team".into(),
            |_, i| Body::Form(vec![("name".into(), format!("Fn team {i}"))]), ADMIN_ONLY),
        row!(POST "/fn/rename_team", |_, _| "/fn/rename_team".into(),
            |f, i| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("name".into(), format!("Renamed {i}"))]), TEAM_A_MANAGE),
        row!(POST "/fn/set_team_archived", |_, _| "/fn/set_team_archived".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_b.clone()), ("archived".into(), "false".into())]), ADMIN_ONLY),
        row!(POST "/fn/list_members", |_, _| "/fn/list_members".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("page[offset]".into(), "0".into()), ("page[limit]".into(), "10".into())]),
            TEAM_A_READ),
        row!(POST "/fn/add_member", |_, _| "/fn/add_member".into(),
            |f, i| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("username".into(), f.spare_names[i].clone()), ("role".into(), "member".into())]),
            TEAM_A_MANAGE),
        row!(POST "/fn/change_role", |_, _| "/fn/change_role".into(),
            |f, i| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("user_id".into(), f.a_extra[i].clone()), ("role".into(), "viewer".into())]),
            TEAM_A_MANAGE),
        row!(POST "/fn/remove_member", |_, _| "/fn/remove_member".into(),
            |f, i| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("user_id".into(), f.a_extra[i].clone())]),
            TEAM_A_MANAGE),
        row!(POST "/fn/cluster_summary", |_, _| "/fn/cluster_summary".into(), none, ANY_USER),
        // The caller's own GPU-hours and spend (the dashboard): anyone signed in, for themselves.
        row!(POST "/fn/own_usage", |_, _| "/fn/own_usage".into(), none, ANY_USER),
        row!(POST "/fn/list_servers", |_, _| "/fn/list_servers".into(), none, ADMIN_ONLY),
        row!(POST "/fn/list_nodes", |_, _| "/fn/list_nodes".into(), page, ANY_USER),
        row!(POST "/fn/node_telemetry", |_, _| "/fn/node_telemetry".into(),
            |f, _| Body::Form(vec![("node_id".into(), f.node_id.clone()), ("limit".into(), "5".into())]), ANY_USER),
        row!(POST "/fn/revoke_node", |_, _| "/fn/revoke_node".into(),
            |f, _| Body::Form(vec![("node_id".into(), f.node_id.clone())]), ADMIN_ONLY),
        row!(POST "/fn/drain_node", |_, _| "/fn/drain_node".into(),
            |f, _| Body::Form(vec![("node_id".into(), f.node_id.clone()), ("minutes".into(), "30".into()),
                ("reason".into(), "matrix".into())]), ADMIN_ONLY),
        row!(POST "/fn/clear_gpu_health", |_, _| "/fn/clear_gpu_health".into(),
            |f, _| Body::Form(vec![("node_id".into(), f.node_id.clone()), ("gpu_uuid".into(), f.gpu_uuid.clone())]),
            [401, 403, 403, 403, 403, 409]),
        row!(POST "/fn/undrain_node", |_, _| "/fn/undrain_node".into(),
            |f, _| Body::Form(vec![("node_id".into(), f.node_id.clone())]), ADMIN_ONLY),
        row!(POST "/fn/list_spares", |_, _| "/fn/list_spares".into(), none, ANY_USER),
        row!(POST "/fn/set_spares", |_, _| "/fn/set_spares".into(),
            |_, _| Body::Form(vec![("model".into(), "H100-80GB".into()), ("gpus".into(), "0".into())]), ADMIN_ONLY),
        // The admin's set above made the rule that the admin's clear ends.
        row!(POST "/fn/clear_spares", |_, _| "/fn/clear_spares".into(),
            |_, _| Body::Form(vec![("model".into(), "H100-80GB".into())]), ADMIN_ONLY),
        row!(POST "/fn/set_gpu_layout", |_, _| "/fn/set_gpu_layout".into(),
            |f, _| Body::Form(vec![("node_id".into(), f.node_id.clone()), ("gpu_uuid".into(), f.gpu_uuid.clone()),
                ("mode".into(), "enabled".into()), ("layout".into(), "3g.40gb@0, 1g.10gb@6".into())]), ADMIN_ONLY),
        row!(POST "/fn/set_gpu_sharing", |_, _| "/fn/set_gpu_sharing".into(),
            |f, _| Body::Form(vec![("node_id".into(), f.node_id.clone()), ("gpu_uuid".into(), f.gpu_uuid.clone()),
                ("sharing".into(), "off".into())]), ADMIN_ONLY),
        row!(POST "/fn/list_join_tokens", |_, _| "/fn/list_join_tokens".into(), page, ADMIN_ONLY),
        row!(POST "/fn/create_join_token", |_, _| "/fn/create_join_token".into(),
            |_, _| form(&[("note", "n"), ("max_uses", "1"), ("expires_in_hours", "2")]), ADMIN_ONLY),
        row!(POST "/fn/revoke_join_token", |_, _| "/fn/revoke_join_token".into(),
            |f, _| Body::Form(vec![("id".into(), f.join_token_id.clone())]), ADMIN_ONLY),
        row!(POST "/fn/free_now", |_, _| "/fn/free_now".into(), none, ANY_USER),
        row!(POST "/fn/list_allocations", |_, _| "/fn/list_allocations".into(),
            |_, _| form(&[("team", ""), ("state", "current"), ("mine", "false"), ("page[offset]", "0"), ("page[limit]", "10")]), ANY_USER),
        row!(POST "/fn/request_allocation", |_, _| "/fn/request_allocation".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("kind".into(), "H100-80GB:1g.10gb".into()),
                ("count".into(), "1".into()), ("duration_hours".into(), "".into()), ("starts_at".into(), "".into()),
                ("priority".into(), "normal".into()), ("purpose".into(), "matrix".into()), ("idempotency_key".into(), "".into())]),
            [401, 403, 200, 200, 404, 200]),
        row!(POST "/fn/get_allocation", |_, _| "/fn/get_allocation".into(),
            |f, _| Body::Form(vec![("id".into(), f.allocs[0].clone())]), TEAM_A_READ),
        row!(POST "/fn/release_allocation", |_, _| "/fn/release_allocation".into(),
            |f, i| Body::Form(vec![("id".into(), f.allocs[i].clone())]), [401, 403, 200, 200, 404, 200]),
        row!(POST "/fn/extend_allocation", |_, _| "/fn/extend_allocation".into(),
            |f, i| Body::Form(vec![("id".into(), f.allocs[i].clone()), ("hours".into(), "1".into())]), EXTEND),
        row!(POST "/fn/decide_allocation", |_, _| "/fn/decide_allocation".into(),
            |f, i| Body::Form(vec![("id".into(), f.pending[i].clone()), ("approve".into(), "true".into()), ("reason".into(), "ok".into())]),
            TEAM_A_MANAGE),
        row!(POST "/fn/list_bookings", |_, _| "/fn/list_bookings".into(),
            |_, _| Body::Form(vec![("from".into(), chrono::Utc::now().to_rfc3339()),
                ("to".into(), (chrono::Utc::now() + chrono::Duration::days(7)).to_rfc3339()), ("model".into(), "".into())]),
            ANY_USER),
        // As its REST twin: more than the matrix's one H100, 422 for those who may book.
        row!(POST "/fn/book_capacity", |_, _| "/fn/book_capacity".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("kind".into(), "H100-80GB:whole".into()),
                ("count".into(), "2".into()),
                ("starts_at".into(), (chrono::Utc::now() + chrono::Duration::days(2)).format("%Y-%m-%dT%H:%M").to_string()),
                ("ends_at".into(), (chrono::Utc::now() + chrono::Duration::days(2) + chrono::Duration::hours(1)).format("%Y-%m-%dT%H:%M").to_string()),
                ("purpose".into(), "matrix".into())]),
            [401, 403, 403, 422, 404, 422]),
        row!(POST "/fn/cancel_booking", |_, _| "/fn/cancel_booking".into(),
            |f, i| Body::Form(vec![("id".into(), f.bookings[i].clone())]), TEAM_A_MANAGE),
        row!(POST "/fn/list_quotas", |_, _| "/fn/list_quotas".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone())]), TEAM_A_READ),
        row!(POST "/fn/set_quota", |_, _| "/fn/set_quota".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("model".into(), "A100-SXM4-40GB".into()),
                ("guaranteed".into(), "7".into()), ("limit".into(), "14".into()), ("per_user".into(), "7".into())]), ADMIN_ONLY),
        row!(POST "/fn/set_team_priority", |_, _| "/fn/set_team_priority".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("high".into(), "false".into())]), ADMIN_ONLY),
        row!(POST "/fn/audit_log", |_, _| "/fn/audit_log".into(),
            |_, _| form(&[("action", ""), ("page[offset]", "0"), ("page[limit]", "10")]), ADMIN_ONLY),
        row!(POST "/fn/list_rates", |_, _| "/fn/list_rates".into(), none, ANY_USER),
        row!(POST "/fn/set_rate", |_, _| "/fn/set_rate".into(),
            |_, _| form(&[("kind", "A100-SXM4-40GB:whole"), ("price", "2.50"), ("preemptible_discount_pct", "0"), ("effective_from", "")]),
            ADMIN_ONLY),
        row!(POST "/fn/team_budget", |_, _| "/fn/team_budget".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone())]), TEAM_A_READ),
        row!(POST "/fn/list_budgets", |_, _| "/fn/list_budgets".into(), none, ADMIN_ONLY),
        row!(POST "/fn/team_grace", |_, _| "/fn/team_grace".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone())]), TEAM_A_READ),
        row!(POST "/fn/set_team_grace", |_, _| "/fn/set_team_grace".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("secs".into(), "30".into())]), TEAM_A_MANAGE),
        row!(POST "/fn/save_budget", |_, _| "/fn/save_budget".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("amount".into(), "100.00".into()), ("hard".into(), "on".into())]),
            ADMIN_ONLY),
        row!(POST "/fn/usage", |_, _| "/fn/usage".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("from".into(), "".into()), ("to".into(), "".into())]), TEAM_A_READ),
        row!(POST "/fn/team_statement", |_, _| "/fn/team_statement".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("month".into(), "2026-11".into())]), TEAM_A_MANAGE),
        row!(POST "/fn/ledger_entries", |_, _| "/fn/ledger_entries".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("from".into(), "".into()), ("to".into(), "".into()),
                ("page[offset]".into(), "0".into()), ("page[limit]".into(), "10".into())]), TEAM_A_MANAGE),
        row!(POST "/fn/reverse_charge", |_, _| "/fn/reverse_charge".into(),
            |_, _| Body::Form(vec![("txn_id".into(), uuid::Uuid::new_v4().to_string()), ("reason".into(), "r".into())]),
            [401, 403, 403, 403, 403, 404]),
        row!(POST "/fn/estimate_cost", |_, _| "/fn/estimate_cost".into(),
            |_, _| form(&[("kind", "H100-80GB:1g.10gb"), ("count", "1"), ("duration_hours", "8"), ("priority", "normal")]), ANY_USER),
        row!(POST "/fn/list_workloads", |_, _| "/fn/list_workloads".into(),
            |_, _| form(&[("mine", "false"), ("live", "false"), ("page[offset]", "0"), ("page[limit]", "10")]), ANY_USER),
        row!(POST "/fn/get_workload", |_, _| "/fn/get_workload".into(),
            |f, _| Body::Form(vec![("id".into(), f.workloads[0].clone())]), TEAM_A_READ),
        row!(POST "/fn/notebook_profiles", |_, _| "/fn/notebook_profiles".into(),
            |f, _| Body::Form(vec![("team".into(), f.team_a.clone())]), TEAM_A_READ),
        row!(POST "/fn/save_notebook_profile", |_, _| "/fn/save_notebook_profile".into(),
            |f, i| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("name".into(), format!("q{i}")),
                ("kind".into(), "H100-80GB:1g.10gb".into()), ("hours".into(), "4".into())]), TEAM_A_MANAGE),
        row!(POST "/fn/delete_notebook_profile", |_, _| "/fn/delete_notebook_profile".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("id".into(), uuid::Uuid::new_v4().to_string())]),
            [401, 403, 403, 404, 404, 404]),
        row!(POST "/fn/my_notifications", |_, _| "/fn/my_notifications".into(), |_, _| form(&[]), ANY_USER),
        row!(POST "/fn/set_notification_email", |_, _| "/fn/set_notification_email".into(),
            |_, i| Body::Form(vec![("email".into(), format!("f{i}@example.org"))]), ANY_USER),
        row!(POST "/fn/set_notification_preference", |_, _| "/fn/set_notification_preference".into(),
            |_, _| form(&[("kind", "workload.failed"), ("mode", "digest")]), ANY_USER),
        row!(POST "/fn/team_webhooks", |_, _| "/fn/team_webhooks".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone())]), TEAM_A_MANAGE),
        row!(POST "/fn/add_team_webhook", |_, _| "/fn/add_team_webhook".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("url".into(), "http://127.0.0.1:9/fn".into())]),
            TEAM_A_MANAGE),
        row!(POST "/fn/delete_team_webhook", |_, _| "/fn/delete_team_webhook".into(),
            |f, i| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("id".into(), f.webhooks[i].clone())]),
            TEAM_A_MANAGE),
        row!(POST "/fn/team_webhook_deliveries", |_, _| "/fn/team_webhook_deliveries".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("id".into(), f.webhooks[0].clone())]),
            TEAM_A_MANAGE),
        row!(POST "/fn/set_team_webhook_enabled", |_, _| "/fn/set_team_webhook_enabled".into(),
            |f, i| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("id".into(), f.webhooks[i].clone()),
                ("enabled".into(), "false".into())]), TEAM_A_MANAGE),
        // The receiver's port is closed: those allowed get 200 saying it was not delivered.
        row!(POST "/fn/test_team_webhook", |_, _| "/fn/test_team_webhook".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("id".into(), f.webhooks[0].clone())]),
            TEAM_A_MANAGE),
        row!(POST "/fn/launch_notebook", |_, _| "/fn/launch_notebook".into(),
            |f, i| Body::Form(vec![("allocation_id".into(), f.allocs[i].clone()), ("name".into(), "x".into()), ("env".into(), "".into())]),
            NOT_ACTIVE),
        row!(POST "/fn/submit_job", |_, _| "/fn/submit_job".into(),
            |f, i| Body::Form(vec![("allocation_id".into(), f.allocs[i].clone()), ("name".into(), "".into()), ("command".into(), "true".into()),
                ("workdir".into(), "".into()), ("env".into(), "".into()), ("retries".into(), "0".into())]), NOT_ACTIVE),
        row!(POST "/fn/stop_workload", |_, _| "/fn/stop_workload".into(),
            |f, i| Body::Form(vec![("id".into(), f.workloads[i].clone())]), WORKLOAD_ACT),
        row!(POST "/fn/workload_logs", |_, _| "/fn/workload_logs".into(),
            |f, _| Body::Form(vec![("id".into(), f.workloads[0].clone())]), WORKLOAD_ACT),
        // Images (the UI's twins of /api/v1/images, /registries and registry-logins). No
        // allow-list entry covers 127.0.0.1:1: an allowed add is refused (422) after the
        // authorization check, without reaching any registry.
        row!(POST "/fn/list_images", |_, _| "/fn/list_images".into(),
            |f, _| Body::Form(vec![("team".into(), f.team_a.clone())]), TEAM_A_READ),
        row!(POST "/fn/add_image", |_, _| "/fn/add_image".into(),
            |f, i| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("name".into(), format!("fnimg{i}")),
                ("reference".into(), "127.0.0.1:1/m/x:1".into())]),
            [401, 403, 403, 422, 404, 422]),
        row!(POST "/fn/remove_image", |_, _| "/fn/remove_image".into(),
            |_, _| Body::Form(vec![("id".into(), uuid::Uuid::new_v4().to_string())]),
            [401, 404, 404, 404, 404, 404]),
        row!(POST "/fn/registry_allowlist", |_, _| "/fn/registry_allowlist".into(), |_, _| form(&[]), ANY_USER),
        row!(POST "/fn/allow_registry", |_, _| "/fn/allow_registry".into(),
            |_, i| Body::Form(vec![("entry".into(), format!("fn{i}.example.com"))]), ADMIN_ONLY),
        row!(POST "/fn/disallow_registry", |_, _| "/fn/disallow_registry".into(),
            |_, _| form(&[("entry", "never.example.com")]), [401, 403, 403, 403, 403, 404]),
        row!(POST "/fn/registry_logins", |_, _| "/fn/registry_logins".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone())]), TEAM_A_MANAGE),
        row!(POST "/fn/set_registry_login", |_, _| "/fn/set_registry_login".into(),
            |f, i| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("registry".into(), format!("fn{i}.example.com")),
                ("username".into(), "u".into()), ("password".into(), "p".into())]), TEAM_A_MANAGE),
        row!(POST "/fn/remove_registry_login", |_, _| "/fn/remove_registry_login".into(),
            |f, _| Body::Form(vec![("team_id".into(), f.team_a.clone()), ("registry".into(), "never.example.com".into())]),
            [401, 403, 403, 404, 404, 404]),
    ]
}

async fn run_matrix(db: Db) {
    let rest = rest_rows();
    let fns = fn_rows();
    let mut failures = Vec::new();
    let mut cases = 0;
    // A fresh fixture per row: rows cannot disturb each other.
    for (row, is_fn) in rest
        .iter()
        .map(|r| (r, false))
        .chain(fns.iter().map(|r| (r, true)))
    {
        let f = Fixture::new(db).await;
        for (i, who) in WHO.iter().enumerate() {
            let auth = match (is_fn, &f.tokens[i], &f.cookies[i]) {
                (_, None, _) | (true, _, None) => Auth::None,
                (false, Some(t), _) => Auth::Token(t),
                (true, _, Some(c)) => Auth::Cookie(c),
            };
            let path = (row.path)(&f, i);
            let r = send(&f.app, row.method.clone(), &path, auth, (row.body)(&f, i)).await;
            cases += 1;
            let got = r.status().as_u16();
            if got != row.expect[i] {
                let body = r.text().await.unwrap_or_default();
                failures.push(format!(
                    "{} {} as {who}: expected {}, got {got}: {body}",
                    row.method, path, row.expect[i]
                ));
            }
        }
    }
    println!(
        "authorization matrix ({db:?}): {cases} cases, {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The table names every REST route in the OpenAPI document and every registered server
/// function, and nothing else.
async fn the_table_covers_every_route(db: Db) {
    let app = TestApp::spawn(db).await;
    let doc: Value = reqwest::get(app.url("/api/v1/openapi.json"))
        .await
        .expect("openapi")
        .json()
        .await
        .expect("json");
    let mut registered: BTreeSet<(String, String)> = BTreeSet::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for method in ops.as_object().expect("ops").keys() {
            registered.insert((method.to_uppercase(), path.clone()));
        }
    }
    registered.insert(("GET".into(), "/api/v1/openapi.json".into()));
    // The notebook proxy is not part of the REST API's document.
    registered.insert(("GET".into(), "/user/{username}/{server}/{*rest}".into()));
    for (path, method) in leptos::server_fn::axum::server_fn_paths() {
        registered.insert((method.to_string(), path.to_owned()));
    }
    let table: BTreeSet<(String, String)> = rest_rows()
        .iter()
        .chain(fn_rows().iter())
        .map(|r| (r.method.to_string(), r.route.to_owned()))
        .collect();
    let missing: Vec<_> = registered.difference(&table).collect();
    let stale: Vec<_> = table.difference(&registered).collect();
    assert!(
        missing.is_empty(),
        "routes without a row in the matrix: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "rows for routes that do not exist: {stale:?}"
    );
}

crate::on_both_databases!(run_matrix, the_table_covers_every_route);

/// Property: for team B's admin, a random id and team A's real id get byte-identical
/// answers on every team route: nothing reveals that team A exists.
#[test]
fn random_ids_never_reveal_another_teams_objects() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let f = rt.block_on(Fixture::new(Db::Sqlite));
    let tb = f.tokens[4].clone().expect("team B admin token");
    let tb_cookie = f.cookies[4].clone().expect("team B admin cookie");
    let probe = |team: &str, user: &str| {
        let f = &f;
        let tb = tb.clone();
        let tb_cookie = tb_cookie.clone();
        let (team, user) = (team.to_owned(), user.to_owned());
        rt.block_on(async move {
            let mut answers = Vec::new();
            let rest: [(Method, String, Body); 5] = [
                (Method::GET, format!("/api/v1/teams/{team}"), Body::None),
                (
                    Method::PATCH,
                    format!("/api/v1/teams/{team}"),
                    Body::Json(json!({"name": "Taken over"})),
                ),
                (
                    Method::GET,
                    format!("/api/v1/teams/{team}/members"),
                    Body::None,
                ),
                (
                    Method::POST,
                    format!("/api/v1/teams/{team}/members"),
                    Body::Json(json!({"username": "spare0", "role": "member"})),
                ),
                (
                    Method::DELETE,
                    format!("/api/v1/teams/{team}/members/{user}"),
                    Body::None,
                ),
            ];
            for (m, path, body) in rest {
                let r = send(&f.app, m, &path, Auth::Token(&tb), body).await;
                answers.push((r.status().as_u16(), r.text().await.unwrap_or_default()));
            }
            let r = send(
                &f.app,
                Method::POST,
                "/fn/get_team",
                Auth::Cookie(&tb_cookie),
                Body::Form(vec![("team_id".into(), team.clone())]),
            )
            .await;
            answers.push((r.status().as_u16(), r.text().await.unwrap_or_default()));
            answers
        })
    };
    let real = probe(&f.team_a, &f.a_extra[0]);
    assert!(real.iter().all(|(s, _)| *s == 404), "{real:?}");
    let mut runner = TestRunner::new(Config {
        cases: 32,
        ..Config::default()
    });
    runner
        .run(&(any::<u128>(), any::<u128>()), |(t, u)| {
            let fake = probe(
                &uuid::Uuid::from_u128(t).to_string(),
                &uuid::Uuid::from_u128(u).to_string(),
            );
            prop_assert_eq!(&fake, &real);
            Ok(())
        })
        .expect("random ids answer exactly like another team's real ids");
    // Team A's member list is unchanged by all those attempts.
    let member = f.tokens[2].clone().expect("member token");
    let members: Value = rt.block_on(async {
        send(
            &f.app,
            Method::GET,
            &format!("/api/v1/teams/{}/members", f.team_a),
            Auth::Token(&member),
            Body::None,
        )
        .await
        .json()
        .await
        .expect("json")
    });
    assert_eq!(members["total"], 9);
}
