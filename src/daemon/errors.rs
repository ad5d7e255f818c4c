//! The daemon's errors: what was refused or failed, rendered to the API's
//! kind and message in one place (`into_response`).

use thiserror::Error;

use crate::api::{ErrorKind, Response};
use crate::host::clone_ns::CloneNsError;
use crate::host::netlink::NetlinkError;
use crate::host::nft::NftError;
use crate::host::tap::TapError;
use crate::leases::LeaseError;
use crate::services::ServiceError;

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
    pub fn kind(&self) -> ErrorKind {
        match self {
            DaemonError::BadRequest(_) => ErrorKind::BadRequest,
            DaemonError::UnknownNetwork { .. } => ErrorKind::UnknownNetwork,
            DaemonError::NotAllowed { .. }
            | DaemonError::Forbidden(_)
            | DaemonError::Lease(LeaseError::NotYours { .. }) => ErrorKind::NotAllowed,
            DaemonError::Busy(_) => ErrorKind::Busy,
            DaemonError::Conflict(_) | DaemonError::Lease(_) => ErrorKind::Conflict,
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
