//! The device page: what a person opens to play a hosted session in a
//! browser (the board, a controller or the settings screen).
//!
//! | method and path | what |
//! | --- | --- |
//! | `GET /memizy/play` | the page (`#session=…&token=…` says which session and who) |
//! | `GET /memizy/play/{play.js,play.css}` | its ES module and styles |
//! | `GET /memizy/play/vendor/penpal-7.0.6.mjs` | Penpal 7.0.6 (npm, MIT), vendored: no CDN |
//! | `GET /memizy/play/api/{id}` | for a bearer token of the session (host's or a player's): who it opens, the phase, roster, clock, result, server time, and the iframe's `sandbox` and `allow` |
//! | `GET /memizy/play/plugin/{id}?key=…` | the plugin's document with the Content Security Policy (SPEC 8.4), as a header and as the first element of `<head>` |
//! | `GET /memizy/play/vendor/plugin-sdk.mjs` | with `--plugin-sdk`: the operator's copy of the plugin SDK, which the plugin document's CDN import of `@memizy/plugin-sdk@1` is pointed at (offline classrooms) |
//!
//! The page's files are in `crates/server/play/`, built into the binary.
//! The page holds no secret: every call it forwards still goes through the
//! session's rules. The sandbox, `allow` and policy come from
//! `hostwire_memizy::policy`, the code `hostwire check` prints them with.
//! The plugin document is opened with a key of its own (random, per
//! session, kept in memory), never with the device's token: the plugin can
//! read its own address, and must not learn a token that attaches devices.

#![allow(clippy::result_large_err)]

use super::actor::{Admin, Cmd};
use super::{restore, Sessions, MAX_SESSIONS};
use crate::http::error::json_response;
use crate::http::{Presented, Refused};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hostwire_core::token::Token;
use hostwire_memizy::manifest::{read_plugin_manifest, PluginRuntime};
use hostwire_memizy::policy::{allow_attribute, content_policy, SANDBOX};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// The page, its module and styles, and the vendored Penpal.
pub const INDEX_HTML: &str = include_str!("../../play/index.html");
pub const PLAY_JS: &str = include_str!("../../play/play.js");
pub const PLAY_CSS: &str = include_str!("../../play/play.css");
/// Penpal 7.0.6's ES module as npm distributes it (`dist/penpal.mjs`).
pub const PENPAL_MJS: &str = include_str!("../../play/vendor/penpal-7.0.6.mjs");
/// The path plugins import Penpal from.
pub const PENPAL_PATH: &str = "/memizy/play/vendor/penpal-7.0.6.mjs";
/// Where the operator's plugin SDK is served (`--plugin-sdk`), and what a
/// plugin's import of the SDK from a CDN is rewritten to.
pub const PLUGIN_SDK_PATH: &str = "/memizy/play/vendor/plugin-sdk.mjs";
/// The SDK package whose CDN imports are pointed at [`PLUGIN_SDK_PATH`].
pub const PLUGIN_SDK_PACKAGE: &str = "@memizy/plugin-sdk";
/// The SDK major the served file stands for: plugins load `…/plugin-sdk@1`
/// (SPEC 9), and another major is another API, never rewritten.
pub const PLUGIN_SDK_MAJOR: u32 = 1;
/// The largest plugin SDK file `--plugin-sdk` takes: the SDK's
/// self-contained bundle is tens of kilobytes; it is held in memory.
pub const MAX_PLUGIN_SDK_BYTES: u64 = 4 * 1024 * 1024;
/// Sessions whose plugin document key is kept; past it the table is
/// emptied (a device whose key went asks for a new one when it reloads).
pub const MAX_DOCUMENT_KEYS: usize = MAX_SESSIONS;

/// The device page's own policy: its scripts and styles from this server,
/// connections to it (the session socket), frames from it (the plugin).
const PAGE_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'";

/// The operator's copy of the plugin SDK (`--plugin-sdk`), read once at
/// start-up and served at [`PLUGIN_SDK_PATH`].
#[derive(Debug, Clone)]
pub struct PluginSdk {
    body: bytes::Bytes,
}

