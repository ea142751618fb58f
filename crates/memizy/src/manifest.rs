//! The plugin manifest (SPEC 2): the OQSEM data island read from plugin
//! HTML without running anything, validated as OQSEM 1.0 plus every rule of
//! `appSpecific.memizy`. Every problem is reported with its JSON path.

use crate::settings::{
    mode_name, same_json, LocalizedText, SelectOption, SettingDefinition, SettingKind,
};
use crate::types::{HostAs, Mode, View};
use hostwire_core::json::{from_str_bounded, JsonError, JsonLimits};
use hostwire_core::Version;
use serde::de::IgnoredAny;
use serde_json::{Map, Value};
use std::fmt;

mod island;
pub use island::{find_data_island, DataIsland};

/// The media type of the manifest data island.
pub const MANIFEST_SCRIPT_TYPE: &str = "application/oqse-manifest+json";
/// A manifest larger than this is refused before parsing.
pub const MANIFEST_MAX_BYTES: usize = 1024 * 1024;
pub const MANIFEST_MAX_DEPTH: usize = 64;
/// At most this many `permissions.network` origins.
pub const MAX_NETWORK_ORIGINS: usize = 20;
/// The devices a plugin may ask for (SPEC 8.4).
pub const PLUGIN_DEVICES: &[&str] = &["camera", "microphone", "geolocation", "serial", "bluetooth"];
/// OQSEM `capabilities.actions` values (besides `x-…`).
pub const OQSEM_ACTIONS: &[&str] = &["render", "edit", "validate", "import", "export"];
/// The OQSEM MAJOR version this library reads.
pub const OQSEM_MAJOR: u32 = 1;
/// The draft OQSEM MAJOR version that every plugin written for protocol 1.0
/// still declares (`"version": "0.2"`). The reference host accepts it (its
/// schema checks only the `MAJOR.MINOR` form), so it is read as 1.0 here
/// too, with a warning (see [`PluginManifest::warnings`]).
pub const OQSEM_DRAFT_MAJOR: u32 = 0;

/// One problem with a manifest: where, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestProblem {
    /// A JSON path such as `appSpecific.memizy.settings[2].default`.
    pub path: String,
    pub message: String,
}

impl fmt::Display for ManifestProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("no <script type=\"application/oqse-manifest+json\"> data island found")]
    NoDataIsland,
    #[error("the manifest data island is empty")]
    EmptyDataIsland,
    #[error("found {count} manifest data islands; a plugin has exactly one")]
    SeveralDataIslands { count: usize },
    #[error("the manifest data island is not valid JSON: {message}")]
    InvalidJson { message: String },
    #[error("the manifest has {} problem(s):\n{}", .0.len(), .0.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<ManifestProblem>),
}

impl ManifestError {
    /// Every problem, as `path: message` entries.
    pub fn problems(&self) -> Vec<ManifestProblem> {
        match self {
            ManifestError::Invalid(p) => p.clone(),
            other => vec![ManifestProblem {
                path: String::new(),
                message: other.to_string(),
            }],
        }
    }
}

/// `appSpecific.memizy.set`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetUsage {
    Required,
    Optional,
    None,
}

