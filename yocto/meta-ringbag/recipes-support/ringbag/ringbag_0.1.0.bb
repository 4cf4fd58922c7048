SUMMARY = "Always-on ROS 2 bag recorder service"
DESCRIPTION = "ringbag records ROS 2 topics into rosbag2-compatible SQLite bags inside a \
               fixed disk budget (circular logging), stamps messages with PTP hardware time, \
               survives kill -9 and power loss, and runs as a hardened systemd service."
AUTHOR = "The ringbag authors"
HOMEPAGE = "https://example.invalid/ringbag"
BUGTRACKER = "https://example.invalid/ringbag/issues"
SECTION = "console/utils"
LICENSE = "Apache-2.0"
LIC_FILES_CHKSUM = "file://LICENSE;md5=3b83ef96387f14655fc854ddc3c6bd57"
CVE_PRODUCT = "ringbag"

# The man pages and shell completions are written by the binary just built (`ringbag gen-docs`,
# from its clap definitions), run under qemu-user on the build host: the qemu class and
# qemu-native (MACHINE_FEATURES "qemu-usermode", on by default for aarch64).
DEPENDS += "qemu-native"

# The source: by default the git repository this layer lives in (yocto/meta-ringbag inside
# it), fetched over the file protocol, so nothing is downloaded. Point RINGBAG_GIT_URI at your
# mirror to build elsewhere. An image that ships pins SRCREV (SRCREV:pn-ringbag in the distro
# or local.conf) to a commit whose Cargo.lock matches ringbag-crates.inc: CI keeps the two
# equal on every commit, so any commit of the same tree does.
PV .= "+git${SRCPV}"
RINGBAG_TOPDIR := "${@os.path.normpath(d.getVar('THISDIR') + '/../../../..')}"
RINGBAG_GIT_URI ??= "git://${RINGBAG_TOPDIR};protocol=file;branch=main"
SRC_URI = "${RINGBAG_GIT_URI}"
SRCREV ??= "${AUTOREV}"
S = "${WORKDIR}/git"

# Every crate of Cargo.lock as crate://crates.io/NAME/VERSION with its sha256: fetched in
# do_fetch, vendored by the cargo class, built with --frozen. No network at compile time.
require ringbag-crates.inc

inherit cargo systemd useradd qemu

# `ringbag --version` names the commit: the git fetcher unpacks a clone with its .git into S,
# where build.rs asks git (in HOSTTOOLS). A source without .git may export RINGBAG_GIT_COMMIT.

# Live ROS 2 recording through r2r (meta-ros). r2r generates its bindings at build time with
# bindgen (clang-native) from the message packages of the target's ROS 2 (AMENT_PREFIX_PATH).
# Without it the binary records from the synthetic source and reads, plays and repairs bags.
PACKAGECONFIG ??= ""
PACKAGECONFIG[ros] = ",,clang-native rcl rcl-action rcl-yaml-param-parser rcutils rmw rmw-implementation rosidl-runtime-c rosidl-typesupport-c builtin-interfaces std-msgs rosgraph-msgs std-srvs"
CARGO_BUILD_FLAGS:append = " ${@bb.utils.contains('PACKAGECONFIG', 'ros', '--features ros', '', d)}"
export LIBCLANG_PATH = "${@bb.utils.contains('PACKAGECONFIG', 'ros', '${STAGING_LIBDIR_NATIVE}', '', d)}"
export BINDGEN_EXTRA_CLANG_ARGS = "${@bb.utils.contains('PACKAGECONFIG', 'ros', '--sysroot=${STAGING_DIR_TARGET}', '', d)}"
export AMENT_PREFIX_PATH = "${@bb.utils.contains('PACKAGECONFIG', 'ros', '${STAGING_DIR_TARGET}${ros_prefix}', '', d)}"
export ROS_DISTRO

