"""``--web-config FILE``: TLS and basic auth in the Prometheus exporter-toolkit format, for every gpulens HTTP server
that Prometheus scrapes (the exporter's endpoints, the collector's own /metrics).

```yaml
tls_server_config:
  cert_file: /etc/gpulens/tls.crt
  key_file: /etc/gpulens/tls.key
  client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
  client_ca_file: /etc/gpulens/ca.crt
  min_version: TLS12                              # optional: TLS10 | TLS11 | TLS12 | TLS13
basic_auth_users:
  prometheus: $2y$10$...                          # bcrypt hashes, e.g. from `htpasswd -nBC 10 "" | tr -d ':\\n'`
```
Relative file paths are resolved against the config file's directory, as the exporter-toolkit does.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from gpulens.config import ConfigError
from gpulens.typedinput import FieldError, InputStruct, decode_yaml, input_error, read_text
from gpulens.webauth import BasicAuth

ClientAuth = Literal[
    "NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"
]
TlsVersion = Literal["TLS10", "TLS11", "TLS12", "TLS13"]
_CLIENT_AUTH: Final[dict[str, ssl.VerifyMode]] = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_VERSIONS: Final = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_FILES: Final = ("cert_file", "key_file", "client_ca_file")


@dataclass(frozen=True)
class TlsConfig:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"

    def context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _TLS_VERSIONS[self.min_version]
        ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        ctx.verify_mode = _CLIENT_AUTH[self.client_auth_type]
        if self.client_ca_file is not None:
            ctx.load_verify_locations(str(self.client_ca_file))
        return ctx


CHALLENGE: Final = {"WWW-Authenticate": 'Basic realm="gpulens"'}  # the headers of a 401 answer


@dataclass(frozen=True)
class WebConfig:
    tls: TlsConfig | None = None
    basic_auth: BasicAuth | None = None


class TlsServerFile(InputStruct, frozen=True):
    """``tls_server_config`` as written; the files are checked against the disk by :func:`load_web_config`."""

    cert_file: str | None = None
    key_file: str | None = None
    client_auth_type: ClientAuth = "NoClientCert"
    client_ca_file: str | None = None
    min_version: TlsVersion = "TLS12"

    def __post_init__(self) -> None:
        for key in _FILES:
            if getattr(self, key) == "":
                raise FieldError(key, "expected a file path")
        for key in ("cert_file", "key_file"):
            if getattr(self, key) is None:
                raise FieldError(key, "is required when tls_server_config is set")
        if (
            self.client_auth_type in ("RequireAndVerifyClientCert", "VerifyClientCertIfGiven")
            and not self.client_ca_file
        ):
            raise FieldError("client_auth_type", f"client_ca_file is required with {self.client_auth_type}")


class WebConfigFile(InputStruct, frozen=True):
    """A whole web-config file (``http_server_config`` is accepted and ignored, as before)."""

    tls_server_config: TlsServerFile | None = None
    basic_auth_users: dict[str, Any] | None = None  # values checked without ever being echoed
    http_server_config: dict[str, Any] | None = None


def load_web_config(path: str | Path) -> WebConfig:
    """Read and validate a web config file; every error names the file, the key and the line."""
    path = Path(path)
    try:
        text = read_text(path)
    except ConfigError as exc:
        raise ConfigError(f"cannot read web config: {exc.message.removeprefix('cannot read: ')}", file=path) from None
    file = decode_yaml(text, WebConfigFile, str(path))

    def fail(message: str, *keys: str) -> ConfigError:
        return input_error(message, keys, text=text, source=str(path), kind="yaml")

    tls = _tls(file.tls_server_config, path.parent, fail) if file.tls_server_config is not None else None
    auth = _basic_auth(file.basic_auth_users, fail) if file.basic_auth_users is not None else None
    return WebConfig(tls=tls, basic_auth=auth)


def _tls(section: TlsServerFile, base: Path, fail: Any) -> TlsConfig:
    files: dict[str, Path] = {}
    for key in _FILES:
        value = getattr(section, key)
        if value is None:
            continue
        resolved = (base / value) if not os.path.isabs(value) else Path(value)
        if not resolved.is_file():
            raise fail(f"no such file: {resolved}", "tls_server_config", key)
        files[key] = resolved
    config = TlsConfig(
        cert_file=files["cert_file"],
        key_file=files["key_file"],
        client_auth_type=section.client_auth_type,
        client_ca_file=files.get("client_ca_file"),
        min_version=section.min_version,
    )
    try:
        config.context()
    except (ssl.SSLError, OSError) as exc:
        raise fail(f"cannot load the certificate or key: {exc}", "tls_server_config", "cert_file") from None
    return config


def _basic_auth(section: dict[str, Any], fail: Any) -> BasicAuth:
    if not section:
        raise fail("expected a mapping of user names to bcrypt hashes", "basic_auth_users")
    users: dict[str, bytes] = {}
    for user, hashed in section.items():
        if not user or ":" in user:
            raise fail("user names must be non-empty strings without ':'", "basic_auth_users", user)
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            # Never echo the value: it may be a plaintext password pasted by mistake.
            raise fail("expected a bcrypt hash ($2a$/$2b$/$2y$...)", "basic_auth_users", user)
        users[user] = hashed.encode()
    return BasicAuth(users)
