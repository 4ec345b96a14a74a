//! The Prometheus text exposition of Idempost's instruments: a pull reader on the same meter
//! provider as the OTLP exporter, so both see exactly the same instruments and values.
//!
//! Names follow Prometheus conventions through the OpenTelemetry exporter: dots become
//! underscores, the unit becomes a suffix (`_seconds`), counters end in `_total`, and each
//! attribute becomes a label of the same name with underscores (`idempost_outbox_status`).

use std::sync::OnceLock;

use opentelemetry_prometheus::PrometheusExporter;
use prometheus::{Encoder as _, Registry, TextEncoder};

/// The registry the reader fills at each scrape; set once, by [`reader`].
static REGISTRY: OnceLock<Registry> = OnceLock::new();

/// The `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// A pull reader for the meter provider, or `None` if one was made already (a process has one
/// meter provider) or the exporter refused to build.
pub(super) fn reader() -> Option<PrometheusExporter> {
    let registry = Registry::new();
    // Scope labels (`otel_scope_name="idempost"` on every point) would only repeat the one meter.
    let exporter = opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .scope_info_enabled(false)
        .build()
        .ok()?;
    REGISTRY.set(registry).ok()?;
    Some(exporter)
}

/// Every instrument's current value in the text format, or `None` when this process was not
/// started with a metrics listener (no reader is collecting).
pub fn render() -> Option<Vec<u8>> {
    let families = REGISTRY.get()?.gather();
    let mut text = Vec::new();
    match TextEncoder::new().encode(&families, &mut text) {
        Ok(()) => Some(text),
        Err(e) => {
            tracing::warn!(error = %e, "the metrics could not be encoded");
            None
        }
    }
}
