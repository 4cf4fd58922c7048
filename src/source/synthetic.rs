//! Robot-like synthetic generator: valid CDR for real ROS 2 types, so that bags recorded from
//! it decode with any ROS 2 tool (`rosbags`, `ros2 bag play`).
//!
//! This module is pure data and encoders; timing and queues belong to the caller. Each topic
//! gets an [`Encoder`] that precomputes whatever is expensive (the 2.7 MB image, the 1 MiB
//! point cloud and strings) once, so that a message costs one `memcpy` into the caller's
//! buffer plus a few patched bytes: the header stamp and some bytes that depend on `seq`,
//! so consecutive messages differ.
//!
//! The single-topic benchmark profiles (`small`, `medium`, `large`) all use
//! `std_msgs/msg/String`: the serialized size is then exactly `9 + text length` bytes (4-byte
//! encapsulation header, u32 length, text, NUL), so 100 B, 64 KiB and 1 MiB are exact, and
//! the three benchmark rows differ only in size, not in type.

use crate::bag::{MessageDefinition, TopicInfo};
use crate::source::cdr::{self, CdrWriter, HEADER_LEN};
use crate::source::msgdef::{self, EmbeddedFiles, Encoding};

/// A set of topics to generate, chosen with `--synthetic-profile`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum SyntheticProfile {
    /// IMU 400 Hz, tf 100 Hz, two 1280x720 rgb8 cameras at 30 Hz, a ~1 MB point cloud at 10 Hz.
    Robot,
    /// One std_msgs/String topic, 100 B per serialized message.
    Small,
    /// One std_msgs/String topic, 64 KiB per serialized message.
    Medium,
    /// One std_msgs/String topic, 1 MiB per serialized message.
    Large,
    /// One 1920x1080 rgb8 sensor_msgs/Image topic at 30 Hz, 6.2 MB per message.
    Camera,
    /// Two std_msgs/String topics: 100 B at 1 kHz and 2 MB at 30 Hz (the playback timing
    /// benchmark: a fast small topic beside a slow large one).
    Mixed,
}

/// What the payload bytes look like, chosen with `--synthetic-payload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Payload {
    /// One template per topic with a few bytes patched per message: the cheapest to generate,
    /// but it compresses absurdly well (zstd finds the previous frame's bytes).
    #[default]
    Template,
    /// Modelled sensor data, as compressible as real recordings: camera frames are a scene
    /// plus per-pixel sensor noise, the cloud a noisy street scan of a 64-ring lidar, IMU and
    /// tf carry noise (see [`realistic_image`], [`realistic_cloud`]). For compression figures.
    /// The std_msgs/String profiles are unchanged.
    Realistic,
}

/// Precomputed noisy variants of each realistic image and cloud; message `seq` uses variant
/// `seq % REALISTIC_VARIANTS`. Four keeps the same noise four frames of one topic apart (11 MB
/// of camera data, 4 MiB of cloud), beyond zstd's window at levels 1 to 3 (512 KiB to 2 MiB),
/// for 4x the template's memory (about 26 MB for the robot profile).
pub const REALISTIC_VARIANTS: usize = 4;

/// Serialized sizes of the benchmark profiles, encapsulation header included.
pub const SMALL_MESSAGE_BYTES: usize = 100;
pub const MEDIUM_MESSAGE_BYTES: usize = 64 * 1024;
pub const LARGE_MESSAGE_BYTES: usize = 1024 * 1024;
/// The large topic of the `mixed` profile: 2 MB (decimal), as the playback benchmark asks.
pub const MIXED_LARGE_MESSAGE_BYTES: usize = 2_000_000;

/// Geometry of the `camera` profile's image: 1080p, as a Jetson's camera delivers it.
pub const HD_WIDTH: u32 = 1920;
pub const HD_HEIGHT: u32 = 1080;

/// Camera geometry of the robot profile.
pub const CAMERA_WIDTH: u32 = 1280;
pub const CAMERA_HEIGHT: u32 = 720;
/// Points per cloud: 16 B each (x, y, z, intensity as float32) gives 1 MiB of point data.
pub const CLOUD_POINTS: u32 = 65_536;
const POINT_STEP: u32 = 16;

impl SyntheticProfile {
    /// The topics of this profile, with Jazzy type hashes and `ros2msg` definitions.
    /// `offered_qos_profiles` is left empty for the caller to fill.
    pub fn topics(&self) -> Vec<SyntheticTopic> {
        match self {
            SyntheticProfile::Robot => vec![
                SyntheticTopic::new(
                    "/imu",
                    400.0,
                    Kind::Imu {
                        frame_id: "imu_link",
                    },
                ),
                SyntheticTopic::new("/tf", 100.0, Kind::Tf),
                SyntheticTopic::new(
                    "/camera/front/image_raw",
                    30.0,
                    Kind::Image {
                        frame_id: "camera_front_optical_frame",
                        width: CAMERA_WIDTH,
                        height: CAMERA_HEIGHT,
                    },
                ),
                SyntheticTopic::new(
                    "/camera/rear/image_raw",
                    30.0,
                    Kind::Image {
                        frame_id: "camera_rear_optical_frame",
                        width: CAMERA_WIDTH,
                        height: CAMERA_HEIGHT,
                    },
                ),
                SyntheticTopic::new(
                    "/points",
                    10.0,
                    Kind::PointCloud {
                        frame_id: "lidar_link",
                        points: CLOUD_POINTS,
                    },
                ),
            ],
            // Real-time rates for the benchmark profiles are nominal (the benchmark runs them
            // as fast as possible); they keep real-time runs near 100 KB/s, 6.5 MB/s, 31 MB/s.
            SyntheticProfile::Small => vec![SyntheticTopic::new(
                "/synthetic/small",
                1000.0,
                Kind::Text {
                    total_len: SMALL_MESSAGE_BYTES,
                },
            )],
            SyntheticProfile::Medium => vec![SyntheticTopic::new(
                "/synthetic/medium",
                100.0,
                Kind::Text {
                    total_len: MEDIUM_MESSAGE_BYTES,
                },
            )],
            SyntheticProfile::Large => vec![SyntheticTopic::new(
                "/synthetic/large",
                30.0,
                Kind::Text {
                    total_len: LARGE_MESSAGE_BYTES,
                },
            )],
            SyntheticProfile::Camera => vec![SyntheticTopic::new(
                "/camera/hd/image_raw",
                30.0,
                Kind::Image {
                    frame_id: "camera_hd_optical_frame",
                    width: HD_WIDTH,
                    height: HD_HEIGHT,
                },
            )],
            SyntheticProfile::Mixed => vec![
                SyntheticTopic::new(
                    "/synthetic/small",
                    1000.0,
                    Kind::Text {
                        total_len: SMALL_MESSAGE_BYTES,
                    },
                ),
                SyntheticTopic::new(
                    "/synthetic/blob",
                    30.0,
                    Kind::Text {
                        total_len: MIXED_LARGE_MESSAGE_BYTES,
                    },
                ),
            ],
        }
    }
}

