//! The answers of one `LeaseKeepAlive` stream: its requests are read as they come, up to
//! [`READ_AHEAD`] not yet started, and renewed [`IN_FLIGHT`] at a time, answered in the order
//! they were asked. Reading ahead matters: HTTP/2 (the `h2` crate) ends the whole connection
//! (`GOAWAY ENHANCE_YOUR_CALM`) once about 2,000 small DATA frames wait unread, and a client
//! renewing thousands of leases on one stream (Go's clientv3 renews every lease of a client on
//! one) sends its due renewals in one burst, each request its own frame, as etcd takes them.
//!
//! No task is spawned: the answers are a stream that tonic polls and drops when the call ends,
//! so a half-close ends it once every answer is sent, and a cancel stops it (and every renewal
//! not yet sent to etcd) at once.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::stream::{FuturesOrdered, Stream, StreamExt};

/// Most renewals of one stream under way at once.
pub(crate) const IN_FLIGHT: usize = 64;

/// Most requests of one stream read and not yet started (8 bytes each: 32 KiB a stream).
pub(crate) const READ_AHEAD: usize = 4096;

/// Answers to `requests` (lease ids, or the failure that ends the stream), each from `renew`.
pub(crate) struct Renewals<S, F, R: Future> {
    requests: Option<S>,
    waiting: VecDeque<i64>,
    /// The requests' failure, answered once every earlier request is.
    failed: Option<tonic::Status>,
    running: FuturesOrdered<R>,
    renew: F,
}

impl<S, F, R, T> Renewals<S, F, R>
where
    S: Stream<Item = Result<i64, tonic::Status>> + Unpin,
    F: FnMut(i64) -> R + Unpin,
    R: Future<Output = Result<T, tonic::Status>>,
{
    pub(crate) fn new(requests: S, renew: F) -> Self {
        Self {
            requests: Some(requests),
            waiting: VecDeque::new(),
            failed: None,
            running: FuturesOrdered::new(),
            renew,
        }
    }
}

impl<S, F, R, T> Stream for Renewals<S, F, R>
where
    S: Stream<Item = Result<i64, tonic::Status>> + Unpin,
    F: FnMut(i64) -> R + Unpin,
    R: Future<Output = Result<T, tonic::Status>>,
{
    type Item = Result<T, tonic::Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        // Read what has come, as far as the bound allows (else the connection's budget goes).
        while this.waiting.len() < READ_AHEAD {
            let Some(requests) = this.requests.as_mut() else {
                break;
            };
            match requests.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(id))) => this.waiting.push_back(id),
                Poll::Ready(Some(Err(e))) => {
                    this.failed = Some(e);
                    this.requests = None;
                }
                Poll::Ready(None) => this.requests = None,
                Poll::Pending => break,
            }
        }
        while this.running.len() < IN_FLIGHT {
            let Some(id) = this.waiting.pop_front() else {
                break;
            };
            this.running.push_back((this.renew)(id));
        }
        match this.running.poll_next_unpin(cx) {
            Poll::Ready(Some(answer)) => Poll::Ready(Some(answer)),
            // Nothing under way and nothing waiting: ended, or waiting for requests (polled
            // above, so their arrival wakes this).
            Poll::Ready(None) if this.requests.is_none() => {
                Poll::Ready(this.failed.take().map(Err))
            }
            _ => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Renewals that take `id` ms, answered in the order asked; the requests are read ahead
    /// while earlier ones run; a failure of the requests comes after every earlier answer.
    #[tokio::test(start_paused = true)]
    async fn answers_in_order_reads_ahead_and_fails_last() {
        let (tx, requests) = futures::channel::mpsc::unbounded::<Result<i64, tonic::Status>>();
        let renewals = Renewals::new(requests, |id| async move {
            tokio::time::sleep(Duration::from_millis(id.unsigned_abs())).await;
            Ok::<_, tonic::Status>(id)
        });
        let ids: Vec<i64> = (0..10_000).map(|i| (i * 7919) % 50).collect();
        for id in &ids {
            tx.unbounded_send(Ok(*id)).unwrap();
        }
        tx.unbounded_send(Err(tonic::Status::cancelled("gone")))
            .unwrap();
        let mut renewals = Box::pin(renewals);
        let mut got = Vec::new();
        while got.len() < ids.len() {
            got.push(renewals.next().await.unwrap().unwrap());
        }
        assert_eq!(got, ids);
        assert_eq!(
            renewals.next().await.unwrap().unwrap_err().code(),
            tonic::Code::Cancelled
        );
        assert!(renewals.next().await.is_none());
    }

    /// Never more than [`READ_AHEAD`] requests read and not started while renewals hang.
    #[tokio::test(start_paused = true)]
    async fn reads_no_further_than_the_bound() {
        let (tx, requests) = futures::channel::mpsc::unbounded::<Result<i64, tonic::Status>>();
        let mut renewals = Box::pin(Renewals::new(requests, |_| {
            futures::future::pending::<Result<i64, tonic::Status>>()
        }));
        for id in 0..(IN_FLIGHT + READ_AHEAD + 100) {
            tx.unbounded_send(Ok(id as i64)).unwrap();
        }
        let polled = tokio::time::timeout(Duration::from_millis(10), renewals.next()).await;
        assert!(polled.is_err());
        let read = renewals.waiting.len() + renewals.running.len();
        assert!(
            renewals.waiting.len() <= READ_AHEAD,
            "{}",
            renewals.waiting.len()
        );
        assert!(
            (READ_AHEAD..=READ_AHEAD + IN_FLIGHT).contains(&read),
            "{read}"
        );
    }
}
