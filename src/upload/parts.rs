//! How a file is cut into parts, by AWS's rules (Garage and MinIO accept what AWS refuses, so
//! the rules are enforced here): every part but the last 5 MiB..5 GiB, at most 10,000 parts,
//! objects at most 5 TiB. The split depends only on the file size and the configured part
//! size, so a resume after a restart computes exactly the same parts.

use super::md5::Md5;

pub const MIN_PART_SIZE: u64 = 5 << 20;
pub const MAX_PART_SIZE: u64 = 5 << 30;
pub const MAX_PARTS: u64 = 10_000;
pub const MAX_OBJECT_SIZE: u64 = 5 << 40;
/// A part size grown for a huge file is rounded up to this, so it stays a readable number.
const GROW_STEP: u64 = 1 << 20;

/// The parts of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartPlan {
    pub file_size: u64,
    /// Size of every part but the last.
    pub part_size: u64,
    /// Number of parts; 0 means one PutObject (the file is no larger than the part size).
    pub parts: u32,
}

impl PartPlan {
    /// The plan for a file of `file_size` bytes with the configured `part_size` (clamped to
    /// 5 MiB..5 GiB). `None` when the file is larger than an S3 object may be.
    pub fn new(file_size: u64, part_size: u64) -> Option<PartPlan> {
        if file_size > MAX_OBJECT_SIZE {
            return None;
        }
        let mut part_size = part_size.clamp(MIN_PART_SIZE, MAX_PART_SIZE);
        if file_size <= part_size {
            return Some(PartPlan {
                file_size,
                part_size,
                parts: 0,
            });
        }
        if file_size.div_ceil(part_size) > MAX_PARTS {
            // The smallest whole number of MiB that fits the file in 10,000 parts. 5 TiB /
            // 10,000 is 525 MiB, far below 5 GiB, so this never breaks the upper bound.
            part_size = file_size.div_ceil(MAX_PARTS).div_ceil(GROW_STEP) * GROW_STEP;
        }
        let parts = file_size.div_ceil(part_size);
        Some(PartPlan {
            file_size,
            part_size,
            parts: parts as u32,
        })
    }

    pub fn is_multipart(&self) -> bool {
        self.parts > 0
    }

    /// Offset and length of part `number` (1-based, as S3 numbers them).
    pub fn range(&self, number: u32) -> (u64, u64) {
        let offset = (number as u64 - 1) * self.part_size;
        let len = self.part_size.min(self.file_size - offset);
        (offset, len)
    }
}

/// The ETag S3 gives a multipart object: the MD5 of the concatenated binary MD5s of its
/// parts, in hex, then `-` and the number of parts.
pub fn multipart_etag(part_md5s: &[[u8; 16]]) -> String {
    let mut h = Md5::new();
    for m in part_md5s {
        h.update(m);
    }
    format!("{}-{}", hex(&h.finalize()), part_md5s.len())
}

pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

pub fn from_hex16(s: &str) -> Option<[u8; 16]> {
    let s = s.trim_matches('"');
    if s.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Standard base64 with padding, for `Content-MD5`.
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// An ETag as servers send it, without quotes and in lower case.
pub fn bare_etag(etag: &str) -> String {
    etag.trim().trim_matches('"').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn files_up_to_the_part_size_go_as_one_put() {
        let p = PartPlan::new(16 * MIB, 16 * MIB).unwrap();
        assert_eq!(p.parts, 0);
        assert!(!p.is_multipart());
        assert_eq!(PartPlan::new(0, 16 * MIB).unwrap().parts, 0);
    }

    #[test]
    fn a_larger_file_is_cut_into_full_parts_and_a_shorter_last_one() {
        let p = PartPlan::new(40 * MIB + 3, 16 * MIB).unwrap();
        assert_eq!(p.parts, 3);
        assert_eq!(p.range(1), (0, 16 * MIB));
        assert_eq!(p.range(2), (16 * MIB, 16 * MIB));
        assert_eq!(p.range(3), (32 * MIB, 8 * MIB + 3));
    }

    #[test]
    fn part_sizes_below_5_mib_or_above_5_gib_are_clamped_to_aws_limits() {
        let p = PartPlan::new(12 * MIB, MIB).unwrap();
        assert_eq!(p.part_size, MIN_PART_SIZE);
        assert_eq!(p.parts, 3);
        let p = PartPlan::new(11 << 30, 8 << 30).unwrap();
        assert_eq!(p.part_size, MAX_PART_SIZE);
        assert_eq!(p.parts, 3);
    }

    #[test]
    fn more_than_10000_parts_grows_the_part_size_deterministically() {
        // 200 GiB at 16 MiB would be 12,800 parts.
        let size = 200u64 << 30;
        let p = PartPlan::new(size, 16 * MIB).unwrap();
        assert!(p.parts as u64 <= MAX_PARTS, "{p:?}");
        assert_eq!(
            p.part_size,
            21 * MIB,
            "ceil(200 GiB / 10000) rounded up to a MiB"
        );
        assert_eq!(p.parts, 9753);
        let (last_off, last_len) = p.range(p.parts);
        assert_eq!(last_off + last_len, size);
        assert!(last_len > 0 && last_len <= p.part_size);
        // The same inputs always give the same split (a resume depends on it).
        assert_eq!(PartPlan::new(size, 16 * MIB), Some(p));
        // Exactly 10,000 parts stays as configured.
        let p = PartPlan::new(10_000 * 16 * MIB, 16 * MIB).unwrap();
        assert_eq!((p.part_size, p.parts), (16 * MIB, 10_000));
        let p = PartPlan::new(10_000 * 16 * MIB + 1, 16 * MIB).unwrap();
        assert_eq!((p.part_size, p.parts), (17 * MIB, 9_412));
    }

    #[test]
    fn objects_over_5_tib_are_refused() {
        assert!(PartPlan::new(MAX_OBJECT_SIZE, 16 * MIB).is_some());
        assert!(PartPlan::new(MAX_OBJECT_SIZE + 1, 16 * MIB).is_none());
        let p = PartPlan::new(MAX_OBJECT_SIZE, 16 * MIB).unwrap();
        assert!(p.parts as u64 <= MAX_PARTS && p.part_size <= MAX_PART_SIZE);
    }

    #[test]
    fn the_multipart_etag_is_the_md5_of_the_part_md5s() {
        // Reference computed independently (Python hashlib): parts b"a"*5MiB and b"b"*1.
        let a = Md5::digest(&vec![b'a'; 5 << 20]);
        let b = Md5::digest(b"b");
        assert_eq!(hex(&b), "92eb5ffee6ae2fec3ad71c777531578f");
        assert_eq!(
            multipart_etag(&[a, b]),
            "e5a8c5272b26fc10581a21089559b006-2"
        );
    }

    #[test]
    fn base64_and_hex_round_trip_known_values() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        // Content-MD5 of the empty body (Python: base64(md5(b""))).
        assert_eq!(base64(&Md5::digest(b"")), "1B2M2Y8AsgTpgAmY7PhCfg==");
        let m = Md5::digest(b"ringbag");
        assert_eq!(from_hex16(&format!("\"{}\"", hex(&m))), Some(m));
        assert_eq!(bare_etag("\"ABC\""), "abc");
    }
}
