//! `linnet daemon`: the only privileged process, in layers that depend one
//! way (docs/architecture.md; `scripts/check-layers` checks):
//!
//! - the model: `errors`, `client`, `holder`, `interface`, `records`,
//!   `leftovers`;
//! - the parts, each with its own state and no `impl Daemon`: the kinds of
//!   network (`drivers`: linnet's own bridge, an existing bridge, macvtaps
//!   on a NIC), the guard (`guarding`), published ports (`forwards`),
//!   connect/listen policies (`policies`), the view of the host
//!   (`coexist`), IP forwarding (`forwarding`), a rootless daemon's host
//!   ports (`host_ports`);
//! - an attach as data (`plan`);
//! - the core (`state`): the daemon's state, and what every request shares,
//!   through the host seam (`host::seam`);
//! - the requests (`requests`), start-up and stop (`adoption`), and what
//!   the kernel tells: `watch` (the host changed under linnet), `tap_watch`
//!   (a VMM changed its TAP's MAC), `learning` (a LAN VM's DHCP),
//!   `formed6` (the IPv6 addresses a VM forms itself);
//! - connections: `sessions` (the socket protocol), `sockets`,
//!   `network_sockets` (VMs on the networks' socket_vmnet-compatible
//!   sockets, each through a relay), `metrics` (Prometheus' scrapes),
//!   `server` (the event loop), `rootless` (a user's own daemon's
//!   supervisor).
//!
//! `scenarios` runs the daemon over the fake host (`host::fake`).

mod adoption;
mod apply;
mod audit;
mod client;
mod coexist;
mod confined;
mod drivers;
mod errors;
mod formed6;
mod forwarding;
mod forwards;
mod gatekeeper;
mod guarding;
mod holder;
mod host_ports;
mod interface;
mod learning;
mod leftovers;
mod metrics;
mod network_sockets;
mod plan;
mod policies;
mod records;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use records::InterfaceRecord;
mod requests;
pub mod rootless;
#[cfg(test)]
mod scenarios;
mod secret_proxies;
mod secrets;
mod server;
mod sessions;
mod sockets;
mod spares;
mod state;
mod tap_watch;
mod teardown;
mod tidy;
mod watch;

pub use server::{Options, Placement, run};
