"""Pending approvals and questions: what nobody at a terminal can confirm or answer waits in the session's log.

::

    approval = request_approval(store, "s1", action="run shell.run", detail='{"command": "rm -f junk"}',
                                reason="command 'rm -f junk' matches sensitive pattern 'rm'", author="follower",
                                timeout=300)
    # another process, another host, the service's API:
    decide(store, "s1", approval.number, approved=True, author="user:alice")
    # the waiting step:
    decided = await wait_for_decision(store, approval)      # .status == "approved"

An approval is two events of the session, each attributable like any other:

- ``approval_request`` (``meta["approval"]``: what would run, why it needs
  approval, how long it waits) written by the session's runner while its step
  waits; the approval's **number** is that event's version, so it is unique in
  the session without a counter anyone could race on;
- ``approval_decision`` (``meta["approval"]``: the number, ``approved``,
  ``refused`` or ``timed_out``, and a note) written by whoever decides:
  ``saucer approve``/``saucer refuse``, the service's API, or the waiting side
  itself when the timeout passes (author ``system``). The first decision in log
  order counts; :func:`decide` appends only on the version it checked, so two
  people deciding at once get one decision and one clear error.

A *question* (the model's ``ask_user`` where no terminal can answer) is the
same two events: its request says ``"kind": "question"`` (the text is its
``detail``), its decision is ``answered`` with the answer as its note, or
``timed_out``; ``saucer answer`` and the API's ``answer`` route write it
(:func:`request_question`, :func:`pending_question`). Approve/refuse do not
apply to a question, nor an answer to an approval.

Neither event changes the Context's state (no operations): they are the
session's record of who allowed what. :func:`approvals_of` is the one fold
from events to :class:`Approval` rows, used by the CLI, the API and the waiter.
The waiter does not spin: it follows the log with
:meth:`~saucer.store.EventStore.watch` (PostgreSQL's ``LISTEN``/``NOTIFY``,
else a poll every ``interval`` seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

from saucer.context import Context, ContextNames
from saucer.engine.cancel import cancel_of
from saucer.engine.host import SessionRef
from saucer.engine.interactor import as_channel, interactor_approver, nobody_to_ask
from saucer.store import ConflictError, Event, EventStore, NotParticipantError, SessionNotFoundError, StoreError
from saucer.store.summary import ENDED

if TYPE_CHECKING:
    from saucer.engine.meta import ApprovalDecisionData, ApprovalDecisionMeta, ApprovalRequestData, ApprovalRequestMeta

__all__ = [
    "REQUEST_KIND",
    "DECISION_KIND",
    "Approval",
    "ApprovalError",
    "ApprovalNotFound",
    "NotAllowedToDecide",
    "check_decider",
    "ApprovalStatus",
    "RequestKind",
    "approvals_of",
    "approval_line",
    "read_approvals",
    "pending_approvals",
    "request_approval",
    "decide",
    "wait_for_decision",
    "pending_approver",
    "request_question",
    "pending_question",
    "QUESTION_TIMED_OUT",
    "MAX_ANSWER_CHARS",
    "DEFAULT_POLL_INTERVAL",
]

REQUEST_KIND = "approval_request"
"""``meta["kind"]`` of the event that asks for an approval."""
DECISION_KIND = "approval_decision"
"""``meta["kind"]`` of the event that answers one."""
DEFAULT_POLL_INTERVAL = 0.5
"""Seconds between two reads of the log while waiting (when the store has no notifications)."""

ApprovalStatus = Literal["pending", "approved", "refused", "timed_out", "answered"]
RequestKind = Literal["approval", "question"]
DecidedStatus = Literal["approved", "refused", "timed_out", "answered"]
_DECIDED: tuple[DecidedStatus, ...] = ("approved", "refused", "timed_out", "answered")
QUESTION_TIMED_OUT = "no answer (timeout)"
"""How a question nobody answered in time begins (what the model reads)."""
_DETAIL_CHARS = 2000
MAX_ANSWER_CHARS = 10_000
"""The longest answer to a question (what a model reads; a longer one is refused, not cut)."""
_MAX_TRIES = 50


class ApprovalError(Exception):
    """An approval that cannot be listed or decided: one sentence saying why."""


class ApprovalNotFound(ApprovalError):
    """No such session, or no approval of that number in it."""


class NotAllowedToDecide(ApprovalError):
    """The author is not a participant of a session that declares its participants."""


def check_decider(store: EventStore, session_id: str, author: str, version: int) -> None:
    """:class:`NotAllowedToDecide` unless ``author`` may write to the session as it is at
    ``version`` (a session that declares no participants is open to every writer)."""
    ctx = Context.open(store, session_id, create=False, at=version)
    try:
        allowed = ctx.participants
    finally:
        ctx.close()
    if allowed is not None and author not in allowed:
        raise NotAllowedToDecide(str(NotParticipantError(session_id, author)))


@dataclass(frozen=True)
class Approval:
    """One approval of a session, as its events say (see the module docs)."""

    session_id: str
    number: int
    action: str
    detail: str
    reason: str
    requested_by: str
    requested_at: float
    round: int | None = None
    step: int | None = None
    timeout: float | None = None
    kind: RequestKind = "approval"
    status: ApprovalStatus = "pending"
    decided_by: str | None = None
    decided_at: float | None = None
    note: str | None = None

    @property
    def pending(self) -> bool:
        """Whether nobody has decided yet."""
        return self.status == "pending"

    @property
    def deadline(self) -> float | None:
        """When an unanswered approval becomes a refusal (epoch seconds; None: it waits as long as its runner)."""
        return None if self.timeout is None else self.requested_at + self.timeout

    @property
    def what(self) -> str:
        """``approval`` or ``question``: how messages name it."""
        return self.kind

    @property
    def answer(self) -> str | None:
        """A question's answer (None: not answered, or not a question)."""
        return self.note if self.status == "answered" else None

    def reply(self) -> str:
        """What the model reads for a decided question: the answer, or that nobody answered in time."""
        if self.status == "answered":
            return f"the user ({self.decided_by}) answered: {self.note or ''}"
        return (
            f"{QUESTION_TIMED_OUT}: nobody answered question {self.number} of session {self.session_id} "
            f"within {self.timeout or 0:g} s; decide without the answer, or finish and say what you need to know"
        )

    def refusal(self) -> str:
        """What the agent is told when this approval did not allow the step (its result's error text)."""
        what = f"approval {self.number} of session {self.session_id}"
        if self.status == "timed_out":
            return f"refused by timeout: nobody decided on {what} within {self.timeout or 0:g} s"
        note = f": {self.note}" if self.note else ""
        return f"refused by {self.decided_by} ({what}){note}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``saucer approvals --json`` and the API show)."""
        data = asdict(self)
        data["deadline"] = self.deadline
        data["answer"] = self.answer
        return data


