//! Transports: anything that carries frames as text, one frame per message.

use crate::frame::MAX_FRAME_BYTES;
use futures_util::{SinkExt, Stream, StreamExt};
use std::io;
use std::pin::Pin;
use tokio::process::{Child, Command};
use tokio_util::codec::{FramedRead, FramedWrite, LinesCodec};

pub type FrameStream = Pin<Box<dyn Stream<Item = io::Result<String>> + Send>>;
pub type FrameSink = Pin<Box<dyn futures_util::Sink<String, Error = io::Error> + Send>>;

/// Both halves of a connection.
pub struct Transport {
    pub reader: FrameStream,
    pub writer: FrameSink,
}

/// Two connected in-memory transports (for tests and in-process workers).
pub fn memory_pair() -> (Transport, Transport) {
    let (a_tx, a_rx) = futures_channel::mpsc::unbounded::<String>();
    let (b_tx, b_rx) = futures_channel::mpsc::unbounded::<String>();
    let side = |tx: futures_channel::mpsc::UnboundedSender<String>,
                rx: futures_channel::mpsc::UnboundedReceiver<String>| Transport {
        reader: Box::pin(rx.map(Ok)),
        writer: Box::pin(tx.sink_map_err(|e| io::Error::new(io::ErrorKind::BrokenPipe, e))),
    };
    (side(a_tx, b_rx), side(b_tx, a_rx))
}

fn codec() -> LinesCodec {
    LinesCodec::new_with_max_length(MAX_FRAME_BYTES)
}

fn lines_error(e: tokio_util::codec::LinesCodecError) -> io::Error {
    match e {
        tokio_util::codec::LinesCodecError::MaxLineLengthExceeded => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame line is over {MAX_FRAME_BYTES} bytes"),
        ),
        tokio_util::codec::LinesCodecError::Io(e) => e,
    }
}

/// Newline-delimited JSON over any byte streams.
pub fn ndjson<R, W>(read: R, write: W) -> Transport
where
    R: tokio::io::AsyncRead + Send + 'static,
    W: tokio::io::AsyncWrite + Send + 'static,
{
    Transport {
        reader: Box::pin(FramedRead::new(read, codec()).map(|r| r.map_err(lines_error))),
        writer: Box::pin(futures_util::SinkExt::<String>::sink_map_err(
            FramedWrite::new(write, codec()),
            lines_error,
        )),
    }
}

/// Spawns `command` as a worker and talks NDJSON over its stdin / stdout.
/// Its stderr is inherited (worker logs).
pub fn spawn_worker(mut command: Command) -> io::Result<(Transport, Child)> {
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| io::Error::other("no stdin"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| io::Error::other("no stdout"))?;
    Ok((ndjson(stdout, stdin), child))
}

/// The worker's side of [`spawn_worker`]: this process's stdin / stdout.
pub fn stdio() -> Transport {
    ndjson(tokio::io::stdin(), tokio::io::stdout())
}

/// One text message per frame over a WebSocket (client or server side).
///
/// Build the stream with a small `read_buffer_size` (a few KiB):
/// tungstenite zero-fills the whole free read buffer before every read, and
/// its default of 128 KiB makes each small frame cost a 128 KiB memset.
pub fn websocket<S>(ws: tokio_tungstenite::WebSocketStream<S>) -> Transport
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tokio_tungstenite::tungstenite::Message;
    let (sink, stream) = ws.split();
    let reader = stream.filter_map(|m| async move {
        match m {
            Ok(Message::Text(t)) => Some(Ok(t.to_string())),
            Ok(Message::Binary(b)) => Some(String::from_utf8(b.to_vec()).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidData, "a binary frame is not UTF-8")
            })),
            // Pings, pongs and the close frame carry no RPC frame.
            Ok(_) => None,
            Err(e) => Some(Err(io::Error::other(e))),
        }
    });
    let writer = sink
        .with(|t: String| async move {
            Ok::<_, tokio_tungstenite::tungstenite::Error>(Message::Text(t.into()))
        })
        .sink_map_err(io::Error::other);
    Transport {
        reader: Box::pin(reader),
        writer: Box::pin(writer),
    }
}
