"""Approvals in service mode: a sensitive command waits on the server for a principal's decision.

Nobody sits at a device to confirm a sensitive command (``rm``, ``sudo``, a
tool marked sensitive). Before the server sends a batch, :class:`ApprovalGate`
checks each command against the rules the device itself registered with
(each tool's ``sensitive`` flag and ``sensitive_commands`` patterns, read by
the same :func:`saucer.tools.rules.sensitive_reason` the device applies). A
sensitive one becomes a pending approval in the session's event log
(:mod:`saucer.engine.approvals`) and the batch waits, without a device
timeout running, until a principal decides::

    GET  /api/sessions/{id}/approvals                 the session's approvals (pending and decided)
    POST /api/sessions/{id}/approvals/{n}/approve     let it run
    POST /api/sessions/{id}/approvals/{n}/refuse      {"reason": "..."}: it does not run
    POST /api/sessions/{id}/approvals/{n}/answer      {"answer": "..."}: the model's pending question

A request session's LLM agent asking the user (``ask_user``) waits the same
way, as a pending *question* listed with the approvals (``"kind": "question"``,
its text in ``detail``); the same principals answer it, and the model reads
the answer (or "no answer (timeout)").

``saucer approve``/``saucer refuse`` on the server's event store do the same.
Who may decide: the session's owner (the principal that submitted it), the
service admins and the session's participants (``participants`` of the task,
and those added since); any other principal gets 403, and so does an admin
that a session declaring its participants does not name (a non-participant's
write is refused). Each decision is an event whose author is the principal's
name, as participants name principals. An approved command is sent with its call id
in the ``command`` frame's ``approved`` list, which the device accepts as the
confirmation nobody could give at the device; a refused one is not sent (its
result is a failure that says who refused it, or that it timed out), and the
commands after it in the batch are skipped. ``[approvals] timeout`` (seconds,
``SAUCER_APPROVALS__TIMEOUT``) bounds the wait; 0 sends everything unasked, so
a device without ``--yes`` refuses sensitive commands as before. A device run
with ``--yes`` registers ``assume_yes`` and is never asked for.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from saucer.dispatch.messages import Command, Result
from saucer.engine.approvals import (
    DEFAULT_POLL_INTERVAL,
    MAX_ANSWER_CHARS,
    ApprovalError,
    ApprovalNotFound,
    NotAllowedToDecide,
    check_decider,
    decide,
    read_approvals,
    request_approval,
    wait_for_decision,
)
from saucer.service.auth import TokenAuthenticator
from saucer.service.http import error_response, json_response, unauthorized
from saucer.store import EventStore
from saucer.tools.rules import SensitivityRules, sensitive_reason

__all__ = ["ApprovalGate", "ApprovalRoutes", "listed_reason", "may_act", "principal_author"]

_log = logging.getLogger("saucer.service.approvals")


def principal_author(principal: str) -> str:
    """The author of an event a principal writes through the API: its name, as the session's
    participants name principals (the submitting principal is one)."""
    return principal


def listed_reason(tools: Mapping[str, Any], command: Command) -> str | None:
    """Why ``command`` needs approval by the rules of a device's tool listing (None: it does not,
    or the listing cannot say: then the device decides for itself)."""
    name = command.tool_name
    info = tools.get(name)
    if not isinstance(info, Mapping):
        owners = [qualified for qualified in tools if qualified.partition(".")[2] == name]
        if len(owners) != 1:
            return None
        name, info = owners[0], tools[owners[0]]
        if not isinstance(info, Mapping):
            return None
    patterns = info.get("sensitive_commands") or ()
    try:
        rules = SensitivityRules.build(tools=[name] if info.get("sensitive") else [], command_patterns=list(patterns))
    except (TypeError, ValueError):
        return None
    return sensitive_reason(name, command.parameters, rules)


class ApprovalGate:
    """Asks for approvals of one service session's sensitive commands before they are sent."""

    def __init__(self, session_id: str, timeout: float, *, interval: float = DEFAULT_POLL_INTERVAL) -> None:
        self.session_id = session_id
        self.timeout = timeout
        self.interval = interval

    async def check(
        self,
        store: EventStore | None,
        commands: Sequence[Command],
        device_info: Mapping[str, Any],
        round_id: int | None,
    ) -> tuple[int, list[str], Result | None]:
        """``(n, approved, refused)``: the first ``n`` commands may be sent, ``approved`` are the call
        ids a principal approved among them, and ``refused`` is the failure of command ``n`` (None:
        every command may be sent)."""
        tools = device_info.get("tools")
        if self.timeout <= 0 or store is None or device_info.get("assume_yes") or not isinstance(tools, Mapping):
            return len(commands), [], None
        approved: list[str] = []
        for index, command in enumerate(commands):
            reason = listed_reason(tools, command)
            if reason is None:
                continue
            detail = json.dumps(command.parameters, ensure_ascii=False, default=str)
            approval = await asyncio.to_thread(
                request_approval,
                store,
                self.session_id,
                action=f"run {command.tool_name}",
                detail=detail,
                reason=reason,
                round=round_id,
                timeout=self.timeout,
            )
            _log.info(
                "session %s: %s waits for approval %d (%s): POST /api/sessions/%s/approvals/%d/approve or /refuse",
                self.session_id,
                approval.action,
                approval.number,
                reason,
                self.session_id,
                approval.number,
            )
            decided = await wait_for_decision(store, approval, interval=self.interval)
            if decided.status != "approved":
                error = f"refused: tool {command.tool_name!r} ({reason}): {decided.refusal()}"
                return index, approved, Result.failure(command, error)
            approved.append(command.call_id)
        return len(commands), approved, None


