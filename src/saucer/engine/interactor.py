"""How a session talks to its user: the :class:`Interactor` protocol and a non-interactive default.

The engine never waits on a terminal itself. The CLI provides a rich
implementation; without a terminal (CI, pipes, services) the
:class:`NonInteractiveInteractor` answers with documented defaults:

=========================  ===========================================
method                     non-interactive answer
=========================  ===========================================
``first_request()``        the next queued request, else None (no request)
``new_request()``          ``(next queued request, False)``, else ``("", True)`` (complete)
``experience_asker()``     False (do not save)
``question_asker(q, i)``   "" (no answer)
``sensitive_step_asker``   ``assume_yes`` (False unless ``--yes``)
=========================  ===========================================

Optional extras an interactor may have: ``interactive`` (False: nobody can
answer, so a pool treats ``save_experience = "ask"`` as ``auto``),
``batch_experience_asker(count)`` (the one question a pool asks instead of
asking each session), ``refusal_reason()`` (why a sensitive step was
refused, e.g. "no terminal to ask; pass --yes"), which the dispatcher puts
in the failed result, and ``approval_pending(approval)`` (told when a
sensitive step nobody can confirm here waits as a pending approval in the
session, see :mod:`saucer.engine.approvals`; the default logs it), and
``question_pending(question)`` (the same for a model's question nobody here
can answer).

Methods may be plain or ``async``. An interactor whose plain methods block
(reading a terminal) sets ``blocking = True`` so the engine calls them in a
worker thread and other sessions keep running.

The engine and the agents never call an interactor by a method's name: a
:class:`UserChannel` (``session.user_channel``, ``agent.user_channel``) checks
once, when it is made, which of these methods the interactor has (one
``runtime_checkable`` Protocol each) and keeps them as bound callables, with the
non-interactive defaults for the others.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from saucer.engine.conformance import conforms

_log = logging.getLogger("saucer.engine.approvals")

__all__ = [
    "Interactor",
    "NonInteractiveInteractor",
    "UserChannel",
    "as_channel",
    "interactor_approver",
    "nobody_to_ask",
    "request_of",
]


@runtime_checkable
class Interactor(Protocol):
    """The user side of a session. Each method may also be ``async``."""

    def first_request(self) -> str | None | Awaitable[str | None]:
        """The first request of a session; None or "" means there is none."""
        ...

    def new_request(self) -> tuple[str, bool] | Awaitable[tuple[str, bool]]:
        """UFO's shape: ``(request, complete)``; ``complete`` (the user typed N) finishes the session.

        The engine also takes a plain ``str`` (None or "" finishes), as older interactors return.
        """
        ...

    def experience_asker(self) -> bool | Awaitable[bool]:
        """Whether to save this successful session as a replayable plan."""
        ...

    def question_asker(self, question: str, index: int) -> str | Awaitable[str]:
        """An answer to an agent's question (the ``index``-th of the session)."""
        ...

    def sensitive_step_asker(self, action: str, target: str) -> bool | Awaitable[bool]:
        """Whether a sensitive action on ``target`` may run (the safe answer is no)."""
        ...


class NonInteractiveInteractor:
    """Never waits for input: queued requests, then the documented defaults."""

    blocking = False

    def __init__(self, assume_yes: bool = False, requests: Iterable[str] = ()) -> None:
        self.assume_yes = assume_yes
        self._requests: deque[str] = deque(requests)

    @property
    def interactive(self) -> bool:
        """Whether it would still give a request (while queued requests remain); it never asks anyone."""
        return bool(self._requests)

    def first_request(self) -> str | None:
        return self._requests.popleft() if self._requests else None

    def new_request(self) -> tuple[str, bool]:
        return (self._requests.popleft(), False) if self._requests else ("", True)

    def experience_asker(self) -> bool:
        return False

    def batch_experience_asker(self, count: int) -> bool:
        return False

    def question_asker(self, question: str, index: int) -> str:
        return ""

    def sensitive_step_asker(self, action: str, target: str) -> bool:
        return self.assume_yes

    def question_pending(self, question: Any) -> None:
        _log.info(
            "session %s: question %d waits for an answer; saucer answer %s %d TEXT",
            question.session_id,
            question.number,
            question.session_id,
            question.number,
        )

    def approval_pending(self, approval: Any) -> None:
        _log.info(
            "session %s: approval %d waits (%s); saucer approve %s %d, or saucer refuse",
            approval.session_id,
            approval.number,
            approval.action,
            approval.session_id,
            approval.number,
        )


