//! A client's WebSocket: tungstenite's protocol over the TCP stream itself
//! ([`Tcp`]), read and written with the stream's own readiness. Between the
//! two there is no boxed, rewinding stream of the HTTP layer's and no
//! adapter from tokio's I/O to std's with wakers of its own: an idle
//! connection holds the stream and nothing else, tungstenite's state being
//! let go while it is idle (see docs/BENCHMARKS.md, "Idle connections").

use super::tcp::{Held, Tcp};
use super::Config;
use bytes::Bytes;
use std::io::{self, Write};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tungstenite::protocol::frame::coding::{Data, OpCode};
use tungstenite::protocol::frame::Frame;
use tungstenite::protocol::{Role, WebSocketConfig, WebSocketContext};
use tungstenite::{Error, Message};

/// After a message over this, tungstenite's state is let go at once
/// ([`WebSocket::shed`]), so that no socket keeps a read buffer of more
/// than about this size. Not after every message over the read buffer:
/// starting afresh after each of a classroom's 200-byte `up`s cost 4 % more
/// user CPU (measured), to keep a few hundred bytes less.
const RECLAIM_OVER: usize = 1024;

/// A message over this goes out in fragments of this size (RFC 6455 5.4),
/// each handed to tungstenite once the one before is written: its write
/// buffer keeps, for the socket's life, the capacity of the most it ever
/// held, which a whole message of several MiB would make its size.
pub const FRAGMENT_BYTES: usize = 16 * 1024;

/// tungstenite's state, made afresh with `config`'s limits and buffers if
/// it was let go ([`WebSocket::shed`]).
fn context<'a>(
    ws: &'a mut Option<Box<WebSocketContext>>,
    config: &Config,
) -> &'a mut WebSocketContext {
    ws.get_or_insert_with(|| {
        let ws_config = WebSocketConfig::default()
            .max_message_size(Some(config.max_message_bytes))
            .max_frame_size(Some(config.max_message_bytes))
            .read_buffer_size(config.read_buffer)
            .write_buffer_size(config.write_buffer)
            .max_write_buffer_size(config.max_unsent_bytes.max(config.write_buffer + 1));
        Box::new(WebSocketContext::new(Role::Server, Some(ws_config)))
    })
}

