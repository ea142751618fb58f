//! Declared actions and their payload schemas (draft-07), with the
//! protocol's `CONTRACT_VIOLATION` details.
//!
//! As the protocol's own validator does, every object node of a declared
//! schema is closed (`additionalProperties: false` unless the author set
//! it), all errors are collected, and each becomes a violation
//! `{field, message, expected?, received?, keyword?}` whose `field` is
//! `<action>.data.<path>` (`todos[0].done` style).

use jsonschema::error::ValidationErrorKind;
use jsonschema::paths::LocationSegment;
use jsonschema::{ValidationError, Validator};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// The `tool` a user-action violation names.
pub const EVENT_TOOL: &str = "ggui_event";
/// The hint of a user-action violation.
pub const EVENT_HINT: &str = "The user-action payload did not match the render's actionSpec. Re-check the client-side action wiring, or have the agent render a new UI whose actionSpec covers this payload shape.";
/// Bound on the declared actions of one session.
pub const MAX_DECLARED_ACTIONS: usize = 256;
/// Bound on violations reported for one action (the rest are counted).
pub const MAX_VIOLATIONS: usize = 64;
/// Bound on the serialized size of one declared schema.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// One violation, in the protocol's shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContractViolation {
    pub field: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub received: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyword: Option<String>,
}

/// The outcome of validating one action.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ValidationResult {
    pub violations: Vec<ContractViolation>,
}

impl ValidationResult {
    pub fn valid(&self) -> bool {
        self.violations.is_empty()
    }
}

struct ActionEntry {
    name: String,
    schema: Option<Value>,
    next_step: Option<String>,
    /// Compiled from the closed-shape form of `schema`.
    validator: Option<(Validator, Value)>,
}

/// A session's declared actions: name → `{schema?, nextStep?}`, in the
/// order they were declared.
pub struct ActionSpec {
    entries: Vec<ActionEntry>,
    index: HashMap<String, usize>,
    source: Value,
}

impl std::fmt::Debug for ActionSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActionSpec")
            .field("source", &self.source)
            .finish()
    }
}

impl ActionSpec {
    /// Reads and compiles an action spec. A schema that is not a valid
    /// draft-07 schema, or refers outside itself, is refused with the
    /// field at fault (no schema is ever fetched from the network).
    pub fn from_json(spec: &Value) -> Result<Self, String> {
        let Value::Object(m) = spec else {
            return Err("actionSpec must be an object".into());
        };
        if m.len() > MAX_DECLARED_ACTIONS {
            return Err(format!(
                "actionSpec declares more than {MAX_DECLARED_ACTIONS} actions"
            ));
        }
        let mut entries = Vec::with_capacity(m.len());
        let mut index = HashMap::with_capacity(m.len());
        for (name, entry) in m {
            if name.is_empty() || name.len() > crate::decode::MAX_ID_BYTES {
                return Err(format!(
                    "actionSpec key must be 1 to {} bytes",
                    crate::decode::MAX_ID_BYTES
                ));
            }
            let Value::Object(e) = entry else {
                return Err(format!("actionSpec.{name} must be an object"));
            };
            let next_step = match e.get("nextStep") {
                None => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(_) => return Err(format!("actionSpec.{name}.nextStep must be a string")),
            };
            let (schema, validator) = match e.get("schema") {
                None => (None, None),
                Some(schema @ Value::Object(_)) => {
                    if hostwire_core::json::json_size(schema) > MAX_SCHEMA_BYTES {
                        return Err(format!(
                            "actionSpec.{name}.schema is larger than {MAX_SCHEMA_BYTES} bytes"
                        ));
                    }
                    let closed = inject_closed_shape(schema);
                    let validator = jsonschema::draft7::options()
                        .should_validate_formats(true)
                        .build(&closed)
                        .map_err(|e| {
                            format!("actionSpec.{name}.schema is not a valid JSON Schema: {e}")
                        })?;
                    (Some(schema.clone()), Some((validator, closed)))
                }
                Some(_) => return Err(format!("actionSpec.{name}.schema must be an object")),
            };
            index.insert(name.clone(), entries.len());
            entries.push(ActionEntry {
                name: name.clone(),
                schema,
                next_step,
                validator,
            });
        }
        Ok(Self {
            entries,
            index,
            source: spec.clone(),
        })
    }

