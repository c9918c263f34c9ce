"""Questions to the user, as rich panels (UFO's interactor).

Without a terminal on standard input (CI, pipes) nothing waits for input and
these documented defaults apply:

================================  =============================================
``first_request``                 None: no request (pass ``--request`` or ``--plan``)
``new_request``                   None: finish the session
``experience_asker``              do not save (``--yes``: save)
``question_asker``                empty answer
``sensitive_step_asker``          refuse (``--yes``: approve)
================================  =============================================
"""

from __future__ import annotations

import sys
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.prompt import Confirm, Prompt

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

    def _panel(self, text: str, title: str, style: str = "cyan") -> None:
        self.console.print(Panel(text, title=title, border_style=style, expand=False))

    def first_request(self) -> str | None:
        """The session's first request (None without a terminal)."""
        if not self.interactive:
            return None
        self._panel("Welcome to saucer. What should the agents do?", "new session")
        while True:
            text = Prompt.ask("[bold]request[/]", console=self.console).strip()
            if text:
                return text

    def new_request(self) -> str | None:
        """The next request, or None when the user types N (finish)."""
        if not self.interactive:
            return None
        self._panel("Enter your next request, or N to finish the session.", "next round")
        text = Prompt.ask("[bold]request[/]", console=self.console).strip()
        if text.upper() in ("N", ""):
            return None
        return text

    def experience_asker(self) -> bool:
        """Whether to save this session as a replayable plan."""
        if not self.interactive:
            return self.assume_yes
        self._panel("Save this session as a replayable plan (experience)?", "experience")
        return Confirm.ask("save", default=False, console=self.console)

    def question_asker(self, question: str, index: int = 0) -> str:
        """An agent's question to the user; the answer text."""
        if not self.interactive:
            return ""
        self._panel(escape(question), f"question {index + 1}", "yellow")
        return Prompt.ask("[bold]answer[/]", console=self.console, default="")

    def sensitive_step_asker(self, action: str, target: str = "") -> bool:
        """Whether to run a sensitive step; defaults to no."""
        if self.assume_yes:
            return True
        if not self.interactive:
            return False
        text = f"[bold]{escape(action)}[/]" + (f"\n{escape(target)}" if target else "")
        self._panel(text + "\n\nThis step is marked sensitive. Run it?", "confirm", "red")
        return Confirm.ask("run it", default=False, console=self.console)
