//! A small blocking NBD client: the fixed newstyle handshake with
//! `NBD_OPT_GO`, then requests sent ahead of their replies (pipelined, as
//! many as the caller wants in flight) and replies taken in the order the
//! server sends them. Used by the tests and by `dafne bench nbd`; real
//! deployments use the kernel's client, qemu or libnbd.

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::proto;
use crate::server::Stream;

/// A connection to an export, in its transmission phase.
#[derive(Debug)]
pub struct Client {
    r: BufReader<Stream>,
    w: BufWriter<Stream>,
    /// The export's size and transmission flags, as the server announced.
    pub size: u64,
    pub flags: u16,
    /// Handle → length of each READ still waiting for its reply.
    reads: HashMap<u64, u32>,
    next: u64,
}

/// A reply: its request's handle, the NBD error (0 = success).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub handle: u64,
    pub error: u32,
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Client {
    pub fn connect_tcp(addr: SocketAddr, name: &str) -> io::Result<Client> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        Client::handshake(Stream::Tcp(s), name)
    }

    pub fn connect_unix(path: &Path, name: &str) -> io::Result<Client> {
        Client::handshake(Stream::Unix(UnixStream::connect(path)?), name)
    }

    /// The handshake over an already connected stream.
    pub fn handshake(s: Stream, name: &str) -> io::Result<Client> {
        let mut r = BufReader::new(s.try_clone()?);
        let mut w = BufWriter::new(s);
        let mut g = [0u8; 18];
        r.read_exact(&mut g)?;
        if g != proto::greeting() {
            return Err(bad(format!("not an NBD fixed newstyle server: {g:02x?}")));
        }
        w.write_all(&(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes())?;
        let mut data = Vec::new();
        data.extend_from_slice(&(name.len() as u32).to_be_bytes());
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&0u16.to_be_bytes());
        w.write_all(&proto::IHAVEOPT.to_be_bytes())?;
        w.write_all(&proto::OPT_GO.to_be_bytes())?;
        w.write_all(&(data.len() as u32).to_be_bytes())?;
        w.write_all(&data)?;
        w.flush()?;
        let (mut size, mut flags) = (None, 0);
        loop {
            let mut h = [0u8; 20];
            r.read_exact(&mut h)?;
            let kind = u32::from_be_bytes(h[12..16].try_into().expect("4 bytes"));
            let len = u32::from_be_bytes(h[16..20].try_into().expect("4 bytes"));
            if len > proto::MAX_OPTION {
                return Err(bad(format!("option reply of {len} bytes")));
            }
            let mut d = vec![0u8; len as usize];
            r.read_exact(&mut d)?;
            match kind {
                proto::REP_INFO if d.len() == 12 && d[0..2] == proto::INFO_EXPORT.to_be_bytes() => {
                    size = Some(u64::from_be_bytes(d[2..10].try_into().expect("8 bytes")));
                    flags = u16::from_be_bytes([d[10], d[11]]);
                }
                proto::REP_INFO => {}
                proto::REP_ACK => break,
                e => return Err(bad(format!("the server refused export {name:?}: reply {e:#x}"))),
            }
        }
        let size = size.ok_or_else(|| bad("no NBD_INFO_EXPORT before the ACK".into()))?;
        Ok(Client { r, w, size, flags, reads: HashMap::new(), next: 1 })
    }

    fn submit(&mut self, kind: u16, flags: u16, offset: u64, len: u32, payload: &[u8]) -> io::Result<u64> {
        let handle = self.next;
        self.next += 1;
        self.w.write_all(&crate::server::request(kind, flags, handle, offset, len))?;
        self.w.write_all(payload)?;
        Ok(handle)
    }

    /// Queues a READ (sent at the next [`Self::send`] or when the buffer fills).
    pub fn submit_read(&mut self, offset: u64, len: u32) -> io::Result<u64> {
        let h = self.submit(proto::CMD_READ, 0, offset, len, &[])?;
        self.reads.insert(h, len);
        Ok(h)
    }

    pub fn submit_write(&mut self, offset: u64, data: &[u8], fua: bool) -> io::Result<u64> {
        let flags = if fua { proto::CMD_FLAG_FUA } else { 0 };
        self.submit(proto::CMD_WRITE, flags, offset, data.len() as u32, data)
    }

    /// Queues a request without payload (FLUSH, TRIM, WRITE_ZEROES, or
    /// anything a test wants to send).
    pub fn submit_other(&mut self, kind: u16, flags: u16, offset: u64, len: u32) -> io::Result<u64> {
        self.submit(kind, flags, offset, len, &[])
    }

    /// Sends what was queued.
    pub fn send(&mut self) -> io::Result<()> {
        self.w.flush()
    }

    /// The next reply; a successful READ's data goes to `data` (resized).
    pub fn complete(&mut self, data: &mut Vec<u8>) -> io::Result<Reply> {
        let mut h = [0u8; proto::REPLY_LEN];
        self.r.read_exact(&mut h)?;
        if u32::from_be_bytes(h[0..4].try_into().expect("4 bytes")) != proto::SIMPLE_REPLY_MAGIC {
            return Err(bad(format!("not a simple reply: {h:02x?}")));
        }
        let error = u32::from_be_bytes(h[4..8].try_into().expect("4 bytes"));
        let handle = u64::from_be_bytes(h[8..16].try_into().expect("8 bytes"));
        if let Some(len) = self.reads.remove(&handle) {
            if error == 0 {
                data.resize(len as usize, 0);
                self.r.read_exact(data)?;
            }
        }
        Ok(Reply { handle, error })
    }

    /// One READ, waited for.
    pub fn read(&mut self, offset: u64, len: u32) -> io::Result<Result<Vec<u8>, u32>> {
        self.submit_read(offset, len)?;
        self.send()?;
        let mut d = Vec::new();
        let r = self.complete(&mut d)?;
        Ok(if r.error == 0 { Ok(d) } else { Err(r.error) })
    }

    /// One request without READ data, waited for; returns the NBD error.
    pub fn call(&mut self, kind: u16, flags: u16, offset: u64, payload: &[u8], len: u32) -> io::Result<u32> {
        self.submit(kind, flags, offset, len, payload)?;
        self.send()?;
        Ok(self.complete(&mut Vec::new())?.error)
    }

    /// `NBD_CMD_DISC`, then the connection closes.
    pub fn disconnect(mut self) -> io::Result<()> {
        self.submit(proto::CMD_DISC, 0, 0, 0, &[])?;
        self.send()
    }
}
