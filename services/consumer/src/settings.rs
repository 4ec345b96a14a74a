use std::net::SocketAddr;
use std::time::Duration;

use rdkafka::ClientConfig;

use super::retention::DedupRetention;
use idempost::db::DatabaseSettings;
use idempost::kafka::KafkaSettings;

/// The consumer name (dedup identity) unless configured otherwise.
pub const DEFAULT_CONSUMER_NAME: &str = "notification-planner";

const DAY: u64 = 24 * 3600;

/// The consumer's settings, from flags or the environment (flags win).
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "idempost-consumer",
    version,
    about = "Idempost consumer: one notification job per OrderAccepted event",
    mut_args(shared_settings)
)]
pub struct Settings {
    /// The consumer's own database (`--database-url`, or `--database-url-file`).
    #[command(flatten)]
    pub(crate) database: DatabaseSettings,

    /// Most database connections the consumer holds.
    #[arg(long, env = "IDEMPOST_DB_MAX_CONNECTIONS", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) db_max_connections: u32,

    /// The brokers, the topic and the consumer's pass-through options.
    #[command(flatten)]
    pub kafka: KafkaSettings,

    /// The dedup identity: `consumed_event.consumer_name`. Two consumers with different names
    /// each handle every event once.
    #[arg(long, env = "IDEMPOST_CONSUMER_NAME", default_value = DEFAULT_CONSUMER_NAME)]
    pub consumer_name: String,

    /// Kafka consumer group; defaults to the consumer name.
    #[arg(long, env = "IDEMPOST_CONSUMER_GROUP")]
    pub group_id: Option<String>,

    /// How this instance is a member of its group. `static`: the group knows it by
    /// `group.instance.id` (the consumer name and the instance name), so an instance that
    /// restarts under its name, even after SIGKILL, takes its own partitions back at once.
    /// `dynamic`: every start is a new member, and a dead one holds its partitions until the
    /// broker drops it after its session timeout; Tansu 0.6 can keep them assigned to it even
    /// then, so a dynamic consumer that sees partitions it does not hold stand still for its
    /// session timeout and 10 s leaves the group and joins it again. `auto`: static under the
    /// instance's stable name (`--instance-name`, or a fixed `--listen` port), or else under
    /// the lowest numbered slot of the group that no live instance holds (`slot-0`, `slot-1`,
    /// ...; taken through the instance lock in the database, so a restart takes its dead
    /// predecessor's slot); dynamic on an in-memory SQLite database, which nothing can share a
    /// lock through, or with a `session.timeout.ms` under 10 s, too short for a static join on
    /// Tansu 0.6.
    #[arg(long, env = "IDEMPOST_CONSUMER_MEMBERSHIP", value_enum, default_value_t = Membership::Auto)]
    pub membership: Membership,

    /// This instance's name among the group's instances: the same across its restarts, and
    /// different from every other instance's (under Kubernetes, the StatefulSet pod name, such as
    /// `notification-planner-0`, which a restarted pod keeps). Default: `<host name>-<listen
    /// port>`, which two consumers on one host cannot share. With `--listen` port 0 there is no
    /// such default: `--membership static` then needs this name, and `auto` takes a slot. A
    /// second live instance under the same name stops at start-up (exit status 1, naming it).
    #[arg(long, env = "IDEMPOST_CONSUMER_INSTANCE_NAME")]
    pub instance_name: Option<String>,

    /// Most records handled in one transaction: those already fetched, never waiting for more.
    #[arg(long, env = "IDEMPOST_CONSUMER_BATCH_SIZE", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub(crate) batch_size: u16,

    /// Longest wait between retries of a record whose handling failed.
    #[arg(long, env = "IDEMPOST_CONSUMER_BACKOFF_MAX", default_value = "30s", value_parser = humantime::parse_duration)]
    pub backoff_max: Duration,

    /// How long the record in hand may take to finish after SIGTERM.
    #[arg(long, env = "IDEMPOST_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,

    /// Address of the gRPC listener: health, and the operators' ConsumerAdminService (keep it on
    /// an operators' network). Port 0 picks a free port.
    #[arg(long, env = "IDEMPOST_CONSUMER_LISTEN", default_value = "127.0.0.1:50053")]
    pub listen: SocketAddr,

