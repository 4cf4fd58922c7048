//! MD5 (RFC 1321), one stream or two streams at once.
//!
//! Why not only the `md-5` crate: every uploaded byte goes through MD5 (the `Content-MD5` of
//! each part and the multipart ETag computed locally), and MD5 is a chain of dependent
//! additions: one stream keeps a core's adders mostly idle (~500 MB/s here, with `md-5` and
//! with this code alike). Two independent streams stepped together fill them: measured
//! 1.8× the bytes per CPU second on this project's VM. The uploader reads its parts in
//! flight side by side and hashes them with [`update_pair`]. `md-5` stays as a dev-dependency
//! that every digest here is checked against.
//!
//! Safe code only: the lanes are plain `u32`s that the compiler keeps in registers, with no
//! intrinsics, so the same source builds for aarch64. The gain there is expected (the Orin's
//! Cortex-A78AE is an out-of-order core with several integer pipes) but not measured: there is
//! no Arm hardware in CI.

/// `floor(abs(sin(i + 1)) × 2^32)`, RFC 1321 §3.4.
const K: [u32; 64] = [
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391,
];

/// Left-rotation amounts, four per round.
const ROT: [u32; 16] = [7, 12, 17, 22, 5, 9, 14, 20, 4, 11, 16, 23, 6, 10, 15, 21];

const INIT: [u32; 4] = [0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476];

const BLOCK: usize = 64;

fn words(block: &[u8]) -> [u32; 16] {
    let mut m = [0u32; 16];
    for (w, c) in m.iter_mut().zip(block.chunks_exact(4)) {
        *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    m
}

/// `$m!(0); … $m!(63);`
macro_rules! each_step {
    ($m:ident) => {
        each_step!(@ $m 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27
            28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56
            57 58 59 60 61 62 63)
    };
    (@ $m:ident $($i:literal)*) => { $($m!($i);)* };
}

/// The 64 steps of one block for `N` lanes at once. Written as a macro over literal step
/// numbers so that every round function, word index and rotation is a constant (a loop over
/// the steps was not unrolled and ran at half the speed).
macro_rules! compress_lanes {
    ($state:expr, $m:expr, $n:literal) => {{
        let state: &mut [[u32; 4]; $n] = $state;
        let m: &[[u32; 16]; $n] = $m;
        let mut a = [0u32; $n];
        let mut b = [0u32; $n];
        let mut c = [0u32; $n];
        let mut d = [0u32; $n];
        for l in 0..$n {
            [a[l], b[l], c[l], d[l]] = state[l];
        }
        macro_rules! step {
            ($i:literal) => {{
                const I: usize = $i;
                const G: usize = match I / 16 {
                    0 => I,
                    1 => (5 * I + 1) % 16,
                    2 => (3 * I + 5) % 16,
                    _ => (7 * I) % 16,
                };
                const R: u32 = ROT[(I / 16) * 4 + I % 4];
                for l in 0..$n {
                    // Everything but the newest word `b` is known a step early: sum it
                    // first, so that only the last operations wait for `b` (the chain of
                    // steps is what bounds MD5's speed).
                    let early = a[l].wrapping_add(K[I]).wrapping_add(m[l][G]);
                    let t = match I / 16 {
                        0 => early.wrapping_add(d[l] ^ (b[l] & (c[l] ^ d[l]))),
                        // (b & d) | (c & !d): the two halves never share a bit, so they add.
                        1 => early.wrapping_add(c[l] & !d[l]).wrapping_add(b[l] & d[l]),
                        2 => early.wrapping_add(b[l] ^ (c[l] ^ d[l])),
                        _ => early.wrapping_add(c[l] ^ (b[l] | !d[l])),
                    };
                    let next = b[l].wrapping_add(t.rotate_left(R));
                    a[l] = d[l];
                    d[l] = c[l];
                    c[l] = b[l];
                    b[l] = next;
                }
            }};
        }
        each_step!(step);
        for l in 0..$n {
            state[l][0] = state[l][0].wrapping_add(a[l]);
            state[l][1] = state[l][1].wrapping_add(b[l]);
            state[l][2] = state[l][2].wrapping_add(c[l]);
            state[l][3] = state[l][3].wrapping_add(d[l]);
        }
    }};
}

fn compress1(state: &mut [u32; 4], blocks: &[u8]) {
    for blk in blocks.chunks_exact(BLOCK) {
        let lanes: &mut [[u32; 4]; 1] = std::array::from_mut(state);
        compress_lanes!(lanes, &[words(blk)], 1);
    }
}

fn compress2(x: &mut [u32; 4], xs: &[u8], y: &mut [u32; 4], ys: &[u8]) {
    for (bx, by) in xs.chunks_exact(BLOCK).zip(ys.chunks_exact(BLOCK)) {
        let mut lanes = [*x, *y];
        compress_lanes!(&mut lanes, &[words(bx), words(by)], 2);
        [*x, *y] = lanes;
    }
}

/// A streaming MD5.
#[derive(Clone)]
pub struct Md5 {
    state: [u32; 4],
    /// Bytes of an unfinished block.
    pending: [u8; BLOCK],
    pending_len: usize,
    /// Bytes hashed in all.
    len: u64,
}

impl Default for Md5 {
    fn default() -> Self {
        Md5 {
            state: INIT,
            pending: [0; BLOCK],
            pending_len: 0,
            len: 0,
        }
    }
}

impl std::fmt::Debug for Md5 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Md5").field("len", &self.len).finish()
    }
}

