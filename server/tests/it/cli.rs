//! The `tessera` CLI against a real server: each subcommand's happy path, decoded as the
//! domain's views (`--output json`), a stranger's object (exit 3 with the server's
//! message), the exit codes scripts rely on, `login`'s 0600 file, and `export chargeback`
//! byte for byte as the REST CSV.

use crate::allocations::{SimAgent, set_quota, team, wait_for_state};
use crate::billing::{history, member_id, next_hour, services, set_rate};
use crate::on_both_databases;
use crate::support::{AdminClient, Db};
use crate::workloads::{WorkloadAgent, wait_workload};
use chrono::{Datelike, Duration};
use serde::de::DeserializeOwned;
use std::process::Stdio;
use tessera_domain::alloc::{AllocationView, QuotaView};
use tessera_domain::billing::UsageReport;
use tessera_domain::booking::BookingView;
use tessera_domain::cluster::NodeView;
use tessera_domain::tenancy::Page;
use tessera_domain::workload::{WorkloadState, WorkloadView};
use tokio::io::AsyncWriteExt;

/// What one run of the binary did.
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Out {
    /// Asserts success and decodes standard output as the view `T`.
    fn json<T: DeserializeOwned>(&self) -> T {
        assert_eq!(self.code, Some(0), "{}", self.stderr);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not the view: {e}\n{}", self.stdout))
    }

    fn ok(&self) -> &str {
        assert_eq!(self.code, Some(0), "{}\n{}", self.stdout, self.stderr);
        &self.stdout
    }
}

/// Runs the CLI with its own config dir (so no one's stored login leaks in) against
/// `url`, with `token` (none: what `tessera login` stored there) and `stdin`.
struct Cli {
    url: String,
    config: tempfile::TempDir,
}

impl Cli {
    fn new(url: &str) -> Cli {
        Cli {
            url: url.to_owned(),
            config: tempfile::tempdir().expect("tempdir"),
        }
    }

