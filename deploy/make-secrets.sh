#!/usr/bin/env bash
# Creates the compose stack's two secrets once: a random PostgreSQL password and the gpulens database URL that
# carries it. docker-compose.yml reads them as the secrets `postgres-password` and `gpulens-db-url`.
#
#   deploy/make-secrets.sh [DIR]        DIR defaults to deploy/secrets, next to this script
#
# The directory is private to its owner (0700); the files in it are 0644 because compose (outside swarm) bind-mounts
# them as they are, and the postgres and gpulens users in the containers must read them.
set -euo pipefail

dir=${1:-"$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)/secrets"}
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
# 24 random bytes as hex: no character needs escaping in a URL.
password=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
umask 0022
printf '%s\n' "$password" >"$password_file"
printf 'postgresql+psycopg://gpulens:%s@postgres:5432/gpulens\n' "$password" >"$url_file"
echo "make-secrets: wrote $password_file and $url_file" >&2
