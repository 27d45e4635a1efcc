"""The broker transport adds each socket's reader to Celery's event loop once, not on every
turn of the loop (``ReadersAddedOnce``), and a reader the loop dropped comes back."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from kombu.asynchronous import Hub

from workers.protocol.broker_transport import ReadersAddedOnce


@pytest.fixture
def hub() -> Iterator[Hub]:
    loop = Hub()
    yield loop
    loop.close()


@pytest.fixture
def sockets() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


def poller_registrations(hub: Hub) -> list[int]:
    """The file descriptors the loop's poller is asked to register, from now on."""
    asked: list[int] = []
    register = hub.poller.register

    def counted(fd: int, events: int) -> Any:
        asked.append(fd)
        return register(fd, events)

    hub.poller.register = counted
    return asked


def test_a_reader_the_loop_has_is_not_registered_again(
    hub: Hub, sockets: tuple[socket.socket, socket.socket]
) -> None:
    """The same socket and callback on every turn: the poller is asked once; another
    callback for it replaces the first."""

    def on_readable(_: int) -> None:
        """The transport's reader (never called here: the loop does not turn)."""

    def another_reader(_: int) -> None:
        """A new connection's reader on the same descriptor."""

    fd = sockets[0].fileno()
    asked = poller_registrations(hub)
    loop = ReadersAddedOnce(hub)
    for _ in range(3):
        loop.add_reader(fd, on_readable, fd)
    assert asked == [fd]
    loop.add_reader(fd, another_reader, fd)
    assert asked == [fd, fd]
    assert hub.readers[fd] == (another_reader, (fd,))


def test_a_reader_the_loop_dropped_is_added_again_and_reads(
    hub: Hub, sockets: tuple[socket.socket, socket.socket]
) -> None:
    """Once the loop removes a reader (kombu pauses a ``BRPOP`` so, or drops a connection),
    the transport's next turn adds it again, and a readable socket runs it."""
    ours, theirs = sockets
    fd = ours.fileno()
    read: list[bytes] = []

    def on_readable(_: int) -> None:
        read.append(ours.recv(16))

    loop = ReadersAddedOnce(hub)
    loop.add_reader(fd, on_readable, fd)
    hub.remove_reader(fd)
    loop.add_reader(fd, on_readable, fd)
    theirs.sendall(b"batch")
    turns = hub.create_loop()
    for _ in range(5):  # a turn returns as soon as the socket is readable
        next(turns)
        if read:
            break
    assert read == [b"batch"]
