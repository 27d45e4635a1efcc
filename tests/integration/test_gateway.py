"""The HTTP gateway (``batchfleet gateway``), called as users call it: the official ``openai``
client for embeddings, chat (whole and streamed) and completions, and plain httpx for bad
input, refusals and a client that leaves mid-stream. One fleet (a batcher and a worker) and
one gateway serve every test of this file."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from config.keys import Keys
from producer.async_client import AsyncProducer
from workers.gateway.batch_store import BatchStore
from workers.local.local_fleet import LocalFleet
from workers.local.local_gateway import start_gateway
from workers.local.local_redis import LocalRedis, free_port
from workers.models.synthetic import expected_vector

from .conftest import READY_TIMEOUT_S, producer_for, settings_for, wait_ready
from .openai_server import FakeUpstream

API_KEY = "sk-test-" + uuid.uuid4().hex
DIMS = 16
# Served by nobody: its one queue slot fills and stays full, its answers never come.
IDLE_POLICY = {"max_queue_len": 1, "request_timeout_s": 1.0}
CONCURRENT_CALLS = 2000
EMBED_POLICY = {"options": {"base_ms": 2, "per_item_ms": 0.02, "dims": DIMS}}
MAX_FILE_BYTES = 1 << 20
BATCH_LINES = 300
ENDED = ("completed", "failed", "cancelled", "expired")


@dataclass
class Gateway:
    """The module's gateway: its URL, processes, upstream, environment, and one official
    client on it."""

    url: str
    fleet: LocalFleet
    upstream: FakeUpstream
    env: dict[str, str]
    client: openai.OpenAI

    def post(
        self, path: str, key: str | None = API_KEY, content_type: str | None = None, **kwargs: Any
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        if content_type:
            headers["Content-Type"] = content_type
        return httpx.post(f"{self.url}{path}", headers=headers, timeout=30, **kwargs)


@pytest.fixture(scope="module")
def gateway(
    redis_server: LocalRedis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    with FakeUpstream() as upstream:
        upstream_options = {"base_url": upstream.url, "model": "m"}
        models = {
            "embed": EMBED_POLICY,
            "chat": {"backend": "openai", "options": {**upstream_options, "endpoint": "chat"}},
            "text": {
                "backend": "openai",
                "options": {**upstream_options, "endpoint": "completions"},
            },
        }
        env = {
            "BATCHFLEET_REDIS_URL": redis_server.url,
            "BATCHFLEET_KEY_PREFIX": f"t{uuid.uuid4().hex[:10]}",
            "BATCHFLEET_MODELS": json.dumps(models),
            "BATCHFLEET_GATEWAY__API_KEYS": API_KEY,
            "BATCHFLEET_GATEWAY__MAX_BODY_BYTES": str(64 * 1024),
        }
        with LocalFleet(env) as fleet:
            fleet.start("batcher")
            fleet.start("worker", "--cpu")
            with producer_for(fleet) as producer:
                for model, warmup in (("embed", "warm"), ("chat", "warm"), ("text", "warm")):
                    wait_ready(producer, fleet, model, warmup=warmup)
            unserved = {"idle": IDLE_POLICY, "held": IDLE_POLICY}
            gateway_env = {
                **env,
                "BATCHFLEET_MODELS": json.dumps({**models, **unserved}),
                "BATCHFLEET_GATEWAY__FILES_DIR": str(tmp_path_factory.mktemp("files")),
                "BATCHFLEET_GATEWAY__MAX_FILE_BYTES": str(MAX_FILE_BYTES),
            }
            with LocalFleet(gateway_env) as gateway_fleet:
                url = start_gateway(gateway_fleet)
                with openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY) as client:
                    yield Gateway(url, gateway_fleet, upstream, gateway_env, client)


def as_float32(vector: list[float]) -> Any:
    """``vector`` as the client holds it after base64 (float32), for comparison."""
    return pytest.approx(vector, abs=1e-6)


def test_the_openai_client_gets_each_inputs_embedding(gateway: Gateway) -> None:
    """One call with several texts: one vector per text, in order, as the model computes it,
    exactly as floats, or base64-encoded (float32, what the client asks for by default)."""
    texts = ["a red fox", "a blue whale", "a green frog"]
    expected = [expected_vector(text, DIMS) for text in texts]
    client = gateway.client
    as_floats = client.embeddings.create(model="embed", input=texts, encoding_format="float")
    assert [row.index for row in as_floats.data] == [0, 1, 2]
    assert [row.embedding for row in as_floats.data] == expected
    assert as_floats.model == "embed"
    by_default = client.embeddings.create(model="embed", input=texts)
    assert [row.embedding for row in by_default.data] == [as_float32(v) for v in expected]
    raw = gateway.post(
        "/v1/embeddings", json={"model": "embed", "input": texts[0], "encoding_format": "base64"}
    ).json()
    packed = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack(f"<{DIMS}f", packed)) == as_float32(expected[0])


def test_thousands_of_concurrent_calls_each_get_the_fleets_own_answer(gateway: Gateway) -> None:
    """2,000 concurrent calls from the async client, one text each: every answer is the
    vector the fleet gives for that text when asked directly."""
    texts = [f"sentence {n} {uuid.uuid4().hex}" for n in range(CONCURRENT_CALLS)]

    async def through_gateway() -> list[list[float]]:
        client = openai.AsyncOpenAI(
            base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0, timeout=120
        )
        async with client:
            answers = await asyncio.gather(
                *(client.embeddings.create(model="embed", input=text) for text in texts)
            )
        return [answer.data[0].embedding for answer in answers]

    async def directly() -> list[Any]:
        async with AsyncProducer(settings_for(gateway.env)) as producer:
            return await producer.infer("embed", texts)

    answers, direct = asyncio.run(through_gateway()), asyncio.run(directly())
    assert answers == [as_float32(vector) for vector in direct]


def test_the_openai_client_chats_whole_and_streamed(gateway: Gateway) -> None:
    """A chat call answers in OpenAI's shape with the model's text and usage; streamed, its
    chunks add up to the text the model generates, then the finish reason and the usage."""
    client = gateway.client
    messages = [{"role": "user", "content": "count:5"}]
    whole = client.chat.completions.create(model="chat", messages=messages)  # type: ignore[arg-type]
    assert whole.choices[0].message.content == "echo: count:5"
    assert whole.choices[0].finish_reason == "stop"
    assert whole.usage is not None and whole.usage.total_tokens == 3
    stream = client.chat.completions.create(
        model="chat",
        messages=messages,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split() == ["w1", "w2", "w3", "w4", "w5"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


def test_the_openai_client_completes_text(gateway: Gateway) -> None:
    """The legacy completions endpoint: whole, and streamed."""
    client = gateway.client
    whole = client.completions.create(model="text", prompt="hello")
    assert whole.choices[0].text == "echo: hello"
    streamed = client.completions.create(model="text", prompt="count:3", stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices).split() == ["w1", "w2", "w3"]


def test_the_models_list_names_what_the_fleet_serves(gateway: Gateway) -> None:
    names = {model.id for model in gateway.client.models.list()}
    assert {"embed", "chat", "text"} <= names


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_request"),
        (json.dumps({"model": "embed", "input": 5}).encode(), 400, "invalid_request"),
        (json.dumps({"model": "embed"}).encode(), 400, "invalid_request"),
        (json.dumps({"model": "embed", "input": [""]}).encode(), 400, "invalid_input"),
        (json.dumps({"model": "nope", "input": "x"}).encode(), 404, "model_not_found"),
        (json.dumps({"model": "embed", "input": "x" * 70_000}).encode(), 413, "body_too_large"),
    ],
)
def test_bad_calls_get_their_status_and_the_gateway_stays_up(
    gateway: Gateway, body: bytes, status: int, code: str
) -> None:
    """Malformed JSON, wrong types, a missing field, an empty text, an unknown model and a
    body over the cap: each its HTTP status and OpenAI's error body; the gateway serves on."""
    response = gateway.post("/v1/embeddings", content=body, content_type="application/json")
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert gateway.client.embeddings.create(model="embed", input="still up").data


