//! Keeps a reserve of descriptors that a flood on a server's listener
//! cannot take, so that UCX's *other* listener never meets a full table.
//!
//! # Why
//!
//! A server listens twice: dafne's listener (UCX's connection manager,
//! `tcp_sockcm`, guarded by `dafne-transport`'s `sockguard`) and the TCP
//! transport's *data* listener (a `uct` tcp interface's listening socket,
//! which a client's data endpoint connects to after the handshake). A flood
//! of connections to dafne's listener that keeps reconnecting refilled the
//! descriptor table on every resume (review of the first flood fix, issue
//! 10 finding 1). Once the table was full, the next honest client's data
//! connection made the data listener's `accept` fail with EMFILE, and UCX
//! 1.13.1 then closes that listening socket for good (anything but EAGAIN
//! closes it, leaving its async handler behind): every later client got
//! "Destination is unreachable", and meta died of SIGSEGV at `dafne down`
//! (`uct_tcp_sockcm_ep_t_cleanup` under `ucp_worker_destroy`). Pausing
//! dafne's listener from the guard's thread cannot prevent it: UCX's async
//! thread accepts a thousand connections between two of the guard's looks.
//!
//! # How
//!
//! Both listeners' `accept` calls are UCX's (`ucs_socket_accept` in libucs
//! calls the C library's `accept`). The `dafne` executable defines the
//! symbol `accept` as [`dafne_gated_accept`] (`crates/dafne/build.rs`:
//! `--defsym`); the dynamic linker binds libucs's call to the executable's
//! definition first, so every `accept` UCX makes comes here, on UCX's own
//! thread, at the moment it happens. No other library or program gets
//! this: the cdylibs (`dafne-c`, `dafne-preload`, `dafne-py`) export
//! `dafne_gated_accept` under that name only and never define `accept`,
//! and until [`configure`] runs (servers only) the function is a plain
//! `accept`.
//!
//! A server runs with its soft `RLIMIT_NOFILE` below its hard one by a
//! reserve ([`reserve_for`]: 256, or a quarter of a hard limit below
//! 1,024). The kernel then refuses descriptors past the soft limit `S` to
//! everyone: when dafne's listener's `accept` meets it (EMFILE), this
//! function, still inside UCX's call,
//! 1. turns that listener's async handler off (`ucs_async_modify_handler`,
//!    events 0: connections wait in the kernel's queue),
//! 2. raises the soft limit to the hard one `H` (pause first, then raise:
//!    nothing of the flood can take the reserve), and
//! 3. answers UCX EAGAIN (UCX treats it as "nothing queued", logs nothing
//!    and keeps its listener), and wakes the guard.
//!
//! When any other `accept` (the data listener's) meets EMFILE, the table is
//! at `S` with dafne's listener still on (the two race on UCX's thread): it
//! pauses dafne's listeners and raises the limit the same way, then accepts
//! again from the reserve. Only if that fails too (the whole table, reserve
//! included, is full: dafne's listener stopped at `S`, so something else
//! took the reserve, e.g. a flood aimed at the data listener's own port)
//! does it answer EAGAIN instead of EMFILE, so that UCX keeps its listener
//! instead of closing it for good, and turns that listener's handler off
//! (level-triggered, it would call `accept` again at once: a core spinning
//! until a descriptor frees); the guard turns it back on once 64
//! descriptors are free below `H` ([`resume_others`]).
//!
//! The guard resumes dafne's listener ([`Gate::resume`]) once the table has
//! room below `S` again: it lowers the soft limit back to `S` first, then
//! turns the handler on. Arithmetic at `ulimit -Hn 1024`: `S` = 768; an
//! idle server holds 25 to 28 descriptors (`/proc/PID/fd`, measured), so
//! a flood may hold ~740 sockets. The guard would pause at 64 free below
//! `S` (704 open), but UCX fills the table faster than the guard looks,
//! so the gate pauses first, at `S` (the guard's log shows 767 open at
//! the pause in `hostile.rs`); the guard resumes at 128 free below `S`
//! (640 open) once the queue fits. While paused, the server's own files
//! and honest clients' sockets have the 256 of the reserve plus whatever
//! the guard frees: the flood cannot take them, since dafne's listener is
//! off until the soft limit is back at `S`. At `H` = 20,000 (this
//! machine's default) `S` = 19,744.
//!
//! A build script's link arguments reach only its own package's targets,
//! never the programs that depend on it (checked: a `--defsym` from a
//! dependency's build script was not in the dependent binary), so no
//! library can bring the gate along: an executable of its own (a
//! deployment's server program beside `dafne-cluster`) needs the one line
//! of `crates/dafne/build.rs` in its build script. Other executables that
//! serve (test binaries, benchmarks) do not define `accept`: [`configure`] finds the gate not in effect and raises the
//! soft limit to the hard one, as before; there a flood past the hard
//! limit meets only the guard's pause (a loop of EMFILE lines from UCX
//! until the guard's next look, and the data listener at risk).
//!
//! Counts ([`take_counts`]) go to the guard's stats and its log summary:
//! nothing is hidden from the log (UCX never sees the refusals, so it
//! writes no line about them).