/// What a topic carries; decides the type and the encoder.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// std_msgs/String whose serialized size is exactly `total_len`.
    Text {
        total_len: usize,
    },
    Imu {
        frame_id: &'static str,
    },
    /// tf2_msgs/TFMessage with map->odom and odom->base_link.
    Tf,
    /// sensor_msgs/Image, rgb8.
    Image {
        frame_id: &'static str,
        width: u32,
        height: u32,
    },
    /// sensor_msgs/PointCloud2 with x, y, z, intensity as float32.
    PointCloud {
        frame_id: &'static str,
        points: u32,
    },
}

impl Kind {
    fn type_name(self) -> &'static str {
        match self {
            Kind::Text { .. } => "std_msgs/msg/String",
            Kind::Imu { .. } => "sensor_msgs/msg/Imu",
            Kind::Tf => "tf2_msgs/msg/TFMessage",
            Kind::Image { .. } => "sensor_msgs/msg/Image",
            Kind::PointCloud { .. } => "sensor_msgs/msg/PointCloud2",
        }
    }
}

/// One generated topic: what goes into the bag's `topics` and `message_definitions` tables,
/// and the nominal real-time rate.
#[derive(Debug, Clone)]
pub struct SyntheticTopic {
    pub info: TopicInfo,
    pub definition: MessageDefinition,
    pub rate_hz: f64,
    kind: Kind,
}

impl SyntheticTopic {
    fn new(name: &str, rate_hz: f64, kind: Kind) -> Self {
        let type_name = kind.type_name();
        let hash = type_description_hash(type_name).unwrap_or_default();
        let mut info = TopicInfo::new(name, type_name);
        info.type_description_hash = hash.to_string();
        let definition = message_definition(type_name, hash);
        SyntheticTopic {
            info,
            definition,
            rate_hz,
            kind,
        }
    }

    /// A fresh encoder for this topic with the template payload; builds it once.
    pub fn encoder(&self) -> Encoder {
        Encoder::new(self.kind, Payload::Template)
    }

    /// A fresh encoder for this topic with the given payload; builds its templates (or its
    /// realistic variants) once.
    pub fn encoder_with(&self, payload: Payload) -> Encoder {
        Encoder::new(self.kind, payload)
    }
}

/// Encodes the messages of one topic. Holds the precomputed template, so create one per topic
/// and reuse it for every message.
#[derive(Debug, Clone)]
pub struct Encoder {
    kind: Kind,
    payload: Payload,
    /// Realistic images and clouds: [`REALISTIC_VARIANTS`] complete messages (with `template`
    /// left empty, so that `encode_reusing` encodes afresh); empty otherwise.
    variants: Vec<Vec<u8>>,
    /// A complete message for the big kinds, copied per message and then patched (stamp and
    /// seq bytes); empty for Imu and tf, which are small enough to encode field by field.
    template: Vec<u8>,
    /// Buffer index of the first byte of the variable payload (string text, image or point data).
    data_offset: usize,
    /// Exact serialized size of every message of this topic.
    size: usize,
}

