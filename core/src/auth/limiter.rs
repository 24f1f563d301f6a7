//! Throttling of failed sign-ins.
//!
//! Failures are counted per (account, client address), so a stranger hammering an account
//! throttles only themselves and the owner, signing in from elsewhere, is never locked out.
//! A second, looser counter per client address slows password spraying across accounts.
//! After `free_attempts` failures in a window, each further attempt must wait, doubling up
//! to `max_delay`. Successful sign-in clears the (account, address) counter.
//!
//! An IPv6 client counts as its /64: one subscriber or host usually holds a whole /64,
//! so per-address counting would give an attacker 2^64 fresh addresses.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct LimiterConfig {
    pub free_attempts: u32,
    pub window: Duration,
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// Failures per client address (any account) before that address is throttled.
    pub per_address_attempts: u32,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        Self {
            free_attempts: 5,
            window: Duration::from_secs(15 * 60),
            base_delay: Duration::from_secs(2),
            max_delay: Duration::from_secs(15 * 60),
            per_address_attempts: 50,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    failures: u32,
    first: Instant,
    last: Instant,
}

#[derive(Debug)]
pub struct LoginLimiter {
    config: LimiterConfig,
    by_account: Mutex<HashMap<(String, IpAddr), Entry>>,
    by_address: Mutex<HashMap<IpAddr, Entry>>,
}

impl LoginLimiter {
    pub fn new(config: LimiterConfig) -> Self {
        Self {
            config,
            by_account: Mutex::new(HashMap::new()),
            by_address: Mutex::new(HashMap::new()),
        }
    }

    /// `Err(wait)` when this client must wait before trying this account again.
    pub fn check(&self, account: &str, addr: IpAddr, now: Instant) -> Result<(), Duration> {
        let addr = client_key(addr);
        let key = (account.to_owned(), addr);
        let acct = lock(&self.by_account).get(&key).copied();
        let wait_a = acct.and_then(|e| self.wait(e, self.config.free_attempts, now));
        let addr_e = lock(&self.by_address).get(&addr).copied();
        let wait_b = addr_e.and_then(|e| self.wait(e, self.config.per_address_attempts, now));
        match wait_a.max(wait_b) {
            Some(w) => Err(w),
            None => Ok(()),
        }
    }

    pub fn record_failure(&self, account: &str, addr: IpAddr, now: Instant) {
        let addr = client_key(addr);
        let window = self.config.window;
        let bump = |e: &mut Entry| {
            if now.duration_since(e.first) > window {
                *e = Entry {
                    failures: 0,
                    first: now,
                    last: now,
                };
            }
            e.failures = e.failures.saturating_add(1);
            e.last = now;
        };
        let fresh = Entry {
            failures: 0,
            first: now,
            last: now,
        };
        {
            let mut map = lock(&self.by_account);
            if map.len() > 100_000 {
                map.retain(|_, e| now.duration_since(e.last) <= window);
            }
            bump(map.entry((account.to_owned(), addr)).or_insert(fresh));
        }
        let mut map = lock(&self.by_address);
        if map.len() > 100_000 {
            map.retain(|_, e| now.duration_since(e.last) <= window);
        }
        bump(map.entry(addr).or_insert(fresh));
    }

    pub fn record_success(&self, account: &str, addr: IpAddr) {
        let addr = client_key(addr);
        lock(&self.by_account).remove(&(account.to_owned(), addr));
    }

    fn wait(&self, e: Entry, free: u32, now: Instant) -> Option<Duration> {
        if now.duration_since(e.first) > self.config.window || e.failures < free {
            return None;
        }
        let doublings = (e.failures - free).min(20);
        let delay = self
            .config
            .base_delay
            .saturating_mul(1u32 << doublings)
            .min(self.config.max_delay);
        let ready = e.last + delay;
        (ready > now).then(|| ready - now)
    }
}

/// What the counters key on: an IPv4 address as is (also when IPv4-mapped), an IPv6
/// address as its /64 network.
fn client_key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => addr,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut seg = v6.segments();
                seg[4..].fill(0);
                IpAddr::V6(seg.into())
            }
        },
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn throttles_the_attacker_not_the_owner() {
        let l = LoginLimiter::new(LimiterConfig::default());
        let t0 = Instant::now();
        let attacker = ip("203.0.113.9");
        for _ in 0..5 {
            assert!(l.check("alice", attacker, t0).is_ok());
            l.record_failure("alice", attacker, t0);
        }
        let wait = l.check("alice", attacker, t0).expect_err("throttled");
        assert_eq!(wait, Duration::from_secs(2));
        // The owner, from her own address, is unaffected.
        assert!(l.check("alice", ip("198.51.100.7"), t0).is_ok());
        // Other accounts from the attacker's address are not yet throttled.
        assert!(l.check("bob", attacker, t0).is_ok());
        // Waiting long enough lets the attacker try once more, then the delay doubles.
        let t1 = t0 + Duration::from_secs(2);
        assert!(l.check("alice", attacker, t1).is_ok());
        l.record_failure("alice", attacker, t1);
        assert_eq!(l.check("alice", attacker, t1), Err(Duration::from_secs(4)));
    }

    #[test]
    fn an_ipv6_attacker_counts_as_its_64_however_many_addresses_it_uses() {
        let l = LoginLimiter::new(LimiterConfig::default());
        let t0 = Instant::now();
        for i in 0..5u16 {
            let addr = IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 7, 1, i, 0, 0, i + 1));
            assert!(l.check("alice", addr, t0).is_ok());
            l.record_failure("alice", addr, t0);
        }
        let fresh = ip("2001:db8:7:1:ffff:ffff:ffff:ffff");
        assert!(
            l.check("alice", fresh, t0).is_err(),
            "a new address in the /64"
        );
        // The next /64 is someone else.
        assert!(l.check("alice", ip("2001:db8:7:2::1"), t0).is_ok());
        // The per-address (spraying) counter groups by /64 too.
        for n in 0..60u16 {
            let addr = IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 9, 9, n, 1, 2, 3));
            l.record_failure(&format!("user{n}"), addr, t0);
        }
        assert!(l.check("zed", ip("2001:db8:9:9::42"), t0).is_err());
        // An IPv4-mapped address is its IPv4 address.
        for _ in 0..5 {
            l.record_failure("bob", ip("192.0.2.77"), t0);
        }
        assert!(l.check("bob", ip("::ffff:192.0.2.77"), t0).is_err());
        assert!(l.check("bob", ip("::ffff:192.0.2.78"), t0).is_ok());
    }

    #[test]
    fn the_window_forgets_old_failures_and_success_clears() {
        let cfg = LimiterConfig::default();
        let window = cfg.window;
        let l = LoginLimiter::new(cfg);
        let t0 = Instant::now();
        let a = ip("192.0.2.1");
        for _ in 0..5 {
            l.record_failure("carol", a, t0);
        }
        assert!(l.check("carol", a, t0).is_err());
        assert!(
            l.check("carol", a, t0 + window + Duration::from_secs(1))
                .is_ok()
        );
        l.record_success("carol", a);
        assert!(l.check("carol", a, t0).is_ok());
    }

    #[test]
    fn spraying_many_accounts_from_one_address_is_throttled() {
        let l = LoginLimiter::new(LimiterConfig::default());
        let t0 = Instant::now();
        let a = ip("192.0.2.50");
        for i in 0..50 {
            l.record_failure(&format!("user{i}"), a, t0);
        }
        assert!(l.check("someone-new", a, t0).is_err());
    }
}
