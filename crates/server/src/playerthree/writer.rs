//! Match records as store writes. They go through the server's one store
//! writer ([`crate::store_writer`]), PlayerThree's own: a match never
//! waits for the disk, except to hand out what must be durable first (a
//! new match, a token minted by the operator or by an owner's `mint`, the
//! answer to an owner's `mandate`, `scopes` or `controller`).

use hostwire_playerthree::host::Output;
use hostwire_playerthree::observer::MAX_KEYFRAME_COMMENTARY;
use hostwire_playerthree::Record;
use hostwire_store::playerthree::PlayerThreeWrite;

/// PlayerThree's store writer.
pub type Writer = crate::store_writer::StoreWriter<PlayerThreeWrite>;

/// The store writes for the `Persist` outputs among `outputs`.
pub fn persisted(match_id: &str, outputs: Vec<Output>) -> Vec<PlayerThreeWrite> {
    outputs
        .into_iter()
        .filter_map(|o| match o {
            Output::Persist(r) => Some(write_of(match_id, &r)),
            _ => None,
        })
        .collect()
}

/// Chat lines (owner tells and agent replies) a match keeps per team,
/// the newest: chat is kept for the record, a restore does not read it.
pub const MAX_STORED_CHAT_PER_TEAM: u32 = 256;

/// One record as a store write.
pub fn write_of(match_id: &str, r: &Record) -> PlayerThreeWrite {
    // What restore reads of a seat's policy, controller, card and
    // proposal, and of the game's state, is the latest of each: a new one
    // replaces the one before (an owner writing `mandate` in a loop keeps
    // one row per seat, not one per write). Of a team's commentary a
    // restart's keyframe carries the newest MAX_KEYFRAME_COMMENTARY; of
    // its chat, restore reads nothing.
    let latest = |kind: &str, key: &str| (Some(format!("{kind}:{key}")), 1);
    let (kind, tick, (slot, keep)) = match r {
        Record::Config { .. } => ("config", None, (None, 0)),
        Record::Token { .. } => ("token", None, (None, 0)),
        Record::Revoked { .. } => ("revoked", None, (None, 0)),
        Record::Controller { role, .. } => ("controller", None, latest("controller", role)),
        Record::Policy { role, .. } => ("policy", None, latest("policy", role)),
        Record::Card { role, .. } => ("card", None, latest("card", role)),
        // A seat has one proposal pending at most; its end replaces it
        // (restore continues ids past the end's id too).
        Record::Proposal { role, .. } => ("proposal", None, latest("proposal", role)),
        Record::Resolved { role, .. } => (
            "resolved",
            None,
            match role {
                Some(role) => latest("proposal", role),
                None => (None, 0),
            },
        ),
        Record::State { tick, .. } => ("state", Some(*tick), latest("state", "game")),
        Record::Chat { tick, team, .. } => (
            "chat",
            Some(*tick),
            (Some(format!("chat:{team}")), MAX_STORED_CHAT_PER_TEAM),
        ),
        Record::Commentary { tick, team, .. } => (
            "commentary",
            Some(*tick),
            (
                Some(format!("commentary:{team}")),
                MAX_KEYFRAME_COMMENTARY as u32,
            ),
        ),
    };
    PlayerThreeWrite::Record {
        match_id: match_id.to_owned(),
        kind: kind.to_owned(),
        tick,
        slot,
        keep,
        // A record is plain data: serializing it cannot fail.
        body: serde_json::to_string(r).unwrap_or_default(),
    }
}
