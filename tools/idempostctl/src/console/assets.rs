//! The page itself: `console/static` (the HTML page and its stylesheet) and the script esbuild
//! bundled from `console/src` (committed in `console/dist`, so a `cargo build` needs no Node; a
//! test fails when it is stale), and the page's settings.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

/// Scripts, styles and calls from this origin only; no inline script or style, no plugin, no
/// frame, no form posted anywhere.
pub(super) const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

const INDEX: &str = include_str!("../../console/static/index.html");
const SCRIPT: &str = include_str!("../../console/dist/console.js");
const STYLE: &str = include_str!("../../console/static/console.css");

/// The paths of the static routes: the only ones served without a session.
pub(super) const PATHS: [&str; 4] = ["/", "/console.js", "/console.css", "/config.json"];

/// The static routes ([`PATHS`]): the page, its script and style, and `/config.json` (what the page cannot
/// know by itself; nothing secret).
pub(super) fn router(jaeger_url: Option<&str>) -> Router {
    let config = serde_json::json!({ "jaegerUrl": jaeger_url.map(|u| u.trim_end_matches('/')) }).to_string();
    Router::new()
        .route("/", get(|| async { page("text/html; charset=utf-8", INDEX) }))
        .route("/console.js", get(|| async { page("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/console.css", get(|| async { page("text/css; charset=utf-8", STYLE) }))
        .route(
            "/config.json",
            get(move || async move { ([(header::CONTENT_TYPE, "application/json")], config) }),
        )
}

fn page(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, content_type)], body)
}