use std::io;
use std::os::fd::RawFd;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::thread::{Thread, ThreadId};

use crate::sockets::OwnSockets;

/// Descriptors kept back from a hard limit of `hard` (module docs): 256,
/// or a quarter of a limit below 1,024; none below 64 (nothing to split).
pub fn reserve_for(hard: u64) -> u64 {
    if hard < 64 {
        0
    } else {
        (hard / 4).min(256)
    }
}

/// The soft limit dafne's listeners may fill (`S`); 0: not configured.
static RESERVE_LIMIT: AtomicU64 = AtomicU64::new(0);
/// The hard limit (`H`).
static HARD_LIMIT: AtomicU64 = AtomicU64::new(0);

const SLOTS: usize = 4;
/// Ports of the guarded (dafne) listeners; 0 = free slot.
static PORTS: [AtomicU32; SLOTS] = [const { AtomicU32::new(0) }; SLOTS];
/// Their descriptor numbers once the guard found them; -1 = not known.
static FDS: [AtomicI32; SLOTS] = [const { AtomicI32::new(-1) }; SLOTS];
/// Whether each is paused (by the guard or here).
static PAUSED: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];

/// Other listeners (UCX's data listener) paused here because even the
/// reserve was full: (descriptor, inode), -1 = free; the guard resumes them
/// ([`resume_others`]).
static OTHERS_FD: [AtomicI32; SLOTS] = [const { AtomicI32::new(-1) }; SLOTS];
static OTHERS_INO: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

static REFUSED: AtomicU64 = AtomicU64::new(0);
static RESCUED: AtomicU64 = AtomicU64::new(0);
static SHORT: AtomicU64 = AtomicU64::new(0);
/// Set by the first refusal after a take: the wakers were unparked.
static WOKEN: AtomicBool = AtomicBool::new(false);
static WAKERS: Mutex<Vec<Thread>> = Mutex::new(Vec::new());

/// Events UCX's TCP listeners register their handler for
/// (`UCS_EVENT_SET_EVREAD | UCS_EVENT_SET_EVERR`).
pub(crate) const LISTENER_EVENTS: u8 = 1 | 4;

/// Whether UCX's `accept` calls come to [`dafne_gated_accept`] in this
/// process (the `dafne` executable; not test binaries or libraries).
pub fn in_effect() -> bool {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name reads
    // nothing else; the result is only compared.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"accept".as_ptr()) };
    std::ptr::eq(p as *const (), dafne_gated_accept as *const ())
}

