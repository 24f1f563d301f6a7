//! The REST API from a terminal: `tessera login`, `alloc`, `job`, `exec`, `notebook`, `quota`,
//! `usage`, `export`, `node`, `booking`, `image` and `completions`. It is a client like any other: it calls
//! `/api/v1` with a personal API token (created under My account), so the server applies
//! the same authorization as to any REST call. Responses are decoded into the domain's
//! views (`AllocationView`, `WorkloadView`, `QuotaView`, `UsageReport`, `NodeView`,
//! `BookingView`, `Page<…>`), which `--output json` prints as they are.
//!
//! Where to: `--url`/`TESSERA_URL` and `--token`/`TESSERA_TOKEN`; absent those, what
//! `tessera login` stored in `$XDG_CONFIG_HOME/tessera/config.json` (or
//! `~/.config/tessera/config.json`, created readable by its owner only); absent that,
//! `http://127.0.0.1:3000`.
//!
//! Exit codes, for scripts:
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done |
//! | 1 | the server refused the request (400, 409, 422, …; its message is printed), or a followed job did not succeed, or a notebook failed to start |
//! | 2 | bad usage (clap's own errors too) or a local problem, or the server could not be reached |
//! | 3 | not found (404): no such object, or not one the caller may see |
//! | 4 | not signed in or not allowed: no token, a token the server rejects (401), forbidden (403) |
//! | 5 | the server failed (5xx) |
//!
//! `job submit --follow` and `job logs --follow` end with the job: 0 if it succeeded, 1
//! otherwise.

mod allocations;
mod billing;
mod bookings;
mod exec;
mod images;
mod nodes;
mod workloads;

pub use allocations::{AllocCommand, QuotaCommand};
pub use billing::{ExportCommand, UsageArgs};
pub use bookings::{BookingCommand, booking};
pub use exec::{ExecArgs, exec};
pub use images::{ImageCommand, image};
pub use nodes::NodeCommand;
pub use workloads::{JobCommand, NotebookCommand, job, notebook};

pub use allocations::{alloc, quota};
pub use billing::{export, usage};
pub use nodes::node;

use clap::{Args, ValueEnum};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use tessera_domain::tenancy::{Page, TeamView};

/// Exit codes (see the module doc).
pub mod exit {
    pub const REFUSED: i32 = 1;
    pub const USAGE: i32 = 2;
    pub const NOT_FOUND: i32 = 3;
    pub const NOT_ALLOWED: i32 = 4;
    pub const SERVER_FAILED: i32 = 5;
}

/// The portal's URL when neither a flag, the environment nor `tessera login` gives one.
const DEFAULT_URL: &str = "http://127.0.0.1:3000";

#[derive(Debug, Clone, Args)]
pub struct Remote {
    /// The portal's URL (default: the one `tessera login` stored, else http://127.0.0.1:3000).
    #[arg(long, env = "TESSERA_URL", global = true)]
    pub url: Option<String>,
    /// A personal API token (`tsk_…`, from My account; default: the one `tessera login`
    /// stored).
    #[arg(long, env = "TESSERA_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// How to print results: a table for people, the domain's JSON views, or CSV.
    #[arg(long, short, value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
    Csv,
}

/// A refusal or an unreachable server, already worded for the terminal.
pub struct CliError {
    pub code: i32,
    pub message: String,
}

pub type R<T> = Result<T, CliError>;

impl CliError {
    fn usage(message: impl Into<String>) -> CliError {
        CliError {
            code: exit::USAGE,
            message: message.into(),
        }
    }
}

/// The `message` of an error answer's body, or the status where the body has none.
pub(crate) async fn error_message(resp: reqwest::Response) -> String {
    #[derive(Deserialize)]
    struct ErrorBody {
        message: String,
    }
    let status = resp.status();
    let bytes = resp.bytes().await.unwrap_or_default();
    serde_json::from_slice::<ErrorBody>(&bytes)
        .map(|b| b.message)
        .unwrap_or_else(|_| format!("the server answered {status}"))
}

fn unreachable(e: reqwest::Error) -> CliError {
    CliError::usage(format!("cannot reach the server: {e}"))
}

/// The exit code for a status the server answered with.
fn code_for(status: reqwest::StatusCode) -> i32 {
    match status.as_u16() {
        404 => exit::NOT_FOUND,
        401 | 403 => exit::NOT_ALLOWED,
        500.. => exit::SERVER_FAILED,
        _ => exit::REFUSED,
    }
}

/// What `tessera login` stores.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    url: String,
    token: String,
}

