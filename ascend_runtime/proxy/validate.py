"""Input hygiene of the completion routes: the body and the request fields the proxy itself reads or
rewrites, checked as vLLM 0.23.0 checks them, with vLLM's answers (status, ``type``, ``param``).

:func:`parse_request` takes the body bytes and the two headers that decide how they are read:

- ``Content-Type`` must be ``application/json`` (the media type, lower-cased, before any ``;``), as
  ``validate_json_request`` (``vllm/entrypoints/serve/utils/api_utils.py``) requires on both routes;
  the proxy sends every engine request as ``application/json``, so an engine could not refuse it;
- a ``Content-Encoding`` other than ``identity`` is refused: vLLM reads the body bytes as JSON text
  (starlette ``Request.json``), so a compressed body never parses there;
- the body must be a JSON object (Python's ``json.loads`` on the bytes, as starlette does: UTF-8,
  UTF-8 with a BOM, UTF-16 and UTF-32 are read; ``NaN`` and ``Infinity`` are numbers), nested at most
  :data:`MAX_DEPTH` containers deep.

Every failure is 400, ``type`` "Bad Request": FastAPI raises ``RequestValidationError`` for a JSON
decode error and ``HTTPException(400)`` for any other body-reading error (``fastapi/routing.py``
``get_request_handler``); vLLM answers both with ``type`` = the status phrase
(``validation_exception_handler`` / ``http_exception_handler``, ``vllm/entrypoints/serve/utils/
server_utils.py``).

Then :func:`check_request` checks the fields, with the pydantic types of vLLM 0.23.0's
``CompletionRequest`` / ``ChatCompletionRequest`` (``vllm/entrypoints/openai/completion/protocol.py``,
``chat_completion/protocol.py``; lax mode: ``"16"`` and ``16.0`` are integers, ``1.5`` and ``"abc"`` are
not). The fields are the ones the proxy reads (``stream``, ``echo``, ``max_tokens``,
``max_completion_tokens``, ``prompt``, ``messages``) and the ones it rewrites in the prefill copy
(``stream``, ``stream_options``, ``max_tokens``, ``max_completion_tokens``, ``min_tokens``,
``kv_transfer_params``, pd.py): the prefill engine never sees the client's value of those, and a decode
that refused it would do so only after the prefill computed the prompt (a body refused by pydantic
never reaches ``_with_kv_transfer_rejection_cleanup``, ``vllm/entrypoints/openai/engine/serving.py``,
so the prefill's KV blocks stay held until they time out). Every other field goes to the prefill
unchanged, which refuses a bad one before any KV is made; the proxy relays that answer as it is.

- a wrong type, a missing ``messages``, or a ``model_validator(mode="before")`` rule of vLLM that
  depends on a rewritten field (``stream_options`` without ``stream``; ``prompt_logprobs`` with
  ``stream``): 400, ``type`` "Bad Request", ``param`` the rule's parameter, as
  ``validation_exception_handler`` answers a ``RequestValidationError``;
- what ``SamplingParams._verify_args`` (``vllm/sampling_params.py``) refuses of those fields, and
  completions' ``stream`` with ``use_beam_search`` (``completion/serving.py``): 400, ``type``
  "BadRequestError" (``create_error_response``, ``vllm/entrypoints/serve/utils/error_response.py``):
  the output limit below 1 (chat: ``max_completion_tokens`` when set, which makes vLLM ignore
  ``max_tokens``, else ``max_tokens``; completions: ``max_tokens``, 0 allowed with ``echo``;
  ``max_completion_tokens`` is an unknown field of completions, ignored) with ``param``
  "max_tokens"; ``min_tokens`` below 0 or above that limit.

``model`` is optional in vLLM 0.23.0 (``model: str | None = None``: the served model is used), so a
request without one is forwarded as it is.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ascend_runtime.proxy.boundedjson import MAX_DEPTH, JsonError, load_json
from ascend_runtime.proxy.errors import error_body

#: Characters of a refused value quoted in an error message.
_QUOTE_CHARS = 120
_MEDIA_TYPE_ERROR = "Unsupported Media Type: Only 'application/json' is allowed"

__all__ = ["MAX_DEPTH", "check_request", "output_limit_refusal", "parse_request", "wire_header"]


class ParamError(ValueError):
    """A refused value, named: ``str()`` ends with ``(parameter=NAME)`` as vLLM's ``VLLMValidationError``
    (``vllm/exceptions.py``) does; raised inside a model validator, pydantic keeps it as the error's
    ``ctx["error"]``, where ``validation_exception_handler`` finds the ``param`` of the answer."""

    def __init__(self, message: str, parameter: str) -> None:
        super().__init__(message)
        self.parameter = parameter

    def __str__(self) -> str:
        return f"{super().__str__()} (parameter={self.parameter})"


def _stream_options_rule(data: dict[str, Any]) -> None:
    # validate_stream_options: the raw values' truth, before the fields are validated
    if data.get("stream_options") and not data.get("stream"):
        raise ParamError("Stream options can only be defined when `stream=True`.", "stream_options")


def _prompt_logprobs_rule(data: dict[str, Any]) -> None:
    # check_logprobs, its stream part (the prefill copy has stream=false); a value that is not a number
    # fails there in a comparison (TypeError, 400) whatever ``stream`` is, so the prefill refuses it
    pl = data.get("prompt_logprobs")
    if isinstance(pl, (int, float)) and data.get("stream") and (pl > 0 or pl == -1):
        raise ParamError("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")


class StreamOptions(BaseModel):
    """``StreamOptions`` (vllm/entrypoints/openai/engine/protocol.py)."""

    model_config = ConfigDict(extra="allow")

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _Read(BaseModel):
    model_config = ConfigDict(extra="allow")

    stream: bool | None = False
    stream_options: StreamOptions | None = None
    echo: bool | None = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    min_tokens: int = 0
    kv_transfer_params: dict[str, Any] | None = None


class CompletionFields(_Read):
    prompt: (list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]] | str | list[str]
             | None) = None
    max_tokens: int | None = 16
    #: not a field of vLLM 0.23.0's CompletionRequest: an unknown field, ignored whatever its value
    max_completion_tokens: Any = None
    use_beam_search: bool = False

    @model_validator(mode="before")
    @classmethod
    def _rules(cls, data: Any) -> Any:
        # completion/protocol.py: validate_stream_options runs before check_logprobs (defined after it)
        if isinstance(data, dict):
            _stream_options_rule(data)
            _prompt_logprobs_rule(data)
        return data


class ChatFields(_Read):
    messages: list[dict[str, Any]]
    echo: bool = False

    @model_validator(mode="before")
    @classmethod
    def _rules(cls, data: Any) -> Any:
        # chat_completion/protocol.py: check_logprobs runs before validate_stream_options (defined after it)
        if isinstance(data, dict):
            _prompt_logprobs_rule(data)
            _stream_options_rule(data)
        return data


def _quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE_CHARS else text[:_QUOTE_CHARS] + "..."


def _describe(exc: ValidationError) -> tuple[str, str | None]:
    """(message, param): pydantic's description of each error, and the parameter the first named error
    names (``validation_exception_handler``)."""
    errors = exc.errors(include_url=False)
    lines = [f"{len(errors)} validation error{'s' if len(errors) != 1 else ''}:"]
    param = None
    for e in errors:
        loc = ".".join(str(p) for p in ("body", *e["loc"]))
        lines.append(f"  {loc}: {e['msg']} (input: {_quote(e.get('input'))})")
        cause = (e.get("ctx") or {}).get("error")
        if param is None and isinstance(cause, ParamError):
            param = cause.parameter
    return "\n".join(lines), param


def _bad_request(message: str, param: str | None = None) -> dict[str, Any]:
    return error_body(message, 400, param=param)


def _sampling_error(message: str, param: str | None = None) -> dict[str, Any]:
    return error_body(message, 400, "BadRequestError", param=param)


def check_request(req: dict[str, Any], chat: bool) -> tuple[_Read | None, dict[str, Any] | None]:
    """Return (validated fields, None) or (None, vLLM-shaped error body with code 400)."""
    try:
        fields: _Read = (ChatFields if chat else CompletionFields).model_validate(req)
    except ValidationError as exc:
        return None, _bad_request(*_describe(exc))
    if not chat and fields.stream and fields.use_beam_search:  # type: ignore[attr-defined]
        return None, _sampling_error("Streaming is not currently supported with beam search")
    # the limit the engine uses: chat takes max_completion_tokens when it is set and then ignores max_tokens
    # (chat_completion/serving.py get_max_tokens, chat_completion/protocol.py build_tok_params, v0.23.0)
    if chat and fields.max_completion_tokens is not None:
        value = fields.max_completion_tokens
    else:
        value = fields.max_tokens
    floor = 0 if (not chat and fields.echo) else 1
    if value is not None and value < floor:
        msg = f"max_tokens must be at least 1, got {value}. (parameter=max_tokens, value={value})"
        return None, _sampling_error(msg, param="max_tokens")
    # SamplingParams gets max_tokens=1 for an echo-only completion (completion/protocol.py to_sampling_params);
    # the engine's own limit can only be lower than the request's (get_max_tokens takes the smallest)
    limit = 1 if value == 0 else value
    if fields.min_tokens < 0:
        return None, _sampling_error(f"min_tokens must be greater than or equal to 0, got {fields.min_tokens}.")
    if limit is not None and fields.min_tokens > limit:
        return None, _sampling_error(
            f"min_tokens must be less than or equal to max_tokens={limit}, got {fields.min_tokens}.")
    return fields, None


def output_limit_refusal(fields: _Read, chat: bool, max_model_len: int | None) -> dict[str, Any] | None:
    """The engine's refusal of an output limit above its context limit (``max_model_len`` tokens, as the
    decode instances report it; None: unknown, nothing refused), or None. vLLM 0.23.0 refuses it before
    tokenizing (``TokenizeParams.__post_init__``, vllm/renderers/params.py, with the parameter names of
    ``build_tok_params`` in completion/protocol.py and chat_completion/protocol.py); the proxy refuses it
    the same way before prefill runs the prompt. A limit that only the prompt's length makes impossible is
    the engine's to refuse: the proxy does not tokenize."""
    if max_model_len is None:
        return None
    param = "max_completion_tokens" if chat and fields.max_completion_tokens is not None else "max_tokens"
    wanted = fields.max_completion_tokens if param == "max_completion_tokens" else fields.max_tokens
    if wanted is None or wanted <= max_model_len:
        return None
    return _sampling_error(f"{param}={wanted} cannot be greater than max_model_len=max_total_tokens={max_model_len}. "
                           f"Please request fewer output tokens. (parameter={param}, value={wanted})", param=param)


