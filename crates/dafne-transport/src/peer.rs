//! Which processes of this host are a client: the owners of the client's
//! end of its TCP control connection.
//!
//! A server on the same host as a client may write the client's memory
//! through a System V segment named in the client's keys (the fastest RMA
//! on one host). A key is the client's word, so the server needs the
//! kernel's: the client's socket `(address, port) → (server port)` appears
//! in `/proc/net/tcp{,6}` with its inode, and `/proc/<pid>/fd` shows which
//! processes hold that inode. Only segments those processes created are
//! accepted (`dafne_ucx::Endpoint::set_peer_processes`). A client on
//! another host (or in another network namespace) owns no local socket and
//! is proven to be no local process: its keys' shared-memory parts are
//! dropped, as they must be. The scan runs once per connection.

use std::collections::HashSet;
use std::net::SocketAddr;

/// The pids holding the client's socket of a TCP connection from `client`
/// to our port `server_port`: `None` when that socket is not one of this
/// host's (the client is on another host, or in another network
/// namespace), else the processes /proc shows holding it (possibly none,
/// e.g. another user's processes when this one may not read their fds):
/// whether a client is local is the kernel's word, not the client's.
pub(crate) fn socket_owners(client: SocketAddr, server_port: u16) -> Option<Vec<u32>> {
    let inodes = client_socket_inodes(client, server_port);
    if inodes.is_empty() {
        return None;
    }
    let mut pids = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return Some(pids) };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else { continue };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .ok()
                .and_then(|t| socket_inode(&t.to_string_lossy()))
                .is_some_and(|i| inodes.contains(&i))
        });
        if holds {
            pids.push(pid);
        }
    }
    Some(pids)
}

fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// Inodes of established TCP sockets whose local end is `client` and whose
/// remote port is `server_port`.
fn client_socket_inodes(client: SocketAddr, server_port: u16) -> HashSet<u64> {
    let mut out = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st ... inode (field 9); 01 = ESTABLISHED.
            if f.len() < 10 || f[3] != "01" {
                continue;
            }
            let (Some(local), Some(rem)) = (parse_endpoint(f[1]), parse_endpoint(f[2])) else { continue };
            if local.1 == client.port() && rem.1 == server_port && same_ip(&local.0, client) {
                if let Ok(inode) = f[9].parse::<u64>() {
                    out.insert(inode);
                }
            }
        }
    }
    out
}

/// `ADDR:PORT` of /proc/net/tcp{,6}: the address as the kernel's 32-bit
/// words in host order (here little-endian), the port in hex.
fn parse_endpoint(s: &str) -> Option<(Vec<u8>, u16)> {
    let (a, p) = s.split_once(':')?;
    let port = u16::from_str_radix(p, 16).ok()?;
    if a.len() % 8 != 0 {
        return None;
    }
    let mut bytes = Vec::with_capacity(a.len() / 2);
    for w in 0..a.len() / 8 {
        let word = u32::from_str_radix(&a[w * 8..w * 8 + 8], 16).ok()?;
        bytes.extend_from_slice(&word.to_le_bytes());
    }
    Some((bytes, port))
}

/// Whether /proc's address bytes are `client`'s IP (IPv4, IPv6, or IPv4
/// mapped into IPv6 either way).
fn same_ip(bytes: &[u8], client: SocketAddr) -> bool {
    let v4 = |ip: std::net::IpAddr| match ip {
        std::net::IpAddr::V4(v) => Some(v),
        std::net::IpAddr::V6(v) => v.to_ipv4_mapped(),
    };
    let ours = match bytes.len() {
        4 => std::net::IpAddr::from(<[u8; 4]>::try_from(bytes).expect("4 bytes")),
        16 => std::net::IpAddr::from(<[u8; 16]>::try_from(bytes).expect("16 bytes")),
        _ => return false,
    };
    ours == client.ip() || (v4(ours).is_some() && v4(ours) == v4(client.ip()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_tcp_addresses_parse() {
        assert_eq!(parse_endpoint("0100007F:1F90"), Some((vec![127, 0, 0, 1], 8080)));
        assert!(same_ip(&[127, 0, 0, 1], "127.0.0.1:5".parse().unwrap()));
        assert!(same_ip(&[127, 0, 0, 1], "[::ffff:127.0.0.1]:5".parse().unwrap()));
        let (v6, port) = parse_endpoint("0000000000000000FFFF00000100007F:0050").unwrap();
        assert_eq!(port, 80);
        assert!(same_ip(&v6, "127.0.0.1:1".parse().unwrap()));
        assert!(!same_ip(&[10, 0, 0, 1], "127.0.0.1:5".parse().unwrap()));
        assert_eq!(parse_endpoint("zz:1"), None);
    }

    #[test]
    fn the_owner_of_a_local_connection_is_found_and_a_stranger_is_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_server_side, seen) = listener.accept().unwrap();
        assert_eq!(seen, client.local_addr().unwrap());
        assert_eq!(socket_owners(seen, port), Some(vec![std::process::id()]));
        // A port nobody connects from, and a remote address: not local.
        assert_eq!(socket_owners("127.0.0.1:1".parse().unwrap(), port), None);
        assert_eq!(socket_owners(SocketAddr::new("192.0.2.7".parse().unwrap(), seen.port()), port), None);
    }
}
