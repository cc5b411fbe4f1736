//! Reading the files an operator points the binaries at (keys, certificates, the token file):
//! regular files only, and bounded — a FIFO would block the reader for good and a device such
//! as `/dev/zero` would never end, both at start and on every reload. Files of lines (the key
//! file, the token file) must end their last line: one that does not may have been read while
//! being written.

use std::io::{self, Read};
use std::path::Path;

/// Reads the regular file at `path`, refusing anything else and anything larger than `max`
/// bytes (the error says which).
pub fn read_config_file(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let not_regular = || io::Error::new(io::ErrorKind::InvalidInput, "not a regular file");
    if !std::fs::metadata(path)?.is_file() {
        return Err(not_regular());
    }
    let file = std::fs::File::open(path)?;
    // Checked again on what was opened: the name may have been swapped in between.
    if !file.metadata()?.is_file() {
        return Err(not_regular());
    }
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        ));
    }
    Ok(bytes)
}

/// Reads the regular file of lines at `path` like [`read_config_file`], as UTF-8, refusing a
/// file whose last line has no newline: it may have been read in the middle of a rewrite (a
/// line cut short can mean something else, such as a shorter, wider prefix). An empty file is
/// whole.
pub fn read_config_text(path: &Path, max: u64) -> io::Result<String> {
    let text = String::from_utf8(read_config_file(path, max)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if !text.is_empty() && !text.ends_with('\n') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the last line has no newline: the file may be cut short (being written?); end \
             it with a newline, and replace the file by rename (write a temporary file in the \
             same directory, then rename it over this one)",
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_of_lines_must_end_their_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lines");
        for whole in ["", "\n", "a b\n", "a b\n# c\n"] {
            std::fs::write(&file, whole).unwrap();
            assert_eq!(read_config_text(&file, 100).unwrap(), whole);
        }
        for cut in ["a", "a b\nc", "a b\n# c"] {
            std::fs::write(&file, cut).unwrap();
            let err = read_config_text(&file, 100).unwrap_err();
            assert!(err.to_string().contains("no newline"), "{cut:?}: {err}");
        }
        std::fs::write(&file, [b'a', 0xff, b'\n']).unwrap();
        assert!(read_config_text(&file, 100).is_err());
    }

    #[test]
    fn only_bounded_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        std::fs::write(&small, "abc").unwrap();
        assert_eq!(read_config_file(&small, 3).unwrap(), b"abc");
        let err = read_config_file(&small, 2).unwrap_err();
        assert!(err.to_string().contains("larger than 2 bytes"), "{err}");
        for other in [dir.path(), Path::new("/dev/zero")] {
            let err = read_config_file(other, 1 << 20).unwrap_err();
            assert!(err.to_string().contains("not a regular file"), "{err}");
        }
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let err = read_config_file(&fifo, 1 << 20).unwrap_err();
            assert!(err.to_string().contains("not a regular file"), "{err}");
        }
        assert!(read_config_file(&dir.path().join("missing"), 1).is_err());
    }
}
