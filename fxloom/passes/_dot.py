"""DOT text and rendering for ``fxloom.passes.graph_drawer``: escaping, ``DotGraph``, ``dot``.

fxloom writes DOT source itself, so drawing needs no Python package; turning the source into
an image (svg, png, pdf, ...) runs Graphviz's ``dot`` program in a subprocess, and only that
needs Graphviz installed. ``DotGraph.to_graphviz()`` hands the source to the optional Python
``graphviz`` package (``pip install 'fxloom[draw]'``) for code that wants its API.

Escaping. Every label is an HTML-like label (``label=<...>``), whose text needs ``&``, ``<``,
``>`` and ``"`` as entities. Graphviz also expands backslash sequences in label text (``\\N``
becomes the node's name, ``\\G`` the graph's; ``\\\\`` is one backslash), so backslashes are
doubled first. Characters that are not printable (newlines, tabs, control characters, lone
surrogates) are shown as their Python escapes, so every label is one line of visible text.
Identifiers are always quoted (a node may be named ``graph`` or ``node``, which are DOT
keywords).

Depends on: the standard library (and, in ``to_graphviz`` only, the ``graphviz`` package).
"""

from __future__ import annotations

import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

__all__ = [
    "DotGraph",
    "GraphvizError",
    "GraphvizNotFoundError",
    "GraphvizWarning",
    "SOURCE_FORMATS",
    "html_text",
    "quote_id",
    "render",
]

# Formats written as fxloom's own DOT source, without running Graphviz. Any other format is
# handed to `dot -T<format>` (svg, png, pdf, jpg, ps, xdot, ...).
SOURCE_FORMATS = frozenset({"dot", "gv", "raw"})

INSTALL_HINT = (
    "install Graphviz: apt-get install graphviz (Debian/Ubuntu), dnf install graphviz "
    "(Fedora), brew install graphviz (macOS), conda install -c conda-forge graphviz, or see "
    "https://graphviz.org/download/"
)


class GraphvizNotFoundError(RuntimeError):
    """Graphviz's ``dot`` program is not on ``PATH``, so DOT source cannot become an image."""


class GraphvizError(RuntimeError):
    """``dot`` refused the source or the format; the message holds what ``dot`` printed."""


class GraphvizWarning(UserWarning):
    """``dot`` rendered the image but printed warnings (shown in the message)."""


def quote_id(identifier: str) -> str:
    r"""``identifier`` as a quoted DOT ID.

    >>> print(quote_id('graph'), quote_id('say "hi"'), quote_id('C:\\dir'))
    "graph" "say \"hi\"" "C:\\dir"
    """
    return '"' + identifier.replace("\\", "\\\\").replace('"', '\\"') + '"'


_HTML_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}


def html_text(text: str) -> str:
    r"""``text`` escaped to show literally inside an HTML-like label, on one line.

    >>> print(html_text('x -> "y" & <z> \\N' + chr(10)))
    x -&gt; &quot;y&quot; &amp; &lt;z&gt; \\N\\n
    """
    visible = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    visible = visible.replace("\\", "\\\\")
    return "".join(_HTML_ENTITIES.get(ch, ch) for ch in visible)


def render(source: str, format: str) -> bytes:
    """Run ``dot -T<format>`` on DOT ``source`` and return the image.

    Raises ``GraphvizNotFoundError`` (with how to install Graphviz) when ``dot`` is not on
    ``PATH`` and ``GraphvizError`` when ``dot`` fails; warns ``GraphvizWarning`` when it
    succeeds with warnings.
    """
    executable = shutil.which("dot")
    if executable is None:
        raise GraphvizNotFoundError(
            f"cannot render {format}: Graphviz's 'dot' program is not on PATH; {INSTALL_HINT}. "
            "DOT source needs no Graphviz: write a .dot file or use .source"
        )
    result = subprocess.run(
        [executable, f"-T{format}"], input=source.encode("utf-8"), capture_output=True
    )
    messages = result.stderr.decode("utf-8", errors="replace").strip()
    if result.returncode != 0:
        raise GraphvizError(
            f"'dot -T{format}' failed (exit status {result.returncode}): {messages or '(no message)'}"
        )
    if messages:
        warnings.warn(GraphvizWarning(f"'dot -T{format}': {messages}"), stacklevel=3)
    return result.stdout


