//! Logs, traces and metrics for every service.
//!
//! Logs go to stderr (text, or JSON with `IDEMPOST_LOG_FORMAT=json`). Traces and metrics leave over
//! OTLP/gRPC only when the standard variables ask for it (`OTEL_EXPORTER_OTLP_ENDPOINT`, or the
//! per-signal `…_TRACES_ENDPOINT` / `…_METRICS_ENDPOINT`); `OTEL_SERVICE_NAME`,
//! `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*` and `OTEL_METRIC_EXPORT_INTERVAL` work as everywhere else.
//! Without an endpoint nothing is exported and nothing is said about it. A service started with
//! `--metrics-listen` also keeps the same instruments for Prometheus to scrape ([`exposition`]).
//!
//! Context crosses both hops in W3C trace-context form: the order service stores the SubmitOrder
//! context in the outbox row, the relay continues it and puts `traceparent` in the Kafka headers,
//! and the consumer continues that. One event, one trace.

mod context;
pub mod exposition;
mod metrics;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{MetricExporter, SpanExporter};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::{EnvFilter, Layer, filter::Targets, fmt, prelude::*};

pub use context::{
    TraceHeaders, context_from, current_trace_id, follow, grpc_context, inject_into, record_trace_id,
    trace_id_of,
};
pub use metrics::{metrics, start_at_zero};

/// The most bytes of free text from elsewhere (a caller's field, an operator's reason, a record's
/// header, a broker's or a database's error) one log field or span attribute holds.
pub const TEXT_BOUND: usize = 512;

/// Free text from elsewhere as a log field or span attribute holds it: control characters escaped
/// and at most [`TEXT_BOUND`] bytes ([`idempost_proto::escape_for_log`]), so that a caller cannot
/// forge log lines, move an operator's terminal, or make one record megabytes long.
pub fn logged(text: &str) -> String {
    idempost_proto::escape_for_log(text, TEXT_BOUND)
}

/// The exporters of one process; [`Telemetry::shutdown`] flushes what they still hold.
#[derive(Debug, Default)]
pub struct Telemetry {
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
}

impl Telemetry {
    /// Exports what is still buffered and stops the exporters. Call it before the process exits.
    pub fn shutdown(self) {
        if let Some(provider) = self.tracer_provider {
            let _ = provider.force_flush();
            let _ = provider.shutdown();
        }
        if let Some(provider) = self.meter_provider {
            let _ = provider.force_flush();
            let _ = provider.shutdown();
        }
    }
}

fn configured(signal: &str) -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set(&format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")))
}

/// Installs logging, and tracing and metrics export where configured, for `service_name`
/// (`OTEL_SERVICE_NAME` wins when set). `RUST_LOG` filters the logs (default `info`).
pub fn init(service_name: &'static str) -> Telemetry {
    init_scraped(service_name, false)
}

/// [`init`], and when `scraped` (the service serves `/metrics`) a Prometheus reader beside the
/// OTLP exporter, on the same meter provider.
pub fn init_scraped(service_name: &'static str, scraped: bool) -> Telemetry {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let resource = if std::env::var_os("OTEL_SERVICE_NAME").is_some() {
        Resource::builder().build()
    } else {
        Resource::builder().with_service_name(service_name).build()
    };

    let tracer_provider = configured("TRACES")
        .then(|| SpanExporter::builder().with_tonic().build().ok())
        .flatten()
        .map(|exporter| {
            SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.clone()).build()
        });
    let otlp = configured("METRICS").then(|| MetricExporter::builder().with_tonic().build().ok()).flatten();
    let prometheus = scraped.then(exposition::reader).flatten();
    // Without either reader the global no-op meter stays: recording costs nothing.
    let meter_provider = (otlp.is_some() || prometheus.is_some()).then(|| {
        let mut builder = SdkMeterProvider::builder().with_resource(resource);
        if let Some(exporter) = otlp {
            builder = builder.with_periodic_exporter(exporter);
        }
        if let Some(reader) = prometheus {
            builder = builder.with_reader(reader);
        }
        builder.build()
    });
    if let Some(provider) = &meter_provider {
        opentelemetry::global::set_meter_provider(provider.clone());
    }

    // Only Idempost's own spans are exported: the exporter's own gRPC client must not trace
    // itself into a loop.
    let otel = tracer_provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(service_name))
            .with_filter(Targets::new().with_target("idempost", tracing::Level::INFO))
    });
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("IDEMPOST_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let logs = if json {
        fmt::layer().json().with_current_span(true).with_span_list(false).with_writer(std::io::stderr).boxed()
    } else {
        fmt::layer().with_writer(std::io::stderr).boxed()
    };
    let _ = tracing_subscriber::registry().with(logs.with_filter(filter)).with(otel).try_init();
    Telemetry { tracer_provider, meter_provider }
}