def _request_of(event: Event) -> Approval | None:
    data = event.meta.get("approval")
    if event.meta.get("kind") != REQUEST_KIND or not isinstance(data, dict):
        return None
    timeout = data.get("timeout")
    return Approval(
        session_id=event.session_id,
        number=event.version,
        action=str(data.get("action") or ""),
        detail=str(data.get("detail") or ""),
        reason=str(data.get("reason") or ""),
        requested_by=event.author,
        requested_at=event.timestamp,
        round=event.round,
        step=event.step,
        timeout=float(timeout) if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) else None,
        kind="question" if data.get("kind") == "question" else "approval",
    )


def _decision_of(event: Event) -> tuple[int, DecidedStatus, str | None] | None:
    data = event.meta.get("approval")
    if event.meta.get("kind") != DECISION_KIND or not isinstance(data, dict):
        return None
    number, status = data.get("number"), data.get("status")
    if not isinstance(number, int) or not _is_decided(status):
        return None
    note = data.get("note")
    return number, status, note if isinstance(note, str) and note else None


def _is_decided(status: object) -> TypeGuard[DecidedStatus]:
    return status in _DECIDED


def approvals_of(events: Iterable[Event]) -> list[Approval]:
    """Every approval the events ask for, with its decision (the first one in log order), by number."""
    found: dict[int, Approval] = {}
    for event in events:
        request = _request_of(event)
        if request is not None:
            found[request.number] = request
            continue
        decision = _decision_of(event)
        if decision is None:
            continue
        number, status, note = decision
        current = found.get(number)
        if current is not None and current.pending:
            found[number] = replace(
                current,
                status=status,
                decided_by=event.author,
                decided_at=event.timestamp,
                note=note,
            )
    return [found[n] for n in sorted(found)]


