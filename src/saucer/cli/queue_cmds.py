"""``saucer worker``, ``saucer queue status|retry|cancel`` and ``saucer run ... --queue``.

The queue lives in the store's PostgreSQL database (schema ``<store schema>_queue``),
so every command here takes the same ``--store`` as the rest of saucer; an
SQLite or memory store is refused with one sentence saying a queue needs
PostgreSQL. ``register(app)`` adds the commands to the ``saucer`` app.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from saucer.cli.common import (
    ConfigOption,
    StoreOption,
    UserError,
    console,
    err,
    friendly,
    program_name,
    settings_for,
    store_flag,
)
from saucer.cli.output import print_json, styled, visible

if TYPE_CHECKING:
    from saucer.queue import Enqueued, QueueClient

_T = TypeVar("_T")

__all__ = ["register", "queued_run", "migrate_queue_line", "WORKER_HELP"]

_ENDED = ("done", "failed", "cancelled")


@contextlib.contextmanager
def _queue_errors() -> Iterator[None]:
    from saucer.queue import QueueUnavailableError

    try:
        yield
    except (QueueUnavailableError, LookupError) as exc:
        raise UserError(str(exc.args[0]) if exc.args else str(exc)) from None


def _settings(store: str | None, config: Path | None, **flags: Any) -> Any:
    overrides: dict[str, Any] = {"store.url": store}
    overrides.update({k: v for k, v in flags.items() if v is not None})
    return settings_for(config, overrides)


def _client(settings: Any) -> QueueClient:
    from saucer.queue import QueueClient
    from saucer.store import open_store

    with _queue_errors():
        client = QueueClient(settings)
    client.store = open_store(settings.store.url)
    return client


async def _with_client(settings: Any, action: Callable[[QueueClient], Awaitable[_T]]) -> _T:
    client = _client(settings)
    try:
        with _queue_errors():
            async with client:
                return await action(client)
    finally:
        if client.store is not None:
            client.store.close()


# ================================================================ run --queue


def queued_run(
    settings: Any,
    *,
    plan: Path | None,
    request: str | None,
    task: str | None,
    session_id: str | None,
    workspace: Path | None,
    yes: bool,
    wait: bool,
    priority: int | None,
    queue_name: str | None,
    overrides: dict[str, Any],
    store_option: str | None,
    seed: dict[str, Any] | None = None,
) -> None:
    """Put a plan, a folder of plans or a request on the queue; with ``wait``, follow them to their end.
    ``seed``: the sessions' ``context_vars``, ``participants`` and ``user`` (see ``saucer run --var``)."""
    from saucer.queue import plan_jobs, request_job

    if plan is not None:
        if session_id is not None:
            raise UserError(
                "--session-id does not go with --queue --plan: a queued plan's session id is made from its path and content"
            )
        specs = plan_jobs(plan, task=task, workspace=workspace, yes=yes, overrides=overrides, **(seed or {}))
    else:
        specs = [
            request_job(
                request or "",
                task=task or "request",
                session_id=session_id,
                workspace=workspace,
                yes=yes,
                overrides=overrides,
                **(seed or {}),
            )
        ]

    async def enqueue(client: QueueClient) -> list[Enqueued]:
        return await client.enqueue(specs, queue=queue_name, priority=priority)

    import asyncio

    done = asyncio.run(_with_client(settings, enqueue))
    queued = [d for d in done if d.outcome != "skipped"]
    where = (
        f"{len(specs)} plan(s) in {plan}"
        if plan is not None and plan.is_dir()
        else ("1 plan" if plan is not None else "1 request")
    )
    console.print(
        f"{visible(where)}: {len(queued)} queued, {len(done) - len(queued)} skipped (queue {visible(queue_name or settings.queue.name)})"
    )
    for d in done:
        if d.outcome == "skipped":
            console.print(
                f"  skipped {visible(d.spec.source)}: {visible(d.why)} (session {visible(d.spec.session_id)})"
            )
        elif d.outcome == "requeued":
            console.print(
                f"  queued again {visible(d.spec.source)} (session {visible(d.spec.session_id)}, job {d.job_id})"
            )
    flag = store_flag(store_option)
    if not wait:
        console.print(f"workers run them: {program_name()} worker{flag}")
        console.print(f"follow them: {program_name()} queue status{flag}")
        return
    followed = {d.spec.session_id for d in done if d.outcome != "skipped" or d.why in ("already queued", "running")}
    _wait_for(settings, followed)


