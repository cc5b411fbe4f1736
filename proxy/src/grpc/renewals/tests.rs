//! The stream machine of [`super`] against a fake etcd.
use super::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// An answer: the lease, and which way it was renewed ("own", "shared", "foreign").
type Answer = (i64, &'static str);

/// Leases `id % 5 == 3` are not the caller's. The own stream's etcd answers each keepalive
/// after 1 ms, in order, and ends after `lives` answers; opening it goes as `opens` say
/// (then succeeds).
#[derive(Clone)]
struct Fake {
    opens: Arc<Mutex<VecDeque<Open<()>>>>,
    lives: usize,
    opened: Arc<Mutex<Vec<i64>>>,
    /// Judging never ends.
    hang: bool,
}

struct FakeStream {
    to_etcd: mpsc::UnboundedSender<i64>,
    from_etcd: mpsc::UnboundedReceiver<i64>,
}

impl Fake {
    fn new(opens: Vec<Open<()>>, lives: usize) -> Self {
        Self {
            opens: Arc::new(Mutex::new(opens.into())),
            lives,
            opened: Arc::default(),
            hang: false,
        }
    }
}

impl Renewer for Fake {
    type Answer = Answer;
    type Upstream = FakeStream;

    fn judge(&self, id: i64) -> BoxFuture<'static, Result<Step<Answer>, tonic::Status>> {
        let hang = self.hang;
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_millis(id.unsigned_abs() % 3)).await;
            Ok(if id % 5 == 3 {
                Step::Answer((id, "foreign"))
            } else {
                Step::Renew(id)
            })
        }
        .boxed()
    }

    fn open(&self, id: i64) -> BoxFuture<'static, Open<FakeStream>> {
        self.opened.lock().unwrap().push(id);
        let planned = self.opens.lock().unwrap().pop_front();
        let lives = self.lives;
        async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            match planned {
                Some(Open::Gone) => return Open::Gone,
                Some(Open::Failed) => return Open::Failed,
                _ => {}
            }
            let (to_etcd, mut asked) = mpsc::unbounded_channel::<i64>();
            let (answer, from_etcd) = mpsc::unbounded_channel();
            tokio::spawn(async move {
                for _ in 0..lives {
                    let Some(id) = asked.recv().await else { return };
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let _ = answer.send(id);
                }
                drop((asked, answer));
            });
            Open::Stream(FakeStream { to_etcd, from_etcd })
        }
        .boxed()
    }

    fn renew(&self, id: i64) -> BoxFuture<'static, Result<Answer, tonic::Status>> {
        async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok((id, "shared"))
        }
        .boxed()
    }
}

impl Upstream for FakeStream {
    type Answer = Answer;

    fn send(&mut self, id: i64) -> bool {
        self.to_etcd.send(id).is_ok()
    }

    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Option<(i64, Answer)>> {
        self.from_etcd
            .poll_recv(cx)
            .map(|id| id.map(|id| (id, (id, "own"))))
    }
}

/// Every request of `ids` (then a failure) sent at once through `fake`: the answers.
async fn run(fake: Fake, ids: &[i64]) -> Vec<Answer> {
    let (tx, requests) = futures::channel::mpsc::unbounded::<Result<i64, tonic::Status>>();
    for id in ids {
        tx.unbounded_send(Ok(*id)).unwrap();
    }
    tx.unbounded_send(Err(tonic::Status::cancelled("gone")))
        .unwrap();
    let mut renewals = Box::pin(Renewals::new(requests, fake));
    let mut got = Vec::new();
    while got.len() < ids.len() {
        // (Paused time: a renewal left unanswered fails here at once.)
        let next = tokio::time::timeout(Duration::from_secs(600), renewals.next()).await;
        let answer = next.unwrap_or_else(|_| panic!("unanswered after {}", got.len()));
        got.push(answer.unwrap().unwrap());
    }
    let last = renewals.next().await.unwrap().unwrap_err();
    assert_eq!(last.code(), tonic::Code::Cancelled);
    assert!(renewals.next().await.is_none());
    got
}

fn ids(n: i64) -> Vec<i64> {
    (0..n).map(|i| (i * 7919) % 50).collect()
}

