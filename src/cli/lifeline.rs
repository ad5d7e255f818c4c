//! A client's hold on its interface across daemon restarts. The system
//! daemon leaves attached interfaces in place when it stops, and the next
//! one adopts them; the client (`linnet run`, the relay of `linnet
//! helper`) reconnects to the daemon's socket and re-claims its interface
//! with the token it got at attach. Meanwhile the kernel keeps forwarding
//! the VM's frames. A rootless daemon's interfaces go with it, so its
//! clients have no lifeline.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;

use crate::api::{Channel, Request, Response};
use crate::types::InterfaceId;

/// How often a client tries to reach a daemon that went away.
pub const RETRY: Duration = Duration::from_millis(100);

/// What a client says when the daemon went away and it waits for the next.
pub const WAITING: &str = "the linnet daemon went away; the VM keeps its network, and its interface is re-claimed when a daemon is back";

#[derive(Debug, Clone)]
pub struct Lifeline {
    pub socket: PathBuf,
    pub interface_id: InterfaceId,
    pub token: String,
}

impl Lifeline {
    /// One try. `None`: no daemon answers yet; `Some`: re-claimed on this
    /// connection. An error: the daemon there refused it (it did not adopt
    /// the interface).
    pub fn try_reclaim(&self) -> anyhow::Result<Option<Channel>> {
        let Ok(channel) = Channel::connect(&self.socket) else {
            return Ok(None);
        };
        let request = Request::Reclaim {
            interface_id: self.interface_id,
            token: self.token.clone(),
        };
        match channel.call(&request) {
            Ok((Response::Reclaimed { .. }, _)) => Ok(Some(channel)),
            Ok((Response::Error { message, .. }, _)) => {
                bail!("the linnet daemon came back without this VM's interface: {message}")
            }
            Ok((other, _)) => bail!("unexpected reply from the daemon: {other:?}"),
            // A daemon stopping again, or one that does not serve yet.
            Err(_) => Ok(None),
        }
    }

    /// Tries every `RETRY` until re-claimed or refused.
    pub fn reclaim(&self) -> anyhow::Result<Channel> {
        loop {
            if let Some(channel) = self.try_reclaim()? {
                return Ok(channel);
            }
            std::thread::sleep(RETRY);
        }
    }
}