impl PluginSdk {
    /// Reads the file, refusing a missing one or one over
    /// [`MAX_PLUGIN_SDK_BYTES`] with a sentence naming the setting.
    pub fn load(path: &std::path::Path) -> anyhow::Result<PluginSdk> {
        use std::io::Read;
        let what = |e: &dyn std::fmt::Display| {
            anyhow::anyhow!(
                "--plugin-sdk / HOSTWIRE_PLUGIN_SDK: cannot read {}: {e}",
                path.display()
            )
        };
        let file = std::fs::File::open(path).map_err(|e| what(&e))?;
        let mut body = Vec::new();
        // One byte past the bound tells a file that is too large, whatever
        // its metadata says (a pipe, a file still growing).
        file.take(MAX_PLUGIN_SDK_BYTES + 1)
            .read_to_end(&mut body)
            .map_err(|e| what(&e))?;
        if body.len() as u64 > MAX_PLUGIN_SDK_BYTES {
            anyhow::bail!(
                "--plugin-sdk / HOSTWIRE_PLUGIN_SDK: {} is over {MAX_PLUGIN_SDK_BYTES} bytes (MAX_PLUGIN_SDK_BYTES); give the SDK's self-contained ES module bundle",
                path.display()
            );
        }
        if body.is_empty() {
            anyhow::bail!(
                "--plugin-sdk / HOSTWIRE_PLUGIN_SDK: {} is empty; give the SDK's self-contained ES module bundle",
                path.display()
            );
        }
        Ok(PluginSdk { body: body.into() })
    }

    /// An SDK of these bytes (tests).
    pub fn from_bytes(body: impl Into<bytes::Bytes>) -> PluginSdk {
        PluginSdk { body: body.into() }
    }
}

/// A plugin's import of the SDK from a library CDN (SPEC 9: plugins load
/// `https://cdn.jsdelivr.net/npm/@memizy/plugin-sdk@1`, often with
/// `/+esm`), of [`PLUGIN_SDK_MAJOR`]: any version of that major
/// (`@1`, `@1.0.3`, `@^1.2`), any path or query after it, in quotes.
fn sdk_import() -> &'static regex::Regex {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        let hosts = hostwire_memizy::policy::LIBRARY_ORIGINS
            .iter()
            .filter_map(|o| o.strip_prefix("https://"))
            .map(regex::escape)
            .collect::<Vec<_>>()
            .join("|");
        let pattern = format!(
            r#"(["'`])(?:https:)?//(?:{hosts})/(?:[^"'`\s@]*/)?{}@[~^]?{PLUGIN_SDK_MAJOR}(?:[.+-][0-9A-Za-z*]+)*(?:[/?#][^"'`\s]*)?(["'`])"#,
            regex::escape(PLUGIN_SDK_PACKAGE)
        );
        regex::Regex::new(&pattern).expect("the SDK import pattern")
    })
}

/// The plugin document with every CDN import of the SDK (of
/// [`PLUGIN_SDK_MAJOR`]) pointed at [`PLUGIN_SDK_PATH`] on this server.
pub fn with_local_sdk(html: &str) -> std::borrow::Cow<'_, str> {
    sdk_import().replace_all(html, |c: &regex::Captures<'_>| {
        if c[1] == c[2] {
            format!("{}{PLUGIN_SDK_PATH}{}", &c[1], &c[2])
        } else {
            c[0].to_owned()
        }
    })
}

/// What the page's routes share: the sessions and, per session, the key
/// that opens its plugin document and what its manifest says.
pub struct Play {
    sessions: Arc<Sessions>,
    docs: Mutex<HashMap<String, Arc<PluginDoc>>>,
}

/// One session's plugin, as the page needs it.
struct PluginDoc {
    key: Token,
    plugin_id: String,
    runtime: PluginRuntime,
    mode: Value,
    host_as: Value,
}

