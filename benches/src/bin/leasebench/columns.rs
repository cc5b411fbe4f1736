//! The columns of leasebench's tables: every side an operation is measured on, the peers
//! `--peers` adds, and what each table's operation is run against.

use std::sync::Arc;

use lease_proxy_benches::stack::Stack;

use super::args::Args;
use super::ops::{self, Op};
use super::raw::{self, RawEtcd};
use super::sides::{Side, Table};
use super::{gateway, grpc, http, peers, sessions, take};

/// The columns of every requested operation's table. `proxy_held`/`sessions` are shared by
/// the proxy's HTTP/1.1 and h2c clients (one proxy); `unbatched` is a second proxy on the
/// same etcd started with `--batch-max 1`; `grpc` the gRPC clients of etcd and of the proxy,
/// when a gRPC operation is measured.
pub(crate) struct Columns {
    pub(crate) raw: Arc<RawEtcd>,
    pub(crate) raw_held: Arc<Vec<raw::RawHeld>>,
    pub(crate) proxy: Arc<http::Proxy>,
    pub(crate) proxy_held: Arc<Vec<http::ProxyHeld>>,
    pub(crate) sessions: Arc<Vec<sessions::ProxySession>>,
    pub(crate) h2c: Option<Arc<http::Proxy>>,
    pub(crate) unbatched: Option<Arc<http::Proxy>>,
    pub(crate) unbatched_in_flight: Option<usize>,
    pub(crate) grpc: Option<(Arc<grpc::Grpc>, Arc<grpc::Grpc>)>,
    /// The proxy's pid, when started here.
    pub(crate) proxy_pid: Option<u32>,
    /// The peers, with `--peers`.
    pub(crate) peers: Option<Peers>,
}

/// What `--peers` measures beside the proxy (see `peers`).
pub(crate) struct Peers {
    /// etcd's grpc-proxy, namespaced, and its pid.
    pub(crate) grpc_proxy: (Arc<grpc::Grpc>, u32),
    /// The bare pass-through to etcd, and its pid.
    pub(crate) pass_through: (Arc<grpc::Grpc>, u32),
    /// etcd's JSON gateway on its client port.
    pub(crate) gateway: Arc<gateway::Gateway>,
    pub(crate) gateway_held: Arc<Vec<gateway::GatewayHeld>>,
    /// The proxy's `/v3` JSON gateway.
    pub(crate) v3: Arc<gateway::Gateway>,
    pub(crate) v3_held: Arc<Vec<gateway::GatewayHeld>>,
}

impl Peers {
    /// Starts grpc-proxy and the pass-through on `etcd_url`'s etcd, and takes the held leases
    /// the JSON gateways' `renew` and `get` need.
    pub(crate) async fn start(
        args: &Args,
        stack: &mut Stack,
        etcd_url: &str,
        proxy_url: &str,
    ) -> anyhow::Result<Self> {
        let (gp_url, gp) = peers::grpc_proxy(stack, &args.etcd_bin, etcd_url).await?;
        let (pt_url, pt) = peers::pass_through(stack, etcd_url).await?;
        let gateway = Arc::new(gateway::Gateway::new(etcd_url, "/leasebench-gateway/"));
        let v3 = Arc::new(gateway::Gateway::new(proxy_url, ""));
        let holds = args.op.iter().any(|op| op.needs_held());
        let names = |side: &str| -> Vec<String> {
            (0..if holds { args.held } else { 0 })
                .map(|i| format!("lb-held-{side}-{}-{i}", std::process::id()))
                .collect()
        };
        let gateway_held = Arc::new(ops::acquire_all(&gateway, names("g"), 600, 64).await?);
        let v3_held = Arc::new(ops::acquire_all(&v3, names("v"), 600, 64).await?);
        Ok(Self {
            grpc_proxy: (Arc::new(grpc::Grpc::connect(&gp_url, "").await?), gp.pid),
            pass_through: (
                Arc::new(grpc::Grpc::connect(&pt_url, peers::PASS_THROUGH_PREFIX).await?),
                pt.pid,
            ),
            gateway,
            gateway_held,
            v3,
            v3_held,
        })
    }
}

impl Columns {
    /// Gives back what [`setup`] took; the tables (which share the held sets) must be gone.
    pub(crate) async fn teardown(self) -> anyhow::Result<()> {
        if let Some(p) = self.peers {
            ops::release_all(&p.gateway, take(p.gateway_held)?, 64).await?;
            ops::release_all(&p.v3, take(p.v3_held)?, 64).await?;
        }
        ops::release_all(&self.raw, take(self.raw_held)?, 64).await?;
        ops::release_all(&self.proxy, take(self.proxy_held)?, 64).await?;
        sessions::close_all(&self.proxy, &self.sessions, 64).await
    }

    pub(crate) fn tables(&self, args: &Args) -> Vec<Table> {
        args.op
            .iter()
            .map(|&op| self.table(op, args.renewals))
            .collect()
    }

