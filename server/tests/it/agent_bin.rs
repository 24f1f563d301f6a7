//! Where the `tessera-agent` binary is (shared with the benches, which include this file).

/// The `tessera-agent` binary beside this test or bench binary, built in the same
/// profile if it is missing.
pub fn agent_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .to_path_buf();
    let bin = dir.join("tessera-agent");
    if !bin.exists() {
        let mut build = std::process::Command::new(env!("CARGO"));
        build.args(["build", "-p", "tessera-agent", "--bin", "tessera-agent"]);
        if !cfg!(debug_assertions) {
            build.arg("--release");
        }
        let status = build.status().expect("cargo build");
        assert!(status.success(), "building tessera-agent");
    }
    bin
}
