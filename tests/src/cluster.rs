//! A cluster of real streamgate nodes for the tests and benchmarks: all on one new
//! PostgreSQL database and one new S3 bucket (the servers of `backends`), each with its
//! own data directory and ports.

use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::Value;

use crate::{backends, client, Server};

pub struct Cluster {
    dir: tempfile::TempDir,
    /// What every node's name for the database and its bucket are made from.
    tag: String,
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
        let mut cluster = Cluster {
            dir: tempfile::tempdir().unwrap(),
            tag: format!("{}{}", std::process::id(), rand::rng().random::<u32>()),
            nodes: Vec::new(),
        };
        for server in servers {
            cluster.add_node_through(server, flags);
        }
        cluster
    }

    /// Starts one more node (a node joining the running cluster); its index.
    pub fn add_node(&mut self, flags: &[&str]) -> usize {
        self.add_node_through(&backends::postgres_server(), flags)
    }

    fn add_node_through(&mut self, server: &str, flags: &[&str]) -> usize {
        let tag = &self.tag;
        let metadata = format!("{server}/streamgate_test_cluster_{tag}");
        let objects = format!("s3://streamgate-test-cluster-{tag}/records");
        let endpoint = backends::s3_endpoint();
        let mut args = vec![
            "--metadata",
            &metadata,
            "--objects",
            &objects,
            "--s3-endpoint",
            &endpoint,
        ];
        args.extend_from_slice(flags);
        let index = self.nodes.len();
        let data_dir = self.dir.path().join(format!("node{index}"));
        self.nodes.push(Server::start_with(&data_dir, &args));
        index
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

    /// Waits until `node` sees `live` nodes whose lease holds and that have started
    /// (streams are placed only on those).
    pub async fn wait_for_live_nodes(&self, node: usize, live: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let view = self.view(node).await;
            let count = view["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["live"] == true && n["ready"] == true)
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

    /// How many times node `node` has looked up a stream's owner in the metadata store
    /// (it needs `--metrics-listen`).
    pub async fn owner_lookups(&self, node: usize) -> u64 {
        const SERIES: &str = "streamgate_metadata_requests_total{operation=\"looking up a stream's owner\",outcome=\"ok\"}";
        let text = self.nodes[node].scrape_metrics().await;
        crate::prometheus_sample(&text, SERIES).unwrap_or(0.0) as u64
    }

    /// Which node has this endpoint (an advertised URL, say).
    pub fn node_at(&self, url: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.endpoint == url)
    }
}