    /// The spec as it was declared (for persistence).
    pub fn source(&self) -> &Value {
        &self.source
    }

    /// The declared `nextStep` of an action: the tool it routes to.
    pub fn next_step(&self, action: &str) -> Option<&str> {
        self.index
            .get(action)
            .and_then(|&i| self.entries[i].next_step.as_deref())
    }

    /// The declared schema of an action, as declared.
    pub fn schema(&self, action: &str) -> Option<&Value> {
        self.index
            .get(action)
            .and_then(|&i| self.entries[i].schema.as_ref())
    }

    fn declared(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.name.as_str())
    }

    /// Checks an action payload (`{action, data, tool?}`, possibly absent)
    /// against the declared actions.
    pub fn validate_action_data(&self, value: Option<&Value>) -> ValidationResult {
        let mut violations = Vec::new();
        let Some(Value::Object(record)) = value else {
            violations.push(ContractViolation {
                field: "value".into(),
                message: "Action payload must be an object with an `action` field".into(),
                expected: Some("object".into()),
                received: Some(json_type_of(value).into()),
                keyword: None,
            });
            return ValidationResult { violations };
        };
        let action = match record.get("action") {
            Some(Value::String(a)) if !a.is_empty() => a,
            other => {
                violations.push(ContractViolation {
                    field: "action".into(),
                    message: "Missing or empty `action` identifier".into(),
                    expected: Some("string".into()),
                    received: Some(json_type_of(other).into()),
                    keyword: None,
                });
                return ValidationResult { violations };
            }
        };
        let Some(&i) = self.index.get(action.as_str()) else {
            let names: Vec<&str> = self.declared().collect();
            let listed = if names.is_empty() {
                "(none)".to_owned()
            } else {
                names.join(", ")
            };
            let expected = if names.is_empty() {
                "(none)".to_owned()
            } else {
                names.join(" | ")
            };
            violations.push(ContractViolation {
                field: "action".into(),
                message: format!("Unknown action '{action}'. Declared actions: {listed}"),
                expected: Some(expected),
                received: Some(action.clone()),
                keyword: None,
            });
            return ValidationResult { violations };
        };
        let entry = &self.entries[i];
        if let Some((validator, closed)) = &entry.validator {
            let data = record.get("data");
            let null = Value::Null;
            let instance = data.unwrap_or(&null);
            // The common case, a valid payload, skips building errors.
            if validator.is_valid(instance) {
                return ValidationResult { violations };
            }
            let prefix = format!("{action}.data");
            for error in validator.iter_errors(instance) {
                if violations.len() >= MAX_VIOLATIONS {
                    break;
                }
                map_error(&error, data, closed, &prefix, &mut violations);
            }
        }
        ValidationResult { violations }
    }
}

fn json_type_of(v: Option<&Value>) -> &'static str {
    match v {
        None => "undefined",
        Some(Value::Null) => "null",
        Some(Value::Array(_)) => "array",
        Some(Value::Object(_)) => "object",
        Some(Value::String(_)) => "string",
        Some(Value::Number(_)) => "number",
        Some(Value::Bool(_)) => "boolean",
    }
}

/// Closes every object node (`additionalProperties: false` unless set),
/// recursing through `properties`, `items`, schema-valued
/// `additionalProperties`, `oneOf` and `anyOf`, as the protocol does.
pub fn inject_closed_shape(schema: &Value) -> Value {
    let Value::Object(s) = schema else {
        return schema.clone();
    };
    let types: Vec<&str> = match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let is_object = types.contains(&"object") || s.contains_key("properties");
    let mut out = s.clone();
    let map_branches = |out: &mut Map<String, Value>| {
        for key in ["oneOf", "anyOf"] {
            if let Some(Value::Array(branches)) = out.get(key) {
                let mapped: Vec<Value> = branches.iter().map(inject_closed_shape).collect();
                out.insert(key.into(), Value::Array(mapped));
            }
        }
    };
    if is_object {
        if let Some(Value::Object(props)) = out.get("properties") {
            let closed: Map<String, Value> = props
                .iter()
                .map(|(k, v)| (k.clone(), inject_closed_shape(v)))
                .collect();
            out.insert("properties".into(), Value::Object(closed));
        }
        match out.get("additionalProperties") {
            None => {
                out.insert("additionalProperties".into(), Value::Bool(false));
            }
            Some(Value::Bool(_)) => {}
            Some(other) => {
                let closed = inject_closed_shape(other);
                out.insert("additionalProperties".into(), closed);
            }
        }
        map_branches(&mut out);
        return Value::Object(out);
    }
    if types.contains(&"array") {
        if let Some(items) = out.get("items") {
            let closed = inject_closed_shape(items);
            out.insert("items".into(), closed);
            return Value::Object(out);
        }
    }
    map_branches(&mut out);
    Value::Object(out)
}

