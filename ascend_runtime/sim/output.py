"""What the simulated model generates, and the JSON of vLLM 0.23.0's answers.

The model has no weights: choice ``c`` of a request generates the words of
``WORDS`` in a loop, from a start offset drawn per choice (different for the
choices of one prompt while ``n <= 10``; reproducible with ``seed``, else from
the request id). Token ``i`` is the text ``" " + word`` with the pseudo id
``WORD_ID_BASE + word index``; a token-id prompt is shown as the words of its
ids modulo 10. When a request sets no token limit (chat without
``max_tokens``/``max_completion_tokens``; ``max_tokens: null``) and no
``ignore_eos``, the model ends with its end-of-sequence token after
``EOS_AFTER`` tokens (finish reason ``stop``), as a model stops on its own;
otherwise generation runs to ``max_tokens``.

Stop conditions as vLLM 0.23.0 applies them: ``stop_token_ids`` and EOS in
the scheduler (``vllm/v1/core/sched/utils.py`` ``check_stop``: from
``min_tokens`` output tokens on; the stopping token is counted but not shown
unless ``include_stop_str_in_output``), stop strings in the detokenizer
(``vllm/v1/engine/detokenizer.py`` ``update`` / ``check_stop_strings``: once
more than ``min_tokens`` tokens were generated; the text ends before the stop
string, or after it with ``include_stop_str_in_output``; while streaming, the
last ``len(longest stop) - 1`` characters are held back until the end).

Log-probabilities: the sampled token is always the most probable one, with a
log-probability in [-0.6, -0.01]; the alternatives (other words, and the
words without their space or capitalised) share the rest of the probability
mass, each at most half of the previous one, so every list is sorted and the
probabilities sum to less than 1. Shapes follow ``completion/serving.py``
``_create_completion_logprobs`` (``top_logprobs`` has ``max(logprobs, 1)``
entries because the sampled token is the top one) and
``chat_completion/serving.py`` ``_create_chat_logprobs`` (``top_logprobs``
entries of ``top_logprobs`` alternatives, the first being the sampled token).

The answers carry the fields vLLM's pydantic models dump: non-streaming
answers every field (``model_dump()``), stream chunks only the fields vLLM
sets (``model_dump_json(exclude_unset=True)``), the final usage chunk without
``None`` fields.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ascend_runtime.sim.api import ParsedRequest

WORDS = ("the", "model", "serves", "tokens", "on", "ascend", "with", "expert", "parallel", "decode")
#: Token id of ``WORDS[k]`` is ``WORD_ID_BASE + k``; DeepSeek-V3's EOS token id is 1.
WORD_ID_BASE = 100
EOS_ID = 1
EOS_TOKEN = "<\uff5cend\u2581of\u2581sentence\uff5c>"
#: Tokens generated before EOS when a request gives no limit.
EOS_AFTER = 16
_ALTERNATIVES = tuple(f" {w}" for w in WORDS) + WORDS + tuple(f" {w.capitalize()}" for w in WORDS)
_MASK = (1 << 64) - 1


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dumps(obj: Any) -> bytes:
    """JSON as vLLM's server writes it (compact, UTF-8)."""
    return _ENCODER.encode(obj).encode()


def sse(obj: Any) -> bytes:
    """One SSE event."""
    return b"data: " + dumps(obj) + b"\n\n"


def decode_token(token_id: int) -> str:
    """The text the simulator shows for a prompt token id."""
    return " " + WORDS[token_id % len(WORDS)]