    /// `op`'s columns: the naive raw etcd first (the baseline of every ratio), then the best
    /// raw variant where one exists, the proxy without group commit, the proxy, the proxy over
    /// h2c.
    pub(crate) fn table(&self, op: Op, renewals: usize) -> Table {
        if let (true, Some((etcd, proxy))) = (op.is_grpc(), &self.grpc) {
            let side = |name: &str, g: &Arc<grpc::Grpc>| {
                let g = g.clone();
                Side::new(name, move |c, n, tag| {
                    let g = g.clone();
                    async move { grpc::measure(&g, op, c, n, &tag).await }
                })
            };
            let proxy = side("proxy", proxy)
                .probed(&self.proxy)
                .process(self.proxy_pid);
            let sides = match &self.peers {
                // The peer first: every ratio is over it.
                Some(p) => vec![
                    side("grpc-proxy", &p.grpc_proxy.0).process(Some(p.grpc_proxy.1)),
                    side("pass-through", &p.pass_through.0).process(Some(p.pass_through.1)),
                    proxy,
                    side("etcd", etcd),
                ],
                None => vec![side("etcd", etcd), proxy],
            };
            return Table {
                op: op.name(),
                sides,
            };
        }
        if op == Op::Lock {
            return self.locks();
        }
        if let (
            Some(p),
            Op::Acquire | Op::Contended | Op::Release | Op::Cycle | Op::Renew | Op::Get,
        ) = (&self.peers, op)
        {
            // The JSON gateway first: every ratio is over it; raw etcd's gRPC last, as context.
            return Table {
                op: op.name(),
                sides: vec![
                    Side::op("etcd gateway", &p.gateway, op, &p.gateway_held, renewals),
                    Side::op("proxy /v3", &p.v3, op, &p.v3_held, renewals).process(self.proxy_pid),
                    Side::op("proxy", &self.proxy, op, &self.proxy_held, renewals)
                        .probed(&self.proxy)
                        .process(self.proxy_pid),
                    Side::op("etcd", &self.raw, op, &self.raw_held, renewals),
                ],
            };
        }
        let single =
            |name: &str, p: &Arc<http::Proxy>| Side::op(name, p, op, &self.proxy_held, renewals);
        let in_session = |name: &str, p: &Arc<http::Proxy>| {
            let p = p.clone();
            Side::new(name, move |c, n, tag| {
                let p = p.clone();
                async move { sessions::measure(&p, c, n, None, &tag).await }
            })
        };
        let session_cycle = |name: &str, p: &Arc<http::Proxy>| {
            let p = p.clone();
            Side::new(name, move |c, n, tag| {
                let p = p.clone();
                async move { sessions::measure(&p, c, n, Some(renewals), &tag).await }
            })
        };
        let heartbeat = |name: &str, p: &Arc<http::Proxy>| {
            let beats = Arc::new(sessions::Heartbeats(p.clone()));
            Side::op(name, &beats, Op::Renew, &self.sessions, renewals)
        };
        let proxy_side = |name: &str, p: &Arc<http::Proxy>| {
            let side = match op {
                Op::SessionAcquire => in_session(name, p),
                Op::SessionCycle => session_cycle(name, p),
                Op::SessionKeepalive => heartbeat(name, p),
                _ => single(name, p),
            };
            // The unbatched proxy is a process of its own, not counted as this side's.
            let pid = self.proxy_pid.filter(|_| {
                Arc::ptr_eq(p, &self.proxy) || self.h2c.as_ref().is_some_and(|h| Arc::ptr_eq(p, h))
            });
            side.probed(p).process(pid)
        };
        let raw_op = match op {
            Op::SessionAcquire => Op::Acquire,
            Op::SessionCycle => Op::Cycle,
            Op::SessionKeepalive => Op::Renew,
            other => other,
        };
        let mut sides = vec![Side::op(
            "etcd",
            &self.raw,
            raw_op,
            &self.raw_held,
            renewals,
        )];
        if op == Op::SessionAcquire {
            let raw = self.raw.clone();
            sides.push(Side::new("etcd session", move |c, n, tag| {
                let raw = raw.clone();
                async move { sessions::measure(&raw, c, n, None, &tag).await }
            }));
        }
        if op == Op::SessionCycle {
            let raw = self.raw.clone();
            sides.push(Side::new("etcd session", move |c, n, tag| {
                let raw = raw.clone();
                async move { sessions::measure(&raw, c, n, Some(renewals), &tag).await }
            }));
        }
        if let (Some(p), Op::Acquire | Op::SessionAcquire | Op::SessionCycle) =
            (&self.unbatched, op)
        {
            let name = match self.unbatched_in_flight {
                Some(n) => format!("proxy batch-max 1 in-flight {n}"),
                None => "proxy batch-max 1".to_owned(),
            };
            sides.push(proxy_side(&name, p));
        }
        sides.push(proxy_side("proxy", &self.proxy));
        if let Some(p) = &self.h2c {
            sides.push(proxy_side("proxy h2c", p));
        }
        Table {
            op: op.name(),
            sides,
        }
    }

    /// `lock`'s columns: each side takes and gives back a distinct resource under a session
    /// per worker (`sessions::measure` with no renewals); with `--peers`, etcd's JSON gateway
    /// first (its lock service, every ratio over it), then the proxy's `/v3` lock service.
    fn locks(&self) -> Table {
        fn side<S: sessions::SessionBackend>(name: &str, backend: &Arc<S>) -> Side {
            let backend = backend.clone();
            Side::new(name, move |c, n, tag| {
                let backend = backend.clone();
                async move { sessions::measure(&backend, c, n, Some(0), &tag).await }
            })
        }
        let mut sides = Vec::new();
        if let Some(p) = &self.peers {
            sides.push(side("etcd gateway", &p.gateway));
            sides.push(side("proxy /v3", &p.v3).process(self.proxy_pid));
        }
        sides.push(
            side("proxy", &self.proxy)
                .probed(&self.proxy)
                .process(self.proxy_pid),
        );
        sides.push(side("etcd", &self.raw));
        Table {
            op: Op::Lock.name(),
            sides,
        }
    }

    /// Every column's name, in order of first appearance, for the chart.
    pub(crate) fn names(tables: &[Table]) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for side in tables.iter().flat_map(|t| &t.sides) {
            if !names.contains(&side.name) {
                names.push(side.name.clone());
            }
        }
        names
    }
}
