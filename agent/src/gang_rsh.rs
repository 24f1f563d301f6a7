//! `tessera-rsh`: the remote agent of a gang job (issue 42), in place of `ssh`.
//!
//! The agent's own executable answers to this name (multi-call: `main` looks at
//! `argv[0]`'s basename before anything else). It is mounted read-only at
//! `/opt/tessera/bin/tessera-rsh` in every gang member's sandbox, and Open MPI's
//! `plm rsh` launcher uses it (`OMPI_MCA_plm_rsh_agent`) to start its daemons (`orted`)
//! on the other members.
//!
//! - `tessera-rsh serve` listens on `0.0.0.0:$TESSERA_GANG_RSH_PORT` and runs the commands
//!   of clients that know `$TESSERA_GANG_SECRET`. It runs until SIGTERM/SIGINT, which it
//!   passes on to every command's process group.
//! - `tessera-rsh [ssh options] <host> <command…>` runs `<command…>` (its words joined by
//!   spaces, as `ssh` does) with `/bin/sh -c` on `<host>`'s server, copies its output
//!   here and exits with its exit status; 255 when the command could not be run there
//!   (no connection, refused secret), as `ssh` does.
//!
//! # Protocol
//! One TCP connection per command. Both ways, a sequence of frames: one type byte, a
//! big-endian `u32` payload length, the payload.
//! - Client → server: `S` the secret, `C` the command line (UTF-8), then `I` frames of
//!   stdin; an empty `I` frame is stdin's end.
//! - Server → client: `O` stdout bytes, `E` stderr bytes, then `X` with the exit status
//!   (big-endian `i32`: the exit code, or 128 + the signal's number). Instead, `D` with a
//!   reason when the secret is wrong or the command cannot run; the server then closes.
//!
//! When the connection drops before the command has ended, the server kills the
//! command's process group (SIGKILL): a dead `mpirun` leaves no `orted` behind.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// The name the agent's executable answers to as the remote agent.
pub const PROGRAM: &str = "tessera-rsh";
/// The environment variable holding the gang's secret.
pub const SECRET_ENV: &str = "TESSERA_GANG_SECRET";
/// The environment variable holding the port the server listens on.
pub const PORT_ENV: &str = "TESSERA_GANG_RSH_PORT";
/// The exit status of the client when the command could not be run remotely (`ssh`'s).
pub const EXIT_RSH_FAILED: i32 = 255;

/// Frame types (see the module's documentation).
pub mod frame {
    pub const SECRET: u8 = b'S';
    pub const COMMAND: u8 = b'C';
    pub const STDIN: u8 = b'I';
    pub const STDOUT: u8 = b'O';
    pub const STDERR: u8 = b'E';
    pub const EXIT: u8 = b'X';
    pub const DENIED: u8 = b'D';
}

/// The largest payload a peer accepts in one frame.
pub const MAX_FRAME: u32 = 1 << 20;
/// How long the server waits for a new connection's secret and command.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the client tries to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Output is sent in frames of at most this many bytes.
const CHUNK: usize = 32 * 1024;

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|l| *l <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut buf = Vec::with_capacity(5 + payload.len());
    buf.push(kind);
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(payload);
    w.write_all(&buf)?;
    w.flush()
}

/// Reads one frame: `None` at a clean end of the stream (before a frame's first byte).
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut kind = [0u8; 1];
    loop {
        match r.read(&mut kind) {
            Ok(0) => return Ok(None),
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is over the limit of {MAX_FRAME}"),
        ));
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    Ok(Some((kind[0], payload)))
}

/// Whether `given` is the secret `expected`, in time independent of where they differ
/// (both are hashed first, so their lengths do not show either). An empty expected
/// secret matches nothing.
pub fn secret_matches(expected: &[u8], given: &[u8]) -> bool {
    if expected.is_empty() {
        return false;
    }
    let a = Sha256::digest(expected);
    let b = Sha256::digest(given);
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// The exit status the client passes on: the code, or 128 + the signal.
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(EXIT_RSH_FAILED)
}

/// What the client's arguments ask for.
#[derive(Debug, PartialEq, Eq)]
pub struct ClientArgs {
    pub host: String,
    /// `-p PORT`, overriding `$TESSERA_GANG_RSH_PORT`.
    pub port: Option<u16>,
    /// The command words joined by single spaces (what `ssh` sends).
    pub command: String,
}

