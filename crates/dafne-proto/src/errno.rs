//! POSIX error numbers (Linux numbering): the one status space of the
//! metadata protocol. A failed reply carries one; the FUSE layer hands it to
//! the kernel unchanged.
//!
//! The table in the `errnos!` invocation below is the single source of the
//! names, numbers and descriptions (the descriptions are glibc's `strerror`
//! texts; a test checks them against the host's on Linux).

use std::fmt;
use std::io;

/// Largest errno value the wire accepts (Linux's `MAX_ERRNO`).
pub const MAX_ERRNO: i32 = 4095;

/// A POSIX error number. Values outside the table are allowed (the
/// protocol carries any errno in `1..=MAX_ERRNO`); they just have no name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Errno(pub i32);

macro_rules! errnos {
    ($($name:ident = $num:literal, $desc:literal;)*) => {
        impl Errno {
            $(
                #[doc = $desc]
                pub const $name: Errno = Errno($num);
            )*
        }

        /// (number, name, description) of every errno with a name.
        const TABLE: &[(i32, &str, &str)] = &[$(($num, stringify!($name), $desc),)*];
    };
}

errnos! {
    EPERM = 1, "Operation not permitted";
    ENOENT = 2, "No such file or directory";
    EINTR = 4, "Interrupted system call";
    EIO = 5, "Input/output error";
    ENXIO = 6, "No such device or address";
    E2BIG = 7, "Argument list too long";
    EBADF = 9, "Bad file descriptor";
    EAGAIN = 11, "Resource temporarily unavailable";
    ENOMEM = 12, "Cannot allocate memory";
    EACCES = 13, "Permission denied";
    EFAULT = 14, "Bad address";
    EBUSY = 16, "Device or resource busy";
    EEXIST = 17, "File exists";
    EXDEV = 18, "Invalid cross-device link";
    ENOTDIR = 20, "Not a directory";
    EISDIR = 21, "Is a directory";
    EINVAL = 22, "Invalid argument";
    ENFILE = 23, "Too many open files in system";
    EMFILE = 24, "Too many open files";
    EFBIG = 27, "File too large";
    ENOSPC = 28, "No space left on device";
    EROFS = 30, "Read-only file system";
    EMLINK = 31, "Too many links";
    ERANGE = 34, "Numerical result out of range";
    EDEADLK = 35, "Resource deadlock avoided";
    ENAMETOOLONG = 36, "File name too long";
    ENOLCK = 37, "No locks available";
    ENOSYS = 38, "Function not implemented";
    ENOTEMPTY = 39, "Directory not empty";
    ELOOP = 40, "Too many levels of symbolic links";
    ECHRNG = 44, "Channel number out of range";
    ENODATA = 61, "No data available";
    EPROTO = 71, "Protocol error";
    EOVERFLOW = 75, "Value too large for defined data type";
    EOPNOTSUPP = 95, "Operation not supported";
    EADDRINUSE = 98, "Address already in use";
    ENOTCONN = 107, "Transport endpoint is not connected";
    ETIMEDOUT = 110, "Connection timed out";
    ESTALE = 116, "Stale file handle";
    EREMOTEIO = 121, "Remote I/O error";
    EDQUOT = 122, "Disk quota exceeded";
    EKEYREVOKED = 128, "Key has been revoked";
}

impl Errno {
    fn entry(self) -> Option<&'static (i32, &'static str, &'static str)> {
        TABLE.iter().find(|(n, _, _)| *n == self.0)
    }

    /// The symbolic name (`"ENOENT"`), if the table has this number.
    pub fn name(self) -> Option<&'static str> {
        self.entry().map(|e| e.1)
    }

    /// The description (`"No such file or directory"`), if the table has
    /// this number.
    pub fn description(self) -> Option<&'static str> {
        self.entry().map(|e| e.2)
    }

    /// Whether this value may travel as the error of a reply
    /// (`1..=MAX_ERRNO`).
    pub fn is_valid(self) -> bool {
        (1..=MAX_ERRNO).contains(&self.0)
    }

    /// The errno of an I/O error: its raw OS error, or `EIO` if it has none.
    pub fn from_io(err: &io::Error) -> Errno {
        err.raw_os_error().map_or(Errno::EIO, Errno)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.entry() {
            Some((_, name, desc)) => write!(f, "{name} ({desc})"),
            None => write!(f, "errno {}", self.0),
        }
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for io::Error {
    fn from(e: Errno) -> io::Error {
        io::Error::from_raw_os_error(e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_numbers_and_names_are_unique_and_valid() {
        for (i, (n, name, _)) in TABLE.iter().enumerate() {
            assert!(Errno(*n).is_valid(), "{name}");
            for (m, other, _) in &TABLE[i + 1..] {
                assert_ne!(n, m, "{name} and {other} share a number");
                assert_ne!(name, other);
            }
        }
    }

    #[test]
    fn display_names_and_describes() {
        assert_eq!(Errno::ENOENT.to_string(), "ENOENT (No such file or directory)");
        assert_eq!(Errno(3000).to_string(), "errno 3000");
        assert_eq!(Errno::ESTALE.name(), Some("ESTALE"));
        assert_eq!(Errno(3000).name(), None);
    }

    #[test]
    fn io_error_round_trip() {
        let e: io::Error = Errno::ENOENT.into();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(Errno::from_io(&e), Errno::ENOENT);
        let plain = io::Error::other("no os error");
        assert_eq!(Errno::from_io(&plain), Errno::EIO);
    }

    /// The table's numbers and descriptions are the host's (Linux only:
    /// other systems number differently).
    #[cfg(target_os = "linux")]
    #[test]
    fn table_matches_host_strerror() {
        for (n, name, desc) in TABLE {
            let host = io::Error::from_raw_os_error(*n).to_string();
            assert!(host.starts_with(desc), "{name} = {n}: table says {desc:?}, host says {host:?}");
        }
    }

    #[test]
    fn validity() {
        assert!(!Errno(0).is_valid());
        assert!(!Errno(-2).is_valid());
        assert!(Errno(MAX_ERRNO).is_valid());
        assert!(!Errno(MAX_ERRNO + 1).is_valid());
    }
}
