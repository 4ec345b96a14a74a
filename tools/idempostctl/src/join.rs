//! One event's timeline from its two owners: the order side (order, outbox row) and the consumer
//! side (consumers, jobs, dead letters), which may live in different databases.

use idempost_proto::v1 as pb;

/// The order side's and the consumer side's parts of one event as one timeline; `None` when
/// neither knows the event.
pub(crate) fn timeline(
    order: Option<pb::EventTimeline>,
    consumer: Option<pb::ConsumerTimeline>,
) -> Option<pb::EventTimeline> {
    let consumer = consumer
        .filter(|c| !(c.consumers.is_empty() && c.notification_jobs.is_empty() && c.dead_letters.is_empty()));
    let mut joined = match (order, &consumer) {
        (None, None) => return None,
        (Some(order), _) => order,
        (None, Some(consumer)) => {
            pb::EventTimeline { event_id: consumer.event_id.clone(), ..Default::default() }
        }
    };
    if let Some(consumer) = consumer {
        joined.notification_job = consumer.notification_jobs.first().cloned();
        joined.consumers = consumer.consumers;
        joined.notification_jobs = consumer.notification_jobs;
        joined.dead_letters = consumer.dead_letters;
    }
    Some(joined)
}

/// What the consumer side did with one event of an order, for the table of every version: per
/// consumer name, dead-lettered, parked (recorded, waiting for an earlier version) or applied (to
/// its read model of the order); "not consumed yet" when no consumer recorded it.
pub(crate) fn consumer_state(consumer: &pb::ConsumerTimeline, parked: &[pb::ParkedEventRecord]) -> String {
    let mut states: Vec<String> =
        consumer.dead_letters.iter().map(|d| format!("dead-lettered by {}", d.consumer_name)).collect();
    for c in &consumer.consumers {
        let waiting =
            parked.iter().find(|p| p.event_id == consumer.event_id && p.consumer_name == c.consumer_name);
        states.push(match waiting {
            Some(p) => format!("parked by {}: {}", c.consumer_name, p.reason),
            None => format!("applied by {}", c.consumer_name),
        });
    }
    if states.is_empty() { "not consumed yet".to_owned() } else { states.join("; ") }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const EVENT: &str = "0190f0e4-58a6-7c3e-9d6e-1f2a3b4c5d6e";

    fn order() -> pb::EventTimeline {
        pb::EventTimeline {
            event_id: EVENT.into(),
            order: Some(pb::OrderRecord { order_id: 7, ..Default::default() }),
            outbox: Some(pb::OutboxRecord { status: "PUBLISHED".into(), ..Default::default() }),
            ..Default::default()
        }
    }

    fn job(consumer_name: &str) -> pb::NotificationJobRecord {
        pb::NotificationJobRecord { consumer_name: consumer_name.into(), order_id: 7, ..Default::default() }
    }

    fn consumed(names: &[&str]) -> pb::ConsumerTimeline {
        pb::ConsumerTimeline {
            event_id: EVENT.into(),
            consumers: names
                .iter()
                .map(|n| pb::ConsumerRecord { consumer_name: (*n).into(), consumed_at: None })
                .collect(),
            notification_jobs: names.iter().map(|n| job(n)).collect(),
            dead_letters: Vec::new(),
        }
    }

    #[test]
    fn both_sides_make_one_timeline() {
        let joined = timeline(Some(order()), Some(consumed(&["a", "b"]))).unwrap();
        assert_eq!(joined.event_id, EVENT);
        assert_eq!(joined.order.unwrap().order_id, 7);
        assert_eq!(joined.outbox.unwrap().status, "PUBLISHED");
        assert_eq!(joined.consumers.len(), 2);
        assert_eq!(joined.notification_jobs.len(), 2);
        assert_eq!(joined.notification_job, Some(job("a")), "the first job, for one-consumer clients");
    }

    #[test]
    fn an_order_nobody_consumed_yet_has_no_consumer_parts() {
        let joined = timeline(Some(order()), Some(consumed(&[]))).unwrap();
        assert!(joined.consumers.is_empty() && joined.notification_job.is_none());
        assert_eq!(
            timeline(Some(order()), None).unwrap(),
            joined,
            "an unreachable consumer side looks the same"
        );
    }

    #[test]
    fn the_consumer_side_alone_still_shows_the_event() {
        let dead = pb::ConsumerTimeline {
            dead_letters: vec![pb::DeadLetterRecord { error: "undecodable".into(), ..Default::default() }],
            ..consumed(&[])
        };
        let joined = timeline(None, Some(dead)).unwrap();
        assert_eq!(joined.event_id, EVENT);
        assert!(joined.order.is_none() && joined.outbox.is_none());
        assert_eq!(joined.dead_letters.len(), 1);
    }

    #[test]
    fn an_event_neither_side_knows_is_no_timeline() {
        assert_eq!(timeline(None, None), None);
        assert_eq!(timeline(None, Some(consumed(&[]))), None);
    }

    #[test]
    fn each_event_of_an_order_says_whether_each_consumer_applied_parked_or_dead_lettered_it() {
        let parked = [pb::ParkedEventRecord {
            consumer_name: "b".into(),
            event_id: EVENT.into(),
            reason: "waits for version 2".into(),
            ..Default::default()
        }];
        let dead = pb::ConsumerTimeline {
            dead_letters: vec![pb::DeadLetterRecord { consumer_name: "c".into(), ..Default::default() }],
            ..consumed(&["a", "b"])
        };

        assert_eq!(consumer_state(&consumed(&["a"]), &parked), "applied by a");
        assert_eq!(
            consumer_state(&dead, &parked),
            "dead-lettered by c; applied by a; parked by b: waits for version 2"
        );
        assert_eq!(consumer_state(&consumed(&[]), &[]), "not consumed yet");
    }
}
