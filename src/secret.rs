//! Secret settings (database URLs with passwords, Kafka SASL passwords) given inline or read
//! from a file, so that they need not appear on a command line, where every user of the host
//! can read them (`ps`, `/proc/<pid>/cmdline`). Their values never reach a log or an error.

use std::path::{Path, PathBuf};

/// A secret setting could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Neither form of a required setting was given.
    #[error("{0} is required")]
    Missing(&'static str),
    /// Both forms were given: which one counts would be a guess.
    #[error("{0}: give the value or the file, not both")]
    Both(&'static str),
    /// The file cannot be read.
    #[error("{setting}: cannot read {path}: {source}")]
    Read {
        /// The setting naming the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line of an options file is not `KEY=VALUE` (the line is not repeated: it may hold a
    /// secret).
    #[error("{setting}: line {line} of {path} is not KEY=VALUE")]
    NotKeyValue {
        /// The setting naming the file.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// Its 1-based line number.
        line: usize,
    },
}

const DATABASE_URL: &str =
    "--database-url (IDEMPOST_DATABASE_URL) or --database-url-file (IDEMPOST_DATABASE_URL_FILE)";
const KAFKA_OPTION_FILE: &str = "--kafka-option-file (IDEMPOST_KAFKA_OPTION_FILE)";

fn read(setting: &'static str, path: &Path) -> Result<String, SecretError> {
    std::fs::read_to_string(path).map_err(|source| SecretError::Read {
        setting,
        path: path.to_owned(),
        source,
    })
}

/// The database URL: `inline` (the flag or its environment variable), or the contents of `file`
/// with surrounding white space (a trailing newline) removed. Exactly one must be given.
pub fn database_url(inline: &str, file: Option<&Path>) -> Result<String, SecretError> {
    match (inline.trim().is_empty(), file) {
        (true, None) => Err(SecretError::Missing(DATABASE_URL)),
        (false, Some(_)) => Err(SecretError::Both(DATABASE_URL)),
        (false, None) => Ok(inline.to_owned()),
        (true, Some(path)) => {
            let url = read("--database-url-file", path)?.trim().to_owned();
            if url.is_empty() { Err(SecretError::Missing(DATABASE_URL)) } else { Ok(url) }
        }
    }
}

/// Kafka client options: `inline` (the `--kafka-option` flags or their environment variable),
/// then those of `file`, one `KEY=VALUE` a line (blank lines and lines starting with `#` are
/// skipped). An option in the file overrides the same key given inline.
pub fn kafka_options(
    inline: &[(String, String)],
    file: Option<&Path>,
) -> Result<Vec<(String, String)>, SecretError> {
    let mut options = inline.to_vec();
    let Some(path) = file else { return Ok(options) };
    for (index, line) in read(KAFKA_OPTION_FILE, path)?.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let option = crate::startup::parse_key_value(line).map_err(|_| SecretError::NotKeyValue {
            setting: KAFKA_OPTION_FILE,
            path: path.to_owned(),
            line: index + 1,
        })?;
        options.push(option);
    }
    Ok(options)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_database_url_comes_from_exactly_one_place_and_a_file_loses_its_newline() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("url");
        std::fs::write(&file, "mysql://idempost:s3cret@db/idempost\n").unwrap();
        assert_eq!(database_url("", Some(&file)).unwrap(), "mysql://idempost:s3cret@db/idempost");
        assert_eq!(database_url("sqlite::memory:", None).unwrap(), "sqlite::memory:");
        assert!(matches!(database_url("", None), Err(SecretError::Missing(_))));
        assert!(matches!(database_url("sqlite::memory:", Some(&file)), Err(SecretError::Both(_))));
        let missing = database_url("", Some(&dir.path().join("none"))).unwrap_err();
        assert!(missing.to_string().contains("--database-url-file"), "{missing}");
    }

    #[test]
    fn kafka_options_from_a_file_follow_the_inline_ones_and_a_bad_line_is_named_not_shown() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kafka");
        std::fs::write(&file, "# SASL\nsasl.username = idempost\n\nsasl.password=p=w,d\n").unwrap();
        let inline = vec![("sasl.mechanisms".to_owned(), "PLAIN".to_owned())];
        let options = kafka_options(&inline, Some(&file)).unwrap();
        let keys: Vec<_> = options.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(keys, ["sasl.mechanisms=PLAIN", "sasl.username=idempost", "sasl.password=p=w,d"]);
        std::fs::write(&file, "sasl.username=idempost\nhunter2\n").unwrap();
        let refused = kafka_options(&[], Some(&file)).unwrap_err().to_string();
        assert!(refused.contains("line 2") && !refused.contains("hunter2"), "{refused}");
    }
}
