//! Go's standard base64 decoder (`base64.StdEncoding`, which etcd's gateway decodes every bytes
//! field with), reproduced byte for byte so that the proxy reports the same "illegal base64 data
//! at input byte N" as etcd, and can tell which inputs Go reads differently from a strict decoder.

/// Go's `base64.StdEncoding.DecodeString`, byte for byte: the decoded bytes, or the offset Go
/// reports in "illegal base64 data at input byte N". Like Go it skips `\r` and `\n` and ignores
/// non-zero bits in the last character (the caller refuses both).
pub(crate) fn go_base64(src: &[u8]) -> Result<Vec<u8>, usize> {
    fn digit(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let newline = |c: u8| c == b'\n' || c == b'\r';
    let mut out = Vec::with_capacity(src.len() / 4 * 3);
    let mut si = 0;
    while si < src.len() {
        // One `decodeQuantum`.
        let mut quantum = [0u32; 4];
        let mut len = 4;
        let mut trailing = None;
        let mut j = 0;
        while j < 4 {
            let Some(&c) = src.get(si) else {
                if j == 0 {
                    return Ok(out);
                }
                return Err(si - j);
            };
            si += 1;
            if let Some(d) = digit(c) {
                quantum[j] = d;
                j += 1;
                continue;
            }
            if newline(c) {
                continue;
            }
            if c != b'=' || j < 2 {
                return Err(si - 1);
            }
            if j == 2 {
                while src.get(si).is_some_and(|&c| newline(c)) {
                    si += 1;
                }
                match src.get(si) {
                    None => return Err(src.len()),
                    Some(b'=') => si += 1,
                    Some(_) => return Err(si - 1),
                }
            }
            while src.get(si).is_some_and(|&c| newline(c)) {
                si += 1;
            }
            if si < src.len() {
                trailing = Some(si);
            }
            len = j;
            break;
        }
        let val = quantum[0] << 18 | quantum[1] << 12 | quantum[2] << 6 | quantum[3];
        let bytes = val.to_be_bytes();
        out.extend_from_slice(&bytes[1..len]);
        if let Some(at) = trailing {
            return Err(at);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_base64_offsets() {
        assert_eq!(go_base64(b"not base64!"), Err(3));
        assert_eq!(go_base64(b"***"), Err(0));
        assert_eq!(go_base64(b"YQ="), Err(3));
        assert_eq!(go_base64(b"YQ"), Err(0));
        assert_eq!(go_base64(b"Y==="), Err(1));
        assert_eq!(go_base64(b"YQ==x"), Err(4));
        assert_eq!(go_base64(b"YQ==").unwrap(), b"a");
        assert_eq!(go_base64(b"Y\nQ=\r=").unwrap(), b"a");
        assert_eq!(
            go_base64(b"YR==").unwrap(),
            b"a",
            "Go ignores the extra bits"
        );
        assert_eq!(go_base64(b"YWJj").unwrap(), b"abc");
        assert_eq!(go_base64(b"").unwrap(), b"");
    }
}
