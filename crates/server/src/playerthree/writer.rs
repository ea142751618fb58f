//! Match records as store writes. They go through the server's one store
//! writer ([`crate::store_writer`]), PlayerThree's own: a match never
//! waits for the disk, except to hand out what must be durable first (a
//! new match, a token minted by the operator or by an owner's `mint`, the
//! answer to an owner's `mandate`, `scopes` or `controller`).

use hostwire_playerthree::host::Output;
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

/// One record as a store write.
pub fn write_of(match_id: &str, r: &Record) -> PlayerThreeWrite {
    // What restore reads of a seat's policy, controller and card is the
    // latest of each: a new one replaces the one before (an owner writing
    // `mandate` in a loop keeps one row per seat, not one per write).
    let slot = |kind: &str, role: &str| Some(format!("{kind}:{role}"));
    let (kind, tick, slot) = match r {
        Record::Config { .. } => ("config", None, None),
        Record::Token { .. } => ("token", None, None),
        Record::Revoked { .. } => ("revoked", None, None),
        Record::Controller { role, .. } => ("controller", None, slot("controller", role)),
        Record::Policy { role, .. } => ("policy", None, slot("policy", role)),
        Record::Card { role, .. } => ("card", None, slot("card", role)),
        Record::Proposal { .. } => ("proposal", None, None),
        Record::Resolved { .. } => ("resolved", None, None),
        Record::State { tick, .. } => ("state", Some(*tick), None),
        Record::Chat { tick, .. } => ("chat", Some(*tick), None),
        Record::Commentary { tick, .. } => ("commentary", Some(*tick), None),
    };
    PlayerThreeWrite::Record {
        match_id: match_id.to_owned(),
        kind: kind.to_owned(),
        tick,
        slot,
        // A record is plain data: serializing it cannot fail.
        body: serde_json::to_string(r).unwrap_or_default(),
    }
}
