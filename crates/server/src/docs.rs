//! The protocols' docs pages (`docs/protocols/*.md`), built into the
//! binary and served rendered to HTML at `/docs/{name}`, so that the front
//! door links to pages this server itself serves (an operator's network
//! may not reach the repository). `{name}.md` is the same page: the pages
//! link to each other by file name.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use pulldown_cmark::{html, CowStr, Event, Options, Parser, Tag, TagEnd};
use std::collections::HashMap;
use std::sync::OnceLock;

/// Every page of `docs/protocols/`, by name (the file's stem).
pub const PAGES: &[(&str, &str)] = &[
    (
        "memizy-relay",
        include_str!("../../../docs/protocols/memizy-relay.md"),
    ),
    (
        "memizy-sessions",
        include_str!("../../../docs/protocols/memizy-sessions.md"),
    ),
    (
        "worker-rpc",
        include_str!("../../../docs/protocols/worker-rpc.md"),
    ),
    ("ggui", include_str!("../../../docs/protocols/ggui.md")),
    (
        "playerthree",
        include_str!("../../../docs/protocols/playerthree.md"),
    ),
];

/// The pages' screenshots (`docs/images/`), served at `/docs/images/{name}`;
/// a page's `../images/…` is pointed there.
pub const IMAGES: &[(&str, &[u8])] = &[
    (
        "lobby.png",
        include_bytes!("../../../docs/images/lobby.png"),
    ),
    (
        "running.png",
        include_bytes!("../../../docs/images/running.png"),
    ),
    (
        "running-controller.png",
        include_bytes!("../../../docs/images/running-controller.png"),
    ),
    (
        "results.png",
        include_bytes!("../../../docs/images/results.png"),
    ),
];

/// A rendered page may use only the server's stylesheet and images: no
/// script.
const PAGE_POLICY: &str =
    "default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'";

pub fn router() -> Router {
    Router::new()
        .route("/docs/{name}", get(page))
        .route("/docs/images/{name}", get(image))
}

/// `GET /docs/images/{name}`: a screenshot of the docs; 404 for another.
async fn image(Path(name): Path<String>) -> Response {
    let Some((_, bytes)) = IMAGES.iter().find(|(n, _)| *n == name) else {
        return (StatusCode::NOT_FOUND, "name: no such image").into_response();
    };
    (
        [
            (header::CONTENT_TYPE, "image/png"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        *bytes,
    )
        .into_response()
}

/// `GET /docs/{name}`: the page as HTML; 404 naming `name` for another.
async fn page(Path(name): Path<String>) -> Response {
    let stem = name.strip_suffix(".md").unwrap_or(&name);
    let Some(html) = rendered().get(stem) else {
        let known: Vec<&str> = PAGES.iter().map(|(n, _)| *n).collect();
        return (
            StatusCode::NOT_FOUND,
            format!(
                "name: no docs page {stem:?}; the pages are {}",
                known.join(", ")
            ),
        )
            .into_response();
    };
    crate::http::html_response(html.clone(), PAGE_POLICY)
}

/// Every page rendered once, at its first request.
fn rendered() -> &'static HashMap<&'static str, String> {
    static PAGES_HTML: OnceLock<HashMap<&'static str, String>> = OnceLock::new();
    PAGES_HTML.get_or_init(|| PAGES.iter().map(|(n, md)| (*n, render(md))).collect())
}

/// A Markdown page as a whole HTML document, its first heading the title.
pub fn render(markdown: &str) -> String {
    let title = markdown
        .lines()
        .find_map(|l| l.strip_prefix("# "))
        .unwrap_or("hostwire");
    let mut body = String::with_capacity(markdown.len() * 3 / 2);
    html::push_html(&mut body, with_heading_ids(markdown).into_iter());
    format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{} · hostwire</title>\n<link rel=\"stylesheet\" href=\"/memizy/play/play.css\">\n</head>\n<body class=\"front\">\n<main>\n<p><a href=\"/\">hostwire</a></p>\n{body}</main>\n</body>\n</html>\n",
        escape(title)
    )
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The page's events, each heading with the id GitHub gives it, so that
/// links such as `memizy-sessions.md#services` land where they do there,
/// and its screenshots from this server.
fn with_heading_ids(markdown: &str) -> Vec<Event<'_>> {
    let options = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH;
    let mut events: Vec<Event<'_>> = Parser::new_ext(markdown, options).collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut i = 0;
    while i < events.len() {
        if let Event::Start(Tag::Image { dest_url, .. }) = &mut events[i] {
            if let Some(name) = dest_url.strip_prefix("../images/") {
                *dest_url = CowStr::from(format!("/docs/images/{name}"));
            }
        }
        if let Event::Start(Tag::Heading { id: None, .. }) = &events[i] {
            let mut text = String::new();
            for e in &events[i + 1..] {
                match e {
                    Event::End(TagEnd::Heading(_)) => break,
                    Event::Text(t) | Event::Code(t) => text.push_str(t),
                    _ => {}
                }
            }
            let mut slug = slug(&text);
            let n = seen.entry(slug.clone()).or_insert(0);
            if *n > 0 {
                slug = format!("{slug}-{n}");
            }
            *n += 1;
            if let Event::Start(Tag::Heading {
                level,
                classes,
                attrs,
                ..
            }) = std::mem::replace(&mut events[i], Event::SoftBreak)
            {
                events[i] = Event::Start(Tag::Heading {
                    level,
                    id: Some(CowStr::from(slug)),
                    classes,
                    attrs,
                });
            }
        }
        i += 1;
    }
    events
}

/// GitHub's heading anchor: lower case, spaces to `-`, only letters,
/// digits, `-` and `_` kept.
fn slug(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_protocol_page_in_docs_is_served() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/protocols");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| {
                let p = e.unwrap().path();
                (p.extension()? == "md").then(|| p.file_stem()?.to_str().map(str::to_owned))?
            })
            .collect();
        on_disk.sort();
        let mut served: Vec<String> = PAGES.iter().map(|(n, _)| (*n).to_owned()).collect();
        served.sort();
        assert_eq!(
            on_disk, served,
            "a page added to docs/protocols/ is added to PAGES"
        );
    }

    #[test]
    fn every_image_of_the_docs_is_served() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/images");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        on_disk.sort();
        let mut served: Vec<String> = IMAGES.iter().map(|(n, _)| (*n).to_owned()).collect();
        served.sort();
        assert_eq!(
            on_disk, served,
            "an image added to docs/images/ is added to IMAGES"
        );
        let html = render("![lobby](../images/lobby.png)");
        assert!(html.contains("src=\"/docs/images/lobby.png\""), "{html}");
    }

    #[test]
    fn headings_get_githubs_anchors_and_tables_are_tables() {
        let html = render("# Top\n\n## Offline classrooms: the plugin SDK from hostwire\n\n## Top\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n");
        assert!(html.contains("<title>Top · hostwire</title>"), "{html}");
        assert!(
            html.contains("<h2 id=\"offline-classrooms-the-plugin-sdk-from-hostwire\">"),
            "{html}"
        );
        assert!(html.contains("<h2 id=\"top-1\">"), "{html}");
        assert!(
            html.contains("<table>") && html.contains("<td>1</td>"),
            "{html}"
        );
    }
}
