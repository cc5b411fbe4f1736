//! An incremental parser of Server-Sent Events (the `text/event-stream` format of the HTML
//! standard): bytes in, messages out, whatever the chunk boundaries.

/// The most bytes one line, or the data of one message, may have.
pub(crate) const MAX_LINE: usize = 1 << 20;

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
    /// A line or a message's data went over [`MAX_LINE`]: nothing more is parsed.
    overflowed: bool,
}

impl Parser {
    /// Whether a line, or one message's data, went over [`MAX_LINE`] bytes: the parser takes
    /// nothing more (the connection must be dropped; the message being read is lost).
    pub(crate) fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Feeds `bytes`; returns the messages completed by them (up to an overflow).
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<Message> {
        let mut out = Vec::new();
        for &b in bytes {
            if self.overflowed {
                break;
            }
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
                _ if self.line.len() >= MAX_LINE => {
                    self.overflowed = true;
                    self.line = Vec::new();
                    self.pending = Message::default();
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
                Some(data) if data.len() + 1 + value.len() > MAX_LINE => {
                    self.overflowed = true;
                    self.pending = Message::default();
                }
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

    #[test]
    fn a_line_or_a_message_over_the_limit_stops_the_parser() {
        let mut parser = Parser::default();
        let mut bytes = b"id: 1\ndata: x\n\nid: 2\ndata: ".to_vec();
        bytes.extend(std::iter::repeat_n(b'a', MAX_LINE));
        bytes.extend(b"\n\nid: 3\n\n");
        let got = parser.feed(&bytes);
        assert_eq!(got.len(), 1, "only the message before the long line");
        assert!(parser.overflowed());
        assert!(parser.feed(b"id: 4\n\n").is_empty());

        // Many data lines, each short, adding up to more than the limit.
        let mut parser = Parser::default();
        let line = format!("data: {}\n", "b".repeat(1000));
        for _ in 0..(MAX_LINE / 1000 + 1) {
            assert!(parser.feed(line.as_bytes()).is_empty());
        }
        assert!(parser.overflowed());
    }
}
