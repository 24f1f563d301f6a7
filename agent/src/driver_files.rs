//! The NVIDIA driver's user-space files in image workloads, as NVIDIA's container
//! toolkit gives them: a CUDA program in an image needs the node driver's own
//! `libcuda.so` (the kernel module and its user-space library must match), which no
//! image can carry.
//!
//! Found once when the agent starts:
//! - on hardware ([`DriverFiles::discover`]): the libraries the toolkit lists
//!   ([`LIBRARIES`]) from the host's linker cache (`ldconfig -p`, this machine's
//!   architecture only), and its binaries ([`BINARIES`]) from the system folders;
//! - on the simulator ([`DriverFiles::write_stand_ins`]): stand-in files the agent
//!   writes under its state folder (a `libcuda.so.<version>` naming the simulated driver,
//!   an `nvidia-smi` script printing the simulated driver and CUDA versions), mounted the
//!   same way so that tests see what a workload on hardware would.
//!
//! The sandbox mounts them read-only into every image workload that has a GPU, each file
//! at its own name under [`NVIDIA_DIR`]`/lib64` or `/bin`, on a small tmpfs at
//! [`NVIDIA_DIR`] (the image store makes that folder in every root, so the runtime never
//! writes in a shared image). That is where NVIDIA's CUDA images already look
//! (`LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64`,
//! `PATH=/usr/local/nvidia/bin:…`); [`driver_env`] adds both for other images.
//! Workloads on the node's own folders see the host's `/usr` and need none of this.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where the driver's files appear inside an image workload.
pub const NVIDIA_DIR: &str = "/usr/local/nvidia";
pub const NVIDIA_LIB: &str = "/usr/local/nvidia/lib64";
pub const NVIDIA_BIN: &str = "/usr/local/nvidia/bin";

/// The driver's user-space libraries a CUDA (compute, utility) container gets, by name
/// prefix (NVIDIA container toolkit, `libnvidia-container`'s compute and utility lists).
pub const LIBRARIES: &[&str] = &[
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libnvidia-opencl.so",
    "libnvidia-compiler.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
];

/// The driver's programs a container gets.
pub const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// Where the driver's programs are looked for on the host.
const BINARY_DIRS: &[&str] = &["/usr/bin", "/usr/local/bin", "/usr/sbin", "/bin", "/sbin"];

/// One file bound read-only into image workloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFile {
    /// On the host (a symlink is followed by the bind: the container sees the file).
    pub host: PathBuf,
    /// Inside the container, under [`NVIDIA_LIB`] or [`NVIDIA_BIN`].
    pub dest: String,
}

/// The driver's files for image workloads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverFiles {
    pub files: Vec<DriverFile>,
}

impl DriverFiles {
    /// The host driver's files: libraries from `ldconfig -p`, programs from the system
    /// folders. Empty (with a warning) where `ldconfig` cannot be run.
    pub fn discover() -> DriverFiles {
        let cache = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
            .iter()
            .find_map(|p| {
                let out = Command::new(p)
                    .arg("-p")
                    .stdin(Stdio::null())
                    .stderr(Stdio::null())
                    .output()
                    .ok()?;
                out.status
                    .success()
                    .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
            });
        let Some(cache) = cache else {
            tracing::warn!(
                "cannot run `ldconfig -p`: image workloads get none of the NVIDIA driver's libraries"
            );
            return DriverFiles::default();
        };
        let binaries: Vec<PathBuf> = BINARIES
            .iter()
            .filter_map(|b| {
                BINARY_DIRS
                    .iter()
                    .map(|d| Path::new(d).join(b))
                    .find(|p| p.is_file())
            })
            .collect();
        DriverFiles::from_parts(&parse_ldconfig(&cache, host_abi()), &binaries)
    }

    /// The files for `libraries` (`(name, host path)`, from [`parse_ldconfig`]) and
    /// `binaries` (host paths): the driver's only, one per name inside.
    pub fn from_parts(libraries: &[(String, PathBuf)], binaries: &[PathBuf]) -> DriverFiles {
        let mut files: Vec<DriverFile> = Vec::new();
        for (name, host) in libraries {
            if !LIBRARIES.iter().any(|l| name.starts_with(l)) || !safe_file_name(name) {
                continue;
            }
            let dest = format!("{NVIDIA_LIB}/{name}");
            if !files.iter().any(|f| f.dest == dest) {
                files.push(DriverFile {
                    host: host.clone(),
                    dest,
                });
            }
        }
        for host in binaries {
            let Some(name) = host.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let dest = format!("{NVIDIA_BIN}/{name}");
            if BINARIES.contains(&name) && !files.iter().any(|f| f.dest == dest) {
                files.push(DriverFile {
                    host: host.clone(),
                    dest,
                });
            }
        }
        DriverFiles { files }
    }

