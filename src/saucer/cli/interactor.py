"""Questions to the user, as rich panels (UFO's interactor).

Without a terminal on standard input (CI, pipes) nothing waits for input and
these documented defaults apply:

================================  =============================================
``first_request``                 None: no request (pass ``--request`` or ``--plan``)
``new_request``                   ``("", True)``: finish the session (UFO's ``(request, complete)``)
``experience_asker``              do not save (``--yes``: save)
``batch_experience_asker``        not asked: a pool treats ``ask`` as ``auto``
``question_asker``                empty answer
``sensitive_step_asker``          a pending approval in the session (``saucer approve``; ``--yes``: approve;
                                  ``approvals.timeout = 0``: refuse, the failed result says to pass ``--yes``)
================================  =============================================

Panels show an agent's question or a command's parameters exactly as they
are (rich ``Text``, never markup).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.prompt import Confirm, Prompt
from rich.text import Text

__all__ = ["RichInteractor", "stdin_is_terminal"]


def stdin_is_terminal() -> bool:
    """True when standard input is an interactive terminal."""
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):
        return False


class RichInteractor:
    """Asks the user through rich panels; applies the defaults above without a terminal.

    Implements :class:`saucer.engine.interactor.Interactor`. Its methods block
    on the terminal, so ``blocking = True`` tells the engine to call them in a
    worker thread while other sessions keep running.
    """

    blocking = True

    def __init__(
        self,
        console: Console | None = None,
        *,
        assume_yes: bool = False,
        interactive: bool | None = None,
    ) -> None:
        self.console = console or Console(stderr=True)
        self.assume_yes = assume_yes
        self._interactive: Callable[[], bool] = (lambda: interactive) if interactive is not None else stdin_is_terminal

    @property
    def interactive(self) -> bool:
        """Whether questions are actually asked."""
        return bool(self._interactive())

    def _panel(self, text: str | Text, title: str, style: str = "cyan") -> None:
        body = text if isinstance(text, Text) else Text(text)
        self.console.print(Panel(body, title=Text(title), border_style=style, expand=False))

    def first_request(self) -> str | None:
        """The session's first request (None without a terminal)."""
        if not self.interactive:
            return None
        self._panel("Welcome to saucer. What should the agents do?", "new session")
        while True:
            text = Prompt.ask("[bold]request[/]", console=self.console).strip()
            if text:
                return text

    def new_request(self) -> tuple[str, bool]:
        """UFO's ``(request, complete)``: complete when the user types N (or there is no terminal)."""
        if not self.interactive:
            return "", True
        self._panel("Enter your next request, or N to finish the session.", "next round")
        text = Prompt.ask("[bold]request[/]", console=self.console).strip()
        if text.upper() in ("N", ""):
            return "", True
        return text, False

    def experience_asker(self) -> bool:
        """Whether to save this session as a replayable plan."""
        if not self.interactive:
            return self.assume_yes
        self._panel("Save this session as a replayable plan (experience)?", "experience")
        return Confirm.ask("save", default=False, console=self.console)

    def batch_experience_asker(self, count: int) -> bool:
        """Asked once for a pool: whether to save each of its sessions that succeeds as a replayable plan."""
        if not self.interactive:
            return self.assume_yes
        self._panel(
            f"Save each of the {count} sessions of this batch that succeeds as a replayable plan (experience)?",
            "experience",
        )
        return Confirm.ask("save", default=False, console=self.console)

    def question_asker(self, question: str, index: int = 0) -> str:
        """An agent's question to the user; the answer text."""
        if not self.interactive:
            return ""
        self._panel(question, f"question {index + 1}", "yellow")
        return Prompt.ask("[bold]answer[/]", console=self.console, default="")

    def sensitive_step_asker(self, action: str, target: str = "") -> bool:
        """Whether to run a sensitive step; defaults to no."""
        if self.assume_yes:
            return True
        if not self.interactive:
            return False
        text = Text(action, style="bold")
        if target:
            text.append("\n" + target)
        text.append("\n\nThis step is marked sensitive. Run it?")
        self._panel(text, "confirm", "red")
        return Confirm.ask("run it", default=False, console=self.console)

    def question_pending(self, question: Any) -> None:
        """The model's question waits as a pending question in the session: say how to answer it."""
        from saucer.cli.common import program_name

        sid, saucer = shlex.quote(question.session_id), program_name()
        text = Text(question.detail, style="bold")
        text.append(
            f"\n\nThere is no terminal to ask: this waits as question {question.number} of session "
            f"{question.session_id}. Answer from another terminal:\n  {saucer} answer {sid} {question.number} TEXT"
        )
        if question.timeout is not None:
            text.append(f'\nWithout an answer the model reads "no answer (timeout)" in {question.timeout:g} s.')
        self._panel(text, "the model asks", "yellow")

    def approval_pending(self, approval: Any) -> None:
        """A sensitive step waits as a pending approval in the session: say how to decide on it."""
        from saucer.cli.common import program_name

        sid, saucer = shlex.quote(approval.session_id), program_name()
        text = Text(f"{approval.action}\n{approval.detail}", style="bold")
        if approval.reason:
            text.append(f"\n{approval.reason}")
        text.append(
            f"\n\nThere is no terminal to ask: this step waits as approval {approval.number} of session "
            f"{approval.session_id}. Decide from another terminal:\n  {saucer} approve {sid} {approval.number}\n"
            f"  {saucer} refuse {sid} {approval.number} --reason TEXT"
        )
        if approval.timeout is not None:
            text.append(f"\nWithout a decision it is refused in {approval.timeout:g} s.")
        self._panel(text, "waiting for approval", "red")

    def refusal_reason(self) -> str | None:
        """Why a sensitive step was refused, when no one was asked (None: the user said no)."""
        if self.assume_yes or self.interactive:
            return None
        return "there is no terminal to ask for approval; run it again with --yes to approve sensitive steps"