    /// Address of the Prometheus `/metrics` listener (HTTP/1.1; TLS, plaintext policy and
    /// connection bounds as the gRPC listeners); port 0 picks a free port. Off when unset.
    #[arg(long, env = "IDEMPOST_CONSUMER_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Once every listener is bound, the service writes `name=address` lines to this file, one
    /// per listener (`listen`, and `metrics-listen` when set), through a temporary file renamed into place: how whoever
    /// started it on port 0 learns which ports it got.
    #[arg(long, env = "IDEMPOST_PORT_FILE")]
    pub(crate) port_file: Option<std::path::PathBuf>,

    /// consumed_event rows are deleted this long after their effect committed; never shorter
    /// than the redelivery horizon.
    #[arg(long, env = "IDEMPOST_CONSUMED_RETENTION", default_value = "30days", value_parser = humantime::parse_duration)]
    pub consumed_retention: Duration,

    /// The longest a record can be delivered again after it was consumed: the topic's retention
    /// plus the window for manual replays. The dedup history is kept at least this long.
    #[arg(long, env = "IDEMPOST_REDELIVERY_HORIZON", default_value = "14days", value_parser = humantime::parse_duration)]
    pub redelivery_horizon: Duration,

    /// How often the consumer purges its dedup history on its own; "0s" leaves purging to
    /// `idempostctl purge`.
    #[arg(long, env = "IDEMPOST_PURGE_EVERY", default_value = "1h", value_parser = humantime::parse_duration)]
    pub purge_every: Duration,

    /// Rows deleted per purge statement.
    #[arg(long, env = "IDEMPOST_PURGE_BATCH_SIZE", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub purge_batch_size: u64,

    /// TLS, plaintext policy and load bounds of the listener.
    #[command(flatten)]
    pub security: idempost::security::ListenerSettings,

    /// Who may call the ConsumerAdminService: the same flags as the order service's; every call
    /// needs the operator scope. Health is never authenticated.
    #[command(flatten)]
    pub auth: idempost::security::AuthSettings,
}

impl Settings {
    /// These settings with the database URL and the Kafka options file read, when they were
    /// given as files.
    pub(crate) fn with_secrets_read(mut self) -> Result<Self, idempost::secret::SecretError> {
        self.database.read_url_file()?;
        self.kafka.read_option_file()?;
        Ok(self)
    }

    /// Settings for `database_url` and `brokers` with every other value at its default and an
    /// OS-chosen port, except that callers are not authenticated (`--auth none`): loopback only,
    /// for tests and embedding.
    pub fn new(database_url: impl Into<String>, brokers: impl Into<String>) -> Self {
        Self {
            database: DatabaseSettings::new(database_url),
            db_max_connections: 4,
            kafka: KafkaSettings::new(brokers),
            consumer_name: DEFAULT_CONSUMER_NAME.to_owned(),
            group_id: None,
            membership: Membership::Auto,
            instance_name: None,
            batch_size: 64,
            backoff_max: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_listen: None,
            port_file: None,
            consumed_retention: Duration::from_secs(30 * DAY),
            redelivery_horizon: Duration::from_secs(14 * DAY),
            purge_every: Duration::from_secs(3600),
            purge_batch_size: 500,
            security: idempost::security::ListenerSettings::default(),
            auth: idempost::security::AuthSettings::none(),
        }
    }

    /// The dedup history's retention policy.
    pub(crate) fn retention(&self) -> DedupRetention {
        DedupRetention {
            consumed: self.consumed_retention,
            redelivery_horizon: self.redelivery_horizon,
            batch_size: self.purge_batch_size,
        }
    }

    /// The consumer group: `group_id`, or the consumer name.
    pub(crate) fn group(&self) -> &str {
        self.group_id.as_deref().unwrap_or(&self.consumer_name)
    }

    /// This instance's name when it is a static member, `None` when it is dynamic: the
    /// configured name, or `<host name>-<listen port>` for a fixed port. Never a name made from
    /// a port picked at start: every start would be a new member, and the old one would hold its
    /// partitions until the broker drops it (`check` refuses `static` without a stable name).
    pub(crate) fn static_instance_name(&self) -> Option<String> {
        match (self.membership, &self.instance_name) {
            (Membership::Dynamic, _) => None,
            (_, Some(name)) => Some(name.clone()),
            (_, None) if self.listen.port() == 0 => None,
            (_, None) => {
                Some(format!("{}-{}", gethostname::gethostname().to_string_lossy(), self.listen.port()))
            }
        }
    }

