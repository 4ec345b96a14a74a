# Shared by scripts/demo and scripts/test. Sourced, not run.
# Every install step the project needs lives here, so a fresh machine gets the same as this one.

set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

# A build cache outside the clone keeps warm runs fast; a fresh machine simply starts it empty.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/idempost/target}"
# Failpoint builds (`--all-features`) obey FAILPOINTS and start only with IDEMPOST_ALLOW_FAILPOINTS=1:
# they get a target directory of their own, so no failpoint binary ever lands where scripts/demo,
# scripts/bench or a release build put theirs. Point it elsewhere with IDEMPOST_FAILPOINTS_TARGET_DIR.
export FAILPOINTS_TARGET_DIR="${IDEMPOST_FAILPOINTS_TARGET_DIR:-$CARGO_TARGET_DIR/failpoints}"
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

# The suite runs eight tests at once, each with its own services, relays and pools on the shared
# servers: PostgreSQL's stock 100 connections ran out ("sorry, too many clients already": the
# relay's tests alone reached 99) and failed tests at random, and MariaDB's 151 are as close.
# The test servers get room for that; a deployment sizes its own server for its own services.
TEST_SERVER_CONNECTIONS=400
ensure_database_room() {
  local version have
  version="$(ls /etc/postgresql)"
  have="$(psql -h 127.0.0.1 -U postgres -Atc 'SHOW max_connections')"
  if (( have < TEST_SERVER_CONNECTIONS )); then
    log "PostgreSQL: max_connections $have -> $TEST_SERVER_CONNECTIONS (a restart)"
    printf 'max_connections = %s\n' "$TEST_SERVER_CONNECTIONS" \
      >"/etc/postgresql/$version/main/conf.d/95-idempost-tests.conf"
    pg_ctlcluster --skip-systemctl-redirect "$version" main restart
    ensure_databases
  fi
  # MariaDB takes it at run time; ensure_databases runs before every suite, after any restart.
  mysql --protocol=tcp -h 127.0.0.1 -u root \
    -e "SET GLOBAL max_connections = GREATEST(@@max_connections, $TEST_SERVER_CONNECTIONS)"
}

