//! An export held in memory: the reference the serving loop is tested and
//! fuzzed against (no cluster needed), and a model of what a backend must do.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use crate::proto::NbdError;
use crate::server::{Backend, Buffer};

/// A byte vector as an export.
#[derive(Debug)]
pub struct MemBackend {
    bytes: RwLock<Vec<u8>>,
    read_only: bool,
    pub flushes: AtomicU64,
    pub trims: AtomicU64,
}

impl MemBackend {
    pub fn new(size: usize, read_only: bool) -> MemBackend {
        MemBackend {
            bytes: RwLock::new(vec![0; size]),
            read_only,
            flushes: AtomicU64::new(0),
            trims: AtomicU64::new(0),
        }
    }

    /// A copy of the export's bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        self.bytes.read().map(|b| b.clone()).unwrap_or_default()
    }

    fn range(offset: u64, len: u32) -> std::ops::Range<usize> {
        offset as usize..offset as usize + len as usize
    }
}

impl Buffer for Vec<u8> {
    fn fill_from(&mut self, r: &mut dyn Read, len: usize) -> io::Result<()> {
        r.read_exact(&mut self[..len])
    }
    fn send_to(&self, w: &mut dyn Write, len: usize) -> io::Result<()> {
        w.write_all(&self[..len])
    }
}

impl Backend for MemBackend {
    type Buf = Vec<u8>;
    fn size(&self) -> u64 {
        self.bytes.read().map(|b| b.len() as u64).unwrap_or(0)
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn buffer(&self, len: usize) -> Result<Vec<u8>, NbdError> {
        Ok(vec![0; len])
    }
    fn read(&self, offset: u64, len: u32, buf: &mut Vec<u8>) -> Result<(), NbdError> {
        let b = self.bytes.read().map_err(|_| NbdError::Io)?;
        buf[..len as usize].copy_from_slice(&b[Self::range(offset, len)]);
        Ok(())
    }
    fn write(&self, offset: u64, len: u32, buf: &mut Vec<u8>, _fua: bool) -> Result<(), NbdError> {
        let mut b = self.bytes.write().map_err(|_| NbdError::Io)?;
        b[Self::range(offset, len)].copy_from_slice(&buf[..len as usize]);
        Ok(())
    }
    fn flush(&self) -> Result<(), NbdError> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn trim(&self, offset: u64, len: u32) -> Result<(), NbdError> {
        self.trims.fetch_add(1, Ordering::Relaxed);
        self.write_zeroes(offset, len, true, false)
    }
    fn write_zeroes(&self, offset: u64, len: u32, _may_punch: bool, _fua: bool) -> Result<(), NbdError> {
        let mut b = self.bytes.write().map_err(|_| NbdError::Io)?;
        b[Self::range(offset, len)].fill(0);
        Ok(())
    }
}
