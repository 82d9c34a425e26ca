//! The bounded cursor that decodes and the buffer that encodes.
//!
//! [`Reader`] never reads past its slice and never reserves memory for a
//! count before checking that count against a limit and against the bytes
//! that remain ([`Reader::count`]), so a hostile length costs an error, not
//! an allocation.

use crate::DecodeError;

/// A value with one wire encoding.
pub(crate) trait Wire: Sized {
    fn put(&self, w: &mut Writer);
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError>;
}

/// A bounded cursor over bytes received from a peer.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

macro_rules! get_int {
    ($($name:ident: $ty:ty;)*) => {$(
        pub(crate) fn $name(&mut self, what: &'static str) -> Result<$ty, DecodeError> {
            Ok(<$ty>::from_le_bytes(self.array(what)?))
        }
    )*};
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf }
    }

    /// Bytes not yet read.
    pub(crate) fn left(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Truncated { what, needed: n, left: self.buf.len() });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub(crate) fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    get_int! {
        u8: u8;
        u16: u16;
        u32: u32;
        u64: u64;
        i32: i32;
        i64: i64;
    }

    /// A u8 that must be 0 or 1.
    pub(crate) fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(DecodeError::BadValue { what, value: v.into() }),
        }
    }

    /// u32 length + that many bytes, the length at most `max`.
    pub(crate) fn bytes(&mut self, what: &'static str, max: usize) -> Result<Vec<u8>, DecodeError> {
        let len = self.u32(what)? as usize;
        if len > max {
            return Err(DecodeError::TooLong { what, len, max });
        }
        Ok(self.take(len, what)?.to_vec())
    }

    /// A u32 element count, at most `max`, whose elements of at least
    /// `min_size` bytes each fit in what is left. The result may size a
    /// `Vec::with_capacity`.
    pub(crate) fn count(&mut self, what: &'static str, max: usize, min_size: usize) -> Result<usize, DecodeError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(DecodeError::TooLong { what, len: n, max });
        }
        let needed = n.saturating_mul(min_size);
        if needed > self.left() {
            return Err(DecodeError::Truncated { what, needed, left: self.left() });
        }
        Ok(n)
    }

    /// Succeeds if every byte was read.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

/// The buffer an encoder appends to.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    buf: Vec<u8>,
}

macro_rules! put_int {
    ($($name:ident: $ty:ty;)*) => {$(
        pub(crate) fn $name(&mut self, v: $ty) {
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
    )*};
}

impl Writer {
    /// A writer whose first `n` bytes are zeros, to be overwritten by a
    /// header once the body's length is known.
    pub(crate) fn with_prefix(n: usize) -> Writer {
        Writer { buf: vec![0; n] }
    }

    pub(crate) fn into_vec(self) -> Vec<u8> {
        self.buf
    }

    put_int! {
        put_u8: u8;
        put_u16: u16;
        put_u32: u32;
        put_u64: u64;
        put_i32: i32;
        put_i64: i64;
    }

    pub(crate) fn put_bool(&mut self, v: bool) {
        self.put_u8(v.into());
    }

    pub(crate) fn put_raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// u32 length + bytes.
    pub(crate) fn put_bytes(&mut self, b: &[u8]) {
        self.put_len(b.len());
        self.put_raw(b);
    }

    /// A length or count as u32.
    ///
    /// # Panics
    /// If `n` does not fit in u32: no message may be that large (the
    /// transport's limit is far below), so the caller is broken.
    pub(crate) fn put_len(&mut self, n: usize) {
        let n = u32::try_from(n).expect("a wire length above u32::MAX");
        self.put_u32(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_little_endian() {
        let mut w = Writer::default();
        w.put_u16(0x0102);
        w.put_u32(0x0304_0506);
        w.put_i64(-2);
        let b = w.into_vec();
        assert_eq!(&b[..6], &[0x02, 0x01, 0x06, 0x05, 0x04, 0x03]);
        let mut r = Reader::new(&b);
        assert_eq!(r.u16("a"), Ok(0x0102));
        assert_eq!(r.u32("b"), Ok(0x0304_0506));
        assert_eq!(r.i64("c"), Ok(-2));
        assert_eq!(r.finish(), Ok(()));
    }

    #[test]
    fn take_past_end_is_truncated() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u32("x"), Err(DecodeError::Truncated { what: "x", needed: 4, left: 3 }));
    }

    #[test]
    fn count_is_bounded_by_limit_and_input() {
        let huge = u32::MAX.to_le_bytes();
        assert!(matches!(
            Reader::new(&huge).count("n", 16, 1),
            Err(DecodeError::TooLong { len, max: 16, .. }) if len == u32::MAX as usize
        ));
        let mut b = 10u32.to_le_bytes().to_vec();
        b.extend_from_slice(&[0; 19]);
        assert_eq!(Reader::new(&b).count("n", 16, 2), Err(DecodeError::Truncated { what: "n", needed: 20, left: 19 }));
        b.push(0);
        assert_eq!(Reader::new(&b).count("n", 16, 2), Ok(10));
    }

    #[test]
    fn bytes_length_is_bounded() {
        let mut b = 5u32.to_le_bytes().to_vec();
        b.extend_from_slice(b"hello");
        assert_eq!(Reader::new(&b).bytes("s", 5), Ok(b"hello".to_vec()));
        assert_eq!(Reader::new(&b).bytes("s", 4), Err(DecodeError::TooLong { what: "s", len: 5, max: 4 }));
    }

    #[test]
    fn bool_is_zero_or_one() {
        assert_eq!(Reader::new(&[1]).bool("b"), Ok(true));
        assert_eq!(Reader::new(&[2]).bool("b"), Err(DecodeError::BadValue { what: "b", value: 2 }));
    }
}
