//! The Prometheus endpoint of a Cairn process (`--metrics-listen ADDR`): `GET /metrics` renders
//! everything recorded through the `metrics` facade (crate metrics-exporter-prometheus), served
//! by axum. docs/operations.md lists the metrics.

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::net::SocketAddr;

/// Upper bounds (seconds) of the latency histograms: 50 µs to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// Installs the process-wide recorder and serves it on `addr` (port 0: any free port).
/// Returns the bound address. Call inside the process's tokio runtime.
pub async fn serve(addr: SocketAddr, process: &'static str) -> anyhow::Result<SocketAddr> {
    let handle = PrometheusBuilder::new()
        .set_buckets(LATENCY_BUCKETS)?
        .add_global_label("process", process)
        .install_recorder()?;
    describe();
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || render(handle.clone())),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
    tracing::info!(%bound, "metrics on http://{bound}/metrics");
    Ok(bound)
}

async fn render(h: PrometheusHandle) -> String {
    h.render()
}

/// Help texts of the metrics Cairn records.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(
        "cairn_chunkserver_request_seconds",
        metrics::Unit::Seconds,
        "Data-plane request latency at the chunkserver, by opcode"
    );
    describe_counter!(
        "cairn_chunkserver_requests_total",
        "Data-plane requests served, by opcode and status"
    );
    describe_counter!(
        "cairn_chunkserver_bytes_total",
        "Payload bytes received (in) and sent (out) on the data plane"
    );
    describe_counter!(
        "cairn_chunkserver_faults_injected_total",
        "Requests delayed, failed or held by injected faults"
    );
    describe_counter!(
        "cairn_chunkserver_repair_bytes_total",
        "Bytes copied by repairs this server ran"
    );
    describe_counter!(
        "cairn_chunkserver_repairs_total",
        "Repairs this server finished, by result"
    );
    describe_gauge!("cairn_chunkserver_capacity_bytes", "Bytes of all disks");
    describe_gauge!("cairn_chunkserver_used_bytes", "Bytes in use on all disks");
    describe_gauge!("cairn_chunkserver_chunks", "Chunks held");
    describe_gauge!("cairn_master_is_leader", "1 on the Raft leader");
    describe_gauge!("cairn_master_term", "Raft term");
    describe_gauge!(
        "cairn_master_chunkservers",
        "Chunkservers by state (leader only)"
    );
    describe_gauge!(
        "cairn_master_under_replicated_chunks",
        "Sealed chunks short of copies (leader only)"
    );
    describe_gauge!(
        "cairn_master_under_replicated_bytes",
        "Bytes in chunks short of copies (leader only)"
    );
    describe_gauge!("cairn_master_lost_chunks", "Chunks with no good copy");
    describe_gauge!("cairn_master_repairs_running", "Repairs running");
    describe_gauge!(
        "cairn_master_repairs_finished",
        "Repairs finished since this master became leader, by result"
    );
    describe_gauge!(
        "cairn_master_repaired_bytes",
        "Bytes repaired since this master became leader"
    );
    describe_gauge!(
        "cairn_master_repair_rate_bytes_per_second",
        "Repair rate over the last 10 s"
    );
    describe_gauge!(
        "cairn_master_repair_cap_bytes_per_second",
        "Repair bandwidth cap"
    );
    describe_gauge!(
        "cairn_master_reporting_clients",
        "Clients that sent a health report in the last 10 s"
    );
    describe_gauge!(
        "cairn_master_server_reported_by",
        "Clients listing a chunkserver on a blacklist"
    );
    describe_gauge!(
        "cairn_master_server_avoided",
        "1 for chunkservers new chunks avoid (reported by many clients)"
    );
    describe_gauge!("cairn_master_files", "Files in the namespace");
    describe_gauge!("cairn_master_chunks", "Chunks in the namespace");
    describe_histogram!(
        "cairn_client_request_seconds",
        metrics::Unit::Seconds,
        "Client-observed latency of reads and writes, by chunkserver and size class"
    );
    describe_counter!(
        "cairn_client_backup_reads_total",
        "Backup reads: sent, won (answered first), denied (no budget)"
    );
    describe_gauge!(
        "cairn_client_blacklisted",
        "1 while a chunkserver is on this client's failed or slow list"
    );
    describe_counter!(
        "cairn_client_chasing_total",
        "Appends acknowledged with a replica still chasing (chased), replicas dropped, chunk switches"
    );
}
