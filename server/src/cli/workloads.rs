//! `tessera job …` and `tessera notebook …`: jobs and notebooks, decoded into
//! [`WorkloadView`].

use super::{CliError, Client, Output, R, Remote, Tabular, encode, exit, opt, print, word};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use std::time::Duration;
use tessera_domain::tenancy::Page;
use tessera_domain::workload::{LogSlice, WorkloadState, WorkloadView};

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
        /// Run in an image of your team's catalog (its id, name or pinned reference; see
        /// `tessera image list`) instead of the node's environment.
        #[arg(long)]
        image: Option<String>,
        #[command(flatten)]
        gang: Box<GangArgs>,
    },
    /// Prints a job's output.
    Logs {
        id: String,
        /// Keep printing until the job ends.
        #[arg(long, short)]
        follow: bool,
        /// A multi-node job's member (default 0).
        #[arg(long, default_value_t = 0)]
        rank: u32,
    },
    /// Cancels a job (its processes are killed).
    #[command(alias = "cancel")]
    Stop { id: String },
    /// Your jobs, newest first.
    List(ListArgs),
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
        /// Run JupyterLab from an image of your team's catalog (id, name or pinned
        /// reference); the image must have it installed.
        #[arg(long)]
        image: Option<String>,
    },
    /// Prints the address of a running notebook (through the portal).
    Open { id: String },
    /// Stops a notebook.
    Stop { id: String },
    /// Your notebooks, newest first.
    List(ListArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Every one you may see (your teams'; platform admins: all), not only your own.
    #[arg(long)]
    all: bool,
    #[arg(long, default_value_t = 50)]
    limit: u32,
    #[arg(long, default_value_t = 0)]
    offset: u32,
}

/// A job on several nodes at once.
#[derive(Debug, Clone, Args)]
pub struct GangArgs {
    /// Run on this many nodes at once (a gang, placed all together or not at all),
    /// each with `--gpus-per-node` of `--gpu`:
    /// `tessera job submit --gpu H100-80GB --nodes 2 --gpus-per-node 8 -- torchrun train.py`.
    #[arg(long, requires = "gpu", conflicts_with = "array")]
    nodes: Option<u32>,
    /// With `--nodes`: how many of `--gpu` each node gets (default `--count`).
    #[arg(long = "gpus-per-node", requires = "nodes")]
    gpus_per_node: Option<u32>,
    /// With `--nodes`: `each` (every node runs the command; torchrun, JAX) or `rank0`
    /// (only rank 0 runs it: `mpirun --hostfile $TESSERA_HOSTFILE …`).
    #[arg(long, requires = "nodes")]
    launcher: Option<String>,
    /// With `--nodes`: `per-node` (default; one process per node, e.g. torchrun) or
    /// `per-gpu` (one process per GPU, each with its own RANK, LOCAL_RANK and device).
    #[arg(long, requires = "nodes")]
    ranks: Option<String>,
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

fn env_map(vars: &[String]) -> R<serde_json::Map<String, Value>> {
    let mut m = serde_json::Map::new();
    for v in vars {
        let (k, val) = v.split_once('=').ok_or(CliError {
            code: exit::REFUSED,
            message: format!("--env {v}: write NAME=value"),
        })?;
        m.insert(k.to_owned(), Value::String(val.to_owned()));
    }
    Ok(m)
}

impl Tabular for WorkloadView {
    const HEADER: &'static [&'static str] = &["id", "state", "name", "team", "exit", "url"];
    fn cells(&self) -> Vec<String> {
        vec![
            self.id.to_string(),
            word(&self.state),
            self.name.clone(),
            self.team_name.clone(),
            opt(self.exit_code),
            self.url.clone().unwrap_or_default(),
        ]
    }
}

async fn follow_logs(c: &Client, id: &str, follow: bool, rank: u32) -> R<i32> {
    use std::io::Write;
    let mut from = 0;
    loop {
        let slice: LogSlice = c
            .get(&format!(
                "/api/v1/workloads/{}/logs?from={from}&rank={rank}",
                encode(id)
            ))
            .await?;
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(slice.text.as_bytes());
        let _ = out.flush();
        from = slice.next;
        // `complete`: the job ended and all of its output is here.
        if !follow || slice.complete {
            break;
        }
        if slice.text.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    if !follow {
        return Ok(0);
    }
    let w: WorkloadView = c.get(&format!("/api/v1/workloads/{}", encode(id))).await?;
    eprintln!(
        "job {}{}",
        word(&w.state),
        w.exit_code
            .map(|c| format!(" (exit code {c})"))
            .unwrap_or_default()
    );
    Ok(if w.state == WorkloadState::Succeeded {
        0
    } else {
        exit::REFUSED
    })
}

async fn list(c: &Client, kind: &str, args: &ListArgs) -> R<i32> {
    let page: Page<WorkloadView> = c
        .get(&format!(
            "/api/v1/workloads?kind={kind}&mine={}&limit={}&offset={}",
            !args.all, args.limit, args.offset
        ))
        .await?;
    print(c.output, &page, &page.items, &format!("no {kind}s yet"))
}

/// Most jobs one `--array` submits.
const ARRAY_MAX: u32 = 1000;

/// `FIRST-LAST` (or one index) as an inclusive range.
fn array_range(spec: &str) -> R<std::ops::RangeInclusive<u32>> {
    let bad = || CliError {
        code: exit::REFUSED,
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
    let mut submitted = Vec::new();
    for (n, i) in range.enumerate() {
        let mut one = body.clone();
        one["name"] = json!(format!("{base}[{i}]"));
        one["array_index"] = json!(i);
        let v: WorkloadView = c
            .call(reqwest::Method::POST, "/api/v1/jobs", Some(one))
            .await
            .map_err(|e| CliError {
                code: e.code,
                message: format!(
                    "{} (after {n} of {total} array jobs were submitted)",
                    e.message
                ),
            })?;
        if c.output != Output::Json {
            println!("{}", v.id);
        }
        submitted.push(v);
    }
    if c.output == Output::Json {
        print::<_, WorkloadView>(Output::Json, &submitted, &[], "")?;
    }
    eprintln!(
        "submitted {total} jobs; each runs when its GPU is free and gives it back at its end"
    );
    Ok(0)
}

/// Stops a notebook or cancels a job.
async fn stop(c: &Client, id: &str) -> R<i32> {
    let v: WorkloadView = c
        .call(
            reqwest::Method::POST,
            &format!("/api/v1/workloads/{}/stop", encode(id)),
            None,
        )
        .await?;
    print(c.output, &v, std::slice::from_ref(&v), "")
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
            image,
            gang,
        } => {
            let GangArgs {
                nodes,
                gpus_per_node,
                launcher,
                ranks,
            } = *gang;
            let command = command.unwrap_or_else(|| shell_join(&args));
            let mut body = json!({"allocation_id": allocation, "command": command, "name": name,
                "workdir": workdir, "env": env_map(&env)?, "retries": retries, "image": image});
            own.fields(&mut body);
            if let Some(n) = nodes {
                body["nodes"] = json!(n);
                if let Some(g) = gpus_per_node {
                    body["count"] = json!(g);
                }
                if let Some(l) = launcher {
                    body["launcher"] = json!(l);
                }
                if let Some(r) = ranks {
                    body["ranks"] = json!(r.replace('-', "_"));
                }
            }
            if let Some(range) = array {
                return submit_array(&c, body, &range).await;
            }
            let v: WorkloadView = c
                .call(reqwest::Method::POST, "/api/v1/jobs", Some(body))
                .await?;
            match &v.waiting {
                Some(why) => eprintln!("queued job {}: {why}", v.id),
                None => eprintln!("submitted job {}", v.id),
            }
            if follow {
                return follow_logs(&c, &v.id.to_string(), true, 0).await;
            }
            match c.output {
                Output::Table => println!("{}", v.id),
                output => {
                    print(output, &v, std::slice::from_ref(&v), "")?;
                }
            }
            Ok(0)
        }
        JobCommand::Logs { id, follow, rank } => follow_logs(&c, &id, follow, rank).await,
        JobCommand::Stop { id } => stop(&c, &id).await,
        JobCommand::List(args) => list(&c, "job", &args).await,
    }
}

pub async fn notebook(remote: &Remote, cmd: NotebookCommand) -> R<i32> {
    let c = Client::new(remote)?;
    match cmd {
        NotebookCommand::Start {
            allocation,
            own,
            name,
            image,
        } => {
            let mut body = json!({"allocation_id": allocation, "name": name, "image": image});
            own.fields(&mut body);
            let v: WorkloadView = c
                .call(reqwest::Method::POST, "/api/v1/notebooks", Some(body))
                .await?;
            let id = v.id;
            eprintln!("notebook {id} is starting");
            let mut deadline = std::time::Instant::now() + Duration::from_secs(300);
            let mut told = String::new();
            loop {
                let w: WorkloadView = c.get(&format!("/api/v1/workloads/{id}")).await?;
                match w.state {
                    WorkloadState::Running => return opened(&c, &w),
                    WorkloadState::Pending | WorkloadState::Starting
                        if std::time::Instant::now() < deadline =>
                    {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    // Waiting for its GPU takes as long as the queue: no deadline (Ctrl-C
                    // leaves it queued; `tessera notebook stop ID` gives the request up).
                    WorkloadState::Queued => {
                        let why = w.waiting.as_deref().unwrap_or("waiting for its GPU");
                        if why != told {
                            eprintln!("waiting: {why}");
                            told = why.to_owned();
                        }
                        deadline = std::time::Instant::now() + Duration::from_secs(300);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    other => {
                        return Err(CliError {
                            code: exit::REFUSED,
                            message: format!(
                                "the notebook is {}: {}",
                                word(&other),
                                w.message.as_deref().unwrap_or("see its page for the log")
                            ),
                        });
                    }
                }
            }
        }
        NotebookCommand::Open { id } => {
            let w: WorkloadView = c.get(&format!("/api/v1/workloads/{}", encode(&id))).await?;
            if w.state != WorkloadState::Running {
                return Err(CliError {
                    code: exit::REFUSED,
                    message: format!("the notebook is {}, not running", word(&w.state)),
                });
            }
            opened(&c, &w)
        }
        NotebookCommand::Stop { id } => stop(&c, &id).await,
        NotebookCommand::List(args) => list(&c, "notebook", &args).await,
    }
}

/// A running notebook: its address (JSON: its view).
fn opened(c: &Client, w: &WorkloadView) -> R<i32> {
    match c.output {
        Output::Json => print(Output::Json, w, std::slice::from_ref(w), ""),
        _ => {
            println!("{}{}", c.base, w.url.as_deref().unwrap_or(""));
            Ok(0)
        }
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
