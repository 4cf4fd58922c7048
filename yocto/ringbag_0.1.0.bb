# ringbag: always-on ROS 2 bag recorder service.
# Layers: meta-rust-bin (prebuilt stable Rust and the cargo_bin class; OE-core's own Rust is
# older than the crate's rust-version on kirkstone, the base of JetPack 5's meta-tegra), and
# meta-ros for the optional `ros` PACKAGECONFIG. Not built in this repository's CI.
SUMMARY = "Always-on ROS 2 bag recorder (rosbag2 SQLite bags, circular logging, PTP time)"
HOMEPAGE = "https://example.invalid/ringbag"
LICENSE = "Apache-2.0"
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/Apache-2.0;md5=89aea4e17d99a7cacdbeed46a0096b10"

# Point RINGBAG_GIT_URI at the real repository (or use externalsrc during development:
# INHERIT += "externalsrc" and EXTERNALSRC:pn-ringbag = "/path/to/ringbag" in local.conf).
RINGBAG_GIT_URI ?= "git://example.invalid/ringbag.git;protocol=https;branch=main"
SRC_URI = "${RINGBAG_GIT_URI}"
# Pin a commit for reproducible images; AUTOREV only for development builds.
SRCREV = "${AUTOREV}"
PV = "0.1.0+git${SRCPV}"
S = "${WORKDIR}/git"

inherit cargo_bin systemd useradd

# cargo_bin fetches crates.io dependencies during compile (pinned by Cargo.lock); rusqlite
# bundles SQLite and builds it with the target C compiler, so no libsqlite3 dependency.
do_compile[network] = "1"
CARGO_BUILD_FLAGS:append = " --locked"

# Live ROS 2 recording through r2r. r2r generates its bindings at build time from the sourced
# ROS 2 (AMENT_PREFIX_PATH) with bindgen, hence clang-native and the message packages.
# Without it the binary records from the synthetic source and reads/plays bags only.
PACKAGECONFIG ??= ""
PACKAGECONFIG[ros] = ",,rcl rcl-action rmw-implementation std-msgs sensor-msgs clang-native"
CARGO_FEATURES = "${@bb.utils.contains('PACKAGECONFIG', 'ros', 'ros', '', d)}"
export AMENT_PREFIX_PATH = "${@bb.utils.contains('PACKAGECONFIG', 'ros', '${STAGING_DIR_TARGET}${ros_prefix}', '', d)}"

# Unprivileged service user; `ptp` owns /dev/ptp0 (see the udev rule below).
USERADD_PACKAGES = "${PN}"
GROUPADD_PARAM:${PN} = "--system ptp"
# The same accounts as systemd/ringbag.sysusers (installed too, for images that run sysusers).
USERADD_PARAM:${PN} = "--system --home-dir /var/lib/ringbag --no-create-home \
                       --shell /sbin/nologin --user-group --groups ptp ringbag"

SYSTEMD_SERVICE:${PN} = "ringbag.service"
SYSTEMD_AUTO_ENABLE:${PN} = "enable"

do_install:append() {
    install -d ${D}${systemd_system_unitdir}
    install -m 0644 ${S}/systemd/ringbag.service ${D}${systemd_system_unitdir}/ringbag.service

    # The example becomes the live config; CONFFILES keeps local edits across upgrades.
    install -d ${D}${sysconfdir}/ringbag
    install -m 0644 ${S}/systemd/ringbag.toml ${D}${sysconfdir}/ringbag/ringbag.toml

    # Recording root. systemd's StateDirectory= would create it too, but a read-only rootfs
    # image needs it to exist (and be owned correctly) at build time.
    install -d -m 0750 -o ringbag -g ringbag ${D}${localstatedir}/lib/ringbag

    install -d -m 0750 -o ringbag -g ringbag ${D}${localstatedir}/lib/ringbag/bags
    install -D -m 0644 ${S}/systemd/ringbag.sysusers ${D}${nonarch_libdir}/sysusers.d/ringbag.conf
    install -D -m 0644 ${S}/systemd/ringbag.tmpfiles ${D}${nonarch_libdir}/tmpfiles.d/ringbag.conf

    # Let the `ptp` group read the PTP hardware clocks.
    install -D -m 0644 ${S}/systemd/60-ringbag-ptp.rules \
        ${D}${nonarch_base_libdir}/udev/rules.d/60-ringbag-ptp.rules
}

FILES:${PN} += " \
    ${systemd_system_unitdir}/ringbag.service \
    ${sysconfdir}/ringbag \
    ${localstatedir}/lib/ringbag \
    ${nonarch_libdir}/sysusers.d/ringbag.conf \
    ${nonarch_libdir}/tmpfiles.d/ringbag.conf \
    ${nonarch_base_libdir}/udev/rules.d/60-ringbag-ptp.rules \
"
CONFFILES:${PN} = "${sysconfdir}/ringbag/ringbag.toml"
