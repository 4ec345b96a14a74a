//! The commands: each calls the order side's AdminService, the consumer's
//! ConsumerAdminService, or both and joins their answers; `amend` and `cancel` call the
//! OrderService with the safe caller protocol.

use std::time::Duration;

use idempost_client::{BearerToken, ClientTls, SafeSubmitError, SafeSubmitter, SubmitPolicy};
use idempost_proto::v1::{
    self as pb, admin_service_client::AdminServiceClient,
    consumer_admin_service_client::ConsumerAdminServiceClient,
};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic_types::StatusExt as _;

use crate::shown::shown;
use crate::wait::WaitArgs;
use crate::{audit, console, join, render, replay, wait};

/// Inspects and operates an Idempost deployment through the order service's AdminService and the
/// consumer's ConsumerAdminService.
#[derive(Debug, clap::Parser)]
#[command(name = "idempostctl", version)]
pub(crate) struct Cli {
    /// The order service's admin endpoint. Without a scheme: https:// when a token or a CA file
    /// is configured, http:// otherwise. A token is sent in plaintext (http://) only to a
    /// loopback address; any other host is refused.
    #[arg(long, env = "IDEMPOST_ADMIN_URL", default_value = "127.0.0.1:50054", global = true)]
    admin_url: String,
    /// The order service's OrderService endpoint (its `--listen`), for `amend` and `cancel`.
    /// Schemes as for --admin-url.
    #[arg(long, env = "IDEMPOST_ORDER_URL", default_value = "127.0.0.1:50051", global = true)]
    order_url: String,
    /// The consumer's endpoint (its `--listen`): its records of each event, its dead letters and
    /// its dedup history's purge. Schemes as for --admin-url.
    #[arg(long, env = "IDEMPOST_CONSUMER_ADMIN_URL", default_value = "127.0.0.1:50053", global = true)]
    consumer_admin_url: String,
    /// PEM CA that signed the listeners' certificates; the URLs must be https:// with it.
    #[arg(long, env = "IDEMPOST_CA_FILE", global = true)]
    ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate, when the listener requires mutual TLS (with --client-key).
    #[arg(long, env = "IDEMPOST_CLIENT_CERT", global = true, requires = "client_key")]
    client_cert: Option<std::path::PathBuf>,
    /// PEM key of --client-cert.
    #[arg(long, env = "IDEMPOST_CLIENT_KEY", global = true, requires = "client_cert")]
    client_key: Option<std::path::PathBuf>,
    /// File holding the bearer token (a JWT with the operator scope); else IDEMPOST_TOKEN is used.
    #[arg(long, env = "IDEMPOST_TOKEN_FILE", global = true)]
    token_file: Option<std::path::PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Everything known about one event: order and outbox row from the order side, consumers,
    /// jobs and dead letters from the consumer side, joined.
    Timeline {
        /// The event id.
        event_id: String,
        #[command(flatten)]
        versions: VersionsArgs,
    },
    /// The timeline of the event committed under a tenant's request id (an order's acceptance,
    /// amendment or cancellation).
    Find {
        /// The tenant id.
        tenant_id: i64,
        /// The caller's idempotency key.
        request_id: String,
    },
    /// Outbox rows in one status, oldest first, and the counts of rows that still need something.
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
        /// The shard to list (its name in the order service's shard map); the default shard when
        /// unset.
        #[arg(long, default_value = "")]
        shard: String,
        #[command(flatten)]
        page: PageArgs,
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
    /// The consumer's dead letters, oldest first.
    DeadLetters {
        /// Only this consumer name's.
        #[arg(long, default_value = "")]
        consumer_name: String,
        /// At most this many (1 to 1000).
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Amend an order (OrderService.AmendOrder) with the safe caller protocol: replace its lines
    /// and/or its customer if it is still at --expected-version. Running the same command again
    /// (same --request-id) is a replay, never a second change.
    Amend {
        #[command(flatten)]
        change: ChangeArgs,
        /// A new line as SKU:QUANTITY:UNIT_PRICE_MINOR; repeatable. Given lines replace all lines.
        #[arg(long = "line", value_parser = parse_line)]
        lines: Vec<pb::LineItem>,
        /// The new customer id.
        #[arg(long, default_value = "")]
        customer_id: String,
    },
    /// Cancel an order (OrderService.CancelOrder) with the safe caller protocol, if it is still
    /// at --expected-version.
    Cancel {
        #[command(flatten)]
        change: ChangeArgs,
        /// Why.
        #[arg(long, value_enum)]
        reason: CancelReasonArg,
        /// Free text, up to 512 characters.
        #[arg(long, default_value = "")]
        note: String,
    },
    /// The consumer's parked events: recorded but not applied to its read model yet, each
    /// waiting behind a missing earlier version of its order or of a type it does not know.
    Parked {
        /// Only this order's.
        #[arg(long)]
        order_id: Option<i64>,
        /// At most this many (1 to 1000).
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Go on where an earlier listing stopped: the token it printed.
        #[arg(long, default_value = "")]
        page_token: String,
    },
    /// Give up an order's missing versions in the consumer's read model and apply what waits
    /// behind them, in version order; the token's subject and the reason are recorded.
    ReleaseGap {
        /// The order.
        order_id: i64,
        /// Why the missing versions may be given up.
        #[arg(long)]
        reason: String,
    },
    /// Delete PUBLISHED outbox rows (order side) and consumed_event rows (consumer side) past
    /// their retention.
    Purge {
        /// Override the order service's outbox window, such as "7days".
        #[arg(long, value_parser = humantime::parse_duration)]
        outbox_older_than: Option<Duration>,
        /// Override the consumer's consumed_event window; never below its redelivery horizon.
        #[arg(long, value_parser = humantime::parse_duration)]
        consumed_older_than: Option<Duration>,
        /// Count only; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Why these rows may go: recorded in both sides' audit (required, for a dry run too).
        #[arg(long)]
        reason: String,
    },
    /// The audit of operators' writes, newest first: the order side's (redrive, purge, replay)
    /// or, with --consumer, the consumer's (release-gap, its purge). Who, what, why, when, the
    /// call's trace id and what came of it.
    Audit(audit::AuditArgs),
    /// Publish PUBLISHED events again, for a consumer that must see them again (a new consumer
    /// name): by order, creation time and event type. Event ids stay, so consumers that applied
    /// an event absorb the copy as a duplicate; one order's events go out in version order.
    /// Operators only; audited with --reason. Run it with --dry-run first: at most 1000 events
    /// per call.
    Replay(replay::ReplayArgs),
    /// The console in a browser: backlog, timelines, dead letters, redrive and purge. Listens on
    /// loopback, prints the URL to open, and calls the services with this command's flags and
    /// token until Ctrl-C.
    Console(console::ConsoleArgs),
    /// Wait until an event is published (--published) or consumed by a named consumer
    /// (--consumed --consumer), for scripts and integration tests. Exit code 0 when it is, 3 when
    /// --timeout passed first, 4 when it was set aside (FAILED, dead-lettered or parked).
    Wait(WaitArgs),
}

/// Which page of a listing, and whether with payloads.
#[derive(Debug, clap::Args)]
struct PageArgs {
    /// Include each row's payload (base64, in --json output only).
    #[arg(long)]
    payloads: bool,
    /// Go on where an earlier listing stopped: the token it printed.
    #[arg(long, default_value = "")]
    page_token: String,
}

/// Which of the order's versions a timeline shows: without these flags, the latest 100 the
/// timeline carries.
#[derive(Debug, clap::Args)]
struct VersionsArgs {
    /// Show at most this many of the order's versions (1 to 1000).
    #[arg(long)]
    limit: Option<u32>,
    /// Show the versions below this one: the value a timeline prints for its older versions.
    #[arg(long)]
    before_version: Option<i64>,
}

impl VersionsArgs {
    /// The ListOrderEvents request, when a page other than the timeline's own is asked for.
    fn request(&self, order_id: i64) -> Option<pb::ListOrderEventsRequest> {
        if self.limit.is_none() && self.before_version.is_none() {
            return None;
        }
        Some(pb::ListOrderEventsRequest {
            order_id,
            before_version: self.before_version.unwrap_or(0),
            limit: self.limit.unwrap_or(0),
        })
    }
}

/// What every change names: whose order, which one, at which version, under which key.
#[derive(Debug, clap::Args)]
struct ChangeArgs {
    /// The tenant (0: the token's).
    tenant_id: i64,
    /// The order to change.
    order_id: i64,
    /// The version read before deciding on the change (see `find` / `timeline`).
    #[arg(long)]
    expected_version: i64,
    /// The idempotency key of this change, unique within the tenant: reuse it to retry.
    #[arg(long)]
    request_id: String,
    /// The event id to commit with the change (a canonical lower-case UUID); made if absent.
    #[arg(long, default_value = "")]
    event_id: String,
}

impl ChangeArgs {
    /// The AmendOrder request for this change: `lines` (when given) replace all lines,
    /// `customer_id` (when not empty) the customer.
    fn amend(&self, lines: &[pb::LineItem], customer_id: &str) -> pb::AmendOrderRequest {
        pb::AmendOrderRequest {
            tenant_id: self.tenant_id,
            request_id: self.request_id.clone(),
            order_id: self.order_id,
            expected_version: self.expected_version,
            line_items: lines.to_vec(),
            customer_id: customer_id.to_owned(),
            event_id: self.event_id.clone(),
        }
    }

