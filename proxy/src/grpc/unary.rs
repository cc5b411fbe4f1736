//! Serving a unary gRPC method by hand, as tonic's generated servers serve one: for the
//! services whose generated servers etcd-client builds but does not export (v3lock's Lock, and
//! Auth, whose messages it exports only in part).

use std::future::Future;

use tonic::server::{Grpc, UnaryService};
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
