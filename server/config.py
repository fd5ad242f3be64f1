"""The rollout server's settings: one pydantic-settings class, from env vars and CLI flags.

Precedence, lowest first: field defaults, a TOML file (``gspo serve --config``,
``ServerSettings.from_toml``), ``GSPO_*`` environment variables (``GSPO_API_KEY``,
``GSPO_REDIS_URL``, ...), keyword arguments (the ``gspo serve`` flags a user actually passed).
Unsafe or inconsistent values fail at construction, before a model is loaded or Redis is
touched: an admin key equal to the API key would let every environment push weights.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gspo_rl.contract.schema import DEFAULT_PREFIX
from gspo_rl.redisq.groups.types import QueueConfig

EngineKind = Literal["hf", "vllm"]
ToolParserName = Literal["hermes", "llama3_json", "mistral", "qwen3_coder", "none"]
ReasoningParserName = Literal["none", "qwen3", "deepseek_r1"]
DType = Literal["auto", "float32", "bfloat16", "float16"]


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine ("localhost", 127.0.0.0/8,
    ::1); 0.0.0.0, "::", "", other addresses and host names do not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _default_server_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class ServerSettings(BaseSettings):
    """Everything one rollout server process needs. Field docstrings are the reference."""

    model_config = SettingsConfigDict(
        env_prefix="GSPO_", env_nested_delimiter="__", extra="forbid",
        use_attribute_docstrings=True, frozen=True,
    )

    # ---------------------------------------------------------------- model and engine
    model: str
    """Path of the Hugging Face model directory to serve (config, tokenizer, safetensors)."""
    engine: EngineKind = "hf"
    """Inference engine: "hf" (plain transformers, no extra install) or "vllm"."""
    served_model_name: str = ""
    """The name clients put in ``model``; empty: the model directory's name."""
    device: str | None = None
    """Torch device for the hf engine ("cpu", "cuda", "cuda:1"); None: the engine's choice."""
    max_batch_size: int = Field(default=64, ge=1)
    """Most sequences the engine decodes together (the engine batches concurrent requests)."""
    dtype: DType = "auto"
    """Weights and activations of the engine: "auto" is bfloat16 on a GPU, float32 on a CPU
    (``resolved_dtype``). The learner trains in float32 either way: see docs/gpus.md on
    ``--old-logprobs recompute`` for serving in bfloat16."""
    max_model_len: int | None = Field(default=None, ge=2)
    """Longest prompt + completion; None: the model's ``max_position_embeddings``."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """vLLM: GPUs one server shards the model over."""
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    """vLLM: share of each GPU's memory for weights + KV cache (None: vLLM's 0.9). Lower it
    when the learner shares the GPU (``gspo up --device cuda``, compose ``gpu1``)."""
    max_lora_rank: int | None = Field(default=None, ge=1, le=512)
    """vLLM: serve LoRA adapter pushes with vLLM's own LoRA support (adapters loaded from
    memory, applied in the forward; rounded up to a rank vLLM accepts). None (default): adapter
    pushes are merged into the weights instead, which costs a host copy of the adapted base
    weights and a reload of them per push (docs/lora.md compares the two). 0 means None."""
    enforce_eager: bool | None = None
    """vLLM: no CUDA graphs (faster start, slower decode). None: eager on CPU only."""
    vllm_args: dict[str, Any] = Field(default_factory=dict)
    """vLLM: any other ``AsyncEngineArgs`` field, as it is (CLI ``--vllm-arg key=value``,
    repeatable; env ``GSPO_VLLM_ARGS='{"key": value}'``)."""

    # ---------------------------------------------------------------- network and auth
    host: str = "127.0.0.1"
    """Interface uvicorn binds to. Any other than loopback (0.0.0.0, a LAN address, a host
    name) needs ``api_key`` (or ``insecure_no_auth``): the server refuses to start without."""
    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port uvicorn listens on (0: any free port)."""
    keep_alive_s: float = Field(default=30.0, gt=0)
    """Idle keep-alive connections are closed after this long. Longer than the clients' own
    pool expiry (httpx, hence the openai client: 5 s), so that a client never sends on a
    connection the server is closing at that moment (a ReadError on the client)."""
    api_key: SecretStr | None = None
    """Bearer token every ``/v1`` route requires (environments hold it). None: open."""
    admin_key: SecretStr | None = None
    """Separate Bearer token for weight-update and admin routes (the learner holds it). None:
    admin routes are open only if ``api_key`` is None too (a local, single-user setup)."""
    insecure_no_auth: bool = False
    """Listen beyond loopback without an API key: anyone who reaches the port may sample,
    post rewards and (without ``admin_key``) replace the weights. Only for a trusted network;
    the server says so at start (WARNING) and in ``/health`` (``warnings``)."""
    advertise_url: str | None = None
    """Base URL the learner uses to reach this server (registered in Redis); None:
    ``http://{host}:{port}`` (the host's name when bound to all interfaces)."""
    server_id: str = Field(default_factory=_default_server_id)
    """This server's id in the Redis server registry (default: hostname-pid)."""
    engine_dead_exit_delay_s: float = Field(default=2.0, ge=0)
    """Once the engine has died, ``/health`` answers 503 ``"dead"`` (and ``/metrics`` can be
    scraped) for this long; then the server stops and exits non-zero, so that its supervisor
    restarts it (``gspo_rl.server.run``)."""

    # ---------------------------------------------------------------- queue (Redis)
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis that stores rollouts and groups (``gspo_rl.contract.schema`` lists the keys)."""
    key_prefix: str = DEFAULT_PREFIX
    """Prefix of every Redis key; servers and the learner of one run must agree on it."""
    queue: QueueConfig = Field(default_factory=QueueConfig)
    """Group lifetimes and finalisation rules, passed to ``RolloutStore`` as they are (env:
    ``GSPO_QUEUE__GROUP_TTL_S=600``; CLI: ``--group-ttl-s``)."""
    sweep_interval_s: float = Field(default=1.0, gt=0)
    """How often the sweeper expires overdue groups and publishes stuck complete ones."""

    # ---------------------------------------------------------------- request limits
    max_n: int = Field(default=64, ge=1)
    """Most samples one request may ask for (``n``); a group is one request's samples."""
    max_tokens: int = Field(default=4096, ge=1)
    """Most tokens one sample may generate; also the default when a request names none
    (then further capped by what the context leaves after the prompt)."""
    max_top_logprobs: int = Field(default=20, ge=0)
    """Most alternatives per token a request may ask for (``top_logprobs``/``logprobs``)."""
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Request bodies larger than this are refused with a 413 before they are parsed."""
    max_ready_groups: int = Field(default=1024, ge=0)
    """Bound on the ready queue (published groups the learner has not yet read): at or over
    it, requests that would start a new group get a 503 until the learner catches up
    (``gspo_rl.server.rollouts.admission``). 0: no bound."""
    admission: bool = True
    """Hold back requests that start a group while as many groups are in flight as the
    learner can train within its staleness bound (``gspo_rl.server.rollouts.admission``): they wait,
    then get a 503 ``too_many_groups_in_flight``. False: admit everything (groups may arrive too
    stale and be dropped by the learner)."""
    admission_wait_s: float = Field(default=30.0, ge=0)
    """Longest time a request is held for admission before its 503 (clients retry after
    ``Retry-After``; the SDK does so by itself)."""
    no_signal_hold_s: float = Field(default=30.0, ge=0)
    """The sampling budget: a group that ends without a learning signal (all rewards equal,
    dropped) still counts as in flight until the learner's next step, at most this long, so
    an environment whose groups all end so is slowed to the learner's pace instead of
    sampling as fast as the server allows (``gspo_rl.redisq.inflight``). 0: such a
    group leaves the count at once."""
    no_signal_drought_s: float = Field(default=180.0, ge=0)
    """The budget's drought: once no group has carried a learning signal for this long while
    groups kept ending without one, every held group counts (none of the places otherwise
    left free for one learner step's groups), so an environment whose groups never carry a
    signal slows to ``bound / no_signal_hold_s`` groups a second; the first group with a
    signal ends it. 0: never (docs/learning-signal.md)."""
    admission_capacity_without_learner: int = Field(default=12, ge=1)
    """Groups in flight admitted while no learner has published its staleness bound and
    groups per step (12 = (2 + 1) x 4, the demo's); once it has, its bound applies."""
    sanitize_control_tokens: bool = True
    """Chat templating encodes special tokens (``<|im_end|>``, ``<|eot_id|>``...) found inside
    message contents and tool definitions as plain text, so a user message cannot forge a
    turn boundary (env ``GSPO_SANITIZE_CONTROL_TOKENS``). Added tokens that are not special
    (Qwen3's ``<think>``) always pass as tokens (``gspo_rl.contract.chat.sanitize``)."""

    tool_call_parser: ToolParserName = "hermes"
    """How tool calls are read from a completion (vLLM's names): hermes (Qwen2.5/Qwen3
    ``<tool_call>`` JSON) | llama3_json | mistral | qwen3_coder | none
    (``gspo_rl.server.rollouts.parsers.tool_calls``). Only the response changes: the trajectory
    keeps the ids."""
    reasoning_parser: ReasoningParserName = "none"
    """How reasoning is split off a completion into ``reasoning_content``: none | qwen3 |
    deepseek_r1 (``gspo_rl.server.rollouts.parsers.reasoning``)."""

    # ---------------------------------------------------------------- multi-turn episodes
    max_episode_turns: int = Field(default=64, ge=1)
    """Most model turns one episode (``POST /v1/groups``) may have; the next gets a 400."""
    episode_history_rewrite: Literal["append", "reject"] = "append"
    """When the chat template renders an episode's earlier messages differently in a later
    turn (e.g. it drops earlier reasoning): "append" keeps the stored trajectory (what the
    model saw and wrote) and appends only the new messages; "reject" answers 409
    (``gspo_rl.server.rollouts.episodes``)."""

    @field_validator("max_lora_rank", mode="before")
    @classmethod
    def _zero_is_unset(cls, value: Any) -> Any:
        """0 or empty (``GSPO_MAX_LORA_RANK=0`` in compose's ``.env``) means unset."""
        if isinstance(value, str):
            value = value.strip()
        return None if value in ("", "0", 0) else value

    @model_validator(mode="after")
    def _check(self) -> ServerSettings:
        if self.admin_key is not None and self.api_key is not None and (
            self.admin_key.get_secret_value() == self.api_key.get_secret_value()
        ):
            raise ValueError("admin_key must differ from api_key: environments would hold "
                             "the key that replaces the model's weights")
        if self.max_n > self.queue.max_group_size:
            raise ValueError(f"max_n ({self.max_n}) is over the queue's max_group_size "
                             f"({self.queue.max_group_size}): such groups could not be stored")
        if self.engine == "hf" and (self.tensor_parallel_size > 1 or self.vllm_args
                                    or self.gpu_memory_utilization is not None
                                    or self.max_lora_rank is not None):
            raise ValueError("tensor_parallel_size, gpu_memory_utilization, max_lora_rank and "
                             "vllm_args are vLLM settings: use --engine vllm (the hf engine "
                             "merges adapters)")
        for name, key in (("api_key", self.api_key), ("admin_key", self.admin_key)):
            if key is not None and not key.get_secret_value().strip():
                raise ValueError(f"{name} is empty: leave it unset to disable it")
        if self.api_key is None and not is_loopback(self.host) and not self.insecure_no_auth:
            raise ValueError(
                f"host {self.host!r} is reachable beyond this machine and no api_key is set: "
                "anyone could sample, post rewards and replace the weights. Set "
                "GSPO_API_KEY and GSPO_ADMIN_KEY, listen on 127.0.0.1, or pass "
                "--insecure-no-auth (GSPO_INSECURE_NO_AUTH=1) on a trusted network")
        return self

    @property
    def security_warnings(self) -> list[str]:
        """What a person must know about this server's exposure (logged at start, in
        ``/health``): empty unless ``insecure_no_auth`` opened it beyond loopback."""
        if self.api_key is not None or is_loopback(self.host):
            return []
        admin = "admin routes need the admin key" if self.admin_key is not None else \
            "admin routes (weight updates) are open too"
        return [f"insecure_no_auth: listening on {self.host}:{self.port} with no API key: "
                f"anyone who reaches it may sample and post rewards; {admin}"]

    @property
    def model_name(self) -> str:
        """The name clients must send in ``model``."""
        return self.served_model_name or Path(self.model.rstrip("/")).name

    def resolved_dtype(self, cuda_available: bool) -> str:
        """``dtype`` with "auto" decided: bfloat16 when the engine runs on a GPU (vLLM on a
        CUDA machine, the hf engine on a CUDA device), float32 on CPUs."""
        if self.dtype != "auto":
            return self.dtype
        if self.engine == "vllm":
            on_gpu = cuda_available
        else:
            on_gpu = self.device.startswith("cuda") if self.device else cuda_available
        return "bfloat16" if on_gpu else "float32"

    @classmethod
    def from_toml(cls, path: str | Path | None = None, **flags: Any) -> ServerSettings:
        """``gspo serve --config``: the settings with the TOML file at ``path`` (field names;
        ``[queue]`` for the queue's) below the ``GSPO_*`` environment and the ``flags``:
        defaults < file < environment < flags. An unknown name in the file is an error, as
        an unknown flag is. Without a path: ``cls(**flags)``."""
        if path is None:
            return cls(**flags)
        if not Path(path).is_file():
            raise ValueError(f"no such config file: {path}")
        from pydantic_settings import PydanticBaseSettingsSource, TomlConfigSettingsSource

        class FromFile(cls):  # type: ignore[valid-type,misc]  # a subclass of cls, a variable
            @classmethod
            def settings_customise_sources(
                cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                env_settings: PydanticBaseSettingsSource,
                dotenv_settings: PydanticBaseSettingsSource,
                file_secret_settings: PydanticBaseSettingsSource,
            ) -> tuple[PydanticBaseSettingsSource, ...]:
                return (init_settings, env_settings,
                        TomlConfigSettingsSource(settings_cls,
                                                 toml_file=Path(cast("str | Path", path))))

        # the plain class again (picklable, its own name), from the merged values
        return cls.model_validate(dict(FromFile(**flags)))
