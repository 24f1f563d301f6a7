//! `tessera exec [--rank R] [-i] [-t] JOB -- COMMAND…`: runs a command inside a running
//! workload through `GET /api/v1/workloads/{id}/exec` (a WebSocket of
//! `tessera_domain::wire::exec_frame`s) and exits with its exit code. `-i` forwards
//! standard input (without it the command's input is closed at once); `-t` gives it a
//! terminal, puts this one in raw mode while it runs and sends its size when it changes.

use super::{CliError, Client, R, Remote, code_for, encode, exit, unreachable};
use clap::Args;
use futures_util::{SinkExt, StreamExt};
use std::io::{IsTerminal, Read, Write};
use tessera_domain::wire::exec_frame::{self, Channel};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

#[derive(Debug, Clone, Args)]
pub struct ExecArgs {
    /// The rank of a multi-node job to run it in (0: the job itself).
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    /// Forward standard input to the command.
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Give the command a terminal (with -i: an interactive shell, `-it JOB -- bash`).
    #[arg(short = 't', long)]
    pub tty: bool,
    /// The job's (or notebook's) id.
    pub id: String,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Puts the terminal back as it was when dropped.
struct RawMode(String);

impl RawMode {
    fn enter() -> Option<RawMode> {
        let saved = stty(&["-g"])?;
        stty(&["raw", "-echo"])?;
        Some(RawMode(saved.trim().to_owned()))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = stty(&[&self.0]);
    }
}

/// Runs `stty` on this process's terminal; its output when it succeeds.
fn stty(args: &[&str]) -> Option<String> {
    let tty = std::fs::File::open("/dev/tty").ok()?;
    let out = std::process::Command::new("stty")
        .args(args)
        .stdin(tty)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The terminal's size as (cols, rows).
fn terminal_size() -> Option<(u16, u16)> {
    let s = stty(&["size"])?;
    let mut it = s.split_whitespace().map(str::parse::<u16>);
    let (Some(Ok(rows)), Some(Ok(cols))) = (it.next(), it.next()) else {
        return None;
    };
    Some((cols, rows))
}

pub async fn exec(remote: &Remote, args: ExecArgs) -> R<i32> {
    let c = Client::new(remote)?;
    let mut query: Vec<String> = args
        .command
        .iter()
        .map(|a| format!("command={}", encode(a)))
        .collect();
    query.push(format!("tty={}", args.tty));
    query.push(format!("rank={}", args.rank));
    let path = format!(
        "/api/v1/workloads/{}/exec?{}",
        encode(&args.id),
        query.join("&")
    );
    let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
    let request = c
        .http
        .get(format!("{}{path}", c.base))
        .bearer_auth(&c.token);
    let resp = exec_frame::upgrade_headers(key)
        .into_iter()
        .fold(request, |r, (name, value)| r.header(name, value))
        .send()
        .await
        .map_err(unreachable)?;
    let status = resp.status();
    if status != reqwest::StatusCode::SWITCHING_PROTOCOLS {
        let mut message = super::error_message(resp).await;
        if status == reqwest::StatusCode::NOT_FOUND {
            message = format!(
                "{message}: job {} (no such job, or not one you may see)",
                args.id
            );
        }
        return Err(CliError {
            code: if status.is_success() {
                exit::SERVER_FAILED
            } else {
                code_for(status)
            },
            message,
        });
    }
    let upgraded = resp.upgrade().await.map_err(unreachable)?;
    let ws = WebSocketStream::from_raw_socket(upgraded, Role::Client, None).await;
    let (mut tx, mut rx) = ws.split();

    let local_tty = args.tty && std::io::stdin().is_terminal();
    let raw = if local_tty { RawMode::enter() } else { None };
    let (input, mut inputs) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    if args.stdin {
        // A thread of its own: reading a terminal blocks.
        let input = input.clone();
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 8192];
            loop {
                let n = stdin.read(&mut buf).unwrap_or(0);
                let frame = exec_frame::encode(Channel::Stdin, &buf[..n]);
                if input.blocking_send(frame).is_err() || n == 0 {
                    return;
                }
            }
        });
    } else {
        let _ = input.send(exec_frame::encode(Channel::Stdin, b"")).await;
    }
    if local_tty && let Some((cols, rows)) = terminal_size() {
        let _ = input.send(exec_frame::resize(cols, rows)).await;
    }
    drop(input);
    let mut winch = if local_tty {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok()
    } else {
        None
    };

    let mut code = None;
    let mut inputs_open = true;
    loop {
        tokio::select! {
            frame = inputs.recv(), if inputs_open => match frame {
                Some(f) => {
                    if tx.send(Message::Binary(f.into())).await.is_err() {
                        break;
                    }
                }
                None => inputs_open = false,
            },
            Some(()) = async { match winch.as_mut() { Some(w) => w.recv().await, None => None } } => {
                if let Some((cols, rows)) = terminal_size() {
                    let _ = tx.send(Message::Binary(exec_frame::resize(cols, rows).into())).await;
                }
            }
            m = rx.next() => match m {
                Some(Ok(Message::Binary(b))) => match exec_frame::decode(&b) {
                    Some((Channel::Stdout, data)) => {
                        let mut out = std::io::stdout().lock();
                        let _ = out.write_all(data).and_then(|()| out.flush());
                    }
                    Some((Channel::Stderr, data)) => {
                        let mut err = std::io::stderr().lock();
                        let _ = err.write_all(data).and_then(|()| err.flush());
                    }
                    Some((Channel::Exit, json)) => {
                        code = exec_frame::exit_code(json);
                    }
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    drop(raw);
    let _ = tx.send(Message::Close(None)).await;
    match code {
        Some(code) => Ok(code.clamp(0, 255)),
        None => Err(CliError {
            code: exit::REFUSED,
            message: "the session ended without the command's exit status".into(),
        }),
    }
}
