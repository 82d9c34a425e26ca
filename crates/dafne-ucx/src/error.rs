//! UCX status codes as typed errors that keep the operation's context.

use std::ffi::CStr;
use std::fmt;

use ucx_sys as sys;

/// A UCX status code (`ucs_status_t`, a signed 8-bit value in 1.13).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(pub i8);

impl Status {
    pub const OK: Status = Status(sys::UCS_OK);
    pub const IN_PROGRESS: Status = Status(sys::UCS_INPROGRESS);
    pub const BUSY: Status = Status(sys::UCS_ERR_BUSY);
    pub const CANCELED: Status = Status(sys::UCS_ERR_CANCELED);
    pub const TIMED_OUT: Status = Status(sys::UCS_ERR_TIMED_OUT);
    pub const REJECTED: Status = Status(sys::UCS_ERR_REJECTED);
    pub const MESSAGE_TRUNCATED: Status = Status(sys::UCS_ERR_MESSAGE_TRUNCATED);
    pub const ENDPOINT_TIMEOUT: Status = Status(sys::UCS_ERR_ENDPOINT_TIMEOUT);
    pub const CONNECTION_RESET: Status = Status(sys::UCS_ERR_CONNECTION_RESET);
    pub const UNREACHABLE: Status = Status(sys::UCS_ERR_UNREACHABLE);
    pub const INVALID_PARAM: Status = Status(sys::UCS_ERR_INVALID_PARAM);
    pub const NO_MEMORY: Status = Status(sys::UCS_ERR_NO_MEMORY);

    /// UCX's own description of the status.
    pub fn describe(self) -> &'static str {
        // SAFETY: ucs_status_string returns a pointer to a static,
        // NUL-terminated string for every value, including unknown ones.
        let p = unsafe { sys::ucs_status_string(self.0 as sys::ucs_status_t) };
        if p.is_null() {
            return "unknown UCX status";
        }
        // SAFETY: non-null, static and NUL-terminated (see above).
        unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("unknown UCX status")
    }

    pub fn is_ok(self) -> bool {
        self == Status::OK
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Status({} \"{}\")", self.0, self.describe())
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (UCX status {})", self.describe(), self.0)
    }
}

/// Errors from the safe UCX layer. Each variant says which call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A UCX call returned an error status.
    #[error("{op} failed: {status}")]
    Ucx { op: &'static str, status: Status },
    /// An argument was rejected before reaching UCX.
    #[error("{op}: {reason}")]
    Invalid { op: &'static str, reason: String },
    /// The endpoint has failed (peer error callback fired) earlier.
    #[error("endpoint failed earlier: {0}")]
    EndpointFailed(Status),
    /// A system call around UCX failed (e.g. `mmap` of a file to register).
    #[error("{op} failed: {source}")]
    Os { op: &'static str, source: std::io::Error },
    /// A slab range asked for overlaps a view that is still alive.
    #[error("Slab::view: bytes {offset}+{len} overlap a live view")]
    ViewTaken { offset: usize, len: usize },
}

impl Error {
    /// The UCX status behind the error, if any.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Ucx { status, .. } | Error::EndpointFailed(status) => Some(*status),
            Error::Invalid { .. } | Error::Os { .. } | Error::ViewTaken { .. } => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Turns a `ucs_status_t` into `Result`, naming the call.
pub(crate) fn check(op: &'static str, status: sys::ucs_status_t) -> Result<()> {
    if status == sys::UCS_OK as sys::ucs_status_t {
        Ok(())
    } else {
        Err(Error::Ucx { op, status: Status(status) })
    }
}
