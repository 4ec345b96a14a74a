//! The experiment: one event through a fault at every commit window.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use tonic_types::StatusExt as _;

use idempost::failpoint as fp;
use idempost_proto::EventId;
use idempost_proto::v1::{self as pb, order_service_client::OrderServiceClient};

use idempost_consumer::DEFAULT_CONSUMER_NAME;

use crate::error::VerifyError;
use crate::evidence::{self, OutboxRow, Record};
use crate::ordering;
use crate::process::{ServiceProcess, Signal};
use crate::report::{Counts, EventFacts, Injection, Invariant, Report, Versions};
use crate::settings::Settings;

const STEP: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);

type Evidence = Vec<(String, String)>;

fn ev(pairs: &[(&str, String)]) -> Evidence {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
}

/// Polls `check` until it yields a value, or fails with `what` after `limit`.
async fn until<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> Result<T, VerifyError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, VerifyError>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(VerifyError::Stuck(format!("timed out after {limit:?} waiting until {what}")));
        }
        tokio::time::sleep(POLL).await;
    }
}

struct Run<'a> {
    settings: &'a Settings,
    db: DatabaseConnection,
    topic: String,
    group: String,
    event_id: String,
    /// The followed order's tenant: every order of it is the experiment's.
    tenant_id: i64,
    processes: Vec<ServiceProcess>,
}

