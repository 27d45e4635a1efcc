"""The model registry, the synthetic model's launches, and the embedding backend's contract
(when its extra is installed)."""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from config.errors import ConfigError
from config.settings import ModelPolicy
from workers.models.base import ItemError, Model, outputs_of
from workers.models.embedding import save_half_precision
from workers.models.registry import build_model, load_class
from workers.models.synthetic import SyntheticModel, expected_output, launch


class UserModel:
    """A user's own model, plugged in by import path."""

    version = "user-7"

    def __init__(self, scale: int = 1) -> None:
        self.scale = scale

    def setup(self, device: str) -> None:
        self.device = device

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        return [item * self.scale for item in batch]


class BrokenSetupModel(UserModel):
    """A model whose weights cannot load."""

    def setup(self, device: str) -> None:
        raise FileNotFoundError("weights.safetensors not found")


def test_builtin_backends_resolve_by_name() -> None:
    """The built-in backends are found by their short names."""
    assert load_class("synthetic") is SyntheticModel
    assert load_class("embedding").__name__ == "EmbeddingModel"


def test_a_users_model_plugs_in_by_import_path_with_its_options() -> None:
    """A class named module:Class is built with the policy's options and set up on the device."""
    policy = ModelPolicy(backend=f"{__name__}:UserModel", options={"scale": 3})
    model = build_model("mine", policy, "cpu")
    assert isinstance(model, Model)
    assert model.predict([1, 2]) == [3, 6]
    assert model.version == "user-7"


@pytest.fixture
def switches_never_forced() -> Iterator[None]:
    """The interpreter never takes the GIL from a running thread: another thread runs only
    where the one holding it lets it go."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    yield
    sys.setswitchinterval(interval)


@pytest.mark.usefixtures("switches_never_forced")
def test_a_synthetic_launch_works_the_cpu_and_lets_the_gil_go_at_each_launch() -> None:
    """``launch_ms`` stands in for eager PyTorch launching a batch from Python: it spends
    that much of its thread's CPU time, and a thread waiting for the GIL runs during it."""
    woken, launching, ran_during_launch = threading.Event(), threading.Event(), threading.Event()

    def waiter() -> None:
        woken.wait()
        if launching.is_set():
            ran_during_launch.set()

    while not ran_during_launch.is_set():
        thread = threading.Thread(target=waiter)
        thread.start()
        cpu_before = time.thread_time()
        launching.set()
        woken.set()  # the waiter now wants the GIL, which this thread holds
        launch(0.02)
        launching.clear()
        assert time.thread_time() - cpu_before >= 0.02
        thread.join()
        woken.clear()


def test_a_launching_synthetic_model_answers_as_it_does_without_launches() -> None:
    model = SyntheticModel(base_ms=0, per_item_ms=0, launch_ms=1)
    assert outputs_of(model, [1, "two"]) == [expected_output(1), expected_output("two")]
    with pytest.raises(ValueError, match="launch_ms"):
        SyntheticModel(launch_ms=-1)


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        ("nonsense", "unknown backend 'nonsense'"),
        ("no_such_module:Model", "cannot load backend"),
        (f"{__name__}:NoSuchClass", "cannot load backend"),
        (f"{__name__}:BrokenSetupModel", "failed to set up: weights.safetensors not found"),
    ],
)
def test_a_model_that_cannot_load_is_one_clear_config_error(backend: str, message: str) -> None:
    """A wrong backend name or a failing setup is a ConfigError naming the model."""
    with pytest.raises(ConfigError, match=message):
        build_model("mine", ModelPolicy(backend=backend), "cpu")


@pytest.fixture(scope="module")
def embedder() -> Model:
    pytest.importorskip("torch", reason="the embedding extra is not installed")
    return build_model("embed", ModelPolicy(backend="embedding", options={"threads": 1}), "cpu")


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_embeddings_are_unit_vectors_in_the_callers_order(embedder: Model) -> None:
    """One 384-float unit vector per input, in order, the same whatever the batch around it."""
    sentences = ["The cat sat on the mat.", "Stock markets fell sharply on Monday."]
    forward = outputs_of(embedder, sentences)
    backward = outputs_of(embedder, list(reversed(sentences)))
    alone = outputs_of(embedder, sentences[:1])
    assert [len(vector) for vector in forward] == [384, 384]
    assert math.isclose(cosine(forward[0], forward[0]), 1.0, rel_tol=1e-5)
    assert cosine(forward[0], backward[1]) > 0.9999
    assert cosine(forward[1], backward[0]) > 0.9999
    assert cosine(forward[0], alone[0]) > 0.9999


def test_embeddings_place_similar_sentences_close(embedder: Model) -> None:
    """A paraphrase is nearer than an unrelated sentence: the real model answered."""
    cat, kitten, markets = outputs_of(
        embedder,
        ["A cat is sleeping on the sofa.", "A kitten naps on the couch.", "Bond yields rose."],
    )
    assert cosine(cat, kitten) > cosine(cat, markets) + 0.3


@pytest.mark.parametrize("bad", ["", "   ", 42, {"text": "hi"}, None])
def test_an_embedding_input_must_be_a_non_empty_string(embedder: Model, bad: Any) -> None:
    """A non-string or empty input gets an invalid_input error in its place; the text beside
    it still gets its vector."""
    fine, refused = outputs_of(embedder, ["fine", bad])
    assert len(fine) == 384
    assert isinstance(refused, ItemError) and refused.code == "invalid_input"
    assert "non-empty string" in refused.message


@pytest.mark.parametrize(
    "options", [{"threads": 0}, {"normalize": "maybe"}, {"max_tokens": 513}, {"max_tokens": 0}]
)
def test_embedding_options_out_of_range_are_refused_before_loading(options: Any) -> None:
    """A bad embedding option is a ConfigError at build time, naming the option."""
    with pytest.raises(ConfigError, match=next(iter(options))):
        build_model("embed", ModelPolicy(backend="embedding", options=options), "cpu")


def test_an_embedding_input_costs_its_tokens(embedder: Model) -> None:
    """cost() counts an input's tokens (no padding), caps them at max_tokens, and prices
    anything that is not text at 1 for predict to refuse."""
    cost = embedder.cost  # type: ignore[attr-defined]
    assert 5 <= cost("A short sentence.") <= 8
    assert cost("word " * 1000) == 256
    assert cost(42) == 1


def test_the_embedding_model_loads_a_half_precision_copy_from_another_folder(
    embedder: Model, tmp_path: Path
) -> None:
    """The ``weights`` option (what the GPU check carries: the model in fp16, in its own
    folder) gives the same vectors, to fp16's precision, and prices inputs alike."""
    copy = tmp_path / "minilm-fp16"
    save_half_precision(copy)
    options = {"threads": 1, "weights": str(copy)}
    half = build_model("embed", ModelPolicy(backend="embedding", options=options), "cpu")
    sentences = ["The cat sat on the mat.", "Stock markets fell sharply on Monday."]
    full = outputs_of(embedder, sentences)
    for ours, theirs in zip(outputs_of(half, sentences), full, strict=True):
        assert cosine(ours, theirs) > 0.999
    assert half.cost(sentences[1]) == embedder.cost(sentences[1])  # type: ignore[attr-defined]
