//! aiosmtpd on a loopback port, driven by a Python handler of the caller's (shared with
//! the notify bench, which includes this file).

/// What every handler script ends with: serve on `port` and say "ready".
const SERVE: &str = r#"
c = Controller(Handler(), hostname="127.0.0.1", port=port)
c.start()
print("ready", flush=True)
while True:
    time.sleep(3600)
"#;

/// A running aiosmtpd, killed when dropped.
pub struct Aiosmtpd {
    child: std::process::Child,
    pub port: u16,
}

impl Aiosmtpd {
    /// Runs `handler` (Python defining `Handler`, having imported `time` and `Controller`
    /// and read `port` from `sys.argv[1]`) with `port` and `out` as its arguments; returns
    /// once it is ready.
    pub fn start(handler: &str, out: &std::path::Path) -> Aiosmtpd {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("port");
        let mut child = std::process::Command::new("python3")
            .args(["-c", &format!("{handler}{SERVE}"), &port.to_string()])
            .arg(out)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 with aiosmtpd (pip install aiosmtpd; cargo xtask test does)");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("read");
        assert_eq!(line.trim(), "ready", "aiosmtpd did not start");
        Aiosmtpd { child, port }
    }

    /// `smtp://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }
}

impl Drop for Aiosmtpd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
