//! An in-process OTLP/gRPC receiver: the OpenTelemetry collector's own trace and metrics
//! services, served by tonic on port 0, keeping what the service processes export.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use tonic::{Request, Response, Status};

/// One exported span, flattened for assertions.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    pub kind: i32,
    pub start_unix_nano: u64,
    pub attributes: HashMap<String, String>,
    pub events: Vec<String>,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }

    pub fn has_event(&self, prefix: &str) -> bool {
        self.events.iter().any(|e| e.starts_with(prefix))
    }
}

/// One exported metric data point, flattened: a sum's or gauge's value, a histogram's count and sum.
#[derive(Debug, Clone)]
pub struct ReceivedPoint {
    pub service: String,
    pub name: String,
    pub value: f64,
    pub count: u64,
    pub attributes: HashMap<String, String>,
}

impl ReceivedPoint {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Received {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    points: Arc<Mutex<Vec<ReceivedPoint>>>,
}

impl Received {
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    pub fn points(&self) -> Vec<ReceivedPoint> {
        self.points.lock().unwrap().clone()
    }
}

/// Serves OTLP on a free port until dropped; returns the endpoint URL and what arrives.
pub async fn start_receiver() -> (String, Received, tokio::task::JoinHandle<()>) {
    let received = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(received.clone()))
        .add_service(MetricsServiceServer::new(received.clone()))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    let task = tokio::spawn(async move {
        server.await.unwrap();
    });
    (endpoint, received, task)
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

fn attributes(attributes: &[KeyValue]) -> HashMap<String, String> {
    attributes.iter().map(|kv| (kv.key.clone(), text(kv.value.as_ref()))).collect()
}

fn service_name(resource: Option<&opentelemetry_proto::tonic::resource::v1::Resource>) -> String {
    resource
        .map(|r| attributes(&r.attributes))
        .and_then(|a| a.get("service.name").cloned())
        .unwrap_or_default()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = service_name(resource_spans.resource.as_ref());
            for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
                spans.push(ReceivedSpan {
                    service: service.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    start_unix_nano: span.start_time_unix_nano,
                    attributes: attributes(&span.attributes),
                    events: span.events.into_iter().map(|e| e.name).collect(),
                });
            }
        }
        Ok(Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

#[tonic::async_trait]
impl MetricsService for Received {
    async fn export(
        &self,
        request: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        let mut points = self.points.lock().unwrap();
        for resource_metrics in request.into_inner().resource_metrics {
            let service = service_name(resource_metrics.resource.as_ref());
            for metric in resource_metrics.scope_metrics.into_iter().flat_map(|s| s.metrics) {
                let mut push = |value: f64, count: u64, labels: &[KeyValue]| {
                    points.push(ReceivedPoint {
                        service: service.clone(),
                        name: metric.name.clone(),
                        value,
                        count,
                        attributes: attributes(labels),
                    });
                };
                use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value as N;
                let number = |v: &Option<N>| match v {
                    Some(N::AsDouble(d)) => *d,
                    Some(N::AsInt(i)) => *i as f64,
                    None => 0.0,
                };
                match &metric.data {
                    Some(Data::Sum(sum)) => {
                        sum.data_points.iter().for_each(|p| push(number(&p.value), 1, &p.attributes))
                    }
                    Some(Data::Gauge(gauge)) => {
                        gauge.data_points.iter().for_each(|p| push(number(&p.value), 1, &p.attributes))
                    }
                    Some(Data::Histogram(h)) => {
                        h.data_points.iter().for_each(|p| push(p.sum.unwrap_or(0.0), p.count, &p.attributes))
                    }
                    _ => {}
                }
            }
        }
        Ok(Response::new(ExportMetricsServiceResponse { partial_success: None }))
    }
}
