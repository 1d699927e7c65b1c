"""OpenAI-compatible requests in vLLM 0.23.0's dialect, without a tokenizer.

A request is checked in the three stages vLLM 0.23.0 answers in, with the
same status, error ``type`` and message text:

1. **protocol** - the body against the request model (field types, and the
   ``model_validator(mode="before")`` checks of
   ``vllm/entrypoints/openai/completion/protocol.py`` and
   ``chat_completion/protocol.py``). FastAPI turns a failure into 400 with
   ``type: "Bad Request"`` and, as message, the list of pydantic errors
   (``validation_exception_handler``, ``vllm/entrypoints/serve/utils/server_utils.py``).
2. **serving** - what the serving classes check before the engine sees the
   request: the model name (``engine/serving.py`` ``_check_model``, 404
   ``NotFoundError``), tool choice (``serve/render/serving.py`` ``render_chat``),
   length limits (``vllm/renderers/params.py`` ``TokenizeParams``), sampling
   values (``vllm/sampling_params.py`` ``SamplingParams._verify_args``).
   400 ``BadRequestError`` (``serve/utils/error_response.py`` ``create_error_response``:
   ``param`` is the ``VLLMValidationError`` parameter, message ``str(exc)``).
3. **engine** - what ``AsyncLLM.generate`` checks when it is first iterated
   (``SamplingParams.verify``, ``v1/engine/input_processor.py``). Non-streaming
   requests get the same 400; a streaming request has already been answered
   200, so it gets one SSE error event and ``[DONE]``. ``ParsedRequest.engine_error``.

Token accounting (no tokenizer): a completion prompt has one token per
whitespace-separated word (at least 1); a list of token ids counts its ids; a
chat prompt has the words of every message's content plus
``CHAT_TOKENS_PER_MESSAGE`` per message. Generated text and log-probabilities
come from :mod:`ascend_runtime.sim.output`.

Request ids follow vLLM 0.23.0 (``engine/serving.py`` ``_base_request_id``;
``completion/serving.py`` and ``chat_completion/serving.py``;
``v1/engine/input_processor.py`` ``assign_request_id``;
``v1/engine/parallel_sampling.py`` ``get_child_info``): the base id is the
``X-Request-Id`` header, else the body's ``request_id``, else a random 16-hex
id; the answer's ``id`` is ``cmpl-<base>`` (chat ``chatcmpl-<base>``); the
engine-side id of prompt ``p`` is ``cmpl-<base>-<p>`` (chat ``chatcmpl-<base>``)
plus ``-`` and 8 random hex digits, and with ``n > 1`` choice ``c`` is
``<c>_<that id>``. A duplicate base id is accepted, not refused.
"""

from __future__ import annotations

import json
import random
import re
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ascend_runtime.sim import output

CHAT_TOKENS_PER_MESSAGE = 4
#: Tokens the simulated model generates before its end-of-sequence token when a request sets no limit.
DEFAULT_MAX_TOKENS = output.EOS_AFTER
#: ``--max-logprobs`` default (vllm/config/model.py ``ModelConfig.max_logprobs``).
MAX_LOGPROBS = 20
#: ``VLLM_MAX_N_SEQUENCES`` default (vllm/envs.py).
MAX_N = 16384
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: Below this temperature vLLM samples greedily (vllm/sampling_params.py ``_SAMPLING_EPS``).
_SAMPLING_EPS = 1e-5


# ---------------------------------------------------------------- errors
class VLLMValidationError(ValueError):
    """vLLM's validation error (vllm/exceptions.py): ``str()`` appends ``(parameter=..., value=...)``."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter, self.value = parameter, value

    def __str__(self) -> str:
        extras = []
        if self.parameter is not None:
            extras.append(f"parameter={self.parameter}")
        if self.value is not None:
            extras.append(f"value={self.value}")
        base = super().__str__()
        return f"{base} ({', '.join(extras)})" if extras else base


def error_body(message: str, code: int, err_type: str = "BadRequestError", param: str | None = None) -> dict[str, Any]:
    """vLLM 0.23.0's ``ErrorResponse`` JSON (vllm/entrypoints/openai/engine/protocol.py ``ErrorInfo``)."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


