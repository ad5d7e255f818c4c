//! The kernel's part of a detach, which may run without the daemon's
//! lock: deleting a link waits for the kernel to let go of the device
//! (an RCU grace period: 20 ms for a TAP and 40 ms for a macvtap in the
//! benchmark), and no other client's request should wait for that.
//!
//! A detach is three steps. Under the lock, the core's `begin_detach`
//! takes the interfaces out of the attached ones, unpublishes their
//! ports and returns a `Teardown`; the interfaces stay in the state as
//! detaching, so what they hold (their leases, names, ids, MACs, their
//! guard, their network) is not given to anyone else meanwhile. Without
//! it, `Teardown::cut_off` takes macvtaps down (the core then removes
//! their hooks) and `Teardown::delete` deletes the links. Under the lock
//! again, `finish_detach` removes their guard and gives back what they
//! held.

use std::sync::Arc;

use tracing::warn;

use super::interface::CloneState;
use crate::host::netlink::NetlinkError;
use crate::host::seam::Links;
use crate::types::InterfaceId;

/// What is left to do of one detach, outside the lock.
pub struct Teardown {
    links: Arc<dyn Links>,
    /// The interfaces being detached.
    pub(super) ids: Vec<InterfaceId>,
    /// Their links' indexes.
    taps: Vec<u32>,
    /// The macvtaps among them, (index, name): taken down before their
    /// hook goes, as their VMM may still hold their fd.
    macvtaps: Vec<(u32, String)>,
    /// Clones' own state: their TAP in their namespace goes too, and the
    /// namespace with the state.
    clones: Vec<CloneState>,
    /// Whether the links were deleted (a TAP that was not keeps its
    /// guard: its client may still hold the fd).
    pub(super) deleted: Result<(), NetlinkError>,
}

impl Teardown {
    pub(super) fn new(links: Arc<dyn Links>) -> Teardown {
        Teardown {
            links,
            ids: Vec::new(),
            taps: Vec::new(),
            macvtaps: Vec::new(),
            clones: Vec::new(),
            deleted: Ok(()),
        }
    }

    /// One interface more: its link, whether it is a macvtap, and a
    /// clone's state.
    pub(super) fn add(
        &mut self,
        id: InterfaceId,
        (index, name): (u32, &str),
        macvtap: bool,
        clone: Option<CloneState>,
    ) {
        self.ids.push(id);
        self.taps.push(index);
        if macvtap {
            self.macvtaps.push((index, name.to_string()));
        }
        self.clones.extend(clone);
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether there are macvtaps to take down (and hooks to remove
    /// between that and `delete`).
    pub fn has_macvtaps(&self) -> bool {
        !self.macvtaps.is_empty()
    }

    /// Takes the macvtaps down, so that no frame of theirs passes
    /// unchecked once their hook is gone.
    pub async fn cut_off(&self) {
        for (index, name) in &self.macvtaps {
            if let Err(e) = self.links.cut_off(*index).await {
                warn!(macvtap = %name, "cannot take the macvtap down before it goes: {e}");
            }
        }
    }

    /// Deletes the links, and clones' TAPs in their namespaces.
    pub async fn delete(&mut self) {
        self.deleted = self.links.delete_links(&self.taps).await;
        for clone in &self.clones {
            clone.delete_tap().await;
        }
    }
}
