"""``--web-config FILE``: TLS and basic auth in the Prometheus exporter-toolkit format.

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
from typing import Any, Final

import yaml

from gpulens.config import ConfigError
from gpulens.webauth import BasicAuth

_TLS_KEYS: Final = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version"}
_TOP_KEYS: Final = {"tls_server_config", "basic_auth_users", "http_server_config"}
_CLIENT_AUTH: Final = {
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


@dataclass(frozen=True)
class WebConfig:
    tls: TlsConfig | None = None
    basic_auth: BasicAuth | None = None


def _line_of(root: yaml.Node | None, *path: str) -> int | None:
    node = root
    line = None
    for key in path:
        if not isinstance(node, yaml.MappingNode):
            return line
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                line = k.start_mark.line + 1
                node = v
                break
        else:
            return line
    return line


def load_web_config(path: str | Path) -> WebConfig:
    """Read and validate a web config file; every error names the file, the key and the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read web config: {exc.strerror or exc}", file=path) from None
    except UnicodeDecodeError:
        raise ConfigError("cannot read web config: not UTF-8 text (expected a YAML file)", file=path) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(f"invalid YAML: {getattr(exc, 'problem', exc)}", file=path, line=line) from None
    if data is None:
        return WebConfig()

    def fail(message: str, *keys: str) -> ConfigError:
        return ConfigError(message, file=path, key=".".join(keys), line=_line_of(root, *keys))

    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", file=path, line=1)
    for key in data:
        if key not in _TOP_KEYS:
            raise fail(f"unknown key (expected one of {', '.join(sorted(_TOP_KEYS))})", str(key))
    base = path.parent
    tls = _tls(data.get("tls_server_config"), base, fail)
    auth = _basic_auth(data.get("basic_auth_users"), fail)
    return WebConfig(tls=tls, basic_auth=auth)


def _tls(section: Any, base: Path, fail: Any) -> TlsConfig | None:
    if section is None:
        return None
    if not isinstance(section, dict):
        raise fail("expected a mapping", "tls_server_config")
    for key in section:
        if key not in _TLS_KEYS:
            raise fail("unknown key", "tls_server_config", str(key))
    files: dict[str, Path] = {}
    for key in ("cert_file", "key_file", "client_ca_file"):
        value = section.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise fail("expected a file path", "tls_server_config", key)
        resolved = (base / value) if not os.path.isabs(value) else Path(value)
        if not resolved.is_file():
            raise fail(f"no such file: {resolved}", "tls_server_config", key)
        files[key] = resolved
    for key in ("cert_file", "key_file"):
        if key not in files:
            raise fail("is required when tls_server_config is set", "tls_server_config", key)
    client_auth = section.get("client_auth_type", "NoClientCert")
    if client_auth not in _CLIENT_AUTH:
        raise fail(f"expected one of {', '.join(_CLIENT_AUTH)}", "tls_server_config", "client_auth_type")
    if client_auth in ("RequireAndVerifyClientCert", "VerifyClientCertIfGiven") and "client_ca_file" not in files:
        raise fail(f"client_ca_file is required with {client_auth}", "tls_server_config", "client_auth_type")
    min_version = section.get("min_version", "TLS12")
    if min_version not in _TLS_VERSIONS:
        raise fail(f"expected one of {', '.join(_TLS_VERSIONS)}", "tls_server_config", "min_version")
    config = TlsConfig(
        cert_file=files["cert_file"],
        key_file=files["key_file"],
        client_auth_type=client_auth,
        client_ca_file=files.get("client_ca_file"),
        min_version=min_version,
    )
    try:
        config.context()
    except (ssl.SSLError, OSError) as exc:
        raise fail(f"cannot load the certificate or key: {exc}", "tls_server_config", "cert_file") from None
    return config


def _basic_auth(section: Any, fail: Any) -> BasicAuth | None:
    if section is None:
        return None
    if not isinstance(section, dict) or not section:
        raise fail("expected a mapping of user names to bcrypt hashes", "basic_auth_users")
    users: dict[str, bytes] = {}
    for user, hashed in section.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise fail("user names must be non-empty strings without ':'", "basic_auth_users", str(user))
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            # Never echo the value: it may be a plaintext password pasted by mistake.
            raise fail("expected a bcrypt hash ($2a$/$2b$/$2y$...)", "basic_auth_users", user)
        users[user] = hashed.encode()
    return BasicAuth(users)