/// Sets the soft descriptor limit to the hard one less the reserve, if the
/// gate is in effect (module docs); otherwise raises it to the hard one
/// (no reserve possible: what the server had before). Returns `(S, H)`
/// when the gate is on. Call once, before listening.
pub fn configure() -> io::Result<Option<(u64, u64)>> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is valid for writes of one rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let hard = lim.rlim_max;
    let reserve = if hard == libc::RLIM_INFINITY { 0 } else { reserve_for(hard) };
    let on = in_effect() && reserve > 0;
    let soft = if on { hard - reserve } else { hard };
    set_soft(soft)?;
    if on {
        HARD_LIMIT.store(hard, Relaxed);
        RESERVE_LIMIT.store(soft, Relaxed);
        Ok(Some((soft, hard)))
    } else {
        Ok(None)
    }
}

/// `(S, H)` once [`configure`] turned the gate on.
pub fn limits() -> Option<(u64, u64)> {
    match RESERVE_LIMIT.load(Relaxed) {
        0 => None,
        s => Some((s, HARD_LIMIT.load(Relaxed))),
    }
}

fn set_soft(soft: u64) -> io::Result<()> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is valid for writes of one rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur == soft {
        return Ok(());
    }
    lim.rlim_cur = soft;
    // SAFETY: `lim` is a valid rlimit read for the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Opens the reserve: soft limit up to the hard one.
fn raise() {
    let h = HARD_LIMIT.load(Relaxed);
    if h > 0 {
        let _ = set_soft(h);
    }
}

/// What the gate did since the last [`take_counts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateCounts {
    /// Accepts on a guarded listener refused at the soft limit (each paused
    /// it, if it was on).
    pub refused: u64,
    /// Accepts on another listener (UCX's data listener) that met the soft
    /// limit and were served from the reserve.
    pub rescued: u64,
    /// Accepts on another listener refused with EAGAIN because even the
    /// reserve was full (UCX retries; its listener stays).
    pub short: u64,
}

/// Counts since the last call; the next refusal wakes the registered
/// threads again.
pub fn take_counts() -> GateCounts {
    WOKEN.store(false, Relaxed);
    GateCounts { refused: REFUSED.swap(0, Relaxed), rescued: RESCUED.swap(0, Relaxed), short: SHORT.swap(0, Relaxed) }
}

/// Whether an accept was refused since the last [`take_counts`].
pub fn refusing() -> bool {
    WOKEN.load(Relaxed)
}

/// Unparks `thread` whenever an accept is refused (the guard then looks at
/// once) until the registration is dropped.
pub fn wake_on_refusal(thread: Thread) -> WakeRegistration {
    let id = thread.id();
    WAKERS.lock().unwrap_or_else(|p| p.into_inner()).push(thread);
    WakeRegistration { id }
}

/// A thread registered with [`wake_on_refusal`]; unregisters when dropped.
#[derive(Debug)]
pub struct WakeRegistration {
    id: ThreadId,
}

impl Drop for WakeRegistration {
    fn drop(&mut self) {
        WAKERS.lock().unwrap_or_else(|p| p.into_inner()).retain(|t| t.id() != self.id);
    }
}

fn wake() {
    // Never blocks UCX's thread: a guard registering just now looks within
    // its period anyway.
    if !WOKEN.swap(true, Relaxed) {
        if let Ok(w) = WAKERS.try_lock() {
            w.iter().for_each(Thread::unpark);
        }
    }
}

/// A guarded listener's place in the gate; frees it when dropped. Must be
/// dropped before the listener is destroyed (it pauses and resumes the
/// listener's handler by descriptor number).
#[derive(Debug)]
pub struct Gate {
    slot: usize,
}

/// Registers dafne's listener on `port` (`None`: every slot taken; the
/// listener is then treated like any other).
pub fn register(port: u16) -> Option<Gate> {
    let port = u32::from(port);
    for (slot, p) in PORTS.iter().enumerate() {
        if p.compare_exchange(0, port, Relaxed, Relaxed).is_ok() {
            FDS[slot].store(-1, Relaxed);
            PAUSED[slot].store(false, Relaxed);
            return Some(Gate { slot });
        }
    }
    None
}

