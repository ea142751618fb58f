//! Transports: anything that carries frames, one frame per message.
//!
//! A transport delivers each message as bytes (UTF-8 is checked per frame
//! by the peer, so one bad byte fails one frame, not the connection), and
//! a message over the frame limit as its first bytes and its size (so the
//! frame can still be answered).

use crate::frame::{MAX_FRAME_BYTES, MAX_HEAD_BYTES};
use bytes::{Buf, BytesMut};
use futures_util::{SinkExt, Stream, StreamExt};
use std::io;
use std::pin::Pin;
use tokio::process::{Child, Command};
use tokio_util::codec::{Decoder, Encoder, FramedRead, FramedWrite};

/// One message from the peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound {
    /// A whole message.
    Frame(Vec<u8>),
    /// A message over the transport's frame limit: its first
    /// [`MAX_HEAD_BYTES`] bytes, and its size.
    Oversize { head: Vec<u8>, size: usize },
}

pub type FrameStream = Pin<Box<dyn Stream<Item = io::Result<Inbound>> + Send>>;
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
        reader: Box::pin(rx.map(|t| Ok(Inbound::Frame(t.into_bytes())))),
        writer: Box::pin(tx.sink_map_err(|e| io::Error::new(io::ErrorKind::BrokenPipe, e))),
    };
    (side(a_tx, b_rx), side(b_tx, a_rx))
}

/// Two connected in-memory transports that hold at most `capacity`
/// messages in each direction: a side that stops reading makes the other
/// side's writes wait, as a socket or pipe does.
pub fn memory_pair_bounded(capacity: usize) -> (Transport, Transport) {
    let (a_tx, a_rx) = futures_channel::mpsc::channel::<String>(capacity);
    let (b_tx, b_rx) = futures_channel::mpsc::channel::<String>(capacity);
    let side = |tx: futures_channel::mpsc::Sender<String>,
                rx: futures_channel::mpsc::Receiver<String>| Transport {
        reader: Box::pin(rx.map(|t| Ok(Inbound::Frame(t.into_bytes())))),
        writer: Box::pin(tx.sink_map_err(|e| io::Error::new(io::ErrorKind::BrokenPipe, e))),
    };
    (side(a_tx, b_rx), side(b_tx, a_rx))
}

/// Newline-delimited frames: one frame per line, `\n` (or `\r\n`) after
/// each; blank lines are skipped. A line over `max_frame_bytes` is not
/// buffered: its first [`MAX_HEAD_BYTES`] bytes are kept and the rest is
/// discarded up to the next newline.
#[derive(Debug)]
pub struct NdjsonCodec {
    max_frame_bytes: usize,
    /// Bytes of the current line already searched for a newline.
    searched: usize,
    /// A line over the limit being discarded: its head and size so far.
    discarding: Option<(Vec<u8>, usize)>,
}

impl NdjsonCodec {
    pub fn new(max_frame_bytes: usize) -> Self {
        Self {
            max_frame_bytes,
            searched: 0,
            discarding: None,
        }
    }

    fn oversize(line: &[u8], size: usize) -> Inbound {
        Inbound::Oversize {
            head: line[..line.len().min(MAX_HEAD_BYTES)].to_vec(),
            size,
        }
    }
}

