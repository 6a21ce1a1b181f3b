//! The dashboard at `/dashboard`: static assets compiled into the binary (no build step,
//! no CDN, works offline), a client of the same REST API as every other, with the
//! user's access token. Pages go out with a Content-Security-Policy that allows only
//! this origin's scripts, styles and API, so nothing a stream holds can run as code.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

const INDEX: &str = include_str!("../dashboard/index.html");
const SCRIPT: &str = include_str!("../dashboard/app.js");
const STYLE: &str = include_str!("../dashboard/app.css");

const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// What the pages learn of the server beyond its API: its version and the RESP address
/// (for the connection snippets).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerInfo {
    pub version: &'static str,
    pub resp: Option<String>,
}

/// The dashboard's routes, or (with `--no-dashboard`) a clear 404 in their place.
pub fn router(enabled: bool, info: ServerInfo) -> Router {
    if !enabled {
        let off = || async {
            (
                axum::http::StatusCode::NOT_FOUND,
                "the dashboard is turned off on this server (--no-dashboard)\n",
            )
        };
        return Router::new()
            .route("/dashboard", get(off))
            .route("/dashboard/{*rest}", get(off));
    }
    Router::new()
        .route(
            "/dashboard",
            get(|| async { asset(INDEX, "text/html; charset=utf-8") }),
        )
        .route(
            "/dashboard/",
            get(|| async { asset(INDEX, "text/html; charset=utf-8") }),
        )
        .route(
            "/dashboard/app.js",
            get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/dashboard/app.css",
            get(|| async { asset(STYLE, "text/css; charset=utf-8") }),
        )
        .route(
            "/dashboard/server.json",
            get(move || {
                let info = info.clone();
                async move { Json(info) }
            }),
        )
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
