//! A client's WebSocket: tungstenite's protocol over the TCP stream itself,
//! read and written with the stream's own readiness. Between the two there
//! is no boxed, rewinding stream of the HTTP layer's and no adapter from
//! tokio's I/O to std's with wakers of its own: an idle connection holds
//! the stream, tungstenite's state and nothing else (see
//! docs/BENCHMARKS.md, "Idle connections"). A text or binary message with
//! nothing before it is written as its own bytes behind a header made here
//! ([`Held`]), not copied into tungstenite's write buffer, which would keep
//! the capacity of the largest frame it held for the socket's life.

use super::frame_ends::FrameEnds;
use crate::http::counted::IpSlot;
use bytes::Bytes;
use std::io::{self, IoSlice, Read, Write};
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};
use tokio::io::AsyncRead;
use tokio::net::TcpStream;
use tungstenite::protocol::frame::coding::{Data, OpCode};
use tungstenite::protocol::frame::{Frame, FrameHeader};
use tungstenite::protocol::{Role, WebSocketConfig, WebSocketContext};
use tungstenite::{Error, Message};

/// The TCP stream under a WebSocket, as tungstenite reads and writes it:
/// without blocking (`WouldBlock` when the socket has nothing or no room).
pub struct Tcp {
    stream: TcpStream,
    /// A write found no room: a reply tungstenite owes the peer (a pong, a
    /// close) waits for the socket's room, which the reader then watches.
    write_blocked: bool,
    /// Bytes read from the socket past what tungstenite took: held only
    /// until taken, so an idle connection holds none (and, boxed, only a
    /// pointer's room for them).
    ahead: Option<Box<Ahead>>,
    /// A message taken as it is, to be written behind its header with no
    /// copy ([`WebSocket::start_send`]): it goes out before any byte
    /// tungstenite writes after it.
    held: Option<Box<Held>>,
    /// Where the frames tungstenite is given end: never a byte past the
    /// frame it reads, so once it returns a message its read buffer holds
    /// nothing ([`WebSocket::reclaim`]).
    frames: FrameEnds,
    /// The client IP's place among open connections, kept for the socket's
    /// life (`None` for a stream accepted elsewhere).
    _slot: Option<IpSlot>,
}

/// Bytes read from the socket past what tungstenite took, from `taken`
/// on: at most [`SCRATCH_BYTES`] and a frame header.
#[derive(Default)]
struct Ahead {
    bytes: Vec<u8>,
    taken: usize,
}

/// A message written as its own bytes behind a header made here, where
/// tungstenite would copy it into its write buffer, which then keeps, for
/// the socket's life, the capacity of the largest frame it held.
struct Held {
    /// A text or binary message.
    msg: Message,
    /// Bytes of the frame (header, then body) the socket has taken.
    written: usize,
}

impl Held {
    fn body(&self) -> &[u8] {
        match &self.msg {
            Message::Text(t) => t.as_ref(),
            Message::Binary(b) => b,
            _ => &[],
        }
    }

    /// The frame's header (a server's: final, unmasked), and its length.
    fn header(&self) -> ([u8; 10], usize) {
        let data = if self.msg.is_binary() {
            Data::Binary
        } else {
            Data::Text
        };
        let header = FrameHeader {
            opcode: OpCode::Data(data),
            ..FrameHeader::default()
        };
        let len = self.body().len() as u64;
        let mut bytes = [0; 10];
        header
            .format(len, &mut &mut bytes[..])
            .expect("an unmasked header fits in 10 bytes");
        (bytes, header.len(len))
    }
}

/// After a message over this, tungstenite's state starts afresh
/// ([`WebSocket::reclaim`]), so that no socket keeps a read buffer of more
/// than about this size. Not after every message over the read buffer:
/// starting afresh after each of a classroom's 200-byte `up`s cost 4 % more
/// user CPU (measured), to keep a few hundred bytes less.
const RECLAIM_OVER: usize = 1024;