def _wait_for(settings: Any, sessions: set[str]) -> None:
    """A progress bar until every job of ``sessions`` has ended; exit 1 unless all of them finished."""
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from saucer.queue import queue_status

    async def follow(client: Any) -> list[Any]:
        with Progress(
            TextColumn("queue"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=not console.is_terminal,
        ) as bar:
            task_id = bar.add_task("", total=len(sessions))
            while True:  # the queue's tables only; the sessions' statuses are read once, at the end
                rows = [j for j in (await queue_status(client, sessions=False)).jobs if j.session_id in sessions]
                ended = [j for j in rows if j.state in _ENDED]
                running = sum(1 for j in rows if j.state == "running")
                bar.update(task_id, completed=len(ended), description=f"{running} running")
                if len(ended) >= len(sessions):
                    return [j for j in (await queue_status(client)).jobs if j.session_id in sessions]
                await asyncio.sleep(0.5)

    rows = asyncio.run(_with_client(settings, follow))
    bad = [j for j in rows if j.state != "done" or j.session not in ("finished",)]
    console.print(f"{len(rows) - len(bad)} of {len(rows)} finished")
    for j in bad:
        console.print(visible(f"  {job_line(j)}"), soft_wrap=True)
    if bad:
        raise typer.Exit(1)


# ===================================================================== worker

WORKER_HELP = """Take session jobs from the queue and run them (until SIGTERM or Ctrl-C).

Run as many as you like, on any hosts, against one PostgreSQL store. A
worker that dies has its sessions taken over by the others once its
heartbeats stop (queue.stalled_after) and its session leases expire
(store.lease_ttl): they continue at the first uncommitted step. On SIGTERM a
worker takes no new job, lets its sessions run on for queue.shutdown_timeout
seconds, then hands the rest back to the queue.
"""


def _worker_cmd(
    concurrency: int | None = typer.Option(
        None, "--concurrency", "-c", min=1, help="Sessions run at once. Default: queue.concurrency (4)."
    ),
    queue: list[str] | None = typer.Option(
        None, "--queue", "-q", help="Queue to take jobs from (repeat for several). Default: queue.name."
    ),
    log_level: str = typer.Option("info", "--log-level", help="critical, error, warning, info or debug."),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    from saucer.queue import run_worker

    if log_level.lower() not in ("critical", "error", "warning", "info", "debug"):
        raise UserError(f"--log-level {log_level!r}: use critical, error, warning, info or debug")
    settings = _settings(store, config)
    import logging

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("procrastinate").setLevel(max(logging.WARNING, logging.getLogger().level))
    names = queue or [settings.queue.name]
    err.print(
        f"saucer worker on queue(s) {', '.join(names)} of {_display(settings)}, {concurrency or settings.queue.concurrency} at once"
    )
    with _queue_errors():
        import asyncio

        runner = asyncio.run(
            run_worker(
                settings,
                queues=names,
                concurrency=concurrency,
                observer=_WorkerLog(),
                report=lambda line: err.print(visible(line), soft_wrap=True),
            )
        )
    err.print(f"saucer worker stopped after {len(runner.finished)} session(s)")


def _display(settings: Any) -> str:
    from saucer.queue import queue_location

    with _queue_errors():
        return queue_location(settings.store.url).display


class _WorkerLog:
    """One line per session start and end on the worker's stderr."""

    def on_session_start(self, session: Any) -> None:
        how = "continuing" if session.resumed else "starting"
        err.print(styled(f"{time.strftime('%H:%M:%S')} {how} session ", (visible(session.session_id), "bold")))

    def on_session_end(self, session: Any, result: Any) -> None:
        err.print(
            styled(f"{time.strftime('%H:%M:%S')} session ", (visible(result.session_id), "bold"), f" {result.status}")
        )


# ================================================================= queue ...

queue_app = typer.Typer(help="The job queue of a PostgreSQL store: status, retry, cancel.", no_args_is_help=True)

SessionsArgument = typer.Argument(None, help="Session ids (or unique prefixes) of queued jobs.")


@queue_app.command("status")
@friendly
def status_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print the counts and every job as JSON."),
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Every job: queued, running (on which worker), done, failed, cancelled, and how many were retried."""
    import asyncio

    from rich.table import Table

    from saucer.queue import queue_status

    status = asyncio.run(_with_client(_settings(store, config), queue_status))
    if as_json:
        print_json(status.to_dict())
        return
    counts = status.counts()
    console.print(
        ", ".join(f"{counts[k]} {k}" for k in ("queued", "running", "done", "failed", "cancelled", "retried"))
        + f" · {counts['total']} jobs"
    )
    if not status.jobs:
        return
    columns = ("session", "state", "session status", "worker", "retries", "queue", "source")
    rows = [
        (
            visible(j.session_id),
            j.state,
            j.session or "-",
            visible(j.worker or "-"),
            str(j.retries),
            visible(j.queue),
            visible(j.source),
        )
        for j in status.jobs
    ]
    if console.is_terminal:
        table = Table(*columns, show_edge=False)
        for row in rows:
            table.add_row(*row)
        console.print(table)
    else:  # piped: plain lines, one per job, never a box table
        print("\t".join(columns))
        for row in rows:
            print("\t".join(row))
    failed = [j for j in status.jobs if j.reason]
    if failed:
        console.print("why they failed:")
        for j in failed:
            console.print(visible(f"  {job_line(j)}"), soft_wrap=True)


def job_line(job: Any) -> str:
    """One line for a job that did not finish: ``SESSION: STATE, session STATUS: REASON``."""
    line = f"{job.session_id}: {job.state}" + (f", session {job.session}" if job.session else "")
    return line + (f": {job.reason}" if job.reason else "")


@queue_app.command("retry")
@friendly
def retry_cmd(
    sessions: list[str] | None = SessionsArgument,
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Queue failed and cancelled jobs again (the named ones, or all); each continues at its first uncommitted step."""
    import asyncio

    from saucer.queue import retry_jobs

    done = asyncio.run(_with_client(_settings(store, config), lambda c: retry_jobs(c, list(sessions or []))))
    _report(done, "failed or cancelled jobs")


@queue_app.command("cancel")
@friendly
def cancel_cmd(
    sessions: list[str] | None = SessionsArgument,
    store: str | None = StoreOption,
    config: Path | None = ConfigOption,
) -> None:
    """Cancel jobs (the named ones, or every queued one); a running one is stopped within seconds and keeps the steps it committed."""
    import asyncio

    from saucer.queue import cancel_jobs

    done = asyncio.run(_with_client(_settings(store, config), lambda c: cancel_jobs(c, list(sessions or []))))
    _report(done, "queued jobs")


def _report(done: list[tuple[str, str]], what: str) -> None:
    if not done:
        console.print(f"no {what}")
    for sid, outcome in done:
        console.print(f"{visible(sid)}: {visible(outcome)}")


def register(app: typer.Typer) -> None:
    """Add ``worker`` and ``queue`` to the ``saucer`` app."""
    app.command("worker", help=WORKER_HELP)(friendly(_worker_cmd))
    app.add_typer(queue_app, name="queue")


def migrate_queue_line(store_url: str) -> str:
    """Create or check the queue schema of a PostgreSQL store (``saucer store migrate``); one line saying where it is."""
    from saucer.queue import migrate_queue, queue_location

    with _queue_errors():
        location = queue_location(store_url)
        version, made_by = migrate_queue(location)
    return f"queue schema {location.schema} is at version {version} (procrastinate {made_by})"
