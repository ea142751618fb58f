//! `hostwire check PLUGIN.html [--set SET.json] [--mode solo|multiplayer] [--json]`

use clap::{Args, ValueEnum};
use hostwire_core::json::{from_str_bounded, JsonLimits};
use hostwire_memizy::manifest::{modes_summary, ManifestError, PluginManifest, SetUsage};
use hostwire_memizy::negotiate::check_manifest_protocol;
use hostwire_memizy::policy::{allow_attribute, content_policy, SANDBOX};
use hostwire_memizy::settings::{resolve_settings, SettingDefinition, SettingKind};
use hostwire_memizy::{
    check_compatibility, read_plugin_manifest, Compatibility, Mode, HOST_SUPPORTED_VERSIONS,
};
use serde_json::{json, Map, Value};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// Sets larger than this are refused before parsing.
const SET_MAX_BYTES: usize = 64 * 1024 * 1024;
const SET_MAX_DEPTH: usize = 128;

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The plugin's HTML file.
    plugin: PathBuf,
    /// An OQSE set (JSON) to check the plugin against.
    #[arg(long)]
    set: Option<PathBuf>,
    /// Check for one mode only: the plugin must support it, and settings are
    /// resolved for it.
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// The host's origin, allowed in the content policy (e.g. https://play.example.org).
    #[arg(long)]
    host_origin: Option<String>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ModeArg {
    Solo,
    Multiplayer,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Solo => Mode::Solo,
            ModeArg::Multiplayer => Mode::Multiplayer,
        }
    }
}

/// Which file a problem is in: its path is a JSON path inside that file's
/// JSON (the plugin's manifest data island, or the set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Document {
    Manifest,
    Set,
}

impl Document {
    fn as_str(self) -> &'static str {
        match self {
            Document::Manifest => "manifest",
            Document::Set => "set",
        }
    }
}

/// One problem: the document, the JSON path in it, and what is wrong.
struct Problem {
    document: Document,
    path: String,
    message: String,
}

impl Problem {
    fn manifest(path: &str, message: impl Into<String>) -> Problem {
        Problem {
            document: Document::Manifest,
            path: path.to_owned(),
            message: message.into(),
        }
    }

    /// A compatibility problem, written `path: message` with the JSON path
    /// inside the set.
    fn set(problem: &str) -> Problem {
        let (path, message) = problem.split_once(": ").unwrap_or(("", problem));
        Problem {
            document: Document::Set,
            path: path.to_owned(),
            message: message.to_owned(),
        }
    }

    fn json(&self) -> Value {
        json!({"document": self.document.as_str(), "path": self.path, "message": self.message})
    }

    fn line(&self) -> String {
        let place = match (self.document, self.path.is_empty()) {
            (Document::Manifest, true) => String::new(),
            (Document::Manifest, false) => format!("{}: ", self.path),
            (Document::Set, true) => "set: ".to_owned(),
            (Document::Set, false) => format!("set {}: ", self.path),
        };
        format!("{place}{}", self.message)
    }
}

const EXIT_VALID: u8 = 0;
const EXIT_INVALID: u8 = 1;
const EXIT_UNREADABLE: u8 = 2;

pub fn run(args: &CheckArgs) -> ExitCode {
    let (code, out) = check(args);
    print!("{out}");
    ExitCode::from(code)
}

