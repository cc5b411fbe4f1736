//! Reading `/v3` request bodies the way etcd's gateway reads them — or refusing them.
//!
//! etcd's gateway decodes a body with Go's `encoding/json` `Decoder` and `jsonpb`: it reads the
//! first JSON value and ignores whatever follows it; every object becomes a Go map, where a
//! repeated key silently keeps its last value; invalid UTF-8 and lone UTF-16 surrogate escapes
//! silently become U+FFFD. This reader accepts Go's grammar exactly and reports syntax errors in
//! Go's words (a client sees the message etcd would give), but everything Go would read in a way
//! the proxy cannot be sure to reproduce is a refusal of its own ([`JsonError::Refused`]):
//! duplicate keys (after escapes are undone), invalid UTF-8, lone surrogates, and nesting deeper
//! than [`MAX_DEPTH`]. What follows the first value is left to the caller.

use std::collections::HashSet;

/// Deepest nesting of objects and arrays read (Go allows 10,000). Enough for transactions nested
/// far deeper than the proxy's own limit on them allows.
pub(crate) const MAX_DEPTH: usize = 100;

/// A JSON value as Go's decoder sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number, as its literal text (already checked against JSON's number grammar).
    Number(String),
    /// A string.
    String(Str),
    /// An array.
    Array(Vec<Value>),
    /// An object, its members in order; no key occurs twice.
    Object(Vec<(String, Value)>),
}

impl Value {
    /// The kind's name in Go's type errors (`json: cannot unmarshal {kind} into …`).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }
}

/// A JSON string: its text, and the bytes between its quotes as sent (Go's `jsonpb` parses
/// 64-bit integers and enum names from the latter, escapes and all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Str {
    /// The text, escapes undone.
    pub(crate) text: String,
    /// The text between the quotes, exactly as sent.
    pub(crate) raw: String,
}

/// Why a body cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JsonError {
    /// Go's decoder refuses it too; this is Go's message.
    Go(String),
    /// Go would read it somehow; the proxy refuses to guess how.
    Refused(String),
}

/// Reads JSON values one after another from a body.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// The first reason to refuse the value being read. Reading goes on, so that a syntax
    /// error later in the value (which Go reports too) takes precedence.
    refusal: Option<String>,
}

fn eof() -> JsonError {
    JsonError::Go("unexpected EOF".into())
}

fn syntax(c: u8, context: &str) -> JsonError {
    JsonError::Go(format!("invalid character {} {context}", quote_char(c)))
}

/// Go's `quoteChar`: the offending byte as a rune, quoted with single quotes.
fn quote_char(c: u8) -> String {
    match c {
        b'\'' => r"'\''".into(),
        b'"' => "'\"'".into(),
        _ => format!("'{}'", go_escape(char::from(c))),
    }
}

