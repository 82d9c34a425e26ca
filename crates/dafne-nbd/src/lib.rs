//! A Network Block Device server: the MXBD idea of the seeds (a block
//! device whose blocks live in the cluster) spoken to standard clients
//! (the Linux kernel's `nbd` module, qemu, libnbd's `nbdcopy`/`nbdinfo`/
//! `nbdsh`, fio's `nbd` engine) over TCP or a Unix socket.
//!
//! # Why NBD
//! A block device lets software that wants a disk (a VM image, a file
//! system of its own, a database on raw storage) use dafne without a
//! mount: the client sees a fixed-size array of bytes, and no namespace or
//! page-cache coherence is involved. NBD is the outside protocol every
//! block client already speaks; between dafne's own processes everything
//! stays UCX (the server is a client of the cluster, `dafne nbd serve`).
//!
//! # Shape
//! * [`proto`]: the wire format as pure functions (unit-tested and
//!   mutation-tested in `fuzz/`): every byte a client sends is checked and
//!   bounded before it is trusted.
//! * [`server`]: the serving loop over a [`server::Backend`] (the export's
//!   bytes and the memory requests travel through); several requests in
//!   flight per connection, replies in completion order.
//! * [`mem`]: an in-memory backend, the reference for tests and fuzzing.
//! * [`client`]: a small pipelined client for tests and benchmarks.
//!
//! What is served: the fixed newstyle handshake with `NBD_OPT_GO`,
//! `NBD_OPT_INFO`, `NBD_OPT_LIST`, `NBD_OPT_ABORT` and
//! `NBD_OPT_EXPORT_NAME`; READ, WRITE (FUA), FLUSH, TRIM, WRITE_ZEROES
//! (NO_HOLE), DISC, with simple replies. Not served: TLS, structured
//! replies, block status, CACHE, RESIZE (each refused as the spec says).

pub mod client;
pub mod mem;
pub mod proto;
pub mod server;