    /// Writes the simulated driver's stand-ins into `dir` (replacing what was there) and
    /// answers them: `lib/libcuda.so.<version>` (text naming the driver), its
    /// `libcuda.so.1` and `libnvidia-ml.so.1` siblings, and `bin/nvidia-smi`, a shell
    /// script printing the driver and CUDA versions as the real one's header does.
    pub fn write_stand_ins(dir: &Path, version: &str, cuda: &str) -> io::Result<DriverFiles> {
        let lib = dir.join("lib");
        let bin = dir.join("bin");
        if dir.exists() {
            fs::remove_dir_all(dir)?;
        }
        fs::create_dir_all(&lib)?;
        fs::create_dir_all(&bin)?;
        for d in [dir, lib.as_path(), bin.as_path()] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755))?;
        }
        let text = format!("tessera simulated NVIDIA driver {version} (CUDA {cuda})\n");
        let mut libraries = Vec::new();
        for name in [
            format!("libcuda.so.{version}"),
            "libcuda.so.1".to_owned(),
            format!("libnvidia-ml.so.{version}"),
            "libnvidia-ml.so.1".to_owned(),
        ] {
            let p = lib.join(&name);
            fs::write(&p, &text)?;
            fs::set_permissions(&p, fs::Permissions::from_mode(0o644))?;
            libraries.push((name, p));
        }
        let smi = bin.join("nvidia-smi");
        fs::write(
            &smi,
            format!(
                "#!/bin/sh\necho \"NVIDIA-SMI {version}  Driver Version: {version}  \
                 CUDA Version: {cuda}  (tessera simulator)\"\n"
            ),
        )?;
        fs::set_permissions(&smi, fs::Permissions::from_mode(0o755))?;
        Ok(DriverFiles::from_parts(&libraries, &[smi]))
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// `[A-Za-z0-9._+-]+`, not `.`/`..`: a library name safe as one path component.
fn safe_file_name(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'))
}

/// How `ldconfig -p` names this machine's 64-bit ABI (`x86-64`, `AArch64`).
pub fn host_abi() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "x86-64",
        "aarch64" => "AArch64",
        other => other,
    }
}

/// The entries of `ldconfig -p` for `abi` (`x86-64`): `(name, path)`, in its order.
/// A line reads `\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1`;
/// entries of other ABIs (32-bit `libc6` alone) are left out.
pub fn parse_ldconfig(text: &str, abi: &str) -> Vec<(String, PathBuf)> {
    text.lines()
        .filter_map(|line| {
            let (left, path) = line.split_once(" => ")?;
            let (name, flags) = left.trim().split_once(" (")?;
            let flags = flags.strip_suffix(')')?;
            flags
                .split(',')
                .any(|f| f.trim() == abi)
                .then(|| (name.trim().to_owned(), PathBuf::from(path.trim())))
        })
        .collect()
}