class ApiError(Exception):
    """An answer vLLM gives with an ``ErrorResponse``."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param

    @classmethod
    def from_exception(cls, exc: Exception) -> "ApiError":
        """``create_error_response(exc)``: a (VLLM)ValueError is 400 ``BadRequestError``."""
        return cls(400, str(exc), "BadRequestError", getattr(exc, "parameter", None))

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status, self.err_type, self.param)


#: Where vLLM 0.23.0's routes are defined (serve/utils/api_utils.py): FastAPI names the endpoint of a body
#: validation error in its message. ``None``: a dependency's error (no endpoint).
_ENDPOINTS = {"completions": ("create_completion", 34, "/v1/completions"),
              "chat": ("create_chat_completion", 40, "/v1/chat/completions"),
              "tokenize": ("tokenize", 38, "/tokenize")}
_API_UTILS = "vllm/entrypoints/serve/utils/api_utils.py"


def validation_message(errors: list[Any], endpoint: str | None) -> str:
    """The message ``validation_exception_handler`` (server_utils.py) writes: ``str()`` of FastAPI's
    ``RequestValidationError`` (``N validation error(s):``, one line per error, then the endpoint's file,
    line, function and ``POST <path>`` for a body error; fastapi/exceptions.py), a space and the list."""
    lines = [f"{len(errors)} validation error{'s' if len(errors) != 1 else ''}:"] + [f"  {e}" for e in errors]
    text = "\n".join(lines) + "\n"
    if endpoint is not None:
        function, line, path = _ENDPOINTS[endpoint]
        text += f'\n  File "{_API_UTILS}", line {line}, in {function}\n    POST {path}'
    return f"{text.rstrip()} {errors}"


def _bad_request(errors: list[Any], endpoint: str | None) -> ApiError:
    """FastAPI's RequestValidationError answer: type "Bad Request", message :func:`validation_message`,
    param from the first VLLMValidationError (server_utils.py ``validation_exception_handler``)."""
    param = None
    for err in errors:
        ctx = err.get("ctx") if isinstance(err, dict) else None
        if ctx and isinstance(ctx.get("error"), VLLMValidationError):
            param = ctx["error"].parameter
            break
    return ApiError(400, validation_message(errors, endpoint), "Bad Request", param)


def _pydantic_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """The errors FastAPI reports for a body model: pydantic's, without url, located under ``body``."""
    out = []
    for err in exc.errors(include_url=False):
        e = {"type": err["type"], "loc": ("body", *err["loc"]), "msg": err["msg"], "input": err["input"]}
        if "ctx" in err:
            e["ctx"] = err["ctx"]
        out.append(e)
    return out


def decode_body(raw: bytes, content_type: str, endpoint: str = "completions") -> Any:
    """The JSON body, or the 400 FastAPI answers (``validate_json_request`` in serve/utils/api_utils.py, a
    dependency, then the ``json_invalid`` error of the body parser)."""
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        raise _bad_request(["Unsupported Media Type: Only 'application/json' is allowed"], None)
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _bad_request([{"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error",
                             "input": {}, "ctx": {"error": exc.msg}}], endpoint) from None
    except UnicodeDecodeError as exc:
        raise _bad_request([{"type": "json_invalid", "loc": ("body", exc.start), "msg": "JSON decode error",
                             "input": {}, "ctx": {"error": exc.reason}}], endpoint) from None


# ---------------------------------------------------------------- request models
class _Model(BaseModel):
    # OpenAIBaseModel (engine/protocol.py): unknown fields are allowed (and ignored)
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Model):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: dict[str, Any] | None = None


class FunctionDefinition(_Model):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatCompletionToolsParam(_Model):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionNamedFunction(_Model):
    name: str


class ChatCompletionNamedToolChoiceParam(_Model):
    function: ChatCompletionNamedFunction
    type: Literal["function"] = "function"


class ChatMessage(_Model):
    role: str
    content: str | list[dict[str, Any]] | None = None


