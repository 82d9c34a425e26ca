//! Errors of the transport, with the context a user needs to act on them.

use std::net::SocketAddr;
use std::time::Duration;

use crate::frame::TransportStatus;

#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// No dafne server answers at this address.
    #[error("cannot reach a dafne server at {addr}: {reason} (is the server running and listening there?)")]
    Unreachable { addr: SocketAddr, reason: String },
    /// The peer died or closed the connection.
    #[error("connection to {peer} failed: {reason}")]
    PeerFailed { peer: String, reason: String },
    /// No answer in time.
    #[error("{what} timed out after {after:?}")]
    TimedOut { what: &'static str, after: Duration },
    /// The server refused the request at the transport level.
    #[error("server refused the request: {0:?}")]
    Rejected(TransportStatus),
    /// A payload beyond the agreed limit.
    #[error("payload of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { len: usize, limit: usize },
    /// A UCX call failed.
    #[error("UCX: {0}")]
    Ucx(String),
    /// The peer broke the protocol.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The runtime is shutting down.
    #[error("the transport runtime has shut down")]
    Shutdown,
}

impl From<dafne_ucx::Error> for TransportError {
    fn from(e: dafne_ucx::Error) -> Self {
        TransportError::Ucx(e.to_string())
    }
}

pub type Result<T, E = TransportError> = std::result::Result<T, E>;
