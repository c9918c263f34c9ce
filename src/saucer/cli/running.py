"""``saucer run``, ``saucer resume`` and ``saucer demo``: sessions run from the command line.

Plans are checked against the tools before anything runs. After a run, the
commands printed as "next" are computed from that session and work as
printed. Ctrl-C prints the exact command that continues the work.
"""

from __future__ import annotations

import gc
import shlex
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.rule import Rule

from saucer.cli import timeline
from saucer.cli.common import (
    ConfigOption,
    StoreOption,
    UserError,
    console,
    err,
    fail,
    friendly,
    local_user,
    open_existing_store,
    parse_vars,
    program_name,
    resolve_session,
    settings_for,
    store_flag,
)
from saucer.cli.output import styled, visible
from saucer.cli.ui_cmd import ui_command
from saucer.store import EventStore

if TYPE_CHECKING:
    from saucer.engine.result import SessionResult

__all__ = ["run_cmd", "resume_cmd", "demo_cmd"]

ModeOption = typer.Option(
    None,
    "--mode",
    help="normal (a request, answered by the LLM agent), follower (a plan), batch_normal (a folder of plans), "
    "operator (a request carried out on the X11 desktop by a model that sees screenshots), normal_operator "
    "(operator with the shell and files tools too) or service (through saucer serve). "
    "Default: follower for a plan file, batch_normal for a folder, normal for a request.",
)

_ENDED_BADLY = ("failed", "error")


@contextmanager
def _kept_for_good() -> Iterator[None]:
    """What a run makes while it starts (the modules it imports, the settings, the factory) lives as long
    as the process. So the cycle collector stays off while it is made (its passes would walk the growing
    heap and find next to nothing: ~5% of a one-step run's CPU) and it is frozen out of the collector's way
    afterwards (its later full passes and the two at exit skip it: ~40 ms). What the sessions make stays
    collectable; what failed to start is not frozen."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()  # also zeroes the collector's count of new objects: no pass falls due on leaving
    finally:
        if enabled:
            gc.enable()


def _run_settings(config: Path | None, store: str | None, **flags: Any) -> Any:
    overrides: dict[str, Any] = {"store.url": store}
    overrides.update({k: v for k, v in flags.items() if v is not None})
    with _kept_for_good():
        return settings_for(config, overrides)


NoInputOption = typer.Option(
    False,
    "--no-input",
    help="Never ask at the terminal: a sensitive step waits as a pending approval (saucer approve / refuse), a model's question as a pending question (saucer answer).",
)
ApprovalTimeoutOption = typer.Option(
    None,
    "--approval-timeout",
    min=0,
    help="Seconds a pending approval waits before it is refused by timeout (0: refuse at once). Default: approvals.timeout, 300.",
)


def _factory(
    settings: Any, yes: bool, workspace: Path | None, show_session: bool = False, no_input: bool = False
) -> Any:
    with _kept_for_good():
        from saucer.cli.interactor import RichInteractor
        from saucer.cli.progress import StepPrinter
        from saucer.engine.factory import SessionFactory

        return SessionFactory(
            settings,
            interactor=RichInteractor(err, assume_yes=yes, interactive=False if no_input else None),
            observer=StepPrinter(console, show_session=show_session),
            workspace=workspace,
        )


async def _run_sessions(factory: Any, sessions: list[Any], concurrency: int, pooled: bool) -> list[Any]:
    """Check every plan against the tools, then run the sessions (a pool for a batch), on one set of tool servers."""
    from saucer.dispatch.shared import share_tool_servers

    async with share_tool_servers():
        return await _check_and_run(factory, sessions, concurrency, pooled)


async def _check_and_run(factory: Any, sessions: list[Any], concurrency: int, pooled: bool) -> list[Any]:
    await factory.check_plans(sessions)
    _say_confinement(factory.settings, factory.workspace)
    if factory.last_batch is not None:
        for line in factory.last_batch.lines():
            console.print(line)
    if not sessions:
        return []
    if len(sessions) == 1 and not pooled:
        return [await sessions[0].run()]
    from saucer.engine.pool import SessionPool  # a batch's: one session runs without it

    pool = SessionPool(sessions, max_concurrency=concurrency, progress=True, console=console)
    results = await pool.run_all()
    console.print(pool.summary_table())
    return results


def _say_confinement(settings: Any, workspace: Path | None) -> None:
    """Once the plans are checked, before anything runs: on stderr, the confinement the built-in tools' commands run under (the line of ``saucer doctor``)."""
    if settings.mcp.servers and not settings.desktop.enabled:
        return  # the configured servers run their commands their own way
    from saucer.dispatch.servers import confinement_summary

    err.print(visible(confinement_summary(settings.shell, workspace or Path.cwd())), markup=False, highlight=False)


