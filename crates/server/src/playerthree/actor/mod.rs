//! One task per match, driven by THE unit driver ([`crate::unit::drive`]):
//! it owns the match and handles its commands in order. The match's
//! durability rules (what waits for the store, what a refused write takes
//! back) and its timers (ticks, observer releases, idle MCP presences,
//! expiry) are the protocol crate's ([`DurableMatch`]); here its outputs
//! are carried out ([`deliver`]): frames to connections (one text shared
//! by all its readers), closes with the protocol's codes, pushes to MCP
//! sessions, answers to the requests waiting. A finished match ends its
//! task `finished_ttl_ms` after it finished: its connections are closed
//! (1000), its tokens forgotten and its records deleted. A match nobody
//! joins (no connection, no MCP session) ends the same way
//! `unjoined_ttl_ms` after it was created or restored.

mod commands;
mod deliver;

pub use commands::{MatchCmd, MatchHandle, SeatBinding};
pub use deliver::shared_frame;

use super::PlayerThree;
use crate::unit::{self, Store, Unit, Write};
use crate::ws::Utf8Bytes;
use commands::Tag;
use hostwire_playerthree::demo::Ridge;
use hostwire_playerthree::durable::{Change, Done, DurableMatch, MatchCommand, MatchTimes};
use hostwire_playerthree::tokens::TokenHash;
use hostwire_playerthree::Match;
use hostwire_store::playerthree::PlayerThreeWrite;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Commands waiting for one match.
pub const MATCH_QUEUE: usize = 4096;
/// Ticks run at once to catch up after the clock jumped (the protocol
/// crate's).
pub use hostwire_playerthree::durable::MAX_CATCH_UP_TICKS;

/// Close codes of `/playerthree/ws` (the protocol crate's).
pub use hostwire_playerthree::protocol::{
    CLOSE_GOING_AWAY, CLOSE_MATCH_OVER, CLOSE_RATE_LIMITED, CLOSE_REVOKED,
};

/// The match as the driver sees it.
type Unit3 = DurableMatch<Ridge, Tag>;

impl Unit for Unit3 {
    type Command = (MatchCommand<Utf8Bytes>, Option<Tag>);
    type Output = Done<Tag>;
    type Record = PlayerThreeWrite;

    fn handle(&mut self, (cmd, tag): Self::Command, now: u64) {
        DurableMatch::handle(self, cmd, tag, now)
    }
    fn poll_output(&mut self) -> Option<Done<Tag>> {
        DurableMatch::poll_output(self)
    }
    fn poll_timeout(&self) -> Option<u64> {
        DurableMatch::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: u64) {
        DurableMatch::handle_timeout(self, now)
    }
    fn poll_write(&mut self) -> Option<Write<PlayerThreeWrite>> {
        let w = DurableMatch::poll_write(self)?;
        let id = self.id();
        let records = w
            .changes
            .iter()
            .map(|c| match c {
                Change::Record(r) => super::writer::write_of(id, r),
                Change::RemoveMatch => PlayerThreeWrite::RemoveMatch { id: id.to_owned() },
            })
            .collect();
        Some(Write { id: w.id, records })
    }
    fn ack(&mut self, id: u64, durable: bool, now: u64) {
        DurableMatch::ack(self, id, durable, now)
    }
    fn accepts(&self) -> bool {
        DurableMatch::accepts(self)
    }
}

pub fn spawn(p3: Arc<PlayerThree>, m: Match<Ridge>, operator_token: TokenHash) -> MatchHandle {
    let (tx, rx) = mpsc::channel(MATCH_QUEUE);
    let handle = MatchHandle {
        id: Arc::from(m.id()),
        operator_token,
        tx,
        inbound: Arc::new(super::pace::InboundPace::new()),
        lost: Arc::default(),
    };
    let me = handle.tx.downgrade();
    // A root span: the match outlives the request that created it.
    let span = tracing::info_span!(parent: None, "match", id = %handle.id);
    let lost = Arc::clone(&handle.lost);
    tokio::spawn(tracing::Instrument::instrument(
        run(p3, m, me, lost, rx),
        span,
    ));
    handle
}

/// The match's task: handles commands until it expires, shuts down or
/// its handles are gone, or until another node takes it over (then it
/// answers nothing more and closes its connections with
/// [`CLOSE_MATCH_MOVED`](super::CLOSE_MATCH_MOVED)).
async fn run(
    p3: Arc<PlayerThree>,
    m: Match<Ridge>,
    me: mpsc::WeakSender<MatchCmd>,
    lost: Arc<tokio::sync::Notify>,
    mut rx: mpsc::Receiver<MatchCmd>,
) {
    let times = MatchTimes {
        tick_ms: p3.config.tick_ms,
        finished_ttl_ms: p3.config.finished_ttl_ms,
        unjoined_ttl_ms: p3.config.unjoined_ttl_ms,
        mcp_live_grace_ms: super::mcp::MCP_LIVE_GRACE_MS,
    };
    // Records of the restore itself come out first (none for a new match:
    // its creator wrote them).
    let mut unit = DurableMatch::new(m, times, p3.clock.now_ms());
    let id = unit.id().to_owned();
    let mut to = deliver::Conns::new(&p3, me);
    let store = Store {
        writer: &p3.writer,
        key: &id,
        clock: &*p3.clock,
    };
    let was_lost = tokio::select! {
        // A loss first: the refused write that told it must not be
        // answered as the store's failure.
        biased;
        () = lost.notified() => true,
        () = unit::drive(&mut unit, &mut to, &mut rx, store) => false,
    };
    if was_lost {
        to.close_all(super::CLOSE_MATCH_MOVED, "match moved to another node");
        rx.close();
        tracing::warn!("match dropped: another node took it over");
    } else {
        p3.release(&id).await;
    }
}
