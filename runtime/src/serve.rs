//! Serving an axum router with the drain both binaries need (lease-proxy uses it too), and the
//! request ids both put on every request and log line.
//!

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderName, Request};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_io_timeout::TimeoutStream;
use tokio_rustls::TlsAcceptor;
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
    /// Then it is told to go away, as a draining server's are: an HTTP/1 connection closes at
    /// once; an HTTP/2 one gets a GOAWAY first, so a request the client sent as the server gave
    /// up on the connection is either still served or known by the client never to have been
    /// read, where closing the socket under it would fail it, processed or not. A connection
    /// still open one more `idle_timeout` later (a client that does not answer the GOAWAY's
    /// ping) is closed.
    ///
    /// Not for a connection whose latest marked answer the app marked [`LongLived`], while that
    /// mark holds (lease-proxy: a gRPC call of a caller it let in, until the caller's principal
    /// loses its right): gRPC clients keep one connection for their whole life,
    /// as etcd (grpc-go) lets them, and a synchronous one (Python's grpcio, under python-etcd3)
    /// reads nothing while no call is under way, so it learns of a close only by failing its
    /// next call with UNAVAILABLE "Socket closed", GOAWAY or not. Such a connection ends with
    /// its client, the drain, or TCP keepalive finding its peer gone. A request's content type
    /// alone never marks one: a refused caller's connection goes idle as any other.
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
    /// The latest answer's [`LongLived`] mark: no idle deadline while it holds.
    long_lived: Mutex<Option<LongLived>>,
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
            long_lived: Mutex::new(None),
            last: Mutex::new(Instant::now()),
            next: AtomicU64::new(0),
            handed: Mutex::new(HashMap::new()),
        }
    }

    fn handed(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Instant>> {
        self.handed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the idle clock again from now.
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Whether the connection's latest [`LongLived`] mark still holds.
    fn long_lived(&self) -> bool {
        let mark = self
            .long_lived
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        mark.is_some_and(|m| m.holds())
    }

    /// When the connection is to be closed if nothing happens before, and why: while busy,
    /// when an answer handed over has waited `write_timeout` for its reader (`None`: none
    /// waits); else the idle (or first-request) deadline, none for a gRPC client's while its
    /// mark holds (asked again at every look, so once it no longer holds the idle deadline is
    /// back, counted from the last request).
    fn deadline(&self, limits: &Limits) -> Option<(Instant, Close)> {
        if self.busy.load(Ordering::Acquire) > 0 {
            let oldest = self.handed().values().min().copied();
            return oldest.map(|at| (at + limits.write_timeout, Close::Stalled));
        }
        let limit = if self.served.load(Ordering::Acquire) {
            if self.long_lived() {
                return None;
            }
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
    // Tells every connection to go away (HTTP/2 GOAWAY, HTTP/1 no keep-alive) once the
    // listener has stopped.
    let go_away = CancellationToken::new();
    let mut server = tokio::spawn(accept(
        listener.into(),
        app,
        stop.clone(),
        go_away.clone(),
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
    go_away.cancel();
    let finished = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(drain.deadline, finished)
        .await
        .is_err()
    {
        tracing::warn!("drain deadline passed; closing remaining connections");
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Accepts connections until `stop`, at most `limits.max_connections` at once, each told to go
/// away when `go_away` is cancelled (a TLS connection from the end of its handshake); returns
/// the connections still being served.
async fn accept(
    listener: Listener,
    app: Router,
    stop: CancellationToken,
    go_away: CancellationToken,
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
        let stream = tuned(stream, limits.write_timeout);
        let connection = Connection {
            builder: builder.clone(),
            go_away: go_away.clone(),
            app: app.clone(),
            limits,
        };
        let tls = listener.tls.as_ref().map(|tls| tls.acceptor());
        connections.spawn(async move {
            connection.serve_accepted(stream, tls).await;
            drop(slot);
        });
    }
}

/// An accepted stream with its socket options set, and writes that make no progress for
/// `write_timeout` failing the connection (under TLS too: the TLS stream writes through it).
fn tuned(stream: TcpStream, write_timeout: Duration) -> Pin<Box<TimeoutStream<TcpStream>>> {
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
    let mut stream = TimeoutStream::new(stream);
    stream.set_write_timeout(Some(write_timeout));
    Box::pin(stream)
}

/// What serving one accepted connection needs.
struct Connection {
    builder: Builder<TokioExecutor>,
    go_away: CancellationToken,
    app: Router,
    limits: Limits,
}

impl Connection {
    /// Serves `stream`, after a TLS handshake when `tls` is set.
    async fn serve_accepted(
        self,
        stream: Pin<Box<TimeoutStream<TcpStream>>>,
        tls: Option<TlsAcceptor>,
    ) {
        let Some(acceptor) = tls else {
            return self.serve(TokioIo::new(stream), None).await;
        };
        // The handshake runs in the connection's own task (a slow or silent client holds its
        // slot, not the accept loop), under the header deadline.
        let deadline = self.limits.header_read_timeout;
        match tokio::time::timeout(deadline, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => {
                let peer = PeerCertificate::of(stream.get_ref().1);
                self.serve(TokioIo::new(stream), peer).await;
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
            Err(_) => tracing::debug!("TLS handshake timed out"),
        }
    }

    /// Serves HTTP on `io` until the client closes it, it errs, or it stays idle past its
    /// deadline (then it is told to go away first, see [`Limits::idle_timeout`]); every request
    /// carries `peer` (the client certificate) as an extension.
    async fn serve<I>(self, io: I, peer: Option<PeerCertificate>)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let Self {
            builder,
            go_away,
            app,
            limits,
        } = self;
        let activity = Arc::new(Activity::new());
        let service = TowerToHyperService::new(tracked(app, activity.clone(), peer));
        let connection = builder
            .serve_connection_with_upgrades(io, service)
            .into_owned();
        tokio::pin!(connection);
        // Whether the connection was told to go away (idle, or the server draining).
        let mut going = false;
        // Looked at again at least this often: an answer may be handed over, and start
        // waiting, at any time.
        let recheck = limits.idle_timeout.min(limits.write_timeout);
        loop {
            let check = activity
                .deadline(&limits)
                .map_or_else(|| Instant::now() + recheck, |(at, _)| at);
            tokio::select! {
                ended = connection.as_mut() => {
                    if let Err(e) = ended {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    break;
                }
                () = go_away.cancelled(), if !going => {
                    connection.as_mut().graceful_shutdown();
                    going = true;
                }
                () = tokio::time::sleep_until(check) => match activity.deadline(&limits) {
                    Some((deadline, why)) if deadline <= Instant::now() => match why {
                        // Idle after a request: told to go away, given one more idle
                        // timeout to do so.
                        Close::Idle if !going && activity.served.load(Ordering::Acquire) => {
                            tracing::debug!("an idle connection: going away");
                            connection.as_mut().graceful_shutdown();
                            going = true;
                            activity.touch();
                        }
                        Close::Idle => {
                            tracing::debug!("closing an idle connection");
                            break;
                        }
                        Close::Stalled => {
                            tracing::debug!("closing a connection whose reader takes nothing");
                            break;
                        }
                    },
                    _ => {}
                },
            }
        }
    }
}

/// Marks an answer (in its extensions) whose connection the client keeps for its whole life
/// and may leave idle: the connection then has no idle deadline (see [`Limits::idle_timeout`])
/// for as long as the mark holds. The app sets it only for a caller it let in (lease-proxy: a
/// gRPC call that passed its authentication), so that no refused client can pin a connection,
/// and makes it lapse once the caller would no longer be let in (its principal removed), so
/// that no removed one keeps pinning it. A connection's latest mark is the one that counts.
#[derive(Clone)]
pub struct LongLived {
    holds: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
}

impl LongLived {
    /// A mark that holds for the connection's whole life.
    pub fn always() -> Self {
        Self { holds: None }
    }

    /// A mark that holds while `holds` says so. It is asked whenever the serving loop looks at
    /// an idle connection's deadline — at least every `min(idle_timeout, write_timeout)` — so
    /// it must be cheap, and free of side effects a repeated call would repeat.
    pub fn while_holds(holds: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self {
            holds: Some(Arc::new(holds)),
        }
    }

    fn holds(&self) -> bool {
        self.holds.as_ref().is_none_or(|holds| holds())
    }
}

impl std::fmt::Debug for LongLived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LongLived")
            .field("lapses", &self.holds.is_some())
            .finish()
    }
}

/// `app`, counting each request as busy on `activity` until its answer's body is dropped,
/// giving each the connection's client certificate, and marking the connection long-lived once
/// an answer is [`LongLived`].
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
        let activity = activity.clone();
        async move {
            let response = answer.await?;
            if let Some(mark) = response.extensions().get::<LongLived>() {
                *activity
                    .long_lived
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(mark.clone());
            }
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

#[cfg(test)]
mod tests {
    //! The idle close as an HTTP/2 client sees it, frame by frame, over a raw socket: what a
    //! gRPC client whose next call crosses the close needs (a GOAWAY before the socket closes,
    //! and a request sent across it still answered).
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const HEADERS: u8 = 0x1;
    const SETTINGS: u8 = 0x4;
    const PING: u8 = 0x6;
    const GOAWAY: u8 = 0x7;
    const ACK: u8 = 0x1;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = u32::try_from(payload.len()).unwrap().to_be_bytes()[1..].to_vec();
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// `GET /` on `stream`, headers and end of stream in one frame (HPACK: the static table's
    /// `:method GET`, `:scheme http`, `:path /`, and `:authority x` as a literal).
    fn get(stream: u32) -> Vec<u8> {
        frame(
            HEADERS,
            0x4 | 0x1,
            stream,
            &[0x82, 0x86, 0x84, 0x41, 1, b'x'],
        )
    }

    /// Whether `GET /lapse`'s mark has lapsed (one test uses it).
    static LAPSED: AtomicBool = AtomicBool::new(false);

    /// A server whose connections go idle after 300 ms.
    async fn server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let long_lived = || async {
            let mut answer = axum::response::IntoResponse::into_response("ok");
            answer.extensions_mut().insert(LongLived::always());
            answer
        };
        let lapsing = || async {
            let mut answer = axum::response::IntoResponse::into_response("ok");
            let mark = LongLived::while_holds(|| !LAPSED.load(Ordering::Acquire));
            answer.extensions_mut().insert(mark);
            answer
        };
        let app = Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .route("/long", axum::routing::get(long_lived))
            .route("/lapse", axum::routing::get(lapsing));
        let limits = Limits {
            header_read_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let draining: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
        tokio::spawn(until_shutdown(
            listener,
            app,
            std::future::pending(),
            draining,
            CancellationToken::new(),
            Drain {
                delay: Duration::ZERO,
                deadline: Duration::from_secs(1),
            },
            limits,
        ));
        addr
    }

    /// A frame read: its type, flags, stream and payload.
    type Frame = (u8, u8, u32, Vec<u8>);

    /// The next frame, or `None` at the end of the connection; SETTINGS are acknowledged.
    async fn next(socket: &mut TcpStream) -> Option<Frame> {
        let mut head = [0u8; 9];
        tokio::time::timeout(Duration::from_secs(5), socket.read_exact(&mut head))
            .await
            .expect("no frame and no close within 5 s")
            .ok()?;
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0; len];
        socket.read_exact(&mut payload).await.ok()?;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if head[3] == SETTINGS && head[4] & ACK == 0 {
            socket.write_all(&frame(SETTINGS, ACK, 0, &[])).await.ok()?;
        }
        Some((head[3], head[4], stream, payload))
    }

    async fn connect(addr: &str) -> TcpStream {
        let mut socket = TcpStream::connect(addr).await.unwrap();
        socket.write_all(PREFACE).await.unwrap();
        socket.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
        socket
    }

    #[tokio::test]
    async fn an_idle_http2_connection_gets_a_goaway_before_it_closes() {
        let addr = server().await;
        let mut socket = connect(&addr).await;
        socket.write_all(&get(1)).await.unwrap();
        let started = Instant::now();
        let mut seen = Vec::new();
        while let Some((kind, flags, stream, payload)) = next(&mut socket).await {
            if kind == PING && flags & ACK == 0 {
                socket
                    .write_all(&frame(PING, ACK, 0, &payload))
                    .await
                    .unwrap();
            }
            seen.push((kind, stream));
        }
        assert!(seen.contains(&(HEADERS, 1)), "not answered: {seen:?}");
        assert!(
            seen.iter().any(|&(kind, _)| kind == GOAWAY),
            "closed without a GOAWAY: {seen:?}"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "closed before it was idle"
        );
    }

    #[tokio::test]
    async fn a_long_lived_answers_connection_stays_open_when_idle() {
        let addr = server().await;
        let mut socket = connect(&addr).await;
        // `GET /long` (`:path` a literal with an indexed name), answered `LongLived`.
        let block = [
            0x82, 0x86, 0x44, 5, b'/', b'l', b'o', b'n', b'g', 0x41, 1, b'x',
        ];
        socket
            .write_all(&frame(HEADERS, 0x4 | 0x1, 1, &block))
            .await
            .unwrap();
        let mut answered = false;
        let quiet_until = Instant::now() + Duration::from_millis(1500);
        loop {
            let mut head = [0u8; 9];
            match tokio::time::timeout_at(quiet_until, socket.read_exact(&mut head)).await {
                Err(_) => break, // five idle timeouts without a frame or a close
                Ok(read) => assert!(read.is_ok(), "the connection was closed"),
            }
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0; len];
            socket.read_exact(&mut payload).await.unwrap();
            assert_ne!(
                head[3], GOAWAY,
                "a long-lived connection was told to go away"
            );
            if head[3] == SETTINGS && head[4] & ACK == 0 {
                socket
                    .write_all(&frame(SETTINGS, ACK, 0, &[]))
                    .await
                    .unwrap();
            }
            answered |= head[3] == HEADERS;
        }
        assert!(answered, "the call was not answered");
        // Still served.
        socket.write_all(&get(3)).await.unwrap();
        let mut again = false;
        while !again {
            let (kind, _, stream, _) = next(&mut socket).await.expect("closed");
            again = kind == HEADERS && stream == 3;
        }
    }

    /// A mark that lapses gives the connection its idle deadline back: a removed principal's
    /// silent connections must not keep every slot.
    #[tokio::test]
    async fn a_connection_whose_mark_lapses_goes_idle() {
        let addr = server().await;
        let mut socket = connect(&addr).await;
        // `GET /lapse` (`:path` a literal with an indexed name), answered with a lapsing mark.
        let block = [
            0x82, 0x86, 0x44, 6, b'/', b'l', b'a', b'p', b's', b'e', 0x41, 1, b'x',
        ];
        socket
            .write_all(&frame(HEADERS, 0x4 | 0x1, 1, &block))
            .await
            .unwrap();
        // Idle for three idle timeouts while the mark holds, then it lapses.
        let lapsed_at = Instant::now() + Duration::from_millis(900);
        tokio::spawn(async move {
            tokio::time::sleep_until(lapsed_at).await;
            LAPSED.store(true, Ordering::Release);
        });
        let mut answered = false;
        loop {
            let (kind, _, stream, _) = next(&mut socket).await.expect("closed without a GOAWAY");
            answered |= kind == HEADERS && stream == 1;
            if kind == GOAWAY {
                break;
            }
        }
        assert!(answered, "the call was not answered");
        assert!(
            Instant::now() >= lapsed_at,
            "told to go away while the mark held"
        );
    }

    /// One request with a gRPC content type, refused or not for the app at all, kept
    /// its connection open for ever (a slot pinned at no cost, on fence-gateway too).
    #[tokio::test]
    async fn a_grpc_content_type_alone_keeps_no_connection_open() {
        let addr = server().await;
        let mut socket = connect(&addr).await;
        // `POST /` with `content-type: application/grpc` (a literal with an indexed name) and
        // no body: answered 405, not `LongLived`.
        let mut block = vec![0x83, 0x86, 0x84, 0x41, 1, b'x', 0x5f, 16];
        block.extend_from_slice(b"application/grpc");
        socket
            .write_all(&frame(HEADERS, 0x4 | 0x1, 1, &block))
            .await
            .unwrap();
        loop {
            let (kind, _, _, _) = next(&mut socket).await.expect("closed without a GOAWAY");
            if kind == GOAWAY {
                break;
            }
        }
    }

    #[tokio::test]
    async fn a_request_sent_as_an_idle_connection_goes_away_is_still_answered() {
        let addr = server().await;
        let mut socket = connect(&addr).await;
        socket.write_all(&get(1)).await.unwrap();
        // Read up to the server's first GOAWAY; a request sent now crossed it on the wire.
        let mut ping = None;
        loop {
            let (kind, flags, _, payload) =
                next(&mut socket).await.expect("closed without a GOAWAY");
            if kind == PING && flags & ACK == 0 {
                ping = Some(payload);
            } else if kind == GOAWAY {
                break;
            }
        }
        socket.write_all(&get(3)).await.unwrap();
        let mut answered = false;
        while let Some((kind, flags, stream, payload)) = next(&mut socket).await {
            if kind == PING && flags & ACK == 0 {
                ping = Some(payload);
            }
            if let Some(payload) = ping.take() {
                socket
                    .write_all(&frame(PING, ACK, 0, &payload))
                    .await
                    .unwrap();
            }
            answered |= kind == HEADERS && stream == 3;
        }
        assert!(
            answered,
            "the request sent across the GOAWAY was not answered"
        );
    }
}