fn would_block(e: &Error) -> bool {
    matches!(e, Error::Io(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// A server's WebSocket over [`Tcp`], read as a stream of messages and
/// written as a sink (`poll_*`, registering the caller's waker), or written
/// without waiting (`try_*`, registering none: for a frame written at once
/// by another task, which hands what it cannot finish to the connection's
/// writer).
pub struct WebSocket {
    /// tungstenite's state of the connection (its buffers with it), `None`
    /// while the socket is idle ([`WebSocket::shed`]): made afresh when a
    /// frame comes or a message must go through it.
    ws: Option<Box<WebSocketContext>>,
    /// The protocol's choices, shared by its sockets: tungstenite's limits
    /// and buffers for a state made afresh.
    config: Arc<Config>,
    tcp: Tcp,
    /// `false` after a message was taken with no room to write it out:
    /// the next one waits until the buffer is written.
    ready: bool,
    /// What is left of a message sent in fragments ([`FRAGMENT_BYTES`]):
    /// the next message waits until it is all taken.
    rest: Option<Box<Bytes>>,
    /// The close was started; what is left is to write it out.
    closing: bool,
    /// tungstenite may hold bytes of a message not yet written: a message
    /// is held ([`Tcp`]'s `held`) only behind none, so that none overtakes
    /// another.
    buffered: bool,
    /// The stream has ended or failed: nothing more is read.
    ended: bool,
}

impl WebSocket {
    /// A server's WebSocket over `tcp`, after the upgrade; `read` is what
    /// the HTTP layer had read past the request (the client's first frames).
    pub fn new(mut tcp: Tcp, read: &[u8], config: Arc<Config>) -> WebSocket {
        // Read through `tcp` as if from the socket: tungstenite's own buffer
        // stays at its configured size.
        tcp.push_ahead(read);
        WebSocket {
            ws: None,
            config,
            tcp,
            ready: true,
            rest: None,
            closing: false,
            buffered: false,
            ended: false,
        }
    }

    /// The next message (`None` once the stream has ended; an error ends
    /// it too). Pings are answered and the peer's Close echoed by
    /// tungstenite as it reads.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Message, Error>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        loop {
            if self.ws.is_none() && !self.tcp.has_ahead() {
                // Shed while idle: nothing to read is no reason to make it
                // afresh (a wake meant for the writer polls the reader too).
                match self.tcp.stream.poll_read_ready(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => {
                        self.ended = true;
                        return Poll::Ready(Some(Err(Error::Io(e))));
                    }
                    Poll::Pending => return Poll::Pending,
                }
            }
            let e = match context(&mut self.ws, &self.config).read(&mut self.tcp) {
                Ok(m) => {
                    // tungstenite's read buffer grew to take this frame
                    // whole, and would keep that size.
                    if m.len() > RECLAIM_OVER {
                        self.shed();
                    }
                    return Poll::Ready(Some(Ok(m)));
                }
                Err(e) => e,
            };
            if !would_block(&e) {
                self.ended = true;
                return Poll::Ready(match e {
                    Error::ConnectionClosed | Error::AlreadyClosed => None,
                    e => Some(Err(e)),
                });
            }
            let tcp = &mut self.tcp;
            match tcp.stream.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(e)) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(Error::Io(e))));
                }
                Poll::Pending => {}
            }
            // A reply that found no room is written by the next read once
            // there is room: wait for that too. Cleared before the read, so
            // that room left unused (tungstenite had nothing owed) is not
            // waited for again and again.
            if tcp.write_blocked {
                if let Poll::Ready(r) = tcp.stream.poll_write_ready(cx) {
                    tcp.write_blocked = false;
                    if let Err(e) = r {
                        self.ended = true;
                        return Poll::Ready(Some(Err(Error::Io(e))));
                    }
                    continue;
                }
            }
            return Poll::Pending;
        }
    }

    /// Lets go of tungstenite's state, to be made afresh when next needed:
    /// while the socket is idle (the registry's sweep, [`super::Sockets`]),
    /// and after a message over [`RECLAIM_OVER`], for which its read buffer
    /// grew (to more than the frame: 20 KB after one of 15 KB, measured)
    /// and would keep that size for the socket's life. Only where nothing
    /// is lost: between messages (tungstenite is never given a byte past
    /// the frame it reads, so its read buffer is empty and no message is
    /// half read), with nothing of the server's waiting to be written, and
    /// neither end closing. Whether it is let go.
    pub fn shed(&mut self) -> bool {
        let Some(ws) = &self.ws else {
            return true;
        };
        let idle = self.ready && self.rest.is_none() && !self.closing && !self.ended;
        if !(idle && self.tcp.between_messages() && ws.can_read() && ws.can_write()) {
            return false;
        }
        if self.flush_ws().is_err() {
            return false;
        }
        self.ws = None;
        true
    }

    /// Whether tungstenite's state is let go ([`WebSocket::shed`]).
    pub fn is_shed(&self) -> bool {
        self.ws.is_none()
    }

    /// Ready to take a message: what a blocked write left is written
    /// first, then the rest of a message sent in fragments.
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        loop {
            while !self.ready {
                match self.flush_ws() {
                    Ok(()) => self.ready = true,
                    Err(e) if would_block(&e) => ready!(self.poll_writable(cx))?,
                    Err(e) => {
                        self.ready = true;
                        return Poll::Ready(Err(e));
                    }
                }
            }
            if !self.next_fragment()? {
                return Poll::Ready(Ok(()));
            }
        }
    }

    /// Takes `msg` (after [`WebSocket::poll_ready`] or
    /// [`WebSocket::try_ready`]); it is written once tungstenite's write
    /// buffer fills, or on flush. A message over [`FRAGMENT_BYTES`] goes in
    /// fragments of that size, each taken once the one before is written.
    pub fn start_send(&mut self, msg: Message) -> Result<(), Error> {
        let (mut bytes, data) = match msg {
            Message::Text(t) if t.len() > FRAGMENT_BYTES => (Bytes::from(t), Data::Text),
            Message::Binary(b) if b.len() > FRAGMENT_BYTES => (b, Data::Binary),
            msg => return self.write(msg),
        };
        let first = bytes.split_to(FRAGMENT_BYTES);
        self.rest = Some(Box::new(bytes));
        self.write(Message::Frame(Frame::message(
            first,
            OpCode::Data(data),
            false,
        )))
    }

    /// Hands the next fragment of a message to tungstenite; false if none
    /// is left.
    fn next_fragment(&mut self) -> Result<bool, Error> {
        let Some(mut rest) = self.rest.take() else {
            return Ok(false);
        };
        let fragment = rest.split_to(rest.len().min(FRAGMENT_BYTES));
        let last = rest.is_empty();
        if !last {
            self.rest = Some(rest);
        }
        let continued = OpCode::Data(Data::Continue);
        self.write(Message::Frame(Frame::message(fragment, continued, last)))?;
        Ok(true)
    }

    /// Takes `msg`: held as it is, to be written behind its header, if
    /// nothing is before it; else into tungstenite's buffer, after the
    /// held message if that is not begun (one write for both).
    fn write(&mut self, msg: Message) -> Result<(), Error> {
        let data = matches!(msg, Message::Text(_) | Message::Binary(_));
        let can_write = self.ws.as_ref().is_none_or(|ws| ws.can_write());
        if data && !self.buffered && self.tcp.held.is_none() && can_write {
            self.tcp.held = Some(Box::new(Held { msg, written: 0 }));
            return Ok(());
        }
        if let Some(held) = self.tcp.held.take_if(|h| h.written == 0) {
            self.write_buffered(held.msg)?;
        }
        self.write_buffered(msg)
    }

    fn write_buffered(&mut self, msg: Message) -> Result<(), Error> {
        self.buffered = true;
        match context(&mut self.ws, &self.config).write(&mut self.tcp, msg) {
            Ok(()) => Ok(()),
            // Taken and buffered: the rest waits for room.
            Err(e) if would_block(&e) => {
                self.ready = false;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Writes out everything taken.
    pub fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        ready!(self.poll_ready(cx))?;
        loop {
            match self.flush_ws() {
                Ok(()) | Err(Error::ConnectionClosed) => {
                    self.ready = true;
                    return Poll::Ready(Ok(()));
                }
                Err(e) if would_block(&e) => ready!(self.poll_writable(cx))?,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Sends a Close (unless one was sent) and writes everything out. A
    /// message half sent in fragments is cut short: the Close ends it.
    pub fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.ready = true;
        self.rest = None;
        loop {
            let r = if self.closing {
                self.flush_ws()
            } else {
                self.closing = true;
                context(&mut self.ws, &self.config).close(&mut self.tcp, None)
            };
            match r {
                Ok(()) | Err(Error::ConnectionClosed) => return Poll::Ready(Ok(())),
                Err(e) if would_block(&e) => ready!(self.poll_writable(cx))?,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// [`WebSocket::poll_ready`] without waiting: false if a blocked write
    /// is still not written.
    pub fn try_ready(&mut self) -> Result<bool, Error> {
        loop {
            if !self.ready {
                match self.flush_ws() {
                    Ok(()) => self.ready = true,
                    Err(e) if would_block(&e) => return Ok(false),
                    Err(e) => return Err(e),
                }
            }
            if !self.next_fragment()? {
                return Ok(true);
            }
        }
    }

    /// [`WebSocket::poll_flush`] without waiting: false if some is left.
    pub fn try_flush(&mut self) -> Result<bool, Error> {
        if !self.try_ready()? {
            return Ok(false);
        }
        match self.flush_ws() {
            Ok(()) | Err(Error::ConnectionClosed) => {
                self.ready = true;
                Ok(true)
            }
            Err(e) if would_block(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// tungstenite's flush, which writes the held message first: once it
    /// succeeds, tungstenite holds nothing unwritten.
    fn flush_ws(&mut self) -> Result<(), Error> {
        let r = match &mut self.ws {
            Some(ws) => ws.flush(&mut self.tcp),
            // Let go of with nothing owed: only a held message is left.
            None => self.tcp.flush().map_err(Error::Io),
        };
        if r.is_ok() {
            self.buffered = false;
        }
        r
    }

    /// Ready once the socket has room (the write that found none is tried
    /// again), or with the socket's error.
    fn poll_writable(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.tcp.stream.poll_write_ready(cx).map_err(Error::Io)
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