/// A held frame up to this size is joined to its header on the stack and
/// written from one buffer.
const JOINED_BYTES: usize = 4096;

/// A message over this goes out in fragments of this size (RFC 6455 5.4),
/// each handed to tungstenite once the one before is written: its write
/// buffer keeps, for the socket's life, the capacity of the most it ever
/// held, which a whole message of several MiB would make its size.
pub const FRAGMENT_BYTES: usize = 16 * 1024;

/// What one system call reads at most: a thread's read buffer, shared by
/// every socket its thread reads (as uWebSockets has one per event loop).
/// tungstenite asks for a few hundred bytes at a time (its read buffer is
/// kept small, since every idle connection holds it); a host's burst of 40
/// frames is one read here, not one per few hundred bytes.
pub const SCRATCH_BYTES: usize = 64 * 1024;

thread_local! {
    static SCRATCH: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0; SCRATCH_BYTES].into_boxed_slice());
}

impl Tcp {
    pub fn new(stream: TcpStream) -> Tcp {
        Tcp {
            stream,
            write_blocked: false,
            ahead: None,
            held: None,
            frames: FrameEnds::default(),
            _slot: None,
        }
    }

    pub(crate) fn counted(stream: TcpStream, slot: IpSlot) -> Tcp {
        Tcp {
            _slot: Some(slot),
            ..Tcp::new(stream)
        }
    }

    /// Reads from the socket into `buf` (see [`Read::read`] for `Tcp`).
    fn read_socket(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // `poll_read`, not `try_read`: a read that does not fill `buf` marks
        // the socket drained, so the next read waits for readiness instead
        // of a system call that finds nothing (one per frame read). No
        // waker: on `WouldBlock` the reader registers its own at once
        // ([`WebSocket::poll_next`]), and only the reader reads.
        let mut read = tokio::io::ReadBuf::new(buf);
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut self.stream).poll_read(&mut cx, &mut read) {
            Poll::Ready(Ok(())) => Ok(read.filled().len()),
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Hands `bytes` to tungstenite before anything read from the socket.
    fn push_ahead(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let ahead = self.ahead.get_or_insert_with(Box::default);
        ahead.bytes.extend_from_slice(bytes);
    }

    /// Whether bytes read ahead wait to be taken.
    fn has_ahead(&self) -> bool {
        self.ahead.is_some()
    }

    /// At a frame's boundary: tungstenite holds no byte of a frame it has
    /// not returned.
    fn at_boundary(&self) -> bool {
        self.frames.at_boundary()
    }

    /// Gives `buf` what it may take of the bytes read ahead; `None` if
    /// there are none it may take yet.
    fn take_ahead(&mut self, buf: &mut [u8]) -> Option<usize> {
        let ahead = self.ahead.as_mut()?;
        let from = ahead.taken;
        let n = self.frames.give(&ahead.bytes[from..], buf.len())?;
        buf[..n].copy_from_slice(&ahead.bytes[from..from + n]);
        ahead.taken += n;
        if ahead.taken == ahead.bytes.len() {
            // Let go of it: an idle connection holds no bytes read ahead.
            self.ahead = None;
        }
        Some(n)
    }
}

impl Read for Tcp {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(n) = self.take_ahead(buf) {
                return Ok(n);
            }
            let given = SCRATCH.with(|scratch| {
                let mut scratch = scratch.borrow_mut();
                let n = self.read_socket(&mut scratch)?;
                if n == 0 {
                    return Ok(Some(0));
                }
                if self.has_ahead() {
                    // A frame header begun in the bytes before.
                    self.push_ahead(&scratch[..n]);
                    return Ok(None);
                }
                let Some(given) = self.frames.give(&scratch[..n], buf.len()) else {
                    self.push_ahead(&scratch[..n]);
                    return Ok(None);
                };
                buf[..given].copy_from_slice(&scratch[..given]);
                self.push_ahead(&scratch[given..n]);
                Ok::<_, io::Error>(Some(given))
            })?;
            if let Some(n) = given {
                return Ok(n);
            }
        }
    }
}

