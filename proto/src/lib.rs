//! Idempost's gRPC contracts, generated from `proto/idempost/v1` at build time: the one crate the
//! services, the Rust client and the tools share for the wire types. Beside the generated code,
//! the hand-written parts of the contract both sides need: the error domain, the event id's one
//! text form, and the one way text from the other side is escaped before it is shown.

mod audit;
mod event_id;
mod text;

pub use event_id::EventId;
pub use text::escape_for_log;

/// Package `idempost.v1`: messages, the `OrderService`, `AdminService` and `ConsumerAdminService`
/// clients and servers.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("idempost.v1");
}

/// The encoded descriptors of every Idempost `.proto` file, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("idempost_descriptor");

/// `google.rpc.ErrorInfo.domain` of every error status the services answer with (the protos'
/// package), so callers can tell Idempost's reasons from a proxy's.
pub const ERROR_DOMAIN: &str = "idempost.v1";
