"""The fleet side of batchfleet, one sub-package per process or role.

- ``protocol/``: the Redis protocol the batcher and the workers share (stream entries, final
  answers, capacity and heartbeats, batch caps, model times, the Celery app).
- ``batcher/``: the batcher process (reads streams, plans micro-batches, sends Celery tasks).
- ``runtime/``: the GPU-pinned Celery worker process (device, batches, answers, heartbeat).
- ``models/``: the model plug-ins a worker loads (synthetic, embedding, openai).
- ``tools/``: operator tools on top of the fleet (bench, demo, bulk jobs, top).
- ``local/``: a fleet and a Redis started on this machine, for the demo, bench and tests.
- ``cli/``: the ``batchfleet`` command.

Serving code (``protocol``, ``batcher``, ``runtime``, ``models``) never imports ``producer``,
``tools``, ``local`` or ``cli``; the batcher and the runtime never import each other
(``tests/unit/test_layering.py``).
"""
