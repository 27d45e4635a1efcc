"""Every Redis key and Celery queue name batchfleet uses; no other module builds one.

All keys share one prefix (``Settings.key_prefix``, default ``bf``) and ``:`` as separator.
Everything about one model, its requests included, shares the hash tag ``{m:MODEL}``: on
Redis Cluster each model lives in one hash slot, so every script call (each touches one
model) runs on one node, and different models spread over the cluster. The one request key
outside its model's slot is the fleet-wide index ``bf:model_of:ID``, which names the model of
an id the caller chose (a drawn id is found by its record under each model).

``M`` below stands for ``bf:{m:MODEL}``.

==========================  ======  ========================  =================  ===============
key                         type    writer                    reader             TTL
==========================  ======  ========================  =================  ===============
``M:requests``              stream  producer (admission)      batcher (group)    none; entries
                                                                                 XDEL'd when final
``M:inflight``              zset    batcher ZADD, worker ZREM batcher            pruned after
                                                                                 the lease
``M:inflight_owners``       hash    worker (start, done)      batcher            with inflight
                            batch→
                            worker
``M:slot_free``             list    worker (LPUSH)            batcher (BLPOP;    the lease
                                                              DEL at dispatch)
``M:workers``               zset    worker (heartbeat)        batcher            pruned by score
``M:devices``               zset    worker (heartbeat)        worker             pruned by score
``M:attempts``              hash    batcher (reclaim)         batcher            fields HDEL'd
                                                                                 when final
``M:stats``                 hash    producer, worker,         metrics, top       none
                            batcher (counts)
``M:model_time``            hash    worker (heartbeat)        batcher            none
``M:latency``               list    worker (finalize)         top                none; capped at
                                                                                 2,000 items
``M:batch_cap``             string  worker (out of memory)    batcher, worker    none; DEL'd
                                                                                 when back to max
``M:dead``                  stream  batcher, worker (poison)  the operator       none; capped
                                                                                 near 10,000
``M:version``               string  worker (model load)       producer           none
``M:c:{digest}``            string  worker (answer written)   producer           cache_ttl_s
                            version+
                            output
``M:stream_lane``           stream  producer (stream)         worker (streamers) entries XDEL'd
``M:chunks:{request_id}``   stream  worker (streaming)        producer           result_ttl_s
``M:r:{request_id}``        string  producer (admission,      producer, worker   timeout + result
                            +waiters waiting)                                    TTL; result TTL
                                                                                 once final
``M:res:{request_id}``      string  worker, batcher           producer           result_ttl_s
``M:inbox:{producer_id}``   list    worker, batcher           producer (BLPOP)   result_ttl_s
``bf:model_of:{request_id}`` string producer (a caller's id)  producer           record's TTL +
                            model                                                result TTL
``bf:node:{hostname}``      hash    worker (heartbeat)        top, the operator  3 heartbeats
``bf:gpuclaim:{gpu uuid}``  string  worker (--gpu auto)       worker             3 heartbeats
``bf:policies``             hash    batcher (start)           producer           none
                            model→
                            policy
``bf:gw:batches``           zset    gateway (batch created)   gateway            none; members
                            id→                                                  ZREM'd when the
                            created                                              batch is gone
``bf:gw:batch:{batch_id}``  hash    gateway (batch runner,    gateway            none; DEL'd
                                    cancel)                                      with its files
``bf:gw:lease:{batch_id}``  string  gateway (batch runner)    gateway            the lease (30 s)
==========================  ======  ========================  =================  ===============

``M:r`` holds the request's digest (model and input), and while it is queued its stream
entry and model (``digest:entry:model``), ``M:c`` the output tagged with the model version
that computed it (``config.schema.cache_entry``), ``M:w`` the inbox keys of producers
waiting for it (each producer has one inbox per model), ``M:res`` and the inbox entries the
result JSON; ``M:workers`` members are ``hostname|slots`` and ``M:devices`` members device
consumers, scored by heartbeat expiry, ``M:inflight`` members batch ids scored by dispatch
time (Redis server time). ``bf:model_of`` names the model a caller's id was claimed for
before admission: an id names one request of one model at a time. ``bf:gw:batch`` holds a
Batch API job (``workers/gateway/batch_store.py``) and ``bf:gw:lease`` the id of the gateway
process running it, which renews it while it runs: another gateway resumes a job whose lease
ran out.

The consumer group on each request stream is ``batchers``; Celery's queue for a model is
``bf.{m:MODEL}``, in the model's slot (kombu keeps its own keys under that name).
"""

from __future__ import annotations

from dataclasses import dataclass

CONSUMER_GROUP = "batchers"
STREAM_GROUP = "streamers"
DEVICE_CONSUMER_SUFFIX = ":device"


def worker_consumer(hostname: str) -> str:
    """The stream consumer that holds a worker's batches from the moment their task starts."""
    return f"worker:{hostname}"


def device_consumer(hostname: str, incarnation: str) -> str:
    """The stream consumer that holds what one worker process (``incarnation``: a token drawn
    when it starts) has on its device right now; a restarted process gets a new one."""
    return f"worker:{hostname}:{incarnation}{DEVICE_CONSUMER_SUFFIX}"


def held_on_device(consumer: str) -> bool:
    """Whether ``consumer`` is a worker's device: its requests were in the model call."""
    return consumer.endswith(DEVICE_CONSUMER_SUFFIX)


