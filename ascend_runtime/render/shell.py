"""One quoting mechanism for every shell artifact the kit renders.

:func:`quote` turns any value into exactly one shell word: :func:`shlex.quote`
for ordinary text, and bash ANSI-C quoting (``$'...'``) with every control
character escaped when the text has one. The result never spans lines and
never expands, so it is equally inert as a command word and on a ``#``
comment line.

Shell templates are compiled by :func:`shell_environment`, whose code
generator refuses, when a template is compiled, any ``{{ ... }}`` whose last
filter is not ``| sh`` (the filter is :func:`quote`) and any ``| sh`` that
sits inside a quoted string on its line (a quoted word inside ``"..."`` would
expand again). The rule is about the template's syntax, not about variable
names, so a new variable cannot slip through.
"""

from __future__ import annotations

import shlex
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame

#: The one quoting filter of shell templates: ``{{ value | sh }}``.
QUOTE_FILTER = "sh"
#: Template names rendered by the strict shell environment (bash scripts and shell-style key=value files).
SHELL_TEMPLATE_SUFFIXES = (".sh.j2", ".conf.j2")


def _ansi_c(char: str) -> str:
    if char == "\\":
        return "\\\\"
    if char == "'":
        return "\\'"
    if char.isprintable():
        return char
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def quote(value: Any) -> str:
    """``value`` as one shell word that expands to exactly ``str(value)``, on one line."""
    text = str(value)
    if all(c.isprintable() for c in text):
        return shlex.quote(text)
    return "$'" + "".join(_ansi_c(c) for c in text) + "'"


def quote_all(values: Any) -> str:
    """A sequence of values as space-separated shell words."""
    return " ".join(quote(v) for v in values)


def _open_quote(line: str) -> str | None:
    """The quote still open at the end of ``line`` (``'`` or ``"``), ``#`` on a comment, else None."""
    state: str | None = None
    i = 0
    while i < len(line):
        c = line[i]
        if state == "'":
            if c == "'":
                state = None
        elif state == '"':
            if c == "\\":
                i += 1
            elif c == '"':
                state = None
        elif c == "\\":
            i += 1
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return "#"
        elif c in "'\"":
            state = c
        i += 1
    return state


class QuotedOutputCodeGenerator(CodeGenerator):
    """Compiles a shell template only if every interpolation is a standalone ``| sh`` word."""

    _line = ""

    def visit_Output(self, node: nodes.Output, frame: Frame) -> None:
        for child in node.nodes:
            if isinstance(child, nodes.TemplateData):
                self._line = (self._line + child.data).rsplit("\n", 1)[-1]
                continue
            if not (isinstance(child, nodes.Filter) and child.name == QUOTE_FILTER):
                self.fail(
                    f"unquoted interpolation in shell template {self.name or '<string>'}: end every {{{{ ... }}}} with "
                    f"`| {QUOTE_FILTER}` (ascend_runtime.render.shell.quote)",
                    child.lineno,
                )
            if _open_quote(self._line) in ("'", '"'):
                self.fail(
                    f"`| {QUOTE_FILTER}` inside a quoted string in shell template {self.name or '<string>'}: a quoted word "
                    "must stand on its own (assign it to a variable and use \"$VAR\")",
                    child.lineno,
                )
            self._line += "w"  # a quoted word: opens and closes its own quotes
        super().visit_Output(node, frame)


class ShellEnvironment(jinja2.Environment):
    """Jinja2 environment of shell templates: the ``sh`` filter and the compile-time quoting rule."""

    code_generator_class = QuotedOutputCodeGenerator


def _options(loader: jinja2.BaseLoader | None) -> dict[str, Any]:
    return {
        "loader": loader,
        "autoescape": False,
        "trim_blocks": True,
        "lstrip_blocks": True,
        "keep_trailing_newline": True,
        "undefined": jinja2.StrictUndefined,
    }


def shell_environment(loader: jinja2.BaseLoader | None = None) -> jinja2.Environment:
    """The strict environment every shell template is rendered with."""
    env = ShellEnvironment(**_options(loader))
    env.filters[QUOTE_FILTER] = quote
    return env


def text_environment(loader: jinja2.BaseLoader | None = None) -> jinja2.Environment:
    """The environment of non-shell text templates (markdown); ``sh`` quotes the commands they show."""
    env = jinja2.Environment(**_options(loader))
    env.filters[QUOTE_FILTER] = quote
    return env


def is_shell_template(name: str) -> bool:
    """True for templates rendered by :func:`shell_environment`."""
    return name.endswith(SHELL_TEMPLATE_SUFFIXES)
