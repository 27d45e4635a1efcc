"""A batch task's message as it lies on a Redis broker queue, built without Celery's sending
path, for the dispatch script to push in the round trip that records the batch in flight.

The message is what ``Celery.send_task`` puts there: Celery's task message protocol v2
(headers, and a JSON body of args, kwargs and embed) in kombu's Redis transport envelope
(delivery info naming the anonymous exchange and the queue), but for its body, which lies
there as JSON text instead of base64: kombu decodes a body by its ``body_encoding`` property
and takes one without it as it is, and base64 cost the batcher ~0.7 µs a request to encode
and the worker ~0.3 to decode (``benchmarks/README.md``). ``send_task`` builds the message
through Celery's router, kombu's producer, its declare cache and its retry wrapper, a third of
a batcher's CPU at a fast model's batch rate (py-spy, ``benchmarks/README.md``).

Only a broker that is the fleet's own Redis takes it: elsewhere (RabbitMQ, a Redis of its own)
the batcher sends with ``send_task``. ``tests/integration/test_task_message.py`` compares it
with the message ``send_task`` writes, so that a Celery or kombu upgrade that changes the
format fails there, not in a fleet.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from typing import Any

from config.batch_task import RUN_BATCH_TASK, BatchTask

# Celery's fields of a task that is no part of a canvas (no callbacks, chain or chord).
EMBED: dict[str, None] = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def batch_message(task: BatchTask, queue: str) -> str:
    """The broker message that runs ``task`` from ``queue``, as JSON text; a new task id."""
    task_id = str(uuid.uuid4())
    argsrepr = task.argsrepr()
    message: dict[str, Any] = {
        "body": json.dumps([task.args(), {}, EMBED]),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": RUN_BATCH_TASK,
            "id": task_id,
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": task_id,
            "parent_id": None,
            "argsrepr": argsrepr,
            "kwargsrepr": "{}",
            # The sender, as Celery names a process that is not a worker (``anon_nodename``).
            "origin": f"gen{os.getpid()}@{socket.gethostname()}",
            "ignore_result": False,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": task_id,
            "argsrepr": argsrepr,
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return json.dumps(message)