@dataclass
class ChoicePlan:
    """One choice: what it generates and how it ends (decided up front: the text is deterministic)."""

    index: int
    prompt: int
    child: int
    offset: int
    seed: int
    #: Tokens the engine generates for it (its ``max_tokens`` in the engine).
    tokens: int
    finish_reason: str
    stop_reason: str | int | None
    #: Index of the EOS token (then the last), else None.
    eos_at: int | None
    #: The last token is not shown (a stop token id without ``include_stop_str_in_output``).
    hidden_last: bool
    #: Length the final text is cut to (a stop string), else None.
    truncate_to: int | None
    #: Characters held back while streaming.
    holdback: int

    def piece(self, i: int) -> str:
        """Text of token ``i``."""
        return "" if i == self.eos_at else " " + WORDS[(self.offset + i) % len(WORDS)]

    def token(self, i: int) -> str:
        """Token ``i`` as log-probabilities show it."""
        return EOS_TOKEN if i == self.eos_at else " " + WORDS[(self.offset + i) % len(WORDS)]

    def token_id(self, i: int) -> int:
        return EOS_ID if i == self.eos_at else WORD_ID_BASE + (self.offset + i) % len(WORDS)

    def text(self, upto: int) -> str:
        """Text of the first ``upto`` tokens as the detokenizer has it before the end."""
        return "".join(self.piece(i) for i in range(upto))

    def final_text(self) -> str:
        """The whole text once finished."""
        shown = self.tokens - 1 if self.hidden_last else self.tokens
        text = self.text(shown)
        return text if self.truncate_to is None else text[: self.truncate_to]


def _find_stop(text: str, new_chars: int, stop: list[str], include: bool) -> tuple[str, int] | None:
    """(stop string, cut position or -1) if a stop string ends in the new text (detokenizer.py semantics)."""
    if not new_chars:
        return None
    for s in stop:
        at = text.find(s, 1 - new_chars - len(s))
        if at == -1:
            continue
        if include:
            at += len(s)
            if at >= len(text):
                return s, -1
        return s, at
    return None


def plan_choice(*, index: int, prompt: int, child: int, offset: int, seed: int, max_tokens: int, min_tokens: int,
                eos: bool, stop: list[str], stop_token_ids: list[int], include_stop: bool) -> ChoicePlan:
    """Decide how many tokens a choice generates and why it ends."""
    limit, eos_at = max_tokens, None
    if eos:
        n_eos = max(EOS_AFTER, min_tokens + 1)
        if n_eos <= max_tokens:
            limit, eos_at = n_eos, n_eos - 1
    plan = ChoicePlan(index, prompt, child, offset, seed, limit, "stop" if eos_at is not None else "length", None,
                      eos_at, False, None, max(len(s) for s in stop) - 1 if stop and not include_stop else 0)
    if not stop and not stop_token_ids:
        return plan
    stop_ids = set(stop_token_ids)
    # the words repeat every len(WORDS) tokens: a stop string or id not met by then never is
    scan = min(limit, min_tokens + len(WORDS) + max((len(s) for s in stop), default=0) + 2)
    text = ""
    for i in range(scan):
        count = i + 1
        stop_token = i == eos_at or (plan.token_id(i) in stop_ids and count >= min_tokens)
        check_from = len(text)
        text += "" if stop_token and not include_stop else plan.piece(i)
        if min_tokens and count <= min_tokens:
            check_from = len(text)
        found = _find_stop(text, len(text) - check_from, stop, include_stop) if stop and count > min_tokens else None
        if found is not None:
            plan.tokens, plan.finish_reason, plan.stop_reason, plan.eos_at = count, "stop", found[0], None
            plan.hidden_last = stop_token and not include_stop
            plan.truncate_to = None if found[1] == -1 else found[1]
            return plan
        if stop_token:
            plan.tokens, plan.finish_reason = count, "stop"
            plan.stop_reason = None if i == eos_at else plan.token_id(i)
            plan.hidden_last = not include_stop and i != eos_at
            return plan
    return plan


# ---------------------------------------------------------------- log-probabilities
def _unit(seed: int, i: int, j: int = 0) -> float:
    """A reproducible number in [0, 1) for (choice, token, rank)."""
    x = (seed * 0x9E3779B97F4A7C15 + (i + 1) * 0xBF58476D1CE4E5B9 + (j + 1) * 0x94D049BB133111EB) & _MASK
    x ^= x >> 31
    x = (x * 0xD6E8FEB86659FD93) & _MASK
    x ^= x >> 32
    return (x >> 11) / float(1 << 53)


