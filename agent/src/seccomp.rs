//! The workloads' syscall filter: Docker's default seccomp profile (moby v20.10.24, as
//! Debian 12 ships it; origin and checksum in `agent/seccomp/README.md`), the one
//! containerd and Docker apply to every container, turned into the OCI runtime's
//! `linux.seccomp` for this node.
//!
//! The file is in Docker's format: rules that apply only on some architectures, only to
//! processes holding some capabilities, or only from some kernel version on. The
//! conversion is Docker's own (`profiles/seccomp/seccomp_linux.go`, `setupSeccomp`) for a
//! process with *no* capabilities, which every workload is: so `unshare`, `setns`,
//! `mount`, `bpf`, `perf_event_open` and `clone` of new namespaces stay refused, and
//! `keyctl`, `userfaultfd`, module, clock and reboot calls are not in the allow list at
//! all. A refused call fails with `EPERM`.

use std::fs;

use serde_json::{Map, Value, json};

/// Docker's default profile, unmodified.
pub const DOCKER_DEFAULT: &str = include_str!("../seccomp/moby-default.json");

/// `EPERM`, what a refused call returns (Docker's default, stated rather than left to
/// the runtime's).
const EPERM: u64 = 1;

/// The filter for this node's architecture and kernel. An architecture the profile does
/// not know is an error: the sandbox refuses to start rather than run unfiltered.
pub fn workload_filter() -> Result<Value, String> {
    let profile: Value = serde_json::from_str(DOCKER_DEFAULT)
        .map_err(|e| format!("the built-in seccomp profile does not parse: {e}"))?;
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .and_then(|s| kernel_version(&s))
        .ok_or("cannot read the kernel's version (/proc/sys/kernel/osrelease)")?;
    oci_filter(&profile, std::env::consts::ARCH, kernel)
}

/// Docker's name of a Rust target architecture (Go's `GOARCH`) and libseccomp's.
fn arch_names(rust_arch: &str) -> Option<(&'static str, &'static str)> {
    Some(match rust_arch {
        "x86_64" => ("amd64", "SCMP_ARCH_X86_64"),
        "x86" => ("386", "SCMP_ARCH_X86"),
        "aarch64" => ("arm64", "SCMP_ARCH_AARCH64"),
        "arm" => ("arm", "SCMP_ARCH_ARM"),
        "powerpc64" if cfg!(target_endian = "little") => ("ppc64le", "SCMP_ARCH_PPC64LE"),
        "s390x" => ("s390x", "SCMP_ARCH_S390X"),
        "riscv64" => ("riscv64", "SCMP_ARCH_RISCV64"),
        _ => return None,
    })
}

