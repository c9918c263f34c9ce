"""``SessionFactory``: sessions for each mode, with their store, agents and dispatcher.

Modes (UFO's names):

``normal``
    Requests in plain language, answered by the LLM agents the settings'
    ``agents.provider`` names (``saucer.agents.llm:create_agent_provider`` by
    default). Until it is installed and configured, asking for this mode raises
    :class:`~saucer.engine.errors.LLMUnavailableError` saying what to set.
``follower``
    A plan file (or a folder: one session per plan). Command steps run offline
    through the dispatcher, one round per step, all of them unless
    ``system.max_round`` is lower; text steps need the LLM agent (an error
    naming the step when there is none).
``batch_normal``
    A folder of plans, one session each. A plan's identity is its resolved
    path and the hash of its content (:func:`~saucer.engine.plan.plan_identity`);
    its session's id is derived from it, so the batch's status lives in the
    store: a re-run skips finished plans, continues stopped and interrupted
    ones, retries the failed step of failed ones, and leaves alone a plan
    another runner is running. Creating the session (or taking its lease, to
    continue one) is the per-plan claim: of two runs over one folder, only one
    runs each plan; the other reports it ``skipped``. :attr:`SessionFactory.last_batch`
    says what was skipped and why. A plan's command steps run offline; a plan
    without steps is its ``task`` as a request.
``operator`` and ``normal_operator``
    A request carried out on this machine's X11 desktop by a computer-use
    agent (``saucer.agents.operator``): each step the model sees a
    screenshot and the UI tree and answers with ``desktop`` tool calls
    (``normal_operator``: the shell and files tools too). The built-in
    desktop server is added to these sessions' tools whatever
    ``[desktop] enabled`` says. Needs the ``[llm]`` settings, with a model
    that takes images.
``service``
    Commands run on a remote device; ``saucer serve`` creates these sessions
    with a remote dispatcher (``remote_dispatcher_factory``). Without one,
    :class:`~saucer.engine.errors.ServiceModeError`.

The dispatcher for real runs is ``saucer.dispatch.local.LocalCommandDispatcher``
(``mcp.servers`` or the built-in Linux tools, in-process unless ``mcp.isolate``),
created per session and closed with it; pass ``dispatcher_factory`` (or
``dispatcher=`` per session) to use another.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saucer.config import SettingsModel, load_settings
from saucer.dispatch.messages import Command, Result
from saucer.dispatch.servers import DesktopServer, configured_servers
from saucer.engine.agent import AgentSet
from saucer.engine.components import create_agent_provider, create_operator_provider
from saucer.engine.errors import (
    LLMUnavailableError,
    ModeError,
    PlanError,
    PlatformNotSupportedError,
    ServiceModeError,
)
from saucer.engine.interactor import interactor_approver
from saucer.engine.logs import log_dir_for
from saucer.engine.plan import (
    Plan,
    check_plan_tools,
    load_plan,
    load_plan_folder,
    load_plan_folder_with_identity,
    parse_plan,
)
from saucer.engine.session import Session, SessionStatus, new_session_id
from saucer.engine.status import INTERRUPTED, stored_status
from saucer.store import EventStore, open_store

__all__ = ["SessionFactory", "MODES", "BatchReport", "current_platform", "local_dispatcher_factory"]

MODES = ("normal", "follower", "batch_normal", "service", "operator", "normal_operator")
#: Request modes whose agent drives the desktop (the desktop server is always added to their tools).
OPERATOR_MODES = ("operator", "normal_operator")
SUPPORTED_PLATFORMS = ("linux",)


def current_platform() -> str:
    """``linux``, ``windows``, ``darwin`` or ``sys.platform``."""
    if sys.platform.startswith("linux"):
        return "linux"
    if sys.platform.startswith(("win32", "cygwin")):  # type: ignore[unreachable]  # mypy knows only this platform
        return "windows"
    return sys.platform


class _UnavailableDispatcher:
    """Stands in when no dispatcher can be built: every command fails with the reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def execute_commands(self, commands: list[Command], timeout: float | None = None) -> list[Result]:
        return [Result.failure(c, self.reason) for c in commands]

    def list_tools(self) -> list[Any]:
        return []


