"""Before a run's first group: the model servers a run talks to, and whether they answer.

An env's ``--openai.*`` settings reach Atropos's ``ServerManager``; this module makes sure they
say what the user typed and that the endpoint answers before any group waits on it.

Rules it keeps:

- **Every ``--openai.*`` flag is honoured, whatever ``config_init`` returns.** Atropos drops the
  flags when ``config_init`` returns its bare ``ServerBaseline`` (as ``AgentEnv.config_init``
  did, and every env that returned ``super()``'s servers). ``cli_servers`` offers such a baseline
  to Atropos's command line as one ``APIServerConfig`` with the same settings, so the flags
  merge into it. A list of two or more servers takes no ``--openai.*`` flag: Atropos refuses
  them there, saying to list the servers in the YAML ``openai:`` block instead.
- **What Atropos hands over is what the servers are.** Atropos passes a single
  ``APIServerConfig`` to ``ServerManager``, which then ignores its ``base_url`` and talks to
  ``localhost:9004-9007``; ``normalize_servers`` turns one with a ``base_url`` into a list of
  one, and a config without a ``base_url`` into the baseline it stands for.
- **An endpoint that does not answer is said at once, and the run ends after a stated
  deadline.** ``wait_for_model`` sends each server one tiny request of the kind the run will
  send (a one-token chat completion in OpenAI mode, a one-token completion on the token
  endpoint in managed mode). A failure is logged at once with the URL, what came back (the
  connection error or the HTTP status and body) and what was expected; a server that answers
  the wrong thing (a 4xx, a body that is not the expected JSON) ends the start at once, one
  that cannot be reached or answers 5xx is tried again each second until ``model_wait_s``
  has passed, and then the start fails with ``ModelEndpointUnavailable`` naming all of it.
- **wandb that cannot log is said before the run waits on anything.** Atropos's ``process``
  turns ``use_wandb`` on whatever ``config_init`` set, and wandb then stops the run only after
  the model answered. ``check_wandb`` refuses a start with ``use_wandb`` on, wandb not switched
  off (``WANDB_MODE`` ``disabled`` or ``offline``), and nowhere wandb reads a key from (no
  ``WANDB_API_KEY``, no netrc file, no wandb settings file), naming the ways out.
- ``server_configs`` is the typed way for ``config_init`` to name a server (``APIServerConfig``
  is untyped): each value is checked here, and a bad one is a ``ConfigError`` naming
  ``openai.<field>``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, cast

import anyio
import attrs
from atroposlib.envs.server_handling.server_baseline import (  # type: ignore[import-untyped]
    APIServerConfig,
    ServerBaseline,
)
from pydantic import ValidationError

from trajcore.adapters.llm.atropos import token_server_from_config
from trajcore.adapters.llm.chat import OpenAIChatServer
from trajcore.adapters.llm.transport import RetryRules
from trajcore.adapters.tokenizers import qwen3_tokenizer_path
from trajcore.domain.errors import (
    ConfigError,
    InfrastructureError,
    ModelServerError,
    ModelServerRejected,
    TrajcoreError,
)
from trajcore.domain.validators import check_argument, positive_int
from trajcore.entrypoints.atropos.failing_groups import GroupsFailing
from trajcore.entrypoints.model_probe import PROBE_SAMPLING, send_probe
from trajcore.entrypoints.seed_settings import translate_seed_flags

__all__ = [
    "ModelEndpointUnavailable",
    "ServerType",
    "check_wandb",
    "cli_command",
    "cli_servers",
    "inline_negative_values",
    "model_probes",
    "normalize_servers",
    "server_configs",
    "tokenizer_errors",
    "tokenizer_unavailable",
    "wait_for_model",
]

log = logging.getLogger("trajcore.env")

ServerType = Literal["openai", "vllm", "sglang", "trl"]
_SERVER_TYPES = ("openai", "vllm", "sglang", "trl")

PROBE_TIMEOUT_S = 10.0
"""Longest one try of an endpoint may take."""
RETRY_EVERY_S = 1.0
"""Pause between tries of an endpoint that could not be reached."""


class ModelEndpointUnavailable(InfrastructureError):
    """No model endpoint of the run answered as expected before ``model_wait_s`` passed, or
    one answered something that is not a model server's answer."""


