//! `linnet daemon`: the only privileged process. `state` decides what the
//! kernel should hold (networks, interfaces, leases) and asks `host` to make
//! it so; `server` speaks the socket protocol and watches clients.

mod coexist;
mod forwards;
pub mod leases;
mod network;
mod server;
mod state;
mod watch;

pub use server::{Options, run};