def _desktop_server(settings: SettingsModel, session: Session) -> DesktopServer | None:
    """The built-in desktop server when ``[desktop] enabled``, an operator mode, or ``system.save_ui_tree``
    with an X display (without one the session skips it and says so: :mod:`saucer.engine.defaults`);
    added to ``mcp.servers`` too, unless they have a ``desktop``; its artifacts go to
    ``desktop.artifacts_dir``, else to the session's log folder."""
    display = settings.desktop.display or os.environ.get("DISPLAY")
    wanted = (
        settings.desktop.enabled or (settings.system.save_ui_tree and bool(display)) or session.mode in OPERATOR_MODES
    )
    if not wanted:
        return None
    return DesktopServer(
        artifacts=_artifacts(settings, session), display=settings.desktop.display, sandbox=settings.shell
    )


def _artifacts(settings: SettingsModel, session: Session) -> Path:
    """The session's artifacts folder: ``desktop.artifacts_dir``, else ``artifacts/`` in its log folder."""
    return Path(
        settings.desktop.artifacts_dir
        or log_dir_for(settings.logs.root, session.task, session.session_id) / "artifacts"
    )


def local_dispatcher_factory(settings: SettingsModel, workspace: str | Path | None = None) -> Callable[[Session], Any]:
    """Per-session ``LocalCommandDispatcher.from_config(configured_servers(mcp.servers, workspace, desktop=...))``."""

    def make(session: Session) -> Any:
        try:
            from saucer.dispatch import local
        except ImportError as exc:
            return _UnavailableDispatcher(f"the local command dispatcher is not available ({exc})")
        where = Path(session.workspace or workspace or Path.cwd())
        desktop = _desktop_server(settings, session)
        # The shell may write to the session's artifacts folder when it has one (a desktop session); the
        # other sessions' shell options stay the same, so a pool shares one shell server among them.
        servers = configured_servers(
            settings.mcp.servers,
            where,
            desktop=desktop,
            isolate=settings.mcp.isolate,
            shell=settings.shell,
            artifacts=desktop.artifacts if desktop is not None else None,
        )
        channel = session.user_channel
        dispatcher = local.LocalCommandDispatcher.from_config(
            servers, approver=interactor_approver(channel), assume_yes=channel.assume_yes
        )
        # Nobody at a terminal: a sensitive command waits as a pending approval in the session's log.
        dispatcher.approver = _pending_approver(session, channel, settings.approvals.timeout, dispatcher)
        return dispatcher

    return make


def _pending_approver(
    session: Session, channel: Any, timeout: float, dispatcher: Any
) -> Callable[[Any], Awaitable[bool | str]]:
    """:func:`~saucer.engine.approvals.pending_approver` for the session's dispatcher, made when a command
    first needs approval: the approvals module is not loaded by the sessions that never ask."""
    made: list[Callable[[Any], Awaitable[bool | str]]] = []

    async def approve(command: Any) -> bool | str:
        if not made:
            from saucer.engine.approvals import pending_approver

            made.append(pending_approver(session, channel, timeout=timeout, reason_of=dispatcher.sensitive_reason))
        return await made[0](command)

    return approve


@dataclass
class BatchReport:
    """What a ``batch_normal`` folder holds: plans to run, to continue, and skipped (with why)."""

    folder: str
    plans: int = 0
    new: list[str] = field(default_factory=list)
    #: (plan file, session id, its status before: stopped, interrupted, failed or error)
    continued: list[tuple[str, str, str]] = field(default_factory=list)
    #: (plan file, session id, why it is skipped)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)

    def lines(self) -> list[str]:
        """Sentences for the user: how many plans, what is skipped and why, what is continued."""
        out = [
            f"{self.plans} plan(s) in {self.folder}: {len(self.new)} to run, {len(self.continued)} to continue, "
            f"{len(self.skipped)} skipped"
        ]
        out += [f"  skipped {path}: {why} (session {sid})" for path, sid, why in self.skipped]
        verbs = {SessionStatus.STOPPED: "continuing", INTERRUPTED: "resuming"}  # else failed or error
        out += [
            f"  {verbs.get(before, 'retrying the failed step of')} {path} ({before}, session {sid})"
            for path, sid, before in self.continued
        ]
        return out


