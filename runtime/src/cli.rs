//! What both binaries' command lines share: settings layered flags > environment > TOML file >
//! defaults, the log format, secrets redacted from printed settings, and shell completions and a
//! man page generated from the clap definition.

use std::fmt::Display;
use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::parser::ValueSource;
use serde::de::DeserializeOwned;
use serde::Serialize;

use clap_complete::Shell;

/// The log format is telemetry's (which the command line sits above); named here too because
/// every binary's configuration has a `--log-format`.
pub use crate::telemetry::LogFormat;

/// A configuration read by clap from flags and environment variables, with an optional TOML file
/// (keys: the long flag names with `_`) layered under them. Fields that only make sense on the
/// command line (`--config`, `--print-config`, …) are `#[serde(skip)]`, and the struct denies
/// unknown fields, so a file that names one is refused.
pub trait Layered: clap::Parser + Serialize + DeserializeOwned {
    /// The TOML file to layer, if one was named.
    fn file(&self) -> Option<&Path>;

    /// Copies the command-line-only settings from `cli` (the file cannot carry them).
    fn keep_command_line_only(&mut self, cli: &Self);
}

/// Parses flags and environment, then layers the named TOML file under them: a setting comes
/// from the file only when neither a flag nor the environment gave it.
pub fn parse_layered<T: Layered>() -> Result<T, clap::Error> {
    parse_layered_from(std::env::args_os())
}

/// [`parse_layered`] over `args` (the program's name first) instead of the process's own.
pub fn parse_layered_from<T: Layered>(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<T, clap::Error> {
    let command = T::command();
    let matches = command.clone().try_get_matches_from(args)?;
    let cli = T::from_arg_matches(&matches)?;
    let Some(path) = cli.file().map(Path::to_owned) else {
        return Ok(cli);
    };
    let given = |id: &str| {
        command.get_arguments().any(|a| a.get_id() == id)
            && !matches!(
                matches.value_source(id),
                Some(ValueSource::DefaultValue) | None
            )
    };
    layer_file(&cli, &path, |id| !given(id))
        .map_err(|e| T::command().error(clap::error::ErrorKind::InvalidValue, e))
}

/// `cli` with every setting for which `from_file(name)` is true replaced by the file's value. A
/// key that is no setting (or a command-line-only one) is refused.
pub fn layer_file<T: Layered>(
    cli: &T,
    path: &Path,
    from_file: impl Fn(&str) -> bool,
) -> Result<T, String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| at(&e))?;
    let file: toml::Table = text.parse().map_err(|e| at(&e))?;
    let mut merged = toml::Table::try_from(cli).map_err(|e| e.to_string())?;
    for (key, value) in file {
        if from_file(&key) {
            merged.insert(key, value);
        }
    }
    let mut layered: T = merged
        .try_into()
        .map_err(|e: toml::de::Error| at(&e.message()))?;
    layered.keep_command_line_only(cli);
    Ok(layered)
}

/// Flags that make a binary print something and exit instead of serving (command line only:
/// never in the config file).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PrintAndExit {
    /// Print the effective configuration (flags > environment > file > defaults) as TOML, with
    /// credentials in URLs redacted, and exit.
    #[arg(long)]
    pub print_config: bool,

    /// Print shell completions for SHELL and exit.
    #[arg(long, value_name = "SHELL", value_enum)]
    pub completions: Option<Shell>,

    /// Print the man page (roff) and exit.
    #[arg(long)]
    pub man: bool,
}

/// EX_USAGE: the exit status of a binary whose configuration is wrong.
pub const EXIT_CONFIG: u8 = 64;

/// The exit of a binary whose command line or configuration could not be read (status 0 for
/// `--help` and `--version`, which clap reports as errors too).
pub fn config_error_exit(e: &clap::Error) -> ExitCode {
    let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
    let _ = e.print();
    ExitCode::from(code)
}

/// Prints the completions or the man page for `cmd` if asked: `Some(exit)` when it did (or
/// failed to), `None` to go on.
pub fn print_generated(cmd: clap::Command, asked: &PrintAndExit) -> Option<ExitCode> {
    let name = cmd.get_name().to_owned();
    match write_generated(cmd, asked.completions, asked.man, &mut std::io::stdout()) {
        Ok(true) => Some(ExitCode::SUCCESS),
        Ok(false) => None,
        Err(e) => {
            eprintln!("{name}: {e}");
            Some(ExitCode::FAILURE)
        }
    }
}

/// Prints binary `name`'s effective settings (`--print-config`).
pub fn print_settings(name: &str, toml: Result<String, impl Display>) -> ExitCode {
    match toml {
        Ok(toml) => {
            print!("{toml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Serves as binary `service`: installs its telemetry, runs `serve` on a multi-threaded
/// runtime (`threads` workers, else one per CPU), flushes spans once the runtime has stopped,
/// and maps the outcome to the exit status.
pub fn run_server<E: Display, F: Future<Output = Result<(), E>>>(
    service: &'static str,
    format: LogFormat,
    threads: Option<usize>,
    serve: impl FnOnce() -> F,
) -> ExitCode {
    let telemetry = crate::telemetry::init(service, format);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        builder.worker_threads(n);
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{service}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(serve());
    drop(runtime);
    telemetry.shutdown();
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "{service} failed");
            eprintln!("{service}: {e}");
            ExitCode::FAILURE
        }
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
