//! A lease-proxy in this process on a free port, in front of a real etcd (from
//! `lease-proxy-testkit`), for the SDK's tests.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lease_proxy::Config;

pub mod fake;

pub use lease_proxy_testkit::Etcd;

pub use lease_proxy_testkit::proxy::Proxy;

/// Starts a proxy on `etcd` with test defaults (shortest TTL 2 s, a key prefix of its own, so
/// that tests can share one etcd), adjusted by `tweak`; `ready` is the client used to see it
/// ready (it must trust its certificate under TLS).
pub async fn start_proxy_with(
    etcd: &Etcd,
    ready: &reqwest::Client,
    tweak: impl FnOnce(&mut Config),
) -> Proxy {
    Proxy::start_https(etcd.endpoints(), ready, |config| {
        config.min_ttl = 2;
        config.etcd_prefix = lease_proxy_testkit::prefix("sdk");
        tweak(config);
    })
    .await
}

/// Starts a plain-HTTP proxy on `etcd` with test defaults.
pub async fn start_proxy(etcd: &Etcd) -> Proxy {
    start_proxy_with(etcd, &reqwest::Client::new(), |_| {}).await
}

/// Revokes etcd lease `id` (decimal, as the API writes it) directly in etcd.
pub async fn revoke_in_etcd(etcd: &Etcd, id: &str) {
    etcd.client()
        .await
        .lease_revoke(id.parse::<i64>().unwrap())
        .await
        .unwrap();
}

/// A TCP relay in front of `target` (`host:port`) that delays every chunk of every answer by
/// `delay` and, with `drop_first_answer`, reads the first connection's answer and closes it
/// unsent (the request was served, the client sees a transport error). Returns its URL.
pub async fn relay(target: &str, delay: Duration, drop_first_answer: bool) -> String {
    Relay::start(target, delay, drop_first_answer).await.url
}

/// A running relay (see [`relay`]) whose open connections can be cut.
pub struct Relay {
    pub url: String,
    cuts: tokio::sync::watch::Sender<u64>,
}

impl Relay {
    pub async fn start(target: &str, delay: Duration, drop_first_answer: bool) -> Relay {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let target = target.to_owned();
        let (cuts, cut_rx) = tokio::sync::watch::channel(0u64);
        tokio::spawn(async move {
            let mut first = drop_first_answer;
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let drop_answer = std::mem::take(&mut first);
                let target = target.clone();
                let mut cut = cut_rx.clone();
                cut.mark_unchanged();
                tokio::spawn(async move {
                    let Ok(upstream) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    let (mut client_rd, mut client_wr) = client.into_split();
                    let (mut up_rd, mut up_wr) = upstream.into_split();
                    let requests = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut client_rd, &mut up_wr).await;
                    });
                    let answers = async {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match up_rd.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if drop_answer {
                                break;
                            }
                            tokio::time::sleep(delay).await;
                            if client_wr.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    tokio::select! {
                        _ = answers => {}
                        // A dropped `Relay` cuts nothing.
                        Ok(()) = cut.changed() => {}
                    }
                    requests.abort();
                });
            }
        });
        Relay { url, cuts }
    }

    /// Closes every connection open now (new ones are relayed again).
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}

/// `host:port` of an `http://host:port` URL.
pub fn authority(url: &str) -> &str {
    url.trim_start_matches("http://")
}
