//! Browser access to the HTTP API (CORS), so the TypeScript SDK, dashboards and
//! OpenTelemetry's browser exporters can call streamgate from a page on another origin.
//! As s2-lite does, by default any origin may call, with credentials, any method and any
//! request header (the S2 headers among them: `authorization`, `s2-basin`, `s2-format`,
//! `s2-encryption-key`, `s2-request-token`, …); `--cors-allow-origin` narrows that to a
//! list of origins, and `--no-cors` sends no CORS headers at all. Preflights are answered
//! before authentication (a browser sends them without credentials); streaming
//! responses (SSE, S2S) carry the headers like any other.

use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer};

/// Which origins may call the API from a browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorsPolicy {
    /// Every origin (the default).
    AnyOrigin,
    /// Only these origins (`scheme://host[:port]`).
    Origins(Vec<HeaderValue>),
    /// No CORS headers: browsers allow only pages of the server's own origin.
    Off,
}

impl CorsPolicy {
    /// The policy the flags ask for; an origin that is not `scheme://host[:port]` is an
    /// error naming it.
    pub fn from_flags(no_cors: bool, origins: &[String]) -> anyhow::Result<CorsPolicy> {
        if no_cors {
            if !origins.is_empty() {
                anyhow::bail!("--no-cors and --cors-allow-origin exclude each other; give one");
            }
            return Ok(CorsPolicy::Off);
        }
        if origins.is_empty() || origins.iter().any(|o| o == "*") {
            return Ok(CorsPolicy::AnyOrigin);
        }
        let origins = origins
            .iter()
            .map(|origin| {
                // Browsers send the scheme and host in lowercase.
                let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
                let origin = origin.as_str();
                let valid = origin.split_once("://").is_some_and(|(scheme, host)| {
                    matches!(scheme, "http" | "https") && !host.is_empty() && !host.contains('/')
                });
                if !valid {
                    anyhow::bail!(
                        "--cors-allow-origin: `{origin}` is not an origin; write it as a browser \
                         sends it, e.g. `https://app.example.com` or `http://localhost:5173`"
                    );
                }
                Ok(HeaderValue::from_str(origin)?)
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(CorsPolicy::Origins(origins))
    }

    /// The layer that answers preflights and adds the headers; `None` when off.
    pub fn layer(&self) -> Option<CorsLayer> {
        let origin = match self {
            CorsPolicy::Off => return None,
            CorsPolicy::AnyOrigin => AllowOrigin::mirror_request(),
            CorsPolicy::Origins(origins) => AllowOrigin::list(origins.clone()),
        };
        Some(
            CorsLayer::new()
                .allow_origin(origin)
                .allow_credentials(true)
                .allow_methods(AllowMethods::mirror_request())
                .allow_headers(AllowHeaders::mirror_request())
                // Response headers a page may read beyond the always-readable ones.
                .expose_headers([
                    HeaderName::from_static("s2-provision-result"),
                    HeaderName::from_static("retry-after"),
                ])
                // Browsers may keep a preflight's answer for an hour.
                .max_age(Duration::from_secs(3600)),
        )
    }

    /// How the banner describes it.
    pub fn describe(&self) -> String {
        match self {
            CorsPolicy::AnyOrigin => "any origin".into(),
            CorsPolicy::Origins(origins) => origins
                .iter()
                .map(|o| o.to_str().unwrap_or("?"))
                .collect::<Vec<_>>()
                .join(", "),
            CorsPolicy::Off => "off".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_choose_the_policy_and_bad_origins_are_named() {
        assert_eq!(
            CorsPolicy::from_flags(false, &[]).unwrap(),
            CorsPolicy::AnyOrigin
        );
        assert_eq!(CorsPolicy::from_flags(true, &[]).unwrap(), CorsPolicy::Off);
        assert!(CorsPolicy::from_flags(true, &["https://a.example".into()]).is_err());
        let listed = CorsPolicy::from_flags(
            false,
            &["https://a.example/".into(), "http://localhost:3000".into()],
        )
        .unwrap();
        assert_eq!(
            listed.describe(),
            "https://a.example, http://localhost:3000"
        );
        let err = CorsPolicy::from_flags(false, &["a.example".into()]).unwrap_err();
        assert!(
            err.to_string().contains("`a.example` is not an origin"),
            "{err}"
        );
        assert!(CorsPolicy::Off.layer().is_none());
    }
}