impl Encoder {
    fn new(kind: Kind, payload: Payload) -> Self {
        let mut enc = Encoder {
            kind,
            payload,
            variants: Vec::new(),
            template: Vec::new(),
            data_offset: 0,
            size: 0,
        };
        let mut template = Vec::new();
        match kind {
            Kind::Text { total_len } => {
                let mut w = CdrWriter::new(&mut template);
                // 4 (encapsulation) + 4 (length) + text + 1 (NUL) = total_len.
                let text_len = total_len.saturating_sub(HEADER_LEN + 5);
                w.sequence_len(text_len + 1);
                enc.data_offset = w.buffer_offset();
                for chunk in TEXT_FILLER.iter().cycle().take(text_len) {
                    w.u8(*chunk);
                }
                w.u8(0);
            }
            Kind::Image {
                frame_id,
                width,
                height,
            } => {
                let mut w = CdrWriter::new(&mut template);
                w.time(0);
                w.string(frame_id);
                w.u32(height);
                w.u32(width);
                w.string("rgb8");
                w.u8(0);
                let step = width * 3;
                w.u32(step);
                let len = step as usize * height as usize;
                w.sequence_len(len);
                enc.data_offset = w.buffer_offset();
                // A gradient: red along x, green along y, so a viewer shows a real picture.
                for y in 0..height {
                    let g = (y * 255 / height.max(1)) as u8;
                    for x in 0..width {
                        let r = (x * 255 / width.max(1)) as u8;
                        w.raw(&[r, g, 128]);
                    }
                }
            }
            Kind::PointCloud { frame_id, points } => {
                let mut w = CdrWriter::new(&mut template);
                w.time(0);
                w.string(frame_id);
                w.u32(1); // height: unorganized cloud
                w.u32(points); // width
                w.sequence_len(4);
                for (i, name) in ["x", "y", "z", "intensity"].into_iter().enumerate() {
                    w.string(name);
                    w.u32(4 * i as u32); // offset
                    w.u8(POINT_FIELD_FLOAT32);
                    w.u32(1); // count
                }
                w.bool(false); // is_bigendian
                w.u32(POINT_STEP);
                w.u32(POINT_STEP * points); // row_step
                w.sequence_len(POINT_STEP as usize * points as usize);
                enc.data_offset = w.buffer_offset();
                for i in 0..points {
                    for v in cloud_point(i) {
                        w.raw(&v.to_le_bytes());
                    }
                }
                w.bool(true); // is_dense
            }
            Kind::Imu { .. } | Kind::Tf => {}
        }
        if payload == Payload::Realistic {
            let seed = match kind {
                Kind::Image { frame_id, .. } | Kind::PointCloud { frame_id, .. } => {
                    fnv1a(frame_id.as_bytes())
                }
                _ => 0,
            };
            let off = enc.data_offset;
            match kind {
                Kind::Image { width, height, .. } => {
                    let scene = image_scene(width, height, seed);
                    enc.variants = (0..REALISTIC_VARIANTS as u64)
                        .map(|v| {
                            let mut m = template.clone();
                            realistic_image(&mut m[off..], &scene, seed ^ v);
                            m
                        })
                        .collect();
                    template = Vec::new();
                }
                Kind::PointCloud { points, .. } => {
                    enc.variants = (0..REALISTIC_VARIANTS as u64)
                        .map(|v| {
                            let mut m = template.clone();
                            realistic_cloud(&mut m[off..], points, seed ^ v);
                            m
                        })
                        .collect();
                    template = Vec::new();
                }
                // Text stays the template; IMU and tf add their noise per message.
                Kind::Text { .. } | Kind::Imu { .. } | Kind::Tf => {}
            }
        }
        enc.template = template;
        enc.size = if enc.template.is_empty() {
            let mut probe = Vec::new();
            enc.encode(0, 0, &mut probe);
            probe.len()
        } else {
            enc.template.len()
        };
        enc
    }

    /// Appends one message's CDR bytes (encapsulation header included) to `buf`; the caller
    /// clears `buf` first. The bytes depend only on `seq` and `stamp_ns`; `header.stamp` (every
    /// header, for tf) is set from `stamp_ns`. Never allocates once `buf` has grown to
    /// [`Encoder::size_hint`].
    pub fn encode(&mut self, seq: u64, stamp_ns: i64, buf: &mut Vec<u8>) {
        let start = buf.len();
        match self.kind {
            Kind::Text { .. } => {
                append_template(buf, &self.template);
                let text_end = buf.len() - 1;
                patch_text(&mut buf[start + self.data_offset..text_end], seq, stamp_ns);
            }
            Kind::Image { .. } | Kind::PointCloud { .. } if !self.variants.is_empty() => {
                // A precomputed noisy frame or scan, the stamp, and seq in the first 8 data
                // bytes: no two messages are equal.
                append_template(
                    buf,
                    &self.variants[(seq % self.variants.len() as u64) as usize],
                );
                cdr::patch_time(buf, start + HEADER_LEN, stamp_ns);
                let data = &mut buf[start + self.data_offset..];
                data[..8].copy_from_slice(&seq.to_le_bytes());
            }
            Kind::Image { width, height, .. } => {
                append_template(buf, &self.template);
                cdr::patch_time(buf, start + HEADER_LEN, stamp_ns);
                let data = &mut buf[start + self.data_offset..];
                // seq in the first 8 bytes, plus a white column that moves one pixel per frame.
                data[..8].copy_from_slice(&seq.to_le_bytes());
                let step = width as usize * 3;
                let x = (seq % u64::from(width.max(1))) as usize * 3;
                for row in data.chunks_exact_mut(step).take(height as usize).skip(1) {
                    row[x..x + 3].copy_from_slice(&[255, 255, 255]);
                }
            }
            Kind::PointCloud { points, .. } => {
                append_template(buf, &self.template);
                cdr::patch_time(buf, start + HEADER_LEN, stamp_ns);
                let data = &mut buf[start + self.data_offset..];
                // Intensity of point 0 carries seq; one point per scan moves outwards.
                data[12..16].copy_from_slice(&(seq as f32).to_le_bytes());
                let i = (seq % u64::from(points.max(1))) as usize * POINT_STEP as usize;
                let p = &mut data[i..i + 4];
                let x = f32::from_le_bytes([p[0], p[1], p[2], p[3]]) * 1.5;
                p.copy_from_slice(&x.to_le_bytes());
            }
            Kind::Imu { frame_id } => encode_imu(buf, frame_id, seq, stamp_ns, self.noise(seq)),
            Kind::Tf => encode_tf(buf, seq, stamp_ns, self.noise(seq)),
        }
    }

    /// The per-message noise source of IMU and tf: seeded by `seq` (deterministic), or none
    /// for the template payload.
    fn noise(&self, seq: u64) -> Option<Rng> {
        (self.payload == Payload::Realistic).then(|| Rng::new(seq ^ 0x5eed_1e55))
    }

