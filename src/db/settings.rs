use std::path::PathBuf;

use crate::secret::{self, SecretError};

/// Where a service's database is: its URL, given inline or in a file (a mounted secret).
///
/// Flattened into each service's settings, so every service takes the same flags and
/// environment variables and reads the file the same way. What the database is for differs per
/// service: each says so in the help of `--database-url` (its id stays `database_url`), which it
/// sets with `#[command(mut_args(…))]`.
#[derive(Debug, Clone, clap::Args)]
pub struct DatabaseSettings {
    /// The service's database: mysql://, postgres:// or sqlite:// URL. A URL with a password
    /// belongs in `--database-url-file`: flags show in `ps`.
    #[arg(
        id = "database_url",
        long = "database-url",
        value_name = "DATABASE_URL",
        env = "IDEMPOST_DATABASE_URL",
        default_value = "",
        hide_default_value = true
    )]
    pub url: String,

    /// File holding the database URL (instead of `--database-url`), such as a mounted secret.
    #[arg(
        id = "database_url_file",
        long = "database-url-file",
        value_name = "DATABASE_URL_FILE",
        env = "IDEMPOST_DATABASE_URL_FILE"
    )]
    pub url_file: Option<PathBuf>,
}

impl DatabaseSettings {
    /// The database at `url`, given inline.
    pub fn new(url: impl Into<String>) -> Self {
        Self { url: url.into(), url_file: None }
    }

    /// The URL: the inline one, or the contents of `url_file`; exactly one must be given.
    pub fn resolved_url(&self) -> Result<String, SecretError> {
        secret::database_url(&self.url, self.url_file.as_deref())
    }

    /// Reads the URL from `url_file` when that is how it was given, so that `url` holds it.
    pub fn read_url_file(&mut self) -> Result<(), SecretError> {
        self.url = self.resolved_url()?;
        self.url_file = None;
        Ok(())
    }
}
