//! Where the frames of a client's byte stream end, as the stream is handed
//! to tungstenite in pieces: it is never given a byte past the frame it
//! reads, so once it returns a message its read buffer is empty and its
//! state can be let go (see `stream::WebSocket::shed`).

use std::io::Cursor;
use tungstenite::protocol::frame::coding::OpCode;
use tungstenite::protocol::frame::FrameHeader;

/// The bytes left of the frame being handed out, its header included, and
/// whether a message sent in fragments is begun and not ended.
#[derive(Debug, Default)]
pub struct FrameEnds {
    left: u64,
    in_message: bool,
}

impl FrameEnds {
    /// Nothing of a frame has been handed out that is not all handed out.
    pub fn at_boundary(&self) -> bool {
        self.left == 0
    }

    /// At a frame's boundary and between messages: tungstenite, once it
    /// has read every frame handed out, holds no part of a message.
    pub fn between_messages(&self) -> bool {
        self.left == 0 && !self.in_message
    }

    /// How many of `src`'s first bytes may be handed out, at most `want`:
    /// no further than the end of the frame they belong to. `None` if `src`
    /// starts a frame whose header is not all there yet (it is then kept
    /// until it is). Never `Some(0)` for a `src` and `want` that are not
    /// empty, so a reader always gets on.
    pub fn give(&mut self, src: &[u8], want: usize) -> Option<usize> {
        if self.left == 0 {
            let mut header = Cursor::new(src);
            self.left = match FrameHeader::parse(&mut header) {
                Ok(Some((h, payload))) => {
                    // A control frame may come between a message's
                    // fragments: only data frames begin or end one.
                    if let OpCode::Data(_) = h.opcode {
                        self.in_message = !h.is_final;
                    }
                    header.position().saturating_add(payload)
                }
                Ok(None) => return None,
                // tungstenite refuses it too and the connection ends: the
                // bytes go to it as they come.
                Err(_) => u64::MAX,
            };
        }
        let n = want
            .min(src.len())
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        self.left -= n as u64;
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tungstenite::protocol::frame::coding::{Control, Data};
    use tungstenite::protocol::frame::Frame;

    /// Client frames of every length encoding (7-bit, 16-bit, 64-bit),
    /// masked, with where each ends in the stream.
    fn stream() -> (Vec<u8>, Vec<usize>) {
        let mut bytes = Vec::new();
        let mut ends = Vec::new();
        for (i, len) in [0, 5, 125, 126, 300, 65_535, 65_536, 70_000]
            .into_iter()
            .enumerate()
        {
            let fin = i % 3 != 1;
            let op = if i == 0 { Data::Text } else { Data::Binary };
            let mut f = Frame::message(vec![b'a'; len], OpCode::Data(op), fin);
            f.header_mut().mask = Some([1, 2, 3, 4]);
            f.format(&mut bytes).unwrap();
            ends.push(bytes.len());
        }
        (bytes, ends)
    }

    #[test]
    fn pieces_end_at_frame_ends_however_the_stream_arrives() {
        let (bytes, ends) = stream();
        for (chunk, want) in [
            (1, 1),
            (3, 7),
            (13, 128),
            (1000, 256),
            (100_000, 128),
            (7, 100_000),
        ] {
            let mut f = FrameEnds::default();
            // `have` is what has arrived; `at` what has been handed out.
            let (mut have, mut at, mut cuts) = (0, 0, Vec::new());
            while at < bytes.len() {
                match f.give(&bytes[at..have], want) {
                    Some(n) if at < have => {
                        assert!(n > 0 && n <= want, "chunk {chunk}, want {want}: {n}");
                        at += n;
                        if f.at_boundary() {
                            cuts.push(at);
                        }
                    }
                    _ => {
                        assert!(have < bytes.len(), "stuck at {at} with everything there");
                        have = (have + chunk).min(bytes.len());
                    }
                }
            }
            assert_eq!(cuts, ends, "chunk {chunk}, want {want}");
        }
    }

    /// A message sent in fragments is begun until its final fragment, with
    /// a ping between two of them.
    #[test]
    fn a_fragmented_message_is_between_messages_only_once_ended() {
        let mut bytes = Vec::new();
        let frames = [
            (OpCode::Data(Data::Text), false),
            (OpCode::Control(Control::Ping), true),
            (OpCode::Data(Data::Continue), false),
            (OpCode::Data(Data::Continue), true),
            (OpCode::Data(Data::Binary), true),
        ];
        let mut ends = Vec::new();
        for (op, fin) in frames {
            let mut f = Frame::message(vec![b'a'; 3], op, fin);
            f.header_mut().mask = Some([1, 2, 3, 4]);
            f.format(&mut bytes).unwrap();
            ends.push(bytes.len());
        }
        let mut f = FrameEnds::default();
        assert!(f.between_messages());
        let (mut at, mut seen) = (0, Vec::new());
        while at < bytes.len() {
            at += f.give(&bytes[at..], 4).unwrap();
            if ends.contains(&at) {
                seen.push(f.between_messages());
            } else {
                assert!(!f.between_messages(), "inside a frame at {at}");
            }
        }
        assert_eq!(seen, [false, false, false, true, true]);
    }

    #[test]
    fn a_header_tungstenite_refuses_is_passed_through() {
        // Reserved opcode 3: tungstenite ends the connection on it.
        let mut f = FrameEnds::default();
        assert_eq!(f.give(&[0x83, 0x80, 1, 2, 3, 4, 9, 9], 5), Some(5));
        assert_eq!(f.give(&[9, 9, 9], 5), Some(3));
        assert!(!f.at_boundary());
    }
}
