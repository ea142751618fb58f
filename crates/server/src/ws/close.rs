//! How a connection ends: the WebSocket layer's refusals mapped to close
//! codes (RFC 6455 violations), and the clean close handshake.

use super::config::{CLOSE_INVALID_DATA, CLOSE_NORMAL, CLOSE_PROTOCOL_ERROR};
use super::reader::{End, Reader};
use crate::outbound::Close;
use axum::extract::ws::Message;
use futures_util::StreamExt;

/// How the WebSocket layer's refusal of what the client sent ends the
/// connection.
pub(super) enum ReadError {
    Oversized,
    /// Not WebSocket as RFC 6455 has it: closed with this code and reason.
    Violation(Close),
    /// The socket failed or ended: nothing can be sent.
    Gone,
}

pub(super) fn read_error(e: axum::Error) -> ReadError {
    use tungstenite::error::ProtocolError as P;
    let e = e.into_inner();
    let Some(e) = e.downcast_ref::<tungstenite::Error>() else {
        return ReadError::Gone;
    };
    match e {
        tungstenite::Error::Capacity(_) => ReadError::Oversized,
        tungstenite::Error::Utf8(_) => {
            ReadError::Violation((CLOSE_INVALID_DATA, "invalid UTF-8 in a text frame"))
        }
        tungstenite::Error::Protocol(p) => ReadError::Violation((
            CLOSE_PROTOCOL_ERROR,
            match p {
                P::UnmaskedFrameFromClient => "unmasked client frame",
                P::NonZeroReservedBits => "reserved bits set",
                P::UnknownDataFrameType(_) | P::UnknownControlFrameType(_) => "unknown opcode",
                P::FragmentedControlFrame => "fragmented control frame",
                P::ControlFrameTooBig => "control frame over 125 bytes",
                P::UnexpectedContinueFrame | P::ExpectedFragment(_) => "continuation out of order",
                P::InvalidCloseSequence => "invalid close frame",
                // The socket ended or the handshake is over: nothing to
                // answer.
                P::ResetWithoutClosingHandshake | P::ReceivedAfterClosing | P::SendAfterClosing => {
                    return ReadError::Gone
                }
                _ => "protocol error",
            },
        )),
        _ => ReadError::Gone,
    }
}

impl Reader {
    /// Ends the connection cleanly: closes it (after what is queued) unless
    /// it is closing already, waits at most
    /// [`Config::close_grace`](super::Config::close_grace) for the Close
    /// frame to be sent (else the socket is dropped), then reads and
    /// discards until the peer's Close, at most
    /// [`Config::close_linger`](super::Config::close_linger). Call it once
    /// the protocol has let go of the connection (it left its room, session
    /// or match).
    pub async fn finish(self) {
        let Reader {
            mut stream,
            out,
            mut writer,
            end,
            registered,
            config,
            ..
        } = self;
        let close = match end {
            End::Oversized => config.oversized,
            _ => (CLOSE_NORMAL, "closed"),
        };
        out.close(close);
        drop(out);
        // Nothing is read before the Close frame is out: a peer's Close
        // read now would be echoed ahead of it, and the peer would get its
        // own code instead of the server's.
        let sent = match tokio::time::timeout(config.close_grace, &mut writer).await {
            Ok(r) => r.is_ok(),
            Err(_) => {
                writer.abort();
                false
            }
        };
        if sent && !matches!(end, End::Read | End::Oversized) {
            let _ = tokio::time::timeout(config.close_linger, async {
                while let Some(Ok(m)) = stream.next().await {
                    if matches!(m, Message::Close(_)) {
                        break;
                    }
                }
            })
            .await;
        }
        if let Some((sockets, id)) = registered {
            sockets.deregister(id);
        }
    }
}