    async fn run_with(&self, token: Option<&str>, args: &[&str], stdin: &str) -> Out {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_tessera"));
        cmd.args(args)
            .env_remove("TESSERA_URL")
            .env_remove("TESSERA_TOKEN")
            .env("XDG_CONFIG_HOME", self.config.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(t) = token {
            cmd.env("TESSERA_URL", &self.url).env("TESSERA_TOKEN", t);
        }
        let mut child = cmd.spawn().expect("run tessera");
        let mut input = child.stdin.take().expect("stdin");
        input.write_all(stdin.as_bytes()).await.expect("stdin");
        drop(input);
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(180),
            child.wait_with_output(),
        )
        .await
        .expect("tessera finished in time")
        .expect("tessera ran");
        Out {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    async fn run(&self, token: &str, args: &[&str]) -> Out {
        self.run_with(Some(token), args, "").await
    }
}

async fn allocations_jobs_and_notebooks_on_a_live_node(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "clia").await;
    set_quota(&a, &t.id, "H100-80GB", 7, 7, 7).await;
    let stranger = team(&a, "clib").await;
    let agent = WorkloadAgent::start(&a, "cli-node").await;
    let cli = Cli::new(&a.app.base);

    // `login` reads the token on standard input, checks it, and stores it readable by
    // its owner only; later commands need neither flags nor the environment.
    let out = cli
        .run_with(
            None,
            &["login", "--url", &a.app.base],
            &format!("{}\n", t.member),
        )
        .await;
    assert!(out.ok().contains("clia-member"), "{}", out.stdout);
    let stored = cli.config.path().join("tessera/config.json");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&stored)
            .expect("stored")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }
    let text = std::fs::read_to_string(&stored).expect("read");
    assert!(
        text.contains(&t.member) && text.contains(&a.app.base),
        "{text}"
    );

    // alloc request (team: the member's only one), then it becomes active on the node.
    let requested: AllocationView = cli
        .run_with(
            None,
            &[
                "alloc",
                "request",
                "--kind",
                "H100-80GB:1g.10gb",
                "--hours",
                "2",
                "-o",
                "json",
            ],
            "",
        )
        .await
        .json();
    assert_eq!(requested.team_id.to_string(), t.id);
    assert_eq!(requested.kind, "H100-80GB:1g.10gb");
    let alloc = requested.id.to_string();
    wait_for_state(&a, &alloc, "active").await;

    let listed: Page<AllocationView> = cli
        .run(&t.member, &["alloc", "list", "--mine", "-o", "json"])
        .await
        .json();
    assert!(
        listed.items.iter().any(|v| v.id == requested.id),
        "{listed:?}"
    );
    let csv = cli.run(&t.member, &["alloc", "list", "-o", "csv"]).await;
    let mut lines = csv.ok().lines();
    assert!(
        lines.next().expect("header").starts_with("id,state,kind,"),
        "{}",
        csv.stdout
    );
    assert!(
        lines.any(|l| l.starts_with(&format!("{alloc},active,H100-80GB:1g.10gb,"))),
        "{}",
        csv.stdout
    );
    let shown = cli.run(&t.member, &["alloc", "show", &alloc]).await;
    assert!(
        shown.ok().contains("state     active") && shown.stdout.contains("history"),
        "{}",
        shown.stdout
    );
    let shown: AllocationView = cli
        .run(&t.member, &["alloc", "show", &alloc, "-o", "json"])
        .await
        .json();
    let extended: AllocationView = cli
        .run(
            &t.member,
            &["alloc", "extend", &alloc, "--minutes", "30", "-o", "json"],
        )
        .await
        .json();
    assert_eq!(
        extended.ends_at,
        shown.ends_at.map(|e| e + Duration::minutes(30))
    );

    // A stranger's allocation: not found (3) with the server's message; nothing changes.
    for args in [
        &["alloc", "show", &alloc][..],
        &["alloc", "release", &alloc],
        &["alloc", "extend", &alloc, "--minutes", "5"],
    ] {
        let out = cli.run(&stranger.member, args).await;
        assert_eq!(out.code, Some(3), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr
                .starts_with("error: not found: /api/v1/allocations/")
                && out.stderr.contains(&alloc),
            "{}",
            out.stderr
        );
        assert!(out.stdout.is_empty(), "{}", out.stdout);
    }

    // Jobs: submit, logs -f (exits with the job), list, stop.
    let submit = |rest: &[&'static str]| {
        [&["job", "submit", "--allocation", alloc.as_str()][..], rest].concat()
    };
    let out = cli
        .run(&t.member, &submit(&["--", "echo", "cli hello"]))
        .await;
    let job = out.ok().trim().to_owned();
    let logs = cli.run(&t.member, &["job", "logs", "-f", &job]).await;
    assert!(logs.ok().contains("cli hello"), "{}", logs.stdout);
    let long: WorkloadView = cli
        .run(
            &t.member,
            &submit(&["--command", "sleep 300", "-o", "json"]),
        )
        .await
        .json();
    let jobs: Page<WorkloadView> = cli
        .run(&t.member, &["job", "list", "-o", "json"])
        .await
        .json();
    let states: Vec<(String, WorkloadState)> = jobs
        .items
        .iter()
        .map(|j| (j.id.to_string(), j.state))
        .collect();
    assert!(
        states.contains(&(job.clone(), WorkloadState::Succeeded)),
        "{states:?}"
    );
    assert!(jobs.items.iter().any(|j| j.id == long.id), "{states:?}");
    let other = cli
        .run(&stranger.member, &["job", "stop", &long.id.to_string()])
        .await;
    assert_eq!(other.code, Some(3), "{}", other.stderr);
    let stopped: WorkloadView = cli
        .run(
            &t.member,
            &["job", "stop", &long.id.to_string(), "-o", "json"],
        )
        .await
        .json();
    assert_eq!(stopped.id, long.id);
    wait_workload(&a.app, &t.member, &long.id.to_string(), "cancelled", 60).await;

    // Notebooks: start (waits until it answers), list, open, stop.
    let started = cli
        .run(
            &t.member,
            &[
                "notebook",
                "start",
                "--allocation",
                &alloc,
                "--name",
                "clinb",
            ],
        )
        .await;
    let url = started.ok().trim().to_owned();
    assert!(
        url.starts_with(&a.app.base) && url.contains("/clinb/"),
        "{url}"
    );
    let notebooks: Page<WorkloadView> = cli
        .run(&t.member, &["notebook", "list", "-o", "json"])
        .await
        .json();
    let nb = notebooks
        .items
        .iter()
        .find(|n| n.name == "clinb")
        .expect("listed");
    let nb_id = nb.id.to_string();
    let opened = cli.run(&t.member, &["notebook", "open", &nb_id]).await;
    assert_eq!(opened.ok().trim(), url);
    let out = cli
        .run(&stranger.member, &["notebook", "open", &nb_id])
        .await;
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    cli.run(&t.member, &["notebook", "stop", &nb_id]).await.ok();
    wait_workload(&a.app, &t.member, &nb_id, "stopped", 60).await;

    // Nodes, for platform admins (a member is refused, exit 4).
    let admin = a.token().await;
    let nodes: Page<NodeView> = cli
        .run(&admin, &["node", "list", "-o", "json"])
        .await
        .json();
    assert!(
        nodes.items.iter().any(|n| n.hostname == "cli-node"),
        "{nodes:?}"
    );
    let table = cli.run(&admin, &["node", "list"]).await;
    assert!(table.ok().contains("cli-node"), "{}", table.stdout);
    // Drain by hostname (platform admins; a member gets exit 4, an unknown node exit 3),
    // then undrain.
    let out = cli
        .run(&t.member, &["node", "drain", "cli-node", "--in", "60"])
        .await;
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    let out = cli.run(&admin, &["node", "drain", "no-such-node"]).await;
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    let out = cli
        .run(&admin, &["node", "drain", "cli-node", "--in=-3"])
        .await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("minutes"), "{}", out.stderr);
    let drained: NodeView = cli
        .run(
            &admin,
            &[
                "node", "drain", "cli-node", "--in", "60", "--reason", "firmware", "-o", "json",
            ],
        )
        .await
        .json();
    let d = drained.drain.expect("drained");
    assert_eq!(d.reason, "firmware");
    let table = cli.run(&admin, &["node", "list"]).await;
    assert!(table.ok().contains("until"), "{}", table.stdout);
    let back: NodeView = cli
        .run(&admin, &["node", "undrain", "cli-node", "-o", "json"])
        .await
        .json();
    assert!(back.drain.is_none(), "{back:?}");
    // Hot spares: a member may list but not set them (exit 4); bad input names the field
    // (exit 1); an admin sets one, lists it, and clears it.
    let out = cli
        .run(
            &t.member,
            &["node", "spares", "set", "H100-80GB", "--gpus", "1"],
        )
        .await;
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    let out = cli
        .run(
            &admin,
            &["node", "spares", "set", "H100-80GB", "--percent", "60"],
        )
        .await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("percent"), "{}", out.stderr);
    let set: Vec<tessera_domain::spares::SpareView> = cli
        .run(
            &admin,
            &[
                "node",
                "spares",
                "set",
                "H100-80GB",
                "--gpus",
                "1",
                "-o",
                "json",
            ],
        )
        .await
        .json();
    assert_eq!(set[0].gpus, Some(1), "{set:?}");
    let table = cli.run(&t.member, &["node", "spares"]).await;
    assert!(table.ok().contains("H100-80GB"), "{}", table.stdout);
    let cleared = cli
        .run(&admin, &["node", "spares", "clear", "H100-80GB"])
        .await;
    assert!(cleared.ok().contains("no hot spares"), "{}", cleared.stdout);

    // Release ends it.
    let released: AllocationView = cli
        .run(&t.member, &["alloc", "release", &alloc, "-o", "json"])
        .await
        .json();
    assert_eq!(released.id, requested.id);
    wait_for_state(&a, &alloc, "ended").await;
    agent.stop().await;
}

