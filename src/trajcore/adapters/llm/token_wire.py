"""The three token-in, token-out wire formats of managed mode, as pure request/response functions.

Managed mode lives or dies by one rule: the ids trajcore keeps are the ids the sampler drew, never
a re-tokenisation of text. Each server says which ids it drew in its own way, and each parser here
reads the ids from the field that carries them as integers, checks that there is exactly one
logprob per id, and names the path of anything wrong.

- **vLLM, OpenAI completions** (``POST /v1/completions``): the prompt is a list of ids; we ask for
  ``logprobs`` and ``return_tokens_as_token_ids``, so ``choices[0].logprobs.tokens`` holds
  ``"token_id:<id>"`` strings; newer vLLM also honours ``return_token_ids`` and sends
  ``choices[0].token_ids``. When both are present they must agree. Logprobs come from
  ``choices[0].logprobs.token_logprobs``.
- **SGLang native** (``POST /generate``): ``input_ids`` in, ``return_logprob`` set;
  ``meta_info.output_token_logprobs`` is a list of ``[logprob, token_id, text-or-null]``;
  ``meta_info.finish_reason`` is ``{"type": "stop"|"length"|"abort", ...}`` (a bare string is
  accepted). A batch-shaped reply (a list of one result) is accepted too. When ``output_ids`` is
  present it must agree with the logprob entries, after the prompt ids SGLang's detokenizer puts
  in front of them (up to five, its incremental-decoding context) are skipped.
- **Atropos ``/generate``** (the vLLM API server atroposlib's ``VLLMServer`` talks to):
  ``{"prompt": {"prompt_token_ids": [...]}, "logprobs": 0, ...sampling}`` in;
  ``{"text": [...], "finish_reasons": [...], "logprobs": [[[{"<id>": lp}], ...]], "token_ids":
  [[...]], "prompt_token_ids": [...]}`` out. The ids come from ``token_ids[0]`` (atroposlib
  itself takes the first key of each logprob dict, which is only right when no top-k was asked
  for); each position's logprob is looked up under its own id.

``sampling.extra_body`` is merged into every request body last: at the top level, except that
for SGLang a sampling key (``top_k``, ``min_p``...) goes inside ``sampling_params``, the only place
SGLang reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeAlias

from trajcore.domain.errors import WireError
from trajcore.domain.json_values import JSONObject
from trajcore.domain.sampling import FinishReason, SamplingParams, TokenCompletion

from .wire import (
    array,
    integer,
    integers,
    number,
    obj,
    optional,
    optional_string,
    read_response,
    sampling_fields,
    string,
)

__all__ = [
    "SGLANG_SAMPLING_KEYS",
    "TOKEN_ID_PREFIX",
    "ResponseParser",
    "atropos_generate_request",
    "check_prompt_ids",
    "parse_atropos_generate",
    "parse_atropos_generate_body",
    "parse_sglang_generate",
    "parse_sglang_generate_body",
    "parse_vllm_completion",
    "parse_vllm_completion_body",
    "response_parser",
    "sglang_generate_parser",
    "sglang_generate_request",
    "vllm_completion_request",
]

TOKEN_ID_PREFIX = "token_id:"  # noqa: S105 -- a wire prefix, not a secret
"""How vLLM spells a token when ``return_tokens_as_token_ids`` is set."""


def check_prompt_ids(prompt_ids: Sequence[int]) -> list[int]:
    """``prompt_ids`` as a list, or ``WireError`` at ``prompt_ids[i]`` / ``prompt_ids``."""
    ids = list(prompt_ids)
    for i, value in enumerate(ids):
        token: object = value
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise WireError(f"prompt_ids[{i}]", f"expected a non-negative integer, got {token!r}")
    if not ids:
        raise WireError("prompt_ids", "must not be empty")
    return ids


def _same_length(ids: Sequence[int], logprobs: Sequence[float], field: str) -> None:
    if len(ids) != len(logprobs):
        raise WireError(field, f"{len(logprobs)} logprobs for {len(ids)} token ids")


ResponseParser: TypeAlias = Callable[[int, Mapping[str, str], bytes], TokenCompletion]


def response_parser(parse_body: Callable[[object], TokenCompletion]) -> ResponseParser:
    """A parser of a whole response (status, headers, body) whose decoded JSON ``parse_body`` reads.

    The parser raises RateLimited, ModelServerError or ModelServerRejected for a non-2xx status,
    WireError for a 2xx body that breaks the protocol.
    """

    def parse(status: int, headers: Mapping[str, str], body: bytes) -> TokenCompletion:
        return read_response(status, headers, body, parse_body)

    return parse


# ------------------------------------------------------------------------------- vLLM completions


def vllm_completion_request(
    *, model: str, prompt_ids: Sequence[int], sampling: SamplingParams
) -> JSONObject:
    """The body of ``POST /v1/completions`` for a token-id prompt with exact sampled ids back.

    Raises:
        WireError: ``prompt_ids`` empty or not non-negative integers.
    """
    body: JSONObject = {
        "model": model,
        "prompt": list(check_prompt_ids(prompt_ids)),
        **sampling_fields(sampling),
        "n": 1,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    body.update(sampling.extra_body)
    return body


def _token_id_string(value: object, field: str) -> int:
    text = string(value, field)
    digits = text.removeprefix(TOKEN_ID_PREFIX)
    if digits == text or not digits.isdigit():
        raise WireError(
            field, f"expected '{TOKEN_ID_PREFIX}<id>' (return_tokens_as_token_ids), got {text!r}"
        )
    return int(digits)


def parse_vllm_completion_body(data: object) -> TokenCompletion:
    """The ``TokenCompletion`` in a decoded vLLM completions response.

    Raises:
        WireError: a field missing or mistyped, ids that do not agree, or a logprob count that
            differs from the id count, naming the path.
    """
    root = obj(data, "$")
    choices = array(root.get("choices"), "$.choices")
    if not choices:
        raise WireError("$.choices", "expected at least one choice, got none")
    at = "$.choices[0]"
    choice = obj(choices[0], at)
    finish = FinishReason.parse(optional(choice, "finish_reason"), field=f"{at}.finish_reason")
    logprobs = obj(choice.get("logprobs"), f"{at}.logprobs")
    raw_values = array(logprobs.get("token_logprobs"), f"{at}.logprobs.token_logprobs")
    values = [number(v, f"{at}.logprobs.token_logprobs[{i}]") for i, v in enumerate(raw_values)]
    from_tokens: list[int] | None = None
    raw_tokens = optional(logprobs, "tokens")
    if raw_tokens is not None:
        from_tokens = [
            _token_id_string(t, f"{at}.logprobs.tokens[{i}]")
            for i, t in enumerate(array(raw_tokens, f"{at}.logprobs.tokens"))
        ]
    raw_ids = optional(choice, "token_ids")
    if raw_ids is not None:
        ids = integers(raw_ids, f"{at}.token_ids")
        if from_tokens is not None and from_tokens != ids:
            raise WireError(f"{at}.logprobs.tokens", "disagrees with token_ids")
    elif from_tokens is not None:
        ids = from_tokens
    else:
        raise WireError(f"{at}.logprobs.tokens", "missing: no sampled token ids in the response")
    _same_length(ids, values, f"{at}.logprobs.token_logprobs")
    text = optional_string(choice, "text", f"{at}.text")
    return TokenCompletion(token_ids=ids, logprobs=values, finish_reason=finish, text=text)


#: The ``TokenCompletion`` a vLLM completions response carries (see ``response_parser``).
parse_vllm_completion = response_parser(parse_vllm_completion_body)


# ------------------------------------------------------------------------------- SGLang /generate


#: The names SGLang reads inside ``sampling_params`` (its ``SamplingParams`` API fields). At the
#: top level of a ``/generate`` body they are ignored without a word, so ``extra_body`` keys of
#: these names are put inside ``sampling_params``.
SGLANG_SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "n",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "custom_params",
        "stream_interval",
        "logit_bias",
        "sampling_seed",
    }
)


def sglang_generate_request(*, prompt_ids: Sequence[int], sampling: SamplingParams) -> JSONObject:
    """The body of SGLang's native ``POST /generate`` for a token-id prompt.

    ``sampling.extra_body`` is merged last: a key SGLang samples with (``SGLANG_SAMPLING_KEYS``,
    e.g. ``top_k``, ``min_p``, ``repetition_penalty``) and the entries of an ``extra_body``
    ``sampling_params`` object go into ``sampling_params``; any other key at the top level.

    Raises:
        WireError: ``prompt_ids`` empty or not non-negative integers.
    """
    params: JSONObject = {
        **sampling_fields(sampling, max_tokens="max_new_tokens", seed="sampling_seed"),
        "skip_special_tokens": False,
    }
    body: JSONObject = {
        "input_ids": list(check_prompt_ids(prompt_ids)),
        "sampling_params": params,
        "return_logprob": True,
        "logprob_start_len": -1,
        "return_text_in_logprobs": False,
    }
    for key, value in sampling.extra_body.items():
        if key == "sampling_params" and isinstance(value, dict):
            params.update(value)
        elif key in SGLANG_SAMPLING_KEYS:
            params[key] = value
        else:
            body[key] = value
    return body


def _finish_type(value: object, field: str) -> FinishReason:
    if isinstance(value, dict):
        return FinishReason.parse(value.get("type"), field=f"{field}.type")
    return FinishReason.parse(value, field=field)


def parse_sglang_generate_body(data: object, prompt_ids: Sequence[int] = ()) -> TokenCompletion:
    """The ``TokenCompletion`` in a decoded SGLang ``/generate`` response to ``prompt_ids``.

    The sampled ids are those of ``output_token_logprobs``. ``output_ids`` must agree with them;
    SGLang's detokenizer may put up to the last few prompt ids in front of them there (its
    incremental-decoding context, sgl-project/sglang#17240), so leading ids that equal the tail
    of ``prompt_ids`` are skipped. Without ``prompt_ids`` nothing is skipped.

    Raises:
        WireError: a field missing or mistyped, or ``output_ids`` that disagree with the
            logprob entries, naming the path.
    """
    root_at = "$"
    if isinstance(data, list):
        if len(data) != 1:
            raise WireError("$", f"expected one result, got {len(data)}")
        data, root_at = data[0], "$[0]"
    root = obj(data, root_at)
    meta_at = f"{root_at}.meta_info"
    meta = obj(root.get("meta_info"), meta_at)
    finish = _finish_type(optional(meta, "finish_reason"), f"{meta_at}.finish_reason")
    entries_at = f"{meta_at}.output_token_logprobs"
    ids: list[int] = []
    values: list[float] = []
    for i, item in enumerate(array(meta.get("output_token_logprobs"), entries_at)):
        entry = array(item, f"{entries_at}[{i}]")
        if len(entry) < 2:
            raise WireError(f"{entries_at}[{i}]", "expected [logprob, token_id, text]")
        values.append(number(entry[0], f"{entries_at}[{i}][0]"))
        ids.append(integer(entry[1], f"{entries_at}[{i}][1]"))
    raw_ids = optional(root, "output_ids")
    if raw_ids is not None:
        output_ids = integers(raw_ids, f"{root_at}.output_ids")
        extra = len(output_ids) - len(ids)
        if 0 < extra <= len(prompt_ids) and output_ids[:extra] == list(prompt_ids[-extra:]):
            output_ids = output_ids[extra:]  # the detokenizer's context, not sampled
        if len(output_ids) != len(ids):
            raise WireError(entries_at, f"{len(ids)} logprobs for {len(output_ids)} token ids")
        if output_ids != ids:
            raise WireError(f"{root_at}.output_ids", "disagrees with output_token_logprobs")
    text = optional_string(root, "text", f"{root_at}.text")
    return TokenCompletion(token_ids=ids, logprobs=values, finish_reason=finish, text=text)


#: The ``TokenCompletion`` an SGLang ``/generate`` response carries (see ``response_parser``),
#: with no prompt to recognise in ``output_ids`` (see ``sglang_generate_parser``).
parse_sglang_generate = response_parser(parse_sglang_generate_body)


def sglang_generate_parser(prompt_ids: Sequence[int]) -> ResponseParser:
    """The parser of SGLang's answer to ``prompt_ids`` (see ``parse_sglang_generate_body``)."""
    prompt = tuple(prompt_ids)

    def parse_body(data: object) -> TokenCompletion:
        return parse_sglang_generate_body(data, prompt)

    return response_parser(parse_body)


