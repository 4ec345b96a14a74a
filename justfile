# Idempost's everyday commands. The README's two commands need no `just`: these are conveniences.

default:
    @just --list

# Run the demo end to end on the embedded SQLite default.
demo:
    scripts/demo

# Run the whole test suite (fmt, clippy, every test on MariaDB, PostgreSQL and SQLite).
test *ARGS:
    scripts/test {{ARGS}}

# Apply migrations to DATABASE_URL: the deploy step before any service starts.
migrate url:
    cargo run --quiet --bin idempost-migrate -- -u '{{url}}' up

# Show which migrations DATABASE_URL has.
migrate-status url:
    cargo run --quiet --bin idempost-migrate -- -u '{{url}}' status

# Run the order service against a migrated database (loopback, no authentication).
order url listen="127.0.0.1:50051":
    IDEMPOST_AUTH=none IDEMPOST_DATABASE_URL='{{url}}' IDEMPOST_ORDER_LISTEN='{{listen}}' cargo run --bin idempost-order

# Run the fault-injection verifier against DATABASE_URL and BROKERS (migrate first). Failpoint
# builds go to target/failpoints, never beside production builds; the services refuse to start
# without IDEMPOST_ALLOW_FAILPOINTS=1, which the verifier sets for the processes it starts.
verify url brokers="127.0.0.1:9092":
    cargo build --workspace --all-features --bins --target-dir target/failpoints
    target/failpoints/debug/idempost-verify --database-url '{{url}}' --brokers '{{brokers}}'

# Format and lint as CI does.
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets --all-features -- -D warnings

# Measure throughput, latency, CPU and memory against the machine's limits (release builds).
# Starts its own Tansu broker unless ARGS has --brokers; e.g. `just bench --quick`.
bench *ARGS:
    scripts/bench {{ARGS}}
