//! The three services together: every order becomes exactly one notification job, through the
//! outbox, the relay, the topic and the consumer (the test kit's `Pipeline`).

use idempost_testkit::pipeline::Pipeline;
use idempost_testkit::wait::WAIT;

use crate::broker::TestBroker;
use crate::helpers::{Backend, assert_eventually, on_every_backend, order};

on_every_backend!(orders_flow_through_relay_and_consumer_into_exactly_one_notification_job_each);

async fn orders_flow_through_relay_and_consumer_into_exactly_one_notification_job_each(backend: Backend) {
    let broker = TestBroker::start().await;
    let topic = idempost_testkit::topic::unique("idempost-test");
    broker.create_topic(&topic, 3).await;
    let pipeline = Pipeline::spawn(backend, &broker.address(), &topic, "g1").await;
    let app = &pipeline.order;

    let mut accepted = Vec::new();
    for i in 0..10 {
        accepted.push(app.submit(order(7, &format!("req-{i}"))).await.unwrap());
    }
    assert_eventually("ten notification jobs exist", WAIT, || async {
        app.count("notification_job").await == 10
    })
    .await;

    for answer in &accepted {
        assert_eq!(app.rows_for_event("notification_job", &answer.event_id).await, 1);
        assert_eq!(app.rows_for_event("consumed_event", &answer.event_id).await, 1);
        let job_order = app
            .scalar_i64(&format!(
                "SELECT order_id FROM notification_job WHERE event_id = '{}'",
                answer.event_id
            ))
            .await;
        assert_eq!(job_order, answer.order_id);
    }
    pipeline.stop().await;
}
