//! What both binaries' command lines share: the log format and logging set-up, secrets redacted
//! from printed settings, and shell completions and a man page generated from the clap
//! definition.

use std::io::Write;

use clap_complete::Shell;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Logs to stderr in `format`, filtered by `RUST_LOG` (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
}

/// `url` with any credentials (`user:password@`) replaced by `***@`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// Writes what was asked for — completions for `shell`, or the man page — for `cmd` to `out`.
/// `false` when neither was asked for.
pub fn write_generated(
    mut cmd: clap::Command,
    completions: Option<Shell>,
    man: bool,
    out: &mut dyn Write,
) -> std::io::Result<bool> {
    if let Some(shell) = completions {
        let name = cmd.get_name().to_owned();
        clap_complete::generate(shell, &mut cmd, name, out);
        return Ok(true);
    }
    if man {
        clap_mangen::Man::new(cmd).render(out)?;
        return Ok(true);
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_redacted_and_nothing_else() {
        assert_eq!(
            redact_url("postgres://fence:s3cret@db:5432/marks"),
            "postgres://***@db:5432/marks"
        );
        assert_eq!(
            redact_url("http://user@h:1/p?q=a@b"),
            "http://***@h:1/p?q=a@b"
        );
        assert_eq!(redact_url("http://127.0.0.1:2379"), "http://127.0.0.1:2379");
        assert_eq!(redact_url("http://h/path@x"), "http://h/path@x");
        assert_eq!(redact_url("sqlite:marks.db"), "sqlite:marks.db");
        assert_eq!(redact_url("memory"), "memory");
    }

    #[test]
    fn generates_completions_and_a_man_page() {
        let cmd = || clap::Command::new("demo").arg(clap::Arg::new("listen").long("listen"));
        let mut out = Vec::new();
        assert!(write_generated(cmd(), Some(Shell::Bash), false, &mut out).unwrap());
        assert!(String::from_utf8_lossy(&out).contains("--listen"));
        let mut out = Vec::new();
        assert!(write_generated(cmd(), None, true, &mut out).unwrap());
        assert!(String::from_utf8_lossy(&out).starts_with(".ie"));
        assert!(!write_generated(cmd(), None, false, &mut Vec::new()).unwrap());
    }
}
