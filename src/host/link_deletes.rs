//! Link deletes on a thread of their own. The kernel answers RTM_DELLINK
//! only after an RCU grace period (about 20 ms for a TAP), inside the
//! `sendmsg` that asks for it: on the daemon's one thread that would stall
//! every client's request and every service behind each detach. rtnl is
//! not held through that wait, so other changes to links go on meanwhile
//! over the daemon's own connection (`netlink`).
//!
//! One thread and one blocking rtnetlink socket per `Deletes`, both made
//! where it is made (the socket lives in that network namespace); the
//! thread ends when the last clone of it is dropped.

use std::io;
use std::num::NonZeroI32;
use std::sync::mpsc;
use std::thread::JoinHandle;

use rtnetlink::packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use tokio::sync::oneshot;

/// What to delete.
#[derive(Debug, Clone, Copy)]
pub(super) enum Delete {
    /// The link with this index.
    Link(u32),
    /// Every link in this device group.
    Group(u32),
}

type Request = (Delete, oneshot::Sender<io::Result<()>>);

/// A handle to the deleting thread.
#[derive(Clone)]
pub(super) struct Deletes {
    requests: mpsc::Sender<Request>,
}

impl Deletes {
    /// Opens the socket (in the caller's network namespace) and starts the
    /// thread that uses it.
    pub(super) fn start() -> io::Result<(Deletes, JoinHandle<()>)> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        let (requests, served) = mpsc::channel::<Request>();
        let thread = std::thread::Builder::new()
            .name("linnet-rtnl".into())
            .spawn(move || serve(&socket, served))?;
        Ok((Deletes { requests }, thread))
    }

    /// Deletes `what`, waiting without holding up the caller's thread.
    pub(super) async fn delete(&self, what: Delete) -> io::Result<()> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send((what, reply))
            .map_err(|_| io::Error::other("the thread that deletes links has ended"))?;
        answer
            .await
            .map_err(|_| io::Error::other("the thread that deletes links ended mid-request"))?
    }
}

/// Answers requests, one at a time, until every handle is dropped.
fn serve(socket: &Socket, requests: mpsc::Receiver<Request>) {
    let mut buf = vec![0u8; 8192];
    for (seq, (what, reply)) in (1u32..).zip(requests) {
        // A caller that gave up (its task dropped) needs no answer.
        reply.send(delete(socket, what, seq, &mut buf)).ok();
    }
}

/// Sends one RTM_DELLINK and reads its acknowledgement.
fn delete(socket: &Socket, what: Delete, seq: u32, buf: &mut [u8]) -> io::Result<()> {
    let mut link = LinkMessage::default();
    match what {
        Delete::Link(index) => link.header.index = index,
        Delete::Group(group) => link.attributes.push(LinkAttribute::Group(group)),
    }
    let mut msg = NetlinkMessage::from(RouteNetlinkMessage::DelLink(link));
    msg.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    msg.header.sequence_number = seq;
    msg.finalize();
    let mut bytes = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut bytes);
    socket.send(&bytes, 0)?;
    loop {
        let len = socket.recv(&mut &mut buf[..], 0)?;
        if let Some(answer) = acknowledgement(&buf[..len], seq)? {
            return answer;
        }
    }
}

/// The answer to request `seq` among the messages in `datagram`, if it
/// is there: its error, or none (an ACK).
fn acknowledgement(datagram: &[u8], seq: u32) -> io::Result<Option<io::Result<()>>> {
    let mut at = 0;
    while at < datagram.len() {
        let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&datagram[at..])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        let len = msg.header.length as usize;
        if msg.header.sequence_number == seq
            && let NetlinkPayload::Error(e) = &msg.payload
        {
            return Ok(Some(match e.code {
                None => Ok(()),
                Some(code) => Err(errno(code)),
            }));
        }
        if len == 0 {
            break;
        }
        at += len.next_multiple_of(4);
    }
    Ok(None)
}

/// The kernel's negative errno as an io::Error.
fn errno(code: NonZeroI32) -> io::Error {
    io::Error::from_raw_os_error(-code.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The thread answers from the kernel (a link that is not there is
    /// ENODEV, which needs no privilege to learn) and ends once its
    /// handles are dropped: a clone's short-lived one in its namespace
    /// must leave no thread behind.
    #[test]
    fn the_thread_answers_and_ends_with_its_handles() {
        let (deletes, thread) = Deletes::start().expect("an rtnetlink socket");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let answer = runtime.block_on(deletes.delete(Delete::Link(i32::MAX as u32 - 7)));
        let e = answer.expect_err("no link has that index");
        assert!(
            matches!(e.raw_os_error(), Some(libc::ENODEV | libc::EPERM)),
            "the kernel's own answer: {e}"
        );
        assert!(!thread.is_finished(), "serving while a handle is held");
        drop(deletes);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !thread.is_finished() {
            assert!(
                std::time::Instant::now() < deadline,
                "the thread outlived its handles"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        thread.join().expect("the thread ended cleanly");
    }
}
