"""Live progress of running sessions (a :class:`~saucer.engine.observer.SessionObserver`).

One line per committed step — round, step, agent and state, the last command
and its status, running cost — so the output reads the same in a terminal, a
pipe or a CI log. Pools add a progress bar with per-session status (see
:class:`saucer.engine.pool.SessionPool`).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from saucer.cli.inspect import short

__all__ = ["StepPrinter"]

_STATUS_STYLE = {"success": "green", "failure": "red", "skipped": "yellow"}


class StepPrinter:
    """Prints each committed step of the sessions it observes."""

    def __init__(self, console: Console, *, show_session: bool = False) -> None:
        self.console = console
        self.show_session = show_session
        self._cost: dict[str, float] = {}

    def _prefix(self, session: Any) -> str:
        return f"[dim]{escape(session.session_id)}[/] " if self.show_session else ""

    def on_session_start(self, session: Any) -> None:
        what = "resuming" if getattr(session, "_resuming", False) else "running"
        self.console.print(
            f"{self._prefix(session)}[bold]{what}[/] session [bold cyan]{escape(session.session_id)}[/] "
            f"({escape(session.mode)} mode, task {escape(session.task)!r})"
        )

    def on_round_start(self, session: Any, round: Any) -> None:
        request = getattr(round, "request", "") or ""
        self.console.print(
            f"{self._prefix(session)}[cyan]round {getattr(round, 'id', '?')}[/]"
            + (f": {escape(short(request, 90))}" if request else "")
        )

    def on_step(self, session: Any, record: Any) -> None:
        if record.cost:
            self._cost[session.session_id] = self._cost.get(session.session_id, 0.0) + record.cost
        line = f"{self._prefix(session)}  step {record.session_step} [magenta]{escape(record.agent)}[/]/{escape(record.state)}"
        if record.commands:
            last = record.commands[-1]
            status = record.results[-1].get("status", "-") if record.results else "-"
            style = _STATUS_STYLE.get(status, "")
            line += f"  {escape(str(last.get('tool_name', '?')))} [{style}]{escape(str(status))}[/]"
            if status == "failure" and record.results[-1].get("error"):
                line += f" [dim]{escape(short(record.results[-1]['error'], 80))}[/]"
        elif record.subtask:
            line += f"  {escape(short(record.subtask, 60))}"
        if record.error:
            line += f"  [red]{escape(short(record.error, 80))}[/]"
        cost = self._cost.get(session.session_id)
        if cost:
            line += f"  [yellow]cost {cost:.4f}[/]"
        self.console.print(line)

    def on_session_end(self, session: Any, result: Any) -> None:
        style = "green" if result.ok else "red"
        self.console.print(
            f"{self._prefix(session)}[{style}]session {escape(result.session_id)} {escape(str(result.status))}[/]"
            + (f": {escape(result.reason)}" if result.reason and not result.ok else "")
        )
