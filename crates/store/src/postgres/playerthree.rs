//! PlayerThree matches on PostgreSQL (see [`crate::playerthree`]).

use super::{ms, PgStore, Tx};
use crate::playerthree::{PlayerThreeStore, PlayerThreeWrite, StoredMatch, LOG_KINDS};
use crate::{StoreError, Unit, UnitResults, UnitStore};

impl PlayerThreeStore for PgStore {
    fn load_matches(&self) -> Result<Vec<StoredMatch>, StoreError> {
        self.read(|tx| {
            let mut matches: Vec<StoredMatch> = tx
                .query(
                    "SELECT id, game, operator_token, created_at_ms FROM playerthree_matches
                     ORDER BY created_at_ms, id",
                    &[],
                )?
                .iter()
                .map(|r| StoredMatch {
                    id: r.get(0),
                    game: r.get(1),
                    operator_token_hash: r.get(2),
                    created_at_ms: r.get::<_, i64>(3) as u64,
                    records: Vec::new(),
                })
                .collect();
            let records = tx.prepare(
                "SELECT body FROM playerthree_records WHERE match_id = $1 AND kind <> ALL($2) ORDER BY seq",
            )?;
            for m in &mut matches {
                m.records = tx
                    .query(&records, &[&m.id, &LOG_KINDS])?
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
            }
            Ok(matches)
        })
    }

    fn load_match(&self, id: &str) -> Result<Option<StoredMatch>, StoreError> {
        self.read(|tx| {
            let Some(r) = tx.query_opt(
                "SELECT id, game, operator_token, created_at_ms FROM playerthree_matches
                 WHERE id = $1",
                &[&id],
            )?
            else {
                return Ok(None);
            };
            let mut m = StoredMatch {
                id: r.get(0),
                game: r.get(1),
                operator_token_hash: r.get(2),
                created_at_ms: r.get::<_, i64>(3) as u64,
                records: Vec::new(),
            };
            m.records = tx
                .query(
                    "SELECT body FROM playerthree_records WHERE match_id = $1 AND kind <> ALL($2) ORDER BY seq",
                    &[&m.id, &LOG_KINDS],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            Ok(Some(m))
        })
    }

    fn match_of_token(&self, token_hash_hex: &str) -> Result<Option<String>, StoreError> {
        if !crate::playerthree::is_hash_hex(token_hash_hex) {
            return Ok(None);
        }
        self.read(|tx| {
            Ok(tx
                .query_opt(MATCH_OF_TOKEN_SQL, &[&token_hash_hex])?
                .map(|r| r.get(0)))
        })
    }

    fn apply_playerthree(&self, writes: &[PlayerThreeWrite]) -> Result<(), StoreError> {
        self.apply_all(writes, apply_playerthree)
    }
}

/// Which match minted a token, by its hash: one lookup in
/// `playerthree_records_by_token` (schema version 3).
pub(crate) const MATCH_OF_TOKEN_SQL: &str = "SELECT match_id FROM playerthree_records
     WHERE kind = 'token' AND (body::jsonb ->> 'tokenHash') = $1 LIMIT 1";

impl UnitStore<PlayerThreeWrite> for PgStore {
    fn apply_units(&self, units: &[Unit<'_, PlayerThreeWrite>]) -> UnitResults {
        self.apply_units_with(
            crate::lease::UnitKind::PlayerThreeMatch,
            units,
            apply_playerthree,
        )
    }
}

fn apply_playerthree(tx: &mut Tx<'_, '_>, w: &PlayerThreeWrite) -> Result<(), StoreError> {
    match w {
        PlayerThreeWrite::Match {
            id,
            game,
            operator_token_hash,
            created_at_ms,
        } => {
            tx.execute(
                "INSERT INTO playerthree_matches (id, game, operator_token, created_at_ms) VALUES ($1, $2, $3, $4)
                 ON CONFLICT DO NOTHING",
                &[id, game, operator_token_hash, &ms(*created_at_ms)],
            )?;
        }
        PlayerThreeWrite::RemoveMatch { id } => {
            tx.execute("DELETE FROM playerthree_records WHERE match_id = $1", &[id])?;
            tx.execute("DELETE FROM playerthree_matches WHERE id = $1", &[id])?;
        }
        PlayerThreeWrite::Record {
            match_id,
            kind,
            tick,
            slot,
            keep,
            body,
        } => {
            if let Some(slot) = slot {
                // The slot's newest `keep - 1` stay beside this one.
                tx.execute(
                    "DELETE FROM playerthree_records WHERE match_id = $1 AND slot = $2 AND seq NOT IN
                     (SELECT seq FROM playerthree_records WHERE match_id = $1 AND slot = $2
                      ORDER BY seq DESC LIMIT $3)",
                    &[match_id, slot, &i64::from(keep.saturating_sub(1))],
                )?;
            }
            tx.execute(
                "INSERT INTO playerthree_records (match_id, kind, tick, slot, body) VALUES ($1, $2, $3, $4, $5)",
                &[match_id, kind, &tick.map(ms), slot, body],
            )?;
        }
    }
    Ok(())
}