def _print_result(result: SessionResult) -> None:
    line = styled((f"session {visible(result.session_id)}: {result.status}", "green" if result.ok else "red"))
    if result.reason:
        line.append(f" ({visible(result.reason)})")
    console.print(line)
    console.print(result.cost.render())
    if result.log_path:
        console.print(f"logs: {result.log_path}")
    if result.experience_path:
        console.print(f"experience saved as a replayable plan: {result.experience_path}")


def _exit_for(results: Sequence[Any]) -> None:
    if not all(r.ok or r.status == "skipped" for r in results):
        raise typer.Exit(1)


def _next_steps(store: EventStore, session_id: str, status: str, flag: str) -> list[tuple[str, str]]:
    """(what it does, command) pairs that work on this session as it is now."""
    events = list(store.read(session_id))
    head = events[-1].version if events else 0
    steps = [e.version for e in events if e.meta.get("kind") == "step"]
    sid = shlex.quote(session_id)
    pairs = [
        ("the timeline: rounds, steps, commands, results", f"show {sid}"),
        ("every change with its version, author, round and step", f"history {sid}"),
    ]
    if steps:
        at = steps[0]
        pairs.append(
            (f"time travel: the Context as it was after the first step (version {at})", f"state {sid} --at {at}")
        )
        if head > at:
            pairs.append((f"what changed from version {at} to the last one ({head})", f"diff {sid} {at} {head}"))
        pairs.append(
            (
                f"branch off a new session from version {at}, in its own new workspace "
                "(a fork never touches this one's)",
                f"fork {sid} --at {at}",
            )
        )
    if status in _ENDED_BADLY:
        pairs.append(("run the failed step again, then go on", f"resume --retry-failed {sid}"))
    elif status == "stopped":
        pairs.append(("continue where the limit stopped it", f"resume {sid}"))
    return [(comment, f"{program_name()} {command}{flag}") for comment, command in pairs]


def _print_next_steps(store: EventStore, result: Any, store_option: str | None) -> None:
    console.print()
    console.print(styled(("next", "bold"), " (each works as printed):"))
    for comment, command in _next_steps(store, result.session_id, result.status, store_flag(store_option)):
        console.print(styled((f"  # {comment}", "dim")))
        console.print(f"  {command}")


def _interrupted(
    store: EventStore, session_ids: Sequence[str], store_option: str | None, yes: bool, batch: bool
) -> None:
    """Ctrl-C: say exactly how to continue, and exit 130."""
    if batch:
        again = shlex.join([*shlex.split(program_name()), *sys.argv[1:]])
        fail(f"interrupted; run the same command again to continue the batch: {again}", 130)
    started = [sid for sid in session_ids if store.exists(sid)]
    if not started:
        fail("interrupted before the session started; there is nothing to resume", 130)
    flags = (" --yes" if yes else "") + store_flag(store_option)
    fail(f"interrupted; continue with: {program_name()} resume {shlex.quote(started[0])}{flags}", 130)