def parse_request(body: bytes, chat: bool, content_type: str | None = "application/json",
                  content_encoding: str | None = None) -> tuple[dict[str, Any] | None, _Read | None,
                                                                 dict[str, Any] | None]:
    """(request, validated fields, None), or (None, None, vLLM-shaped error body with code 400).

    body: the request body bytes; chat: the route is /v1/chat/completions; content_type and
    content_encoding: the request's headers of those names (None: absent).
    """
    if (content_type or "").lower().split(";", 1)[0] != "application/json":
        return None, None, _bad_request(_MEDIA_TYPE_ERROR)
    if content_encoding and content_encoding.strip().lower() != "identity":
        return None, None, _bad_request(
            f"request body with Content-Encoding {_quote(content_encoding)}: the body must be plain JSON text")
    try:
        req = load_json(body)  # nested at most MAX_DEPTH deep (boundedjson.py)
    except JsonError as exc:
        return None, None, _bad_request(f"invalid JSON request: {exc}")
    if not isinstance(req, dict):
        return None, None, _bad_request(f"invalid JSON request: body is not a JSON object but {type(req).__name__}")
    fields, err = check_request(req, chat)
    if err is not None:
        return None, None, err
    return req, fields, None


def wire_header(value: str) -> str:
    """A request header value to send on: the client's bytes, as a latin-1 string.

    aiohttp decodes header bytes as UTF-8 with ``surrogateescape``; the engine requests are written in
    latin-1 (relay.py ``serialize_request``), which neither such escapes nor characters past U+00FF
    survive. ASCII values (nearly all) are returned as they are.
    """
    if value.isascii():
        return value
    return value.encode("utf-8", "surrogateescape").decode("latin-1")