    /// The static membership id, `<consumer name>.<instance name>` in the characters Kafka
    /// allows; `None` for a dynamic member.
    pub(crate) fn group_instance_id(&self) -> Option<String> {
        self.static_instance_name().map(|instance| self.instance_id(&instance))
    }

    /// The static membership id of instance `instance` of this consumer.
    pub(crate) fn instance_id(&self, instance: &str) -> String {
        format!("{}.{instance}", self.consumer_name)
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
            .take(GROUP_INSTANCE_ID_MAX_CHARS)
            .collect()
    }

    /// The group session timeout this consumer asks for: `session.timeout.ms` as librdkafka
    /// reads it from the options (its default, 45 s, when none is given).
    pub(crate) fn session_timeout(&self) -> Duration {
        let ms = self
            .kafka_config()
            .ok()
            .and_then(|config| config.create_native_config().ok())
            .and_then(|native| native.get("session.timeout.ms").ok())
            .and_then(|value| value.parse().ok())
            .unwrap_or(45_000);
        Duration::from_millis(ms)
    }

    /// Whether this instance names itself after the lowest free slot of its group (`slot-<n>`,
    /// held through its instance lock): `auto` membership without a stable name of its own, and
    /// a session timeout a static member can join within (see [`STATIC_SESSION_MIN`]).
    pub(crate) fn takes_a_slot(&self) -> bool {
        self.membership == Membership::Auto
            && self.static_instance_name().is_none()
            && self.session_timeout() >= STATIC_SESSION_MIN
    }

    /// Refuses settings that would break a guarantee at run time: a consumer name its columns
    /// cannot hold, and librdkafka options that would acknowledge records before their local
    /// commit, skip records, or leave committed work uncommitted.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.membership == Membership::Static && self.static_instance_name().is_none() {
            return Err("--membership static needs a stable instance name: give --instance-name (under \
                        Kubernetes, the StatefulSet pod name) or a fixed --listen port; port 0 is picked \
                        anew at every start"
                .into());
        }
        let name_chars = self.consumer_name.chars().count();
        if name_chars == 0 || name_chars > CONSUMER_NAME_MAX_CHARS {
            return Err(format!(
                "--consumer-name must have 1 to {CONSUMER_NAME_MAX_CHARS} characters (the consumed_event, \
                 notification_job and dead_letter columns hold {CONSUMER_NAME_MAX_CHARS}); it has {name_chars}"
            ));
        }
        self.kafka_config().map(|_| ())
    }

    /// The librdkafka consumer configuration: Idempost's settings, then the pass-through options,
    /// checked by the values librdkafka itself reads from them (so `FALSE`, `0` or an alias
    /// cannot slip past).
    pub(crate) fn kafka_config(&self) -> Result<ClientConfig, String> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.kafka.brokers)
            .set("group.id", self.group())
            // Offsets are stored by hand after the local commit; only stored offsets are committed.
            .set("enable.auto.offset.store", "false")
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            // A new group starts at the beginning: events published before it existed still count.
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false");
        if let Some(id) = self.group_instance_id() {
            config.set("group.instance.id", id);
        }
        for (key, value) in &self.kafka.options {
            if let Some(setting) = OWN_SETTINGS.iter().find(|(k, _)| k == key).map(|(_, s)| s) {
                return Err(format!("kafka option {key} is a setting of its own: use {setting}"));
            }
            config.set(key, value);
        }
        let native = config.create_native_config().map_err(|e| format!("kafka options: {e}"))?;
        let effective = |key: &str| native.get(key).map_err(|e| format!("kafka option {key}: {e}"));
        if effective("enable.auto.offset.store")? != "false" {
            return Err("kafka option enable.auto.offset.store must stay false: offsets are stored only \
                        after the local commit"
                .into());
        }
        if effective("enable.auto.commit")? != "true" {
            return Err("kafka option enable.auto.commit must stay true: it is what commits the offsets \
                        stored after each local commit (the consumer has no other periodic commit); tune \
                        auto.commit.interval.ms instead"
                .into());
        }
        if effective("enable.partition.eof")? != "false" {
            return Err("kafka option enable.partition.eof must stay false: the consumer reads an \
                        end-of-partition event as a failed receive"
                .into());
        }
        // librdkafka reads earliest, smallest and beginning alike and shows them as `smallest`.
        let reset = effective("auto.offset.reset")?;
        if reset != "smallest" {
            return Err(format!(
                "kafka option auto.offset.reset must be earliest (librdkafka reads it as {reset}): for a \
                 new group or an offset out of range, latest would skip records and error would stall \
                 the partition"
            ));
        }
        Ok(config)
    }
}