_DEFAULT = NonInteractiveInteractor()


def request_of(answer: Any) -> str | None:
    """The request in a ``new_request`` answer: UFO's ``(request, complete)`` or a plain string; None: finish."""
    if isinstance(answer, tuple) and len(answer) == 2:
        request, complete = answer
        return None if complete or not request else str(request)
    if not answer or (isinstance(answer, str) and answer.strip().upper() == "N"):
        return None
    return str(answer)


# ------------------------------------------------------------ optional hooks, as contracts
# Each optional method of an interactor is a Protocol of its own, checked ONCE when a
# UserChannel is made (isinstance with runtime_checkable): the engine never looks a method up by name.


@runtime_checkable
class _FirstRequest(Protocol):
    def first_request(self) -> str | None | Awaitable[str | None]: ...


@runtime_checkable
class _NewRequest(Protocol):
    def new_request(self) -> object: ...


@runtime_checkable
class _ExperienceAsker(Protocol):
    def experience_asker(self) -> bool | Awaitable[bool]: ...


@runtime_checkable
class _BatchExperienceAsker(Protocol):
    def batch_experience_asker(self, count: int) -> bool | Awaitable[bool]: ...


@runtime_checkable
class _QuestionAsker(Protocol):
    def question_asker(self, question: str, index: int) -> str | Awaitable[str]: ...


@runtime_checkable
class _SensitiveStepAsker(Protocol):
    def sensitive_step_asker(self, action: str, target: str) -> bool | Awaitable[bool]: ...


@runtime_checkable
class _ApprovalPending(Protocol):
    def approval_pending(self, approval: Any) -> object: ...


@runtime_checkable
class _QuestionPending(Protocol):
    def question_pending(self, question: Any) -> object: ...


@runtime_checkable
class _RefusalReason(Protocol):
    def refusal_reason(self) -> str | None: ...


@runtime_checkable
class _Interactive(Protocol):
    @property
    def interactive(self) -> bool: ...


@runtime_checkable
class _AssumeYes(Protocol):
    assume_yes: bool


@runtime_checkable
class _Blocking(Protocol):
    blocking: bool


