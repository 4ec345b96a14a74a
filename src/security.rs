//! Who may call, and over what: TLS on every gRPC listener (plaintext only on loopback, or when
//! explicitly allowed), bearer-token callers whose tenant comes from their credentials,
//! operators recognised by scope, and a bounded load per listener.

mod admission;
mod auth;
mod connection;
mod listener;
mod refusals;
mod settings;
mod tls;

pub use auth::AuthConfigError;
pub use auth::{AuthError, Authenticator, Caller};
pub use connection::Connection;
pub use listener::Listener;
pub use listener::ListenerError;
pub use refusals::note_refusal;
pub use settings::{AuthMode, AuthSettings, ListenerSettings, SecuritySettings};
pub use tls::TlsError;
