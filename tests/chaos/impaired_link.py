"""A link with latency and loss, in user space, where the kernel has no ``tc netem``: copies
Ethernet frames between two interfaces, each frame ``delay_ms`` late and one in ``1 / loss``
dropped at random, in both directions.

Run (as root, in the namespace that holds both interfaces):
    python -m tests.chaos.impaired_link IF_A IF_B DELAY_MS LOSS
It runs until killed.
"""

from __future__ import annotations

import heapq
import itertools
import random
import socket
import sys
import threading
import time

ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
IPPROTO_TCP = 6
PACKET_OUTGOING = 4
MAX_FRAME = 65536
ETHERNET_HEADER = 14


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of ``data``."""
    if len(data) % 2:
        data += b"\0"
    total = sum(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def with_tcp_checksum(frame: bytes) -> bytes:
    """``frame`` with its TCP checksum computed: a veth leaves it to the hardware that a frame
    copied in user space never meets, and the receiver would drop it."""
    if len(frame) < ETHERNET_HEADER + 20 or frame[12:14] != ETH_P_IP.to_bytes(2, "big"):
        return frame
    ip = frame[ETHERNET_HEADER:]
    header = (ip[0] & 0x0F) * 4
    if ip[9] != IPPROTO_TCP:
        return frame
    length = int.from_bytes(ip[2:4], "big")
    segment = bytearray(ip[header:length])
    if len(segment) < 20:
        return frame
    segment[16:18] = b"\0\0"
    pseudo = ip[12:20] + bytes([0, IPPROTO_TCP]) + len(segment).to_bytes(2, "big")
    segment[16:18] = checksum(pseudo + bytes(segment)).to_bytes(2, "big")
    return frame[: ETHERNET_HEADER + header] + bytes(segment) + ip[length:]


def open_raw(interface: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((interface, 0))
    return sock


class Link:
    """Frames in flight, each sent out when due."""

    def __init__(self, delay_s: float, loss: float) -> None:
        self._delay_s = delay_s
        self._loss = loss
        self._random = random.Random(0)
        self._due: list[tuple[float, int, socket.socket, bytes]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()

    def carry(self, source: socket.socket, target: socket.socket) -> None:
        """Takes every frame arriving on ``source`` for ``target``, forever."""
        while True:
            frame, address = source.recvfrom(MAX_FRAME)
            if address[2] == PACKET_OUTGOING:  # what this link itself sent out there
                continue
            if self._random.random() < self._loss:
                continue
            frame = with_tcp_checksum(frame)
            with self._ready:
                due = time.monotonic() + self._delay_s
                heapq.heappush(self._due, (due, next(self._order), target, frame))
                self._ready.notify()

    def send_when_due(self) -> None:
        while True:
            with self._ready:
                while not self._due or self._due[0][0] > time.monotonic():
                    wait_s = self._due[0][0] - time.monotonic() if self._due else None
                    self._ready.wait(wait_s)
                _, _, target, frame = heapq.heappop(self._due)
            target.send(frame)


def main(interface_a: str, interface_b: str, delay_ms: str, loss: str) -> None:
    link = Link(float(delay_ms) / 1000, float(loss))
    a, b = open_raw(interface_a), open_raw(interface_b)
    for source, target in ((a, b), (b, a)):
        threading.Thread(target=link.carry, args=(source, target), daemon=True).start()
    link.send_when_due()


if __name__ == "__main__":
    main(*sys.argv[1:])
