//! The socket operations the transport needs to defend UCX's TCP
//! connection manager against unauthenticated peers, done with descriptors
//! opened in advance so that they work when the descriptor table is full.
//!
//! Why this exists: UCX 1.13's `tcp_sockcm` reads a connection request's
//! private data into a fixed buffer whose length comes from a header the
//! peer wrote. Random bytes announce more than the buffer holds; once the
//! buffer is full UCX calls `recv(len = 0)`, which "succeeds" with nothing,
//! while the socket stays readable, so UCX's async thread spins a core for
//! as long as the socket lives (measured: issue 10, finding 11). UCX gives
//! no handle on these sockets, but they are ours: the transport's guard
//! (`dafne-transport::sockguard`) finds them in our descriptor table and
//! uses [`OwnSockets`] on them.
//!
//! # Working at a full descriptor table
//!
//! A flood of silent connections larger than the process's hard
//! `RLIMIT_NOFILE` fills the whole table: UCX accepts until `accept` fails
//! with EMFILE. Listing `/proc/self/fd` with `read_dir` and probing a
//! socket through `dup` each need a free descriptor, so the guard could do
//! nothing and the server held every descriptor until the peer left
//! (issue 10). [`OwnSockets`] therefore opens, before the server listens,
//! everything it will ever need, and never asks for a new descriptor:
//! * a descriptor of the directory `/proc/self/fd`, rewound (`lseek` 0)
//!   and re-read (`getdents64`) on every scan: procfs builds the listing
//!   from the live table on each read; link targets are read with
//!   `readlinkat` relative to it (no descriptor);
//! * a *slot*: one descriptor number we own for good, normally naming
//!   `/dev/null`. To look at socket number `fd`, `dup3(fd, slot)` makes the
//!   slot name whatever `fd` names at that instant (atomically: the slot is
//!   never free, so no other thread can take its number and the table
//!   needs no free entry), `fstat` checks that it is the socket the caller
//!   found (same inode), every call then goes to the slot, and a second
//!   `dup3` puts `/dev/null` back, dropping our reference.
//!
//! Why not call `getsockopt`/`connect` on the number itself: UCX's async
//! thread may close the number at any moment and the next `accept` (or any
//! `open` in the process) reuses the lowest free number at once, so between
//! our check and our call the number can name another socket: a genuine
//! client's, or one of UCX's own transport sockets, which we would reset.
//! Under a flood the table is full and numbers are recycled continuously,
//! which makes that race likely rather than rare. The slot holds a
//! reference of its own: once the inode matches, the socket stays that
//! socket until we let go, whatever happens to the number.
//!
//! The classic reserve descriptor (keep one spare open, close it on EMFILE,
//! accept and drop the connection, reopen) does not fit here: the accepting
//! is UCX's, on its own thread, and the number freed would most likely go
//! to UCX's next `accept` of the flood, leaving the guard without its
//! spare. The slot is never free, so nobody can take it.
//!
//! Aborting uses `connect(AF_UNSPEC)`, which disconnects a TCP socket (RST
//! to the peer, `ECONNRESET` pending on the socket, `EPOLLERR` to whoever
//! polls it) without closing the descriptor: UCX sees an error event on its
//! own socket and cleans up its endpoint itself. No privilege is needed
//! (unlike `SOCK_DESTROY`).
//!
//! # Pausing UCX's accepting
//!
//! At a full table UCX 1.13's listener (`tcp_listener.c`) is a
//! level-triggered read handler whose `accept` fails with EMFILE: it logs
//! `accept() failed` (plus a line on the open-file limit) and returns, the
//! listening socket is still readable, and UCX's async thread calls it
//! again at once: most of a core and 2.8 GB of log in 30 s (issue 10).
//! [`OwnSockets::set_accepting`] turns the listener's handler off and on
//! (`ucs_async_modify_handler`, the call UCX itself uses to change the
//! events of a socket's handler): the guard stops UCX accepting while few
//! descriptors are left, resets what it must, and lets UCX accept again
//! once there is room. Connections that arrive meanwhile wait in the
//! kernel's accept queue. The guard's looks are too slow to keep the table
//! from filling (UCX accepts a thousand connections between two of them):
//! [`crate::acceptgate`] pauses the listener from inside UCX's own
//! `accept` at a soft limit that keeps a reserve.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

