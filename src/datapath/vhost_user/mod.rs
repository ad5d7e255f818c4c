//! The `vhost-user` datapath: the VMM shares the guest's memory and the
//! virtio-net device's rings with a back-end in the VM's own relay process
//! (`linnet run`, or `linnet-relay` under `linnet helper --vhost-user`),
//! which moves frames between them and the interface's TAP (net.rs). No
//! socket per frame: QEMU's fastest datapath for an unprivileged VMM.
//!
//! The protocol is rust-vmm's (`vhost`, `vhost-user-backend`). Each VMM
//! connection gets a back-end of its own: it reaches it through
//! early_enable.rs, which lets QEMU 7.2's early `SET_VRING_ENABLE` through,
//! on a private socket the relay makes for that (rust-vmm's back-end takes
//! a listener, not a connection). A VMM that goes leaves a relay at a
//! user's path (`linnet helper`) listening for it to connect again (QEMU's
//! `reconnect=`); `linnet run`'s relay serves its one VMM, on a socket in
//! its private directory, and ends with it.

pub mod early_enable;
pub mod net;

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use thiserror::Error;
use tracing::info;
use vhost::vhost_user::{Error as ProtocolError, Listener};
use vhost_user_backend::{Error as BackendError, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

use self::net::{Fault, Faults, Net, RX_AGAIN, TAP_READABLE};
use super::Counters;

#[derive(Debug, Error)]
pub enum VhostUserError {
    #[error("cannot set up the vhost-user back-end: {0}")]
    Setup(io::Error),
    /// rust-vmm's error, as text (it may hold a thread's panic, which
    /// cannot cross threads as an error).
    #[error("the vhost-user back-end failed: {0}")]
    Backend(String),
    #[error("the VM's virtio-net device {0}; its relay stops")]
    Guest(Fault),
    #[error("the VMM's vhost-user socket failed: {0}")]
    Frontend(io::Error),
}

/// Where the VMM (the vhost-user front-end) connects.
pub enum Frontend {
    /// A socket the relay makes in its private directory
    /// (`VhostUserRelay::vmm_socket`), for one VMM of the same user
    /// (`linnet run`'s): once it connects, the path goes, and the relay
    /// ends with the connection. (QEMU takes a vhost-user chardev by
    /// path only: on one given as a descriptor it cannot pass the guest's
    /// memory.)
    OneVmm,
    /// A socket at a path it connects to, again after it restarts.
    Listening(UnixListener),
}

/// A vhost-user-net back-end for one interface, serving its VMM.
pub struct VhostUserRelay {
    tap: Arc<OwnedFd>,
    frontend: Option<Frontend>,
    mtu: u32,
    counters: Arc<Counters>,
    inner: Inner,
}

impl VhostUserRelay {
    /// Everything the relay needs but the VMM: after this, it only
    /// accepts, connects to its own socket and maps the guest's memory.
    pub fn new(
        tap: OwnedFd,
        frontend: Frontend,
        mtu: u32,
        counters: Arc<Counters>,
    ) -> Result<VhostUserRelay, VhostUserError> {
        super::port::set_nonblocking(tap.as_raw_fd()).map_err(VhostUserError::Setup)?;
        let one_vmm = matches!(frontend, Frontend::OneVmm);
        Ok(VhostUserRelay {
            tap: Arc::new(tap),
            frontend: Some(frontend),
            mtu,
            counters,
            inner: Inner::new(one_vmm).map_err(VhostUserError::Setup)?,
        })
    }

    /// The relay's own socket to its back-ends (a new back-end for each
    /// VMM connection is reached through it).
    pub fn backend_socket(&self) -> PathBuf {
        self.inner.dir.backend()
    }

    /// Reaches the back-end's socket with `connect` from now on: a
    /// confined relay may not connect itself (`cli::connector`).
    pub fn connect_backend_with(&mut self, connect: ConnectBackend) {
        self.inner.connect_with = Some(connect);
    }

    /// The socket the VMM connects to, with `Frontend::OneVmm`.
    pub fn vmm_socket(&self) -> Option<PathBuf> {
        self.inner.vmm.as_ref().map(|_| self.inner.dir.vmm())
    }

    /// What removes the relay's private directory when dropped.
    pub fn leftovers(&self) -> Leftovers {
        Leftovers(self.inner.dir.clone())
    }

    /// Serves the VMM until its connection closes (`OneVmm`), or for good
    /// (`Listening`): only a broken device or socket ends it then.
    pub fn run(mut self) -> Result<(), VhostUserError> {
        match self.frontend.take().expect("run once") {
            Frontend::OneVmm => {
                let listener = self.inner.vmm.take().expect("made with OneVmm");
                let (vmm, _) = listener.accept().map_err(VhostUserError::Frontend)?;
                // Connected both ways: nothing more to connect to.
                self.inner.dir.remove();
                drop(listener);
                self.serve(vmm)
            }
            Frontend::Listening(listener) => loop {
                let (vmm, _) = listener.accept().map_err(VhostUserError::Frontend)?;
                info!("the VMM connected");
                self.serve(vmm)?;
                info!("the VMM closed its connection; waiting for it to connect again");
            },
        }
    }

    /// One VMM connection, on a back-end of its own.
    fn serve(&mut self, vmm: UnixStream) -> Result<(), VhostUserError> {
        let faults = Arc::new(Faults::default());
        let net = Net::new(
            self.tap.clone(),
            self.mtu,
            self.counters.clone(),
            faults.clone(),
        )
        .map_err(VhostUserError::Setup)?;
        let again = net.again_fd();
        let memory = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let mut daemon =
            VhostUserDaemon::new("vhost-user".into(), Arc::new(Mutex::new(net)), memory)
                .map_err(|e| VhostUserError::Backend(e.to_string()))?;
        let ours = self.inner.connect().map_err(VhostUserError::Setup)?;
        daemon
            .start(&mut self.inner.listener)
            .map_err(|e| VhostUserError::Backend(e.to_string()))?;
        let handler = &daemon.get_epoll_handlers()[0];
        let tap_events = EventSet::IN | EventSet::EDGE_TRIGGERED;
        handler
            .register_listener(self.tap.as_raw_fd(), tap_events, TAP_READABLE.into())
            .and_then(|()| handler.register_listener(again, EventSet::IN, RX_AGAIN.into()))
            .map_err(VhostUserError::Setup)?;
        // A guest's fault ends the connection, which ends the back-end.
        let stop = ours.try_clone().map_err(VhostUserError::Setup)?;
        faults.on_fault(move || {
            let _ = stop.shutdown(Shutdown::Both);
        });
        let forwarder = std::thread::Builder::new()
            .name("vhost-user".into())
            .spawn(move || {
                let (a, b) = (vmm.try_clone(), ours.try_clone());
                let result = early_enable::forward(vmm, ours);
                for socket in [a, b].into_iter().flatten() {
                    let _ = socket.shutdown(Shutdown::Both);
                }
                result
            })
            .map_err(VhostUserError::Setup)?;
        let ended = daemon.wait();
        for handler in daemon.get_epoll_handlers() {
            handler.send_exit_event();
        }
        let forwarded = forwarder.join().unwrap_or_else(|_| {
            Err(io::Error::other(
                "the vhost-user forwarding thread panicked",
            ))
        });
        if let Some(fault) = faults.first() {
            return Err(VhostUserError::Guest(fault));
        }
        // The back-end's own error says more than what the forwarder saw
        // of it (a socket closed).
        match ended {
            Ok(())
            | Err(BackendError::HandleRequest(
                ProtocolError::Disconnected
                | ProtocolError::PartialMessage
                | ProtocolError::SocketBroken(_),
            )) => {}
            Err(e) => return Err(VhostUserError::Backend(e.to_string())),
        }
        forwarded.map_err(VhostUserError::Frontend)
    }
}

/// The relay's own socket to rust-vmm's back-end (and the VMM's, for one
/// VMM): in a directory only its user may enter, so nobody else can
/// connect first.
struct Inner {
    listener: Listener,
    dir: Arc<PrivateDir>,
    vmm: Option<UnixListener>,
    /// The first connection to it, made in `new`: a relay that serves one
    /// VMM connection makes no socket once set up.
    first: Option<UnixStream>,
    /// How later ones are made, if not by a connect of its own.
    connect_with: Option<ConnectBackend>,
}

/// What connects to the relay's back-end socket for it.
pub type ConnectBackend = Box<dyn FnMut() -> io::Result<UnixStream> + Send>;

impl Inner {
    fn new(one_vmm: bool) -> io::Result<Inner> {
        let dir = Arc::new(PrivateDir::new(&std::env::temp_dir())?);
        let listener = UnixListener::bind(dir.backend())?;
        let first = UnixStream::connect(dir.backend())?;
        let vmm = match one_vmm {
            true => Some(UnixListener::bind(dir.vmm())?),
            false => None,
        };
        Ok(Inner {
            listener: Listener::from(listener),
            dir,
            vmm,
            first: Some(first),
            connect_with: None,
        })
    }

    /// A connection to the back-end's socket, for `start` to accept.
    fn connect(&mut self) -> io::Result<UnixStream> {
        match (self.first.take(), &mut self.connect_with) {
            (Some(first), _) => Ok(first),
            (None, Some(connect)) => connect(),
            (None, None) => UnixStream::connect(self.dir.backend()),
        }
    }
}

/// The relay's private directory and the sockets in it.
struct PrivateDir(PathBuf);

/// How a relay's private directory is named: this, its pid, `-`, and
/// mkdtemp's six characters.
const PRIVATE_DIR: &str = "linnet-vhost-user-";

/// Removes from `parent` the private directories of this user's relays
/// that are gone (killed: a relay that ends removes its own). Only this
/// user's directories (anyone may make one so named in /tmp), only the
/// two sockets in them; a pid that is alive (maybe another process now)
/// keeps its directory.
fn remove_left_behind(parent: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = (name.to_str())
            .and_then(|n| n.strip_prefix(PRIVATE_DIR))
            .and_then(|rest| rest.rsplit_once('-'))
            .and_then(|(pid, _)| pid.parse::<libc::pid_t>().ok())
            .filter(|&pid| pid > 0)
        else {
            continue;
        };
        let path = entry.path();
        let ours = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && m.uid() == uid);
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if ours && gone {
            drop(PrivateDir(path));
        }
    }
}