/// The shared database and Kafka settings with help that says what each is to the consumer (one
/// paragraph without a full stop, as clap shows a doc comment's). Applied in place, so the
/// settings keep their order in `--help` and on the configuration page.
fn shared_settings(arg: clap::Arg) -> clap::Arg {
    match arg.get_id().as_str() {
        "database_url" => arg.help(
            "The consumer's own database: mysql://, postgres:// or sqlite:// URL. A URL with a password \
             belongs in `--database-url-file`: flags show in `ps`",
        ),
        "topic" => arg.help("Topic to consume"),
        "kafka_options" => arg.help(
            "librdkafka consumer options passed through as KEY=VALUE (SASL, TLS, session timeouts, ...): repeat \
             the flag, one option each (a value may contain commas); in the environment variable, one option \
             per line. Options that would break a guarantee are refused",
        ),
        _ => arg,
    }
}

/// The most characters of a consumer name: the width of the columns that store it.
pub(crate) const CONSUMER_NAME_MAX_CHARS: usize = 128;

/// The longest `group.instance.id` Kafka accepts.
const GROUP_INSTANCE_ID_MAX_CHARS: usize = 249;

/// The shortest session timeout under which an unnamed `auto` instance takes a slot (a static
/// membership): Tansu 0.6 pauses every static join and every static sync for 3 s, and a static
/// member with a 6 s session never got its partitions in our tests. Below it, such an instance
/// stays a dynamic member, as a short session asks for a dead member to go quickly.
const STATIC_SESSION_MIN: Duration = Duration::from_secs(10);

/// librdkafka options Idempost sets from settings of its own, which name them instead.
const OWN_SETTINGS: [(&str, &str); 3] = [
    ("bootstrap.servers", "--brokers"),
    ("group.id", "--group-id"),
    ("group.instance.id", "--membership and --instance-name"),
];

