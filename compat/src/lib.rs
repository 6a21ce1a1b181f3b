//! Compatibility suites driven by the official S2 clients (see `tests/`), and the
//! benchmark programs (see `src/bin/`). The server under test is the real binary,
//! started through `streamgate_tests::Server`.

pub use streamgate_tests::{wire, Server};
