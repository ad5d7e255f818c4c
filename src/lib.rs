//! linnet: networks for virtual machines on Linux.
//!
//! A library only so that its two executables share the code: `linnet`
//! (src/main.rs: the daemon and every command) and `linnet-relay`
//! (src/bin/linnet-relay.rs: the per-VM relay `linnet helper` becomes once
//! attached), which links only the API client and the datapath and so
//! stays small in memory, one per VM; and `linnet-gate`
//! (src/bin/linnet-gate.rs: the confined process that judges held
//! connections by their name, one per daemon).

mod addr6;
mod api;
mod budget;
mod ceiling;
mod cli;
mod clone;
mod coexist;
mod config;
mod daemon;
mod datapath;
mod events;
mod files;
mod formed6;
mod forward;
mod frr;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod gate;
mod host;
mod learned;
mod leases;
mod metrics;
mod names;
mod policy;
mod rate;
mod secret_proxy;
mod secrets;
mod services;
mod types;

/// The command-line definition, for man pages and completions
/// (tools/gendocs).
pub use cli::command;
pub use cli::gate::main as gate_main;
pub use cli::main;
pub use cli::relay::main as relay_main;
pub use cli::secrets_proxy::main as secrets_main;

/// What the benchmark's splicing proxy (tools/spliceproxy, the name
/// check's alternative design) reads a connection's name with: the gate's
/// own reader, so the two designs differ in how the bytes travel, not in
/// how they are read.
#[doc(hidden)]
pub mod name_reader {
    pub use crate::gate::vms::compared;
    pub use crate::gate::{MAX_BYTES, Shown, shown};
}
