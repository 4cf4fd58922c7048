#!/usr/bin/env bash
# Cross.toml's pre-build step for aarch64-unknown-linux-gnu: an arm64 ROS 2 Humble sysroot in
# cross's image, so `cross build --features ros` can generate r2r's bindings and link against
# arm64 rcl. See docs/ros.md, "Cross-compiling for the Jetson", for the build command.
#
# NOT RUN in this repository's CI: its machines have no container engine, so `cross` cannot run
# there. Every step is written out so that it can be followed, or debugged, by hand.
#
# Why a sysroot, not `apt-get install ros-humble-*:arm64`: cross's aarch64 image is Ubuntu 20.04
# (focal), while ROS 2 Humble's binary packages are built for Ubuntu 22.04 (jammy). Installing
# jammy packages into focal is impossible, but extracting them (no maintainer scripts, nothing
# runs) into a directory of their own is not. mmdebstrap's `extract` variant does exactly that,
# with apt resolving the dependencies and checking the signatures.
#
# A failure here never fails the image: the plain `cross test` (no `ros` feature) needs none of
# it. A ros build without the sysroot then stops at r2r's build script, after this warning.
set -uo pipefail

SYSROOT=/opt/humble-arm64
KEYRING=/usr/share/keyrings/ros-archive-keyring.gpg
PACKAGES=ros-humble-ros-core,ros-humble-rmw-cyclonedds-cpp,ros-humble-rosgraph-msgs,ros-humble-std-srvs

warn() {
    echo "cross-ros-humble-sysroot.sh: WARNING: $*; \`cross build --features ros\` will not work in this image" >&2
    exit 0
}

[[ "${CROSS_DEB_ARCH:-arm64}" == arm64 ]] || warn "CROSS_DEB_ARCH is $CROSS_DEB_ARCH, not arm64"

# 1. Host tools: mmdebstrap to build the sysroot; clang and libclang for bindgen (r2r's bindings
#    are generated on the build machine, for the target, with --sysroot).
apt-get update || warn "apt-get update failed"
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    mmdebstrap curl ca-certificates gnupg clang libclang-dev ||
    warn "installing mmdebstrap, clang and libclang-dev failed"

# 2. The ROS 2 apt repository's signing key (as in ROS 2's own installation instructions).
curl -fsSL https://raw.githubusercontent.com/ros/rosdistro/master/ros.key -o "$KEYRING" ||
    warn "downloading the ROS 2 signing key failed"

# 3. Ubuntu jammy arm64 (ports.ubuntu.com) plus packages.ros.org, extracted into $SYSROOT:
#    glibc 2.35, libstdc++, rcl, rmw_cyclonedds and the message packages with their headers.
mmdebstrap --arch=arm64 --variant=extract --include="$PACKAGES" \
    --aptopt="Acquire::Retries \"3\"" \
    jammy "$SYSROOT" \
    "deb http://ports.ubuntu.com/ubuntu-ports jammy main universe" \
    "deb http://ports.ubuntu.com/ubuntu-ports jammy-updates main universe" \
    "deb [signed-by=$KEYRING] http://packages.ros.org/ros2/ubuntu jammy main" ||
    warn "mmdebstrap of ROS 2 Humble arm64 into $SYSROOT failed"

# 4. Sanity: what r2r's build scripts look for.
for f in opt/ros/humble/include/rcl/rcl/rcl.h opt/ros/humble/lib/librcl.so \
    opt/ros/humble/share/std_msgs/package.xml usr/lib/aarch64-linux-gnu/libc.so.6; do
    [[ -e "$SYSROOT/$f" ]] || warn "$SYSROOT/$f is missing"
done
echo "cross-ros-humble-sysroot.sh: ROS 2 Humble arm64 sysroot ready in $SYSROOT"
