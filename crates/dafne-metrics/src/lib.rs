//! dafne's metrics endpoint, shared by the metadata and io servers and by
//! `dafne status --metrics`.
//!
//! * [`text`]: writing counters and gauges in the Prometheus text format
//!   (version 0.0.4): `# HELP` and `# TYPE` once per family, then its
//!   samples, every one labelled with the server it comes from.
//! * [`parse`]: reading that format back, strictly (every sample line
//!   `name{labels} value`, every family typed), for gathering several
//!   servers' pages into one and for tests.
//! * [`http`]: a minimal HTTP/1.1 server for `GET /metrics`, and the client
//!   `dafne status --metrics` uses.
//!
//! # Why HTTP here
//! Every byte between dafne processes travels over UCX. The metrics port
//! is for tools outside dafne (Prometheus, curl), which speak HTTP; it
//! serves one read-only page and accepts nothing else. It listens on
//! loopback unless told otherwise, and it is built so that anyone who
//! reaches it cannot hurt the server: a request head of at most
//! [`http::MAX_HEAD`] bytes read within [`http::READ_DEADLINE`], at most
//! [`http::MAX_CONNECTIONS`] connections at once (more are answered 503
//! at once), one request per connection, the page is built only for a
//! well-formed `GET /metrics` and at most once per [`http::CACHE_FOR`].
//! A data server takes its port with
//! [`MetricsServer::start_or_elsewhere`]: metrics are optional, and a
//! taken port must never keep the server from serving its clients.

pub mod http;
pub mod parse;
pub mod text;

pub use http::{fetch, FetchError, MetricsServer, Options};
pub use parse::{parse, Family as ParsedFamily, ParseError, Sample};
pub use text::{Kind, Text};

/// `ServerInfo` → `server_info`, `Read` → `read`: an op's name as a label
/// value, in the snake case Prometheus users expect.
pub fn snake(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The process's CPU time, seconds (user and system, all threads).
pub fn process_cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// The process's resident memory, bytes (`/proc/self/statm`), if readable.
pub fn process_resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * rustix::param::page_size() as u64)
}

/// The process families every dafne server exports (the names the
/// Prometheus client libraries use).
pub fn write_process(t: &mut Text) {
    t.family("process_cpu_seconds_total", Kind::Counter, "User and system CPU time of the server process, seconds.")
        .sample_f64(&[], process_cpu_seconds());
    if let Some(rss) = process_resident_bytes() {
        t.family("process_resident_memory_bytes", Kind::Gauge, "Resident memory of the server process, bytes.")
            .sample(&[], rss);
    }
}

/// Counters given as `(name, meaning, value)` triples (a snapshot's
/// `described()`), each its own family `{prefix}{name}_total` with the
/// meaning as its help, except the names listed in `gauges`, which are
/// gauges `{prefix}{name}`.
pub fn write_fields(t: &mut Text, prefix: &str, fields: &[(&str, String, u64)], gauges: &[&str]) {
    for (name, meaning, value) in fields {
        let (full, kind) = if gauges.contains(name) {
            (format!("{prefix}{name}"), Kind::Gauge)
        } else {
            (format!("{prefix}{name}_total"), Kind::Counter)
        };
        t.family(&full, kind, meaning).sample(&[], *value);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn op_names_become_snake_case() {
        assert_eq!(super::snake("Read"), "read");
        assert_eq!(super::snake("ServerInfo"), "server_info");
        assert_eq!(super::snake("SessionOpen"), "session_open");
    }
}
