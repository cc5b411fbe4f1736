//! `etcdserverpb.Watch`: the bidirectional watch stream through the core
//! ([`crate::etcdapi::Service::watch`]), confined to the caller's namespace; the core takes the
//! stream's event-stream slot with its first create. Its answers stay counted in the replica's
//! watch budgets until HTTP/2 has written them: the answer's body hands tonic's encoded frames
//! over a piece at a time through the core's [`Written`] ([`Counted`]).

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::body::{Body, Bytes};
use etcd_client::proto::{PbWatchRequest, PbWatchResponse, PbWatchService};
use futures::stream::{BoxStream, StreamExt};
use http_body::Frame;
use tonic::{Request, Response, Streaming};

use super::{status, Front};
use crate::etcdapi::{Status, WatchRequests, Written};

type Answer<T> = Result<Response<T>, tonic::Status>;

#[tonic::async_trait]
impl PbWatchService for Front {
    type WatchStream = BoxStream<'static, Result<PbWatchResponse, tonic::Status>>;

    async fn watch(&self, req: Request<Streaming<PbWatchRequest>>) -> Answer<Self::WatchStream> {
        let caller = self.caller(&req)?;
        let requests: WatchRequests = req
            .into_inner()
            .map(|r| r.map_err(|s| Status::from_grpc(s.code() as i32, s.message().to_owned())))
            .boxed();
        let (answers, written) = self.core().watch(caller, requests);
        let mut answer = Response::new(answers.map(|a| a.map_err(status)).boxed());
        // For the front, which wraps the encoded body in [`Counted`].
        answer.extensions_mut().insert(written);
        Ok(answer)
    }
}

/// A watch answer's body: tonic's encoded frames held by the core ([`Written::hold`]) and
/// handed to HTTP/2 a piece at a time ([`Written::piece`]), so that HTTP/2 — which asks for
/// more only when it can send — holds little of a stream whose client does not read, and the
/// rest stays where a budget can take it back. A stream cut off mid-answer fails its body, and
/// HTTP/2 resets the stream: the client never reads part of an answer.
pub(super) struct Counted {
    body: Body,
    written: Written,
}

impl Counted {
    pub(super) fn new(body: Body, written: Written) -> Self {
        Self { body, written }
    }
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        loop {
            match self.written.piece() {
                Err(cut) => return Poll::Ready(Some(Err(axum::Error::new(cut)))),
                Ok(Some(piece)) => return Poll::Ready(Some(Ok(Frame::data(piece)))),
                Ok(None) => {}
            }
            match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.written.hold(data),
                    // Trailers: the stream's status, after every answer.
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                other => return Poll::Ready(other),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream() && self.written.is_empty()
    }
}
