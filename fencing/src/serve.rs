//! Serving an axum router with the drain both binaries need (lease-proxy uses it too), and the
//! request ids both put on every request and log line.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderName, Request};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_io_timeout::TimeoutStream;
use tokio_util::sync::CancellationToken;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::tls::{PeerCertificate, ServerTls};

/// Idle time before a connection's first TCP keepalive probe.
const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Time between unanswered probes.
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes before the kernel drops the connection.
const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// How a server stops once told to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drain {
    /// How long to go on serving, with readiness at 503, before the listener closes: time for
    /// load balancers (Kubernetes endpoints) to stop sending new requests here.
    pub delay: Duration,
    /// How long in-flight requests then get to finish before remaining connections are closed.
    pub deadline: Duration,
}

/// What one server accepts from its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most client connections served at once; further connections wait in the listen backlog
    /// until one closes.
    pub max_connections: usize,
    /// Deadline for a client to send a request's headers: a connection that has not sent its
    /// first request's headers this long after it was accepted (a silent client, an HTTP/2
    /// preface alone) is closed, and so is one trickling an HTTP/1 header.
    pub header_read_timeout: Duration,
    /// How long a connection with no request in flight (its last answer fully sent) stays open.
    pub idle_timeout: Duration,
    /// How long an answer may wait on a client that takes none of it before the connection is
    /// closed: a socket write that makes no progress (its buffers full: a paused or vanished
    /// reader), or an answer (or a frame of its body) that hyper holds without coming back for
    /// more — an HTTP/2 stream whose reader opens no window, whose body hyper then never polls.
    /// Any progress restarts the clock. Progress is what the kernel (or the HTTP/2 window)
    /// takes, in steps of about one segment or window update, so a reader much slower than
    /// that step per timeout (about 1-2 KiB/s on loopback at 30 s) can be cut. This is what ends
    /// a long answer — an event stream, a large forwarded body — whose reader stopped, since
    /// the answer's own timers are not polled while it waits; on HTTP/2 the whole connection
    /// goes, with its other streams.
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// What one connection is doing, for its deadlines.
struct Activity {
    /// Requests whose answers are not yet fully sent.
    busy: AtomicUsize,
    /// Whether a request has arrived at all.
    served: AtomicBool,
    /// When the last request ended (or the connection was accepted).
    last: Mutex<Instant>,
    /// Numbers the connection's requests.
    next: AtomicU64,
    /// Answers handed to hyper (the answer itself, or a frame of its body) that hyper has not
    /// come back for since, by request, with when: hyper polls a body only when it can send,
    /// so an answer left here is one its reader is not taking (an HTTP/2 stream without
    /// window, a full socket).
    handed: Mutex<HashMap<u64, Instant>>,
}

/// One request in flight on a connection; ends when its answer's body is dropped.
struct Busy {
    activity: Arc<Activity>,
    id: u64,
}

impl Busy {
    fn new(activity: Arc<Activity>) -> Self {
        activity.busy.fetch_add(1, Ordering::AcqRel);
        activity.served.store(true, Ordering::Release);
        let id = activity.next.fetch_add(1, Ordering::Relaxed);
        Self { activity, id }
    }

    /// Its answer (or a frame of it) was handed over: waiting for hyper to come back.
    fn handed(&self) {
        self.activity.handed().insert(self.id, Instant::now());
    }

