//! What a refused call's status says, as the rich error model carries it.

use tonic_types::StatusExt;

/// The `ErrorInfo.reason` of a status, and its metadata value for `key`.
pub fn reason(status: &tonic::Status) -> String {
    status.get_details_error_info().map(|info| info.reason).unwrap_or_default()
}

pub fn metadata(status: &tonic::Status, key: &str) -> Option<String> {
    status.get_details_error_info().and_then(|info| info.metadata.get(key).cloned())
}

/// The fields a status's BadRequest details name.
pub fn violated_fields(status: &tonic::Status) -> Vec<String> {
    status
        .get_details_bad_request()
        .map(|bad| bad.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default()
}