impl PrivateDir {
    /// A new directory in `parent` that only this user may enter
    /// (mkdtemp), named with this process's pid; those a killed relay of
    /// this user's left there go first.
    fn new(parent: &Path) -> io::Result<PrivateDir> {
        use std::os::unix::ffi::OsStringExt;
        remove_left_behind(parent);
        let mut template = parent
            .join(format!("{PRIVATE_DIR}{}-XXXXXX", std::process::id()))
            .into_os_string()
            .into_vec();
        template.push(0);
        // SAFETY: a NUL-terminated template that mkdtemp fills in place.
        let made = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
        if made.is_null() {
            return Err(io::Error::last_os_error());
        }
        template.pop();
        Ok(PrivateDir(PathBuf::from(std::ffi::OsString::from_vec(
            template,
        ))))
    }

    fn backend(&self) -> PathBuf {
        self.0.join("backend")
    }

    fn vmm(&self) -> PathBuf {
        self.0.join("vmm")
    }

    /// Removes the sockets and the directory (again: nothing).
    fn remove(&self) {
        let _ = std::fs::remove_file(self.backend());
        let _ = std::fs::remove_file(self.vmm());
        let _ = std::fs::remove_dir(&self.0);
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Removes a relay's private directory when dropped: held by the thread
/// that outlives the relay's (a process ends without dropping what its
/// other threads hold).
pub struct Leftovers(Arc<PrivateDir>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        self.0.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_relays_directory_goes_and_a_live_ones_and_others_stay() {
        let parent = tempfile::tempdir().unwrap();
        let mut ended = std::process::Command::new("true").spawn().unwrap();
        let dead = ended.id();
        ended.wait().unwrap();
        let name = |pid: &dyn std::fmt::Display| format!("{PRIVATE_DIR}{pid}-a1b2c3");
        let names = [
            name(&dead),
            name(&std::process::id()),
            "linnet-vhost-user-a1b2c3".to_string(),
            name(&"x"),
        ];
        for n in &names {
            std::fs::create_dir(parent.path().join(n)).unwrap();
            std::fs::write(parent.path().join(n).join("backend"), b"").unwrap();
        }
        remove_left_behind(parent.path());
        let mut left: Vec<String> = std::fs::read_dir(parent.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want = names[1..].to_vec();
        want.sort();
        assert_eq!(left, want, "only the dead relay's directory went");
    }
}
