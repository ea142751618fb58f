//! A command offered to a unit's bounded queue from a connection's task.
//! A connection's future is held for its life, and every wait inside it
//! widens it: `Sender::send`'s own future is about 300 bytes. Almost
//! always the queue has room, so the command goes with `try_send` and
//! nothing waits; only a full queue makes (and boxes) the wait for room.

use std::borrow::Borrow;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc::{error::TrySendError, Sender};

/// Resolves to whether the command reached the queue (`false`: the unit
/// is gone). 16 bytes, whatever the command's size.
pub struct Offer<'a>(State<'a>);

enum State<'a> {
    Done(bool),
    Wait(Pin<Box<dyn Future<Output = bool> + Send + 'a>>),
}

/// Offers `msg` to `tx`'s queue, waiting for room only when it is full.
pub fn offer<T: Send + 'static>(tx: &Sender<T>, msg: T) -> Offer<'_> {
    offer_through(tx, msg)
}

/// [`offer`] with a sender of its own: the offer borrows nothing, so it
/// can be made before the future that awaits it (which then does not keep
/// the command).
pub fn offer_owned<T: Send + 'static>(tx: Sender<T>, msg: T) -> Offer<'static> {
    offer_through(tx, msg)
}

fn offer_through<'a, T, S>(tx: S, msg: T) -> Offer<'a>
where
    T: Send + 'static,
    S: Borrow<Sender<T>> + Send + Sync + 'a,
{
    match tx.borrow().try_send(msg) {
        Ok(()) => Offer(State::Done(true)),
        Err(TrySendError::Closed(_)) => Offer(State::Done(false)),
        Err(TrySendError::Full(msg)) => Offer(State::Wait(Box::pin(async move {
            tx.borrow().send(msg).await.is_ok()
        }))),
    }
}

impl Future for Offer<'_> {
    type Output = bool;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        match &mut self.0 {
            State::Done(sent) => Poll::Ready(*sent),
            State::Wait(wait) => wait.as_mut().poll(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    #[tokio::test]
    async fn sends_at_once_waits_for_room_and_tells_a_closed_queue() {
        let (tx, mut rx) = mpsc::channel::<u32>(1);
        assert!(offer(&tx, 1).await);
        // Full: the offer waits until the unit takes the first.
        let mut second = std::pin::pin!(offer_owned(tx.clone(), 2));
        let pending =
            std::future::poll_fn(|cx| Poll::Ready(second.as_mut().poll(cx).is_pending())).await;
        assert!(pending);
        assert_eq!(rx.recv().await, Some(1));
        assert!(second.await);
        assert_eq!(rx.recv().await, Some(2));
        drop(rx);
        assert!(!offer(&tx, 3).await);
        assert!(std::mem::size_of::<Offer<'_>>() <= 16);
    }
}
