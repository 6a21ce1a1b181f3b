//! Compatibility suites driven by the official S2 clients (see `tests/`, `python/`,
//! `node/`), and the benchmark programs (see `src/bin/`). The server under test is the
//! real binary, started through `streamgate_tests::Server`.

pub use streamgate_tests::{client, client_builder, wire, Server, ROOT_TOKEN};

/// The official Rust SDK pointed at `server` (plain http or https; certificates are not
/// verified, since test servers use self-signed ones).
pub fn sdk_client(server: &Server) -> s2_sdk::S2 {
    sdk_client_with_token(server, ROOT_TOKEN)
}

/// The official Rust SDK pointed at `server`, authenticating with `token`.
pub fn sdk_client_with_token(server: &Server, token: &str) -> s2_sdk::S2 {
    use s2_sdk::types::{S2Config, S2Endpoints};
    let config = S2Config::new(token)
        .with_endpoints(S2Endpoints::for_endpoint(&server.endpoint).expect("a valid endpoint"))
        .with_insecure_skip_cert_verification(true)
        .with_request_timeout(std::time::Duration::from_secs(30));
    s2_sdk::S2::new(config).expect("an SDK client")
}