async fn quotas_usage_export_and_exit_codes(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "cliq").await;
    let stranger = team(&a, "clir").await;
    set_quota(&a, &t.id, "H100-80GB", 2, 7, 7).await;
    let admin = a.token().await;
    let cli = Cli::new(&a.app.base);

    // quota show (the member's only team) and set (platform admins only).
    let quotas: Vec<QuotaView> = cli
        .run(&t.member, &["quota", "show", "-o", "json"])
        .await
        .json();
    assert_eq!(
        quotas
            .iter()
            .map(|q| (q.model.as_str(), q.guaranteed, q.limit))
            .collect::<Vec<_>>(),
        [("H100-80GB", 2, 7)]
    );
    let set = ["quota", "set", "--team", &t.id, "--model", "H100-80GB"];
    let values = ["--guaranteed", "3", "--limit", "6", "--per-user", "4"];
    let out = cli.run(&t.member, &[&set[..], &values].concat()).await;
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    let quotas: Vec<QuotaView> = cli
        .run(&admin, &[&set[..], &values, &["-o", "json"]].concat())
        .await
        .json();
    assert_eq!(
        (quotas[0].guaranteed, quotas[0].limit, quotas[0].per_user),
        (3, 6, 4)
    );
    let out = cli
        .run(&stranger.member, &["quota", "show", "--team", &t.id])
        .await;
    assert_eq!(out.code, Some(3), "{}", out.stderr);

    // Metered usage: a slice active for two hours at 7.00 an hour for a whole H100.
    let (s, system, store) = services(&a.app).await;
    let h = next_hour();
    set_rate(&a, "H100-80GB:whole", 700, 0, h).await;
    let user = member_id(&a, &t.id).await;
    let team_id = uuid::Uuid::parse_str(&t.id).expect("team");
    history(
        &store,
        team_id,
        user,
        "H100-80GB:1g.10gb",
        1,
        1,
        "normal",
        h,
        Some(h + Duration::hours(2)),
    )
    .await;
    s.billing
        .meter(&system, h + Duration::hours(3), None)
        .await
        .expect("meter");
    let (day, day2) = (
        h.date_naive().to_string(),
        (h + Duration::hours(2)).date_naive().to_string(),
    );
    let period = ["--team", &t.id, "--from", &day, "--to", &day2];
    let report: UsageReport = cli
        .run(
            &t.team_admin,
            &[&["usage"][..], &period, &["-o", "json"]].concat(),
        )
        .await
        .json();
    assert!(report.total.gpu_ms > 0, "{report:?}");
    assert_eq!(report.total.cost_minor, 200, "{report:?}");
    let table = cli
        .run(&t.team_admin, &[&["usage"][..], &period].concat())
        .await;
    assert!(
        table
            .ok()
            .lines()
            .any(|l| l.starts_with("team ") && l.contains("cliq") && l.ends_with("2.00")),
        "{}",
        table.stdout
    );
    let csv = cli
        .run(
            &t.team_admin,
            &[&["usage"][..], &period, &["-o", "csv"]].concat(),
        )
        .await;
    assert!(
        csv.ok()
            .starts_with("group,key,label,gpu_hours,active_gpu_hours,efficiency_pct,cost\ntotal,"),
        "{}",
        csv.stdout
    );

    // The chargeback export is the REST CSV, byte for byte.
    let month = h.format("%Y-%m").to_string();
    let exported = {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["export", "chargeback", "--month", &month, "--team", &t.id])
            .env("TESSERA_URL", &a.app.base)
            .env("TESSERA_TOKEN", &t.team_admin)
            .env("XDG_CONFIG_HOME", cli.config.path())
            .output()
            .await
            .expect("run tessera");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let (first, last) = (
        format!("{month}-01"),
        (h.date_naive().with_day(1).expect("first") + chrono::Months::new(1)
            - chrono::Days::new(1))
        .to_string(),
    );
    let rest = reqwest::Client::new()
        .get(a.app.url(&format!(
            "/api/v1/exports/chargeback.csv?team={}&from={first}&to={last}",
            t.id
        )))
        .bearer_auth(&t.team_admin)
        .send()
        .await
        .expect("export");
    assert_eq!(rest.status(), 200);
    let rest = rest.bytes().await.expect("body");
    assert_eq!(exported, rest.to_vec());
    assert!(
        String::from_utf8_lossy(&exported).lines().count() >= 2,
        "a header and the charges"
    );
    let out = cli
        .run(
            &stranger.team_admin,
            &["export", "chargeback", "--month", &month, "--team", &t.id],
        )
        .await;
    assert!(matches!(out.code, Some(3 | 4)), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);

    // Exit codes: a bad month (2), a token the server rejects (4), no token at all (4), a
    // server that cannot be reached (2), no such allocation (3), a refused request (1).
    let out = cli
        .run(&t.member, &["export", "chargeback", "--month", "2026-13"])
        .await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    let out = cli.run("tsk_not-a-token", &["alloc", "list"]).await;
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    let out = cli.run_with(None, &["alloc", "list"], "").await;
    assert_eq!(out.code, Some(4), "{}", out.stderr);
    assert!(out.stderr.contains("tessera login"), "{}", out.stderr);
    let gone = Cli::new("http://127.0.0.1:9");
    let out = gone.run(&t.member, &["alloc", "list"]).await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    let out = cli
        .run(
            &t.member,
            &["alloc", "show", &uuid::Uuid::new_v4().to_string()],
        )
        .await;
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    let out = cli
        .run(
            &t.member,
            &["alloc", "request", "--kind", "H100-80GB:9g.99gb"],
        )
        .await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.starts_with("error: "), "{}", out.stderr);
    let out = cli.run(&t.member, &["alloc", "list", "-o", "yaml"]).await;
    assert_eq!(out.code, Some(2), "clap's usage errors: {}", out.stderr);
}

