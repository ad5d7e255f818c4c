//! A network's spare ports (`daemon::spares` makes them): TAPs on its
//! bridge and down, owned by root, their fds held here alone.

use std::os::fd::AsFd;
use std::sync::Mutex;

use tracing::debug;

use super::Port;
use crate::host::seam::Devices;

/// How many spares a network keeps: an attach and the one after it find
/// one each while the first's spare is made again.
pub(in crate::daemon) const SPARES: usize = 2;

/// A network's spare ports (their fds the only ones).
#[derive(Default)]
pub(in crate::daemon) struct Spares {
    ready: Mutex<Vec<Port>>,
}

impl Spares {
    /// A spare for an attach, given to `uid`/`gid`; None: there is none,
    /// or the one there was is gone (deleted by hand), and a new TAP is
    /// made as without spares.
    pub fn take(&self, devices: &dyn Devices, uid: u32, gid: u32) -> Option<Port> {
        loop {
            let spare = self.ready.lock().expect("spares lock").pop()?;
            match devices.give_tap(spare.fds[0].as_fd(), uid, gid) {
                Ok(()) => return Some(spare),
                Err(e) => debug!(tap = %spare.name, "a spare TAP cannot be given ({e}): dropped"),
            }
        }
    }

    /// How many more the network wants.
    pub fn wanted(&self) -> usize {
        SPARES.saturating_sub(self.ready.lock().expect("spares lock").len())
    }

    pub fn keep(&self, spare: Port) {
        self.ready.lock().expect("spares lock").push(spare);
    }

    /// Drops them all: their TAPs go with their fds.
    pub fn clear(&self) {
        self.ready.lock().expect("spares lock").clear();
    }
}