@friendly
def run_cmd(
    request: str | None = typer.Option(
        None, "--request", "-r", help="What the agents should do, in plain language (normal mode)."
    ),
    plan: Path | None = typer.Option(None, "--plan", "-p", help="A plan JSON file, or a folder of them."),
    mode: str | None = ModeOption,
    task: str | None = typer.Option(None, "--task", help="Task name (default: the plan's task, or 'request')."),
    session_id: str | None = typer.Option(
        None, "--session-id", help="Id of the new session (default: generated). Not for a folder of plans."
    ),
    workspace: Path | None = typer.Option(
        None,
        "--workspace",
        "-w",
        help="Directory the built-in shell and files tools act in (default: the current directory).",
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Approve sensitive steps without asking."),
    no_input: bool = NoInputOption,
    approval_timeout: float | None = ApprovalTimeoutOption,
    concurrency: int = typer.Option(
        4, "--concurrency", "-c", min=1, help="Sessions run at once for a folder of plans."
    ),
    max_step: int | None = typer.Option(None, "--max-step", min=1, help="Override system.max_step."),
    max_round: int | None = typer.Option(None, "--max-round", min=0, help="Override system.max_round (0: no limit)."),
    durability: str | None = typer.Option(None, "--durability", help="step (default), strict or exit."),
    queue: bool = typer.Option(
        False,
        "--queue",
        help="Put the sessions on the queue for saucer worker processes (PostgreSQL stores), once per plan.",
    ),
    wait: bool = typer.Option(False, "--wait", help="With --queue: show their progress until all have ended."),
    priority: int | None = typer.Option(
        None, "--priority", help="With --queue: the jobs' priority (higher first). Default: queue.priority."
    ),
    queue_name: str | None = typer.Option(
        None, "--queue-name", help="With --queue: the queue to use. Default: queue.name."
    ),
    var: list[str] = typer.Option(
        [],
        "--var",
        help='KEY=JSON: a context variable the session starts with (repeatable; over the plan\'s "vars"), e.g. --var retries=3 --var phase=\'"draft"\'.',
    ),
    participant: list[str] = typer.Option(
        [],
        "--participant",
        help='NAME: another author allowed to write to the session while it runs (repeatable; with the plan\'s "participants"). None named: anyone may.',
    ),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Run a session: a request in plain language, a plan, or a folder of plans.

    With --queue the sessions go on the store's queue instead, for saucer
    worker processes on any hosts; a plan already queued, running or finished
    is not queued again.

    Every command of a plan is checked against the tools before anything runs.
    A folder of plans skips the plans that already finished, continues the
    stopped and interrupted ones and retries the failed step of failed ones;
    two runs over one folder never run a plan twice.
    """
    if request is not None and plan is not None:
        raise UserError("give --request TEXT or --plan FILE|DIR, not both")
    if request is None and plan is None and mode != "normal":
        raise UserError("give either --request TEXT or --plan FILE|DIR")
    if plan is not None and not plan.exists():
        raise UserError(f"no such plan file or folder: {plan}")
    mode = mode or ("normal" if plan is None else "batch_normal" if plan.is_dir() else "follower")
    if session_id is not None and plan is not None and plan.is_dir():
        raise UserError(
            "--session-id names one session; a folder of plans runs one session per plan, with ids made from the plans"
        )
    flags = {
        "system.max_step": max_step,
        "system.max_round": max_round,
        "store.durability": durability,
        "approvals.timeout": approval_timeout,
    }
    seed = {"context_vars": parse_vars(var), "participants": list(participant), "user": local_user()}
    settings = _run_settings(config, store, **flags)
    if queue or wait or priority is not None or queue_name is not None:
        if not queue:
            raise UserError("--wait, --priority and --queue-name go with --queue")
        from saucer.cli.queue_cmds import queued_run

        return queued_run(
            settings,
            plan=plan,
            request=request,
            task=task,
            session_id=session_id,
            workspace=workspace,
            yes=yes,
            wait=wait,
            priority=priority,
            queue_name=queue_name,
            overrides=flags,
            store_option=store,
            seed=seed,
        )
    if mode in ("operator", "normal_operator"):
        from saucer.agents.llm import require_model_settings

        require_model_settings(settings)
        if request is None or plan is not None:
            raise UserError(f"{mode} mode needs --request TEXT (a plan of desktop commands runs in follower mode)")
    if mode == "normal":
        from saucer.agents.llm import require_model_settings

        require_model_settings(settings)
        if request is None:
            from saucer.cli.interactor import stdin_is_terminal

            if not stdin_is_terminal():
                raise UserError("normal mode needs a request: pass --request TEXT (there is no terminal to ask)")
    if mode == "service":
        raise UserError("service-mode sessions run on a server: start it with saucer serve and submit tasks to it")
    if session_id is not None:
        from saucer.store.model import InvalidSessionIdError, check_session_id

        try:  # a bad id is the user's mistake: said before anything is started or printed
            check_session_id(session_id)
        except InvalidSessionIdError as exc:
            raise UserError(str(exc)) from None
    if workspace is not None:
        workspace.mkdir(parents=True, exist_ok=True)
    name = task or ("request" if plan is None else None)
    with _factory(
        settings, yes, workspace, show_session=plan is not None and plan.is_dir(), no_input=no_input
    ) as factory:
        if session_id is not None and factory.store.exists(session_id):
            raise UserError(
                f"session {session_id!r} already exists; continue it with: "
                f"{program_name()} resume {shlex.quote(session_id)}{store_flag(store)}"
            )
        extra: dict[str, Any] = {"session_id": session_id} if session_id is not None else {}
        if name is None and plan is not None:  # no --task: a plan names its session
            from saucer.engine.plan import load_plan

            name = load_plan(plan).task if plan.is_file() else plan.name
            if plan.is_dir():
                extra["plan_tasks"] = True  # each plan of the folder keeps its own task
        sessions = factory.create_session(name, mode, plan=plan, request=request or "", **extra, **seed)
        batch = mode == "batch_normal"
        try:
            import asyncio

            results = asyncio.run(_run_sessions(factory, sessions, concurrency, pooled=batch))
        except KeyboardInterrupt:
            _interrupted(factory.store, [s.session_id for s in sessions], store, yes, batch)
        if len(results) == 1 and not batch:
            _print_result(results[0])
            _print_next_steps(factory.store, results[0], store)
    _exit_for(results)


def _fork_without_workspace(store: EventStore, session_id: str) -> bool:
    from saucer.engine.cursor import fork_origin, stored_session_brief

    origin, _ = fork_origin(store.session_info_without_plan(session_id)[0])
    return origin is not None and not stored_session_brief(store, session_id)[0].get("workspace")


@friendly
def resume_cmd(
    session: str = typer.Argument(..., help="Session id, a unique prefix of one, or 'last'."),
    retry_failed: bool = typer.Option(
        False,
        "--retry-failed",
        help="For a failed session: run its failed step again (the failed attempt stays in the log), then go on.",
    ),
    workspace: Path | None = typer.Option(
        None, "--workspace", "-w", help="Tools directory (default: the session's own)."
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Approve sensitive steps without asking."),
    no_input: bool = NoInputOption,
    approval_timeout: float | None = ApprovalTimeoutOption,
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Continue a session at its first uncommitted step.

    An interrupted session continues where its runner vanished; a session a
    limit stopped continues with a fresh budget of max_step and max_round.
    A finished session only reports its result, and so does a failed one
    unless --retry-failed.
    """
    settings = _run_settings(config, store, **{"approvals.timeout": approval_timeout})
    with open_existing_store(store, config) as st:
        sid = resolve_session(st, session)
        if workspace is None and _fork_without_workspace(st, sid):
            fail(
                f"{sid} is a fork with no workspace of its own, and a fork never runs in its parent's; "
                f"give it one: {program_name()} resume {shlex.quote(sid)} --workspace DIR{store_flag(store)}"
            )
    if workspace is not None:
        workspace.mkdir(parents=True, exist_ok=True)
    with _factory(settings, yes, workspace, no_input=no_input) as factory:
        kw: dict[str, Any] = {"workspace": workspace} if workspace is not None else {}
        resumed = factory.resume_session(sid, retry_failed=retry_failed, **kw)
        try:
            import asyncio

            result = asyncio.run(resumed.run())
        except KeyboardInterrupt:
            _interrupted(factory.store, [sid], store, yes, batch=False)
        _print_result(result)
        again = f"{program_name()} resume{{}} {shlex.quote(sid)}{store_flag(store)}"
        if result.status in _ENDED_BADLY and not retry_failed:
            console.print("run the failed step again with: " + again.format(" --retry-failed"))
        elif result.status == "stopped":
            console.print("continue it with: " + again.format(""))
    _exit_for([result])


@friendly
def demo_cmd(
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Run the shipped demo: a plan that builds, edits and searches a small project with the built-in tools.

    No network and no API key needed. It ends with the session's timeline and
    the commands to inspect, time-travel and fork it.
    """
    from importlib.resources import files

    plan_path = Path(str(files("saucer.cli") / "demo_plan.json"))
    settings = _run_settings(config, store)
    run_id = uuid.uuid4().hex[:6]
    workspace = Path(".saucer") / "demo" / run_id
    workspace.mkdir(parents=True, exist_ok=True)
    console.print(Rule(styled(("saucer demo", "bold"))), width=min(console.width, 80))
    console.print(f"plan: {plan_path.name} · workspace: {workspace} · store: {settings.store.url}\n")
    with _factory(settings, True, workspace) as factory:
        sessions = factory.create_session("demo", "follower", plan=plan_path, session_id=f"demo-{run_id}")
        try:
            import asyncio

            [result] = asyncio.run(_run_sessions(factory, sessions, 1, pooled=False))
        except KeyboardInterrupt:
            _interrupted(factory.store, [sessions[0].session_id], store, True, batch=False)
        events = list(factory.store.read(result.session_id))
        console.print()
        console.print(timeline.timeline(events, f"session {result.session_id} · v{result.version}"))
        _print_result(result)
        _print_next_steps(factory.store, result, store)
    console.print(styled(("  # browse it in the web viewer (Ctrl-C stops the viewer)", "dim")))
    console.print(f"  {ui_command(program_name(), store_flag(store), result.session_id)}")
    _exit_for([result])
