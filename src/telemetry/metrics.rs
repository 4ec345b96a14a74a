//! Idempost's metric instruments, from the global meter (a no-op unless metrics export is on).

use std::sync::LazyLock;

use opentelemetry::metrics::{Counter, Gauge, Histogram};

/// Every instrument Idempost records. Durations are in seconds.
#[derive(Debug)]
pub struct Metrics {
    /// Outbox rows per status (attribute `idempost.outbox.status`).
    pub outbox_backlog: Gauge<u64>,
    /// Age of the oldest PENDING or PUBLISHING outbox row.
    pub outbox_oldest_pending_age: Gauge<f64>,
    /// Age of the oldest event a relay could claim now: due (not in backoff), not held behind an
    /// earlier version of its order, or leased by a relay whose lease ran out. 0 when none.
    pub outbox_oldest_claimable_age: Gauge<f64>,
    /// Events a relay could claim now (as for the age above).
    pub outbox_claimable: Gauge<u64>,
    /// Age of the oldest transaction holding back the database's cleanup (see
    /// [`crate::db::cleanup::oldest_transaction_age`]); 0 when none.
    pub db_oldest_transaction_age: Gauge<f64>,
    /// Old row versions the database's cleanup has not removed yet: the outbox's dead rows on
    /// PostgreSQL, InnoDB's history list length on MariaDB/MySQL, 0 on SQLite (see
    /// [`crate::db::cleanup::unremoved_versions`]).
    pub db_unremoved_versions: Gauge<u64>,
    /// Events leased by the relay's claims (every claim counts as an attempt).
    pub claimed: Counter<u64>,
    /// From the event's creation to the broker's confirm.
    pub publish_latency: Histogram<f64>,
    /// Events confirmed and marked PUBLISHED.
    pub published: Counter<u64>,
    /// Marks and releases that found the lease taken over.
    pub lease_losses: Counter<u64>,
    /// Failed publishes released for a retry.
    pub releases: Counter<u64>,
    /// Relay statements that lost a lock conflict and ran again (attribute `idempost.relay.phase`:
    /// `claim` or `record`); the relay's statements are meant never to wait on each other.
    pub relay_lock_conflicts: Counter<u64>,
    /// Claims that waited the whole of the claim gate's wait and claimed without it
    /// (MariaDB/MySQL).
    pub claim_gate_timeouts: Counter<u64>,
    /// Sweeps that found a claimable row behind where the relay's claims start reading
    /// (attribute `idempost.relay.claim_read`: `due` or `expired`); often means a lookback too short.
    pub claim_sweep_finds: Counter<u64>,
    /// Idle waits ended early by a wake-up from the order service.
    pub wakeups: Counter<u64>,
    /// Events moved to FAILED.
    pub failed: Counter<u64>,
    /// From receiving a record to committing its effect.
    pub consume_latency: Histogram<f64>,
    /// From the event's creation in the order service to the consumer's commit of its effect.
    pub end_to_end_latency: Histogram<f64>,
    /// Records the consumer's group has not committed, over every partition of its topic.
    pub consumer_lag: Gauge<u64>,
    /// Events parked in the consumer's read model (its consumer name's).
    pub consumer_parked: Gauge<u64>,
    /// Events whose effect committed.
    pub consumed: Counter<u64>,
    /// Deliveries of events already consumed.
    pub duplicates: Counter<u64>,
    /// Records stored in the dead-letter table.
    pub dead_letters: Counter<u64>,
    /// Order transactions run again after a deadlock or lock-wait timeout (attribute `reason`).
    pub order_lock_retries: Counter<u64>,
    /// Orders per group-commit transaction.
    pub order_batch_size: Histogram<u64>,
    /// Set-based writes of a group-commit batch (attribute `outcome`: `written` or `fell_back`).
    pub order_batch_set_writes: Counter<u64>,
    /// Calls refused for their credentials or scope (attribute `reason`, the ErrorInfo reason).
    pub calls_refused: Counter<u64>,
    /// 1 while the service reports SERVING, 0 while NOT_SERVING (attribute `idempost.service`).
    pub health_serving: Gauge<u64>,
    /// 1 while a health check fails, 0 while it passes (attributes `idempost.service`,
    /// `idempost.health.check`).
    pub health_failing: Gauge<u64>,
    /// 1 while a shard's database does not answer the order service's health ping, 0 while it
    /// does (attribute `idempost.shard`): health stays SERVING while any shard answers.
    pub shard_down: Gauge<u64>,
    /// 1 for every shard of a relay fleet's map that this relay serves, 0 for the others
    /// (attribute `idempost.shard`).
    pub relay_shard_owned: Gauge<u64>,
    /// 1 while a relay fleet's shard has no live owner by its control partition (its end has not
    /// moved for three ticks), else 0 (attribute `idempost.shard`); every relay reports every
    /// shard of its map.
    pub relay_shard_unowned: Gauge<u64>,
    /// Ticks the broker confirmed in the control partitions of the shards this relay owns
    /// (attribute `idempost.shard`): the owner's sign of life.
    pub relay_control_ticks: Counter<u64>,
    /// Kafka producers the relay replaced after a fatal error or a run of rejected batches.
    pub producer_rebuilds: Counter<u64>,
    /// Kafka consumers the consumer replaced after a fatal error.
    pub client_rebuilds: Counter<u64>,
    /// 1 in a binary built with the test-only `failpoints` feature, else 0.
    pub failpoints_compiled_in: Gauge<u64>,
    /// New connections a listener did not serve in full (attributes `idempost.shed.reason`:
    /// `connections`, `descriptors` or `handshakes`; `idempost.shed.action`: `closed` or
    /// `health_only`).
    pub connections_shed: Counter<u64>,
    /// Signature keys in force for bearer tokens; 0 refuses every token.
    pub auth_jwks_keys: Gauge<u64>,
    /// 1 while the JWKS file cannot be read or parsed and the keys read before stay in force.
    pub auth_jwks_stale: Gauge<u64>,
}

