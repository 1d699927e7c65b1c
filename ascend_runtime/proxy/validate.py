"""Validation of the request fields the proxy itself reads, with vLLM 0.23.0's answers.

The proxy reads ``stream``, ``max_tokens`` / ``max_completion_tokens``,
``prompt`` (completions), ``messages`` (chat) and ``echo``; every other field
is the engine's business and is forwarded unchanged. These fields are checked
with the same pydantic types (lax mode: ``"16"`` and ``16.0`` are integers,
``1.5`` and ``"abc"`` are not) as vLLM 0.23.0's ``CompletionRequest`` /
``ChatCompletionRequest`` (``vllm/entrypoints/openai/completion/protocol.py``,
``chat_completion/protocol.py``), and a failure gets vLLM's answer:

- a wrong type, or a missing ``messages``: 400, ``type`` "Bad Request", as
  ``validation_exception_handler`` (``vllm/entrypoints/serve/utils/server_utils.py``)
  answers a ``RequestValidationError``;
- the output limit below 1 (chat: ``max_completion_tokens`` when set, which makes vLLM ignore
  ``max_tokens``, else ``max_tokens``; completions: ``max_tokens``, and ``max_completion_tokens``
  is an unknown field there, ignored): 400, ``type`` "BadRequestError", ``param``
  "max_tokens", message ``max_tokens must be at least 1, got N. (parameter=max_tokens,
  value=N)``, as ``SamplingParams._verify_args`` raises it (``vllm/sampling_params.py``;
  0 is allowed with ``echo`` on completions, as vLLM's echo-only requests).

``model`` is optional in vLLM 0.23.0 (``model: str | None = None``: the served
model is used), so a request without one is forwarded as it is.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ascend_runtime.proxy.errors import error_body


class _Read(BaseModel):
    model_config = ConfigDict(extra="allow")

    stream: bool | None = False
    echo: bool | None = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None


class CompletionFields(_Read):
    prompt: (list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]] | str | list[str]
             | None) = None
    max_tokens: int | None = 16
    #: not a field of vLLM 0.23.0's CompletionRequest: an unknown field, ignored whatever its value
    max_completion_tokens: Any = None


class ChatFields(_Read):
    messages: list[dict[str, Any]]


def _describe(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    lines = [f"{len(errors)} validation error{'s' if len(errors) != 1 else ''}:"]
    for e in errors:
        loc = ".".join(str(p) for p in ("body", *e["loc"]))
        lines.append(f"  {loc}: {e['msg']} (input: {e.get('input')!r})")
    return "\n".join(lines)


def check_request(req: dict[str, Any], chat: bool) -> tuple[_Read | None, dict[str, Any] | None]:
    """Return (validated fields, None) or (None, vLLM-shaped error body with code 400)."""
    try:
        fields: _Read = (ChatFields if chat else CompletionFields).model_validate(req)
    except ValidationError as exc:
        return None, error_body(_describe(exc), 400)
    # the limit the engine uses: chat takes max_completion_tokens when it is set and then ignores max_tokens
    # (chat_completion/serving.py get_max_tokens, chat_completion/protocol.py build_tok_params, v0.23.0)
    if chat and fields.max_completion_tokens is not None:
        value = fields.max_completion_tokens
    else:
        value = fields.max_tokens
    floor = 0 if (not chat and fields.echo) else 1
    if value is not None and value < floor:
        msg = f"max_tokens must be at least 1, got {value}. (parameter=max_tokens, value={value})"
        return None, error_body(msg, 400, "BadRequestError", param="max_tokens")
    return fields, None
