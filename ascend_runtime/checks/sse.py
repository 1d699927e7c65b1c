"""Incremental decoding of OpenAI/vLLM server-sent-event streams.

The stream is ``data: {json}\\n\\n`` events ending with ``data: [DONE]``.
The decoder is line based (one ``data:`` line is one event, as vLLM emits
them), tolerant of ``\\r\\n`` and of events split across network reads, and
ignores comments (``:``) and other SSE fields (``event:``, ``id:``).
"""

from __future__ import annotations

DONE = b"[DONE]"


class SSEDecoder:
    """Feed raw bytes, get back the payloads of complete ``data:`` lines."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Return the payloads (bytes after ``data:``) completed by ``data``."""
        buf = self._buf + data if self._buf else data
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        out: list[bytes] = []
        for line in lines:
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload:
                    out.append(payload)
        return out

    def flush(self) -> list[bytes]:
        """Payload of a last line that had no trailing newline, if any."""
        rest, self._buf = self._buf, b""
        if rest.startswith(b"data:"):
            payload = rest[5:].strip()
            if payload:
                return [payload]
        return []

    @property
    def pending(self) -> bool:
        """True when bytes of an incomplete line are buffered."""
        return bool(self._buf.strip())


def chunk_text(obj: dict) -> str | None:
    """Generated text carried by one completion or chat chunk, or None.

    Completions carry ``choices[0].text``; chat carries
    ``choices[0].delta.content`` (or ``reasoning_content`` for R1-style
    reasoning output).  Role-only and finish-only chunks return ``""``.
    """
    choices = obj.get("choices")
    if not choices:
        return None
    choice = choices[0]
    text = choice.get("text")
    if text is not None:
        return text
    delta = choice.get("delta") or choice.get("message") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
