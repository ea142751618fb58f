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
/// Bound on the validator's errors put in the protocol's order for one
/// action (the first [`MAX_VIOLATIONS`] of them are reported): it keeps
/// ordering a payload with thousands of faults cheap.
pub const MAX_ERRORS_ORDERED: usize = 16 * MAX_VIOLATIONS;
/// Bound on the serialized size of one declared schema.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Bound on the schemas one place of an action payload is checked against,
/// with every `$ref` expanded (the schema's evaluation fan-out). It keeps
/// the work of one action within a small multiple of the action's size.
pub const MAX_SCHEMA_FANOUT: u64 = 16;
/// Bound on the compiled size of one `pattern` (and on its lazy DFA's
/// cache), so that compiling `(a{1000}){1000}` is refused, not attempted.
pub const MAX_PATTERN_PROGRAM_BYTES: usize = 1024 * 1024;
/// Bound on nested schemas and `$ref`s followed from one schema's root.
pub const MAX_SCHEMA_NESTING: usize = 64;

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
    /// The most schemas any one place of any action is checked against:
    /// an action's validation costs about this times its size.
    max_fanout: u64,
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
        let mut max_fanout = 1;
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
                    let fanout = check_fanout(&closed)
                        .map_err(|(at, why)| format!("actionSpec.{name}.schema#{at}: {why}"))?;
                    max_fanout = max_fanout.max(fanout);
                    let validator = jsonschema::draft7::options()
                        .should_validate_formats(true)
                        // `regex` runs in time linear in the input; a
                        // pattern it cannot run (look-around, back
                        // references) is refused here, not backtracked.
                        .with_pattern_options(
                            jsonschema::PatternOptions::regex()
                                .size_limit(MAX_PATTERN_PROGRAM_BYTES)
                                .dfa_size_limit(MAX_PATTERN_PROGRAM_BYTES),
                        )
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
            max_fanout,
        })
    }

    /// What validating an action of `bytes` costs at most, in bytes times
    /// schemas checked at one place (the bound [`MAX_SCHEMA_FANOUT`] puts
    /// on the work per byte).
    pub fn validation_cost(&self, bytes: usize) -> u64 {
        (bytes as u64).saturating_mul(self.max_fanout)
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
            // The protocol's validator (Ajv) reports in the order it
            // evaluates: sort ours the same way (stable, so errors of one
            // keyword keep the order they came in).
            let mut errors: Vec<(Vec<(u16, usize)>, ValidationError<'_>)> = validator
                .iter_errors(instance)
                .take(MAX_ERRORS_ORDERED)
                .map(|e| (ajv_order(closed, instance, &e), e))
                .collect();
            errors.sort_by(|a, b| a.0.cmp(&b.0));
            for (_, error) in &errors {
                if violations.len() >= MAX_VIOLATIONS {
                    break;
                }
                map_error(error, data, closed, &prefix, &mut violations);
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

/// Keywords whose subschemas apply to the same place of the instance.
const IN_PLACE_ONE: [&str; 4] = ["not", "if", "then", "else"];
const IN_PLACE_MANY: [&str; 3] = ["allOf", "anyOf", "oneOf"];

/// How many schemas one place of the instance is checked against, for a
/// schema and everything under it: `here` at the schema's own place, and
/// the worst place under each key / element below it.
#[derive(Clone, Default)]
struct Fanout {
    here: u64,
    /// Named keys of an object: the schemas that apply to that member.
    keys: HashMap<String, u64>,
    /// Any other key (`additionalProperties`, `patternProperties`).
    other_keys: u64,
    /// Any element of an array (`items`, `additionalItems`, `contains`).
    elements: u64,
    /// Property names as strings (`propertyNames`).
    names: u64,
}

impl Fanout {
    /// The worst place, its own or any below it.
    fn worst(&self) -> u64 {
        let keys = self.keys.values().copied().max().unwrap_or(0);
        self.here
            .max(keys)
            .max(self.other_keys)
            .max(self.elements)
            .max(self.names)
    }

    /// Both `self` and `other` apply at the same place.
    fn add(&mut self, other: &Fanout) {
        self.here = self.here.saturating_add(other.here);
        for (k, v) in self.keys.iter_mut() {
            let theirs = other.keys.get(k).copied().unwrap_or(other.other_keys);
            *v = v.saturating_add(theirs);
        }
        for (k, v) in &other.keys {
            if !self.keys.contains_key(k) {
                self.keys
                    .insert(k.clone(), v.saturating_add(self.other_keys));
            }
        }
        self.other_keys = self.other_keys.saturating_add(other.other_keys);
        self.elements = self.elements.saturating_add(other.elements);
        self.names = self.names.saturating_add(other.names);
    }
}

/// Walks a schema with every `$ref` expanded (each target once, memoized)
/// and refuses it when some place of an instance would be checked against
/// more than [`MAX_SCHEMA_FANOUT`] schemas. A reference cycle is refused
/// too: one that stays at a place never ends, and one that descends can
/// multiply with the instance's depth. The error is `(JSON pointer, why)`;
/// otherwise the most schemas one place is checked against.
fn check_fanout(root: &Value) -> Result<u64, (String, String)> {
    let mut walk = FanoutWalk {
        root,
        memo: HashMap::new(),
        // `#` is the root, already being walked.
        stack: vec![String::new()],
        max: 1,
    };
    walk.schema(root, String::new(), 0)?;
    Ok(walk.max)
}

struct FanoutWalk<'a> {
    root: &'a Value,
    memo: HashMap<String, Fanout>,
    stack: Vec<String>,
    /// The largest fan-out of a place seen so far.
    max: u64,
}

impl<'a> FanoutWalk<'a> {
    fn schema(
        &mut self,
        s: &'a Value,
        at: String,
        depth: usize,
    ) -> Result<Fanout, (String, String)> {
        if depth > MAX_SCHEMA_NESTING {
            return Err((
                at,
                format!("schemas and $refs nest deeper than {MAX_SCHEMA_NESTING}"),
            ));
        }
        let Value::Object(m) = s else {
            // `true` / `false`: one check at its place.
            return Ok(Fanout {
                here: 1,
                ..Fanout::default()
            });
        };
        if depth > 0 && m.get("$id").is_some_and(Value::is_string) {
            // A nested base URI would change what `#/...` refers to below.
            return Err((at, "$id is only allowed at the schema's root".into()));
        }
        let mut f = Fanout {
            here: 1,
            ..Fanout::default()
        };
        let child =
            |at: &str, key: &str| format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
        if let Some(r) = m.get("$ref") {
            let target = self.reference(r, &at, depth)?;
            f.add(&target);
        }
        for key in IN_PLACE_ONE {
            if let Some(sub) = m.get(key) {
                let sub = self.schema(sub, child(&at, key), depth + 1)?;
                f.add(&sub);
            }
        }
        for key in IN_PLACE_MANY {
            if let Some(Value::Array(subs)) = m.get(key) {
                for (i, sub) in subs.iter().enumerate() {
                    let sub = self.schema(sub, format!("{}/{i}", child(&at, key)), depth + 1)?;
                    f.add(&sub);
                }
            }
        }
        if let Some(Value::Object(deps)) = m.get("dependencies") {
            let at = child(&at, "dependencies");
            for (k, sub) in deps {
                if sub.is_object() || sub.is_boolean() {
                    let sub = self.schema(sub, child(&at, k), depth + 1)?;
                    f.add(&sub);
                }
            }
        }
        // What applies to any key: every `patternProperties` (a pattern may
        // match any name) and, for a key not named, `additionalProperties`.
        let mut any_key = 0u64;
        if let Some(Value::Object(pats)) = m.get("patternProperties") {
            let at = child(&at, "patternProperties");
            for (k, sub) in pats {
                let w = self.schema(sub, child(&at, k), depth + 1)?.worst();
                any_key = any_key.saturating_add(w);
            }
        }
        let mut other_keys = any_key;
        if let Some(sub) = m.get("additionalProperties") {
            let w = self
                .schema(sub, child(&at, "additionalProperties"), depth + 1)?
                .worst();
            other_keys = other_keys.saturating_add(w);
        }
        let mut own = Fanout {
            other_keys,
            ..Fanout::default()
        };
        if let Some(Value::Object(props)) = m.get("properties") {
            let at = child(&at, "properties");
            for (k, sub) in props {
                let w = self.schema(sub, child(&at, k), depth + 1)?.worst();
                own.keys.insert(k.clone(), w.saturating_add(any_key));
            }
        }
        let mut elements = 0u64;
        match m.get("items") {
            Some(Value::Array(subs)) => {
                let at = child(&at, "items");
                for (i, sub) in subs.iter().enumerate() {
                    let w = self.schema(sub, format!("{at}/{i}"), depth + 1)?.worst();
                    elements = elements.max(w);
                }
                if let Some(sub) = m.get("additionalItems") {
                    let w = self
                        .schema(sub, child(&at, "additionalItems"), depth + 1)?
                        .worst();
                    elements = elements.max(w);
                }
            }
            Some(sub) => {
                elements = self.schema(sub, child(&at, "items"), depth + 1)?.worst();
            }
            None => {}
        }
        if let Some(sub) = m.get("contains") {
            let w = self.schema(sub, child(&at, "contains"), depth + 1)?.worst();
            elements = elements.saturating_add(w);
        }
        own.elements = elements;
        if let Some(sub) = m.get("propertyNames") {
            own.names = self
                .schema(sub, child(&at, "propertyNames"), depth + 1)?
                .worst();
        }
        f.add(&own);
        self.max = self.max.max(f.worst());
        if f.worst() > MAX_SCHEMA_FANOUT {
            return Err((
                at,
                format!(
                    "one place of an action would be checked against more than {MAX_SCHEMA_FANOUT} schemas (reference or combinator fan-out)"
                ),
            ));
        }
        Ok(f)
    }

    fn reference(&mut self, r: &Value, at: &str, depth: usize) -> Result<Fanout, (String, String)> {
        let at_ref = format!("{at}/$ref");
        let Value::String(r) = r else {
            return Err((at_ref, "$ref must be a string".into()));
        };
        let Some(pointer) = r.strip_prefix('#') else {
            return Err((
                at_ref,
                format!("$ref '{r}' must be a local '#/...' reference"),
            ));
        };
        if let Some(f) = self.memo.get(pointer) {
            return Ok(f.clone());
        }
        if self.stack.iter().any(|p| p == pointer) {
            return Err((
                pointer.to_owned(),
                format!("$ref '{r}' is recursive (reference cycles are refused)"),
            ));
        }
        let Some(target) = self.root.pointer(pointer) else {
            return Err((at_ref, format!("$ref '{r}' does not resolve")));
        };
        self.stack.push(pointer.to_owned());
        let f = self.schema(target, pointer.to_owned(), depth + 1);
        self.stack.pop();
        let f = f?;
        self.memo.insert(pointer.to_owned(), f.clone());
        Ok(f)
    }
}

/// Ajv's keyword groups, in the order it evaluates them at one schema
/// node: keywords for any type, then those of numbers, strings, arrays and
/// objects, each in the order Ajv's draft-07 vocabularies register them.
const AJV_ANY: &[&str] = &[
    "$ref", "const", "enum", "not", "anyOf", "oneOf", "allOf", "if", "then", "else",
];
const AJV_GROUPS: [(&str, &[&str]); 4] = [
    (
        "number",
        &[
            "maximum",
            "minimum",
            "exclusiveMaximum",
            "exclusiveMinimum",
            "multipleOf",
        ],
    ),
    ("string", &["maxLength", "minLength", "pattern", "format"]),
    (
        "array",
        &[
            "maxItems",
            "minItems",
            "uniqueItems",
            "additionalItems",
            "items",
            "contains",
        ],
    ),
    (
        "object",
        &[
            "maxProperties",
            "minProperties",
            "required",
            "propertyNames",
            "additionalProperties",
            "dependencies",
            "properties",
            "patternProperties",
        ],
    ),
];

/// Where Ajv evaluates `keyword` of `schema`: 0 for a type check made
/// before any keyword, then the groups above (each group's own type check
/// first in it).
fn ajv_rank(schema: &Map<String, Value>, keyword: &str) -> u16 {
    if keyword == "type" {
        let types: Vec<&str> = match schema.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        // A single type whose group has keywords in the schema is checked
        // in that group; any other type check comes first.
        if let [t] = types.as_slice() {
            if let Some(g) = AJV_GROUPS
                .iter()
                .position(|(name, kws)| name == t && kws.iter().any(|k| schema.contains_key(*k)))
            {
                return 100 * (g as u16 + 1);
            }
        }
        return 0;
    }
    if let Some(i) = AJV_ANY.iter().position(|k| *k == keyword) {
        return 1 + i as u16;
    }
    for (g, (_, kws)) in AJV_GROUPS.iter().enumerate() {
        if let Some(i) = kws.iter().position(|k| *k == keyword) {
            return 100 * (g as u16 + 1) + 1 + i as u16;
        }
    }
    1_000
}

/// The member or element of `data` that the instance segment `seg` names.
fn next_data<'v>(data: Option<&'v Value>, seg: Option<&String>) -> Option<&'v Value> {
    match (data, seg) {
        (Some(Value::Object(m)), Some(k)) => m.get(k.as_str()),
        (Some(Value::Array(a)), Some(k)) => k.parse::<usize>().ok().and_then(|j| a.get(j)),
        _ => None,
    }
}

