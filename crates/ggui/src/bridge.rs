//! The agent bridge client (`invokeAgentEndpoint`), sans-IO: build the POST
//! the agent's endpoint expects, then read its answer (JSON, or the last
//! `data: ` line of an SSE body), validated before use. An answer that does
//! not parse or validate is forwarded as raw text, as the protocol does.
//! The caller does the HTTP (with [`AgentRequest::timeout_ms`]) and reads at
//! most [`AGENT_RESPONSE_MAX_BYTES`] of the body.

use serde_json::{json, Map, Value};

/// Default request timeout.
pub const DEFAULT_AGENT_TIMEOUT_MS: u64 = 90_000;
/// The most of an agent's answer hostwire reads (its own bound).
pub const AGENT_RESPONSE_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Nesting bound of an agent's answer.
pub const AGENT_RESPONSE_MAX_DEPTH: usize = 64;
/// The message a `start` invocation sends when none is given.
pub const DEFAULT_START_MESSAGE: &str = "Start a new session";

/// `start` creates a session; `message` continues one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InvokeType {
    Start,
    Message,
}

/// What to send to the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct InvokeAgentOptions {
    pub connector_endpoint_url: String,
    pub session_id: Option<String>,
    pub invoke_type: InvokeType,
    pub message: Option<String>,
    pub app_id: String,
    pub interface_context: Option<Value>,
    pub conversation_history: Option<Vec<Value>>,
    pub timeout_ms: Option<u64>,
}

/// The HTTP request to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRequest {
    pub url: String,
    /// Always `POST`.
    pub method: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    pub timeout_ms: u64,
}

/// Builds the request body and headers of the bridge protocol:
/// `{type:'start', appId, sessionId?, message, interfaceContext?}` or
/// `{type:'message', appId, sessionId, message, interfaceContext?, conversationHistory?}`.
pub fn build_agent_request(opts: &InvokeAgentOptions) -> AgentRequest {
    let mut body = Map::new();
    let non_empty = |s: &Option<String>| s.as_deref().filter(|s| !s.is_empty()).map(str::to_owned);
    match opts.invoke_type {
        InvokeType::Start => {
            body.insert("type".into(), json!("start"));
            body.insert("appId".into(), json!(opts.app_id));
            if let Some(id) = non_empty(&opts.session_id) {
                body.insert("sessionId".into(), json!(id));
            }
            let message =
                non_empty(&opts.message).unwrap_or_else(|| DEFAULT_START_MESSAGE.to_owned());
            body.insert("message".into(), json!(message));
            if let Some(ic) = &opts.interface_context {
                body.insert("interfaceContext".into(), ic.clone());
            }
        }
        InvokeType::Message => {
            body.insert("type".into(), json!("message"));
            body.insert("appId".into(), json!(opts.app_id));
            if let Some(id) = &opts.session_id {
                body.insert("sessionId".into(), json!(id));
            }
            if let Some(m) = &opts.message {
                body.insert("message".into(), json!(m));
            }
            if let Some(ic) = &opts.interface_context {
                body.insert("interfaceContext".into(), ic.clone());
            }
            if let Some(history) = opts.conversation_history.as_ref().filter(|h| !h.is_empty()) {
                body.insert("conversationHistory".into(), Value::Array(history.clone()));
            }
        }
    }
    let mut headers = vec![
        ("Content-Type", "application/json".to_owned()),
        ("X-Ggui-App-Id", opts.app_id.clone()),
    ];
    if let Some(id) = non_empty(&opts.session_id) {
        headers.push(("X-Ggui-Session-Id", id));
    }
    AgentRequest {
        url: opts.connector_endpoint_url.clone(),
        method: "POST",
        headers,
        body: Value::Object(body).to_string(),
        timeout_ms: opts.timeout_ms.unwrap_or(DEFAULT_AGENT_TIMEOUT_MS),
    }
}

/// `{sessionId?, text?, streamed, status, error?}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InvokeAgentResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    pub streamed: bool,
    /// `ok` or `error`.
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl InvokeAgentResult {
    fn failed(error: String) -> Self {
        Self {
            session_id: None,
            text: None,
            streamed: false,
            status: "error",
            error: Some(error),
        }
    }
}

