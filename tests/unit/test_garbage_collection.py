"""A fleet process with its garbage collector settled still frees cyclic garbage, without an
explicit collection, once enough objects build up."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from config.garbage_collection import YOUNG_COLLECTION_THRESHOLD, settle_garbage_collection


@pytest.fixture
def settled() -> Iterator[None]:
    """This test process settled as a fleet process is, then put back as it was."""
    thresholds = gc.get_threshold()
    settle_garbage_collection()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


class Node:
    """An object that can hold itself: a cycle that only the collector frees."""

    def __init__(self) -> None:
        self.self: Node | None = self


def test_cyclic_garbage_is_freed_once_objects_build_up(settled: None) -> None:
    cycle = Node()
    probe = weakref.ref(cycle)
    del cycle
    held = []
    for _ in range(3 * YOUNG_COLLECTION_THRESHOLD):
        held.append([])
        if probe() is None:
            break
    assert probe() is None, "the cycle outlived three thresholds' worth of new objects"
