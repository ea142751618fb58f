//! The TCP stream under a client's WebSocket, as tungstenite reads and
//! writes it: without blocking, read through the thread's buffer
//! ([`SCRATCH_BYTES`]) and never past the frame tungstenite reads
//! ([`FrameEnds`]), and written with a text or binary message that has
//! nothing before it held as it is ([`Held`]) and written behind a header
//! made here, not copied into tungstenite's write buffer, which would keep
//! the capacity of the largest frame it held for the socket's life.

use super::frame_ends::FrameEnds;
use crate::http::counted::IpSlot;
use std::io::{self, IoSlice, Read, Write};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use tokio::io::AsyncRead;
use tokio::net::TcpStream;
use tungstenite::protocol::frame::coding::{Data, OpCode};
use tungstenite::protocol::frame::FrameHeader;
use tungstenite::Message;

/// The TCP stream under a WebSocket, as tungstenite reads and writes it:
/// without blocking (`WouldBlock` when the socket has nothing or no room).
pub struct Tcp {
    pub(super) stream: TcpStream,
    /// A write found no room: a reply tungstenite owes the peer (a pong, a
    /// close) waits for the socket's room, which the reader then watches.
    pub(super) write_blocked: bool,
    /// Bytes read from the socket past what tungstenite took: held only
    /// until taken, so an idle connection holds none (and, boxed, only a
    /// pointer's room for them).
    ahead: Option<Box<Ahead>>,
    /// A message taken as it is, to be written behind its header with no
    /// copy ([`WebSocket::start_send`](super::WebSocket::start_send)): it goes out before any byte
    /// tungstenite writes after it.
    pub(super) held: Option<Box<Held>>,
    /// Where the frames tungstenite is given end: never a byte past the
    /// frame it reads, so once it returns a message its read buffer holds
    /// nothing ([`WebSocket::shed`](super::WebSocket::shed)).
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
pub(super) struct Held {
    /// A text or binary message.
    pub(super) msg: Message,
    /// Bytes of the frame (header, then body) the socket has taken.
    pub(super) written: usize,
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

/// A held frame up to this size is joined to its header on the stack and
/// written from one buffer.
const JOINED_BYTES: usize = 4096;

/// Most frames (a relay's `to` and `up`, a device's call) fit here: the
/// stack buffer they are joined in is zeroed before use, and zeroing
/// [`JOINED_BYTES`] for every small frame costs more than the copy.
const JOINED_SMALL_BYTES: usize = 512;

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
    pub(super) fn push_ahead(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let ahead = self.ahead.get_or_insert_with(Box::default);
        ahead.bytes.extend_from_slice(bytes);
    }

    /// Whether bytes read ahead wait to be taken.
    pub(super) fn has_ahead(&self) -> bool {
        self.ahead.is_some()
    }

    /// Between messages, with nothing read ahead: once tungstenite has
    /// read what it was given, it holds no part of a message.
    pub(super) fn between_messages(&self) -> bool {
        self.frames.between_messages() && !self.has_ahead()
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
            // One buffer, not two: a socket's `writev` costs the kernel
            // more than a `send` of the same bytes (measured), and a small
            // frame's copy on the stack costs nothing beside it.
            let n = if left <= JOINED_SMALL_BYTES {
                write_joined::<JOINED_SMALL_BYTES>(
                    &self.stream,
                    &mut self.write_blocked,
                    header,
                    body,
                )?
            } else if left <= JOINED_BYTES {
                write_joined::<JOINED_BYTES>(&self.stream, &mut self.write_blocked, header, body)?
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

/// `header` and `body` (together at most `N` bytes) written from one
/// buffer on the stack.
fn write_joined<const N: usize>(
    stream: &TcpStream,
    blocked: &mut bool,
    header: &[u8],
    body: &[u8],
) -> io::Result<usize> {
    let left = header.len() + body.len();
    let mut joined = [0; N];
    joined[..header.len()].copy_from_slice(header);
    joined[header.len()..left].copy_from_slice(body);
    write_now(stream, blocked, |s| s.try_write(&joined[..left]))
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