    /// The CancelOrder request for this change.
    fn cancel(&self, reason: CancelReasonArg, note: &str) -> pb::CancelOrderRequest {
        pb::CancelOrderRequest {
            tenant_id: self.tenant_id,
            request_id: self.request_id.clone(),
            order_id: self.order_id,
            expected_version: self.expected_version,
            reason: pb::CancelReason::from(reason).into(),
            note: note.to_owned(),
            event_id: self.event_id.clone(),
        }
    }
}

/// `--reason` of `cancel`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum CancelReasonArg {
    CustomerRequest,
    OutOfStock,
    PaymentFailed,
    FraudSuspected,
    Other,
}

impl From<CancelReasonArg> for pb::CancelReason {
    fn from(reason: CancelReasonArg) -> Self {
        match reason {
            CancelReasonArg::CustomerRequest => Self::CustomerRequest,
            CancelReasonArg::OutOfStock => Self::OutOfStock,
            CancelReasonArg::PaymentFailed => Self::PaymentFailed,
            CancelReasonArg::FraudSuspected => Self::FraudSuspected,
            CancelReasonArg::Other => Self::Other,
        }
    }
}

/// `SKU:QUANTITY:UNIT_PRICE_MINOR`; the server checks the values.
fn parse_line(text: &str) -> Result<pb::LineItem, String> {
    let mut parts = text.rsplitn(3, ':');
    let (Some(price), Some(quantity), Some(sku)) = (parts.next(), parts.next(), parts.next()) else {
        return Err("expected SKU:QUANTITY:UNIT_PRICE_MINOR".to_owned());
    };
    Ok(pb::LineItem {
        sku: sku.to_owned(),
        quantity: quantity.parse().map_err(|_| format!("quantity {quantity:?} is not a number"))?,
        unit_price_minor: price.parse().map_err(|_| format!("unit price {price:?} is not a number"))?,
    })
}

