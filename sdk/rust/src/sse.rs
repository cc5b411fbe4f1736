//! An incremental parser of Server-Sent Events (the `text/event-stream` format of the HTML
//! standard): bytes in, messages out, whatever the chunk boundaries.

/// One dispatched message: the fields seen since the previous blank line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Message {
    /// The `id` field, when the message had one.
    pub(crate) id: Option<String>,
    /// The `event` field.
    pub(crate) event: Option<String>,
    /// The `data` lines, joined with `\n`.
    pub(crate) data: Option<String>,
}

/// The parser's state between chunks.
#[derive(Debug, Default)]
pub(crate) struct Parser {
    /// Bytes of a line not yet terminated.
    line: Vec<u8>,
    /// A `\r` ended the last line: a `\n` right after it belongs to it.
    after_cr: bool,
    pending: Message,
}

impl Parser {
    /// Feeds `bytes`; returns the messages completed by them.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<Message> {
        let mut out = Vec::new();
        for &b in bytes {
            if std::mem::take(&mut self.after_cr) && b == b'\n' {
                continue;
            }
            match b {
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.line);
                    if let Some(message) = self.line_ended(&line) {
                        out.push(message);
                    }
                }
                _ => self.line.push(b),
            }
        }
        out
    }

    /// Handles one complete line; a blank line dispatches the pending message.
    fn line_ended(&mut self, line: &[u8]) -> Option<Message> {
        if line.is_empty() {
            let message = std::mem::take(&mut self.pending);
            return (message != Message::default()).then_some(message);
        }
        if line.first() == Some(&b':') {
            return None; // a comment
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        match field {
            "id" if !value.contains('\0') => self.pending.id = Some(value.to_owned()),
            "event" => self.pending.event = Some(value.to_owned()),
            "data" => match &mut self.pending.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.pending.data = Some(value.to_owned()),
            },
            _ => {} // `retry` and unknown fields
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = "id: 41\n\n: keepalive\n\nid: 42.0\nevent: acquired\ndata: {\"a\":1}\n\nid:43.1\r\nevent:released\r\ndata: line one\r\ndata:line two\r\nretry: 1000\r\nunknown: x\r\n\r\ndata\n\n";

    fn expected() -> Vec<Message> {
        vec![
            Message {
                id: Some("41".into()),
                ..Message::default()
            },
            Message {
                id: Some("42.0".into()),
                event: Some("acquired".into()),
                data: Some("{\"a\":1}".into()),
            },
            Message {
                id: Some("43.1".into()),
                event: Some("released".into()),
                data: Some("line one\nline two".into()),
            },
            Message {
                data: Some(String::new()),
                ..Message::default()
            },
        ]
    }

    #[test]
    fn messages_are_parsed_whole() {
        assert_eq!(Parser::default().feed(STREAM.as_bytes()), expected());
    }

    #[test]
    fn chunk_boundaries_do_not_matter() {
        let bytes = STREAM.as_bytes();
        for size in 1..=7 {
            let mut parser = Parser::default();
            let got: Vec<Message> = bytes.chunks(size).flat_map(|c| parser.feed(c)).collect();
            assert_eq!(got, expected(), "chunks of {size}");
        }
    }

    #[test]
    fn lone_carriage_returns_end_lines_and_incomplete_messages_wait() {
        let mut parser = Parser::default();
        assert_eq!(
            parser.feed(b"id: 7\r\rid: 8\ndata: x"),
            vec![Message {
                id: Some("7".into()),
                ..Message::default()
            }]
        );
        assert_eq!(
            parser.feed(b"\n\n"),
            vec![Message {
                id: Some("8".into()),
                data: Some("x".into()),
                ..Message::default()
            }]
        );
        // Only comments and blank lines: nothing.
        assert!(parser.feed(b": a\n\n\n:b\n\n").is_empty());
    }
}