def approval_line(event: Event) -> str | None:
    """What an approval event says, in one line (None for any other event): the timeline's text."""
    request = _request_of(event)
    if request is not None and request.kind == "question":
        return f"question {request.number} asked: {request.detail}"
    if request is not None:
        because = f" ({request.reason})" if request.reason else ""
        return f"approval {request.number} asked: {request.action} {request.detail}{because}"
    decision = _decision_of(event)
    if decision is None:
        return None
    number, status, note = decision
    if status == "answered":
        return f"question {number} answered by {event.author}: {note or ''}"
    if status == "timed_out" and note == QUESTION_TIMED_OUT:
        return f"question {number}: {note}"
    verb = "refused by timeout" if status == "timed_out" else f"{status} by {event.author}"
    return f"approval {number} {verb}" + (f": {note}" if note else "")


def read_approvals(store: EventStore, session_id: str) -> list[Approval]:
    """The approvals of one session (:class:`ApprovalError` when there is no such session)."""
    try:
        return approvals_of(store.iter_events(session_id))
    except SessionNotFoundError:
        raise ApprovalNotFound(f"no session {session_id!r} in this store") from None


def pending_approvals(store: EventStore, session_ids: Iterable[str] | None = None) -> list[Approval]:
    """Pending approvals of the given sessions, or of every running session (those not running
    cannot be waiting on one), oldest first."""
    if session_ids is None:
        session_ids = [s.session_id for s in store.list_sessions(status="running")]
    out: list[Approval] = []
    for session_id in session_ids:
        out += [a for a in read_approvals(store, session_id) if a.pending]
    return sorted(out, key=lambda a: (a.requested_at, a.session_id, a.number))


def _ended(store: EventStore, session_id: str) -> str | None:
    """The status a session ended with (None while it has not ended)."""
    head = store.head(session_id)
    if head == 0:
        return None
    last = next(iter(store.read(session_id, head - 1, head)), None)
    if last is None:
        return None
    status = last.meta.get("session_status")
    if last.meta.get("kind") == "session_end":  # whatever its status (a service session's "cancelled" too)
        return str(status or "ended")
    return status if status in ENDED else None


def request_approval(
    store: EventStore,
    session_id: str,
    *,
    action: str,
    detail: str = "",
    reason: str = "",
    author: str = "system",
    round: int | None = None,
    step: int | None = None,
    timeout: float | None = None,
    kind: RequestKind = "approval",
) -> Approval:
    """Record a pending approval (or question) in the session (an ``approval_request`` event) and return it."""
    data: ApprovalRequestData = {"action": action, "detail": detail[:_DETAIL_CHARS], "reason": reason}
    if kind == "question":
        data["kind"] = "question"
    if timeout is not None:
        data["timeout"] = float(timeout)
    asking: ApprovalRequestMeta = {"kind": "approval_request", "approval": data}
    meta = dict(asking)
    for _ in range(_MAX_TRIES):
        head = store.head(session_id)
        try:
            event = store.append(session_id, head, [], author=author, round=round, step=step, meta=meta)
        except ConflictError:
            continue  # another writer went first: append after it
        request = _request_of(event)
        assert request is not None
        return request
    raise ApprovalError(f"session {session_id!r}: too many concurrent writers to record an approval request")