/// `booking create|list|cancel`: a team admin books by team name; a member is refused
/// (exit 4); a window in the past is refused naming the field and a fully booked one with
/// the reason (exit 1); the calendar lists it, to another team without its id or team;
/// another team's admin cannot cancel it (exit 3), its own can, and it leaves the calendar.
async fn bookings_from_the_terminal(db: Db) {
    let a = AdminClient::new(db).await;
    let t = team(&a, "clibk").await;
    let other = team(&a, "clibk-other").await;
    for id in [&t.id, &other.id] {
        set_quota(&a, id, "H100-80GB", 0, 7, 7).await;
    }
    let _node = SimAgent::start(&a, "clibk-node").await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (s, v) = a.get("/api/v1/cluster/free").await;
        assert_eq!(s, 200, "{v}");
        if v.as_object().is_some_and(|m| !m.is_empty()) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no capacity: {v}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let cli = Cli::new(&a.app.base);
    let day = (chrono::Utc::now() + Duration::days(2)).date_naive();
    let from = format!("{day}T10:00");
    let to = format!("{day}T12:00");
    let create = |from: String, to: String| {
        vec![
            "booking".to_owned(),
            "create".into(),
            "--team".into(),
            "clibk".into(),
            "--kind".into(),
            "H100-80GB:whole".into(),
            "--from".into(),
            from,
            "--to".into(),
            to,
            "--purpose".into(),
            "workshop".into(),
            "-o".into(),
            "json".into(),
        ]
    };
    let run = async |token: &str, v: Vec<String>| {
        cli.run(token, &v.iter().map(String::as_str).collect::<Vec<_>>())
            .await
    };

    let out = run(&t.member, create(from.clone(), to.clone())).await;
    assert_eq!(out.code, Some(4), "a member may not book: {}", out.stderr);
    let yesterday = (chrono::Utc::now() - Duration::days(1)).date_naive();
    let out = run(
        &t.team_admin,
        create(format!("{yesterday}T10:00"), format!("{yesterday}T11:00")),
    )
    .await;
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("starts_at"), "{}", out.stderr);

    let booked: BookingView = run(&t.team_admin, create(from.clone(), to.clone()))
        .await
        .json();
    assert_eq!(booked.state, "booked");
    assert_eq!(booked.team_name.as_deref(), Some("clibk"));
    assert_eq!((booked.kind.as_str(), booked.count), ("H100-80GB:whole", 1));
    assert_eq!(booked.purpose, "workshop");
    let id = booked.id.expect("own booking has its id").to_string();
    // The one H100 is booked for that window: a second booking is refused with the reason.
    let out = run(&t.team_admin, create(from.clone(), to.clone())).await;
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    assert!(!out.stderr.trim().is_empty(), "a reason is printed");

    let range = [
        "booking",
        "list",
        "--from",
        &day.to_string(),
        "--to",
        &(day + Duration::days(1)).to_string(),
        "--model",
        "H100-80GB",
    ];
    let theirs: Vec<BookingView> = cli
        .run(&other.member, &[&range[..], &["-o", "json"]].concat())
        .await
        .json();
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    assert_eq!((theirs[0].id, theirs[0].team_name.as_deref()), (None, None));
    let table = cli.run(&t.member, &range).await;
    let text = table.ok();
    assert!(text.contains(&id) && text.contains("clibk"), "{text}");
    let none = cli
        .run(&t.member, &["booking", "list", "--model", "A100-80GB"])
        .await;
    assert!(none.ok().contains("nothing booked"), "{}", none.stdout);
    let out = cli
        .run(&t.member, &["booking", "list", "--from", "soon"])
        .await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);

    let out = cli
        .run(&other.team_admin, &["booking", "cancel", &id])
        .await;
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    let cancelled: BookingView = cli
        .run(&t.team_admin, &["booking", "cancel", &id, "-o", "json"])
        .await
        .json();
    assert_eq!(cancelled.state, "cancelled");
    let after = cli.run(&t.member, &range).await;
    assert!(after.ok().contains("nothing booked"), "{}", after.stdout);
}

#[tokio::test]
async fn completions_are_generated_for_each_shell() {
    let cli = Cli::new("http://127.0.0.1:9");
    for (shell, mark) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef tessera"),
        ("fish", "complete -c tessera"),
    ] {
        let out = cli.run_with(None, &["completions", shell], "").await;
        let script = out.ok();
        assert!(script.contains(mark), "{shell}: {script}");
        assert!(
            script.contains("chargeback"),
            "{shell}: subcommands included"
        );
    }
}

on_both_databases!(
    allocations_jobs_and_notebooks_on_a_live_node,
    quotas_usage_export_and_exit_codes,
    bookings_from_the_terminal,
);
