"""The batcher's turn and the worker's batch task against fakeredis, called directly."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import fakeredis
import pytest
import redis
from pydantic import SecretStr

from config import stats_fields
from config.batch_task import BatchTask
from config.keys import CONSUMER_GROUP, Keys, device_consumer
from config.schema import STREAM_FIELD, Request, Result
from config.settings import ModelPolicy, Settings
from producer.admission import ProducerCore
from producer.client import Producer
from tests.chaos.harness import wait_until
from workers.batcher.model_batcher import ModelBatcher
from workers.models.base import ItemError
from workers.models.synthetic import SyntheticModel, expected_output
from workers.protocol.capacity import FleetState, NodeBeat, node_heartbeat, worker_member
from workers.runtime import device as device_module
from workers.runtime.runtime import WorkerRuntime

KEYS = Keys("bf")
STREAM = KEYS.stream("synthetic")


class RecordingCelery:
    """Stands in for the Celery app and its broker: the batches a batcher sent, oldest first.

    Given the fleet's fakeredis, it reads the messages the dispatch script pushed onto the
    model's queue there (the broker is the fleet's Redis); else it records ``send_task``
    calls (a broker of its own)."""

    def __init__(self, client: fakeredis.FakeRedis | None = None, model: str = "synthetic") -> None:
        self._client = client
        self._queue = KEYS.celery_queue(model)
        self._called: list[dict[str, Any]] = []

    def send_task(self, name: str, args: list[Any], queue: str, argsrepr: str) -> None:
        self._called.append({"name": name, "args": args, "queue": queue, "argsrepr": argsrepr})

    @property
    def sent(self) -> list[dict[str, Any]]:
        if self._client is None:
            return list(self._called)
        queued = self._client.lrange(self._queue, 0, -1)
        return [sent_task(message) for message in reversed(queued)]


def sent_task(message: bytes) -> dict[str, Any]:
    """A task message on a kombu Redis queue, as ``send_task``'s arguments (and its name)."""
    envelope = json.loads(message)
    args, _, _ = json.loads(envelope["body"])  # the dispatched body is JSON text
    return {
        "name": envelope["headers"]["task"],
        "args": args,
        "queue": envelope["properties"]["delivery_info"]["routing_key"],
        "argsrepr": envelope["headers"]["argsrepr"],
    }


class FailingModel:
    """A model whose every batch raises."""

    version = "1"

    def setup(self, device: str) -> None:
        pass

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        raise RuntimeError("CUDA out of memory")


class ShortModel(FailingModel):
    """A model that forgets its last output."""

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        return list(batch)[:-1]


class ItemErrorModel(FailingModel):
    """A model that answers "bad" with an ItemError and echoes the rest."""

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        return [ItemError("upstream refused it") if item == "bad" else item for item in batch]


class PoisonModel(FailingModel):
    """A model that fails any batch holding the input "poison", and echoes otherwise."""

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        if "poison" in batch:
            raise ValueError("cannot digest poison")
        return [{"ok": item} for item in batch]


@pytest.fixture
def celery(fake_redis: fakeredis.FakeRedis) -> RecordingCelery:
    return RecordingCelery(fake_redis)


def new_batcher(
    settings: Settings, client: fakeredis.FakeRedis, celery: Any, model: str = "synthetic"
) -> ModelBatcher:
    """A batcher ``b1`` for ``model`` that publishes to ``celery``, its group created."""
    batcher = ModelBatcher(settings, model, client=client, celery=celery, consumer="b1")
    batcher._ensure_group()
    return batcher


@pytest.fixture
def batcher(
    settings: Settings, fake_redis: fakeredis.FakeRedis, celery: RecordingCelery
) -> ModelBatcher:
    return new_batcher(settings, fake_redis, celery)


@pytest.fixture
def runtime(settings: Settings, fake_redis: fakeredis.FakeRedis) -> WorkerRuntime:
    return WorkerRuntime(settings, "w1", "cpu", ["synthetic"], client=fake_redis)


def add_worker(client: fakeredis.FakeRedis, slots: int = 1) -> None:
    FleetState(client, KEYS, "synthetic").heartbeat(worker_member("w1", slots), 30)


def stored_result(client: fakeredis.FakeRedis, request_id: str) -> Result:
    raw = client.get(KEYS.result("synthetic", request_id))
    assert raw is not None, f"no result for {request_id}"
    return Result.decode(raw)


def test_full_batch_becomes_one_celery_task(
    batcher: ModelBatcher,
    producer: Producer,
    fake_redis: fakeredis.FakeRedis,
    celery: RecordingCelery,
) -> None:
    """max_batch_size requests go out as ONE task on the model's queue, entries still pending."""
    add_worker(fake_redis)
    ids = producer.submit_many("synthetic", ["a", "b", "c", "d"])
    batcher.step()
    batcher.step()
    assert len(celery.sent) == 1
    task = celery.sent[0]
    assert task["queue"] == "bf.{m:synthetic}"
    model, _, entries, reason = task["args"]
    assert reason == "size"
    assert model == "synthetic"
    assert [request_id for _, request_id in entries] == ids
    assert fake_redis.xpending(STREAM, CONSUMER_GROUP)["pending"] == 4


def test_no_live_worker_means_no_dispatch(
    batcher: ModelBatcher, producer: Producer, celery: RecordingCelery
) -> None:
    """Without a live worker the batcher holds requests instead of piling tasks up."""
    producer.submit_many("synthetic", ["a", "b", "c", "d"])
    batcher.step()
    batcher.step()
    assert celery.sent == []


