"""The console every command prints through: tables that do not fit are folded, not squeezed.

rich prints at the terminal's width, and in a pipe or a file at ``COLUMNS`` when it is set,
else 80 columns. A table wider than that would be squeezed into columns a few characters wide
(or its cells cut short with "…"), so ``cli_console()`` prints such a table folded instead:
one block per row, the row's first cell as its heading and every other cell on a line of its
own under its column's name, nothing cut. A table that fits prints as it is.

Depends on: rich.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.measure import Measurement
from rich.protocol import rich_cast
from rich.table import Table
from rich.text import Text

__all__ = ["FittingConsole", "cli_console", "folded"]

_UNBOUNDED = 100_000  # columns: measuring at this width gives a table's unwrapped width


class FittingConsole(Console):
    """A rich ``Console`` whose ``print`` folds a table wider than the console."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(self.fitted(item) for item in objects), **kwargs)

    def fitted(self, renderable: Any) -> Any:
        """``renderable`` as it is, or folded when it is a table wider than the console."""
        cast = rich_cast(renderable)
        if not isinstance(cast, Table):
            return renderable
        unbounded = self.options.update(max_width=_UNBOUNDED)  # the table's natural width
        if Measurement.get(self, unbounded, cast).maximum <= self.width:
            return cast
        return folded(cast)


def cli_console() -> FittingConsole:
    return FittingConsole()


def folded(table: Table) -> Group:
    """``table`` as one block per row (and one for its footer): the first cell as the block's
    heading, then ``column  value`` lines, values wrapped within the width, never cut."""
    headers = [_plain(column.header) for column in table.columns]
    rows = [list(column.cells) for column in table.columns]
    blocks: list[Any] = []
    if table.title:
        blocks.append(_as_text(table.title))
    names = [f"  {header:<{max(map(len, headers[1:]), default=0)}}" for header in headers[1:]]
    for index in range(len(rows[0]) if rows else 0):
        blocks.append(_block(headers[0], names, [cells[index] for cells in rows]))
    if table.show_footer and any(_plain(column.footer) for column in table.columns):
        blocks.append(_block(headers[0], names, [column.footer for column in table.columns]))
    if table.caption:
        blocks.append(_as_text(table.caption))
    return Group(*blocks)


def _block(first: str, names: list[str], cells: list[Any]) -> Group:
    """One row: ``first`` (the first column's name) and its cell as the heading, then the
    other columns' ``names`` (indented, of one width) beside their cells; empty cells left out."""
    heading = " ".join(part for part in (first, _plain(cells[0])) if part)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)  # the column names
    grid.add_column(overflow="fold")  # the values wrap at the width, nothing cut
    for name, cell in zip(names, cells[1:]):
        if _plain(cell):
            grid.add_row(name, cell)
    return Group(Text(heading, style="bold"), grid)


def _plain(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, Text):
        return value.plain.strip()
    if isinstance(value, str):
        return Text.from_markup(value).plain.strip()
    return str(value)


def _as_text(value: Any) -> Any:
    return Text.from_markup(value) if isinstance(value, str) else value