    /// Hyper came back for more.
    fn polled(&self) {
        self.activity.handed().remove(&self.id);
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.polled();
        *self.activity.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.activity.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Close {
    /// No request arrived in time, or none since the last answer.
    Idle,
    /// An answer was not taken for `write_timeout`.
    Stalled,
}

impl Activity {
    fn new() -> Self {
        Self {
            busy: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            last: Mutex::new(Instant::now()),
            next: AtomicU64::new(0),
            handed: Mutex::new(HashMap::new()),
        }
    }

    fn handed(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Instant>> {
        self.handed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the connection is to be closed if nothing happens before, and why: while busy,
    /// when an answer handed over has waited `write_timeout` for its reader (`None`: none
    /// waits); else the idle (or first-request) deadline.
    fn deadline(&self, limits: &Limits) -> Option<(Instant, Close)> {
        if self.busy.load(Ordering::Acquire) > 0 {
            let oldest = self.handed().values().min().copied();
            return oldest.map(|at| (at + limits.write_timeout, Close::Stalled));
        }
        let limit = if self.served.load(Ordering::Acquire) {
            limits.idle_timeout
        } else {
            limits.header_read_timeout
        };
        let last = *self.last.lock().unwrap_or_else(|p| p.into_inner());
        Some((last + limit, Close::Idle))
    }
}

/// An answer's body that tells its request's [`Busy`] when hyper takes a frame and when it
/// comes back for the next.
struct Watched {
    body: axum::body::Body,
    busy: Busy,
}

impl http_body::Body for Watched {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.busy.polled();
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(_))) = &polled {
            self.busy.handed();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Where a server accepts connections: a TCP listener, with or without TLS.
#[derive(Debug)]
pub struct Listener {
    /// The socket.
    pub tcp: TcpListener,
    /// TLS on every connection, when set; the handshake must end within the header read
    /// timeout.
    pub tls: Option<Arc<ServerTls>>,
}

impl From<TcpListener> for Listener {
    fn from(tcp: TcpListener) -> Self {
        Self { tcp, tls: None }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, within `limits`. Then: `draining` is
/// set (readiness turns 503) while serving goes on for `drain.delay`; then `stop` is cancelled
/// (the listener stops accepting; callers may hang other work off it), and in-flight requests
/// get up to `drain.deadline` to finish before remaining connections are closed.
pub async fn until_shutdown(
    listener: impl Into<Listener>,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
    draining: &AtomicBool,
    stop: CancellationToken,
    drain: Drain,
    limits: Limits,
) -> std::io::Result<()> {
    let graceful = Arc::new(GracefulShutdown::new());
    let mut server = tokio::spawn(accept(
        listener.into(),
        app,
        stop.clone(),
        graceful.clone(),
        limits,
    ));
    let served = tokio::select! {
        result = &mut server => Some(result),
        () = shutdown => None,
    };
    if let Some(result) = served {
        return result.map_err(std::io::Error::other)?.map(drop);
    }
    tracing::info!(delay = ?drain.delay, deadline = ?drain.deadline, "shutting down: draining");
    draining.store(true, Ordering::Relaxed);
    let stopped_early = tokio::select! {
        result = &mut server => Some(result),
        () = tokio::time::sleep(drain.delay) => None,
    };
    if let Some(result) = stopped_early {
        return result.map_err(std::io::Error::other)?.map(drop);
    }
    stop.cancel();
    let mut connections = server.await.map_err(std::io::Error::other)??;
    let graceful = Arc::try_unwrap(graceful)
        .map_err(|_| std::io::Error::other("the accept loop still holds the connection watcher"))?;
    if tokio::time::timeout(drain.deadline, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain deadline passed; closing remaining connections");
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Accepts connections until `stop`, at most `limits.max_connections` at once, each served
/// under `graceful`'s watch (a TLS connection from the end of its handshake); returns the
/// connections still being served.
async fn accept(
    listener: Listener,
    app: Router,
    stop: CancellationToken,
    graceful: Arc<GracefulShutdown>,
    limits: Limits,
) -> std::io::Result<JoinSet<()>> {
    let mut connections = JoinSet::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.map_err(std::io::Error::other)?,
            () = stop.cancelled() => return Ok(connections),
        };
        while connections.try_join_next().is_some() {}
        let stream = tokio::select! {
            accepted = listener.tcp.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little, then go on.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => return Ok(connections),
        };
        let _ = stream.set_nodelay(true);
        // A peer that vanished without a FIN or RST (power loss, a cut link) is found out in
        // about a minute rather than when the kernel gives up retransmitting (~15 min): its
        // connection, and whatever long stream it held, ends.
        let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(
            &socket2::TcpKeepalive::new()
                .with_time(TCP_KEEPALIVE_IDLE)
                .with_interval(TCP_KEEPALIVE_INTERVAL)
                .with_retries(TCP_KEEPALIVE_RETRIES),
        );
        // A write that makes no progress for `write_timeout` fails the connection (under TLS
        // too: the TLS stream writes through this one).
        let mut stream = TimeoutStream::new(stream);
        stream.set_write_timeout(Some(limits.write_timeout));
        let stream = Box::pin(stream);
        let connection = Connection {
            builder: builder.clone(),
            watcher: graceful.watcher(),
            app: app.clone(),
            limits,
        };
        let tls = listener.tls.as_ref().map(|tls| tls.acceptor());
        connections.spawn(async move {
            match tls {
                None => connection.serve(TokioIo::new(stream), None).await,
                // The handshake runs here, in the connection's own task (a slow or silent
                // client holds its slot, not the accept loop), under the header deadline.
                Some(acceptor) => {
                    match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(stream)) => {
                            let peer = PeerCertificate::of(stream.get_ref().1);
                            connection.serve(TokioIo::new(stream), peer).await;
                        }
                        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                }
            }
            drop(slot);
        });
    }
}

/// What serving one accepted connection needs.
struct Connection {
    builder: Builder<TokioExecutor>,
    watcher: Watcher,
    app: Router,
    limits: Limits,
}

impl Connection {
    /// Serves HTTP on `io` until the client closes it, it errs, or it stays idle past its
    /// deadline; every request carries `peer` (the client certificate) as an extension.
    async fn serve<I>(self, io: I, peer: Option<PeerCertificate>)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let Self {
            builder,
            watcher,
            app,
            limits,
        } = self;
        let activity = Arc::new(Activity::new());
        let service = TowerToHyperService::new(tracked(app, activity.clone(), peer));
        let connection = builder
            .serve_connection_with_upgrades(io, service)
            .into_owned();
        let connection = watcher.watch(connection);
        tokio::pin!(connection);
        // Looked at again at least this often: an answer may be handed over, and start
        // waiting, at any time.
        let recheck = limits.idle_timeout.min(limits.write_timeout);
        loop {
            let check = activity
                .deadline(&limits)
                .map_or_else(|| Instant::now() + recheck, |(at, _)| at);
            match tokio::time::timeout_at(check, &mut connection).await {
                Ok(Err(e)) => tracing::debug!(error = %e, "connection ended with an error"),
                Ok(Ok(())) => {}
                Err(_) => match activity.deadline(&limits) {
                    Some((deadline, why)) if deadline <= Instant::now() => match why {
                        Close::Idle => tracing::debug!("closing an idle connection"),
                        Close::Stalled => {
                            tracing::debug!("closing a connection whose reader takes nothing");
                        }
                    },
                    _ => continue,
                },
            }
            break;
        }
    }
}

/// `app`, counting each request as busy on `activity` until its answer's body is dropped, and
/// giving each the connection's client certificate.
fn tracked(
    app: Router,
    activity: Arc<Activity>,
    peer: Option<PeerCertificate>,
) -> impl tower::Service<
    Request<hyper::body::Incoming>,
    Response = http::Response<axum::body::Body>,
    Error = std::convert::Infallible,
    Future = impl Future + Send,
> + Clone {
    tower::service_fn(move |mut req: Request<hyper::body::Incoming>| {
        let busy = Busy::new(activity.clone());
        if let Some(peer) = &peer {
            req.extensions_mut().insert(peer.clone());
        }
        let answer = tower::ServiceExt::oneshot(app.clone(), req);
        async move {
            let response = answer.await?;
            busy.handed();
            Ok(response.map(|body| axum::body::Body::new(Watched { body, busy })))
        }
    })
}

/// The request id header: kept when the client sent one, else set to a fresh UUID; echoed in
/// the response, passed on by forwarding, and recorded on the request's log span.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Wraps `app` so every request carries an `X-Request-Id` and runs in a span with it (method,
/// route and request id only: never a header value, so never a secret or token). The span
/// continues the client's W3C trace (`traceparent`) when a tracer is installed.
pub fn with_request_ids(app: Router) -> Router {
    let header = HeaderName::from_static(REQUEST_ID_HEADER);
    app.layer(PropagateRequestIdLayer::new(header.clone()))
        .layer(
            TraceLayer::new_for_http().make_span_with(|req: &Request<axum::body::Body>| {
                let id = req
                    .headers()
                    .get(REQUEST_ID_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                // The route template, never the path itself: resource names stay out of span
                // names (and so out of any index built on them).
                let span = tracing::info_span!(
                    "request",
                    otel.name = tracing::field::Empty,
                    otel.kind = tracing::field::Empty,
                    method = %req.method(),
                    path = %req.uri().path(),
                    request_id = %id,
                );
                crate::telemetry::server_span(&span, req);
                span
            }),
        )
        .layer(SetRequestIdLayer::new(header, MakeRequestUuid))
}

/// Resolves on SIGTERM or SIGINT: the shutdown signal of both binaries.
pub async fn terminated() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = term => {},
    }
}
