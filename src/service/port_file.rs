//! The port file (`--port-file`): where a service started on port 0 says which ports it got.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;

/// Writes one `name=address` line per listener to `path`, once every listener is bound. The lines
/// go to a temporary file beside it first, which is then renamed into place: a reader that sees
/// the file sees all of it.
pub(crate) fn write(path: &Path, listeners: &[(&str, SocketAddr)]) -> std::io::Result<()> {
    let mut text = String::new();
    for (name, addr) in listeners {
        text.push_str(&format!("{name}={addr}\n"));
    }
    let mut staged = path.as_os_str().to_owned();
    staged.push(format!(".{}.tmp", std::process::id()));
    let staged = std::path::PathBuf::from(staged);
    let mut file = std::fs::File::create(&staged)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&staged, path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_port_file_holds_one_line_per_listener_and_no_staging_file_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ports");
        let listeners = [
            ("listen", SocketAddr::from(([127, 0, 0, 1], 40001))),
            ("admin-listen", SocketAddr::from(([127, 0, 0, 1], 40002))),
        ];
        write(&path, &listeners).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "listen=127.0.0.1:40001\nadmin-listen=127.0.0.1:40002\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