pub fn router(sessions: Arc<Sessions>) -> Router {
    let play = Arc::new(Play {
        sessions,
        docs: Mutex::new(HashMap::new()),
    });
    Router::new()
        .route("/memizy/play", get(|| async { page(INDEX_HTML) }))
        .route("/memizy/play/", get(|| async { page(INDEX_HTML) }))
        .route(
            "/memizy/play/play.js",
            get(|| async { asset("text/javascript; charset=utf-8", PLAY_JS, false) }),
        )
        .route(
            "/memizy/play/play.css",
            get(|| async { asset("text/css; charset=utf-8", PLAY_CSS, false) }),
        )
        .route(
            PENPAL_PATH,
            // Plugins import it from their opaque (`null`) origin: a module
            // script is a CORS request, so it must allow any origin.
            get(|| async { asset("text/javascript; charset=utf-8", PENPAL_MJS, true) }),
        )
        .route(PLUGIN_SDK_PATH, get(plugin_sdk))
        .route("/memizy/play/api/{id}", get(session_view))
        .route("/memizy/play/plugin/{id}", get(plugin_document))
        .with_state(play)
}

fn page(html: &'static str) -> Response {
    let mut r = crate::http::html_response(html, PAGE_POLICY);
    let h = r.headers_mut();
    // The link's token is in the fragment, which is never sent; no page
    // this one opens learns its address either.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // A page left for another must leave its session: `no-store` keeps it
    // out of the back-forward cache, where its socket would stay open.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn asset(content_type: &'static str, body: &'static str, any_origin: bool) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if any_origin {
        h.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
    }
    r
}

/// `GET /memizy/play/vendor/plugin-sdk.mjs`: the operator's SDK, for a
/// module import from the plugin's opaque (`null`) origin: a module script
/// is a CORS request, so any origin is allowed, and it must be JavaScript.
/// Nothing in it is session-specific. 404 without `--plugin-sdk`.
async fn plugin_sdk(State(play): State<Arc<Play>>) -> Response {
    let Some(sdk) = play.sessions.plugin_sdk() else {
        return error(
            StatusCode::NOT_FOUND,
            "plugin-sdk: this server serves no plugin SDK (start it with --plugin-sdk)",
        );
    };
    let mut r = (StatusCode::OK, sdk.body.clone()).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/javascript; charset=utf-8"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    // A page isolated with Cross-Origin-Embedder-Policy may still load it.
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("cross-origin"),
    );
    r
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    json_response(status, &json!({"error": message.into()}))
}

/// This server's origin as the browser reached it: the scheme is `https`
/// only behind a trusted proxy that says so.
fn host_origin(headers: &HeaderMap, trust_proxy: bool) -> Option<String> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == ';' || c == '/') {
        return None;
    }
    let https = trust_proxy
        && headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|p| p.eq_ignore_ascii_case("https"));
    Some(format!("{}://{host}", if https { "https" } else { "http" }))
}

/// What the page reads of a stored creation request. The rest (the set,
/// its items, the assets) is skipped, not built: a device reloading its
/// plugin must not cost a JSON tree of the whole set.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PluginView {
    #[serde(default)]
    plugin_html: String,
    #[serde(default)]
    mode: Value,
    #[serde(default)]
    host_as: Value,
}

impl PluginView {
    fn read(spec: &str) -> Result<PluginView, Response> {
        serde_json::from_str(spec).map_err(|e| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("stored session: {e}"),
            )
        })
    }
}

impl Play {
    /// The session's creation request as stored (`None`: no such session).
    async fn stored(&self, id: &str) -> Result<hostwire_store::sessions::StoredSession, Response> {
        let store = self.sessions.store();
        let key = id.to_owned();
        crate::blocking::spawn(move || store.load_session(&key))
            .await
            .map_err(|e| error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?
            .map_err(|e| {
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("store: {}", e.reason()),
                )
            })?
            .ok_or_else(|| error(StatusCode::NOT_FOUND, "session: no such session"))
    }

    /// The session's plugin document key and manifest, read once.
    fn doc(&self, id: &str, spec: &str) -> Result<Arc<PluginDoc>, Response> {
        if let Some(d) = self.docs.lock().ok().and_then(|m| m.get(id).cloned()) {
            return Ok(d);
        }
        let spec = PluginView::read(spec)?;
        let m = read_plugin_manifest(&spec.plugin_html).map_err(|e| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("pluginHtml: {e}"),
            )
        })?;
        let doc = Arc::new(PluginDoc {
            key: Token::generate(),
            plugin_id: m.id,
            runtime: m.runtime,
            mode: spec.mode,
            host_as: spec.host_as,
        });
        if let Ok(mut m) = self.docs.lock() {
            if m.len() >= MAX_DOCUMENT_KEYS {
                m.clear();
            }
            return Ok(Arc::clone(m.entry(id.to_owned()).or_insert(doc)));
        }
        Ok(doc)
    }
}