impl Gate {
    /// Records the listener's descriptor number (found by the guard).
    pub fn set_listener(&self, fd: RawFd) {
        FDS[self.slot].store(fd, Relaxed);
    }

    /// Whether the listener is paused now (by the guard or the gate).
    pub fn paused(&self) -> bool {
        PAUSED[self.slot].load(Relaxed)
    }

    /// Pauses the listener `fd` (inode `inode`), then opens the reserve.
    /// Returns whether UCX took it.
    pub fn pause(&self, own: &mut OwnSockets, fd: RawFd, inode: u64) -> io::Result<bool> {
        if !own.set_accepting(fd, inode, false)? {
            return Ok(false);
        }
        PAUSED[self.slot].store(true, Relaxed);
        raise();
        Ok(true)
    }

    /// Closes the reserve (soft limit back to `S`, unless another guarded
    /// listener is still paused), then resumes the listener.
    pub fn resume(&self, own: &mut OwnSockets, fd: RawFd, inode: u64) -> io::Result<bool> {
        let others_paused =
            (0..SLOTS).any(|i| i != self.slot && PORTS[i].load(Relaxed) != 0 && PAUSED[i].load(Relaxed));
        if let (Some((s, _)), false) = (limits(), others_paused) {
            set_soft(s)?;
        }
        PAUSED[self.slot].store(false, Relaxed);
        let ok = own.set_accepting(fd, inode, true)?;
        if !ok {
            PAUSED[self.slot].store(true, Relaxed);
        }
        Ok(ok)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        FDS[self.slot].store(-1, Relaxed);
        PAUSED[self.slot].store(false, Relaxed);
        PORTS[self.slot].store(0, Relaxed);
    }
}