/// `(major, minor)` of a kernel release such as `6.1.0-18-amd64`.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Docker's profile as the OCI runtime's `linux.seccomp`, for a process without
/// capabilities on `rust_arch` (as `std::env::consts::ARCH` names it) and `kernel`.
pub fn oci_filter(profile: &Value, rust_arch: &str, kernel: (u32, u32)) -> Result<Value, String> {
    let (arch, native) = arch_names(rust_arch)
        .ok_or_else(|| format!("no seccomp filter for the architecture `{rust_arch}`"))?;
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    // The native ABI only, where Docker adds the 32-bit ones (`subArchitectures`): a
    // call through another ABI (i386's `int 0x80`, x32) then meets libseccomp's
    // bad-architecture action, which kills the thread. GPU workloads are 64-bit, and
    // compiling three ABIs' filters made every start ~20 ms slower (docs/benchmarks.md §8).
    let known = profile["archMap"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|a| a["architecture"] == native);
    if !known {
        return Err(format!("the seccomp profile has no rules for `{native}`"));
    }
    let architectures = [native];
    let mut syscalls = Vec::new();
    for rule in profile["syscalls"]
        .as_array()
        .ok_or("the seccomp profile has no `syscalls`")?
    {
        let includes = rule.get("includes").unwrap_or(&Value::Null);
        let excludes = rule.get("excludes").unwrap_or(&Value::Null);
        // Rules for other architectures, or for holders of capabilities (a workload has
        // none), do not apply; rules *excluding* capability holders do.
        let only_on = strings(includes.get("arches"));
        if (!only_on.is_empty() && !only_on.iter().any(|a| a == arch))
            || strings(excludes.get("arches")).iter().any(|a| a == arch)
            || !strings(includes.get("caps")).is_empty()
        {
            continue;
        }
        if let Some(min) = includes.get("minKernel").and_then(Value::as_str) {
            let min = kernel_version(min)
                .ok_or_else(|| format!("the seccomp profile's minKernel `{min}` is unreadable"))?;
            if kernel < min {
                continue;
            }
        }
        let mut out = Map::new();
        for key in ["names", "action", "errnoRet", "args"] {
            if let Some(v) = rule.get(key).filter(|v| !v.is_null()) {
                out.insert(key.to_owned(), v.clone());
            }
        }
        syscalls.push(Value::Object(out));
    }
    let default_action = profile["defaultAction"]
        .as_str()
        .ok_or("the seccomp profile has no defaultAction")?;
    Ok(json!({
        "defaultAction": default_action,
        "defaultErrnoRet": profile.get("defaultErrnoRet").and_then(Value::as_u64).unwrap_or(EPERM),
        "architectures": architectures,
        "syscalls": syscalls,
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn filter(arch: &str, kernel: (u32, u32)) -> Value {
        oci_filter(&serde_json::from_str(DOCKER_DEFAULT).unwrap(), arch, kernel).unwrap()
    }

    /// Names allowed whatever their arguments.
    fn allowed(f: &Value) -> Vec<String> {
        f["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                r["action"] == "SCMP_ACT_ALLOW"
                    && r.get("args")
                        .is_none_or(|a| a.as_array().is_none_or(Vec::is_empty))
            })
            .flat_map(|r| r["names"].as_array().unwrap().iter())
            .map(|n| n.as_str().unwrap().to_owned())
            .collect()
    }

    fn rules_for<'a>(f: &'a Value, name: &str) -> Vec<&'a Value> {
        f["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["names"].as_array().unwrap().iter().any(|n| n == name))
            .collect()
    }

    #[test]
    fn what_breaks_out_of_a_container_stays_refused() {
        let f = filter("x86_64", (6, 1));
        assert_eq!(f["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(f["defaultErrnoRet"], 1);
        let ok = allowed(&f);
        assert!(ok.len() > 300, "{}", ok.len());
        for common in [
            "read", "openat", "execve", "socket", "connect", "mmap", "ptrace",
        ] {
            assert!(ok.iter().any(|n| n == common), "{common} is allowed");
        }
        for refused in [
            "unshare",
            "setns",
            "mount",
            "umount2",
            "pivot_root",
            "keyctl",
            "add_key",
            "request_key",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "init_module",
            "finit_module",
            "delete_module",
            "clock_settime",
            "settimeofday",
            "reboot",
            "kexec_load",
            "open_by_handle_at",
            "swapon",
        ] {
            assert!(rules_for(&f, refused).is_empty(), "{refused} has a rule");
        }
        // clone only without namespace flags (CLONE_NEWUSER among them); clone3, whose
        // flags a filter cannot read, answers ENOSYS so that libc falls back to clone.
        let clone = rules_for(&f, "clone");
        assert_eq!(clone.len(), 1);
        let arg = &clone[0]["args"][0];
        assert_eq!(arg["index"], 0);
        assert_eq!(arg["op"], "SCMP_CMP_MASKED_EQ");
        let mask = arg["value"].as_u64().unwrap();
        assert_eq!(arg["value"], 0x7E02_0000);
        for flag in [0x1000_0000, 0x4000_0000, 0x0002_0000, 0x0800_0000] {
            assert_ne!(mask & flag, 0, "CLONE flag {flag:#x} is masked");
        }
        let clone3 = rules_for(&f, "clone3");
        assert_eq!(clone3.len(), 1);
        assert_eq!(clone3[0]["action"], "SCMP_ACT_ERRNO");
        assert_eq!(clone3[0]["errnoRet"], 38);
        // The native ABI only: i386 and x32 calls are not let through at all.
        assert_eq!(f["architectures"], json!(["SCMP_ARCH_X86_64"]));
        // No Docker-only keys reach the runtime.
        for r in f["syscalls"].as_array().unwrap() {
            for key in r.as_object().unwrap().keys() {
                assert!(["names", "action", "errnoRet", "args"].contains(&key.as_str()));
            }
        }
    }

    #[test]
    fn rules_follow_the_architecture_and_the_kernel() {
        let amd64 = filter("x86_64", (6, 1));
        let arm64 = filter("aarch64", (6, 1));
        assert!(allowed(&amd64).contains(&"arch_prctl".to_owned()));
        assert!(!allowed(&arm64).contains(&"arch_prctl".to_owned()));
        assert!(allowed(&arm64).contains(&"breakpoint".to_owned()));
        assert_eq!(arm64["architectures"], json!(["SCMP_ARCH_AARCH64"]));
        // s390's clone takes its flags second: its rule, not amd64's.
        let s390 = filter("s390x", (6, 1));
        assert_eq!(rules_for(&s390, "clone")[0]["args"][0]["index"], 1);
        // ptrace only from 4.8 (before, it could bypass seccomp).
        assert!(!allowed(&filter("x86_64", (4, 4))).contains(&"ptrace".to_owned()));
        let unknown = oci_filter(
            &serde_json::from_str(DOCKER_DEFAULT).unwrap(),
            "sparc",
            (6, 1),
        );
        assert!(unknown.unwrap_err().contains("sparc"));
    }

    #[test]
    fn kernel_releases_are_read() {
        assert_eq!(kernel_version("6.18.44-fc-v657\n"), Some((6, 18)));
        assert_eq!(kernel_version("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("4.8"), Some((4, 8)));
        assert_eq!(kernel_version("garbage"), None);
    }
}
