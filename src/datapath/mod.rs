//! Datapaths: how a VM's frames reach its VMM. With `tap` the VMM gets the
//! TAP fd, with `tap-name` it opens the TAP by name, and the kernel moves
//! frames; linnet is off the path. With `dgram`
//! and `stream` a relay (relay.rs) moves frames between the TAP and a unix
//! socket the VMM speaks: one frame per datagram, or each frame after its
//! length as 4 bytes big-endian (framing.rs).

pub mod coalesce;
pub mod framing;
pub mod inet;
pub mod port;
pub mod relay;
pub mod segment;
pub mod vhost_user;
pub mod vnet;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Ethernet header and one VLAN tag on top of the MTU.
pub const FRAME_OVERHEAD: usize = 18;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Datapath {
    /// The VMM gets the TAP fd (QEMU -netdev tap, Cloud Hypervisor, crosvm).
    #[default]
    Tap,
    /// A persistent TAP the VMM opens by name as the attaching user
    /// (Firecracker's host_dev_name, Cloud Hypervisor tap=, crosvm
    /// --tap-name); it goes at detach.
    #[serde(rename = "tap-name")]
    #[value(name = "tap-name")]
    TapName,
    /// A unix datagram socket, one frame per datagram (QEMU -netdev dgram, krunkit unixgram, vfkit).
    Dgram,
    /// A unix stream socket, 4-byte big-endian length before each frame (QEMU -netdev stream, passt, socket_vmnet).
    Stream,
    /// vhost-user: the VMM shares the guest's memory and virtio-net rings
    /// with linnet's back-end in the VM's relay (QEMU -netdev vhost-user).
    #[serde(rename = "vhost-user")]
    #[value(name = "vhost-user")]
    VhostUser,
}

impl fmt::Display for Datapath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Datapath::Tap => "tap",
            Datapath::TapName => "tap-name",
            Datapath::Dgram => "dgram",
            Datapath::Stream => "stream",
            Datapath::VhostUser => "vhost-user",
        })
    }
}

/// Frames, bytes and drops one way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flow {
    pub frames: u64,
    pub bytes: u64,
    pub drops: u64,
}

/// What a relay moved, each way, as it reports to the daemon.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayCounters {
    /// From the network to the VMM.
    pub to_vm: Flow,
    /// From the VMM to the network.
    pub from_vm: Flow,
}

/// A relay's live counters: written by the relay thread (once per batch),
/// read by whoever reports them.
#[derive(Debug, Default)]
pub struct Counters {
    to_vm: AtomicFlow,
    from_vm: AtomicFlow,
}

#[derive(Debug, Default)]
struct AtomicFlow {
    frames: AtomicU64,
    bytes: AtomicU64,
    drops: AtomicU64,
}

impl AtomicFlow {
    fn add(&self, frames: u64, bytes: u64) {
        self.frames.fetch_add(frames, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn drop_frames(&self, n: u64) {
        self.drops.fetch_add(n, Ordering::Relaxed);
    }

    fn load(&self) -> Flow {
        Flow {
            frames: self.frames.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            drops: self.drops.load(Ordering::Relaxed),
        }
    }
}

impl Counters {
    pub fn snapshot(&self) -> RelayCounters {
        RelayCounters {
            to_vm: self.to_vm.load(),
            from_vm: self.from_vm.load(),
        }
    }
}
