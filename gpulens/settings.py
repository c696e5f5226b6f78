"""The gpulens TOML configuration file (``gpulens.toml``): its typed schema, validation and environment overrides.

The input structs below are the single source of truth: the file is decoded into them by the typed reader
(:mod:`gpulens.typedinput`: unknown keys, wrong types and bad values are errors naming the file, the key and the
line), and ``docs/configuration.md`` is generated from them and their ``Meta`` help
(``python -m gpulens.configdoc > docs/configuration.md``), so the reference cannot drift from the code. The
validated file then becomes :class:`Settings`, the frozen value the rest of the code reads.

Secrets never live in the file itself unless the operator insists: the database URL can come from
``GPULENS_DB_URL`` or ``url_file``, and a target's password from ``password_file`` or ``password_env``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec

from gpulens.config import ConfigError, TomlLocator
from gpulens.netaddr import parse_listen
from gpulens.typedinput import (
    Duration,
    FieldError,
    InputStruct,
    convert,
    input_error,
    parse_toml,
)


def doc(meaning: str, *, env: str | None = None, kind: str | None = None, **constraints: Any) -> msgspec.Meta:
    """A key's reference entry: its help, the environment variable that overrides it, the type shown in the docs
    when it is not the Python type's (``shard``, ``listen``), and msgspec constraints (``ge=1``)."""
    extra = {name: value for name, value in (("env", env), ("kind", kind)) if value is not None}
    return msgspec.Meta(description=meaning, extra=extra, **constraints)


# --- the schema: one struct per table -------------------------------------------------------------------------------

TargetKind = Literal["gpulens", "dcgm"]
_SHARD = re.compile(r"^(\d+)/(\d+)$")