    /// As [`encode`](Self::encode) into a pooled buffer that may still hold an earlier message
    /// of this encoder, identified by `old_tag` (what this function returned for it). Then
    /// only the bytes that differ between the two messages are rewritten (header stamp,
    /// sequence marks): for a 1 MiB frame a few KiB instead of the whole template, so a
    /// benchmark measures the recorder rather than a memcpy. Any other buffer is cleared and
    /// encoded from scratch. The result is byte for byte what `encode` produces; the returned
    /// tag (`key` in the top 16 bits, `seq` below) describes it. `key` tells this encoder's
    /// buffers from other topics' and must not be 0 ([`NO_TAG`](crate::pipeline::NO_TAG)).
    pub fn encode_reusing(
        &mut self,
        key: u16,
        seq: u64,
        stamp_ns: i64,
        buf: &mut Vec<u8>,
        old_tag: u64,
    ) -> u64 {
        debug_assert!(key != 0, "key 0 would be NO_TAG");
        const SEQ_BITS: u32 = 48;
        let tag = (u64::from(key) << SEQ_BITS) | (seq & ((1 << SEQ_BITS) - 1));
        let old_seq = old_tag & ((1 << SEQ_BITS) - 1);
        let mine = old_tag >> SEQ_BITS == u64::from(key) && buf.len() == self.size;
        if !mine || self.template.is_empty() {
            buf.clear();
            self.encode(seq, stamp_ns, buf);
            return tag;
        }
        match self.kind {
            Kind::Text { .. } => {
                let text_end = buf.len() - 1;
                patch_text(&mut buf[self.data_offset..text_end], seq, stamp_ns);
            }
            Kind::Image { width, height, .. } => {
                cdr::patch_time(buf, HEADER_LEN, stamp_ns);
                let step = width as usize * 3;
                let w = u64::from(width.max(1));
                let (old_x, x) = ((old_seq % w) as usize * 3, (seq % w) as usize * 3);
                let template = &self.template[self.data_offset..];
                let data = &mut buf[self.data_offset..];
                // Put back the previous frame's white column, then draw this frame's.
                for (row, orig) in data
                    .chunks_exact_mut(step)
                    .zip(template.chunks_exact(step))
                    .take(height as usize)
                    .skip(1)
                {
                    row[old_x..old_x + 3].copy_from_slice(&orig[old_x..old_x + 3]);
                    row[x..x + 3].copy_from_slice(&[255, 255, 255]);
                }
                data[..8].copy_from_slice(&seq.to_le_bytes());
            }
            Kind::PointCloud { points, .. } => {
                cdr::patch_time(buf, HEADER_LEN, stamp_ns);
                let n = u64::from(points.max(1));
                let step = POINT_STEP as usize;
                let (old_i, i) = ((old_seq % n) as usize * step, (seq % n) as usize * step);
                let template = &self.template[self.data_offset..];
                let data = &mut buf[self.data_offset..];
                data[old_i..old_i + 4].copy_from_slice(&template[old_i..old_i + 4]);
                data[12..16].copy_from_slice(&(seq as f32).to_le_bytes());
                let t = &template[i..i + 4];
                let x = f32::from_le_bytes([t[0], t[1], t[2], t[3]]) * 1.5;
                data[i..i + 4].copy_from_slice(&x.to_le_bytes());
            }
            Kind::Imu { .. } | Kind::Tf => unreachable!("no template: encoded from scratch above"),
        }
        tag
    }

    /// Exact serialized size of every message this encoder produces.
    pub fn size_hint(&self) -> usize {
        self.size
    }
}

/// Copies a template in 2 KiB pieces. glibc's memcpy uses `rep movsb` for 2 KiB..512 KiB
/// copies, which on the AMD EPYC bench machine ran at 2 GB/s for the 64 KiB template
/// (vs 30 GB/s for the 1 MiB one, which takes the vector loop); pieces under glibc's
/// `rep_movsb_threshold` always take the vector loop. `buf` grows once, not per piece.
fn append_template(buf: &mut Vec<u8>, template: &[u8]) {
    const PIECE: usize = 2048;
    buf.reserve(template.len());
    for piece in template.chunks(PIECE) {
        buf.extend_from_slice(piece);
    }
}

/// sensor_msgs/PointField FLOAT32.
const POINT_FIELD_FLOAT32: u8 = 7;

/// Printable ASCII filler for std_msgs/String payloads (valid UTF-8, no NUL).
const TEXT_FILLER: &[u8] = b"ringbag synthetic payload 0123456789 abcdefghijklmnopqrstuvwxyz. ";

/// Width of the `seq=... stamp=... ` prefix patched into every String message.
pub const TEXT_PREFIX_LEN: usize = 4 + 16 + 7 + 16 + 1;

/// Writes `seq=<16 hex digits> stamp=<16 hex digits> ` at the start of the text (when it
/// fits), so each message is unique and a reader can check it. Hex rather than decimal keeps
/// this at a few ns (no divisions) for the 100 B benchmark; the stamp is the two's-complement
/// bit pattern of `stamp_ns`.
fn patch_text(text: &mut [u8], seq: u64, stamp_ns: i64) {
    if text.len() < TEXT_PREFIX_LEN {
        return;
    }
    text[..4].copy_from_slice(b"seq=");
    write_hex(&mut text[4..20], seq);
    text[20..27].copy_from_slice(b" stamp=");
    write_hex(&mut text[27..43], stamp_ns as u64);
    text[43] = b' ';
}

/// Zero-padded lowercase hex, right-aligned in `dst` (no allocation, unlike `format!`).
fn write_hex(dst: &mut [u8], mut v: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for d in dst.iter_mut().rev() {
        *d = DIGITS[(v & 0xf) as usize];
        v >>= 4;
    }
}