def decide(
    store: EventStore,
    session_id: str,
    number: int,
    *,
    status: Literal["approved", "refused", "timed_out", "answered"],
    author: str,
    note: str | None = None,
) -> Approval:
    """Decide on a pending approval; return it decided. :class:`ApprovalError` (one sentence) when
    the session or the approval does not exist, it was already decided, the session has ended, or
    ``author`` is not a participant of a session that declares its participants, or the decision
    does not fit the request (``answered`` with a non-blank ``note`` is for questions only,
    approved/refused for approvals only). The decision is
    appended on the version these were checked at (a change meanwhile: checked again)."""
    if status not in _DECIDED:
        raise ValueError(f"status must be one of {', '.join(_DECIDED)}, not {status!r}")
    sought = "question" if status == "answered" else "approval"
    for _ in range(_MAX_TRIES):
        try:
            head = store.head(session_id)
            if not isinstance(number, int) or number < 1 or number > head:
                raise ApprovalNotFound(f"session {session_id!r} has no {sought} {number}")
            events = list(store.read(session_id, number - 1, head))
        except SessionNotFoundError:
            raise ApprovalNotFound(f"no session {session_id!r} in this store") from None
        found = approvals_of(events)
        if not found or found[0].number != number:
            raise ApprovalNotFound(f"session {session_id!r} has no {sought} {number}")
        approval = found[0]
        what = approval.what
        if approval.kind == "question" and status in ("approved", "refused"):
            raise ApprovalError(
                f"{number} of session {session_id!r} is a question, not an approval: answer it "
                f"(saucer answer {session_id} {number} TEXT)"
            )
        if approval.kind == "approval" and status == "answered":
            raise ApprovalError(
                f"{number} of session {session_id!r} is an approval, not a question: approve or refuse it"
            )
        if status == "answered" and not (note or "").strip():
            raise ApprovalError("the answer must not be blank")
        if status == "answered" and len(note or "") > MAX_ANSWER_CHARS:
            raise ApprovalError(f"the answer has {len(note or '')} characters; at most {MAX_ANSWER_CHARS} are taken")
        if not approval.pending:
            raise ApprovalError(
                f"{what} {number} of session {session_id!r} was already {approval.status.replace('_', ' ')}"
                + (f" by {approval.decided_by}" if approval.status != "timed_out" else "")
            )
        ended = _ended(store, session_id)
        if ended is not None:
            raise ApprovalError(
                f"session {session_id!r} has ended ({ended}); its {what} {number} can no longer "
                + ("be answered" if what == "question" else "run")
            )
        if status != "timed_out":  # the runner's own timeout is not a person's write
            check_decider(store, session_id, author, head)
        data: ApprovalDecisionData = {"number": number, "status": status}
        if note:
            data["note"] = note
        decision: ApprovalDecisionMeta = {"kind": "approval_decision", "approval": data}
        try:
            event = store.append(
                session_id,
                head,
                [],
                author=author,
                round=approval.round,
                meta=dict(decision),
            )
        except ConflictError:
            continue  # something was written meanwhile (maybe a decision): check again
        return replace(approval, status=status, decided_by=author, decided_at=event.timestamp, note=note or None)
    raise ApprovalError(f"session {session_id!r}: too many concurrent writers to record a decision")


async def wait_for_decision(
    store: EventStore, approval: Approval, *, interval: float = DEFAULT_POLL_INTERVAL
) -> Approval:
    """Wait until someone decides on ``approval``; when its timeout passes first, record that it
    timed out (author ``system``) and return it so. The log is followed with ``store.watch``."""
    deadline = approval.deadline
    loop = asyncio.get_running_loop()
    when = None if deadline is None else loop.time() + max(0.0, deadline - time.time())
    stream = store.watch(approval.session_id, approval.number, interval=interval)
    try:
        async with asyncio.timeout_at(when):
            async for event in stream:
                cancel = cancel_of(event) if approval.kind == "approval" else None
                if cancel is not None:  # the session was cancelled: its waiting step does not run
                    refused = await asyncio.to_thread(_refuse_on_cancel, store, approval, cancel.author, cancel.text())
                    if refused is not None:
                        return refused
                    continue  # decided meanwhile: that decision follows in the log
                decision = _decision_of(event)
                if decision is not None and decision[0] == approval.number:
                    _, status, note = decision
                    return replace(
                        approval,
                        status=status,
                        decided_by=event.author,
                        decided_at=event.timestamp,
                        note=note,
                    )
    except TimeoutError:
        pass
    finally:
        with contextlib.suppress(Exception):
            await stream.aclose()  # type: ignore[attr-defined]
    try:
        return await asyncio.to_thread(
            decide,
            store,
            approval.session_id,
            approval.number,
            status="timed_out",
            author="system",
            note=QUESTION_TIMED_OUT if approval.kind == "question" else None,
        )
    except ApprovalError:
        # Decided meanwhile (or the session was taken away): what the log says counts.
        for found in await asyncio.to_thread(read_approvals, store, approval.session_id):
            if found.number == approval.number and not found.pending:
                return found
        raise
    except StoreError as exc:
        raise ApprovalError(f"approval {approval.number} of session {approval.session_id!r}: {exc}") from None


