"""The wire format: versioned JSON in, typed errors out."""

import json

import pytest

from config.errors import InvalidInput, ModelError, RequestExpired, WireFormatError
from config.schema import (
    ErrorInfo,
    Request,
    RequestEncoder,
    Result,
    ResultEncoder,
    cache_entry,
    canonical_json,
    input_digest,
    output_json,
)


def make_request(**overrides: object) -> Request:
    fields: dict[str, object] = dict(
        request_id="r1",
        model="m",
        input={"b": 1, "a": [1, 2]},
        digest="d",
        submitted_at=1.0,
        deadline_at=2.0,
    )
    fields.update(overrides)
    return Request(**fields)  # type: ignore[arg-type]


def test_request_round_trips_as_versioned_json() -> None:
    """A request decodes to what was encoded, and says its schema version on the wire."""
    request = make_request()
    wire = request.encode()
    assert json.loads(wire)["schema_version"] == 1
    assert Request.decode(wire) == request


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "{}",
        json.dumps({**json.loads(make_request().encode()), "schema_version": 2}),
        json.dumps({**json.loads(make_request().encode()), "extra": 1}),
    ],
)
def test_malformed_request_raises_wire_format_error(raw: str) -> None:
    """Garbage, missing fields, another version or unknown fields are refused with the raw text."""
    with pytest.raises(WireFormatError) as caught:
        Request.decode(raw)
    assert caught.value.raw == raw


def test_canonical_json_sorts_keys_and_refuses_what_json_cannot_carry() -> None:
    """Key order does not change the digest; sets, bytes and NaN are invalid input."""
    assert canonical_json({"b": 1, "a": 2}) == '{"a":2,"b":1}'
    assert input_digest("m", canonical_json({"b": 1, "a": 2})) == input_digest(
        "m", canonical_json({"a": 2, "b": 1})
    )
    assert input_digest("m", "1") != input_digest("n", "1")
    for bad in ({1, 2}, b"bytes", float("nan"), object()):
        with pytest.raises(InvalidInput):
            canonical_json(bad)