/// `GET /memizy/play/api/{id}` with the host's or a player's token.
async fn session_view(
    State(play): State<Arc<Play>>,
    Path(id): Path<String>,
    presented: Presented,
) -> Response {
    let stored = match play.stored(&id).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let store = play.sessions.store();
    let key = id.clone();
    let players = crate::blocking::spawn(move || store.load_player_tokens(&key))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let host = Token::parse(&stored.host_token);
    // Who the token opens: the host, or one player.
    let who = presented.check(|given| {
        if host.as_ref().is_some_and(|t| t.matches(given)) {
            return Some(None);
        }
        players
            .iter()
            .find(|(_, t)| Token::parse(t).is_some_and(|t| t.matches(given)))
            .map(|(p, _)| Some(p.clone()))
    });
    let who = match who {
        Ok(w) => w,
        Err(r @ Refused::Throttled(_)) => return r.response("session token"),
        Err(_) => {
            return error(
                StatusCode::UNAUTHORIZED,
                "token: this link's token does not open this session (wrong, or the player was removed)",
            )
        }
    };
    let doc = match play.doc(&id, &stored.spec) {
        Ok(d) => d,
        Err(r) => return r,
    };
    let status = match restore::running(&play.sessions, &id).await {
        Err((status, m)) => return error(status, m),
        Ok(Some(h)) => {
            let (tx, rx) = oneshot::channel();
            let sent = h.tx.send(Cmd::Admin(Box::new(Admin::Status), tx)).await;
            match (sent, rx.await) {
                (Ok(()), Ok(Ok(v))) => v,
                _ => json!({"phase": "closed"}),
            }
        }
        Ok(None) => {
            let store = play.sessions.store();
            let key = id.clone();
            let result = crate::blocking::spawn(move || store.load_result(&key))
                .await
                .ok()
                .and_then(Result::ok)
                .flatten()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok());
            let phase = if result.is_some() {
                "finished"
            } else {
                "stopped"
            };
            json!({"phase": phase, "result": result})
        }
    };
    json_response(
        StatusCode::OK,
        &json!({
            "sessionId": id,
            "role": if who.is_some() { "player" } else { "host" },
            "player": who,
            "pluginId": doc.plugin_id,
            "mode": doc.mode,
            "hostAs": doc.host_as,
            "phase": status.get("phase"),
            "players": status.get("players").cloned().unwrap_or(json!([])),
            "clock": status.get("clock"),
            "result": status.get("result"),
            "settingsValid": status.get("settingsValid"),
            "serverTime": play.sessions.clock.now_ms(),
            "sandbox": SANDBOX,
            "allow": allow_attribute(Some(&doc.runtime)),
            "pluginDocument": format!("/memizy/play/plugin/{id}?key={}", doc.key.as_str()),
            "penpal": PENPAL_PATH,
        }),
    )
}

#[derive(Debug, Deserialize)]
struct DocKey {
    #[serde(default)]
    key: String,
}

