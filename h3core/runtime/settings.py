"""The service's settings: defaults, then a TOML file, then `H3_*` environment, then flags.

Every setting is declared once, as a field of `Settings`: its default, its bounds, its description.
From the field come its environment variable (`H3_` + its name in capitals) and its flag on
`serve` (h3core/cli/flags.py: the description is the flag's help), all but the `NoFlag` secrets;
`H3_CONFIG` (or `--config`) names an optional TOML file with the same names as keys. A description
says in brackets what an unset setting (a default of None or empty) means; a flag's help shows any
other default from the field itself.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import re
import socket
import tomllib
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, TomlConfigSettingsSource

from h3core.adapters.s3 import parse_s3_url
from h3core.adapters.store.location import is_postgres_url
from h3core.adapters.uploads import DEFAULT_MAX_PIXELS
from h3core.domain.capabilities import MODES
from h3core.domain.checkpoints import CheckpointPolicy
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


def _s3_url(value: str) -> str:
    parse_s3_url(value)  # raises ValueError naming what is wrong
    return value


def _not_a_url(value: Path) -> Path:
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:(/|$)", str(value)):  # a URL (a Path keeps one slash of `//`)
        raise ValueError(f"{str(value)!r} is neither a folder nor an s3://bucket/prefix URL")
    return value


S3Url = Annotated[str, AfterValidator(_s3_url)]
Folder = Annotated[Path, AfterValidator(_not_a_url)]


class NoFlag:
    """Marks a setting that no command has a flag for (`Annotated[..., NoFlag]`): a secret, which on a
    command line would show in `ps` to every user of the machine; its variable or the file sets it."""


class SettingsError(ValueError):
    """A setting that cannot work, with the setting named."""


def _split(value: Any) -> Any:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


class _TomlFile(TomlConfigSettingsSource):
    """pydantic-settings' TOML source on the file H3_CONFIG names, made strict: the stock source
    skips a file that is not there and passes an unknown key on as an "extra"; a named file that
    cannot be read, or a key that is no setting, stops the process here, naming the file."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        self.named = os.environ.get("H3_CONFIG") or None  # read per Settings(): `--config` sets it first
        self.names = set(settings_cls.model_fields)  # the base sets settings_cls only after reading the file
        if self.named is not None and not Path(self.named).expanduser().is_file():
            self._read_file(Path(self.named))  # raises SettingsError with the OS's reason (missing, a folder)
        super().__init__(settings_cls, toml_file=self.named)

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        try:
            data = super()._read_file(file_path)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"H3_CONFIG={self.named}: {exc}") from exc
        # Exact names: the stock source would also take `SLOTS` for `slots` (case-insensitive).
        unknown = set(data) - self.names
        if unknown:
            raise SettingsError(f"H3_CONFIG={self.named}: unknown setting(s) {sorted(unknown)}")
        return data


# An entry of H3_API_TOKENS may name its token, `name:token`; what the token's holder does is kept
# in the job's log under that name (an unnamed token is `token-<n>`, its place in the list).
_TOKEN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,32}")


def token_secret(entry: str) -> tuple[str | None, str]:
    """An H3_API_TOKENS entry's name (None where it has none) and its token."""
    name, sep, secret = entry.partition(":")
    if sep and _TOKEN_NAME.fullmatch(name) and secret:
        return name, secret
    return None, entry


