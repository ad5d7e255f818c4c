//! The API's requests on the daemon, one file per concern. Each decides
//! with the daemon's parts and carries out through its core (`state`);
//! the core never calls back up here.

mod attach;
mod clone;
mod doctor;
mod forward;
mod list;
mod policy;

pub(super) use attach::{finish_unlocked, lock_for_attach, lock_when_detached};
pub(super) use doctor::add_fabric_health;
