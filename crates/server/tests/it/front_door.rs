//! The front door (`GET /`) and the docs pages it links to, served by the
//! server itself from `docs/protocols/`.

use crate::support::session::TestHost;

async fn get(url: &str) -> (u16, String, String) {
    let r = reqwest::get(url).await.unwrap();
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, ct, r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_doors_docs_are_links_to_pages_served_here() {
    let h = TestHost::start().await;
    let (s, _, front) = get(&format!("{}/", h.http)).await;
    assert_eq!(s, 200);
    let links: Vec<&str> = front
        .split("href=\"/docs/")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap())
        .collect();
    assert_eq!(
        links,
        [
            "memizy-relay",
            "memizy-sessions",
            "worker-rpc",
            "ggui",
            "playerthree"
        ],
        "every protocol's docs page is a link"
    );
    assert!(
        !front.contains(".md</code></td>"),
        "no doc named as a path: {front}"
    );
    for name in links {
        let (s, ct, page) = get(&format!("{}/docs/{name}", h.http)).await;
        assert_eq!(s, 200, "{name}: {page}");
        assert_eq!(ct, "text/html; charset=utf-8");
        assert!(page.contains("<h1 id="), "{name} rendered: {page}");
        assert!(!page.contains("\n# "), "{name}: no Markdown left");
    }
    // The pages link to each other by file name: that is the same page.
    let (_, _, sessions) = get(&format!("{}/docs/memizy-sessions", h.http)).await;
    assert!(
        sessions.contains("<table>")
            && sessions.contains("id=\"offline-classrooms-the-plugin-sdk-from-hostwire\""),
        "tables and heading anchors"
    );
    let (s, _, by_file) = get(&format!("{}/docs/memizy-sessions.md", h.http)).await;
    assert_eq!((s, &by_file), (200, &sessions));
    // Its screenshots are served too.
    assert!(sessions.contains("src=\"/docs/images/lobby.png\""));
    let (s, ct, png) = get(&format!("{}/docs/images/lobby.png", h.http)).await;
    assert_eq!((s, ct.as_str()), (200, "image/png"));
    assert!(!png.is_empty());
    let (s, _, _) = get(&format!("{}/docs/images/nope.png", h.http)).await;
    assert_eq!(s, 404);
    // Unknown names, and paths out of the folder, are 404.
    for bad in [
        "nope",
        "operations",
        "..%2FCargo.toml",
        "memizy-sessions.txt",
    ] {
        let (s, _, body) = get(&format!("{}/docs/{bad}", h.http)).await;
        assert_eq!(s, 404, "{bad}: {body}");
    }
    let (s, _, body) = get(&format!("{}/docs/nope", h.http)).await;
    assert_eq!(s, 404);
    assert!(body.starts_with("name: no docs page \"nope\""), "{body}");
}