# The accounts of systemd/ringbag.sysusers, created at build time (a read-only rootfs has no
# first-boot systemd-sysusers): user and group `ringbag`, supplementary group `ptp`.
USERADD_PACKAGES = "${PN}"
GROUPADD_PARAM:${PN} = "--system ptp"
USERADD_PARAM:${PN} = "--system --home-dir ${localstatedir}/lib/ringbag --no-create-home \
                       --shell ${base_sbindir}/nologin --user-group --groups ptp \
                       --comment 'ringbag ROS 2 bag recorder' ringbag"

SYSTEMD_SERVICE:${PN} = "ringbag.service"
SYSTEMD_AUTO_ENABLE:${PN} = "enable"

do_install:append() {
    install -d ${D}${systemd_system_unitdir}
    sed 's|^ExecStart=[^ ]*/ringbag |ExecStart=${bindir}/ringbag |' \
        ${S}/systemd/ringbag.service >${D}${systemd_system_unitdir}/ringbag.service
    chmod 0644 ${D}${systemd_system_unitdir}/ringbag.service
    install -D -m 0644 ${S}/systemd/ringbag.sysusers ${D}${nonarch_libdir}/sysusers.d/ringbag.conf
    install -D -m 0644 ${S}/systemd/ringbag.tmpfiles ${D}${nonarch_libdir}/tmpfiles.d/ringbag.conf
    install -D -m 0644 ${S}/systemd/60-ringbag-ptp.rules \
        ${D}${nonarch_base_libdir}/udev/rules.d/60-ringbag-ptp.rules
    install -D -m 0644 ${S}/systemd/ringbag.toml ${D}${sysconfdir}/ringbag/ringbag.toml
    # Prometheus alerting rules, for the monitoring server (not read on the robot).
    install -D -m 0644 ${S}/systemd/ringbag.rules.yml ${D}${datadir}/ringbag/ringbag.rules.yml

    # Man pages (packaged in ${PN}-doc, as the doc class does) and completions (in ${PN}).
    rm -rf ${B}/gen-docs
    ${@qemu_run_binary(d, '${STAGING_DIR_TARGET}', '${D}${bindir}/ringbag')} gen-docs --out ${B}/gen-docs
    install -d ${D}${mandir}/man1 ${D}${mandir}/man5
    install -m 0644 ${B}/gen-docs/man1/*.1 ${D}${mandir}/man1/
    install -m 0644 ${B}/gen-docs/man5/ringbag.toml.5 ${D}${mandir}/man5/
    install -D -m 0644 ${B}/gen-docs/completions/ringbag.bash \
        ${D}${datadir}/bash-completion/completions/ringbag
    install -D -m 0644 ${B}/gen-docs/completions/_ringbag ${D}${datadir}/zsh/site-functions/_ringbag
    install -D -m 0644 ${B}/gen-docs/completions/ringbag.fish \
        ${D}${datadir}/fish/vendor_completions.d/ringbag.fish

    # The recording root, owned by the service user in the image itself: a read-only rootfs
    # cannot have systemd-tmpfiles fix it at boot.
    install -d -m 0750 -o ringbag -g ringbag ${D}${localstatedir}/lib/ringbag
    install -d -m 0750 -o ringbag -g ringbag ${D}${localstatedir}/lib/ringbag/bags
}

FILES:${PN} += "\
    ${nonarch_libdir}/sysusers.d/ringbag.conf \
    ${nonarch_libdir}/tmpfiles.d/ringbag.conf \
    ${nonarch_base_libdir}/udev/rules.d/60-ringbag-ptp.rules \
    ${datadir}/ringbag/ringbag.rules.yml \
    ${datadir}/bash-completion/completions/ringbag \
    ${datadir}/zsh/site-functions/_ringbag \
    ${datadir}/fish/vendor_completions.d/ringbag.fish \
    ${localstatedir}/lib/ringbag \
"
# A locally edited configuration survives package upgrades.
CONFFILES:${PN} = "${sysconfdir}/ringbag/ringbag.toml"