/// `strconv.Quote` of one rune below U+0100, without the quotes.
fn go_escape(c: char) -> String {
    let n = u32::from(c);
    match c {
        '\x07' => r"\a".into(),
        '\x08' => r"\b".into(),
        '\x0c' => r"\f".into(),
        '\n' => r"\n".into(),
        '\r' => r"\r".into(),
        '\t' => r"\t".into(),
        '\x0b' => r"\v".into(),
        '\\' => r"\\".into(),
        _ if n < 0x20 || n == 0x7f => format!(r"\x{n:02x}"),
        _ if (0x80..=0xa0).contains(&n) || n == 0xad => format!(r"\u{n:04x}"),
        _ => c.to_string(),
    }
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            pos: 0,
            refusal: None,
        }
    }

    /// The next value, or `None` if only whitespace is left (Go's `io.EOF`).
    pub(crate) fn next_value(&mut self) -> Result<Option<Value>, JsonError> {
        self.skip_ws();
        if self.pos == self.bytes.len() {
            return Ok(None);
        }
        self.refusal = None;
        let value = self.value(0)?;
        match self.refusal.take() {
            Some(reason) => Err(JsonError::Refused(reason)),
            None => Ok(Some(value)),
        }
    }

    /// Whether nothing but whitespace is left.
    pub(crate) fn at_end(&mut self) -> bool {
        self.skip_ws();
        self.pos == self.bytes.len()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.pos += 1;
        Some(c)
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn refuse(&mut self, reason: impl Into<String>) {
        self.refusal.get_or_insert_with(|| reason.into());
    }

    /// A value starting at the current (non-whitespace) byte.
    fn value(&mut self, depth: usize) -> Result<Value, JsonError> {
        let c = self.peek().ok_or_else(eof)?;
        match c {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => self.string().map(Value::String),
            b'-' | b'0'..=b'9' => self.number(),
            b't' => self.literal("true", Value::Bool(true)),
            b'f' => self.literal("false", Value::Bool(false)),
            b'n' => self.literal("null", Value::Null),
            _ => Err(syntax(c, "looking for beginning of value")),
        }
    }

    fn nested(depth: usize) -> Result<(), JsonError> {
        if depth > MAX_DEPTH {
            return Err(JsonError::Refused(format!(
                "JSON nested deeper than {MAX_DEPTH} levels"
            )));
        }
        Ok(())
    }

    fn object(&mut self, depth: usize) -> Result<Value, JsonError> {
        Self::nested(depth)?;
        self.pos += 1;
        let mut members = Vec::new();
        let mut seen = HashSet::new();
        self.skip_ws();
        match self.peek() {
            None => return Err(eof()),
            Some(b'}') => {
                self.pos += 1;
                return Ok(Value::Object(members));
            }
            Some(b'"') => {}
            Some(c) => return Err(syntax(c, "looking for beginning of object key string")),
        }
        loop {
            let key = self.string()?.text;
            self.skip_ws();
            match self.bump() {
                None => return Err(eof()),
                Some(b':') => {}
                Some(c) => return Err(syntax(c, "after object key")),
            }
            self.skip_ws();
            let value = self.value(depth)?;
            if !seen.insert(key.clone()) {
                self.refuse(format!(
                    "duplicate JSON key {key:?} (etcd would silently keep the last one)"
                ));
            }
            members.push((key, value));
            self.skip_ws();
            match self.bump() {
                None => return Err(eof()),
                Some(b',') => {
                    self.skip_ws();
                    match self.peek() {
                        None => return Err(eof()),
                        Some(b'"') => {}
                        Some(c) => {
                            return Err(syntax(c, "looking for beginning of object key string"))
                        }
                    }
                }
                Some(b'}') => return Ok(Value::Object(members)),
                Some(c) => return Err(syntax(c, "after object key:value pair")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, JsonError> {
        Self::nested(depth)?;
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.bump() {
                None => return Err(eof()),
                Some(b',') => self.skip_ws(),
                Some(b']') => return Ok(Value::Array(items)),
                Some(c) => return Err(syntax(c, "after array element")),
            }
        }
    }

    fn literal(&mut self, word: &'static str, value: Value) -> Result<Value, JsonError> {
        self.pos += 1;
        for expected in word.bytes().skip(1) {
            match self.bump() {
                None => return Err(eof()),
                Some(c) if c == expected => {}
                Some(c) => {
                    return Err(syntax(
                        c,
                        &format!("in literal {word} (expecting {})", quote_char(expected)),
                    ))
                }
            }
        }
        Ok(value)
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, in the words of Go's scanner.
    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
            match self.peek() {
                None => return Err(eof()),
                Some(b'0'..=b'9') => {}
                Some(c) => return Err(syntax(c, "in numeric literal")),
            }
        }
        if self.peek() == Some(b'0') {
            self.pos += 1;
        } else {
            self.digits();
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            match self.peek() {
                None => return Err(eof()),
                Some(b'0'..=b'9') => self.digits(),
                Some(c) => return Err(syntax(c, "after decimal point in numeric literal")),
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            match self.peek() {
                None => return Err(eof()),
                Some(b'0'..=b'9') => self.digits(),
                Some(c) => return Err(syntax(c, "in exponent of numeric literal")),
            }
        }
        // Only ASCII digits and signs were consumed.
        let text = String::from_utf8_lossy(&self.bytes[start..self.pos]).into_owned();
        Ok(Value::Number(text))
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let mut n = 0;
        for _ in 0..4 {
            let c = self.bump().ok_or_else(eof)?;
            let digit = char::from(c)
                .to_digit(16)
                .ok_or_else(|| syntax(c, r"in \u hexadecimal character escape"))?;
            n = n * 16 + digit;
        }
        Ok(n)
    }

    /// A low surrogate escape `\uDC00`–`\uDFFF` right at the current position, consumed if so.
    fn low_surrogate(&mut self) -> Option<u32> {
        let rest = self.bytes.get(self.pos..self.pos + 6)?;
        if !rest.starts_with(br"\u") {
            return None;
        }
        let hex = std::str::from_utf8(&rest[2..]).ok()?;
        let n = u32::from_str_radix(hex, 16).ok()?;
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) || !(0xdc00..0xe000).contains(&n) {
            return None;
        }
        self.pos += 6;
        Some(n)
    }

    fn string(&mut self) -> Result<Str, JsonError> {
        self.pos += 1;
        let start = self.pos;
        let mut text = Vec::new();
        loop {
            let c = self.bump().ok_or_else(eof)?;
            match c {
                b'"' => break,
                b'\\' => {
                    let e = self.bump().ok_or_else(eof)?;
                    match e {
                        b'"' | b'\\' | b'/' => text.push(e),
                        b'b' => text.push(0x08),
                        b'f' => text.push(0x0c),
                        b'n' => text.push(b'\n'),
                        b'r' => text.push(b'\r'),
                        b't' => text.push(b'\t'),
                        b'u' => {
                            let unit = self.hex4()?;
                            let scalar = if (0xd800..0xdc00).contains(&unit) {
                                self.low_surrogate()
                                    .map(|low| 0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00))
                            } else {
                                Some(unit)
                            };
                            match scalar.and_then(char::from_u32) {
                                Some(ch) => {
                                    let mut buf = [0; 4];
                                    text.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                                }
                                None => {
                                    self.refuse(
                                        "a lone UTF-16 surrogate escape (etcd would read U+FFFD)",
                                    );
                                }
                            }
                        }
                        other => return Err(syntax(other, "in string escape code")),
                    }
                }
                c if c < 0x20 => return Err(syntax(c, "in string literal")),
                c => text.push(c),
            }
        }
        let raw = &self.bytes[start..self.pos - 1];
        match (String::from_utf8(text), std::str::from_utf8(raw)) {
            (Ok(text), Ok(raw)) => Ok(Str {
                text,
                raw: raw.to_owned(),
            }),
            _ => {
                self.refuse("invalid UTF-8 in a JSON string (etcd would read U+FFFD)");
                Ok(Str {
                    text: String::new(),
                    raw: String::new(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(s: &str) -> Result<Option<Value>, JsonError> {
        Reader::new(s.as_bytes()).next_value()
    }

    fn go(s: &str) -> String {
        match first(s) {
            Err(JsonError::Go(m)) => m,
            other => panic!("{s:?}: {other:?}"),
        }
    }

    fn refused(s: &str) -> bool {
        matches!(first(s), Err(JsonError::Refused(_)))
    }

    #[test]
    fn syntax_errors_in_gos_words() {
        for (input, message) in [
            (
                "not json",
                "invalid character 'o' in literal null (expecting 'u')",
            ),
            (r#"{"key":"#, "unexpected EOF"),
            ("{", "unexpected EOF"),
            ("x", "invalid character 'x' looking for beginning of value"),
            (
                "{1:2}",
                "invalid character '1' looking for beginning of object key string",
            ),
            (r#"{"a" 1}"#, "invalid character '1' after object key"),
            (
                r#"{"a":1 "b":2}"#,
                "invalid character '\"' after object key:value pair",
            ),
            (
                r#"{"a":01}"#,
                "invalid character '1' after object key:value pair",
            ),
            ("[1 2]", "invalid character '2' after array element"),
            (
                "[1,]",
                "invalid character ']' looking for beginning of value",
            ),
            (r#"{"a":-}"#, "invalid character '}' in numeric literal"),
            (
                r#"{"a":1.}"#,
                "invalid character '}' after decimal point in numeric literal",
            ),
            (
                r#"{"a":1e}"#,
                "invalid character '}' in exponent of numeric literal",
            ),
            ("{\"a\n\":1}", r"invalid character '\n' in string literal"),
            (r#"{"\x":1}"#, "invalid character 'x' in string escape code"),
            (
                r#"{"\u12g4":1}"#,
                r"invalid character 'g' in \u hexadecimal character escape",
            ),
            ("tru", "unexpected EOF"),
            (
                "\u{ef}",
                "invalid character 'Ã' looking for beginning of value",
            ),
            (
                "'",
                r"invalid character '\'' looking for beginning of value",
            ),
        ] {
            assert_eq!(go(input), message, "{input:?}");
        }
    }

    #[test]
    fn values_and_what_follows_them() {
        let mut r = Reader::new(br#" {"ID":"1","TTL":2}{"a":[true,null,-0.5e+3]} x"#);
        let v = r.next_value().unwrap().unwrap();
        let Value::Object(m) = v else { panic!() };
        assert_eq!(m[0].0, "ID");
        assert_eq!(m[1].1, Value::Number("2".into()));
        assert!(r.next_value().unwrap().is_some());
        assert!(!r.at_end());
        assert_eq!(Reader::new(b" \n\t").next_value(), Ok(None));
    }

    #[test]
    fn escapes_are_undone_and_raw_text_kept() {
        let Some(Value::String(s)) = first(r#""a\u0041\n\ud83d\ude00\/""#).unwrap() else {
            panic!()
        };
        assert_eq!(s.text, "aA\n\u{1f600}/");
        assert_eq!(s.raw, r"a\u0041\n\ud83d\ude00\/");
    }

    #[test]
    fn what_go_reads_differently_is_refused() {
        assert!(refused(r#"{"key":"a","key":"b"}"#));
        assert!(refused(r#"{"key":"a","k\u0065y":"b"}"#));
        assert!(refused(r#"{"a":"\ud800"}"#));
        assert!(refused(r#"{"a":"\udc00x"}"#));
        let invalid_utf8 = b"{\"a\":\"\xff\"}";
        assert!(matches!(
            Reader::new(invalid_utf8).next_value(),
            Err(JsonError::Refused(_))
        ));
        let deep = "[".repeat(MAX_DEPTH + 1);
        assert!(refused(&deep));
        // A syntax error later in the value wins: Go reports it too.
        assert_eq!(
            go(r#"{"a":1,"a":2,}"#),
            "invalid character '}' looking for beginning of object key string"
        );
    }
}
