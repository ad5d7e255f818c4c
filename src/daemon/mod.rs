//! `linnet daemon`: the only privileged process. `state` decides what the
//! kernel should hold (networks, interfaces; the leases live in
//! `crate::leases`, which the services read too) and asks `host` to make it
//! so; `forwards`, `policies`, `guarding` and `coexist` add to the same
//! `Daemon` for their concern (published ports, connect/listen policies,
//! anti-spoofing, other firewalls and uplinks). `server` speaks the socket
//! protocol and watches clients; `network_sockets` accepts VMs on the
//! networks' socket_vmnet-compatible sockets, each through a relay;
//! `watch` notices when the host changes under linnet, `tap_watch` when a
//! VMM changes its TAP's MAC.

mod attach;
mod coexist;
mod forwards;
mod guarding;
mod network;
mod network_sockets;
mod policies;
mod server;
mod state;
mod tap_watch;
mod watch;

pub use server::{Options, run};