# ------------------------------------------------------------------------------ Atropos /generate


def atropos_generate_request(*, prompt_ids: Sequence[int], sampling: SamplingParams) -> JSONObject:
    """The body of the Atropos vLLM API server's ``POST /generate`` for a token-id prompt.

    Raises:
        WireError: ``prompt_ids`` empty or not non-negative integers.
    """
    body: JSONObject = {
        "prompt": {"prompt_token_ids": list(check_prompt_ids(prompt_ids))},
        "logprobs": 0,
        "n": 1,
        **sampling_fields(sampling),
        "skip_special_tokens": False,
    }
    body.update(sampling.extra_body)
    return body


def _position_logprob(item: object, token: int | None, field: str) -> tuple[int, float]:
    """(id, logprob) of one position: ``[{"<id>": lp, ...}]`` looked up under ``token``."""
    entries = array(item, field)
    for j, entry in enumerate(entries):
        table = obj(entry, f"{field}[{j}]")
        if token is None:
            if not table:
                continue
            key, value = next(iter(table.items()))
            if not key.isdigit():
                raise WireError(f"{field}[{j}]", f"key {key!r} is not a token id")
            return int(key), number(value, f"{field}[{j}].{key}")
        if str(token) in table:
            return token, number(table[str(token)], f"{field}[{j}].{token}")
    raise WireError(field, f"no logprob for the sampled token {token}")


