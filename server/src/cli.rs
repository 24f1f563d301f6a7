//! `tessera job …` and `tessera notebook …`: the REST API from a terminal, with a personal
//! API token (`TESSERA_TOKEN`, created under My account) against `TESSERA_URL`.
//!
//! Exit codes: 0 success; 1 the server refused (its message is printed); 2 the server
//! could not be reached. `job submit --follow` and `job logs --follow` end with the job:
//! 0 if it succeeded, 1 otherwise.

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use std::time::Duration;

#[derive(Debug, Clone, Args)]
pub struct Remote {
    /// The portal's URL.
    #[arg(
        long,
        env = "TESSERA_URL",
        default_value = "http://127.0.0.1:3000",
        global = true
    )]
    pub url: String,
    /// A personal API token (`tsk_…`, from My account).
    #[arg(long, env = "TESSERA_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Runs a command on one of your active allocations (`--allocation`), or queues it for
    /// a GPU of its own (`--gpu`), given back when it ends:
    /// `tessera job submit --gpu H100-80GB:1g.10gb -- python train.py`.
    Submit {
        /// The allocation's id.
        #[arg(long, required_unless_present = "gpu", conflicts_with = "gpu")]
        allocation: Option<String>,
        #[command(flatten)]
        own: Box<OwnGpu>,
        /// Shell command, run by /bin/sh in your team's workspace; or give it after `--`.
        #[arg(long, required_unless_present = "args", conflicts_with = "args")]
        command: Option<String>,
        /// The command and its arguments, after `--`.
        #[arg(last = true)]
        args: Vec<String>,
        #[arg(long, default_value = "")]
        name: String,
        /// Folder inside the team workspace.
        #[arg(long, default_value = "")]
        workdir: String,
        /// NAME=value, repeatable.
        #[arg(long = "env")]
        env: Vec<String>,
        /// Times a failed run is started again (0–5).
        #[arg(long, default_value_t = 0)]
        retries: u32,
        /// Print its output as it comes and exit with the job.
        #[arg(long, conflicts_with = "array")]
        follow: bool,
        /// A sweep: one job per index in `FIRST-LAST` (e.g. `1-20`), each queued for a GPU
        /// of its own, with `TESSERA_ARRAY_INDEX` set to its index and `[index]` after its
        /// name. Prints one job id per line.
        #[arg(long, requires = "gpu", value_name = "FIRST-LAST")]
        array: Option<String>,
    },
    /// Prints a job's output.
    Logs {
        id: String,
        /// Keep printing until the job ends.
        #[arg(long, short)]
        follow: bool,
    },
    /// Cancels a job (its processes are killed).
    Cancel { id: String },
    /// Your jobs, newest first.
    List,
}

#[derive(Debug, Subcommand)]
pub enum NotebookCommand {
    /// Launches JupyterLab on one of your active allocations (`--allocation`), or with a
    /// GPU of its own (`--gpu`, given back when it stops), and waits until it answers.
    Start {
        #[arg(long, required_unless_present = "gpu", conflicts_with = "gpu")]
        allocation: Option<String>,
        #[command(flatten)]
        own: Box<OwnGpu>,
        #[arg(long, default_value = "default")]
        name: String,
    },
    /// Stops a notebook.
    Stop { id: String },
    /// Your notebooks, newest first.
    List,
}

/// A GPU request of the workload's own.
#[derive(Debug, Clone, Args)]
pub struct OwnGpu {
    /// Queue for a GPU of this kind, e.g. `H100-80GB:1g.10gb` or `H100-80GB:whole`.
    #[arg(long)]
    gpu: Option<String>,
    /// How many of `--gpu`.
    #[arg(long, default_value_t = 1, requires = "gpu")]
    count: u32,
    /// `high`, `normal` or `preemptible`.
    #[arg(long, requires = "gpu")]
    priority: Option<String>,
    /// Longest run in minutes (the GPU is given back then); default: the portal's policy.
    #[arg(long = "time-limit", requires = "gpu")]
    time_limit: Option<u32>,
    /// The team that pays (its id); default: your only team.
    #[arg(long, requires = "gpu")]
    team: Option<String>,
}

impl OwnGpu {
    /// The request body's fields for it (nothing without `--gpu`).
    fn fields(&self, body: &mut Value) {
        let Some(gpu) = &self.gpu else { return };
        body["gpu"] = json!(gpu);
        body["count"] = json!(self.count);
        if let Some(p) = &self.priority {
            body["priority"] = json!(p);
        }
        if let Some(t) = self.time_limit {
            body["time_limit_minutes"] = json!(t);
        }
        if let Some(t) = &self.team {
            body["team_id"] = json!(t);
        }
    }
}

