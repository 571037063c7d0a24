"""Report prose kept as Markdown files with named blocks, filled with ``str.format``.

    from pipeline.report.templates import Templates
    text = Templates("pipeline.report", "templates/sections.md")
    text("intro", encoder="toy", ...)              # one block, its fields filled

A template file is Markdown; a line ``<!-- name -->`` (a kebab-case name alone in an HTML
comment) starts the block ``name``, which runs to the next such line. Anything before the
first marker is a note for the reader and is ignored. Paragraphs may be wrapped at any
width: the lines of a paragraph are joined with single spaces (Markdown renders a soft
break as a space), paragraphs stay separated by one blank line. Fields are ``str.format``
fields (``{total:,}``); a literal brace is written ``{{`` or ``}}``.
"""

from __future__ import annotations

import re
from functools import cached_property
from importlib import resources

_MARKER = re.compile(r"^<!-- ([a-z0-9]+(?:-[a-z0-9]+)*) -->$")


def parse_blocks(text: str) -> dict[str, str]:
    """``{name: block}`` of a template file's text, each paragraph unwrapped to one line."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        m = _MARKER.match(line.strip())
        if m:
            if m.group(1) in blocks:
                raise ValueError(f"template block {m.group(1)!r} is defined twice")
            current = blocks[m.group(1)] = []
        elif current is not None:
            current.append(line.strip())
    return {name: _unwrap(lines) for name, lines in blocks.items()}


def _unwrap(lines: list[str]) -> str:
    paragraphs, para = [], []
    for line in [*lines, ""]:
        if line:
            para.append(line)
        elif para:
            paragraphs.append(" ".join(para))
            para = []
    return "\n\n".join(paragraphs)


class Templates:
    """The named blocks of one template file shipped in ``package`` (read on first use).

    Args:
        package: dotted package holding the file ("pipeline.scorers.bindclip").
        resource: the file's path inside the package ("report.md").
    """

    def __init__(self, package: str, resource: str) -> None:
        self.package = package
        self.resource = resource

    @cached_property
    def blocks(self) -> dict[str, str]:
        path = resources.files(self.package).joinpath(self.resource)
        return parse_blocks(path.read_text(encoding="utf-8"))

    def __call__(self, name: str, **fields) -> str:
        """Block ``name`` with its fields filled; unknown names list the file's blocks."""
        if name not in self.blocks:
            raise KeyError(
                f"no block {name!r} in {self.package}/{self.resource}; "
                f"blocks: {', '.join(sorted(self.blocks))}"
            )
        return self.blocks[name].format(**fields)