def test_expired_request_gets_an_expired_error_and_is_never_sent(
    batcher: ModelBatcher,
    settings: Settings,
    producer: Producer,
    fake_redis: fakeredis.FakeRedis,
    celery: RecordingCelery,
) -> None:
    """A request past its deadline in the queue ends 'expired' and leaves the stream."""
    add_worker(fake_redis)
    prepared = ProducerCore(settings).prepare("synthetic", "late", deadline_s=5)
    stale = prepared.request.model_copy(update={"deadline_at": time.time() - 1})
    fake_redis.set(KEYS.record("synthetic", stale.request_id), stale.digest)
    fake_redis.xadd(STREAM, {STREAM_FIELD: stale.encode()})
    batcher.step()
    batcher.step()
    assert stored_result(fake_redis, stale.request_id).error.code == "expired"  # type: ignore[union-attr]
    assert celery.sent == []
    assert fake_redis.xlen(STREAM) == 0


def test_malformed_stream_entries_never_crash_the_batcher(
    batcher: ModelBatcher, fake_redis: fakeredis.FakeRedis, celery: RecordingCelery
) -> None:
    """A hand-written bad entry with an id gets invalid_input (bytes that are not UTF-8 in its
    input included); one without an id is dropped."""
    add_worker(fake_redis)
    fake_redis.xadd(STREAM, {STREAM_FIELD: json.dumps({"request_id": "bad-1", "input": 1})})
    not_utf8 = ProducerCore(batcher.settings).prepare("synthetic", "x", request_id="bad-utf8")
    fake_redis.xadd(
        STREAM, {STREAM_FIELD: not_utf8.encoded.encode().replace(b'"input":"x"', b'"input":"\xff"')}
    )
    fake_redis.xadd(STREAM, {STREAM_FIELD: "not json at all"})
    fake_redis.xadd(STREAM, {"other": "field"})
    fake_redis.xadd(STREAM, {STREAM_FIELD: b"\xff\xfe not utf-8"})
    fake_redis.xadd(STREAM, {STREAM_FIELD: "[" * 5000 + "]" * 5000})
    nan_deadline = json.loads(
        ProducerCore(batcher.settings).prepare("synthetic", "x").request.encode()
    )
    fake_redis.xadd(
        STREAM,
        {
            STREAM_FIELD: json.dumps(nan_deadline).replace(
                f'"deadline_at": {nan_deadline["deadline_at"]}', '"deadline_at": NaN'
            )
        },
    )
    batcher.step()
    batcher.step()
    assert stored_result(fake_redis, "bad-1").error.code == "invalid_input"  # type: ignore[union-attr]
    assert stored_result(fake_redis, "bad-utf8").error.code == "invalid_input"  # type: ignore[union-attr]
    nan_result = stored_result(fake_redis, nan_deadline["request_id"])
    assert nan_result.error is not None and nan_result.error.code == "invalid_input"
    assert celery.sent == []
    assert fake_redis.xlen(STREAM) == 0


def test_a_bad_entry_among_good_ones_fails_alone(
    runtime: WorkerRuntime,
    fake_redis: fakeredis.FakeRedis,
    producer: Producer,
    batcher: ModelBatcher,
    celery: RecordingCelery,
) -> None:
    """The batcher decodes what it reads in one call; one bad entry among good ones is answered
    invalid_input, and the good ones run in one batch."""
    first = producer.submit_many("synthetic", ["a", "b"])
    fake_redis.xadd(STREAM, {STREAM_FIELD: json.dumps({"request_id": "bad-1", "input": 1})})
    last = producer.submit_many("synthetic", ["c"])
    run_one_batch(runtime, fake_redis, batcher, celery)
    assert stored_result(fake_redis, "bad-1").error.code == "invalid_input"  # type: ignore[union-attr]
    for request_id, value in zip([*first, *last], ["a", "b", "c"], strict=True):
        result = stored_result(fake_redis, request_id)
        assert result.output == expected_output(value)
        assert result.batch_size == 3
    assert len(celery.sent) == 1


def run_one_batch(
    runtime: WorkerRuntime,
    client: fakeredis.FakeRedis,
    batcher: ModelBatcher,
    celery: RecordingCelery,
) -> dict[str, Any]:
    add_worker(client)
    batcher.step()
    batcher.step()
    return runtime.run_batch(BatchTask(*celery.sent[-1]["args"]))


def test_batch_task_writes_each_result_and_clears_the_ledger(
    runtime: WorkerRuntime,
    fake_redis: fakeredis.FakeRedis,
    producer: Producer,
    batcher: ModelBatcher,
    celery: RecordingCelery,
) -> None:
    """Every request gets its own output, stamped with the model's version; the stream entries
    are acked and deleted."""
    inputs = [{"n": 1}, "two", [3], None]
    ids = producer.submit_many("synthetic", inputs)
    run_one_batch(runtime, fake_redis, batcher, celery)
    for request_id, value in zip(ids, inputs, strict=True):
        result = stored_result(fake_redis, request_id)
        assert result.output == expected_output(value)
        assert result.batch_size == 4
        assert result.model_version == SyntheticModel().version
    assert fake_redis.xlen(STREAM) == 0
    delivered = {r.request_id: r.output for r in producer.results(ids, timeout_s=5)}
    assert delivered == {
        request_id: expected_output(value) for request_id, value in zip(ids, inputs, strict=True)
    }


