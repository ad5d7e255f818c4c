//! `linnet daemon`: the only privileged process. `state` decides what the
//! kernel should hold (networks, interfaces) and asks `host` to make it
//! so; each network's kind is a driver (`drivers`: linnet's own bridge, an
//! existing bridge, macvtaps on a NIC) that owns what that kind has of its
//! own; an attach is planned as data (`attach`) and then carried out.
//! `forwards`, `policies`, `guarding` and `coexist` add to the same
//! `Daemon` for their concern (published ports, connect/listen policies,
//! anti-spoofing, other firewalls and uplinks); `learning` learns LAN
//! VMs' addresses from their DHCP. `server` speaks the socket protocol and
//! watches clients; `network_sockets` accepts VMs on the networks'
//! socket_vmnet-compatible sockets, each through a relay; `watch` notices
//! when the host changes under linnet, `tap_watch` when a VMM changes its
//! TAP's MAC.

mod adoption;
mod client;
mod coexist;
mod drivers;
mod errors;
mod forwarding;
mod forwards;
mod guarding;
mod holder;
mod host_ports;
mod interface;
mod learning;
mod leftovers;
mod network_sockets;
mod plan;
mod policies;
mod records;
mod requests;
pub mod rootless;
#[cfg(test)]
mod scenarios;
mod server;
mod sessions;
mod sockets;
mod state;
mod tap_watch;
mod watch;

pub use server::{Options, Placement, run};
