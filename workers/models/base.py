"""The model protocol every backend implements, built-in or the user's own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Model(Protocol):
    """A batched model. Built with its policy's ``options`` as keyword arguments.

    ``setup`` runs once per worker process before the first batch; it loads weights onto
    ``device`` (``"cuda"`` when the process is pinned to a GPU, else ``"cpu"``). ``predict``
    returns exactly one output per input, in order, each JSON-serialisable.
    """

    version: str

    def setup(self, device: str) -> None: ...

    def predict(self, batch: Sequence[Any]) -> Sequence[Any]: ...
