//! `spawn_app` for the relay: [`TestRelay`] runs one in this process, with test-sized timings
//! ([`relay_settings`]) or the same settings as a process's flags ([`relay_args`]).

use std::time::Duration;

use idempost_relay::{Application, Settings};

use crate::in_process::InProcess;

/// Short, test-sized timings over the outbox at `database_url` that still satisfy the relay's
/// start-up check.
pub fn relay_settings(database_url: &str, brokers: &str, topic: &str) -> Settings {
    let mut settings = Settings::new(database_url, brokers);
    settings.kafka.topic = topic.to_owned();
    settings.lease = Duration::from_secs(9);
    settings.delivery_timeout = Duration::from_secs(3);
    settings.lease_margin = Duration::from_secs(1);
    settings.backoff_base = Duration::from_millis(100);
    settings.backoff_max = Duration::from_millis(500);
    settings.max_idle_poll = Duration::from_millis(100);
    settings
}

/// The relay's defaults over the outbox at `database_url`, but for `topic` and an idle poll of
/// 100 ms, so that a test's first events do not wait a whole default poll.
pub fn relay_defaults(database_url: &str, brokers: &str, topic: &str) -> Settings {
    let mut settings = Settings::new(database_url, brokers);
    settings.kafka.topic = topic.to_owned();
    settings.max_idle_poll = Duration::from_millis(100);
    settings
}

/// The same settings as command-line flags for a relay process.
pub fn relay_args(settings: &Settings) -> Vec<String> {
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    vec![
        format!("--database-url={}", settings.database.url),
        format!("--brokers={}", settings.kafka.brokers),
        format!("--topic={}", settings.kafka.topic),
        format!("--lease={}", ms(settings.lease)),
        format!("--delivery-timeout={}", ms(settings.delivery_timeout)),
        format!("--lease-margin={}", ms(settings.lease_margin)),
        format!("--backoff-base={}", ms(settings.backoff_base)),
        format!("--backoff-max={}", ms(settings.backoff_max)),
        format!("--max-idle-poll={}", ms(settings.max_idle_poll)),
        format!("--max-attempts={}", settings.max_attempts),
        "--listen=127.0.0.1:0".to_owned(),
    ]
}

/// A relay running in this process until stopped or dropped, with its health port.
#[derive(Debug)]
pub struct TestRelay {
    pub port: u16,
    service: InProcess,
}

impl TestRelay {
    pub async fn spawn(settings: Settings) -> Self {
        let app = Application::build(settings).await.unwrap();
        let port = app.port();
        Self { port, service: InProcess::spawn(|shutdown| app.run_until_stopped(shutdown)) }
    }

    /// Stops the relay as SIGTERM would, and waits until it has.
    pub async fn stop(self) {
        self.service.stop().await;
    }
}
