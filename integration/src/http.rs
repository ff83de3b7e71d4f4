//! A minimal HTTP/1.1 GET over a fresh TCP connection, enough for /healthz
//! and /metrics (no dependency on an HTTP client crate).

use std::time::Duration;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// Status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Body text.
    pub body: String,
}

/// `GET http://<addr><path>`; `Err` on a connection failure or timeout.
pub async fn get(addr: &str, path: &str) -> Result<Reply, String> {
    let fut = async {
        let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.map_err(|e| e.to_string())?;
        parse(&String::from_utf8_lossy(&raw))
    };
    tokio::time::timeout(Duration::from_secs(30), fut).await.map_err(|_| "HTTP request timed out".to_string())?
}

fn parse(raw: &str) -> Result<Reply, String> {
    let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(|| format!("no header end in {raw:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line in {head:?}"))?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.to_ascii_lowercase().contains("chunked")
    });
    let body = if chunked { dechunk(body)? } else { body.to_string() };
    Ok(Reply { status, body })
}

fn dechunk(mut s: &str) -> Result<String, String> {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").ok_or("bad chunk")?;
        let n = usize::from_str_radix(size.trim(), 16).map_err(|e| e.to_string())?;
        if n == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..n).ok_or("short chunk")?);
        s = rest.get(n + 2..).ok_or("short chunk")?;
    }
}

/// One persistent HTTP/1.1 connection for repeated GETs (benchmarks).
pub struct KeepAlive {
    stream: tokio::io::BufReader<TcpStream>,
    host: String,
}

impl KeepAlive {
    /// Connects to `addr`.
    pub async fn connect(addr: &str) -> std::io::Result<KeepAlive> {
        Ok(KeepAlive { stream: tokio::io::BufReader::new(TcpStream::connect(addr).await?), host: addr.to_string() })
    }

    /// One GET on this connection; the body must carry a content-length.
    pub async fn get(&mut self, path: &str) -> Result<Reply, String> {
        use tokio::io::AsyncBufReadExt;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {}\r\n\r\n", self.host);
        self.stream.get_mut().write_all(req.as_bytes()).await.map_err(|e| e.to_string())?;
        let mut status = 0u16;
        let mut length = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            if self.stream.read_line(&mut line).await.map_err(|e| e.to_string())? == 0 {
                return Err("connection closed".into());
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if status == 0 {
                status = l.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or("bad status line")?;
            } else if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().map_err(|_| "bad content-length")?;
            }
        }
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body).await.map_err(|e| e.to_string())?;
        Ok(Reply { status, body: String::from_utf8_lossy(&body).into_owned() })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_plain_and_chunked() {
        let r = super::parse("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));
        let r = super::parse(
            "HTTP/1.1 500 Internal Server Error\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((r.status, r.body.as_str()), (500, "abcde"));
    }
}