/// `/todos/0/done` → `todos[0].done`.
fn field_path(error: &ValidationError<'_>) -> String {
    let mut out = String::new();
    for seg in error.instance_path().iter() {
        match seg {
            LocationSegment::Index(i) => out.push_str(&format!("[{i}]")),
            LocationSegment::Property(p) => {
                if is_all_digits(&p) {
                    out.push_str(&format!("[{p}]"));
                } else if out.is_empty() {
                    out.push_str(&p);
                } else {
                    out.push('.');
                    out.push_str(&p);
                }
            }
        }
    }
    out
}

fn is_all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn prefixed(prefix: &str, field: &str) -> String {
    if field.is_empty() {
        prefix.to_owned()
    } else {
        format!("{prefix}.{field}")
    }
}

fn resolve<'v>(root: Option<&'v Value>, error: &ValidationError<'_>) -> Option<&'v Value> {
    let mut cur = root?;
    for seg in error.instance_path().iter() {
        cur = match (seg, cur) {
            (LocationSegment::Index(i), Value::Array(a)) => a.get(i)?,
            (LocationSegment::Property(p), Value::Object(m)) => m.get(p.as_ref())?,
            (LocationSegment::Property(p), Value::Array(a)) => a.get(p.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// A JSON value as JSON text, bounded for messages.
fn json_text(v: Option<&Value>) -> String {
    match v {
        None => "undefined".into(),
        Some(v) => {
            let t = v.to_string();
            if t.len() > 256 {
                let mut end = 256;
                while !t.is_char_boundary(end) {
                    end -= 1;
                }
                format!("{}…", &t[..end])
            } else {
                t
            }
        }
    }
}

fn number_text(v: &Value) -> String {
    v.to_string()
}

fn map_error(
    error: &ValidationError<'_>,
    root: Option<&Value>,
    closed_schema: &Value,
    prefix: &str,
    out: &mut Vec<ContractViolation>,
) {
    let path = field_path(error);
    let keyword = error.kind().keyword().to_owned();
    let at = |path: &str| {
        if path.is_empty() {
            String::new()
        } else {
            format!(" at '{path}'")
        }
    };
    let value = resolve(root, error);
    let plain = |message: String| ContractViolation {
        field: prefixed(prefix, &path),
        message,
        expected: None,
        received: None,
        keyword: Some(keyword.clone()),
    };
    let v = match error.kind() {
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            // The parent schema's declared keys, read at the schema path.
            let schema_ptr = error.schema_path().as_str();
            let parent_ptr = schema_ptr
                .strip_suffix("/additionalProperties")
                .unwrap_or(schema_ptr);
            let declared: Vec<String> = closed_schema
                .pointer(parent_ptr)
                .and_then(|s| s.get("properties"))
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            let hint = if declared.is_empty() {
                " Declared keys: [(none)].".to_owned()
            } else {
                format!(" Declared keys: [{}].", declared.join(", "))
            };
            for extra in unexpected {
                if out.len() >= MAX_VIOLATIONS {
                    return;
                }
                let field = if path.is_empty() {
                    extra.clone()
                } else {
                    format!("{path}.{extra}")
                };
                let received = value.and_then(|o| o.get(extra));
                out.push(ContractViolation {
                    field: prefixed(prefix, &field),
                    message: format!("Undeclared field '{extra}'{}.{hint}", at(&path)),
                    expected: Some("<declared key>".into()),
                    received: Some(json_type_of(received).into()),
                    keyword: Some(keyword.clone()),
                });
            }
            return;
        }
        ValidationErrorKind::Required { property } => {
            let missing = property
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| property.to_string());
            let field = if path.is_empty() {
                missing.clone()
            } else {
                format!("{path}.{missing}")
            };
            ContractViolation {
                field: prefixed(prefix, &field),
                message: format!("Required field '{missing}' missing{}", at(&path)),
                expected: Some("present".into()),
                received: Some("undefined".into()),
                keyword: Some(keyword.clone()),
            }
        }
        ValidationErrorKind::Type { kind } => {
            let names: Vec<String> = match kind {
                jsonschema::error::TypeKind::Single(t) => vec![t.to_string()],
                jsonschema::error::TypeKind::Multiple(set) => {
                    set.iter().map(|t| t.to_string()).collect()
                }
            };
            ContractViolation {
                field: prefixed(prefix, &path),
                message: format!("must be {}", names.join(",")),
                expected: Some(names.join("|")),
                received: Some(json_type_of(value).into()),
                keyword: Some(keyword.clone()),
            }
        }
        ValidationErrorKind::Enum { options } => {
            let expected = match options.as_ref() {
                Value::Array(a) => a
                    .iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join("|"),
                other => other.to_string(),
            };
            ContractViolation {
                field: prefixed(prefix, &path),
                message: "must be equal to one of the allowed values".into(),
                expected: Some(expected),
                received: Some(json_text(value)),
                keyword: Some(keyword.clone()),
            }
        }
        ValidationErrorKind::Constant { expected_value } => ContractViolation {
            field: prefixed(prefix, &path),
            message: "must be equal to constant".into(),
            expected: Some(expected_value.to_string()),
            received: Some(json_text(value)),
            keyword: Some(keyword.clone()),
        },
        ValidationErrorKind::Pattern { pattern } => ContractViolation {
            field: prefixed(prefix, &path),
            message: format!("must match pattern \"{pattern}\""),
            expected: Some(pattern.clone()),
            received: Some(match value {
                Some(Value::String(s)) => s.clone(),
                other => json_text(other),
            }),
            keyword: Some(keyword.clone()),
        },
        ValidationErrorKind::Minimum { limit } => {
            plain(format!("must be >= {}", number_text(limit)))
        }
        ValidationErrorKind::Maximum { limit } => {
            plain(format!("must be <= {}", number_text(limit)))
        }
        ValidationErrorKind::ExclusiveMinimum { limit } => {
            plain(format!("must be > {}", number_text(limit)))
        }
        ValidationErrorKind::ExclusiveMaximum { limit } => {
            plain(format!("must be < {}", number_text(limit)))
        }
        ValidationErrorKind::MinLength { limit } => {
            plain(format!("must NOT have fewer than {limit} characters"))
        }
        ValidationErrorKind::MaxLength { limit } => {
            plain(format!("must NOT have more than {limit} characters"))
        }
        ValidationErrorKind::MinItems { limit } => {
            plain(format!("must NOT have fewer than {limit} items"))
        }
        ValidationErrorKind::MaxItems { limit } => {
            plain(format!("must NOT have more than {limit} items"))
        }
        ValidationErrorKind::MinProperties { limit } => {
            plain(format!("must NOT have fewer than {limit} properties"))
        }
        ValidationErrorKind::MaxProperties { limit } => {
            plain(format!("must NOT have more than {limit} properties"))
        }
        ValidationErrorKind::Format { format } => plain(format!("must match format \"{format}\"")),
        ValidationErrorKind::AnyOf { .. } => plain("must match a schema in anyOf".into()),
        ValidationErrorKind::OneOfNotValid { .. }
        | ValidationErrorKind::OneOfMultipleValid { .. } => {
            plain("must match exactly one schema in oneOf".into())
        }
        ValidationErrorKind::Not { .. } => plain("must NOT be valid".into()),
        ValidationErrorKind::UniqueItems => plain("must NOT have duplicate items".into()),
        _ => plain(error.to_string()),
    };
    out.push(v);
}

/// `- field: message (expected: X, got: Y)` lines, as the protocol formats.
pub fn format_violations(violations: &[ContractViolation]) -> String {
    violations
        .iter()
        .map(|v| {
            let tail = match v.expected.as_deref() {
                Some(e) if !e.is_empty() => format!(
                    " (expected: {e}, got: {})",
                    v.received.as_deref().unwrap_or("undefined")
                ),
                _ => String::new(),
            };
            format!("- {}: {}{tail}", v.field, v.message)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `CONTRACT_VIOLATION` error's message and `details`
/// (`{error:'contract_violation', tool, violations, hint}`).
pub fn contract_violation(
    tool: &str,
    violations: &[ContractViolation],
    hint: &str,
) -> (String, Value) {
    let message = format!(
        "Contract violation in {tool}:\n{}",
        format_violations(violations)
    );
    let details = json!({
        "error": "contract_violation",
        "tool": tool,
        "violations": violations,
        "hint": hint,
    });
    (message, details)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ActionSpec {
        ActionSpec::from_json(&json!({
            "toggleTask": {"schema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}, "nextStep": "todo.toggle"},
            "free": {},
            "open": {"schema": {"type": "object", "additionalProperties": true}}
        }))
        .unwrap()
    }

    #[test]
    fn closed_shape_is_injected_but_author_choice_kept() {
        let s = spec();
        let r = s.validate_action_data(Some(
            &json!({"action": "toggleTask", "data": {"id": "x", "more": 1}}),
        ));
        assert_eq!(
            r.violations[0].keyword.as_deref(),
            Some("additionalProperties")
        );
        assert_eq!(r.violations[0].field, "toggleTask.data.more");
        assert!(s
            .validate_action_data(Some(&json!({"action": "open", "data": {"more": 1}})))
            .valid());
        let nested = inject_closed_shape(
            &json!({"type": "array", "items": {"properties": {"a": {"type": ["object", "null"]}}}}),
        );
        assert_eq!(nested["items"]["additionalProperties"], json!(false));
        assert_eq!(
            nested["items"]["properties"]["a"]["additionalProperties"],
            json!(false)
        );
    }

    #[test]
    fn undeclared_and_schema_free_actions() {
        let s = spec();
        assert!(s
            .validate_action_data(Some(&json!({"action": "free", "data": [1, 2]})))
            .valid());
        let r = s.validate_action_data(Some(&json!({"action": "nope"})));
        assert_eq!(
            r.violations[0].message,
            "Unknown action 'nope'. Declared actions: toggleTask, free, open"
        );
        assert_eq!(
            r.violations[0].expected.as_deref(),
            Some("toggleTask | free | open")
        );
        assert_eq!(s.next_step("toggleTask"), Some("todo.toggle"));
        let empty = ActionSpec::from_json(&json!({})).unwrap();
        let r = empty.validate_action_data(Some(&json!({"action": "x"})));
        assert_eq!(
            r.violations[0].message,
            "Unknown action 'x'. Declared actions: (none)"
        );
    }

    #[test]
    fn bad_specs_name_the_field() {
        assert_eq!(
            ActionSpec::from_json(&json!([])).unwrap_err(),
            "actionSpec must be an object"
        );
        assert_eq!(
            ActionSpec::from_json(&json!({"a": 1})).unwrap_err(),
            "actionSpec.a must be an object"
        );
        let e = ActionSpec::from_json(&json!({"a": {"schema": {"type": 12}}})).unwrap_err();
        assert!(
            e.starts_with("actionSpec.a.schema is not a valid JSON Schema"),
            "{e}"
        );
        // A remote reference is never fetched: the schema is refused.
        let e = ActionSpec::from_json(
            &json!({"a": {"schema": {"$ref": "https://example.org/s.json"}}}),
        )
        .unwrap_err();
        assert!(e.starts_with("actionSpec.a.schema"), "{e}");
    }

    #[test]
    fn violations_are_bounded() {
        let s = ActionSpec::from_json(
            &json!({"a": {"schema": {"type": "array", "items": {"type": "string"}}}}),
        )
        .unwrap();
        let data: Vec<i32> = (0..1000).collect();
        let r = s.validate_action_data(Some(&json!({"action": "a", "data": data})));
        assert_eq!(r.violations.len(), MAX_VIOLATIONS);
        // The protocol joins prefix and path with a dot even before an
        // index, so a root-level array element reads `a.data.[3]`.
        assert_eq!(r.violations[3].field, "a.data.[3]");
    }

    #[test]
    fn format_matches_protocol() {
        let v = vec![
            ContractViolation {
                field: "f".into(),
                message: "m".into(),
                expected: Some("string".into()),
                received: None,
                keyword: None,
            },
            ContractViolation {
                field: "g".into(),
                message: "n".into(),
                expected: None,
                received: Some("x".into()),
                keyword: None,
            },
        ];
        assert_eq!(
            format_violations(&v),
            "- f: m (expected: string, got: undefined)\n- g: n"
        );
    }
}