/// What the kernel says about one TCP socket (`getsockname`, `TCP_INFO`,
/// `SIOCINQ`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpProbe {
    /// The socket's local port.
    pub local_port: u16,
    /// TCP state (include/net/tcp_states.h: 1 established, 8 close-wait,
    /// 10 listen).
    pub state: u8,
    /// Bytes received and not yet read by the socket's owner.
    pub unread: u32,
    /// Bytes this side sent that the peer acknowledged.
    pub bytes_acked: u64,
    /// Bytes received from the peer.
    pub bytes_received: u64,
    /// Bytes this side has sent but the peer has not acknowledged yet (for
    /// a listening socket: connections waiting in its accept queue).
    pub unacked_segments: u32,
}

/// One look at our descriptor table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableScan {
    /// Our descriptors that are sockets: (inode, descriptor number).
    pub sockets: Vec<(u64, RawFd)>,
    /// Descriptors open in the process, of every kind.
    pub open: usize,
}

/// The descriptors a socket guard needs, opened in advance (module docs).
/// One per guard thread: the slot holds one socket at a time.
#[derive(Debug)]
pub struct OwnSockets {
    dir: OwnedFd,
    null: OwnedFd,
    slot: OwnedFd,
    buf: Vec<u8>,
}

use crate::acceptgate::LISTENER_EVENTS;

