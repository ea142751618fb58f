//! `hostwire check` as a user runs it: the real binary on real files.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hostwire"))
        .arg("check")
        .args(args)
        .current_dir(root())
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
    )
}

/// A file in a directory of its own, both removed when dropped.
struct TempFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl std::ops::Deref for TempFile {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TempFile {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

fn temp(name: &str, content: &str) -> TempFile {
    let dir = tempfile::Builder::new()
        .prefix("hostwire-check-")
        .tempdir()
        .unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    TempFile { _dir: dir, path }
}

#[test]
fn valid_plugin_prints_a_summary_and_exits_0() {
    let (code, out) = run(&[
        "examples/quiz-race.html",
        "--set",
        "examples/quiz.oqse.json",
    ]);
    assert_eq!(code, 0, "{out}");
    for needle in [
        "Quiz Race 1.2.0",
        "protocol:    1.0",
        "views:       solo, board, controller, settings",
        "questionTime (number)",
        "= 20",
        "connect-src",
        "wss://live.example.org:8443",
        "allow:       microphone *",
        "5 of 5 items playable",
        "✓ valid",
    ] {
        assert!(out.contains(needle), "{needle:?} missing:\n{out}");
    }
}

#[test]
fn json_output_is_one_document() {
    let (code, out) = run(&[
        "examples/quiz-race.html",
        "--json",
        "--mode",
        "solo",
        "--host-origin",
        "https://play.example.org",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["manifest"]["appName"], "Quiz Race");
    assert_eq!(v["resolvedSettings"]["questionTime"], 20);
    // Only the settings that apply to solo are listed.
    assert_eq!(v["manifest"]["settings"].as_array().unwrap().len(), 2);
    assert!(v["policy"]["contentSecurityPolicy"]
        .as_str()
        .unwrap()
        .contains("https://play.example.org"));
}

#[test]
fn incompatible_set_exits_1_with_every_problem() {
    let (code, out) = run(&[
        "examples/quiz-race.html",
        "--set",
        "examples/every-type.oqse.json",
        "--json",
    ]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["compatibility"]["compatible"], false);
    assert_eq!(v["compatibility"]["unsupportedTypes"]["timeline"], 2);
    assert!(v["problems"].as_array().unwrap().len() > 10);
}

#[test]
fn invalid_manifest_exits_1_and_names_paths() {
    let html = r#"<script type="application/oqse-manifest+json">{"version":"1.0","id":"x","appName":"A","appSpecific":{"memizy":{"protocol":"1","modes":{}}}}</script>"#;
    let p = temp("bad.html", html);
    let (code, out) = run(&[p.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    for needle in [
        "id: must be a URL",
        "appSpecific.memizy.protocol:",
        "appSpecific.memizy.modes:",
        "capabilities.types:",
    ] {
        assert!(out.contains(needle), "{needle:?} missing:\n{out}");
    }
    let (code, out) = run(&[p.to_str().unwrap(), "--json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["path"] == "appSpecific.memizy.protocol"));
}

#[test]
fn unsupported_mode_is_invalid() {
    let html = r#"<script type="application/oqse-manifest+json">{"version":"1.0","id":"https://a.org/p","appName":"A","capabilities":{"types":["*"]},"appSpecific":{"memizy":{"protocol":"1.0","modes":{"solo":{}}}}}</script>"#;
    let p = temp("solo.html", html);
    assert_eq!(run(&[p.to_str().unwrap(), "--mode", "solo"]).0, 0);
    let (code, out) = run(&[p.to_str().unwrap(), "--mode", "multiplayer"]);
    assert_eq!(code, 1);
    assert!(out.contains("does not declare multiplayer"));
    let newer = html.replace(r#""protocol":"1.0""#, r#""protocol":"1.7""#);
    let p = temp("newer.html", &newer);
    let (code, out) = run(&[p.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(out.contains("needs a newer host"), "{out}");
}

#[test]
fn unreadable_input_exits_2() {
    assert_eq!(run(&["does/not/exist.html"]).0, 2);
    let bin = temp("bin.html", "");
    std::fs::write(&bin, [0xff, 0xfe, 0x00]).unwrap();
    assert_eq!(run(&[bin.to_str().unwrap()]).0, 2);
    let bad_set = temp("set.json", "{ not json");
    let (code, out) = run(&[
        "examples/quiz-race.html",
        "--set",
        bad_set.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(out.contains("not valid JSON"), "{out}");
}

#[test]
fn set_problems_name_their_json_path_in_the_set() {
    let set = temp(
        "set.json",
        r#"{"version": "2.0", "items": [{"id": "a", "type": "mcq-single"}, {"id": "b"}]}"#,
    );
    let (code, out) = run(&[
        "examples/quiz-race.html",
        "--set",
        set.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let problems = v["problems"].as_array().unwrap();
    let find = |path: &str| {
        problems
            .iter()
            .find(|p| p["path"] == path)
            .unwrap_or_else(|| panic!("no problem at {path}: {problems:#?}"))
    };
    let untyped = find("items[1].type");
    assert_eq!(untyped["document"], "set");
    assert_eq!(untyped["message"], "is required");
    let version = find("version");
    assert_eq!(version["document"], "set");
    assert!(
        version["message"].as_str().unwrap().starts_with("OQSE 2.0"),
        "{version}"
    );
    // In text, the set's problems say so, then give the path.
    let (_, out) = run(&["examples/quiz-race.html", "--set", set.to_str().unwrap()]);
    assert!(out.contains("✗ set items[1].type: is required"), "{out}");
}

#[test]
fn manifest_problems_name_their_json_path_and_document() {
    // A repeated setting id is found even though both settings have other
    // problems.
    let html = r#"<script type="application/oqse-manifest+json">{"version":"1.0","id":"https://a.org/p","appName":"A","capabilities":{"types":["*"]},"appSpecific":{"memizy":{"protocol":"1.0","modes":{"solo":{}},"settings":[{"id":"t","type":"number","label":"T"},{"id":"t","type":"boolean","label":"","default":true}]}}}</script>"#;
    let p = temp("dup.html", html);
    let (code, out) = run(&[p.to_str().unwrap(), "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let problems = v["problems"].as_array().unwrap();
    for path in [
        "appSpecific.memizy.settings[0].default",
        "appSpecific.memizy.settings[1].label",
        "appSpecific.memizy.settings[1].id",
    ] {
        let found = problems.iter().find(|p| p["path"] == path);
        let found = found.unwrap_or_else(|| panic!("no problem at {path}: {problems:#?}"));
        assert_eq!(found["document"], "manifest");
    }
}

#[test]
fn a_json_syntax_error_names_the_line_of_the_plugin_file() {
    let html = "<!DOCTYPE html>\n<html>\n<head>\n  <script type=\"application/oqse-manifest+json\">\n  {\n    \"version\": \"1.0\",\n    \"appName\": \"A\"\n    \"id\": \"https://a.org/p\"\n  }\n  </script>\n";
    let p = temp("syntax.html", html);
    let (code, out) = run(&[p.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    // The missing comma is noticed at `"id"`, line 8 of the file.
    assert!(out.contains("at line 8 column 5 of the HTML file"), "{out}");
}

#[test]
fn a_draft_oqsem_manifest_is_valid_with_a_warning() {
    let html = std::fs::read_to_string(root().join("examples/quiz-race.html")).unwrap();
    assert!(
        html.contains("\"version\": \"1.0\""),
        "the example declares OQSEM 1.0"
    );
    let draft = temp(
        "draft.html",
        &html.replacen("\"version\": \"1.0\"", "\"version\": \"0.2\"", 1),
    );
    let (code, out) = run(&[draft.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("warning: version: OQSEM 0.2 is a draft"),
        "{out}"
    );
    let (code, out) = run(&[draft.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["warnings"][0]["path"], "version", "{out}");
    let other = temp(
        "other.html",
        &html.replacen("\"version\": \"1.0\"", "\"version\": \"2.0\"", 1),
    );
    let (code, out) = run(&[other.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
}