/// Point `i` of a 64-ring spinning lidar scan (1024 points per ring).
fn cloud_point(i: u32) -> [f32; 4] {
    let ring = (i / 1024) as f32;
    let azimuth = (i % 1024) as f32 * (std::f32::consts::TAU / 1024.0);
    let range = 4.0 + ring * 0.25;
    let elevation = (ring - 32.0) * 0.01;
    [
        range * azimuth.cos(),
        range * azimuth.sin(),
        range * elevation,
        ring,
    ]
}

// ---------------------------------------------------------------------------------------------
// Realistic payloads (`--synthetic-payload realistic`): what makes real sensor data hard to
// compress is noise, which no dictionary coder can predict. Each image and cloud is built
// REALISTIC_VARIANTS times at start-up, so a message costs the same copy as the template.

/// xorshift64*: cheap, deterministic, good enough for sensor noise.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        // splitmix64 of the seed: nearby seeds (seq, seq + 1) give unrelated streams, never 0.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Approximately standard normal: the sum of four 16-bit uniforms, centred and scaled to
    /// unit variance (tails end at ±3.46, which sensor noise models do not need).
    fn gauss(&mut self) -> f32 {
        let r = self.next();
        let sum = (r & 0xffff) + (r >> 16 & 0xffff) + (r >> 32 & 0xffff) + (r >> 48);
        (sum as f32 / 65536.0 - 2.0) * 3f32.sqrt()
    }
}

/// FNV-1a, to give each camera and lidar a scene and noise of its own.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Camera noise (1 sigma, in LSB of 8 bits): read noise, and the shot-noise gain (electrons
/// per LSB; shot noise is sqrt(signal / gain)). At these values a mid-grey pixel varies by
/// about 2.4 LSB and a bright one by 4, as a small-pixel CMOS sensor at moderate gain.
const CAMERA_READ_NOISE_LSB: f32 = 1.5;
const CAMERA_GAIN: f32 = 18.0;

/// The noiseless scene of one camera, rgb8 row-major: a sky band brightening to saturation at
/// the top, a middle band of 64 x 48 px blocks (buildings, cars: a colour each, lit by a
/// gradient across the block) and a road darkening towards the bottom. It only sets the
/// spread of pixel values (what entropy coding can still win); the noise decides the rest.
fn image_scene(width: u32, height: u32, seed: u64) -> Vec<u8> {
    let (w, h) = (width as usize, height as usize);
    let mut scene = vec![0u8; w * h * 3];
    for (y, row) in scene.chunks_exact_mut(w * 3).enumerate() {
        let fy = y as f32 / h.max(1) as f32;
        for (x, px) in row.chunks_exact_mut(3).enumerate() {
            let fx = x as f32 / w.max(1) as f32;
            let rgb: [f32; 3] = if fy < 0.25 {
                // Sky: 8 % of the frame clips at 255 (over-exposed), as auto exposure leaves it.
                let b = 200.0 + 90.0 * (1.0 - fy / 0.25);
                [b - 40.0, b - 15.0, b]
            } else if fy < 0.65 {
                let block = fnv1a(&[(x / 64) as u8, (y / 48) as u8]) ^ seed;
                let lit = 0.7 + 0.3 * ((x % 64) as f32 / 64.0);
                let base = |shift: u32| 30.0 + ((block >> shift) & 0xff) as f32 * 0.7;
                [base(0) * lit, base(8) * lit, base(16) * lit]
            } else {
                let g = 110.0 - 60.0 * (fy - 0.65) / 0.35 + 10.0 * fx;
                [g, g, g + 4.0]
            };
            for (p, v) in px.iter_mut().zip(rgb) {
                *p = v.clamp(0.0, 255.0) as u8;
            }
        }
    }
    scene
}

/// One noisy frame of `scene` into `data`: each byte gets independent read and shot noise,
/// rounded and clipped to 0..=255, as a raw sensor's output after debayering.
fn realistic_image(data: &mut [u8], scene: &[u8], seed: u64) {
    let sigma: Vec<f32> = (0..256)
        .map(|v| (CAMERA_READ_NOISE_LSB.powi(2) + v as f32 / CAMERA_GAIN).sqrt())
        .collect();
    let mut rng = Rng::new(seed);
    for (d, &s) in data.iter_mut().zip(scene) {
        let v = f32::from(s) + rng.gauss() * sigma[usize::from(s)];
        *d = v.round().clamp(0.0, 255.0) as u8;
    }
}

/// The realistic lidar: a 64-ring spinning sensor (vertical field ±16.6°, 1024 points per
/// ring, as an Ouster OS1-64) 1.8 m above a flat road in a street canyon (building fronts
/// 7 m to either side, 12 m tall), range noise of 2 cm (1 sigma), a no-return (x = y = z =
/// intensity = 0, as drivers write it) for sky, beyond 100 m and 3 % dropouts (dark or
/// specular surfaces). Intensity is an integer reflectivity (road ~12, lane marking ~100,
/// facades 30..60 with windows) plus noise, stored as float32 as drivers do.
const LIDAR_RANGE_SIGMA_M: f32 = 0.02;
const LIDAR_DROPOUT: f32 = 0.03;