fn way(answer: &Answer) -> &'static str {
    answer.1
}

fn leases(got: &[Answer]) -> Vec<i64> {
    got.iter().map(|a| a.0).collect()
}

/// Judged at different speeds, answered in the order asked; others' leases not renewed; the
/// caller's over the shared streams while its own opens, then on it; a failure of the
/// requests after every earlier answer.
#[tokio::test(start_paused = true)]
async fn answers_in_order_on_its_own_stream_and_fails_last() {
    let ids = ids(10_000);
    let fake = Fake::new(vec![], usize::MAX);
    let got = run(fake.clone(), &ids).await;
    assert_eq!(leases(&got), ids);
    for (id, way) in &got {
        assert_eq!(*way == "foreign", id % 5 == 3, "{id} {way}");
    }
    assert_eq!(fake.opened.lock().unwrap().len(), 1);
    // (It opens in 5 ms, while about 64 renewals take 2–4 ms over the shared streams.)
    assert!(got[..500].iter().any(|a| way(a) == "shared"));
    assert!(got[500..].iter().all(|a| way(a) != "shared"));
}

/// A stream with one renewal under way at a time keeps to the shared streams.
#[tokio::test(start_paused = true)]
async fn one_renewal_at_a_time_opens_nothing() {
    let fake = Fake::new(vec![], usize::MAX);
    let (tx, requests) = futures::channel::mpsc::unbounded::<Result<i64, tonic::Status>>();
    let mut renewals = Box::pin(Renewals::new(requests, fake.clone()));
    for id in ids(200) {
        tx.unbounded_send(Ok(id)).unwrap();
        let answer = renewals.next().await.unwrap().unwrap();
        assert_eq!(answer.0, id);
        assert_ne!(way(&answer), "own");
    }
    assert!(fake.opened.lock().unwrap().is_empty());
}

/// The own stream lost mid-burst (etcd ended it): what was on it and everything after is
/// renewed over the shared streams, nothing lost, still in order.
#[tokio::test(start_paused = true)]
async fn a_lost_own_stream_hands_its_renewals_over() {
    let ids = ids(3_000);
    let got = run(Fake::new(vec![], 500), &ids).await;
    assert_eq!(leases(&got), ids);
    assert_eq!(got.iter().filter(|a| way(a) == "own").count(), 500);
    let last_own = got.iter().rposition(|a| way(a) == "own").unwrap();
    assert!(got[last_own + 1..].iter().any(|a| way(a) == "shared"));
}

/// Opened with a lease etcd no longer knows: opened again with a later renewal; refused
/// outright, the shared streams take everything.
#[tokio::test(start_paused = true)]
async fn an_opening_that_fails_is_retried_only_when_the_lease_was_gone() {
    let ids = ids(2_000);
    let fake = Fake::new(vec![Open::Gone, Open::Gone], usize::MAX);
    let got = run(fake.clone(), &ids).await;
    assert_eq!(leases(&got), ids);
    assert_eq!(fake.opened.lock().unwrap().len(), 3);
    assert!(got.iter().rev().take(100).all(|a| way(a) != "shared"));

    let fake = Fake::new(vec![Open::Failed], usize::MAX);
    let got = run(fake.clone(), &ids).await;
    assert_eq!(leases(&got), ids);
    assert_eq!(fake.opened.lock().unwrap().len(), 1);
    assert!(got.iter().all(|a| way(a) != "own"));
}

/// Never more than [`READ_AHEAD`] requests read and not started while renewals hang.
#[tokio::test(start_paused = true)]
async fn reads_no_further_than_the_bound() {
    let (tx, requests) = futures::channel::mpsc::unbounded::<Result<i64, tonic::Status>>();
    let hanging = Fake {
        hang: true,
        ..Fake::new(vec![], 0)
    };
    let mut renewals = Box::pin(Renewals::new(requests, hanging));
    for id in 0..(IN_FLIGHT + READ_AHEAD + 100) {
        tx.unbounded_send(Ok(5 * id as i64)).unwrap();
    }
    let polled = tokio::time::timeout(Duration::from_millis(10), renewals.next()).await;
    assert!(polled.is_err());
    let read = renewals.waiting.len() + renewals.answers.len();
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