def top_entries(token: str, seed: int, i: int, k: int) -> list[tuple[str, float]]:
    """``k`` (at least 1) (token, logprob) pairs, most probable first; the first is ``token``."""
    p0 = math.exp(-(0.01 + 0.59 * _unit(seed, i)))
    out = [(token, math.log(p0))]
    rest = 1.0 - p0
    alts = (a for a in _ALTERNATIVES[(seed + i) % 10:] + _ALTERNATIVES[: (seed + i) % 10] if a != token)
    for j in range(1, k):
        alt = next(alts, None)
        if alt is None:
            break
        out.append((alt, math.log(rest * 0.5**j * (0.9 + 0.1 * _unit(seed, i, j)))))
    return out


@dataclass
class TokenLogprob:
    """One position's log-probabilities: the token, its logprob (None for a first prompt token), the top list."""

    token: str
    logprob: float | None
    top: list[tuple[str, float]] | None


def output_logprobs(plan: ChoicePlan, start: int, stop: int, k: int) -> list[TokenLogprob]:
    out = []
    for i in range(start, stop):
        top = top_entries(plan.token(i), plan.seed, i, max(k, 1))
        out.append(TokenLogprob(top[0][0], top[0][1], top))
    return out


def prompt_logprobs(pieces: list[str], seed: int, k: int) -> list[TokenLogprob]:
    """Prompt positions (echo): the first has none, as in vLLM."""
    out = [TokenLogprob(pieces[0], None, None)] if pieces else []
    for i, piece in enumerate(pieces[1:], 1):
        top = top_entries(piece, seed ^ 0x5A5A, i, max(k, 1))
        out.append(TokenLogprob(piece, top[0][1], top))
    return out


def piece_id(piece: str) -> int:
    """The token id the simulator gives a token string: a word's alternatives have ids from
    ``WORD_ID_BASE`` on (so a generated word keeps its id), any other string a stable id above them."""
    if piece in _ALTERNATIVES:
        return WORD_ID_BASE + _ALTERNATIVES.index(piece)
    return WORD_ID_BASE + len(_ALTERNATIVES) + int.from_bytes(piece.encode()[:6].ljust(6, b"\0"), "big") % 100_000


def chat_pieces(messages: list[tuple[str, str]]) -> list[str]:
    """A chat prompt's token strings: per message its 4 template markers, then its words."""
    out: list[str] = []
    for role, text in messages:
        out += ["<\uff5c", role, "\uff5c>", "\n"]
        out += [f" {word}" for word in text.split()]
    return out


def vllm_prompt_logprobs(pieces: list[str], seed: int, k: int) -> list[dict[str, Any] | None]:
    """``prompt_logprobs`` as vLLM answers them (``clamp_prompt_logprobs`` of ``PromptLogprobs``): ``None`` for
    the first token, then per token ``{token id: {logprob, rank, decoded_token}}`` for the prompt's own
    token (the most probable here, rank 1) and the top ``k``."""
    out: list[dict[str, Any] | None] = []
    for pos in prompt_logprobs(pieces, seed, k):
        if pos.top is None:
            out.append(None)
            continue
        out.append({str(piece_id(tok)): {"logprob": lp, "rank": rank, "decoded_token": tok}
                    for rank, (tok, lp) in enumerate(pos.top[: max(k, 1)], 1)})
    return out


def completion_logprobs(positions: list[TokenLogprob], k: int, text_offset: int = 0) -> dict[str, Any]:
    """``CompletionLogProbs`` (completion/serving.py ``_create_completion_logprobs``)."""
    offsets, logprobs, tokens, tops = [], [], [], []
    last = 0
    for n, pos in enumerate(positions):
        offsets.append(text_offset if n == 0 else offsets[-1] + last)
        last = len(pos.token)
        tokens.append(pos.token)
        logprobs.append(pos.logprob)
        tops.append(None if pos.top is None else {t: lp for t, lp in pos.top[: max(k, 0) + 1]})
    return {"text_offset": offsets, "token_logprobs": logprobs, "tokens": tokens, "top_logprobs": tops}