/// Latency buckets in seconds, from a local commit (milliseconds) to a relay's retry backoff
/// (minutes): the SDK's default buckets are meant for milliseconds.
const LATENCY_BOUNDARIES: [f64; 16] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let meter = opentelemetry::global::meter("idempost");
    Metrics {
        outbox_backlog: meter
            .u64_gauge("idempost.outbox.backlog")
            .with_description("Outbox rows per status")
            .build(),
        outbox_oldest_pending_age: meter
            .f64_gauge("idempost.outbox.oldest_pending_age")
            .with_unit("s")
            .with_description("Age of the oldest PENDING or PUBLISHING outbox row")
            .build(),
        outbox_oldest_claimable_age: meter
            .f64_gauge("idempost.outbox.oldest_claimable_age")
            .with_unit("s")
            .with_description("Age of the oldest event a relay could claim now; 0 when none")
            .build(),
        outbox_claimable: meter
            .u64_gauge("idempost.outbox.claimable")
            .with_description("Events a relay could claim now")
            .build(),
        db_oldest_transaction_age: meter
            .f64_gauge("idempost.db.oldest_transaction_age")
            .with_unit("s")
            .with_description("Age of the oldest open transaction holding back the database's cleanup; 0 when none")
            .build(),
        db_unremoved_versions: meter
            .u64_gauge("idempost.db.unremoved_versions")
            .with_description(
                "Old row versions cleanup has not removed: outbox dead rows (PostgreSQL), history list length (MariaDB/MySQL)",
            )
            .build(),
        claimed: meter
            .u64_counter("idempost.relay.claimed")
            .with_description("Events leased by claims")
            .build(),
        publish_latency: meter
            .f64_histogram("idempost.relay.publish.latency")
            .with_unit("s")
            .with_description("From the event's creation to the broker's confirm")
            .with_boundaries(LATENCY_BOUNDARIES.to_vec())
            .build(),
        published: meter
            .u64_counter("idempost.relay.published")
            .with_description("Events marked PUBLISHED")
            .build(),
        lease_losses: meter
            .u64_counter("idempost.relay.lease_losses")
            .with_description("Marks or releases that found another owner's lease")
            .build(),
        relay_lock_conflicts: meter
            .u64_counter("idempost.relay.lock_conflicts")
            .with_description(
                "Claims and outcome writes that lost a deadlock or lock-wait timeout and ran again",
            )
            .build(),
        claim_gate_timeouts: meter
            .u64_counter("idempost.relay.claim_gate_timeouts")
            .with_description("Claims that waited the claim gate's whole wait and claimed without it")
            .build(),
        releases: meter
            .u64_counter("idempost.relay.releases")
            .with_description("Failed publishes released for retry")
            .build(),
        claim_sweep_finds: meter
            .u64_counter("idempost.relay.claim_sweep_finds")
            .with_description("Sweeps that found a claimable row behind where the relay's claims start reading")
            .build(),
        wakeups: meter
            .u64_counter("idempost.relay.wakeups")
            .with_description("Idle waits ended early by a wake-up")
            .build(),
        failed: meter.u64_counter("idempost.relay.failed").with_description("Events moved to FAILED").build(),
        consume_latency: meter
            .f64_histogram("idempost.consumer.latency")
            .with_unit("s")
            .with_description("From receiving a record to committing its effect")
            .with_boundaries(LATENCY_BOUNDARIES.to_vec())
            .build(),
        end_to_end_latency: meter
            .f64_histogram("idempost.end_to_end.latency")
            .with_unit("s")
            .with_description("From the event's creation to the consumer's commit of its effect")
            .with_boundaries(LATENCY_BOUNDARIES.to_vec())
            .build(),
        consumer_lag: meter
            .u64_gauge("idempost.consumer.lag")
            .with_description("Records the consumer group has not committed, over the topic's partitions")
            .build(),
        consumer_parked: meter
            .u64_gauge("idempost.consumer.parked")
            .with_description("Events parked in the consumer's read model")
            .build(),
        consumed: meter
            .u64_counter("idempost.consumer.consumed")
            .with_description("Events whose effect committed")
            .build(),
        duplicates: meter
            .u64_counter("idempost.consumer.duplicates")
            .with_description("Deliveries of events already consumed")
            .build(),
        dead_letters: meter
            .u64_counter("idempost.consumer.dead_letters")
            .with_description("Records dead-lettered")
            .build(),
        order_lock_retries: meter
            .u64_counter("idempost.order.lock_conflict_retries")
            .with_description("Order transactions run again after a deadlock or lock-wait timeout")
            .build(),
        order_batch_size: meter
            .u64_histogram("idempost.order.batch.size")
            .with_description("Orders written per group-commit transaction")
            .with_boundaries(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0])
            .build(),
        order_batch_set_writes: meter
            .u64_counter("idempost.order.batch.set_writes")
            .with_description("Group-commit batches written with one INSERT per table, or fallen back")
            .build(),
        calls_refused: meter
            .u64_counter("idempost.calls.refused")
            .with_description("Calls refused for their credentials or scope, per reason")
            .build(),
        health_serving: meter
            .u64_gauge("idempost.health.serving")
            .with_description("1 while the service's grpc.health.v1 status is SERVING, else 0")
            .build(),
        health_failing: meter
            .u64_gauge("idempost.health.failing")
            .with_description("1 while the named health check fails, else 0")
            .build(),
        shard_down: meter
            .u64_gauge("idempost.order.shard.down")
            .with_description("1 while the shard's database does not answer the order service, else 0")
            .build(),
        relay_shard_owned: meter
            .u64_gauge("idempost.relay.shard.owned")
            .with_description("1 for every shard of the map this relay serves, 0 for the others")
            .build(),
        relay_shard_unowned: meter
            .u64_gauge("idempost.relay.shard.unowned")
            .with_description("1 while the shard's control partition has had no tick for three ticks, else 0")
            .build(),
        relay_control_ticks: meter
            .u64_counter("idempost.relay.control_ticks")
            .with_description("Ticks confirmed in the control partitions of the shards this relay owns")
            .build(),
        producer_rebuilds: meter
            .u64_counter("idempost.relay.producer_rebuilds")
            .with_description("Kafka producers replaced inside the relay process")
            .build(),
        client_rebuilds: meter
            .u64_counter("idempost.consumer.client_rebuilds")
            .with_description("Kafka consumers replaced inside the consumer process")
            .build(),
        failpoints_compiled_in: meter
            .u64_gauge("idempost.failpoints.compiled_in")
            .with_description(
                "1 in a binary built with the test-only failpoints feature (it obeys FAILPOINTS), else 0",
            )
            .build(),
        connections_shed: meter
            .u64_counter("idempost.listener.connections_shed")
            .with_description(
                "New connections closed at once, or kept for health checks only, past a listener's limits",
            )
            .build(),
        auth_jwks_keys: meter
            .u64_gauge("idempost.auth.jwks.keys")
            .with_description("Signature keys in force for bearer tokens; 0 refuses every token")
            .build(),
        auth_jwks_stale: meter
            .u64_gauge("idempost.auth.jwks.stale")
            .with_description("1 while the JWKS file cannot be used and the keys read before stay in force")
            .build(),
    }
});

/// The instruments; the first call binds them to the global meter provider.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

/// Adds 0 to each of `counters`, so that a scrape shows each (at 0) before its first event: a
/// counter never added to is not exported, and an alert or a rate over it would see nothing.
pub fn start_at_zero(counters: &[&Counter<u64>]) {
    for counter in counters {
        counter.add(0, &[]);
    }
}