def test_a_body_over_the_cap_is_refused_as_it_streams_in(gateway: Gateway) -> None:
    """A body sent in chunks, with no length declared, is refused once it passes the cap."""

    def chunks() -> Iterator[bytes]:
        yield b'{"model": "embed", "input": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}'

    response = gateway.post("/v1/embeddings", content=chunks())
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize("key", [None, "sk-wrong"])
def test_a_call_without_a_valid_key_is_refused_and_touches_nothing(
    gateway: Gateway, key: str | None
) -> None:
    keys = Keys(gateway.env["BATCHFLEET_KEY_PREFIX"])
    with redis.Redis.from_url(gateway.env["BATCHFLEET_REDIS_URL"]) as client:
        before = client.xlen(keys.stream("embed"))
        response = gateway.post("/v1/embeddings", key=key, json={"model": "embed", "input": "x"})
        assert client.xlen(keys.stream("embed")) == before
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    with (
        openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="sk-wrong") as wrong,
        pytest.raises(openai.AuthenticationError),
    ):
        wrong.models.list()


def test_a_full_queue_is_429_with_retry_after_and_an_unanswered_call_is_504(
    gateway: Gateway,
) -> None:
    """``idle`` has room for one request and nobody serves it: the first call waits out its
    deadline (504), a second meanwhile finds the queue full (429, Retry-After)."""
    keys = Keys(gateway.env["BATCHFLEET_KEY_PREFIX"])
    with (
        ThreadPoolExecutor(1) as caller,
        redis.Redis.from_url(gateway.env["BATCHFLEET_REDIS_URL"]) as client,
    ):
        first = caller.submit(gateway.post, "/v1/embeddings", json={"model": "idle", "input": "1"})
        deadline = time.monotonic() + READY_TIMEOUT_S
        while client.xlen(keys.stream("idle")) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # polls for the first call's admission, which the second needs
        second = gateway.post("/v1/embeddings", json={"model": "idle", "input": "2"})
        unanswered = first.result()
    assert second.status_code == 429
    assert second.headers["Retry-After"] == "1"
    assert second.json()["error"]["code"] == "queue_full"
    assert unanswered.status_code == 504
    assert unanswered.json()["error"]["code"] == "timeout"