fn open_cstr(path: &std::ffi::CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: `path` is NUL-terminated and lives for the call.
    let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `open` just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl OwnSockets {
    /// Opens the three descriptors (the `/proc/self/fd` directory,
    /// `/dev/null` and the slot). Call it before listening: afterwards a
    /// flood may already have taken every descriptor.
    pub fn open() -> io::Result<OwnSockets> {
        let dir = open_cstr(c"/proc/self/fd", libc::O_RDONLY | libc::O_DIRECTORY)?;
        let null = open_cstr(c"/dev/null", libc::O_RDONLY)?;
        let slot = open_cstr(c"/dev/null", libc::O_RDONLY)?;
        Ok(OwnSockets { dir, null, slot, buf: vec![0u8; 32 << 10] })
    }

    /// The descriptor numbers this guard holds itself (not to be judged).
    pub fn own_numbers(&self) -> [RawFd; 3] {
        [self.dir.as_raw_fd(), self.null.as_raw_fd(), self.slot.as_raw_fd()]
    }

    /// Lists our descriptor table without opening anything.
    pub fn scan(&mut self) -> io::Result<TableScan> {
        // SAFETY: `dir` is a directory descriptor we own; lseek reads no memory.
        if unsafe { libc::lseek(self.dir.as_raw_fd(), 0, libc::SEEK_SET) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut names: Vec<RawFd> = Vec::new();
        loop {
            // SAFETY: `buf` is valid for writes of its length; the kernel
            // writes whole `linux_dirent64` records into it and returns how
            // many bytes it wrote.
            let n = unsafe {
                libc::syscall(libc::SYS_getdents64, self.dir.as_raw_fd(), self.buf.as_mut_ptr(), self.buf.len())
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                break;
            }
            names.extend(dirent_numbers(&self.buf[..n as usize]));
        }
        let mut scan = TableScan { sockets: Vec::new(), open: names.len() };
        let mut link = [0u8; 64];
        for fd in names {
            let name = std::ffi::CString::new(fd.to_string()).expect("digits have no NUL");
            // SAFETY: `name` is NUL-terminated, `link` is valid for writes of
            // its length; readlinkat writes at most that many bytes and
            // returns the count (no NUL added).
            let r =
                unsafe { libc::readlinkat(self.dir.as_raw_fd(), name.as_ptr(), link.as_mut_ptr().cast(), link.len()) };
            if r <= 0 {
                continue; // closed meanwhile
            }
            let target = String::from_utf8_lossy(&link[..r as usize]);
            if let Some(ino) = socket_inode(&target) {
                scan.sockets.push((ino, fd));
            }
        }
        Ok(scan)
    }

    /// Runs `f` on the socket that number `fd` names if it still has inode
    /// `inode` (through the slot, module docs); `None` if the number was
    /// closed or now names something else.
    fn with_socket<T>(&mut self, fd: RawFd, inode: u64, f: impl FnOnce(BorrowedFd<'_>) -> T) -> io::Result<Option<T>> {
        if fd < 0 || self.own_numbers().contains(&fd) {
            return Ok(None);
        }
        // SAFETY: dup3 reads no memory of ours. The slot is a descriptor we
        // own; on success it names what `fd` named (its /dev/null closed),
        // on failure it is unchanged.
        if unsafe { libc::dup3(fd, self.slot.as_raw_fd(), libc::O_CLOEXEC) } < 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EBADF) { Ok(None) } else { Err(e) };
        }
        let held = Held { slot: self.slot.as_raw_fd(), null: self.null.as_raw_fd() };
        // SAFETY: stat is plain old data; all-zero is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is valid for writes; the slot is live.
        if unsafe { libc::fstat(held.slot, &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if st.st_ino != inode || (st.st_mode & libc::S_IFMT) != libc::S_IFSOCK {
            return Ok(None);
        }
        Ok(Some(f(self.slot.as_fd())))
    }

    /// `TCP_INFO` of our own socket `fd` if it still has inode `inode`.
    pub fn probe(&mut self, fd: RawFd, inode: u64) -> io::Result<Option<TcpProbe>> {
        self.with_socket(fd, inode, probe_fd)?.transpose().map(Option::flatten)
    }

    /// Disconnects our own TCP socket `fd` (if it still has inode `inode`)
    /// without closing it: the peer gets a reset and whoever polls the
    /// socket an error event. Returns whether it was done.
    pub fn abort(&mut self, fd: RawFd, inode: u64) -> io::Result<bool> {
        Ok(self.with_socket(fd, inode, abort_fd)?.transpose()?.is_some())
    }

    /// Turns UCX's handling of new connections on the listening socket `fd`
    /// (inode `inode`) off (`false`) or back on: the listener's async
    /// handler keeps its place, only the events it waits for change.
    /// Returns whether UCX took it (false: the number is not, or no longer,
    /// that listener, or UCX has no handler for it).
    ///
    /// The caller must stop calling this before the UCX listener that owns
    /// `fd` is destroyed: UCS looks handlers up by number, and the inode
    /// check here cannot stop the number from being closed and reused for
    /// another socket's handler right after it.
    pub fn set_accepting(&mut self, fd: RawFd, inode: u64, on: bool) -> io::Result<bool> {
        let same = self.with_socket(fd, inode, |_| ())?.is_some();
        if !same {
            return Ok(false);
        }
        let events = if on { LISTENER_EVENTS } else { 0 };
        // SAFETY: reads no memory of ours. UCS finds the handler by number
        // under its own lock and only changes the events its async thread
        // polls for; `fd` names the listener (checked above), which the
        // caller keeps alive (contract above).
        let status = unsafe { ucx_sys::ucs_async_modify_handler(fd, events) };
        Ok(status == ucx_sys::UCS_OK as ucx_sys::ucs_status_t)
    }
}

/// Puts `/dev/null` back into the slot when dropped (our reference to the
/// socket goes with it).
struct Held {
    slot: RawFd,
    null: RawFd,
}

impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: both are descriptors the OwnSockets owns; dup3 onto an open
        // number replaces it atomically and needs no free entry.
        unsafe { libc::dup3(self.null, self.slot, libc::O_CLOEXEC) };
    }
}

/// The descriptor numbers in a buffer of `linux_dirent64` records
/// (`d_ino` u64, `d_off` i64, `d_reclen` u16, `d_type` u8, then the
/// NUL-terminated name); `.`, `..` and anything not a number are skipped,
/// as is a truncated record.
pub fn dirent_numbers(buf: &[u8]) -> Vec<RawFd> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 19 <= buf.len() {
        let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
        if reclen < 19 || at + reclen > buf.len() {
            break;
        }
        let name = &buf[at + 19..at + reclen];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        if let Some(fd) = std::str::from_utf8(name).ok().and_then(|s| s.parse::<RawFd>().ok()) {
            out.push(fd);
        }
        at += reclen;
    }
    out
}