def test_redelivered_batch_keeps_the_first_answer(
    runtime: WorkerRuntime,
    fake_redis: fakeredis.FakeRedis,
    producer: Producer,
    batcher: ModelBatcher,
    celery: RecordingCelery,
) -> None:
    """Running the same batch twice does not write a second, different answer; nor does it
    run again once the answers have expired: its entries left the stream with them."""
    ids = producer.submit_many("synthetic", [1, 2, 3, 4])
    run_one_batch(runtime, fake_redis, batcher, celery)
    result_keys = [KEYS.result("synthetic", request_id) for request_id in ids]
    first = [fake_redis.get(key) for key in result_keys]
    summary = runtime.run_batch(BatchTask(*celery.sent[-1]["args"]))
    assert summary["ran"] == 0
    assert [fake_redis.get(key) for key in result_keys] == first
    fake_redis.delete(*result_keys)  # as their TTL would
    summary = runtime.run_batch(BatchTask(*celery.sent[-1]["args"]))
    assert summary["ran"] == 0
    assert fake_redis.exists(*result_keys) == 0


@dataclass
class BackendFleet:
    """A batcher, a worker runtime and a producer on one fakeredis, serving ``backend``."""

    celery: RecordingCelery
    batcher: ModelBatcher
    runtime: WorkerRuntime
    producer: Producer


@contextlib.contextmanager
def fleet_of_backend(
    client: fakeredis.FakeRedis, backend: str, **settings: Any
) -> Iterator[BackendFleet]:
    """A batcher, a worker runtime and a producer on ``client`` serving ``backend`` as
    ``synthetic`` (batches of 4), with any other ``settings``."""
    settings = Settings(
        models={"synthetic": ModelPolicy(backend=backend, max_batch_size=4)}, **settings
    )
    listen = fakeredis.FakeRedis(server=client.connection_pool.connection_kwargs["server"])
    celery = RecordingCelery(client)
    batcher = new_batcher(settings, client, celery)
    runtime = WorkerRuntime(settings, "w1", "cpu", ["synthetic"], client=client)
    with Producer(settings, client=client, listen_client=listen) as producer:
        yield BackendFleet(celery, batcher, runtime, producer)


def sent_apart(
    fleet: BackendFleet, first: Sequence[Any], second: Any
) -> tuple[list[str], str, BatchTask, BatchTask]:
    """``first`` submitted and sent as one batch, then ``second`` as another: their request
    ids and their batch tasks."""
    first_ids = fleet.producer.submit_many("synthetic", first)
    fleet.batcher.step()
    fleet.batcher.step()
    second_id = fleet.producer.submit("synthetic", second)
    fleet.batcher.step()
    fleet.batcher.step()
    first_task, second_task = (BatchTask(*sent["args"]) for sent in fleet.celery.sent)
    return first_ids, second_id, first_task, second_task


def answers_of_backend(
    client: fakeredis.FakeRedis, backend: str, inputs: Sequence[Any]
) -> list[Result]:
    """Runs ``inputs`` as one batch through a fleet serving ``backend``; their answers."""
    with fleet_of_backend(client, backend) as fleet:
        ids = fleet.producer.submit_many("synthetic", inputs)
        run_one_batch(fleet.runtime, client, fleet.batcher, fleet.celery)
    assert client.xlen(STREAM) == 0
    return [stored_result(client, request_id) for request_id in ids]


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        ("tests.unit.test_batch_path:FailingModel", "CUDA out of memory"),
        ("tests.unit.test_batch_path:ShortModel", "0 outputs for 1 inputs"),
    ],
)
def test_model_failing_on_every_input_answers_each_with_model_error(
    fake_redis: fakeredis.FakeRedis,
    backend: str,
    message: str,
) -> None:
    """A model that raises or miscounts its outputs even on single inputs ends each request
    with model_error, carrying the reason."""
    for result in answers_of_backend(fake_redis, backend, [1, 2, 3, 4]):
        assert result.error is not None and result.error.code == "model_error"
        assert message in result.error.message


def test_poison_input_fails_alone_and_the_rest_of_its_batch_succeeds(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    """One input that breaks the model gets model_error; its batch-mates get their outputs."""
    results = answers_of_backend(
        fake_redis, "tests.unit.test_batch_path:PoisonModel", ["a", "poison", "c", "d"]
    )
    assert [result.output for result in results] == [{"ok": "a"}, None, {"ok": "c"}, {"ok": "d"}]
    poisoned = results[1].error
    assert poisoned is not None and poisoned.code == "model_error"
    assert "cannot digest poison" in poisoned.message
    assert all(result.ok for index, result in enumerate(results) if index != 1)


class PostprocessingModel(FailingModel):
    """Its device computes each input doubled, as one mapping for the whole batch;
    ``postprocess`` makes one output per input of it. A batch holding "hold" stays in
    ``postprocess`` until another batch has run on the device (``held_until_next`` says whether
    one did); "break" makes ``postprocess`` raise, "short" forget an output."""

    postprocessing = threading.Event()
    next_ran = threading.Event()
    held_until_next: ClassVar[list[bool]] = []

    def predict(self, batch: Sequence[Any]) -> dict[str, Any]:
        if "hold" not in batch:
            PostprocessingModel.next_ran.set()
        return {"doubled": [item * 2 for item in batch]}

    def postprocess(self, computed: dict[str, Any]) -> list[Any]:
        doubled = computed["doubled"]
        if "holdhold" in doubled:
            PostprocessingModel.postprocessing.set()
            PostprocessingModel.held_until_next.append(PostprocessingModel.next_ran.wait(30))
        if "breakbreak" in doubled:
            raise ValueError("cannot convert the tensor")
        return [{"doubled": item} for item in doubled if item != "shortshort"]


def test_a_batch_postprocesses_its_outputs_while_the_next_batch_runs_on_the_device(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    """A model's ``postprocess`` turns what its device computed into the outputs once the
    device is free: the next batch's model call runs meanwhile, and each caller gets its
    own output."""
    PostprocessingModel.postprocessing.clear()
    PostprocessingModel.next_ran.clear()
    PostprocessingModel.held_until_next.clear()
    with fleet_of_backend(fake_redis, f"{__name__}:PostprocessingModel") as fleet:
        add_worker(fake_redis, slots=2)
        first, second, first_task, second_task = sent_apart(fleet, ["hold", "a"], "next")
        running = threading.Thread(target=fleet.runtime.run_batch, args=(first_task,))
        running.start()
        try:
            assert PostprocessingModel.postprocessing.wait(timeout=30), "no postprocess ran"
            fleet.runtime.run_batch(second_task)
        finally:
            running.join()
    assert PostprocessingModel.held_until_next == [True]
    answers = {rid: stored_result(fake_redis, rid) for rid in [*first, second]}
    assert [answers[rid].output for rid in [*first, second]] == [
        {"doubled": "holdhold"},
        {"doubled": "aa"},
        {"doubled": "nextnext"},
    ]
    assert {answers[rid].batch_size for rid in first} == {2}


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (["a", "break", "c"], "ValueError: cannot convert the tensor"),
        (["a", "short", "c"], "ValueError: model returned 2 outputs for 3 inputs"),
    ],
)
def test_a_failing_postprocess_fails_its_whole_model_call(
    fake_redis: fakeredis.FakeRedis, inputs: list[str], message: str
) -> None:
    """A ``postprocess`` that raises or miscounts its outputs answers every request of that
    model call with model_error and the reason (the device's work is done: nothing runs
    again), and leaves nothing in the stream."""
    answers = answers_of_backend(fake_redis, f"{__name__}:PostprocessingModel", inputs)
    for answer in answers:
        assert answer.error is not None and answer.error.code == "model_error"
        assert answer.error.message == message


