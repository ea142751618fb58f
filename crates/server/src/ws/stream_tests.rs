//! A held message (written behind its header with no copy) through writes
//! that the socket takes only in part, beside messages tungstenite buffers
//! and the pongs it owes: every byte arrives, in order.

use super::*;
use futures_util::{SinkExt, StreamExt};
use std::future::poll_fn;
use std::task::Waker;
use tokio::net::TcpSocket;
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;

/// A server [`WebSocket`] and a client, both ends with small buffers, so
/// that the server's writes soon find no room while the client does not
/// read (the kernel's own would take the whole test's bytes). Which end
/// connected does not matter to a WebSocket: the server's end connects,
/// since only a socket not yet connected takes a send buffer's size.
async fn pair() -> (WebSocket, WebSocketStream<TcpStream>) {
    let listening = TcpSocket::new_v4().unwrap();
    listening.set_recv_buffer_size(4096).unwrap();
    listening.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = listening.listen(1).unwrap();
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_send_buffer_size(4096).unwrap();
    let server = socket
        .connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (client, _) = listener.accept().await.unwrap();
    let config = Arc::new(Config::new(1 << 20));
    let ws = WebSocket::new(Tcp::new(server), &[], config);
    let client = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
    (ws, client)
}

/// The `i`-th message: its number, then up to 15 KiB of one letter.
fn message(i: usize) -> String {
    let len = (i * 7919) % (15 * 1024);
    let letter = char::from(b'a' + (i % 26) as u8);
    format!("{i}:{}", letter.to_string().repeat(len))
}

const MESSAGES: usize = 300;