/// `ssh` options that take an argument (`ssh(1)`); the others are flags. Open MPI passes
/// none to an agent that is not named `ssh` (it adds `-x` only to `ssh`), but a user's
/// `plm_rsh_args` may carry any of them; all but `-p` are ignored.
const OPTIONS_WITH_ARGUMENT: &str = "BbcDEeFIiJLlmOopQRSWw";
const FLAG_OPTIONS: &str = "46AaCfGgKkMNnqsTtVvXxYy";

/// Parses `[ssh options] [user@]host command…`.
pub fn parse_client_args(args: &[String]) -> Result<ClientArgs, String> {
    let mut port = None;
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            i += 1;
            break;
        }
        let Some(opts) = a.strip_prefix('-').filter(|o| !o.is_empty()) else {
            break;
        };
        for (at, c) in opts.char_indices() {
            if OPTIONS_WITH_ARGUMENT.contains(c) {
                let rest = &opts[at + c.len_utf8()..];
                let value = if rest.is_empty() {
                    i += 1;
                    args.get(i)
                        .cloned()
                        .ok_or_else(|| format!("option -{c} needs an argument"))?
                } else {
                    rest.to_owned()
                };
                if c == 'p' {
                    port = Some(
                        value
                            .parse::<u16>()
                            .map_err(|_| format!("bad port `{value}` for -p"))?,
                    );
                }
                break;
            } else if !FLAG_OPTIONS.contains(c) {
                return Err(format!("unknown option -{c}"));
            }
        }
        i += 1;
    }
    let Some(host) = args.get(i) else {
        return Err("no host given".into());
    };
    // `user@host`: the user is the sandbox's own; ignored.
    let host = host.rsplit_once('@').map_or(host.as_str(), |(_, h)| h);
    if host.is_empty() {
        return Err("no host given".into());
    }
    let words = &args[i + 1..];
    if words.is_empty() {
        return Err("no command given (tessera-rsh runs commands, not shells)".into());
    }
    Ok(ClientArgs {
        host: host.to_owned(),
        port,
        command: words.join(" "),
    })
}

/// The entry point when the executable runs as `tessera-rsh`; returns the exit code.
pub fn main() -> i32 {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "serve") {
        return match serve_main() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("{PROGRAM} serve: {e}");
                1
            }
        };
    }
    if args.first().is_some_and(|a| a == "-h" || a == "--help") {
        println!(
            "usage: {PROGRAM} serve\n       {PROGRAM} [ssh options] [user@]host command...\n\
             Both read ${SECRET_ENV} and ${PORT_ENV}."
        );
        return 0;
    }
    match parse_client_args(&args) {
        Ok(c) => client(&c),
        Err(e) => {
            eprintln!("{PROGRAM}: {e}");
            eprintln!("usage: {PROGRAM} [ssh options] [user@]host command...");
            EXIT_RSH_FAILED
        }
    }
}

fn env_secret() -> Result<String, String> {
    match std::env::var(SECRET_ENV) {
        Ok(s) if !s.is_empty() => Ok(s),
        _ => Err(format!("${SECRET_ENV} is not set")),
    }
}

fn env_port() -> Result<u16, String> {
    let v = std::env::var(PORT_ENV).map_err(|_| format!("${PORT_ENV} is not set"))?;
    v.trim()
        .parse()
        .map_err(|_| format!("${PORT_ENV} is not a port: `{v}`"))
}

// ---------------------------------------------------------------------------------------
// Client

fn client(args: &ClientArgs) -> i32 {
    match run_client(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{PROGRAM}: {}: {e}", args.host);
            EXIT_RSH_FAILED
        }
    }
}

fn connect(host: &str, port: u16) -> Result<TcpStream, String> {
    let addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?;
    let mut last = format!("no address for {host}");
    for a in addrs {
        match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("connect to {a}: {e}"),
        }
    }
    Err(last)
}