def test_a_waiting_batch_tops_itself_up_when_the_device_frees(
    runtime: WorkerRuntime,
    fake_redis: fakeredis.FakeRedis,
    producer: Producer,
    batcher: ModelBatcher,
    celery: RecordingCelery,
) -> None:
    """Late binding: requests that arrived after a batch was formed ride in it, up to
    max_batch_size; the rest stay queued for the next batch."""
    add_worker(fake_redis)
    first = producer.submit("synthetic", "first")
    batcher.step()
    batcher.step()
    assert len(celery.sent) == 1 and len(celery.sent[0]["args"][2]) == 1
    later = producer.submit_many("synthetic", ["a", "b", "c", "d", "e"])
    runtime.run_batch(BatchTask(*celery.sent[0]["args"]))
    rode_along = [first, *later[:3]]
    assert {stored_result(fake_redis, rid).batch_size for rid in rode_along} == {4}
    assert not any(fake_redis.exists(KEYS.result("synthetic", rid)) for rid in later[3:])
    assert fake_redis.xlen(STREAM) == 2


class GatedModel(FailingModel):
    """Echoes; a batch holding "hold" stays on the device until ``release`` is set."""

    on_device = threading.Event()
    release = threading.Event()

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        if "hold" in batch:
            GatedModel.on_device.set()
            GatedModel.release.wait()
        return [{"ok": item} for item in batch]


