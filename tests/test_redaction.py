"""saucer.redaction: one function that keeps secrets out of what is logged or stored, and where it is applied."""

from __future__ import annotations

import pytest

from saucer.context import Context, ContextNames
from saucer.redaction import REDACTED, redact, redact_text, register_secret
from saucer.store import open_store

TOKEN = "tok-" + "7f3a9c" * 4


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Authorization: Bearer abc.def-ghi_123", "Authorization: Bearer ***"),
        ('{"authorization": "Basic dXNlcjpwYXNzd29yZA=="}', '{"authorization": "Basic ***"}'),
        ("proxy-authorization=token xyz12345", "proxy-authorization=token ***"),
        ("curl -H 'Authorization: Bearer eyJhbGciOi.J9'", "curl -H 'Authorization: Bearer ***'"),
        ("sent bearer abcdefgh12345678", "sent bearer ***"),
        ("api_key=abcd1234&x=1", "api_key=***&x=1"),
        ('"x-api-key": "k-123456"', '"x-api-key": "***"'),
        ("key sk-proj-abcdefghijklmnop0123", "key sk-***"),
        (
            "prompt_tokens: 12, a token budget, the bearer of news",
            "prompt_tokens: 12, a token budget, the bearer of news",
        ),
    ],
)
def test_credentials_are_found_by_their_shape(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_registered_and_environment_secrets_are_replaced_as_whole_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    register_secret(TOKEN, None, "short")  # None and short values are ignored
    assert redact_text(f"echo {TOKEN}; x{TOKEN}y") == f"echo {REDACTED}; x{TOKEN}y"
    assert redact_text("short stays") == "short stays"
    monkeypatch.setenv("SAUCER_SERVICE_TOKENS", "ci=env-token-0123456789,bare-token-9876543210")
    register_secret()  # picks up the environment
    assert redact_text("a env-token-0123456789 b bare-token-9876543210") == f"a {REDACTED} b {REDACTED}"
    assert redact_text("1234567890123") == "1234567890123"


def test_structures_are_redacted_by_key_and_value_without_touching_the_input() -> None:
    register_secret(TOKEN)  # not left to the test above: under pytest-xdist it may run in another worker
    value = {
        "headers": {"Authorization": "anything", "Accept": "json"},
        "items": [f"t={TOKEN}", 3, None],
        "password": "p",
    }
    out = redact(value)
    assert out == {
        "headers": {"Authorization": REDACTED, "Accept": "json"},
        "items": [f"t={REDACTED}", 3, None],
        "password": REDACTED,
    }
    assert value["headers"]["Authorization"] == "anything" and value["items"][0] == f"t={TOKEN}"
    clean = {"a": ["b", {"c": 1}]}
    assert redact(clean) is clean  # nothing changed: nothing copied


def test_the_context_stores_what_it_shows_and_replays_it_the_same(tmp_path) -> None:
    register_secret(TOKEN)
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    ctx = Context.open(store, "s1")
    ctx.set(ContextNames.REQUEST, f"deploy with {TOKEN}")
    ctx.update_vars(set={"headers": {"authorization": f"Bearer {TOKEN}"}})
    ctx.commit(meta={"results": [{"stdout": f"token={TOKEN}"}]})
    live = ctx.to_dict()
    assert live["REQUEST"] == f"deploy with {REDACTED}"
    ctx.close()
    again = Context.open(store, "s1", create=False)
    assert again.to_dict() == live and again.vars["headers"] == {"authorization": f"Bearer {REDACTED}"}
    [event] = list(store.read("s1"))
    assert event.meta == {"results": [{"stdout": f"token={REDACTED}"}]}
    again.close()
    store.close()
    assert TOKEN.encode() not in (tmp_path / "s.db").read_bytes()


def test_service_records_are_stored_and_served_redacted() -> None:
    from saucer.dispatch.messages import Result, ResultStatus
    from saucer.service.protocol import TaskSpec
    from saucer.service.records import SessionRecord, StepRecord

    register_secret(TOKEN)
    step = StepRecord(index=0, status="completed", results=[Result(status=ResultStatus.SUCCESS, result=f"x {TOKEN}")])
    record = SessionRecord(session_id="s", owner="a", device_id="d", task=TaskSpec(task=f"use {TOKEN}"), error=TOKEN)
    assert TOKEN not in step.model_dump_json() and TOKEN not in str(step.model_dump(mode="json"))
    assert TOKEN not in record.model_dump_json()
    assert record.task.task == f"use {TOKEN}"  # the running session still has what it was given


def test_context_values_keep_what_only_looks_like_a_credential(tmp_path) -> None:
    # A Context value is the user's data: only saucer's own known secrets are
    # replaced there, never a guess by shape or by key name (nothing is dropped silently).
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    ctx = Context.open(store, "s1")
    looks_like = {"password": "hunter2-hunter2", "note": "api_key=abcd1234 and sk-" + "a" * 20}
    ctx.update_vars(set=looks_like)
    ctx.commit()
    assert dict(ctx.vars) == looks_like
    ctx.close()
    again = Context.open(store, "s1", create=False)
    assert dict(again.vars) == looks_like
    again.close()
    store.close()


def test_the_log_filter_takes_tokens_out_of_lines_and_urls() -> None:
    import logging

    from saucer.redaction import RedactingLogFilter, register_secret

    register_secret("known-secret-token-42")
    record = logging.LogRecord(
        "x",
        logging.DEBUG,
        __file__,
        1,
        "> GET %s HTTP/1.1 (%s)",
        ("/ws?token=anyone-s-token&x=1", "known-secret-token-42"),
        None,
    )
    assert RedactingLogFilter().filter(record) is True
    assert record.getMessage() == "> GET /ws?token=***&x=1 HTTP/1.1 (***)"
    plain = logging.LogRecord("x", logging.INFO, __file__, 1, "nothing %s", ("here",), None)
    RedactingLogFilter().filter(plain)
    assert (plain.msg, plain.args) == ("nothing %s", ("here",))  # untouched when there is nothing to hide


# ------------------------------------------------ the one-scan check of a value's JSON text

QUOTED = 'q"uoted\\secret-0123456789'  # a secret JSON escapes: it does not read the same in the JSON text

_WORDS = [
    "ok",
    "Bearer abcdefgh12345678",
    "api_key=abcd1234",
    "sk-proj-abcdefghijklmnop0123",
    TOKEN,
    f"x{TOKEN}y",
    "Authorization: Basic dXNlcjpw",
    "PASSWORD",
    "rapid",
    "Token",
    "é",
    "line\nbreak",
    "tab\t",
    'a "quote"',
]


def _json_values():
    from hypothesis import strategies as st

    keys = st.sampled_from(["a", "Authorization", "api_key", "X-API-KEY", "password", "Passwd", "note", "token"])
    leaves = st.one_of(st.sampled_from(_WORDS), st.text(max_size=12), st.integers(-5, 5), st.none(), st.booleans())
    return st.recursive(
        leaves,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
        max_leaves=12,
    )


def test_the_json_scan_misses_nothing_the_walk_would_replace() -> None:
    """redact() skips the walk of a value whose JSON text holds no secret nor hint: the result is
    always the walk's (every secret, every shape, every credential key name)."""
    from hypothesis import given, settings

    from saucer import redaction

    register_secret(TOKEN)

    @settings(max_examples=300, deadline=None)
    @given(_json_values())
    def check(value: object) -> None:
        assert redact(value) == redaction._walk(value, redact_text, True)
        assert redaction.redact_known(value) == redaction._walk(value, redaction.redact_known_text, False)

    check()


def test_every_credential_key_name_defeats_the_json_scan() -> None:
    from saucer import redaction

    for key in redaction._SECRET_KEYS:
        for shown in (key, key.upper(), key.title()):
            assert redact({"headers": [{shown: "plain-value"}]}) == {"headers": [{shown: REDACTED}]}, shown


def test_a_secret_that_json_escapes_is_still_found_inside_a_structure() -> None:
    register_secret(QUOTED)
    value = {"results": [{"stdout": f"got {QUOTED} back"}]}
    assert redact(value) == {"results": [{"stdout": f"got {REDACTED} back"}]}
    from saucer.redaction import redact_known

    assert redact_known(value) == {"results": [{"stdout": f"got {REDACTED} back"}]}


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_no_secret_set_in_a_step_or_carried_by_its_record_reaches_the_log(tmp_path, url: str) -> None:
    """A step's nested values and its record's meta become durable redacted on every backend: the
    meta is scanned once, on the JSON text the store encodes it to, and nothing kept aliases the caller's."""
    register_secret(TOKEN)
    store = open_store(f"sqlite:///{tmp_path / 's.db'}" if url == "sqlite" else url)
    ctx = Context.open(store, "s1")
    value = {"deep": [{"cmd": f"login --token {TOKEN}"}]}
    ctx.update_vars(set={"v": value})
    value["deep"].append(TOKEN)  # the caller's value, changed after the set: never the log's
    meta = {"results": [{"stdout": f"token={TOKEN}", "Authorization": "plain"}], "cursor": {"round": 0}}
    ctx.commit(meta=meta, step=1)
    meta["results"].append({"stdout": TOKEN})
    assert ctx.get_var("v") == {"deep": [{"cmd": f"login --token {REDACTED}"}]}
    [event] = list(store.read("s1"))
    assert event.ops == [{"op": "set", "var": "v", "value": {"deep": [{"cmd": f"login --token {REDACTED}"}]}}]
    assert event.meta == {
        "results": [{"stdout": f"token={REDACTED}", "Authorization": REDACTED}],
        "cursor": {"round": 0},
    }
    assert TOKEN not in repr(list(store.read("s1")))
    ctx.close()
    store.close()


def test_the_remembered_hintless_texts_miss_no_hint_nor_a_secret_registered_later() -> None:
    """The JSON scan judges hints on the text without digits and dots (no hint holds one) and
    remembers what held none: a meta seen clean step after step. Nothing a walk would replace
    is skipped for it: not a hint with digits or dots next to it, not a secret registered since."""
    import orjson

    from saucer import redaction

    hints = ("authoriz", "bearer", "api", "token", "secret", "sk-", "passw")
    for hint in hints:
        assert not set(hint.encode()) & set(redaction._NOT_IN_HINTS)
        assert redaction._may_hold_credential(hint) or hint == "passw"
    for step in range(3):  # the same meta but for its numbers: scanned once, remembered
        meta = {"step": step, "started_at": 1.5 + step, "agent": "noop", "note": "plain words"}
        assert redact(meta) is meta
        assert redaction._hintless(orjson.dumps(meta))
        assert b'{"step":0,"started_at":000,"agent":"noop","note":"plain words"}' in redaction._seen_hintless
    split = {"note": "to1ken a.pi 2sk-3 api9"}
    assert redact(split) == redaction._walk(split, redact_text, True)
    shaped = {"note": "api_key=abcd1234 then Bearer 0123456789.abc", "step": 7}
    assert redact(shaped) == {"note": f"api_key={REDACTED} then Bearer {REDACTED}", "step": 7}
    later = "zq81zq82zq83zq84"
    value = {"note": f"says {later}", "step": 1}
    assert redact(value) is value  # remembered as hintless...
    register_secret(later)
    assert redact(value) == {"note": f"says {REDACTED}", "step": 1}  # ...but secrets are matched every time
    assert redaction.redact_known(value) == {"note": f"says {REDACTED}", "step": 1}