class SessionFactory:
    """Creates sessions for every mode and resumes them.

    ``agents`` is an :class:`~saucer.engine.agent.AgentProvider` for requests
    (default: the one ``agents.provider`` of the settings names, saucer's LLM
    agents unless set otherwise). ``dispatcher_factory(session)`` makes each session's
    dispatcher (default: :func:`local_dispatcher_factory`).
    ``remote_dispatcher_factory(session)`` enables service mode.
    """

    def __init__(
        self,
        settings: SettingsModel | None = None,
        *,
        store: EventStore | str | None = None,
        agents: Any = None,
        dispatcher_factory: Callable[[Session], Any] | None = None,
        remote_dispatcher_factory: Callable[[Session], Any] | None = None,
        interactor: Any = None,
        observer: Any = None,
        evaluator: Any = None,
        workspace: str | Path | None = None,
    ) -> None:
        self.settings = settings if settings is not None else load_settings()
        self._store_spec = store if store is not None else self.settings.store.url
        self._store: EventStore | None = store if isinstance(store, EventStore) else None
        self._owns_store = False
        self._agents = agents
        self.dispatcher_factory = dispatcher_factory or local_dispatcher_factory(self.settings, workspace)
        self.remote_dispatcher_factory = remote_dispatcher_factory
        self.interactor = interactor
        self.observer = observer
        self.evaluator = evaluator
        self.workspace = workspace
        #: What the last ``batch_normal`` creation found (None before one).
        self.last_batch: BatchReport | None = None
        self._operators: dict[str, Any] = {}

    # ------------------------------------------------------------- resources

    @property
    def store(self) -> EventStore:
        """The shared store of this factory's sessions (opened on first use)."""
        if self._store is None:
            store = self.settings.store
            self._store = open_store(str(self._store_spec), encrypt=store.encrypt, key_file=store.key_file)
            self._owns_store = True
        return self._store

    def close(self) -> None:
        """Close the store if this factory opened it."""
        if self._owns_store and self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> SessionFactory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def agent_provider(self, mode: str = "normal") -> Any:
        """The provider for requests; :class:`LLMUnavailableError` (saying what to set) when there is none.

        Default: the one ``agents.provider`` of the settings names
        (:func:`~saucer.engine.components.create_agent_provider`); ``mode`` ``operator`` or
        ``normal_operator`` gives the computer-use agent ``agents.operator`` names (unless the
        factory was given ``agents``).
        """
        if self._agents is not None:
            return self._agents
        if mode in OPERATOR_MODES:
            return self._operator_provider(mode)
        self._agents = create_agent_provider(self.settings)
        return self._agents

    def _operator_provider(self, mode: str) -> Any:
        provider = self._operators.get(mode)
        if provider is None:
            provider = self._operators[mode] = create_operator_provider(self.settings, mode)
        return provider

    def _lazy_agents(self) -> Callable[[Session], Any]:
        def provide(session: Session) -> Any:
            provider = self.agent_provider(session.mode)
            if callable(provider) and not isinstance(provider, AgentSet):
                return provider(session)
            return provider

        return provide

    # -------------------------------------------------------------- creation

    def create_session(
        self,
        task: str,
        mode: str,
        plan: str | Path | Plan | Mapping[str, Any] | None = None,
        request: str = "",
        platform_override: str | None = None,
        **kw: Any,
    ) -> list[Session]:
        """Sessions for ``task`` in ``mode`` (a list: a folder of plans gives one per plan).

        ``kw`` goes to :class:`Session` (``session_id``, ``dispatcher``,
        ``interactor``, ``observer``, ``evaluator``, ``agents``, ``graph``,
        ``context_vars`` (the context variables it starts with), ``participants``
        and ``user`` (who else may write to it while it runs)...). A ``plan``
        of ``""`` is no plan, as in UFO. With ``plan_tasks=True`` each plan of a
        folder keeps its own ``"task"`` (``task`` names the folder, for what is not a plan's own).
        """
        if isinstance(plan, str) and not plan.strip():
            plan = None  # UFO passes plan="" for the modes that take none
        plan_tasks = bool(kw.pop("plan_tasks", False))
        platform = self._check_platform(platform_override)
        if mode not in MODES:
            raise ModeError(f"unknown mode {mode!r}; use one of: {', '.join(MODES)}")
        if not isinstance(task, str) or not task.strip():
            raise ModeError("a session needs a task name")
        kw.setdefault("platform", platform)
        if mode == "normal":
            if plan is not None:
                raise ModeError("normal mode takes a request, not a plan (use follower or batch_normal for plans)")
            agents = kw.pop("agents", None) or self.agent_provider()
            return [self._session(task, "normal", request=request, agents=agents, **kw)]
        if mode in OPERATOR_MODES:
            if plan is not None:
                raise ModeError(
                    f"{mode} mode takes a request, not a plan (a plan of desktop commands runs in follower mode)"
                )
            agents = kw.pop("agents", None) or self.agent_provider(mode)
            return [self._session(task, mode, request=request, agents=agents, **kw)]
        if mode == "follower":
            return self._follower(task, plan, request, plan_tasks, **kw)
        if mode == "batch_normal":
            return self._batch(task, plan, plan_tasks, **kw)
        return self._service(task, plan, request, **kw)

    def create_service_session(
        self,
        task: str,
        should_evaluate: bool,
        id: str | int,
        request: str,
        task_protocol: Any = None,
        platform_override: str | None = None,
        **kw: Any,
    ) -> Session:
        """One service-mode session, in UFO's shape (a Session, not a list).

        ``id`` is its session id (an int is UFO's index instead, :attr:`Session.id`);
        ``should_evaluate`` overrides ``system.eva_session`` for it; ``task_protocol``
        carries its commands to the device (an object with ``execute_commands``, used as
        its dispatcher; default: the factory's ``remote_dispatcher_factory``). ``kw``
        goes to :class:`Session` as for :meth:`create_session`.
        """
        if task_protocol is not None:
            kw["dispatcher"] = task_protocol
        kw["session_id" if isinstance(id, str) else "id"] = id
        if bool(should_evaluate) != self.settings.system.eva_session:
            settings = self.settings.model_copy(deep=True)
            settings.system.eva_session = bool(should_evaluate)
            kw["settings"] = settings
        [session] = self.create_session(task, "service", request=request, platform_override=platform_override, **kw)
        return session

    def resume_session(self, session_id: str, **kw: Any) -> Session:
        """A Session continuing ``session_id`` (see :meth:`Session.resume`)."""
        kw.setdefault("agents", self._agents if self._agents is not None else self._lazy_agents())
        kw.setdefault("dispatcher_factory", self._dispatcher_for_mode(None))
        kw.setdefault("interactor", self.interactor)
        kw.setdefault("observer", self.observer)
        kw.setdefault("evaluator", self.evaluator)
        return Session.resume(session_id, store=self.store, settings=self.settings, **kw)

    async def check_plans(self, sessions: Sequence[Session]) -> None:
        """Check the command steps of the sessions' plans against their dispatcher's tools, before any runs.

        One dispatcher per mode is asked for its tool list (the first
        session's; that session keeps it for its run). Raises
        :class:`PlanError` naming the plan file, the step, the tool and the
        closest known names; a dispatcher that cannot list its tools is not
        checked. On error every dispatcher opened here is closed again.
        """
        groups: dict[str, list[Session]] = {}
        for session in sessions:
            plan = session.plan
            if plan is not None and len(plan.text_steps()) < len(plan.steps):
                groups.setdefault(session.mode, []).append(session)
        opened: list[Session] = []
        try:
            for group in groups.values():
                opened.append(group[0])
                tools = await group[0].tools()
                if not tools:
                    continue
                for session in group:
                    assert session.plan is not None
                    check_plan_tools(session.plan, tools, session.plan_file or f"the plan of task {session.task!r}")
        except BaseException:
            for session in opened:
                await session.discard()
            raise

    def _dispatcher_for_mode(self, mode: str | None) -> Callable[[Session], Any]:
        if mode == "service" and self.remote_dispatcher_factory is not None:
            return self.remote_dispatcher_factory
        return self.dispatcher_factory

    def _session(self, task: str, mode: str, **kw: Any) -> Session:
        if "dispatcher" not in kw:
            kw.setdefault("dispatcher_factory", self._dispatcher_for_mode(mode))
        kw.setdefault("interactor", self.interactor)
        kw.setdefault("observer", self.observer)
        kw.setdefault("evaluator", self.evaluator)
        if self.workspace is not None:
            kw.setdefault("workspace", self.workspace)
        kw.setdefault("settings", self.settings)
        return Session(task, mode=mode, store=self.store, **kw)

    def _check_platform(self, override: str | None) -> str:
        here = current_platform()
        wanted = (override or here).lower()
        if wanted in ("win", "win32"):
            wanted = "windows"
        if wanted not in SUPPORTED_PLATFORMS or here not in SUPPORTED_PLATFORMS:
            raise PlatformNotSupportedError(
                f"{wanted} sessions are not supported on this platform ({here}); saucer runs sessions on "
                f"{', '.join(SUPPORTED_PLATFORMS)}"
            )
        return wanted

    def _plans(self, plan: Any, mode: str) -> list[tuple[str | None, Plan]]:
        if plan is None:
            raise ModeError(
                f"{mode} mode needs a plan (a JSON file{' or a folder of them' if mode != 'service' else ''})"
            )
        if isinstance(plan, (Plan, Mapping)):
            return [(None, parse_plan(plan))]
        path = Path(plan)
        if path.is_dir():
            return [(str(p), pl) for p, pl in load_plan_folder(path)]
        return [(str(path), load_plan(path))]

    def _needs_llm(self, plan: Plan, plan_file: str | None) -> Any:
        """The agent provider when the plan has text steps (or no steps), else None."""
        text = plan.text_steps()
        if not text and plan.steps:
            return None
        try:
            return self.agent_provider()
        except LLMUnavailableError as exc:
            where = f" of {plan_file}" if plan_file else ""
            if text:
                i = text[0]
                raise LLMUnavailableError(
                    f"plan step {i}{where} ({plan.steps[i]!r:.80}) is a text step and needs an LLM agent: {exc}"
                ) from None
            raise LLMUnavailableError(
                f"the plan{where} has no steps, so its task is a request for an LLM agent: {exc}"
            ) from None

    def _follower(self, task: str, plan: Any, request: str, plan_tasks: bool = False, **kw: Any) -> list[Session]:
        plans = self._plans(plan, "follower")
        sessions = []
        for i, (plan_file, p) in enumerate(plans):
            if not p.steps:
                raise PlanError(f"{plan_file or 'the plan'} has no steps for follower mode to run")
            agents = kw.get("agents") or self._needs_llm(p, plan_file)
            extra = dict(kw)
            extra["agents"] = agents
            if len(plans) > 1:
                extra.pop("session_id", None)
                extra.setdefault("id", i)
                extra["session_id"] = new_session_id(Path(plan_file or task).stem)
            own = p.task if plan_tasks and len(plans) > 1 else task
            sessions.append(self._session(own, "follower", plan=p, plan_file=plan_file, request=request, **extra))
        return sessions

    def _batch(self, task: str, plan: Any, plan_tasks: bool = False, **kw: Any) -> list[Session]:
        if plan is None or isinstance(plan, (Plan, Mapping)) or not Path(plan).is_dir():
            raise ModeError("batch_normal mode needs a folder of plans")
        plans = load_plan_folder_with_identity(Path(plan))
        report = self.last_batch = BatchReport(str(plan), len(plans))
        sessions: list[Session] = []
        for i, (path, p, identity) in enumerate(plans):
            sid = identity.session_id()
            state = stored_status(self.store, sid) if self.store.exists(sid) else None
            if state is not None and state.status == SessionStatus.FINISHED:
                report.skipped.append((str(path), sid, "already finished"))
                continue
            if state is not None and state.holder is not None:
                report.skipped.append((str(path), sid, f"being run by {state.holder}"))
                continue
            agents = kw.get("agents") or self._needs_llm(p, str(path))
            extra = {k: v for k, v in kw.items() if k not in ("session_id", "agents", "request", "plan", "plan_file")}
            if state is not None:
                retry = state.status in (SessionStatus.FAILED, SessionStatus.ERROR)
                # A continued session started with its variables and participants already.
                kept = {k: v for k, v in extra.items() if k not in ("context_vars", "participants", "user")}
                session = self.resume_session(sid, agents=agents, retry_failed=retry, **kept)
                report.continued.append((str(path), sid, state.status))
            else:
                extra.setdefault("id", i)
                session = self._session(
                    p.task if plan_tasks else task,
                    "batch_normal",
                    plan=p,
                    plan_file=str(path),
                    agents=agents,
                    session_id=sid,
                    ask_new_requests=False,
                    **extra,
                )
                report.new.append(str(path))
            sessions.append(session)
        return sessions

    def _service(self, task: str, plan: Any, request: str, **kw: Any) -> list[Session]:
        if self.remote_dispatcher_factory is None and "dispatcher" not in kw and "dispatcher_factory" not in kw:
            raise ServiceModeError(
                "service mode runs through `saucer serve`: its sessions run commands on a connected device, "
                "and the server supplies that remote dispatcher; to run on this machine use normal or follower mode"
            )
        if plan is not None:
            (plan_file, p), *rest = self._plans(plan, "service")
            if rest:
                raise ModeError("service mode takes one plan, not a folder")
            agents = kw.pop("agents", None) or self._needs_llm(p, plan_file)
            return [
                self._session(
                    task,
                    "service",
                    plan=p,
                    plan_file=plan_file,
                    request=request,
                    agents=agents,
                    ask_new_requests=False,
                    **kw,
                )
            ]
        if not request:
            raise ModeError("service mode needs a request or a plan")
        agents = kw.pop("agents", None) or self.agent_provider()
        return [self._session(task, "service", request=request, agents=agents, ask_new_requests=False, **kw)]
