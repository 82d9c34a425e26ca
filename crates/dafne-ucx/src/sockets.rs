//! The two socket operations the transport needs to defend UCX's TCP
//! connection manager against unauthenticated bytes.
//!
//! Why this exists: UCX 1.13's `tcp_sockcm` reads a connection request's
//! private data into a fixed buffer whose length comes from a header the
//! peer wrote. Random bytes announce more than the buffer holds; once the
//! buffer is full UCX calls `recv(len = 0)`, which "succeeds" with nothing,
//! while the socket stays readable, so UCX's async thread spins a core for
//! as long as the socket lives (measured: issue 10, finding 11). UCX gives
//! no handle on these sockets, but they are ours: the transport finds them
//! in `/proc` (safe code, `dafne-transport::sockguard`) and uses the two
//! functions below on them.
//!
//! Both work on a *duplicate* of the descriptor and first check that the
//! duplicate still names the socket the caller found (same inode): UCX's
//! async thread may close the number at any time and the number may be
//! reused, but a duplicate keeps one socket alive and fixed, so no other
//! socket can be touched by mistake. Aborting uses `connect(AF_UNSPEC)`,
//! which disconnects a TCP socket (RST to the peer, `ECONNRESET` pending on
//! the socket, `EPOLLERR` to whoever polls it) without closing the
//! descriptor: UCX sees an error event on its own socket and cleans up its
//! endpoint itself. No privilege is needed (unlike `SOCK_DESTROY`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

/// What the kernel says about one TCP socket (`getsockname`, `TCP_INFO`,
/// `SIOCINQ`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpProbe {
    /// The socket's local port.
    pub local_port: u16,
    /// TCP state (include/net/tcp_states.h: 1 established, 8 close-wait).
    pub state: u8,
    /// Bytes received and not yet read by the socket's owner.
    pub unread: u32,
    /// Bytes this side sent that the peer acknowledged.
    pub bytes_acked: u64,
    /// Bytes received from the peer.
    pub bytes_received: u64,
    /// Bytes this side has sent but the peer has not acknowledged yet.
    pub unacked_segments: u32,
}

/// Duplicates `fd` and returns the duplicate if it still names the socket
/// with inode `inode`; `None` if the number was closed or now names
/// something else.
fn dup_if_same(fd: RawFd, inode: u64) -> io::Result<Option<OwnedFd>> {
    // SAFETY: `fcntl(F_DUPFD_CLOEXEC)` reads no memory of ours; on a closed
    // or foreign number it fails with EBADF or returns a new descriptor that
    // we then own exclusively.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::EBADF) { Ok(None) } else { Err(e) };
    }
    // SAFETY: `dup` is a descriptor fcntl just created for us; nobody else
    // holds it, so OwnedFd may close it.
    let owned = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(dup) };
    let file = std::fs::File::from(owned);
    let same = file.metadata().map(|m| m.ino() == inode).unwrap_or(false);
    Ok(same.then(|| OwnedFd::from(file)))
}

/// `TCP_INFO` of our own socket `fd` if it still has inode `inode`.
pub fn probe_own_tcp_socket(fd: RawFd, inode: u64) -> io::Result<Option<TcpProbe>> {
    let Some(dup) = dup_if_same(fd, inode)? else {
        return Ok(None);
    };
    // SAFETY: tcp_info is plain old data; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `len` are valid for writes of the sizes given, and
    // `dup` is a live descriptor we own for the duration of the call.
    let r = unsafe {
        libc::getsockopt(
            dup.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        // Not a TCP socket (ENOPROTOOPT) or not a socket: not ours to judge.
        return match e.raw_os_error() {
            Some(libc::ENOPROTOOPT) | Some(libc::ENOTSOCK) | Some(libc::EOPNOTSUPP) => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut alen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `addr`/`alen` are valid for writes of the size given; `dup` is
    // a live descriptor we own.
    if unsafe { libc::getsockname(dup.as_raw_fd(), (&mut addr as *mut libc::sockaddr_storage).cast(), &mut alen) } != 0
    {
        return Err(io::Error::last_os_error());
    }
    let local_port = match i32::from(addr.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote an AF_INET address: the storage holds
            // a sockaddr_in, which it is large and aligned enough for.
            let a = unsafe { &*(&addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            u16::from_be(a.sin_port)
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { &*(&addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            u16::from_be(a.sin6_port)
        }
        _ => return Ok(None),
    };
    let mut unread: libc::c_int = 0;
    // SAFETY: FIONREAD (= SIOCINQ on TCP) writes one int, which `unread` is; `dup` is live.
    if unsafe { libc::ioctl(dup.as_raw_fd(), libc::FIONREAD, &mut unread as *mut libc::c_int) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Some(TcpProbe {
        local_port,
        state: info.tcpi_state,
        unread: unread.max(0) as u32,
        bytes_acked: info.tcpi_bytes_acked,
        bytes_received: info.tcpi_bytes_received,
        unacked_segments: info.tcpi_unacked,
    }))
}

/// Disconnects our own TCP socket `fd` (if it still has inode `inode`)
/// without closing it: the peer gets a reset and whoever polls the socket
/// an error event. Returns whether it was done.
pub fn abort_own_tcp_socket(fd: RawFd, inode: u64) -> io::Result<bool> {
    let Some(dup) = dup_if_same(fd, inode)? else {
        return Ok(false);
    };
    // SAFETY: sockaddr is plain old data; zeroed means family AF_UNSPEC.
    let addr: libc::sockaddr = unsafe { std::mem::zeroed() };
    // SAFETY: `addr` is a valid sockaddr for the length given, and `dup` is
    // a live descriptor we own for the duration of the call.
    let r = unsafe {
        libc::connect(dup.as_raw_fd(), &addr as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr>() as u32)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(true)
}

/// Borrowing helper for tests: the inode of a descriptor we hold.
pub fn inode_of(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let owned = fd.try_clone_to_owned()?;
    Ok(std::fs::File::from(owned).metadata()?.ino())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    #[test]
    fn probe_and_abort_touch_only_the_named_socket() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut server, _) = l.accept().unwrap();
        client.write_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        server.read_exact(&mut buf).unwrap();
        let ino = inode_of(server.as_fd()).unwrap();
        client.write_all(b"more").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let p = probe_own_tcp_socket(server.as_raw_fd(), ino).unwrap().unwrap();
        assert_eq!(p.bytes_received, 9);
        assert_eq!(p.unread, 4);
        assert_eq!(p.state, 1);
        assert_eq!(p.local_port, l.local_addr().unwrap().port());
        assert_eq!(p.bytes_acked, 0);
        // A wrong inode is refused: nothing happens to the socket.
        assert!(!abort_own_tcp_socket(server.as_raw_fd(), ino + 1).unwrap());
        assert!(probe_own_tcp_socket(server.as_raw_fd(), ino + 1).unwrap().is_none());
        server.write_all(b"x").unwrap();
        client.read_exact(&mut buf[..1]).unwrap();
        // The right one is reset: the peer sees the connection end.
        assert!(abort_own_tcp_socket(server.as_raw_fd(), ino).unwrap());
        client.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let r = client.read(&mut buf);
        assert!(matches!(r, Ok(0)) || r.is_err(), "peer still connected: {r:?}");
        // Our descriptor is still open (not closed under its owner).
        assert!(inode_of(server.as_fd()).is_ok());
    }

    #[test]
    fn a_closed_number_is_left_alone() {
        assert!(probe_own_tcp_socket(-1, 1).unwrap().is_none());
        assert!(!abort_own_tcp_socket(-1, 1).unwrap());
    }
}