class Score(float):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {"b": [1, 2.5, -3e-7, 1e16, 10**30], "a": {"z": None, "y": True}},
        {1: "one", 2: ("a", "b")},
        'é ☃ \u2028 \\ " \n',
        [Score(0.5), {"x": Score(1.25)}],
        12345678901234567890,
        [[[[]]], {}],
    ],
)
def test_canonical_json_is_what_json_writes(value: object) -> None:
    """The digest of a resubmitted input matches across producer versions: the encoding is
    ``json``'s own for these settings."""
    assert canonical_json(value) == json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    assert output_json(value) == json.dumps(
        value, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def test_a_value_that_contains_itself_is_invalid_input() -> None:
    looped: list[object] = [1]
    looped.append(looped)
    for encode in (canonical_json, output_json):
        with pytest.raises(InvalidInput):
            encode(looped)


@pytest.mark.parametrize(
    "value",
    [
        [0.25, -1.5, 3e-7],
        [],
        [1e308, 1e308],  # finite numbers whose sum is not: checked the long way, still JSON
        [1, 2.0],
        {"label": "cat", "score": 0.9},
        [float("nan"), 1.0],
        [1.0, float("inf")],
        [1.0, {2.0}],
        {1, 2},
        [b"bytes"],
        [True, 1.0],
        "\ud800",
    ],
)
def test_an_output_is_encoded_as_canonical_json_checks_it(value: object) -> None:
    """A model output is accepted and refused as ``canonical_json`` accepts and refuses it
    (a flat list of floats goes through pydantic's serializer), and means the same JSON."""
    try:
        canonical = canonical_json(value)
    except InvalidInput:
        with pytest.raises(InvalidInput):
            output_json(value)
    else:
        assert json.loads(output_json(value)) == json.loads(canonical)


def test_an_output_keeps_its_own_key_order() -> None:
    """Only a digest needs sorted keys: an answer carries the output as the model made it."""
    assert output_json({"label": "cat", "score": 0.5}) == '{"label":"cat","score":0.5}'
    assert output_json({"score": 0.5, "label": "cat"}) == '{"score":0.5,"label":"cat"}'


def test_result_unwrap_raises_the_error_for_its_code() -> None:
    """An error result raises the exception class of its code, carrying the request id."""
    ok = Result(request_id="r", model="m", output=[1], finished_at=1.0)
    assert ok.ok and ok.unwrap() == [1]
    expired = Result(
        request_id="r", model="m", finished_at=1.0, error=ErrorInfo(code="expired", message="late")
    )
    with pytest.raises(RequestExpired) as caught:
        expired.unwrap()
    assert caught.value.request_id == "r"
    failed = Result(
        request_id="r",
        model="m",
        finished_at=1.0,
        error=ErrorInfo(code="model_error", message="boom"),
    )
    with pytest.raises(ModelError, match="boom"):
        failed.unwrap()
    assert Result.decode(failed.encode()) == failed


def test_fast_request_encoding_decodes_to_the_same_request() -> None:
    """The producer's hand-built wire form is exactly a Request, ids and floats intact."""
    requests = RequestEncoder("model/1", 1796045473.123456, 1796045533.987654)
    wire = requests.encode('id "quoted" é', canonical_json({"b": [1.5, None], "a": "é"}), "d" * 64)
    request = Request.decode(wire)
    assert request == Request(
        request_id='id "quoted" é',
        model="model/1",
        input={"a": "é", "b": [1.5, None]},
        digest="d" * 64,
        submitted_at=1796045473.123456,
        deadline_at=1796045533.987654,
    )
    assert json.loads(wire) == json.loads(request.encode())


def test_fast_result_encoding_decodes_to_the_same_result() -> None:
    """The worker's hand-built wire form is exactly a Result, strings and floats intact."""
    request = make_request(request_id='id "quoted" é', model="model/1", submitted_at=1796045473.25)
    output = {"z": [0.1, 1e-07], "a": "é \u2028"}
    results = ResultEncoder(
        "model/1",
        model_version='v"2',
        batch_id="b-1",
        batch_size=32,
        model_s=0.00264,
        worker="w0@host",
        finished_at=1796045473.987654,
    )
    wire = results.encode(request, output_json(output), flush_reason=None)
    result = Result.decode(wire)
    assert result == Result(
        request_id='id "quoted" é',
        model="model/1",
        model_version='v"2',
        output=output,
        batch_id="b-1",
        batch_size=32,
        model_s=0.00264,
        worker="w0@host",
        submitted_at=1796045473.25,
        finished_at=1796045473.987654,
    )
    assert json.loads(wire) == json.loads(result.encode())
    # A second result of the same call: its own id, submit time, output and flush reason.
    other = make_request(request_id="id-2", model="model/1", submitted_at=1796045470.5)
    late = Result.decode(results.encode(other, output_json([1, "x"]), flush_reason="late"))
    assert late == result.model_copy(
        update={
            "request_id": "id-2",
            "output": [1, "x"],
            "flush_reason": "late",
            "submitted_at": 1796045470.5,
        }
    )


def test_a_cache_entry_tags_its_output_with_the_versions_byte_length_and_the_version() -> None:
    """The tag is unambiguous whatever the version holds (colons, non-ASCII)."""
    assert cache_entry("v1", '{"a":1}') == '2:v1{"a":1}'
    assert cache_entry("é:2", "[]") == "4:é:2[]"


def test_values_decoded_together_are_those_decoded_one_by_one() -> None:
    """Requests and results decoded in one call equal each decoded alone, from bytes or text."""
    requests = [make_request(request_id=f"r{n}", input=[n, {"x": "é"}]) for n in range(3)]
    results = [Result(request_id=f"r{n}", model="m", output=n, finished_at=1.0) for n in range(3)]
    for model, values in ((Request, requests), (Result, results)):
        texts = [value.encode() for value in values]
        assert model.decode_all(texts) == values
        assert model.decode_all([text.encode() for text in texts]) == values
        assert model.decode_all([]) == []


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        json.dumps({**json.loads(make_request().encode()), "extra": 1}),
        f"{make_request().encode()},{make_request().encode()}",  # two requests in one raw
        b"{}",  # bytes among text
        "",
    ],
)
def test_one_bad_value_makes_the_decode_together_give_up(bad: str | bytes) -> None:
    """With one raw that is no request, or that holds two, nothing is decoded together (each
    is then decoded alone, to say which and why)."""
    good = make_request().encode()
    assert Request.decode_all([good, bad, good]) is None