impl Tcp {
    /// Writes what is left of the held message; `WouldBlock` while some
    /// is.
    fn write_held(&mut self) -> io::Result<()> {
        while let Some(held) = self.held.as_mut() {
            let (header, header_len) = held.header();
            let body = held.body();
            let (header, body) = match held.written.checked_sub(header_len) {
                None => (&header[held.written..header_len], body),
                Some(n) => (&[][..], &body[n..]),
            };
            let left = header.len() + body.len();
            let n = if left <= JOINED_BYTES {
                // One buffer, not two: a socket's `writev` costs the kernel
                // more than a `send` of the same bytes (measured), and a
                // small frame's copy on the stack costs nothing beside it.
                let mut joined = [0; JOINED_BYTES];
                joined[..header.len()].copy_from_slice(header);
                joined[header.len()..left].copy_from_slice(body);
                write_now(&self.stream, &mut self.write_blocked, |s| {
                    s.try_write(&joined[..left])
                })?
            } else {
                let slices = [IoSlice::new(header), IoSlice::new(body)];
                write_now(&self.stream, &mut self.write_blocked, |s| {
                    s.try_write_vectored(&slices)
                })?
            };
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            if n < left {
                held.written += n;
            } else {
                self.held = None;
            }
        }
        Ok(())
    }
}

/// One write that does not wait: `try_write` registers no waker, since a
/// frame written at once by another task must not take the place of the
/// writer's. `blocked` says whether it found no room.
fn write_now(
    stream: &TcpStream,
    blocked: &mut bool,
    write: impl FnOnce(&TcpStream) -> io::Result<usize>,
) -> io::Result<usize> {
    let r = write(stream);
    *blocked = matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock);
    r
}

impl Write for Tcp {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // What tungstenite writes goes after the held message.
        self.write_held()?;
        write_now(&self.stream, &mut self.write_blocked, |s| s.try_write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        // TCP_NODELAY is set: only the held message is left to write.
        self.write_held()
    }
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
    /// tungstenite's state of the connection (its buffers with it).
    ws: WebSocketContext,
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
    pub fn new(mut tcp: Tcp, read: &[u8], config: WebSocketConfig) -> WebSocket {
        // Read through `tcp` as if from the socket: tungstenite's own buffer
        // stays at its configured size.
        tcp.push_ahead(read);
        WebSocket {
            ws: WebSocketContext::new(Role::Server, Some(config)),
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
            let e = match self.ws.read(&mut self.tcp) {
                Ok(m) => {
                    // tungstenite's read buffer grew to take this frame
                    // whole, and would keep that size.
                    if m.len() > RECLAIM_OVER {
                        self.reclaim();
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

    /// After a message over [`RECLAIM_OVER`], tungstenite's state
    /// starts afresh: its read buffer grew to take the message's frame
    /// whole (to more than the frame: 20 KB after one of 15 KB, measured)
    /// and would keep that size for the socket's life. Only where nothing
    /// is lost: at a frame's
    /// boundary (tungstenite is never given a byte past the frame it
    /// reads, so its read buffer is empty and no message is half read),
    /// with nothing of the server's waiting to be written, and neither end
    /// closing.
    fn reclaim(&mut self) {
        let idle = self.ready && self.rest.is_none() && !self.closing;
        if !(idle && self.tcp.at_boundary() && self.ws.can_read() && self.ws.can_write()) {
            return;
        }
        if self.flush_ws().is_ok() {
            let config = *self.ws.get_config();
            self.ws = WebSocketContext::new(Role::Server, Some(config));
        }
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
        if data && !self.buffered && self.tcp.held.is_none() && self.ws.can_write() {
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
        match self.ws.write(&mut self.tcp, msg) {
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
                self.ws.close(&mut self.tcp, None)
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
        let r = self.ws.flush(&mut self.tcp);
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
