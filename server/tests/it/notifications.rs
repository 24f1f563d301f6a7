//! Notifications end to end (docs/notifications.md): a real SMTP server (aiosmtpd from
//! PyPI, started here on a free loopback port, writing what it receives to a folder)
//! and a loopback HTTP receiver that checks webhook signatures and refuses replays.
//!
//! Needs `python3 -m aiosmtpd` (`cargo xtask test` installs it).

use crate::aiosmtpd::Aiosmtpd;
use crate::allocations::{Team, request, set_quota, team, wait_for_state};
use crate::on_both_databases;
use crate::support::{
    AdminClient, Db, TestApp, call_with_token, error_kind, get_as, post_as, put_as,
};
use crate::workloads::{WorkloadAgent, wait_workload};
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use reqwest::Method;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_core::store::Deliveries;
use tessera_server::config::{Secret, ServeConfig};
use tessera_server::notify::Notifier;

on_both_databases!(
    a_failed_job_is_mailed_to_its_owner_and_posted_to_the_team_webhook,
    approval_events_reach_approvers_and_the_requester,
    ten_job_endings_with_digest_make_one_mail,
    each_delivery_is_sent_once_across_a_leader_change,
    bad_input_and_authorization,
    the_pages_show_notifications_and_webhooks,
    the_team_page_tests_switches_and_logs_a_webhook,
    only_an_address_proved_by_its_link_gets_mail,
    the_new_events_reach_their_people_and_the_platform_hook,
    a_damaged_hook_fails_its_read_loudly,
);

// ---- the SMTP server ----

const SMTPD: &str = r#"
import itertools, os, sys, time
from aiosmtpd.controller import Controller
port, out = int(sys.argv[1]), sys.argv[2]
counter = itertools.count()
class Handler:
    async def handle_DATA(self, server, session, envelope):
        n = next(counter)
        tmp = os.path.join(out, ".%05d.tmp" % n)
        with open(tmp, "wb") as f:
            f.write(("X-Envelope-To: " + ",".join(envelope.rcpt_tos) + "\r\n").encode())
            f.write(envelope.original_content or envelope.content)
        os.rename(tmp, os.path.join(out, "%05d.eml" % n))
        return "250 OK"
"#;

/// aiosmtpd on a free loopback port; every message lands in `dir` as one file.
struct Smtpd {
    server: Aiosmtpd,
    dir: tempfile::TempDir,
}

impl Smtpd {
    fn start() -> Smtpd {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = Aiosmtpd::start(SMTPD, dir.path());
        Smtpd { server, dir }
    }

    fn url(&self) -> String {
        self.server.url()
    }

    /// Every message received so far: (envelope recipients, the raw message).
    fn messages(&self) -> Vec<(String, String)> {
        messages_in(self.dir.path())
    }

    /// Waits until at least `n` messages arrived (at most `secs`).
    async fn wait_for(&self, n: usize, secs: u64) -> Vec<(String, String)> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let m = self.messages();
            if m.len() >= n || Instant::now() > deadline {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Smtpd {
    /// Waits for the verification mail to `to`, takes it out of the mailbox, and returns
    /// its link.
    async fn take_verification_link(&self, to: &str, secs: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            for p in eml_files(self.dir.path()) {
                let text = unfold(&std::fs::read_to_string(&p).expect("read"));
                if text.starts_with(&format!("X-Envelope-To: {to}\r\n"))
                    && text.contains("Verify your email address")
                {
                    std::fs::remove_file(&p).expect("take the mail");
                    let at = text.find("/verify-email?").expect("a link");
                    let start = text[..at].rfind("http").expect("link start");
                    let end = text[at..]
                        .find(|c: char| c.is_whitespace() || c == '"' || c == '<')
                        .map_or(text.len(), |e| at + e);
                    return text[start..end].replace("&amp;", "&");
                }
            }
            assert!(Instant::now() < deadline, "no verification mail to {to}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn eml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "eml"))
        .collect();
    files.sort();
    files
}

fn messages_in(dir: &Path) -> Vec<(String, String)> {
    eml_files(dir)
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).expect("read");
            let to = text
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("X-Envelope-To: "))
                .unwrap_or("")
                .to_owned();
            (to, unfold(&text))
        })
        .collect()
}

/// The message with quoted-printable soft line breaks and encodings undone enough to
/// search its text (`=\r\n` joins, `=3D` is `=`).
fn unfold(raw: &str) -> String {
    raw.replace("=\r\n", "")
        .replace("=\n", "")
        .replace("=3D", "=")
}

fn header<'a>(msg: &'a str, name: &str) -> Option<&'a str> {
    msg.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .map(str::trim)
}

// ---- the webhook receiver ----

/// A request as received: its `x-tessera-*` headers and its body.
type Recorded = (Vec<(String, String)>, Vec<u8>);

/// What the receiver accepted: (delivery id, body) per verified request, and the
/// signatures it has seen (a second request with one of them is a replay).
#[derive(Default)]
struct Received {
    accepted: Vec<(String, Value)>,
    seen: HashSet<String>,
    refused: Vec<String>,
    /// The last accepted request, to replay: (headers, body).
    last: Option<Recorded>,
}

struct Receiver {
    url: String,
    got: Arc<Mutex<Received>>,
    secret: Arc<Mutex<String>>,
}