#[tokio::test]
async fn held_messages_arrive_whole_and_in_order_through_partial_writes_and_pongs() {
    let (mut ws, mut client) = pair().await;
    // Pings for the server to answer while its writes are blocked.
    for _ in 0..3 {
        client.send(Message::Ping(Bytes::new())).await.unwrap();
    }
    let (blocked_tx, blocked_rx) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(async move {
        let mut blocked = Some(blocked_tx);
        let mut held_in_part = 0;
        let mut i = 0;
        while i < MESSAGES {
            // The state let go wherever it may be: nothing is lost.
            if i % 4 == 0 {
                ws.shed();
            }
            poll_fn(|cx| ws.poll_ready(cx)).await.unwrap();
            ws.start_send(Message::Text(message(i).into())).unwrap();
            i += 1;
            // Every third turn one more message before the flush, every
            // fifth two more: they go to tungstenite's buffer behind the
            // held one, and none is held while tungstenite holds some.
            let more = usize::from(i % 3 == 0) + 2 * usize::from(i % 5 == 0);
            for _ in 0..more.min(MESSAGES - i) {
                poll_fn(|cx| ws.poll_ready(cx)).await.unwrap();
                ws.start_send(Message::Text(message(i).into())).unwrap();
                i += 1;
            }
            // A flush that does not wait first: once one finds no room, the
            // client starts reading.
            if !ws.try_flush().unwrap() {
                if ws.tcp.held.as_ref().is_some_and(|h| h.written > 0) {
                    held_in_part += 1;
                }
                // Reads what came (the pings: their pongs are owed).
                let _ = ws.poll_next(&mut Context::from_waker(Waker::noop()));
                if let Some(b) = blocked.take() {
                    let _ = b.send(());
                }
                poll_fn(|cx| ws.poll_flush(cx)).await.unwrap();
            }
        }
        poll_fn(|cx| ws.poll_close(cx)).await.unwrap();
        held_in_part
    });
    blocked_rx.await.expect("a write found no room");
    let mut pongs = 0;
    let mut next = 0;
    while let Some(m) = client.next().await {
        match m {
            Ok(Message::Text(t)) => {
                assert_eq!(t.as_str(), message(next), "message {next}");
                next += 1;
            }
            Ok(Message::Pong(_)) => pongs += 1,
            Ok(Message::Close(_)) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(next, MESSAGES, "every message arrived");
    assert_eq!(pongs, 3, "every ping was answered");
    let held_in_part = server.await.unwrap();
    assert!(
        held_in_part > 0,
        "no held message was ever written in part: the test did not test it"
    );
}

#[tokio::test]
async fn an_idle_socket_keeps_no_write_buffer_after_a_message() {
    let (mut ws, mut client) = pair().await;
    poll_fn(|cx| ws.poll_ready(cx)).await.unwrap();
    ws.start_send(Message::Text(message(5).into())).unwrap();
    assert!(
        ws.try_flush().unwrap(),
        "a small message is written at once"
    );
    assert!(ws.tcp.held.is_none());
    assert!(!ws.buffered, "tungstenite was given nothing to copy");
    let got = client.next().await.unwrap().unwrap();
    assert_eq!(got.into_text().unwrap().as_str(), message(5));
}

/// The next message the server reads.
async fn read(ws: &mut WebSocket) -> Message {
    poll_fn(|cx| ws.poll_next(cx)).await.unwrap().unwrap()
}

/// tungstenite's state is let go only between messages, with nothing owed
/// to the peer and neither end closing, and is made afresh for the next
/// frame read or message written: nothing read or owed is lost.
#[tokio::test]
async fn state_let_go_between_messages_is_made_afresh_and_nothing_is_lost() {
    let (mut ws, mut client) = pair().await;
    assert!(ws.is_shed(), "made only when first needed");
    client.send(Message::Text("one".into())).await.unwrap();
    assert_eq!(read(&mut ws).await.into_text().unwrap().as_str(), "one");
    assert!(!ws.is_shed());
    assert!(ws.shed(), "between messages");
    assert!(ws.is_shed());

    // A message begun in fragments, a ping between two of them.
    let text = OpCode::Data(Data::Text);
    let part = Frame::message(Bytes::from_static(b"tw"), text, false);
    client.send(Message::Frame(part)).await.unwrap();
    client
        .send(Message::Ping(Bytes::from_static(b"p")))
        .await
        .unwrap();
    assert!(matches!(read(&mut ws).await, Message::Ping(_)));
    assert!(!ws.shed(), "let go in the middle of a message");
    let rest = Frame::message(Bytes::from_static(b"o"), OpCode::Data(Data::Continue), true);
    client.send(Message::Frame(rest)).await.unwrap();
    assert_eq!(read(&mut ws).await.into_text().unwrap().as_str(), "two");
    assert!(ws.shed(), "the pong owed is written first");
    match client.next().await.unwrap().unwrap() {
        Message::Pong(p) => assert_eq!(&p[..], b"p"),
        other => panic!("expected the pong, got {other:?}"),
    }

    // Two messages taken while let go: the second goes through a state
    // made afresh, behind the first; letting go writes both out first.
    for m in ["three", "four"] {
        poll_fn(|cx| ws.poll_ready(cx)).await.unwrap();
        ws.start_send(Message::Text(m.into())).unwrap();
    }
    assert!(!ws.is_shed());
    assert!(ws.shed(), "what was taken is written, then let go");
    assert!(ws.tcp.held.is_none() && !ws.buffered);
    for m in ["three", "four"] {
        let got = client.next().await.unwrap().unwrap();
        assert_eq!(got.into_text().unwrap().as_str(), m);
    }

    // The client's close is read by a state made afresh, and echoed by the
    // read after it, which ends the stream.
    client.send(Message::Close(None)).await.unwrap();
    assert!(matches!(read(&mut ws).await, Message::Close(_)));
    assert!(!ws.shed(), "let go while closing");
    assert!(poll_fn(|cx| ws.poll_next(cx)).await.is_none());
    let echo = tokio::time::timeout(std::time::Duration::from_secs(10), client.next())
        .await
        .expect("the close was not echoed");
    assert!(matches!(echo, Some(Ok(Message::Close(_)))), "{echo:?}");
}
