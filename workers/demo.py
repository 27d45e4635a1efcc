"""``batchfleet demo``: a private fleet, 2,000 requests batched, then the same load unbatched."""

from __future__ import annotations

import asyncio

from workers.bench import BenchConfig, saturation_run
from workers.load_stats import TABLE_HEADER, table_line
from workers.private_fleet import private_fleet


def run_demo(requests: int = 2000, baseline: int = 2000) -> int:
    """Runs the demo and prints its report; 0 when every request completed."""
    config = BenchConfig(mode="saturate")
    print(
        "batchfleet demo: a private Redis, a batcher and one worker; synthetic GPU model: "
        f"{config.base_ms:g} ms + {config.per_item_ms:g} ms per item, one batch at a time"
    )
    with private_fleet(config.models()) as fleet:
        print(
            f"fleet ready at {fleet.redis_url.split('@')[-1]}: {requests} requests at once, "
            f"batched (max batch {config.max_batch_size}); then {baseline} at once, "
            "one request per model call"
        )
        batched = asyncio.run(saturation_run(fleet, config.batched_model, requests)).summary()
        single = asyncio.run(saturation_run(fleet, config.unbatched_model, baseline)).summary()
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
