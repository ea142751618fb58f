//! [`LeaseStore`] on PostgreSQL, and the fence a unit's savepoint checks.
//! Every expiry is set and judged by the database's `now()` (the start of
//! the call's transaction): see [`crate::lease`] for why.

use super::{PgStore, Tx};
use crate::lease::{Acquired, Lease, LeaseEntry, LeaseHeld, LeaseRef, LeaseStore, UnitKind};
use crate::StoreError;
use std::collections::HashSet;
use std::time::Duration;

/// A lease's length as the `BIGINT` of milliseconds the statements take.
fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

fn left(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

/// Milliseconds from the database's clock at this moment (not the
/// transaction's start, which may precede a wait for the row) to
/// `expires_at`, as `BIGINT`.
const LEFT_MS: &str = "(EXTRACT(EPOCH FROM (expires_at - clock_timestamp())) * 1000)::BIGINT";

/// Refuses the unit unless `fence` is the current generation of a lease
/// someone holds. The row is locked `FOR SHARE` until the commit, so a
/// takeover (which updates the row) waits for this batch, and the new
/// owner restores what it wrote.
pub(crate) fn check_fence(
    tx: &mut Tx<'_, '_>,
    kind: UnitKind,
    key: &str,
    fence: u64,
) -> Result<(), StoreError> {
    let row = tx.query_opt(
        "SELECT generation, owner IS NOT NULL FROM unit_leases
         WHERE kind = $1 AND key = $2 FOR SHARE",
        &[&kind.as_str(), &key],
    )?;
    let current = match row {
        Some(r) if r.get::<_, bool>(1) => Some(r.get::<_, i64>(0) as u64),
        _ => None,
    };
    if current == Some(fence) {
        return Ok(());
    }
    Err(StoreError::Fenced {
        key: key.to_owned(),
        held: fence,
        current,
    })
}

fn entries(rows: Vec<::postgres::Row>) -> Vec<LeaseEntry> {
    rows.into_iter()
        .filter_map(|r| {
            Some(LeaseEntry {
                // A kind this hostwire does not know is not its to take.
                kind: UnitKind::from_name(r.get(0))?,
                key: r.get(1),
                owner: r.get(2),
                generation: r.get::<_, i64>(3) as u64,
                expires_in: left(r.get(4)),
            })
        })
        .collect()
}

impl LeaseStore for PgStore {
    fn acquire(
        &self,
        kind: UnitKind,
        key: &str,
        node: &str,
        ttl: Duration,
    ) -> Result<Acquired, StoreError> {
        let ttl = ttl_ms(ttl);
        self.leases.with(|c| {
            let mut tx = c.transaction()?;
            // One statement takes a free unit or an expired lease: two
            // nodes acquiring at once are ordered by the row (or the
            // primary key's insert), and the second sees the first's lease.
            let taken = tx.query_opt(
                "INSERT INTO unit_leases (kind, key, owner, generation, expires_at)
                 VALUES ($1, $2, $3, 1, now() + $4::BIGINT * INTERVAL '1 millisecond')
                 ON CONFLICT (kind, key) DO UPDATE
                 SET owner = EXCLUDED.owner,
                     generation = unit_leases.generation + 1,
                     expires_at = EXCLUDED.expires_at
                 WHERE unit_leases.owner IS NULL OR unit_leases.expires_at <= now()
                 RETURNING generation",
                &[&kind.as_str(), &key, &node, &ttl],
            )?;
            let acquired = match taken {
                Some(r) => Acquired::Owned(Lease {
                    generation: r.get::<_, i64>(0) as u64,
                    expires_in: left(ttl),
                }),
                // The conflicting row stays locked by the statement above:
                // this reads the lease that kept it.
                None => {
                    let r = tx.query_one(
                        &format!(
                            "SELECT owner, generation, {LEFT_MS} FROM unit_leases
                             WHERE kind = $1 AND key = $2"
                        ),
                        &[&kind.as_str(), &key],
                    )?;
                    Acquired::Held(LeaseHeld {
                        owner: r.get(0),
                        generation: r.get::<_, i64>(1) as u64,
                        expires_in: left(r.get(2)),
                    })
                }
            };
            tx.commit()?;
            Ok(acquired)
        })
    }

    fn renew_all(
        &self,
        node: &str,
        held: &[LeaseRef],
        ttl: Duration,
    ) -> Result<Vec<Result<Lease, StoreError>>, StoreError> {
        let ms = ttl_ms(ttl);
        let kinds: Vec<&str> = held.iter().map(|l| l.kind.as_str()).collect();
        let keys: Vec<&str> = held.iter().map(|l| l.key.as_str()).collect();
        let generations: Vec<i64> = held.iter().map(|l| l.generation as i64).collect();
        let renewed: HashSet<(String, String)> = self.leases.with(|c| {
            // SKIP LOCKED: a row a unit's write holds `FOR SHARE` (its
            // fence) is left to the single renewal below, which waits for
            // that one row alone. Waiting here, holding the rows already
            // locked, could close a cycle with a write that fences several
            // units in another order.
            let rows = c.query(
                "WITH mine AS (
                     SELECT l.kind, l.key FROM unit_leases l
                     JOIN unnest($3::TEXT[], $4::TEXT[], $5::BIGINT[]) AS r(kind, key, generation)
                       ON l.kind = r.kind AND l.key = r.key AND l.generation = r.generation
                     WHERE l.owner = $1
                     FOR NO KEY UPDATE OF l SKIP LOCKED)
                 UPDATE unit_leases l
                 SET expires_at = now() + $2::BIGINT * INTERVAL '1 millisecond'
                 FROM mine WHERE l.kind = mine.kind AND l.key = mine.key
                 RETURNING l.kind, l.key",
                &[&node, &ms, &kinds, &keys, &generations],
            )?;
            Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
        })?;
        let lease = |generation| Lease {
            generation,
            expires_in: left(ms),
        };
        Ok(held
            .iter()
            .map(|l| {
                if renewed.contains(&(l.kind.as_str().to_owned(), l.key.clone())) {
                    Ok(lease(l.generation))
                } else {
                    // Taken over, released, or locked by a write just now.
                    let set =
                        format!("expires_at = now() + {ms}::BIGINT * INTERVAL '1 millisecond'");
                    self.update_held(&set, l.kind, &l.key, node, l.generation)
                        .map(|()| lease(l.generation))
                }
            })
            .collect())
    }

    fn release(
        &self,
        kind: UnitKind,
        key: &str,
        node: &str,
        generation: u64,
    ) -> Result<(), StoreError> {
        self.update_held(
            "owner = NULL, expires_at = now()",
            kind,
            key,
            node,
            generation,
        )
    }

    fn hand_over(
        &self,
        kind: UnitKind,
        key: &str,
        node: &str,
        generation: u64,
    ) -> Result<(), StoreError> {
        self.update_held("expires_at = now()", kind, key, node, generation)
    }

    fn owned_by(&self, node: &str) -> Result<Vec<LeaseEntry>, StoreError> {
        let rows = self.leases.with(|c| {
            Ok(c.query(
                &format!(
                    "SELECT kind, key, owner, generation, {LEFT_MS} FROM unit_leases
                     WHERE owner = $1 ORDER BY kind, key"
                ),
                &[&node],
            )?)
        })?;
        Ok(entries(rows))
    }

    fn expired(&self) -> Result<Vec<LeaseEntry>, StoreError> {
        let rows = self.leases.with(|c| {
            Ok(c.query(
                &format!(
                    "SELECT kind, key, owner, generation, {LEFT_MS} FROM unit_leases
                     WHERE owner IS NOT NULL AND expires_at <= now()
                     ORDER BY expires_at, kind, key"
                ),
                &[],
            )?)
        })?;
        Ok(entries(rows))
    }
}

