//! Minimal CDR writer for the synthetic source: XCDR1, little-endian, as ROS 2 (Fast DDS /
//! Cyclone) serializes plain messages.
//!
//! Layout rules (OMG CDR as used by rmw):
//! - a 4-byte encapsulation header `00 01 00 00` (CDR_LE, options 0) comes first;
//! - every primitive is aligned to its own size (max 8), counted from the end of that header,
//!   not from the start of the buffer;
//! - `string` is a u32 length that counts the trailing NUL, the bytes, then the NUL;
//! - a sequence is a u32 element count followed by the elements; fixed arrays have no count.
//!
//! The writer appends to a caller-owned `Vec<u8>`, so once that vector has grown to the
//! message size it never allocates again.

/// CDR_LE encapsulation header (representation id 0x0001, options 0).
pub const ENCAPSULATION_LE: [u8; 4] = [0x00, 0x01, 0x00, 0x00];

/// Bytes taken by the encapsulation header; alignment is counted from here.
pub const HEADER_LEN: usize = ENCAPSULATION_LE.len();

/// Appends CDR fields to a buffer.
pub struct CdrWriter<'a> {
    buf: &'a mut Vec<u8>,
    /// Index in `buf` where the payload (after the encapsulation header) starts.
    origin: usize,
}

impl<'a> CdrWriter<'a> {
    /// Starts a message at the end of `buf`: writes the encapsulation header.
    pub fn new(buf: &'a mut Vec<u8>) -> Self {
        buf.extend_from_slice(&ENCAPSULATION_LE);
        let origin = buf.len();
        CdrWriter { buf, origin }
    }

    /// Bytes of payload written so far (the offset alignment is computed from).
    pub fn position(&self) -> usize {
        self.buf.len() - self.origin
    }

    /// Offset in the underlying buffer of the next byte to be written.
    pub fn buffer_offset(&self) -> usize {
        self.buf.len()
    }

    /// Pads with zeros so that the payload position is a multiple of `n` (a power of two).
    pub fn align(&mut self, n: usize) {
        let pad = (n - self.position() % n) % n;
        self.buf.resize(self.buf.len() + pad, 0);
    }

    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    pub fn bool(&mut self, v: bool) {
        self.buf.push(u8::from(v));
    }

    pub fn u32(&mut self, v: u32) {
        self.align(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn i32(&mut self, v: i32) {
        self.align(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn f32(&mut self, v: f32) {
        self.align(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn f64(&mut self, v: f64) {
        self.align(8);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A sequence or string length prefix. Lengths beyond u32 cannot be expressed in CDR;
    /// every caller here passes sizes fixed by the profiles (at most a few MiB).
    fn len_prefix(&mut self, len: usize) {
        self.u32(u32::try_from(len).unwrap_or(u32::MAX));
    }

    /// Bytes appended as they are, without alignment (the body of a `uint8[]`).
    pub fn raw(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// `string`: length including the NUL, the bytes, the NUL.
    pub fn string(&mut self, s: &str) {
        self.len_prefix(s.len() + 1);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }

    /// `uint8[]`: count, then the bytes (no alignment after the count).
    pub fn byte_sequence(&mut self, data: &[u8]) {
        self.len_prefix(data.len());
        self.buf.extend_from_slice(data);
    }

    /// The count of a sequence whose elements the caller writes next.
    pub fn sequence_len(&mut self, n: usize) {
        self.len_prefix(n);
    }

    /// `builtin_interfaces/Time` from nanoseconds since the epoch.
    pub fn time(&mut self, stamp_ns: i64) {
        let (sec, nanosec) = split_stamp(stamp_ns);
        self.i32(sec);
        self.u32(nanosec);
    }
}

/// Splits nanoseconds since the epoch into ROS `Time { sec: int32, nanosec: uint32 }`.
/// `sec` saturates at the int32 range, which is what the message type can hold.
pub fn split_stamp(stamp_ns: i64) -> (i32, u32) {
    let sec = stamp_ns.div_euclid(1_000_000_000);
    let nanosec = stamp_ns.rem_euclid(1_000_000_000);
    let sec = sec.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32;
    (sec, nanosec as u32)
}

/// Overwrites a `Time` previously written at `offset` in `buf` (a buffer index, not a payload
/// position), so templates can be re-stamped without re-encoding.
pub fn patch_time(buf: &mut [u8], offset: usize, stamp_ns: i64) {
    let (sec, nanosec) = split_stamp(stamp_ns);
    buf[offset..offset + 4].copy_from_slice(&sec.to_le_bytes());
    buf[offset + 4..offset + 8].copy_from_slice(&nanosec.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_with_the_little_endian_encapsulation_header() {
        let mut buf = Vec::new();
        CdrWriter::new(&mut buf);
        assert_eq!(buf, [0, 1, 0, 0]);
    }

    #[test]
    fn encodes_a_string_as_length_with_nul_then_bytes_then_nul() {
        let mut buf = Vec::new();
        CdrWriter::new(&mut buf).string("hi");
        // Same bytes as the /chatter messages of the Jazzy reference bag.
        assert_eq!(buf, [0, 1, 0, 0, 3, 0, 0, 0, b'h', b'i', 0]);
    }

    #[test]
    fn aligns_relative_to_the_end_of_the_encapsulation_header() {
        let mut buf = Vec::new();
        let mut w = CdrWriter::new(&mut buf);
        w.u8(7);
        w.f64(1.0);
        // u8 at payload 0, 7 bytes of padding, f64 at payload 8 = buffer index 12.
        assert_eq!(w.position(), 16);
        assert_eq!(buf.len(), 20);
        assert_eq!(&buf[5..12], &[0; 7]);
        assert_eq!(&buf[12..20], &1.0f64.to_le_bytes());
    }

    #[test]
    fn splits_negative_stamps_into_a_non_negative_nanosecond_part() {
        assert_eq!(split_stamp(-1), (-1, 999_999_999));
        assert_eq!(split_stamp(1_500_000_000), (1, 500_000_000));
        assert_eq!(split_stamp(i64::MAX).0, i32::MAX);
    }

    #[test]
    fn patches_a_time_in_place() {
        let mut buf = Vec::new();
        CdrWriter::new(&mut buf).time(0);
        patch_time(&mut buf, HEADER_LEN, 3_000_000_007);
        let mut expected = Vec::new();
        CdrWriter::new(&mut expected).time(3_000_000_007);
        assert_eq!(buf, expected);
    }
}