def _refuse_on_cancel(store: EventStore, approval: Approval, author: str, why: str) -> Approval | None:
    """Refuse ``approval`` in the name of who cancelled its session (None: it was decided first)."""
    try:
        return decide(
            store, approval.session_id, approval.number, status="refused", author=author, note=f"the session was {why}"
        )
    except ApprovalError:
        return None


def _cancelled_now(session: SessionRef) -> tuple[str, str] | None:
    """Whether the session's runner has been cancelled, its Context brought up to date with what others wrote."""
    ctx = session.context
    if ctx is None:  # not running
        return None  # type: ignore[unreachable]  # Session.context is None until run()
    ctx.catch_up()
    return session.cancelled_by()


def pending_approver(
    session: SessionRef,
    interactor: object | None,
    *,
    timeout: float,
    reason_of: Callable[[Any], Awaitable[str | None]] | None = None,
    interval: float = DEFAULT_POLL_INTERVAL,
) -> Callable[[Any], Awaitable[bool | str]]:
    """The ``approver`` of a session's local dispatcher: the interactor when someone can answer
    (a terminal, or ``assume_yes``); otherwise a pending approval in the session's log that waits
    up to ``timeout`` seconds for ``saucer approve``/``refuse`` (0: refused at once, as before).
    ``reason_of(command)`` says why the command needs approval (stored with the request)."""
    channel = as_channel(interactor)
    asker = interactor_approver(channel)

    async def approve(command: Any) -> bool | str:
        store = session.store
        if timeout <= 0 or store is None or not nobody_to_ask(channel):
            return await asker(command)
        try:
            detail = json.dumps(command.parameters, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            detail = repr(command.parameters)
        reason = (await reason_of(command) if reason_of is not None else None) or ""
        ctx = session.context
        approval = await asyncio.to_thread(
            request_approval,
            store,
            session.session_id,
            action=f"run {command.tool_name}",
            detail=detail,
            reason=reason,
            round=int(ctx.get(ContextNames.CURRENT_ROUND_ID)),
            timeout=timeout,
        )
        await channel.approval_pending(approval)
        # A cancel written before the request (its wait follows the log after it); catching up reads the store.
        cancelled = await asyncio.to_thread(_cancelled_now, session)
        if cancelled is not None:
            refused = await asyncio.to_thread(_refuse_on_cancel, store, approval, *cancelled)
            if refused is not None:
                return refused.refusal()
        decided = await wait_for_decision(store, approval, interval=interval)
        return True if decided.status == "approved" else decided.refusal()

    return approve


def request_question(
    store: EventStore,
    session_id: str,
    question: str,
    *,
    author: str = "system",
    round: int | None = None,
    step: int | None = None,
    timeout: float | None = None,
) -> Approval:
    """Record a pending question in the session (:func:`request_approval` with ``kind="question"``)."""
    return request_approval(
        store,
        session_id,
        action="ask_user",
        detail=question,
        author=author,
        round=round,
        step=step,
        timeout=timeout,
        kind="question",
    )


async def pending_question(
    session: SessionRef,
    interactor: object | None,
    question: str,
    *,
    timeout: float,
    author: str = "system",
    interval: float = DEFAULT_POLL_INTERVAL,
) -> Approval | None:
    """Ask ``question`` as a pending question of ``session`` and wait up to ``timeout`` seconds
    for ``saucer answer`` or the API; return it decided (``answered`` or ``timed_out``). None when
    it cannot wait: no store, or ``timeout`` 0 (the caller says there is no one to ask)."""
    store = session.store
    if timeout <= 0 or store is None:
        return None
    ctx: Context | None = session.context  # None before the session runs
    round_id = ctx.get(ContextNames.CURRENT_ROUND_ID) if ctx is not None else None
    asked = await asyncio.to_thread(
        request_question,
        store,
        session.session_id,
        question,
        author=author,
        round=int(round_id) if isinstance(round_id, int) else None,
        timeout=timeout,
    )
    await as_channel(interactor).question_pending(asked)
    return await wait_for_decision(store, asked, interval=interval)
