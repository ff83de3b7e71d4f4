//! `--csi-address`: a filesystem path or a `unix://` URL.

use std::path::{Path, PathBuf};

/// The address is not a unix socket.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid --csi-address {0:?}: expected a socket path or a unix:// URL")]
pub struct AddressError(pub String);

/// The driver's unix socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsiAddress {
    path: PathBuf,
}

impl CsiAddress {
    /// Parses `/csi/csi.sock`, `unix:///csi/csi.sock` or `unix:/csi/csi.sock`.
    /// A relative path is taken as is, like Go's gRPC `unix:` target.
    pub fn parse(s: &str) -> Result<Self, AddressError> {
        let path = if let Some(rest) = s.strip_prefix("unix://") {
            rest
        } else if let Some(rest) = s.strip_prefix("unix:") {
            rest
        } else if s.contains("://") {
            return Err(AddressError(s.to_string()));
        } else {
            s
        };
        if path.is_empty() {
            return Err(AddressError(s.to_string()));
        }
        Ok(CsiAddress { path: PathBuf::from(path) })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::fmt::Display for CsiAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unix://{}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        for s in ["/csi/csi.sock", "unix:///csi/csi.sock", "unix:/csi/csi.sock"] {
            assert_eq!(CsiAddress::parse(s).unwrap().path(), Path::new("/csi/csi.sock"), "{s}");
        }
        assert_eq!(CsiAddress::parse("/csi/csi.sock").unwrap().to_string(), "unix:///csi/csi.sock");
        assert!(CsiAddress::parse("tcp://1.2.3.4:5").is_err());
        assert!(CsiAddress::parse("unix://").is_err());
        assert!(CsiAddress::parse("").is_err());
    }
}
