//! `tessera-rsh` (agent/src/gang_rsh.rs): the agent's executable run under that name,
//! a server and clients on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SECRET: &str = "gang-secret-0123456789";

struct Server {
    child: Child,
    port: u16,
    rsh: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tessera-rsh`: a symlink to the agent's executable.
fn rsh_link(dir: &Path) -> PathBuf {
    let link = dir.join("tessera-rsh");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tessera-agent"), &link).unwrap();
    link
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_server() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let rsh = rsh_link(dir.path());
    let port = free_port();
    let child = Command::new(&rsh)
        .arg("serve")
        .env("TESSERA_GANG_SECRET", SECRET)
        .env("TESSERA_GANG_RSH_PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "tessera-rsh serve never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Server {
        child,
        port,
        rsh,
        _dir: dir,
    }
}

fn client(s: &Server, secret: &str, args: &[&str], stdin: &[u8]) -> Output {
    client_at(&s.rsh, s.port, secret, args, stdin)
}

/// The client running `sleep 300` in the background on `s`, its pid written to
/// `pid_file`, stdin closed; the caller spawns it.
fn remote_sleeper(s: &Server, pid_file: &Path) -> Command {
    let mut c = Command::new(&s.rsh);
    c.args([
        "127.0.0.1",
        &format!("sleep 300 & echo $! > {}; wait", pid_file.display()),
    ])
    .env("TESSERA_GANG_SECRET", SECRET)
    .env("TESSERA_GANG_RSH_PORT", s.port.to_string())
    .stdin(Stdio::null());
    c
}

/// Sends SIGTERM to `pid` (with `kill`, which must succeed).
fn sigterm(pid: u32) {
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
}

fn client_at(rsh: &Path, port: u16, secret: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut c = Command::new(rsh)
        .args(args)
        .env("TESSERA_GANG_SECRET", secret)
        .env("TESSERA_GANG_RSH_PORT", port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(stdin).unwrap();
    c.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Whether process `pid` is gone (or a zombie, i.e. dead).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn wait_dead(pid: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !dead(pid) {
        assert!(Instant::now() < deadline, "{what} (pid {pid}) still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_pid_file(path: &Path) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "the command never wrote its pid");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn runs_the_command_and_passes_back_output_and_exit_code() {
    let s = start_server();
    // The words are joined by spaces and run by /bin/sh, as ssh does.
    let out = client(
        &s,
        SECRET,
        &[
            "127.0.0.1",
            "echo",
            "out;",
            "echo",
            "err",
            ">&2;",
            "exit",
            "3",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "out\n");
    assert_eq!(text(&out.stderr), "err\n");

    // Options ssh would get are accepted; stdin is forwarded.
    let out = client(
        &s,
        SECRET,
        &["-x", "-q", "127.0.0.1", "tr", "a-z", "A-Z"],
        b"hello",
    );
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "HELLO");

    // Killed by a signal: 128 + the signal.
    let out = client(&s, SECRET, &["127.0.0.1", "kill -9 $$"], b"");
    assert_eq!(out.status.code(), Some(137));

    // Concurrent connections: a command that waits for another one's file.
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("flag");
    let waiting = format!(
        "i=0; while [ ! -e {} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; test -e {}",
        flag.display(),
        flag.display()
    );
    let (rsh, port) = (s.rsh.clone(), s.port);
    let waiter = std::thread::spawn(move || {
        Command::new(rsh)
            .args(["127.0.0.1", &waiting])
            .env("TESSERA_GANG_SECRET", SECRET)
            .env("TESSERA_GANG_RSH_PORT", port.to_string())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    });
    std::thread::sleep(Duration::from_millis(300));
    let out = client(
        &s,
        SECRET,
        &["127.0.0.1", &format!("touch {}", flag.display())],
        b"",
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(waiter.join().unwrap().status.code(), Some(0));
}

#[test]
fn a_wrong_secret_or_no_server_is_exit_255() {
    let s = start_server();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let out = client(
        &s,
        "not-the-secret",
        &["127.0.0.1", &format!("touch {}", marker.display())],
        b"",
    );
    assert_eq!(out.status.code(), Some(255));
    assert!(
        text(&out.stderr).contains("wrong gang secret"),
        "stderr: {}",
        text(&out.stderr)
    );
    assert!(!marker.exists(), "the refused command ran");

    let out = client_at(&s.rsh, free_port(), SECRET, &["127.0.0.1", "true"], b"");
    assert_eq!(out.status.code(), Some(255));
    assert!(text(&out.stderr).contains("127.0.0.1"));

    let out = client(&s, SECRET, &["127.0.0.1"], b"");
    assert_eq!(out.status.code(), Some(255), "no command is an error");
}

#[test]
fn a_dropped_client_kills_the_remote_command() {
    let s = start_server();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let mut c = remote_sleeper(&s, &pid_file).spawn().unwrap();
    let sleeper = wait_pid_file(&pid_file);
    assert!(!dead(sleeper));
    c.kill().unwrap();
    c.wait().unwrap();
    wait_dead(sleeper, "the dropped client's command");
}

#[test]
fn sigterm_stops_the_server_and_its_commands() {
    let mut s = start_server();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let mut c = remote_sleeper(&s, &pid_file)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sleeper = wait_pid_file(&pid_file);
    let serve = s.child.id();
    sigterm(serve);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "serve did not exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "serve: {status}");
    wait_dead(sleeper, "the command of a terminated server");
    // Its client gets the command's status: killed by SIGTERM.
    assert_eq!(c.wait().unwrap().code(), Some(128 + 15));
}

/// The children of `pid` (every thread's), with their state letter.
fn children(pid: u32) -> Vec<(u32, char)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for c in list
            .split_whitespace()
            .filter_map(|c| c.parse::<u32>().ok())
        {
            let state = std::fs::read_to_string(format!("/proc/{c}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, r)| r.trim_start().chars().next())
                })
                .unwrap_or('?');
            out.push((c, state));
        }
    }
    out
}

/// In a sandbox `serve` is the first process of its PID namespace: orphans (a daemonized
/// `orted`) become its children, and it reaps them. Needs root (`unshare --pid`).
#[test]
fn as_pid_1_it_reaps_orphans() {
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("skipped: `unshare --pid` does not work here (not root?)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rsh = rsh_link(dir.path());
    let port = free_port();
    /// Kills `unshare` (and so, `--kill-child`, the server) however the test ends.
    struct KillOnDrop(Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let unshare = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child"])
        .arg(&rsh)
        .arg("serve")
        .env("TESSERA_GANG_SECRET", SECRET)
        .env("TESSERA_GANG_RSH_PORT", port.to_string())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut unshare = KillOnDrop(unshare);
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "serve never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    let serve = children(unshare.0.id())
        .first()
        .map(|(p, _)| *p)
        .expect("unshare's child");
    // The shell exits at once; its background `sleep` is left to PID 1.
    let out = client_at(
        &rsh,
        port,
        SECRET,
        &["127.0.0.1", "sleep 0.3 & exit 0"],
        b"",
    );
    assert_eq!(out.status.code(), Some(0));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let kids = children(serve);
        if kids.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "serve (pid 1) left children behind: {kids:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGTERM reaches it as PID 1 (it has a handler): it ends, and so does `unshare`.
    sigterm(serve);
    let deadline = Instant::now() + Duration::from_secs(10);
    while unshare.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "serve (pid 1) ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}
