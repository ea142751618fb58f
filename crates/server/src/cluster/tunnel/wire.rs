//! A tunnel's messages on NATS: one byte saying what it is, the sender's
//! sequence number (8 bytes, big-endian), then the body. The sequence
//! numbers let the receiver see a message NATS lost (core NATS delivers
//! at most once: a slow consumer or a reconnect can drop one): a gap ends
//! the tunnel, and its client reconnects, rather than a frame going
//! missing unseen.
//!
//! Messages travel in batches, one NATS message per batch for all the
//! tunnels between two nodes (see `link.rs`): each message of a batch is
//! a record of its tunnel's id (one byte of length, then the id) and the
//! message (four bytes of length, big-endian, then the message).

use bytes::{BufMut, Bytes, BytesMut};

/// The sequence number of a message outside the tunnel's order: the
/// receiving node's own refusal (its queue for the tunnel was full), sent
/// by whichever task saw it. Always taken, and always the last.
pub const OUT_OF_BAND: u64 = u64::MAX;

/// The longest close reason carried (RFC 6455: 123 bytes).
const MAX_REASON: usize = 123;

/// The most bytes of a frame one message carries: a longer frame goes as
/// [`Wire::Fragment`]s and a last part (NATS refuses a message over its
/// `max_payload`, 1 MB by default).
pub const FRAGMENT_BYTES: usize = 256 * 1024;

/// What one tunnel message carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wire {
    /// A text frame (UTF-8, checked again on arrival).
    Text(Bytes),
    Binary(Bytes),
    /// The client sent a message over the protocol's limit, of this size.
    Oversized(u64),
    /// The sender is alive (a ping of the owner, or the client node's
    /// beat while its client is connected).
    Keepalive,
    /// The owner closed the connection with this code and reason.
    Close(u16, String),
    /// The client is gone: nothing more comes.
    End,
    /// The first bytes of the next text or binary frame, whose last part
    /// comes as that frame's message.
    Fragment(Bytes),
    /// The receiver took this many more frames and bytes from its queue:
    /// the sender may send that much more (see `bridge.rs`).
    Credit {
        frames: u64,
        bytes: u64,
    },
}

impl Wire {
    /// A text or binary frame (`text`: which) as the messages that carry
    /// it: fragments of [`FRAGMENT_BYTES`], then its last part.
    pub fn frame(text: bool, body: Bytes) -> Vec<Wire> {
        let last = |b: Bytes| if text { Wire::Text(b) } else { Wire::Binary(b) };
        if body.len() <= FRAGMENT_BYTES {
            return vec![last(body)];
        }
        let mut out = Vec::with_capacity(body.len().div_ceil(FRAGMENT_BYTES));
        let mut rest = body;
        while rest.len() > FRAGMENT_BYTES {
            out.push(Wire::Fragment(rest.split_to(FRAGMENT_BYTES)));
        }
        out.push(last(rest));
        out
    }
}

const TEXT: u8 = b'T';
const BINARY: u8 = b'B';
const OVERSIZED: u8 = b'O';
const KEEPALIVE: u8 = b'K';
const CLOSE: u8 = b'C';
const END: u8 = b'E';
const FRAGMENT: u8 = b'F';
const CREDIT: u8 = b'A';

/// Why a message was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    TooShort,
    UnknownKind,
    BadBody,
}

impl Wire {
    pub fn encode(&self, seq: u64) -> Bytes {
        let mut out = BytesMut::with_capacity(self.encoded_len());
        self.encode_into(seq, &mut out);
        out.freeze()
    }

    /// The bytes [`Wire::encode`] gives.
    pub fn encoded_len(&self) -> usize {
        9 + match self {
            Wire::Text(b) | Wire::Binary(b) | Wire::Fragment(b) => b.len(),
            Wire::Credit { .. } => 16,
            Wire::Oversized(_) => 8,
            Wire::Close(_, r) => 2 + truncate(r, MAX_REASON).len(),
            Wire::Keepalive | Wire::End => 0,
        }
    }