# ------------------------------------------------------------------------------ server configs


def server_configs(
    *,
    base_url: str | None = None,
    model_name: str = "default",
    server_type: ServerType = "openai",
    api_key: str = "",
    tokenizer_name: str = "none",
    timeout_s: int = 1200,
    max_requests: int = 512,
    eval_requests: int = 64,
    health_check: bool = True,
) -> object:
    """The server settings ``config_init`` returns beside the env's config, typed and checked.

    ``base_url`` is the API root the ``openai`` client is given (``http://host:8000/v1``);
    ``None`` means Atropos's local servers (``localhost:9004-9007``, what a trainer starts).
    Every ``--openai.*`` flag still overrides these on the command line.

    Returns:
        A list of one ``APIServerConfig``, or Atropos's ``ServerBaseline`` when ``base_url`` is
        ``None``.

    Raises:
        ConfigError: a value that cannot work, at ``openai.<field>``.
    """
    if base_url is not None and not base_url.startswith(("http://", "https://")):
        raise ConfigError("openai.base_url", f"expected an http(s) URL, got {base_url!r}")
    if server_type not in _SERVER_TYPES:
        raise ConfigError(
            "openai.server_type", f"expected one of {', '.join(_SERVER_TYPES)}, got {server_type!r}"
        )
    if not model_name.strip():
        raise ConfigError("openai.model_name", f"must be non-empty text, got {model_name!r}")
    for field, value in (
        ("timeout", timeout_s),
        ("num_max_requests_at_once", max_requests),
        ("num_requests_for_eval", eval_requests),
    ):
        check_argument(positive_int, f"openai.{field}", value)
    common: dict[str, Any] = {
        "model_name": model_name,
        "server_type": server_type,
        "tokenizer_name": tokenizer_name,
        "timeout": timeout_s,
        "num_max_requests_at_once": max_requests,
        "num_requests_for_eval": eval_requests,
    }
    if base_url is None:
        baseline: object = ServerBaseline(**common)
        return baseline
    server: object = APIServerConfig(
        **common, base_url=base_url, api_key=api_key, health_check=health_check
    )
    return [server]


def _baseline_fields(config: object) -> dict[str, Any]:
    dumped = cast("Any", config).model_dump()
    return {name: dumped[name] for name in ServerBaseline.model_fields if name in dumped}


def cli_servers(servers: object) -> object:
    """``servers`` as Atropos's command line should see them: a bare ``ServerBaseline`` becomes
    one ``APIServerConfig`` with its settings (so ``--openai.*`` flags merge into it); anything
    else is returned as it is."""
    if isinstance(servers, ServerBaseline) and not isinstance(servers, APIServerConfig):
        converted: object = APIServerConfig(**_baseline_fields(servers))
        return converted
    return servers


def normalize_servers(servers: object) -> object:
    """The servers ``ServerManager`` should get for ``servers`` (see the module doc)."""
    single = servers
    if isinstance(servers, list) and len(servers) == 1:
        single = servers[0]
    if not isinstance(single, APIServerConfig):
        return servers
    if not single.base_url:
        baseline: object = ServerBaseline(**_baseline_fields(single))
        return baseline
    listed = servers if isinstance(servers, list) else [servers]
    return [_with_key(server) for server in listed]


NO_KEY = "EMPTY"
"""The API key sent to a server given none and no ``OPENAI_API_KEY`` (the ``openai`` client
Atropos makes refuses to start with an empty key; a vLLM or SGLang server without
``--api-key`` takes any)."""


