"""The ``openai`` backend: forwards each micro-batch to an OpenAI-compatible server (vLLM, TGI,
llama.cpp's server, a hosted API) over httpx.

``/v1/embeddings`` takes the whole batch in one call. ``/v1/chat/completions`` and
``/v1/completions`` take one call per input, fanned out over a bounded pool of keep-alive
connections (``max_concurrency``). 429s, 5xx answers, timeouts and connection errors are
retried with exponential backoff and jitter, honouring ``Retry-After``; every call and retry of
a batch shares one deadline, ``budget_s`` after the batch starts (keep it below the worker's
soft time limit, or the watchdog ends the worker). An input that still fails gets its own
``ItemError``; the rest of its batch succeeds. ``stream(item)`` streams one chat or
completions generation, for the streaming lane (``producer.stream``). The API key is read
from the environment variable named by ``api_key_env`` and sent only in the
``Authorization`` header: it is in no option, and is masked in any upstream text that ends up
in an error.
"""

from __future__ import annotations

import functools
import json
import os
import random
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from config.errors import ConfigError
from workers.models.base import ItemError

PATHS = {
    "embeddings": "/v1/embeddings",
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
}
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 60.0


class OpenAIModel:
    """One OpenAI-compatible endpoint, as a batched model."""

    def __init__(
        self,
        base_url: str,
        model: str,
        endpoint: str = "embeddings",
        api_key_env: str = "OPENAI_API_KEY",
        max_concurrency: int | str = 8,
        timeout_s: float | str = 30.0,
        max_retries: int | str = 4,
        backoff_s: float | str = 0.5,
        max_backoff_s: float | str = 10.0,
        budget_s: float | str = 8.0,
    ) -> None:
        if endpoint not in PATHS:
            raise ValueError(f"endpoint must be one of {sorted(PATHS)}, got {endpoint!r}")
        self.base_url = base_url
        self.model = model
        self.endpoint = endpoint
        self.api_key_env = api_key_env
        self.max_concurrency = int(max_concurrency)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.budget_s = float(budget_s)
        if self.max_concurrency < 1 or self.max_retries < 0 or self.budget_s <= 0:
            raise ValueError("max_concurrency >= 1, max_retries >= 0 and budget_s > 0")
        self.version = f"openai:{endpoint}:{model}"
        self._client: httpx.Client | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._key = ""

    def setup(self, device: str) -> None:
        """Opens the connection pool (``device`` is the upstream's business)."""
        key = os.environ.get(self.api_key_env, "")
        self._key = key
        self._client = httpx.Client(
            base_url=self.base_url,
            timeout=self.timeout_s,
            limits=httpx.Limits(
                max_connections=self.max_concurrency,
                max_keepalive_connections=self.max_concurrency,
            ),
            headers={"Authorization": f"Bearer {key}"} if key else {},
        )
        self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="openai")

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            raise ConfigError("OpenAIModel used before setup()")
        return self._client

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        deadline = time.monotonic() + self.budget_s
        if self.endpoint == "embeddings":
            return self._embed(batch, deadline)
        if self._pool is None:
            raise ConfigError("OpenAIModel used before setup()")
        return list(self._pool.map(functools.partial(self._complete, deadline=deadline), batch))

    def _embed(self, batch: Sequence[Any], deadline: float) -> list[Any]:
        """One call for every text of the batch; an answer missing for an input is an error for
        that input, never another input's vector."""
        outputs: list[Any] = [
            None
            if isinstance(item, str) and item
            else ItemError("input must be a non-empty string", "invalid_input")
            for item in batch
        ]
        texts = [index for index, output in enumerate(outputs) if output is None]
        if not texts:
            return outputs
        answer = self._post({"model": self.model, "input": [batch[i] for i in texts]}, deadline)
        vectors: dict[int, Any] = {}
        if isinstance(answer, dict):
            for row in answer.get("data") or []:
                if isinstance(row, dict) and isinstance(row.get("index"), int):
                    vectors[row["index"]] = row.get("embedding")
        for position, index in enumerate(texts):
            if isinstance(answer, ItemError):
                outputs[index] = answer
            elif isinstance(vectors.get(position), list):
                outputs[index] = vectors[position]
            else:
                outputs[index] = ItemError("the upstream returned no embedding for this input")
        return outputs

    def _body(self, item: Any) -> dict[str, Any] | ItemError:
        """The request body of one prompt (a string, or an object of request fields)."""
        if isinstance(item, str) and item:
            field = {"chat": "messages", "completions": "prompt"}[self.endpoint]
            value: Any = [{"role": "user", "content": item}] if field == "messages" else item
            return {"model": self.model, field: value}
        if isinstance(item, dict) and item:
            return {"model": self.model, **item}
        return ItemError(
            "input must be a non-empty string or an object of request fields", "invalid_input"
        )

    def _complete(self, item: Any, deadline: float) -> Any:
        """One call for one prompt."""
        body = self._body(item)
        if isinstance(body, ItemError):
            return body
        answer = self._post(body, deadline)
        if isinstance(answer, ItemError):
            return answer
        try:
            choice = answer["choices"][0]
            text = choice["message"]["content"] if self.endpoint == "chat" else choice["text"]
        except (KeyError, IndexError, TypeError):
            return ItemError("the upstream's answer has no choices[0] text")
        return {
            "text": text,
            "finish_reason": choice.get("finish_reason"),
            "usage": answer.get("usage"),
        }

    def stream(self, item: Any) -> Iterator[dict[str, Any]]:
        """One generation (chat or completions) streamed: yields ``{"delta": text}`` as the
        upstream produces it, then ``{"finish_reason", "usage"}``. Closing the iterator closes
        the upstream call. A stream is not retried: text already sent cannot be taken back.

        Raises:
            ValueError: the input is no prompt, or this endpoint does not generate text.
            RuntimeError: the upstream refused or broke the stream (its text masked).
        """
        if self.endpoint == "embeddings":
            raise ValueError("embeddings do not stream")
        body = self._body(item)
        if isinstance(body, ItemError):
            raise ValueError(body.message)
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        finish_reason, usage = None, None
        with self.client.stream("POST", PATHS[self.endpoint], json=body) as response:
            if response.status_code >= 400:
                response.read()
                raise RuntimeError(
                    f"HTTP {response.status_code}: {self._masked(response.text[:200])}"
                )
            for line in response.iter_lines():
                data = line.removeprefix("data:").strip()
                if not line.startswith("data:") or not data:
                    continue
                if data == "[DONE]":
                    break
                try:
                    event = json.loads(data)
                except ValueError as exc:
                    raise RuntimeError(f"the upstream's stream is not JSON: {data[:80]!r}") from exc
                usage = event.get("usage") or usage
                for choice in event.get("choices") or []:
                    delta = (choice.get("delta") or {}).get("content") or choice.get("text")
                    if delta:
                        yield {"delta": delta}
                    finish_reason = choice.get("finish_reason") or finish_reason
        yield {"finish_reason": finish_reason, "usage": usage}

    def _post(self, body: dict[str, Any], deadline: float) -> dict[str, Any] | ItemError:
        """POSTs ``body``, retrying what may pass until ``deadline``; the JSON object
        answered, or why not."""
        failure = "the batch's budget_s was spent before it was sent"
        for attempt in range(self.max_retries + 1):
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                break
            retry_after: float | None = None
            try:
                response = self.client.post(
                    PATHS[self.endpoint], json=body, timeout=min(self.timeout_s, left_s)
                )
            except httpx.TransportError as exc:
                failure = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code in RETRY_STATUSES:
                    failure = f"HTTP {response.status_code}"
                    retry_after = _retry_after_s(response)
                elif response.status_code in (401, 403):
                    return ItemError(f"HTTP {response.status_code}: the upstream refused the key")
                elif response.status_code >= 400:
                    text = self._masked(response.text[:200])
                    return ItemError(f"HTTP {response.status_code}: {text}")
                else:
                    answer = _json_object(response)
                    if isinstance(answer, ItemError):
                        return ItemError(self._masked(answer.message))
                    return answer
            delay = retry_after if retry_after is not None else self._backoff_s(attempt)
            if attempt == self.max_retries or time.monotonic() + delay >= deadline:
                return ItemError(f"upstream failed after {attempt + 1} attempt(s): {failure}")
            time.sleep(delay)
        return ItemError(f"upstream failed: {failure}")

    def _masked(self, text: str) -> str:
        """``text`` with the API key, should an upstream echo it, replaced by ``***``."""
        return text.replace(self._key, "***") if self._key else text

    def _backoff_s(self, attempt: int) -> float:
        """Exponential backoff with full jitter."""
        return random.uniform(0, min(self.max_backoff_s, self.backoff_s * 2**attempt))


def _retry_after_s(response: httpx.Response) -> float | None:
    """The server's ``Retry-After`` in seconds (only the delta-seconds form), capped."""
    try:
        return min(MAX_RETRY_AFTER_S, max(0.0, float(response.headers["retry-after"])))
    except (KeyError, ValueError):
        return None


def _json_object(response: httpx.Response) -> dict[str, Any] | ItemError:
    try:
        answer = response.json()
    except ValueError:
        return ItemError(f"the upstream's answer is not JSON: {response.text[:80]!r}")
    if not isinstance(answer, dict):
        return ItemError("the upstream's answer is not a JSON object")
    return answer