/// `$XDG_CONFIG_HOME/tessera/config.json`, or under `~/.config` without it.
fn config_path() -> R<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(home) => PathBuf::from(home).join(".config"),
            None => {
                return Err(CliError::usage(
                    "neither XDG_CONFIG_HOME nor HOME is set: no place for the configuration",
                ));
            }
        },
    };
    Ok(base.join("tessera").join("config.json"))
}

fn load_stored() -> Option<Stored> {
    let text = std::fs::read(config_path().ok()?).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Writes the file through a fresh sibling created with mode 0600 and renamed over the old
/// one, so the token is never readable by others, not even for a moment.
fn save_stored(stored: &Stored) -> R<PathBuf> {
    let path = config_path()?;
    let local = |e: std::io::Error| CliError::usage(format!("{}: {e}", path.display()));
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(local)?;
    let tmp = dir.join(format!(".config.json.{}", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options.open(&tmp).and_then(|mut f| {
        let body = serde_json::to_vec_pretty(stored).map_err(std::io::Error::other)?;
        f.write_all(&body)?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(local(e));
    }
    Ok(path)
}

pub(crate) struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    output: Output,
}

impl Client {
    /// Flags and the environment first, then what `tessera login` stored.
    pub(crate) fn new(remote: &Remote) -> R<Client> {
        let stored = load_stored();
        let token = remote
            .token
            .clone()
            .or_else(|| stored.as_ref().map(|s| s.token.clone()))
            .ok_or(CliError {
                code: exit::NOT_ALLOWED,
                message: "not signed in: run `tessera login --url URL`, or set TESSERA_TOKEN \
                          (or --token) to a personal API token from My account"
                    .into(),
            })?;
        let url = remote
            .url
            .clone()
            .or_else(|| stored.map(|s| s.url))
            .unwrap_or_else(|| DEFAULT_URL.to_owned());
        Client::with(&url, token, remote.output)
    }

    fn with(url: &str, token: String, output: Output) -> R<Client> {
        Ok(Client {
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(30))
                .build()
                .map_err(unreachable)?,
            base: url.trim_end_matches('/').to_owned(),
            token,
            output,
        })
    }

    /// Sends a request; a success status gives the response, anything else the server's
    /// message with the exit code for its status.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> R<reqwest::Response> {
        let mut rb = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(Duration::from_secs(60))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            rb = rb.json(b);
        }
        let resp = rb.send().await.map_err(unreachable)?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let mut message = error_message(resp).await;
        if status == reqwest::StatusCode::NOT_FOUND {
            // The server says no more, on purpose (a stranger's object is not found either).
            let path = path.split('?').next().unwrap_or(path);
            message = format!("{message}: {path} (no such object, or not one you may see)");
        }
        Err(CliError {
            code: code_for(status),
            message,
        })
    }

    /// A call whose answer is the domain view `T`.
    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> R<T> {
        let resp = self.send(method, path, body.as_ref()).await?;
        let bytes = resp.bytes().await.map_err(unreachable)?;
        serde_json::from_slice(&bytes).map_err(|e| CliError {
            code: exit::SERVER_FAILED,
            message: format!("the server's answer to {path} is not what this client expects: {e}"),
        })
    }

    /// A call answered with no body (204).
    pub(crate) async fn call_empty(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> R<()> {
        self.send(method, path, body.as_ref()).await.map(|_| ())
    }

    pub(crate) async fn get<T: DeserializeOwned>(&self, path: &str) -> R<T> {
        self.call(reqwest::Method::GET, path, None).await
    }

    /// The caller's team when `team` is absent and they are in exactly one.
    pub(crate) async fn team_or_only(&self, team: Option<String>) -> R<String> {
        if let Some(t) = team {
            return Ok(t);
        }
        let page: Page<TeamView> = self.get("/api/v1/teams?limit=2").await?;
        match page.items.as_slice() {
            [one] => Ok(one.id.to_string()),
            _ => Err(CliError::usage(format!(
                "you see {} teams: name one with --team ID",
                page.total
            ))),
        }
    }
}

/// A value for a path segment or query string: what is not unreserved is percent-encoded
/// (also what the exec tests send as `command=`).
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A view printed as a table row or a CSV record.
pub(crate) trait Tabular {
    const HEADER: &'static [&'static str];
    fn cells(&self) -> Vec<String>;
}

/// An enum or id as its JSON word (`active`, `pending_approval`, a UUID).
pub(crate) fn word<T: Serialize>(t: &T) -> String {
    match serde_json::to_value(t) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(v) => v.to_string(),
        Err(_) => String::new(),
    }
}