fn realistic_cloud(data: &mut [u8], points: u32, seed: u64) {
    const HEIGHT: f32 = 1.8;
    const HALF_STREET: f32 = 7.0;
    const FACADE: f32 = 12.0;
    let mut rng = Rng::new(seed);
    for (i, p) in data
        .chunks_exact_mut(POINT_STEP as usize)
        .take(points as usize)
        .enumerate()
    {
        let ring = (i / 1024) as f32;
        let azimuth = (i % 1024) as f32 * (std::f32::consts::TAU / 1024.0);
        let elevation = (-16.6 + ring * 33.2 / 63.0).to_radians();
        let d = [
            elevation.cos() * azimuth.cos(),
            elevation.cos() * azimuth.sin(),
            elevation.sin(),
        ];
        // The nearest of the road and the facades; None: sky or out of range.
        let road = (d[2] < 0.0).then(|| HEIGHT / -d[2]);
        let facade = (d[1].abs() > 1e-6)
            .then(|| HALF_STREET / d[1].abs())
            .filter(|t| (0.0..=FACADE).contains(&(HEIGHT + t * d[2])));
        let hit = match (road, facade) {
            (Some(r), Some(f)) => Some((r.min(f), r <= f)),
            (Some(r), None) => Some((r, true)),
            (None, Some(f)) => Some((f, false)),
            (None, None) => None,
        };
        // One uniform for the dropout, drawn for every point so the stream stays aligned.
        let dropout = ((rng.next() >> 40) as f32 / (1u64 << 24) as f32) < LIDAR_DROPOUT;
        let v = match hit {
            Some((t, is_road)) if t <= 100.0 && !dropout => {
                let r = t + rng.gauss() * LIDAR_RANGE_SIGMA_M;
                let (x, y) = (r * d[0], r * d[1]);
                let reflect = if is_road {
                    if y.abs() < 0.15 {
                        100.0
                    } else {
                        12.0
                    }
                } else if (x.rem_euclid(3.0) < 1.2) && (HEIGHT + r * d[2]).rem_euclid(3.5) > 1.0 {
                    30.0 // a window
                } else {
                    60.0
                };
                let intensity = (reflect + rng.gauss() * 3.0).round().max(0.0);
                [x, y, r * d[2], intensity]
            }
            _ => [0.0; 4],
        };
        for (dst, f) in p.chunks_exact_mut(4).zip(v) {
            dst.copy_from_slice(&f.to_le_bytes());
        }
    }
}

/// Covariances for all three IMU blocks: a small diagonal rather than zeros ("unknown" in
/// sensor_msgs) or -1 ("not provided"), so consumers that invert it get a valid matrix.
const DIAG_COVARIANCE: [f64; 9] = [0.01, 0.0, 0.0, 0.0, 0.01, 0.0, 0.0, 0.0, 0.01];

/// IMU noise (1 sigma) of a MEMS unit: gyro rad/s, accelerometer m/s², orientation
/// (quaternion components, from the filter).
const IMU_GYRO_SIGMA: f64 = 0.003;
const IMU_ACCEL_SIGMA: f64 = 0.02;
const IMU_QUAT_SIGMA: f64 = 1e-4;

fn encode_imu(buf: &mut Vec<u8>, frame_id: &str, seq: u64, stamp_ns: i64, noise: Option<Rng>) {
    // Yawing slowly at 0.4 rad/s when sampled at 400 Hz.
    let yaw = seq as f64 * 0.001;
    let mut noise = noise;
    // Exactly `v` without noise: the template payload's bytes stay what they were.
    let mut n = |v: f64, sigma: f64| match noise.as_mut() {
        Some(r) => v + f64::from(r.gauss()) * sigma,
        None => v,
    };
    let (s, c) = (yaw / 2.0).sin_cos();
    let mut w = CdrWriter::new(buf);
    w.time(stamp_ns);
    w.string(frame_id);
    for q in [0.0, 0.0, s, c] {
        w.f64(n(q, IMU_QUAT_SIGMA));
    }
    for v in DIAG_COVARIANCE {
        w.f64(v);
    }
    for v in [0.0, 0.0, 0.4] {
        w.f64(n(v, IMU_GYRO_SIGMA));
    }
    for v in DIAG_COVARIANCE {
        w.f64(v);
    }
    for v in [0.05 * yaw.cos(), 0.05 * yaw.sin(), 9.80665] {
        w.f64(n(v, IMU_ACCEL_SIGMA));
    }
    for v in DIAG_COVARIANCE {
        w.f64(v);
    }
}

/// The transforms of the robot profile's /tf messages.
pub const TF_FRAMES: [(&str, &str); 2] = [("map", "odom"), ("odom", "base_link")];

/// Odometry noise (1 sigma) of the realistic tf: metres and radians.
const TF_TRANSLATION_SIGMA: f64 = 0.001;
const TF_YAW_SIGMA: f64 = 0.0005;

