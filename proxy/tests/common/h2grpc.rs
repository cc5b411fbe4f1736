//! gRPC by hand over h2c, for what a library client cannot do: send chosen bytes or metadata,
//! stop reading, read response headers (fencing metadata) or see a stream end.

use prost::Message;
use tokio::sync::mpsc;

/// One gRPC message frame: uncompressed, length-prefixed.
pub fn frame(message: &impl Message) -> Vec<u8> {
    let message = message.encode_to_vec();
    let mut body = vec![0];
    body.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&message);
    body
}

fn h2c() -> reqwest::Client {
    reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap()
}

/// One unary call: the response headers and the answer message's bytes.
pub async fn unary(
    url: &str,
    path: &str,
    request: &impl Message,
    bearer: Option<&str>,
) -> (reqwest::header::HeaderMap, Vec<u8>) {
    let mut call = h2c()
        .post(format!("{url}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(frame(request));
    if let Some(token) = bearer {
        call = call.bearer_auth(token);
    }
    let resp = call.send().await.unwrap();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.unwrap_or_default();
    let message = bytes.get(5..).unwrap_or_default().to_vec();
    (headers, message)
}

/// A bidirectional call: requests sent when the test says, answers read when it says.
pub struct Stream {
    requests: Option<mpsc::Sender<Result<Vec<u8>, std::io::Error>>>,
    pub response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Stream {
    /// Opens `path` with `first` as its first request.
    pub async fn open(url: &str, path: &str, first: &impl Message, bearer: Option<&str>) -> Self {
        let (tx, rx) = mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
        tx.send(Ok(frame(first))).await.unwrap();
        let requests =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
        let mut call = h2c()
            .post(format!("{url}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(reqwest::Body::wrap_stream(requests));
        if let Some(token) = bearer {
            call = call.bearer_auth(token);
        }
        Self {
            requests: Some(tx),
            response: call.send().await.unwrap(),
            buffer: Vec::new(),
        }
    }

    /// Sends another request.
    pub async fn send(&self, request: &impl Message) {
        let tx = self.requests.as_ref().expect("not half-closed");
        tx.send(Ok(frame(request))).await.unwrap();
    }

    /// Half-closes: no more requests.
    pub fn close(&mut self) {
        self.requests = None;
    }

    /// The next answer, or `None` once the stream has ended (or failed) without one.
    pub async fn next<M: Message + Default>(&mut self) -> Option<M> {
        loop {
            if self.buffer.len() >= 5 {
                let len = u32::from_be_bytes(self.buffer[1..5].try_into().unwrap()) as usize;
                if self.buffer.len() >= 5 + len {
                    let message = M::decode(&self.buffer[5..5 + len]).unwrap();
                    self.buffer.drain(..5 + len);
                    return Some(message);
                }
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                Ok(None) | Err(_) => return None,
            }
        }
    }
}
