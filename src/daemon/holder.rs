//! Who holds an interface, which decides when it goes: a client's
//! connection (with it), a network socket's relay (with it, and with the
//! daemon), nobody (kept past its client, until detached or silent for
//! the lease time), or nobody yet (adopted after a restart, until its
//! client re-claims it or exits).

use std::time::Instant;

use crate::host::process::Process;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Holder {
    /// A client's connection (`linnet run`, `helper`, an API client), and
    /// the client's process as it was when it connected, which a next
    /// daemon checks is still there.
    Client {
        connection: u64,
        process: Option<Process>,
    },
    /// The relay of a connection to a network's socket (and its
    /// process), which ends with the daemon: never adopted.
    NetworkSocket {
        connection: u64,
        process: Option<Process>,
    },
    /// Kept past its client's connection (`linnet attach`): the TAP's
    /// receive count when it last moved, and when.
    Kept { rx: u64, since: Instant },
    /// Attached by a previous daemon, until its client (this process)
    /// re-claims it.
    Adopted { process: Option<Process> },
}

impl Holder {
    /// The connection that holds it, if one does.
    pub fn connection(&self) -> Option<u64> {
        match self {
            Holder::Client { connection, .. } | Holder::NetworkSocket { connection, .. } => {
                Some(*connection)
            }
            Holder::Kept { .. } | Holder::Adopted { .. } => None,
        }
    }

    /// Whether `connection` holds it.
    pub fn is(&self, connection: u64) -> bool {
        self.connection() == Some(connection)
    }

    /// The process of its client, where one is known.
    pub fn process(&self) -> Option<Process> {
        match self {
            Holder::Client { process, .. }
            | Holder::NetworkSocket { process, .. }
            | Holder::Adopted { process } => *process,
            Holder::Kept { .. } => None,
        }
    }

    /// Whether no connection holds it: its user (or root) may detach it.
    pub fn is_unheld(&self) -> bool {
        matches!(self, Holder::Kept { .. } | Holder::Adopted { .. })
    }

    /// Whether its client is known to have exited: a client's or an
    /// adopted interface whose process is gone (a kept one has none by
    /// design; a network socket's relay is the daemon's child).
    pub fn client_exited(&self) -> bool {
        match self {
            Holder::Client { .. } | Holder::Adopted { .. } => {
                !self.process().is_some_and(|p| p.is_running())
            }
            Holder::NetworkSocket { .. } | Holder::Kept { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_connection_holds_and_only_unheld_ones_go_to_their_user() {
        let me = Process::of(std::process::id() as i32);
        let client = Holder::Client {
            connection: 7,
            process: me,
        };
        let relay = Holder::NetworkSocket {
            connection: 8,
            process: None,
        };
        let kept = Holder::Kept {
            rx: 0,
            since: Instant::now(),
        };
        let adopted = Holder::Adopted { process: me };
        assert!(client.is(7) && !client.is(8) && relay.is(8));
        assert_eq!((kept.connection(), adopted.connection()), (None, None));
        assert!(kept.is_unheld() && adopted.is_unheld());
        assert!(!client.is_unheld() && !relay.is_unheld());
        assert_eq!(adopted.process(), me);
        assert_eq!(relay.process(), None);
    }

    #[test]
    fn a_client_exited_when_its_process_is_gone() {
        let me = Process::of(std::process::id() as i32).expect("this process");
        let gone = Process {
            pid: me.pid,
            started: me.started + 1,
        };
        let held = |process| Holder::Client {
            connection: 1,
            process,
        };
        assert!(!held(Some(me)).client_exited());
        assert!(held(Some(gone)).client_exited(), "another start time");
        assert!(Holder::Adopted { process: None }.client_exited());
        let kept = Holder::Kept {
            rx: 0,
            since: Instant::now(),
        };
        assert!(!kept.client_exited(), "a kept one has no client");
    }
}