/// `GET /memizy/play/plugin/{id}?key=…`: the plugin document.
async fn plugin_document(
    State(play): State<Arc<Play>>,
    Path(id): Path<String>,
    Query(q): Query<DocKey>,
    headers: HeaderMap,
) -> Response {
    let doc = play.docs.lock().ok().and_then(|m| m.get(&id).cloned());
    let Some(doc) = doc.filter(|d| d.key.matches(&q.key)) else {
        return error(
            StatusCode::UNAUTHORIZED,
            "key: the plugin document's key is wrong or expired (reload the device page)",
        );
    };
    let stored = match play.stored(&id).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let html = match PluginView::read(&stored.spec) {
        Ok(v) => v.plugin_html,
        Err(r) => return r,
    };
    // Offline classrooms: the SDK from this server instead of the CDN.
    let html = match play.sessions.plugin_sdk() {
        Some(_) => with_local_sdk(&html).into_owned(),
        None => html,
    };
    let origin = host_origin(&headers, play.sessions.config.trust_proxy);
    let csp = content_policy(Some(&doc.runtime), origin.as_deref());
    let body = with_policy_meta(&html, &csp);
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(&csp) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// The document with `<meta http-equiv="Content-Security-Policy">` as the
/// first element of its `<head>` (SPEC 8.4); a document without a `<head>`
/// start tag before its first script gets one at its start. The policy is
/// also sent as a header, which holds whatever the markup is.
pub fn with_policy_meta(html: &str, csp: &str) -> String {
    let escaped = csp
        .replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;");
    let meta = format!("<meta http-equiv=\"Content-Security-Policy\" content=\"{escaped}\">");
    let lower = html.to_ascii_lowercase();
    let head = lower.match_indices("<head").find(|(i, _)| {
        matches!(
            lower.as_bytes().get(i + 5),
            Some(b'>' | b' ' | b'\t' | b'\n' | b'\r' | b'/')
        )
    });
    let first_script = lower.find("<script").unwrap_or(usize::MAX);
    match head {
        Some((i, _)) if i < first_script => match lower[i..].find('>') {
            Some(end) => {
                let at = i + end + 1;
                format!("{}{meta}{}", &html[..at], &html[at..])
            }
            None => format!("<head>{meta}</head>{html}"),
        },
        _ => format!("<head>{meta}</head>{html}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdn_imports_of_sdk_major_1_point_at_the_local_copy() {
        for spec in [
            "https://cdn.jsdelivr.net/npm/@memizy/plugin-sdk@1",
            "https://cdn.jsdelivr.net/npm/@memizy/plugin-sdk@1/+esm",
            "https://cdn.jsdelivr.net/npm/@memizy/plugin-sdk@1.0.3/+esm",
            "https://cdn.jsdelivr.net/npm/@memizy/plugin-sdk@^1.2.0/dist/index.js",
            "https://unpkg.com/@memizy/plugin-sdk@1?module",
            "https://esm.sh/@memizy/plugin-sdk@1.0.0-rc.6",
            "https://esm.sh/v135/@memizy/plugin-sdk@1",
        ] {
            for q in ['"', '\'', '`'] {
                let html = format!("import {{ defineGame }} from {q}{spec}{q};");
                assert_eq!(
                    with_local_sdk(&html),
                    format!("import {{ defineGame }} from {q}{PLUGIN_SDK_PATH}{q};"),
                    "{html}"
                );
            }
        }
        // Another major, another package, another host, or no version: kept.
        for kept in [
            "import x from 'https://cdn.jsdelivr.net/npm/@memizy/plugin-sdk@2/+esm';",
            "import x from 'https://cdn.jsdelivr.net/npm/@memizy/plugin-sdk@10';",
            "import x from 'https://cdn.jsdelivr.net/npm/@memizy/plugin-sdk/+esm';",
            "import x from 'https://cdn.jsdelivr.net/npm/@memizy/plugin-sdk-extra@1';",
            "import x from 'https://evil.example/npm/@memizy/plugin-sdk@1';",
            "import x from 'https://cdn.jsdelivr.net/npm/@memizy/plugin-sdk@1\";",
        ] {
            assert_eq!(with_local_sdk(kept), kept);
        }
    }

    #[test]
    fn the_policy_is_the_first_element_of_head() {
        let out = with_policy_meta(
            "<!doctype html><html><HEAD lang=en><script>x</script></head></html>",
            "default-src 'none'",
        );
        assert!(out.contains(
            "<HEAD lang=en><meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'\"><script>"
        ));
        // `<header>` is not `<head>`; a script before any head gets one first.
        let out = with_policy_meta("<header></header><script>x</script>", "a");
        assert!(out.starts_with(
            "<head><meta http-equiv=\"Content-Security-Policy\" content=\"a\"></head><header>"
        ));
        let out = with_policy_meta("<script>x</script><head></head>", "a");
        assert!(out.starts_with("<head><meta"));
    }
}
