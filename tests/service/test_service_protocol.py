"""Wire protocol: parsing, refusal codes, encoding, result alignment, tokens."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saucer.dispatch.messages import Command, Result, ResultStatus
from saucer.service.auth import TokenAuthenticator, TokenConfigError, default_principal, parse_tokens, service_tokens
from saucer.service.protocol import (
    PROTOCOL_VERSION,
    CancelFrame,
    CommandFrame,
    CommandResultsFrame,
    ErrorCode,
    HeartbeatFrame,
    ProtocolError,
    RegisterFrame,
    TaskEndFrame,
    TaskFrame,
    TaskSpec,
    align_results,
    encode_frame,
    parse_frame,
)


def _refused(raw: str | bytes, **kwargs: object) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_frame(raw, **kwargs)  # type: ignore[arg-type]
    return info.value


def test_every_frame_type_round_trips() -> None:
    command = Command(tool_name="shell.run", parameters={"cmd": "ls", "none": None})
    frames = [
        RegisterFrame(client_id="dev-1", info={"os": "linux"}, inflight=["r1"]),
        HeartbeatFrame(sent_at=1.5),
        TaskFrame(task=TaskSpec(task="do it", steps=[]), target_device_id="dev-1", request_id="q"),
        CommandFrame(response_id="r", session_id="s", commands=[command], timeout=3),
        CancelFrame(response_id="r", session_id="s", reason="cancelled by its owner"),
        CommandResultsFrame(
            prev_response_id="r", session_id="s", results=[Result(status=ResultStatus.SUCCESS, call_id="c")]
        ),
        TaskEndFrame(session_id="s", status="completed", results=[{"a": 1}]),
    ]
    for frame in frames:
        text = encode_frame(frame)
        assert parse_frame(text) == frame
        assert parse_frame(text.encode()) == frame


def test_null_fields_are_not_sent_but_null_parameters_are_kept() -> None:
    frame = CommandResultsFrame(
        prev_response_id="r",
        session_id="s",
        results=[Result(status=ResultStatus.SUCCESS, result={"k": None}, call_id="c")],
    )
    data = orjson.loads(encode_frame(frame))
    assert data["protocol_version"] == PROTOCOL_VERSION
    assert data["results"][0] == {"status": "success", "result": {"k": None}, "call_id": "c"}


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("{not json", ErrorCode.MALFORMED_JSON),
        ("[1, 2]", ErrorCode.NOT_AN_OBJECT),
        ('{"client_id": "x"}', ErrorCode.MISSING_TYPE),
        ('{"type": "launch_missiles"}', ErrorCode.UNKNOWN_TYPE),
        ('{"type": 7}', ErrorCode.UNKNOWN_TYPE),
        ('{"type": "heartbeat", "protocol_version": 99}', ErrorCode.UNSUPPORTED_VERSION),
        ('{"type": "heartbeat", "surprise": 1}', ErrorCode.INVALID_FRAME),
        ('{"type": "register", "client_id": "has space"}', ErrorCode.INVALID_FRAME),
    ],
)
def test_bad_frames_are_refused_with_a_code(raw: str, code: str) -> None:
    assert _refused(raw).code == code


def test_invalid_field_is_named_with_its_path_and_ref() -> None:
    raw = orjson.dumps(
        {"type": "command", "response_id": "r9", "session_id": "s", "commands": [{"tool_name": ""}], "timeout": 1}
    )
    error = _refused(raw)
    assert error.code == ErrorCode.INVALID_FRAME
    assert "commands.0.tool_name" in error.message
    assert error.ref == "r9"  # the peer can fail exactly that batch


def test_oversized_frame_is_refused_before_parsing() -> None:
    raw = '{"type": "heartbeat", "pad": "' + "x" * 2000 + '"}'
    error = _refused(raw, max_bytes=1024)
    assert error.code == ErrorCode.FRAME_TOO_LARGE
    assert "1024" in error.message
    # Multi-byte characters count as the bytes they occupy on the wire.
    assert _refused('{"type":"heartbeat","x":"' + "é" * 600 + '"}', max_bytes=1024).code == ErrorCode.FRAME_TOO_LARGE


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(params=st.dictionaries(st.text(max_size=10), _json, max_size=5), tool=st.text(min_size=1, max_size=30))
def test_command_frames_round_trip_any_json_parameters(params: dict, tool: str) -> None:
    frame = CommandFrame(
        response_id="r", session_id="s", commands=[Command(tool_name=tool, parameters=params)], timeout=1.0
    )
    assert parse_frame(encode_frame(frame)) == frame


def test_align_results_matches_by_call_id_and_fills_gaps() -> None:
    commands = [Command(tool_name="t", call_id=f"c{i}") for i in range(3)]
    ok = lambda cid: Result(status=ResultStatus.SUCCESS, result=cid, call_id=cid)  # noqa: E731
    aligned, problems = align_results(commands, [ok("c2"), ok("c0")], source="dev")
    assert [r.call_id for r in aligned] == ["c0", "c1", "c2"]
    assert [r.status for r in aligned] == [ResultStatus.SUCCESS, ResultStatus.FAILURE, ResultStatus.SUCCESS]
    assert "dev returned no result" in (aligned[1].error or "")
    assert problems and "2 results for 3 commands" in problems[0]

    anonymous = [Result(status=ResultStatus.SUCCESS, result=i) for i in range(3)]
    aligned, problems = align_results(commands, anonymous, source="dev")
    assert [(r.call_id, r.result) for r in aligned] == [("c0", 0), ("c1", 1), ("c2", 2)]
    assert problems == []

    aligned, problems = align_results(commands[:1], [ok("c0"), ok("zz")], source="dev")
    assert [r.call_id for r in aligned] == ["c0"]
    assert any("zz" in p for p in problems)


def test_tokens_parse_and_authenticate() -> None:
    tokens = parse_tokens(" alice = a-very-long-token-1 , b-very-long-token-2 ")
    assert tokens["alice"] == "a-very-long-token-1"
    assert tokens[default_principal("b-very-long-token-2")] == "b-very-long-token-2"
    authenticator = TokenAuthenticator(tokens)
    assert authenticator.from_header("Bearer a-very-long-token-1") == "alice"
    assert authenticator.from_header("bearer b-very-long-token-2") == default_principal("b-very-long-token-2")
    for bad in (None, "", "Bearer", "Bearer nope", "Basic a-very-long-token-1", "a-very-long-token-1"):
        assert authenticator.from_header(bad) is None
    with pytest.raises(TokenConfigError, match="at least one token"):
        TokenAuthenticator({})
    with pytest.raises(TokenConfigError, match="shorter than"):
        TokenAuthenticator({"x": "short"})
    with pytest.raises(TokenConfigError, match="twice"):
        parse_tokens("a=xxxxxxxxxxxxxxxxxxxx,a=yyyyyyyyyyyyyyyyyyyy")


def test_configured_tokens_take_names_and_the_environment_adds_to_them() -> None:
    padded = "dG9rZW4tdGhhdC1lbmRzLWluLXBhZGRpbmc="  # a bare base64 token: its '=' is not a name separator
    tokens = service_tokens(
        ["alice=alice-token-000000000000", padded, " bob = bob-token-1111111111111111 "],
        {"SAUCER_SERVICE_TOKENS": "bob=bob-new-token-22222222222,fleet=fleet-token-3333333333333"},
    )
    assert tokens == {
        "alice": "alice-token-000000000000",
        default_principal(padded): padded,
        "bob": "bob-new-token-22222222222",  # the environment wins
        "fleet": "fleet-token-3333333333333",
    }
    assert service_tokens([], {}) == {}
    with pytest.raises(TokenConfigError, match="names principal 'a' twice"):
        service_tokens(["a=xxxxxxxxxxxxxxxxxxxx", "a=yyyyyyyyyyyyyyyyyyyy"], {})
