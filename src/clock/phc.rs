//! The thin device layer: read a PTP hardware clock (PHC) against the system clock.
//!
//! A sample is (system before, PHC, system after) in nanoseconds. "System" here is
//! CLOCK_MONOTONIC, not CLOCK_REALTIME: the tracker models the PHC as a function of a clock
//! that never steps, so a `settimeofday` or NTP step cannot make stamps jump. Kernel
//! measurements against CLOCK_REALTIME are converted with the (step-only) difference
//! REALTIME − MONOTONIC measured right after them.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{open, OFlag};
use nix::sys::stat::Mode;
use nix::time::{clock_gettime, ClockId};

use super::error::ClockError;

/// Device path that selects the CLOCK_MONOTONIC_RAW stand-in instead of a file. The `@`
/// keeps it from ever colliding with a real relative path a user might pass.
pub const MONOTONIC_RAW_STAND_IN: &str = "@monotonic-raw";

/// TAI − UTC the stand-in pretends its clock runs at, so that it behaves like a PHC kept on
/// TAI by ptp4l (the common field setup) and `ringbag clock` shows the 37 s difference.
const STAND_IN_TAI_UTC_S: i64 = 37;

/// Samples per kernel measurement; phc2sys uses 5 by default. Kernel maximum is 25.
const KERNEL_SAMPLES: u32 = 5;
/// Bracketing reads per user-space measurement; the narrowest one is kept.
const BRACKET_SAMPLES: usize = 5;

const NS_PER_S: i64 = 1_000_000_000;

/// One measurement of the PHC against CLOCK_MONOTONIC, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhcSample {
    pub sys_before_ns: i64,
    pub phc_ns: i64,
    pub sys_after_ns: i64,
}

impl PhcSample {
    /// Width of the system-time window the PHC read happened in: the bound on its error.
    pub fn window_ns(&self) -> i64 {
        self.sys_after_ns - self.sys_before_ns
    }

    pub fn sys_mid_ns(&self) -> i64 {
        self.sys_before_ns + self.window_ns() / 2
    }

    /// PHC − system at the middle of the window.
    pub fn offset_ns(&self) -> i64 {
        self.phc_ns - self.sys_mid_ns()
    }
}

/// How the offset is measured, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMethod {
    /// PTP_SYS_OFFSET_EXTENDED measured directly against CLOCK_MONOTONIC (Linux ≥ 6.11).
    SysOffsetExtendedMonotonic,
    /// PTP_SYS_OFFSET_EXTENDED against CLOCK_REALTIME, converted.
    SysOffsetExtended,
    /// PTP_SYS_OFFSET against CLOCK_REALTIME, converted.
    SysOffset,
    /// clock_gettime(system) / clock_gettime(PHC) / clock_gettime(system) from user space.
    Bracketing,
}

impl std::fmt::Display for ReadMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReadMethod::SysOffsetExtendedMonotonic => "PTP_SYS_OFFSET_EXTENDED (CLOCK_MONOTONIC)",
            ReadMethod::SysOffsetExtended => "PTP_SYS_OFFSET_EXTENDED (CLOCK_REALTIME)",
            ReadMethod::SysOffset => "PTP_SYS_OFFSET (CLOCK_REALTIME)",
            ReadMethod::Bracketing => "clock_gettime bracketing",
        })
    }
}

/// A source of PHC samples. The tracker owns one and polls it from its background thread.
pub trait PhcDevice: Send {
    /// One measurement. An error means the device is (currently) unusable; implementations
    /// that can recover (reopen after an unplug) do so on a later call.
    fn sample(&mut self) -> Result<PhcSample, ClockError>;

    /// The device path or a description, for logs and the bag's custom_data.
    fn name(&self) -> String;

    /// How samples are measured.
    fn method(&self) -> ReadMethod;
}

// --- kernel ABI, from linux/ptp_clock.h -------------------------------------------------