async def _participant(store: EventStore, session_id: str, principal: str) -> bool:
    """Whether the session (once its engine session exists) names ``principal`` among its participants."""

    def check() -> bool:
        if not store.exists(session_id):
            return False
        try:
            check_decider(store, session_id, principal_author(principal), store.head(session_id))
        except ApprovalError:
            return False
        return store.session_info(session_id).participants is not None

    return await asyncio.to_thread(check)


async def may_act(
    store: EventStore, session_id: str, principal: str, owner: str, named: Iterable[str], admins: Iterable[str]
) -> bool:
    """Whether ``principal`` may act on the session (decide, answer, write from the viewer): its owner, a
    service admin, a participant its task named or one added since (``named``: the task's participants)."""
    return (
        principal == owner
        or principal in set(admins)
        or principal in set(named)
        or await _participant(store, session_id, principal)
    )


class ApprovalRoutes:
    """The approvals part of the HTTP API (see the module docs), over the runner's event store."""

    def __init__(
        self,
        auth: TokenAuthenticator,
        store: Callable[[], EventStore | None],
        owner_of: Callable[[str], Any],  # async: session id -> (owner, participants its task named) or None
        admins: Iterable[str],
    ) -> None:
        self.auth = auth
        self._store = store
        self._owner_of = owner_of
        self.admins = frozenset(admins)

    def routes(self) -> list[Route]:
        """The routes, to add to the app."""
        base = "/api/sessions/{session_id}/approvals"
        return [
            Route(base, self.list_approvals, methods=["GET"]),
            Route(base + "/{number:int}/approve", self.approve, methods=["POST"]),
            Route(base + "/{number:int}/refuse", self.refuse, methods=["POST"]),
            Route(base + "/{number:int}/answer", self.answer, methods=["POST"]),
        ]

    async def _allowed(self, request: Request) -> tuple[str, str, EventStore] | Response:
        """The principal, the session id and the event store; or the 401, 404 or 403 to answer."""
        principal = self.auth.from_header(request.headers.get("authorization"))
        if principal is None:
            return unauthorized()
        session_id = request.path_params["session_id"]
        found = await self._owner_of(session_id)
        store = self._store()
        if found is None or store is None:
            return error_response(404, "unknown_session", f"no session {session_id!r} with approvals on this server")
        owner, named = found
        if not await may_act(store, session_id, principal, owner, named, self.admins):
            return error_response(
                403,
                "not_allowed",
                f"principal {principal!r} may not see, decide or answer approvals and questions of session {session_id!r} "
                "(its owner, its participants and the service admins may)",
            )
        return principal, session_id, store

    async def list_approvals(self, request: Request) -> Response:
        """Every approval of the session, pending and decided."""
        allowed = await self._allowed(request)
        if isinstance(allowed, Response):
            return allowed
        _, session_id, store = allowed
        try:
            found = await asyncio.to_thread(read_approvals, store, session_id)
        except ApprovalNotFound:
            found = []  # submitted, and its engine session not started yet
        return json_response({"session_id": session_id, "approvals": [a.to_dict() for a in found]})

    async def approve(self, request: Request) -> Response:
        """Let the pending approval's command run."""
        return await self._decide(request, "approved")

    async def refuse(self, request: Request) -> Response:
        """Refuse it; an optional JSON body ``{"reason": "..."}`` says why (the agent is told)."""
        return await self._decide(request, "refused")

    async def answer(self, request: Request) -> Response:
        """Answer the pending question; the JSON body ``{"answer": "..."}`` is what the model reads."""
        return await self._decide(request, "answered")

    async def _decide(self, request: Request, status: Literal["approved", "refused", "answered"]) -> Response:
        allowed = await self._allowed(request)
        if isinstance(allowed, Response):
            return allowed
        principal, session_id, store = allowed
        note = None
        body = await request.body()
        if body.strip():
            try:
                data = json.loads(body)
            except ValueError as exc:
                return error_response(400, "malformed_json", f"body is not valid JSON: {exc}")
            field = "answer" if status == "answered" else "reason"
            reason = data.get(field) if isinstance(data, dict) else None
            if reason is not None and not isinstance(reason, str):
                return error_response(
                    422, "invalid_body", f"{field}: a string" + ("" if status == "answered" else ", or leave it out")
                )
            note = reason or None
        if status == "answered" and not (note or "").strip():
            return error_response(422, "invalid_body", 'the body must be {"answer": "..."} with a non-blank answer')
        if status == "answered" and len(note or "") > MAX_ANSWER_CHARS:
            return error_response(422, "invalid_body", f"answer: at most {MAX_ANSWER_CHARS} characters")
        try:
            decided = await asyncio.to_thread(
                decide,
                store,
                session_id,
                request.path_params["number"],
                status=status,
                author=principal_author(principal),
                note=note,
            )
        except ApprovalNotFound as exc:
            return error_response(404, "unknown_approval", str(exc))
        except NotAllowedToDecide as exc:
            return error_response(403, "not_participant", str(exc))
        except ApprovalError as exc:
            return error_response(409, "not_pending", str(exc))
        return json_response(decided.to_dict())