impl Md5 {
    pub fn new() -> Self {
        Self::default()
    }

    /// Top up the pending block from `data`, compressing it once full. Returns the rest of
    /// `data`; when anything is left, nothing is pending.
    fn top_up<'a>(&mut self, data: &'a [u8]) -> &'a [u8] {
        if self.pending_len == 0 {
            return data;
        }
        let take = (BLOCK - self.pending_len).min(data.len());
        self.pending[self.pending_len..self.pending_len + take].copy_from_slice(&data[..take]);
        self.pending_len += take;
        if self.pending_len == BLOCK {
            compress1(&mut self.state, &self.pending);
            self.pending_len = 0;
        }
        &data[take..]
    }

    /// Hash the whole blocks of `rest` (given by [`Md5::top_up`]) and keep its tail.
    fn absorb(&mut self, rest: &[u8]) {
        if rest.is_empty() {
            return;
        }
        let whole = rest.len() - rest.len() % BLOCK;
        compress1(&mut self.state, &rest[..whole]);
        let tail = &rest[whole..];
        self.pending[..tail.len()].copy_from_slice(tail);
        self.pending_len = tail.len();
    }

    pub fn update(&mut self, data: &[u8]) {
        self.len += data.len() as u64;
        let rest = self.top_up(data);
        self.absorb(rest);
    }

    pub fn finalize(mut self) -> [u8; 16] {
        let bits = self.len.wrapping_mul(8);
        // 0x80, zeros to 56 mod 64, then the length in bits, little-endian.
        let pad = if self.pending_len < 56 {
            56 - self.pending_len
        } else {
            120 - self.pending_len
        };
        let mut tail = [0u8; BLOCK + 8];
        tail[0] = 0x80;
        tail[pad..pad + 8].copy_from_slice(&bits.to_le_bytes());
        self.update(&tail[..pad + 8]);
        debug_assert_eq!(self.pending_len, 0);
        let mut out = [0u8; 16];
        for (o, w) in out.chunks_exact_mut(4).zip(self.state) {
            o.copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    pub fn digest(data: &[u8]) -> [u8; 16] {
        let mut h = Md5::new();
        h.update(data);
        h.finalize()
    }
}

/// `x.update(xs); y.update(ys)`, with the blocks the two have in common hashed side by side.
pub fn update_pair(x: &mut Md5, xs: &[u8], y: &mut Md5, ys: &[u8]) {
    x.len += xs.len() as u64;
    y.len += ys.len() as u64;
    let xs = x.top_up(xs);
    let ys = y.top_up(ys);
    // Side by side only while neither has a partial block pending (the uploader's pieces
    // never leave one: 1 MiB reads into parts of whole MiB); the rest goes one at a time.
    let common = if x.pending_len == 0 && y.pending_len == 0 {
        xs.len().min(ys.len()) / BLOCK * BLOCK
    } else {
        0
    };
    compress2(&mut x.state, &xs[..common], &mut y.state, &ys[..common]);
    x.absorb(&xs[common..]);
    y.absorb(&ys[common..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use md5_ref::Digest;

    fn reference(data: &[u8]) -> [u8; 16] {
        md5_ref::Md5::digest(data).into()
    }

    fn hex(d: [u8; 16]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// RFC 1321 appendix A.5.
    #[test]
    fn the_rfc_1321_test_suite() {
        let suite = [
            ("", "d41d8cd98f00b204e9800998ecf8427e"),
            ("a", "0cc175b9c0f1b6a831c399e269772661"),
            ("abc", "900150983cd24fb0d6963f7d28e17f72"),
            ("message digest", "f96b697d7cb7938d525a2f31aaf161d0"),
            (
                "abcdefghijklmnopqrstuvwxyz",
                "c3fcd3d76192e4007dfb496cca67e13b",
            ),
            (
                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                "d174ab98d277d9f5a5611c2c9f419d9f",
            ),
            (
                "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "57edf4a22be3c955ac49da2e2107b67a",
            ),
        ];
        for (input, want) in suite {
            assert_eq!(hex(Md5::digest(input.as_bytes())), want, "{input:?}");
        }
    }

    /// Deterministic bytes that differ per seed and position.
    fn bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect()
    }

    #[test]
    fn every_length_around_the_padding_edges_matches_md_5() {
        // 55/56/63/64/65 and their neighbours decide whether the length needs a block of its
        // own.
        for len in 0..=300 {
            let data = bytes(len, len as u64);
            assert_eq!(Md5::digest(&data), reference(&data), "length {len}");
        }
    }

    #[test]
    fn updates_cut_anywhere_give_the_one_shot_digest() {
        let data = bytes(10_000, 7);
        let want = reference(&data);
        for cut in [1usize, 3, 63, 64, 65, 127, 1000, 4096] {
            let mut h = Md5::new();
            for piece in data.chunks(cut) {
                h.update(piece);
            }
            assert_eq!(h.finalize(), want, "pieces of {cut}");
        }
    }

    #[test]
    fn pairs_of_any_lengths_and_cuts_match_two_single_digests() {
        // Equal and unequal lengths, pieces on and off block boundaries, one side empty, and
        // a side with a pending partial block when the pair starts.
        let cases = [
            (0usize, 0usize, 64usize, 64usize),
            (1 << 20, 1 << 20, 1 << 16, 1 << 16),
            (100_000, 70_001, 4096, 4096),
            (9_999, 10_000, 65, 64),
            (5_000, 0, 1000, 1000),
            (777, 12_345, 63, 100),
        ];
        for (lx, ly, cx, cy) in cases {
            let (dx, dy) = (bytes(lx, 1), bytes(ly, 2));
            let (mut x, mut y) = (Md5::new(), Md5::new());
            x.update(&dx[..lx.min(3)]);
            let mut px = dx[lx.min(3)..].chunks(cx);
            let mut py = dy.chunks(cy);
            loop {
                match (px.next(), py.next()) {
                    (None, None) => break,
                    (a, b) => update_pair(&mut x, a.unwrap_or(&[]), &mut y, b.unwrap_or(&[])),
                }
            }
            assert_eq!(
                x.finalize(),
                reference(&dx),
                "x of ({lx}, {ly}, {cx}, {cy})"
            );
            assert_eq!(
                y.finalize(),
                reference(&dy),
                "y of ({lx}, {ly}, {cx}, {cy})"
            );
        }
    }
}
