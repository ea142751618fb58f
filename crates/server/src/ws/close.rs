//! How a connection ends cleanly: the server's Close frame after what is
//! queued, then the peer's Close awaited, so that both reach the other
//! side instead of a TCP reset.

use super::config::CLOSE_NORMAL;
use super::reader::{End, Reader};
use std::future::poll_fn;
use tungstenite::Message;

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
            out,
            end,
            registered,
            ..
        } = self;
        let config = std::sync::Arc::clone(&out.0.parked().config);
        let close = match end {
            End::Oversized => config.oversized,
            _ => (CLOSE_NORMAL, "closed"),
        };
        out.close(close);
        let parked = out.0.parked();
        // Nothing is read before the Close frame is out: a peer's Close
        // read now would be echoed ahead of it, and the peer would get its
        // own code instead of the server's. The writer runs beside this in
        // the connection's task.
        let ended = poll_fn(|cx| out.0.poll_writer_ended(cx));
        let sent = match tokio::time::timeout(config.close_grace, ended).await {
            Ok(()) => true,
            Err(_) => {
                // The writer finds the socket gone and ends.
                parked.drop_socket();
                false
            }
        };
        if sent && !matches!(end, End::Read | End::Oversized) {
            let _ = tokio::time::timeout(config.close_linger, async {
                while let Some(Ok(m)) = poll_fn(|cx| parked.poll_next(cx)).await {
                    if matches!(m, Message::Close(_)) {
                        break;
                    }
                }
            })
            .await;
        }
        // The TCP connection ends here, whoever still holds the queue.
        parked.drop_socket();
        let (sockets, id) = registered;
        sockets.deregister(id);
    }
}
