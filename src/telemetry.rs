//! Logging set-up shared by every service.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Installs the global subscriber: `RUST_LOG` filters (default `info`), and
/// `OUTPOST_LOG_FORMAT=json` switches to one JSON object per line.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("OUTPOST_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let registry = tracing_subscriber::registry().with(filter);
    if json {
        registry.with(fmt::layer().json().with_current_span(true)).init();
    } else {
        registry.with(fmt::layer()).init();
    }
}
