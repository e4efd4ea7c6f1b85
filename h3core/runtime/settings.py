"""The service's settings: defaults, then a TOML file, then `H3_*` environment, then flags.

Every setting has an environment variable (`H3_` + its name in capitals) and a `serve` flag;
`H3_CONFIG` (or `--config`) names an optional TOML file with the same names as keys.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import socket
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from h3core.adapters.store.location import is_postgres_url
from h3core.adapters.uploads import DEFAULT_MAX_PIXELS
from h3core.domain.capabilities import MODES
from h3core.domain.failures import unknown_kinds
from h3core.domain.retry import DEFAULT_RETRY_ON, RetryPolicy
from h3core.domain.topology import Topology
from h3core.domain.webhooks import Endpoint, parse_endpoint
from h3core.runtime.config import RunnerConfig

ExecutorName = Literal["fake", "comfyui", "pipeline"]
# all: HTTP and the runner in one process. api: HTTP only, following the store for what a runner
# process writes. runner: the runner only (no HTTP), for an api process on the same store.
Role = Literal["all", "api", "runner"]


def _postgres_url(value: str) -> str:
    if not is_postgres_url(value):
        raise ValueError("not a postgresql:// URL")
    return value


PostgresUrl = Annotated[str, AfterValidator(_postgres_url)]


class SettingsError(ValueError):
    """A setting that cannot work, with the setting named."""


def _split(value: Any) -> Any:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


class _TomlFile(PydanticBaseSettingsSource):
    """Values from the TOML file named by H3_CONFIG, below the environment in priority."""

    def get_field_value(self, field, field_name):  # pragma: no cover - __call__ does the work
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get("H3_CONFIG")
        if not path:
            return {}
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"H3_CONFIG={path}: {exc}") from exc
        unknown = set(data) - set(self.settings_cls.model_fields)
        if unknown:
            raise SettingsError(f"H3_CONFIG={path}: unknown setting(s) {sorted(unknown)}")
        return data


class Settings(BaseSettings):
    """One h3core process's settings, for every command: defaults, then the TOML file H3_CONFIG
    names, then `H3_*` variables, then what the command line gives (see the module)."""

    model_config = SettingsConfigDict(env_prefix="H3_", extra="forbid", frozen=True)

    role: Role = "all"
    tail_interval: float = Field(default=0.05, gt=0, le=10)  # api role: how often it looks for new events
    host: str = "127.0.0.1"
    port: int = Field(default=8100, ge=0, le=65535)
    # A SQLite file, or a postgresql:// URL (several runner and API nodes on one store).
    db: Annotated[PostgresUrl | Path, Field(union_mode="left_to_right")] = Path("h3core.db")
    artifacts: Path = Path("artifacts")
    uploads: Path = Path("uploads")
    executor: ExecutorName = "pipeline"
    api_tokens: Annotated[list[str], NoDecode] = []
    # Model names the OpenAI-compatible Videos API answers to; video objects report the first.
    openai_models: Annotated[list[str], NoDecode] = Field(default=["minimax-h3"], min_length=1)
    fake_step_seconds: float = Field(default=0.5, ge=0)
    stall_timeout: float = Field(default=600.0, gt=0)
    poll_interval: float = Field(default=0.5, gt=0, le=60)  # how often a runner looks for work others stored
    attempt_deadline: float | None = Field(default=None, gt=0)
    queue_timeout: float | None = Field(default=None, gt=0)  # a job not started this long after admission fails `deadline`
    cancel_grace: float = Field(default=30.0, ge=0)
    slots: int = Field(default=1, ge=1, le=256)
    max_attempts: int = Field(default=2, ge=1, le=100)
    retry_on: Annotated[list[str], NoDecode] = list(DEFAULT_RETRY_ON)
    capacity_profile: str | None = None  # a TOML file or a built-in profile's name; unset: the built-in one that matches
    model_dir: Path | None = None  # none: the pipeline serves a tiny random model written beside the store
    device: str = "cpu"  # torch device of the pipeline executor ("cpu", "cuda", "cuda:1")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    attention: Literal["auto", "cudnn", "flash", "efficient", "sage-fp16", "sage-fp8", "sage-triton", "math"] = "auto"
    attention_math_max_tokens: int = Field(default=4096, ge=0)  # longest sequence allowed on the MATH kernel
    attention_tolerance: float = Field(default=0.05, gt=0, le=1)  # relative L1 error a kernel may have at start
    prompt_cache: int = Field(default=32, ge=0)  # prompt embeddings kept by the pipeline executor
    text_encoder_device: str | None = None  # where the text encoder lives (unset: with the transformer)
    vae_device: str | None = None  # where both VAEs live (unset: with the transformer)
    # Set: the pipeline runs on groups of Ray actors, one per device (device "cpu" or "cuda").
    devices: int | None = Field(default=None, ge=1, le=1024)
    group_size: str = "1"  # ranks per group: one size ("2") or the sizes in order ("2,1,1")
    parallel: Literal["fsdp+ulysses", "fsdp", "ulysses"] = "fsdp+ulysses"
    group_budgets: Annotated[dict[int, int], NoDecode] = {}  # tokens a group of each size fits: "1=40000,2=90000"
    group_timeout: float = Field(default=120.0, gt=0)  # bound on every collective of a group
    watchdog_interval: float = Field(default=10.0, gt=0)  # seconds between pings of idle groups
    rank_threads: int | None = Field(default=None, ge=1)  # torch threads per rank on a CPU
    ray_address: str | None = None  # an existing Ray cluster; unset: a local Ray on loopback
    comfyui_url: str | None = None
    comfyui_topology: Literal["single-gpu", "raylight"] = "single-gpu"
    comfyui_templates: Path | None = None  # a folder of extra workflow templates (*.json)
    # The template per mode, by name: "t2va=core-nodes-t2va"; a mode not named: minimax-h3-{mode}-{topology}
    comfyui_template: Annotated[dict[str, str], NoDecode] = {}
    comfyui_concurrency: int = Field(default=1, ge=1, le=256)  # prompts ComfyUI runs at once; h3core sends no more
    comfyui_on_stop: Literal["detach", "interrupt"] = "detach"  # a stop of h3core leaves running prompts running, or not
    comfyui_log: Path | None = None  # ComfyUI's log, for Raylight's progress bars
    comfyui_lost_after: float = Field(default=15.0, gt=0)  # prompt in neither queue nor history
    comfyui_unreachable_after: float = Field(default=300.0, gt=0)
    comfyui_stop_wait: float = Field(default=600.0, gt=0)  # a stopped prompt is followed this long at most
    # Host names answered besides loopback ones ("*": any); without tokens the rest are refused.
    allowed_hosts: Annotated[list[str], NoDecode] = []
    # Origins (scheme://host[:port]) whose pages may call the API from a browser; others are refused.
    cors_origins: Annotated[list[str], NoDecode] = []
    metrics_port: int | None = Field(default=None, ge=1, le=65535)  # set: /metrics on its own listener (HTTP roles)
    metrics_host: str = "127.0.0.1"
    max_body_bytes: int = Field(default=1 << 20, ge=1024)  # JSON requests
    max_upload_bytes: int = Field(default=500 << 20, ge=1024)
    # A request must arrive at a pace: its headers within header_timeout, its body within
    # body_timeout of them, each extended by a second per min_request_rate bytes (service/deadlines.py).
    header_timeout: float = Field(default=20.0, gt=0)
    body_timeout: float = Field(default=20.0, gt=0)
    min_request_rate: float = Field(default=500.0, gt=0)  # bytes per second
    keep_alive_timeout: float = Field(default=5.0, gt=0)  # idle seconds between a connection's requests
    max_connections: int = Field(default=512, ge=1)  # beyond it, new requests are answered 503
    max_upload_pixels: int = Field(default=DEFAULT_MAX_PIXELS, ge=1)  # an image's width x height; larger is refused (422)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = "text"
    store_retry: float = Field(default=30.0, gt=0)  # seconds a failing store is retried before the process exits
    # PostgreSQL store: this runner node's id (unset: the host name) and how long its lease on what
    # it runs lasts without a heartbeat before another node takes the attempt over.
    node: str | None = Field(default=None, min_length=1, max_length=200)
    lease: float = Field(default=30.0, ge=1, le=3600)
    # Seconds /readyz reuses its look at the store (and the runner process); 0: it looks on every request.
    ready_cache: float = Field(default=1.0, ge=0, le=60)
    # Signs webhooks (Standard Webhooks, `whsec_...`; two, comma-separated, while rotating one out);
    # unset, POST /v1/jobs refuses a `webhook` and no endpoint is sent to.
    webhook_secret: SecretStr | None = None
    # The deployment's endpoints, sent every job's events: jobs=URL, jobs:start+progress+completed=URL, openai=URL.
    webhook_endpoints: Annotated[list[str], NoDecode] = []
    # Hosts and address ranges (CIDR) webhooks may reach although private, loopback or link-local.
    webhooks_allow: Annotated[list[str], NoDecode] = []

    @field_validator(
        "api_tokens",
        "retry_on",
        "openai_models",
        "allowed_hosts",
        "cors_origins",
        "webhooks_allow",
        "webhook_endpoints",
        mode="before",
    )
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        return _split(value)

    @field_validator("group_budgets", mode="before")
    @classmethod
    def _budgets(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        out = {}
        for part in _split(value):
            size, sep, tokens = part.partition("=")
            if not sep:
                raise ValueError(f"{part!r} is not size=tokens (e.g. 1=40000,2=90000)")
            out[size.strip()] = tokens.strip()
        return out

    @field_validator("comfyui_template", mode="before")
    @classmethod
    def _templates_by_mode(cls, value: Any) -> Any:
        pairs: list[tuple[Any, Any]] | None = list(value.items()) if isinstance(value, dict) else None
        if isinstance(value, str):
            pairs = []
            for part in _split(value):
                mode, sep, name = part.partition("=")
                if not sep or not name.strip():
                    raise ValueError(f"{part!r} is not mode=template (e.g. t2va=core-nodes-t2va)")
                pairs.append((mode.strip(), name.strip()))
        if pairs is None:
            return value
        unknown = [mode for mode, _ in pairs if mode not in MODES]
        if unknown:
            raise ValueError(f"unknown mode(s) {unknown}; known: {list(MODES)}")
        return dict(pairs)

    @field_validator("api_tokens")
    @classmethod
    def _token_length(cls, tokens: list[str]) -> list[str]:
        short = [t for t in tokens if len(t) < 16]
        if short:
            raise ValueError("every API token must be at least 16 characters")
        return tokens

    @field_validator("webhook_secret")
    @classmethod
    def _whsec(cls, secret: SecretStr | None) -> SecretStr | None:
        if secret is None:
            return None
        for value in secret_list(secret):
            try:
                ok = value.startswith("whsec_") and len(base64.b64decode(value.removeprefix("whsec_"), validate=True)) >= 16
            except binascii.Error:
                ok = False
            if not ok:
                raise ValueError(
                    "a webhook secret is 'whsec_' then the base64 of at least 16 random bytes (two: comma-separated)"
                )
        return secret

    @field_validator("webhook_endpoints")
    @classmethod
    def _endpoints(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            parse_endpoint(entry)  # ValueError saying what is wrong with it
        return entries

    def endpoints(self) -> list[Endpoint]:
        """The deployment's webhook endpoints, parsed; SettingsError for one with no secret to sign with."""
        endpoints = [parse_endpoint(entry) for entry in self.webhook_endpoints]
        if any(e.secret_env is None for e in endpoints) and self.webhook_secret is None:
            raise SettingsError(
                "H3_WEBHOOK_ENDPOINTS needs H3_WEBHOOK_SECRET to sign what is sent to them (or @ENV_NAME on each: its own secret)"
            )
        endpoint_secrets(endpoints)  # SettingsError naming a variable that is unset or no secret
        return endpoints

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        for origin in origins:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query or parts.fragment:
                raise ValueError(f"{origin!r} is not an origin: scheme://host[:port], e.g. http://console.lan:3000")
        return origins

    @field_validator("retry_on")
    @classmethod
    def _kinds(cls, kinds: list[str]) -> list[str]:
        if error := unknown_kinds(kinds):
            raise ValueError(error)
        return kinds

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings):
        """Where settings come from, first wins: what the caller gives, the environment, the TOML file."""
        return init_settings, env_settings, _TomlFile(settings_cls)

    def topology(self) -> Topology | None:
        """The device groups (None: the in-process pipeline); raises SettingsError naming the setting."""
        if self.devices is None:
            return None
        try:
            return Topology.parse(self.devices, self.group_size, self.parallel)
        except ValueError as exc:
            raise SettingsError(first_message(exc)) from exc

    def placement(self) -> dict[str, str]:
        """Parts placed apart from the transformer."""
        parts = {"text_encoder": self.text_encoder_device, "vae": self.vae_device}
        return {part: device for part, device in parts.items() if device}

    def runner_slots(self) -> int:
        """One slot per group when the pipeline runs on groups; `slots` otherwise."""
        topology = self.topology() if self.executor == "pipeline" else None
        return self.slots if topology is None else len(topology.group_sizes)

    def runner_config(self) -> RunnerConfig:
        """How this process's runner runs: its slots, timers and the retry policy of new jobs."""
        return RunnerConfig(
            slots=self.runner_slots(),
            stall_timeout_s=self.stall_timeout,
            poll_interval_s=self.poll_interval,
            attempt_deadline_s=self.attempt_deadline,
            queue_timeout_s=self.queue_timeout,
            cancel_grace_s=self.cancel_grace,
            store_retry_s=self.store_retry,
            lease_s=self.lease,
            retry=RetryPolicy(max_attempts=self.max_attempts, retry_on=tuple(self.retry_on)),
        )

    def store_options(self) -> dict[str, Any]:
        """How this process opens its store: on PostgreSQL a process that runs jobs is a node."""
        if not is_postgres_url(self.db) or self.role == "api":
            return {}
        return {"node": self.node_id()}

    def node_id(self) -> str:
        """This process's id among the nodes of a shared store: H3_NODE, else the host's name (so a
        restarted node is the same node, and takes its own attempts back at once)."""
        return self.node or default_node_id()

    def check_exposure(self) -> None:
        """Refuse to listen beyond loopback without tokens (docs/design.md §2.7)."""
        if self.api_tokens or is_loopback(self.host):
            return
        raise SettingsError(
            f"refusing to listen on {self.host} without API tokens: set H3_API_TOKENS (comma-separated), or listen on 127.0.0.1"
        )