/// What the caller forwards, in order (the protocol's callbacks).
#[derive(Debug, Clone, PartialEq)]
pub enum AgentCallback {
    /// Text to forward to the user.
    StreamChunk(String),
    /// The answer is complete.
    StreamDone,
    /// The agent named its session.
    SessionId(String),
    /// A structured event from the answer's `events` array.
    AgentEvent { event_type: String, event: Value },
}

/// The parsed answer.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentOutcome {
    pub callbacks: Vec<AgentCallback>,
    pub result: InvokeAgentResult,
}

/// The outcome of a request that never got an answer (connection refused,
/// timeout): the transport's message.
pub fn transport_failure(message: impl Into<String>) -> AgentOutcome {
    AgentOutcome {
        callbacks: Vec::new(),
        result: InvokeAgentResult::failed(message.into()),
    }
}

/// Whether the answer was streamed, judged by its headers.
pub fn is_streaming_content_type(content_type: &str, transfer_encoding: &str) -> bool {
    content_type.contains("text/event-stream")
        || content_type.contains("application/x-ndjson")
        || (content_type.contains("text/plain") && transfer_encoding.contains("chunked"))
}

struct AgentData {
    session_id: Option<String>,
    text: Option<String>,
    events: Vec<(String, Value)>,
}

/// The answer's schema: an object with optional string `sessionId` and
/// `text` and an optional array `events` of objects with a string `type`.
fn validate_agent_data(raw: Value) -> Option<AgentData> {
    let Value::Object(m) = raw else { return None };
    let opt_string = |k: &str| match m.get(k) {
        None => Some(None),
        Some(Value::String(s)) => Some(Some(s.clone())),
        Some(_) => None,
    };
    let session_id = opt_string("sessionId")?;
    let text = opt_string("text")?;
    let events = match m.get("events") {
        None => Vec::new(),
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                let Value::Object(e) = item else { return None };
                let Some(Value::String(t)) = e.get("type") else {
                    return None;
                };
                out.push((t.clone(), item.clone()));
            }
            out
        }
        Some(_) => return None,
    };
    Some(AgentData {
        session_id,
        text,
        events,
    })
}

fn parse_body(body: &str) -> Option<Value> {
    let limits = hostwire_core::JsonLimits::new(AGENT_RESPONSE_MAX_BYTES, AGENT_RESPONSE_MAX_DEPTH);
    let last_data = body.split('\n').rfind(|l| l.starts_with("data: "));
    let text = match last_data {
        Some(line) => line[6..].trim(),
        None => body,
    };
    hostwire_core::json::from_str_bounded(text, limits).ok()
}