class Settings(BaseSettings):
    """One h3core process's settings, for every command: defaults, then the TOML file H3_CONFIG
    names, then `H3_*` variables, then what the command line gives (see the module)."""

    model_config = SettingsConfigDict(env_prefix="H3_", extra="forbid", frozen=True)

    role: Role = Field(
        default="all", description="all: HTTP and runner in one process; api: HTTP only; runner: jobs only (no HTTP)."
    )
    tail_interval: float = Field(
        default=0.05, gt=0, le=10, description="api role: seconds between looks for events the runner process stored."
    )
    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8100, ge=0, le=65535, description="Port.")
    # Several runner and API nodes share one store on PostgreSQL.
    db: Annotated[PostgresUrl | Path, Field(union_mode="left_to_right")] = Field(
        default=Path("h3core.db"), description="The store: a SQLite file or a postgresql:// URL."
    )
    artifacts: Annotated[S3Url | Folder, Field(union_mode="left_to_right")] = Field(
        default=Path("artifacts"),
        description="Videos and checkpoints: a folder, or an s3://bucket/prefix URL (AWS_* variables: endpoint, keys).",
    )
    staging: Path = Field(
        default=Path("staging"),
        description="With s3:// artifacts or uploads: this node's folder for videos being written, uploads fetched.",
    )
    artifact_serving: Literal["proxy", "redirect"] = Field(
        default="proxy",
        description="With s3:// artifacts: send videos through the service (proxy) or redirect to a presigned URL.",
    )
    artifact_url_ttl: int = Field(
        default=300, ge=10, le=604800, description="Seconds a presigned video URL stays valid (redirect serving)."
    )
    uploads: Annotated[S3Url | Folder, Field(union_mode="left_to_right")] = Field(
        default=Path("uploads"),
        description="Keyframes and references: a folder, or an s3://bucket/prefix URL (AWS_* variables: endpoint, keys).",
    )
    executor: ExecutorName = Field(default="pipeline", description="pipeline, comfyui or fake.")
    api_tokens: Annotated[list[str], NoDecode, NoFlag] = Field(
        default=[],
        description="Bearer tokens, comma-separated, each at least 16 characters, each optionally named `name:token` "
        "(the name is what the job logs record of who acted) [none].",
    )
    openai_models: Annotated[list[str], NoDecode] = Field(
        default=["minimax-h3"],
        min_length=1,
        description="Model names /v1/videos answers to, comma-separated; the first is reported.",
    )
    fake_step_seconds: float = Field(default=0.5, ge=0, description="The fake executor's time per step.")
    fake_window_seconds: float | None = Field(
        default=None,
        gt=0,
        le=60,
        description="The fake executor's clip window: its longest call in seconds (longer videos are made as "
        "segments, as a model's); unset: any length in one call.",
    )
    stall_timeout: float = Field(default=600.0, gt=0, description="Seconds without progress before a job is stalled.")
    poll_interval: float = Field(
        default=0.5, gt=0, le=60, description="Seconds between a runner's looks for work other processes stored."
    )
    attempt_deadline: float | None = Field(
        default=None, gt=0, description="Seconds an attempt may run before it fails `deadline` [unset]."
    )
    max_video_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="The longest video made as segments past the model's window, in seconds (executors that continue segments).",
    )
    queue_timeout: float | None = Field(
        default=None, gt=0, description="Seconds a job may wait unstarted after admission, then fails 'deadline' [no limit]."
    )
    cancel_grace: float = Field(default=30.0, ge=0, description="Seconds an executor gets to stop a cancelled or stalled job.")
    # Executors that keep denoising checkpoints (the pipeline, its groups, the fake); both 0: none.
    checkpoint_every_steps: int = Field(
        default=5, ge=0, description="Store a denoising checkpoint after every this many steps (0: not by steps)."
    )
    checkpoint_every_s: float = Field(
        default=120.0, ge=0, description="Store a denoising checkpoint after this many seconds of denoising (0: not by time)."
    )
    slots: int = Field(default=1, ge=1, le=256, description="Jobs run at once.")
    max_attempts: int = Field(default=2, ge=1, le=100, description="Retry policy: attempts per job.")
    retry_on: Annotated[list[str], NoDecode] = Field(
        default=list(DEFAULT_RETRY_ON), description="Retry policy: failure kinds retried."
    )
    capacity_profile: str | None = Field(
        default=None,
        description="Capacity profile (a TOML file or a built-in name) applied whatever the hardware "
        "[the built-in one that describes the executor, if any].",
    )
    model_dir: Path | None = Field(
        default=None,
        description="MiniMax-H3 weights, diffusers layout (pipeline) [a tiny random model beside the store].",
    )
    device: str = Field(default="cpu", description="Torch device of the pipeline.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="float32, bfloat16 or float16 (pipeline)."
    )
    attention: Literal["auto", "cudnn", "flash", "efficient", "sage-fp16", "sage-fp8", "sage-triton", "math"] = Field(
        default="auto",
        description="auto (measured at start), cudnn, flash, efficient, sage-fp16, sage-fp8 (both unverified on a GPU), "
        "sage-triton or math (pipeline).",
    )
    attention_math_max_tokens: int = Field(default=4096, ge=0, description="Longest sequence the MATH kernel may take.")
    attention_tolerance: float = Field(
        default=0.05, gt=0, le=1, description="Relative L1 error an attention kernel may show at start."
    )
    prompt_cache: int = Field(default=32, ge=0, description="Prompt embeddings the pipeline keeps.")
    text_encoder_device: str | None = Field(
        default=None, description="Where the text encoder lives, e.g. cpu beside a GPU transformer [with the transformer]."
    )
    vae_device: str | None = Field(default=None, description="Where both VAEs live [with the transformer].")
    devices: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Run the pipeline on this many devices as groups of Ray actors [unset: in-process].",
    )
    group_size: str = Field(default="1", description="Ranks per group, or the sizes in order (2,1,1); each group is one slot.")
    parallel: Literal["fsdp+ulysses", "fsdp", "ulysses"] = Field(
        default="fsdp+ulysses", description="fsdp+ulysses, fsdp or ulysses within a group."
    )
    group_budgets: Annotated[dict[int, int], NoDecode] = Field(
        default={}, description="Tokens a group of each size fits, measured (1=40000,2=90000) [unlimited]."
    )
    group_timeout: float = Field(default=120.0, gt=0, description="Seconds any collective may wait for a partner rank.")
    watchdog_interval: float = Field(default=10.0, gt=0, description="Seconds between pings of idle groups.")
    rank_threads: int | None = Field(default=None, ge=1, description="Torch threads per rank on a CPU [torch's default].")
    ray_address: str | None = Field(default=None, description="An existing Ray cluster [unset: a local Ray on loopback].")
    comfyui_url: str | None = Field(default=None, description="ComfyUI server (comfyui executor).")
    comfyui_topology: Literal["single-gpu", "raylight"] = Field(default="single-gpu", description="single-gpu or raylight.")
    comfyui_templates: Path | None = Field(default=None, description="A folder of extra workflow templates.")
    comfyui_template: Annotated[dict[str, str], NoDecode] = Field(
        default={},
        description="The template per mode, by name: t2va=core-nodes-t2va,fl2va=... [minimax-h3-MODE-TOPOLOGY].",
    )
    comfyui_concurrency: int = Field(
        default=1, ge=1, le=256, description="Prompts ComfyUI runs at once; jobs beyond it wait queued in h3core."
    )
    comfyui_on_stop: Literal["detach", "interrupt"] = Field(
        default="detach", description="On SIGTERM: detach (prompts run on; the next start re-attaches) or interrupt."
    )
    comfyui_log: Path | None = Field(default=None, description="ComfyUI's log file (Raylight progress).")
    comfyui_lost_after: float = Field(
        default=15.0, gt=0, description="Seconds a prompt may be in neither ComfyUI's queue nor history."
    )
    comfyui_unreachable_after: float = Field(
        default=300.0, gt=0, description="Seconds ComfyUI may not answer before its jobs fail."
    )
    comfyui_stop_wait: float = Field(
        default=600.0, gt=0, description="Seconds a stopped ComfyUI prompt is followed, at most, before its stop is unconfirmed."
    )
    # Without tokens, a Host header not named here is refused (it stops DNS rebinding).
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default=[], description="Host names answered besides loopback ones, comma-separated (* for any) [none]."
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default=[], description="Origins whose pages may call the API (scheme://host:port), comma-separated [none]."
    )
    metrics_port: int | None = Field(
        default=None, ge=1, le=65535, description="Serve /metrics on this port instead of the API's [unset]."
    )
    metrics_host: str = Field(default="127.0.0.1", description="Address of the /metrics listener.")
    max_body_bytes: int = Field(default=1 << 20, ge=1024, description="Largest JSON request body, in bytes.")
    max_upload_bytes: int = Field(
        default=500 << 20, ge=1024, description="Largest upload in bytes (each kind has a lower bound of its own)."
    )
    # A request must arrive at a pace: its headers within header_timeout, its body within
    # body_timeout of them, each extended by a second per min_request_rate bytes (service/deadlines.py).
    header_timeout: float = Field(default=20.0, gt=0, description="Seconds a request's line and headers may take to arrive.")
    body_timeout: float = Field(default=20.0, gt=0, description="Seconds a request's body may take after its headers.")
    min_request_rate: float = Field(
        default=500.0, gt=0, description="Bytes per second of a request that earn it one more second."
    )
    keep_alive_timeout: float = Field(
        default=5.0, gt=0, description="Idle seconds a connection is kept between requests, and before its first."
    )
    # Requests, not connections (the name predates issue 38): one that has sent nothing is no request.
    max_connections: int = Field(default=512, ge=1, description="Requests handled at once; requests beyond get 503.")
    max_open_connections: int = Field(
        default=4096, ge=1, description="Connections held open at once, idle ones included; past it the idlest is closed."
    )
    max_upload_pixels: int = Field(
        default=DEFAULT_MAX_PIXELS, ge=1, description="Largest image upload, width x height in pixels."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="debug, info, warning or error.")
    log_format: Literal["text", "json"] = Field(default="text", description="Log records as text or JSON lines (json).")
    store_retry: float = Field(
        default=30.0, gt=0, description="Seconds a failing store is retried before the process exits non-zero."
    )
    # A restarted node keeps its id (the host name), so it takes its own attempts back at once.
    node: str | None = Field(
        default=None, min_length=1, max_length=200, description="PostgreSQL store: this runner node's id [the host name]."
    )
    lease: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        description="PostgreSQL store: seconds without a heartbeat before others take a node's jobs over.",
    )
    webhook_turn_lease: float = Field(
        default=5.0,
        ge=0.5,
        le=300,
        description="PostgreSQL store: seconds the node delivering webhooks keeps its turn without renewing it "
        "(renewed every third of it); past it another node delivers.",
    )
    deletion_sweep: float = Field(
        default=2.0,
        gt=0,
        le=3600,
        description="Seconds between looks for videos deleted (through any node) whose files this node holds: it removes them.",
    )
    ready_cache: float = Field(
        default=0.25,
        ge=0.05,
        le=60,
        description="Seconds between the background looks /readyz answers from (the store writable, the runner "
        "process or nodes alive).",
    )
    ready_stale: float = Field(
        default=5.0,
        gt=0,
        le=600,
        description="Seconds without a look at the store coming back (it hangs) before /readyz answers not ready; "
        "more than H3_READY_CACHE.",
    )
    # Unset, POST /v1/jobs refuses a `webhook` and no endpoint is sent to.
    webhook_secret: Annotated[SecretStr | None, NoFlag] = Field(
        default=None,
        description="Signs webhooks (Standard Webhooks): whsec_ then the base64 of at least 16 random bytes; "
        "two, comma-separated, while one is rotated out [unset].",
    )
    webhook_endpoints: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="Endpoints sent every job's events, comma-separated: jobs=URL, jobs:start+progress=URL, openai=URL; "
        "openai@ENV_NAME=URL: signed with the secret in ENV_NAME [none].",
    )
    webhooks_allow: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="Hosts and CIDR ranges webhooks may reach although private or loopback, comma-separated [none].",
    )

    @field_validator("ready_stale")
    @classmethod
    def _stale_past_a_look(cls, value: float, info: ValidationInfo) -> float:
        interval = info.data.get("ready_cache")
        if interval is not None and value <= interval:
            raise ValueError(f"must be more than H3_READY_CACHE ({interval:g} s): a look is due every that many seconds")
        return value

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
        short = [t for t in tokens if len(token_secret(t)[1]) < 16]
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
            deletion_sweep_s=self.deletion_sweep,
            checkpoints=CheckpointPolicy(every_steps=self.checkpoint_every_steps, every_s=self.checkpoint_every_s),
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