def _with_key(server: object) -> object:
    """``server`` with ``OPENAI_API_KEY``, else ``NO_KEY``, as its API key when it has none."""
    if not isinstance(server, APIServerConfig) or server.api_key:
        return server
    key = os.environ.get("OPENAI_API_KEY") or NO_KEY
    keyed: object = server.model_copy(update={"api_key": key})
    return keyed


@contextmanager
def _config_init_for_cli(env_cls: type[Any]) -> Iterator[None]:
    own = env_cls.__dict__.get("config_init")
    original = env_cls.config_init

    def config_init(cls: type[Any]) -> tuple[object, object]:
        config, servers = original()
        # Atropos's serve and process name the env after the class only in a flag it then
        # drops, so serve sent run-api no name and was refused (422 on desired_name).
        name = getattr(env_cls, "name", None)
        if getattr(config, "wandb_name", "") is None and name:
            config = cast("Any", config).model_copy(update={"wandb_name": name})
        return config, cli_servers(servers)

    env_cls.config_init = classmethod(config_init)
    try:
        yield
    finally:
        if own is None:
            del env_cls.config_init
        else:
            env_cls.config_init = own


_NEGATIVE_NUMBER = re.compile(r"-(?:\d|\.\d|inf|nan)", re.IGNORECASE)


