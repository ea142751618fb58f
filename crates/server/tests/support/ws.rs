//! The one WebSocket client: a socket to a test server (with or without
//! `Origin`, with a small kernel receive buffer when asked), the next text
//! frame, and how the connection ended. Each protocol's frames are in its
//! own module, as a trait on [`Client`].

use super::server::GUARD;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A WebSocket to `url`, with an `Origin` when given and a kernel receive
/// buffer of `recv_buffer` bytes when given (a client that never reads
/// then fills it fast).
pub async fn open(
    url: &str,
    origin: Option<&str>,
    recv_buffer: Option<u32>,
) -> Result<Ws, tokio_tungstenite::tungstenite::Error> {
    let addr: std::net::SocketAddr = url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let socket = tokio::net::TcpSocket::new_v4()?;
    if let Some(b) = recv_buffer {
        socket.set_recv_buffer_size(b)?;
    }
    let tcp = socket.connect(addr).await?;
    // Nagle off, as the server has it: on tokio's paused clock a small
    // frame held for an ACK would look like one that never came.
    tcp.set_nodelay(true)?;
    let mut req = url.into_client_request()?;
    if let Some(o) = origin {
        req.headers_mut().insert("Origin", o.parse().unwrap());
    }
    let (ws, _) = tokio_tungstenite::client_async(req, MaybeTlsStream::Plain(tcp)).await?;
    Ok(ws)
}

/// The next text frame, as sent (pings and pongs skipped).
pub async fn next_text(ws: &mut Ws) -> String {
    loop {
        let m = tokio::time::timeout(GUARD, ws.next())
            .await
            .expect("no frame arrived")
            .expect("stream ended")
            .unwrap();
        match m {
            Message::Text(t) => return t.to_string(),
            Message::Close(c) => panic!("closed: {c:?}"),
            _ => continue,
        }
    }
}

/// The next JSON frame (pings and pongs skipped).
pub async fn next_json(ws: &mut Ws) -> Value {
    serde_json::from_str(&next_text(ws).await).unwrap()
}

/// How a connection ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    Closed(u16),
    Dropped,
}

/// Reads until the connection ends.
pub async fn ended(ws: &mut Ws) -> Ended {
    loop {
        match tokio::time::timeout(GUARD, ws.next())
            .await
            .expect("connection did not end")
        {
            None | Some(Err(_)) => return Ended::Dropped,
            Some(Ok(Message::Close(Some(f)))) => return Ended::Closed(u16::from(f.code)),
            // 1005: no status code was present.
            Some(Ok(Message::Close(None))) => return Ended::Closed(1005),
            Some(Ok(_)) => continue,
        }
    }
}

pub struct Client {
    pub ws: Ws,
}

impl Client {
    pub async fn connect(
        url: &str,
        origin: Option<&str>,
    ) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
        Ok(Client {
            ws: open(url, origin, None).await?,
        })
    }

    /// An upgrade that carries `Origin: origin`, as a browser's does.
    pub async fn connect_from(
        url: &str,
        origin: &str,
    ) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
        Self::connect(url, Some(origin)).await
    }

    /// A client whose socket receives into at most `bytes` of kernel
    /// buffer, so that a big frame cannot be written to it in one go.
    pub async fn connect_with_receive_buffer(
        url: &str,
        origin: Option<&str>,
        bytes: u32,
    ) -> Client {
        Client {
            ws: open(url, origin, Some(bytes)).await.unwrap(),
        }
    }

    pub async fn send(&mut self, v: Value) {
        self.send_text(&v.to_string()).await;
    }

    pub async fn send_text(&mut self, t: &str) {
        self.ws
            .send(Message::Text(t.to_owned().into()))
            .await
            .unwrap();
    }

    /// The next text frame, as sent.
    pub async fn recv_text(&mut self) -> String {
        next_text(&mut self.ws).await
    }

    /// The next JSON frame (pings and pongs skipped).
    pub async fn recv(&mut self) -> Value {
        next_json(&mut self.ws).await
    }

    /// Reads until the connection ends; returns how.
    pub async fn ended(&mut self) -> Ended {
        ended(&mut self.ws).await
    }
}

/// Moves tokio's paused clock `seconds` forward a second at a time, as
/// real time passes: the server's socket sweep
/// (`hostwire::ws::SWEEP_TICK`) runs at each step, so that a frame is
/// seen within a second of its sending, as on a live server.
pub async fn advance_seconds(seconds: u64) {
    for _ in 0..seconds {
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
    }
}