def test_a_client_that_leaves_mid_stream_cancels_its_request(gateway: Gateway) -> None:
    """The client reads the first chunk of a long stream and hangs up: the upstream call is
    cut short, and the gateway serves on."""
    cut_before = gateway.upstream.streams_cut
    body = {
        "model": "chat",
        "stream": True,
        "messages": [{"role": "user", "content": "count:500"}],
    }
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.stream(
        "POST", f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        first = next(response.iter_lines())
        assert first.startswith("data: ")
    deadline = time.monotonic() + READY_TIMEOUT_S
    while gateway.upstream.streams_cut == cut_before and time.monotonic() < deadline:
        time.sleep(0.05)  # the event: the worker closing the upstream call
    assert gateway.upstream.streams_cut > cut_before
    assert gateway.client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "hi"}],  # type: ignore[list-item]
    ).choices


def test_redis_away_is_503_and_health_says_so(redis_server: LocalRedis) -> None:
    """A gateway whose Redis cannot be reached answers 503 (Retry-After), and /healthz 503;
    it is still live (/livez 200: restarting it would not bring Redis back)."""
    env = {
        "BATCHFLEET_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "BATCHFLEET_SUBMIT_RETRY_S": "0",
        "BATCHFLEET_GATEWAY__API_KEYS": API_KEY,
    }
    with LocalFleet(env) as fleet:
        url = start_gateway(fleet)
        assert httpx.get(f"{url}/healthz", timeout=30).status_code == 503
        assert httpx.get(f"{url}/livez", timeout=30).status_code == 200
        response = httpx.post(
            f"{url}/v1/embeddings",
            json={"model": "synthetic", "input": "x"},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=30,
        )
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert response.json()["error"]["code"] == "broker_unavailable"


def test_the_metrics_count_calls_by_endpoint_and_status(gateway: Gateway) -> None:
    gateway.client.embeddings.create(model="embed", input="counted")
    gateway.post("/v1/embeddings", key=None, json={"model": "embed", "input": "x"})
    text = httpx.get(f"{gateway.url}/metrics", timeout=30).text
    assert (
        'batchfleet_gateway_requests_total{endpoint="/v1/embeddings",method="POST",status="200"}'
        in text
    )
    assert 'status="401"' in text
    assert "batchfleet_gateway_request_seconds_bucket" in text


