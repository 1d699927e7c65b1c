"""What the proxy logs and counts when a client sends bytes that are not an HTTP/1.1 request.

aiohttp's HTTP parser refuses a malformed request head (a bad request line, an invalid header, a line
too long) before any route runs: its ``RequestHandler.handle_error`` (aiohttp 3.14,
``web_protocol.py``) answers a plain-text 400 and closes the connection, and logs the parser's exception
with its traceback through the handler's ``logger`` at ERROR. One line of garbage per connection would
then write a traceback per connection: any client could fill the proxy's logs. vLLM 0.23.0's server
(uvicorn with h11) answers the same bytes with a plain-text 400 too, and logs one warning line.

:class:`ProtocolErrorLog` is the ``logger`` the proxy gives aiohttp's server: a parser error becomes one
WARNING line without traceback, at most one per ``interval_s`` (the others are counted in the next line
it writes), and is counted in ``requests_total{endpoint="-", outcome="bad_request", status="400"}``;
anything else (a bug in a handler that escaped it) is logged with its traceback as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

#: the ``endpoint`` label of requests that had no path the parser could read
NO_ENDPOINT = "-"


class ProtocolErrorLog:
    """The server ``logger`` of aiohttp's ``RequestHandler``: parser errors counted, logged one line at a time.

    ``count``: called once per refused request head; ``interval_s``: at most one log line per interval
    (seconds, monotonic); ``clock``: the time source (seconds).
    """

    def __init__(self, log: logging.Logger, count: Callable[[], None], interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.count, self.interval_s, self.clock = log, count, interval_s, clock
        self._next_line = float("-inf")
        self._unlogged = 0

    def _protocol_error(self, exc_info: Any) -> HttpProcessingError | None:
        exc = exc_info[1] if isinstance(exc_info, tuple) else exc_info
        return exc if isinstance(exc, HttpProcessingError) else None

    def _refused(self, msg: str, args: tuple[Any, ...], exc: HttpProcessingError) -> None:
        self.count()
        now = self.clock()
        if now < self._next_line:
            self._unlogged += 1
            return
        more = f" (and {self._unlogged} more since the last line)" if self._unlogged else ""
        self._unlogged, self._next_line = 0, now + self.interval_s
        text = str(exc.message if getattr(exc, "message", None) else exc).splitlines()[0][:200]
        self.log.warning("refused a malformed HTTP request: %s: %s%s", msg % args if args else msg, text, more)

    def exception(self, msg: str, *args: Any, exc_info: Any = True, **kw: Any) -> None:
        """aiohttp's ``log_exception``: a parser error is counted and logged in one line; anything else in full."""
        exc = self._protocol_error(exc_info)
        if exc is not None:
            self._refused(msg, args, exc)
        else:
            self.log.exception(msg, *args, exc_info=exc_info, **kw)

    def debug(self, msg: str, *args: Any, exc_info: Any = None, **kw: Any) -> None:
        """aiohttp's ``log_debug`` and its log of non-HTTP bytes on a first request: counted when a parser error."""
        exc = self._protocol_error(exc_info)
        if exc is not None:
            self.count()
        self.log.debug(msg, *args, **kw)

    def __getattr__(self, name: str) -> Any:  # warning, error, info, isEnabledFor ...: the plain logger's
        return getattr(self.log, name)
