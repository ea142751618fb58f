//! `PUT /api/rooms/:pin/bundle`: what a bundle must look like and the
//! `appName` the room shows for it.

use crate::manifest::extract_manifest_text;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// Why an uploaded bundle was refused (HTTP 400, with [`BundleError::message`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BundleError {
    /// The body is not JSON.
    InvalidJson,
    /// Not `{pluginHtml: string, set: object}`.
    WrongShape,
}

impl BundleError {
    pub const fn message(self) -> &'static str {
        match self {
            BundleError::InvalidJson => "Invalid JSON",
            BundleError::WrongShape => "Expected { pluginHtml: string, set: object }",
        }
    }
}

/// An accepted bundle: its text is stored and served as uploaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleUpload {
    /// The plugin's `appName`, for `GET /api/rooms/:pin`.
    pub app_name: Option<String>,
}

#[derive(Deserialize)]
struct WireBundle<'a> {
    #[serde(borrow, rename = "pluginHtml")]
    plugin_html: Option<&'a RawValue>,
    #[serde(borrow)]
    set: Option<&'a RawValue>,
}

/// The one field of a manifest the relay reads.
#[derive(Deserialize)]
struct ManifestName<'a> {
    #[serde(rename = "appName", borrow)]
    app_name: Option<&'a RawValue>,
}

/// Checks an uploaded bundle (already within `bundle_bytes`) and reads its
/// `appName` from the plugin's manifest data island, without validating the
/// rest of the manifest: a string as it is (empty is none), a number or a
/// boolean as text (JavaScript's `String(appName)`), anything else none.
pub fn parse_bundle(body: &[u8]) -> Result<BundleUpload, BundleError> {
    let wire: WireBundle<'_> = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            BundleError::WrongShape
        } else {
            BundleError::InvalidJson
        }
    })?;
    let html = wire
        .plugin_html
        .filter(|h| h.get().starts_with('"'))
        .and_then(|h| serde_json::from_str::<String>(h.get()).ok())
        .ok_or(BundleError::WrongShape)?;
    if !wire.set.is_some_and(|s| s.get().starts_with('{')) {
        return Err(BundleError::WrongShape);
    }
    // Only `appName` is read: the rest of the manifest is skipped, not
    // built into a tree.
    let app_name = extract_manifest_text(&html)
        .ok()
        .and_then(|t| {
            serde_json::from_str::<ManifestName<'_>>(&t)
                .ok()
                .and_then(|m| m.app_name)
                .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok())
        })
        .and_then(|v| match v {
            Value::String(s) if !s.is_empty() => Some(s),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        });
    Ok(BundleUpload { app_name })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn with_manifest(manifest: &str) -> Vec<u8> {
        let html = format!(
            r#"<html><script type="application/oqse-manifest+json">{manifest}</script></html>"#
        );
        json!({"pluginHtml": html, "set": {"items": []}})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn the_bundle_shape_is_checked() {
        assert_eq!(parse_bundle(b"{not json"), Err(BundleError::InvalidJson));
        assert_eq!(parse_bundle(b""), Err(BundleError::InvalidJson));
        for bad in [
            json!([]),
            json!({"pluginHtml": 1, "set": {}}),
            json!({"pluginHtml": "x", "set": null}),
            json!({"pluginHtml": "x", "set": [1]}),
            json!({"pluginHtml": "x"}),
            json!({"set": {}}),
        ] {
            assert_eq!(
                parse_bundle(bad.to_string().as_bytes()),
                Err(BundleError::WrongShape),
                "{bad}"
            );
        }
        assert_eq!(
            parse_bundle(br#"{"pluginHtml":"<p>no manifest</p>","set":{},"extra":[1]}"#),
            Ok(BundleUpload { app_name: None })
        );
    }

    #[test]
    fn app_name_follows_the_reference() {
        let name = |m: &str| parse_bundle(&with_manifest(m)).unwrap().app_name;
        assert_eq!(
            name(r#"{"appName":"Quiz Race"}"#).as_deref(),
            Some("Quiz Race")
        );
        assert_eq!(name(r#"{"appName":""}"#), None);
        assert_eq!(name(r#"{"appName":7}"#).as_deref(), Some("7"));
        assert_eq!(name(r#"{"appName":true}"#).as_deref(), Some("true"));
        assert_eq!(name(r#"{"appName":null}"#), None);
        assert_eq!(name(r#"{"id":"x"}"#), None);
        assert_eq!(name("{broken"), None);
    }
}
