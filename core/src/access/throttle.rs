//! Throttling of failed authentications per client address. Every unknown secret costs a
//! metadata lookup, so a client that keeps sending bad tokens could load the metadata
//! store for everyone; past a burst of failures, its further attempts with secrets that
//! are not already verified are refused (`rate_limited`) without a lookup, until its
//! allowance refills. Clients whose tokens are valid (and cached) are never slowed.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Failed attempts a client address may make in a burst.
const BURST: f64 = 20.0;
/// Failed attempts per second a client address may go on making.
const REFILL_PER_SECOND: f64 = 5.0;
/// Addresses tracked at most; past it, those whose allowance is full are forgotten
/// (an untracked address has a full allowance, so forgetting them changes nothing).
const MAX_TRACKED: usize = 65_536;

/// One client's allowance of failed attempts (a token bucket).
#[derive(Debug, Clone, Copy)]
struct Allowance {
    left: f64,
    at: Instant,
}

impl Allowance {
    fn refilled(self, now: Instant) -> Allowance {
        let gained = now.duration_since(self.at).as_secs_f64() * REFILL_PER_SECOND;
        Allowance {
            left: (self.left + gained).min(BURST),
            at: now,
        }
    }
}

#[derive(Default)]
pub struct FailedAuthThrottle {
    clients: Mutex<HashMap<IpAddr, Allowance>>,
}

impl FailedAuthThrottle {
    /// `None` if `client` may try to authenticate now; otherwise how long until it may.
    pub fn wait_needed(&self, client: IpAddr) -> Option<Duration> {
        let now = Instant::now();
        let clients = self.clients.lock();
        let allowance = clients.get(&group_of(client))?.refilled(now);
        (allowance.left < 1.0)
            .then(|| Duration::from_secs_f64((1.0 - allowance.left) / REFILL_PER_SECOND))
    }

    /// Counts a failed attempt by `client`.
    pub fn failed(&self, client: IpAddr) {
        let now = Instant::now();
        let mut clients = self.clients.lock();
        if clients.len() >= MAX_TRACKED {
            clients.retain(|_, allowance| allowance.refilled(now).left < BURST);
            if clients.len() >= MAX_TRACKED {
                // Every tracked address is throttled: an attack from very many
                // addresses, which this cannot tell apart anyway.
                clients.clear();
            }
        }
        let allowance = clients.entry(group_of(client)).or_insert(Allowance {
            left: BURST,
            at: now,
        });
        *allowance = allowance.refilled(now);
        allowance.left = (allowance.left - 1.0).max(0.0);
    }
}

/// The unit one client is counted by: its IPv4 address, or its IPv6 /64 (one host's
/// usual allocation, so a client cannot escape by rotating addresses inside it).
fn group_of(client: IpAddr) -> IpAddr {
    match client {
        IpAddr::V4(_) => client,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let network = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(network.into())
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_failures_throttles_only_that_client() {
        let throttle = FailedAuthThrottle::default();
        let attacker: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..BURST as usize {
            assert_eq!(throttle.wait_needed(attacker), None);
            throttle.failed(attacker);
        }
        let wait = throttle
            .wait_needed(attacker)
            .expect("throttled after the burst");
        assert!(
            wait <= Duration::from_secs_f64(1.0 / REFILL_PER_SECOND),
            "{wait:?}"
        );
        assert_eq!(throttle.wait_needed(other), None);
    }

    #[test]
    fn ipv6_clients_are_counted_by_their_64() {
        let throttle = FailedAuthThrottle::default();
        for host in 0..BURST as u32 {
            throttle.failed(format!("2001:db8::{host:x}").parse().unwrap());
        }
        assert!(throttle
            .wait_needed("2001:db8::ffff".parse().unwrap())
            .is_some());
        assert!(throttle
            .wait_needed("2001:db8:0:1::1".parse().unwrap())
            .is_none());
        throttle.failed("::ffff:10.1.1.1".parse().unwrap());
        assert_eq!(
            group_of("::ffff:10.1.1.1".parse().unwrap()),
            "10.1.1.1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn tracking_stays_bounded() {
        let throttle = FailedAuthThrottle::default();
        for n in 0..(MAX_TRACKED as u32 + 10) {
            throttle.failed(IpAddr::V4(n.into()));
        }
        assert!(throttle.clients.lock().len() <= MAX_TRACKED);
    }
}
