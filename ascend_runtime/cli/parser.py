"""The argument parser of `ascend-deploy`: argparse, with unknown options named before anything else.

argparse checks required options before it looks at the ones it does not know, so a mistyped
``--stak NAME`` was reported as a missing ``--stack``. :class:`SuggestingParser` scans the arguments
a (sub-)command receives first: an option it does not define, and that is not an abbreviation
argparse resolves, is refused with the closest option it does define (exit 2, argparse's usage line).
Sub-parsers inherit the class, so every command and sub-command gets the check.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import NoReturn

#: How alike (difflib ratio) a known option must be to be suggested.
SUGGEST_CUTOFF = 0.6
#: Longest value an error quotes (``invalid int value: '9999...'``); a longer one is cut (a pasted megabyte).
QUOTE_LIMIT = 60
#: Longest option name compared with the defined ones (none is longer).
OPTION_MATCH_LIMIT = 100
_LONG_QUOTE = re.compile(r"'([^']{%d,})'" % (QUOTE_LIMIT + 1))


def cut_quotes(message: str) -> str:
    """``message`` with every quoted value longer than :data:`QUOTE_LIMIT` characters cut to it."""
    return _LONG_QUOTE.sub(lambda m: repr(m.group(1)[: QUOTE_LIMIT - 3] + "..."), message)


class SuggestingParser(argparse.ArgumentParser):
    """An ArgumentParser that refuses an unknown option with "did you mean --x?" before any other check."""

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        """Refuse the first unknown option of ``args``, then parse as argparse does."""
        if args is not None:
            args = list(args)
            unknown = self.unknown_option(args)
            if unknown is not None:
                self.error(self.unknown_message(unknown))
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """argparse's usage line and error (exit 2), long quoted values cut (:func:`cut_quotes`)."""
        super().error(cut_quotes(message))

    def unknown_option(self, args: list[str]) -> str | None:
        """The first option in ``args`` this parser neither defines nor resolves as an abbreviation.

        A parser with sub-commands owns only the options before the sub-command's name; a value that
        looks like a negative number, ``-`` and everything after ``--`` are not options."""
        for arg in args:
            if arg == "--":
                return None
            if not arg.startswith("-") or arg == "-" or self._negative_number_matcher.match(arg):
                if self._subparsers is not None:
                    return None  # the sub-command's parser checks the rest
                continue
            name = arg.split("=", 1)[0] if arg.startswith("--") else arg
            if name in self._option_string_actions or self._abbreviates(name) or self._short_cluster(arg):
                continue
            return name
        return None

    def _abbreviates(self, name: str) -> bool:
        return (self.allow_abbrev and name.startswith("--")
                and any(option.startswith(name) for option in self._option_string_actions))

    def _short_cluster(self, arg: str) -> bool:
        """``-xVALUE`` or ``-xy``: a defined single-dash option with its value or further flags attached."""
        return not arg.startswith("--") and len(arg) > 2 and arg[:2] in self._option_string_actions

    def unknown_message(self, name: str) -> str:
        """``unrecognized argument NAME``, with the closest defined option when one is alike."""
        import difflib  # noqa: PLC0415 - only on the error path

        options = [o for o in self._option_string_actions if o.startswith("--") == name.startswith("--")]
        close = difflib.get_close_matches(name[:OPTION_MATCH_LIMIT], options, n=1, cutoff=SUGGEST_CUTOFF)
        shown = name if len(name) <= QUOTE_LIMIT else name[: QUOTE_LIMIT - 3] + "..."
        return f"unrecognized argument {shown}" + (f"; did you mean {close[0]}?" if close else "")