/// The check a receiver makes: `t=<unix>,v1=<hex>` over `<t>.<body>` with the secret,
/// within five minutes, and never twice.
fn verify(
    secret: &str,
    headers: &HeaderMap,
    body: &[u8],
    got: &mut Received,
) -> Result<(), String> {
    let sig = headers
        .get("x-tessera-signature")
        .and_then(|v| v.to_str().ok())
        .ok_or("no signature")?
        .to_owned();
    let mut t = None;
    let mut v1 = None;
    for part in sig.split(',') {
        match part.split_once('=') {
            Some(("t", x)) => t = x.parse::<i64>().ok(),
            Some(("v1", x)) => v1 = Some(x.to_owned()),
            _ => {}
        }
    }
    let (t, v1) = (t.ok_or("no timestamp")?, v1.ok_or("no v1")?);
    if (chrono::Utc::now().timestamp() - t).abs() > 300 {
        return Err("timestamp outside the window".into());
    }
    let tag: Vec<u8> = (0..v1.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(v1.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<_, _>>()
        .map_err(|_| "signature is not hex")?;
    let mut signed = format!("{t}.").into_bytes();
    signed.extend_from_slice(body);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    ring::hmac::verify(&key, &signed, &tag).map_err(|_| "bad signature")?;
    if !got.seen.insert(sig) {
        return Err("replay".into());
    }
    Ok(())
}

impl Receiver {
    async fn start() -> Receiver {
        let got: Arc<Mutex<Received>> = Arc::default();
        let secret: Arc<Mutex<String>> = Arc::default();
        let (g, s) = (got.clone(), secret.clone());
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let (g, s) = (g.clone(), s.clone());
                async move {
                    let secret = s.lock().expect("lock").clone();
                    let mut got = g.lock().expect("lock");
                    match verify(&secret, &headers, &body, &mut got) {
                        Ok(()) => {
                            let id = headers
                                .get("x-tessera-delivery")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_owned();
                            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                            got.accepted.push((id, v));
                            got.last = Some((
                                headers
                                    .iter()
                                    .filter(|(k, _)| k.as_str().starts_with("x-tessera"))
                                    .map(|(k, v)| {
                                        (k.to_string(), v.to_str().unwrap_or("").to_owned())
                                    })
                                    .collect(),
                                body.to_vec(),
                            ));
                            StatusCode::NO_CONTENT
                        }
                        Err(e) => {
                            got.refused.push(e);
                            StatusCode::UNAUTHORIZED
                        }
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { url, got, secret }
    }

    fn set_secret(&self, s: &str) {
        *self.secret.lock().expect("lock") = s.to_owned();
    }

    fn accepted(&self) -> Vec<(String, Value)> {
        self.got.lock().expect("lock").accepted.clone()
    }

    async fn wait_for(
        &self,
        pred: impl Fn(&[(String, Value)]) -> bool,
        secs: u64,
    ) -> Vec<(String, Value)> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let a = self.accepted();
            if pred(&a) || Instant::now() > deadline {
                return a;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Sends the last accepted request again, as an attacker who recorded it would.
    async fn replay(&self) -> u16 {
        let (headers, body) = self
            .got
            .lock()
            .expect("lock")
            .last
            .clone()
            .expect("a request");
        let mut rb = reqwest::Client::new().post(&self.url).body(body);
        for (k, v) in headers {
            rb = rb.header(k, v);
        }
        rb.header("content-type", "application/json")
            .send()
            .await
            .expect("replay")
            .status()
            .as_u16()
    }
}

// ---- helpers ----

async fn app_with_mail(db: Db, smtp: &Smtpd) -> AdminClient {
    app_polling(db, smtp, Duration::from_millis(300)).await
}

/// A server mailing through a fresh aiosmtpd, with teams `name` and `{name}-other`.
async fn mail_and_two_teams(db: Db, name: &str) -> (Smtpd, AdminClient, Team, Team) {
    let smtp = Smtpd::start();
    let a = app_with_mail(db, &smtp).await;
    let t = team(&a, name).await;
    let other = team(&a, &format!("{name}-other")).await;
    (smtp, a, t, other)
}

/// An app whose own delivery worker looks every `interval`.
async fn app_polling(db: Db, smtp: &Smtpd, interval: Duration) -> AdminClient {
    let url = smtp.url();
    let app = TestApp::spawn_with(db, |c| {
        c.notify.smtp_url = Some(Secret::new(url));
        c.notify.mail_from = "Tessera <gpu@example.org>".into();
        c.notify.webhook_allow_private = true;
        c.notify.notify_interval = interval;
    })
    .await;
    AdminClient::with_app(app).await
}

/// Sets the caller's address and verifies it the way its owner would: the verification
/// mail arrives, its link's page posts the token, and the address is verified. The mail
/// is taken out of the mailbox so the tests count only what the event made.
async fn set_email(app: &TestApp, smtp: &Smtpd, token: &str, email: &str) -> Value {
    put_email(app, token, email).await;
    verify_from_mail(app, smtp, token, email).await
}

/// Verifies `email` with the link of its verification mail, as above.
async fn verify_from_mail(app: &TestApp, smtp: &Smtpd, token: &str, email: &str) -> Value {
    let link = smtp.take_verification_link(email, 20).await;
    // The page the link opens has one button that posts the token back.
    verify_link(app, &link).await;
    let (s, v) = call_with_token(app, token, Method::GET, "/api/v1/me/notifications", None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["email_verified"], true, "{v}");
    v
}

/// The `user` and `token` of a verification link.
fn link_params(link: &str) -> (String, String) {
    let query = link.split_once('?').expect("query").1;
    let get = |k: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} in {link}"))
            .to_owned()
    };
    (get("user"), get("token"))
}

/// Sets the caller's address (not verified).
/// Sets how `token`'s user hears of `kind` (`mode`): `(status, their settings)`.
async fn set_preference(app: &TestApp, token: &str, kind: &str, mode: &str) -> (u16, Value) {
    let body = json!({"preferences": [{"kind": kind, "mode": mode}]});
    put_as(app, token, "/api/v1/me/notifications", body).await
}

async fn put_email(app: &TestApp, token: &str, email: &str) -> Value {
    let (s, v) = put_as(
        app,
        token,
        "/api/v1/me/notifications",
        json!({"email": email}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["email"], email, "{v}");
    v
}

async fn add_hook(app: &TestApp, token: &str, team: &str, url: &str) -> (String, String) {
    let (s, v) = post_as(
        app,
        token,
        &format!("/api/v1/teams/{team}/webhooks"),
        json!({"url": url}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    (
        v["webhook"]["id"].as_str().expect("id").to_owned(),
        v["secret"].as_str().expect("secret").to_owned(),
    )
}

/// A worker of the test's own over `app`'s database (its own claim), like a second
/// leader would run.
async fn worker(app: &TestApp, smtp: &Smtpd) -> Notifier {
    let (mut services, system) = app.side_services().await;
    services.notifications = services
        .notifications
        .clone()
        .with_data_keys(Arc::new(app.data_keys()))
        .allowing_private_webhooks(true);
    let mut config = ServeConfig::for_tests(&app.database_url);
    config.notify.smtp_url = Some(Secret::new(smtp.url()));
    config.public_url = Some(app.base.clone());
    Notifier::new(Arc::new(services), system, &config).expect("notifier")
}

fn to_of(msgs: &[(String, String)], addr: &str) -> usize {
    msgs.iter().filter(|(to, _)| to == addr).count()
}

// ---- tests ----

async fn a_failed_job_is_mailed_to_its_owner_and_posted_to_the_team_webhook(db: Db) {
    let name = format!("mail-{}", format!("{db:?}").to_lowercase());
    let (smtp, a, t, other) = mail_and_two_teams(db, &name).await;
    let app = &a.app;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    set_email(app, &smtp, &t.member, "ada@example.org").await;
    set_email(app, &smtp, &other.member, "eve@example.org").await;
    set_email(app, &smtp, &other.team_admin, "mallory@example.org").await;
    let receiver = Receiver::start().await;
    let (_, secret) = add_hook(app, &t.team_admin, &t.id, &receiver.url).await;
    receiver.set_secret(&secret);

    let agent = WorkloadAgent::start(&a, &format!("{name}-node")).await;
    let (s, v) = request(app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let alloc = v["id"].as_str().expect("id").to_owned();
    wait_for_state(&a, &alloc, "active").await;
    let (s, v) = post_as(
        app,
        &t.member,
        "/api/v1/jobs",
        json!({"allocation_id": alloc, "name": "train", "command": "echo hi; exit 3"}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let job = v["id"].as_str().expect("id").to_owned();
    wait_workload(app, &t.member, &job, "failed", 60).await;

    let msgs = smtp.wait_for(1, 30).await;
    let mine: Vec<&(String, String)> = msgs
        .iter()
        .filter(|(to, _)| to == "ada@example.org")
        .collect();
    assert_eq!(mine.len(), 1, "one mail to the job's owner: {msgs:#?}");
    let mail = &mine[0].1;
    let subject = header(mail, "Subject").expect("subject");
    assert!(subject.contains("failed"), "{subject}");
    assert!(mail.contains("train"), "{mail}");
    assert!(mail.contains("exit code 3"), "{mail}");
    assert_eq!(header(mail, "To"), Some("ada@example.org"), "{mail}");
    assert!(
        header(mail, "From").is_some_and(|f| f.contains("gpu@example.org")),
        "{mail}"
    );
    let link = format!("{}/workloads/{job}", app.base);
    assert!(
        mail.contains(&link),
        "the mail links to the job ({link}): {mail}"
    );
    assert!(
        mail.contains("text/plain") && mail.contains("text/html"),
        "{mail}"
    );

    // The team's webhook got the event, signed; a replay is refused.
    let hooks = receiver
        .wait_for(
            |a| a.iter().any(|(_, b)| b["kind"] == "workload.failed"),
            30,
        )
        .await;
    let (delivery, body) = hooks
        .iter()
        .find(|(_, b)| b["kind"] == "workload.failed")
        .expect("workload.failed posted");
    assert!(!delivery.is_empty());
    assert_eq!(body["subject_id"], job.as_str(), "{body}");
    assert_eq!(body["team_id"], t.id.as_str(), "{body}");
    assert_eq!(body["link"], link.as_str(), "{body}");
    assert!(
        body["text"].as_str().is_some_and(|t| t.contains("failed")),
        "{body}"
    );
    assert_eq!(
        receiver.replay().await,
        401,
        "a replayed delivery is refused"
    );
    assert!(
        receiver
            .got
            .lock()
            .expect("lock")
            .refused
            .contains(&"replay".to_owned()),
        "refused as a replay"
    );

    // Nothing about this team reaches the other team's people, even after more passes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let msgs = smtp.messages();
    assert_eq!(to_of(&msgs, "eve@example.org"), 0, "{msgs:#?}");
    assert_eq!(to_of(&msgs, "mallory@example.org"), 0, "{msgs:#?}");
    assert_eq!(to_of(&msgs, "ada@example.org"), 1, "sent once: {msgs:#?}");

    // The hook's delivery log shows it.
    let hook_list = get_as(
        app,
        &t.team_admin,
        &format!("/api/v1/teams/{}/webhooks", t.id),
    )
    .await
    .1;
    let hook_id = hook_list[0]["id"].as_str().expect("hook");
    assert_eq!(hook_list[0]["consecutive_failures"], 0, "{hook_list}");
    let (s, log) = get_as(
        app,
        &t.team_admin,
        &format!("/api/v1/teams/{}/webhooks/{hook_id}/deliveries", t.id),
    )
    .await;
    assert_eq!(s, 200, "{log}");
    assert!(
        log.as_array()
            .expect("list")
            .iter()
            .any(|d| d["kind"] == "workload.failed" && d["state"] == "sent"),
        "{log}"
    );
    agent.stop().await;
}

async fn approval_events_reach_approvers_and_the_requester(db: Db) {
    let (smtp, a, t, other) = mail_and_two_teams(db, "approvals").await;
    let app = &a.app;
    // One slice per user without approval: the second request waits for a team admin.
    set_quota(&a, &t.id, "H100-80GB", 14, 14, 1).await;
    set_email(app, &smtp, &t.member, "req@example.org").await;
    set_email(app, &smtp, &t.team_admin, "lead@example.org").await;
    set_email(app, &smtp, &other.team_admin, "other-lead@example.org").await;
    let receiver = Receiver::start().await;
    let (_, secret) = add_hook(app, &t.team_admin, &t.id, &receiver.url).await;
    receiver.set_secret(&secret);
    let (s, _) = request(app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201);
    let (s, v) = request(app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["state"], "pending_approval", "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    let msgs = smtp.wait_for(1, 20).await;
    let lead: Vec<_> = msgs
        .iter()
        .filter(|(to, _)| to == "lead@example.org")
        .collect();
    assert_eq!(lead.len(), 1, "the team admin is asked: {msgs:#?}");
    assert!(
        lead[0]
            .1
            .contains(&format!("{}/allocations/{id}", app.base)),
        "{}",
        lead[0].1
    );
    assert!(
        header(&lead[0].1, "Subject").is_some_and(|s| s.contains("approval")),
        "{}",
        lead[0].1
    );
    let (s, v) = post_as(
        app,
        &t.team_admin,
        &format!("/api/v1/allocations/{id}/deny"),
        json!({"reason": "not this week"}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let msgs = smtp.wait_for(2, 20).await;
    let req: Vec<_> = msgs
        .iter()
        .filter(|(to, _)| to == "req@example.org")
        .collect();
    assert_eq!(req.len(), 1, "the requester hears of the denial: {msgs:#?}");
    assert!(
        req[0].1.contains("denied") && req[0].1.contains("not this week"),
        "{}",
        req[0].1
    );
    assert_eq!(to_of(&msgs, "other-lead@example.org"), 0, "{msgs:#?}");
    let hooks = receiver
        .wait_for(|a| a.iter().any(|(_, b)| b["kind"] == "request.denied"), 20)
        .await;
    let kinds: Vec<&str> = hooks
        .iter()
        .filter_map(|(_, b)| b["kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"request.needs_approval") && kinds.contains(&"request.denied"),
        "{kinds:?}"
    );
}

async fn ten_job_endings_with_digest_make_one_mail(db: Db) {
    let smtp = Smtpd::start();
    // The jobs below are stored `running` on an allocation no node will set up: the
    // server's workload pass would stop them (their allocation is not active) between
    // their insert and their end. It runs only when woken here.
    let url = smtp.url();
    let app = TestApp::spawn_with(db, |c| {
        c.notify.smtp_url = Some(Secret::new(url));
        c.notify.mail_from = "Tessera <gpu@example.org>".into();
        c.notify.notify_interval = Duration::from_millis(300);
        c.scheduler_interval = Duration::from_secs(3600);
    })
    .await;
    let a = AdminClient::with_app(app).await;
    let app = &a.app;
    let t = team(&a, "digest").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    set_email(app, &smtp, &t.member, "dig@example.org").await;
    // Succeeded jobs go to the digest by default; failed ones too, by choice.
    let (s, v) = set_preference(app, &t.member, "workload.failed", "digest").await;
    assert_eq!(s, 200, "{v}");
    let pref = |k: &str| {
        v["preferences"]
            .as_array()
            .expect("prefs")
            .iter()
            .find(|p| p["kind"] == k)
            .cloned()
            .expect("kind")
    };
    assert_eq!(pref("workload.failed")["mode"], "digest");
    assert_eq!(pref("workload.failed")["default"], false);
    assert_eq!(pref("workload.succeeded")["mode"], "digest");
    assert_eq!(pref("workload.succeeded")["default"], true);
    let (s, v) = request(app, &t.member, &t.id, "H100-80GB:1g.10gb").await;
    assert_eq!(s, 201, "{v}");
    let alloc =
        tessera_domain::ids::AllocationId::parse(v["id"].as_str().expect("id")).expect("uuid");
    // The pass the request woke is over before the jobs appear.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    let row = store
        .allocation(alloc)
        .await
        .expect("load")
        .expect("allocation");
    // Ten jobs end one after the other, each through the store's own transition.
    for i in 0..10 {
        let w = tessera_core::store::WorkloadRow {
            owns_allocation: true,
            ..tessera_core::store::WorkloadRow::new(
                tessera_domain::workload::WorkloadKind::Job,
                &format!("job{i}"),
                (alloc, row.a.team_id, row.a.user_id),
                tessera_domain::workload::WorkloadState::Running,
                chrono::Utc::now(),
            )
        };
        assert!(store.insert_workload(&w).await.expect("insert"));
        let end = if i % 2 == 0 { "succeeded" } else { "failed" };
        let change = tessera_core::store::WorkloadChange {
            ended_at: Some(chrono::Utc::now()),
            exit_code: Some(if i % 2 == 0 { 0 } else { 1 }),
            ..Default::default()
        };
        assert!(
            store
                .workload_step(w.id, "running", end, &change, chrono::Utc::now())
                .await
                .expect("step")
        );
    }
    // The server's own worker writes the deliveries but sends nothing before the digest hour.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        smtp.messages().len(),
        0,
        "nothing immediate: {:#?}",
        smtp.messages()
    );
    let w = worker(app, &smtp).await;
    let tomorrow = chrono::Utc::now() + chrono::Duration::days(1) + chrono::Duration::hours(1);
    let sent = w.pass(tomorrow).await;
    assert_eq!(sent, 10, "ten digest items");
    let msgs = smtp.wait_for(1, 10).await;
    assert_eq!(msgs.len(), 1, "one mail: {msgs:#?}");
    let (to, mail) = &msgs[0];
    assert_eq!(to, "dig@example.org");
    assert!(
        header(mail, "Subject").is_some_and(|s| s.contains("10 notifications")),
        "{mail}"
    );
    for i in 0..10 {
        assert!(
            mail.contains(&format!("`job{i}`")),
            "job{i} in the digest: {mail}"
        );
    }
    assert_eq!(w.pass(tomorrow).await, 0, "a second pass sends nothing");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(smtp.messages().len(), 1);
}

async fn each_delivery_is_sent_once_across_a_leader_change(db: Db) {
    let smtp = Smtpd::start();
    // The server's own worker made its first pass at start and then waits an hour: the
    // workers below are the leaders here (an old one that died holding a delivery, a new
    // one, and a stale one still running).
    let a = app_polling(db, &smtp, Duration::from_secs(3600)).await;
    let app = &a.app;
    let t = team(&a, "once").await;
    set_quota(&a, &t.id, "H100-80GB", 14, 14, 1).await;
    // The server's worker sleeps: a pass of the test's own mails the verification link.
    put_email(app, &t.team_admin, "once@example.org").await;
    worker(app, &smtp).await.pass(chrono::Utc::now()).await;
    verify_from_mail(app, &smtp, &t.team_admin, "once@example.org").await;
    let receiver = Receiver::start().await;
    let (hook, secret) = add_hook(app, &t.team_admin, &t.id, &receiver.url).await;
    receiver.set_secret(&secret);
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    let hook = uuid::Uuid::parse_str(&hook).expect("uuid");
    // A dead leader's claim: it took the webhook delivery of a new event, then died
    // before sending. Take it first, before the server's worker sees it.
    let dead = uuid::Uuid::new_v4();
    let event = tessera_core::store::NewEvent::new(
        tessera_domain::notify::EventKind::BudgetThreshold,
        Some(uuid::Uuid::parse_str(&t.id).expect("uuid")),
        ("team", uuid::Uuid::parse_str(&t.id).expect("uuid")),
        tessera_domain::notify::EventPayload {
            summary: "Team once has spent 50 % of its budget".into(),
            path: format!("/teams/{}", t.id),
            user_id: None,
            detail: None,
            team_name: Some("once".into()),
            audience: Some("team_admins".into()),
        },
        chrono::Utc::now(),
    );
    let long_ago = chrono::Utc::now() - chrono::Duration::minutes(10);
    // The dead leader fanned out and took the webhook delivery long ago.
    assert!(store.record_event(&event).await.expect("record"));
    let (services, system) = app.side_services().await;
    let fanned = services
        .notifications
        .fan_out(&system, chrono::Utc::now(), 100)
        .await
        .expect("fan out");
    assert_eq!(fanned, 1);
    let d = store
        .delivery_by_event(event.id, "webhook", hook)
        .await
        .expect("load")
        .expect("a webhook delivery");
    assert!(
        Deliveries::new(store.clone())
            .claim_delivery(d.id, dead, long_ago)
            .await
            .expect("claim"),
        "the dead leader took it"
    );
    let again = Deliveries::new(store.clone())
        .claim_delivery(d.id, uuid::Uuid::new_v4(), long_ago)
        .await
        .expect("claim");
    assert!(!again, "taken once");
    // More events, while the new leader and a stale one (not yet stopped) run at once.
    for i in 0..20 {
        let mut e = event.clone();
        e.id = uuid::Uuid::now_v7();
        e.payload.summary = format!("event {i}");
        assert!(store.record_event(&e).await.expect("record"));
    }
    let w1 = worker(app, &smtp)
        .await
        .with_stale_claim(chrono::Duration::seconds(1));
    let w2 = worker(app, &smtp).await;
    let now = chrono::Utc::now();
    let (x, y) = tokio::join!(w1.pass(now), w2.pass(now));
    assert!(x + y > 0);
    let got = receiver.wait_for(|a| a.len() >= 21, 30).await;
    let mails = smtp.wait_for(21, 30).await;
    // One webhook post and one mail per event, none twice.
    let mut per_event: BTreeMap<String, usize> = BTreeMap::new();
    for (_, b) in &got {
        *per_event
            .entry(b["id"].as_str().expect("id").to_owned())
            .or_default() += 1;
    }
    assert_eq!(per_event.len(), 21, "every event posted: {per_event:?}");
    assert!(
        per_event.values().all(|n| *n == 1),
        "none twice: {per_event:?}"
    );
    let ids: HashSet<&str> = mails
        .iter()
        .filter_map(|(_, m)| header(m, "Message-ID"))
        .collect();
    assert_eq!(mails.len(), 21, "one mail per event");
    assert_eq!(ids.len(), 21, "no mail twice");
    // The dead leader's delivery went out once, by the new leader.
    assert!(per_event.contains_key(&event.id.to_string()));
    let d = store.delivery(d.id).await.expect("load").expect("delivery");
    assert_eq!(d.state, "sent");
    assert_eq!(
        d.attempts, 2,
        "taken by the dead leader, then by the new one"
    );
    // Later passes send nothing more.
    w1.pass(chrono::Utc::now()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(receiver.accepted().len(), 21);
    assert_eq!(smtp.messages().len(), 21);
}

async fn bad_input_and_authorization(db: Db) {
    // No allow setting here: private addresses are refused.
    let a = AdminClient::new(db).await;
    let app = &a.app;
    let t = team(&a, "hooks").await;
    let other = team(&a, "hooks-other").await;
    let path = format!("/api/v1/teams/{}/webhooks", t.id);
    let post = |token: &str, body: Value| {
        let (app, token, path) = (app, token.to_owned(), path.clone());
        async move {
            reqwest::Client::new()
                .post(app.url(&path))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .expect("request")
        }
    };
    for (body, field) in [
        (json!({"url": "ftp://hooks.example.org/x"}), "url"),
        (json!({"url": "http://127.0.0.1:8080/x"}), "url"),
        (json!({"url": "http://169.254.169.254/latest"}), "url"),
        (json!({"url": "http://[::1]/x"}), "url"),
        (json!({"url": "http://10.0.0.8/x"}), "url"),
        (json!({"url": "http://localhost:9/x"}), "url"),
        (
            json!({"url": "https://93.184.216.34/x", "colour": "red"}),
            "colour",
        ),
        (
            json!({"url": "https://93.184.216.34/x", "events": ["job.exploded"]}),
            "events",
        ),
    ] {
        let (s, e) = error_kind(post(&t.team_admin, body.clone()).await).await;
        assert_eq!(s, 422, "{body}: {e}");
        assert!(e.to_string().contains(field), "{body}: names {field}: {e}");
    }
    // A member may not add hooks; another team's admin does not see the team.
    let ok = json!({"url": "https://93.184.216.34/hook"});
    assert_eq!(post(&t.member, ok.clone()).await.status(), 403);
    assert_eq!(post(&other.team_admin, ok.clone()).await.status(), 404);
    let r = post(&t.team_admin, ok.clone()).await;
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.expect("json");
    let hook = created["webhook"]["id"].as_str().expect("id");
    assert!(created["secret"].as_str().is_some_and(|s| s.len() > 20));
    // The secret is stored sealed, never in clear.
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    let row = store
        .webhook(uuid::Uuid::parse_str(hook).expect("uuid"))
        .await
        .expect("load")
        .expect("row");
    assert!(
        !row.secret
            .as_stored()
            .contains(created["secret"].as_str().expect("secret"))
    );
    assert!(row.secret.key_id().is_some(), "sealed");
    for who in [&t.member, &other.team_admin] {
        let (s, _) = call_with_token(app, who, Method::GET, &format!("{path}/{hook}"), None).await;
        assert!(s == 403 || s == 404);
    }
    let (s, _) = get_as(app, &other.team_admin, &format!("{path}/{hook}")).await;
    assert_eq!(s, 404, "another team's hook is not found");
    // Another team's hook id under one's own team is not found either.
    let (s, _) = call_with_token(
        app,
        &other.team_admin,
        Method::DELETE,
        &format!("/api/v1/teams/{}/webhooks/{hook}", other.id),
        None,
    )
    .await;
    assert_eq!(s, 404);
    // Malformed email, unknown fields, unknown kinds.
    for (body, field) in [
        (json!({"email": "not-an-address"}), "email"),
        (json!({"email": "a b@example.org"}), "email"),
        (json!({"mail": "a@example.org"}), "mail"),
        (
            json!({"preferences": [{"kind": "nope", "mode": "off"}]}),
            "preferences",
        ),
        (
            json!({"preferences": [{"kind": "workload.failed", "mode": "sometimes"}]}),
            "preferences",
        ),
    ] {
        let r = reqwest::Client::new()
            .put(app.url("/api/v1/me/notifications"))
            .bearer_auth(&t.member)
            .json(&body)
            .send()
            .await
            .expect("request");
        let (s, e) = error_kind(r).await;
        assert_eq!(s, 422, "{body}: {e}");
        assert!(e.to_string().contains(field), "{body}: names {field}: {e}");
    }
    let v = put_email(app, &t.member, "ok@example.org").await;
    assert_eq!(v["email_verified"], false);
    let (s, v) = put_as(
        app,
        &t.member,
        "/api/v1/me/notifications",
        json!({"email": ""}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(v["email"], Value::Null, "{v}");
    assert!(
        !v["preferences"]
            .as_array()
            .expect("prefs")
            .iter()
            .any(|p| p["kind"] == "node.lost"),
        "node.lost is for platform admins: {v}"
    );
}

/// My account shows the address and a choice per event kind; the team page shows a team
/// admin the team's webhooks (server-rendered; a member sees no webhooks section). The
/// forms post to the server functions, which change what the REST API reads.
async fn the_pages_show_notifications_and_webhooks(db: Db) {
    let a = AdminClient::with_app(
        TestApp::spawn_with(db, |c| c.notify.webhook_allow_private = true).await,
    )
    .await;
    let app = &a.app;
    let t = team(&a, "pages").await;
    let lead = app.browser();
    assert!(
        lead.login("pages-lead", crate::allocations::PW)
            .await
            .status()
            .is_success()
    );
    let r = lead
        .call("set_notification_email", &[("email", "lead@example.org")])
        .await;
    assert!(r.status().is_success(), "{}", r.status());
    let r = lead
        .call(
            "set_notification_preference",
            &[("kind", "workload.succeeded"), ("mode", "off")],
        )
        .await;
    assert!(r.status().is_success(), "{}", r.status());
    let r = lead
        .call(
            "add_team_webhook",
            &[("team_id", &t.id), ("url", "http://127.0.0.1:9/ui")],
        )
        .await;
    assert!(r.status().is_success(), "{}", r.status());
    let created: Value = r.json().await.expect("json");
    assert!(
        created["secret"]
            .as_str()
            .is_some_and(|s| s.starts_with("whsec")),
        "{created}"
    );
    let html = lead.page("/account").await;
    assert!(html.contains("Notifications"), "{html}");
    assert!(html.contains("lead@example.org"), "the address is shown");
    assert!(
        html.contains("My job or notebook failed"),
        "a choice per kind"
    );
    let html = lead.page(&format!("/teams/{}", t.id)).await;
    assert!(
        html.contains("Webhooks") && html.contains("http://127.0.0.1:9/ui"),
        "{html}"
    );
    let (s, v) = get_as(app, &t.team_admin, "/api/v1/me/notifications").await;
    assert_eq!(s, 200);
    assert_eq!(v["email"], "lead@example.org");
    let off = v["preferences"]
        .as_array()
        .expect("prefs")
        .iter()
        .find(|p| p["kind"] == "workload.succeeded")
        .cloned()
        .expect("kind");
    assert_eq!(off["mode"], "off", "{v}");
    let member = app.browser();
    assert!(
        member
            .login("pages-member", crate::allocations::PW)
            .await
            .status()
            .is_success()
    );
    let html = member.page(&format!("/teams/{}", t.id)).await;
    assert!(
        !html.contains("webhooks-title"),
        "a member sees no webhooks section"
    );
    let r = member.call("team_webhooks", &[("team_id", &t.id)]).await;
    assert_eq!(r.status(), 403);
}

/// The team page's webhook tools, through the server functions its buttons post to: a
/// test delivery answers what the receiver said, exactly as the REST API's test does; the
/// delivery log shows what the worker sent; a hook turned off (by hand, or after 10
/// failures in a row, which the page explains) is turned on again with its failures
/// cleared, its URL and events kept.
async fn the_team_page_tests_switches_and_logs_a_webhook(db: Db) {
    let a = AdminClient::with_app(
        TestApp::spawn_with(db, |c| {
            c.notify.webhook_allow_private = true;
            c.notify.notify_interval = Duration::from_millis(300);
        })
        .await,
    )
    .await;
    let app = &a.app;
    let t = team(&a, "uihooks").await;
    let receiver = Receiver::start().await;
    let lead = app.browser();
    assert!(
        lead.login("uihooks-lead", crate::allocations::PW)
            .await
            .status()
            .is_success()
    );
    let r = lead
        .call(
            "add_team_webhook",
            &[("team_id", &t.id), ("url", &receiver.url)],
        )
        .await;
    assert!(r.status().is_success(), "{}", r.status());
    let created: Value = r.json().await.expect("json");
    receiver.set_secret(created["secret"].as_str().expect("secret"));
    let hook = created["webhook"]["id"].as_str().expect("id").to_owned();
    let hook_path = format!("/api/v1/teams/{}/webhooks/{hook}", t.id);
    let fn_call = |name: &'static str, extra: &[(&'static str, &'static str)]| {
        let mut form = vec![("team_id", t.id.clone()), ("id", hook.clone())];
        form.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        let lead = &lead;
        async move {
            let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let r = lead.call(name, &form).await;
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let rest_test = || async { post_empty(app, &t.team_admin, &format!("{hook_path}/test")).await };

    // A test delivery reaches the receiver, signed, and both ways answer alike.
    let (s, ui) = fn_call("test_team_webhook", &[]).await;
    assert_eq!(s, 200, "{ui}");
    assert_eq!(ui, json!({"delivered": true, "status": 204, "error": null}));
    let (s, rest) = rest_test().await;
    assert_eq!((s, &rest), (200, &ui));
    let got = receiver.wait_for(|a| a.len() >= 2, 10).await;
    assert_eq!(got.len(), 2, "{got:?}");
    for (_, body) in &got {
        assert_eq!(body["kind"], "webhook.test", "{body}");
        assert_eq!(body["team_id"], t.id.as_str(), "{body}");
    }
    // Tests are not in the log: it is empty until an event is delivered.
    let (s, log) = fn_call("team_webhook_deliveries", &[]).await;
    assert_eq!((s, log), (200, json!([])));

    // A receiver that refuses: the test says so, with its status, both ways.
    receiver.set_secret("not-the-secret");
    let (s, ui) = fn_call("test_team_webhook", &[]).await;
    assert_eq!(s, 200, "{ui}");
    assert_eq!(ui["delivered"], false, "{ui}");
    assert_eq!(ui["status"], 401, "{ui}");
    assert!(
        ui["error"].as_str().is_some_and(|e| e.contains("401")),
        "{ui}"
    );
    let (_, rest) = rest_test().await;
    assert_eq!(rest, ui);
    receiver.set_secret(created["secret"].as_str().expect("secret"));

    // An event of the team is delivered by the worker and shows in the log.
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    let team_id = uuid::Uuid::parse_str(&t.id).expect("uuid");
    let event = tessera_core::store::NewEvent::new(
        tessera_domain::notify::EventKind::WorkloadFailed,
        Some(team_id),
        ("workload", uuid::Uuid::now_v7()),
        tessera_domain::notify::EventPayload {
            summary: "Job train failed".into(),
            path: "/workloads".into(),
            user_id: None,
            detail: Some("exit code 1".into()),
            team_name: None,
            audience: None,
        },
        chrono::Utc::now(),
    );
    assert!(store.record_event(&event).await.expect("record"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let log = loop {
        let (s, log) = fn_call("team_webhook_deliveries", &[]).await;
        assert_eq!(s, 200, "{log}");
        if log[0]["state"] == "sent" || Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let rows = log.as_array().expect("list");
    assert_eq!(rows.len(), 1, "{log}");
    assert_eq!(rows[0]["kind"], "workload.failed", "{log}");
    assert_eq!(rows[0]["state"], "sent", "{log}");
    assert_eq!(rows[0]["attempts"], 1, "{log}");
    assert_eq!(rows[0]["last_status"], 204, "{log}");
    assert_eq!(rows[0]["event_id"], event.id.to_string(), "{log}");
    let (s, rest) = get_as(app, &t.team_admin, &format!("{hook_path}/deliveries")).await;
    assert_eq!((s, rest), (200, log));

    // Turned off by hand: URL and events stay; the page offers to turn it on.
    let (s, v) = put_as(
        app,
        &t.team_admin,
        &hook_path,
        json!({"url": receiver.url, "events": ["workload.failed"]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = fn_call("set_team_webhook_enabled", &[("enabled", "false")]).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["enabled"], false, "{v}");
    let (_, v) = call_with_token(app, &t.team_admin, Method::GET, &hook_path, None).await;
    assert_eq!(v["enabled"], false, "{v}");
    assert_eq!(v["url"], receiver.url.as_str(), "{v}");
    assert_eq!(v["events"], json!(["workload.failed"]), "{v}");
    let page = lead.page(&format!("/teams/{}", t.id)).await;
    assert!(page.contains(r#"data-enabled="false""#), "{page}");
    assert!(
        page.contains("Turn on") && page.contains("Send test"),
        "{page}"
    );
    assert!(page.contains(">Deliveries</summary>"), "{page}");

    // On again, then 10 failures in a row turn it off: the page says why.
    let (s, v) = fn_call("set_team_webhook_enabled", &[("enabled", "true")]).await;
    assert_eq!((s, &v["enabled"]), (200, &json!(true)), "{v}");
    for _ in 0..10 {
        Deliveries::new(store.clone())
            .webhook_result(
                uuid::Uuid::parse_str(&hook).expect("uuid"),
                false,
                (
                    Some(500),
                    Some("the receiver answered 500 Internal Server Error"),
                ),
                10,
                chrono::Utc::now(),
            )
            .await
            .expect("result");
    }
    let (_, v) = call_with_token(app, &t.team_admin, Method::GET, &hook_path, None).await;
    assert_eq!(
        (&v["enabled"], &v["consecutive_failures"]),
        (&json!(false), &json!(10))
    );
    let page = lead.page(&format!("/teams/{}", t.id)).await;
    assert!(page.contains("Off after 10 failures in a row"), "{page}");
    assert!(
        page.contains("Last error: the receiver answered 500 Internal Server Error"),
        "{page}"
    );
    let (s, v) = fn_call("set_team_webhook_enabled", &[("enabled", "true")]).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (&v["enabled"], &v["consecutive_failures"]),
        (&json!(true), &json!(0))
    );
    assert_eq!(v["events"], json!(["workload.failed"]), "{v}");

    // Only the team's admins: a member is refused, a bad id names nothing.
    let member = app.browser();
    assert!(
        member
            .login("uihooks-member", crate::allocations::PW)
            .await
            .status()
            .is_success()
    );
    for name in ["test_team_webhook", "team_webhook_deliveries"] {
        let r = member
            .call(name, &[("team_id", &t.id), ("id", &hook)])
            .await;
        assert_eq!(r.status(), 403, "{name}");
    }
    let r = lead
        .call("test_team_webhook", &[("team_id", &t.id), ("id", "nope")])
        .await;
    assert_eq!(r.status(), 404);
    assert_eq!(receiver.accepted().len(), 3, "no more than asked for");
}

/// Mail goes only to an address its owner proved: the mailed link's page posts the token;
/// a wrong token, another user's link, a used link and a replaced link are refused; a
/// new address needs a new proof.
async fn only_an_address_proved_by_its_link_gets_mail(db: Db) {
    let smtp = Smtpd::start();
    let a = app_with_mail(db, &smtp).await;
    let app = &a.app;
    let t = team(&a, "proof").await;
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    put_email(app, &t.member, "proof@example.org").await;
    let link = smtp.take_verification_link("proof@example.org", 20).await;
    let (user, tok) = link_params(&link);
    let user_id = uuid::Uuid::parse_str(&user).expect("uuid");
    let tell = |summary: &str| {
        tessera_core::store::NewEvent::new(
            tessera_domain::notify::EventKind::WorkloadFailed,
            Some(uuid::Uuid::parse_str(&t.id).expect("uuid")),
            ("workload", uuid::Uuid::now_v7()),
            tessera_domain::notify::EventPayload {
                summary: summary.into(),
                path: "/workloads".into(),
                user_id: Some(user_id),
                detail: None,
                team_name: None,
                audience: None,
            },
            chrono::Utc::now(),
        )
    };
    // Not proved yet: nothing is mailed.
    assert!(
        store
            .record_event(&tell("before the proof"))
            .await
            .expect("record")
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        to_of(&smtp.messages(), "proof@example.org"),
        0,
        "{:#?}",
        smtp.messages()
    );

    // A wrong token, and the right token for another user, are refused naming `token`.
    let admin_id = {
        put_email(app, &t.team_admin, "lead-proof@example.org").await;
        let l = smtp
            .take_verification_link("lead-proof@example.org", 20)
            .await;
        link_params(&l).0
    };
    for (u, k) in [
        (user.as_str(), "tev_0000"),
        (admin_id.as_str(), tok.as_str()),
    ] {
        let r = reqwest::Client::new()
            .post(app.url("/api/v1/email-verifications"))
            .json(&json!({"user_id": u, "token": k}))
            .send()
            .await
            .expect("post");
        let (s, e) = error_kind(r).await;
        assert_eq!(s, 422, "{e}");
        assert!(e.to_string().contains("token"), "{e}");
    }
    let r = reqwest::Client::new()
        .post(app.url("/api/v1/email-verifications"))
        .json(&json!({"user_id": user, "token": tok, "extra": 1}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 422, "unknown fields are refused");

    // The right one works once.
    let ok = reqwest::Client::new()
        .post(app.url("/api/v1/email-verifications"))
        .json(&json!({"user_id": user, "token": tok}))
        .send()
        .await
        .expect("post");
    assert_eq!(ok.status(), 204);
    let again = reqwest::Client::new()
        .post(app.url("/verify-email"))
        .header("origin", app.base.clone())
        .form(&[("user", user.as_str()), ("token", tok.as_str())])
        .send()
        .await
        .expect("post")
        .text()
        .await
        .expect("text");
    assert!(again.contains("This link does not work"), "{again}");

    // Proved: the next event is mailed (the one before is not, afterwards either).
    assert!(
        store
            .record_event(&tell("after the proof"))
            .await
            .expect("record")
    );
    let msgs = smtp.wait_for(1, 20).await;
    let mine: Vec<_> = msgs
        .iter()
        .filter(|(to, _)| to == "proof@example.org")
        .collect();
    assert_eq!(mine.len(), 1, "{msgs:#?}");
    assert!(mine[0].1.contains("after the proof"), "{}", mine[0].1);
    let (s, v) = post_empty(app, &t.member, "/api/v1/me/email/verification").await;
    assert_eq!(s, 409, "already verified: {v}");

    // A new address is not proved: asking again within a minute is refused, and only
    // the newest link works.
    put_email(app, &t.member, "proof2@example.org").await;
    let first = smtp.take_verification_link("proof2@example.org", 20).await;
    let (s, v) = post_empty(app, &t.member, "/api/v1/me/email/verification").await;
    assert_eq!(s, 409, "at most one a minute: {v}");
    let (_, first_tok) = link_params(&first);
    assert_ne!(first_tok, tok);
    let (s, v) = get_as(app, &t.member, "/api/v1/me/notifications").await;
    assert_eq!(s, 200);
    assert_eq!(v["email_verified"], false, "{v}");
    verify_link(app, &first).await;
    let (_, v) = get_as(app, &t.member, "/api/v1/me/notifications").await;
    assert_eq!(v["email_verified"], true, "{v}");
}

/// `POST path` with an API token and no body: `(status, JSON body or null)`.
async fn post_empty(app: &TestApp, token: &str, path: &str) -> (u16, Value) {
    call_with_token(app, token, Method::POST, path, None).await
}

/// Opens a verification link's page and presses its button.
async fn verify_link(app: &TestApp, link: &str) {
    let (user, tok) = link_params(link);
    let page = reqwest::get(link)
        .await
        .expect("page")
        .text()
        .await
        .expect("text");
    assert!(
        page.contains("Verify this address") && page.contains(&tok),
        "{page}"
    );
    let r = reqwest::Client::new()
        .post(app.url("/verify-email"))
        .header("origin", app.base.clone())
        .form(&[("user", user.as_str()), ("token", tok.as_str())])
        .send()
        .await
        .expect("verify");
    let page = r.text().await.expect("text");
    assert!(page.contains("Address verified"), "{page}");
}

/// Waits for a mail to `to` whose text contains `text`; returns it.
async fn wait_mail(smtp: &Smtpd, to: &str, text: &str, secs: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let msgs = smtp.messages();
        if let Some((_, m)) = msgs.iter().find(|(t, m)| t == to && m.contains(text)) {
            return m.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no mail to {to} saying {text:?}: {msgs:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A queued job starting, a quota change, an allocation's end near (with its page, where
/// it is extended), a drain's warning and the preemption at its deadline: each reaches
/// the person it is for, by mail, and the team's events reach a platform-wide webhook
/// too. Nothing reaches the other team's admin.
async fn the_new_events_reach_their_people_and_the_platform_hook(db: Db) {
    let (smtp, a, t, other) = mail_and_two_teams(db, "events").await;
    let app = &a.app;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    set_email(app, &smtp, &t.member, "ev@example.org").await;
    set_email(app, &smtp, &t.team_admin, "ev-lead@example.org").await;
    set_email(app, &smtp, &other.team_admin, "ev-other@example.org").await;
    // A queued job's start is off by default, and a quota change goes to the digest:
    // these two ask for them at once.
    for (token, kind) in [
        (&t.member, "workload.started"),
        (&t.team_admin, "quota.changed"),
    ] {
        let (s, v) = set_preference(app, token, kind, "immediate").await;
        assert_eq!(s, 200, "{v}");
    }
    let platform = Receiver::start().await;
    let (s, v) = a
        .post("/api/v1/webhooks", json!({"url": platform.url}))
        .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["webhook"]["team_id"], Value::Null, "{v}");
    platform.set_secret(v["secret"].as_str().expect("secret"));

    // The quota changes: the team's admin hears of it.
    set_quota(&a, &t.id, "H100-80GB", 7, 14, 7).await;
    let m = wait_mail(
        &smtp,
        "ev-lead@example.org",
        "quota on H100-80GB changed",
        20,
    )
    .await;
    assert!(m.contains("limit 7") && m.contains("limit 14"), "{m}");

    // A job with its own GPU waits for it, then starts.
    let node = WorkloadAgent::start(&a, "events-node").await;
    let (s, v) = post_as(
        app,
        &t.member,
        "/api/v1/jobs",
        json!({"command": "sleep 600", "gpu": "H100-80GB:1g.10gb", "name": "ev-job"}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["state"], "queued", "{v}");
    let job = v["id"].as_str().expect("id").to_owned();
    let alloc = v["allocation_id"].as_str().expect("alloc").to_owned();
    wait_workload(app, &t.member, &job, "running", 90).await;
    let m = wait_mail(&smtp, "ev@example.org", "left the queue", 20).await;
    assert!(m.contains(&format!("/workloads/{job}")), "{m}");

    // Its end is near (the pass run at a chosen time, a minute before it): told once,
    // with the page that extends it.
    let v = wait_for_state(&a, &alloc, "active").await;
    let ends: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(v["ends_at"].clone()).expect("ends_at");
    let (services, system) = app.side_services().await;
    let at = ends - chrono::Duration::minutes(1);
    let lead = chrono::Duration::hours(1);
    let told = services
        .notifications
        .find_expiring(&system, at, lead)
        .await;
    assert_eq!(told.expect("pass"), 1);
    let again = services
        .notifications
        .find_expiring(&system, at, lead)
        .await;
    assert_eq!(again.expect("pass"), 0, "told once per end");
    let m = wait_mail(&smtp, "ev@example.org", "ends at", 20).await;
    assert!(m.contains(&format!("/allocations/{alloc}")), "{m}");

    // Its node is drained with a deadline: warned, then preempted.
    let node_id = crate::drain::node_id(&a, "events-node").await;
    let deadline = chrono::Utc::now() + chrono::Duration::seconds(4);
    let (s, v) = a
        .call(
            Method::POST,
            &format!("/api/v1/nodes/{node_id}/drain"),
            Some(json!({"deadline": deadline, "reason": "new fans"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let m = wait_mail(&smtp, "ev@example.org", "will be preempted", 30).await;
    assert!(m.contains("drained by a platform admin"), "{m}");
    let m = wait_mail(&smtp, "ev@example.org", "was preempted", 60).await;
    assert!(m.contains(&format!("/allocations/{alloc}")), "{m}");

    // The platform hook got the team's events; the other team's admin got nothing.
    let want = [
        "quota.changed",
        "workload.started",
        "allocation.expiring",
        "allocation.preemption_warning",
        "allocation.preempted",
    ];
    let got = platform
        .wait_for(
            |a| want.iter().all(|k| a.iter().any(|(_, b)| b["kind"] == *k)),
            30,
        )
        .await;
    for k in want {
        assert!(
            got.iter()
                .any(|(_, b)| b["kind"] == k && b["team_id"] == t.id.as_str()),
            "{k}: {got:?}"
        );
    }
    assert_eq!(to_of(&smtp.messages(), "ev-other@example.org"), 0);
    drop(node);
}

/// A webhook whose stored `events` is not a list of kinds (a damaged row) fails its read:
/// the team's hook list answers 500 without showing the cause, rather than reading the hook
/// as one that wants every event. Another team's hooks still read.
async fn a_damaged_hook_fails_its_read_loudly(db: Db) {
    let a = AdminClient::new(db).await;
    let app = &a.app;
    let (t, other) = (team(&a, "damaged").await, team(&a, "intact").await);
    let hook = json!({"url": "https://93.184.216.34/hook", "events": ["workload.failed"]});
    let mut ids = Vec::new();
    for who in [&t, &other] {
        let path = format!("/api/v1/teams/{}/webhooks", who.id);
        let (s, v) = post_as(app, &who.team_admin, &path, hook.clone()).await;
        assert_eq!(s, 201, "{v}");
        let id = v["webhook"]["id"].as_str().expect("id");
        ids.push(uuid::Uuid::parse_str(id).expect("uuid"));
    }
    let store = tessera_core::store::Store::connect(&app.database_url)
        .await
        .expect("store");
    let sql = r#"UPDATE team_webhooks SET events = '{"workload.failed": true}' WHERE id = $1"#;
    match &store {
        tessera_core::store::Store::Sqlite(p) => {
            sqlx::query(sql).bind(ids[0]).execute(p).await.map(|_| ())
        }
        tessera_core::store::Store::Postgres(p) => {
            sqlx::query(sql).bind(ids[0]).execute(p).await.map(|_| ())
        }
    }
    .expect("damage the row");
    assert!(
        store.webhook(ids[0]).await.is_err(),
        "the store's read fails"
    );
    assert!(store.webhook(ids[1]).await.is_ok_and(|h| h.is_some()));
    store.close().await;
    let path = format!("/api/v1/teams/{}/webhooks", t.id);
    let (s, v) = get_as(app, &t.team_admin, &path).await;
    assert_eq!(s, 500, "{v}");
    assert!(
        !v.to_string().contains("workload.failed"),
        "no cause shown: {v}"
    );
    let path = format!("/api/v1/teams/{}/webhooks", other.id);
    let (s, v) = get_as(app, &other.team_admin, &path).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v[0]["events"], json!(["workload.failed"]), "{v}");
}
