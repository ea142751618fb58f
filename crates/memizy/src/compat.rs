//! The OQSE compatibility check of a set against a plugin manifest: can
//! this plugin play this set?

use crate::manifest::{PluginManifest, SetUsage};
use hostwire_core::Version;
use serde_json::Value;
use std::collections::BTreeMap;

/// The OQSE MAJOR version of the sets this library reads.
pub const OQSE_MAJOR: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Compatibility {
    /// Problems that stop the plugin from playing the set.
    pub problems: Vec<String>,
    /// Item types the plugin does not declare, with how many items have each.
    pub unsupported_types: BTreeMap<String, usize>,
    /// Items the plugin can play.
    pub playable_items: usize,
    pub total_items: usize,
    /// `set: "none"`: nothing was checked.
    pub not_checked: bool,
}

impl Compatibility {
    pub fn is_compatible(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks `set` (an OQSE document) against `manifest`. A plugin with
/// `set: "none"` checks nothing and reports no incompatibility.
pub fn check_compatibility(manifest: &PluginManifest, set: &Value) -> Compatibility {
    let mut out = Compatibility::default();
    if manifest.runtime.set == SetUsage::None {
        out.not_checked = true;
        return out;
    }
    match set
        .get("version")
        .and_then(Value::as_str)
        .map(str::parse::<Version>)
    {
        Some(Ok(v)) if v.major == OQSE_MAJOR => {}
        Some(Ok(v)) => out.problems.push(format!(
            "version: OQSE {v} is not supported (reads OQSE {OQSE_MAJOR}.x)"
        )),
        Some(Err(_)) => out
            .problems
            .push("version: must be MAJOR.MINOR (e.g. \"1.0\")".into()),
        None => out
            .problems
            .push("version: is required (the OQSE version, e.g. \"1.0\")".into()),
    }
    let Some(items) = set.get("items").and_then(Value::as_array) else {
        out.problems.push("items: must be an array of items".into());
        return out;
    };
    out.total_items = items.len();
    for (i, item) in items.iter().enumerate() {
        match item.get("type").and_then(Value::as_str) {
            Some(t) if manifest.declares_type(t) => out.playable_items += 1,
            Some(t) => *out.unsupported_types.entry(t.to_owned()).or_default() += 1,
            None => out.problems.push(format!("items[{i}].type: is required")),
        }
    }
    for (t, n) in &out.unsupported_types {
        out.problems
            .push(format!("items: {n} item(s) of type {t:?}, which the plugin does not declare in capabilities.types"));
    }
    out
}