/// The inode of a `socket:[N]` link target.
pub fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// `TCP_INFO`, local port and unread bytes of socket `fd`; `None` if it is
/// not a TCP socket.
fn probe_fd(fd: BorrowedFd<'_>) -> io::Result<Option<TcpProbe>> {
    // SAFETY: tcp_info is plain old data; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `len` are valid for writes of the sizes given, and
    // `fd` is live for the call (borrowed).
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
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
    // SAFETY: `addr`/`alen` are valid for writes of the size given; `fd` is
    // live.
    if unsafe { libc::getsockname(fd.as_raw_fd(), (&mut addr as *mut libc::sockaddr_storage).cast(), &mut alen) } != 0 {
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
    // SAFETY: FIONREAD (= SIOCINQ on TCP) writes one int, which `unread`
    // is; `fd` is live. On a listening socket it fails (EINVAL): nothing is
    // unread there.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut unread as *mut libc::c_int) } != 0 {
        unread = 0;
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

/// `connect(AF_UNSPEC)` on `fd`: disconnects it (module docs).
fn abort_fd(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: sockaddr is plain old data; zeroed means family AF_UNSPEC.
    let addr: libc::sockaddr = unsafe { std::mem::zeroed() };
    // SAFETY: `addr` is a valid sockaddr for the length given, and `fd` is
    // live for the call (borrowed).
    let r = unsafe {
        libc::connect(fd.as_raw_fd(), &addr as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr>() as u32)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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

    #[test]
    fn probe_and_abort_touch_only_the_named_socket() {
        let mut own = OwnSockets::open().unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut server, _) = l.accept().unwrap();
        client.write_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        server.read_exact(&mut buf).unwrap();
        let ino = inode_of(server.as_fd()).unwrap();
        client.write_all(b"more").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let scan = own.scan().unwrap();
        assert!(scan.sockets.contains(&(ino, server.as_raw_fd())), "{scan:?}");
        assert!(scan.open >= 6, "{scan:?}");
        // The directory is rewound and read afresh: a new socket shows.
        let extra = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let again = own.scan().unwrap();
        assert!(again.sockets.contains(&(inode_of(extra.as_fd()).unwrap(), extra.as_raw_fd())));
        let p = own.probe(server.as_raw_fd(), ino).unwrap().unwrap();
        assert_eq!(p.bytes_received, 9);
        assert_eq!(p.unread, 4);
        assert_eq!(p.state, 1);
        assert_eq!(p.local_port, l.local_addr().unwrap().port());
        assert_eq!(p.bytes_acked, 0);
        let lp = own.probe(l.as_raw_fd(), inode_of(l.as_fd()).unwrap()).unwrap().unwrap();
        assert_eq!(lp.state, 10);
        // A wrong inode is refused: nothing happens to the socket.
        assert!(!own.abort(server.as_raw_fd(), ino + 1).unwrap());
        assert!(own.probe(server.as_raw_fd(), ino + 1).unwrap().is_none());
        server.write_all(b"x").unwrap();
        client.read_exact(&mut buf[..1]).unwrap();
        // The right one is reset: the peer sees the connection end.
        assert!(own.abort(server.as_raw_fd(), ino).unwrap());
        client.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let r = client.read(&mut buf);
        assert!(matches!(r, Ok(0)) || r.is_err(), "peer still connected: {r:?}");
        // Our descriptor is still open (not closed under its owner), and the
        // slot let go of it (it names /dev/null again).
        assert!(inode_of(server.as_fd()).is_ok());
        let slot_target = std::fs::read_link(format!("/proc/self/fd/{}", own.own_numbers()[2])).unwrap();
        assert_eq!(slot_target, std::path::Path::new("/dev/null"));
    }

    #[test]
    fn a_closed_number_or_the_guards_own_is_left_alone() {
        let mut own = OwnSockets::open().unwrap();
        assert!(own.probe(-1, 1).unwrap().is_none());
        assert!(!own.abort(-1, 1).unwrap());
        for n in own.own_numbers() {
            assert!(own.probe(n, 1).unwrap().is_none());
        }
    }

    /// The point of the module: at a full table (soft limit lowered to what
    /// is open) the listing, probing and aborting still work. Runs in a
    /// child process, since it changes the process's descriptor limit.
    #[test]
    fn works_with_no_free_descriptor() {
        if std::env::var_os("DAFNE_SOCKETS_FULL_TABLE_CHILD").is_none() {
            let exe = std::env::current_exe().unwrap();
            let o = std::process::Command::new(exe)
                .args(["--exact", "sockets::tests::works_with_no_free_descriptor", "--nocapture"])
                .env("DAFNE_SOCKETS_FULL_TABLE_CHILD", "1")
                .output()
                .unwrap();
            assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            return;
        }
        // A small table, so filling it is quick.
        let lim = libc::rlimit { rlim_cur: 256, rlim_max: libc::RLIM_INFINITY };
        let mut old = lim;
        // SAFETY: `old` is valid for writes of one rlimit.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) }, 0);
        let lim = libc::rlimit { rlim_max: old.rlim_max, ..lim };
        // SAFETY: `lim` is a valid rlimit read for the call.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
        let mut own = OwnSockets::open().unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        let ino = inode_of(server.as_fd()).unwrap();
        // Fill the table: every number below the limit taken.
        let mut filler = Vec::new();
        loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => filler.push(f),
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EMFILE));
                    break;
                }
            }
            assert!(filler.len() <= 256, "the limit did not hold");
        }
        assert!(std::fs::File::open("/dev/null").is_err());
        let scan = own.scan().unwrap();
        assert!(scan.sockets.contains(&(ino, server.as_raw_fd())));
        assert!(own.probe(server.as_raw_fd(), ino).unwrap().is_some());
        assert!(own.abort(server.as_raw_fd(), ino).unwrap());
        drop(filler);
        client.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        let r = client.read(&mut b);
        assert!(matches!(r, Ok(0)) || r.is_err(), "peer still connected: {r:?}");
    }

    #[test]
    fn dirents_parse() {
        let mut buf = Vec::new();
        for name in [".", "..", "0", "17", "x"] {
            let reclen = (19 + name.len() + 1).div_ceil(8) * 8;
            let mut rec = vec![0u8; reclen];
            rec[16..18].copy_from_slice(&(reclen as u16).to_ne_bytes());
            rec[19..19 + name.len()].copy_from_slice(name.as_bytes());
            buf.extend(rec);
        }
        assert_eq!(dirent_numbers(&buf), vec![0, 17]);
        // A truncated record ends the parse.
        assert_eq!(dirent_numbers(&buf[..buf.len() - 3]), vec![0, 17]);
        assert!(dirent_numbers(&[0u8; 10]).is_empty());
    }
}
