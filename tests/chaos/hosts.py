"""Hosts on one machine, for the multi-host scenarios: one network namespace per host, each
with loopback and one link to a switch (a bridge in a namespace of its own), addresses from
192.0.2.0/24 (TEST-NET-1, for documentation). The test process is the client host: its own
link to the switch gives it ``CLIENT_ADDRESS``. This machine's own network may be that /24
too (it is here), so the client gets no route to the /24: one /32 route per namespaced host,
over its link, and its traffic reaches nothing but the hosts made here.

``cut(name)`` takes a host's switch port down: what it sends, and what is sent to it, is
dropped, not refused, as when a cable or a switch fails (every host knows every other's
link-layer address for good, so no failed address lookup answers "no route to host");
``heal(name)`` brings it back. ``impair(name, delay_ms, loss)`` puts a link with latency and
loss between a host and the switch (``tests/chaos/impaired_link``, in user space: this
machine's kernel has no ``tc netem``).
Everything is removed with the namespaces on ``stop()``. Needs root and iproute2's ``ip``:
``unavailable()`` says why not, where either is missing.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import uuid
from collections.abc import Sequence

from workers.local.startable import Startable

SUBNET = "192.0.2"
# Hosts take addresses from here on, at a random start (two runs at once must not route the
# same address), far from those a real network gives out first.
FIRST_HOST, LAST_HOST = 160, 248
CLIENT_ADDRESS = f"{SUBNET}.250"
CLIENT = "client"


def unavailable() -> str | None:
    """Why hosts cannot be built here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    return None


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def ip_output(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


class Hosts(Startable):
    """Namespaced hosts ``names`` (consecutive addresses from ``192.0.2.160`` on, in order)
    and the client."""

    def __init__(self, names: Sequence[str]) -> None:
        token = uuid.uuid4().hex[:6]
        self._token = token
        self._switch = f"bf{token}-sw"
        self.namespace = {name: f"bf{token}-{name}" for name in names}
        first = random.randint(FIRST_HOST, LAST_HOST - len(names))
        self.address = {name: f"{SUBNET}.{first + n}" for n, name in enumerate(names)}
        self.address[CLIENT] = CLIENT_ADDRESS
        # The switch's port of each host (a veth end in the switch namespace).
        self._port = {name: f"bf{token}p{n}" for n, name in enumerate([*names, CLIENT])}
        self._made: list[str] = []
        self._client_end = f"bf{token}c"
        self._impairers: list[subprocess.Popen[bytes]] = []

    def _start(self) -> None:
        ip("netns", "add", self._switch)
        self._made.append(self._switch)
        ip("-n", self._switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self._switch, "link", "set", "br0", "up")
        for name, namespace in self.namespace.items():
            ip("netns", "add", namespace)
            self._made.append(namespace)
            ip("-n", namespace, "link", "set", "lo", "up")
            self._link(name, namespace)
        self._link(CLIENT, None)
        self._pin_neighbours()

    def _pin_neighbours(self) -> None:
        """Every host (the client too) keeps every other's link-layer address for good."""
        ends = dict(zip([*self.namespace, CLIENT], self._ends(), strict=True))
        macs = {}
        for name, (where, device) in ends.items():
            (link,) = json.loads(ip_output(*where, "-j", "link", "show", device))
            macs[name] = link["address"]
        for name, (where, device) in ends.items():
            for other, mac in macs.items():
                if other != name:
                    ip(*where, "neigh", "replace", self.address[other], "lladdr", mac,
                       "dev", device, "nud", "permanent")  # fmt: skip

    def _link(self, name: str, namespace: str | None) -> None:
        """A veth pair: one end in the host (``eth0``; for the client, in this process's
        namespace, with a /32 route to each host), its address on it; the other the host's
        port on the switch's bridge."""
        port = self._port[name]
        end = self._client_end if namespace is None else f"bf{self._token}e{len(self._made)}"
        ip("link", "add", end, "type", "veth", "peer", "name", port)
        ip("link", "set", port, "netns", self._switch)
        ip("-n", self._switch, "link", "set", port, "master", "br0")
        ip("-n", self._switch, "link", "set", port, "up")
        if namespace is None:
            ip("addr", "add", f"{self.address[name]}/32", "dev", end)
            ip("link", "set", end, "up")
            for host in self.namespace:
                route = f"{self.address[host]}/32"
                ip("route", "add", route, "dev", end, "src", self.address[name])
            return
        ip("link", "set", end, "netns", namespace)
        ip("-n", namespace, "link", "set", end, "name", "eth0")
        ip("-n", namespace, "addr", "add", f"{self.address[name]}/24", "dev", "eth0")
        ip("-n", namespace, "link", "set", "eth0", "up")

    def run_in(self, name: str) -> list[str]:
        """The command prefix that runs a command on host ``name``."""
        return ["ip", "netns", "exec", self.namespace[name]]

    def cut(self, name: str) -> None:
        ip("-n", self._switch, "link", "set", self._port[name], "down")

    def heal(self, name: str) -> None:
        ip("-n", self._switch, "link", "set", self._port[name], "up")

    def impair(self, name: str, delay_ms: float, loss: float) -> None:
        """Every frame between host ``name`` and the switch arrives ``delay_ms`` late (so a
        round trip takes twice that longer), and ``loss`` of them (0..1) never do."""
        port, near, far = self._port[name], f"bf{self._token}i{name[:2]}", f"bf{self._token}j"
        ip("-n", self._switch, "link", "set", port, "nomaster")
        ip("-n", self._switch, "link", "add", near, "type", "veth", "peer", "name", far)
        ip("-n", self._switch, "link", "set", near, "master", "br0")
        for device in (near, far):
            ip("-n", self._switch, "link", "set", device, "up")
        # The link copies frames one by one: no sender may hand it a segment larger than one.
        for where, device in self._ends():
            ip(*where, "link", "set", device, "gso_max_segs", "1")
        command = [sys.executable, "-m", "tests.chaos.impaired_link", port, far]
        self._impairers.append(
            subprocess.Popen([*self.run_in_switch(), *command, str(delay_ms), str(loss)])
        )

    def run_in_switch(self) -> list[str]:
        return ["ip", "netns", "exec", self._switch]

    def _ends(self) -> list[tuple[list[str], str]]:
        """Every host's own end of its link (the client's in this process's namespace)."""
        ends = [(["-n", namespace], "eth0") for namespace in self.namespace.values()]
        return [*ends, ([], self._client_end)]

    def stop(self) -> None:
        """Removes the client's link (its routes with it) and the namespaces, and with them
        every other link (a veth pair goes with either end)."""
        for impairer in self._impairers:
            impairer.kill()
            impairer.wait()
        self._impairers.clear()
        subprocess.run(["ip", "link", "del", self._client_end], check=False, capture_output=True)
        for namespace in reversed(self._made):
            subprocess.run(["ip", "netns", "del", namespace], check=False, capture_output=True)
        self._made.clear()