fn errno() -> c_int {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// The local port of socket `fd`, if it is an IP socket.
fn local_port(fd: c_int) -> Option<u16> {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `addr`/`len` are valid for writes of the size given; `fd` is
    // the listening socket UCX is accepting on (live for its call).
    if unsafe { libc::getsockname(fd, (&mut addr as *mut libc::sockaddr_storage).cast(), &mut len) } != 0 {
        return None;
    }
    match i32::from(addr.ss_family) {
        // SAFETY: the kernel wrote an AF_INET address into storage large and
        // aligned enough for it.
        libc::AF_INET => Some(u16::from_be(unsafe { &*(&addr as *const _ as *const libc::sockaddr_in) }.sin_port)),
        // SAFETY: as above, AF_INET6.
        libc::AF_INET6 => Some(u16::from_be(unsafe { &*(&addr as *const _ as *const libc::sockaddr_in6) }.sin6_port)),
        _ => None,
    }
}

/// Turns UCX's handler of guarded listener `slot` off, if known and on.
fn pause_slot(slot: usize, fd: c_int) {
    if PAUSED[slot].load(Relaxed) || fd < 0 {
        return;
    }
    // SAFETY: reads no memory of ours; UCS finds the handler by number
    // under its own lock. `fd` is the guarded listener (the guard drops its
    // registration before the listener is destroyed).
    if unsafe { ucx_sys::ucs_async_modify_handler(fd, 0) } == ucx_sys::UCS_OK as ucx_sys::ucs_status_t {
        PAUSED[slot].store(true, Relaxed);
    }
}

/// `accept` without the C library (no recursion through the symbol).
///
/// # Safety
/// As `accept(2)`: `addr`/`len` null or valid for the kernel's writes.
unsafe fn raw_accept(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    // SAFETY: the caller's contract is accept's.
    unsafe { libc::syscall(libc::SYS_accept4, fd, addr, len, 0) as c_int }
}

/// The `accept` of the `dafne` executable (module docs): a plain `accept`
/// until [`configure`] turned the gate on; then an accept that meets the
/// soft limit pauses dafne's listeners and never answers UCX EMFILE.
///
/// # Safety
/// As `accept(2)`: `addr` and `len` are null or valid for the kernel's
/// writes.
#[no_mangle]
pub unsafe extern "C" fn dafne_gated_accept(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    // SAFETY: our caller's contract is accept's.
    let r = unsafe { raw_accept(fd, addr, len) };
    if r >= 0 || RESERVE_LIMIT.load(Relaxed) == 0 {
        return r;
    }
    let e = errno();
    if e != libc::EMFILE && e != libc::ENFILE {
        return r;
    }
    let port = local_port(fd).map(u32::from);
    if let Some(slot) = port.and_then(|p| PORTS.iter().position(|q| q.load(Relaxed) == p)) {
        // dafne's listener met the soft limit: pause it, then open the
        // reserve; UCX hears "nothing queued".
        pause_slot(slot, fd);
        raise();
        REFUSED.fetch_add(1, Relaxed);
        wake();
        set_errno(libc::EAGAIN);
        return -1;
    }
    // Another listener (UCX's data listener): never let it see EMFILE.
    for slot in 0..SLOTS {
        if PORTS[slot].load(Relaxed) != 0 {
            pause_slot(slot, FDS[slot].load(Relaxed));
        }
    }
    raise();
    wake();
    // SAFETY: as above.
    let r = unsafe { raw_accept(fd, addr, len) };
    if r >= 0 {
        RESCUED.fetch_add(1, Relaxed);
        return r;
    }
    let e = errno();
    if e == libc::EMFILE || e == libc::ENFILE {
        SHORT.fetch_add(1, Relaxed);
        pause_other(fd);
        set_errno(libc::EAGAIN);
    }
    -1
}

/// Turns off the handler of another listener that met a full table (its
/// handler is level-triggered: answered EAGAIN, UCX would call `accept`
/// again at once, a core spinning until a descriptor frees) and records it
/// for [`resume_others`]. Without a free record it is left on.
fn pause_other(fd: c_int) {
    // SAFETY: stat is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is valid for writes; `fd` is the listening socket UCX is
    // accepting on (live for its call). fstat needs no free descriptor.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return;
    }
    if OTHERS_FD.iter().any(|f| f.load(Relaxed) == fd) {
        return; // already recorded (and paused)
    }
    for slot in 0..SLOTS {
        if OTHERS_FD[slot].compare_exchange(-1, -2, Relaxed, Relaxed).is_ok() {
            // SAFETY: as in `pause_slot`; `fd` is live for UCX's call.
            if unsafe { ucx_sys::ucs_async_modify_handler(fd, 0) } == ucx_sys::UCS_OK as ucx_sys::ucs_status_t {
                OTHERS_INO[slot].store(st.st_ino, Relaxed);
                OTHERS_FD[slot].store(fd, std::sync::atomic::Ordering::Release);
            } else {
                OTHERS_FD[slot].store(-1, Relaxed);
            }
            return;
        }
    }
}

/// Resumes the other listeners [`dafne_gated_accept`] paused at a full
/// table (the guard calls this once descriptors are free again); the
/// inode check skips a number that names something else by now. Returns
/// how many were resumed.
pub fn resume_others(own: &mut OwnSockets) -> usize {
    let mut n = 0;
    for slot in 0..SLOTS {
        let fd = OTHERS_FD[slot].load(std::sync::atomic::Ordering::Acquire);
        if fd < 0 {
            continue;
        }
        let ino = OTHERS_INO[slot].load(Relaxed);
        if OTHERS_FD[slot].compare_exchange(fd, -1, Relaxed, Relaxed).is_ok()
            && own.set_accepting(fd, ino, true).unwrap_or(false)
        {
            n += 1;
        }
    }
    n
}

