"""The model protocol every backend implements, built-in or the user's own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from config.schema import ErrorCode


@dataclass(frozen=True)
class ItemError:
    """An output that says this one input failed while the rest of the batch succeeds: what a
    model returns in that input's place instead of raising for the whole batch. Its caller
    gets ``code`` (``invalid_input`` for an input the model cannot take, else
    ``model_error``) with ``message``."""

    message: str
    code: ErrorCode = "model_error"


@runtime_checkable
class Model(Protocol):
    """A batched model. Built with its policy's ``options`` as keyword arguments.

    ``setup`` runs once per worker process before the first batch; it loads weights onto
    ``device`` (``"cuda"`` when the process is pinned to a GPU, else ``"cpu"``). ``predict``
    returns exactly one output per input, in order, each JSON-serialisable or an
    ``ItemError`` for an input that failed alone.

    A model may also define ``cost(item) -> int`` (e.g. an input's tokens): with
    ``max_batch_cost`` or ``group_by_cost`` in its policy the batcher calls it, on an instance
    it builds but never sets up, to form batches by what the device pays for (padding).

    A model may also define ``postprocess(computed) -> outputs``: ``predict`` then returns what
    the device computed for the batch, as it likes (a tensor, a tuple of them), and the
    worker turns it into the outputs (one per input, in order, as ``predict`` would have
    returned them) with ``postprocess`` once the device is free: the next batch's model call
    runs meanwhile. CPU-only work belongs there (``tensor.tolist()``, labels from logits).
    A ``postprocess`` that raises fails its whole model call (its inputs are not run again
    one by one, as a failing ``predict``'s are): an input that fails alone gets an
    ``ItemError`` in its place instead. ``outputs_of`` calls both.
    """

    version: str

    def setup(self, device: str) -> None: ...

    def predict(self, batch: Sequence[Any]) -> Sequence[Any]: ...


def postprocess_of(model: Model) -> Callable[[Any], Sequence[Any]] | None:
    """``model``'s ``postprocess`` (see ``Model``), or None when it has none."""
    postprocess: Callable[[Any], Sequence[Any]] | None = getattr(model, "postprocess", None)
    return postprocess


def outputs_of(model: Model, batch: Sequence[Any]) -> list[Any]:
    """``model``'s outputs for ``batch``: ``predict``, then ``postprocess`` where the model
    has one (see ``Model``)."""
    computed = model.predict(batch)
    postprocess = postprocess_of(model)
    return list(computed if postprocess is None else postprocess(computed))