fn encode_tf(buf: &mut Vec<u8>, seq: u64, stamp_ns: i64, noise: Option<Rng>) {
    let t = seq as f64 * 0.01; // seconds at 100 Hz
    let mut noise = noise;
    // Exactly `v` without noise: the template payload's bytes stay what they were.
    let mut n = |v: f64, sigma: f64| match noise.as_mut() {
        Some(r) => v + f64::from(r.gauss()) * sigma,
        None => v,
    };
    let mut w = CdrWriter::new(buf);
    w.sequence_len(TF_FRAMES.len());
    for (i, (parent, child)) in TF_FRAMES.iter().enumerate() {
        w.time(stamp_ns);
        w.string(parent);
        w.string(child);
        // map->odom drifts slowly; odom->base_link drives a 5 m circle at 0.5 m/s.
        let (translation, yaw) = if i == 0 {
            ([0.001 * t, 0.0, 0.0], 0.0)
        } else {
            let a = t * 0.1;
            (
                [5.0 * a.cos(), 5.0 * a.sin(), 0.0],
                a + std::f64::consts::FRAC_PI_2,
            )
        };
        for v in translation {
            w.f64(n(v, TF_TRANSLATION_SIGMA));
        }
        let (s, c) = (n(yaw, TF_YAW_SIGMA) / 2.0).sin_cos();
        for q in [0.0, 0.0, s, c] {
            w.f64(q);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Interface data: type hashes and message definitions, as rosbag2 Jazzy stores them.

/// `RIHS01_...` type description hashes (ROS 2 Jazzy), computed once with
/// `rosbags` 0.11.9 (`get_typestore(Stores.ROS2_JAZZY).hash_rihs01(type)`); the String hash
/// equals the one real `ros2 bag record` stored in the Jazzy reference bag.
const TYPE_HASHES: &[(&str, &str)] = &[
    (
        "std_msgs/msg/String",
        "RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18",
    ),
    (
        "sensor_msgs/msg/Imu",
        "RIHS01_7d9a00ff131080897a5ec7e26e315954b8eae3353c3f995c55faf71574000b5b",
    ),
    (
        "sensor_msgs/msg/Image",
        "RIHS01_d31d41a9a4c4bc8eae9be757b0beed306564f7526c88ea6a4588fb9582527d47",
    ),
    (
        "sensor_msgs/msg/PointCloud2",
        "RIHS01_9198cabf7da3796ae6fe19c4cb3bdd3525492988c70522628af5daa124bae2b5",
    ),
    (
        "tf2_msgs/msg/TFMessage",
        "RIHS01_e369d0f05a23ae52508854b66f6aa0437f3449d652e8cbf22d5abe85d020f087",
    ),
];

/// The Jazzy type hash of one of the synthetic types.
pub fn type_description_hash(type_name: &str) -> Option<&'static str> {
    TYPE_HASHES
        .iter()
        .find(|(t, _)| *t == type_name)
        .map(|(_, h)| *h)
}

/// The `message_definitions` row rosbag2 Jazzy writes for `type_name`, composed from the
/// embedded .msg files by the same code as live topics' rows.
fn message_definition(type_name: &str, hash: &str) -> MessageDefinition {
    msgdef::local_definition(type_name, hash, &EmbeddedFiles)
}

/// The `ros2msg` text rosbag2 Jazzy stores for `type_name` (`pkg/msg/Type`), from the embedded
/// .msg files; `None` when they hold no `.msg` definition for it (see [`msgdef`]).
pub fn full_msg_definition(type_name: &str) -> Option<String> {
    match msgdef::full_text(type_name, &EmbeddedFiles) {
        Ok(full) if full.encoding == Encoding::Ros2Msg => Some(full.text),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_are_only_found_for_embedded_msg_types() {
        assert!(full_msg_definition("std_msgs/msg/String").is_some());
        // rosbag2 understands the short name too.
        assert_eq!(
            full_msg_definition("std_msgs/String"),
            full_msg_definition("std_msgs/msg/String")
        );
        assert_eq!(full_msg_definition("std_msgs/srv/Empty"), None);
        assert_eq!(full_msg_definition("nav_msgs/msg/Odometry"), None);
    }

    #[test]
    fn a_missing_definition_is_stored_as_unknown_like_rosbag2_does() {
        let def = message_definition("nav_msgs/msg/Odometry", "");
        assert_eq!(def.encoding, "unknown");
        assert!(def.encoded_message_definition.is_empty());
    }

    #[test]
    fn encoder_templates_do_not_change_while_encoding() {
        for profile in [SyntheticProfile::Robot, SyntheticProfile::Small] {
            for topic in profile.topics() {
                let mut enc = topic.encoder();
                let before = (enc.template.clone(), enc.template.capacity());
                let mut buf = Vec::new();
                for seq in 0..20 {
                    buf.clear();
                    enc.encode(seq, 1, &mut buf);
                }
                assert_eq!((enc.template.clone(), enc.template.capacity()), before);
            }
        }
    }

    #[test]
    fn reusing_a_buffer_gives_the_same_bytes_as_encoding_afresh() {
        // Every kind, including the point whose index wraps and point 0 (whose intensity
        // also carries seq), and a buffer from another encoder (a different key).
        for profile in [
            SyntheticProfile::Robot,
            SyntheticProfile::Small,
            SyntheticProfile::Large,
            SyntheticProfile::Camera,
        ] {
            for (k, t) in profile.topics().iter().enumerate() {
                let key = k as u16 + 1;
                let mut enc = t.encoder();
                let mut buf = Vec::new();
                let mut tag = crate::pipeline::NO_TAG;
                for seq in [
                    0u64, 1, 2, 1279, 1280, 65_535, 65_536, 65_537, 7, 7, 3_000_001,
                ] {
                    let stamp = 1_700_000_000_123_456_789 + seq as i64;
                    tag = enc.encode_reusing(key, seq, stamp, &mut buf, tag);
                    let mut fresh = Vec::new();
                    enc.encode(seq, stamp, &mut fresh);
                    assert!(
                        buf == fresh,
                        "{} seq {seq}: reused bytes differ",
                        t.info.name
                    );
                }
                // A buffer tagged by another topic is encoded from scratch.
                let other = (u64::from(key) + 1) << 48 | 5;
                let t2 = enc.encode_reusing(key, 9, 9, &mut buf, other);
                let mut fresh = Vec::new();
                enc.encode(9, 9, &mut fresh);
                assert!(buf == fresh && t2 >> 48 == u64::from(key));
            }
        }
    }

    /// Every topic of the profiles with images and clouds, realistic and template encoders.
    fn realistic_pairs() -> Vec<(SyntheticTopic, Encoder, Encoder)> {
        [SyntheticProfile::Robot, SyntheticProfile::Camera]
            .into_iter()
            .flat_map(|p| p.topics())
            .map(|t| {
                let (r, e) = (t.encoder_with(Payload::Realistic), t.encoder());
                (t, r, e)
            })
            .collect()
    }

    #[test]
    fn realistic_payloads_keep_the_cdr_layout_and_size_of_the_template() {
        for (t, mut real, mut tpl) in realistic_pairs() {
            assert_eq!(real.size_hint(), tpl.size_hint(), "{}", t.info.name);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            real.encode(5, 77, &mut a);
            tpl.encode(5, 77, &mut b);
            assert_eq!(a.len(), real.size_hint(), "{}", t.info.name);
            // Header, frame_id, dimensions, encoding, fields: byte for byte the template's
            // (for IMU and tf, whose every float is noisy: the stamp and frame_id).
            let fixed = match t.kind {
                Kind::Imu { frame_id } => HEADER_LEN + 8 + 4 + frame_id.len() + 1,
                Kind::Tf => HEADER_LEN + 4 + 8,
                _ => real.data_offset,
            };
            assert_eq!(a[..fixed], b[..fixed], "{}", t.info.name);
            assert!(
                a != b,
                "{}: realistic bytes equal the template's",
                t.info.name
            );
            if let Kind::PointCloud { .. } = t.kind {
                // is_dense stays the last byte; every float is finite (no-returns are 0).
                assert_eq!(a.last(), Some(&1));
                let data = &a[real.data_offset..a.len() - 1];
                assert!(data[8..]
                    .chunks_exact(4)
                    .all(|f| f32::from_le_bytes(f.try_into().unwrap()).is_finite()));
            }
        }
    }

    #[test]
    fn realistic_payloads_are_deterministic_per_seq_and_differ_between_messages() {
        for (t, mut real, _) in realistic_pairs() {
            let mut again = t.encoder_with(Payload::Realistic);
            let mut prev: Option<Vec<u8>> = None;
            for seq in 0..(REALISTIC_VARIANTS as u64 + 2) {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                real.encode(seq, 1_000, &mut a);
                again.encode(seq, 1_000, &mut b);
                assert!(a == b, "{} seq {seq}: not deterministic", t.info.name);
                if let Some(p) = prev {
                    // Not a few patched bytes: the noise differs nearly everywhere (a
                    // saturated pixel or a no-return point may repeat).
                    let differ = a.iter().zip(&p).filter(|(x, y)| x != y).count();
                    let floor = match t.kind {
                        Kind::Imu { .. } | Kind::Tf => 16,
                        _ => (a.len() - real.data_offset) / 2,
                    };
                    assert!(
                        differ > floor,
                        "{} seq {seq}: {differ} bytes differ",
                        t.info.name
                    );
                }
                prev = Some(a);
            }
        }
    }

    #[test]
    fn reusing_a_buffer_with_realistic_payloads_gives_the_same_bytes() {
        for (t, mut real, _) in realistic_pairs() {
            let (mut buf, mut tag) = (Vec::new(), crate::pipeline::NO_TAG);
            for seq in [0u64, 1, 4, 4, 9] {
                tag = real.encode_reusing(1, seq, 3, &mut buf, tag);
                let mut fresh = Vec::new();
                real.encode(seq, 3, &mut fresh);
                assert!(buf == fresh, "{} seq {seq}", t.info.name);
            }
        }
    }

    #[test]
    fn camera_noise_is_a_few_lsb_and_the_lidar_noise_a_few_centimetres() {
        let (w, h) = (CAMERA_WIDTH, CAMERA_HEIGHT);
        let scene = image_scene(w, h, 1);
        let (mut a, mut b) = (vec![0u8; scene.len()], vec![0u8; scene.len()]);
        realistic_image(&mut a, &scene, 1);
        realistic_image(&mut b, &scene, 2);
        // Two frames of one scene differ by sqrt(2) times the noise: 2 to 6 LSB on average.
        let mean_abs = a
            .iter()
            .zip(&b)
            .map(|(x, y)| x.abs_diff(*y) as f64)
            .sum::<f64>()
            / a.len() as f64;
        assert!(
            (1.5..6.0).contains(&mean_abs),
            "mean |a - b| = {mean_abs} LSB"
        );

        let n = CLOUD_POINTS as usize;
        let (mut c, mut d) = (vec![0u8; n * 16], vec![0u8; n * 16]);
        realistic_cloud(&mut c, CLOUD_POINTS, 1);
        realistic_cloud(&mut d, CLOUD_POINTS, 2);
        let range = |p: &[u8]| {
            let f = |i: usize| f32::from_le_bytes(p[i..i + 4].try_into().unwrap());
            (f(0).powi(2) + f(4).powi(2) + f(8).powi(2)).sqrt()
        };
        let (mut empty, mut diffs) = (0, Vec::new());
        for (p, q) in c.chunks_exact(16).zip(d.chunks_exact(16)) {
            let (r, s) = (range(p), range(q));
            if r == 0.0 {
                empty += 1;
            } else if s != 0.0 {
                diffs.push(f64::from(r - s));
            }
        }
        let rms = (diffs.iter().map(|d| d * d).sum::<f64>() / diffs.len() as f64).sqrt();
        // sqrt(2) x 2 cm between two scans; no-returns: sky, far, and the 3 % dropouts.
        assert!((0.02..0.04).contains(&rms), "range rms difference {rms} m");
        assert!(
            (0.05..0.6).contains(&(empty as f64 / n as f64)),
            "{empty} no-returns"
        );
    }

    #[test]
    fn text_prefix_is_left_out_when_the_string_is_too_short_for_it() {
        let mut text = *b"short";
        patch_text(&mut text, 1, 1);
        assert_eq!(&text, b"short");
    }
}
