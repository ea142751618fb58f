//! Request bodies decoded by serde, with the protocol's nesting bound
//! and its error codes (a field at fault is named).

// A ready answer is the error of the parsing helpers: it is returned once
// per request, so its size does not matter.
#![allow(clippy::result_large_err)]

use super::error;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::Response;
use hostwire_ggui::codes;
use hostwire_ggui::decode::MAX_FRAME_DEPTH;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The body as `T` (see [`decode`]); a body the server could not read is
/// answered with its status.
pub(super) fn body_as<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, Response> {
    let body = body.map_err(|r| {
        let status = r.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            codes::FRAME_TOO_LARGE
        } else {
            codes::INVALID_MESSAGE
        };
        error(status, code, format!("request body: {}", r.body_text()))
    })?;
    decode(&body).map_err(|(code, message)| error(StatusCode::BAD_REQUEST, code, message))
}

/// `bytes` as `T` (an empty body is `{}`), with the protocol's nesting
/// bound checked before parsing: text that is not JSON is `INVALID_JSON`,
/// JSON of another shape `INVALID_MESSAGE` naming the field at fault.
pub(super) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, (&'static str, String)> {
    // JSON text is UTF-8; checked whole, since fields a body type skips
    // would otherwise be skipped unchecked.
    let text = std::str::from_utf8(bytes).map_err(|e| {
        (
            codes::INVALID_JSON,
            format!(
                "request body is not JSON: not UTF-8 at byte {}",
                e.valid_up_to()
            ),
        )
    })?;
    let text = if text.trim_ascii().is_empty() {
        "{}"
    } else {
        text
    };
    if hostwire_core::json::deeper_than(text.as_bytes(), MAX_FRAME_DEPTH) {
        return Err((
            codes::INVALID_MESSAGE,
            format!("request body nests deeper than {MAX_FRAME_DEPTH} levels"),
        ));
    }
    let not_json = |e: &dyn std::fmt::Display| {
        (
            codes::INVALID_JSON,
            format!("request body is not JSON: {e}"),
        )
    };
    // A struct also reads from an array (by position): only an object is
    // a body.
    if !text.trim_ascii_start().starts_with('{') {
        return Err(match serde_json::from_str::<Value>(text) {
            Ok(_) => (
                codes::INVALID_MESSAGE,
                "request body must be a JSON object".into(),
            ),
            Err(e) => not_json(&e),
        });
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize::<_, T>(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let e = e.into_inner();
        if e.classify() != serde_json::error::Category::Data {
            return not_json(&e);
        }
        // A shape error found before the end of text that is not JSON at
        // all (`{}}`): the text is what is wrong. Only refused bodies pay
        // for this second pass.
        if let Err(syntax) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
            return not_json(&syntax);
        }
        let at = if path == "." {
            "request body".to_owned()
        } else {
            path
        };
        (codes::INVALID_MESSAGE, format!("{at}: {e}"))
    })?;
    de.end().map_err(|e| not_json(&e))?;
    Ok(value)
}

/// Decodes `bytes` as the body of the agent API's `route` (`create`,
/// `emit`, `props`, `drain` or `version`): `Err` is the refusal's code and
/// message. For fuzzing; the handlers decode the same way.
#[doc(hidden)]
pub fn decode_body(route: &str, bytes: &[u8]) -> Result<(), (&'static str, String)> {
    match route {
        "create" => decode::<CreateBody>(bytes).map(drop),
        "emit" => decode::<EmitBody>(bytes).map(drop),
        "props" => decode::<PropsBody>(bytes).map(drop),
        "drain" => decode::<DrainBody>(bytes).map(drop),
        _ => decode::<VersionBody>(bytes).map(drop),
    }
}

/// `PUT /ggui/sessions/{id}`'s body.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CreateBody {
    #[serde(default)]
    pub(super) app_id: Option<String>,
    #[serde(default)]
    pub(super) version_override: Option<String>,
    #[serde(default)]
    pub(super) action_spec: Option<Map<String, Value>>,
    #[serde(default)]
    pub(super) stream_spec: Option<Map<String, Value>>,
}

/// `POST /ggui/sessions/{id}/emit`'s body.
#[derive(Deserialize)]
pub(super) struct EmitBody {
    pub(super) channel: String,
    #[serde(default)]
    pub(super) mode: Option<String>,
    #[serde(default)]
    pub(super) complete: Option<bool>,
    pub(super) payload: Value,
}

/// `POST /ggui/sessions/{id}/props`'s body.
#[derive(Deserialize)]
pub(super) struct PropsBody {
    pub(super) props: Map<String, Value>,
    #[serde(default)]
    pub(super) epoch: Option<u64>,
}

/// An `actionId`: the ledger `seq`, as a number or as its string.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum ActionId {
    Number(u64),
    Text(String),
}

/// `POST /ggui/sessions/{id}/actions/drain`'s body.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct DrainBody {
    pub(super) up_to: ActionId,
}

/// `PUT /ggui/sessions/{id}/version`'s body (`null` clears).
#[derive(Deserialize)]
pub(super) struct VersionBody {
    #[serde(default)]
    pub(super) version: Option<String>,
}