impl Decoder for NdjsonCodec {
    type Item = Inbound;
    type Error = io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> io::Result<Option<Inbound>> {
        loop {
            if let Some((head, size)) = self.discarding.as_mut() {
                match memchr::memchr(b'\n', buf) {
                    Some(i) => {
                        let room = MAX_HEAD_BYTES.saturating_sub(head.len());
                        head.extend_from_slice(&buf[..i.min(room)]);
                        *size += i;
                        buf.advance(i + 1);
                        let (head, size) = self.discarding.take().unwrap_or_default();
                        return Ok(Some(Inbound::Oversize { head, size }));
                    }
                    None => {
                        let room = MAX_HEAD_BYTES.saturating_sub(head.len());
                        head.extend_from_slice(&buf[..buf.len().min(room)]);
                        *size += buf.len();
                        buf.clear();
                        return Ok(None);
                    }
                }
            }
            match memchr::memchr(b'\n', &buf[self.searched..]) {
                Some(i) => {
                    let end = self.searched + i;
                    self.searched = 0;
                    let line = buf.split_to(end + 1);
                    let mut line = &line[..end];
                    if line.last() == Some(&b'\r') {
                        line = &line[..line.len() - 1];
                    }
                    if line.iter().all(|b| matches!(b, b' ' | b'\t')) {
                        continue;
                    }
                    if line.len() > self.max_frame_bytes {
                        return Ok(Some(Self::oversize(line, line.len())));
                    }
                    return Ok(Some(Inbound::Frame(line.to_vec())));
                }
                None if buf.len() > self.max_frame_bytes => {
                    let head = buf[..MAX_HEAD_BYTES.min(buf.len())].to_vec();
                    self.discarding = Some((head, buf.len()));
                    self.searched = 0;
                    buf.clear();
                    return Ok(None);
                }
                None => {
                    self.searched = buf.len();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> io::Result<Option<Inbound>> {
        if let Some(item) = self.decode(buf)? {
            return Ok(Some(item));
        }
        if let Some((head, size)) = self.discarding.take() {
            return Ok(Some(Inbound::Oversize { head, size }));
        }
        // A last line without its newline is still a frame.
        self.searched = 0;
        let rest = buf.split();
        if rest.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(None);
        }
        if rest.len() > self.max_frame_bytes {
            return Ok(Some(Self::oversize(&rest, rest.len())));
        }
        Ok(Some(Inbound::Frame(rest.to_vec())))
    }
}

impl Encoder<String> for NdjsonCodec {
    type Error = io::Error;

    fn encode(&mut self, text: String, dst: &mut BytesMut) -> io::Result<()> {
        // Serialized JSON never holds a raw newline; the peer checks sizes
        // before anything reaches the transport.
        dst.reserve(text.len() + 1);
        dst.extend_from_slice(text.as_bytes());
        dst.extend_from_slice(b"\n");
        Ok(())
    }
}

/// Newline-delimited JSON over any byte streams.
pub fn ndjson<R, W>(read: R, write: W) -> Transport
where
    R: tokio::io::AsyncRead + Send + 'static,
    W: tokio::io::AsyncWrite + Send + 'static,
{
    Transport {
        reader: Box::pin(FramedRead::new(read, NdjsonCodec::new(MAX_FRAME_BYTES))),
        writer: Box::pin(FramedWrite::new(write, NdjsonCodec::new(MAX_FRAME_BYTES))),
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
///
/// tokio reads stdin and writes stdout on blocking threads, which a
/// runtime waits for when it shuts down: after [`crate::Peer::wait_closed`]
/// (which returns once the goodbye is flushed) exit the process with
/// `std::process::exit` rather than returning from `main`, or a peer that
/// keeps our stdin open keeps the process alive.
pub fn stdio() -> Transport {
    ndjson(tokio::io::stdin(), tokio::io::stdout())
}

/// One message per frame over a WebSocket (client or server side): text
/// messages, and binary messages holding UTF-8 text (checked per frame).
///
/// Build the stream with a small `read_buffer_size` (a few KiB):
/// tungstenite zero-fills the whole free read buffer before every read, and
/// its default of 128 KiB makes each small frame cost a 128 KiB memset. Its
/// `max_message_size` bounds what is buffered before the peer sees it; a
/// message over it ends the connection, so set it above
/// [`MAX_FRAME_BYTES`] (for example twice) and the peer answers the frames
/// in between as too large.
pub fn websocket<S>(ws: tokio_tungstenite::WebSocketStream<S>) -> Transport
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tokio_tungstenite::tungstenite::Message;
    let (sink, stream) = ws.split();
    let reader = stream.filter_map(|m| async move {
        match m {
            Ok(Message::Text(t)) => Some(Ok(Inbound::Frame(t.as_bytes().to_vec()))),
            Ok(Message::Binary(b)) => Some(Ok(Inbound::Frame(b.to_vec()))),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(codec: &mut NdjsonCodec, chunks: &[&[u8]]) -> Vec<Inbound> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for c in chunks {
            buf.extend_from_slice(c);
            while let Some(i) = codec.decode(&mut buf).unwrap() {
                out.push(i);
            }
        }
        while let Some(i) = codec.decode_eof(&mut buf).unwrap() {
            out.push(i);
        }
        out
    }

    #[test]
    fn lines_bad_bytes_and_oversize_lines_are_one_item_each() {
        let mut c = NdjsonCodec::new(10);
        let big = vec![b'x'; 25];
        let out = decode_all(
            &mut c,
            &[
                b"{\"a\":1}\r\n\n\xff\xfe\n",
                &big[..12],
                &big[12..],
                b"\n{}\n{\"b\"",
            ],
        );
        assert_eq!(
            out,
            vec![
                Inbound::Frame(b"{\"a\":1}".to_vec()),
                Inbound::Frame(b"\xff\xfe".to_vec()),
                Inbound::Oversize {
                    head: big.clone(),
                    size: 25
                },
                Inbound::Frame(b"{}".to_vec()),
                Inbound::Frame(b"{\"b\"".to_vec()),
            ]
        );
    }
}