fn run_client(args: &ClientArgs) -> Result<i32, String> {
    let secret = env_secret()?;
    let port = match args.port {
        Some(p) => p,
        None => env_port()?,
    };
    let mut conn = connect(&args.host, port)?;
    let _ = conn.set_nodelay(true);
    let io_err = |e: io::Error| format!("connection: {e}");
    write_frame(&mut conn, frame::SECRET, secret.as_bytes()).map_err(io_err)?;
    write_frame(&mut conn, frame::COMMAND, args.command.as_bytes()).map_err(io_err)?;
    // Stdin, forwarded until its end; the process exits without waiting for it once the
    // command has ended.
    let mut to_server = conn.try_clone().map_err(io_err)?;
    thread::spawn(move || {
        let mut stdin = io::stdin().lock();
        let mut buf = vec![0u8; CHUNK];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = write_frame(&mut to_server, frame::STDIN, &[]);
                    return;
                }
                Ok(n) => {
                    if write_frame(&mut to_server, frame::STDIN, &buf[..n]).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut stdout = io::stdout();
    let mut stderr = io::stderr();
    loop {
        match read_frame(&mut conn).map_err(io_err)? {
            None => return Err("connection closed before the command ended".into()),
            Some((frame::STDOUT, data)) => {
                let _ = stdout.write_all(&data).and_then(|()| stdout.flush());
            }
            Some((frame::STDERR, data)) => {
                let _ = stderr.write_all(&data).and_then(|()| stderr.flush());
            }
            Some((frame::EXIT, data)) => {
                let code: [u8; 4] = data
                    .as_slice()
                    .try_into()
                    .map_err(|_| "bad exit frame".to_owned())?;
                return Ok(i32::from_be_bytes(code));
            }
            Some((frame::DENIED, reason)) => {
                return Err(format!("refused: {}", String::from_utf8_lossy(&reason)));
            }
            Some((kind, _)) => return Err(format!("unexpected frame type {kind:#04x}")),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Server

/// The process groups of the commands running now (each command leads its own).
type Groups = Arc<Mutex<HashSet<i32>>>;

static TERMINATE: AtomicBool = AtomicBool::new(false);

extern "C" fn on_terminate(_: libc::c_int) {
    TERMINATE.store(true, Ordering::SeqCst);
}

/// Catches SIGTERM and SIGINT (a caught signal is reset to its default in the commands
/// the server execs, so they are not affected).
#[allow(unsafe_code)]
fn catch_terminate() {
    let handler = on_terminate as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(sig, handler);
        }
    }
}

/// Sends `sig` to the process group `pgid`.
#[allow(unsafe_code)]
fn kill_group(pgid: i32, sig: libc::c_int) {
    if pgid > 1 {
        // SAFETY: kill(2) takes no memory; a negative pid names the process group.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

fn serve_main() -> Result<(), String> {
    let secret = env_secret()?;
    let port = env_port()?;
    let listener = TcpListener::bind(("0.0.0.0", port))
        .map_err(|e| format!("cannot listen on 0.0.0.0:{port}: {e}"))?;
    serve(listener, secret)
}

/// Serves connections on `listener` until SIGTERM/SIGINT; then stops every command
/// (SIGTERM to its process group, SIGKILL a few seconds later) and returns.
pub fn serve(listener: TcpListener, secret: String) -> Result<(), String> {
    catch_terminate();
    let groups: Groups = Arc::default();
    {
        let groups = groups.clone();
        thread::spawn(move || {
            while !TERMINATE.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(100));
            }
            eprintln!("{PROGRAM} serve: terminating; stopping the running commands");
            let running: Vec<i32> = groups
                .lock()
                .map(|g| g.iter().copied().collect())
                .unwrap_or_default();
            for g in &running {
                kill_group(*g, libc::SIGTERM);
            }
            for _ in 0..30 {
                if groups.lock().map(|g| g.is_empty()).unwrap_or(true) {
                    break;
                }
                thread::sleep(Duration::from_millis(100));
            }
            for g in &running {
                kill_group(*g, libc::SIGKILL);
            }
            for _ in 0..20 {
                if groups.lock().map(|g| g.is_empty()).unwrap_or(true) {
                    break;
                }
                thread::sleep(Duration::from_millis(100));
            }
            std::process::exit(0);
        });
    }
    if std::process::id() == 1 {
        // The sandbox's first process: orphans (a daemonized `orted`, a rank's leftover
        // children) become ours; reap them.
        let groups = groups.clone();
        thread::spawn(move || reap_orphans(&groups));
    }
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!("{PROGRAM} serve: listening on {addr}");
    let secret = Arc::new(secret);
    for conn in listener.incoming() {
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{PROGRAM} serve: accept: {e}");
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let secret = secret.clone();
        let groups = groups.clone();
        thread::spawn(move || {
            let peer = conn
                .peer_addr()
                .map_or_else(|_| "?".to_owned(), |a| a.to_string());
            if let Err(e) = handle(conn, &secret, &groups) {
                eprintln!("{PROGRAM} serve: {peer}: {e}");
            }
        });
    }
    Ok(())
}

/// Reaps every exited child that is not a command's `/bin/sh` (those are in `groups`
/// from before they can exit until after their `Child::wait`).
#[allow(unsafe_code)]
fn reap_orphans(groups: &Groups) {
    loop {
        // SAFETY: a zeroed siginfo_t is a valid value for waitid to fill.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes only into `info`; WNOWAIT leaves the child waitable.
        let r = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if r != 0 {
            // No children at all (ECHILD), or interrupted.
            thread::sleep(Duration::from_millis(200));
            continue;
        }
        // SAFETY: waitid succeeded with WEXITED, so `info` describes a child.
        let pid = unsafe { info.si_pid() };
        let ours = groups.lock().map(|g| g.contains(&pid)).unwrap_or(true);
        if ours {
            // Its connection's thread reaps it.
            thread::sleep(Duration::from_millis(20));
            continue;
        }
        // SAFETY: waitpid on one exited child; no status is read.
        unsafe {
            libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
        }
    }
}

/// Refuses the connection with `reason` (sent to the client, which prints it).
fn deny(conn: &mut TcpStream, reason: &str) {
    let _ = write_frame(conn, frame::DENIED, reason.as_bytes());
    let _ = conn.shutdown(Shutdown::Both);
}

fn handle(mut conn: TcpStream, secret: &str, groups: &Groups) -> Result<(), String> {
    let _ = conn.set_nodelay(true);
    conn.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let given = match read_frame(&mut conn) {
        Ok(Some((frame::SECRET, s))) => s,
        // A probe (connected and closed): nothing to say.
        Ok(None) => return Ok(()),
        Ok(_) => {
            deny(&mut conn, "protocol error: expected the secret");
            return Err("no secret frame; closed".into());
        }
        Err(e) => return Err(format!("reading the secret: {e}")),
    };
    if !secret_matches(secret.as_bytes(), &given) {
        deny(&mut conn, "wrong gang secret");
        return Err("wrong gang secret; refused".into());
    }
    let command = match read_frame(&mut conn) {
        Ok(Some((frame::COMMAND, c))) => String::from_utf8(c).map_err(|_| {
            deny(&mut conn, "the command is not UTF-8");
            "the command is not UTF-8".to_owned()
        })?,
        Ok(_) => {
            deny(&mut conn, "protocol error: expected the command");
            return Err("no command frame; closed".into());
        }
        Err(e) => return Err(format!("reading the command: {e}")),
    };
    conn.set_read_timeout(None).map_err(|e| e.to_string())?;
    eprintln!("{PROGRAM} serve: running: {command}");
    // The group is registered before the shell can exit (see `reap_orphans`).
    let mut registered = groups.lock().map_err(|_| "poisoned".to_owned())?;
    let spawned = Command::new("/bin/sh")
        .arg("-c")
        .arg(&command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            drop(registered);
            deny(&mut conn, &format!("cannot run /bin/sh: {e}"));
            return Err(format!("cannot run /bin/sh: {e}"));
        }
    };
    let pgid = i32::try_from(child.id()).unwrap_or(0);
    registered.insert(pgid);
    drop(registered);
    let done = Arc::new(AtomicBool::new(false));
    let writer = Arc::new(Mutex::new(conn.try_clone().map_err(|e| e.to_string())?));

    // The connection's reader: stdin for the command, and the client's end.
    let stdin = child.stdin.take();
    let mut from_client = conn.try_clone().map_err(|e| e.to_string())?;
    let reader_done = done.clone();
    thread::spawn(move || {
        let mut stdin = stdin;
        loop {
            match read_frame(&mut from_client) {
                Ok(Some((frame::STDIN, data))) if data.is_empty() => stdin = None,
                Ok(Some((frame::STDIN, data))) => {
                    if let Some(s) = stdin.as_mut()
                        && s.write_all(&data).is_err()
                    {
                        stdin = None;
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        drop(stdin);
        if !reader_done.load(Ordering::SeqCst) {
            eprintln!("{PROGRAM} serve: client gone; killing process group {pgid}");
            kill_group(pgid, libc::SIGKILL);
        }
    });

    let pumps: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| (Box::new(s) as Box<dyn Read + Send>, frame::STDOUT)),
        child
            .stderr
            .take()
            .map(|s| (Box::new(s) as Box<dyn Read + Send>, frame::STDERR)),
    ]
    .into_iter()
    .flatten()
    .map(|(mut src, kind)| {
        let writer = writer.clone();
        thread::spawn(move || {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match src.read(&mut buf) {
                    Ok(0) => return,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return,
                    Ok(n) => {
                        let sent = writer
                            .lock()
                            .map_err(|_| io::Error::other("poisoned"))
                            .and_then(|mut w| write_frame(&mut *w, kind, &buf[..n]));
                        if sent.is_err() {
                            // The client is gone; keep draining so the command is not
                            // blocked on a full pipe until it is killed.
                        }
                    }
                }
            }
        })
    })
    .collect();
    let status = child.wait().map_err(|e| e.to_string());
    for p in pumps {
        let _ = p.join();
    }
    done.store(true, Ordering::SeqCst);
    let code = match status {
        Ok(s) => exit_code(s),
        Err(e) => {
            if let Ok(mut g) = groups.lock() {
                g.remove(&pgid);
            }
            return Err(e);
        }
    };
    eprintln!("{PROGRAM} serve: exited {code}: {command}");
    let sent = writer
        .lock()
        .map_err(|_| "poisoned".to_owned())
        .and_then(|mut w| {
            write_frame(&mut *w, frame::EXIT, &code.to_be_bytes()).map_err(|e| e.to_string())
        });
    let _ = conn.shutdown(Shutdown::Write);
    // Only now: a terminating server waits for this (the client gets the status).
    if let Ok(mut g) = groups.lock() {
        g.remove(&pgid);
    }
    sent
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let mut buf = Vec::new();
        write_frame(&mut buf, frame::SECRET, b"s3cret").unwrap();
        write_frame(&mut buf, frame::STDIN, b"").unwrap();
        write_frame(&mut buf, frame::EXIT, &3i32.to_be_bytes()).unwrap();
        assert_eq!(&buf[..5], &[b'S', 0, 0, 0, 6]);
        let mut r = buf.as_slice();
        assert_eq!(
            read_frame(&mut r).unwrap(),
            Some((frame::SECRET, b"s3cret".to_vec()))
        );
        assert_eq!(read_frame(&mut r).unwrap(), Some((frame::STDIN, vec![])));
        assert_eq!(
            read_frame(&mut r).unwrap(),
            Some((frame::EXIT, 3i32.to_be_bytes().to_vec()))
        );
        assert_eq!(read_frame(&mut r).unwrap(), None);
    }

    #[test]
    fn truncated_and_oversized_frames_are_errors() {
        let mut buf = Vec::new();
        write_frame(&mut buf, frame::STDOUT, b"hello").unwrap();
        let mut cut = &buf[..7];
        assert!(read_frame(&mut cut).is_err());
        let huge = [b'O', 0xff, 0xff, 0xff, 0xff];
        let err = read_frame(&mut huge.as_slice()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let too_big = vec![0u8; MAX_FRAME as usize + 1];
        assert!(write_frame(&mut Vec::new(), frame::STDOUT, &too_big).is_err());
    }

    #[test]
    fn secret_check() {
        assert!(secret_matches(b"abc123", b"abc123"));
        assert!(!secret_matches(b"abc123", b"abc124"));
        assert!(!secret_matches(b"abc123", b"abc1234"));
        assert!(!secret_matches(b"abc123", b""));
        assert!(!secret_matches(b"", b""));
    }

    #[test]
    fn client_args_like_ssh() {
        let a =
            parse_client_args(&strings(&["10.0.0.2", "orted", "-mca", "ess", "\"env\""])).unwrap();
        assert_eq!(
            a,
            ClientArgs {
                host: "10.0.0.2".into(),
                port: None,
                command: "orted -mca ess \"env\"".into(),
            }
        );
        let a = parse_client_args(&strings(&[
            "-x",
            "-T",
            "-o",
            "StrictHostKeyChecking=no",
            "-p2222",
            "-l",
            "me",
            "root@h1",
            "echo",
            "a b",
        ]))
        .unwrap();
        assert_eq!(a.host, "h1");
        assert_eq!(a.port, Some(2222));
        assert_eq!(a.command, "echo a b");
        let a = parse_client_args(&strings(&["-xq", "-p", "7", "h", "true"])).unwrap();
        assert_eq!((a.port, a.command.as_str()), (Some(7), "true"));
        assert!(parse_client_args(&strings(&["-x", "h"])).is_err());
        assert!(parse_client_args(&strings(&["-x"])).is_err());
        assert!(parse_client_args(&strings(&["-Z", "h", "true"])).is_err());
        assert!(parse_client_args(&strings(&["-p", "x", "h", "true"])).is_err());
    }
}