def _check_response_format(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    rf = data.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema" and rf.get("json_schema") is None:
        raise VLLMValidationError("When response_format type is 'json_schema', the 'json_schema' field must be "
                                  "provided.", parameter="response_format")
    return data


def _check_stream_options(data: Any) -> Any:
    if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
        raise VLLMValidationError("Stream options can only be defined when `stream=True`.",
                                  parameter="stream_options")
    return data


def _check_prompt_logprobs(data: dict[str, Any]) -> None:
    pl = data.get("prompt_logprobs")
    if isinstance(pl, int) and not isinstance(pl, bool):
        if data.get("stream") and (pl > 0 or pl == -1):
            raise VLLMValidationError("`prompt_logprobs` are not available when `stream=True`.",
                                      parameter="prompt_logprobs")
        if pl < 0 and pl != -1:
            raise VLLMValidationError("`prompt_logprobs` must be a positive value or -1.",
                                      parameter="prompt_logprobs", value=pl)


def _check_cache_salt(data: Any) -> Any:
    if isinstance(data, dict) and data.get("cache_salt") is not None and (
            not isinstance(data["cache_salt"], str) or not data["cache_salt"]):
        raise VLLMValidationError("Parameter 'cache_salt' must be a non-empty string if provided.",
                                  parameter="cache_salt")
    return data


class _Sampling(_Model):
    """Fields both endpoints share (the sampling parameters vLLM reads)."""

    model: str | None = None
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = 0.0
    seed: int | None = Field(None, ge=_INT64_MIN, le=_INT64_MAX)
    stop: str | list[str] | None = []
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = []
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=_INT64_MAX)] | None = None
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    structured_outputs: dict[str, Any] | None = None
    priority: int = Field(0, ge=_INT64_MIN, le=_INT64_MAX)
    request_id: str | None = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None