def endpoint_secrets(endpoints: list[Endpoint]) -> dict[str, list[str]]:
    """The endpoints' own secrets, by the environment variable each names (`@ENV_NAME`)."""
    found: dict[str, list[str]] = {}
    for endpoint in endpoints:
        name = endpoint.secret_env
        if name is None or name in found:
            continue
        value = os.environ.get(name)
        if not value:
            raise SettingsError(f"{name}, the secret of webhook endpoint {endpoint.url}, is not set")
        try:
            Settings._whsec(SecretStr(value))
        except ValueError as exc:
            raise SettingsError(f"{name}: {exc}") from None
        found[name] = secret_list(SecretStr(value))
    return found


def secret_list(secret: SecretStr) -> list[str]:
    """The webhook secrets in H3_WEBHOOK_SECRET: one, or two while one is rotated out."""
    return [v.strip() for v in secret.get_secret_value().split(",") if v.strip()]


def first_message(exc: ValueError) -> str:
    """A pydantic error's first message, without pydantic's decoration; other errors as they are."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
    return str(exc)


def is_loopback(host: str) -> bool:
    """Whether listening on `host` keeps the service on this machine (`localhost` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that is not 'localhost' may resolve anywhere


def default_node_id() -> str:
    """A runner node's id where none is given (`serve`, `worker`, `Jobs` alike): the host's name."""
    return socket.gethostname()