def inline_negative_values(argv: Sequence[str]) -> list[str]:
    """``argv`` with every ``--flag -3`` written ``--flag=-3``.

    Atropos reads the flags it merges into the config from ``sys.argv`` itself, and takes a
    value that starts with ``-`` for a flag without one: ``--env.max_turns -3`` became
    ``max_turns=True``, that is 1, without a word, where ``--env.max_turns=-3`` is refused
    naming the field. Only a value that reads as a negative number is joined to its flag.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        value = argv[i + 1] if i + 1 < len(argv) else None
        flag = arg.startswith("--") and arg != "--" and "=" not in arg
        if flag and value is not None and _NEGATIVE_NUMBER.match(value):
            out.append(f"{arg}={value}")
            i += 2
        else:
            out.append(arg)
            i += 1
    return out


def cli_command(env_cls: type[Any], build: Callable[[], type]) -> type:
    """Atropos's command class from ``build`` (a ``get_cli_*_config_cls``), with the env's
    ``--openai.*`` flags honoured, seed-named ``--env.*`` flags translated (see the module
    doc and ``seed_settings.translate_seed_flags``) and negative values kept
    (``inline_negative_values``).

    Raises:
        ConfigError: a seed flag's value that trajcore cannot honour. (Building the returned
            class from the flags raises ``ConfigError`` too, see ``_flag_errors``.)
    """
    config, _ = env_cls.config_init()
    translated = translate_seed_flags(sys.argv[1:], known=type(config).model_fields)
    sys.argv[1:] = inline_negative_values(translated)
    with _config_init_for_cli(env_cls):
        return _flag_errors(build())


def _flag_errors(command: type) -> type:
    """``command`` (one of Atropos's pydantic command classes), built from the parsed flags
    with a value of the wrong type (``--env.group_size two``) refused as a ``ConfigError`` at
    the flag (``env.group_size``), not as pydantic's ``ValidationError``: Atropos builds it
    before any check of the env's config runs, and lets the error out with its traceback."""
    base: Any = command

    def init(self: Any, **flags: Any) -> None:
        try:
            base.__init__(self, **flags)
        except ValidationError as error:
            problems = [
                (".".join(map(str, e["loc"])) or "config", e["msg"])
                for e in error.errors(include_url=False)
            ]
            raise ConfigError(
                problems[0][0],
                problems[0][1],
                problems=tuple(f"{reason} @ {flag}" for flag, reason in problems),
            ) from None

    namespace = {"__init__": init, "__module__": base.__module__, "__doc__": base.__doc__}
    return type(base.__name__, (base,), namespace)


# --------------------------------------------------------------------------- endpoint probe


@attrs.frozen(kw_only=True)
class EndpointProbe:
    """One try of one model endpoint.

    Attributes:
        url: The endpoint's base URL (for messages).
        expected: What a model server answers there, in words.
        send: Sends the tiny request; raises what the adapter raises.
        close: Closes the adapter.
    """

    url: str
    expected: str
    send: Callable[[], Awaitable[object]]
    close: Callable[[], Awaitable[None]]


def _server_config_fields(config: object) -> tuple[str, str, str, str | None]:
    cfg = cast("Any", config)
    key = getattr(cfg, "api_key", None)
    return (
        str(getattr(cfg, "base_url", "") or ""),
        str(getattr(cfg, "model_name", "default")),
        str(getattr(cfg, "server_type", "openai")),
        str(key) if key else None,
    )


_TOKEN_PATHS = {"openai": "/completions", "vllm": "/generate", "sglang": "/generate"}


def model_probes(
    manager: object, *, mode: Literal["openai", "managed"], prompt_ids: Sequence[int]
) -> list[EndpointProbe]:
    """One probe per server of an atroposlib ``ServerManager`` that has a base URL."""
    retry = RetryRules(max_attempts=1, attempt_timeout_s=PROBE_TIMEOUT_S)
    probes: list[EndpointProbe] = []
    for server in cast("Any", manager).servers:
        config = getattr(server, "config", None)
        url, model, server_type, api_key = _server_config_fields(config)
        if not url:
            continue
        if mode == "openai":
            chat = OpenAIChatServer(base_url=url, model=model, api_key=api_key, retry=retry)

            async def send_chat(chat: OpenAIChatServer = chat) -> object:
                return await send_probe(chat)

            expected = (
                f"POST {url.rstrip('/')}/chat/completions answering 200 with an OpenAI chat "
                f"completion for model {model!r}"
            )
            probes.append(
                EndpointProbe(url=url, expected=expected, send=send_chat, close=chat.aclose)
            )
            continue
        try:
            token = token_server_from_config(config, retry=retry)
        except ConfigError as exc:
            raise ConfigError("openai.server_type", f"{url}: {exc.reason}") from None

        async def send_tokens(token: Any = token) -> object:
            result: object = await token.generate(list(prompt_ids), sampling=PROBE_SAMPLING)
            return result

        path = _TOKEN_PATHS.get(server_type, "")
        expected = (
            f"the {server_type} token endpoint ({path}) answering 200 with sampled token ids "
            "and logprobs"
        )
        probes.append(
            EndpointProbe(url=url, expected=expected, send=send_tokens, close=token.aclose)
        )
    return probes


def _what_came_back(exc: BaseException) -> tuple[str, bool]:
    """What an endpoint answered, in words, and whether trying again may help."""
    if isinstance(exc, ModelServerRejected):
        return f"HTTP {exc.status}: {exc.body[:300]!r}", False
    if isinstance(exc, ModelServerError):
        status = f"HTTP {exc.status}: " if exc.status is not None else ""
        return f"{status}{exc}", True
    if isinstance(exc, TrajcoreError):  # WireError: an answer that is not a model's
        return f"{type(exc).__name__}: {exc}", False
    return f"{type(exc).__name__}: {exc}", True


async def wait_for_model(probes: Sequence[EndpointProbe], *, wait_s: float) -> None:
    """Return once one of ``probes`` answers as expected (see the module doc).

    Raises:
        ModelEndpointUnavailable: an endpoint answered the wrong thing (at once), or none
            answered before ``wait_s`` passed; the message names each URL, what came back and
            what was expected.
    """
    if not probes:
        return
    started = anyio.current_time()
    last: dict[str, str] = {}
    fatal: dict[str, str] = {}
    logged_at = -1e9
    try:
        while True:
            for probe in probes:
                if probe.url in fatal:
                    continue
                try:
                    with anyio.fail_after(PROBE_TIMEOUT_S):
                        await probe.send()
                except TimeoutError:
                    last[probe.url] = f"no answer within {PROBE_TIMEOUT_S:g} s"
                except Exception as exc:  # noqa: BLE001 - every failure is reported
                    what, again = _what_came_back(exc)
                    last[probe.url] = what
                    if not again:
                        fatal[probe.url] = what
                else:
                    log.info("model endpoint %s answers", probe.url)
                    return
            now = anyio.current_time()
            lines = [
                f"{p.url}: {last[p.url]} (expected {p.expected})" for p in probes if p.url in last
            ]
            if len(fatal) == len(probes):
                raise ModelEndpointUnavailable(
                    "the model endpoint answers, but not as a model server: "
                    + "; ".join(lines)
                    + ". Check --openai.base_url (it usually ends in /v1), --openai.server_type "
                    "and --openai.model_name"
                )
            if now - started >= wait_s:
                raise ModelEndpointUnavailable(
                    f"no model endpoint answered within model_wait_s={wait_s:g} s: "
                    + "; ".join(lines)
                    + ". Start the server or point --openai.base_url at one"
                )
            if now - logged_at >= 10.0:
                logged_at = now
                left = max(0.0, wait_s - (now - started))
                log.warning(
                    "waiting for the model endpoint (giving up in %.0f s, model_wait_s): %s",
                    left,
                    "; ".join(lines),
                )
            await anyio.sleep(RETRY_EVERY_S)
    finally:
        with anyio.CancelScope(shield=True):
            for probe in probes:
                await probe.close()


def check_wandb(use_wandb: bool, environ: dict[str, str] | None = None) -> None:
    """Raise when wandb is on and this machine holds no credentials for it at all, before the
    run starts (Atropos's ``process`` and ``evaluate`` turn ``use_wandb`` on, and wandb refuses
    only after the model has answered).

    Conservative: any place wandb reads a key from that exists (``WANDB_API_KEY``,
    ``WANDB_IDENTITY_TOKEN_FILE``, a netrc file, wandb's settings file) lets the run start, and
    wandb itself decides; only a machine with none of them is refused.

    Raises:
        ConfigError: at ``use_wandb``, naming the ways out.
    """
    env = dict(os.environ) if environ is None else environ
    off = env.get("WANDB_MODE", "").lower() in ("disabled", "offline", "dryrun")
    if not use_wandb or off or env.get("WANDB_DISABLED", "").lower() in ("true", "1"):
        return
    if env.get("WANDB_API_KEY") or env.get("WANDB_IDENTITY_TOKEN_FILE"):
        return
    home = env.get("HOME") or os.path.expanduser("~")
    config = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    wandb_dir = env.get("WANDB_CONFIG_DIR") or os.path.join(config, "wandb")
    settings = os.path.join(wandb_dir, "settings")
    places = [env.get("NETRC", ""), os.path.join(home, ".netrc"), os.path.join(home, "_netrc")]
    if any(place and os.path.exists(place) for place in (*places, settings)):
        return  # a key may be there: wandb says whether it is
    raise ConfigError(
        "use_wandb",
        "wandb is on (Atropos's process and evaluate turn it on whatever config_init sets) and "
        f"this machine has no credentials for it (no WANDB_API_KEY, no {places[1]}, no "
        f"{settings}): pass --env.use_wandb false, set WANDB_MODE=disabled or offline, or run "
        "`wandb login`",
    )


@contextmanager
def errors_in_one_line(program: str) -> Iterator[None]:
    """Around the env's command line, the errors that end a run for a reason the user must act
    on are said in one line on stderr, their traceback logged at DEBUG only: a ``ConfigError``
    (a setting that cannot work), ``PROGRAM: REASON @ FIELD``, exit status 2, as ``trajcore
    run`` and argparse do; an ``InfrastructureError`` that ends the run (no model endpoint, no
    sandbox) or ``GroupsFailing`` (``max_failed_groups`` in a row), ``PROGRAM: TYPE: REASON``,
    exit status 1, as ``trajcore demo`` does. Any other error keeps its traceback."""
    log = logging.getLogger("trajcore.env")
    try:
        yield
    except ConfigError as error:
        log.debug("the setting refused", exc_info=True)
        print(f"{program}: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except (InfrastructureError, GroupsFailing) as error:
        log.debug("the run ended", exc_info=True)
        print(f"{program}: {type(error).__name__}: {error}", file=sys.stderr)
        raise SystemExit(1) from None


def _names_a_folder(name: str) -> bool:
    """Whether ``name`` reads as a path (absolute, ``./``, ``../``, ``~``), never a model name."""
    return name.startswith(("/", "./", "../", "~")) or name in (".", "..")


@contextmanager
def tokenizer_errors(name: str, servers: object) -> Iterator[None]:
    """Around Atropos's ``__init__``, which loads the tokenizers: an ``OSError`` loading one is
    raised as ``tokenizer_unavailable``'s ``ConfigError`` (any other as it was)."""
    try:
        yield
    except OSError as error:
        raise tokenizer_unavailable(name, error, servers) or error from error


def tokenizer_unavailable(name: str, error: OSError, servers: object = None) -> ConfigError | None:
    """The ``ConfigError`` for Atropos's failed load of a tokenizer (transformers raises
    ``OSError`` with a page of advice), or ``None`` when ``error`` was not raised loading one:
    at ``tokenizer_name`` for the env's ``name``, or at ``openai.tokenizer_name`` when a vLLM or
    SGLang server of ``servers`` (the ``--openai.*`` configs) loaded its own, which is its
    ``tokenizer_name``, else its ``model_name``. Offline (``HF_HUB_OFFLINE``), a model name loads
    only from the local cache, so the message says so and names the tokenizer trajcore ships."""
    frames = traceback.extract_tb(error.__traceback__)
    if not any("/transformers/" in f.filename or "/huggingface_hub/" in f.filename for f in frames):
        return None
    offline = any(
        os.environ.get(flag, "").lower() not in ("", "0", "false")
        for flag in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    where = "offline, a model name loads only from the local cache; " if offline else ""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    shipped = f"such as the Qwen3 tokenizer trajcore ships: {qwen3_tokenizer_path()}"
    if any("/server_handling/" in f.filename for f in frames):
        items = servers if isinstance(servers, list | tuple) else [servers]
        loaded = [
            c.model_name if str(c.tokenizer_name) == "none" else c.tokenizer_name
            for c in items
            if isinstance(c, APIServerConfig) and c.server_type != "openai"
        ]
        which = repr(loaded[0]) if len(set(loaded)) == 1 else "the model server's tokenizer"
        return ConfigError(
            "openai.tokenizer_name",
            f"{which} could not be loaded ({first}): Atropos's {_servers_kind(items)} server "
            f"loads the tokenizer --openai.tokenizer_name names, else --openai.model_name's; "
            f"{where}set --openai.tokenizer_name to a local tokenizer folder or a model name, "
            f"{shipped}",
        )
    if _names_a_folder(name) and not os.path.isdir(name):  # not a model name: say so plainly
        return ConfigError(
            "tokenizer_name",
            f"{name!r}: no such folder; set tokenizer_name to a local tokenizer folder or a "
            f"model name, {shipped}",
        )
    return ConfigError(
        "tokenizer_name",
        f"{name!r} could not be loaded ({first}): {where}set tokenizer_name to a local "
        f"tokenizer folder or a model name, {shipped}",
    )


def _servers_kind(items: Sequence[object]) -> str:
    """The token server types among ``items`` (``vllm``, ``sglang``), for a message."""
    kinds = {str(getattr(c, "server_type", "")) for c in items} - {"openai", ""}
    return "/".join(sorted(kinds)) or "token"
