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
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, runtime_checkable

_log = logging.getLogger("saucer.engine.approvals")

__all__ = ["Interactor", "NonInteractiveInteractor", "ask", "interactor_approver", "nobody_to_ask", "request_of"]


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


async def ask(interactor: Any, method: str, *args: Any) -> Any:
    """Call ``interactor.method(*args)``: awaited if async, in a thread if ``blocking``.

    A missing interactor or method gives the non-interactive default.
    """
    target = interactor if interactor is not None else _DEFAULT
    fn = getattr(target, method, None)
    if fn is None:
        fn = getattr(_DEFAULT, method)
    if getattr(target, "blocking", False) and not inspect.iscoroutinefunction(fn):
        result = await asyncio.to_thread(fn, *args)
    else:
        result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def interactor_approver(interactor: Any) -> Callable[[Any], Awaitable[bool | str]]:
    """An ``approver`` for sensitive commands that asks ``interactor.sensitive_step_asker``.

    The question names the tool (``run server.tool``) and shows its parameters;
    no interactor means the non-interactive default (refuse unless ``assume_yes``).
    A refusal is ``False``, or the interactor's ``refusal_reason()`` when it has
    one (the dispatcher puts it in the failed result).
    """

    async def approve(command: Any) -> bool | str:
        try:
            target = json.dumps(command.parameters, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            target = repr(command.parameters)
        if await ask(interactor, "sensitive_step_asker", f"run {command.tool_name}", target[:2000]):
            return True
        explain = getattr(interactor, "refusal_reason", None)
        return (explain() if callable(explain) else None) or False

    return approve


def nobody_to_ask(interactor: Any) -> bool:
    """Whether a sensitive step would be refused without asking anyone: no interactor, a
    non-interactive one, or one whose ``refusal_reason()`` says so (no terminal). ``assume_yes`` approves."""
    if interactor is None:
        return True
    if getattr(interactor, "assume_yes", False):
        return False
    if isinstance(interactor, NonInteractiveInteractor):
        return True
    explain = getattr(interactor, "refusal_reason", None)
    return callable(explain) and explain() is not None
