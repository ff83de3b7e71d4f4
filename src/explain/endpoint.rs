//! Reading csi-sidecar's `/debug/objects` over plain HTTP/1.1 (the address
//! in `--http-endpoint` form, or a port-forward's).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::debug::query::{Page, Query};

/// How long one request may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// A bad `--endpoint` value.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("--endpoint {value:?}: {why}")]
pub struct EndpointError {
    value: String,
    why: &'static str,
}

/// `host:port` to connect to, from `:8080`, `127.0.0.1:8080`,
/// `http://127.0.0.1:8080[/]` or `[::1]:8080` (pure). An empty host is
/// this machine, as `--http-endpoint=:8080` listens on it.
pub fn address(value: &str) -> Result<String, EndpointError> {
    let bad = |why| EndpointError { value: value.to_string(), why };
    let rest = value.strip_prefix("http://").unwrap_or(value);
    if rest.starts_with("https://") || value.starts_with("https://") {
        return Err(bad("https is not served; give the plain http address"));
    }
    let rest = rest.trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("want host:port or :port"))?;
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad("the port must be a number from 1 to 65535"));
    }
    if host.contains('/') {
        return Err(bad("want host:port or :port, without a path"));
    }
    let host = if host.is_empty() { "127.0.0.1" } else { host };
    Ok(format!("{host}:{port}"))
}

/// The body of an HTTP/1.1 response, de-chunked (pure).
fn body_of(response: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").ok_or("a response without headers")?;
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    let body = &response[split + 4..];
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("not an HTTP response: {:?}", head.lines().next().unwrap_or_default()))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    if !chunked {
        return Ok((status, body.to_vec()));
    }
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n").ok_or("a cut chunk")?;
        let size_text = String::from_utf8_lossy(&rest[..line_end]).to_string();
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("a bad chunk size {size_text:?}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok((status, out));
        }
        let chunk = rest.get(..size).ok_or("a cut chunk")?;
        out.extend_from_slice(chunk);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
}

/// One GET of `/debug/objects` with `query` at `address`.
pub async fn fetch(address: &str, query: &Query) -> Result<Page, String> {
    let path = format!("{}?{}", crate::http::DEBUG_OBJECTS_PATH, query.to_query_string());
    let get = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.map_err(|e| e.to_string())?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nAccept: application/json\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(response)
    };
    let response = tokio::time::timeout(TIMEOUT, get)
        .await
        .map_err(|_| format!("{address}: no answer within {} s", TIMEOUT.as_secs()))?
        .map_err(|e| format!("{address}: {e}"))?;
    let (status, body) = body_of(&response).map_err(|e| format!("{address}: {e}"))?;
    match status {
        200 => serde_json::from_slice(&body).map_err(|e| format!("{address}: an answer that is not a debug page: {e}")),
        404 => Err(format!("{address}: the debug endpoint is off (start csi-sidecar with --enable-debug-endpoints)")),
        code => Err(format!("{address}: HTTP {code}: {}", String::from_utf8_lossy(&body).trim())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_forms() {
        assert_eq!(address(":8080").unwrap(), "127.0.0.1:8080");
        assert_eq!(address("127.0.0.1:9809").unwrap(), "127.0.0.1:9809");
        assert_eq!(address("http://localhost:80/").unwrap(), "localhost:80");
        assert_eq!(address("[::1]:8080").unwrap(), "[::1]:8080");
        for bad in ["8080", ":0", ":http", "https://x:1", "h:1/debug", ""] {
            assert!(address(bad).is_err(), "{bad}");
        }
        assert_eq!(address("8080").unwrap_err().to_string(), "--endpoint \"8080\": want host:port or :port");
    }

    #[test]
    fn responses_plain_and_chunked() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(body_of(plain).unwrap(), (200, b"{}".to_vec()));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(body_of(chunked).unwrap(), (200, b"abcde".to_vec()));
        assert_eq!(body_of(b"HTTP/1.1 404 Not Found\r\n\r\n").unwrap().0, 404);
        assert!(body_of(b"garbage").is_err());
        assert!(body_of(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err());
    }
}
