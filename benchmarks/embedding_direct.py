"""MiniLM called directly, without the fleet: batches of 32 in arrival order, the same
sentences sorted by length first, and one at a time. The ceiling the fleet is measured against.
Then batches of 32 again beside a thread that runs pure Python, as a worker's other threads do
while a batch is on the device: a model whose call dispatches many small kernels from Python
(eager PyTorch on a GPU) hands the GIL over at each of them.

Run: .venv/bin/python benchmarks/embedding_direct.py [--sentences 2000] [--threads 1]
     [--device cuda] [--weights FOLDER]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Sequence

from workers.models.base import outputs_of
from workers.models.embedding import EmbeddingModel
from workers.runtime.process import GIL_SWITCH_INTERVAL_S
from workers.tools.bench_inputs import sentence_inputs


def rate(model: EmbeddingModel, sentences: Sequence[str], batch_size: int) -> float:
    """Sentences per second through ``predict`` in batches of ``batch_size``, in order (a
    batch's vectors are on the host when ``predict`` returns)."""
    started = time.perf_counter()
    for start in range(0, len(sentences), batch_size):
        outputs_of(model, sentences[start : start + batch_size])
    return len(sentences) / (time.perf_counter() - started)


def beside_busy_thread(measure: Callable[[], float]) -> float:
    """``measure()`` while another thread of this process runs Python without pause."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        return measure()
    finally:
        stop.set()
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda")
    parser.add_argument("--weights", help="the model's folder (default: the installed package)")
    args = parser.parse_args()
    model = EmbeddingModel(threads=args.threads, weights=args.weights)
    model.setup(args.device)
    make = sentence_inputs(seed=1)
    sentences = [make(index) for index in range(args.sentences)]
    outputs_of(model, sentences[:32])  # warm up
    print(f"MiniLM on {args.device}, {args.threads} torch thread(s), {len(sentences)} sentences")
    print(f"batch 32, arrival order    {rate(model, sentences, 32):7.1f} sentences/s")
    by_length = sorted(sentences, key=model.cost)
    print(f"batch 32, sorted by length {rate(model, by_length, 32):7.1f} sentences/s")
    print(f"one at a time              {rate(model, sentences[:300], 1):7.1f} sentences/s")
    few = sentences[:320]
    default_interval = sys.getswitchinterval()
    for interval in (GIL_SWITCH_INTERVAL_S, default_interval):
        sys.setswitchinterval(interval)
        busy = beside_busy_thread(lambda: rate(model, few, 32))
        print(
            f"batch 32 beside a busy Python thread, GIL switch interval {interval * 1000:.1f} ms:"
            f" {busy:7.1f} sentences/s"
        )


if __name__ == "__main__":
    main()
