//! `tessera exec` on the node: a command run inside a running workload, streamed over a
//! WebSocket the agent opens back to the server (`GET /agent/v1/exec/{session}`; the
//! frames are `tessera_domain::wire::exec_frame`).
//!
//! In a sandbox the command joins the workload's container through `crun exec
//! --process`, with the container's own process settings (its uid, environment,
//! working folder, no capabilities, `no_new_privs`, rlimits) and only the arguments and
//! `terminal` changed; with a terminal, crun hands the pseudo-terminal's master over a
//! console socket. Without the sandbox it is a plain process with the workload's
//! environment and working folder (read from its process). When the WebSocket closes
//! the command is killed.
//!
//! Unsafe code: the few libc calls a terminal needs (openpty, the console socket's
//! `SCM_RIGHTS`, `TIOCSWINSZ`, `TIOCSCTTY`) and kill(2); each says why it is sound.
#![allow(unsafe_code)]

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tessera_domain::wire::{ExecRequest, exec_frame};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

/// The connection to the server a session runs over (an upgraded HTTP connection).
pub trait ExecIo: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> ExecIo for T {}
pub type ExecStream = Box<dyn ExecIo>;

/// Exit code reported when the command could not be started at all.
pub const NOT_STARTED: i32 = 126;

/// Where a session's command runs.
#[derive(Debug, Clone)]
pub enum Target {
    /// Inside a crun container.
    Container {
        runtime: PathBuf,
        root: PathBuf,
        id: String,
        /// The container's bundle (its `config.json` gives the process settings).
        bundle: PathBuf,
    },
    /// Beside a workload that runs without the sandbox: its process `pid`.
    Process { pid: u32 },
}

/// The sessions this agent has taken (each is offered until it is taken).
#[derive(Default)]
pub struct Sessions {
    seen: std::collections::HashSet<String>,
}

impl Sessions {
    /// Whether `session` is new (and remembers it).
    pub fn first_time(&mut self, session: &str) -> bool {
        if self.seen.len() > 10_000 {
            self.seen.clear();
        }
        self.seen.insert(session.to_owned())
    }
}

/// Runs one session on `stream` until the command ends or the socket closes.
pub async fn serve(stream: ExecStream, target: Result<Target, String>, req: ExecRequest) {
    let ws = WebSocketStream::from_raw_socket(stream, Role::Client, None).await;
    let (mut tx, mut rx) = ws.split();
    let (out, mut outq) = mpsc::channel::<Vec<u8>>(64);
    let writer = tokio::spawn(async move {
        while let Some(frame) = outq.recv().await {
            if tx.send(Message::Binary(frame.into())).await.is_err() {
                break;
            }
        }
        let _ = tx.send(Message::Close(None)).await;
    });
    let started = match target {
        Ok(t) => start(&t, &req).await,
        Err(e) => Err(e),
    };
    let mut running = match started {
        Ok(r) => r,
        Err(msg) => {
            tracing::info!(session = req.session, error = msg, "exec: not started");
            let _ = out.send(stderr_frame(&format!("tessera: {msg}\n"))).await;
            let _ = out.send(exec_frame::exit(NOT_STARTED)).await;
            drop(out);
            let _ = writer.await;
            return;
        }
    };
    let mut readers = Vec::new();
    for (channel, source) in running.outputs.drain(..) {
        readers.push(tokio::spawn(pump(source, channel, out.clone())));
    }
    let mut input = running.input.take();
    let code = loop {
        tokio::select! {
            status = running.child.wait() => {
                break status.map_or(NOT_STARTED, code_of);
            }
            m = rx.next() => match m {
                Some(Ok(Message::Binary(b))) => match exec_frame::decode(&b) {
                    Some((exec_frame::Channel::Stdin, data)) => {
                        if data.is_empty() {
                            input = None;
                        } else if let Some(i) = input.as_mut()
                            && i.write_all(data).await.and(i.flush().await).is_err()
                        {
                            input = None;
                        }
                    }
                    Some((exec_frame::Channel::Resize, json)) => {
                        if let (Some(fd), Ok(r)) = (
                            running.master.as_ref(),
                            serde_json::from_slice::<exec_frame::Resize>(json),
                        ) {
                            resize(fd.as_raw_fd(), r);
                        }
                    }
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                    // The user went away: the command goes too.
                    running.kill();
                    let _ = running.child.wait().await;
                    drop(out);
                    for r in readers {
                        r.abort();
                    }
                    writer.abort();
                    running.clean();
                    return;
                }
                Some(Ok(_)) => {}
            },
        }
    };
    drop(input);
    // What the command wrote before it ended still goes out; output held open by
    // something it left running does not hold the session.
    for r in readers {
        let _ = tokio::time::timeout(Duration::from_secs(2), r).await;
    }
    running.clean();
    let _ = out.send(exec_frame::exit(code)).await;
    drop(out);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
}

