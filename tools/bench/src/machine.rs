//! What the figures were measured on.

use sea_orm::DatabaseConnection;

use crate::plan::Plan;

fn first_line(path: &str, prefix: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()?.lines().find_map(|l| {
        l.strip_prefix(prefix).map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
    })
}

/// The machine, the database server and the run's shape, as `(name, value)` lines.
pub(crate) async fn describe(db: &DatabaseConnection, plan: &Plan) -> Vec<(String, String)> {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let memory = first_line("/proc/meminfo", "MemTotal")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or_else(String::new, |kib| format!("{:.1} GiB", kib as f64 / 1024.0 / 1024.0));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
    vec![
        (
            "cpus".into(),
            format!("{cpus} x {}", first_line("/proc/cpuinfo", "model name").unwrap_or_default()),
        ),
        ("memory".into(), memory),
        ("kernel".into(), kernel),
        (
            "database".into(),
            format!("{} ({})", crate::sql::version(db).await, db.get_database_backend().as_str()),
        ),
        ("database log".into(), crate::sql::log_settings(db).await),
        ("database cleanup".into(), crate::sql::cleanup_settings(db).await),
        ("broker".into(), plan.brokers.clone()),
        ("librdkafka".into(), rdkafka::util::get_rdkafka_version().1),
        ("backlog".into(), plan.backlog.to_string()),
        ("topic partitions".into(), plan.partitions.to_string()),
        ("point / e2e / trickle".into(), format!("{:?} / {:?} / {:?}", plan.point, plan.e2e, plan.trickle)),
        ("load average at start".into(), format!("{:.2}", crate::observe::load_average())),
    ]
}
