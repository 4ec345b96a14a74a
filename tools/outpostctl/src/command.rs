//! The commands, each one AdminService call.

use std::time::Duration;

use outpost::client::{self, BearerToken, ClientTls};
use outpost::proto::v1::{self as pb, admin_service_client::AdminServiceClient};
use tonic_types::StatusExt as _;

use crate::render;

/// Inspects and operates an Outpost deployment through its AdminService.
#[derive(Debug, clap::Parser)]
#[command(name = "outpostctl", version)]
pub(crate) struct Cli {
    /// The order service's admin endpoint.
    #[arg(long, env = "OUTPOST_ADMIN_URL", default_value = "http://127.0.0.1:50054", global = true)]
    admin_url: String,
    /// PEM CA that signed the admin listener's certificate; use an https:// --admin-url with it.
    #[arg(long, env = "OUTPOST_CA_FILE", global = true)]
    ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate, when the listener requires mutual TLS (with --client-key).
    #[arg(long, env = "OUTPOST_CLIENT_CERT", global = true, requires = "client_key")]
    client_cert: Option<std::path::PathBuf>,
    /// PEM key of --client-cert.
    #[arg(long, env = "OUTPOST_CLIENT_KEY", global = true, requires = "client_cert")]
    client_key: Option<std::path::PathBuf>,
    /// File holding the bearer token (a JWT with the operator scope); else OUTPOST_TOKEN is used.
    #[arg(long, env = "OUTPOST_TOKEN_FILE", global = true)]
    token_file: Option<std::path::PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Everything known about one event: order, outbox row, consumers, job, dead letters.
    Timeline {
        /// The event id.
        event_id: String,
    },
    /// The timeline of the order accepted under a tenant's request id.
    Find {
        /// The tenant id.
        tenant_id: i64,
        /// The caller's idempotency key.
        request_id: String,
    },
    /// Outbox rows in one status, oldest first, and counts per status.
    Backlog {
        /// PENDING, PUBLISHING, PUBLISHED or FAILED.
        #[arg(long, default_value = "PENDING")]
        status: String,
        /// Only rows at least this old, such as "5m".
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Option<Duration>,
        /// At most this many rows (1 to 1000).
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Return a FAILED event to PENDING; who and why are recorded on the row.
    Redrive {
        /// The event id.
        event_id: String,
        /// Why it may be published again now.
        #[arg(long)]
        reason: String,
        /// Who asks. With a token the server records the token's subject and keeps this only as
        /// a note in the reason.
        #[arg(long, env = "USER", default_value = "operator")]
        by: String,
    },
    /// Delete PUBLISHED outbox rows and consumed_event rows past their retention.
    Purge {
        /// Override the server's outbox window, such as "7days".
        #[arg(long, value_parser = humantime::parse_duration)]
        outbox_older_than: Option<Duration>,
        /// Override the server's consumed_event window; never below the redelivery horizon.
        #[arg(long, value_parser = humantime::parse_duration)]
        consumed_older_than: Option<Duration>,
        /// Count only; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// A call that did not succeed, as one line for people.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CtlError {
    #[error(transparent)]
    Connect(#[from] outpost::client::ClientError),
    #[error("{}", describe(.0))]
    Call(#[from] tonic::Status),
    #[error("{0} is too long")]
    Duration(String),
}

fn describe(status: &tonic::Status) -> String {
    let mut line = format!("{:?}: {}", status.code(), status.message());
    if let Some(info) = status.get_details_error_info() {
        line.push_str(&format!(" [{}]", info.reason));
    }
    if let Some(bad) = status.get_details_bad_request() {
        for v in bad.field_violations {
            line.push_str(&format!("\n  {}: {}", v.field, v.description));
        }
    }
    line
}

fn duration(flag: &str, value: Option<Duration>) -> Result<Option<prost_types::Duration>, CtlError> {
    value
        .map(|d| prost_types::Duration::try_from(d).map_err(|_| CtlError::Duration(flag.to_owned())))
        .transpose()
}

/// Runs the command and returns what to print.
pub(crate) async fn run(cli: &Cli) -> Result<String, CtlError> {
    let tls = ClientTls {
        ca_file: cli.ca_file.clone(),
        identity: cli.client_cert.clone().zip(cli.client_key.clone()),
    };
    let channel = client::connect(&cli.admin_url, &tls).await?;
    let token = BearerToken::from_file_or_env(cli.token_file.as_deref(), "OUTPOST_TOKEN")?;
    let mut admin = AdminServiceClient::with_interceptor(channel, move |mut request: tonic::Request<()>| {
        if let Some(token) = &token {
            token.apply(&mut request);
        }
        Ok(request)
    });
    let json = cli.json;
    Ok(match &cli.command {
        Command::Timeline { event_id } => {
            let reply = admin
                .get_event_timeline(pb::GetEventTimelineRequest { event_id: event_id.clone() })
                .await?
                .into_inner();
            render::timeline(reply.timeline.unwrap_or_default(), json)
        }
        Command::Find { tenant_id, request_id } => {
            let reply = admin
                .find_by_business_key(pb::FindByBusinessKeyRequest {
                    tenant_id: *tenant_id,
                    request_id: request_id.clone(),
                })
                .await?
                .into_inner();
            render::timeline(reply.timeline.unwrap_or_default(), json)
        }
        Command::Backlog { status, older_than, limit } => {
            let reply = admin
                .list_backlog(pb::ListBacklogRequest {
                    status: status.clone(),
                    older_than: duration("--older-than", *older_than)?,
                    limit: *limit,
                })
                .await?
                .into_inner();
            render::backlog(reply, json)
        }
        Command::Redrive { event_id, reason, by } => {
            let reply = admin
                .redrive(pb::RedriveRequest {
                    event_id: event_id.clone(),
                    requested_by: by.clone(),
                    reason: reason.clone(),
                })
                .await?
                .into_inner();
            render::redriven(event_id, reply.outbox.unwrap_or_default(), json)
        }
        Command::Purge { outbox_older_than, consumed_older_than, dry_run } => {
            let reply = admin
                .purge(pb::PurgeRequest {
                    outbox_older_than: duration("--outbox-older-than", *outbox_older_than)?,
                    consumed_older_than: duration("--consumed-older-than", *consumed_older_than)?,
                    dry_run: *dry_run,
                })
                .await?
                .into_inner();
            render::purged(reply, *dry_run, json)
        }
    })
}