def test_a_finished_batch_frees_its_slot_only_once_the_waiting_batch_took_late_joiners(
    fake_redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests that reached the stream while a batch ran ride in the batch waiting for the
    device. The running batch's slot release wakes a batcher with a free slot, which reads
    the stream: so it is sent only once the waiting batch has taken the device and read
    them, not when the device frees."""
    GatedModel.on_device.clear()
    GatedModel.release.clear()
    slot_released_at_claim: list[bool] = []
    with fleet_of_backend(fake_redis, f"{__name__}:GatedModel") as fleet:
        add_worker(fake_redis, slots=2)
        _, waiting_first, running_task, waiting_task = sent_apart(fleet, ["hold"], "next")
        running = threading.Thread(target=fleet.runtime.run_batch, args=(running_task,))
        waiting = threading.Thread(target=fleet.runtime.run_batch, args=(waiting_task,))
        device = fleet.runtime.device
        claim = device.claim

        def noting_claim(*args: Any, **kwargs: Any) -> Any:
            inflight = fake_redis.zscore(KEYS.inflight("synthetic"), running_task.batch_id)
            slot_released_at_claim.append(inflight is None)
            return claim(*args, **kwargs)

        running.start()
        try:
            assert GatedModel.on_device.wait(timeout=30), "the first batch never ran"
            late = fleet.producer.submit_many("synthetic", ["a", "b"])
            monkeypatch.setattr(device, "claim", noting_claim)
            waiting.start()
            wait_until(lambda: device.waiting == 1)
        finally:
            GatedModel.release.set()
            running.join()
            if waiting.ident is not None:
                waiting.join()
    assert slot_released_at_claim == [False]
    rode = [stored_result(fake_redis, rid) for rid in [waiting_first, *late]]
    assert {(result.batch_id, result.batch_size) for result in rode} == {(waiting_task.batch_id, 3)}
    assert fake_redis.zcard(KEYS.inflight("synthetic")) == 0
    assert set(fake_redis.lrange(KEYS.slot_free("synthetic"), 0, -1)) == {
        running_task.batch_id.encode(),
        waiting_task.batch_id.encode(),
    }


@pytest.mark.parametrize(
    ("read_ahead", "riders"),
    [
        # The read ahead is fresh when the device frees: the claim reads nothing more.
        ("fresh", ["next", "a"]),
        # It grew stale (the call ran long): the claim tops the batch up to its size.
        ("stale", ["next", "a", "c", "d"]),
        # It failed: the claim reads the late joiners, as without one.
        ("failed", ["next", "a", "c", "d"]),
    ],
)
def test_a_waiting_batch_reads_late_joiners_ahead_of_the_device_freeing(
    fake_redis: fakeredis.FakeRedis,
    monkeypatch: pytest.MonkeyPatch,
    read_ahead: str,
    riders: list[str],
) -> None:
    """A batch waiting for the device, when the running call nears its expected end (here
    at once: a call of that size measured ~0 s), reads the requests that reached the stream
    meanwhile, and readies its claim of them, so that its model starts without a read when
    the device frees. Requests that arrive after that read ride in it only when the read has
    grown stale by then; none is lost either way, and a claim readied for nothing goes back
    to the pool with its connection."""
    GatedModel.on_device.clear()
    GatedModel.release.clear()
    monkeypatch.setattr(
        device_module, "READ_AHEAD_FRESH_S", -1.0 if read_ahead == "stale" else 3600
    )
    with fleet_of_backend(fake_redis, f"{__name__}:GatedModel") as fleet:
        add_worker(fake_redis, slots=2)
        runtime = fleet.runtime
        fleet.producer.submit("synthetic", "measured")
        fleet.batcher.step()
        fleet.batcher.step()
        runtime.run_batch(BatchTask(*fleet.celery.sent[0]["args"]))
        fleet.producer.submit("synthetic", "hold")
        fleet.batcher.step()
        fleet.batcher.step()
        ids = {"next": fleet.producer.submit("synthetic", "next")}
        fleet.batcher.step()
        fleet.batcher.step()
        running_task, waiting_task = (BatchTask(*sent["args"]) for sent in fleet.celery.sent[1:])
        running = threading.Thread(target=runtime.run_batch, args=(running_task,))
        waiting = threading.Thread(target=runtime.run_batch, args=(waiting_task,))
        device = runtime.device
        read = device.read_late_joiners
        was_read = threading.Event()

        def noting_read(*args: Any) -> Any:
            try:
                if read_ahead == "failed":
                    raise redis.ConnectionError("Redis went away")
                return read(*args)
            finally:
                was_read.set()

        running.start()
        try:
            assert GatedModel.on_device.wait(timeout=30), "the first batch never ran"
            ids["a"] = fleet.producer.submit("synthetic", "a")
            monkeypatch.setattr(device, "read_late_joiners", noting_read)
            waiting.start()
            assert was_read.wait(timeout=30), "the waiting batch never read ahead"
            after = ["c", "d"]
            ids.update(zip(after, fleet.producer.submit_many("synthetic", after), strict=True))
        finally:
            GatedModel.release.set()
            running.join()
            if waiting.ident is not None:
                waiting.join()
    rode = {name: stored_result(fake_redis, ids[name]) for name in riders}
    assert {(result.batch_id, result.batch_size) for result in rode.values()} == {
        (waiting_task.batch_id, len(riders))
    }
    left = [name for name in ids if name not in riders]
    assert not any(fake_redis.exists(KEYS.result("synthetic", ids[name])) for name in left)
    assert fake_redis.xlen(STREAM) == len(left)
    assert not fake_redis.connection_pool._in_use_connections, "a connection was kept"


def test_a_batch_done_with_the_device_goes_on_when_the_next_one_never_claims_it(
    runtime: WorkerRuntime,
) -> None:
    """A batch done with the device leaves the interpreter to the full batch it hands the
    device to until that batch's claim is sent; one that never claims (its thread failed
    first) holds up the finished batch's answers for a bounded wait, never for good."""
    device = runtime.device
    next_holds, next_may_go = threading.Event(), threading.Event()

    def take_without_claiming() -> None:
        with device.held():
            next_holds.set()
            next_may_go.wait()

    following = threading.Thread(target=take_without_claiming)
    with device.held():
        following.start()
        wait_until(lambda: device.waiting == 1)
    assert next_holds.wait(timeout=30)  # handed over, and this thread went on
    next_may_go.set()
    following.join()


def test_a_slot_release_handed_to_a_failing_claim_is_still_sent(
    runtime: WorkerRuntime, fake_redis: fakeredis.FakeRedis
) -> None:
    """A finished batch hands its slot release to the batch waiting for the device; when that
    batch's claim fails, the release is sent anyway: the slot is not lost until its lease
    runs out."""
    state = FleetState(fake_redis, KEYS, "synthetic")
    state.dispatched("finished", "slot", lease_s=30)
    no_group = KEYS.stream("other")
    fake_redis.xadd(no_group, {STREAM_FIELD: "{}"})
    device = runtime.device
    failed: list[BaseException] = []

    def claim_when_free() -> None:
        with device.held():
            try:
                device.claim(no_group, [], fill_to=4)
            except redis.ResponseError as exc:
                failed.append(exc)

    with device.held():
        waiting = threading.Thread(target=claim_when_free)
        waiting.start()
        wait_until(lambda: device.waiting == 1)
        assert device.hand_over(state.slot_release("finished", lease_s=30))
    waiting.join()
    assert failed, "a read of a stream without the group should have failed"
    assert fake_redis.zscore(KEYS.inflight("synthetic"), "finished") is None
    assert fake_redis.lrange(KEYS.slot_free("synthetic"), 0, -1) == [b"finished"]


