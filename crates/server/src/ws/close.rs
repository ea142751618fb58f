//! How a connection ends cleanly: the server's Close frame after what is
//! queued, then the peer's Close awaited, so that both reach the other
//! side instead of a TCP reset.

use super::config::CLOSE_NORMAL;
use super::reader::{End, Reader};
use axum::extract::ws::Message;
use futures_util::StreamExt;

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
