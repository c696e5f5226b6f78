#!/usr/bin/env bash
# Creates secrets once, and keeps them on later runs.
#
#   deploy/make-secrets.sh [DIR]          the compose stack's two: a random PostgreSQL password and the gpulens
#                                         database URL that carries it (docker-compose.yml reads them as the secrets
#                                         `postgres-password` and `gpulens-db-url`). DIR defaults to deploy/secrets.
#   deploy/make-secrets.sh --web [DIR]    TLS and basic auth for the exporters' and the collector's /metrics, in
#                                         DIR/web: a self-signed tls.key and tls.crt (this host's name and
#                                         localhost), a random password for the user `collector` (collector-password)
#                                         and web.yml, which names them with the password's bcrypt hash. Give it to
#                                         `gpulens exporter --web-config DIR/web/web.yml` (docs/security.md). The
#                                         hash needs Python with bcrypt: PYTHON=/opt/gpulens/bin/python, say.
#
# The directory is private to its owner (0700); the files in it are 0644 because compose (outside swarm) bind-mounts
# them as they are, and the postgres and gpulens users in the containers must read them; the TLS key and the
# password are 0640.
set -euo pipefail

web=0
if [[ ${1:-} == --web ]]; then
  web=1
  shift
fi
dir=${1:-"$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)/secrets"}

# 24 random bytes as hex: no character needs escaping in a URL or a YAML file.
random_hex() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }

if [[ $web == 1 ]]; then
  out="$dir/web"
  if [[ -e $out/web.yml ]]; then
    echo "make-secrets: $out already holds web.yml; keeping it" >&2
    exit 0
  fi
  python=${PYTHON:-python3}
  if ! "$python" -c 'import bcrypt' 2>/dev/null; then
    echo "make-secrets: $python cannot import bcrypt; run with PYTHON=/path/to/gpulens/venv/bin/python" >&2
    exit 1
  fi
  mkdir -p -- "$out"
  chmod 0700 -- "$dir" "$out"
  host=$(hostname -f 2>/dev/null || hostname)
  umask 0027
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 825 -subj "/CN=$host" \
    -addext "subjectAltName=DNS:$host,DNS:localhost,IP:127.0.0.1" -keyout "$out/tls.key" -out "$out/tls.crt" 2>/dev/null
  password=$(random_hex)
  printf '%s\n' "$password" >"$out/collector-password"
  hash=$(printf '%s' "$password" | "$python" -c \
    'import bcrypt, sys; print(bcrypt.hashpw(sys.stdin.buffer.read(), bcrypt.gensalt(10)).decode())')
  chmod 0644 "$out/tls.crt"
  printf 'tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\nbasic_auth_users:\n  collector: %s\n' \
    "$hash" >"$out/web.yml"
  echo "make-secrets: wrote $out/{tls.key,tls.crt,collector-password,web.yml}" >&2
  exit 0
fi

password_file="$dir/postgres-password"
url_file="$dir/gpulens-db-url"

if [[ -e $password_file && -e $url_file ]]; then
  echo "make-secrets: $dir already holds both secrets; keeping them" >&2
  exit 0
fi
if [[ -e $password_file || -e $url_file ]]; then
  echo "make-secrets: $dir holds only one of postgres-password and gpulens-db-url; remove it and run again" >&2
  exit 1
fi

mkdir -p -- "$dir"
chmod 0700 -- "$dir"
password=$(random_hex)
umask 0022
printf '%s\n' "$password" >"$password_file"
printf 'postgresql+psycopg://gpulens:%s@postgres:5432/gpulens\n' "$password" >"$url_file"
echo "make-secrets: wrote $password_file and $url_file" >&2
