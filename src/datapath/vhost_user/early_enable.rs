//! Between the VMM (the vhost-user front-end) and rust-vmm's back-end: lets
//! through the `SET_VRING_ENABLE` that QEMU sends before `SET_FEATURES`.
//!
//! QEMU 7.2 (Debian 12's) enables the rx ring as it sets the virtio-net
//! device up (`peer_attach`), before the guest has acked any feature and so
//! before `SET_FEATURES`. It sends the request because the back-end offered
//! `VHOST_USER_F_PROTOCOL_FEATURES` in `GET_FEATURES` and answered
//! `GET_PROTOCOL_FEATURES`: to QEMU the protocol features are negotiated
//! from then on. rust-vmm's `vhost` (0.18) and `vhost-user-backend` (0.24)
//! accept the request only once `SET_FEATURES` has acked the bit, fail it
//! with `InactiveFeature`, and end the connection: the VM has no network.
//!
//! The fix here, without patching either crate: this thread forwards every
//! message both ways unchanged (with the descriptors attached to it), and
//! when a `SET_VRING_ENABLE` comes before any `SET_FEATURES`, it first
//! sends the back-end `SET_FEATURES` with just `PROTOCOL_FEATURES`, which
//! is what QEMU believes it negotiated. That asks for no reply, changes no
//! ring (with the bit acked, rings keep their state), and the guest's real
//! `SET_FEATURES` comes later as usual. The back-end therefore sees an order
//! the spec allows. Upstream, the check belongs on the offered features
//! rather than the acked ones; until then, this.

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::cmsg_space;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use vhost::vhost_user::VhostUserVirtioFeatures;
use vhost::vhost_user::message::{
    FrontendReq, MAX_ATTACHED_FD_ENTRIES, MAX_MSG_SIZE, VhostUserU64,
};
use vm_memory::ByteValued;

/// A message's header: request, flags and the body's size, each a u32 in
/// the host's byte order (`vhost` keeps its own type private).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    request: u32,
    flags: u32,
    size: u32,
}

const HEADER: usize = 12;
/// `flags`: protocol version 1.
const VERSION_1: u32 = 0x1;

impl Header {
    fn new(request: FrontendReq, size: usize) -> Header {
        Header {
            request: request.into(),
            flags: VERSION_1,
            size: size as u32,
        }
    }

    fn read(bytes: &[u8; HEADER]) -> Header {
        let field = |i: usize| u32::from_ne_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        Header {
            request: field(0),
            flags: field(4),
            size: field(8),
        }
    }

    fn bytes(&self) -> [u8; HEADER] {
        let mut out = [0u8; HEADER];
        out[..4].copy_from_slice(&self.request.to_ne_bytes());
        out[4..8].copy_from_slice(&self.flags.to_ne_bytes());
        out[8..].copy_from_slice(&self.size.to_ne_bytes());
        out
    }

    fn request(&self) -> Option<FrontendReq> {
        FrontendReq::try_from(self.request).ok()
    }
}

/// Forwards between `frontend` (the VMM) and `backend` until either side
/// closes. An error is a broken message or socket; the caller ends the
/// connection either way.
pub fn forward(frontend: UnixStream, backend: UnixStream) -> io::Result<()> {
    let mut features_set = false;
    let mut body = vec![0u8; MAX_MSG_SIZE];
    let mut reply = vec![0u8; MAX_MSG_SIZE + HEADER];
    loop {
        let mut fds = [
            PollFd::new(frontend.as_fd(), PollFlags::POLLIN),
            PollFd::new(backend.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let ready = |fd: &PollFd| {
            fd.revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP))
        };
        let (from_frontend, from_backend) = (ready(&fds[0]), ready(&fds[1]));
        if from_frontend {
            let Some((header, files)) = receive(&frontend, &mut body)? else {
                return Ok(());
            };
            let size = header.size as usize;
            tracing::debug!(request = ?header.request(), flags = header.flags, size, fds = files.len(), "vhost-user message");
            match header.request() {
                Some(FrontendReq::SET_FEATURES) => features_set = true,
                Some(FrontendReq::SET_VRING_ENABLE) if !features_set => {
                    send(&backend, &protocol_features_only(), &[])?;
                    features_set = true;
                }
                _ => {}
            }
            send(&backend, &[&header.bytes(), &body[..size]].concat(), &files)?;
        }
        if from_backend {
            // Replies go back as they come: nothing in them needs a look.
            let Some((len, files)) = receive_bytes(&backend, &mut reply)? else {
                return Ok(());
            };
            send(&frontend, &reply[..len], &files)?;
        }
    }
}

/// `SET_FEATURES` acking only `VHOST_USER_F_PROTOCOL_FEATURES`.
fn protocol_features_only() -> Vec<u8> {
    let value = VhostUserU64::new(VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits());
    let header = Header::new(
        FrontendReq::SET_FEATURES,
        std::mem::size_of::<VhostUserU64>(),
    );
    [&header.bytes(), value.as_slice()].concat()
}

/// One whole message from the front-end: its header, with the descriptors
/// that came with it, then its body into `body`. `None`: it closed.
fn receive(socket: &UnixStream, body: &mut [u8]) -> io::Result<Option<(Header, Vec<OwnedFd>)>> {
    let mut bytes = [0u8; HEADER];
    let Some((len, files)) = receive_bytes(socket, &mut bytes)? else {
        return Ok(None);
    };
    if len < HEADER {
        (&*socket).read_exact(&mut bytes[len..])?;
    }
    let header = Header::read(&bytes);
    let size = header.size as usize;
    if size > body.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a vhost-user message of {size} bytes, more than {MAX_MSG_SIZE}"),
        ));
    }
    (&*socket).read_exact(&mut body[..size])?;
    Ok(Some((header, files)))
}