def batch_line(custom_id: str, url: str, body: dict[str, Any]) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def run_batch(client: openai.OpenAI, lines: list[str], endpoint: str) -> Any:
    """Uploads ``lines`` and runs them as a batch to its end; the ended batch."""
    uploaded = client.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
    )
    return wait_for_batch(client, batch.id, ENDED)


def wait_for_batch(
    client: openai.OpenAI,
    batch_id: str,
    statuses: tuple[str, ...],
    timeout_s: float = READY_TIMEOUT_S,
) -> Any:
    deadline = time.monotonic() + timeout_s
    batch = client.batches.retrieve(batch_id)
    while batch.status not in statuses and time.monotonic() < deadline:
        time.sleep(0.1)  # polls for the status change, the event the test waits for
        batch = client.batches.retrieve(batch_id)
    assert batch.status in statuses, batch
    return batch


def lines_of(client: openai.OpenAI, file_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_job_runs_from_upload_to_its_output_file(gateway: Gateway) -> None:
    """An embeddings batch uploaded, run and downloaded with the official client: every line
    answered once in OpenAI's output format with the vector the model gives its text; a
    repeated custom_id goes to the error file; the counts say so."""
    texts = {f"line-{n}": f"text number {n}" for n in range(BATCH_LINES)}
    lines = [
        batch_line(cid, "/v1/embeddings", {"model": "embed", "input": text})
        for cid, text in texts.items()
    ]
    lines.append(batch_line("line-7", "/v1/embeddings", {"model": "embed", "input": "again"}))
    client = gateway.client
    batch = run_batch(client, lines, "/v1/embeddings")
    assert batch.status == "completed", f"{batch}\n{gateway.fleet.logs()}"
    assert batch.request_counts.total == BATCH_LINES + 1
    assert batch.request_counts.completed == BATCH_LINES
    assert batch.request_counts.failed == 1
    answers = lines_of(client, batch.output_file_id)
    assert sorted(answer["custom_id"] for answer in answers) == sorted(texts)
    for answer in answers:
        assert answer["error"] is None and answer["response"]["status_code"] == 200
        (row,) = answer["response"]["body"]["data"]
        assert row["embedding"] == expected_vector(texts[answer["custom_id"]], DIMS)
    (error,) = lines_of(client, batch.error_file_id)
    assert error["custom_id"] == "line-7"
    assert error["error"]["code"] == "duplicate_custom_id"


def test_a_chat_batch_answers_each_line_as_a_chat_completion(gateway: Gateway) -> None:
    lines = [
        batch_line(
            f"c{n}",
            "/v1/chat/completions",
            {"model": "chat", "messages": [{"role": "user", "content": f"question {n}"}]},
        )
        for n in range(5)
    ]
    client = gateway.client
    batch = run_batch(client, lines, "/v1/chat/completions")
    assert batch.status == "completed", f"{batch}\n{gateway.fleet.logs()}"
    answers = {answer["custom_id"]: answer for answer in lines_of(client, batch.output_file_id)}
    for n in range(5):
        body = answers[f"c{n}"]["response"]["body"]
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"] == f"echo: question {n}"
    assert batch.error_file_id is None


def test_batches_are_listed_newest_first_page_by_page(gateway: Gateway) -> None:
    """The official client's listing of batches, one a page (it follows ``after`` while
    ``has_more`` says so): each batch once, the newest first; a cursor that names no batch is
    refused."""
    client = gateway.client
    made = [
        run_batch(
            client,
            [batch_line("one", "/v1/embeddings", {"model": "embed", "input": f"listed {n}"})],
            "/v1/embeddings",
        ).id
        for n in range(3)
    ]
    listed = [batch.id for batch in client.batches.list(limit=1)]
    assert len(listed) == len(set(listed))
    assert [batch_id for batch_id in listed if batch_id in made] == made[::-1]
    with pytest.raises(openai.BadRequestError):
        client.batches.list(after="batch_" + "0" * 32)


def test_a_batch_whose_input_does_not_fit_fails_naming_its_lines(gateway: Gateway) -> None:
    """A line for another model or endpoint fails the batch before anything runs; the batch's
    errors name each such line."""
    lines = [
        batch_line("a", "/v1/embeddings", {"model": "embed", "input": "fine"}),
        batch_line("b", "/v1/embeddings", {"model": "chat", "input": "another model"}),
        batch_line("c", "/v1/chat/completions", {"model": "embed", "messages": []}),
    ]
    batch = run_batch(gateway.client, lines, "/v1/embeddings")
    assert batch.status == "failed"
    assert [error.line for error in batch.errors.data] == [2, 3]
    assert batch.output_file_id is None


def test_a_cancelled_batch_stops_and_cancels_what_it_had_sent(gateway: Gateway) -> None:
    """``held`` has room for one request and nobody serves it: the job sends one line and
    waits; cancelled, it sends no more, cancels the one it sent (an error line, cancelled)
    and ends cancelled."""
    keys = Keys(gateway.env["BATCHFLEET_KEY_PREFIX"])
    lines = [
        batch_line(f"h{n}", "/v1/embeddings", {"model": "held", "input": f"{n}"}) for n in range(3)
    ]
    client = gateway.client
    uploaded = client.files.create(file=("in.jsonl", "\n".join(lines).encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    with redis.Redis.from_url(gateway.env["BATCHFLEET_REDIS_URL"]) as redis_client:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while redis_client.xlen(keys.stream("held")) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # polls for the job's first request, the event to cancel after
    assert client.batches.cancel(batch.id).status == "cancelling"
    ended = wait_for_batch(client, batch.id, ENDED)
    assert ended.status == "cancelled"
    assert ended.request_counts.completed == 0
    (error,) = lines_of(client, ended.error_file_id)
    assert error["custom_id"] == "h0" and error["error"]["code"] == "cancelled"


def test_an_upload_over_the_file_cap_is_refused(gateway: Gateway) -> None:
    with pytest.raises(openai.APIStatusError) as refused:
        gateway.client.files.create(
            file=("big.jsonl", b"x" * (MAX_FILE_BYTES + 1)), purpose="batch"
        )
    assert refused.value.status_code == 413


def test_uploads_are_listed_newest_first_page_by_page(gateway: Gateway) -> None:
    """The official client's listing, one file a page (it follows ``after``): each upload
    once, the newest first; a purpose no file has lists nothing; a cursor that names no file
    is refused; deleted files leave."""
    client = gateway.client
    uploaded = [
        client.files.create(file=(f"in-{n}.jsonl", b"{}"), purpose="batch").id for n in range(3)
    ]
    listed = [file.id for file in client.files.list(purpose="batch", limit=1)]
    assert [file_id for file_id in listed if file_id in uploaded] == uploaded[::-1]
    oldest_first = [file.id for file in client.files.list(order="asc")]
    assert [file_id for file_id in oldest_first if file_id in uploaded] == uploaded
    assert not client.files.list(purpose="fine-tune").data
    with pytest.raises(openai.BadRequestError):
        client.files.list(after="file-" + "0" * 32)  # a cursor that names no file
    for file_id in uploaded:
        client.files.delete(file_id)
    assert not set(uploaded) & {file.id for file in client.files.list()}


def test_unknown_files_and_batches_are_404(gateway: Gateway) -> None:
    client = gateway.client
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-" + "0" * 32)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("../../etc/passwd")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")


RESUMED_LINES = 20_000


def test_a_job_whose_gateway_dies_is_resumed_by_another_and_answered_once(
    make_fleet: Callable[..., LocalFleet], tmp_path: Path
) -> None:
    """Gateway A runs a job and is killed (SIGKILL) halfway; gateway B, sharing its Redis and
    files folder, takes the job over when A's lease runs out and finishes it: every line
    answered exactly once in the output, nothing in the error file."""
    fleet = make_fleet(BATCHFLEET_MODELS=json.dumps({"embed": EMBED_POLICY}))
    fleet.start("batcher")
    fleet.start("worker", "--cpu")
    with producer_for(fleet) as producer:
        wait_ready(producer, fleet, "embed", warmup="warm")
    gateway_env = {
        "BATCHFLEET_GATEWAY__API_KEYS": API_KEY,
        "BATCHFLEET_GATEWAY__FILES_DIR": str(tmp_path),
        "BATCHFLEET_GATEWAY__BATCH_LEASE_S": "2",
    }
    first, second = make_fleet(**gateway_env), make_fleet(**gateway_env)
    lines = [
        batch_line(f"r{n}", "/v1/embeddings", {"model": "embed", "input": f"text {n}"})
        for n in range(RESUMED_LINES)
    ]
    with openai.OpenAI(base_url=f"{start_gateway(first)}/v1", api_key=API_KEY) as client:
        uploaded = client.files.create(
            file=("in.jsonl", "\n".join(lines).encode()), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while client.batches.retrieve(batch.id).request_counts.completed == 0:
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.05)  # polls for the job's first answers, the event to kill it after
    first.stop(first.processes[0], signal.SIGKILL)
    with openai.OpenAI(base_url=f"{start_gateway(second)}/v1", api_key=API_KEY) as client:
        assert client.batches.retrieve(batch.id).status == "in_progress"
        ended = wait_for_batch(client, batch.id, ENDED, timeout_s=300)
        assert ended.status == "completed", ended
        answers = lines_of(client, ended.output_file_id)
    assert len(answers) == RESUMED_LINES
    assert {answer["custom_id"] for answer in answers} == {f"r{n}" for n in range(RESUMED_LINES)}
    assert ended.error_file_id is None
    assert ended.request_counts.completed == RESUMED_LINES


# How a job whose gateway is down is ended: the line errors the next gateway writes.
ENDED_WHILE_DOWN = {
    "cancelled": {"h0": "cancelled"},
    "expired": {"h0": "cancelled", "h1": "batch_expired", "h2": "batch_expired"},
}


@pytest.mark.parametrize("ending", sorted(ENDED_WHILE_DOWN))
def test_a_batch_ended_while_no_gateway_runs_it_ends_what_was_sent(
    make_fleet: Callable[..., LocalFleet], tmp_path: Path, ending: str
) -> None:
    """Gateway A runs a job whose model nobody serves (one request queued, the rest waiting
    for room) and is killed; while no gateway runs it, the job is cancelled, or its 24 h
    window ends (its ``expires_at`` set to now, as the clock would). Gateway B takes it
    over when A's lease runs out and ends it: the request A had sent is cancelled (a
    ``cancelled`` error line). Cancelled, the job ends ``cancelled`` and the lines never sent
    stay unwritten; expired, it ends ``expired`` and each line never sent gets a
    ``batch_expired`` error line, as OpenAI's do."""
    gateway_env = {
        "BATCHFLEET_MODELS": json.dumps({"held": IDLE_POLICY}),
        "BATCHFLEET_GATEWAY__API_KEYS": API_KEY,
        "BATCHFLEET_GATEWAY__FILES_DIR": str(tmp_path),
        "BATCHFLEET_GATEWAY__BATCH_LEASE_S": "2",
    }
    first, second = make_fleet(**gateway_env), make_fleet(**gateway_env)
    keys = Keys(first.env["BATCHFLEET_KEY_PREFIX"])
    lines = [
        batch_line(f"h{n}", "/v1/embeddings", {"model": "held", "input": f"{n}"}) for n in range(3)
    ]
    with (
        redis.Redis.from_url(first.env["BATCHFLEET_REDIS_URL"]) as redis_client,
        openai.OpenAI(base_url=f"{start_gateway(first)}/v1", api_key=API_KEY) as client,
    ):
        uploaded = client.files.create(
            file=("in.jsonl", "\n".join(lines).encode()), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while redis_client.xlen(keys.stream("held")) < 1:
            assert time.monotonic() < deadline, "the job sent nothing"
            time.sleep(0.05)  # polls for the job's first request, the event to kill after
        first.stop(first.processes[0], signal.SIGKILL)
        if ending == "cancelled":  # what a gateway's cancel route does, with no gateway up
            assert BatchStore(redis_client, keys, lease_s=2).cancel(batch.id)
        else:
            redis_client.hset(keys.gateway_batch(batch.id), "expires_at", int(time.time()))
    with openai.OpenAI(base_url=f"{start_gateway(second)}/v1", api_key=API_KEY) as client:
        ended = wait_for_batch(client, batch.id, ENDED)
        assert ended.status == ending, f"{ended}\n{second.logs()}"
        errors = lines_of(client, ended.error_file_id)
        assert {error["custom_id"]: error["error"]["code"] for error in errors} == (
            ENDED_WHILE_DOWN[ending]
        )
        assert ended.request_counts.failed == len(ENDED_WHILE_DOWN[ending])
        assert ended.request_counts.completed == 0
        assert lines_of(client, ended.output_file_id) == []
        assert (ended.expired_at is not None) == (ending == "expired")