impl SetUsage {
    pub fn as_str(self) -> &'static str {
        match self {
            SetUsage::Required => "required",
            SetUsage::Optional => "optional",
            SetUsage::None => "none",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlayerLimits {
    pub min: u32,
    pub max: u32,
    pub recommended: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiplayerMode {
    pub players: PlayerLimits,
    pub host_as: Vec<HostAs>,
    /// Default `true`.
    pub late_join: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingsScreenSize {
    Compact,
    Large,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Orientation {
    Any,
    Portrait,
    Landscape,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    pub network: Vec<String>,
    pub devices: Vec<String>,
}

/// The Memizy part with defaults applied: what a host works with.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginRuntime {
    pub protocol: Version,
    pub set: SetUsage,
    pub solo: bool,
    pub multiplayer: Option<MultiplayerMode>,
    pub settings: Vec<SettingDefinition>,
    pub settings_screen: Option<SettingsScreenSize>,
    pub orientation: Orientation,
    pub permissions: Permissions,
    pub services: Vec<String>,
    /// The views the plugin must render (SPEC 3.2).
    pub views: Vec<View>,
}

impl PluginRuntime {
    pub fn supports(&self, mode: Mode) -> bool {
        match mode {
            Mode::Solo => self.solo,
            Mode::Multiplayer => self.multiplayer.is_some(),
        }
    }
}

/// A valid plugin manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginManifest {
    /// The manifest as written (unknown keys preserved).
    pub document: Value,
    pub version: Version,
    pub id: String,
    pub app_name: String,
    pub plugin_version: Option<String>,
    /// `capabilities.types`; `None` when not declared.
    pub types: Option<Vec<String>>,
    pub features: Vec<String>,
    pub runtime: PluginRuntime,
}

/// Something a host accepts in a manifest but a plugin author should fix:
/// where (a JSON path) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestWarning {
    pub path: String,
    pub message: String,
}

impl PluginManifest {
    /// What is accepted but should change: a draft OQSEM 0.x `version`.
    pub fn warnings(&self) -> Vec<ManifestWarning> {
        let mut out = Vec::new();
        if self.version.major == OQSEM_DRAFT_MAJOR {
            out.push(ManifestWarning {
                path: "version".into(),
                message: format!(
                    "OQSEM {} is a draft: read as OQSEM {OQSEM_MAJOR}.0, as the reference host does; declare \"{OQSEM_MAJOR}.0\"",
                    self.version
                ),
            });
        }
        out
    }

    /// Whether the plugin declares an item type (`"*"` declares all).
    pub fn declares_type(&self, item_type: &str) -> bool {
        self.types
            .as_ref()
            .is_some_and(|t| t.iter().any(|d| d == "*" || d == item_type))
    }
}

/// Finds the manifest data island in plugin HTML and returns its text.
/// Nothing in the page runs; see [`find_data_island`].
pub fn extract_manifest_text(html: &str) -> Result<String, ManifestError> {
    find_data_island(html).map(|island| island.text)
}

/// Reads and validates the manifest of a plugin HTML file, in time linear
/// in `html` and without building its document tree.
pub fn read_plugin_manifest(html: &str) -> Result<PluginManifest, ManifestError> {
    let island = find_data_island(html)?;
    let value = parse_island(&island)?;
    parse_plugin_manifest(value)
}

/// Parses the island's JSON. A syntax error names the line of the HTML file
/// (not of the island), so that an editor can go to it.
fn parse_island(island: &DataIsland) -> Result<Value, ManifestError> {
    let limits = JsonLimits::new(MANIFEST_MAX_BYTES, MANIFEST_MAX_DEPTH);
    match from_str_bounded::<Value>(&island.text, limits) {
        Ok(v) => Ok(v),
        Err(JsonError::Invalid { message }) => {
            // The size and depth checks passed, so serde_json's own error,
            // which carries the position, is had again cheaply.
            let message = match serde_json::from_str::<IgnoredAny>(&island.text) {
                Err(e) if e.line() > 0 => {
                    let text = e.to_string();
                    let what = text
                        .rfind(" at line ")
                        .map_or(text.as_str(), |at| &text[..at]);
                    let line = island.line + e.line() as u64 - 1;
                    if e.line() == 1 {
                        // The island's first line shares the file's line
                        // with the start tag, whose column is not known.
                        format!(
                            "{what} at line {line} of the HTML file (column {} of the data island)",
                            e.column()
                        )
                    } else {
                        format!(
                            "{what} at line {line} column {} of the HTML file",
                            e.column()
                        )
                    }
                }
                _ => message,
            };
            Err(ManifestError::InvalidJson { message })
        }
        Err(e) => Err(ManifestError::InvalidJson {
            message: e.to_string(),
        }),
    }
}

/// Validates a manifest document.
pub fn parse_plugin_manifest(document: Value) -> Result<PluginManifest, ManifestError> {
    let mut v = Check::default();
    let parsed = v.manifest(&document);
    match parsed {
        Some(m) if v.problems.is_empty() => Ok(PluginManifest { document, ..m }),
        _ => Err(ManifestError::Invalid(v.problems)),
    }
}

#[derive(Default)]
struct Check {
    problems: Vec<ManifestProblem>,
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn js_len(s: &str) -> usize {
    s.encode_utf16().count()
}

impl Check {
    fn bad(&mut self, path: &str, message: impl Into<String>) {
        self.problems.push(ManifestProblem {
            path: path.to_owned(),
            message: message.into(),
        });
    }

    fn object<'v>(&mut self, v: &'v Value, path: &str) -> Option<&'v Map<String, Value>> {
        match v.as_object() {
            Some(o) => Some(o),
            None => {
                self.bad(path, format!("must be an object, not {}", kind(v)));
                None
            }
        }
    }

    fn string<'v>(&mut self, v: &'v Value, path: &str) -> Option<&'v str> {
        match v.as_str() {
            Some(s) => Some(s),
            None => {
                self.bad(path, format!("must be a string, not {}", kind(v)));
                None
            }
        }
    }

    fn nonempty_string<'v>(&mut self, v: &'v Value, path: &str, max: usize) -> Option<&'v str> {
        let s = self.string(v, path)?;
        if s.is_empty() {
            self.bad(path, "must not be empty");
            return None;
        }
        if js_len(s) > max {
            self.bad(path, format!("must be at most {max} characters"));
            return None;
        }
        Some(s)
    }

    fn boolean(&mut self, v: &Value, path: &str) -> Option<bool> {
        match v.as_bool() {
            Some(b) => Some(b),
            None => {
                self.bad(path, format!("must be true or false, not {}", kind(v)));
                None
            }
        }
    }

    fn number(&mut self, v: &Value, path: &str) -> Option<f64> {
        match v.as_f64() {
            Some(n) if n.is_finite() => Some(n),
            _ => {
                self.bad(path, format!("must be a number, not {}", kind(v)));
                None
            }
        }
    }

    fn integer(&mut self, v: &Value, path: &str) -> Option<i64> {
        let n = self.number(v, path)?;
        if n.fract() != 0.0 || n.abs() > 9.0e15 {
            self.bad(path, "must be a whole number");
            return None;
        }
        Some(n as i64)
    }

    fn array<'v>(&mut self, v: &'v Value, path: &str) -> Option<&'v Vec<Value>> {
        match v.as_array() {
            Some(a) => Some(a),
            None => {
                self.bad(path, format!("must be an array, not {}", kind(v)));
                None
            }
        }
    }

    /// An array of strings from `allowed`, without duplicates.
    fn enum_list(&mut self, v: &Value, path: &str, allowed: &[&str]) -> Option<Vec<String>> {
        let list = self.array(v, path)?;
        let mut out: Vec<String> = Vec::new();
        let mut ok = true;
        for (i, item) in list.iter().enumerate() {
            let p = format!("{path}[{i}]");
            match item.as_str() {
                Some(s) if allowed.contains(&s) => {
                    if out.iter().any(|o| o == s) {
                        self.bad(&p, format!("{s:?} is listed twice"));
                        ok = false;
                    } else {
                        out.push(s.to_owned());
                    }
                }
                _ => {
                    self.bad(&p, format!("must be one of {}", quoted(allowed)));
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }

    fn one_of<'a>(&mut self, v: &Value, path: &str, allowed: &[&'a str]) -> Option<&'a str> {
        let found = v
            .as_str()
            .and_then(|s| allowed.iter().find(|a| **a == s).copied());
        if found.is_none() {
            self.bad(path, format!("must be one of {}", quoted(allowed)));
        }
        found
    }

    fn localized(&mut self, v: &Value, path: &str) -> Option<LocalizedText> {
        match v {
            Value::String(s) if !s.is_empty() => Some(LocalizedText::Text(s.clone())),
            Value::String(_) => {
                self.bad(path, "must not be empty");
                None
            }
            Value::Object(map) => {
                if map.is_empty() {
                    self.bad(path, "needs at least one language");
                    return None;
                }
                let mut out = std::collections::BTreeMap::new();
                let mut ok = true;
                for (lang, text) in map {
                    let p = join(path, lang);
                    if !is_bcp47(lang) {
                        self.bad(&p, format!("{lang:?} is not a BCP 47 language tag"));
                        ok = false;
                    }
                    match text.as_str() {
                        Some(t) if !t.is_empty() => {
                            out.insert(lang.clone(), t.to_owned());
                        }
                        _ => {
                            self.bad(&p, "must be a non-empty string");
                            ok = false;
                        }
                    }
                }
                ok.then_some(LocalizedText::Map(out))
            }
            other => {
                self.bad(
                    path,
                    format!(
                        "must be a string or a map of language to string, not {}",
                        kind(other)
                    ),
                );
                None
            }
        }
    }

    fn manifest(&mut self, doc: &Value) -> Option<PluginManifest> {
        let root = self.object(doc, "")?;
        let version = match root.get("version") {
            None => {
                self.bad("version", "is required (OQSEM version, e.g. \"1.0\")");
                None
            }
            Some(v) => self.string(v, "version").and_then(|s| match s.parse::<Version>() {
                Ok(ver) if ver.major == OQSEM_MAJOR || ver.major == OQSEM_DRAFT_MAJOR => Some(ver),
                Ok(ver) => {
                    self.bad(
                        "version",
                        format!(
                            "OQSEM {ver} is not supported: this host reads OQSEM {OQSEM_MAJOR}.x (and the draft {OQSEM_DRAFT_MAJOR}.x)"
                        ),
                    );
                    None
                }
                Err(_) => {
                    self.bad("version", "must be MAJOR.MINOR (e.g. \"1.0\")");
                    None
                }
            }),
        };
        let id = match root.get("id") {
            None => {
                self.bad("id", "is required (a URL or urn:uuid)");
                None
            }
            Some(v) => self.string(v, "id").and_then(|s| {
                if is_url(s) || is_urn_uuid(s) {
                    Some(s.to_owned())
                } else {
                    self.bad("id", "must be a URL or a urn:uuid");
                    None
                }
            }),
        };
        let app_name = match root.get("appName") {
            None => {
                self.bad("appName", "is required");
                None
            }
            Some(v) => self.nonempty_string(v, "appName", 200).map(str::to_owned),
        };
        let plugin_version = root.get("pluginVersion").and_then(|v| {
            let s = self.string(v, "pluginVersion")?;
            if is_semver(s) {
                Some(s.to_owned())
            } else {
                self.bad("pluginVersion", "must be a SemVer version (e.g. \"1.2.0\")");
                None
            }
        });
        let mut types = None;
        let mut features = Vec::new();
        if let Some(caps) = root.get("capabilities") {
            if let Some(caps) = self.object(caps, "capabilities") {
                if let Some(actions) = caps
                    .get("actions")
                    .and_then(|a| self.array(a, "capabilities.actions"))
                {
                    for (i, a) in actions.iter().enumerate() {
                        let ok = a
                            .as_str()
                            .is_some_and(|s| OQSEM_ACTIONS.contains(&s) || s.starts_with("x-"));
                        if !ok {
                            self.bad(
                                &format!("capabilities.actions[{i}]"),
                                format!(
                                    "must be one of {} or start with \"x-\"",
                                    quoted(OQSEM_ACTIONS)
                                ),
                            );
                        }
                    }
                }
                if let Some(t) = caps.get("types") {
                    types = self.string_list(t, "capabilities.types");
                }
                if let Some(f) = caps.get("features") {
                    features = self
                        .string_list(f, "capabilities.features")
                        .unwrap_or_default();
                }
            }
        }
        let runtime = match root.get("appSpecific") {
            None => {
                self.bad(
                    "appSpecific.memizy",
                    "is required (the Memizy runtime block: protocol, modes, …)",
                );
                None
            }
            Some(app) => self
                .object(app, "appSpecific")
                .and_then(|app| match app.get("memizy") {
                    None => {
                        self.bad(
                            "appSpecific.memizy",
                            "is required (the Memizy runtime block: protocol, modes, …)",
                        );
                        None
                    }
                    Some(m) => self.runtime(m, "appSpecific.memizy", types.as_deref()),
                }),
        };
        Some(PluginManifest {
            document: Value::Null,
            version: version?,
            id: id?,
            app_name: app_name?,
            plugin_version,
            types,
            features,
            runtime: runtime?,
        })
    }

    fn string_list(&mut self, v: &Value, path: &str) -> Option<Vec<String>> {
        let list = self.array(v, path)?;
        let mut out = Vec::new();
        for (i, s) in list.iter().enumerate() {
            if let Some(s) = self.nonempty_string(s, &format!("{path}[{i}]"), 200) {
                out.push(s.to_owned());
            }
        }
        (out.len() == list.len()).then_some(out)
    }

    fn runtime(
        &mut self,
        v: &Value,
        path: &str,
        types: Option<&[String]>,
    ) -> Option<PluginRuntime> {
        let m = self.object(v, path)?;
        let protocol = match m.get("protocol") {
            None => {
                self.bad(
                    &join(path, "protocol"),
                    "is required (MAJOR.MINOR, e.g. \"1.0\")",
                );
                None
            }
            Some(p) => {
                self.string(p, &join(path, "protocol"))
                    .and_then(|s| match s.parse::<Version>() {
                        Ok(v) => Some(v),
                        Err(_) => {
                            self.bad(
                                &join(path, "protocol"),
                                "must be in MAJOR.MINOR format (e.g. \"1.0\")",
                            );
                            None
                        }
                    })
            }
        };
        let set = match m.get("set") {
            None => Some(SetUsage::Required),
            Some(s) => self
                .one_of(s, &join(path, "set"), &["required", "optional", "none"])
                .map(|s| match s {
                    "optional" => SetUsage::Optional,
                    "none" => SetUsage::None,
                    _ => SetUsage::Required,
                }),
        };
        if let Some(usage @ (SetUsage::Required | SetUsage::Optional)) = set {
            if types.is_none_or(|t| t.is_empty()) {
                self.bad(
                    "capabilities.types",
                    format!(
                        "is required when {} is {:?}: list the item types the plugin renders",
                        join(path, "set"),
                        usage.as_str()
                    ),
                );
            }
        }

        let modes_path = join(path, "modes");
        let mut solo = false;
        let mut multiplayer = None;
        let mut modes_ok = false;
        match m.get("modes") {
            None => self.bad(
                &modes_path,
                "is required: declare \"solo\" and/or \"multiplayer\"",
            ),
            Some(modes) => {
                if let Some(modes) = self.object(modes, &modes_path) {
                    modes_ok = true;
                    if let Some(s) = modes.get("solo") {
                        solo = self.object(s, &join(&modes_path, "solo")).is_some();
                    }
                    if let Some(mp) = modes.get("multiplayer") {
                        multiplayer = self.multiplayer(mp, &join(&modes_path, "multiplayer"));
                        if multiplayer.is_none() {
                            modes_ok = false;
                        }
                    }
                    if !modes.contains_key("solo") && !modes.contains_key("multiplayer") {
                        self.bad(&modes_path, "must declare \"solo\" and/or \"multiplayer\"");
                        modes_ok = false;
                    }
                }
            }
        }

        let mut settings = Vec::new();
        if let Some(list) = m.get("settings") {
            let sp = join(path, "settings");
            if let Some(list) = self.array(list, &sp) {
                // Ids are compared whatever else is wrong with either
                // setting, so that one report names every problem.
                let mut ids: Vec<(&str, usize)> = Vec::new();
                for (i, s) in list.iter().enumerate() {
                    let p = format!("{sp}[{i}]");
                    let def = self.setting(s, &p);
                    let Some(id) = s.get("id").and_then(Value::as_str) else {
                        continue;
                    };
                    if let Some((_, first)) = ids.iter().find(|(seen, _)| *seen == id) {
                        self.bad(
                            &join(&p, "id"),
                            format!(
                                "{id:?} is used by another setting ({sp}[{first}]); ids must be unique"
                            ),
                        );
                        continue;
                    }
                    ids.push((id, i));
                    if let Some(def) = def {
                        settings.push(def);
                    }
                }
            }
        }

        let mut settings_screen = None;
        if let Some(ss) = m.get("settingsScreen") {
            let p = join(path, "settingsScreen");
            if let Some(o) = self.object(ss, &p) {
                settings_screen = match o.get("size") {
                    None => {
                        self.bad(&join(&p, "size"), "is required (\"compact\" or \"large\")");
                        None
                    }
                    Some(s) => self
                        .one_of(s, &join(&p, "size"), &["compact", "large"])
                        .map(|s| {
                            if s == "large" {
                                SettingsScreenSize::Large
                            } else {
                                SettingsScreenSize::Compact
                            }
                        }),
                };
            }
            if modes_ok && multiplayer.is_none() {
                self.bad(
                    &p,
                    "is only used in the multiplayer lobby; declare modes.multiplayer or remove it",
                );
            }
        }

        let mut orientation = Orientation::Any;
        if let Some(d) = m.get("display") {
            let p = join(path, "display");
            if let Some(o) = self.object(d, &p) {
                if let Some(or) = o.get("orientation") {
                    orientation = match self.one_of(
                        or,
                        &join(&p, "orientation"),
                        &["any", "portrait", "landscape"],
                    ) {
                        Some("portrait") => Orientation::Portrait,
                        Some("landscape") => Orientation::Landscape,
                        _ => Orientation::Any,
                    };
                }
            }
        }

        let mut permissions = Permissions::default();
        if let Some(perm) = m.get("permissions") {
            let p = join(path, "permissions");
            if let Some(o) = self.object(perm, &p) {
                if let Some(net) = o.get("network") {
                    let np = join(&p, "network");
                    if let Some(list) = self.array(net, &np) {
                        if list.len() > MAX_NETWORK_ORIGINS {
                            self.bad(
                                &np,
                                format!(
                                    "lists {} origins; at most {MAX_NETWORK_ORIGINS} are allowed",
                                    list.len()
                                ),
                            );
                        }
                        for (i, origin) in list.iter().enumerate() {
                            let ip = format!("{np}[{i}]");
                            match origin.as_str() {
                                Some(s) if is_network_origin(s) => permissions.network.push(s.to_owned()),
                                _ => self.bad(
                                    &ip,
                                    "must be an origin \"https://host[:port]\" or \"wss://host[:port]\" without a path",
                                ),
                            }
                        }
                    }
                }
                if let Some(dev) = o.get("devices") {
                    permissions.devices = self
                        .enum_list(dev, &join(&p, "devices"), PLUGIN_DEVICES)
                        .unwrap_or_default();
                }
            }
        }

        let mut services = Vec::new();
        if let Some(sv) = m.get("services") {
            let p = join(path, "services");
            if let Some(list) = self.array(sv, &p) {
                for (i, s) in list.iter().enumerate() {
                    match s.as_str() {
                        Some(name) if crate::calls::is_service_name(name) => services.push(name.to_owned()),
                        _ => self.bad(
                            &format!("{p}[{i}]"),
                            "must be a service name: lowercase segments joined by dots (e.g. \"chess.puzzles\")",
                        ),
                    }
                }
            }
        }

        let mut views = Vec::new();
        if solo {
            views.push(View::Solo);
        }
        if let Some(mp) = &multiplayer {
            if mp.host_as.contains(&HostAs::Presenter) {
                views.push(View::Board);
            }
            views.push(View::Controller);
            if settings_screen.is_some() {
                views.push(View::Settings);
            }
        }

        if !modes_ok {
            return None;
        }
        Some(PluginRuntime {
            protocol: protocol?,
            set: set?,
            solo,
            multiplayer,
            settings,
            settings_screen,
            orientation,
            permissions,
            services,
            views,
        })
    }

    fn multiplayer(&mut self, v: &Value, path: &str) -> Option<MultiplayerMode> {
        let o = self.object(v, path)?;
        let pp = join(path, "players");
        let players = match o.get("players") {
            None => {
                self.bad(&pp, "is required in multiplayer ({min, max})");
                None
            }
            Some(p) => self.object(p, &pp).and_then(|p| {
                let min = match p.get("min") {
                    None => {
                        self.bad(&join(&pp, "min"), "is required");
                        None
                    }
                    Some(v) => self.integer(v, &join(&pp, "min")),
                };
                let max = match p.get("max") {
                    None => {
                        self.bad(&join(&pp, "max"), "is required");
                        None
                    }
                    Some(v) => self.integer(v, &join(&pp, "max")),
                };
                let recommended = p
                    .get("recommended")
                    .map(|v| self.integer(v, &join(&pp, "recommended")));
                let (min, max) = (min?, max?);
                let mut ok = true;
                if min < 1 {
                    self.bad(&join(&pp, "min"), "must be at least 1");
                    ok = false;
                }
                if max > 200 {
                    self.bad(&join(&pp, "max"), "must be at most 200");
                    ok = false;
                }
                if min > max {
                    self.bad(&join(&pp, "min"), "must not be greater than players.max");
                    ok = false;
                }
                let recommended = match recommended {
                    None => None,
                    Some(None) => {
                        ok = false;
                        None
                    }
                    Some(Some(r)) if r < min || r > max => {
                        self.bad(&join(&pp, "recommended"), "must be between min and max");
                        ok = false;
                        None
                    }
                    Some(Some(r)) => Some(r as u32),
                };
                ok.then_some(PlayerLimits {
                    min: min as u32,
                    max: max as u32,
                    recommended,
                })
            }),
        };
        let hp = join(path, "hostAs");
        let host_as = match o.get("hostAs") {
            None => {
                self.bad(
                    &hp,
                    "is required in multiplayer: [\"presenter\"] and/or [\"player\"]",
                );
                None
            }
            Some(h) => self
                .enum_list(h, &hp, &["presenter", "player"])
                .and_then(|l| {
                    if l.is_empty() {
                        self.bad(&hp, "must contain \"presenter\" and/or \"player\"");
                        return None;
                    }
                    Some(
                        l.iter()
                            .map(|s| {
                                if s == "presenter" {
                                    HostAs::Presenter
                                } else {
                                    HostAs::Player
                                }
                            })
                            .collect(),
                    )
                }),
        };
        let late_join = match o.get("lateJoin") {
            None => Some(true),
            Some(v) => self.boolean(v, &join(path, "lateJoin")),
        };
        Some(MultiplayerMode {
            players: players?,
            host_as: host_as?,
            late_join: late_join?,
        })
    }

    fn setting(&mut self, v: &Value, path: &str) -> Option<SettingDefinition> {
        let o = self.object(v, path)?;
        let before = self.problems.len();
        let id = match o.get("id") {
            None => {
                self.bad(&join(path, "id"), "is required");
                None
            }
            Some(id) => self.string(id, &join(path, "id")).and_then(|s| {
                if is_setting_id(s) {
                    Some(s.to_owned())
                } else {
                    self.bad(
                        &join(path, "id"),
                        "must start with a letter and contain only letters, digits, \"_\" and \"-\" (at most 64)",
                    );
                    None
                }
            }),
        };
        let label = match o.get("label") {
            None => {
                self.bad(&join(path, "label"), "is required");
                None
            }
            Some(l) => self.localized(l, &join(path, "label")),
        };
        let description = o
            .get("description")
            .and_then(|d| self.localized(d, &join(path, "description")));
        let modes = match o.get("modes") {
            None => vec![Mode::Solo, Mode::Multiplayer],
            Some(m) => {
                let mp = join(path, "modes");
                let list = self
                    .enum_list(m, &mp, &["solo", "multiplayer"])
                    .unwrap_or_default();
                if list.is_empty() && m.as_array().is_some_and(|a| a.is_empty()) {
                    self.bad(&mp, "must list \"solo\" and/or \"multiplayer\"");
                }
                list.iter()
                    .map(|s| {
                        if s == "solo" {
                            Mode::Solo
                        } else {
                            Mode::Multiplayer
                        }
                    })
                    .collect()
            }
        };
        let tp = join(path, "type");
        let dp = join(path, "default");
        let kind = match o.get("type") {
            None => {
                self.bad(
                    &tp,
                    "is required: \"number\", \"boolean\", \"select\" or \"text\"",
                );
                None
            }
            Some(t) => match self.one_of(t, &tp, &["number", "boolean", "select", "text"]) {
                None => None,
                Some("number") => self.number_setting(o, path),
                Some("boolean") => match o.get("default") {
                    None => {
                        self.bad(&dp, "is required");
                        None
                    }
                    Some(d) => self
                        .boolean(d, &dp)
                        .map(|default| SettingKind::Boolean { default }),
                },
                Some("select") => self.select_setting(o, path),
                Some(_) => self.text_setting(o, path),
            },
        };
        if self.problems.len() > before {
            return None;
        }
        Some(SettingDefinition {
            id: id?,
            label: label?,
            description,
            modes,
            kind: kind?,
        })
    }

    fn number_setting(&mut self, o: &Map<String, Value>, path: &str) -> Option<SettingKind> {
        let dp = join(path, "default");
        let default = match o.get("default") {
            None => {
                self.bad(&dp, "is required");
                None
            }
            Some(d) => self.number(d, &dp),
        };
        let min = o.get("min").map(|v| self.number(v, &join(path, "min")));
        let max = o.get("max").map(|v| self.number(v, &join(path, "max")));
        let step = o.get("step").map(|v| self.number(v, &join(path, "step")));
        if let Some(Some(s)) = step {
            if s <= 0.0 {
                self.bad(&join(path, "step"), "must be greater than 0");
            }
        }
        let (min, max, step) = (min.flatten(), max.flatten(), step.flatten());
        if let (Some(lo), Some(hi)) = (min, max) {
            if lo > hi {
                self.bad(&join(path, "min"), "must not be greater than max");
            }
        }
        let default = default?;
        if min.is_some_and(|m| default < m) || max.is_some_and(|m| default > m) {
            self.bad(&dp, "is outside min/max");
        }
        Some(SettingKind::Number {
            default,
            min,
            max,
            step,
        })
    }

    fn select_setting(&mut self, o: &Map<String, Value>, path: &str) -> Option<SettingKind> {
        let op = join(path, "options");
        let mut options: Vec<SelectOption> = Vec::new();
        match o.get("options") {
            None => self.bad(
                &op,
                "is required: a select setting needs at least one option",
            ),
            Some(list) => {
                if let Some(list) = self.array(list, &op) {
                    if list.is_empty() {
                        self.bad(&op, "needs at least one option");
                    }
                    for (i, opt) in list.iter().enumerate() {
                        let p = format!("{op}[{i}]");
                        let Some(opt) = self.object(opt, &p) else {
                            continue;
                        };
                        let value = match opt.get("value") {
                            Some(v @ (Value::String(_) | Value::Bool(_) | Value::Number(_))) => {
                                Some(v.clone())
                            }
                            _ => {
                                self.bad(&join(&p, "value"), "must be a string, number or boolean");
                                None
                            }
                        };
                        let label = match opt.get("label") {
                            None => {
                                self.bad(&join(&p, "label"), "is required");
                                None
                            }
                            Some(l) => self.localized(l, &join(&p, "label")),
                        };
                        if let (Some(value), Some(label)) = (value, label) {
                            if options.iter().any(|o| same_json(&o.value, &value)) {
                                self.bad(&join(&p, "value"), "option values must be unique");
                            }
                            options.push(SelectOption { value, label });
                        }
                    }
                }
            }
        }
        let dp = join(path, "default");
        let default = match o.get("default") {
            None => {
                self.bad(&dp, "is required");
                return None;
            }
            Some(d) => d.clone(),
        };
        if !options.iter().any(|o| same_json(&o.value, &default)) {
            self.bad(&dp, "must be one of the option values");
        }
        Some(SettingKind::Select { options, default })
    }

    fn text_setting(&mut self, o: &Map<String, Value>, path: &str) -> Option<SettingKind> {
        let dp = join(path, "default");
        let default = match o.get("default") {
            None => {
                self.bad(&dp, "is required");
                None
            }
            Some(d) => self.string(d, &dp).map(str::to_owned),
        };
        let max_length = match o.get("maxLength") {
            None => None,
            Some(v) => match self.integer(v, &join(path, "maxLength")) {
                Some(n) if n > 0 => Some(n as usize),
                Some(_) => {
                    self.bad(&join(path, "maxLength"), "must be a positive whole number");
                    None
                }
                None => None,
            },
        };
        let default = default?;
        if let Some(m) = max_length {
            if js_len(&default) > m {
                self.bad(&dp, "is longer than maxLength");
            }
        }
        Some(SettingKind::Text {
            default,
            max_length,
        })
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn quoted(list: &[&str]) -> String {
    list.iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn is_setting_id(s: &str) -> bool {
    let mut b = s.bytes();
    s.len() <= 64
        && matches!(b.next(), Some(c) if c.is_ascii_alphabetic())
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
}

/// A well-formed BCP 47 language tag (RFC 5646).
fn is_bcp47(tag: &str) -> bool {
    language_tags::LanguageTag::parse(tag).is_ok()
}

/// A URL with a host (`https://…`, `tag://…`), as a browser parses it, and
/// written without the spaces and control characters a URL parser would
/// silently drop (the id is compared as written).
fn is_url(s: &str) -> bool {
    !s.chars().any(|c| c.is_whitespace() || c.is_control())
        && url::Url::parse(s).is_ok_and(|u| u.has_host())
}

fn is_urn_uuid(s: &str) -> bool {
    let Some(u) = s.strip_prefix("urn:uuid:") else {
        return false;
    };
    let groups: Vec<&str> = u.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|c| c.is_ascii_hexdigit()))
}

