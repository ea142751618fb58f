//! The assets a host serves from a session's bundle (SPEC 4.2, 5): every
//! OQSE media object of the set (`meta.assets`, each item's `assets`) whose
//! `value` is a host-relative key of a file the bundle carries. A media
//! object with an absolute URL is not served: the plugin loads it itself.

use super::AssetIndex;
use crate::SetText;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// The file of the bundle an asset's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundledFile {
    /// The media object's `value`: the file's path in the bundle.
    pub file: String,
    /// The media object's `mimeType`, `application/octet-stream` without one.
    pub mime_type: String,
}

/// What the engine resolves (`index`: keys and sizes) and where the server
/// finds the bytes (`files`, by the item id the engine answered with, or
/// `None` for a set asset, and the key).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssetCatalog {
    pub index: AssetIndex,
    pub files: HashMap<(Option<String>, String), BundledFile>,
}

impl AssetCatalog {
    pub fn file(&self, item_id: Option<&str>, key: &str) -> Option<&BundledFile> {
        self.files
            .get(&(item_id.map(str::to_owned), key.to_owned()))
    }
}

fn is_url(value: &str) -> bool {
    let v = value.as_bytes();
    let starts = |p: &[u8]| v.len() >= p.len() && v[..p.len()].eq_ignore_ascii_case(p);
    starts(b"https:") || starts(b"http:") || starts(b"data:") || starts(b"blob:")
}

/// The catalog of `set` given the bundle's files and their sizes. Keys are
/// matched case-insensitively, as OQSE asset keys are lowercase. Items are
/// read one at a time; one that is not JSON has no assets.
pub fn catalog(set: &SetText, files: &BTreeMap<String, usize>) -> AssetCatalog {
    let mut c = AssetCatalog::default();
    let add = |scope: Option<&str>, dict: Option<&Value>, c: &mut AssetCatalog| {
        let Some(dict) = dict.and_then(Value::as_object) else {
            return;
        };
        for (key, media) in dict {
            let Some(value) = media.get("value").and_then(Value::as_str) else {
                continue;
            };
            if is_url(value) {
                continue;
            }
            let Some(&size) = files.get(value) else {
                continue;
            };
            let key = key.to_lowercase();
            let mime_type = media
                .get("mimeType")
                .and_then(Value::as_str)
                .unwrap_or("application/octet-stream")
                .to_owned();
            match scope {
                None => {
                    c.index.set.insert(key.clone(), size);
                }
                Some(item) => {
                    c.index
                        .items
                        .entry(item.to_owned())
                        .or_default()
                        .insert(key.clone(), size);
                }
            }
            c.files.insert(
                (scope.map(str::to_owned), key),
                BundledFile {
                    file: value.to_owned(),
                    mime_type,
                },
            );
        }
    };
    /// What the catalog reads of an item.
    #[derive(serde::Deserialize)]
    struct ItemAssets {
        id: Option<Value>,
        assets: Option<Value>,
    }
    let meta = set.meta_fields().unwrap_or_default();
    add(None, meta.assets.as_ref(), &mut c);
    for raw in &set.items {
        let Ok(item) = serde_json::from_str::<ItemAssets>(raw.get()) else {
            continue;
        };
        if let Some(id) = item.id.as_ref().and_then(Value::as_str) {
            add(Some(id), item.assets.as_ref(), &mut c);
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bundled_files_are_served_and_urls_are_not() {
        let set = crate::DisplaySet {
            meta: json!({"id": "s", "assets": {
                "Cover": {"type": "image", "value": "assets/cover.png", "mimeType": "image/png"},
                "web": {"type": "image", "value": "https://example.com/a.png"},
                "missing": {"type": "image", "value": "assets/none.png"}
            }}),
            items: vec![json!({"id": "q1", "type": "note", "assets": {
                "cover": {"type": "audio", "value": "assets/q1.mp3"}
            }})],
        };
        let files = BTreeMap::from([
            ("assets/cover.png".to_owned(), 10),
            ("assets/q1.mp3".to_owned(), 20),
        ]);
        let c = catalog(&SetText::from_display(&set), &files);
        assert_eq!(c.index.set, BTreeMap::from([("cover".to_owned(), 10)]));
        assert_eq!(c.index.items["q1"]["cover"], 20);
        assert_eq!(c.file(None, "cover").unwrap().mime_type, "image/png");
        let f = c.file(Some("q1"), "cover").unwrap();
        assert_eq!(
            (f.file.as_str(), f.mime_type.as_str()),
            ("assets/q1.mp3", "application/octet-stream")
        );
        assert!(c.file(None, "web").is_none());
        assert!(c.file(None, "missing").is_none());
    }
}