impl Run<'_> {
    fn failpoints(&self, own: &str, consumer: bool) -> String {
        let breaks = self
            .settings
            .breaks
            .iter()
            .filter(|b| b.in_consumer() == consumer)
            .map(|b| format!("{}=return", b.switch()));
        std::iter::once(own.to_owned()).chain(breaks).filter(|s| !s.is_empty()).collect::<Vec<_>>().join(";")
    }

    fn start(
        &mut self,
        binary: &str,
        label: &str,
        args: Vec<String>,
        failpoints: String,
    ) -> Result<usize, VerifyError> {
        let process = self.settings.launch(binary, label, &args, &failpoints)?;
        self.processes.push(process);
        Ok(self.processes.len() - 1)
    }

    fn relay_args(&self) -> Vec<String> {
        [
            format!("--brokers={}", self.settings.brokers),
            format!("--topic={}", self.topic),
            // A delivery timeout long enough for a busy machine: when librdkafka times out an
            // idempotent send it bumps the producer epoch, and Tansu 0.6 then panics on every
            // later produce of that producer (tansu-storage lite.rs:503, "more or less than one
            // row"), answering UNKNOWN_SERVER_ERROR until the relay restarts.
            "--lease=9s".into(),
            "--delivery-timeout=3s".into(),
            "--lease-margin=1s".into(),
            "--max-idle-poll=100ms".into(),
            "--backoff-base=100ms".into(),
            "--backoff-max=500ms".into(),
            // A broker that refuses publishes for a while must delay the experiment, not move
            // its one event to FAILED, which no window here is about.
            "--max-attempts=1000".into(),
            "--listen=127.0.0.1:0".into(),
        ]
        .into()
    }

    fn consumer_args(&self) -> Vec<String> {
        [
            format!("--brokers={}", self.settings.brokers),
            format!("--topic={}", self.topic),
            format!("--group-id={}", self.group),
            "--backoff-max=300ms".into(),
            "--kafka-option=session.timeout.ms=6000".into(),
            "--kafka-option=heartbeat.interval.ms=500".into(),
            "--listen=127.0.0.1:0".into(),
        ]
        .into()
    }

    async fn state(&self) -> Result<Option<OutboxRow>, VerifyError> {
        Ok(evidence::outbox_row(&self.db, &self.event_id).await?)
    }

    /// The followed event's records on the topic.
    async fn deliveries(&self) -> Result<Vec<Record>, VerifyError> {
        let all = self.all_deliveries().await?;
        Ok(all.into_iter().filter(|d| d.event_id == self.event_id).collect())
    }

    /// The followed event's records on the topic, read until nothing new came for a second:
    /// quick enough to poll while a failpoint holds a relay.
    async fn deliveries_quickly(&self) -> Result<Vec<Record>, VerifyError> {
        let all = evidence::read_topic(&self.settings.brokers, &self.topic, Duration::from_secs(1), STEP)
            .await
            .map_err(VerifyError::Broker)?;
        Ok(all.into_iter().filter(|d| d.event_id == self.event_id).collect())
    }

    /// Every record on the topic: every version of the order.
    async fn all_deliveries(&self) -> Result<Vec<Record>, VerifyError> {
        evidence::read_topic(&self.settings.brokers, &self.topic, Duration::from_secs(3), STEP)
            .await
            .map_err(VerifyError::Broker)
    }

    /// The last `n` log lines of every process started so far, for a diagnosis.
    fn log_tails(&self, n: usize) -> String {
        self.processes
            .iter()
            .map(|p| {
                let lines = p.log_lines();
                let tail = lines[lines.len().saturating_sub(n)..]
                    .iter()
                    .map(|l| format!("    {l}"))
                    .collect::<Vec<_>>()
                    .join("\n");
                format!("  {} (pid {:?}):\n{tail}", p.label(), p.pid())
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn consumer_lines(&self, prefix: &str) -> Vec<serde_json::Value> {
        self.processes
            .iter()
            .filter(|p| p.label().starts_with("consumer"))
            .flat_map(|p| p.lines_about(prefix, &self.event_id))
            .collect()
    }
}

fn describe(state: Option<&OutboxRow>) -> String {
    state.map_or_else(
        || "no outbox row".to_owned(),
        |s| {
            format!(
                "status={} attempts={} lease_owner={} published_at={} partition/offset={}/{}",
                s.status,
                s.attempts,
                s.lease_owner.as_deref().unwrap_or("-"),
                s.published_at.as_deref().unwrap_or("-"),
                s.partition.map_or("-".into(), |p| p.to_string()),
                s.offset.map_or("-".into(), |o| o.to_string())
            )
        },
    )
}

fn outcome(result: &Result<tonic::Response<pb::SubmitOrderResponse>, tonic::Status>) -> String {
    match result {
        Ok(ok) => format!("OK {:?} replayed={}", ok.get_ref().outcome(), ok.get_ref().replayed),
        Err(status) => {
            let reason = status.get_details_error_info().map(|i| i.reason).unwrap_or_default();
            format!("{:?} reason={reason}", status.code())
        }
    }
}

async fn database_version(db: &DatabaseConnection) -> String {
    let backend = db.get_database_backend();
    let sql = match backend {
        sea_orm::DbBackend::Sqlite => "SELECT 'SQLite ' || sqlite_version()",
        _ => "SELECT VERSION()",
    };
    let version = db
        .query_one_raw(Statement::from_string(backend, sql))
        .await
        .ok()
        .flatten()
        .and_then(|row| row.try_get_by_index::<String>(0).ok())
        .unwrap_or_else(|| "unknown".into());
    format!("{version}; driver sqlx 0.9 via SeaORM 2")
}

/// Runs the experiment and returns its report. `Err` means the experiment could not be carried
/// out; a report with a FAIL means it ran and a guarantee did not hold.
pub async fn run(settings: &Settings) -> Result<Report, VerifyError> {
    std::fs::create_dir_all(&settings.work_dir)?;
    let db = idempost::service::open_database(&settings.database_url, 2)
        .await
        .map_err(|e| VerifyError::Stuck(e.to_string()))?;
    let experiment = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("idempost-verify-{experiment}");
    evidence::create_topic(&settings.brokers, &topic, 1).await.map_err(VerifyError::Broker)?;
    let event_id = EventId::new().to_string();
    let tenant_id = i64::from(rand::random::<u32>() >> 1) + 1;
    let request_id = format!("verify-{experiment}");
    let mut run = Run {
        settings,
        db,
        topic,
        group: format!("idempost-verify-{experiment}"),
        event_id: event_id.clone(),
        tenant_id,
        processes: Vec::new(),
    };
    let mut report = Report {
        experiment_id: experiment,
        versions: Versions {
            application: format!("idempost {}", env!("CARGO_PKG_VERSION")),
            database_and_driver: database_version(&run.db).await,
            broker_and_client: format!(
                "Kafka protocol at {}; librdkafka {}",
                settings.brokers,
                rdkafka::util::get_rdkafka_version().1
            ),
        },
        event: EventFacts {
            request_id: format!("{tenant_id}/{request_id}"),
            event_id: event_id.clone(),
            order_id: 0,
            event_type_and_version: format!("{} v1", idempost::contract::EVENT_TYPE),
        },
        ..Report::default()
    };
    match journey(&mut run, &mut report, Key { tenant_id, request_id }).await {
        Ok(()) => Ok(report),
        // A stuck step names what it waited for; the services' last words say why.
        Err(VerifyError::Stuck(what)) => Err(VerifyError::Stuck(format!("{what}\n{}", run.log_tails(20)))),
        Err(e) => Err(e),
    }
}

/// The followed order's idempotency key.
struct Key {
    tenant_id: i64,
    request_id: String,
}

/// What the steps saw that the verdicts rest on.
#[derive(Default)]
struct Seen {
    /// Outcomes of the first (rolled back) and second (unknown) submission.
    first: String,
    second: String,
    unknown_reconciled: bool,
    reconciled_event: String,
    key_orders: u64,
    /// Outcomes of the amendment and the cancellation that follow the submission.
    changes: String,
    /// The events of the changes: versions 2 and 3 of the order.
    change_event_ids: Vec<String>,
    discoverable: Option<OutboxRow>,
    after_confirm: Option<OutboxRow>,
    copies_after_confirm: usize,
    stale_owner: String,
    stopped_until_takeover: bool,
    marked_by_new_owner: Option<OutboxRow>,
    late: String,
    /// Whether relay 3 had its late publish confirmed and tried to mark.
    late_mark_tried: bool,
    after_stale: Option<OutboxRow>,
    /// The followed event's records on the topic once the relays are done.
    deliveries: Vec<Record>,
}

/// The seven injections in order, each recorded in `report`, then the verdicts. The order is
/// amended and cancelled after its submission, so the relays and consumers also carry its
/// versions 2 and 3 through the same faults, and the verdicts check the order's order.
async fn journey(run: &mut Run<'_>, report: &mut Report, key: Key) -> Result<(), VerifyError> {
    let mut seen = Seen::default();
    submit_through_faults(run, report, &key, &mut seen).await?;
    relay_dies_before_claim(run, report, &mut seen).await?;
    let relay2_exit = relay_dies_after_confirm(run, &mut seen).await?;
    stale_owner_is_fenced(run, &mut seen).await?;
    report.injections.push(Injection {
        point: fp::AFTER_BROKER_CONFIRM_BEFORE_MARK_PUBLISHED,
        expected: "the broker has the record but the row is still PUBLISHING: the event is published again; duplicates, no loss",
        observed: ev(&[
            ("relayExit", format!("{relay2_exit:?}")),
            ("outboxRowAfterCrash", describe(seen.after_confirm.as_ref())),
            ("copiesOnTopicAfterCrash", seen.copies_after_confirm.to_string()),
        ]),
    });
    report.injections.push(Injection {
        // The stale owner sleeps (and is stopped) in this failpoint: after the broker's
        // confirm, before its mark (see `stale_owner_is_fenced`).
        point: fp::AFTER_BROKER_CONFIRM_BEFORE_MARK_PUBLISHED,
        expected: "the stale owner's late mark changes nothing; lease ownership is traceable; the duplicate is tolerated",
        observed: ev(&[
            ("staleLeaseOwner", seen.stale_owner.clone()),
            ("staleOwnerStoppedUntilTakeover", seen.stopped_until_takeover.to_string()),
            ("markedByNewOwner", describe(seen.marked_by_new_owner.as_ref())),
            ("staleOwnerOutcome", seen.late.clone()),
            ("rowAfterStaleOwner", describe(seen.after_stale.as_ref())),
            ("copiesOnTopic", seen.deliveries.len().to_string()),
        ]),
    });
    consumer_fails_on_another_key(run, report).await?;
    let order_id = report.event.order_id;
    consumer_dies_before_ack(run, report, &seen, order_id).await?;
    verdicts(run, report, &key, &seen).await
}

/// SubmitOrder rolled back, then committed with its acknowledgement lost and reconciled; then the
/// order is amended (version 2) and cancelled (version 3) by the same order service.
async fn submit_through_faults(
    run: &mut Run<'_>,
    report: &mut Report,
    key: &Key,
    seen: &mut Seen,
) -> Result<(), VerifyError> {
    let (tenant_id, request_id) = (key.tenant_id, key.request_id.clone());
    let event_id = run.event_id.clone();
    let failpoints = format!(
        "{}=1*return;{}=1*return",
        fp::BEFORE_ORDER_TRANSACTION_COMMIT,
        fp::COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION
    );
    let listen = vec!["--listen=127.0.0.1:0".into(), "--admin-listen=127.0.0.1:0".into()];
    let order = run.start("idempost-order", "order", listen, failpoints)?;
    let bound = run.processes[order].listening(STEP).await.map_err(VerifyError::Stuck)?;
    let url = format!("http://127.0.0.1:{}", bound.port("listen"));
    let mut client = until("the order service answers", STEP, || {
        let url = url.clone();
        async move { Ok(OrderServiceClient::connect(url).await.ok()) }
    })
    .await?;
    let request = pb::SubmitOrderRequest {
        tenant_id,
        request_id: request_id.clone(),
        customer_id: "verify".into(),
        currency: "EUR".into(),
        line_items: vec![pb::LineItem { sku: "VERIFY".into(), quantity: 1, unit_price_minor: 100 }],
        event_id: event_id.clone(),
    };
    let first = client.submit_order(request.clone()).await;
    let rows_after_first = evidence::rows(&run.db, &event_id).await?;
    report.injections.push(Injection {
        point: fp::BEFORE_ORDER_TRANSACTION_COMMIT,
        expected: "ROLLED_BACK; neither the order nor its event exists; the retry reuses the same ids",
        observed: ev(&[
            ("outcome", outcome(&first)),
            ("ordersWithEventId", rows_after_first.orders.to_string()),
            ("outboxRowsWithEventId", rows_after_first.outbox.to_string()),
            ("retryEventId", request.event_id.clone()),
        ]),
    });
    let second = client.submit_order(request.clone()).await;
    let reconciled = client
        .reconcile(pb::ReconcileRequest { tenant_id, request_id: request_id.clone() })
        .await
        .map(tonic::Response::into_inner);
    seen.key_orders = evidence::orders_for_key(&run.db, tenant_id, &request_id).await?;
    seen.reconciled_event = reconciled.as_ref().map(|r| r.event_id.clone()).unwrap_or_default();
    report.event.order_id = reconciled.as_ref().map(|r| r.order_id).unwrap_or_default();
    report.injections.push(Injection {
        point: fp::COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION,
        expected: "UNKNOWN, then Reconcile by (tenant_id, request_id) finds the order and its event id; no blind replay",
        observed: ev(&[
            ("outcome", outcome(&second)),
            ("reconcile", reconciled.as_ref().map_or_else(|s| format!("{:?}", s.code()), |r| format!("order {} event {}", r.order_id, r.event_id))),
            ("ordersForRequestKey", seen.key_orders.to_string()),
        ]),
    });
    seen.unknown_reconciled = second.as_ref().err().is_some_and(|s| s.code() == tonic::Code::Unknown)
        && first.as_ref().err().is_some_and(|s| s.code() == tonic::Code::Aborted)
        && rows_after_first.orders == 0
        && rows_after_first.outbox == 0
        && seen.reconciled_event == event_id
        && seen.key_orders == 1;
    (seen.first, seen.second) = (outcome(&first), outcome(&second));
    change_the_order(&mut client, key, report.event.order_id, seen).await;
    let _ = run.processes[order].terminate(STEP).await;
    Ok(())
}

/// Amends the order to version 2 and cancels it at version 3; records what each answered and
/// the events they committed.
async fn change_the_order(
    client: &mut OrderServiceClient<tonic::transport::Channel>,
    key: &Key,
    order_id: i64,
    seen: &mut Seen,
) {
    let amend = pb::AmendOrderRequest {
        tenant_id: key.tenant_id,
        request_id: format!("{}-amend", key.request_id),
        order_id,
        expected_version: 1,
        line_items: vec![pb::LineItem { sku: "VERIFY".into(), quantity: 2, unit_price_minor: 100 }],
        ..Default::default()
    };
    let cancel = pb::CancelOrderRequest {
        tenant_id: key.tenant_id,
        request_id: format!("{}-cancel", key.request_id),
        order_id,
        expected_version: 2,
        reason: pb::CancelReason::CustomerRequest.into(),
        note: "idempost-verify".into(),
        ..Default::default()
    };
    let amended =
        client.amend_order(amend).await.map(|r| (r.get_ref().event_id.clone(), r.get_ref().version));
    let cancelled =
        client.cancel_order(cancel).await.map(|r| (r.get_ref().event_id.clone(), r.get_ref().version));
    let mut said = Vec::new();
    for (what, answer) in [("amend", amended), ("cancel", cancelled)] {
        match answer {
            Ok((event_id, version)) => {
                said.push(format!("{what} committed version {version}"));
                seen.change_event_ids.push(event_id);
            }
            Err(status) => said.push(format!("{what} refused: {:?} {}", status.code(), status.message())),
        }
    }
    seen.changes = said.join(", ");
}

/// Relay 1 dies before claiming: the event must stay discoverable.
async fn relay_dies_before_claim(
    run: &mut Run<'_>,
    report: &mut Report,
    seen: &mut Seen,
) -> Result<(), VerifyError> {
    let fps = run.failpoints(&format!("{}=return(abort)", fp::AFTER_COMMIT_BEFORE_RELAY_CLAIM), false);
    let relay1 = run.start("idempost-relay", "relay-1", run.relay_args(), fps)?;
    let relay1_exit = run.processes[relay1].exited(STEP).await;
    seen.discoverable = run.state().await?;
    report.injections.push(Injection {
        point: fp::AFTER_COMMIT_BEFORE_RELAY_CLAIM,
        expected: "the relay dies before claiming; the committed event stays PENDING and discoverable by its id",
        observed: ev(&[
            ("relayExit", format!("{relay1_exit:?}")),
            ("outboxRow", describe(seen.discoverable.as_ref())),
        ]),
    });
    Ok(())
}

/// Relay 2 dies after the broker's confirm and before its mark; returns how it exited.
async fn relay_dies_after_confirm(
    run: &mut Run<'_>,
    seen: &mut Seen,
) -> Result<Option<std::process::ExitStatus>, VerifyError> {
    let fps =
        run.failpoints(&format!("{}=return(abort)", fp::AFTER_BROKER_CONFIRM_BEFORE_MARK_PUBLISHED), false);
    let relay2 = run.start("idempost-relay", "relay-2", run.relay_args(), fps)?;
    let relay2_exit = run.processes[relay2].exited(STEP).await;
    seen.after_confirm = run.state().await?;
    seen.copies_after_confirm = run.deliveries().await?.len();
    Ok(relay2_exit)
}

/// Relay 3 claims after relay 2's lease expires, publishes, then stalls past its own lease
/// before marking; relay 4 takes over, publishes and marks; relay 3 marks late and must change
/// nothing. Relay 4 then publishes the order's later versions.
async fn stale_owner_is_fenced(run: &mut Run<'_>, seen: &mut Seen) -> Result<(), VerifyError> {
    let event_id = run.event_id.clone();
    // The stall comes after the broker's confirm: a step stalled before its publish finds its
    // publishing time spent when it goes on and publishes nothing (the relay's lease budget),
    // so only a stall after the publish can lead to a late mark.
    let fps =
        run.failpoints(&format!("{}=1*sleep(15000)", fp::AFTER_BROKER_CONFIRM_BEFORE_MARK_PUBLISHED), false);
    // One loop: stopped inside the failpoint, it holds no transaction (a second loop could be
    // stopped mid-claim, its row locks then keeping relay 4 from the event).
    let mut one_loop = run.relay_args();
    one_loop.push("--workers=1".into());
    let relay3 = run.start("idempost-relay", "relay-3", one_loop, fps)?;
    let relay3_pid = run.processes[relay3].pid().unwrap_or_default();
    seen.stale_owner = until("relay 3 holds the lease", STEP, || async {
        let state = run.state().await?;
        Ok(state.and_then(|s| s.lease_owner).filter(|owner| owner.contains(&format!("/{relay3_pid}/"))))
    })
    .await?;
    let before = seen.copies_after_confirm;
    until("relay 3's copy is on the topic", STEP, || async {
        let copies = run.deliveries_quickly().await?.len();
        Ok((copies > before).then_some(copies))
    })
    .await?;
    // The stall is held by order, not by time: relay 3 is stopped (in the failpoint, after the
    // broker's confirm and before its mark, nothing in flight) until relay 4 has taken over and
    // marked. A timed stall alone let a slow start of relay 4 end it early, and relay 3 then
    // marked under its own lease, so the late mark this step is about never happened.
    let stopped = run.processes[relay3].signal(Signal::SIGSTOP);
    let relay4 = run.start("idempost-relay", "relay-4", run.relay_args(), run.failpoints("", false))?;
    seen.marked_by_new_owner = Some(
        until("relay 4 marks the event PUBLISHED", STEP, || async {
            let marked = !run.processes[relay4].lines_about("marked PUBLISHED", &event_id).is_empty();
            Ok(run.state().await?.filter(|s| marked && s.status == "PUBLISHED"))
        })
        .await?,
    );
    let resumed = run.processes[relay3].signal(Signal::SIGCONT);
    seen.stopped_until_takeover = stopped && resumed;
    seen.late = until("relay 3 confirms late and records its outcome", STEP, || async {
        let log = &run.processes[relay3];
        let lines =
            // A step that overslept its whole lease budget leaves the outcome unrecorded,
            // which changes nothing too.
            [
                log.lines_about("lease lost", &event_id),
                log.lines_about("marked PUBLISHED", &event_id),
                log.lines_about("could not record the outcome", &event_id),
            ]
            .concat();
        Ok(lines.first().and_then(|l| l["fields"]["message"].as_str()).map(str::to_owned))
    })
    .await?;
    // The path this step is about: relay 3 had its late publish confirmed and tried to mark. A
    // publish that timed out (a loaded machine) or a step out of budget marks nothing, so the
    // row staying as relay 4 left it would prove nothing about the mark's owner condition.
    seen.late_mark_tried =
        seen.late == "marked PUBLISHED" || seen.late.starts_with("lease lost after the broker confirmed");
    seen.after_stale = run.state().await?;
    let later = seen.change_event_ids.clone();
    until("the order's later versions are PUBLISHED", STEP, || async {
        for id in &later {
            if evidence::outbox_row(&run.db, id).await?.is_none_or(|s| s.status != "PUBLISHED") {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await?;
    for index in [relay3, relay4] {
        let _ = run.processes[index].terminate(STEP).await;
    }
    seen.deliveries = run.deliveries().await?;
    Ok(())
}

/// Consumer 1 fails on an integrity error that is not uq_consumed_event_identity, and is killed
/// while still failing.
async fn consumer_fails_on_another_key(run: &mut Run<'_>, report: &mut Report) -> Result<(), VerifyError> {
    let event_id = run.event_id.clone();
    let fps =
        run.failpoints(&format!("{}=return", fp::NON_TARGET_INTEGRITY_OR_DATA_ERROR_WHILE_CLAIMING), true);
    let consumer1 = run.start("idempost-consumer", "consumer-1", run.consumer_args(), fps)?;
    until("consumer 1 has handled the event twice", STEP, || async {
        let log = &run.processes[consumer1];
        let attempts =
            log.lines_about("handling failed", &event_id).len() + log.lines_about("dedup", &event_id).len();
        Ok((attempts >= 2).then_some(()))
    })
    .await?;
    run.processes[consumer1].kill().await;
    let failures = run.processes[consumer1].lines_about("handling failed", &event_id);
    let consumed_after_failures = evidence::rows(&run.db, &event_id).await?.consumed;
    let error = failures.first().and_then(|l| l["fields"]["error"].as_str()).unwrap_or("none logged");
    let hits = run.processes[consumer1].lines_about("dedup hit", &event_id).len();
    report.injections.push(Injection {
        point: fp::NON_TARGET_INTEGRITY_OR_DATA_ERROR_WHILE_CLAIMING,
        expected: "the failure is not taken for already consumed: rolled back, not acknowledged, retried",
        observed: ev(&[
            ("failedAttempts", failures.len().to_string()),
            ("error", error.to_owned()),
            ("consumedEventRowsAfterFailures", consumed_after_failures.to_string()),
            ("dedupHitsWhileFailing", hits.to_string()),
        ]),
    });
    Ok(())
}

/// Every (partition, offset) a consumer handled to a commit or a dedup hit.
fn handled(run: &Run<'_>) -> Vec<(i64, i64)> {
    let mut seen: Vec<(i64, i64)> = ["dedup miss", "dedup hit"]
        .iter()
        .flat_map(|p| run.consumer_lines(p))
        .map(|l| {
            (l["fields"]["partition"].as_i64().unwrap_or(-1), l["fields"]["offset"].as_i64().unwrap_or(-1))
        })
        .collect();
    seen.sort_unstable();
    seen.dedup();
    seen
}

/// Consumer 2 commits and dies before acknowledging; consumer 3 absorbs the redeliveries and
/// applies the order's later versions to its read model.
async fn consumer_dies_before_ack(
    run: &mut Run<'_>,
    report: &mut Report,
    seen: &Seen,
    order_id: i64,
) -> Result<(), VerifyError> {
    let event_id = run.event_id.clone();
    let fps =
        run.failpoints(&format!("{}=return(abort)", fp::AFTER_CONSUMER_COMMIT_BEFORE_MESSAGE_ACK), true);
    let consumer2 = run.start("idempost-consumer", "consumer-2", run.consumer_args(), fps)?;
    let consumer2_exit = run.processes[consumer2].exited(Duration::from_secs(30)).await;
    if consumer2_exit.is_none() {
        run.processes[consumer2].kill().await;
    }
    let consumed_after_crash = evidence::rows(&run.db, &event_id).await?.consumed;
    let consumer3 =
        run.start("idempost-consumer", "consumer-3", run.consumer_args(), run.failpoints("", true))?;
    // Done when every copy on the topic has been handled to a commit or a dedup hit, and the read
    // model reached the order's last version, or after a spell in which that did not happen (the
    // verdicts then say what is missing).
    let _ = until("consumer 3 has handled every copy", Duration::from_secs(40), || async {
        let handled = handled(run);
        let all = seen
            .deliveries
            .iter()
            .all(|d| handled.contains(&(i64::from(d.delivery.partition), d.delivery.offset)));
        Ok(all.then_some(()))
    })
    .await;
    let last = 1 + i64::try_from(seen.change_event_ids.len()).unwrap_or_default();
    let _ = until("the read model reached the order's last version", Duration::from_secs(40), || async {
        let states = ordering::order_states(&run.db, run.tenant_id, DEFAULT_CONSUMER_NAME).await?;
        Ok(states
            .iter()
            .any(|s| s.order_id == order_id && s.view.as_ref().is_some_and(|v| v.0 >= last))
            .then_some(()))
    })
    .await;
    let _ = run.processes[consumer3].terminate(STEP).await;
    report.injections.push(Injection {
        point: fp::AFTER_CONSUMER_COMMIT_BEFORE_MESSAGE_ACK,
        expected: "the redelivery meets uq_consumed_event_identity: a dedup hit, no second effect",
        observed: ev(&[
            ("consumerExit", format!("{consumer2_exit:?}")),
            ("consumedEventRowsAfterCrash", consumed_after_crash.to_string()),
            (
                "dedupHitsAfterRestart",
                run.processes[consumer3].lines_about("dedup hit", &event_id).len().to_string(),
            ),
        ]),
    });
    Ok(())
}

/// The counts and the verdicts, from the rows, the topic and the consumers' logs.
async fn verdicts(run: &mut Run<'_>, report: &mut Report, key: &Key, seen: &Seen) -> Result<(), VerifyError> {
    let rows = evidence::rows(&run.db, &run.event_id).await?;
    let final_state = run.state().await?;
    let misses = run.consumer_lines("dedup miss");
    let hits = run.consumer_lines("dedup hit");
    let failed = run.consumer_lines("handling failed");
    let attempts = (misses.len() + hits.len() + failed.len()) as u64;
    let deliveries = &seen.deliveries;
    report.counts = Counts {
        committed_orders: evidence::orders_for_key(&run.db, key.tenant_id, &key.request_id).await?,
        outbox_events_by_status: final_state.iter().map(|s| (s.status.clone(), 1)).collect(),
        broker_deliveries_for_event: deliveries.len() as u64,
        consumer_handle_attempts: attempts,
        consumed_event_rows: rows.consumed,
        notification_jobs: rows.jobs,
    };
    let stamp = |l: &serde_json::Value| l["timestamp"].as_str().unwrap_or_default().to_owned();
    let first_commit = misses.iter().map(stamp).min();
    let early_hits = hits.iter().filter(|h| first_commit.as_ref().is_none_or(|c| stamp(h) < *c)).count();
    let handled = handled(run);
    let unhandled: Vec<String> = deliveries
        .iter()
        .filter(|d| !handled.contains(&(i64::from(d.delivery.partition), d.delivery.offset)))
        .map(|d| format!("{}/{}", d.delivery.partition, d.delivery.offset))
        .collect();
    let queryable = seen
        .discoverable
        .as_ref()
        .is_some_and(|s| s.status == "PENDING" && s.lease_owner.is_none())
        && seen.after_confirm.as_ref().is_some_and(|s| s.status == "PUBLISHING" && s.lease_owner.is_some())
        && final_state.as_ref().is_some_and(|s| s.status == "PUBLISHED");
    let duplicate_seen = deliveries.len() > 1 && attempts > rows.consumed;
    let facts = Facts {
        rows,
        final_state,
        early_hits,
        failed: failed.len(),
        misses: misses.len(),
        attempts,
        unhandled,
        queryable,
        duplicate_seen,
    };
    if !seen.late_mark_tried {
        report.not_taken.push("staleLeaseOwnerChangesNothing");
    }
    let mut invariants = event_invariants(seen, &facts);
    invariants.extend(order_invariants(run, seen).await?);
    report.invariants = invariants;
    Ok(())
}

/// What the verdicts on the followed event rest on, gathered by [`verdicts`].
struct Facts {
    rows: evidence::Rows,
    final_state: Option<OutboxRow>,
    early_hits: usize,
    failed: usize,
    misses: usize,
    attempts: u64,
    unhandled: Vec<String>,
    queryable: bool,
    duplicate_seen: bool,
}

/// The eight verdicts on the followed event.
fn event_invariants(seen: &Seen, f: &Facts) -> Vec<Invariant> {
    let rows = f.rows;
    let deliveries = seen.deliveries.len();
    vec![
        Invariant {
            name: "committedOrderHasOutboxEvent",
            pass: rows.orders == 1 && rows.outbox == 1,
            because: format!("{} order(s) and {} outbox row(s) carry the event id", rows.orders, rows.outbox),
        },
        Invariant {
            name: "unknownCommitReconciledByStableRequestId",
            pass: seen.unknown_reconciled,
            because: format!(
                "first attempt {}, second {}, Reconcile returned event {}, {} order(s) hold the key",
                seen.first, seen.second, seen.reconciled_event, seen.key_orders
            ),
        },
        Invariant {
            name: "noEffectWithoutCommittedOrder",
            pass: rows.jobs == 0 || rows.orders == 1,
            because: format!("{} job(s), {} committed order(s) for the event", rows.jobs, rows.orders),
        },
        Invariant {
            name: "onlyTargetUniqueConflictMeansAlreadyConsumed",
            pass: f.early_hits == 0 && f.misses > 0,
            because: format!(
                "{} non-target failure(s) retried; {} dedup hit(s) before the first commit",
                f.failed, f.early_hits
            ),
        },
        Invariant {
            name: "oneLocalEffectPerConsumerAndEvent",
            pass: rows.consumed == 1 && rows.jobs == 1 && f.duplicate_seen,
            because: format!(
                "{} consumed row(s), {} job(s) after {deliveries} broker deliveries and {} handle attempts",
                rows.consumed, rows.jobs, f.attempts
            ),
        },
        Invariant {
            name: "everyNonTerminalStateIsQueryable",
            pass: f.queryable,
            because: format!(
                "after relay 1: {}; after relay 2: {}; at the end: {}",
                describe(seen.discoverable.as_ref()),
                describe(seen.after_confirm.as_ref()),
                describe(f.final_state.as_ref())
            ),
        },
        Invariant {
            name: "staleLeaseOwnerChangesNothing",
            pass: seen.after_stale.is_some() && seen.after_stale == seen.marked_by_new_owner,
            because: format!(
                "relay 3 said `{}`; the row went from [{}] to [{}]",
                seen.late,
                describe(seen.marked_by_new_owner.as_ref()),
                describe(seen.after_stale.as_ref())
            ),
        },
        Invariant {
            name: "everyDeliveryHandledBeforeAcknowledged",
            pass: f.unhandled.is_empty(),
            because: if f.unhandled.is_empty() {
                format!("all {deliveries} deliveries reached a commit or a dedup hit")
            } else {
                format!("deliveries {} were acknowledged without being handled", f.unhandled.join(", "))
            },
        },
    ]
}

/// The verdicts on the order's order: its versions on the topic, and the consumer's read model
/// against the order table. Both count the orders and versions they checked.
async fn order_invariants(run: &Run<'_>, seen: &Seen) -> Result<Vec<Invariant>, VerifyError> {
    let records = run.all_deliveries().await?;
    let states = ordering::order_states(&run.db, run.tenant_id, DEFAULT_CONSUMER_NAME).await?;
    let last = states.iter().map(|s| (s.order_id, s.order.0)).collect();
    let topic = ordering::versions_in_order(&records, &last);
    let differences = ordering::read_model_differences(&states);
    let complete = seen.change_event_ids.len() == 2;
    Ok(vec![
        Invariant {
            name: "everyOrdersVersionsInOrderOnTheTopic",
            pass: complete && topic.violations.is_empty() && topic.orders > 0,
            because: format!(
                "{}; {} record(s) on the topic; {}",
                seen.changes,
                records.len(),
                topic.describe()
            ),
        },
        Invariant {
            name: "readModelEqualsOrderTable",
            pass: differences.is_empty() && !states.is_empty(),
            because: if differences.is_empty() {
                format!("{} order(s) compared: (version, status) equal", states.len())
            } else {
                format!("{} order(s) compared; {}", states.len(), differences.join("; "))
            },
        },
    ])
}
