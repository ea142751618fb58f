//! A client's TCP connection as the accept loop hands it to HTTP: it holds
//! its IP's place among the open connections for as long as it lives,
//! after a WebSocket upgrade too (the upgraded socket keeps it).

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// Open connections per client IP.
#[derive(Default)]
pub(crate) struct PerIp(Mutex<HashMap<IpAddr, usize>>);

/// One open connection of an IP; gives its place back when dropped.
pub(crate) struct IpSlot {
    table: Arc<PerIp>,
    ip: IpAddr,
}

impl PerIp {
    pub(crate) fn take(table: &Arc<PerIp>, ip: IpAddr, cap: usize) -> Option<IpSlot> {
        let mut t = table.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = t.entry(ip).or_insert(0);
        if *n >= cap {
            return None;
        }
        *n += 1;
        Some(IpSlot {
            table: Arc::clone(table),
            ip,
        })
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut t = self.table.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = t.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                t.remove(&self.ip);
            }
        }
    }
}

/// A socket holding its IP's place for as long as it lives: after a
/// WebSocket upgrade too, since the upgraded connection keeps it.
pub(crate) struct Counted {
    pub(crate) stream: tokio::net::TcpStream,
    pub(crate) slot: IpSlot,
    /// Set once the client has sent a byte: until then the header read
    /// timeout is kept here (the HTTP layer's starts with the first byte).
    pub(crate) spoke: Arc<std::sync::atomic::AtomicBool>,
}

impl tokio::io::AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.spoke.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