def format_for_path(path: Path, format: str | None) -> str:
    """``format`` if given, else ``path``'s suffix (``out.svg`` -> ``svg``)."""
    if format is not None:
        return format.lower()
    suffix = path.suffix.lstrip(".").lower()
    if not suffix:
        raise ValueError(
            f"cannot tell which format to write {str(path)!r} in: give it a suffix "
            "(.svg, .png, .pdf, .dot) or pass format=..."
        )
    return suffix


class DotGraph:
    r"""A drawing as DOT source, with ways to render and save it.

    ``source`` is the DOT text (also ``str(graph)``); ``pipe(format)`` renders it with
    Graphviz's ``dot``; ``write(path)`` saves it in the format named by the path's suffix.
    The ``write_svg``/``create_svg``-style methods and ``to_string`` match pydot's
    ``Dot``, so code written for torch.fx's drawer runs unchanged.

    >>> graph = DotGraph("tiny", 'digraph "tiny" {\n  "a" -> "b";\n}\n')
    >>> print(graph.source)
    digraph "tiny" {
      "a" -> "b";
    }
    <BLANKLINE>
    """

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source

    def __str__(self) -> str:
        return self.source

    def __repr__(self) -> str:
        return f"<DotGraph {self.name!r}: {self.source.count(chr(10))} lines of DOT>"

    def pipe(self, format: str = "svg") -> bytes:
        """The drawing rendered as ``format`` by ``dot`` (raw DOT text for "dot"/"gv"/"raw")."""
        if format.lower() in SOURCE_FORMATS:
            return self.source.encode("utf-8")
        return render(self.source, format.lower())

    def write(self, path: str | Path, format: str | None = None) -> Path:
        """Save the drawing to ``path``, in ``format`` or else the format its suffix names.

        ``.dot``/``.gv`` save the DOT source (no Graphviz needed); anything else is rendered
        by ``dot`` first, so a failed render leaves no partial file. Returns the path.
        """
        path = Path(path)
        data = self.pipe(format_for_path(path, format))
        path.write_bytes(data)
        return path

    # pydot's names, as used with torch.fx's drawer (`get_dot_graph().write_svg(path)`).
    def to_string(self) -> str:
        return self.source

    def create_svg(self) -> bytes:
        return self.pipe("svg")

    def create_png(self) -> bytes:
        return self.pipe("png")

    def write_svg(self, path: str | Path) -> Path:
        return self.write(path, "svg")

    def write_png(self, path: str | Path) -> Path:
        return self.write(path, "png")

    def write_pdf(self, path: str | Path) -> Path:
        return self.write(path, "pdf")

    def write_raw(self, path: str | Path) -> Path:
        return self.write(path, "dot")

    def to_graphviz(self) -> Any:
        """The drawing as a ``graphviz.Source`` (needs the ``graphviz`` Python package)."""
        try:
            import graphviz
        except ModuleNotFoundError:
            raise ModuleNotFoundError(
                "DotGraph.to_graphviz() needs the Python 'graphviz' package: "
                "pip install 'fxloom[draw]' (or pip install graphviz). Drawing itself does not: "
                "use .source, .write(path) or .pipe(format)"
            ) from None
        return graphviz.Source(self.source, filename=f"{self.name}.gv")

    def _repr_svg_(self) -> str | None:
        # Jupyter shows the SVG when Graphviz is installed, and the repr otherwise.
        if shutil.which("dot") is None:
            return None
        return self.pipe("svg").decode("utf-8")