fn read_text(path: &PathBuf, what: &str) -> Result<String, String> {
    let bytes =
        std::fs::read(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{what} {} is not UTF-8 text (invalid byte at {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// Runs the check and returns the exit status and what to print.
fn check(args: &CheckArgs) -> (u8, String) {
    let unreadable = |message: String| {
        let out = if args.json {
            format!(
                "{}\n",
                json!({"valid": false, "unreadable": true, "problems": [{"document": null, "path": "", "message": message}]})
            )
        } else {
            format!("error: {message}\n")
        };
        (EXIT_UNREADABLE, out)
    };
    let html = match read_text(&args.plugin, "plugin") {
        Ok(h) => h,
        Err(e) => return unreadable(e),
    };
    let set = match &args.set {
        None => None,
        Some(p) => match read_text(p, "set").and_then(|t| {
            from_str_bounded::<Value>(&t, JsonLimits::new(SET_MAX_BYTES, SET_MAX_DEPTH))
                .map_err(|e| format!("set {}: {e}", p.display()))
        }) {
            Ok(v) => Some(v),
            Err(e) => return unreadable(e),
        },
    };

    let manifest = match read_plugin_manifest(&html) {
        Ok(m) => m,
        Err(e) => return invalid_manifest(args, &e),
    };

    let mut problems: Vec<Problem> = Vec::new();
    if let Err(e) = check_manifest_protocol(HOST_SUPPORTED_VERSIONS, manifest.runtime.protocol) {
        problems.push(Problem::manifest("appSpecific.memizy.protocol", e.detail()));
    }
    let mode = args.mode.map(Mode::from);
    if let Some(mode) = mode {
        if !manifest.runtime.supports(mode) {
            problems.push(Problem::manifest(
                "appSpecific.memizy.modes",
                format!("the plugin does not declare {}", mode_str(mode)),
            ));
        }
    }
    let settings = resolve_settings(
        &manifest.runtime.settings,
        &Map::new(),
        mode.unwrap_or(Mode::Solo),
    )
    .unwrap_or_default();
    let compat = set.as_ref().map(|s| check_compatibility(&manifest, s));
    if let Some(c) = &compat {
        problems.extend(c.problems.iter().map(|p| Problem::set(p)));
    }
    let csp = content_policy(Some(&manifest.runtime), args.host_origin.as_deref());
    let code = if problems.is_empty() {
        EXIT_VALID
    } else {
        EXIT_INVALID
    };
    let out = if args.json {
        format!(
            "{}\n",
            serde_json::to_string_pretty(&summary_json(
                &manifest,
                mode,
                &settings,
                &csp,
                compat.as_ref(),
                &problems
            ))
            .unwrap_or_default()
        )
    } else {
        summary_text(&manifest, mode, &csp, compat.as_ref(), &problems)
    };
    (code, out)
}

fn invalid_manifest(args: &CheckArgs, e: &ManifestError) -> (u8, String) {
    let problems: Vec<Problem> = e
        .problems()
        .into_iter()
        .map(|p| Problem::manifest(&p.path, p.message))
        .collect();
    let out = if args.json {
        let list: Vec<Value> = problems.iter().map(Problem::json).collect();
        format!(
            "{}\n",
            serde_json::to_string_pretty(&json!({"valid": false, "problems": list}))
                .unwrap_or_default()
        )
    } else {
        let mut s = format!(
            "{}: invalid plugin manifest ({} problem(s))\n",
            args.plugin.display(),
            problems.len()
        );
        for p in &problems {
            let _ = writeln!(s, "  ✗ {}", p.line());
        }
        s
    };
    (EXIT_INVALID, out)
}

fn mode_str(m: Mode) -> &'static str {
    match m {
        Mode::Solo => "solo",
        Mode::Multiplayer => "multiplayer",
    }
}

fn setting_line(d: &SettingDefinition) -> String {
    let extra = match &d.kind {
        SettingKind::Number { min, max, step, .. } => {
            let mut parts = Vec::new();
            if let Some(m) = min {
                parts.push(format!("min {m}"));
            }
            if let Some(m) = max {
                parts.push(format!("max {m}"));
            }
            if let Some(s) = step {
                parts.push(format!("step {s}"));
            }
            parts.join(", ")
        }
        SettingKind::Select { options, .. } => format!(
            "options {}",
            options
                .iter()
                .map(|o| o.value.to_string())
                .collect::<Vec<_>>()
                .join(" | ")
        ),
        SettingKind::Text {
            max_length: Some(m),
            ..
        } => format!("max {m} characters"),
        _ => String::new(),
    };
    let modes = d
        .modes
        .iter()
        .map(|m| mode_str(*m))
        .collect::<Vec<_>>()
        .join(", ");
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!("; {extra}")
    };
    format!(
        "{} ({}) \"{}\" = {}{extra}; in {modes}",
        d.id,
        d.type_name(),
        d.label.localize("en"),
        d.default_value()
    )
}

fn summary_text(
    m: &PluginManifest,
    mode: Option<Mode>,
    csp: &str,
    compat: Option<&Compatibility>,
    problems: &[Problem],
) -> String {
    let r = &m.runtime;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} {}",
        m.app_name,
        m.plugin_version.as_deref().unwrap_or("(no pluginVersion)")
    );
    let _ = writeln!(s, "  id:          {}", m.id);
    let _ = writeln!(s, "  OQSEM:       {}", m.version);
    let _ = writeln!(s, "  protocol:    {}", r.protocol);
    let _ = writeln!(s, "  set:         {}", r.set.as_str());
    if let Some(t) = &m.types {
        let _ = writeln!(s, "  item types:  {}", t.join(", "));
    }
    let _ = writeln!(s, "  modes:       {}", modes_summary(r));
    let views: Vec<&str> = r.views.iter().map(|v| v.as_str()).collect();
    let _ = writeln!(s, "  views:       {}", views.join(", "));
    if r.settings.is_empty() {
        let _ = writeln!(s, "  settings:    none");
    } else {
        let _ = writeln!(s, "  settings:");
        for d in &r.settings {
            if mode.is_none_or(|m| d.applies_to(m)) {
                let _ = writeln!(s, "    {}", setting_line(d));
            }
        }
    }
    let _ = writeln!(
        s,
        "  network:     {}",
        if r.permissions.network.is_empty() {
            "none".to_owned()
        } else {
            r.permissions.network.join(", ")
        }
    );
    let _ = writeln!(
        s,
        "  devices:     {}",
        if r.permissions.devices.is_empty() {
            "none".to_owned()
        } else {
            r.permissions.devices.join(", ")
        }
    );
    if !r.services.is_empty() {
        let _ = writeln!(s, "  services:    {}", r.services.join(", "));
    }
    let _ = writeln!(s, "  sandbox:     {SANDBOX}");
    let allow = allow_attribute(Some(r));
    let _ = writeln!(
        s,
        "  allow:       {}",
        if allow.is_empty() { "(none)" } else { &allow }
    );
    let _ = writeln!(s, "  CSP:         {csp}");
    if let Some(c) = compat {
        if c.not_checked {
            let _ = writeln!(
                s,
                "  set check:   not checked (the plugin plays without a set)"
            );
        } else {
            let _ = writeln!(
                s,
                "  set check:   {} of {} items playable",
                c.playable_items, c.total_items
            );
        }
    }
    for w in m.warnings() {
        let _ = writeln!(s, "  ! warning: {}: {}", w.path, w.message);
    }
    if problems.is_empty() {
        let _ = writeln!(s, "✓ valid");
    } else {
        for p in problems {
            let _ = writeln!(s, "  ✗ {}", p.line());
        }
        let _ = writeln!(s, "✗ {} problem(s)", problems.len());
    }
    if r.set == SetUsage::Optional && compat.is_none() {
        let _ = writeln!(s, "  (the plugin can also play without a set)");
    }
    s
}

