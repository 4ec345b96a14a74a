//! What every service binary does before it serves: read settings, or say in one line why not.

use std::fmt::Display;
use std::process::ExitCode;

use clap::{Parser, error::ErrorKind};

/// Parses settings from flags and the environment.
///
/// `--help` and `--version` print and exit 0. Bad or missing settings print one line to stderr
/// and exit 2.
pub fn settings<T: Parser>() -> T {
    match T::try_parse() {
        Ok(settings) => settings,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => e.exit(),
        Err(e) => {
            let rendered = e.render().to_string();
            // clap's message runs until the first blank line; the usage hint after it is noise.
            let message = rendered
                .lines()
                .take_while(|line| !line.trim().is_empty())
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(" ");
            let message = message.strip_prefix("error: ").unwrap_or(&message);
            eprintln!("{}: invalid settings: {message}", T::command().get_name());
            std::process::exit(2);
        }
    }
}

/// Reports a fatal error in one line and returns the failure exit code.
pub fn fail(service: &str, error: impl Display) -> ExitCode {
    tracing::error!(%error, "{service} stopped");
    eprintln!("{service}: {error}");
    ExitCode::FAILURE
}

/// The exit code for how a service ended: success, or the error reported in one line.
pub fn exit<E: Display>(service: &str, outcome: Result<(), E>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(service, e),
    }
}

/// Parses a `KEY=VALUE` setting, such as a pass-through Kafka client option.
pub fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => Ok((key.trim().to_owned(), value.trim().to_owned())),
        _ => Err(format!("`{text}` is not KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_value_setting_splits_at_the_first_equals_sign_and_is_trimmed() {
        assert_eq!(parse_key_value(" linger.ms = 5 "), Ok(("linger.ms".to_owned(), "5".to_owned())));
        assert_eq!(parse_key_value("sasl.jaas=a=b"), Ok(("sasl.jaas".to_owned(), "a=b".to_owned())));
        assert_eq!(parse_key_value("empty="), Ok(("empty".to_owned(), String::new())));
    }

    #[test]
    fn a_setting_without_a_key_is_refused() {
        for bad in ["no-equals-sign", "=value", "  =value", ""] {
            assert!(parse_key_value(bad).is_err(), "{bad:?}");
        }
    }
}
