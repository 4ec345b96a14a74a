//! The CloudEvents structured mode: a record whose value is the JSON envelope, the protobuf
//! payload in its `data_base64`. Unwrapped here, so that the rest of decoding sees the payload as
//! in binary mode.

use base64::prelude::{BASE64_STANDARD, Engine as _};

use idempost::contract::{CLOUDEVENTS_JSON, CLOUDEVENTS_SPEC_VERSION, CONTENT_TYPE};

/// Whether a record's `content-type` says its value is a structured-mode envelope: the media type
/// before any parameter, in any case, as the Kafka protocol binding reads it.
pub(super) fn is_structured(content_type: Option<&str>) -> bool {
    let media_type = |text: &str| text.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    content_type.is_some_and(|given| media_type(given) == media_type(CLOUDEVENTS_JSON))
}

/// What an envelope says of its event.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Unwrapped {
    /// The envelope's `id`, which must be the payload's event id.
    pub(super) id: String,
    /// The envelope's `type`: the payload's protobuf message name.
    pub(super) event_type: String,
    /// The payload, from `data_base64`.
    pub(super) payload: Vec<u8>,
}

/// The JSON event format's members the consumer reads; any other member (an extension such as
/// `traceparent`) is ignored, as the format allows.
#[derive(serde::Deserialize)]
struct Envelope {
    specversion: String,
    id: String,
    source: String,
    #[serde(rename = "type")]
    event_type: String,
    datacontenttype: Option<String>,
    data_base64: Option<String>,
    data: Option<serde_json::Value>,
}

/// The event inside `value`, or why the envelope is not one this consumer can apply.
pub(super) fn unwrap(value: &[u8]) -> Result<Unwrapped, String> {
    let envelope: Envelope =
        serde_json::from_slice(value).map_err(|e| format!("not a CloudEvents JSON envelope: {e}"))?;
    if envelope.specversion != CLOUDEVENTS_SPEC_VERSION {
        return Err(format!(
            "CloudEvents specversion `{}` is not {CLOUDEVENTS_SPEC_VERSION}",
            envelope.specversion
        ));
    }
    if envelope.id.is_empty() || envelope.source.is_empty() || envelope.event_type.is_empty() {
        return Err("the CloudEvents envelope has an empty id, source or type".to_owned());
    }
    if let Some(other) = envelope.datacontenttype.as_deref().filter(|given| *given != CONTENT_TYPE) {
        return Err(format!("the CloudEvents envelope's datacontenttype `{other}` is not {CONTENT_TYPE}"));
    }
    let encoded = match (envelope.data_base64, envelope.data) {
        (Some(encoded), None) => encoded,
        (None, Some(_)) => {
            return Err("the CloudEvents envelope carries `data`, not the protobuf payload in `data_base64`"
                .to_owned());
        }
        (Some(_), Some(_)) => {
            return Err("the CloudEvents envelope carries both `data` and `data_base64`".to_owned());
        }
        (None, None) => return Err("the CloudEvents envelope has no data_base64".to_owned()),
    };
    let payload = BASE64_STANDARD
        .decode(encoded)
        .map_err(|e| format!("the CloudEvents envelope's data_base64 is not base64: {e}"))?;
    Ok(Unwrapped { id: envelope.id, event_type: envelope.event_type, payload })
}
