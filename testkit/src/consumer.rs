//! `spawn_app` for the consumer: [`TestConsumer`] runs one in this process, with settings that
//! let a dead group member go in seconds ([`consumer_settings`]).

use std::sync::Arc;
use std::time::Duration;

use idempost_consumer::{Application, ConsumerStats, Settings};

use crate::in_process::InProcess;

/// A consumer of `topic` in `group` writing to the database at `database_url`, with short
/// back-off and grace, and a session timeout of seconds.
pub fn consumer_settings(database_url: &str, brokers: &str, topic: &str, group: &str) -> Settings {
    let mut settings = Settings::new(database_url, brokers);
    settings.kafka.topic = topic.to_owned();
    settings.group_id = Some(group.to_owned());
    settings.backoff_max = Duration::from_millis(300);
    settings.shutdown_grace = Duration::from_secs(5);
    settings.kafka.options = fast_group_options();
    settings
}

/// A dead member leaves the group after seconds, not the default 45 s.
pub fn fast_group_options() -> Vec<(String, String)> {
    vec![("session.timeout.ms".into(), "6000".into()), ("heartbeat.interval.ms".into(), "500".into())]
}

/// A consumer running in this process until stopped or dropped, with its health port and its
/// counters.
#[derive(Debug)]
pub struct TestConsumer {
    pub port: u16,
    pub stats: Arc<ConsumerStats>,
    pub service: InProcess,
}

impl TestConsumer {
    pub async fn spawn(settings: Settings) -> Self {
        let app = Application::build(settings).await.unwrap();
        let (port, stats) = (app.port(), app.stats());
        Self { port, stats, service: InProcess::spawn(|shutdown| app.run_until_stopped(shutdown)) }
    }

    /// Stops the consumer as SIGTERM would, and waits until it has.
    pub async fn stop(self) {
        self.service.stop().await;
    }
}
