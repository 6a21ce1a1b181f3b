//! The streamgate server: the S2 REST API and sessions (`api`), the HTTP listener
//! (`server`), browser access (`cors`), the dashboard, TLS, and the command line (`cli`). The binary (`main.rs`) wires them to
//! the engine and the RESP and OTLP front ends; `fuzz` holds the fuzzers' entry points.

pub mod api;
pub mod cli;
mod coalesce;
pub mod cors;
pub mod dashboard;
#[cfg(feature = "fuzz")]
pub mod fuzz;
pub mod init_file;
pub mod operator_metrics;
pub mod server;
pub mod tls;
