//! Serving gRPC methods by hand, as tonic's generated servers serve them: for the services
//! whose generated servers etcd-client builds but does not export (v3lock's Lock,
//! v3election's Election, and Auth, whose messages it exports only in part).

use std::future::Future;

use futures::Stream;
use tonic::server::{Grpc, ServerStreamingService, UnaryService};
use tonic::{Request, Response};

pub(super) type Answer<T> = Result<Response<T>, tonic::Status>;
pub(super) type HttpRequest = http::Request<tonic::body::Body>;
pub(super) type HttpResponse = http::Response<tonic::body::Body>;

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
