//! What a plugin may reach outside its sandbox (SPEC 8.4): the iframe
//! `sandbox` and `allow` attributes and the Content Security Policy.

use crate::manifest::PluginRuntime;

/// The iframe sandbox: never `allow-same-origin`, never `allow-top-navigation`.
pub const SANDBOX: &str =
    "allow-scripts allow-forms allow-modals allow-pointer-lock allow-popups allow-popups-to-escape-sandbox";

/// The CDNs plugins load libraries from.
pub const LIBRARY_ORIGINS: &[&str] = &[
    "https://cdn.jsdelivr.net",
    "https://unpkg.com",
    "https://cdnjs.cloudflare.com",
    "https://esm.sh",
];

/// Web fonts, for styles only.
pub const FONT_ORIGINS: &[&str] = &["https://fonts.googleapis.com", "https://fonts.gstatic.com"];

/// The iframe `allow` attribute: only the declared devices (empty when none).
pub fn allow_attribute(runtime: Option<&PluginRuntime>) -> String {
    runtime
        .map(|r| {
            r.permissions
                .devices
                .iter()
                .map(|d| format!("{d} *"))
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default()
}

fn list(parts: &[&[&str]]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for p in parts.iter().flat_map(|p| p.iter()) {
        if !seen.contains(p) {
            seen.push(p);
        }
    }
    seen.join(" ")
}

/// The Content Security Policy of a plugin document. Scripts only inline,
/// from the library CDNs and the host; connections only to those and to
/// `permissions.network`; images and media from any https URL (sets link
/// them). `host_origin` is used only when it is an http(s) origin.
pub fn content_policy(runtime: Option<&PluginRuntime>, host_origin: Option<&str>) -> String {
    let host: Vec<&str> = host_origin
        .filter(|h| {
            (h.starts_with("https://") || h.starts_with("http://"))
                && !h.contains(char::is_whitespace)
                && !h.contains(';')
        })
        .into_iter()
        .collect();
    let network: Vec<&str> = runtime
        .map(|r| r.permissions.network.iter().map(String::as_str).collect())
        .unwrap_or_default();
    [
        "default-src 'none'".to_owned(),
        format!(
            "script-src 'unsafe-inline' 'wasm-unsafe-eval' blob: {}",
            list(&[LIBRARY_ORIGINS, &host])
        ),
        format!(
            "style-src 'unsafe-inline' {}",
            list(&[LIBRARY_ORIGINS, FONT_ORIGINS, &host])
        ),
        format!(
            "font-src data: {}",
            list(&[LIBRARY_ORIGINS, FONT_ORIGINS, &host])
        ),
        "img-src data: blob: https:".to_owned(),
        "media-src data: blob: https:".to_owned(),
        format!(
            "connect-src data: blob: {}",
            list(&[LIBRARY_ORIGINS, &host, &network])
        ),
        format!("worker-src blob: {}", list(&[LIBRARY_ORIGINS, &host])),
        "frame-src 'none'".to_owned(),
        "form-action 'none'".to_owned(),
        "base-uri 'none'".to_owned(),
    ]
    .join("; ")
}
