//! One order waiting in the group-commit queue.

use tokio::sync::oneshot;

use crate::accepting::{Accepting, SubmitError, Submitted};

/// One order waiting for a writer, with the caller's span and where its answer goes.
#[derive(Debug)]
pub(super) struct Job {
    pub(super) accepting: Accepting,
    /// The caller's `order transaction` span: the order's own work is traced in it.
    pub(super) span: tracing::Span,
    /// Taken when the order is answered.
    pub(super) reply: Option<oneshot::Sender<Result<Submitted, SubmitError>>>,
}