const PTP_MAX_SAMPLES: usize = 25;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PtpClockTime {
    pub sec: i64,
    pub nsec: u32,
    pub reserved: u32,
}

impl PtpClockTime {
    fn ns(&self) -> i64 {
        self.sec
            .saturating_mul(NS_PER_S)
            .saturating_add(i64::from(self.nsec))
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PtpClockCaps {
    pub max_adj: i32,
    pub n_alarm: i32,
    pub n_ext_ts: i32,
    pub n_per_out: i32,
    pub pps: i32,
    pub n_pins: i32,
    pub cross_timestamping: i32,
    pub adjust_phase: i32,
    pub max_phase_adj: i32,
    pub rsv: [i32; 11],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PtpSysOffset {
    pub n_samples: u32,
    pub rsv: [u32; 3],
    /// system, phc, system, phc, …, system.
    pub ts: [PtpClockTime; 2 * PTP_MAX_SAMPLES + 1],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PtpSysOffsetExtended {
    pub n_samples: u32,
    /// Was rsv[0] before Linux 6.11; older kernels reject a non-zero value with EINVAL.
    pub clockid: i32,
    pub rsv: [u32; 2],
    /// [system before, phc, system after] per sample.
    pub ts: [[PtpClockTime; 3]; PTP_MAX_SAMPLES],
}

const PTP_CLK_MAGIC: u8 = b'=';
nix::ioctl_read!(ptp_clock_getcaps, PTP_CLK_MAGIC, 1, PtpClockCaps);
// _IOW in the header, but the kernel writes the results back into the same struct.
nix::ioctl_write_ptr!(ptp_sys_offset, PTP_CLK_MAGIC, 5, PtpSysOffset);
nix::ioctl_readwrite!(
    ptp_sys_offset_extended,
    PTP_CLK_MAGIC,
    9,
    PtpSysOffsetExtended
);

/// The kernel's FD_TO_CLOCKID: dynamic POSIX clock id of an open PHC character device.
pub fn fd_to_clockid(fd: i32) -> libc::clockid_t {
    ((!fd) << 3) | 3
}

// --- clock helpers ----------------------------------------------------------------------

fn timespec_ns(ts: nix::sys::time::TimeSpec) -> i64 {
    ts.tv_sec()
        .saturating_mul(NS_PER_S)
        .saturating_add(ts.tv_nsec())
}

/// Reads `clock` in nanoseconds.
pub fn read_clock_ns(clock: ClockId) -> Result<i64, Errno> {
    clock_gettime(clock).map(timespec_ns)
}

/// CLOCK_MONOTONIC now, the tracker's system time base. It cannot fail on Linux; 0 would
/// only be clamped away by the per-source monotonic guard.
#[inline]
pub fn monotonic_now_ns() -> i64 {
    read_clock_ns(ClockId::CLOCK_MONOTONIC).unwrap_or(0)
}

/// Reads `clock` between two CLOCK_MONOTONIC reads, `BRACKET_SAMPLES` times, and keeps the
/// narrowest window. Both the PHC fallback and the CLOCK_MONOTONIC_RAW stand-in use this.
pub fn bracket(clock: ClockId) -> Result<PhcSample, Errno> {
    let mut best: Option<PhcSample> = None;
    for _ in 0..BRACKET_SAMPLES {
        let before = read_clock_ns(ClockId::CLOCK_MONOTONIC)?;
        let phc = read_clock_ns(clock)?;
        let after = read_clock_ns(ClockId::CLOCK_MONOTONIC)?;
        let s = PhcSample {
            sys_before_ns: before,
            phc_ns: phc,
            sys_after_ns: after,
        };
        if best.is_none_or(|b| s.window_ns() < b.window_ns()) {
            best = Some(s);
        }
    }
    best.ok_or(Errno::EINVAL)
}

/// CLOCK_REALTIME − CLOCK_MONOTONIC in ns. The two run at the same (NTP-slewed) rate and
/// differ only by steps, so the narrowest of a few brackets gives it to within tens of ns.
pub fn realtime_minus_monotonic_ns() -> i64 {
    let mut best = (i64::MAX, 0i64);
    for _ in 0..3 {
        let (Ok(a), Ok(rt), Ok(b)) = (
            read_clock_ns(ClockId::CLOCK_MONOTONIC),
            read_clock_ns(ClockId::CLOCK_REALTIME),
            read_clock_ns(ClockId::CLOCK_MONOTONIC),
        ) else {
            continue;
        };
        if b - a < best.0 {
            best = (b - a, rt - (a + (b - a) / 2));
        }
    }
    best.1
}

// --- the real device --------------------------------------------------------------------

enum Backing {
    Phc {
        fd: Option<OwnedFd>,
    },
    /// CLOCK_MONOTONIC_RAW shifted to look like a PHC on TAI.
    StandIn {
        epoch_offset_ns: i64,
    },
}

/// A PTP hardware clock character device (`/dev/ptpN`), or the CLOCK_MONOTONIC_RAW stand-in.
pub struct PtpDevice {
    path: PathBuf,
    backing: Backing,
    clock: ClockId,
    method: ReadMethod,
}

impl std::fmt::Debug for PtpDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtpDevice")
            .field("path", &self.path)
            .field("method", &self.method)
            .finish()
    }
}

impl PtpDevice {
    /// Opens `path` read-only and checks it is a PHC; `MONOTONIC_RAW_STAND_IN` gives the
    /// stand-in.
    pub fn open(path: &Path) -> Result<Self, ClockError> {
        if path == Path::new(MONOTONIC_RAW_STAND_IN) {
            return Ok(Self::monotonic_raw_stand_in());
        }
        let (fd, clock, method) = open_phc(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            backing: Backing::Phc { fd: Some(fd) },
            clock,
            method,
        })
    }

    /// CLOCK_MONOTONIC_RAW read through the bracketing path, shifted so it reads like a PHC
    /// kept on TAI (REALTIME at creation + 37 s). It drifts against the system clock exactly
    /// by the NTP frequency correction, like an undisciplined PHC would.
    pub fn monotonic_raw_stand_in() -> Self {
        let raw = read_clock_ns(ClockId::CLOCK_MONOTONIC_RAW).unwrap_or(0);
        let rt = read_clock_ns(ClockId::CLOCK_REALTIME).unwrap_or(0);
        Self {
            path: PathBuf::from(MONOTONIC_RAW_STAND_IN),
            backing: Backing::StandIn {
                epoch_offset_ns: rt - raw + STAND_IN_TAI_UTC_S * NS_PER_S,
            },
            clock: ClockId::CLOCK_MONOTONIC_RAW,
            method: ReadMethod::Bracketing,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One direct clock_gettime on the device clock (what a per-message read would cost).
    #[inline]
    pub fn read_phc_ns(&self) -> Result<i64, ClockError> {
        let raw = read_clock_ns(self.clock).map_err(|source| ClockError::Read {
            device: self.path.clone(),
            source,
        })?;
        Ok(match self.backing {
            Backing::StandIn { epoch_offset_ns } => raw + epoch_offset_ns,
            Backing::Phc { .. } => raw,
        })
    }
}

impl PhcDevice for PtpDevice {
    fn sample(&mut self) -> Result<PhcSample, ClockError> {
        match &mut self.backing {
            Backing::StandIn { epoch_offset_ns } => {
                let off = *epoch_offset_ns;
                let mut s = bracket(self.clock).map_err(|source| ClockError::Read {
                    device: self.path.clone(),
                    source,
                })?;
                s.phc_ns += off;
                Ok(s)
            }
            Backing::Phc { fd } => {
                if fd.is_none() {
                    // Lost earlier (unplugged NIC, driver reload): the dynamic clock id dies
                    // with the fd, so reopen and re-probe; the new PHC may differ.
                    let (new_fd, clock, method) =
                        open_phc(&self.path).map_err(|e| ClockError::Lost {
                            device: self.path.clone(),
                            reason: e.to_string(),
                        })?;
                    *fd = Some(new_fd);
                    self.clock = clock;
                    self.method = method;
                }
                let Some(open_fd) = fd.as_ref() else {
                    return Err(ClockError::Lost {
                        device: self.path.clone(),
                        reason: "not open".into(),
                    });
                };
                match measure_with(open_fd, self.clock, self.method) {
                    Ok(s) => Ok(s),
                    Err(source) => {
                        *fd = None;
                        Err(ClockError::Read {
                            device: self.path.clone(),
                            source,
                        })
                    }
                }
            }
        }
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }

    fn method(&self) -> ReadMethod {
        self.method
    }
}

/// Opens and validates a PHC, and probes the best measurement method it supports.
fn open_phc(path: &Path) -> Result<(OwnedFd, ClockId, ReadMethod), ClockError> {
    let device = || path.to_path_buf();
    // O_NONBLOCK: opening a FIFO (or a tty, a socket) must never wait; a PHC ignores it.
    let fd = open(
        path,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::ENOENT | Errno::ENODEV | Errno::ENXIO => {
            ClockError::DeviceMissing { device: device() }
        }
        Errno::EACCES | Errno::EPERM => ClockError::PermissionDenied { device: device() },
        source => ClockError::Open {
            device: device(),
            source,
        },
    })?;

    // Only a character device can be a PHC: refuse anything else before any ioctl, so a
    // FIFO, a regular file or a directory gets a plain answer instead of an ioctl's.
    let st = nix::sys::stat::fstat(&fd).map_err(|source| ClockError::Open {
        device: device(),
        source,
    })?;
    let kind = st.st_mode & libc::S_IFMT;
    if kind != libc::S_IFCHR {
        return Err(ClockError::NotAPhc {
            device: device(),
            reason: format!("not a character device but {}", file_kind(kind)),
        });
    }

    let mut caps = PtpClockCaps::default();
    // SAFETY: `caps` is a live, properly sized repr(C) struct the kernel fills in.
    if let Err(e) = unsafe { ptp_clock_getcaps(fd.as_raw_fd(), &mut caps) } {
        return Err(ClockError::NotAPhc {
            device: device(),
            reason: format!("PTP_CLOCK_GETCAPS: {e}"),
        });
    }
    let clock = ClockId::from_raw(fd_to_clockid(fd.as_raw_fd()));
    if let Err(e) = read_clock_ns(clock) {
        return Err(ClockError::NotAPhc {
            device: device(),
            reason: format!("clock_gettime on its dynamic clock: {e}"),
        });
    }
    for method in [
        ReadMethod::SysOffsetExtendedMonotonic,
        ReadMethod::SysOffsetExtended,
        ReadMethod::SysOffset,
        ReadMethod::Bracketing,
    ] {
        if measure_with(&fd, clock, method).is_ok() {
            return Ok((fd, clock, method));
        }
    }
    Err(ClockError::NotAPhc {
        device: device(),
        reason: "no offset measurement method works".into(),
    })
}

/// What a `st_mode & S_IFMT` value is, for the error message.
fn file_kind(kind: libc::mode_t) -> &'static str {
    match kind {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFBLK => "a block device",
        libc::S_IFLNK => "a symbolic link",
        _ => "an unknown file type",
    }
}

fn measure_with(fd: &OwnedFd, clock: ClockId, method: ReadMethod) -> Result<PhcSample, Errno> {
    match method {
        ReadMethod::SysOffsetExtendedMonotonic => sys_offset_extended(fd, libc::CLOCK_MONOTONIC),
        ReadMethod::SysOffsetExtended => sys_offset_extended(fd, libc::CLOCK_REALTIME),
        ReadMethod::SysOffset => sys_offset(fd),
        ReadMethod::Bracketing => bracket(clock),
    }
}

/// PTP_SYS_OFFSET_EXTENDED against `clockid` (CLOCK_MONOTONIC or CLOCK_REALTIME).
fn sys_offset_extended(fd: &OwnedFd, clockid: libc::clockid_t) -> Result<PhcSample, Errno> {
    let mut req = PtpSysOffsetExtended {
        n_samples: KERNEL_SAMPLES,
        clockid,
        rsv: [0; 2],
        ts: [[PtpClockTime::default(); 3]; PTP_MAX_SAMPLES],
    };
    // SAFETY: `req` is a live repr(C) struct of the size encoded in the request number.
    unsafe { ptp_sys_offset_extended(fd.as_raw_fd(), &mut req) }?;
    // Measured after the ioctl so it reflects the same side of any realtime step.
    let shift = if clockid == libc::CLOCK_MONOTONIC {
        0
    } else {
        realtime_minus_monotonic_ns()
    };
    let n = (req.n_samples as usize).min(PTP_MAX_SAMPLES);
    narrowest(req.ts[..n].iter().map(|t| PhcSample {
        sys_before_ns: t[0].ns() - shift,
        phc_ns: t[1].ns(),
        sys_after_ns: t[2].ns() - shift,
    }))
}

/// PTP_SYS_OFFSET: interleaved system/PHC stamps against CLOCK_REALTIME.
fn sys_offset(fd: &OwnedFd) -> Result<PhcSample, Errno> {
    let mut req = PtpSysOffset {
        n_samples: KERNEL_SAMPLES,
        rsv: [0; 3],
        ts: [PtpClockTime::default(); 2 * PTP_MAX_SAMPLES + 1],
    };
    // SAFETY: as above; the kernel writes its results back into `req` although the header
    // declares the request write-only, so the pointer comes from a unique mutable borrow.
    unsafe { ptp_sys_offset(fd.as_raw_fd(), std::ptr::addr_of_mut!(req).cast_const()) }?;
    let shift = realtime_minus_monotonic_ns();
    let n = (req.n_samples as usize).min(PTP_MAX_SAMPLES);
    narrowest((0..n).map(|i| PhcSample {
        sys_before_ns: req.ts[2 * i].ns() - shift,
        phc_ns: req.ts[2 * i + 1].ns(),
        sys_after_ns: req.ts[2 * i + 2].ns() - shift,
    }))
}

/// The sample with the narrowest system window, as phc2sys keeps.
fn narrowest(samples: impl Iterator<Item = PhcSample>) -> Result<PhcSample, Errno> {
    samples
        .filter(|s| s.window_ns() >= 0)
        .min_by_key(|s| s.window_ns())
        .ok_or(Errno::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_structs_have_the_abi_sizes() {
        assert_eq!(std::mem::size_of::<PtpClockTime>(), 16);
        assert_eq!(std::mem::size_of::<PtpClockCaps>(), 80);
        assert_eq!(std::mem::size_of::<PtpSysOffset>(), 832);
        assert_eq!(std::mem::size_of::<PtpSysOffsetExtended>(), 1216);
    }

    #[test]
    fn fd_to_clockid_matches_the_kernel_macro() {
        // FD_TO_CLOCKID(3) = (~3 << 3) | 3 = -29
        assert_eq!(fd_to_clockid(3), -29);
    }

    #[test]
    fn narrowest_keeps_the_smallest_window() {
        let s = |b, p, a| PhcSample {
            sys_before_ns: b,
            phc_ns: p,
            sys_after_ns: a,
        };
        let best = narrowest([s(0, 5, 100), s(10, 12, 20), s(30, 40, 90)].into_iter());
        assert_eq!(best, Ok(s(10, 12, 20)));
    }
}
