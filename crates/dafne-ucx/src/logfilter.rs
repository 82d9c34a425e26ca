//! Keeps UCX's EMFILE accept loop out of the log.
//!
//! At a full descriptor table UCX 1.13's TCP listener calls `accept` again
//! and again (its handler is level-triggered and the connection stays
//! queued), and each failure logs an error line. UCX 1.13.1 (Debian's)
//! writes one line from `sock.c:46`, format `"%s: the maximal number of
//! files that could be opened simultaneously was reached, try to increase
//! the limit ... (current: %d)"`, whose `%s` is `accept() failed (client
//! addr ...)`; other releases log `accept() failed (client addr %s): %m`
//! (`ucs_socket_accept` in `ucs/sys/sock.c`). Measured in issue 10: 2.8 GB
//! of log in 30 s; here, before this filter, 1.7 to 4.9 MB in the first
//! 0.7 s of a flood (`hostile.rs`, three runs). The listener's guard
//! (`dafne-transport::sockguard`) stops UCX accepting within one of its
//! scans once descriptors run short (see [`crate::sockets`]), but the lines
//! written before that were already megabytes.
//!
//! This installs a UCS log handler, once per process, that drops exactly
//! those lines while `errno` says EMFILE or ENFILE (UCS formats `%m` from
//! `errno` after its handlers run, so `errno` is still the `accept`'s) and
//! counts them (one per refused `accept`); [`take_refused_accepts`] hands
//! the count to the guard, which logs one summary line at most every 10 s.
//! The first refusal after each take also wakes the threads registered with
//! [`wake_on_refusal`] (the guards), so that a guard stops UCX's loop at
//! once instead of at its next scan: without it UCX refused 44,000 to
//! 103,000 accepts in the up to 250 ms before a guard's scan, with it 1 to
//! 3,843 (`hostile.rs`, the flood past the hard limit, a 2-core machine
//! shared with other builds; ARCHITECTURE "Connection floods").
//! Every other UCX message goes on to UCS's own printer unchanged. The
//! handler matches the printf format (a constant in libucs), never formats
//! the arguments, and touches nothing but atomics and (never waiting for
//! it) the list of threads to wake, so it is safe on any UCX thread.

use std::ffi::CStr;
use std::os::raw::{c_char, c_uint};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::{Thread, ThreadId};

use ucx_sys as sys;

static REFUSED: AtomicU64 = AtomicU64::new(0);
/// Set by the first refusal after a take: the wakers were unparked.
static WOKEN: AtomicBool = AtomicBool::new(false);
static WAKERS: Mutex<Vec<Thread>> = Mutex::new(Vec::new());

/// `accept` failures for want of descriptors kept out of the log since the
/// last call. The next refusal wakes the registered threads again.
pub fn take_refused_accepts() -> u64 {
    WOKEN.store(false, Ordering::Relaxed);
    REFUSED.swap(0, Ordering::Relaxed)
}

/// Whether UCX has refused an accept since the last
/// [`take_refused_accepts`].
pub fn refusing() -> bool {
    WOKEN.load(Ordering::Relaxed)
}

/// Unparks `thread` whenever UCX starts refusing accepts (module docs)
/// until the returned registration is dropped.
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

/// Whether one UCX log message, from its printf format and `errno`, is a
/// refused `accept` for want of descriptors (dropped and counted).
pub fn is_refused_accept(format: &[u8], errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::EMFILE) | Some(libc::ENFILE))
        && (format.starts_with(b"accept() failed") || format.windows(LIMIT_LINE.len()).any(|w| w == LIMIT_LINE))
}

/// A piece of the line UCX 1.13.1 prints when `accept` fails with EMFILE.
const LIMIT_LINE: &[u8] = b"the maximal number of files that could be opened simultaneously";

unsafe extern "C" fn handler(
    _file: *const c_char,
    _line: c_uint,
    _function: *const c_char,
    _level: sys::ucs_log_level_t,
    _comp_conf: *const sys::ucs_log_component_config_t,
    message: *const c_char,
    _ap: *mut std::ffi::c_void,
) -> c_uint {
    // Read before anything else can change it.
    let errno = std::io::Error::last_os_error().raw_os_error();
    if message.is_null() {
        return sys::UCS_LOG_FUNC_RC_CONTINUE;
    }
    // SAFETY: UCS passes its printf format, a NUL-terminated string constant.
    let format = unsafe { CStr::from_ptr(message) }.to_bytes();
    if is_refused_accept(format, errno) {
        REFUSED.fetch_add(1, Ordering::Relaxed);
        // Never blocks UCX's thread: if a guard is registering just now,
        // it scans within its period anyway.
        if !WOKEN.swap(true, Ordering::Relaxed) {
            if let Ok(w) = WAKERS.try_lock() {
                w.iter().for_each(Thread::unpark);
            }
        }
        sys::UCS_LOG_FUNC_RC_STOP
    } else {
        sys::UCS_LOG_FUNC_RC_CONTINUE
    }
}

/// Installs the handler, once per process. Called before a listener is
/// created, while the process has no connection UCX could be logging about
/// (UCS's handler list is not meant to change while another thread logs).
pub(crate) fn install() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        // SAFETY: `handler` has the C signature UCS calls (its `va_list`
        // argument is pointer-sized on x86-64 and never read), is `'static`,
        // and is safe on any thread (module docs).
        unsafe { sys::ucs_log_push_handler(Some(handler)) };
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_emfile_accept_lines_are_dropped() {
        let accept = b"accept() failed (client addr %s): %m";
        let limit = b"%s: the maximal number of files that could be opened simultaneously was reached, try ...";
        assert!(is_refused_accept(accept, Some(libc::EMFILE)));
        assert!(is_refused_accept(accept, Some(libc::ENFILE)));
        assert!(is_refused_accept(limit, Some(libc::EMFILE)));
        // Other failures of accept are logged as UCX logs them.
        assert!(!is_refused_accept(accept, Some(libc::ENOMEM)));
        assert!(!is_refused_accept(accept, None));
        assert!(!is_refused_accept(b"failed to close fd %d: %m", Some(libc::EMFILE)));
    }
}
