//! The generated parts of the documentation, and its checks:
//!
//! - the configuration reference (`docs/configuration.md`), rendered from the clap definitions the
//!   services parse, so the page cannot drift from the code: a test compares the committed page
//!   with a fresh rendering. The rendering is ours, not clap's help: clap wraps help to the
//!   terminal's width, and clap-markdown leaves out environment variables, which are how the
//!   services are deployed;
//! - the current benchmark figures ([`figures`]), one table rendered from the committed results
//!   file into the README and the benchmarks page;
//! - the docs index and the relative links ([`links`]), checked by the tests in `tests/`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, Command, CommandFactory as _};

pub mod figures;
pub mod links;

/// The command that rewrites every generated page: the configuration page and the figure tables.
pub const REGENERATE: &str = "cargo run -p idempost-docgen";

/// The workspace root: two directories above this crate's (`tools/docgen`).
pub fn workspace_root() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir.ancestors().nth(2).unwrap_or(crate_dir).to_path_buf()
}

const PREAMBLE: &str = "# Configuration

<!-- Generated from the services' clap definitions by `cargo run -p idempost-docgen`; do not edit.
     A test (`idempost-docgen`'s own) fails when this page differs from the code. -->

Every service takes each setting as a flag or from its environment variable; a flag wins over
the environment. Durations are written as `500ms`, `30s`, `5m`, `1h`, `7days`. Logging is set by
the environment alone: `RUST_LOG` (default `info`) and `IDEMPOST_LOG_FORMAT=json` (default: text);
telemetry by the standard `OTEL_*` variables (see [observability.md](observability.md)). A
setting the parser refuses exits 2; one the service refuses as it starts exits 1 (see
[operations.md](operations.md#exit-codes)).

The operators' and developers' tools (`idempostctl`, `idempost-verify`, `idempost-bench`,
`idempost-migrate`) describe their own flags with `--help`; see [operations.md](operations.md),
[verify.md](verify.md) and [benchmarks/README.md](benchmarks/README.md).
";

/// Where the committed page lives: `docs/configuration.md` at the workspace root.
pub fn configuration_page_path() -> PathBuf {
    let crate_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir.ancestors().nth(2).unwrap_or(crate_dir).join("docs").join("configuration.md")
}

/// The whole page: every setting of `idempost-order`, `idempost-relay` and `idempost-consumer`.
pub fn configuration_page() -> String {
    let mut page = String::from(PREAMBLE);
    for command in [
        idempost_order::Settings::command(),
        idempost_relay::Settings::command(),
        idempost_consumer::Settings::command(),
    ] {
        render_command(&mut page, &command, "##", "");
    }
    page
}

/// One command's section: its heading, what it does, a table of its settings, then its
/// subcommands one level down.
fn render_command(out: &mut String, command: &Command, level: &str, parent: &str) {
    let name = format!("{parent}{}", command.get_name());
    let _ = writeln!(out, "\n{level} {name}");
    if let Some(about) = command.get_long_about().or(command.get_about()) {
        let _ = writeln!(out, "\n{}", sentence(&about.to_string()));
    }
    let args: Vec<&Arg> = command.get_arguments().filter(|arg| documented(arg)).collect();
    if !args.is_empty() {
        out.push_str("\n| flag | environment | default | meaning |\n|---|---|---|---|\n");
        for arg in args {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                flag(arg),
                environment(arg),
                default(arg),
                meaning(arg)
            );
        }
    }
    for sub in command.get_subcommands() {
        render_command(out, sub, &format!("{level}#"), &format!("{name} "));
    }
}

/// Help and version are clap's own, and hidden settings are not for operators.
fn documented(arg: &Arg) -> bool {
    !arg.is_hide_set()
        && !matches!(arg.get_action(), ArgAction::Help | ArgAction::HelpLong | ArgAction::Version)
}

fn flag(arg: &Arg) -> String {
    match arg.get_long() {
        Some(long) => format!("`--{long}`"),
        None => format!("`{}` (argument)", arg.get_id().as_str().to_uppercase()),
    }
}

fn environment(arg: &Arg) -> String {
    arg.get_env().map(|env| format!("`{}`", env.to_string_lossy())).unwrap_or_default()
}

fn default(arg: &Arg) -> String {
    if !arg.get_action().takes_values() {
        return "off".to_owned();
    }
    let values: Vec<String> =
        arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
    match values.as_slice() {
        [] if arg.is_required_set() => "required".to_owned(),
        [] => "none".to_owned(),
        [only] if only.is_empty() => "empty".to_owned(),
        _ => values.iter().map(|v| format!("`{v}`")).collect::<Vec<_>>().join(", "),
    }
}

/// The setting's help, in one cell, with the values it accepts when they are a fixed set.
fn meaning(arg: &Arg) -> String {
    let help = arg.get_long_help().or(arg.get_help()).map(|h| sentence(&h.to_string())).unwrap_or_default();
    let choices: Vec<String> = if arg.get_action().takes_values() {
        arg.get_possible_values()
            .iter()
            .filter(|value| !value.is_hide_set())
            .map(|value| format!("`{}`", value.get_name()))
            .collect()
    } else {
        Vec::new()
    };
    if choices.is_empty() { help } else { format!("{help} One of {}.", choices.join(", ")) }
}

/// Help text as one sentence-ended table cell (clap drops the full stop of a one-line help).
fn sentence(text: &str) -> String {
    let line = one_line(text);
    if line.is_empty() || line.ends_with(['.', '!', '?']) { line } else { format!("{line}.") }
}

/// Help text as one table cell: whitespace collapsed (no dependence on a terminal's width) and
/// the cell separator escaped.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_configuration_page_matches_the_services_clap_definitions() {
        let path = configuration_page_path();
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == configuration_page(),
            "{} is stale (or missing): regenerate it with `{REGENERATE}` and commit it",
            path.display()
        );
    }

    #[test]
    fn every_setting_of_every_service_is_on_the_page_with_its_environment_variable() {
        let page = configuration_page();
        for command in [
            idempost_order::Settings::command(),
            idempost_relay::Settings::command(),
            idempost_consumer::Settings::command(),
        ] {
            for arg in command.get_arguments().filter(|arg| documented(arg)) {
                let row = format!("| {} | {} |", flag(arg), environment(arg));
                assert!(page.contains(&row), "{} lacks {row}", command.get_name());
            }
        }
    }

    #[test]
    fn help_text_becomes_one_cell_whatever_its_line_breaks() {
        assert_eq!(one_line("a  b\n   c | d\n"), "a b c \\| d");
        assert_eq!(sentence("Most connections"), "Most connections.");
        assert_eq!(sentence("Two paragraphs.\n\nThe second."), "Two paragraphs. The second.");
    }
}