impl PgStore {
    /// Changes `node`'s lease `generation` of a unit (`set`: the columns
    /// changed; a renewal, a release, a hand-over), waiting for its row if
    /// a write holds it; fenced when it no longer holds that generation.
    fn update_held(
        &self,
        set: &str,
        kind: UnitKind,
        key: &str,
        node: &str,
        generation: u64,
    ) -> Result<(), StoreError> {
        self.leases.with(|c| {
            let n = c.execute(
                &format!(
                    "UPDATE unit_leases SET {set}
                     WHERE kind = $1 AND key = $2 AND owner = $3 AND generation = $4"
                ),
                &[&kind.as_str(), &key, &node, &(generation as i64)],
            )?;
            if n == 1 {
                return Ok(());
            }
            Err(lost(c, kind, key, generation))
        })
    }
}

/// The [`StoreError::Fenced`] of a renew or release that found its lease
/// gone, naming the generation it is at now (if anyone holds it).
fn lost(c: &mut ::postgres::Client, kind: UnitKind, key: &str, held: u64) -> StoreError {
    let current = c.query_opt(
        "SELECT generation FROM unit_leases WHERE kind = $1 AND key = $2 AND owner IS NOT NULL",
        &[&kind.as_str(), &key],
    );
    match current {
        Ok(row) => StoreError::Fenced {
            key: key.to_owned(),
            held,
            current: row.map(|r| r.get::<_, i64>(0) as u64),
        },
        Err(e) => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::DEFAULT_LEASE_TTL;
    use crate::sessions::{SessionStore, SessionWrite};
    use crate::{RelayStore, Unit, UnitStore};
    use hostwire_relay_records::{RoomChange, RoomRecord};

    const ROOM: UnitKind = UnitKind::RelayRoom;

    fn created(pin: &str) -> RoomChange {
        RoomChange::Created(RoomRecord {
            pin: pin.into(),
            host_token: "h".repeat(32),
            created_at_ms: 1_000,
            host_away_since_ms: None,
            open: true,
            players: vec![],
            kicked_tokens: vec![],
            bundle: None,
        })
    }

    fn close(pin: &str) -> RoomChange {
        RoomChange::Open {
            pin: pin.into(),
            open: false,
        }
    }

    fn is_open(s: &PgStore, pin: &str) -> bool {
        s.load_rooms()
            .unwrap()
            .into_iter()
            .find(|r| r.record.pin == pin)
            .unwrap()
            .record
            .open
    }

    /// Time passing past every lease, as the database's clock sees it:
    /// tests never wait for a lease's seconds.
    fn expire_all(url: &str) {
        let mut c = ::postgres::Client::connect(url, ::postgres::NoTls).unwrap();
        c.execute(
            "UPDATE unit_leases SET expires_at = now() - INTERVAL '1 second'
             WHERE owner IS NOT NULL",
            &[],
        )
        .unwrap();
    }

    fn held(pin: &str, generation: u64) -> LeaseRef {
        LeaseRef {
            kind: ROOM,
            key: pin.into(),
            generation,
        }
    }

    fn owned(a: Acquired) -> Lease {
        match a {
            Acquired::Owned(l) => l,
            Acquired::Held(h) => panic!("held: {h:?}"),
        }
    }

    /// Two handles as two nodes: A owns generation 1 and writes; its lease
    /// runs out; B takes the room at generation 2; A's late write and
    /// renewal are refused and change nothing, B's write lands.
    #[test]
    fn a_node_that_lost_its_lease_cannot_write_and_the_new_owner_can() {
        let Some(url) = crate::testing::fresh_database("lease_takeover") else {
            return;
        };
        let a = PgStore::connect(&url).unwrap();
        let b = PgStore::connect(&url).unwrap();
        let pin = "111111";

        let la = owned(a.acquire(ROOM, pin, "node-a", DEFAULT_LEASE_TTL).unwrap());
        assert_eq!(la.generation, 1);
        let create = [created(pin)];
        let r = a.apply_units(&[Unit::new(pin, &create).fenced(la.generation)]);
        assert!(r[0].is_ok(), "{r:?}");

        // A live lease is not B's to take, and says whose it is.
        match b.acquire(ROOM, pin, "node-b", DEFAULT_LEASE_TTL).unwrap() {
            Acquired::Held(h) => {
                assert_eq!((h.owner.as_str(), h.generation), ("node-a", 1));
                assert!(h.expires_in > Duration::ZERO && h.expires_in <= DEFAULT_LEASE_TTL);
            }
            other => panic!("B took a live lease: {other:?}"),
        }
        assert!(b.expired().unwrap().is_empty());

        expire_all(&url);
        let expired = b.expired().unwrap();
        assert_eq!(expired.len(), 1);
        assert_eq!(
            (
                expired[0].kind,
                expired[0].key.as_str(),
                expired[0].owner.as_str()
            ),
            (ROOM, pin, "node-a")
        );
        let lb = owned(b.acquire(ROOM, pin, "node-b", DEFAULT_LEASE_TTL).unwrap());
        assert_eq!(lb.generation, 2);

        let closing = [close(pin)];
        let r = a.apply_units(&[Unit::new(pin, &closing).fenced(la.generation)]);
        match &r[0] {
            Err(StoreError::Fenced { key, held, current }) => {
                assert_eq!((key.as_str(), *held, *current), (pin, 1, Some(2)));
                let msg = r[0].as_ref().unwrap_err().to_string();
                assert!(
                    msg.contains("generation 1") && msg.contains("generation 2"),
                    "{msg}"
                );
            }
            other => panic!("A's stale write: {other:?}"),
        }
        assert!(is_open(&b, pin), "A's refused write changed the room");

        match &a
            .renew_all("node-a", &[held(pin, la.generation)], DEFAULT_LEASE_TTL)
            .unwrap()[..]
        {
            [Err(StoreError::Fenced {
                held: 1,
                current: Some(2),
                ..
            })] => {}
            other => panic!("A renewed a lease B took: {other:?}"),
        }
        assert!(a.release(ROOM, pin, "node-a", la.generation).is_err());

        let r = b.apply_units(&[Unit::new(pin, &closing).fenced(lb.generation)]);
        assert!(r[0].is_ok(), "{r:?}");
        assert!(!is_open(&a, pin));

        assert!(a.owned_by("node-a").unwrap().is_empty());
        let mine = b.owned_by("node-b").unwrap();
        assert_eq!(mine.len(), 1);
        assert_eq!((mine[0].generation, mine[0].key.as_str()), (2, pin));
        let renewed = b
            .renew_all("node-b", &[held(pin, 2)], DEFAULT_LEASE_TTL)
            .unwrap();
        assert_eq!(renewed[0].as_ref().unwrap().generation, 2);
    }

    /// A release fences its own later writes, the row keeps its generation
    /// (a new owner is generation 2, never 1 again), and a released unit is
    /// no takeover candidate.
    #[test]
    fn a_released_lease_fences_its_writer_and_keeps_counting() {
        let Some(url) = crate::testing::fresh_database("lease_release") else {
            return;
        };
        let a = PgStore::connect(&url).unwrap();
        let pin = "222222";
        let create = [created(pin)];
        assert!(RelayStore::apply(&a, &create).is_ok());
        let la = owned(a.acquire(ROOM, pin, "node-a", DEFAULT_LEASE_TTL).unwrap());
        a.release(ROOM, pin, "node-a", la.generation).unwrap();
        assert!(a.expired().unwrap().is_empty());
        let closing = [close(pin)];
        let r = a.apply_units(&[Unit::new(pin, &closing).fenced(la.generation)]);
        assert!(
            matches!(r[0], Err(StoreError::Fenced { current: None, .. })),
            "{r:?}"
        );
        assert!(is_open(&a, pin));
        let again = owned(a.acquire(ROOM, pin, "node-b", DEFAULT_LEASE_TTL).unwrap());
        assert_eq!(again.generation, 2);
    }

    /// Many nodes acquiring one unit at once, round after round: each
    /// generation has exactly one owner, and every loser is told that owner.
    #[test]
    fn concurrent_acquires_give_one_owner_per_generation() {
        let Some(url) = crate::testing::fresh_database("lease_race") else {
            return;
        };
        const NODES: usize = 8;
        const ROUNDS: u64 = 6;
        let stores: Vec<PgStore> = (0..NODES)
            .map(|_| PgStore::connect(&url).unwrap())
            .collect();
        for round in 1..=ROUNDS {
            let start = std::sync::Barrier::new(NODES);
            let results: Vec<(String, Acquired)> = std::thread::scope(|s| {
                let running: Vec<_> = stores
                    .iter()
                    .enumerate()
                    .map(|(i, store)| {
                        let start = &start;
                        s.spawn(move || {
                            let node = format!("node-{i}");
                            start.wait();
                            let got = store.acquire(ROOM, "333333", &node, DEFAULT_LEASE_TTL);
                            (node, got.unwrap())
                        })
                    })
                    .collect();
                running.into_iter().map(|t| t.join().unwrap()).collect()
            });
            let winners: Vec<&String> = results
                .iter()
                .filter_map(|(n, a)| match a {
                    Acquired::Owned(l) => {
                        assert_eq!(l.generation, round, "{results:?}");
                        Some(n)
                    }
                    Acquired::Held(_) => None,
                })
                .collect();
            assert_eq!(winners.len(), 1, "round {round}: {results:?}");
            for (_, a) in &results {
                if let Acquired::Held(h) = a {
                    assert_eq!((&h.owner, h.generation), (winners[0], round), "{results:?}");
                }
            }
            expire_all(&url);
        }
    }

    /// Whether a hostwire connection comes to wait on a lock in a statement
    /// starting with `statement` before `done` says the call finished:
    /// polls the server's own view, never a clock.
    fn comes_to_wait(url: &str, statement: &str, done: &dyn Fn() -> bool) -> bool {
        let mut c = ::postgres::Client::connect(url, ::postgres::NoTls).unwrap();
        let pattern = format!("{statement}%");
        while !done() {
            let waiting: i64 = c
                .query_one(
                    "SELECT COUNT(*) FROM pg_stat_activity
                     WHERE application_name = 'hostwire' AND datname = current_database()
                       AND wait_event_type = 'Lock' AND query LIKE $1",
                    &[&pattern],
                )
                .unwrap()
                .get(0);
            if waiting > 0 {
                return true;
            }
            std::thread::yield_now();
        }
        false
    }

    /// A takeover waits for the old owner's fenced write already in
    /// flight (the lease row is locked until that write commits), so the
    /// new owner restores it: an acknowledged write is never lost to a
    /// takeover, even one of a lease that ran out while it was on its way.
    #[test]
    fn a_takeover_waits_for_the_old_owners_write_in_flight() {
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        let Some(url) = crate::testing::fresh_database("lease_in_flight") else {
            return;
        };
        let a = PgStore::connect(&url).unwrap();
        let b = PgStore::connect(&url).unwrap();
        let pin = "777777";
        RelayStore::apply(&a, &[created(pin)]).unwrap();
        let la = owned(a.acquire(ROOM, pin, "node-a", DEFAULT_LEASE_TTL).unwrap());
        expire_all(&url);

        // Another session holds the room's row: A's write passes its fence
        // (nobody took the unit yet), then waits here, mid-transaction.
        let mut blocker = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
        let mut held = blocker.transaction().unwrap();
        held.execute(
            "SELECT 1 FROM relay_rooms WHERE pin = $1 FOR UPDATE",
            &[&pin],
        )
        .unwrap();

        let (a_done, b_done) = (AtomicBool::new(false), AtomicBool::new(false));
        let closing = [close(pin)];
        let (a_waited, b_waited, written, taken) = std::thread::scope(|s| {
            let writing = s.spawn(|| {
                let r = a.apply_units(&[Unit::new(pin, &closing).fenced(la.generation)]);
                a_done.store(true, SeqCst);
                r
            });
            let a_waited = comes_to_wait(&url, "UPDATE relay_rooms", &|| a_done.load(SeqCst));
            let taking = s.spawn(|| {
                let r = b.acquire(ROOM, pin, "node-b", DEFAULT_LEASE_TTL);
                b_done.store(true, SeqCst);
                r
            });
            let b_waited = comes_to_wait(&url, "INSERT INTO unit_leases", &|| b_done.load(SeqCst));
            held.commit().unwrap();
            (
                a_waited,
                b_waited,
                writing.join().unwrap(),
                taking.join().unwrap(),
            )
        });
        assert!(a_waited, "A's write never waited for the held room row");
        assert!(
            b_waited,
            "B took the unit while A's write in flight had not committed"
        );
        assert!(written[0].is_ok(), "{written:?}");
        assert_eq!(owned(taken.unwrap()).generation, 2);
        assert!(!is_open(&b, pin), "the new owner does not see A's write");
    }

    /// A batch mixing a fenced-out unit and good ones commits the good ones
    /// only; a key's later unit after its fenced one is not tried; a lease
    /// of one kind is no fence for another kind's unit of the same key.
    #[test]
    fn a_fenced_out_unit_fails_alone_in_its_batch() {
        let Some(url) = crate::testing::fresh_database("lease_batch") else {
            return;
        };
        let a = PgStore::connect(&url).unwrap();
        let b = PgStore::connect(&url).unwrap();
        let (lost, kept) = ("444444", "555555");
        RelayStore::apply(&a, &[created(lost), created(kept)]).unwrap();
        let la_lost = owned(a.acquire(ROOM, lost, "node-a", DEFAULT_LEASE_TTL).unwrap());
        expire_all(&url);
        let la_kept = owned(a.acquire(ROOM, kept, "node-a", DEFAULT_LEASE_TTL).unwrap());
        assert_eq!(
            owned(b.acquire(ROOM, lost, "node-b", DEFAULT_LEASE_TTL).unwrap()).generation,
            2
        );

        let (close_lost, close_kept) = ([close(lost)], [close(kept)]);
        let away = [RoomChange::HostAway {
            pin: lost.into(),
            since_ms: Some(9),
        }];
        let r = a.apply_units(&[
            Unit::new(lost, &close_lost).fenced(la_lost.generation),
            Unit::new(kept, &close_kept).fenced(la_kept.generation),
            Unit::new(lost, &away).fenced(la_lost.generation),
        ]);
        assert!(matches!(r[0], Err(StoreError::Fenced { .. })), "{r:?}");
        assert!(r[1].is_ok(), "{r:?}");
        assert!(
            matches!(&r[2], Err(StoreError::EarlierFailed(k)) if k == lost),
            "{r:?}"
        );
        assert!(is_open(&a, lost), "the fenced unit changed its room");
        assert!(!is_open(&a, kept), "the good unit was not committed");

        // The relay room's lease does not cover a session with its key.
        let snapshot = [SessionWrite::Snapshot {
            session_id: kept.into(),
            snapshot: "{}".into(),
            game_time_ms: None,
        }];
        let r = UnitStore::<SessionWrite>::apply_units(
            &a,
            &[Unit::new(kept, &snapshot).fenced(la_kept.generation)],
        );
        assert!(
            matches!(r[0], Err(StoreError::Fenced { current: None, .. })),
            "{r:?}"
        );
        assert_eq!(a.load_snapshot(kept).unwrap(), None);
    }

    /// Seconds left on a lease, by the database's clock.
    fn left_s(url: &str, pin: &str) -> f64 {
        let mut c = ::postgres::Client::connect(url, ::postgres::NoTls).unwrap();
        c.query_one(
            "SELECT EXTRACT(EPOCH FROM (expires_at - now()))::FLOAT8 FROM unit_leases
             WHERE kind = $1 AND key = $2",
            &[&ROOM.as_str(), &pin],
        )
        .unwrap()
        .get(0)
    }

    /// Hundreds of leases renewed in one call: each answered in order,
    /// the one another node took over fenced, the rest extended (an
    /// expired one nobody took included), and only the caller's own.
    #[test]
    fn many_leases_are_renewed_in_one_call_and_a_lost_one_is_fenced() {
        let Some(url) = crate::testing::fresh_database("lease_renew_all") else {
            return;
        };
        let a = PgStore::connect(&url).unwrap();
        let b = PgStore::connect(&url).unwrap();
        let pins: Vec<String> = (0..300).map(|i| format!("{:06}", 100_000 + i)).collect();
        let mut mine: Vec<LeaseRef> = pins
            .iter()
            .map(|p| {
                held(
                    p,
                    owned(a.acquire(ROOM, p, "node-a", DEFAULT_LEASE_TTL).unwrap()).generation,
                )
            })
            .collect();
        expire_all(&url);
        // B takes one over; another node's lease is not A's to renew.
        let taken = owned(
            b.acquire(ROOM, &pins[7], "node-b", DEFAULT_LEASE_TTL)
                .unwrap(),
        );
        assert_eq!(taken.generation, 2);
        mine.push(held("999999", 1));

        let ttl = Duration::from_secs(60);
        let r = a.renew_all("node-a", &mine, ttl).unwrap();
        assert_eq!(r.len(), mine.len());
        for (i, (l, r)) in mine.iter().zip(&r).enumerate() {
            match (i, r) {
                (
                    7,
                    Err(StoreError::Fenced {
                        held: 1,
                        current: Some(2),
                        ..
                    }),
                ) => {}
                (
                    300,
                    Err(StoreError::Fenced {
                        held: 1,
                        current: None,
                        ..
                    }),
                ) => {}
                (7 | 300, other) => panic!("{}: {other:?}", l.key),
                (_, Ok(lease)) => assert_eq!(lease.generation, 1),
                (_, Err(e)) => panic!("{}: {e}", l.key),
            }
        }
        assert!(left_s(&url, &pins[0]) > 50.0, "not extended");
        assert!(left_s(&url, &pins[299]) > 50.0, "not extended");
        // B's lease is untouched (its own length, not A's minute).
        assert!(left_s(&url, &pins[7]) <= DEFAULT_LEASE_TTL.as_secs_f64());
        assert!(a.expired().unwrap().is_empty());
    }

    /// A unit's write holds its lease row (its fence) while it waits for
    /// a second unit's row, which the renewal covers too. The renewal
    /// leaves the held row for last and locks nothing meanwhile, so the
    /// write goes on at once (a renewal waiting with the second row
    /// locked would deadlock with it), and both leases are renewed once
    /// the write commits.
    #[test]
    fn a_renewal_never_waits_holding_rows_a_write_wants() {
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        let Some(url) = crate::testing::fresh_database("lease_renew_locks") else {
            return;
        };
        let a = PgStore::connect(&url).unwrap();
        let (first, second) = ("121212", "343434");
        let mine = [
            held(
                second,
                owned(
                    a.acquire(ROOM, second, "node-a", DEFAULT_LEASE_TTL)
                        .unwrap(),
                )
                .generation,
            ),
            held(
                first,
                owned(a.acquire(ROOM, first, "node-a", DEFAULT_LEASE_TTL).unwrap()).generation,
            ),
        ];
        let fence = "SELECT 1 FROM unit_leases WHERE kind = $1 AND key = $2 FOR SHARE";
        let mut writer = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
        writer
            .batch_execute("SET lock_timeout = '20s'; SET deadlock_timeout = '20s'")
            .unwrap();
        let mut w = writer.transaction().unwrap();
        w.execute(fence, &[&ROOM.as_str(), &first]).unwrap();

        let done = AtomicBool::new(false);
        let ttl = Duration::from_secs(60);
        let (waited, renewed) = std::thread::scope(|s| {
            let renewing = s.spawn(|| {
                let r = a.renew_all("node-a", &mine, ttl);
                done.store(true, SeqCst);
                r
            });
            // The renewal comes to wait for the first row alone ...
            let waited = comes_to_wait(&url, "", &|| done.load(SeqCst));
            // ... and holds no other: the write takes its second fence now.
            w.execute(fence, &[&ROOM.as_str(), &second]).unwrap();
            w.commit().unwrap();
            (waited, renewing.join().unwrap())
        });
        assert!(waited, "the renewal did not wait for the held row");
        let renewed = renewed.unwrap();
        assert!(renewed.iter().all(|r| r.is_ok()), "{renewed:?}");
        assert!(left_s(&url, first) > 50.0 && left_s(&url, second) > 50.0);
    }
}
