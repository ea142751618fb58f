//! The device page's routes over HTTP: offline classrooms (`--plugin-sdk`),
//! the plugin document's SDK import pointed at the server's own copy, and
//! the headers a module import from a `null` origin needs.

use crate::support::session::*;
use hostwire::sessions::play::{PluginSdk, MAX_PLUGIN_SDK_BYTES, PLUGIN_SDK_PATH};
use serde_json::Value;

const CDN_IMPORT: &str = "https://cdn.jsdelivr.net/npm/@memizy/plugin-sdk@1/+esm";
const SDK: &str = "export const defineGame = () => 'offline';\n";

/// A plugin importing the SDK from its CDN, as published plugins do, and
/// another major that must stay as it is.
fn plugin_with_sdk_import() -> String {
    plugin_html().replace(
        "</body>",
        &format!(
            "<script type=\"module\">import {{ defineGame }} from '{CDN_IMPORT}';\nimport('https://cdn.jsdelivr.net/npm/@memizy/plugin-sdk@2/+esm');</script></body>"
        ),
    )
}

/// The session's plugin document as a device page loads it: (status, headers, body).
async fn plugin_document(h: &TestHost) -> (u16, reqwest::header::HeaderMap, String) {
    let api = Api::of(h);
    let mut body = presenter_body(1);
    body["pluginHtml"] = Value::String(plugin_with_sdk_import());
    let (sid, host) = api.create(&body).await;
    let (s, v) = api
        .request("GET", &format!("/memizy/play/api/{sid}"), Some(&host), None)
        .await;
    assert_eq!(s, 200, "{v}");
    get(&format!(
        "{}{}",
        h.http,
        v["pluginDocument"].as_str().unwrap()
    ))
    .await
}

async fn get(url: &str) -> (u16, reqwest::header::HeaderMap, String) {
    let r = reqwest::Client::new()
        .get(url)
        .header("origin", "null")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_plugin_sdk_the_cdn_import_points_at_the_servers_copy() {
    let h = TestHost::start_with_sdk(Some(PluginSdk::from_bytes(SDK))).await;
    let (s, headers, doc) = plugin_document(&h).await;
    assert_eq!(s, 200, "{doc}");
    assert!(
        doc.contains(&format!("from '{PLUGIN_SDK_PATH}';")),
        "the import is rewritten: {doc}"
    );
    assert!(!doc.contains(CDN_IMPORT), "{doc}");
    assert!(
        doc.contains("import('https://cdn.jsdelivr.net/npm/@memizy/plugin-sdk@2/+esm')"),
        "another major is left alone: {doc}"
    );
    // The policy lets the document load scripts from this server.
    let csp = headers["content-security-policy"].to_str().unwrap();
    let script_src = csp
        .split(';')
        .find(|d| d.trim_start().starts_with("script-src"))
        .unwrap();
    assert!(script_src.contains(&h.http), "{csp}");

    // The SDK itself, as Chromium imports it from a `null` origin.
    let (s, headers, body) = get(&format!("{}{PLUGIN_SDK_PATH}", h.http)).await;
    assert_eq!(s, 200);
    assert_eq!(body, SDK);
    assert_eq!(headers["access-control-allow-origin"], "*");
    assert_eq!(
        headers["content-type"].to_str().unwrap(),
        "text/javascript; charset=utf-8"
    );
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["cross-origin-resource-policy"], "cross-origin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_plugin_sdk_nothing_is_rewritten_or_served() {
    let h = TestHost::start().await;
    let (s, _, doc) = plugin_document(&h).await;
    assert_eq!(s, 200, "{doc}");
    assert!(doc.contains(&format!("from '{CDN_IMPORT}';")), "{doc}");
    assert!(!doc.contains(PLUGIN_SDK_PATH), "{doc}");
    let (s, _, body) = get(&format!("{}{PLUGIN_SDK_PATH}", h.http)).await;
    assert_eq!(s, 404, "{body}");
    assert!(body.contains("plugin-sdk"), "{body}");
}

#[test]
fn a_missing_or_too_large_sdk_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.mjs");
    let e = PluginSdk::load(&missing).unwrap_err().to_string();
    assert!(
        e.contains("--plugin-sdk") && e.contains("missing.mjs"),
        "{e}"
    );
    let big = dir.path().join("big.mjs");
    std::fs::write(&big, vec![b' '; MAX_PLUGIN_SDK_BYTES as usize + 1]).unwrap();
    let e = PluginSdk::load(&big).unwrap_err().to_string();
    assert!(e.contains("MAX_PLUGIN_SDK_BYTES"), "{e}");
    let ok = dir.path().join("sdk.mjs");
    std::fs::write(&ok, SDK).unwrap();
    assert!(PluginSdk::load(&ok).is_ok());
}