/// The order key of an error as Ajv would report it: the rank of each
/// keyword on the way from the root schema to the failing one, with the
/// declared position of a named property or branch, or the instance's
/// own position of an element or undeclared key.
fn ajv_order(closed: &Value, instance: &Value, error: &ValidationError<'_>) -> Vec<(u16, usize)> {
    let segs: Vec<String> = error
        .schema_path()
        .as_str()
        .split('/')
        .skip(1)
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect();
    let inst: Vec<String> = error
        .instance_path()
        .iter()
        .map(|seg| match seg {
            LocationSegment::Index(i) => i.to_string(),
            LocationSegment::Property(p) => p.to_string(),
        })
        .collect();
    let mut key = Vec::new();
    let (mut node, mut data, mut depth, mut i) = (closed, Some(instance), 0, 0);
    // The position of the instance's next segment in the value at hand.
    let position = |data: Option<&Value>, seg: Option<&String>| -> usize {
        match (data, seg) {
            (Some(Value::Object(m)), Some(k)) => m.keys().position(|x| x == k).unwrap_or(0),
            (_, Some(k)) => k.parse().unwrap_or(0),
            _ => 0,
        }
    };
    while i < segs.len() {
        let Value::Object(schema) = node else { break };
        let kw = segs[i].as_str();
        let rank = ajv_rank(schema, kw);
        let named = |group: &str, name: Option<&String>| {
            schema
                .get(group)
                .and_then(Value::as_object)
                .and_then(|m| m.keys().position(|x| Some(x) == name))
                .unwrap_or(0)
        };
        match kw {
            "properties" | "patternProperties" => {
                key.push((rank, named(kw, segs.get(i + 1))));
                if kw == "properties" {
                    key.push((0, 0));
                } else {
                    key.push((0, position(data, inst.get(depth))));
                }
                node = match schema
                    .get(kw)
                    .and_then(|m| m.get(segs.get(i + 1)?.as_str()))
                {
                    Some(n) => n,
                    None => break,
                };
                data = next_data(data, inst.get(depth));
                depth += 1;
                i += 2;
            }
            "additionalProperties" | "additionalItems" => {
                let Some(sub) = schema.get(kw).filter(|v| v.is_object()) else {
                    key.push((rank, 0));
                    break;
                };
                key.push((rank, position(data, inst.get(depth))));
                node = sub;
                data = next_data(data, inst.get(depth));
                depth += 1;
                i += 1;
            }
            "items" => match schema.get("items") {
                Some(Value::Array(tuple)) => {
                    let j: usize = segs.get(i + 1).and_then(|s| s.parse().ok()).unwrap_or(0);
                    key.push((rank, j));
                    let Some(n) = tuple.get(j) else { break };
                    node = n;
                    data = next_data(data, inst.get(depth));
                    depth += 1;
                    i += 2;
                }
                Some(sub) => {
                    key.push((rank, position(data, inst.get(depth))));
                    node = sub;
                    data = next_data(data, inst.get(depth));
                    depth += 1;
                    i += 1;
                }
                None => break,
            },
            "allOf" | "anyOf" | "oneOf" if segs.len() > i + 1 => {
                let j: usize = segs[i + 1].parse().unwrap_or(0);
                key.push((rank, j));
                let Some(n) = schema.get(kw).and_then(|b| b.get(j)) else {
                    break;
                };
                node = n;
                i += 2;
            }
            "dependencies" if segs.len() > i + 1 => {
                key.push((rank, named(kw, segs.get(i + 1))));
                let Some(n) = schema.get(kw).and_then(|d| d.get(segs[i + 1].as_str())) else {
                    break;
                };
                node = n;
                i += 2;
            }
            "not" | "if" | "then" | "else" => {
                key.push((rank, 0));
                let Some(n) = schema.get(kw) else { break };
                node = n;
                i += 1;
            }
            _ => {
                key.push((rank, 0));
                break;
            }
        }
    }
    key
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
            // A union reads as declared (`string,null`), as Ajv has it.
            let schema_ptr = error.schema_path().as_str();
            let declared: Option<Vec<String>> = closed_schema
                .pointer(schema_ptr)
                .and_then(Value::as_array)
                .map(|ts| {
                    ts.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                });
            let names: Vec<String> = match (kind, declared) {
                (jsonschema::error::TypeKind::Multiple(_), Some(d)) if !d.is_empty() => d,
                (jsonschema::error::TypeKind::Single(t), _) => vec![t.to_string()],
                (jsonschema::error::TypeKind::Multiple(set), _) => {
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

    /// `l0 = allOf[$ref l1, $ref l1]`, ... : 2^levels schemas at one place.
    pub(crate) fn ref_chain(levels: usize) -> Value {
        let mut defs = Map::new();
        for i in 0..levels {
            let next = format!("#/definitions/l{}", i + 1);
            defs.insert(
                format!("l{i}"),
                json!({"allOf": [{"$ref": next}, {"$ref": next}]}),
            );
        }
        defs.insert(format!("l{levels}"), json!({"type": "string"}));
        json!({"definitions": defs, "$ref": "#/definitions/l0"})
    }

    #[test]
    fn reference_fan_out_is_refused_naming_the_schema_path() {
        let started = std::time::Instant::now();
        let e = ActionSpec::from_json(&json!({"a": {"schema": ref_chain(24)}})).unwrap_err();
        assert!(e.starts_with("actionSpec.a.schema#/definitions/l"), "{e}");
        assert!(e.contains(&MAX_SCHEMA_FANOUT.to_string()), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        // Fan-out through sibling objects at the same key counts too.
        let wide = json!({"allOf": (0..20).map(|_| json!({"properties": {"x": {"type": "string"}}})).collect::<Vec<_>>()});
        let e = ActionSpec::from_json(&json!({"a": {"schema": wide}})).unwrap_err();
        assert!(e.starts_with("actionSpec.a.schema"), "{e}");
        // A reference cycle that never descends into the instance loops.
        let e = ActionSpec::from_json(&json!({"a": {"schema": {"definitions": {"x": {"allOf": [{"$ref": "#/definitions/x"}]}}, "$ref": "#/definitions/x"}}})).unwrap_err();
        assert!(e.starts_with("actionSpec.a.schema#/definitions/x"), "{e}");
        // Shallow, reasonable schemas with references still register.
        let ok = json!({
            "definitions": {"id": {"type": "string", "pattern": "^[a-z0-9-]+$"}},
            "type": "object",
            "properties": {"id": {"$ref": "#/definitions/id"}, "items": {"type": "array", "items": {"$ref": "#/definitions/id"}}},
            "oneOf": [{"required": ["id"]}, {"required": ["items"]}]
        });
        let s = ActionSpec::from_json(&json!({"a": {"schema": ok}})).unwrap();
        assert!(s
            .validate_action_data(Some(&json!({"action": "a", "data": {"id": "x-1"}})))
            .valid());
        // Named properties of one object go to different places: no fan-out.
        let props: Map<String, Value> = (0..1000)
            .map(|i| (format!("p{i}"), json!({"type": "string"})))
            .collect();
        ActionSpec::from_json(&json!({"a": {"schema": {"type": "object", "properties": props}}}))
            .unwrap();
    }

    #[test]
    fn backtracking_patterns_are_refused_and_patterns_run_in_linear_time() {
        for pattern in ["^(?=(a+)+$)", "^(a+)\\1$", "(?<=a)b"] {
            for schema in [
                json!({"type": "string", "pattern": pattern}),
                json!({"type": "object", "patternProperties": {pattern: {}}}),
            ] {
                let e = ActionSpec::from_json(&json!({"a": {"schema": schema}})).unwrap_err();
                assert!(e.starts_with("actionSpec.a.schema"), "{e}");
            }
        }
        let s = ActionSpec::from_json(
            &json!({"a": {"schema": {"type": "string", "pattern": "^(a+)+$"}}}),
        )
        .unwrap();
        let data = format!("{}!", "a".repeat(100_000));
        let started = std::time::Instant::now();
        assert!(!s
            .validate_action_data(Some(&json!({"action": "a", "data": data})))
            .valid());
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    /// The worst schema that registers: every element of an array is
    /// checked against [`MAX_SCHEMA_FANOUT`] schemas, through references.
    pub(crate) fn worst_admissible() -> Value {
        // The `allOf` itself, then each `{"$ref"}` and its target.
        let per = (MAX_SCHEMA_FANOUT as usize - 1) / 2;
        json!({
            "definitions": {"s": {"type": "string", "pattern": "^(a|b)+$", "maxLength": 64}},
            "type": "array",
            "items": {"allOf": (0..per).map(|_| json!({"$ref": "#/definitions/s"})).collect::<Vec<_>>()}
        })
    }

    #[test]
    fn the_worst_admissible_schema_costs_a_bounded_multiple_of_the_action() {
        let schema = worst_admissible();
        let s = ActionSpec::from_json(&json!({"a": {"schema": schema}})).unwrap();
        // One more reference and it is refused.
        let mut over = worst_admissible();
        over["items"]["allOf"]
            .as_array_mut()
            .unwrap()
            .push(json!({"$ref": "#/definitions/s"}));
        assert!(ActionSpec::from_json(&json!({"a": {"schema": over}})).is_err());
        // An action of short strings: as many places as fit. Against the
        // cheapest schema of the same kind (one check per element), the
        // worst admissible one costs about its fan-out, not more.
        let data: Vec<&str> = std::iter::repeat_n("ab", 64 * 1024 / 5).collect();
        let action = json!({"action": "a", "data": data});
        let cheapest = ActionSpec::from_json(&json!({"a": {"schema": {"type": "array", "items": {"type": "string", "pattern": "^(a|b)+$", "maxLength": 64}}}})).unwrap();
        let time = |spec: &ActionSpec| {
            let started = std::time::Instant::now();
            assert!(spec.validate_action_data(Some(&action)).valid());
            started.elapsed()
        };
        let (base, worst) = (time(&cheapest), time(&s));
        eprintln!(
            "64 KiB action: fan-out {} {base:?}, fan-out {} {worst:?}",
            cheapest.max_fanout, s.max_fanout
        );
        // The cost the channel reckons with (to validate inline or not)
        // ranks them the same way.
        assert!(cheapest.max_fanout <= 2, "{}", cheapest.max_fanout);
        assert!(s.max_fanout >= MAX_SCHEMA_FANOUT - 1, "{}", s.max_fanout);
        assert!(
            worst < base * 2 * MAX_SCHEMA_FANOUT as u32,
            "{base:?} {worst:?}"
        );
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