    /// Appends the message to `out`.
    pub fn encode_into(&self, seq: u64, out: &mut BytesMut) {
        out.reserve(self.encoded_len());
        let (kind, body): (u8, &[u8]) = match self {
            Wire::Text(b) => (TEXT, b),
            Wire::Binary(b) => (BINARY, b),
            Wire::Fragment(b) => (FRAGMENT, b),
            Wire::Credit { .. } => (CREDIT, &[]),
            Wire::Oversized(_) => (OVERSIZED, &[]),
            Wire::Keepalive => (KEEPALIVE, &[]),
            Wire::Close(..) => (CLOSE, &[]),
            Wire::End => (END, &[]),
        };
        out.put_u8(kind);
        out.put_u64(seq);
        out.put_slice(body);
        match self {
            Wire::Oversized(n) => out.put_u64(*n),
            Wire::Credit { frames, bytes } => {
                out.put_u64(*frames);
                out.put_u64(*bytes);
            }
            Wire::Close(code, reason) => {
                out.put_u16(*code);
                out.put_slice(truncate(reason, MAX_REASON).as_bytes());
            }
            _ => {}
        }
    }

    /// Reads one message; the frame bodies share `payload`'s bytes.
    pub fn decode(payload: &Bytes) -> Result<(u64, Wire), Malformed> {
        if payload.len() < 9 {
            return Err(Malformed::TooShort);
        }
        let seq = u64::from_be_bytes(payload[1..9].try_into().expect("8 bytes"));
        let body = payload.slice(9..);
        let wire = match payload[0] {
            TEXT => Wire::Text(body),
            BINARY => Wire::Binary(body),
            FRAGMENT => Wire::Fragment(body),
            CREDIT => {
                let n: [u8; 16] = body[..].try_into().map_err(|_| Malformed::BadBody)?;
                Wire::Credit {
                    frames: u64::from_be_bytes(n[..8].try_into().expect("8 bytes")),
                    bytes: u64::from_be_bytes(n[8..].try_into().expect("8 bytes")),
                }
            }
            OVERSIZED => {
                let n: [u8; 8] = body[..].try_into().map_err(|_| Malformed::BadBody)?;
                Wire::Oversized(u64::from_be_bytes(n))
            }
            KEEPALIVE if body.is_empty() => Wire::Keepalive,
            END if body.is_empty() => Wire::End,
            CLOSE if body.len() >= 2 && body.len() <= 2 + MAX_REASON => {
                let code = u16::from_be_bytes([body[0], body[1]]);
                let reason = std::str::from_utf8(&body[2..]).map_err(|_| Malformed::BadBody)?;
                Wire::Close(code, reason.to_owned())
            }
            KEEPALIVE | END | CLOSE => return Err(Malformed::BadBody),
            _ => return Err(Malformed::UnknownKind),
        };
        Ok((seq, wire))
    }
}

/// The longest tunnel id a record holds (one byte of length).
pub const MAX_TUNNEL_ID: usize = 255;

/// Appends one record of a batch: `tunnel`'s message `w`. False (nothing
/// appended) when the id is longer than [`MAX_TUNNEL_ID`].
pub fn put_record(out: &mut BytesMut, tunnel: &str, seq: u64, w: &Wire) -> bool {
    let Ok(id_len) = u8::try_from(tunnel.len()) else {
        return false;
    };
    let Ok(len) = u32::try_from(w.encoded_len()) else {
        return false;
    };
    out.reserve(1 + tunnel.len() + 4 + len as usize);
    out.put_u8(id_len);
    out.put_slice(tunnel.as_bytes());
    out.put_u32(len);
    w.encode_into(seq, out);
    true
}

/// The records of a batch, in order: each tunnel id and its message (read
/// with [`Wire::decode`]), sharing `batch`'s bytes. A record cut short or
/// an id that is not UTF-8 ends the reading with [`Malformed`].
pub fn records(batch: &Bytes) -> Records<'_> {
    Records { batch, at: 0 }
}

