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

    /// A fresh encoder for this topic; builds its payload template once.
    pub fn encoder(&self) -> Encoder {
        Encoder::new(self.kind)
    }
}

/// Encodes the messages of one topic. Holds the precomputed template, so create one per topic
/// and reuse it for every message.
#[derive(Debug, Clone)]
pub struct Encoder {
    kind: Kind,
    /// A complete message for the big kinds, copied per message and then patched (stamp and
    /// seq bytes); empty for Imu and tf, which are small enough to encode field by field.
    template: Vec<u8>,
    /// Buffer index of the first byte of the variable payload (string text, image or point data).
    data_offset: usize,
    /// Exact serialized size of every message of this topic.
    size: usize,
}

impl Encoder {
    fn new(kind: Kind) -> Self {
        let mut enc = Encoder {
            kind,
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
            Kind::Imu { frame_id } => encode_imu(buf, frame_id, seq, stamp_ns),
            Kind::Tf => encode_tf(buf, seq, stamp_ns),
        }
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

/// Covariances for all three IMU blocks: a small diagonal rather than zeros ("unknown" in
/// sensor_msgs) or -1 ("not provided"), so consumers that invert it get a valid matrix.
const DIAG_COVARIANCE: [f64; 9] = [0.01, 0.0, 0.0, 0.0, 0.01, 0.0, 0.0, 0.0, 0.01];

fn encode_imu(buf: &mut Vec<u8>, frame_id: &str, seq: u64, stamp_ns: i64) {
    // Yawing slowly at 0.4 rad/s when sampled at 400 Hz.
    let yaw = seq as f64 * 0.001;
    let (s, c) = (yaw / 2.0).sin_cos();
    let mut w = CdrWriter::new(buf);
    w.time(stamp_ns);
    w.string(frame_id);
    for q in [0.0, 0.0, s, c] {
        w.f64(q);
    }
    for v in DIAG_COVARIANCE {
        w.f64(v);
    }
    for v in [0.0, 0.0, 0.4] {
        w.f64(v);
    }
    for v in DIAG_COVARIANCE {
        w.f64(v);
    }
    for v in [0.05 * yaw.cos(), 0.05 * yaw.sin(), 9.80665] {
        w.f64(v);
    }
    for v in DIAG_COVARIANCE {
        w.f64(v);
    }
}

/// The transforms of the robot profile's /tf messages.
pub const TF_FRAMES: [(&str, &str); 2] = [("map", "odom"), ("odom", "base_link")];

fn encode_tf(buf: &mut Vec<u8>, seq: u64, stamp_ns: i64) {
    let t = seq as f64 * 0.01; // seconds at 100 Hz
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
            w.f64(v);
        }
        let (s, c) = (yaw / 2.0).sin_cos();
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

    #[test]
    fn text_prefix_is_left_out_when_the_string_is_too_short_for_it() {
        let mut text = *b"short";
        patch_text(&mut text, 1, 1);
        assert_eq!(&text, b"short");
    }
}