/// What one read brings, up to `buf`'s length, and the descriptors with it.
fn receive_bytes(socket: &UnixStream, buf: &mut [u8]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut space = cmsg_space!([RawFd; MAX_ATTACHED_FD_ENTRIES]);
    let mut iov = [IoSliceMut::new(buf)];
    let message = loop {
        match recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(Errno::EINTR) => continue,
            other => break other?,
        }
    };
    let mut files = Vec::new();
    for cmsg in message.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            // SAFETY: the kernel just gave us these descriptors.
            files.extend(
                fds.into_iter()
                    .map(|fd| unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }),
            );
        }
    }
    if message.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a vhost-user message with more descriptors than the protocol allows",
        ));
    }
    match message.bytes {
        0 => Ok(None),
        n => Ok(Some((n, files))),
    }
}

/// Sends `bytes` whole, the descriptors with the first piece.
fn send(socket: &UnixStream, mut bytes: &[u8], files: &[OwnedFd]) -> io::Result<()> {
    let raw: Vec<RawFd> = files.iter().map(AsRawFd::as_raw_fd).collect();
    let mut rights: &[RawFd] = &raw;
    while !bytes.is_empty() {
        let cmsg = [ControlMessage::ScmRights(rights)];
        let cmsgs: &[ControlMessage] = if rights.is_empty() { &[] } else { &cmsg };
        match sendmsg::<()>(
            socket.as_raw_fd(),
            &[IoSlice::new(bytes)],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(n) => {
                bytes = &bytes[n..];
                rights = &[];
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vhost::vhost_user::message::VhostUserVringState;

    fn message<T: ByteValued>(request: FrontendReq, body: &T) -> Vec<u8> {
        let header = Header::new(request, std::mem::size_of::<T>());
        [&header.bytes(), body.as_slice()].concat()
    }

    fn read_message(socket: &UnixStream) -> (FrontendReq, Vec<u8>, usize) {
        let mut body = vec![0u8; MAX_MSG_SIZE];
        let (header, files) = receive(socket, &mut body).unwrap().expect("a message");
        let size = header.size as usize;
        (
            header.request().unwrap(),
            body[..size].to_vec(),
            files.len(),
        )
    }

    fn pair() -> (UnixStream, UnixStream, UnixStream, UnixStream) {
        let (vmm, frontend) = UnixStream::pair().unwrap();
        let (backend, ours) = UnixStream::pair().unwrap();
        (vmm, frontend, backend, ours)
    }

    #[test]
    fn an_enable_before_set_features_reaches_the_backend_after_protocol_features_are_acked() {
        let (vmm, frontend, backend, ours) = pair();
        let forwarder = std::thread::spawn(move || forward(frontend, ours));
        let enable = VhostUserVringState::new(0, 1);
        send(&vmm, &message(FrontendReq::SET_VRING_ENABLE, &enable), &[]).unwrap();
        let (code, body, _) = read_message(&backend);
        assert_eq!(code, FrontendReq::SET_FEATURES);
        let acked = VhostUserU64::from_slice(&body).unwrap().value;
        assert_eq!(acked, VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits());
        let (code, body, _) = read_message(&backend);
        assert_eq!(code, FrontendReq::SET_VRING_ENABLE);
        assert_eq!(body, enable.as_slice());

        // Later ones pass as they are, and only once features were set.
        let features = VhostUserU64::new(1 << 32 | 1 << 30);
        send(&vmm, &message(FrontendReq::SET_FEATURES, &features), &[]).unwrap();
        send(&vmm, &message(FrontendReq::SET_VRING_ENABLE, &enable), &[]).unwrap();
        assert_eq!(read_message(&backend).0, FrontendReq::SET_FEATURES);
        assert_eq!(read_message(&backend).0, FrontendReq::SET_VRING_ENABLE);
        drop(vmm);
        forwarder.join().unwrap().unwrap();
    }

    #[test]
    fn after_set_features_nothing_is_added_and_descriptors_and_replies_cross() {
        let (vmm, frontend, backend, ours) = pair();
        let forwarder = std::thread::spawn(move || forward(frontend, ours));
        let features = VhostUserU64::new(1 << 32 | 1 << 30);
        send(&vmm, &message(FrontendReq::SET_FEATURES, &features), &[]).unwrap();
        let kick: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        let index = VhostUserU64::new(0);
        send(&vmm, &message(FrontendReq::SET_VRING_KICK, &index), &[kick]).unwrap();
        assert_eq!(read_message(&backend).0, FrontendReq::SET_FEATURES);
        let (code, _, files) = read_message(&backend);
        assert_eq!((code, files), (FrontendReq::SET_VRING_KICK, 1));

        let mut answer = Header::new(FrontendReq::GET_FEATURES, 8);
        answer.flags |= 0x4; // a reply
        let reply = [&answer.bytes(), VhostUserU64::new(7).as_slice()].concat();
        send(&backend, &reply, &[]).unwrap();
        let mut got = vec![0u8; reply.len()];
        (&vmm).read_exact(&mut got).unwrap();
        assert_eq!(got, reply);
        drop(backend);
        forwarder.join().unwrap().unwrap();
    }

    #[test]
    fn an_oversized_message_ends_the_forwarding() {
        let (vmm, frontend, _backend, ours) = pair();
        let forwarder = std::thread::spawn(move || forward(frontend, ours));
        let header = Header::new(FrontendReq::SET_MEM_TABLE, 1 << 20);
        send(&vmm, &header.bytes(), &[]).unwrap();
        let e = forwarder.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
    }
}