fn summary_json(
    m: &PluginManifest,
    mode: Option<Mode>,
    settings: &Map<String, Value>,
    csp: &str,
    compat: Option<&Compatibility>,
    problems: &[Problem],
) -> Value {
    let r = &m.runtime;
    let settings_list: Vec<Value> = r
        .settings
        .iter()
        .filter(|d| mode.is_none_or(|m| d.applies_to(m)))
        .map(|d| {
            json!({
                "id": d.id, "type": d.type_name(), "label": d.label, "default": d.default_value(),
                "modes": d.modes.iter().map(|m| mode_str(*m)).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "valid": problems.is_empty(),
        "manifest": {
            "id": m.id, "appName": m.app_name, "pluginVersion": m.plugin_version, "version": m.version.to_string(),
            "protocol": r.protocol.to_string(), "set": r.set.as_str(), "types": m.types,
            "modes": {
                "solo": r.solo,
                "multiplayer": r.multiplayer.as_ref().map(|mp| json!({
                    "players": {"min": mp.players.min, "max": mp.players.max, "recommended": mp.players.recommended},
                    "hostAs": mp.host_as, "lateJoin": mp.late_join,
                })),
            },
            "views": r.views,
            "settings": settings_list,
            "permissions": {"network": r.permissions.network, "devices": r.permissions.devices},
            "services": r.services,
        },
        "resolvedSettings": settings,
        "policy": {"sandbox": SANDBOX, "allow": allow_attribute(Some(r)), "contentSecurityPolicy": csp},
        "compatibility": compat.map(|c| json!({
            "checked": !c.not_checked, "compatible": c.is_compatible(),
            "playableItems": c.playable_items, "totalItems": c.total_items,
            "unsupportedTypes": c.unsupported_types,
        })),
        "problems": problems.iter().map(Problem::json).collect::<Vec<_>>(),
        "warnings": m.warnings().iter().map(|w| json!({
            "document": "manifest", "path": w.path, "message": w.message,
        })).collect::<Vec<_>>(),
    })
}