/// Whether another listener is paused at a full table now.
pub fn others_paused() -> bool {
    OTHERS_FD.iter().any(|f| f.load(Relaxed) >= 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves() {
        assert_eq!(reserve_for(1024), 256);
        assert_eq!(reserve_for(20_000), 256);
        assert_eq!(reserve_for(512), 128);
        assert_eq!(reserve_for(63), 0);
    }

    /// The gate's decisions at a full table, on plain sockets (no UCX
    /// handler to pause: `ucs_async_modify_handler` fails, which the gate
    /// tolerates). Runs in a child process: it changes the descriptor
    /// limit and the gate's process-wide state.
    #[test]
    fn at_the_soft_limit_a_guarded_listener_is_refused_and_another_served_from_the_reserve() {
        if std::env::var_os("DAFNE_GATE_CHILD").is_none() {
            let exe = std::env::current_exe().unwrap();
            let o = std::process::Command::new(exe)
                .args(["--exact", "acceptgate::tests::at_the_soft_limit_a_guarded_listener_is_refused_and_another_served_from_the_reserve", "--nocapture"])
                .env("DAFNE_GATE_CHILD", "1")
                .output()
                .unwrap();
            assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            return;
        }
        use std::os::fd::AsRawFd;
        let accept = |l: &std::net::TcpListener| {
            // SAFETY: null address pointers are allowed.
            let fd = unsafe { dafne_gated_accept(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
            (fd, errno())
        };
        let guarded = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _c1 = std::net::TcpStream::connect(guarded.local_addr().unwrap()).unwrap();
        let _c2 = std::net::TcpStream::connect(other.local_addr().unwrap()).unwrap();
        let _c3 = std::net::TcpStream::connect(other.local_addr().unwrap()).unwrap();
        let gate = register(guarded.local_addr().unwrap().port()).unwrap();
        gate.set_listener(guarded.as_raw_fd());
        // S = 200, H = 208: fill the table up to S.
        let mut old = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: `old` is valid for writes of one rlimit.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) }, 0);
        let lim = libc::rlimit { rlim_cur: 200, rlim_max: old.rlim_max };
        // SAFETY: `lim` is a valid rlimit for the call.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
        HARD_LIMIT.store(208, Relaxed);
        RESERVE_LIMIT.store(200, Relaxed);
        let mut filler = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            filler.push(f);
            assert!(filler.len() <= 200);
        }
        take_counts();
        // dafne's listener at S: refused with EAGAIN, the reserve opened.
        assert_eq!(accept(&guarded), (-1, libc::EAGAIN));
        let mut now = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) }, 0);
        assert_eq!(now.rlim_cur, 208, "the reserve was not opened");
        assert!(refusing());
        assert_eq!(take_counts(), GateCounts { refused: 1, rescued: 0, short: 0 });
        // Another listener at S (limit back to S): served from the reserve.
        set_soft(200).unwrap();
        let (fd, _) = accept(&other);
        assert!(fd >= 0, "the other listener was refused at S");
        assert_eq!(take_counts(), GateCounts { refused: 0, rescued: 1, short: 0 });
        // The whole table full, reserve included: EAGAIN, never EMFILE.
        while let Ok(f) = std::fs::File::open("/dev/null") {
            filler.push(f);
        }
        assert_eq!(accept(&other), (-1, libc::EAGAIN));
        assert_eq!(take_counts(), GateCounts { refused: 0, rescued: 0, short: 1 });
        drop(filler);
        // SAFETY: the descriptor was returned to us above.
        unsafe { libc::close(fd) };
    }

    /// A test binary does not define `accept`: the gate stays off and the
    /// function is a plain accept.
    #[test]
    fn off_unless_the_executable_defines_accept() {
        assert!(!in_effect());
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: null address pointers are allowed.
        let fd = unsafe { dafne_gated_accept(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
        assert!(fd >= 0);
        // SAFETY: the descriptor was just returned to us.
        unsafe { libc::close(fd) };
    }
}
