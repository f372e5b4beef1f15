"""Managed mode: ``TokenServer`` adapters for vLLM, SGLang and the Atropos ``/generate`` server.

Each adapter sends a token-id prompt and returns the sampled ids and their logprobs exactly as
the server reported them; the wire details (and how each server names the sampled ids) are in
``token_wire``. They share ``transport`` for keep-alive connections, retries and deadlines.

Which to pick:

- ``VLLMTokenServer``: stock vLLM (``vllm serve``), OpenAI completions endpoint. ``base_url``
  includes ``/v1``.
- ``SGLangTokenServer``: SGLang's native ``/generate``. ``base_url`` is the server root (a
  trailing ``/v1`` is dropped, as atroposlib does).
- ``AtroposTokenServer``: the vLLM API server from Atropos' example trainer (what atroposlib's
  ``VLLMServer`` calls). ``base_url`` as for SGLang.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

import attrs

from trajcore.domain.json_values import JSONObject
from trajcore.domain.sampling import SamplingParams, TokenCompletion

from .token_wire import (
    ResponseParser,
    atropos_generate_request,
    parse_atropos_generate,
    parse_sglang_generate,
    parse_vllm_completion,
    sglang_generate_parser,
    sglang_generate_request,
    vllm_completion_request,
)
from .transport import HTTPModelServer

__all__ = ["AtroposTokenServer", "SGLangTokenServer", "VLLMTokenServer"]


@attrs.define
class _HttpTokenServer(HTTPModelServer):
    _path: ClassVar[str]
    _at_root: ClassVar[bool] = False  # a trailing ``/v1`` of ``base_url`` is dropped
    _parse: ClassVar[ResponseParser]  # read through the class: a plain function, never bound

    def _root(self) -> str:
        url = self.base_url.rstrip("/")
        return url.removesuffix("/v1") if self._at_root else url

    def _request(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> JSONObject:
        raise NotImplementedError

    def _parser(self, prompt_ids: Sequence[int]) -> ResponseParser:
        """The parser of the answer to ``prompt_ids``."""
        return type(self)._parse

    async def generate(
        self, prompt_ids: Sequence[int], *, sampling: SamplingParams
    ) -> TokenCompletion:
        """Sample a continuation of ``prompt_ids``; see ``TokenServer.generate``.

        Raises:
            RateLimited, ModelServerError: after retries (or at the deadline).
            ModelServerRejected: a 4xx other than 408/429, with status and body.
            WireError: the response broke the protocol (including a logprob count that differs
                from the id count); ``field`` is its JSON path. Also for an empty or non-integer
                prompt (``field`` ``prompt_ids[i]``).
            PoolClosed: after ``aclose``.
        """
        body = self._request(prompt_ids, sampling)
        return await self._client.post_json(self._path, body, self._parser(prompt_ids))


@attrs.define
class VLLMTokenServer(_HttpTokenServer):
    """A ``TokenServer`` over stock vLLM's ``/v1/completions`` with a token-id prompt.

    Attributes:
        base_url: The API root including ``/v1``.
        model: The served model's name (the ``model`` field of every request).
        api_key, retry, max_connections, rng, transport: As for ``OpenAIChatServer``.
    """

    _path = "/completions"
    _parse = parse_vllm_completion
    model: str = attrs.field(kw_only=True)

    def _request(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> JSONObject:
        return vllm_completion_request(model=self.model, prompt_ids=prompt_ids, sampling=sampling)


class _RequestBuilder(Protocol):
    def __call__(self, *, prompt_ids: Sequence[int], sampling: SamplingParams) -> JSONObject: ...


@attrs.define
class _GenerateTokenServer(_HttpTokenServer):
    """A native ``/generate`` at the server root, whose request needs only the ids and sampling."""

    _path = "/generate"
    _at_root = True
    _build: ClassVar[_RequestBuilder]

    def _request(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> JSONObject:
        return self._build(prompt_ids=prompt_ids, sampling=sampling)


@attrs.define
class SGLangTokenServer(_GenerateTokenServer):
    """A ``TokenServer`` over SGLang's native ``/generate`` (``input_ids``, ``return_logprob``).

    Attributes:
        base_url: The server root (``http://host:30000``); a trailing ``/v1`` is dropped.
        api_key, retry, max_connections, rng, transport: As for ``OpenAIChatServer``.
    """

    _build = staticmethod(sglang_generate_request)
    _parse = parse_sglang_generate

    def _parser(self, prompt_ids: Sequence[int]) -> ResponseParser:
        # SGLang may repeat the prompt's last ids in ``output_ids``; the parser skips them.
        return sglang_generate_parser(prompt_ids)


@attrs.define
class AtroposTokenServer(_GenerateTokenServer):
    """A ``TokenServer`` over the Atropos vLLM API server's ``/generate``.

    Attributes:
        base_url: The server root; a trailing ``/v1`` is dropped (atroposlib's configs carry it).
        api_key, retry, max_connections, rng, transport: As for ``OpenAIChatServer``.
    """

    _build = staticmethod(atropos_generate_request)
    _parse = parse_atropos_generate
