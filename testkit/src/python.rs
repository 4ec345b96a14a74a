//! The Python clients (clients/python) run as a user runs them: one script, its JSON lines.

use std::collections::BTreeSet;
use std::process::{ExitStatus, Stdio};

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::wait::WAIT;

/// The interpreter with clients/python's requirements installed.
fn python() -> String {
    std::env::var("IDEMPOST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "IDEMPOST_PYTHON is not set. It names a Python with clients/python/requirements.txt installed, \
             and the stubs must be generated: scripts/test sets up both (ensure_python_clients in \
             scripts/common.sh). After one run of scripts/test: \
             export IDEMPOST_PYTHON=$HOME/.cache/idempost/venv/bin/python"
        )
    })
}

/// What one run of a Python client printed.
#[derive(Debug)]
pub struct PythonRun {
    pub status: ExitStatus,
    pub lines: Vec<Value>,
    pub stderr: String,
}

impl PythonRun {
    pub fn of_type(&self, kind: &str) -> Vec<&Value> {
        self.lines.iter().filter(|line| line["type"] == kind).collect()
    }

    /// The only `result` line.
    pub fn result(&self) -> &Value {
        let results = self.of_type("result");
        assert_eq!(results.len(), 1, "one result line expected: {self}");
        results[0]
    }

    /// `call code [reason]` of every call made, in order.
    pub fn calls(&self) -> Vec<String> {
        self.of_type("call")
            .into_iter()
            .map(|call| match call["reason"].as_str() {
                Some(reason) => format!("{} {} {reason}", text(&call["call"]), text(&call["code"])),
                None => format!("{} {}", text(&call["call"]), text(&call["code"])),
            })
            .collect()
    }

    /// The event ids every submit call sent.
    pub fn sent_event_ids(&self) -> BTreeSet<String> {
        self.of_type("call")
            .into_iter()
            .filter(|call| call["call"] == "submit")
            .map(|call| text(&call["sent_event_id"]).to_owned())
            .collect()
    }
}

impl std::fmt::Display for PythonRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; stdout:", self.status)?;
        for line in &self.lines {
            write!(f, "\n  {line}")?;
        }
        write!(f, "\nstderr:\n{}", self.stderr)
    }
}

/// A JSON string value, or a failed test naming what it was instead.
pub fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_else(|| panic!("not a string: {value}"))
}

/// Runs `clients/python/<script>` with `args`, `stdin` on its standard input, and reads its JSON
/// lines.
pub async fn run_python(script: &str, args: &[String], stdin: &str) -> PythonRun {
    let path = crate::repo_root().join("clients/python").join(script);
    let mut child = tokio::process::Command::new(python())
        .arg(&path)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {} {}: {e}", python(), path.display()));
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let output = tokio::time::timeout(WAIT * 2, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish within {:?}", WAIT * 2))
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let lines = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| {
                panic!("{script} printed a line that is not JSON ({e}): {line}\n{stderr}")
            })
        })
        .collect();
    PythonRun { status: output.status, lines, stderr }
}

/// A valid two-line order as proto JSON: the same content as [`crate::order::order`]`(7, request_id)`.
pub fn order_json(request_id: &str, event_id: Option<&str>) -> Value {
    let mut order = json!({
        "tenant_id": 7,
        "request_id": request_id,
        "customer_id": "customer-42",
        "currency": "EUR",
        "line_items": [
            {"sku": "SKU-RED-MUG", "quantity": 2, "unit_price_minor": 1250},
            {"sku": "SKU-TEA", "quantity": 1, "unit_price_minor": 799},
        ],
    });
    if let Some(event_id) = event_id {
        order["event_id"] = event_id.into();
    }
    order
}