def _lp(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", errors="replace"))}


def chat_logprobs(positions: list[TokenLogprob], k: int) -> dict[str, Any]:
    """``ChatCompletionLogProbs`` (chat_completion/serving.py ``_create_chat_logprobs``)."""
    content = []
    for pos in positions:
        entry = _lp(pos.token, pos.logprob if pos.logprob is not None else -9999.0)
        entry["top_logprobs"] = [_lp(t, lp) for t, lp in (pos.top or [])[:k]] if k > 0 else []
        content.append(entry)
    return {"content": content}


# ---------------------------------------------------------------- answers
class ChoiceStream:
    """Streaming state of one choice: tokens sent, text shown so far (detokenizer.py ``get_next_output_text``)."""

    __slots__ = ("plan", "sent", "text", "shown", "echoed")

    def __init__(self, plan: ChoicePlan) -> None:
        self.plan = plan
        self.sent = 0
        self.text = ""
        self.shown = 0
        self.echoed = False

    def advance(self, upto: int, finished: bool) -> str:
        """The text delta once ``upto`` tokens exist (``finished``: the choice is done)."""
        plan = self.plan
        if not plan.holdback and plan.truncate_to is None and not plan.hidden_last:
            # nothing is held back or cut: the delta is the new tokens' text
            new = plan.piece(self.sent) if upto == self.sent + 1 else "".join(map(plan.piece, range(self.sent, upto)))
            self.sent = upto
            self.shown += len(new)
            return new
        if finished:
            full = plan.final_text()
        else:
            self.text += "".join(plan.piece(i) for i in range(self.sent, upto))
            full = self.text[: len(self.text) - plan.holdback] if plan.holdback else self.text
        self.sent = upto
        delta = full[self.shown:] if len(full) > self.shown else ""
        self.shown = max(self.shown, len(full))
        return delta


def _usage(prompt: int, completion: int, details: bool = True) -> dict[str, Any]:
    u: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
    if details:
        u["prompt_tokens_details"] = None
    return u


class Answer:
    """Builds the JSON objects of one answer (``req.choices`` in answer order)."""

    def __init__(self, req: "ParsedRequest", fingerprint: str | None) -> None:
        self.req = req
        self.fingerprint = fingerprint
        self.id = req.response_id
        self.created = int(time.time())
        self.obj = "chat.completion.chunk" if req.chat else "text_completion"
        self.streams = [ChoiceStream(p) for p in req.choices]
        self.started = False

    # ---- usage
    def prompt_tokens(self) -> int:
        """Prompt tokens of the answer: each prompt once (completion/serving.py, chat_completion/serving.py)."""
        return sum(p.tokens for p in self.req.prompts)

    # ---- non-streaming
    def full(self, generated: list[int], kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
        """The non-streaming answer; ``generated``: tokens each choice generated."""
        req = self.req
        k = req.logprobs
        choices = []
        for plan, gen in zip(req.choices, generated):
            text = plan.final_text()
            if req.chat:
                positions = output_logprobs(plan, 0, gen, k or 0) if k is not None else None
                choices.append({
                    "index": plan.child,
                    "message": {"role": req.role, "content": req.echo_text + text, "refusal": None,
                                "annotations": None, "audio": None, "function_call": None, "tool_calls": [],
                                "reasoning": None},
                    "logprobs": chat_logprobs(positions, k or 0) if positions is not None else None,
                    "finish_reason": plan.finish_reason, "stop_reason": plan.stop_reason, "token_ids": None,
                    "routed_experts": None,
                })
            else:
                logprobs = None
                prompt = req.prompts[plan.prompt]
                if k is not None:
                    positions = prompt_logprobs(prompt.pieces, plan.seed, k) if req.echo else []
                    if not req.echo_only:
                        positions += output_logprobs(plan, 0, gen, k)
                    logprobs = completion_logprobs(positions, k)
                if req.echo_only:
                    text = prompt.text
                elif req.echo:
                    text = prompt.text + text
                plp = (vllm_prompt_logprobs(prompt.pieces, plan.seed, req.prompt_logprobs)
                       if req.prompt_logprobs is not None else None)
                choices.append({"index": plan.index, "text": text, "logprobs": logprobs,
                                "finish_reason": plan.finish_reason, "stop_reason": plan.stop_reason,
                                "token_ids": None, "prompt_logprobs": plp, "prompt_token_ids": None,
                                "routed_experts": None})
        body: dict[str, Any] = {
            "id": self.id, "object": "chat.completion" if req.chat else "text_completion", "created": self.created,
            "model": req.model, "choices": choices, "service_tier": None, "system_fingerprint": self.fingerprint,
            "usage": _usage(self.prompt_tokens(), sum(generated)),
        }
        if req.chat:
            plp = (vllm_prompt_logprobs(req.prompts[0].pieces, req.choices[0].seed, req.prompt_logprobs)
                   if req.prompt_logprobs is not None else None)
            body.update(prompt_logprobs=plp, prompt_token_ids=None, prompt_text=None)
        body["kv_transfer_params"] = kv_transfer_params
        return body

    # ---- streaming
    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.id, "object": self.obj, "created": self.created, "model": self.req.model,
                "choices": [choice]}

    def first_chunks(self) -> list[dict[str, Any]]:
        """Chat: a role-only chunk per choice, then the echoed content (sent with the first output)."""
        self.started = True
        req = self.req
        if not req.chat:
            return []
        out = []
        p = self.prompt_tokens()
        for c in range(req.n):
            chunk = self._chunk({"index": c, "delta": {"role": req.role, "content": ""}, "logprobs": None,
                                 "finish_reason": None})
            chunk["prompt_token_ids"] = None
            chunk["prompt_text"] = None
            if req.continuous_usage:
                chunk["usage"] = _usage(p, 0, details=False)
            out.append(chunk)
        if req.echo_text:
            for c in range(req.n):
                chunk = self._chunk({"index": c, "delta": {"content": req.echo_text}, "logprobs": None,
                                     "finish_reason": None})
                if req.continuous_usage:
                    chunk["usage"] = _usage(p, 0, details=False)
                out.append(chunk)
        return out

    def step_chunk(self, c: int, upto: int, finished: bool) -> dict[str, Any] | None:
        """The chunk of choice ``c`` once it has ``upto`` tokens, or None if it has nothing new."""
        st = self.streams[c]
        plan, req = st.plan, self.req
        start = st.sent
        if upto <= start and not (finished and start < plan.tokens):
            return None
        delta = st.advance(upto, finished)
        k = req.logprobs
        done = finished and upto >= plan.tokens
        finish = plan.finish_reason if done else None
        if req.chat:
            choice: dict[str, Any] = {"index": plan.child, "delta": {"content": delta},
                                      "logprobs": chat_logprobs(output_logprobs(plan, start, upto, k), k)
                                      if k is not None else None,
                                      "finish_reason": finish}
            if done:
                choice["stop_reason"] = plan.stop_reason
            choice["token_ids"] = None
        else:
            prompt = req.prompts[plan.prompt]
            positions: list[TokenLogprob] = []
            offset = st.shown - len(delta)
            echoing = req.echo and not st.echoed
            if echoing:
                st.echoed = True
                delta = prompt.text if req.echo_only else prompt.text + delta
                if k is not None:
                    positions = prompt_logprobs(prompt.pieces, plan.seed, k)
                offset = 0
            # later chunks count offsets from the generated text only, as vLLM does (previous_text_lens)
            if k is not None and not req.echo_only:
                positions += output_logprobs(plan, start, upto, k)
            choice = {"index": plan.index, "text": delta,
                      "logprobs": completion_logprobs(positions, k, offset) if k is not None else None,
                      "finish_reason": finish, "stop_reason": plan.stop_reason if done else None,
                      # the echoing chunk carries the prompt's token ids (completion/serving.py)
                      "prompt_token_ids": prompt.token_ids() if echoing else None,
                      "token_ids": None}
        chunk = self._chunk(choice)
        if done and not req.include_usage and self.fingerprint is not None:
            chunk["system_fingerprint"] = self.fingerprint
        if req.continuous_usage:
            prompt_tokens = self.prompt_tokens() if req.chat else req.prompts[plan.prompt].tokens
            chunk["usage"] = _usage(prompt_tokens, upto, details=False)
        return chunk

    def usage_chunk(self, generated: list[int]) -> dict[str, Any]:
        """Final chunk with empty choices and the usage (``stream_options.include_usage``)."""
        chunk = {"id": self.id, "object": self.obj, "created": self.created, "model": self.req.model,
                 "choices": [], "usage": _usage(self.prompt_tokens(), sum(generated), details=False)}
        if self.fingerprint is not None:
            chunk["system_fingerprint"] = self.fingerprint
        return chunk
