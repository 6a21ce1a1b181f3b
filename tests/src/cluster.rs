//! A cluster of real streamgate nodes for the tests and benchmarks: all on one new
//! PostgreSQL database and one new S3 bucket (the servers of `backends`), each with its
//! own data directory and ports.

use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::Value;

use crate::{backends, client, Server};

pub struct Cluster {
    _dir: tempfile::TempDir,
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// `count` nodes with extra flags (a lease time, say).
    pub fn start(count: usize, flags: &[&str]) -> Cluster {
        Self::start_with_metadata_servers(&vec![backends::postgres_server(); count], flags)
    }

    /// One node per `postgres://…` server URL (a proxy of its own, say), all on the
    /// same database.
    pub fn start_with_metadata_servers(servers: &[String], flags: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let tag = format!("{}{}", std::process::id(), rand::rng().random::<u32>());
        let objects = format!("s3://streamgate-test-cluster-{tag}/records");
        let endpoint = backends::s3_endpoint();
        let nodes = servers
            .iter()
            .enumerate()
            .map(|(i, server)| {
                let metadata = format!("{server}/streamgate_test_cluster_{tag}");
                let mut args = vec![
                    "--metadata",
                    &metadata,
                    "--objects",
                    &objects,
                    "--s3-endpoint",
                    &endpoint,
                ];
                args.extend_from_slice(flags);
                Server::start_with(&dir.path().join(format!("node{i}")), &args)
            })
            .collect();
        Cluster { _dir: dir, nodes }
    }

    /// The endpoint of node `node` (modulo the number of nodes).
    pub fn endpoint(&self, node: usize) -> String {
        self.nodes[node % self.nodes.len()].endpoint.clone()
    }

    /// `GET /cluster` of a node.
    pub async fn view(&self, node: usize) -> Value {
        let response = client()
            .get(format!("{}/cluster", self.endpoint(node)))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
        response.json().await.unwrap()
    }

    /// Waits until `node` sees `live` nodes whose lease holds.
    pub async fn wait_for_live_nodes(&self, node: usize, live: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let view = self.view(node).await;
            let count = view["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["live"] == true)
                .count();
            if count == live {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {node} never saw {live} live nodes: {view}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Which node has this endpoint (an advertised URL, say).
    pub fn node_at(&self, url: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.endpoint == url)
    }
}