fn stderr_frame(msg: &str) -> Vec<u8> {
    exec_frame::encode(exec_frame::Channel::Stderr, msg.as_bytes())
}

fn code_of(s: ExitStatus) -> i32 {
    s.code()
        .or_else(|| s.signal().map(|n| 128 + n))
        .unwrap_or(NOT_STARTED)
}

/// Copies `source` into frames of `channel` until it ends (a terminal's master ends
/// with EIO once nothing holds its other side).
async fn pump(
    mut source: Box<dyn AsyncRead + Unpin + Send>,
    channel: exec_frame::Channel,
    out: mpsc::Sender<Vec<u8>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match source.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if out
                    .send(exec_frame::encode(channel, &buf[..n]))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

/// A started command.
struct Running {
    child: tokio::process::Child,
    input: Option<Box<dyn AsyncWrite + Unpin + Send>>,
    outputs: Vec<(exec_frame::Channel, Box<dyn AsyncRead + Unpin + Send>)>,
    /// The terminal's master, for resizes.
    master: Option<OwnedFd>,
    /// Where crun writes the command's pid on the host (containers).
    pid_file: Option<PathBuf>,
    /// The command's own process group (plain processes).
    group: Option<u32>,
    /// Files of the session to remove at the end.
    scratch: Vec<PathBuf>,
}

impl Running {
    fn kill(&mut self) {
        if let Some(pid) = self
            .pid_file
            .as_ref()
            .and_then(|p| fs::read_to_string(p).ok())
            .and_then(|s| s.trim().parse::<i32>().ok())
            .filter(|&p| p > 1)
        {
            // SAFETY: kill(2) takes no pointers.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        if let Some(g) = self
            .group
            .and_then(|g| i32::try_from(g).ok())
            .filter(|&g| g > 1)
        {
            // SAFETY: as above; a negative pid names the process group.
            unsafe {
                libc::kill(-g, libc::SIGKILL);
            }
        }
        let _ = self.child.start_kill();
    }

    fn clean(&mut self) {
        for p in self.scratch.drain(..) {
            if p.is_dir() {
                let _ = fs::remove_dir_all(&p);
            } else {
                let _ = fs::remove_file(&p);
            }
        }
    }
}

async fn start(target: &Target, req: &ExecRequest) -> Result<Running, String> {
    if req.argv.is_empty() {
        return Err("no command given".into());
    }
    match target {
        Target::Container {
            runtime,
            root,
            id,
            bundle,
        } => start_in_container(runtime, root, id, bundle, req).await,
        Target::Process { pid } => start_beside(*pid, req),
    }
}

/// The container's own process settings with `argv` and `terminal` replaced.
pub fn exec_process(
    config: &serde_json::Value,
    argv: &[String],
    tty: bool,
) -> Option<serde_json::Value> {
    let mut process = config.get("process")?.clone();
    let obj = process.as_object_mut()?;
    obj.insert("args".into(), serde_json::json!(argv));
    obj.insert("terminal".into(), serde_json::json!(tty));
    obj.remove("consoleSize");
    Some(process)
}

async fn start_in_container(
    runtime: &Path,
    root: &Path,
    id: &str,
    bundle: &Path,
    req: &ExecRequest,
) -> Result<Running, String> {
    let config: serde_json::Value = fs::read(bundle.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or("the workload's sandbox settings cannot be read")?;
    let process =
        exec_process(&config, &req.argv, req.tty).ok_or("the workload's sandbox has no process")?;
    // Private to the agent (root, 0700): the process settings hold the workload's
    // environment, the socket hands over its terminal.
    let dir = private_dir(&req.session)?;
    let process_file = dir.join("process.json");
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&process_file)
        .and_then(|mut f| {
            io::Write::write_all(
                &mut f,
                &serde_json::to_vec(&process).map_err(io::Error::other)?,
            )
        })
        .map_err(|e| format!("cannot write the exec settings: {e}"))?;
    let pid_file = dir.join("pid");
    let mut cmd = tokio::process::Command::new(runtime);
    cmd.arg("--root")
        .arg(root)
        .arg("exec")
        .arg("--process")
        .arg(&process_file)
        .arg("--pid-file")
        .arg(&pid_file);
    let console = if req.tty {
        let sock = dir.join("console.sock");
        let listener = tokio::net::UnixListener::bind(&sock)
            .map_err(|e| format!("cannot open the console socket: {e}"))?;
        cmd.arg("--console-socket").arg(&sock);
        Some(listener)
    } else {
        None
    };
    cmd.arg(id)
        .env_clear()
        .stdin(if req.tty {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run `{}`: {e}", runtime.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut running = Running {
        input: None,
        outputs: Vec::new(),
        master: None,
        pid_file: Some(pid_file),
        group: None,
        scratch: vec![dir],
        child,
    };
    match console {
        None => {
            running.input = child_input(&mut running.child);
            running
                .outputs
                .push((exec_frame::Channel::Stdout, Box::new(stdout)));
            running
                .outputs
                .push((exec_frame::Channel::Stderr, Box::new(stderr)));
        }
        Some(listener) => {
            // crun's own complaints (a bad command) go out as stderr.
            running
                .outputs
                .push((exec_frame::Channel::Stderr, Box::new(stdout)));
            running
                .outputs
                .push((exec_frame::Channel::Stderr, Box::new(stderr)));
            let master = tokio::select! {
                m = receive_master(&listener) => m,
                s = running.child.wait() => {
                    // It ended before handing the terminal over: its stderr says why.
                    return finished_early(running, s);
                }
            };
            let master = match master {
                Ok(m) => m,
                Err(e) => {
                    running.kill();
                    running.clean();
                    return Err(format!("no terminal from the sandbox: {e}"));
                }
            };
            attach_master(&mut running, master)?;
        }
    }
    Ok(running)
}

/// crun ended before the terminal was handed over: keep its output and status, with no
/// terminal (the session then reports them).
fn finished_early(running: Running, _status: io::Result<ExitStatus>) -> Result<Running, String> {
    Ok(running)
}

/// Gives the session the terminal's master: its output, its input, its size.
fn attach_master(running: &mut Running, master: OwnedFd) -> Result<(), String> {
    let reader = master
        .try_clone()
        .map_err(|e| format!("cannot use the terminal: {e}"))?;
    let writer = master
        .try_clone()
        .map_err(|e| format!("cannot use the terminal: {e}"))?;
    running.outputs.insert(
        0,
        (
            exec_frame::Channel::Stdout,
            Box::new(tokio::fs::File::from_std(fs::File::from(reader))),
        ),
    );
    running.input = Some(Box::new(tokio::fs::File::from_std(fs::File::from(writer))));
    running.master = Some(master);
    Ok(())
}

fn child_input(child: &mut tokio::process::Child) -> Option<Box<dyn AsyncWrite + Unpin + Send>> {
    child
        .stdin
        .take()
        .map(|s| Box::new(s) as Box<dyn AsyncWrite + Unpin + Send>)
}

/// A fresh folder only root can enter, with a short path (a socket's path must fit
/// in 108 bytes).
fn private_dir(session: &str) -> Result<PathBuf, String> {
    let name: String = session
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(32)
        .collect();
    let dir = std::env::temp_dir().join(format!("tessera-exec-{name}"));
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("cannot create a folder for the session: {e}"))?;
    Ok(dir)
}

/// Accepts crun's connection on the console socket and takes the master it sends.
async fn receive_master(listener: &tokio::net::UnixListener) -> io::Result<OwnedFd> {
    let (stream, _) = tokio::time::timeout(Duration::from_secs(20), listener.accept())
        .await
        .map_err(|_| io::Error::other("the runtime did not connect"))??;
    let std = stream.into_std()?;
    std.set_nonblocking(false)?;
    tokio::task::spawn_blocking(move || receive_fd(std.as_raw_fd()))
        .await
        .map_err(io::Error::other)?
}

/// One file descriptor passed as `SCM_RIGHTS` on the socket `sock`.
fn receive_fd(sock: RawFd) -> io::Result<OwnedFd> {
    let mut data = [0u8; 256];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // Room for one descriptor's control message, aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` points at live buffers of the sizes it gives.
    let n = unsafe { libc::recvmsg(sock, &raw mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled within its length.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let fd: RawFd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                return Ok(OwnedFd::from_raw_fd(fd));
            }
            c = libc::CMSG_NXTHDR(&raw const msg, c);
        }
    }
    Err(io::Error::other("no terminal descriptor in the message"))
}

/// Sets the terminal's size.
fn resize(master: RawFd, r: exec_frame::Resize) {
    let ws = libc::winsize {
        ws_row: r.rows,
        ws_col: r.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer given.
    unsafe {
        libc::ioctl(master, libc::TIOCSWINSZ, &raw const ws);
    }
}

/// The environment of process `pid` (`/proc/<pid>/environ`).
fn environ_of(pid: u32) -> io::Result<Vec<(OsString, OsString)>> {
    use std::os::unix::ffi::OsStrExt;
    let raw = fs::read(format!("/proc/{pid}/environ"))?;
    Ok(raw
        .split(|&b| b == 0)
        .filter_map(|kv| {
            let eq = kv.iter().position(|&b| b == b'=')?;
            Some((
                std::ffi::OsStr::from_bytes(&kv[..eq]).to_owned(),
                std::ffi::OsStr::from_bytes(&kv[eq + 1..]).to_owned(),
            ))
        })
        .collect())
}

/// A workload without the sandbox: the command as a plain process with its
/// environment, in its working folder.
fn start_beside(pid: u32, req: &ExecRequest) -> Result<Running, String> {
    let env =
        environ_of(pid).map_err(|e| format!("cannot read the workload's environment: {e}"))?;
    let cwd = fs::read_link(format!("/proc/{pid}/cwd"))
        .map_err(|e| format!("cannot find the workload's working folder: {e}"))?;
    let mut cmd = tokio::process::Command::new(&req.argv[0]);
    cmd.args(&req.argv[1..])
        .env_clear()
        .envs(env)
        .current_dir(cwd)
        .kill_on_drop(true);
    if !req.tty {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run `{}`: {e}", req.argv[0]))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let group = child.id();
        let input = child_input(&mut child);
        return Ok(Running {
            child,
            input,
            outputs: vec![
                (exec_frame::Channel::Stdout, Box::new(stdout)),
                (exec_frame::Channel::Stderr, Box::new(stderr)),
            ],
            master: None,
            pid_file: None,
            group,
            scratch: Vec::new(),
        });
    }
    let (master, slave) = open_pty().map_err(|e| format!("cannot open a terminal: {e}"))?;
    let stdio = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
    let (i, o, e) = (stdio(&slave), stdio(&slave), stdio(&slave));
    let (Ok(i), Ok(o), Ok(e)) = (i, o, e) else {
        return Err("cannot use the terminal".into());
    };
    cmd.stdin(i).stdout(o).stderr(e);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot run `{}`: {e}", req.argv[0]))?;
    drop(slave);
    let group = child.id();
    let mut running = Running {
        child,
        input: None,
        outputs: Vec::new(),
        master: None,
        pid_file: None,
        group,
        scratch: Vec::new(),
    };
    attach_master(&mut running, master)?;
    Ok(running)
}

fn open_pty() -> io::Result<(OwnedFd, OwnedFd)> {
    let (mut master, mut slave): (RawFd, RawFd) = (-1, -1);
    // SAFETY: openpty writes two descriptors; name, termios and winsize may be null.
    let r = unsafe {
        libc::openpty(
            &raw mut master,
            &raw mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openpty succeeded: both are open descriptors we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn exec_keeps_the_containers_process_settings() {
        let config = serde_json::json!({"process": {
            "args": ["/bin/sh", "-c", "wrapper"], "terminal": false,
            "user": {"uid": 2001, "gid": 2001}, "env": ["A=1"], "cwd": "/w",
            "noNewPrivileges": true, "consoleSize": {"height": 1, "width": 2}}});
        let p = exec_process(&config, &["bash".into(), "-l".into()], true).unwrap();
        assert_eq!(p["args"], serde_json::json!(["bash", "-l"]));
        assert_eq!(p["terminal"], true);
        assert_eq!(p["user"]["uid"], 2001);
        assert_eq!(p["env"], serde_json::json!(["A=1"]));
        assert_eq!(p["noNewPrivileges"], true);
        assert!(p.get("consoleSize").is_none());
        assert!(exec_process(&serde_json::json!({}), &["x".into()], false).is_none());
    }

    /// The server's end of a session with `target`: what came back as (stdout, stderr,
    /// exit code), after `input` frames were sent.
    async fn session(
        target: Target,
        argv: &[&str],
        tty: bool,
        input: Vec<Vec<u8>>,
    ) -> (String, String, Option<i32>) {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let req = ExecRequest {
            session: "test".into(),
            secret: String::new(),
            workload_id: "w".into(),
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            tty,
        };
        let agent = tokio::spawn(serve(Box::new(theirs), Ok(target), req));
        let mut ws = WebSocketStream::from_raw_socket(ours, Role::Server, None).await;
        for f in input {
            ws.send(Message::Binary(f.into())).await.unwrap();
        }
        let (mut out, mut err, mut code) = (String::new(), String::new(), None);
        let read = async {
            while let Some(Ok(m)) = ws.next().await {
                let Message::Binary(b) = m else { continue };
                match exec_frame::decode(&b) {
                    Some((exec_frame::Channel::Stdout, d)) => {
                        out.push_str(&String::from_utf8_lossy(d))
                    }
                    Some((exec_frame::Channel::Stderr, d)) => {
                        err.push_str(&String::from_utf8_lossy(d))
                    }
                    Some((exec_frame::Channel::Exit, d)) => {
                        code = serde_json::from_slice::<exec_frame::Exit>(d)
                            .ok()
                            .map(|e| e.code);
                    }
                    _ => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), read)
            .await
            .unwrap();
        agent.await.unwrap();
        (out, err, code)
    }

    /// Beside a workload without the sandbox (here: this test process), a command gets
    /// its environment and working folder, its input, and a terminal when asked.
    #[tokio::test]
    async fn beside_an_unsandboxed_workload() {
        let me = Target::Process {
            pid: std::process::id(),
        };
        let cwd = std::env::current_dir().unwrap();
        let (out, err, code) = session(
            me.clone(),
            &["sh", "-c", "pwd; cat; echo oops >&2; exit 4"],
            false,
            vec![
                exec_frame::encode(exec_frame::Channel::Stdin, b"fed\n"),
                exec_frame::encode(exec_frame::Channel::Stdin, b""),
            ],
        )
        .await;
        assert_eq!(out, format!("{}\nfed\n", cwd.display()));
        assert_eq!(err, "oops\n");
        assert_eq!(code, Some(4));

        let (out, _, code) = session(
            me.clone(),
            &["sh"],
            true,
            vec![
                exec_frame::resize(91, 27),
                exec_frame::encode(
                    exec_frame::Channel::Stdin,
                    b"stty size; tty >/dev/null && echo is-$((20+3)); exit 9\n",
                ),
            ],
        )
        .await;
        assert!(out.contains("27 91"), "{out}");
        assert!(out.contains("is-23"), "{out}");
        assert_eq!(code, Some(9));

        let (_, err, code) = session(me, &["/no/such/program"], false, vec![]).await;
        assert_eq!(code, Some(NOT_STARTED));
        assert!(err.contains("cannot run `/no/such/program`"), "{err}");
    }
}
