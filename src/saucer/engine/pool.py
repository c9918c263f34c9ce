"""``SessionPool``: run many sessions concurrently, each isolated from the others.

A session that fails, or whose run raises, becomes an ``error`` result; the
others carry on. A session another runner claimed first (it created the
session, or holds its lease) is not run: its result is ``skipped``. A pool
never stops a session to ask ``save_experience``: it asks once, before it
starts. Results come back in the order the sessions were given. The
sessions' local dispatchers share their tool servers (one per server and
configuration for the whole pool, see :mod:`saucer.dispatch.shared`), so a
pool of 1,000 sessions starts each server once.
With ``progress=True`` a rich progress bar shows how many sessions are done;
:meth:`SessionPool.summary_table` renders the results.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from saucer.dispatch.shared import share_tool_servers
from saucer.engine.accounting import CostSummary
from saucer.engine.session import Session, SessionResult, SessionStatus
from saucer.store import LeaseHeldError, SessionExistsError

__all__ = ["SessionPool"]


class _ProgressObserver:
    """A rich progress bar: one tick per finished session, the last status in the description."""

    def __init__(self, total: int, console: Any = None) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("[bold]sessions"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task("", total=total)
        self.counts: Counter[str] = Counter()

    def on_session_end(self, session: Session, result: SessionResult) -> None:
        self.counts[result.status] += 1
        text = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        self.progress.update(self.task, advance=1, description=text)


class SessionPool:
    """Run ``sessions`` with at most ``max_concurrency`` at a time."""

    def __init__(
        self,
        sessions: Iterable[Session],
        max_concurrency: int = 4,
        *,
        observer: Any = None,
        progress: bool = False,
        console: Any = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self.sessions: list[Session] = list(sessions)
        self.max_concurrency = max_concurrency
        self.observer = observer
        self.progress = progress
        self.console = console
        self.results: list[SessionResult] = []
        self.wall_time = 0.0

    async def run_all(self) -> list[SessionResult]:
        """Run every session; return their results in order (never raises for a session's failure)."""
        started = time.perf_counter()
        await self._decide_experience()
        bar = _ProgressObserver(len(self.sessions), self.console) if self.progress else None
        extra = [o for o in (self.observer, bar) if o is not None]
        if extra:
            for session in self.sessions:
                session.add_observers(*extra)
        results: list[SessionResult | None] = [None] * len(self.sessions)
        work = iter(enumerate(self.sessions))

        async def worker() -> None:
            for index, session in work:
                results[index] = await self._run_one(session)

        if bar is not None:
            bar.progress.start()
        try:
            async with share_tool_servers():
                await asyncio.gather(*(worker() for _ in range(min(self.max_concurrency, len(self.sessions)))))
        finally:
            if bar is not None:
                bar.progress.stop()
        self.results = [r for r in results if r is not None]
        self.wall_time = time.perf_counter() - started
        return self.results

    async def _decide_experience(self) -> None:
        """``save_experience = "ask"`` is asked once for the whole pool, before it starts.

        No session of a pool stops to ask on its own. Without anyone to ask
        (an interactor that is not interactive) it is treated as ``auto``.
        """
        asking = [s for s in self.sessions if (s.save_experience or s.settings.system.save_experience) == "ask"]
        if len(self.sessions) < 2 or not asking:
            return
        channel = asking[0].user_channel
        if channel.present and channel.interactive(True):
            decision = "always" if await channel.batch_experience_asker(len(asking)) else "always_not"
        else:
            decision = "auto"
        for session in asking:
            session.save_experience = decision

    @staticmethod
    async def _run_one(session: Session) -> SessionResult:
        try:
            return await session.run()
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except (SessionExistsError, LeaseHeldError) as exc:
            # Another runner claimed the session first (created it, or holds its lease): not ours to run.
            result = SessionResult(
                session_id=session.session_id,
                task=session.task,
                mode=session.mode,
                status=SessionStatus.SKIPPED,
                reason=f"claimed by another run ({exc})",
            )
        except Exception as exc:  # noqa: BLE001 - one session's crash never stops the others
            result = SessionResult(
                session_id=session.session_id,
                task=session.task,
                mode=session.mode,
                status=SessionStatus.ERROR,
                reason=str(exc),
                error=f"{type(exc).__name__}: {exc}",
                cost=CostSummary(),
            )
        with contextlib.suppress(Exception):  # an observer's failure never hides the result
            await session.notify("on_session_end", session, result)
        return result

    def counts(self) -> dict[str, int]:
        """How many sessions ended in each status."""
        return dict(Counter(r.status for r in self.results))

    def summary_table(self, results: Sequence[SessionResult] | None = None) -> Any:
        """A rich Table: session, status, rounds, steps, cost, reason."""
        from rich.table import Table
        from rich.text import Text

        rows = self.results if results is None else results
        counts = ", ".join(f"{k} {v}" for k, v in sorted(Counter(r.status for r in rows).items()))
        table = Table(title=Text(f"{len(rows)} session(s): {counts}"))
        table.add_column("session", no_wrap=True)
        for column in ("status", "rounds", "steps", "cost", "reason"):
            table.add_column(column, overflow="fold")
        style = {"finished": "green", "failed": "red", "error": "red", "stopped": "yellow", "skipped": "dim"}
        for r in rows:
            ran = r.status != SessionStatus.SKIPPED
            reason = (r.error or r.reason or "").strip()
            # Text cells: a reason or an id is shown as it is, never read as markup.
            table.add_row(
                Text(r.session_id),
                Text(r.status, style=style.get(r.status, "")),
                Text(str(r.rounds) if ran else "-"),
                Text(str(r.steps) if ran else "-"),
                Text("-" if not ran else "unknown" if r.cost.unknown else f"{r.cost.known:.4f}"),
                Text(reason.splitlines()[0][:160] if reason else ""),
            )
        return table