@dataclass(frozen=True)
class Keys:
    """Builds the Redis keys under one prefix."""

    prefix: str = "bf"

    def _model(self, model: str) -> str:
        """The start of every key of ``model``: its hash tag puts them all in one slot."""
        return f"{self.prefix}:{{m:{model}}}"

    def stream(self, model: str) -> str:
        """The model's request stream, the ledger of accepted, unfinished requests."""
        return f"{self._model(model)}:requests"

    def inflight(self, model: str) -> str:
        """Batches dispatched to Celery and not yet finished, scored by dispatch time."""
        return f"{self._model(model)}:inflight"

    def inflight_owners(self, model: str) -> str:
        """Which worker (its heartbeat member) runs each started in-flight batch."""
        return f"{self._model(model)}:inflight_owners"

    def slot_free(self, model: str) -> str:
        """The list a worker pushes to when it finishes a batch, waking the batcher."""
        return f"{self._model(model)}:slot_free"

    def workers(self, model: str) -> str:
        """Live workers of the model: member ``hostname|slots``, score the heartbeat's expiry."""
        return f"{self._model(model)}:workers"

    def devices(self, model: str) -> str:
        """The device consumers of the live worker processes serving the model, scored by
        their heartbeat's expiry."""
        return f"{self._model(model)}:devices"

    def gpu_claim(self, gpu_uuid: str, share: int = 0) -> str:
        """Which worker (``--gpu auto``) runs on the GPU of this UUID, in its ``share``-th
        place (``worker.processes_per_gpu`` places a GPU); expires unless renewed."""
        place = f":{share}" if share else ""
        return f"{self.prefix}:gpuclaim:{gpu_uuid}{place}"

    def node(self, hostname: str) -> str:
        """A worker process's status: its work done and its GPU's latest NVML reading."""
        return f"{self.prefix}:node:{hostname}"

    def attempts(self, model: str) -> str:
        """How often each stream entry was taken back from a process that died holding it."""
        return f"{self._model(model)}:attempts"

    def stats(self, model: str) -> str:
        """The model's request and batch counters since the fleet's Redis began; its fields
        are named in ``config.stats_fields``."""
        return f"{self._model(model)}:stats"

    def model_version(self, model: str) -> str:
        """The version the model's workers last loaded (``Model.version``): a cache entry
        answers only while it matches the version the entry carries, so a new version starts
        with an empty cache."""
        return f"{self._model(model)}:version"

    def cache(self, model: str, digest: str) -> str:
        """The cached output of an input (by its digest), tagged with the model version
        that computed it."""
        return f"{self._model(model)}:c:{digest}"

    def stream_lane(self, model: str) -> str:
        """Streaming requests of the model: a lane of their own, past the batcher."""
        return f"{self._model(model)}:stream_lane"

    def chunks(self, model: str, request_id: str) -> str:
        """A streaming request's chunks, in order, for its caller to read."""
        return f"{self._model(model)}:chunks:{request_id}"

    def policies(self) -> str:
        """The fleet's model policies (model → ``ModelPolicy`` JSON), as its batchers serve
        them: producers follow these over their own configuration."""
        return f"{self.prefix}:policies"

    def model_time(self, model: str) -> str:
        """The model's measured time per batch-size bucket (power of two → seconds)."""
        return f"{self._model(model)}:model_time"

    def latencies(self, model: str) -> str:
        """The model's latest answers: ``finished_at:latency_s`` items, newest first, capped."""
        return f"{self._model(model)}:latency"

    def batch_cap(self, model: str) -> str:
        """The largest batch the model's devices ran without running out of memory."""
        return f"{self._model(model)}:batch_cap"

    def dead_letter(self, model: str) -> str:
        """Requests given up as poison (their process died on them), for an operator."""
        return f"{self._model(model)}:dead"

    def record(self, model: str, request_id: str) -> str:
        """A request's admission record: its digest, while queued its entry and model, and the
        inboxes of the producers waiting for its answer (``config/lua/waiters.lua``)."""
        return f"{self._model(model)}:r:{request_id}"

    def result(self, model: str, request_id: str) -> str:
        """A request's final result or error, written once."""
        return f"{self._model(model)}:res:{request_id}"

    def inbox(self, model: str, producer_id: str) -> str:
        """A producer's inbox for a model: final results of the model's requests it waits
        for are pushed here."""
        return f"{self._model(model)}:inbox:{producer_id}"

    def model_of(self, request_id: str) -> str:
        """The model a request id was admitted to, for callers that know only the id."""
        return f"{self.prefix}:model_of:{request_id}"

    def gateway_batches(self) -> str:
        """The gateway's Batch API jobs, scored by when each was created."""
        return f"{self.prefix}:gw:batches"

    def gateway_batch(self, batch_id: str) -> str:
        """One Batch API job: its fields (status, files, counts, times)."""
        return f"{self.prefix}:gw:batch:{batch_id}"

    def gateway_batch_lease(self, batch_id: str) -> str:
        """The gateway process running a Batch API job, while it renews this."""
        return f"{self.prefix}:gw:lease:{batch_id}"

    def celery_queue(self, model: str) -> str:
        """The Celery queue that carries the model's batches; on the fleet's Redis, in the
        model's hash slot, as the dispatch script that pushes onto it needs."""
        return f"{self.prefix}.{{m:{model}}}"