pub(crate) fn opt<T: std::fmt::Display>(t: Option<T>) -> String {
    t.map(|t| t.to_string()).unwrap_or_default()
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  "));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(header.iter().map(|h| h.to_uppercase()).collect());
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
}

fn csv(header: &[&str], rows: &[Vec<String>]) -> String {
    let record = |cells: &[String]| {
        cells
            .iter()
            .map(|c| csv_field(c))
            .collect::<Vec<_>>()
            .join(",")
            + "\n"
    };
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    let mut out = record(&header);
    for row in rows {
        out.push_str(&record(row));
    }
    out
}

/// Prints `view` as JSON, or `items` as a table or CSV (`empty` when a table has no rows).
pub(crate) fn print<V: Serialize, T: Tabular>(
    output: Output,
    view: &V,
    items: &[T],
    empty: &str,
) -> R<i32> {
    let rows: Vec<Vec<String>> = items.iter().map(Tabular::cells).collect();
    let text = match output {
        Output::Json => {
            serde_json::to_string_pretty(view).map_err(|e| CliError::usage(e.to_string()))? + "\n"
        }
        Output::Csv => csv(T::HEADER, &rows),
        Output::Table if rows.is_empty() => format!("{empty}\n"),
        Output::Table => table(T::HEADER, &rows),
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
    Ok(0)
}

/// `tessera login`.
#[derive(Debug, Clone, Args)]
pub struct LoginArgs {
    /// The portal's URL, e.g. https://gpu.example.org.
    #[arg(long, env = "TESSERA_URL")]
    pub url: String,
    /// A personal API token from My account; without it, it is read from standard input.
    #[arg(long, env = "TESSERA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// Checks the token with `GET /api/v1/me` and stores URL and token for later commands.
pub async fn login(args: LoginArgs) -> R<i32> {
    let token = match args.token {
        Some(t) => t,
        None => {
            eprint!("API token (from My account on {}): ", args.url);
            let _ = std::io::stderr().flush();
            // Typed at a terminal: not echoed (`stty`, where there is one).
            let tty = std::io::IsTerminal::is_terminal(&std::io::stdin());
            let stty = |arg: &str| {
                let _ = std::process::Command::new("stty")
                    .arg(arg)
                    .stdin(std::process::Stdio::inherit())
                    .status();
            };
            if tty {
                stty("-echo");
            }
            let mut line = String::new();
            let read = std::io::stdin().read_line(&mut line);
            if tty {
                stty("echo");
                eprintln!();
            }
            read.map_err(|e| CliError::usage(format!("reading the token: {e}")))?;
            line
        }
    };
    let token = token.trim().to_owned();
    if token.is_empty() {
        return Err(CliError::usage("no token given"));
    }
    let client = Client::with(&args.url, token, Output::Table)?;
    let me: tessera_domain::account::Me = client.get("/api/v1/me").await?;
    let path = save_stored(&Stored {
        url: client.base.clone(),
        token: client.token.clone(),
    })?;
    println!(
        "signed in to {} as {}{} (stored in {})",
        client.base,
        me.username,
        if me.is_admin {
            ", a platform admin"
        } else {
            ""
        },
        path.display()
    );
    Ok(0)
}

/// `tessera completions SHELL`.
#[derive(Debug, Clone, Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Prints the completion script for `shell` (e.g. `tessera completions bash >
/// /etc/bash_completion.d/tessera`).
pub fn completions(args: &CompletionsArgs) -> i32 {
    let mut cmd = <crate::config::Cli as clap::CommandFactory>::command();
    clap_complete::generate(args.shell, &mut cmd, "tessera", &mut std::io::stdout());
    0
}

#[cfg(test)]
mod tests {
    use super::{csv, encode, table};

    #[test]
    fn values_are_percent_encoded() {
        assert_eq!(
            encode("H100-80GB:1g.10gb a&b/.."),
            "H100-80GB%3A1g.10gb%20a%26b%2F.."
        );
    }

    #[test]
    fn csv_quotes_only_what_needs_it() {
        let rows = vec![vec![
            "a,b".to_owned(),
            "say \"hi\"".to_owned(),
            "x".to_owned(),
        ]];
        assert_eq!(
            csv(&["one", "two", "three"], &rows),
            "one,two,three\n\"a,b\",\"say \"\"hi\"\"\",x\n"
        );
    }

    #[test]
    fn table_columns_line_up() {
        let rows = vec![
            vec!["1".to_owned(), "active".to_owned()],
            vec!["22".to_owned(), "queued".to_owned()],
        ];
        assert_eq!(
            table(&["id", "state"], &rows),
            "ID  STATE\n1   active\n22  queued\n"
        );
    }
}