/// A SemVer 2.0.0 version.
fn is_semver(s: &str) -> bool {
    semver::Version::parse(s).is_ok()
}

/// `https://host[:port]` or `wss://host[:port]`, no path, query or user.
/// The origin goes into a Content Security Policy as written, so it must
/// be plain ASCII, and a domain must be LDH labels (a URL parser lets
/// `;`, `*` and quotes through in a host).
pub fn is_network_origin(s: &str) -> bool {
    let Ok(u) = url::Url::parse(s) else {
        return false;
    };
    let host_ok = match u.host() {
        Some(url::Host::Domain(d)) => {
            d.len() <= 253
                && d.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label
                            .bytes()
                            .all(|c| c.is_ascii_alphanumeric() || c == b'-')
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                })
        }
        Some(url::Host::Ipv4(_) | url::Host::Ipv6(_)) => true,
        None => false,
    };
    // Nothing but the host and the port after the scheme: no user, path
    // (not even `/` or `/.`), query or fragment.
    let written = s.split_once("://").map_or("", |(_, rest)| rest);
    let host = u.host_str().unwrap_or_default();
    let bare = written.eq_ignore_ascii_case(host)
        || u.port_or_known_default()
            .is_some_and(|port| written.eq_ignore_ascii_case(&format!("{host}:{port}")));
    s.bytes().all(|c| c.is_ascii_graphic())
        && matches!(u.scheme(), "https" | "wss")
        && host_ok
        && u.port() != Some(0)
        && bare
}

/// A one-line description of a mode list, for summaries.
pub fn modes_summary(runtime: &PluginRuntime) -> String {
    let mut m = Vec::new();
    if runtime.solo {
        m.push(mode_name(Mode::Solo).to_owned());
    }
    if let Some(mp) = &runtime.multiplayer {
        let host_as: Vec<&str> = mp
            .host_as
            .iter()
            .map(|h| {
                if *h == HostAs::Presenter {
                    "presenter"
                } else {
                    "player"
                }
            })
            .collect();
        let rec = mp
            .players
            .recommended
            .map(|r| format!(", recommended {r}"))
            .unwrap_or_default();
        m.push(format!(
            "multiplayer ({}–{} players{rec}; host as {}; late join {})",
            mp.players.min,
            mp.players.max,
            host_as.join(", "),
            if mp.late_join { "on" } else { "off" }
        ));
    }
    m.join("; ")
}
