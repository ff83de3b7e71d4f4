//! The registration socket file.

use std::{
    io,
    os::unix::fs::FileTypeExt,
    path::{Path, PathBuf},
};

use tokio::net::UnixListener;

use super::decide::SocketState;

/// The socket path could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Something else is at the path; upstream refuses to remove it too.
    #[error("{0} exists and is not a socket; refusing to remove it")]
    NotASocket(PathBuf),
    /// I/O.
    #[error("{path}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

/// Looks at the path without following links.
pub fn state(path: &Path) -> SocketState {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => SocketState::Present,
        Ok(_) => SocketState::NotASocket,
        Err(e) if e.kind() == io::ErrorKind::NotFound => SocketState::Missing,
        Err(e) => SocketState::StatError(e.to_string()),
    }
}

/// Removes a stale socket; a missing one is fine.
pub fn remove(path: &Path) -> Result<(), SocketError> {
    match state(path) {
        SocketState::Missing => Ok(()),
        SocketState::Present => std::fs::remove_file(path)
            .or_else(|e| if e.kind() == io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
            .map_err(|source| SocketError::Io { path: path.into(), source }),
        SocketState::NotASocket => Err(SocketError::NotASocket(path.into())),
        SocketState::StatError(e) => Err(SocketError::Io { path: path.into(), source: io::Error::other(e) }),
    }
}

/// Removes a stale socket and listens on a fresh one. The process umask
/// (0077, set in `main`) makes it owner-only, like upstream's.
pub fn listen(path: &Path) -> Result<UnixListener, SocketError> {
    remove(path)?;
    UnixListener::bind(path).map_err(|source| SocketError::Io { path: path.into(), source })
}