class CompletionBody(_Sampling):
    """vLLM 0.23.0 ``CompletionRequest`` (completion/protocol.py), the fields the simulator reads."""

    prompt: (list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]] | str | list[str]
             | None) = None
    echo: bool | None = False
    logprobs: int | None = None
    max_tokens: int | None = 16
    n: int = 1
    suffix: str | None = None
    prompt_embeds: bytes | list[bytes] | None = None

    # validators in the order of completion/protocol.py (pydantic runs "before" validators last-defined first)
    @model_validator(mode="before")
    @classmethod
    def _response_format(cls, data: Any) -> Any:
        return _check_response_format(data)

    @model_validator(mode="before")
    @classmethod
    def _logprobs(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        _check_prompt_logprobs(data)
        lp = data.get("logprobs")
        if isinstance(lp, (int, float)) and not isinstance(lp, bool) and lp < 0:
            raise VLLMValidationError("`logprobs` must be a positive value.", parameter="logprobs", value=lp)
        return data

    @model_validator(mode="before")
    @classmethod
    def _stream_options(cls, data: Any) -> Any:
        return _check_stream_options(data)

    @model_validator(mode="before")
    @classmethod
    def _prompt(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        prompt, embeds = data.get("prompt"), data.get("prompt_embeds")
        if (prompt is None or prompt == "") and (embeds is None or embeds == []):
            raise VLLMValidationError("Either prompt or prompt_embeds must be provided and non-empty.",
                                      parameter="prompt")
        return data

    @model_validator(mode="before")
    @classmethod
    def _cache_salt(cls, data: Any) -> Any:
        return _check_cache_salt(data)


class ChatBody(_Sampling):
    """vLLM 0.23.0 ``ChatCompletionRequest`` (chat_completion/protocol.py), the fields the simulator reads."""

    messages: list[ChatMessage]
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = 1
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: (Literal["none"] | Literal["auto"] | Literal["required"] | ChatCompletionNamedToolChoiceParam
                  | None) = "none"
    parallel_tool_calls: bool | None = True
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    bad_words: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _response_format(cls, data: Any) -> Any:
        return _check_response_format(data)

    @model_validator(mode="before")
    @classmethod
    def _stream_options(cls, data: Any) -> Any:
        return _check_stream_options(data)

    @model_validator(mode="before")
    @classmethod
    def _logprobs(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        _check_prompt_logprobs(data)
        top = data.get("top_logprobs")
        if isinstance(top, (int, float)) and not isinstance(top, bool):
            if top < 0 and top != -1:
                raise VLLMValidationError("`top_logprobs` must be a positive value or -1.",
                                          parameter="top_logprobs", value=top)
            if (top == -1 or top > 0) and not data.get("logprobs"):
                raise VLLMValidationError("when using `top_logprobs`, `logprobs` must be set to true.",
                                          parameter="top_logprobs")
        return data

    @model_validator(mode="before")
    @classmethod
    def _tool_usage(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("tools") == []:
            raise ValueError("`tools` must not be an empty array. Either provide at least one tool or omit the "
                             "field entirely.")
        if "tool_choice" not in data and data.get("tools"):
            data["tool_choice"] = "auto"  # vLLM's default once tools are given
        choice = data.get("tool_choice")
        if choice is None or choice == "none":
            return data
        if data.get("tools") is None:
            raise VLLMValidationError("When using `tool_choice`, `tools` must be set.", parameter="tool_choice")
        if choice not in ("auto", "required") and not isinstance(choice, dict):
            raise VLLMValidationError(f"Invalid value for `tool_choice`: {choice}! Only named tools, \"none\", "
                                      "\"auto\" or \"required\" are supported.", parameter="tool_choice")
        if isinstance(choice, dict):
            usage = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'
            function = choice.get("function")
            if not isinstance(function, dict):
                raise VLLMValidationError(f"Invalid value for `function`: `{function}` in `tool_choice`! {usage}",
                                          parameter="tool_choice.function")
            if "name" not in function:
                raise VLLMValidationError(f"Expected field `name` in `function` in `tool_choice`! {usage}",
                                          parameter="tool_choice.function.name")
            name = function["name"]
            if not isinstance(name, str) or not name:
                raise VLLMValidationError(f"Invalid `name` in `function`: `{name}` in `tool_choice`! {usage}",
                                          parameter="tool_choice.function.name")
            tools = data["tools"] if isinstance(data["tools"], list) else []
            if not any(isinstance(t, dict) and isinstance(t.get("function"), dict)
                       and t["function"].get("name") == name for t in tools):
                raise VLLMValidationError("The tool specified in `tool_choice` does not match any of the specified "
                                          "`tools`", parameter="tool_choice")
        return data

    @model_validator(mode="before")
    @classmethod
    def _generation_prompt(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("continue_final_message") and data.get("add_generation_prompt"):
            raise VLLMValidationError("Cannot set both `continue_final_message` and `add_generation_prompt` to "
                                      "True.")
        return data

    @model_validator(mode="before")
    @classmethod
    def _cache_salt(cls, data: Any) -> Any:
        return _check_cache_salt(data)


# ---------------------------------------------------------------- the parsed request
@dataclass
class Prompt:
    """One prompt of a request: its token count, its text (what ``echo`` returns) and its token strings."""

    tokens: int
    text: str
    pieces: list[str]
    #: Largest token id of a token-id prompt (None for text).
    max_id: int | None = None
    #: A token-id prompt's ids (None for text).
    ids: list[int] | None = None

    def token_ids(self) -> list[int]:
        """The prompt's token ids (a text prompt's: the simulator's ids of its words)."""
        return list(self.ids) if self.ids is not None else [output.piece_id(p) for p in self.pieces]


@dataclass
class ParsedRequest:
    """What the engine and the answer need from one completion or chat request."""

    chat: bool
    model: str
    prompts: list[Prompt]
    n: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    kv_transfer_params: dict[str, Any] | None
    #: Base request id (X-Request-Id header, else body ``request_id``, else random).
    request_id: str
    #: One plan per choice, in answer order (completions: prompt-major, ``index = prompt * n + c``).
    choices: list[output.ChoicePlan] = field(default_factory=list)
    #: Completions: ``logprobs``; chat: ``top_logprobs`` when ``logprobs`` is true; else None.
    logprobs: int | None = None
    echo: bool = False
    #: Completions with echo and ``max_tokens: 0``: the answer is the prompt only.
    echo_only: bool = False
    #: Chat: the role of the answer and the content ``echo`` prepends ("" if none).
    role: str = "assistant"
    echo_text: str = ""
    #: ``max_tokens`` as the engine sees it, per prompt (``vllm:request_params_max_tokens``).
    max_tokens_param: list[int] = field(default_factory=list)
    #: An error the engine raises when the request is first iterated (stage 3), else None.
    engine_error: ApiError | None = None
    #: ``prompt_logprobs`` as the engine sees it (completions with echo: ``logprobs``), else None.
    prompt_logprobs: int | None = None

    @property
    def response_id(self) -> str:
        """The answer's ``id``: ``cmpl-<base>`` / ``chatcmpl-<base>``, as vLLM builds it."""
        return ("chatcmpl-" if self.chat else "cmpl-") + self.request_id

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of the first prompt (the one a PD transfer carries)."""
        return self.prompts[0].tokens


def random_uuid() -> str:
    """vLLM's ``random_uuid``: 16 hex digits."""
    return f"{uuid.uuid4().int & ((1 << 64) - 1):016x}"


def engine_request_ids(req: ParsedRequest) -> list[str]:
    """Engine-side ids of the request's sequences, in ``req.choices`` order (unique even for a reused base id)."""
    out = []
    for p in range(len(req.prompts)):
        sub = req.response_id if req.chat else f"{req.response_id}-{p}"
        parent = f"{sub}-{random_uuid()[:8]}"
        out.extend([parent] if req.n == 1 else [f"{c}_{parent}" for c in range(req.n)])
    return out


_PIECE = re.compile(r"\s*\S+")


def _text_prompt(text: str) -> Prompt:
    pieces = _PIECE.findall(text)
    return Prompt(max(len(pieces), 1), text, pieces or [text])


def _ids_prompt(ids: list[int]) -> Prompt:
    pieces = [output.decode_token(i) for i in ids]
    return Prompt(len(ids), "".join(pieces), pieces, max(ids, default=None), list(ids))


def _content_words(content: Any) -> int:
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):  # content parts
        return sum(len(str(p.get("text", "")).split()) for p in content if isinstance(p, dict))
    return 0


def _content_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
    return content or ""


# ---------------------------------------------------------------- parse
def parse(body: Any, chat: bool, served_model: str, max_model_len: int, vocab_size: int,
          header_request_id: str | None = None, spec_decode: bool = False) -> ParsedRequest:
    """Check a decoded request body through stages 1 and 2; raises :class:`ApiError`.

    ``header_request_id``: the X-Request-Id header, if any. ``spec_decode``: the instance runs MTP
    (a speculative config, which some sampling parameters are refused with). Stage 3 problems are
    returned in ``engine_error``.
    """
    if not isinstance(body, dict):
        # vLLM 0.23.0 reads the body as a mapping before validating it: a JSON array, string, number or null
        # fails with AttributeError, answered 500 (server_utils.py ``exception_handler``)
        raise ApiError(500, f"'{type(body).__name__}' object has no attribute 'get'", "InternalServerError")
    model_cls = ChatBody if chat else CompletionBody
    try:
        r = model_cls.model_validate(body)
    except ValidationError as exc:
        raise _bad_request(_pydantic_errors(exc), "chat" if chat else "completions") from None
    assert isinstance(body, dict)
    try:
        return _serve(r, body, chat, served_model, max_model_len, vocab_size, header_request_id, spec_decode)
    except VLLMValidationError as exc:
        raise ApiError.from_exception(exc) from None
    except ValueError as exc:
        raise ApiError.from_exception(exc) from None


def _serve(r: Any, body: dict[str, Any], chat: bool, served_model: str, max_model_len: int, vocab_size: int,
           header_request_id: str | None, spec_decode: bool) -> ParsedRequest:
    if not chat and r.stream and r.use_beam_search:  # completion/serving.py, before the model check
        raise ValueError("Streaming is not currently supported with beam search")
    if r.model and r.model != served_model:
        raise ApiError(404, f"The model `{r.model}` does not exist.", "NotFoundError", "model")
    # what the simulator does not model (it has no beam search or prompt embeddings)
    for name, given in (("use_beam_search", r.use_beam_search), ("prompt_embeds", getattr(r, "prompt_embeds", None))):
        if given:
            raise VLLMValidationError(f"`{name}` is not modelled by the engine simulator.", parameter=name)
    role, echo_text = "assistant", ""
    if chat:
        choice = r.tool_choice
        if choice not in (None, "none"):  # serve/render/serving.py render_chat, no tool parser configured
            if choice == "auto":
                raise ValueError('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to '
                                 "be set")
            raise ValueError(f'tool_choice="{choice}" requires --tool-call-parser to be set')
        if not r.messages:
            raise ValueError("messages must be a non-empty list")
        words = sum(_content_words(m.content) + CHAT_TOKENS_PER_MESSAGE for m in r.messages)
        prompts = [Prompt(max(words, 1), "", output.chat_pieces([(m.role, _content_text(m.content))
                                                                  for m in r.messages]))]
        if not r.add_generation_prompt:  # chat_completion/serving.py get_chat_request_role
            role = r.messages[-1].role
        if r.echo and r.messages[-1].role == role:
            echo_text = _content_text(r.messages[-1].content)
        requested = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
        requested_param = "max_completion_tokens" if r.max_completion_tokens is not None else "max_tokens"
        n = 1 if r.n is None else r.n
        logprobs = r.top_logprobs if r.logprobs else None
    else:
        if r.suffix is not None:  # serve/render/serving.py render_completion
            raise ValueError("suffix is not currently supported")
        p = r.prompt
        if isinstance(p, str):
            prompts = [_text_prompt(p)]
        elif p and isinstance(p[0], str):
            prompts = [_text_prompt(s) for s in p]
        elif p and isinstance(p[0], list):
            prompts = [_ids_prompt(ids) for ids in p]
        else:
            prompts = [_ids_prompt(list(p or []))]
        requested, requested_param = r.max_tokens, "max_tokens"
        n = r.n
        logprobs = r.logprobs
    # completion/protocol.py to_sampling_params: echo asks the prompt's log-probabilities at logprobs
    prompt_logprobs = r.prompt_logprobs if r.prompt_logprobs is not None or chat or not r.echo else r.logprobs
    # renderers/params.py TokenizeParams: output limit, then each prompt's length
    if requested is not None and requested > max_model_len:
        raise VLLMValidationError(
            f"{requested_param}={requested} cannot be greater than max_model_len=max_total_tokens={max_model_len}. "
            "Please request fewer output tokens.", parameter=requested_param, value=requested)
    max_input = max_model_len - (requested or 0)
    for pr in prompts:
        if pr.tokens > max_input:
            text_prompt = pr.max_id is None  # a tokenizer stops at max_input + 1 tokens
            count = max_input + 1 if text_prompt else pr.tokens
            qualifier = "at least " if text_prompt else ""
            raise VLLMValidationError(
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{requested or 0} output tokens and your prompt contains {qualifier}{count} input tokens, for a "
                f"total of {qualifier}{count + (requested or 0)} tokens. Please reduce the length of the input "
                "prompt or the number of requested output tokens.", parameter="input_tokens", value=count)
    stop = [r.stop] if isinstance(r.stop, str) else list(r.stop or [])
    echo = bool(r.echo)
    echo_only = not chat and echo and requested == 0
    max_params: list[int] = []
    for pr in prompts:
        if pr.tokens > max_model_len:  # serve/utils/api_utils.py get_max_tokens
            raise ValueError(f"Input length ({pr.tokens}) exceeds model's maximum context length ({max_model_len}).")
        limit = max_model_len - pr.tokens if requested is None else min(requested, max_model_len - pr.tokens)
        max_tokens = 1 if echo_only else limit
        if r.logit_bias:  # SamplingParams.from_optional turns the keys into token ids first
            {int(token): bias for token, bias in r.logit_bias.items()}
        _verify_sampling(r, n, max_tokens, logprobs, stop)
        max_params.append(max_tokens)
    rid = header_request_id if header_request_id is not None else (r.request_id or random_uuid())
    so = r.stream_options
    include_usage = bool(so and so.include_usage)  # serve/utils/api_utils.py should_include_usage
    req = ParsedRequest(
        chat=chat, model=served_model, prompts=prompts, n=n, stream=bool(r.stream), include_usage=include_usage,
        continuous_usage=include_usage and bool(so and so.continuous_usage_stats),
        kv_transfer_params=r.kv_transfer_params, request_id=rid, logprobs=logprobs, echo=echo, echo_only=echo_only,
        role=role, echo_text=echo_text, max_tokens_param=max_params,
        prompt_logprobs=prompt_logprobs,
    )
    # greedy sampling (temperature below vLLM's _SAMPLING_EPS) answers a prompt the same way every time, as a
    # real model does; otherwise the text derives from the seed, else from the request id
    greedy = r.temperature is not None and r.temperature < _SAMPLING_EPS
    prompt_key = json.dumps(body.get("messages" if chat else "prompt"), sort_keys=True, default=str)
    rng = random.Random(r.seed if r.seed is not None else (prompt_key if greedy else rid))
    eos = requested is None and not r.ignore_eos  # no limit given: the simulated model ends with EOS
    for p_idx, pr in enumerate(prompts):
        offsets = rng.sample(range(len(output.WORDS)), n) if n <= len(output.WORDS) else \
            [rng.randrange(len(output.WORDS)) for _ in range(n)]
        for c in range(n):
            req.choices.append(output.plan_choice(
                index=p_idx * n + c, prompt=p_idx, child=c, offset=offsets[c], seed=rng.getrandbits(32),
                max_tokens=max_params[p_idx], min_tokens=r.min_tokens, eos=eos, stop=stop,
                stop_token_ids=list(r.stop_token_ids or []), include_stop=r.include_stop_str_in_output))
    req.engine_error = _engine_checks(r, req, vocab_size, spec_decode)
    return req


def _verify_sampling(r: Any, n: Any, max_tokens: int, logprobs: int | None, stop: list[str]) -> None:
    """``SamplingParams.__post_init__`` / ``_verify_args`` (vllm/sampling_params.py), with vLLM's defaults."""
    presence = 0.0 if r.presence_penalty is None else r.presence_penalty
    frequency = 0.0 if r.frequency_penalty is None else r.frequency_penalty
    repetition = 1.0 if r.repetition_penalty is None else r.repetition_penalty
    temperature = 1.0 if r.temperature is None else r.temperature
    top_p = 1.0 if r.top_p is None else r.top_p
    top_k = 0 if r.top_k is None else r.top_k
    min_p = 0.0 if r.min_p is None else r.min_p
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}.")
    if n > MAX_N:
        raise ValueError(f"n must be at most {MAX_N}, got {n}. To increase this limit, set the VLLM_MAX_N_SEQUENCES "
                         "environment variable.")
    if not -2.0 <= presence <= 2.0:
        raise ValueError(f"presence_penalty must be in [-2, 2], got {presence}.")
    if not -2.0 <= frequency <= 2.0:
        raise ValueError(f"frequency_penalty must be in [-2, 2], got {frequency}.")
    if repetition <= 0.0:
        raise ValueError(f"repetition_penalty must be greater than zero, got {repetition}.")
    if temperature < 0.0:
        raise VLLMValidationError(f"temperature must be non-negative, got {temperature}.", parameter="temperature",
                                  value=temperature)
    if not 0.0 < top_p <= 1.0:
        raise VLLMValidationError(f"top_p must be in (0, 1], got {top_p}.", parameter="top_p", value=top_p)
    if top_k < -1:
        raise ValueError(f"top_k must be 0 (disable), or at least 1, got {top_k}.")
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {min_p}.")
    if max_tokens < 1:
        raise VLLMValidationError(f"max_tokens must be at least 1, got {max_tokens}.", parameter="max_tokens",
                                  value=max_tokens)
    if r.min_tokens < 0:
        raise ValueError(f"min_tokens must be greater than or equal to 0, got {r.min_tokens}.")
    if r.min_tokens > max_tokens:
        raise ValueError(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {r.min_tokens}.")
    if logprobs is not None and logprobs != -1 and logprobs < 0:
        raise VLLMValidationError(f"logprobs must be non-negative or -1, got {logprobs}.", parameter="logprobs",
                                  value=logprobs)
    if any(not s for s in stop):
        raise ValueError("stop cannot contain an empty string.")
    if temperature < _SAMPLING_EPS and n > 1:
        raise ValueError(f"n must be 1 when using greedy sampling, got {n}.")


def _engine_checks(r: Any, req: ParsedRequest, vocab_size: int, spec_decode: bool) -> ApiError | None:
    """Stage 3: ``SamplingParams.verify`` and the input processor's prompt checks, as vLLM orders them."""
    try:
        _verify_at_engine(r, req, vocab_size, spec_decode)
    except ValueError as exc:
        return ApiError.from_exception(exc)
    return None


def _verify_at_engine(r: Any, req: ParsedRequest, vocab_size: int, spec_decode: bool) -> None:
    for pr in req.prompts:
        # SamplingParams.verify (vllm/sampling_params.py): logprobs, logit_bias, allowed_token_ids, spec decode,
        # structured outputs
        if req.logprobs:
            k = vocab_size if req.logprobs == -1 else req.logprobs
            if k > MAX_LOGPROBS:
                raise VLLMValidationError(f"Requested sample logprobs of {k}, which is greater than max allowed: "
                                          f"{MAX_LOGPROBS}", parameter="logprobs", value=k)
        if req.prompt_logprobs:
            k = vocab_size if req.prompt_logprobs == -1 else req.prompt_logprobs
            if k > MAX_LOGPROBS:
                raise VLLMValidationError(f"Requested prompt logprobs of {k}, which is greater than max allowed: "
                                          f"{MAX_LOGPROBS}", parameter="prompt_logprobs", value=k)
        if r.logit_bias:
            bad = [int(t) for t in r.logit_bias if not 0 <= int(t) < vocab_size]
            if bad:
                raise VLLMValidationError(f"token_id(s) {bad} in logit_bias contain out-of-vocab token ids. "
                                          f"Vocabulary size: {vocab_size}", parameter="logit_bias", value=bad)
        if r.allowed_token_ids is not None:
            if not r.allowed_token_ids:
                raise VLLMValidationError("allowed_token_ids is not None and empty!", parameter="allowed_token_ids",
                                          value=r.allowed_token_ids)
            bad = [t for t in r.allowed_token_ids if not 0 <= t < vocab_size]
            if bad:
                raise VLLMValidationError("allowed_token_ids contains out-of-vocab token id!",
                                          parameter="allowed_token_ids", value=bad)
        if spec_decode and ((r.min_p or 0.0) > _SAMPLING_EPS or r.logit_bias):
            raise ValueError("The min_p and logit_bias sampling parameters are not yet supported with speculative "
                             "decoding.")
        rf = r.response_format.type if r.response_format is not None else "text"
        # json_object needs no grammar of the request's own, and every vLLM backend takes it: accepted (the
        # simulated text is not constrained to JSON); the others need a grammar the simulator cannot check
        if rf not in ("text", "json_object") or r.structured_outputs is not None:
            what = f"response_format type '{rf}'" if rf != "text" else "structured_outputs"
            # where vLLM's structured output backend validates the grammar (SamplingParams._validate_structured_
            # outputs): the simulator has none, so it refuses every structured output request
            raise ValueError(f"Structured outputs are not supported by the engine simulator ({what}): it has no "
                             "structured output backend.")
        # v1/engine/input_processor.py: empty prompt, out-of-vocabulary token ids
        if pr.tokens == 0:
            raise ValueError("The decoder prompt cannot be empty")
        if pr.max_id is not None and pr.max_id > vocab_size - 1:
            raise ValueError(f"Token id {pr.max_id} is out of vocabulary")
