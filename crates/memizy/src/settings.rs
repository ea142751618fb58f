//! Game settings (SPEC 2): definitions read from the manifest, and values
//! resolved for a session (defaults applied, every value checked).

use crate::types::Mode;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A string, or a map of BCP 47 language → string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LocalizedText {
    Text(String),
    Map(BTreeMap<String, String>),
}

impl LocalizedText {
    /// The best text for `locale`: exact tag, its language, English, then
    /// the first one.
    pub fn localize(&self, locale: &str) -> &str {
        match self {
            LocalizedText::Text(s) => s,
            LocalizedText::Map(m) => {
                let lang = locale.split('-').next().unwrap_or(locale);
                m.get(locale)
                    .or_else(|| m.get(lang))
                    .or_else(|| m.get("en"))
                    .or_else(|| m.values().next())
                    .map(String::as_str)
                    .unwrap_or("")
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelectOption {
    pub value: Value,
    pub label: LocalizedText,
}

/// The four setting types and their extra keys.
#[derive(Debug, Clone, PartialEq)]
pub enum SettingKind {
    Number {
        default: f64,
        min: Option<f64>,
        max: Option<f64>,
        step: Option<f64>,
    },
    Boolean {
        default: bool,
    },
    Select {
        options: Vec<SelectOption>,
        default: Value,
    },
    Text {
        default: String,
        max_length: Option<usize>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct SettingDefinition {
    pub id: String,
    pub label: LocalizedText,
    pub description: Option<LocalizedText>,
    /// The modes the setting is shown in (both when the manifest omits it).
    pub modes: Vec<Mode>,
    pub kind: SettingKind,
}

impl SettingDefinition {
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            SettingKind::Number { .. } => "number",
            SettingKind::Boolean { .. } => "boolean",
            SettingKind::Select { .. } => "select",
            SettingKind::Text { .. } => "text",
        }
    }

    pub fn default_value(&self) -> Value {
        match &self.kind {
            SettingKind::Number { default, .. } => number_value(*default),
            SettingKind::Boolean { default } => Value::Bool(*default),
            SettingKind::Select { default, .. } => default.clone(),
            SettingKind::Text { default, .. } => Value::String(default.clone()),
        }
    }

    pub fn applies_to(&self, mode: Mode) -> bool {
        self.modes.contains(&mode)
    }

    /// Why `value` is not valid for this setting, or `None`.
    pub fn check_value(&self, value: &Value) -> Option<String> {
        match &self.kind {
            SettingKind::Number {
                min, max, step: _, ..
            } => {
                let Some(n) = value.as_f64().filter(|n| n.is_finite()) else {
                    return Some("must be a number".into());
                };
                if let Some(min) = min.filter(|m| n < *m) {
                    return Some(format!("must be at least {}", fmt_num(min)));
                }
                if let Some(max) = max.filter(|m| n > *m) {
                    return Some(format!("must be at most {}", fmt_num(max)));
                }
                None
            }
            SettingKind::Boolean { .. } => {
                (!value.is_boolean()).then(|| "must be true or false".into())
            }
            SettingKind::Select { options, .. } => {
                (!options.iter().any(|o| same_json(&o.value, value)))
                    .then(|| "must be one of the options".into())
            }
            SettingKind::Text { max_length, .. } => match value.as_str() {
                None => Some("must be text".into()),
                Some(s) => max_length
                    .filter(|m| s.encode_utf16().count() > *m)
                    .map(|m| format!("must be at most {m} characters")),
            },
        }
    }
}

/// One problem with a setting value: the setting id and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingProblem {
    pub id: String,
    pub message: String,
}

impl std::fmt::Display for SettingProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.id, self.message)
    }
}

/// The settings of a session in `mode`: every declared setting gets the
/// given value or its default. Any invalid value, unknown id, or value
/// other than its default for a setting that does not apply to `mode` is
/// reported; nothing is silently replaced. A setting outside the mode may
/// carry its default: the plugin receives the default of every declared
/// setting (SPEC 2), so the settings it holds, saves and sends back whole
/// in `updateSettings` are valid as they are.
pub fn resolve_settings(
    definitions: &[SettingDefinition],
    input: &Map<String, Value>,
    mode: Mode,
) -> Result<Map<String, Value>, Vec<SettingProblem>> {
    let mut values = Map::new();
    let mut problems = Vec::new();
    for def in definitions {
        match input.get(&def.id) {
            None => {
                values.insert(def.id.clone(), def.default_value());
            }
            Some(v) if !def.applies_to(mode) => {
                let default = def.default_value();
                if same_json(v, &default) {
                    values.insert(def.id.clone(), default);
                } else {
                    problems.push(SettingProblem {
                        id: def.id.clone(),
                        message: format!(
                            "does not apply to {} (the plugin gets its default)",
                            mode_name(mode)
                        ),
                    });
                }
            }
            Some(v) => match def.check_value(v) {
                Some(message) => problems.push(SettingProblem {
                    id: def.id.clone(),
                    message,
                }),
                None => {
                    values.insert(def.id.clone(), v.clone());
                }
            },
        }
    }
    for key in input.keys() {
        if !definitions.iter().any(|d| &d.id == key) {
            problems.push(SettingProblem {
                id: key.clone(),
                message: "unknown setting".into(),
            });
        }
    }
    if problems.is_empty() {
        Ok(values)
    } else {
        Err(problems)
    }
}

pub(crate) fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Solo => "solo",
        Mode::Multiplayer => "multiplayer",
    }
}

/// Select values compare as JavaScript's `===` would: numbers by value.
pub(crate) fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

pub(crate) fn number_value(n: f64) -> Value {
    if n.fract() == 0.0 && n.abs() < 9.0e15 {
        Value::from(n as i64)
    } else {
        serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number)
    }
}

pub(crate) fn fmt_num(n: f64) -> String {
    number_value(n).to_string()
}