# Galera (MariaDB's multi-primary cluster): Debian's provider for the installed mariadb-server, and
# rsync for the full state transfers of a node joining. The Galera tests start their own
# three-node cluster on loopback (testkit/src/galera.rs).
ensure_galera() {
  if [[ -e /usr/lib/galera/libgalera_smm.so ]] && command -v rsync >/dev/null 2>&1; then
    return 0
  fi
  log "installing galera-4 and rsync"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq galera-4 rsync >/dev/null
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

# A venv at $1 with the pinned requirements file $2, made again only when that file changes.
ensure_venv() {
  local venv="$1" requirements="$2"
  local stamp="$venv/.requirements.sha256"
  local want
  want="$(sha256sum "$requirements" | cut -d' ' -f1)"
  if [[ ! -x "$venv/bin/python" ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    log "installing $requirements into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --requirement "$requirements"
    printf '%s\n' "$want" >"$stamp"
  fi
}

# The Python clients (clients/python): a venv outside the clone with the pinned requirements,
# reinstalled only when requirements.txt changes, and stubs generated from this clone's proto/
# (under a second, so every run regenerates them and they never lag behind the contracts).
# The tests find the interpreter through IDEMPOST_PYTHON.
PYTHON_VENV="$HOME/.cache/idempost/venv"
ensure_python_clients() {
  ensure_venv "$PYTHON_VENV" "$repo_root/clients/python/requirements.txt"
  "$PYTHON_VENV/bin/python" "$repo_root/clients/python/generate.py"
  export IDEMPOST_PYTHON="$PYTHON_VENV/bin/python"
}

# The TypeScript client (clients/typescript): `npm ci` of its package-lock.json into its own
# node_modules (gitignored), again only when the lockfile changes. Its stubs in src/gen are
# committed (the console builds on them); `check_typescript_client` fails when they are stale.
# The tests find the directory through IDEMPOST_TS_CLIENT.
TS_CLIENT="$repo_root/clients/typescript"
ensure_typescript_client() {
  npm_ci_when_changed "$TS_CLIENT" "the TypeScript client's packages"
  export IDEMPOST_TS_CLIENT="$TS_CLIENT"
}

# `npm ci` in the package directory $1 (what it holds: $2), skipped while its package-lock.json is
# the one installed last (its hash is kept in node_modules).
npm_ci_when_changed() {
  local dir="$1" what="$2"
  local stamp="$dir/node_modules/.package-lock.sha256"
  local want
  want="$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)"
  if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    log "installing $what (npm ci in $dir)"
    (cd "$dir" && npm ci --no-audit --no-fund --silent)
    printf '%s\n' "$want" >"$stamp"
  fi
}

# The operators' console (tools/idempostctl/console): esbuild, the runtime it bundles and
# playwright-core for its browser test. Its bundle (dist/) is committed and embedded in idempostctl,
# so building idempostctl needs none of this; a test fails when the bundle is stale.
ensure_console() {
  npm_ci_when_changed "$repo_root/tools/idempostctl/console" "the console's packages"
}

# Debian's Chromium, which the console's browser test drives through playwright-core (no browser
# is ever downloaded: playwright-core ships none).
ensure_chromium() {
  if [[ -x /usr/bin/chromium ]]; then
    return 0
  fi
  log "installing chromium with apt-get"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
}

# promtool (the deployment's alert rules: `promtool check rules` and `test rules`, and the live
# scrape's `promtool check metrics`) from Debian's `prometheus` package, the way chromium comes;
# the package also brings the Prometheus server, which nothing here uses.
ensure_promtool() {
  if command -v promtool >/dev/null; then
    return 0
  fi
  log "installing promtool (Debian's prometheus package) with apt-get"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
}

# The generated stubs match proto/ (regenerated into a temporary directory and compared) and the
# client type-checks.
check_typescript_client() {
  (cd "$TS_CLIENT" && node scripts/generate.mjs --check && npx --no-install tsc --noEmit -p .)
}

# The deployment files' checks (deploy/check.py: Kubernetes and Compose schemas): a venv of
# their own next to the clients' one, reinstalled only when deploy/requirements.txt changes.
# The tests find the interpreter through IDEMPOST_DEPLOY_PYTHON.
DEPLOY_VENV="$HOME/.cache/idempost/deploy-venv"
ensure_deploy_checks() {
  ensure_venv "$DEPLOY_VENV" "$repo_root/deploy/requirements.txt"
  export IDEMPOST_DEPLOY_PYTHON="$DEPLOY_VENV/bin/python"
}

# buf (lint and breaking-change checks of proto/) from the npm registry, which ships the binary.
BUF_VERSION=1.75.0
BUF_PREFIX="$HOME/.cache/idempost/node"
BUF="$BUF_PREFIX/node_modules/.bin/buf"
ensure_buf() {
  if [[ -x "$BUF" ]] && [[ "$("$BUF" --version 2>/dev/null)" == "$BUF_VERSION" ]]; then
    return 0
  fi
  log "installing buf $BUF_VERSION into $BUF_PREFIX"
  mkdir -p "$BUF_PREFIX"
  npm install --prefix "$BUF_PREFIX" --no-audit --no-fund --silent "@bufbuild/buf@$BUF_VERSION"
}

# The commit that proto/ must stay compatible with, as a buf input; empty when this clone has
# none. Not main's tip: main may have moved on (a new .proto, a new field), and against its tip
# the branch would look as if it deleted them. So: where this branch left main (the merge base).
# On main itself that is HEAD, which only checks uncommitted edits; then the previous commit is
# the baseline, so CI on main still checks what the last commit (or merge) changed. A shallow or
# single-branch clone may have no main (then origin/main) or no parent; IDEMPOST_BUF_AGAINST
# overrides all of this with any buf input.
buf_baseline() {
  if [[ -n "${IDEMPOST_BUF_AGAINST:-}" ]]; then
    printf '%s\n' "$IDEMPOST_BUF_AGAINST"
    return 0
  fi
  local main="" candidate base head
  for candidate in main origin/main; do
    if git rev-parse --quiet --verify "$candidate^{commit}" >/dev/null 2>&1; then
      main="$candidate"
      break
    fi
  done
  [[ -n "$main" ]] || return 0
  head="$(git rev-parse HEAD)"
  base="$(git merge-base HEAD "$main" 2>/dev/null)" || return 0
  if [[ "$base" == "$head" ]]; then
    if git rev-parse --quiet --verify "HEAD~1^{commit}" >/dev/null 2>&1; then
      base="$(git rev-parse HEAD~1)"
    else
      log "HEAD is $main's tip and has no parent here (a shallow clone?): buf breaking checks only uncommitted edits"
    fi
  fi
  # subdir: the module root, so the baseline builds whether or not it has a buf.yaml.
  printf '.git#ref=%s,subdir=proto\n' "$base"
}

# Tests make databases named idempost_t_<uuid>; remove any a previous run left behind.
drop_test_databases() {
  local db
  for db in $(mysql --protocol=tcp -h 127.0.0.1 -u root -N -e "SHOW DATABASES LIKE 'idempost\\_t\\_%'" 2>/dev/null); do
    mysql --protocol=tcp -h 127.0.0.1 -u root -e "DROP DATABASE \`$db\`" || true
  done
  for db in $(psql -h 127.0.0.1 -U postgres -d postgres -Atc "SELECT datname FROM pg_database WHERE datname LIKE 'idempost\\_t\\_%'" 2>/dev/null); do
    psql -h 127.0.0.1 -U postgres -d postgres -qc "DROP DATABASE \"$db\" WITH (FORCE)" || true
  done
}
