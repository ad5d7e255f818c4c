//! The daemon's errors: what was refused or failed, rendered to the API's
//! kind and message in one place (`into_response`).

use thiserror::Error;

use crate::api::{ErrorKind, Response};
use crate::config::Config;
use crate::forward::PortForward;
use crate::host::clone_ns::CloneNsError;
use crate::host::netlink::NetlinkError;
use crate::host::nft::NftError;
use crate::host::tap::TapError;
use crate::leases::LeaseError;
use crate::services::ServiceError;
use crate::types::{InterfaceId, MacAddr};

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("{0}")]
    BadRequest(String),
    #[error("unknown network \"{name}\"; known networks: {known} (add it to {file})")]
    UnknownNetwork {
        name: String,
        known: String,
        file: String,
    },
    #[error(
        "uid {uid} may not attach to network \"{network}\": it allows {allow}; add the user to networks.{network}.allow or to one of those groups"
    )]
    NotAllowed {
        uid: u32,
        network: String,
        allow: String,
    },
    /// The name is another interface's on the network.
    #[error(
        "network \"{network}\": the name \"{name}\" is held by interface {holder} of uid {uid}; choose another --name"
    )]
    NameHeld {
        network: String,
        name: String,
        holder: InterfaceId,
        uid: u32,
    },
    /// The interface id is attached already.
    #[error(
        "interface {id} is already attached to network \"{network}\" by pid {}; detach it first or use another --interface-id",
        shown_pid(*pid)
    )]
    Attached {
        id: InterfaceId,
        network: String,
        pid: Option<i32>,
    },
    /// Another user's interface: only its user or root may `what` it.
    #[error("interface {id} belongs to uid {owner}; only it or root may {what}")]
    NotOwner {
        id: InterfaceId,
        owner: u32,
        what: &'static str,
    },
    /// Held by another client's connection, which alone detaches it.
    #[error(
        "interface {id} belongs to another client (pid {}); only it can detach it",
        shown_pid(*pid)
    )]
    HeldByAnother { id: InterfaceId, pid: Option<i32> },
    /// A network's limit of interfaces (`per_uid`: of this uid's).
    #[error("{}", limit_message(network, *limit, *per_uid))]
    Limit {
        network: String,
        limit: u32,
        per_uid: Option<u32>,
    },
    /// The MAC is another interface's on the network.
    #[error("network \"{network}\": MAC {mac} is another interface's; choose another --mac")]
    MacTaken { network: String, mac: MacAddr },
    /// A re-claim with a wrong token, or by another user.
    #[error("interface {id} is not this client's to re-claim")]
    NotReclaimable { id: InterfaceId },
    /// A re-claim of an interface a connection holds already.
    #[error("interface {id} is held by a connection already")]
    AlreadyReclaimed { id: InterfaceId },
    /// A host port another interface's forward has.
    #[error(
        "host port {port} is already forwarded to interface {holder}{} on network \"{network}\" ({forward}); choose another host port, or remove that one with `linnet forward rm`",
        holder_name.as_ref().map(|n| format!(" ({n})")).unwrap_or_default()
    )]
    PortForwarded {
        port: String,
        holder: InterfaceId,
        holder_name: Option<String>,
        network: String,
        forward: PortForward,
    },
    /// A host port a socket in the namespace is bound to (`owner`: its
    /// process, for root's eyes only).
    #[error(
        "host port {port} is already bound by a listening socket on {addr}{} in linnet's network namespace; choose another host port or stop that service",
        owner.as_ref().map(|o| format!(" of {o}")).unwrap_or_default()
    )]
    PortBound {
        port: String,
        addr: String,
        owner: Option<String>,
    },
    /// A privileged host port asked for by a user other than root.
    #[error(
        "host port {port} is privileged (below net.ipv4.ip_unprivileged_port_start = {first}): only root may publish it; choose a host port of {first} or more"
    )]
    PrivilegedPort { port: String, first: u16 },
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Tap(#[from] TapError),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error(transparent)]
    Firewall(#[from] NftError),
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error("{0}")]
    HostSetup(String),
    #[error("{0}")]
    Internal(String),
}

impl DaemonError {
    /// `name` is no network of `config`'s: which are, and where to add it.
    pub fn unknown_network(config: &Config, name: &str) -> DaemonError {
        DaemonError::UnknownNetwork {
            name: name.into(),
            known: config
                .networks
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            file: config
                .source
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| crate::config::DEFAULT_CONFIG_PATH.into()),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            DaemonError::BadRequest(_) => ErrorKind::BadRequest,
            DaemonError::UnknownNetwork { .. } => ErrorKind::UnknownNetwork,
            DaemonError::NotAllowed { .. }
            | DaemonError::NotOwner { .. }
            | DaemonError::NotReclaimable { .. }
            | DaemonError::PrivilegedPort { .. }
            | DaemonError::Forbidden(_)
            | DaemonError::Lease(LeaseError::NotYours { .. }) => ErrorKind::NotAllowed,
            DaemonError::Busy(_)
            | DaemonError::Attached { .. }
            | DaemonError::HeldByAnother { .. }
            | DaemonError::AlreadyReclaimed { .. }
            | DaemonError::Limit { .. } => ErrorKind::Busy,
            DaemonError::Conflict(_)
            | DaemonError::NameHeld { .. }
            | DaemonError::MacTaken { .. }
            | DaemonError::PortForwarded { .. }
            | DaemonError::PortBound { .. }
            | DaemonError::Lease(_) => ErrorKind::Conflict,
            DaemonError::Tap(_)
            | DaemonError::Netlink(_)
            | DaemonError::Firewall(_)
            | DaemonError::Service(_)
            | DaemonError::HostSetup(_) => ErrorKind::HostSetup,
            DaemonError::Internal(_) => ErrorKind::Internal,
        }
    }

    pub fn into_response(self) -> Response {
        Response::Error {
            kind: self.kind(),
            message: self.to_string(),
        }
    }
}

/// A client's pid in a message ("?" when unknown).
fn shown_pid(pid: Option<i32>) -> String {
    pid.map(|p| p.to_string()).unwrap_or_else(|| "?".into())
}

fn limit_message(network: &str, limit: u32, per_uid: Option<u32>) -> String {
    match per_uid {
        None => format!(
            "network \"{network}\" has {limit} interfaces, its limit (networks.{network}.max_interfaces); detach one or raise the limit"
        ),
        Some(uid) => format!(
            "uid {uid} has {limit} interfaces on network \"{network}\", its limit (networks.{network}.max_interfaces_per_uid); detach one or raise the limit"
        ),
    }
}

impl From<CloneNsError> for DaemonError {
    fn from(e: CloneNsError) -> DaemonError {
        match e {
            CloneNsError::Tap(e) => DaemonError::Tap(e),
            CloneNsError::Netlink(e) => DaemonError::Netlink(e),
            CloneNsError::Firewall(e) => DaemonError::Firewall(e),
            other => DaemonError::HostSetup(other.to_string()),
        }
    }
}