def test_requests_read_while_redis_lost_its_scripts_are_still_sent(
    batcher: ModelBatcher,
    producer: Producer,
    fake_redis: fakeredis.FakeRedis,
    celery: RecordingCelery,
) -> None:
    """Redis restarted with its data (or flushed its scripts) between two reads: the capacity
    count that travels with a read is refused for want of its script and made again alone,
    and the requests that read took go out in the next batch instead of waiting out the
    lease."""
    add_worker(fake_redis)
    producer.submit_many("synthetic", ["a", "b", "c", "d"])
    batcher.step()
    batcher.step()
    assert len(celery.sent) == 1
    ahead = producer.submit_many("synthetic", ["e", "f", "g", "h"])
    fake_redis.script_flush()
    batcher.step()  # the one slot is busy: the next full batch is read ahead
    first_batch_id = celery.sent[0]["args"][1]
    FleetState(fake_redis, KEYS, "synthetic").batch_done(first_batch_id, lease_s=55)()
    batcher.step()
    batcher.step()
    assert len(celery.sent) == 2
    assert [request_id for _, request_id in celery.sent[1]["args"][2]] == ahead


def ids_sent(task: dict[str, Any]) -> list[str]:
    """The request ids a sent batch task names."""
    return [request_id for _, request_id in task["args"][2]]


def test_a_full_batch_is_sent_in_the_round_trip_that_reads_the_next_one(
    batcher: ModelBatcher,
    producer: Producer,
    fake_redis: fakeredis.FakeRedis,
    celery: RecordingCelery,
) -> None:
    """While batches leave full, the step that sends one also takes the next batch's
    requests from the stream; they go out as the next batch once a slot frees."""
    add_worker(fake_redis)
    first = producer.submit_many("synthetic", ["a", "b", "c", "d"])
    second = producer.submit_many("synthetic", ["e", "f", "g", "h"])
    batcher.step()
    batcher.step()
    assert [ids_sent(task) for task in celery.sent] == [first]
    assert fake_redis.xpending(STREAM, CONSUMER_GROUP)["pending"] == 8
    assert fake_redis.xinfo_groups(STREAM)[0]["lag"] == 0
    FleetState(fake_redis, KEYS, "synthetic").batch_done(celery.sent[0]["args"][1], lease_s=55)()
    batcher.step()
    assert [ids_sent(task) for task in celery.sent] == [first, second]


def test_a_batch_sent_while_redis_lost_its_scripts_goes_out_once(
    batcher: ModelBatcher,
    producer: Producer,
    fake_redis: fakeredis.FakeRedis,
    celery: RecordingCelery,
) -> None:
    """The dispatch refused for want of its script is made again alone: its batch is sent
    once, and the requests read in its round trip are held for the next batch, not read
    again."""
    add_worker(fake_redis)
    first = producer.submit_many("synthetic", ["a", "b", "c", "d"])
    second = producer.submit_many("synthetic", ["e", "f", "g", "h"])
    batcher.step()
    fake_redis.script_flush()
    batcher.step()
    assert [ids_sent(task) for task in celery.sent] == [first]
    assert fake_redis.hget(KEYS.stats("synthetic"), stats_fields.batches("size")) == b"1"
    FleetState(fake_redis, KEYS, "synthetic").batch_done(celery.sent[0]["args"][1], lease_s=55)()
    batcher.step()
    assert [ids_sent(task) for task in celery.sent] == [first, second]


def queue_full_batches(
    settings: Settings, client: fakeredis.FakeRedis, count: int
) -> list[list[str]]:
    """``count`` full batches' request ids, queued (the model's queue holds them all)."""
    policy = settings.models["synthetic"].model_copy(update={"max_queue_len": 4 * count})
    roomy = settings.model_copy(update={"models": {"synthetic": policy}})
    listen = fakeredis.FakeRedis(server=client.connection_pool.connection_kwargs["server"])
    with Producer(roomy, client=client, listen_client=listen) as producer:
        return [
            producer.submit_many("synthetic", [f"{n}-{i}" for i in range(4)]) for n in range(count)
        ]


@pytest.fixture
def three_batches(settings: Settings, fake_redis: fakeredis.FakeRedis) -> list[list[str]]:
    """Three full batches' request ids, queued."""
    return queue_full_batches(settings, fake_redis, 3)


def test_a_full_batch_waiting_for_room_is_sent_in_the_round_trip_that_waits(
    batcher: ModelBatcher,
    three_batches: list[list[str]],
    fake_redis: fakeredis.FakeRedis,
    celery: RecordingCelery,
) -> None:
    """With its one slot busy and one full batch ahead, the worker has no room: the next
    full batch waits in the batcher, and the step that sees a slot free sends it at once."""
    add_worker(fake_redis)
    for _ in range(4):
        batcher.step()
    assert [ids_sent(task) for task in celery.sent] == three_batches[:2]
    FleetState(fake_redis, KEYS, "synthetic").batch_done(celery.sent[0]["args"][1], lease_s=55)()
    batcher.step()
    assert [ids_sent(task) for task in celery.sent] == three_batches
    assert fake_redis.hget(KEYS.stats("synthetic"), stats_fields.batches("size")) == b"3"


def test_a_full_batch_sent_after_a_wait_while_redis_lost_its_scripts_goes_out_once(
    batcher: ModelBatcher,
    three_batches: list[list[str]],
    fake_redis: fakeredis.FakeRedis,
    celery: RecordingCelery,
) -> None:
    """The dispatch that follows a wait for a slot, refused for want of its script, is made
    again alone: its batch is sent once, without waiting again."""
    add_worker(fake_redis)
    for _ in range(3):
        batcher.step()
    FleetState(fake_redis, KEYS, "synthetic").batch_done(celery.sent[0]["args"][1], lease_s=55)()
    fake_redis.script_flush()
    batcher.step()
    assert [ids_sent(task) for task in celery.sent] == three_batches


