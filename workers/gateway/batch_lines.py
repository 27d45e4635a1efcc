"""A Batch API job's lines: the input file checked before the job runs (every line a POST
to the job's endpoint for the job's model), and the answer and error lines written in
OpenAI's batch output format.

An answer line: ``{"id", "custom_id", "response": {"status_code": 200, "request_id",
"body"}, "error": null}``, the body as the endpoint answers a call. An error line:
``{"id", "custom_id", "response": null, "error": {"code", "message"}, "line"}``: ``line`` is
the input line's number, which a resumed job reads to skip what was reported.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from config.schema import Result
from workers.gateway.completions import CHAT, TEXT, Kind, completion_body
from workers.gateway.embeddings import embeddings_body
from workers.gateway.openai_errors import ApiError
from workers.tools.bulk_files import Line

EMBEDDINGS = "/v1/embeddings"
KINDS: dict[str, Kind | None] = {
    EMBEDDINGS: None,
    "/v1/chat/completions": CHAT,
    "/v1/completions": TEXT,
}
# A job whose input has problems fails listing this many of them.
MAX_PROBLEMS = 100


def model_of(path: Path) -> str:
    """The model the input file's first request names (``body.model``).

    Raises:
        ApiError: 400, no line names a model.
    """
    with path.open(encoding="utf-8") as lines:
        for text in lines:
            if not text.strip():
                continue
            try:
                model = json.loads(text)["body"]["model"]
            except (ValueError, KeyError, TypeError):
                break
            if isinstance(model, str) and model:
                return model
            break
    message = "the input file's first line is no request with a body.model"
    raise ApiError(400, message, "invalid_input_file", "input_file_id")


def _problem(record: Any, endpoint: str, model: str) -> str | None:
    if not isinstance(record, dict):
        return "not a JSON object"
    body = record.get("body")
    if record.get("method") != "POST" or record.get("url") != endpoint:
        line_call = f"{record.get('method')} {record.get('url')}"
        return f"the batch runs POST {endpoint}; this line is {line_call}"
    if not isinstance(body, dict) or body.get("model") != model:
        return f"the batch runs model {model!r}; this line's body names another"
    if endpoint == EMBEDDINGS and not (isinstance(body.get("input"), str) and body["input"]):
        return "a line of an embeddings batch has one non-empty text as its input"
    return None


def check_input(path: Path, endpoint: str, model: str) -> tuple[int, list[dict[str, Any]]]:
    """The input file's requests (its non-blank lines), and its problems as OpenAI lists a
    batch's errors (``code``, ``message``, ``line``), at most ``MAX_PROBLEMS``."""
    total, problems = 0, list[dict[str, Any]]()
    with path.open(encoding="utf-8") as lines:
        for number, text in enumerate(lines, start=1):
            if not text.strip():
                continue
            total += 1
            try:
                problem = _problem(json.loads(text), endpoint, model)
            except json.JSONDecodeError as exc:
                problem = f"not JSON: {exc.msg}"
            if problem is not None and len(problems) < MAX_PROBLEMS:
                problems.append({"code": "invalid_request", "message": problem, "line": number})
    return total, problems


class OpenAILines:
    """Answer and error lines in OpenAI's batch output format (see the module's docstring)."""

    def __init__(self, endpoint: str, model: str) -> None:
        self.endpoint = endpoint
        self.model = model

    def answer(self, line: Line, result: Result) -> dict[str, Any]:
        kind = KINDS[self.endpoint]
        request_id = result.request_id
        if kind is None:
            body = embeddings_body(self.model, [result.output], "float", 0)
        else:
            body = completion_body(kind, request_id, self.model, result.output)
        return {
            "id": f"batch_req_{request_id}",
            "custom_id": line.custom_id,
            "response": {"status_code": 200, "request_id": request_id, "body": body},
            "error": None,
        }

    def error(self, custom_id: str | None, number: int, code: str, message: str) -> dict[str, Any]:
        return {
            "id": f"batch_req_{uuid.uuid4().hex}",
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
            "line": number,
        }