/// A call that did not succeed, as one line for people.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CtlError {
    #[error("{setting}: {source}")]
    Connect { setting: &'static str, source: idempost_client::ClientError },
    #[error("{}", describe(.0))]
    Call(#[from] tonic::Status),
    #[error("{0} is too long")]
    Duration(String),
    #[error(transparent)]
    Console(#[from] console::ConsoleError),
    #[error("the order side answered, the consumer side did not: {error}\n{done}")]
    ConsumerSide { done: String, error: Box<CtlError> },
    #[error("{}", describe_change(.0))]
    Change(#[from] SafeSubmitError),
    #[error(transparent)]
    Wait(#[from] wait::WaitEnded),
}

/// A wait that did not reach its goal: a failed call is reported as every command reports one
/// (exit code 1); the wait's own ends keep their exit codes.
impl From<idempost_client::AwaitError> for CtlError {
    fn from(error: idempost_client::AwaitError) -> Self {
        match error {
            idempost_client::AwaitError::Call(status) => Self::Call(status),
            error => Self::Wait(error.into()),
        }
    }
}

impl CtlError {
    /// The process's exit code: `wait`'s own codes, 1 for every other failure.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::Wait(ended) => ended.exit_code(),
            _ => 1,
        }
    }
}

fn describe_change(error: &SafeSubmitError) -> String {
    match error {
        SafeSubmitError::Rejected(status) => {
            let mut line = format!("refused, nothing written: {}", describe(status));
            if let Some(version) =
                status.get_details_error_info().and_then(|info| info.metadata.get("current_version").cloned())
            {
                line.push_str(&format!(" (current version {version})"));
            }
            line
        }
        SafeSubmitError::GaveUp { calls, event_id, last } => format!(
            "gave up after {calls} calls; the change may have committed: run the same command again (same \
             --request-id, --event-id {event_id}). Last error: {}",
            describe(last)
        ),
    }
}

fn describe(status: &tonic::Status) -> String {
    let mut line = format!("{:?}: {}", status.code(), shown(status.message()));
    if let Some(info) = status.get_details_error_info() {
        line.push_str(&format!(" [{}]", shown(&info.reason)));
    }
    if let Some(bad) = status.get_details_bad_request() {
        for v in bad.field_violations {
            line.push_str(&format!("\n  {}: {}", shown(&v.field), shown(&v.description)));
        }
    }
    line
}

fn duration(flag: &str, value: Option<Duration>) -> Result<Option<prost_types::Duration>, CtlError> {
    value
        .map(|d| prost_types::Duration::try_from(d).map_err(|_| CtlError::Duration(flag.to_owned())))
        .transpose()
}

/// The settings naming the two endpoints, as errors name them.
pub(crate) const ADMIN_URL: &str = "--admin-url (IDEMPOST_ADMIN_URL)";
pub(crate) const CONSUMER_ADMIN_URL: &str = "--consumer-admin-url (IDEMPOST_CONSUMER_ADMIN_URL)";
const ORDER_URL: &str = "--order-url (IDEMPOST_ORDER_URL)";

type Authorized = InterceptedService<
    Channel,
    Box<dyn Fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Send + Sync>,
>;

/// Runs the command and returns what to print.
pub(crate) async fn run(cli: &Cli) -> Result<String, CtlError> {
    let json = cli.json;
    Ok(match &cli.command {
        Command::Console(args) => console(cli, args).await?,
        Command::Wait(args) => {
            let (setting, url) = match args.side() {
                wait::Side::Order => (ADMIN_URL, cli.admin_url.as_str()),
                wait::Side::Consumer => (CONSUMER_ADMIN_URL, cli.consumer_admin_url.as_str()),
            };
            let (channel, token) = cli.channel(setting, url).await?;
            wait::wait(&idempost_client::AdminEndpoint::new(channel, token), args, json).await?
        }
        Command::Timeline { event_id, versions } => timeline(cli, event_id, versions).await?,
        Command::Find { tenant_id, request_id } => {
            let mut client = cli.admin().await?;
            let request =
                pb::FindByBusinessKeyRequest { tenant_id: *tenant_id, request_id: request_id.clone() };
            let reply = client.find_by_business_key(request).await?.into_inner();
            let order = reply.timeline.unwrap_or_default();
            joined(cli, &order.event_id.clone(), Some(order), None).await?
        }
        Command::Backlog { status, older_than, limit, shard, page } => {
            let mut client = cli.admin().await?;
            let request = pb::ListBacklogRequest {
                status: status.clone(),
                older_than: duration("--older-than", *older_than)?,
                limit: *limit,
                include_payloads: page.payloads,
                page_token: page.page_token.clone(),
                shard: shard.clone(),
            };
            let reply = client.list_backlog(request).await?.into_inner();
            render::backlog(reply, json)
        }
        Command::Redrive { event_id, reason, by } => {
            let mut client = cli.admin().await?;
            let request = pb::RedriveRequest {
                event_id: event_id.clone(),
                requested_by: by.clone(),
                reason: reason.clone(),
            };
            let reply = client.redrive(request).await?.into_inner();
            render::redriven(event_id, reply.outbox.unwrap_or_default(), json)
        }
        Command::DeadLetters { consumer_name, limit, page } => {
            let mut client = cli.consumer_admin().await?;
            let request = pb::ListDeadLettersRequest {
                consumer_name: consumer_name.clone(),
                limit: *limit,
                include_payloads: page.payloads,
                page_token: page.page_token.clone(),
            };
            let reply = client.list_dead_letters(request).await?.into_inner();
            render::dead_letters(&reply, json)
        }
        Command::Amend { change, lines, customer_id } => {
            let request = change.amend(lines, customer_id);
            render::changed("amended", &cli.submitter().await?.amend(request).await?, json)
        }
        Command::Cancel { change, reason, note } => {
            let request = change.cancel(*reason, note);
            render::changed("cancelled", &cli.submitter().await?.cancel(request).await?, json)
        }
        Command::Parked { order_id, limit, page_token } => {
            let mut client = cli.consumer_admin().await?;
            let request = pb::ListParkedEventsRequest {
                order_id: order_id.unwrap_or(0),
                limit: *limit,
                page_token: page_token.clone(),
            };
            let reply = client.list_parked_events(request).await?.into_inner();
            render::parked(&reply, json)
        }
        Command::ReleaseGap { order_id, reason } => {
            let mut client = cli.consumer_admin().await?;
            let request = pb::ReleaseParkedGapRequest { order_id: *order_id, reason: reason.clone() };
            let reply = client.release_parked_gap(request).await?.into_inner();
            render::released(*order_id, &reply, json)
        }
        Command::Replay(args) => {
            let reply = cli.admin().await?.replay(args.request()).await?.into_inner();
            replay::render(&reply, json)
        }
        Command::Purge { outbox_older_than, consumed_older_than, dry_run, reason } => {
            purge(cli, *outbox_older_than, *consumed_older_than, *dry_run, reason).await?
        }
        Command::Audit(args) => {
            let reply = if args.consumer() {
                let ask = pb::ConsumerAdminServiceListAuditRequest::from(args.request());
                cli.consumer_admin().await?.list_audit(ask).await?.into_inner().into()
            } else {
                cli.admin().await?.list_audit(args.request()).await?.into_inner()
            };
            audit::render(&reply, json)
        }
    })
}

/// `console`: serves the web console until stopped, calling both admin services with the
/// configured TLS and token. Refuses at start, not at the first call, a URL the token would
/// travel to in plaintext. Prints nothing.
async fn console(cli: &Cli, args: &console::ConsoleArgs) -> Result<String, CtlError> {
    let (tls, token) = (cli.tls(), cli.token()?);
    // Refused at start, not at the first call, when the token would travel in plaintext.
    let url = |setting, url| {
        idempost_client::token_url(url, &tls, token.as_ref())
            .map_err(|source| CtlError::Connect { setting, source })
    };
    let admin_url = url(ADMIN_URL, &cli.admin_url)?;
    let consumer_url = url(CONSUMER_ADMIN_URL, &cli.consumer_admin_url)?;
    let admin = console::Upstream::new(&admin_url, tls.clone(), token.clone());
    let consumer = console::Upstream::new(&consumer_url, tls, token);
    console::serve(args, admin, consumer).await?;
    Ok(String::new())
}

/// `timeline`: the order side's timeline of `event_id` joined to the consumer side's, with the
/// page of the order's versions `versions` asks for. An event the order side does not know is
/// still looked up on the consumer side.
async fn timeline(cli: &Cli, event_id: &str, versions: &VersionsArgs) -> Result<String, CtlError> {
    let mut admin = cli.admin().await?;
    let order = admin.get_event_timeline(pb::GetEventTimelineRequest { event_id: event_id.to_owned() });
    let mut order = match order.await {
        Ok(reply) => reply.into_inner().timeline,
        // The consumer may still know it (or say the id is unknown there too).
        Err(status) if status.code() == tonic::Code::NotFound => None,
        Err(status) => return Err(status.into()),
    };
    let mut older = None;
    let page = order.as_ref().and_then(|t| t.order.as_ref()).and_then(|o| versions.request(o.order_id));
    if let (Some(request), Some(timeline)) = (page, order.as_mut()) {
        let page = admin.list_order_events(request).await?.into_inner();
        timeline.order_events = page.order_events;
        timeline.order_events_total = page.total;
        older = Some(page.next_before_version);
    }
    joined(cli, event_id, order, older).await
}

/// `purge`: the order side's outbox purge, then the consumer's dedup history purge. When the
/// consumer side fails after the order side purged, the error carries what the order side did.
async fn purge(
    cli: &Cli,
    outbox_older_than: Option<Duration>,
    consumed_older_than: Option<Duration>,
    dry_run: bool,
    reason: &str,
) -> Result<String, CtlError> {
    let outbox = cli
        .admin()
        .await?
        .purge(pb::PurgeRequest {
            outbox_older_than: duration("--outbox-older-than", outbox_older_than)?,
            dry_run,
            reason: reason.to_owned(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let consumed_older_than = duration("--consumed-older-than", consumed_older_than)?;
    let consumed = async {
        let request = pb::PurgeConsumedRequest { consumed_older_than, dry_run, reason: reason.to_owned() };
        Ok::<_, CtlError>(cli.consumer_admin().await?.purge_consumed(request).await?.into_inner())
    };
    match consumed.await {
        Ok(consumed) => Ok(render::purged(&outbox, Some(&consumed), dry_run, cli.json)),
        Err(error) => Err(CtlError::ConsumerSide {
            done: render::purged(&outbox, None, dry_run, cli.json),
            error: Box::new(error),
        }),
    }
}

/// The consumer side's part of `event_id` joined to the order side's `order`. When the consumer
/// cannot be asked, the order side is shown alone, saying so. `older` is where the order's older
/// versions start when a page of them was asked for (0: none older); otherwise the timeline's
/// own versions are the latest ones.
async fn joined(
    cli: &Cli,
    event_id: &str,
    order: Option<pb::EventTimeline>,
    older: Option<i64>,
) -> Result<String, CtlError> {
    let consumer = async {
        let request = pb::GetConsumerTimelineRequest { event_id: event_id.to_owned() };
        Ok::<_, CtlError>(cli.consumer_admin().await?.get_consumer_timeline(request).await?.into_inner())
    };
    let (consumer, unavailable) = match consumer.await {
        Ok(reply) => (reply.timeline, None),
        Err(error) if order.is_some() => (None, Some(error.to_string())),
        Err(error) => return Err(error),
    };
    let Some(timeline) = join::timeline(order, consumer) else {
        return Err(tonic::Status::not_found(format!(
            "neither the order side nor the consumer side knows event {event_id} [EVENT_NOT_FOUND]"
        ))
        .into());
    };
    let states = match unavailable {
        Some(_) => Vec::new(),
        None => version_states(cli, &timeline)
            .await
            .unwrap_or_else(|error| vec![format!("unknown: {error}"); timeline.order_events.len()]),
    };
    let older = older.unwrap_or_else(|| render::older_than_shown(&timeline));
    Ok(render::timeline(timeline, &states, unavailable.as_deref(), older, cli.json))
}

/// The consumer side's state of each event in `timeline.order_events` (a page of the order's
/// versions), in that order; empty when the consumer cannot be asked (the event's own timeline
/// already says so). One GetConsumerTimeline per version and one ListParkedEvents of the order.
async fn version_states(cli: &Cli, timeline: &pb::EventTimeline) -> Result<Vec<String>, CtlError> {
    let Some(order_id) = timeline.order.as_ref().map(|o| o.order_id) else { return Ok(Vec::new()) };
    if timeline.order_events.is_empty() {
        return Ok(Vec::new());
    }
    let mut consumer = cli.consumer_admin().await?;
    let parked = pb::ListParkedEventsRequest { order_id, limit: 1000, ..Default::default() };
    let parked = consumer.list_parked_events(parked).await?.into_inner().parked_events;
    let mut states = Vec::with_capacity(timeline.order_events.len());
    for event in &timeline.order_events {
        let request = pb::GetConsumerTimelineRequest { event_id: event.event_id.clone() };
        let records =
            consumer.get_consumer_timeline(request).await?.into_inner().timeline.unwrap_or_default();
        states.push(join::consumer_state(&records, &parked));
    }
    Ok(states)
}

impl Cli {
    fn tls(&self) -> ClientTls {
        ClientTls {
            ca_file: self.ca_file.clone(),
            identity: self.client_cert.clone().zip(self.client_key.clone()),
        }
    }

    /// The bearer token, if one is configured.
    fn token(&self) -> Result<Option<BearerToken>, CtlError> {
        BearerToken::from_file_or_env(self.token_file.as_deref(), "IDEMPOST_TOKEN").map_err(|source| {
            CtlError::Connect { setting: "--token-file (IDEMPOST_TOKEN_FILE, IDEMPOST_TOKEN)", source }
        })
    }

    /// A channel to `url`, the value of `setting`, and the token to send on it: the token is
    /// read first, so that it never travels in plaintext to another host.
    pub(crate) async fn channel(
        &self,
        setting: &'static str,
        url: &str,
    ) -> Result<(Channel, Option<BearerToken>), CtlError> {
        let token = self.token()?;
        let channel = idempost_client::connect_with_token(url, &self.tls(), token.as_ref())
            .await
            .map_err(|source| CtlError::Connect { setting, source })?;
        Ok((channel, token))
    }

    /// A client of the order service's AdminService.
    async fn admin(&self) -> Result<AdminServiceClient<Authorized>, CtlError> {
        let (channel, token) = self.channel(ADMIN_URL, &self.admin_url).await?;
        Ok(AdminServiceClient::new(InterceptedService::new(channel, bearer(token))))
    }

    /// The safe caller protocol over the OrderService, with the token if there is one.
    async fn submitter(&self) -> Result<SafeSubmitter, CtlError> {
        let token = self.token()?;
        SafeSubmitter::connect(&self.order_url, &self.tls(), token, SubmitPolicy::default())
            .await
            .map_err(|source| CtlError::Connect { setting: ORDER_URL, source })
    }

    /// A client of the consumer's ConsumerAdminService.
    async fn consumer_admin(&self) -> Result<ConsumerAdminServiceClient<Authorized>, CtlError> {
        let (channel, token) = self.channel(CONSUMER_ADMIN_URL, &self.consumer_admin_url).await?;
        Ok(ConsumerAdminServiceClient::new(InterceptedService::new(channel, bearer(token))))
    }
}

/// Puts the bearer token, if any, on every request.
#[allow(clippy::type_complexity)]
fn bearer(
    token: Option<BearerToken>,
) -> Box<dyn Fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Send + Sync> {
    Box::new(move |mut request| {
        if let Some(token) = &token {
            token.apply(&mut request);
        }
        Ok(request)
    })
}