/// How a consumer instance is a member of its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Membership {
    /// Static when the instance has a stable name, dynamic otherwise.
    Auto,
    /// Known by `group.instance.id` across restarts.
    Static,
    /// A new member at every start.
    Dynamic,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::Parser as _;

    use super::*;

    fn with_options(options: &[(&str, &str)]) -> Settings {
        let mut settings = Settings::new("sqlite::memory:", "127.0.0.1:9092");
        settings.kafka.options = options.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        settings
    }

    #[test]
    fn the_defaults_pass() {
        assert_eq!(with_options(&[]).check(), Ok(()));
    }

    #[test]
    fn harmless_options_pass_through() {
        let settings = with_options(&[
            ("session.timeout.ms", "6000"),
            ("auto.offset.reset", "beginning"),
            ("enable.auto.commit", "TRUE"),
            ("enable.partition.eof", "0"),
        ]);
        assert_eq!(settings.check(), Ok(()));
    }

    #[test]
    fn a_consumer_name_longer_than_its_column_is_refused() {
        let mut settings = with_options(&[]);
        settings.consumer_name = "n".repeat(CONSUMER_NAME_MAX_CHARS);
        assert_eq!(settings.check(), Ok(()));
        settings.consumer_name = "é".repeat(CONSUMER_NAME_MAX_CHARS + 1);
        assert!(settings.check().unwrap_err().contains("--consumer-name must have 1 to 128"));
        settings.consumer_name = String::new();
        assert!(settings.check().is_err());
    }

    #[test]
    fn options_that_break_a_guarantee_are_refused_however_spelled() {
        for (key, value, says) in [
            ("enable.auto.offset.store", "1", "enable.auto.offset.store must stay false"),
            ("enable.auto.offset.store", "True", "enable.auto.offset.store must stay false"),
            ("enable.auto.commit", "false", "enable.auto.commit must stay true"),
            ("enable.auto.commit", "F", "enable.auto.commit must stay true"),
            ("enable.partition.eof", "true", "enable.partition.eof must stay false"),
            ("auto.offset.reset", "latest", "auto.offset.reset must be earliest"),
            ("auto.offset.reset", "largest", "auto.offset.reset must be earliest"),
            ("auto.offset.reset", "end", "auto.offset.reset must be earliest"),
            ("auto.offset.reset", "error", "auto.offset.reset must be earliest"),
            ("group.id", "other", "use --group-id"),
            ("no.such.option", "1", "kafka options"),
        ] {
            let refused = with_options(&[(key, value)]).check().unwrap_err();
            assert!(refused.contains(says), "{key}={value}: {refused}");
        }
    }

    #[test]
    fn the_static_membership_id_is_stable_per_instance_and_kafka_safe() {
        let mut settings = with_options(&[]);
        settings.membership = Membership::Static;
        settings.instance_name = Some("pod/0 ü".to_owned());
        assert_eq!(settings.group_instance_id().as_deref(), Some("notification-planner.pod_0__"));
        settings.instance_name = None;
        settings.listen.set_port(50053);
        let by_port = settings.group_instance_id().unwrap();
        assert!(by_port.starts_with("notification-planner.") && by_port.ends_with("-50053"), "{by_port}");
        assert_eq!(settings.group_instance_id(), Some(by_port.clone()), "stable across restarts");
        settings.listen.set_port(50054);
        assert_ne!(settings.group_instance_id(), Some(by_port), "two ports, two instances");
        settings.consumer_name = "n".repeat(CONSUMER_NAME_MAX_CHARS);
        settings.instance_name = Some("i".repeat(300));
        assert_eq!(settings.group_instance_id().unwrap().len(), GROUP_INSTANCE_ID_MAX_CHARS);
        settings.membership = Membership::Dynamic;
        assert_eq!(settings.group_instance_id(), None);
        // auto: static only with a stable name.
        settings.membership = Membership::Auto;
        assert!(settings.group_instance_id().is_some(), "named");
        settings.instance_name = None;
        settings.listen.set_port(0);
        assert_eq!(settings.group_instance_id(), None, "port 0 picks a new port at every start");
        settings.listen.set_port(50053);
        assert!(settings.group_instance_id().unwrap().ends_with("-50053"), "a fixed port names it");
        let refused = with_options(&[("group.instance.id", "x")]).check().unwrap_err();
        assert!(refused.contains("--instance-name"), "{refused}");
    }

    #[test]
    fn an_unnamed_auto_instance_takes_a_slot_unless_its_session_is_too_short_for_a_static_join() {
        let mut settings = with_options(&[]);
        settings.listen.set_port(0);
        assert_eq!(settings.session_timeout(), Duration::from_secs(45), "librdkafka's default");
        assert!(settings.takes_a_slot());
        let mut short = with_options(&[("session.timeout.ms", "6000")]);
        short.listen.set_port(0);
        assert!(!short.takes_a_slot(), "6 s is too short for a static join on Tansu");
        settings.instance_name = Some("pod-0".to_owned());
        assert!(!settings.takes_a_slot(), "a name of its own");
        settings.instance_name = None;
        settings.membership = Membership::Dynamic;
        assert!(!settings.takes_a_slot(), "dynamic asked for");
    }

    #[test]
    fn static_membership_without_a_stable_name_is_refused_rather_than_named_after_a_random_port() {
        let mut settings = with_options(&[]);
        settings.membership = Membership::Static;
        assert_eq!(settings.listen.port(), 0);
        let refused = settings.check().unwrap_err();
        assert!(refused.contains("--membership static needs a stable instance name"), "{refused}");
        settings.instance_name = Some("notification-planner-0".to_owned());
        assert_eq!(settings.check(), Ok(()));
    }

    #[test]
    fn an_option_value_may_contain_commas_and_the_flag_repeats() {
        let settings = Settings::try_parse_from([
            "idempost-consumer",
            "--database-url=sqlite::memory:",
            "--kafka-option",
            "ssl.cipher.suites=ECDHE-RSA-AES128-GCM-SHA256,ECDHE-RSA-AES256-GCM-SHA384",
            "--kafka-option=session.timeout.ms=6000",
        ])
        .unwrap();
        assert_eq!(
            settings.kafka.options,
            [
                (
                    "ssl.cipher.suites".to_owned(),
                    "ECDHE-RSA-AES128-GCM-SHA256,ECDHE-RSA-AES256-GCM-SHA384".to_owned()
                ),
                ("session.timeout.ms".to_owned(), "6000".to_owned()),
            ]
        );
    }
}