/// Reads the agent's HTTP answer.
pub fn parse_agent_response(
    status: u16,
    content_type: &str,
    transfer_encoding: &str,
    body: &str,
) -> AgentOutcome {
    if !(200..300).contains(&status) {
        return transport_failure(format!("Agent returned {status}"));
    }
    if body.len() > AGENT_RESPONSE_MAX_BYTES {
        return transport_failure(format!(
            "Agent answer is {} bytes; the limit is {AGENT_RESPONSE_MAX_BYTES}",
            body.len()
        ));
    }
    let Some(data) = parse_body(body).and_then(validate_agent_data) else {
        // Unparseable or invalid: forward the raw text, as streamed.
        return AgentOutcome {
            callbacks: vec![
                AgentCallback::StreamChunk(body.to_owned()),
                AgentCallback::StreamDone,
            ],
            result: InvokeAgentResult {
                session_id: None,
                text: None,
                streamed: true,
                status: "ok",
                error: None,
            },
        };
    };
    let mut callbacks = Vec::with_capacity(data.events.len() + 2);
    if let Some(id) = data.session_id.as_ref().filter(|s| !s.is_empty()) {
        callbacks.push(AgentCallback::SessionId(id.clone()));
    }
    for (event_type, event) in data.events {
        callbacks.push(AgentCallback::AgentEvent { event_type, event });
    }
    callbacks.push(AgentCallback::StreamDone);
    AgentOutcome {
        callbacks,
        result: InvokeAgentResult {
            session_id: data.session_id,
            text: data.text,
            streamed: is_streaming_content_type(content_type, transfer_encoding),
            status: "ok",
            error: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(t: InvokeType) -> InvokeAgentOptions {
        InvokeAgentOptions {
            connector_endpoint_url: "http://agent.test/invoke".into(),
            session_id: None,
            invoke_type: t,
            message: None,
            app_id: "app".into(),
            interface_context: None,
            conversation_history: None,
            timeout_ms: None,
        }
    }

    #[test]
    fn start_body_defaults_message_and_skips_empty_session() {
        let mut o = opts(InvokeType::Start);
        o.session_id = Some(String::new());
        let r = build_agent_request(&o);
        assert_eq!(
            r.body,
            r#"{"type":"start","appId":"app","message":"Start a new session"}"#
        );
        assert_eq!(r.timeout_ms, 90_000);
        assert_eq!(r.headers.len(), 2);
        o.session_id = Some("s1".into());
        o.interface_context = Some(json!({"shell": "web"}));
        let r = build_agent_request(&o);
        assert_eq!(
            r.body,
            r#"{"type":"start","appId":"app","sessionId":"s1","message":"Start a new session","interfaceContext":{"shell":"web"}}"#
        );
        assert_eq!(r.headers[2], ("X-Ggui-Session-Id", "s1".to_owned()));
    }

    #[test]
    fn message_body_order_and_history_only_when_non_empty() {
        let mut o = opts(InvokeType::Message);
        o.session_id = Some("s1".into());
        o.message = Some("hi".into());
        o.conversation_history = Some(vec![]);
        assert_eq!(
            build_agent_request(&o).body,
            r#"{"type":"message","appId":"app","sessionId":"s1","message":"hi"}"#
        );
        o.conversation_history = Some(vec![json!({"role": "user", "text": "a"})]);
        o.interface_context = Some(json!({}));
        assert_eq!(
            build_agent_request(&o).body,
            r#"{"type":"message","appId":"app","sessionId":"s1","message":"hi","interfaceContext":{},"conversationHistory":[{"role":"user","text":"a"}]}"#
        );
    }

    #[test]
    fn json_answer_forwards_session_events_then_done() {
        let out = parse_agent_response(
            200,
            "application/json",
            "",
            r#"{"sessionId":"s9","text":"hello","events":[{"type":"push","payload":{"a":1}}],"extra":true}"#,
        );
        assert_eq!(out.result.session_id.as_deref(), Some("s9"));
        assert_eq!(out.result.text.as_deref(), Some("hello"));
        assert!(!out.result.streamed);
        assert_eq!(out.callbacks.len(), 3);
        assert_eq!(out.callbacks[0], AgentCallback::SessionId("s9".into()));
        assert!(
            matches!(&out.callbacks[1], AgentCallback::AgentEvent { event_type, .. } if event_type == "push")
        );
        assert_eq!(out.callbacks[2], AgentCallback::StreamDone);
    }

    #[test]
    fn sse_uses_the_last_data_line() {
        let body = "event: x\ndata: {\"text\":\"first\"}\n\ndata: {\"text\":\"last\"}\n\n";
        let out = parse_agent_response(200, "text/event-stream", "", body);
        assert_eq!(out.result.text.as_deref(), Some("last"));
        assert!(out.result.streamed);
    }

    #[test]
    fn unparseable_or_invalid_answers_are_forwarded_raw() {
        for body in [
            "not json",
            r#"{"text": 5}"#,
            r#"{"events":[{"payload":1}]}"#,
            "[1]",
        ] {
            let out = parse_agent_response(200, "application/json", "", body);
            assert_eq!(
                out.callbacks,
                vec![
                    AgentCallback::StreamChunk(body.into()),
                    AgentCallback::StreamDone
                ]
            );
            assert_eq!((out.result.status, out.result.streamed), ("ok", true));
        }
    }

    #[test]
    fn http_errors_and_transport_failures() {
        let out = parse_agent_response(502, "text/html", "", "bad gateway");
        assert_eq!(out.result.error.as_deref(), Some("Agent returned 502"));
        assert_eq!(out.result.status, "error");
        assert!(out.callbacks.is_empty());
        assert_eq!(
            transport_failure("timed out").result.error.as_deref(),
            Some("timed out")
        );
        assert!(is_streaming_content_type(
            "text/plain; charset=utf-8",
            "chunked"
        ));
        assert!(!is_streaming_content_type("text/plain", ""));
    }
}
