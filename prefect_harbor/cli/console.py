"""The command line's console: rich's, showing control characters in what it prints instead of obeying them.

rich drops a few controls (BEL, backspace, carriage return) but passes ESC and the C1 codes to
the terminal, so a row id, task name or message holding ``ESC [ 2 J`` would clear it. Every
string rich prints, table cells and titles included, becomes text through ``render_str``: one
place for :func:`~prefect_harbor.text.visible`.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from prefect_harbor.text import visible


class VisibleConsole(Console):
    """A rich ``Console`` whose strings go through :func:`~prefect_harbor.text.visible` before markup is read."""

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(visible(text), **options)