/// Words for `/bin/sh -c`: each argument as it was given (single-quoted where needed).
fn shell_join(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
            if plain {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

/// A refusal or an unreachable server, already worded for the terminal.
pub struct CliError {
    pub code: i32,
    pub message: String,
}

type R<T> = Result<T, CliError>;

fn unreachable(e: reqwest::Error) -> CliError {
    CliError {
        code: 2,
        message: format!("cannot reach the server: {e}"),
    }
}

impl Client {
    fn new(remote: &Remote) -> R<Client> {
        let token = remote.token.clone().ok_or(CliError {
            code: 1,
            message: "set TESSERA_TOKEN (or --token) to a personal API token from My account"
                .into(),
        })?;
        Ok(Client {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .map_err(unreachable)?,
            base: remote.url.trim_end_matches('/').to_owned(),
            token,
        })
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> R<Value> {
        let mut rb = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let resp = rb.send().await.map_err(unreachable)?;
        let status = resp.status();
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(v);
        }
        let message = v["message"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("the server answered {status}"));
        Err(CliError { code: 1, message })
    }
}

fn env_map(vars: &[String]) -> R<serde_json::Map<String, Value>> {
    let mut m = serde_json::Map::new();
    for v in vars {
        let (k, val) = v.split_once('=').ok_or(CliError {
            code: 1,
            message: format!("--env {v}: write NAME=value"),
        })?;
        m.insert(k.to_owned(), Value::String(val.to_owned()));
    }
    Ok(m)
}

fn row(v: &Value) -> String {
    format!(
        "{}  {:<10} {:<24} {}",
        v["id"].as_str().unwrap_or(""),
        v["state"].as_str().unwrap_or(""),
        v["name"].as_str().unwrap_or(""),
        v["exit_code"]
            .as_i64()
            .map(|c| format!("exit {c}"))
            .or_else(|| v["url"].as_str().map(str::to_owned))
            .unwrap_or_default()
    )
}

async fn follow_logs(c: &Client, id: &str, follow: bool) -> R<i32> {
    use std::io::Write;
    let mut from: Option<u64> = Some(0);
    loop {
        let q = from.map(|f| format!("?from={f}")).unwrap_or_default();
        let slice = c
            .call(
                reqwest::Method::GET,
                &format!("/api/v1/workloads/{id}/logs{q}"),
                None,
            )
            .await?;
        let text = slice["text"].as_str().unwrap_or("");
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
        from = slice["next"].as_u64();
        // `complete`: the job ended and all of its output is here.
        if !follow || slice["complete"] == true {
            break;
        }
        if text.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    if !follow {
        return Ok(0);
    }
    let w = c
        .call(
            reqwest::Method::GET,
            &format!("/api/v1/workloads/{id}"),
            None,
        )
        .await?;
    let state = w["state"].as_str().unwrap_or("");
    eprintln!(
        "job {state}{}",
        w["exit_code"]
            .as_i64()
            .map(|c| format!(" (exit code {c})"))
            .unwrap_or_default()
    );
    Ok(if state == "succeeded" { 0 } else { 1 })
}

async fn list(c: &Client, kind: &str) -> R<i32> {
    let page = c
        .call(
            reqwest::Method::GET,
            &format!("/api/v1/workloads?kind={kind}&mine=true&limit=50"),
            None,
        )
        .await?;
    let items = page["items"].as_array().cloned().unwrap_or_default();
    if items.is_empty() {
        println!("no {kind}s yet");
    }
    for v in &items {
        println!("{}", row(v));
    }
    Ok(0)
}

/// Most jobs one `--array` submits.
const ARRAY_MAX: u32 = 1000;

/// `FIRST-LAST` (or one index) as an inclusive range.
fn array_range(spec: &str) -> R<std::ops::RangeInclusive<u32>> {
    let bad = || CliError {
        code: 1,
        message: format!("--array {spec}: write FIRST-LAST, e.g. 1-20 (at most {ARRAY_MAX} jobs)"),
    };
    let (a, b) = spec.split_once('-').unwrap_or((spec, spec));
    let (a, b): (u32, u32) = (
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    );
    if b < a || b - a >= ARRAY_MAX {
        return Err(bad());
    }
    Ok(a..=b)
}

/// Submits one job per index of `spec`, each with `TESSERA_ARRAY_INDEX`.
async fn submit_array(c: &Client, body: Value, spec: &str) -> R<i32> {
    let range = array_range(spec)?;
    let base = match body["name"].as_str().filter(|n| !n.is_empty()) {
        Some(n) => n.to_owned(),
        None => body["command"]
            .as_str()
            .unwrap_or("job")
            .chars()
            .take(40)
            .collect(),
    };
    let total = range.clone().count();
    for (n, i) in range.enumerate() {
        let mut one = body.clone();
        one["name"] = json!(format!("{base}[{i}]"));
        one["array_index"] = json!(i);
        let v = c
            .call(reqwest::Method::POST, "/api/v1/jobs", Some(one))
            .await
            .map_err(|e| CliError {
                code: e.code,
                message: format!(
                    "{} (after {n} of {total} array jobs were submitted)",
                    e.message
                ),
            })?;
        println!("{}", v["id"].as_str().unwrap_or(""));
    }
    eprintln!(
        "submitted {total} jobs; each runs when its GPU is free and gives it back at its end"
    );
    Ok(0)
}

/// Stops a notebook or cancels a job.
async fn stop(c: &Client, id: &str) -> R<i32> {
    let v = c
        .call(
            reqwest::Method::POST,
            &format!("/api/v1/workloads/{id}/stop"),
            None,
        )
        .await?;
    println!("{}", row(&v));
    Ok(0)
}

pub async fn job(remote: &Remote, cmd: JobCommand) -> R<i32> {
    let c = Client::new(remote)?;
    match cmd {
        JobCommand::Submit {
            allocation,
            own,
            command,
            args,
            name,
            workdir,
            env,
            retries,
            follow,
            array,
        } => {
            let command = command.unwrap_or_else(|| shell_join(&args));
            let mut body = json!({"allocation_id": allocation, "command": command, "name": name,
                "workdir": workdir, "env": env_map(&env)?, "retries": retries});
            own.fields(&mut body);
            if let Some(range) = array {
                return submit_array(&c, body, &range).await;
            }
            let v = c
                .call(reqwest::Method::POST, "/api/v1/jobs", Some(body))
                .await?;
            let id = v["id"].as_str().unwrap_or("").to_owned();
            match v["waiting"].as_str() {
                Some(why) => eprintln!("queued job {id}: {why}"),
                None => eprintln!("submitted job {id}"),
            }
            if follow {
                return follow_logs(&c, &id, true).await;
            }
            println!("{id}");
            Ok(0)
        }
        JobCommand::Logs { id, follow } => follow_logs(&c, &id, follow).await,
        JobCommand::Cancel { id } => stop(&c, &id).await,
        JobCommand::List => list(&c, "job").await,
    }
}

pub async fn notebook(remote: &Remote, cmd: NotebookCommand) -> R<i32> {
    let c = Client::new(remote)?;
    match cmd {
        NotebookCommand::Start {
            allocation,
            own,
            name,
        } => {
            let mut body = json!({"allocation_id": allocation, "name": name});
            own.fields(&mut body);
            let v = c
                .call(reqwest::Method::POST, "/api/v1/notebooks", Some(body))
                .await?;
            let id = v["id"].as_str().unwrap_or("").to_owned();
            eprintln!("notebook {id} is starting");
            let mut deadline = std::time::Instant::now() + Duration::from_secs(300);
            let mut told = String::new();
            loop {
                let w = c
                    .call(
                        reqwest::Method::GET,
                        &format!("/api/v1/workloads/{id}"),
                        None,
                    )
                    .await?;
                match w["state"].as_str().unwrap_or("") {
                    "running" => {
                        println!("{}{}", c.base, w["url"].as_str().unwrap_or(""));
                        return Ok(0);
                    }
                    "pending" | "starting" if std::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    // Waiting for its GPU takes as long as the queue: no deadline (Ctrl-C
                    // leaves it queued; `tessera notebook stop ID` gives the request up).
                    "queued" => {
                        let why = w["waiting"].as_str().unwrap_or("waiting for its GPU");
                        if why != told {
                            eprintln!("waiting: {why}");
                            told = why.to_owned();
                        }
                        deadline = std::time::Instant::now() + Duration::from_secs(300);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    other => {
                        return Err(CliError {
                            code: 1,
                            message: format!(
                                "the notebook is {other}: {}",
                                w["message"].as_str().unwrap_or("see its page for the log")
                            ),
                        });
                    }
                }
            }
        }
        NotebookCommand::Stop { id } => stop(&c, &id).await,
        NotebookCommand::List => list(&c, "notebook").await,
    }
}

#[cfg(test)]
mod tests {
    use super::{array_range, shell_join};

    #[test]
    fn array_ranges_are_inclusive_and_bounded() {
        assert_eq!(array_range("1-20").ok(), Some(1..=20));
        assert_eq!(array_range("7").ok(), Some(7..=7));
        assert_eq!(array_range("0-999").ok(), Some(0..=999));
        for bad in ["20-1", "1-1001", "a-3", "", "-"] {
            assert!(array_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn trailing_arguments_reach_the_shell_as_given() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            shell_join(&args(&["python", "train.py", "--lr=0.1"])),
            "python train.py --lr=0.1"
        );
        assert_eq!(
            shell_join(&args(&["echo", "two words", "it's", "$HOME", ""])),
            "echo 'two words' 'it'\\''s' '$HOME' ''"
        );
    }
}