def parse_shard(text: str) -> tuple[int, int]:
    m = _SHARD.match(text.strip())
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
        raise ValueError(f"expected I/N with 0 <= I < N, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def default_timeout_s(interval_s: float) -> float:
    """The scrape timeout when none is given: room before the next tick to store the round (as Prometheus requires
    ``scrape_timeout`` <= ``scrape_interval``, with a margin)."""
    return min(10.0, 0.8 * interval_s)


class CollectorFile(InputStruct, frozen=True):
    """The scrape loop."""

    interval: Annotated[Duration, doc("Time between scrape rounds.")] = Duration(10.0)
    timeout: Annotated[
        Duration | None,
        doc(
            "Per-target scrape timeout; at most the interval. Default: `min(10s, 0.8 x interval)`, which leaves "
            "each round time to store before the next tick."
        ),
    ] = None
    max_response_bytes: Annotated[int, doc("Largest response accepted per target.", ge=1024)] = 16 * 1024 * 1024
    concurrency: Annotated[int, doc("Targets scraped at the same time.", ge=1)] = 64
    listen: Annotated[
        str, doc("Where the collector serves its own /metrics; `0.0.0.0:9411`: every interface.", kind="listen")
    ] = "127.0.0.1:9411"
    web_config: Annotated[
        str | None,
        doc("A web config file (the exporter's `--web-config` format): TLS and basic auth for that /metrics."),
    ] = None
    shard: Annotated[str, doc("`I/N`: scrape only the targets whose name hashes to I of N.", kind="shard")] = "0/1"
    spool_dir: Annotated[str, doc("Where rounds wait while the database is unreachable.")] = "gpulens-spool"
    spool_max_bytes: Annotated[int, doc("Spool size limit; the oldest rounds go first.", ge=1024)] = 1024**3
    future_tolerance: Annotated[Duration, doc("Readings stamped further in the future are rejected.")] = Duration(300.0)

    def __post_init__(self) -> None:
        for key, minimum in (("interval", 0.1), ("timeout", 0.01)):
            value = getattr(self, key)
            if value is not None and value < minimum:
                raise FieldError(key, f"must be at least {minimum:g}, got {value:g}")
        if self.timeout is not None and self.timeout > self.interval:
            raise FieldError(
                "timeout",
                f"{self.timeout:g}s is longer than the interval ({self.interval:g}s): a round would overrun the next "
                "tick (leave it out for min(10s, 0.8 x interval))",
            )
        try:
            parse_listen(self.listen)
        except ValueError as exc:
            raise FieldError("listen", str(exc)) from None
        try:
            parse_shard(self.shard)
        except ValueError as exc:
            raise FieldError("shard", str(exc)) from None


class RetentionFile(InputStruct, frozen=True):
    """How long each resolution is kept."""

    raw: Annotated[Duration, doc("Raw readings (one row per GPU per scrape).")] = Duration(7 * 86400.0)
    minute: Annotated[Duration, doc("1-minute min/mean/max rollups.")] = Duration(90 * 86400.0)
    hour: Annotated[Duration, doc("1-hour min/mean/max rollups.")] = Duration(730 * 86400.0)


class AccountingFile(InputStruct, frozen=True):
    """What a job's summary (`gpulens job-summary`) prices it at, once it has ended."""

    price_per_gpu_hour: Annotated[float, doc("Cost of one GPU held for one hour.", ge=0)] = 0.0
    price_per_kwh: Annotated[float, doc("Cost of one kWh of GPU energy.", ge=0)] = 0.0
    currency: Annotated[str, doc("The currency the prices are in, shown beside the cost.")] = "USD"
    carbon_gco2e_per_kwh: Annotated[float, doc("Grid carbon intensity, grams CO2e per kWh.", ge=0)] = 0.0
    idle_utilization: Annotated[
        float, doc("A GPU sample below this utilization counts as idle in the job's idle share.", ge=0, le=1)
    ] = 0.05


class AuthFile(InputStruct, frozen=True):
    """The credentials and TLS trust of a scrape (shared by ``[[targets]]`` and ``[[file_sd]]``)."""

    username: Annotated[str | None, doc("Basic-auth user name.")] = None
    password_file: Annotated[str | None, doc("File holding the basic-auth password (first line).")] = None
    password_env: Annotated[str | None, doc("Environment variable holding the basic-auth password.")] = None
    ca_file: Annotated[str | None, doc("CA bundle to verify the target's TLS certificate.")] = None
    insecure_skip_verify: Annotated[bool, doc("Do not verify the target's TLS certificate (testing only).")] = False

    def check_auth(self, line_key: str | None = None) -> None:
        if self.password_file and self.password_env:
            raise FieldError("password_env", "give password_file or password_env, not both", line_key=line_key)
        if (self.password_file or self.password_env) and not self.username:
            raise FieldError("username", "a password needs a username", line_key=line_key)

    def auth(self) -> TlsAuth:
        return TlsAuth(
            username=self.username or None,
            password_file=self.password_file or None,
            password_env=self.password_env or None,
            ca_file=self.ca_file or None,
            insecure_skip_verify=self.insecure_skip_verify,
        )


class DatabaseFile(AuthFile, frozen=True):
    """Where the history is stored. The credential keys apply to a Prometheus URL only (docs/prometheus.md)."""

    url: Annotated[
        str,
        doc(
            "SQLAlchemy URL: `sqlite:///path.db` (embedded) or `postgresql+psycopg://user@host/db`; or, read-only, "
            "a Prometheus-compatible query API: `prometheus+http://host:9090[/path]` or `prometheus+https://...`.",
            env="GPULENS_DB_URL",
        ),
    ] = "sqlite:///gpulens.db"
    url_file: Annotated[str | None, doc("File holding the URL (keeps the password out of the config).")] = None
    bearer_token_file: Annotated[str | None, doc("Prometheus: file holding a bearer token (first line).")] = None
    bearer_token_env: Annotated[str | None, doc("Prometheus: environment variable holding a bearer token.")] = None
    tenant: Annotated[str | None, doc("Prometheus: tenant sent as `X-Scope-OrgID` (Mimir, Cortex, Thanos).")] = None
    max_series: Annotated[int, doc("Prometheus: most series one query may return.", ge=1)] = 100_000
    min_step: Annotated[Duration, doc("Prometheus: the shortest step of a range query (its scrape interval).")] = (
        Duration(15.0)
    )
    state_url: Annotated[
        str, doc("With a Prometheus URL: the small writable store of alert states, outbox and silences.")
    ] = "sqlite:///gpulens-alerts.db"

    def __post_init__(self) -> None:
        self.check_auth()
        if self.bearer_token_file and self.bearer_token_env:
            raise FieldError("bearer_token_env", "give bearer_token_file or bearer_token_env, not both")


class TargetFile(AuthFile, frozen=True, kw_only=True):
    """Static scrape targets, one table each."""

    url: Annotated[str, doc("Base URL of a gpulens exporter, or the /metrics URL of a dcgm-exporter.")]
    name: Annotated[str | None, doc("Target name (default: the URL); used for sharding and health.")] = None
    kind: Annotated[TargetKind, doc("What answers at the URL.")] = "gpulens"
    node: Annotated[str | None, doc("Node name for a dcgm-exporter page without a hostname label.")] = None

    def __post_init__(self) -> None:
        if not re.match(r"^https?://[^/\s]+", self.url):
            raise FieldError("url", f"expected an http:// or https:// URL, got {self.url!r}")
        self.check_auth(line_key="url")


class FileSdFile(AuthFile, frozen=True, kw_only=True):
    """Prometheus file-based service discovery: JSON or YAML files of `{targets: [...], labels: {...}}`,
    re-read when they change. A target is `host:port` (scheme `http`, or `__scheme__` in labels) or a URL."""

    files: Annotated[tuple[str, ...], doc("Files or glob patterns.")]
    kind: Annotated[TargetKind, doc("What answers at the targets.")] = "gpulens"

    def __post_init__(self) -> None:
        if not self.files or not all(self.files):
            raise FieldError("files", "expected a non-empty list of strings")
        self.check_auth()


DELEGATED_HELP: Final = "alert rules, receivers and routes: see docs/alerts.md (validated by the alerts package)"


class SettingsFile(InputStruct, frozen=True):
    """A whole ``gpulens.toml``; ``[alerts]`` is kept as parsed and validated by the alerts package."""

    database: DatabaseFile = msgspec.field(default_factory=DatabaseFile)
    collector: CollectorFile = msgspec.field(default_factory=CollectorFile)
    retention: RetentionFile = msgspec.field(default_factory=RetentionFile)
    accounting: AccountingFile = msgspec.field(default_factory=AccountingFile)
    targets: tuple[TargetFile, ...] = ()
    file_sd: tuple[FileSdFile, ...] = ()
    alerts: Annotated[dict[str, Any], doc(DELEGATED_HELP, kind="delegated")] = msgspec.field(default_factory=dict)


# --- typed settings -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsAuth:
    username: str | None = None
    password_file: str | None = None
    password_env: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False

    def password(self) -> str | None:
        """The password, read now (files and variables may be rotated). Raises ConfigError when unreadable."""
        if self.password_file:
            try:
                return Path(self.password_file).read_text(encoding="utf-8").splitlines()[0].strip()
            except (OSError, IndexError, UnicodeDecodeError) as exc:
                raise ConfigError(f"cannot read password_file {self.password_file}: {exc}") from None
        if self.password_env:
            value = os.environ.get(self.password_env)
            if value is None:
                raise ConfigError(f"environment variable {self.password_env} (password_env) is not set")
            return value
        return None


@dataclass(frozen=True)
class StoreAuth:
    """How gpulens authenticates to a Prometheus-compatible store: basic auth, or a bearer token, and TLS trust."""

    tls: TlsAuth = field(default_factory=TlsAuth)
    bearer_token_file: str | None = None
    bearer_token_env: str | None = None
    tenant: str | None = None
    max_series: int = 100_000
    min_step_s: float = 15.0

    def bearer_token(self) -> str | None:
        """The token, read now. Raises ConfigError when unreadable."""
        if self.bearer_token_file:
            try:
                return Path(self.bearer_token_file).read_text(encoding="utf-8").splitlines()[0].strip()
            except (OSError, IndexError) as exc:
                raise ConfigError(f"cannot read bearer_token_file {self.bearer_token_file}: {exc}") from None
        if self.bearer_token_env:
            value = os.environ.get(self.bearer_token_env)
            if value is None:
                raise ConfigError(f"environment variable {self.bearer_token_env} (bearer_token_env) is not set")
            return value
        return None


@dataclass(frozen=True)
class TargetSettings:
    url: str
    name: str
    kind: str = "gpulens"
    node: str | None = None
    auth: TlsAuth = field(default_factory=TlsAuth)


@dataclass(frozen=True)
class FileSdSettings:
    files: tuple[str, ...]
    kind: str = "gpulens"
    auth: TlsAuth = field(default_factory=TlsAuth)


@dataclass(frozen=True)
class Prices:
    """``[accounting]``: what a GPU-hour and a kWh cost, and the grid's carbon intensity."""

    per_gpu_hour: float = 0.0
    per_kwh: float = 0.0
    currency: str = "USD"
    carbon_gco2e_per_kwh: float = 0.0
    idle_utilization: float = 0.05


@dataclass(frozen=True)
class Settings:
    source: str | None  # the file it came from
    db_url: str
    interval_s: float
    timeout_s: float
    max_response_bytes: int
    concurrency: int
    listen: str
    shard: tuple[int, int]
    spool_dir: str
    spool_max_bytes: int
    future_tolerance_s: float
    retention_raw_s: float
    retention_minute_s: float
    retention_hour_s: float
    targets: tuple[TargetSettings, ...] = ()
    file_sd: tuple[FileSdSettings, ...] = ()
    prices: Prices = field(default_factory=Prices)
    store_auth: StoreAuth = field(default_factory=StoreAuth)  # for a Prometheus db_url
    state_url: str = "sqlite:///gpulens-alerts.db"  # alert state beside a read-only (Prometheus) store
    web_config: str | None = None  # TLS and basic auth of the collector's /metrics (gpulens.webconfig)
    raw: Mapping[str, Any] = field(default_factory=dict)  # the file's tables as parsed (``alerts`` among them)
    text: str = ""  # the file's text, for the line numbers of errors found by delegated validators

    @property
    def locator(self) -> TomlLocator:
        return TomlLocator(self.text)


# --- loading --------------------------------------------------------------------------------------------------------


def parse_settings(text: str, source: str = "<config>", environ: Mapping[str, str] | None = None) -> Settings:
    """Validate config text. Raises ``ConfigError`` naming the file, the key and the line."""
    env = os.environ if environ is None else environ
    data = parse_toml(text, source)
    file = convert(data, SettingsFile, text=text, source=source)

    targets: list[TargetSettings] = []
    for i, t in enumerate(file.targets):
        url = t.url.rstrip("/")
        name = t.name or url
        if any(other.name == name for other in targets):
            raise input_error(
                f"duplicate target name {name!r}", ["targets", i, "name"], text=text, source=source,
                line_parts=["targets", i],
            )  # fmt: skip
        targets.append(TargetSettings(url=url, name=name, kind=t.kind, node=t.node, auth=t.auth()))
    file_sd = tuple(FileSdSettings(files=f.files, kind=f.kind, auth=f.auth()) for f in file.file_sd)

    db = file.database
    db_url = env.get("GPULENS_DB_URL") or None
    if db_url is None and db.url_file:
        try:
            db_url = Path(db.url_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise input_error(
                f"cannot read: {exc.strerror}", ["database", "url_file"], text=text, source=source
            ) from None
        except UnicodeDecodeError:
            raise input_error(
                "cannot read: not UTF-8 text", ["database", "url_file"], text=text, source=source
            ) from None
    col, ret = file.collector, file.retention
    return Settings(
        source=source,
        db_url=db_url or db.url,
        interval_s=float(col.interval),
        timeout_s=float(col.timeout) if col.timeout is not None else default_timeout_s(float(col.interval)),
        max_response_bytes=col.max_response_bytes,
        concurrency=col.concurrency,
        listen=col.listen,
        web_config=col.web_config,
        shard=parse_shard(col.shard),
        spool_dir=col.spool_dir,
        spool_max_bytes=col.spool_max_bytes,
        future_tolerance_s=float(col.future_tolerance),
        retention_raw_s=float(ret.raw),
        retention_minute_s=float(ret.minute),
        retention_hour_s=float(ret.hour),
        targets=tuple(targets),
        file_sd=file_sd,
        prices=Prices(
            per_gpu_hour=file.accounting.price_per_gpu_hour,
            per_kwh=file.accounting.price_per_kwh,
            currency=file.accounting.currency,
            carbon_gco2e_per_kwh=file.accounting.carbon_gco2e_per_kwh,
            idle_utilization=file.accounting.idle_utilization,
        ),
        store_auth=StoreAuth(
            tls=db.auth(),
            bearer_token_file=db.bearer_token_file,
            bearer_token_env=db.bearer_token_env,
            tenant=db.tenant,
            max_series=db.max_series,
            min_step_s=float(db.min_step),
        ),
        state_url=db.state_url,
        raw=data,
        text=text,
    )


def load_settings(path: str | Path, environ: Mapping[str, str] | None = None) -> Settings:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the config file: {exc.strerror or exc}", file=path) from None
    except UnicodeDecodeError:
        raise ConfigError("cannot read the config file: not UTF-8 text (expected a TOML file)", file=path) from None
    return parse_settings(text, str(path), environ)


def default_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of an empty config file (command-line quick starts)."""
    return parse_settings("", "<defaults>", environ)
