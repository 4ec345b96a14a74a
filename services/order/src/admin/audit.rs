//! Who an admin write is recorded as, for Redrive and Replay alike.

use idempost::backlog::RedriveAudit;
use idempost::security::Caller;

/// Who asks and why, as recorded: the token's subject when there is one (the request's
/// `requested_by`, when it differs, kept as a note in the reason), else `requested_by` as given.
pub(super) fn audit_of(caller: &Caller, requested_by: String, reason: String) -> RedriveAudit {
    match &caller.subject {
        None => RedriveAudit { requested_by, reason },
        Some(subject) => {
            let note = requested_by.trim();
            let reason = if note.is_empty() || note == subject {
                reason
            } else {
                format!("{reason} (requested_by note: {note})")
            };
            RedriveAudit { requested_by: subject.clone(), reason }
        }
    }
}