def test_full_batches_that_wait_for_room_go_out_in_order_as_slots_free(
    batcher: ModelBatcher,
    settings: Settings,
    fake_redis: fakeredis.FakeRedis,
    celery: RecordingCelery,
) -> None:
    """A worker with no room for a while: the batches queued behind it wait in the batcher
    (holding up to two batches' worth once a wait found no room) and go out one per freed
    slot, in order."""
    add_worker(fake_redis)
    batches = queue_full_batches(settings, fake_redis, 4)
    for _ in range(6):
        batcher.step()
    state = FleetState(fake_redis, KEYS, "synthetic")
    for sent in (2, 3):
        assert len(celery.sent) == sent
        state.batch_done(celery.sent[sent - 2]["args"][1], lease_s=55)()
        batcher.step()
    assert [ids_sent(task) for task in celery.sent] == batches


def taken_by_a_dead_process(client: fakeredis.FakeRedis, batcher: ModelBatcher) -> list[Any]:
    """Entries a worker read onto its device and then died holding, as a reclaim hands them
    over."""
    batcher._ensure_group()
    reply = client.xreadgroup(CONSUMER_GROUP, device_consumer("dead", "gone"), {STREAM: ">"})
    return [entry for _, entries in reply for entry in entries]


def ids_of(entries: list[Any]) -> set[str]:
    return {entry_id.decode() for entry_id, _ in entries}


def test_requests_taken_back_from_a_dead_process_ride_alone(
    batcher: ModelBatcher,
    producer: Producer,
    fake_redis: fakeredis.FakeRedis,
    celery: RecordingCelery,
) -> None:
    """After a crash each suspect request is its own batch, never topped up, so an input that
    kills its process cannot take innocent requests with it again."""
    add_worker(fake_redis, slots=4)
    ids = producer.submit_many("synthetic", ["a", "b", "c"])
    entries = taken_by_a_dead_process(fake_redis, batcher)
    batcher._take_back(entries, died_on_device=ids_of(entries))
    for _ in range(3):
        batcher.step()
    assert [len(task["args"][2]) for task in celery.sent] == [1, 1, 1]
    assert {task["args"][3] for task in celery.sent} == {"isolated"}
    assert {task["args"][2][0][1] for task in celery.sent} == set(ids)


def test_a_request_whose_process_keeps_dying_is_answered_poison_and_dead_lettered(
    batcher: ModelBatcher,
    producer: Producer,
    fake_redis: fakeredis.FakeRedis,
    celery: RecordingCelery,
) -> None:
    """At max_attempts the request is not sent again: its caller gets poison, and the request
    is copied to the model's dead-letter stream."""
    (request_id,) = producer.submit_many("synthetic", ["segfault"])
    entries = taken_by_a_dead_process(fake_redis, batcher)
    fake_redis.hset(KEYS.attempts("synthetic"), entries[0][0], 2)
    batcher._take_back(entries, died_on_device=ids_of(entries))
    error = stored_result(fake_redis, request_id).error
    assert error is not None and error.code == "poison"
    assert "died 3 times" in error.message
    ((_, dead),) = fake_redis.xrange(KEYS.dead_letter("synthetic"))
    assert Request.decode(dead[b"request"].decode()).request_id == request_id
    assert dead[b"deaths"] == b"3"
    assert celery.sent == []
    assert not fake_redis.hexists(KEYS.attempts("synthetic"), entries[0][0])


def test_requests_reclaimed_from_a_process_that_did_not_run_them_count_no_attempt(
    batcher: ModelBatcher,
    producer: Producer,
    fake_redis: fakeredis.FakeRedis,
    celery: RecordingCelery,
) -> None:
    """Requests a dead batcher held, or a worker held while waiting for its device, cannot
    have killed it: they are sent again together, with no attempt counted."""
    add_worker(fake_redis, slots=4)
    producer.submit_many("synthetic", ["a", "b", "c"])
    batcher._take_back(taken_by_a_dead_process(fake_redis, batcher), died_on_device=set())
    batcher.step()
    assert [len(task["args"][2]) for task in celery.sent] == [3]
    assert fake_redis.hlen(KEYS.attempts("synthetic")) == 0


def one_batch_first_on(
    device: str,
    inputs: list[str],
    producer: Producer,
    batcher: ModelBatcher,
    celery: RecordingCelery,
    client: fakeredis.FakeRedis,
) -> tuple[list[str], list[Any]]:
    """Sends ``inputs`` as one batch and leaves its first request held by ``device`` (a
    worker's device consumer), as a process that took it into a model call does; the ids and
    the batch task's arguments."""
    add_worker(client)
    ids = producer.submit_many("synthetic", inputs)
    batcher.step()
    batcher.step()
    args = celery.sent[0]["args"]
    client.xclaim(STREAM, CONSUMER_GROUP, device, 0, [args[2][0][0]])
    return ids, args


def test_a_batch_celery_delivers_again_counts_an_attempt_for_what_was_on_the_device(
    runtime: WorkerRuntime,
    batcher: ModelBatcher,
    producer: Producer,
    fake_redis: fakeredis.FakeRedis,
    celery: RecordingCelery,
) -> None:
    """A batch redelivered after its worker died: requests the dead worker's device held count
    an attempt (at max_attempts they get poison, not another run); the rest run."""
    dead = device_consumer("dead", "gone")
    ids, args = one_batch_first_on(
        dead, ["on device", "waiting"], producer, batcher, celery, fake_redis
    )
    fake_redis.hset(KEYS.attempts("synthetic"), args[2][0][0], 2)
    runtime.run_batch(BatchTask(*args), redelivered=True)
    error = stored_result(fake_redis, ids[0]).error
    assert error is not None and error.code == "poison" and "died 3 times" in error.message
    assert fake_redis.xlen(KEYS.dead_letter("synthetic")) == 1
    assert stored_result(fake_redis, ids[1]).output == expected_output("waiting")
    assert fake_redis.xlen(STREAM) == 0
    assert fake_redis.hlen(KEYS.attempts("synthetic")) == 0


