//! Logging: klog's `-v` levels mapped onto tracing, text or JSON on stderr.

use tracing_subscriber::{EnvFilter, fmt};

/// Logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// `--logging-format` other than text or json.
    #[error("invalid --logging-format {0:?}: supported formats are \"text\" and \"json\"")]
    UnknownFormat(String),
    /// A subscriber was already installed.
    #[error("logging already initialised: {0}")]
    AlreadySet(String),
}

/// The tracing level for a klog verbosity: 0-1 info, 2-4 debug, 5+ trace
/// (trace carries every CSI request and response, secrets stripped).
pub fn level_for_verbosity(v: u32) -> tracing::Level {
    match v {
        0..=1 => tracing::Level::INFO,
        2..=4 => tracing::Level::DEBUG,
        _ => tracing::Level::TRACE,
    }
}

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `-v`.
pub fn init(verbosity: u32, format: Option<&str>) -> Result<(), LoggingError> {
    let level = level_for_verbosity(verbosity).to_string().to_lowercase();
    let filter =
        EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new(format!("warn,csi_sidecar={level}")));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).with_ansi(ansi);
    let result = match format.unwrap_or("text") {
        "" | "text" => builder.try_init(),
        "json" => builder.json().flatten_event(true).try_init(),
        other => return Err(LoggingError::UnknownFormat(other.to_string())),
    };
    result.map_err(|e| LoggingError::AlreadySet(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn klog_levels() {
        assert_eq!(level_for_verbosity(0), tracing::Level::INFO);
        assert_eq!(level_for_verbosity(2), tracing::Level::DEBUG);
        assert_eq!(level_for_verbosity(4), tracing::Level::DEBUG);
        assert_eq!(level_for_verbosity(5), tracing::Level::TRACE);
    }

    #[test]
    fn unknown_format_is_an_error() {
        assert!(matches!(init(0, Some("xml")), Err(LoggingError::UnknownFormat(f)) if f == "xml"));
    }
}
