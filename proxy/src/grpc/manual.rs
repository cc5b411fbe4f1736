//! Serving gRPC methods by hand, as tonic's generated servers serve them: for the services
//! whose generated servers etcd-client builds but does not export (v3lock's Lock,
//! v3election's Election, and Auth, whose messages it exports only in part).

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;

use futures::future::BoxFuture;
use futures::Stream;
use tonic::server::{Grpc, NamedService, ServerStreamingService, UnaryService};
use tonic::{Request, Response};

use super::Front;

pub(super) type Answer<T> = Result<Response<T>, tonic::Status>;
pub(super) type HttpRequest = http::Request<tonic::body::Body>;
pub(super) type HttpResponse = http::Response<tonic::body::Body>;

/// A service served by hand: its name, and the answer to a call of one of its methods.
pub(super) trait Methods: Send + Sync + 'static {
    /// `package.Service`.
    const NAME: &'static str;
    /// The answer to `req`, whose path names the method (Unimplemented for a method the
    /// service does not have), with messages of at most `limit` bytes.
    fn call(front: Front, limit: usize, req: HttpRequest) -> BoxFuture<'static, HttpResponse>;
}

/// The tower service of the hand-served `M`, for tonic's router.
pub(super) struct Served<M> {
    front: Front,
    limit: usize,
    methods: PhantomData<fn() -> M>,
}

/// `M` over `front`, with requests of at most `limit` bytes.
pub(super) fn served<M: Methods>(front: Front, limit: usize) -> Served<M> {
    Served {
        front,
        limit,
        methods: PhantomData,
    }
}

impl<M> Clone for Served<M> {
    fn clone(&self) -> Self {
        Self {
            front: self.front.clone(),
            limit: self.limit,
            methods: PhantomData,
        }
    }
}

impl<M: Methods> NamedService for Served<M> {
    const NAME: &'static str = M::NAME;
}

impl<M: Methods> tower::Service<HttpRequest> for Served<M> {
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<HttpResponse, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: HttpRequest) -> Self::Future {
        let answer = M::call(self.front.clone(), self.limit, req);
        Box::pin(async move { Ok(answer.await) })
    }
}

/// The answer to a method the service does not have.
pub(super) fn unimplemented() -> BoxFuture<'static, HttpResponse> {
    Box::pin(async { tonic::Status::unimplemented("").into_http() })
}

/// A unary method: a function from the decoded request to the answer.
struct Unary<F>(F);

impl<Req, Resp, F, Fut> UnaryService<Req> for Unary<F>
where
    F: FnMut(Request<Req>) -> Fut,
    Fut: Future<Output = Answer<Resp>> + Send + 'static,
{
    type Response = Resp;
    type Future = Fut;

    fn call(&mut self, request: Request<Req>) -> Fut {
        (self.0)(request)
    }
}

/// The answer to a call of `method`, served as tonic's generated servers serve one.
pub(super) async fn unary<Req, Resp, F, Fut>(
    limit: usize,
    req: HttpRequest,
    method: F,
) -> HttpResponse
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnMut(Request<Req>) -> Fut,
    Fut: Future<Output = Answer<Resp>> + Send + 'static,
{
    let codec = tonic_prost::ProstCodec::<Resp, Req>::default();
    let mut grpc = Grpc::new(codec).apply_max_message_size_config(Some(limit), None);
    grpc.unary(Unary(method), req).await
}

/// A server-streaming method: a function from the decoded request to the answers.
struct Streaming<F>(F);

impl<Req, Resp, F, Fut, S> ServerStreamingService<Req> for Streaming<F>
where
    F: FnMut(Request<Req>) -> Fut,
    Fut: Future<Output = Answer<S>> + Send + 'static,
    S: Stream<Item = Result<Resp, tonic::Status>> + Send + 'static,
{
    type Response = Resp;
    type ResponseStream = S;
    type Future = Fut;

    fn call(&mut self, request: Request<Req>) -> Fut {
        (self.0)(request)
    }
}

/// The answers to a call of the server-streaming `method`.
pub(super) async fn server_streaming<Req, Resp, F, Fut, S>(
    limit: usize,
    req: HttpRequest,
    method: F,
) -> HttpResponse
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    F: FnMut(Request<Req>) -> Fut,
    Fut: Future<Output = Answer<S>> + Send + 'static,
    S: Stream<Item = Result<Resp, tonic::Status>> + Send + 'static,
{
    let codec = tonic_prost::ProstCodec::<Resp, Req>::default();
    let mut grpc = Grpc::new(codec).apply_max_message_size_config(Some(limit), None);
    grpc.server_streaming(Streaming(method), req).await
}
