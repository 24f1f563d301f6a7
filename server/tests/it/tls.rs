//! TLS on the server's own listener (`TESSERA_TLS_CERT` / `TESSERA_TLS_KEY`): the chain
//! it serves, a renewal picked up without a restart, a broken renewal that changes
//! nothing; and the agent's refusal of plain HTTP across the network.

use crate::multihost::{server_cert, test_ca};
use crate::support::{Db, TestApp};
use std::time::{Duration, Instant};

/// An HTTPS client trusting `ca_pem` only. Each check makes a new one: a client's TLS
/// session cache would resume an earlier session without looking at the certificate.
fn trusting(ca_pem: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).expect("ca"))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

async fn healthy(ca_pem: &str, app: &TestApp) -> bool {
    trusting(ca_pem)
        .get(app.url("/healthz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

/// Writes `text` to `path` the way an editor or `cp` does: in place.
fn overwrite(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_serves_tls_and_picks_up_a_renewed_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca1, issuer1) = test_ca("first CA");
    let (ca2, issuer2) = test_ca("second CA");
    let (cert1, key1) = server_cert(&["127.0.0.1"], &issuer1);
    let (cert2, key2) = server_cert(&["127.0.0.1"], &issuer2);
    let (cert_file, key_file) = (dir.path().join("tls.pem"), dir.path().join("tls.key"));
    overwrite(&cert_file, &cert1);
    overwrite(&key_file, &key1);
    let app = TestApp::spawn_with(Db::Sqlite, |c| {
        c.tls_cert = Some(cert_file.clone());
        c.tls_key = Some(key_file.clone());
    })
    .await;
    assert!(app.base.starts_with("https://"), "{}", app.base);
    let (old, new) = (ca1.pem(), ca2.pem());
    assert!(healthy(&old, &app).await, "the first certificate is served");
    assert!(
        !healthy(&new, &app).await,
        "a client of another CA refuses it"
    );
    let plain = reqwest::Client::new()
        .get(format!("http://{}/healthz", app.addr))
        .send()
        .await;
    assert!(
        plain.map(|r| !r.status().is_success()).unwrap_or(true),
        "no plain HTTP on the TLS port"
    );
    // Anonymous pages still redirect to the sign-in page, on the https origin.
    let r = trusting(&old)
        .get(app.url("/allocations"))
        .send()
        .await
        .expect("page");
    assert_eq!(r.status(), 303);

    // A renewal written in two steps: first the key alone (it does not match the old
    // certificate: the old pair stays), then the certificate.
    overwrite(&key_file, &key2);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        healthy(&old, &app).await,
        "a key without its certificate changes nothing"
    );
    overwrite(&cert_file, &cert2);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !healthy(&new, &app).await {
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(!healthy(&old, &app).await, "the old certificate is gone");

    // A broken file (half written, wrong file copied) keeps the last good pair.
    overwrite(&cert_file, "-----BEGIN CERTIFICATE-----\nbroken\n");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(healthy(&new, &app).await, "a broken renewal keeps serving");
}

#[test]
fn the_server_refuses_to_start_with_a_certificate_that_does_not_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, issuer) = test_ca("a CA");
    let (cert, _) = server_cert(&["127.0.0.1"], &issuer);
    let (_, other_key) = server_cert(&["127.0.0.1"], &issuer);
    let (cert_file, key_file) = (dir.path().join("tls.pem"), dir.path().join("tls.key"));
    std::fs::write(&cert_file, cert).expect("write");
    std::fs::write(&key_file, other_key).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["serve", "--bind", "127.0.0.1:0", "--no-sim"])
        .env("TESSERA_TLS_CERT", &cert_file)
        .env("TESSERA_TLS_KEY", &key_file)
        .env(
            "TESSERA_DATABASE_URL",
            format!("sqlite://{}/t.db?mode=rwc", dir.path().display()),
        )
        .output()
        .expect("tessera serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("is not the key of TESSERA_TLS_CERT"),
        "{stderr}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["serve", "--bind", "127.0.0.1:0", "--no-sim"])
        .env("TESSERA_TLS_CERT", &cert_file)
        .env_remove("TESSERA_TLS_KEY")
        .output()
        .expect("tessera serve");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--tls-key"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Across the network the agent speaks HTTPS, or plain HTTP only when told so.
#[test]
fn an_agent_refuses_plain_http_beyond_loopback() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(crate::support::agent_bin())
        .args(["--simulate", "--gpus", "H100-80GB"])
        .args([
            "--server",
            "http://192.0.2.10:3000",
            "--join-token",
            "unused",
        ])
        .arg("--state-dir")
        .arg(dir.path())
        .env_remove("TESSERA_AGENT_INSECURE_HTTP")
        .output()
        .expect("tessera-agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("clear text") && stderr.contains("--insecure-http"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("credential.json").exists(),
        "nothing was sent"
    );
}
