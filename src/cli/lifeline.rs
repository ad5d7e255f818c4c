//! A client's hold on its interface across daemon restarts. The system
//! daemon leaves attached interfaces in place when it stops, and the next
//! one adopts them; the client (`linnet run`, the relay of `linnet
//! helper`) reconnects to the daemon's socket and re-claims its interface
//! with the token it got at attach. Meanwhile the kernel keeps forwarding
//! the VM's frames. A rootless daemon's interfaces go with it, so its
//! clients have no lifeline. The client is confined by then, and may not
//! connect: its connector (`cli::connector`) connects for it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;

use super::connector::Connector;
use crate::api::{Channel, ErrorKind, Request, Response};
use crate::types::InterfaceId;

/// How often a client tries to reach a daemon that went away.
pub const RETRY: Duration = Duration::from_millis(100);

/// What a client says when the daemon went away and it waits for the next.
pub const WAITING: &str = "the linnet daemon went away; the VM keeps its network, and its interface is re-claimed when a daemon is back";

#[derive(Debug, Clone)]
pub struct Lifeline {
    /// Connects to the daemon's socket: its target `daemon`.
    pub connector: Arc<Connector>,
    pub daemon: usize,
    pub interface_id: InterfaceId,
    pub token: String,
}

impl Lifeline {
    /// One try, which waits for the daemon's answer once connected.
    /// `None`: no daemon yet; `Some`: re-claimed on this connection. An
    /// error: the daemon there refused it (it did not adopt the interface,
    /// or it is not ours).
    pub fn try_reclaim(&self) -> anyhow::Result<Option<Channel>> {
        let Ok(fd) = self.connector.connect(self.daemon) else {
            return Ok(None);
        };
        let channel = Channel::from_fd(fd);
        // Once sent, the answer is waited for on this connection (a
        // socket systemd holds accepts before a daemon serves it): one
        // given up on could still be served, and then closed, which would
        // detach the interface.
        let request = Request::Reclaim {
            interface_id: self.interface_id,
            token: self.token.clone(),
        };
        match channel.call(&request) {
            Ok((Response::Reclaimed { .. }, _)) => Ok(Some(channel)),
            // The daemon did not adopt it, or it is not ours: final.
            Ok((
                Response::Error {
                    kind: kind @ (ErrorKind::BadRequest | ErrorKind::NotAllowed),
                    message,
                },
                _,
            )) => {
                bail!(
                    "the linnet daemon came back without this VM's interface ({kind:?}): {message}"
                )
            }
            // Busy (too many connections of ours, for a moment), or a
            // daemon stopping again.
            Ok((Response::Error { .. }, _)) | Err(_) => Ok(None),
            Ok((other, _)) => bail!("unexpected reply from the daemon: {other:?}"),
        }
    }

    /// Tries every `RETRY` until re-claimed or refused (blocking).
    pub fn reclaim(&self) -> anyhow::Result<Channel> {
        loop {
            if let Some(channel) = self.try_reclaim()? {
                return Ok(channel);
            }
            std::thread::sleep(RETRY);
        }
    }
}
