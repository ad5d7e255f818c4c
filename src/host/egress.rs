//! The rootless namespace's way out: pasta (package `passt`), or
//! slirp4netns where pasta is missing. Either gives the namespace one
//! interface, `EGRESS_IFNAME`, with the same addresses, so nothing else
//! depends on which runs: the namespace is 10.0.2.100/24, its gateway
//! 10.0.2.2 is the host's loopback, and 10.0.2.3 forwards DNS to the
//! host's resolver. linnet NATs its networks out of that interface; the
//! tool turns each flow into a socket of the user's on the host.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The namespace's interface toward the host.
pub const EGRESS_IFNAME: &str = "lnup0";
/// The namespace's own address on it.
pub const NAMESPACE_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 100);
pub const NAMESPACE_PREFIX: u8 = 24;
/// Connections to this address reach the host's 127.0.0.1.
pub const HOST_LOOPBACK: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// DNS sent here goes to the host's resolver.
pub const HOST_DNS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);
/// Jumbo frames between the namespace and the tool: fewer, larger writes.
const MTU: u32 = 65520;
/// The egress interface's queue: the VMs' traffic is routed into it (not
/// sent by a local socket, which the queue would hold back), so a tool a
/// moment late would cost them drops and TCP retransmits at the default
/// 1000 frames. What the benchmark's VM-to-host rows measure.
pub const EGRESS_TXQUEUELEN: u32 = 10000;

/// Which user-mode stack carries the namespace's traffic out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Egress {
    Pasta,
    Slirp4netns,
}

impl Egress {
    pub fn program(self) -> &'static str {
        match self {
            Egress::Pasta => "pasta",
            Egress::Slirp4netns => "slirp4netns",
        }
    }

    /// pasta when it is installed, else slirp4netns when that is.
    pub fn find() -> Option<Egress> {
        [Egress::Pasta, Egress::Slirp4netns]
            .into_iter()
            .find(|e| on_path(e.program()).is_some())
    }

    /// The command line that connects the namespaces of process `pid`
    /// (its user namespace, then its network namespace), in the
    /// foreground, logging to `log`.
    pub fn command(self, pid: u32, log: &Path) -> Vec<String> {
        let mut argv: Vec<String> = vec![self.program().into()];
        let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        match self {
            Egress::Pasta => {
                argv.extend(s(&["--foreground", "--quiet", "--config-net"]));
                // No port is forwarded either way on its own: published
                // ports are linnet's (they are refused or granted by name).
                argv.extend(s(&["-t", "none", "-u", "none", "-T", "none", "-U", "none"]));
                argv.extend(s(&["--ns-ifname", EGRESS_IFNAME]));
                argv.extend([
                    "--address".into(),
                    NAMESPACE_ADDRESS.to_string(),
                    "--netmask".into(),
                    NAMESPACE_PREFIX.to_string(),
                    "--gateway".into(),
                    HOST_LOOPBACK.to_string(),
                    "--dns-forward".into(),
                    HOST_DNS.to_string(),
                    "--mtu".into(),
                    MTU.to_string(),
                    "--log-file".into(),
                    log.display().to_string(),
                    pid.to_string(),
                ]);
            }
            // Its defaults are the addresses above.
            Egress::Slirp4netns => {
                argv.extend([
                    "--configure".into(),
                    format!("--mtu={MTU}"),
                    format!("--userns-path=/proc/{pid}/ns/user"),
                    pid.to_string(),
                    EGRESS_IFNAME.into(),
                ]);
            }
        }
        argv
    }
}

/// `program`'s path on $PATH.
pub fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Whether the network namespace of `pid` has an IPv4 default route yet
/// (read from the outside: /proc/PID/net is that process's namespace).
pub fn has_default_route(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/net/route")).is_ok_and(|t| default_route_in(&t))
}

/// Whether process `pid` (and so its namespaces) still exists.
pub fn namespace_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}/ns/net")).exists()
}

/// Whether /proc/net/route's text has a default route (destination and
/// mask 0).
fn default_route_in(table: &str) -> bool {
    table.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        f.len() > 7 && f[1] == "00000000" && f[7] == "00000000"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pasta_forwards_no_port_of_its_own_and_joins_by_pid() {
        let argv = Egress::Pasta.command(4242, Path::new("/run/user/1000/linnet/egress.log"));
        let line = argv.join(" ");
        assert!(line.starts_with("pasta --foreground"));
        assert!(line.contains("-t none -u none -T none -U none"), "{line}");
        assert!(line.contains("--address 10.0.2.100 --netmask 24 --gateway 10.0.2.2"));
        assert!(line.contains("--dns-forward 10.0.2.3"));
        assert_eq!(argv.last().unwrap(), "4242");
    }

    #[test]
    fn slirp4netns_joins_the_user_namespace_first() {
        let argv = Egress::Slirp4netns.command(7, Path::new("/x"));
        assert_eq!(
            argv,
            [
                "slirp4netns",
                "--configure",
                "--mtu=65520",
                "--userns-path=/proc/7/ns/user",
                "7",
                "lnup0"
            ]
        );
    }

    #[test]
    fn a_default_route_is_seen_in_the_route_table() {
        let header =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n";
        let on_link = "lnup0\t0002000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let default = "lnup0\t00000000\t0202000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert!(!default_route_in(&format!("{header}{on_link}")));
        assert!(default_route_in(&format!("{header}{on_link}{default}")));
    }
}
