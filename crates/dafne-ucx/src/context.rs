//! The UCP context: transports, features, and the memory-registration domain.

use std::ffi::CString;
use std::ptr;
use std::sync::Arc;

use ucx_sys as sys;

use crate::error::{check, Error, Result};
use crate::stats::Stats;

/// Settings applied on top of the `UCX_*` environment when the context is made.
#[derive(Debug, Clone, Default)]
pub struct ContextOptions {
    /// Name shown in UCX logs.
    pub name: String,
    /// UCX configuration overrides, e.g. `("TLS", "tcp")` or `("NET_DEVICES", "lo")`:
    /// the same keys as the `UCX_` environment variables without the prefix.
    pub config: Vec<(String, String)>,
}

pub(crate) struct ContextInner {
    pub(crate) h: sys::ucp_context_h,
    pub(crate) stats: Stats,
    key_shape: std::sync::OnceLock<crate::memory::KeyShape>,
}

// SAFETY: the context is created with mt_workers_shared = 1, which makes UCX
// guard context-level calls (mem_map/unmap, rkey_pack) with its own lock; the
// handle itself is an opaque pointer that is never mutated by Rust.
unsafe impl Send for ContextInner {}
// SAFETY: see Send above; all Rust-side state (Stats) is atomics.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: every worker and region holds an Arc<ContextInner>, so when
        // this runs no UCX object created from the context remains.
        unsafe { sys::ucp_cleanup(self.h) };
    }
}

/// A UCP context with the features dafne uses: active messages, RMA, wakeup.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("h", &self.inner.h).finish()
    }
}

impl Context {
    pub fn new(opts: &ContextOptions) -> Result<Context> {
        let mut config: *mut sys::ucp_config_t = ptr::null_mut();
        // SAFETY: null env prefix and file name mean "defaults + UCX_* env";
        // `config` is a valid out-pointer.
        check("ucp_config_read", unsafe { sys::ucp_config_read(ptr::null(), ptr::null(), &mut config) })?;
        let guard = ConfigGuard(config);
        for (k, v) in &opts.config {
            let (ck, cv) = (cstring("ucp_config_modify", k)?, cstring("ucp_config_modify", v)?);
            // SAFETY: config is live (guard), strings are NUL-terminated and
            // outlive the call.
            check("ucp_config_modify", unsafe { sys::ucp_config_modify(guard.0, ck.as_ptr(), cv.as_ptr()) })
                .map_err(|e| Error::Invalid { op: "ucp_config_modify", reason: format!("UCX_{k}={v}: {e}") })?;
        }
        let name = cstring("ucp_init", if opts.name.is_empty() { "dafne" } else { &opts.name })?;
        let params = sys::ucp_params_t {
            field_mask: (sys::UCP_PARAM_FIELD_FEATURES
                | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED
                | sys::UCP_PARAM_FIELD_NAME) as u64,
            features: (sys::UCP_FEATURE_AM | sys::UCP_FEATURE_RMA | sys::UCP_FEATURE_WAKEUP) as u64,
            mt_workers_shared: 1,
            name: name.as_ptr(),
            ..Default::default()
        };
        let mut h: sys::ucp_context_h = ptr::null_mut();
        // Opening devices may register handlers (`handler_ids`).
        let registering = crate::handler_ids::registering();
        // SAFETY: params and config are valid for the call; h is an out-pointer.
        check("ucp_init", unsafe { sys::ucp_init(&params, guard.0, &mut h) })?;
        drop(registering);
        let ctx = Context {
            inner: Arc::new(ContextInner { h, stats: Stats::default(), key_shape: std::sync::OnceLock::new() }),
        };
        // Learn the key layout now (two small registrations) rather than on
        // the first peer key a server unpacks, which is on its hot path.
        let _ = ctx.key_shape();
        Ok(ctx)
    }

    /// The shape of this process's packed keys (learned when the context is made).
    pub(crate) fn key_shape(&self) -> &crate::memory::KeyShape {
        self.inner.key_shape.get_or_init(|| crate::memory::KeyShape::learn(self))
    }

    /// Counters of everything done through this context.
    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }
}

struct ConfigGuard(*mut sys::ucp_config_t);
impl Drop for ConfigGuard {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a successful ucp_config_read and is
        // released exactly once.
        unsafe { sys::ucp_config_release(self.0) };
    }
}

pub(crate) fn cstring(op: &'static str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Invalid { op, reason: format!("{s:?} contains a NUL byte") })
}