pub use proto::NbdError;
pub use server::{Backend, Buffer, ExportConfig, Listener, Server, Stats, Stream};

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::client::Client;
    use super::mem::MemBackend;
    use super::proto::*;
    use super::*;

    fn server(size: usize, read_only: bool) -> Server<MemBackend> {
        let cfg = ExportConfig { name: "disk".into(), description: "test".into(), workers: 4, ..Default::default() };
        Server::new(Arc::new(MemBackend::new(size, read_only)), cfg)
    }

    /// A connection served on a thread; the client's end.
    fn connect(s: &Server<MemBackend>) -> (UnixStream, std::thread::JoinHandle<Result<(), String>>) {
        let (a, b) = UnixStream::pair().unwrap();
        let s = s.clone();
        let t = std::thread::spawn(move || s.serve_stream(Stream::Unix(b)).map_err(|e| e.to_string()));
        (a, t)
    }

    fn client(s: &Server<MemBackend>, name: &str) -> (Client, std::thread::JoinHandle<Result<(), String>>) {
        let (a, t) = connect(s);
        (Client::handshake(Stream::Unix(a), name).unwrap(), t)
    }

    #[test]
    fn go_announces_size_and_flags_and_data_round_trips() {
        let s = server(1 << 20, false);
        let (mut c, t) = client(&s, "disk");
        assert_eq!(c.size, 1 << 20);
        assert_ne!(c.flags & TF_SEND_TRIM, 0);
        assert_ne!(c.flags & TF_CAN_MULTI_CONN, 0);
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
        assert_eq!(c.call(CMD_WRITE, CMD_FLAG_FUA, 4096, &data, data.len() as u32).unwrap(), 0);
        assert_eq!(c.read(4096, 8192).unwrap().unwrap(), data);
        assert_eq!(c.call(CMD_TRIM, 0, 4096, &[], 4096).unwrap(), 0);
        assert_eq!(c.call(CMD_FLUSH, 0, 0, &[], 0).unwrap(), 0);
        let back = c.read(4096, 8192).unwrap().unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0));
        assert_eq!(back[4096..], data[4096..]);
        // Out of range, unknown command, bad flags: answered, connection kept.
        assert_eq!(c.read((1 << 20) - 1, 2).unwrap(), Err(NbdError::Inval as u32));
        assert_eq!(c.call(CMD_WRITE, 0, 1 << 20, &[1], 1).unwrap(), NbdError::NoSpc as u32);
        assert_eq!(c.call(42, 0, 0, &[], 0).unwrap(), NbdError::Inval as u32);
        assert_eq!(c.read(0, MAX_PAYLOAD + 1).unwrap(), Err(NbdError::Overflow as u32));
        assert_eq!(c.read(0, 1).unwrap().unwrap(), vec![0]);
        c.disconnect().unwrap();
        t.join().unwrap().unwrap();
        assert_eq!(s.backend().flushes.load(Ordering::Relaxed), 1);
        assert_eq!(s.backend().trims.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn many_requests_in_flight_are_all_answered_by_handle() {
        let s = server(4 << 20, false);
        let (mut c, t) = client(&s, "");
        for i in 0..64u64 {
            c.submit_write(i * 65536, &vec![i as u8; 65536], false).unwrap();
        }
        c.send().unwrap();
        let mut handles: Vec<u64> = (0..64).map(|_| c.complete(&mut Vec::new()).unwrap().handle).collect();
        handles.sort();
        assert_eq!(handles, (1..=64).collect::<Vec<u64>>());
        let mut want = std::collections::HashMap::new();
        for i in 0..64u64 {
            want.insert(c.submit_read(i * 65536, 65536).unwrap(), i as u8);
        }
        c.send().unwrap();
        for _ in 0..64 {
            let mut d = Vec::new();
            let r = c.complete(&mut d).unwrap();
            assert_eq!(r.error, 0);
            assert!(d.iter().all(|&b| b == want[&r.handle]));
        }
        c.disconnect().unwrap();
        t.join().unwrap().unwrap();
    }

    #[test]
    fn a_read_only_export_refuses_changes() {
        let s = server(65536, true);
        let (mut c, t) = client(&s, "disk");
        assert_ne!(c.flags & TF_READ_ONLY, 0);
        assert_eq!(c.call(CMD_WRITE, 0, 0, &[1, 2], 2).unwrap(), NbdError::Perm as u32);
        assert_eq!(c.call(CMD_TRIM, 0, 0, &[], 2).unwrap(), NbdError::Perm as u32);
        assert_eq!(c.read(0, 2).unwrap().unwrap(), vec![0, 0]);
        c.disconnect().unwrap();
        t.join().unwrap().unwrap();
    }

    fn option(opt: u32, data: &[u8]) -> Vec<u8> {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        b
    }

    /// Reads one option reply: (option, type, data).
    fn option_reply(a: &mut UnixStream) -> (u32, u32, Vec<u8>) {
        let mut h = [0u8; 20];
        a.read_exact(&mut h).unwrap();
        assert_eq!(u64::from_be_bytes(h[0..8].try_into().unwrap()), OPT_REPLY_MAGIC);
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        let mut d = vec![0; len as usize];
        a.read_exact(&mut d).unwrap();
        (u32::from_be_bytes(h[8..12].try_into().unwrap()), u32::from_be_bytes(h[12..16].try_into().unwrap()), d)
    }

    #[test]
    fn options_list_info_unknown_and_abort_get_their_answers() {
        let s = server(65536, false);
        let (mut a, t) = connect(&s);
        let mut g = [0u8; 18];
        a.read_exact(&mut g).unwrap();
        a.write_all(&1u32.to_be_bytes()).unwrap();
        a.write_all(&option(OPT_LIST, &[])).unwrap();
        assert_eq!(option_reply(&mut a), (OPT_LIST, REP_SERVER, list_entry(b"disk", b"test")));
        assert_eq!(option_reply(&mut a).1, REP_ACK);
        a.write_all(&option(OPT_LIST, b"x")).unwrap();
        assert_eq!(option_reply(&mut a).1, REP_ERR_INVALID);
        a.write_all(&option(OPT_STRUCTURED_REPLY, &[])).unwrap();
        assert_eq!(option_reply(&mut a).1, REP_ERR_UNSUP);
        a.write_all(&option(OPT_STARTTLS, &[])).unwrap();
        assert_eq!(option_reply(&mut a).1, REP_ERR_UNSUP);
        a.write_all(&option(12345, &[1, 2, 3])).unwrap();
        assert_eq!(option_reply(&mut a), (12345, REP_ERR_UNSUP, vec![]));
        // INFO for an unknown name, then a malformed one, then the export.
        let go = |name: &[u8], infos: &[u16]| {
            let mut d = (name.len() as u32).to_be_bytes().to_vec();
            d.extend_from_slice(name);
            d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
            infos.iter().for_each(|i| d.extend_from_slice(&i.to_be_bytes()));
            d
        };
        a.write_all(&option(OPT_INFO, &go(b"nope", &[]))).unwrap();
        assert_eq!(option_reply(&mut a).1, REP_ERR_UNKNOWN);
        a.write_all(&option(OPT_INFO, &[0, 0, 0, 9, 1])).unwrap();
        assert_eq!(option_reply(&mut a).1, REP_ERR_INVALID);
        a.write_all(&option(OPT_INFO, &go(b"disk", &[INFO_BLOCK_SIZE, INFO_NAME]))).unwrap();
        let (_, kind, d) = option_reply(&mut a);
        assert_eq!((kind, d[0..2].to_vec()), (REP_INFO, INFO_EXPORT.to_be_bytes().to_vec()));
        assert_eq!(option_reply(&mut a).2, info_block_size(1, 4096, MAX_PAYLOAD));
        assert_eq!(option_reply(&mut a).2, info_text(INFO_NAME, b"disk"));
        assert_eq!(option_reply(&mut a).1, REP_ACK);
        a.write_all(&option(OPT_ABORT, &[])).unwrap();
        assert_eq!(option_reply(&mut a).1, REP_ACK);
        t.join().unwrap().unwrap();
    }

    #[test]
    fn export_name_serves_the_export_and_closes_on_an_unknown_name() {
        let s = server(65536, false);
        let (mut a, t) = connect(&s);
        let mut g = [0u8; 18];
        a.read_exact(&mut g).unwrap();
        a.write_all(&1u32.to_be_bytes()).unwrap();
        a.write_all(&option(OPT_EXPORT_NAME, b"disk")).unwrap();
        let mut r = [0u8; 134];
        a.read_exact(&mut r).unwrap();
        assert_eq!(u64::from_be_bytes(r[0..8].try_into().unwrap()), 65536);
        a.write_all(&server::request(CMD_DISC, 0, 1, 0, 0)).unwrap();
        t.join().unwrap().unwrap();

        let (mut a, t) = connect(&s);
        a.read_exact(&mut g).unwrap();
        a.write_all(&3u32.to_be_bytes()).unwrap();
        a.write_all(&option(OPT_EXPORT_NAME, b"other")).unwrap();
        let mut rest = Vec::new();
        a.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
        assert!(t.join().unwrap().unwrap_err().contains("other"));
    }

    #[test]
    fn garbage_closes_the_connection_and_the_server_serves_the_next_client() {
        let s = server(65536, false);
        // Not an NBD client at all.
        let (mut a, t) = connect(&s);
        a.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut rest = Vec::new();
        a.read_to_end(&mut rest).unwrap();
        assert!(t.join().unwrap().is_err());
        // A huge option, then a wrong request magic after a good handshake,
        // then a write above the limit.
        let (mut a, t) = connect(&s);
        a.write_all(&1u32.to_be_bytes()).unwrap();
        a.write_all(&IHAVEOPT.to_be_bytes()).unwrap();
        a.write_all(&OPT_GO.to_be_bytes()).unwrap();
        a.write_all(&u32::MAX.to_be_bytes()).unwrap();
        a.read_to_end(&mut rest).unwrap();
        assert!(t.join().unwrap().unwrap_err().contains("above the limit"));
        for bad in [[0xffu8; REQUEST_LEN], server::request(CMD_WRITE, 0, 1, 0, MAX_PAYLOAD + 1)] {
            let (a, t) = connect(&s);
            let mut c = Client::handshake(Stream::Unix(a.try_clone().unwrap()), "disk").unwrap();
            (&a).write_all(&bad).unwrap();
            let mut d = Vec::new();
            assert!(c.complete(&mut d).is_err());
            assert!(t.join().unwrap().is_err());
        }
        assert_eq!(s.stats().protocol_errors.load(Ordering::Relaxed), 4);
        let (mut c, t) = client(&s, "disk");
        assert_eq!(c.read(0, 4).unwrap().unwrap(), vec![0; 4]);
        c.disconnect().unwrap();
        t.join().unwrap().unwrap();
    }

    /// Sends `bytes` one at a time, `pause` apart, until the server stops
    /// taking them: how many it took.
    fn trickle(a: &mut UnixStream, bytes: usize, pause: std::time::Duration) -> usize {
        for n in 0..bytes {
            if a.write_all(&[0]).is_err() {
                return n;
            }
            std::thread::sleep(pause);
        }
        bytes
    }

    fn server_with_deadlines(limit: std::time::Duration) -> Server<MemBackend> {
        let cfg =
            ExportConfig { name: "disk".into(), handshake_timeout: limit, stall_timeout: limit, ..Default::default() };
        Server::new(Arc::new(MemBackend::new(1 << 20, false)), cfg)
    }

    #[test]
    fn a_payload_trickled_a_byte_at_a_time_is_cut_at_its_deadline() {
        // Each byte comes well within the limit; the payload as a whole
        // cannot (200 bytes 20 ms apart, 4 s, against 300 ms): a limit per
        // read would take all 200 and then wait for the rest.
        let s = server_with_deadlines(std::time::Duration::from_millis(300));
        let (mut a, t) = connect(&s);
        let c = Client::handshake(Stream::Unix(a.try_clone().unwrap()), "disk").unwrap();
        a.write_all(&server::request(CMD_WRITE, 0, 1, 0, 4096)).unwrap();
        let sent = trickle(&mut a, 200, std::time::Duration::from_millis(20));
        assert!(sent < 200, "the server took all {sent} bytes of a trickled payload");
        assert!(t.join().unwrap().unwrap_err().contains("too long"));
        drop(c);
        // The server goes on: a prompt client is served.
        let (mut c, t) = client(&s, "disk");
        assert_eq!(c.call(CMD_WRITE, 0, 0, &[7; 4096], 4096).unwrap(), 0);
        assert_eq!(c.read(0, 4).unwrap().unwrap(), vec![7; 4]);
        c.disconnect().unwrap();
        t.join().unwrap().unwrap();
    }

    #[test]
    fn a_handshake_trickled_a_byte_at_a_time_is_cut_at_its_deadline() {
        let s = server_with_deadlines(std::time::Duration::from_millis(300));
        let (mut a, t) = connect(&s);
        let mut greeting = [0u8; 18];
        a.read_exact(&mut greeting).unwrap();
        a.write_all(&1u32.to_be_bytes()).unwrap();
        // An option header, then a long option's data a byte at a time.
        a.write_all(&IHAVEOPT.to_be_bytes()).unwrap();
        a.write_all(&OPT_LIST.to_be_bytes()).unwrap();
        a.write_all(&1000u32.to_be_bytes()).unwrap();
        let sent = trickle(&mut a, 200, std::time::Duration::from_millis(20));
        assert!(sent < 200, "the server took all {sent} bytes of a trickled handshake");
        assert!(t.join().unwrap().unwrap_err().contains("too long"));
    }
}
