//! A database server of the test's own (the test kit's private server), for tests that stop and
//! start the database. The machine's shared MariaDB and PostgreSQL serve every other test at the
//! same time and are never stopped.

use idempost_testkit::private_db::{self, Engine};

use crate::helpers::{Backend, TestDb};

/// A private MariaDB or PostgreSQL server, stopped for good when dropped.
pub struct PrivateServer(private_db::PrivateServer);

impl PrivateServer {
    /// Initialises a data directory and starts the server.
    pub async fn start(backend: Backend) -> Self {
        let engine = match backend {
            Backend::MariaDb => Engine::MariaDb,
            Backend::Postgres => Engine::Postgres,
            Backend::Sqlite => panic!("SQLite has no server to stop"),
        };
        Self(private_db::PrivateServer::start(engine).await)
    }

    /// A fresh, migrated database on this server.
    pub async fn migrated_database(&self) -> TestDb {
        TestDb::migrated_at(self.0.create_database().await).await
    }

    /// Stops the server abruptly, as a crash would: no client gets a goodbye.
    pub async fn stop(&mut self) {
        self.0.stop().await;
    }

    /// Starts the server again on its port and data, and waits until it accepts queries.
    pub async fn resume(&mut self) {
        self.0.resume().await;
    }
}