class UserChannel:
    """The session's interactor with every method resolved once, when the channel is made.

    Each method is the interactor's own when it has it (plain or ``async``),
    else the :class:`NonInteractiveInteractor`'s documented default; a
    ``blocking`` interactor's plain methods run in a worker thread. Made by
    the session (``session.user_channel``) and used by the engine and the agents
    (``agent.user_channel``) instead of calling the interactor by name.
    """

    __slots__ = (
        "interactor",
        "_blocking",
        "_first",
        "_new",
        "_experience",
        "_batch_experience",
        "_question",
        "_sensitive",
        "_approval_pending",
        "_question_pending",
        "_refusal",
    )

    def __init__(self, interactor: object | None) -> None:
        #: The interactor as given (None: nobody; the non-interactive defaults answer).
        self.interactor = interactor
        target: object = interactor if interactor is not None else _DEFAULT
        self._blocking = conforms(target, _Blocking) and bool(target.blocking)
        self._first: Callable[[], object] = (
            target.first_request if conforms(target, _FirstRequest) else _DEFAULT.first_request
        )
        self._new: Callable[[], object] = target.new_request if conforms(target, _NewRequest) else _DEFAULT.new_request
        self._experience: Callable[[], object] = (
            target.experience_asker if conforms(target, _ExperienceAsker) else _DEFAULT.experience_asker
        )
        self._batch_experience: Callable[[int], object] | None = (
            target.batch_experience_asker if conforms(target, _BatchExperienceAsker) else None
        )
        self._question: Callable[[str, int], object] = (
            target.question_asker if conforms(target, _QuestionAsker) else _DEFAULT.question_asker
        )
        self._sensitive: Callable[[str, str], object] = (
            target.sensitive_step_asker if conforms(target, _SensitiveStepAsker) else _DEFAULT.sensitive_step_asker
        )
        self._approval_pending: Callable[[Any], object] = (
            target.approval_pending if conforms(target, _ApprovalPending) else _DEFAULT.approval_pending
        )
        self._question_pending: Callable[[Any], object] = (
            target.question_pending if conforms(target, _QuestionPending) else _DEFAULT.question_pending
        )
        self._refusal: Callable[[], str | None] | None = (
            interactor.refusal_reason if conforms(interactor, _RefusalReason) else None
        )

    # ------------------------------------------------------------- what it is

    @property
    def present(self) -> bool:
        """Whether the session has an interactor at all."""
        return self.interactor is not None

    def interactive(self, default: bool) -> bool:
        """The interactor's ``interactive`` (read now: it may change), or ``default`` when it has none."""
        target = self.interactor
        return bool(target.interactive) if isinstance(target, _Interactive) else default

    @property
    def assume_yes(self) -> bool:
        """Whether the interactor approves sensitive steps without asking (``--yes``)."""
        target = self.interactor
        return isinstance(target, _AssumeYes) and bool(target.assume_yes)

    def refusal_reason(self) -> str | None:
        """Why a sensitive step was refused (e.g. no terminal), when the interactor says."""
        return self._refusal() if self._refusal is not None else None

    # ------------------------------------------------------------------ calls

    async def _call(self, fn: Callable[..., object], *args: Any) -> object:
        if self._blocking and not inspect.iscoroutinefunction(fn):
            result = await asyncio.to_thread(fn, *args)
        else:
            result = fn(*args)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def first_request(self) -> str:
        """The first request of a session ("" when there is none)."""
        answer = await self._call(self._first)
        return str(answer) if answer else ""

    async def new_request(self) -> str | None:
        """The next request, or None when the user is done (see :func:`request_of`)."""
        return request_of(await self._call(self._new))

    async def experience_asker(self) -> bool:
        """Whether to save this successful session as a replayable plan."""
        return bool(await self._call(self._experience))

    async def batch_experience_asker(self, count: int) -> bool:
        """The one question a pool asks for its ``count`` sessions (the single question when there is no batch one)."""
        if self._batch_experience is None:
            return await self.experience_asker()
        return bool(await self._call(self._batch_experience, count))

    async def question_asker(self, question: str, index: int) -> str:
        """The user's answer to an agent's ``index``-th question ("" for none)."""
        answer = await self._call(self._question, question, index)
        return answer if isinstance(answer, str) else ""

    async def sensitive_step_asker(self, action: str, target: str) -> bool:
        """Whether a sensitive ``action`` on ``target`` may run."""
        return bool(await self._call(self._sensitive, action, target))

    async def approval_pending(self, approval: Any) -> None:
        """Tell the user a sensitive step waits as a pending approval."""
        await self._call(self._approval_pending, approval)

    async def question_pending(self, question: Any) -> None:
        """Tell the user a model's question waits as a pending question."""
        await self._call(self._question_pending, question)


def as_channel(interactor: object | None) -> UserChannel:
    """``interactor`` as a :class:`UserChannel` (itself when it already is one)."""
    return interactor if isinstance(interactor, UserChannel) else UserChannel(interactor)


def interactor_approver(interactor: object | None) -> Callable[[Any], Awaitable[bool | str]]:
    """An ``approver`` for sensitive commands that asks the interactor's ``sensitive_step_asker``.

    The question names the tool (``run server.tool``) and shows its parameters;
    no interactor means the non-interactive default (refuse unless ``assume_yes``).
    A refusal is ``False``, or the interactor's ``refusal_reason()`` when it has
    one (the dispatcher puts it in the failed result). ``interactor`` may be a :class:`UserChannel`.
    """
    channel = as_channel(interactor)

    async def approve(command: Any) -> bool | str:
        try:
            target = json.dumps(command.parameters, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            target = repr(command.parameters)
        if await channel.sensitive_step_asker(f"run {command.tool_name}", target[:2000]):
            return True
        return channel.refusal_reason() or False

    return approve


def nobody_to_ask(interactor: object | None) -> bool:
    """Whether a sensitive step would be refused without asking anyone: no interactor, a
    non-interactive one, or one whose ``refusal_reason()`` says so (no terminal). ``assume_yes`` approves."""
    channel = as_channel(interactor)
    if not channel.present:
        return True
    if channel.assume_yes:
        return False
    if isinstance(channel.interactor, NonInteractiveInteractor):
        return True
    return channel.refusal_reason() is not None
