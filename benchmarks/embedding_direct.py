"""MiniLM called directly, without the fleet: batches of 32 in arrival order, the same
sentences sorted by length first, and one at a time. The ceiling the fleet is measured against.

Run: .venv/bin/python benchmarks/embedding_direct.py [--sentences 2000] [--threads 1]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from workers.models.embedding import EmbeddingModel
from workers.tools.bench_inputs import sentence_inputs


def rate(model: EmbeddingModel, sentences: Sequence[str], batch_size: int) -> float:
    """Sentences per second through ``predict`` in batches of ``batch_size``, in order."""
    started = time.perf_counter()
    for start in range(0, len(sentences), batch_size):
        model.predict(sentences[start : start + batch_size])
    return len(sentences) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    model = EmbeddingModel(threads=args.threads)
    model.setup("cpu")
    make = sentence_inputs(seed=1)
    sentences = [make(index) for index in range(args.sentences)]
    model.predict(sentences[:32])  # warm up
    print(f"MiniLM on the CPU, {args.threads} torch thread(s), {len(sentences)} sentences")
    print(f"batch 32, arrival order   {rate(model, sentences, 32):7.1f} sentences/s")
    by_length = sorted(sentences, key=model.cost)
    print(f"batch 32, sorted by length {rate(model, by_length, 32):7.1f} sentences/s")
    print(f"one at a time              {rate(model, sentences[:300], 1):7.1f} sentences/s")


if __name__ == "__main__":
    main()
