//! Ownership of a unit across nodes: a lease with a generation, and the
//! fence every write of the unit passes.
//!
//! Several nodes on one PostgreSQL database each own some units (relay
//! rooms, hosted sessions, ggui sessions, PlayerThree matches). A node owns
//! a unit while it holds the unit's lease: a row of `unit_leases` naming
//! the node, a **generation** and an expiry. Taking a unit over (its lease
//! expired, or never taken, or released) raises the generation by one, so
//! each generation has exactly one owner.
//!
//! A write of a unit carries the generation its writer holds
//! ([`Unit::fence`](crate::Unit::fence)); the store checks it against the
//! lease row in the same transaction as the writes and refuses the unit
//! ([`StoreError::Fenced`](crate::StoreError::Fenced)) when the generation
//! moved on. A node that was paused or cut off past its lease therefore
//! cannot overwrite what the new owner restored and changed.
//!
//! # Whose clock
//!
//! The database's: every expiry is computed and compared by PostgreSQL
//! (`now()`, the time its transaction started), never from a node's
//! clock, because nodes' clocks differ and one judge must decide whether a
//! lease has run out. A caller learns how long its lease has left
//! ([`Lease::expires_in`]) and should count that from *before* it sent the
//! request, which can only make its own view of the lease shorter than
//! the database's.
//!
//! # SQLite
//!
//! SQLite is one node's file (held under [`lock_data_dir`](crate::lock_data_dir)):
//! no other node can own a unit, so it has no lease table, does not
//! implement [`LeaseStore`], and ignores a unit's `fence`.

use std::time::Duration;

/// How long a lease lasts unless the owner renews it: the time after which
/// another node may take over the units of a node that died.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);

/// What kind of unit a lease is for: the same key (a PIN, an id) may name
/// units of different protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnitKind {
    RelayRoom,
    HostedSession,
    GguiSession,
    PlayerThreeMatch,
}

impl UnitKind {
    pub const ALL: [UnitKind; 4] = [
        UnitKind::RelayRoom,
        UnitKind::HostedSession,
        UnitKind::GguiSession,
        UnitKind::PlayerThreeMatch,
    ];

    /// The name stored in `unit_leases.kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            UnitKind::RelayRoom => "relay_room",
            UnitKind::HostedSession => "hosted_session",
            UnitKind::GguiSession => "ggui_session",
            UnitKind::PlayerThreeMatch => "playerthree_match",
        }
    }

    pub fn from_name(name: &str) -> Option<UnitKind> {
        UnitKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl std::fmt::Display for UnitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A lease this node holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// What its writes carry as their fence.
    pub generation: u64,
    /// How long it has left by the database's clock when it was granted.
    pub expires_in: Duration,
}

/// Another node's (or this node's) live lease, which an acquire could not
/// take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHeld {
    pub owner: String,
    pub generation: u64,
    /// How long it has left by the database's clock.
    pub expires_in: Duration,
}

/// What [`LeaseStore::acquire`] got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The unit is this node's, under a new generation.
    Owned(Lease),
    /// A live lease holds it (renew your own instead of acquiring it).
    Held(LeaseHeld),
}

/// A lease a node believes it holds, as [`LeaseStore::renew_all`] takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRef {
    pub kind: UnitKind,
    pub key: String,
    pub generation: u64,
}

/// A row of the lease table, as listed by [`LeaseStore::owned_by`] and
/// [`LeaseStore::expired`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseEntry {
    pub kind: UnitKind,
    pub key: String,
    pub owner: String,
    pub generation: u64,
    /// Left by the database's clock; zero once expired.
    pub expires_in: Duration,
}

/// Leases of units, judged by the database's clock. Every call is one
/// short transaction on a connection of its own, so that renewals never
/// wait behind a batch of writes.
pub trait LeaseStore: Send + Sync + 'static {
    /// Takes the unit when it is free (never leased, released, or its lease
    /// expired): the generation grows by one and the lease runs `ttl` from
    /// the database's now. A live lease, this node's own included, is
    /// [`Acquired::Held`].
    fn acquire(
        &self,
        kind: UnitKind,
        key: &str,
        node: &str,
        ttl: Duration,
    ) -> Result<Acquired, crate::StoreError>;

    /// Extends each lease `node` holds in `held` (a unit's kind, key and
    /// generation) to `ttl` from now, in one statement for the lot (a node
    /// may own thousands of units; a round trip each would cost a
    /// database call per unit per pass). An expired lease nobody took over
    /// is extended too: no one else wrote. One answer per lease, in
    /// order: renewed, or [`StoreError::Fenced`](crate::StoreError::Fenced)
    /// when the unit was taken over or released. `Err` when the database
    /// could not be asked at all (nothing is known of any lease).
    fn renew_all(
        &self,
        node: &str,
        held: &[LeaseRef],
        ttl: Duration,
    ) -> Result<Vec<Result<Lease, crate::StoreError>>, crate::StoreError>;

    /// Lets the unit go: writes fenced with `generation` are refused from
    /// now on, and the next acquire takes it at once. The row stays (its
    /// generation must never start again at 1, or a stale writer's fence
    /// would pass). Fenced when `node` no longer holds `generation`.
    fn release(
        &self,
        kind: UnitKind,
        key: &str,
        node: &str,
        generation: u64,
    ) -> Result<(), crate::StoreError>;

    /// Hands the unit to whichever node takes it next (this node stops):
    /// its lease runs out now but keeps its owner, so that it is listed by
    /// [`LeaseStore::expired`] and another node's sweep takes it over even
    /// if no client asks for it (its timers must run somewhere). Fenced
    /// when `node` no longer holds `generation`.
    fn hand_over(
        &self,
        kind: UnitKind,
        key: &str,
        node: &str,
        generation: u64,
    ) -> Result<(), crate::StoreError>;

    /// The leases `node` holds (expired ones included, until taken over).
    fn owned_by(&self, node: &str) -> Result<Vec<LeaseEntry>, crate::StoreError>;

    /// The leases whose owner let them run out: what another node may take
    /// over. Released units are not listed (their owner let them go on
    /// purpose: the unit ended, or was handed to a named node).
    fn expired(&self) -> Result<Vec<LeaseEntry>, crate::StoreError>;
}
