#!/usr/bin/env python3
"""What DDS needs from the operating system, tried under ringbag.service's sandbox.

scripts/systemd-test.sh runs this as ExecStart of a copy of the unit (same hardening, user and
groups) to show the hardening leaves ROS 2 communication possible without a ROS 2 install:
interface enumeration (netlink), UDP unicast and multicast with the SPDP discovery group
(239.255.0.1) looped back, and a shared-memory segment in /dev/shm as Fast DDS and Cyclone's
iceoryx transports use. Prints one line per primitive; exits 1 at the first refusal.
"""
import mmap
import os
import socket
import struct
import sys

GROUP = "239.255.0.1"  # DDS SPDP default multicast group (domain 0)


def step(name, fn):
    try:
        detail = fn()
    except OSError as e:
        print(f"dds-probe: {name}: REFUSED: {e}")
        sys.exit(1)
    print(f"dds-probe: {name}: ok{': ' + detail if detail else ''}")


def interfaces():
    # glibc's if_nameindex/getifaddrs ask the kernel over AF_NETLINK.
    return " ".join(n for _, n in socket.if_nameindex())


def udp_unicast():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(2)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.sendto(b"ringbag-probe", rx.getsockname())
    data, _ = rx.recvfrom(64)
    assert data == b"ringbag-probe"
    return f"loopback {rx.getsockname()[1]}"


def udp_multicast():
    # The interface the default route leaves by: DDS sends discovery there.
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect(("192.0.2.254", 9))
    local = probe.getsockname()[0]
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    rx.bind(("", 0))
    port = rx.getsockname()[1]
    mreq = struct.pack("4s4s", socket.inet_aton(GROUP), socket.inet_aton(local))
    rx.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
    rx.settimeout(3)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(local))
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
    tx.sendto(b"ringbag-mcast", (GROUP, port))
    try:
        data, src = rx.recvfrom(64)
    except socket.timeout:
        raise OSError(f"multicast {GROUP}:{port} via {local} sent but not received within 3 s")
    assert data == b"ringbag-mcast"
    return f"{GROUP}:{port} via {local}, looped back from {src[0]}"


def shm():
    path = f"/dev/shm/ringbag-probe-{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 1 << 20)
        m = mmap.mmap(fd, 1 << 20)
        m[:4] = b"DDS!"
        m.close()
    finally:
        os.close(fd)
        os.unlink(path)
    return "1 MiB segment created, mapped, written, removed"


step("netlink interfaces", interfaces)
step("udp unicast", udp_unicast)
step("udp multicast", udp_multicast)
step("shared memory", shm)