pub struct Records<'a> {
    batch: &'a Bytes,
    at: usize,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<(&'a str, Bytes), Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        let b = &self.batch[self.at..];
        if b.is_empty() {
            return None;
        }
        let id_len = b[0] as usize;
        let Some(id) = b.get(1..1 + id_len) else {
            self.at = self.batch.len();
            return Some(Err(Malformed::TooShort));
        };
        let Some(len) = b.get(1 + id_len..5 + id_len) else {
            self.at = self.batch.len();
            return Some(Err(Malformed::TooShort));
        };
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        let start = self.at + 5 + id_len;
        if self.batch.len() - start < len {
            self.at = self.batch.len();
            return Some(Err(Malformed::TooShort));
        }
        self.at = start + len;
        let Ok(id) = std::str::from_utf8(id) else {
            return Some(Err(Malformed::BadBody));
        };
        Some(Ok((id, self.batch.slice(start..start + len))))
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_reads_back_as_written() {
        let all = [
            Wire::Text(Bytes::from_static(b"{\"t\":\"join\"}")),
            Wire::Binary(Bytes::from_static(&[0, 1, 2])),
            Wire::Oversized(1 << 40),
            Wire::Keepalive,
            Wire::Close(1013, "room served by another node".to_owned()),
            Wire::End,
            Wire::Fragment(Bytes::from_static(b"{\"t\":")),
            Wire::Credit {
                frames: 32,
                bytes: 1 << 20,
            },
        ];
        for (seq, w) in all.into_iter().enumerate() {
            let b = w.encode(seq as u64);
            assert_eq!(Wire::decode(&b), Ok((seq as u64, w)));
        }
    }

    #[test]
    fn what_is_not_a_message_is_refused_by_name() {
        assert_eq!(
            Wire::decode(&Bytes::from_static(b"T1234")),
            Err(Malformed::TooShort)
        );
        let mut m = Wire::Keepalive.encode(3).to_vec();
        m[0] = b'Z';
        assert_eq!(Wire::decode(&m.into()), Err(Malformed::UnknownKind));
        let mut m = Wire::End.encode(3).to_vec();
        m.push(0);
        assert_eq!(Wire::decode(&m.into()), Err(Malformed::BadBody));
        let mut m = Wire::Close(1000, String::new()).encode(0).to_vec();
        m.extend_from_slice(&[0xff, 0xfe]);
        assert_eq!(Wire::decode(&m.into()), Err(Malformed::BadBody));
        let m = Wire::Oversized(1).encode(0);
        assert_eq!(Wire::decode(&m.slice(..12)), Err(Malformed::BadBody));
    }

    #[test]
    fn a_long_frame_goes_in_fragments_that_join_back() {
        let body = Bytes::from(vec![7u8; 2 * FRAGMENT_BYTES + 5]);
        let parts = Wire::frame(true, body.clone());
        assert_eq!(parts.len(), 3);
        let mut joined = Vec::new();
        for p in &parts[..2] {
            let Wire::Fragment(b) = p else {
                panic!("not a fragment: {p:?}")
            };
            assert_eq!(b.len(), FRAGMENT_BYTES);
            joined.extend_from_slice(b);
        }
        let Wire::Text(last) = &parts[2] else {
            panic!("not the last part")
        };
        joined.extend_from_slice(last);
        assert_eq!(joined, body);
        assert_eq!(
            Wire::frame(false, Bytes::from_static(b"x")),
            [Wire::Binary(Bytes::from_static(b"x"))]
        );
    }

    #[test]
    fn a_batch_reads_back_record_by_record() {
        let mut batch = BytesMut::new();
        assert!(put_record(&mut batch, "abc", 0, &Wire::Keepalive));
        assert!(put_record(
            &mut batch,
            "de",
            7,
            &Wire::Text(Bytes::from_static(b"hi"))
        ));
        assert!(!put_record(&mut batch, &"x".repeat(256), 0, &Wire::End));
        let batch = batch.freeze();
        let read: Vec<_> = records(&batch)
            .map(|r| r.map(|(id, m)| (id.to_owned(), Wire::decode(&m))))
            .collect();
        assert_eq!(
            read,
            [
                Ok(("abc".to_owned(), Ok((0, Wire::Keepalive)))),
                Ok((
                    "de".to_owned(),
                    Ok((7, Wire::Text(Bytes::from_static(b"hi"))))
                )),
            ]
        );
        // Cut anywhere inside its last record, a batch ends with an error.
        for cut in batch.len() - 12..batch.len() {
            let short = batch.slice(..cut);
            let last = records(&short).last();
            assert_eq!(last, Some(Err(Malformed::TooShort)), "cut at {cut}");
        }
    }

    #[test]
    fn a_long_reason_is_cut_at_a_character() {
        let reason = "é".repeat(100);
        let b = Wire::Close(1000, reason).encode(0);
        let Ok((_, Wire::Close(_, r))) = Wire::decode(&b) else {
            panic!("not read back");
        };
        assert_eq!(r.len(), 122);
    }
}
