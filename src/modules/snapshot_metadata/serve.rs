//! The gRPC server over TLS on the listener the host bound: each accepted
//! connection's handshake runs on its own task (a slow client holds no
//! other), with the key pair of that moment (`tls.rs` re-reads rotated
//! files). On shutdown the server stops accepting, tells clients to go
//! away and lets streams in flight finish within the host's grace.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_util::sync::CancellationToken;
use tonic::transport::server::{Connected, Router};

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepted connections waiting for the server, at most.
const PENDING_CONNECTIONS: usize = 64;

/// A TLS connection as the server reads it.
pub struct TlsConnection(TlsStream<TcpStream>);

impl Connected for TlsConnection {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for TlsConnection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Accepts on `listener` until `stop`, handing each connection whose
/// handshake succeeded to the returned channel.
fn accept(listener: TcpListener, acceptor: TlsAcceptor, stop: CancellationToken) -> mpsc::Receiver<TlsConnection> {
    let (tx, rx) = mpsc::channel(PENDING_CONNECTIONS);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: try again shortly.
                        tracing::warn!(error = %e, "Accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            // Each response is a small write: Nagle's algorithm would hold
            // it for the client's delayed acknowledgement.
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(%peer, error = %e, "Cannot set TCP_NODELAY");
            }
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(TlsConnection(tls)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    rx
}

/// Serves `router` on `listener` with `tls` until `shutdown`, then stops
/// gracefully (streams in flight finish; the host bounds the wait).
pub async fn serve(
    listener: &std::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let listener = listener.try_clone()?;
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    let stop = shutdown.child_token();
    let connections = accept(listener, TlsAcceptor::from(tls), stop.clone());
    let incoming =
        futures::stream::unfold(
            connections,
            |mut rx| async move { rx.recv().await.map(|c| (Ok::<_, io::Error>(c), rx)) },
        );
    let served = router.serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned()).await;
    stop.cancel();
    served.map_err(io::Error::other)
}