def parse_atropos_generate_body(data: object) -> TokenCompletion:
    """The ``TokenCompletion`` in a decoded Atropos ``/generate`` response (first completion).

    Raises:
        WireError: a field missing or mistyped, or a logprob count that differs from the ids.
    """
    root = obj(data, "$")
    finishes = array(root.get("finish_reasons"), "$.finish_reasons")
    if not finishes:
        raise WireError("$.finish_reasons", "expected one finish reason per completion, got none")
    finish = FinishReason.parse(finishes[0], field="$.finish_reasons[0]")
    all_logprobs = array(root.get("logprobs"), "$.logprobs")
    if not all_logprobs:
        raise WireError("$.logprobs", "expected one list per completion, got none")
    positions = array(all_logprobs[0], "$.logprobs[0]")
    raw_ids = optional(root, "token_ids")
    ids: list[int | None]
    if raw_ids is not None:
        per_completion = array(raw_ids, "$.token_ids")
        if not per_completion:
            raise WireError("$.token_ids", "expected one list per completion, got none")
        ids = [*integers(per_completion[0], "$.token_ids[0]")]
        if len(ids) != len(positions):
            raise WireError("$.logprobs[0]", f"{len(positions)} logprobs for {len(ids)} token ids")
    else:
        ids = [None] * len(positions)
    out_ids: list[int] = []
    values: list[float] = []
    for i, (item, token) in enumerate(zip(positions, ids, strict=True)):
        got, value = _position_logprob(item, token, f"$.logprobs[0][{i}]")
        out_ids.append(got)
        values.append(value)
    texts = optional(root, "text")
    text: str | None = None
    if texts is not None:
        text_list = array(texts, "$.text")
        text = string(text_list[0], "$.text[0]") if text_list else None
    return TokenCompletion(token_ids=out_ids, logprobs=values, finish_reason=finish, text=text)


#: The ``TokenCompletion`` an Atropos ``/generate`` response carries (see ``response_parser``).
parse_atropos_generate = response_parser(parse_atropos_generate_body)
