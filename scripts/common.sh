# Shared by scripts/demo and scripts/test. Sourced, not run.
# Every install step the project needs lives here, so a fresh machine gets the same as this one.

set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

# A build cache outside the clone keeps warm runs fast; a fresh machine simply starts it empty.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/outpost/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export PATH="$HOME/.cargo/bin:$PATH"

log() { printf '==> %s\n' "$*" >&2; }

# MariaDB and PostgreSQL are started by the machine; start them again if they are down.
ensure_databases() {
  if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    log "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
  fi
  if ! mysqladmin --protocol=tcp -h 127.0.0.1 -u root ping >/dev/null 2>&1; then
    log "starting MariaDB"
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  fi
  for _ in $(seq 1 60); do
    if pg_isready -q -h 127.0.0.1 -p 5432 && mysqladmin --protocol=tcp -h 127.0.0.1 -u root ping >/dev/null 2>&1; then
      return 0
    fi
    sleep 1
  done
  log "MariaDB or PostgreSQL did not come up on 127.0.0.1"
  return 1
}

ensure_nextest() {
  if ! command -v cargo-nextest >/dev/null 2>&1; then
    log "installing cargo-nextest"
    cargo install cargo-nextest --locked
  fi
}

# Tansu, a Kafka-protocol broker from crates.io; the tests start one per test on SQLite storage.
TANSU_VERSION=0.6.0
ensure_tansu() {
  if command -v tansu >/dev/null 2>&1 && tansu --version 2>/dev/null | grep -q "$TANSU_VERSION"; then
    return 0
  fi
  log "installing tansu $TANSU_VERSION (about 17 minutes on a fresh machine; once per machine)"
  cargo install tansu --version "$TANSU_VERSION" --locked --features dynostore,libsql
}

# Tests make databases named outpost_t_<uuid>; remove any a previous run left behind.
drop_test_databases() {
  local db
  for db in $(mysql --protocol=tcp -h 127.0.0.1 -u root -N -e "SHOW DATABASES LIKE 'outpost\\_t\\_%'" 2>/dev/null); do
    mysql --protocol=tcp -h 127.0.0.1 -u root -e "DROP DATABASE \`$db\`" || true
  done
  for db in $(psql -h 127.0.0.1 -U postgres -d postgres -Atc "SELECT datname FROM pg_database WHERE datname LIKE 'outpost\\_t\\_%'" 2>/dev/null); do
    psql -h 127.0.0.1 -U postgres -d postgres -qc "DROP DATABASE \"$db\" WITH (FORCE)" || true
  done
}
