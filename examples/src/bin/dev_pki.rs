//! Generates the development certificates of `scripts/run.sh --secure` into a directory: one CA
//! (`demo-ca.pem`), a server certificate for `localhost`/127.0.0.1 for each of etcd, lease-proxy,
//! fence-gateway and the inventory (`etcd.pem`, `proxy.pem`, `gateway.pem`, `inventory.pem`,
//! keys beside them as `.key`), and client certificates: `proxy-etcd` (lease-proxy towards etcd),
//! `proxy-client` (lease-proxy towards the gateway: common name `lease-proxy`, the principal the
//! gateway's `--fence-principals` allows) and `operator` (a person with `curl`: common name
//! `operator`, a principal of the token file's `cert` lines).
//!
//! For demos and tests only: the CA's key is not kept, so nothing else can ever be signed by it,
//! and every run makes new ones.

use std::path::PathBuf;

use clap::Parser;
use lease_proxy_testkit::pki::Pki;

/// `dev-pki DIR`
#[derive(Parser)]
#[command(about = "Development certificates for scripts/run.sh --secure")]
struct Args {
    /// Directory to write the certificates and keys to (created if missing).
    dir: PathBuf,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Err(e) = std::fs::create_dir_all(&args.dir) {
        eprintln!("dev-pki: {}: {e}", args.dir.display());
        return std::process::ExitCode::FAILURE;
    }
    let pki = Pki::in_dir(&args.dir, "demo");
    for server in ["etcd", "proxy", "gateway", "inventory"] {
        pki.server(server);
    }
    pki.client("proxy-etcd", "lease-proxy-etcd", &[]);
    pki.client("proxy-client", "lease-proxy", &[]);
    pki.client("operator", "operator", &[]);
    println!("{}", pki.ca().display());
    std::process::ExitCode::SUCCESS
}