def test_a_redelivered_request_below_max_attempts_runs_alone_and_succeeds(
    runtime: WorkerRuntime,
    batcher: ModelBatcher,
    producer: Producer,
    fake_redis: fakeredis.FakeRedis,
    celery: RecordingCelery,
) -> None:
    """One death on the device is one attempt: the request runs again and is answered."""
    dead = device_consumer("dead", "gone")
    (request_id,), args = one_batch_first_on(
        dead, ["on device"], producer, batcher, celery, fake_redis
    )
    runtime.run_batch(BatchTask(*args), redelivered=True)
    assert stored_result(fake_redis, request_id).output == expected_output("on device")
    assert fake_redis.hlen(KEYS.attempts("synthetic")) == 0


def test_a_redelivered_batch_leaves_what_a_live_device_is_running_to_it(
    runtime: WorkerRuntime,
    batcher: ModelBatcher,
    producer: Producer,
    fake_redis: fakeredis.FakeRedis,
    celery: RecordingCelery,
) -> None:
    """A batch delivered again while a live process has one of its requests on its device
    (its batcher sent it again, or another slot runs it): that request is left to that run,
    with no attempt counted and no second execution; the rest run."""
    live = device_consumer("other", "alive")
    node_heartbeat(fake_redis, KEYS, NodeBeat("other", live, {}, ["synthetic"], ttl_s=30))
    ids, args = one_batch_first_on(
        live, ["running elsewhere", "waiting"], producer, batcher, celery, fake_redis
    )
    runtime.run_batch(BatchTask(*args), redelivered=True)
    assert not fake_redis.exists(KEYS.result("synthetic", ids[0]))
    held = fake_redis.xpending_range(STREAM, CONSUMER_GROUP, "-", "+", 10)
    assert [(row["message_id"].decode(), row["consumer"].decode()) for row in held] == [
        (args[2][0][0], live)
    ]
    assert stored_result(fake_redis, ids[1]).output == expected_output("waiting")
    assert fake_redis.hlen(KEYS.attempts("synthetic")) == 0


class DyingModel(FailingModel):
    """A model whose process dies on the input "die" (simulated: SystemExit escapes)."""

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        if "die" in batch:
            raise SystemExit(3)
        return [{"ok": item} for item in batch]


def test_each_request_of_a_redelivered_batch_is_answered_before_the_next_runs(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    """Run one at a time, an innocent request run before the one that kills the process keeps
    its answer, and does not stay on the device to be counted as a suspect."""
    with fleet_of_backend(fake_redis, f"{__name__}:DyingModel") as fleet:
        innocent, _ = fleet.producer.submit_many("synthetic", ["fine", "die"])
        add_worker(fake_redis)
        fleet.batcher.step()
        fleet.batcher.step()
        task = BatchTask(*fleet.celery.sent[0]["args"])
        with pytest.raises(SystemExit):
            fleet.runtime.run_batch(task, redelivered=True)
    assert stored_result(fake_redis, innocent).output == {"ok": "fine"}
    held = fake_redis.xpending_range(STREAM, CONSUMER_GROUP, "-", "+", 10)
    assert [entry["message_id"].decode() for entry in held] == [task.entries[1][0]]


class RestartingRedisCelery(RecordingCelery):
    """Records batches sent to a broker of their own. At the first, the fleet's Redis
    restarts empty and a new request arrives; at the second, the batcher's loop is stopped."""

    def __init__(self, stop: threading.Event, restart: Callable[[], None]) -> None:
        super().__init__()
        self.stop = stop
        self.restart = restart

    def send_task(self, name: str, args: list[Any], queue: str, argsrepr: str) -> None:
        super().send_task(name, args, queue, argsrepr)
        if len(self.sent) == 1:
            self.restart()
        else:
            self.stop.set()


def test_a_batcher_starts_over_when_redis_comes_back_empty(
    settings: Settings, fake_redis: fakeredis.FakeRedis, producer: Producer
) -> None:
    """Redis restarted without persistence loses the stream and its group: the running batcher
    recreates them and serves the requests that arrive next instead of failing."""
    stop = threading.Event()
    after: list[str] = []

    def restart_empty() -> None:
        fake_redis.flushall()
        add_worker(fake_redis)
        after.extend(producer.submit_many("synthetic", ["after the restart"]))

    celery = RestartingRedisCelery(stop, restart_empty)
    own_broker = settings.model_copy(update={"broker_url": SecretStr("redis://broker:6379/0")})
    batcher = new_batcher(own_broker, fake_redis, celery)
    add_worker(fake_redis)
    producer.submit_many("synthetic", ["before"])
    loop = threading.Thread(target=batcher.run, args=(stop,))
    loop.start()
    loop.join(timeout=10)
    assert not loop.is_alive() and not batcher.failed
    assert [len(task["args"][2]) for task in celery.sent] == [1, 1]
    ((_, request_id),) = celery.sent[1]["args"][2]
    assert [request_id] == after


def test_an_item_error_fails_only_its_input(fake_redis: fakeredis.FakeRedis) -> None:
    """A model that returns ItemError for one input: that caller gets model_error with the
    message, the others their outputs, from one model call."""
    answers = answers_of_backend(fake_redis, f"{__name__}:ItemErrorModel", ["a", "bad", "c"])
    assert [answer.output for answer in answers] == ["a", None, "c"]
    error = answers[1].error
    assert error is not None and error.code == "model_error"
    assert error.message == "upstream refused it"
    assert answers[0].batch_size == 3
