//! `linnet-gate`'s work: judging held connections by the name their
//! first bytes show, over the socket the daemon handed it (`serve`). The
//! process around it (`cli::gate`: confined before it reads a byte) is
//! started by `daemon::gatekeeper`.
//!
//! One thread, no runtime: a poll on the socket, a tick four times a
//! second for what waited too long. It ends when the daemon's end closes.

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use super::held::{Gate, Out};
use super::wire::{self, Control, MAX_MESSAGE, ToGate};

/// The executable's name; the daemon finds it beside its own.
pub const EXECUTABLE: &str = "linnet-gate";
/// The socket to the daemon.
pub const DAEMON_FD: RawFd = 3;
const TICK: Duration = Duration::from_millis(250);
/// Verdicts per message at most (each is `wire::VERDICT_LEN` bytes).
const VERDICTS_PER_MESSAGE: usize = 4096;

/// Sends one message on the daemon's socket `fd` (`flags` besides
/// MSG_NOSIGNAL: MSG_DONTWAIT for one that may be dropped).
pub fn send(fd: RawFd, message: &[u8], flags: libc::c_int) -> io::Result<()> {
    // SAFETY: send(2) of our buffer. Blocking, it waits as long as the
    // daemon is behind: it reads as fast as packets come.
    let n = unsafe {
        libc::send(
            fd,
            message.as_ptr().cast(),
            message.len(),
            libc::MSG_NOSIGNAL | flags,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends what `out` holds, and empties it.
fn flush(fd: RawFd, out: &mut Out, message: &mut Vec<u8>) -> io::Result<()> {
    for chunk in out.verdicts.chunks(VERDICTS_PER_MESSAGE) {
        wire::verdicts(message);
        for &(id, judged) in chunk {
            wire::add_verdict(message, id, judged);
        }
        send(fd, message, 0)?;
    }
    out.verdicts.clear();
    for judgement in out.judgements.drain(..) {
        send(fd, &wire::judgement(&judgement), 0)?;
    }
    Ok(())
}

/// Serves the daemon on `fd` until it closes its end.
pub fn serve(fd: RawFd) -> io::Result<()> {
    let mut gate = Gate::default();
    let mut out = Out::default();
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut message = Vec::with_capacity(1 + VERDICTS_PER_MESSAGE * wire::VERDICT_LEN);
    let mut last_tick = Instant::now();
    loop {
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) of one pollfd of ours.
        let ready = unsafe { libc::poll(&mut poll, 1, TICK.as_millis() as libc::c_int) };
        if ready < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // Everything waiting, then the verdicts in as few messages.
        loop {
            // SAFETY: recv(2) into our buffer.
            let n =
                unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => break,
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            if n == 0 {
                // The daemon is gone: what is held dies with its queue.
                return Ok(());
            }
            let now = Instant::now();
            match wire::to_gate(&buf[..n as usize]) {
                Ok(ToGate::Packet { id, again, bytes }) => {
                    gate.packet(id, bytes, again, now, &mut out)
                }
                Ok(ToGate::Control(Control::Vms(vms))) => gate.vms.set(vms),
                Ok(ToGate::Control(Control::Learned {
                    interface_id,
                    name,
                    addrs,
                })) => gate.vms.learned(interface_id, &name, &addrs, now),
                Ok(ToGate::Control(Control::Restored {
                    interface_id,
                    reach,
                    addrs,
                })) => gate.vms.restored(interface_id, reach, &addrs, now),
                Err(e) => {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
            }
            if out.verdicts.len() >= VERDICTS_PER_MESSAGE {
                flush(fd, &mut out, &mut message)?;
            }
        }
        let now = Instant::now();
        if now.duration_since(last_tick) >= TICK {
            gate.tick(now, &mut out);
            last_tick = now;
        }
        flush(fd, &mut out, &mut message)?;
    }
}
