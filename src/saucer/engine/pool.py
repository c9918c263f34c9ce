"""``SessionPool``: run many sessions concurrently, each isolated from the others.

A session that fails, or whose run raises, becomes an ``error`` result; the
others carry on. Results come back in the order the sessions were given.
With ``progress=True`` a rich progress bar shows how many sessions are done;
:meth:`SessionPool.summary_table` renders the results.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any, Iterable, Sequence

from saucer.engine.accounting import CostSummary
from saucer.engine.observer import CompositeObserver, ObserverCaller
from saucer.engine.session import Session, SessionResult, SessionStatus

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
        bar = _ProgressObserver(len(self.sessions), self.console) if self.progress else None
        extra = [o for o in (self.observer, bar) if o is not None]
        if extra:
            for session in self.sessions:
                session._notify = ObserverCaller(CompositeObserver([session.observer, *extra]))
        results: list[SessionResult | None] = [None] * len(self.sessions)
        work = iter(enumerate(self.sessions))

        async def worker() -> None:
            for index, session in work:
                results[index] = await self._run_one(session)

        if bar is not None:
            bar.progress.start()
        try:
            await asyncio.gather(*(worker() for _ in range(min(self.max_concurrency, len(self.sessions)))))
        finally:
            if bar is not None:
                bar.progress.stop()
        self.results = [r for r in results if r is not None]
        self.wall_time = time.perf_counter() - started
        return self.results

    @staticmethod
    async def _run_one(session: Session) -> SessionResult:
        try:
            return await session.run()
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
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
            try:
                await session._notify("on_session_end", session, result)
            except Exception:  # noqa: BLE001
                pass
            return result

    def counts(self) -> dict[str, int]:
        """How many sessions ended in each status."""
        return dict(Counter(r.status for r in self.results))

    def summary_table(self, results: Sequence[SessionResult] | None = None) -> Any:
        """A rich Table: session, status, rounds, steps, cost, reason."""
        from rich.table import Table

        rows = self.results if results is None else results
        table = Table(title=f"{len(rows)} session(s): " + ", ".join(f"{k} {v}" for k, v in sorted(Counter(r.status for r in rows).items())))
        for column in ("session", "status", "rounds", "steps", "cost", "reason"):
            table.add_column(column, overflow="fold")
        style = {"finished": "green", "failed": "red", "error": "red", "stopped": "yellow"}
        for r in rows:
            table.add_row(
                r.session_id,
                f"[{style.get(r.status, '')}]{r.status}[/]" if r.status in style else r.status,
                str(r.rounds),
                str(r.steps),
                f"{r.cost.total:.4f}" + ("?" if r.cost.unknown else ""),
                (r.error or r.reason or "")[:120],
            )
        return table
