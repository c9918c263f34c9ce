"""Live progress of running sessions (a :class:`~saucer.engine.observer.SessionObserver`).

One line per committed step — round, step, agent and state, every command
and its status, running cost — so the output reads the same in a terminal, a
pipe or a CI log. Pools add a progress bar with per-session status (see
:class:`saucer.engine.pool.SessionPool`). Every value is printed as it is
stored (rich ``Text``, never markup).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from saucer.cli.inspect import short
from saucer.cli.output import visible

if TYPE_CHECKING:
    from saucer.engine.round import Round
    from saucer.engine.session import Session

__all__ = ["StepPrinter"]

_STATUS_STYLE = {"success": "green", "failure": "red", "skipped": "yellow"}


class StepPrinter:
    """Prints each committed step of the sessions it observes."""

    def __init__(self, console: Console, *, show_session: bool = False) -> None:
        self.console = console
        self.show_session = show_session
        self._cost: dict[str, float | None] = {}

    def _line(self, session: Any) -> Text:
        line = Text()
        if self.show_session:
            line.append(visible(session.session_id), style="dim")
            line.append(" ")
        return line

    def on_session_start(self, session: Session) -> None:
        """Say which session runs (or resumes), in which mode, on which task."""
        what = "resuming" if session.resumed else "running"
        line = self._line(session)
        line.append(what, style="bold")
        line.append(" session ")
        line.append(visible(session.session_id), style="bold cyan")
        line.append(f" ({session.mode} mode, task {session.task!r})")
        self.console.print(line)

    def on_round_start(self, session: Session, round: Round) -> None:
        """Say which round starts, and its request."""
        request = round.request or ""
        line = self._line(session)
        line.append(f"round {round.id}", style="cyan")
        if request:
            line.append(f": {short(request, 90)}")
        self.console.print(line)

    def on_step(self, session: Any, record: Any) -> None:
        sid = session.session_id
        if record.cost is None:
            self._cost[sid] = None
        elif record.cost and self._cost.get(sid, 0.0) is not None:
            self._cost[sid] = (self._cost.get(sid) or 0.0) + record.cost
        line = self._line(session)
        line.append(f"  step {record.session_step} ")
        line.append(visible(record.agent), style="magenta")
        line.append(f"/{visible(record.state)}")
        for i, command in enumerate(record.commands or ()):  # every command of the step, each with its status
            result = record.results[i] if i < len(record.results or ()) else {}
            status = str(result.get("status", "-"))
            line.append("  " if i == 0 else ", ")
            line.append(f"{visible(str(command.get('tool_name', '?')))} ")
            line.append(status, style=_STATUS_STYLE.get(status, ""))
            error = str(result.get("error") or "").strip()
            if status == "failure" and error:
                line.append(f" {short(error.splitlines()[0], 100)}", style="dim")
        if not record.commands and record.subtask:
            line.append(f"  {short(record.subtask, 60)}")
        if record.error:
            line.append(f"  {short(record.error, 80)}", style="red")
        if sid in self._cost:
            cost = self._cost[sid]
            line.append("  cost unknown" if cost is None else f"  cost {cost:.4f}", style="yellow")
        self.console.print(line)

    def on_session_end(self, session: Any, result: Any) -> None:
        line = self._line(session)
        line.append(f"session {visible(result.session_id)} {result.status}", style="green" if result.ok else "red")
        if result.reason and not result.ok:
            line.append(f": {short(result.reason, 200)}")
        self.console.print(line)