/// Adds the driver's folders to an image workload's environment: [`NVIDIA_LIB`] first on
/// `LD_LIBRARY_PATH` and [`NVIDIA_BIN`] last on `PATH`, unless already there.
pub fn driver_env(env: &mut Vec<(OsString, OsString)>) {
    let mut add = |key: &str, dir: &str, first: bool| match env.iter_mut().find(|(k, _)| k == key) {
        Some((_, v)) => {
            let s = v.to_string_lossy().into_owned();
            if s.split(':').any(|p| p == dir) {
                return;
            }
            *v = if s.is_empty() {
                dir.into()
            } else if first {
                format!("{dir}:{s}").into()
            } else {
                format!("{s}:{dir}").into()
            };
        }
        None => env.push((key.into(), dir.into())),
    };
    add("LD_LIBRARY_PATH", NVIDIA_LIB, true);
    add("PATH", NVIDIA_BIN, false);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const LDCONFIG: &str = "1234 libs found in cache `/etc/ld.so.cache'
\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1
\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
\tlibnvidia-ml.so.1 (libc6) => /usr/lib/i386-linux-gnu/libnvidia-ml.so.1
\tlibnvidia-ptxjitcompiler.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1
\tlibnvidia-glcore.so.550.54.15 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-glcore.so.550.54.15
\tlibcudart.so.12 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.12
\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
\tlibcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so
\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1
Cache generated by: ldconfig (Ubuntu GLIBC 2.35-0ubuntu3.8) stable release version 2.35
";

    #[test]
    fn the_driver_libraries_of_this_abi_are_taken_from_the_linker_cache() {
        let libs = parse_ldconfig(LDCONFIG, "x86-64");
        assert_eq!(libs.len(), 7);
        let files = DriverFiles::from_parts(&libs, &[PathBuf::from("/usr/bin/nvidia-smi")]);
        let got: Vec<(&str, &str)> = files
            .files
            .iter()
            .map(|f| (f.host.to_str().unwrap(), f.dest.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                    "/usr/local/nvidia/lib64/libnvidia-ml.so.1"
                ),
                (
                    "/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1",
                    "/usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so.1"
                ),
                (
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                    "/usr/local/nvidia/lib64/libcuda.so.1"
                ),
                (
                    "/usr/lib/x86_64-linux-gnu/libcuda.so",
                    "/usr/local/nvidia/lib64/libcuda.so"
                ),
                ("/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi"),
            ],
            "graphics libraries, the CUDA runtime (the image's own) and 32-bit ones stay out"
        );
        // Another ABI, other entries.
        let i386 = parse_ldconfig(LDCONFIG, "i386");
        assert!(i386.is_empty(), "{i386:?}");
    }

    #[test]
    fn odd_names_and_foreign_programs_are_not_mounted() {
        let libs = vec![
            ("libcuda.so/../../x".to_owned(), PathBuf::from("/x")),
            ("libcuda.so.1".to_owned(), PathBuf::from("/a/libcuda.so.1")),
            ("libcuda.so.1".to_owned(), PathBuf::from("/b/libcuda.so.1")),
        ];
        let files = DriverFiles::from_parts(&libs, &[PathBuf::from("/usr/bin/bash")]);
        assert_eq!(
            files.files,
            [DriverFile {
                host: PathBuf::from("/a/libcuda.so.1"),
                dest: "/usr/local/nvidia/lib64/libcuda.so.1".into()
            }]
        );
    }

    #[test]
    fn the_driver_folders_join_the_search_paths_once() {
        let mut env: Vec<(OsString, OsString)> = vec![("PATH".into(), "/bin:/usr/bin".into())];
        driver_env(&mut env);
        driver_env(&mut env);
        assert_eq!(
            env,
            [
                ("PATH".into(), "/bin:/usr/bin:/usr/local/nvidia/bin".into()),
                ("LD_LIBRARY_PATH".into(), "/usr/local/nvidia/lib64".into()),
            ]
        );
        let mut env: Vec<(OsString, OsString)> =
            vec![("LD_LIBRARY_PATH".into(), "/opt/lib".into())];
        driver_env(&mut env);
        assert_eq!(env[0].1, OsString::from("/usr/local/nvidia/lib64:/opt/lib"));
    }

    #[test]
    fn stand_ins_are_written_and_listed() {
        let dir = tempfile::tempdir().unwrap();
        let files =
            DriverFiles::write_stand_ins(&dir.path().join("sim"), "550.54.15", "12.4").unwrap();
        let dests: Vec<&str> = files.files.iter().map(|f| f.dest.as_str()).collect();
        assert_eq!(
            dests,
            [
                "/usr/local/nvidia/lib64/libcuda.so.550.54.15",
                "/usr/local/nvidia/lib64/libcuda.so.1",
                "/usr/local/nvidia/lib64/libnvidia-ml.so.550.54.15",
                "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
                "/usr/local/nvidia/bin/nvidia-smi",
            ]
        );
        // Another test's fork can briefly hold the fresh script open for writing (until its
        // child execs): the kernel answers "text file busy" meanwhile, so run it again.
        let smi = (0..100)
            .map(|_| Command::new(&files.files[4].host).output())
            .find(|r| {
                let busy =
                    matches!(r, Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy);
                if busy {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                !busy
            })
            .expect("nvidia-smi stand-in stayed busy")
            .unwrap();
        let out = String::from_utf8_lossy(&smi.stdout);
        assert!(
            out.contains("Driver Version: 550.54.15") && out.contains("CUDA Version: 12.4"),
            "{out}"
        );
    }
}
