//! The ordered-relay phase (issue 25, "cost, measured"): the relay x1 and x2 draining a backlog
//! of many versions per order, where it claims only each order's earliest unpublished event,
//! beside the same relays draining as many events one per order; then AmendOrder calls at a
//! modest rate through the whole pipeline, and their latency until the consumer applied them.

use super::{Run, Start, step};
use crate::error::BenchError;
use crate::figures::{Amends, Ordered, OrderedDrain};
use crate::load;
use crate::measure::Latencies;
use crate::ordered::{self, AMEND_RATE, AMENDED_ORDERS};
use crate::raw;
use crate::sql;

const JOBS: &str = "SELECT COUNT(*) FROM notification_job";

/// The relay processes of each drain.
const PROCESSES: [usize; 2] = [1, 2];

impl Run<'_> {
    pub(super) async fn ordered(&mut self) -> Result<(), BenchError> {
        let shape = self.plan.ordered;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let topic = |what: &str| format!("idempost-bench-ordered-{what}-{id}");
        let topics = ["one-x1", "many-x1", "one-x2", "many-x2", "e2e"].map(topic);
        for topic in &topics {
            idempost_verify::create_topic(&self.plan.brokers, topic, self.plan.partitions)
                .await
                .map_err(BenchError::Stuck)?;
        }
        let mut figures = Ordered { orders: shape.orders, versions: shape.versions, ..Ordered::default() };

        // Each comparison's two drains back to back, so a shared machine's load drifts less
        // between them.
        for (processes, topics) in PROCESSES.into_iter().zip(topics[..4].chunks(2)) {
            sql::truncate_all(&self.db).await?;
            step(&format!("ordered: pre-filling the outbox with {} events, one per order", shape.events()));
            raw::prefill(&self.db, shape.events()).await?;
            sql::hold_back_all(&self.db).await?;
            let drain = self.ordered_drain(processes, &topics[0], "one-per-order", shape.events()).await?;
            figures.one_per_order.push(drain);

            sql::truncate_all(&self.db).await?;
            step(&format!(
                "ordered: pre-filling the outbox with {} orders x {} versions",
                shape.orders, shape.versions
            ));
            ordered::prefill(&self.db, shape).await?;
            sql::hold_back_all(&self.db).await?;
            let drain = self.ordered_drain(processes, &topics[1], "many-per-order", shape.events()).await?;
            figures.many_per_order.push(drain);
        }

        figures.amends = self.amends(&topics[4]).await?;
        self.figures.ordered = Some(figures);
        // The table lists each service's rows together (its peak RSS once).
        self.figures.services.sort_by(|a, b| a.service.cmp(&b.service));
        Ok(())
    }

    /// One drain of the pre-filled outbox.
    async fn ordered_drain(
        &mut self,
        processes: usize,
        topic: &str,
        label: &str,
        events: u64,
    ) -> Result<OrderedDrain, BenchError> {
        let phase = format!("ordered: {label} x{processes}");
        // Held back until every relay is up: these drains last a few seconds, and a relay that
        // starts half a second after the other would decide the x2 figure.
        let relay = format!("relay-{label}");
        let drained = self.drain_from(Start::HeldBack, processes, topic, &relay, &phase, events).await?;
        self.figures.services.push(drained.usage(format!("{label} x{processes} (sum)")));
        Ok(OrderedDrain { processes, drain: drained.drain, phases: drained.phases })
    }

    /// Submits [`AMENDED_ORDERS`] orders, then amends them in turn at [`AMEND_RATE`] for one
    /// end-to-end level's length, with order service, relay and consumer running.
    async fn amends(&mut self, topic: &str) -> Result<Amends, BenchError> {
        sql::truncate_all(&self.db).await?;
        let (clients, mut services) = self.start_pipeline(topic, "ordered-e2e").await?;
        let mut orders = Vec::with_capacity(AMENDED_ORDERS);
        for n in 0..AMENDED_ORDERS {
            orders.push(clients.submit_for_id(n).await?);
        }
        let accepted = 1 + AMENDED_ORDERS as u64;
        self.wait_for(JOBS, accepted, &mut services).await?;

        let observer = self.observe(&format!("ordered: amends ({AMEND_RATE:.0}/s)")).await;
        let (sent, failed, first_error) =
            load::amend_loop(&clients, &orders, AMEND_RATE, self.plan.e2e).await;
        if let Some(e) = first_error {
            self.figures.notes.push(format!("ordered amends: {failed} AmendOrder calls failed, first: {e}"));
        }
        self.wait_for(JOBS, accepted + sent.len() as u64, &mut services).await?;
        self.waited(observer.finish().await);

        let jobs = self.jobs().await?;
        let (mut sent_to_applied, mut accepted_to_applied) = (Latencies::default(), Latencies::default());
        let mut missing = 0;
        for s in &sent {
            let Some(&(created, _, applied)) = jobs.get(&s.event_id) else {
                missing += 1;
                continue;
            };
            let sent_us = s.at_micros();
            sent_to_applied.push_ms((applied - sent_us) as f64 / 1000.0);
            accepted_to_applied.push_ms((applied - created) as f64 / 1000.0);
        }
        let parked = sql::count(&self.db, "SELECT COUNT(*) FROM parked_event").await?;
        let views_current = sql::count(
            &self.db,
            "SELECT COUNT(*) FROM orders o JOIN order_view v ON v.order_id = o.id AND v.version = o.version \
             WHERE o.version > 1",
        )
        .await?;
        for service in services {
            service.stop().await;
        }
        Ok(Amends {
            offered_per_second: AMEND_RATE,
            orders: AMENDED_ORDERS,
            accepted: sent.len() as u64,
            failed,
            missing,
            sent_to_applied: sent_to_applied.summary(),
            accepted_to_applied: accepted_to_applied.summary(),
            parked,
            views_current,
        })
    }
}
