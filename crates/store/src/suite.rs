//! One store suite, two backends: every test here runs on SQLite (a file
//! in a temporary directory) and on PostgreSQL (a fresh database of a
//! real server, [`crate::testing`]), the failure cases included.

use crate::ggui::{GguiChange, GguiStore, GguiStoredSession};
use crate::playerthree::{PlayerThreeStore, PlayerThreeWrite};
use crate::postgres::PgStore;
use crate::sessions::{SessionStore, SessionWrite};
use crate::{RelayStore, SqliteStore, StoreError, StoredBundle, Unit, UnitStore};
use bytes::Bytes;
use hostwire_relay_records::{BundleMeta, PlayerRecord, RoomChange, RoomRecord};

/// A database one test owns, and the ways a test reaches into it.
trait Backend: Sized {
    type Store: RelayStore + SessionStore + GguiStore + PlayerThreeStore;
    /// A new, empty database (`None`: this backend cannot be had here).
    fn fresh(test: &str) -> Option<Self>;
    /// The store on it, as a server (re)starting opens it.
    fn try_open(&self) -> Result<Self::Store, StoreError>;
    fn open(&self) -> Self::Store {
        self.try_open().unwrap()
    }
    /// The first column of each row of `sql`, which must be text.
    fn texts(&self, sql: &str) -> Vec<String>;
    /// The database's plan of `sql` run with the one parameter `param`,
    /// as text (sequential scans made dear where the backend allows it, so
    /// that an index that can serve is used even on a small table).
    fn plan(&self, sql: &str, param: &str) -> String;
    /// Every write of the room `pin` fails inside the database, as a full
    /// disk or a lost connection would fail it.
    fn fail_writes_of_room(&self, pin: &str);
    /// Marks the schema as written by a hostwire of version `v`.
    fn set_schema_version(&self, v: i64);
    /// The schema version this hostwire writes on this backend.
    const KNOWN: i64;
    const NAME: &'static str;
}

struct Sqlite {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl Backend for Sqlite {
    type Store = SqliteStore;
    const KNOWN: i64 = crate::SQLITE_SCHEMA_VERSION;
    const NAME: &'static str = "SQLite";

    fn fresh(_: &str) -> Option<Self> {
        let dir = tempfile::Builder::new()
            .prefix("hostwire-store-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("hostwire.db");
        Some(Sqlite { _dir: dir, path })
    }

    fn try_open(&self) -> Result<SqliteStore, StoreError> {
        SqliteStore::open(&self.path)
    }

    fn texts(&self, sql: &str) -> Vec<String> {
        let c = rusqlite::Connection::open(&self.path).unwrap();
        let mut st = c.prepare(sql).unwrap();
        st.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn plan(&self, sql: &str, param: &str) -> String {
        let c = rusqlite::Connection::open(&self.path).unwrap();
        let mut st = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows: Vec<String> = st
            .query_map([param], |r| r.get(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        rows.join("\n")
    }

    fn fail_writes_of_room(&self, pin: &str) {
        let c = rusqlite::Connection::open(&self.path).unwrap();
        for (name, event, table) in [
            ("u", "UPDATE", "relay_rooms"),
            ("d", "DELETE", "relay_rooms"),
            ("p", "INSERT", "relay_players"),
            ("k", "INSERT", "relay_kicked"),
        ] {
            c.execute_batch(&format!(
                "CREATE TRIGGER fail_{name}_{pin} BEFORE {event} ON {table}
                 WHEN {row}.pin = '{pin}' BEGIN SELECT RAISE(ABORT, 'injected'); END;",
                row = if event == "DELETE" { "OLD" } else { "NEW" },
            ))
            .unwrap();
        }
    }

    fn set_schema_version(&self, v: i64) {
        let c = rusqlite::Connection::open(&self.path).unwrap();
        c.pragma_update(None, "user_version", v).unwrap();
    }
}

struct Postgres {
    url: String,
}

impl Postgres {
    fn client(&self) -> ::postgres::Client {
        ::postgres::Client::connect(&self.url, ::postgres::NoTls).unwrap()
    }
}

impl Backend for Postgres {
    type Store = PgStore;
    const KNOWN: i64 = crate::postgres::PG_SCHEMA_VERSION;
    const NAME: &'static str = "PostgreSQL";

    fn fresh(test: &str) -> Option<Self> {
        crate::testing::fresh_database(test).map(|url| Postgres { url })
    }

    fn try_open(&self) -> Result<PgStore, StoreError> {
        PgStore::connect(&self.url)
    }

    fn texts(&self, sql: &str) -> Vec<String> {
        self.client()
            .query(sql, &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    fn plan(&self, sql: &str, param: &str) -> String {
        let mut c = self.client();
        c.batch_execute("SET enable_seqscan = off").unwrap();
        let rows = c.query(&format!("EXPLAIN {sql}"), &[&param]).unwrap();
        rows.iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn fail_writes_of_room(&self, pin: &str) {
        let mut c = self.client();
        c.batch_execute(
            "CREATE OR REPLACE FUNCTION hostwire_injected() RETURNS trigger LANGUAGE plpgsql
             AS $$ BEGIN RAISE EXCEPTION 'injected'; END $$;",
        )
        .unwrap();
        for (name, event, table) in [
            ("u", "UPDATE", "relay_rooms"),
            ("d", "DELETE", "relay_rooms"),
            ("p", "INSERT", "relay_players"),
            ("k", "INSERT", "relay_kicked"),
        ] {
            c.batch_execute(&format!(
                "CREATE TRIGGER fail_{name}_{pin} BEFORE {event} ON {table} FOR EACH ROW
                 WHEN ({row}.pin = '{pin}') EXECUTE FUNCTION hostwire_injected();",
                row = if event == "DELETE" { "OLD" } else { "NEW" },
            ))
            .unwrap();
        }
    }

    fn set_schema_version(&self, v: i64) {
        self.client()
            .execute("INSERT INTO hostwire_schema (version) VALUES ($1)", &[&v])
            .unwrap();
    }
}

/// Each test below, once per backend.
macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $name() {
                if let Some(b) = <super::Sqlite as super::Backend>::fresh(stringify!($name)) {
                    super::$name(b)
                }
            })*
        }
        mod postgres {
            $(#[test]
            fn $name() {
                if let Some(b) = <super::Postgres as super::Backend>::fresh(stringify!($name)) {
                    super::$name(b)
                }
            })*
        }
    };
}

suite!(
    every_change_survives_reopening,
    one_room_is_loaded_as_all_rooms_have_it,
    a_room_created_again_under_its_pin_starts_anew,
    a_failed_batch_changes_nothing,
    one_rooms_failed_unit_leaves_the_others_of_the_batch_durable,
    a_failed_unit_of_each_protocol_changes_nothing,
    a_schema_newer_than_known_is_refused_naming_both_versions,
    reopening_keeps_the_schema_version,
    session_writes_are_read_back_and_a_discarded_snapshot_is_gone,
    a_player_keeps_its_first_token_and_assets_are_read_back,
    a_removed_session_leaves_its_learners_data,
    a_ggui_session_comes_back_with_its_ledger_stream_and_counters,
    ggui_counters_never_go_back_and_rows_without_a_record_are_not_loaded,
    a_ggui_ledgers_last_sequence_survives_its_entries_and_their_trim,
    matches_come_back_with_their_records_in_order,
    one_match_is_loaded_as_all_matches_have_it_and_found_by_its_tokens_hash,
    a_record_of_no_match_fails_the_whole_batch,
    a_removed_match_leaves_no_row,
    a_record_with_a_slot_replaces_the_one_before_it,
    a_slot_keeps_its_newest_records_and_log_kinds_are_not_loaded,
);

// The relay.

fn room(pin: &str) -> RoomRecord {
    RoomRecord {
        pin: pin.into(),
        host_token: "h".repeat(32),
        created_at_ms: 1_000,
        host_away_since_ms: Some(1_000),
        open: true,
        players: vec![],
        kicked_tokens: vec![],
        bundle: None,
    }
}

fn player(id: &str, name: &str) -> PlayerRecord {
    PlayerRecord {
        id: id.into(),
        name: name.into(),
        token: format!("{id:_<32}"),
    }
}

fn every_change_survives_reopening<B: Backend>(b: B) {
    {
        let s = b.open();
        s.apply(&[
            RoomChange::Created(room("111111")),
            RoomChange::Created(room("222222")),
        ])
        .unwrap();
        s.apply(&[
            RoomChange::Player {
                pin: "111111".into(),
                player: player("p-a", "Ann"),
            },
            RoomChange::Player {
                pin: "111111".into(),
                player: player("p-b", "Bob"),
            },
            RoomChange::Player {
                pin: "111111".into(),
                player: player("p-c", "Cyd"),
            },
            RoomChange::Player {
                pin: "111111".into(),
                player: player("p-a", "Anna"),
            },
            RoomChange::Kicked {
                pin: "111111".into(),
                player_id: "p-b".into(),
                token: player("p-b", "").token,
            },
            RoomChange::Open {
                pin: "111111".into(),
                open: false,
            },
            RoomChange::HostAway {
                pin: "111111".into(),
                since_ms: None,
            },
            RoomChange::Bundle {
                pin: "111111".into(),
                meta: BundleMeta {
                    version: 2,
                    app_name: Some("Quiz".into()),
                },
                text: Bytes::from_static(b"{\"pluginHtml\":\"x\",\"set\":{}}"),
            },
            RoomChange::Deleted {
                pin: "222222".into(),
            },
        ])
        .unwrap();
    }
    let s = b.open();
    let rooms = s.load_rooms().unwrap();
    assert_eq!(rooms.len(), 1);
    let r = &rooms[0].record;
    assert_eq!(r.pin, "111111");
    assert_eq!(r.host_token, "h".repeat(32));
    assert!(!r.open);
    assert_eq!(r.host_away_since_ms, None);
    let names: Vec<&str> = r.players.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        vec!["Anna", "Cyd"],
        "join order kept, renames applied, kicked removed"
    );
    assert_eq!(r.kicked_tokens, vec![player("p-b", "").token]);
    assert_eq!(
        r.bundle,
        Some(BundleMeta {
            version: 2,
            app_name: Some("Quiz".into())
        })
    );
    assert_eq!(
        s.load_bundle("111111").unwrap(),
        Some(StoredBundle {
            version: 2,
            text: b"{\"pluginHtml\":\"x\",\"set\":{}}".to_vec()
        })
    );
    assert_eq!(s.load_bundle("222222").unwrap(), None);
}

fn one_room_is_loaded_as_all_rooms_have_it<B: Backend>(b: B) {
    let s = b.open();
    s.apply(&[
        RoomChange::Created(room("111111")),
        RoomChange::Created(room("222222")),
        RoomChange::Player {
            pin: "222222".into(),
            player: player("p-a", "Ann"),
        },
        RoomChange::Kicked {
            pin: "222222".into(),
            player_id: "p-a".into(),
            token: player("p-a", "").token,
        },
        RoomChange::Player {
            pin: "222222".into(),
            player: player("p-b", "Bob"),
        },
    ])
    .unwrap();
    let all = s.load_rooms().unwrap();
    let one = s.load_room("222222").unwrap().expect("stored");
    assert_eq!(Some(&one), all.iter().find(|r| r.record.pin == "222222"));
    assert_eq!(one.record.players.len(), 1);
    assert_eq!(one.record.kicked_tokens.len(), 1);
    assert_eq!(s.load_room("333333").unwrap(), None);
}

fn a_room_created_again_under_its_pin_starts_anew<B: Backend>(b: B) {
    let s = b.open();
    s.apply(&[
        RoomChange::Created(room("666666")),
        RoomChange::Player {
            pin: "666666".into(),
            player: player("p-a", "Ann"),
        },
        RoomChange::Bundle {
            pin: "666666".into(),
            meta: BundleMeta {
                version: 1,
                app_name: None,
            },
            text: Bytes::from_static(b"{}"),
        },
    ])
    .unwrap();
    let mut again = room("666666");
    again.host_token = "g".repeat(32);
    s.apply(&[RoomChange::Created(again)]).unwrap();
    let rooms = s.load_rooms().unwrap();
    assert_eq!(rooms.len(), 1);
    let r = &rooms[0].record;
    assert_eq!(r.host_token, "g".repeat(32));
    assert!(r.players.is_empty() && r.bundle.is_none(), "{r:?}");
    assert_eq!(s.load_bundle("666666").unwrap(), None);
}

fn a_failed_batch_changes_nothing<B: Backend>(b: B) {
    let s = b.open();
    s.apply(&[RoomChange::Created(room("333333"))]).unwrap();
    // A player of a room that does not exist violates the foreign key.
    let bad = s.apply(&[
        RoomChange::Open {
            pin: "333333".into(),
            open: false,
        },
        RoomChange::Player {
            pin: "999999".into(),
            player: player("p-x", "X"),
        },
    ]);
    assert!(bad.is_err());
    let rooms = s.load_rooms().unwrap();
    assert_eq!(rooms.len(), 1);
    assert!(rooms[0].record.open, "the batch was rolled back");
}

fn one_rooms_failed_unit_leaves_the_others_of_the_batch_durable<B: Backend>(b: B) {
    let s = b.open();
    s.apply(&[
        RoomChange::Created(room("111111")),
        RoomChange::Created(room("222222")),
    ])
    .unwrap();
    b.fail_writes_of_room("222222");
    let open = |pin: &str, open| RoomChange::Open {
        pin: pin.into(),
        open,
    };
    let kick = RoomChange::Kicked {
        pin: "111111".into(),
        player_id: "p-a".into(),
        token: "t".repeat(32),
    };
    let units: Vec<Vec<RoomChange>> = vec![
        vec![open("111111", false)],
        vec![open("222222", false)],
        // After the failed one of its room: not tried.
        vec![RoomChange::HostAway {
            pin: "222222".into(),
            since_ms: None,
        }],
        vec![kick],
    ];
    let refs: Vec<Unit<'_, RoomChange>> = units
        .iter()
        .map(|u| Unit {
            key: u[0].pin(),
            writes: u,
            fence: None,
        })
        .collect();
    let r = s.apply_units(&refs);
    assert!(r[0].is_ok() && r[3].is_ok(), "{r:?}");
    assert!(
        matches!(r[1], Err(StoreError::Sqlite(_) | StoreError::Postgres(_))),
        "{r:?}"
    );
    assert!(
        matches!(&r[2], Err(StoreError::EarlierFailed(p)) if p == "222222"),
        "{r:?}"
    );
    drop(s);
    let rooms = b.open().load_rooms().unwrap();
    let by_pin = |p: &str| {
        rooms
            .iter()
            .find(|r| r.record.pin == p)
            .unwrap()
            .record
            .clone()
    };
    assert!(!by_pin("111111").open);
    assert_eq!(by_pin("111111").kicked_tokens, vec!["t".repeat(32)]);
    assert!(by_pin("222222").open, "the failed unit was rolled back");
    assert_eq!(by_pin("222222").host_away_since_ms, Some(1_000));
}

/// A unit of each of the other protocols that fails inside the database
/// (a record of no match; a bad unit after a good one of the same batch)
/// leaves nothing of itself, and the batch's other units are kept.
fn a_failed_unit_of_each_protocol_changes_nothing<B: Backend>(b: B) {
    let s = b.open();
    let m1 = PlayerThreeWrite::Match {
        id: "m1".into(),
        game: "ridge".into(),
        operator_token_hash: "op".into(),
        created_at_ms: 5,
    };
    let good = [m1, record("m1", "config", "{}")];
    let bad = [
        PlayerThreeWrite::Match {
            id: "m2".into(),
            game: "ridge".into(),
            operator_token_hash: "op".into(),
            created_at_ms: 6,
        },
        record("no-such-match", "config", "{}"),
    ];
    let r = s.apply_units(&[
        Unit {
            key: "m2",
            writes: &bad,
            fence: None,
        },
        Unit {
            key: "m1",
            writes: &good,
            fence: None,
        },
        Unit {
            key: "m2",
            writes: &[record("m2", "state", "{}")],
            fence: None,
        },
    ]);
    assert!(r[0].is_err() && r[1].is_ok(), "{r:?}");
    assert!(matches!(&r[2], Err(StoreError::EarlierFailed(k)) if k == "m2"));
    let ids: Vec<String> = s
        .load_matches()
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(ids, vec!["m1"], "m2's match row went with its unit");

    // Sessions: the whole of a failed batch is rolled back, the unit of
    // another session in the same call is kept.
    let snapshot = |id: &str| SessionWrite::Snapshot {
        session_id: id.into(),
        snapshot: "{}".into(),
        game_time_ms: None,
    };
    b.fail_writes_of_room("444444");
    let relay_bad = [
        RoomChange::Created(room("444444")),
        RoomChange::Open {
            pin: "444444".into(),
            open: false,
        },
    ];
    assert!(RelayStore::apply(&s, &relay_bad).is_err());
    assert!(
        s.load_rooms().unwrap().is_empty(),
        "the created room went too"
    );
    let r = UnitStore::<SessionWrite>::apply_units(
        &s,
        &[Unit {
            key: "s1",
            writes: &[snapshot("s1")],
            fence: None,
        }],
    );
    assert!(r[0].is_ok());
    assert_eq!(s.load_snapshot("s1").unwrap().as_deref(), Some("{}"));
}

// Schema versions.

fn a_schema_newer_than_known_is_refused_naming_both_versions<B: Backend>(b: B) {
    drop(b.open());
    b.set_schema_version(B::KNOWN + 98);
    let err = match b.try_open() {
        Ok(_) => panic!("a {} schema newer than known was opened", B::NAME),
        Err(e) => e,
    };
    let StoreError::SchemaTooNew {
        database,
        found,
        known,
    } = err
    else {
        panic!("{err:?}")
    };
    assert_eq!((database, found, known), (B::NAME, B::KNOWN + 98, B::KNOWN));
    let text = err_text(database, found, known);
    assert!(
        text.contains(&format!("version {}", B::KNOWN + 98))
            && text.contains(&format!("version {}", B::KNOWN)),
        "{text}"
    );
}

fn err_text(database: &'static str, found: i64, known: i64) -> String {
    StoreError::SchemaTooNew {
        database,
        found,
        known,
    }
    .to_string()
}

fn reopening_keeps_the_schema_version<B: Backend>(b: B) {
    let s = b.open();
    s.apply(&[RoomChange::Created(room("555555"))]).unwrap();
    drop(s);
    // Opened again (another node, a restart): nothing applied twice.
    let s = b.open();
    assert_eq!(s.load_rooms().unwrap().len(), 1);
    let (version, expected) = if B::NAME == "SQLite" {
        (
            b.texts("SELECT CAST(user_version AS TEXT) FROM pragma_user_version"),
            B::KNOWN.to_string(),
        )
    } else {
        // One row per version applied, each once.
        (
            b.texts("SELECT string_agg(version::TEXT, ',' ORDER BY version) FROM hostwire_schema"),
            (1..=B::KNOWN)
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(","),
        )
    };
    assert_eq!(version, vec![expected]);
}

// Hosted sessions.

fn session_writes_are_read_back_and_a_discarded_snapshot_is_gone<B: Backend>(b: B) {
    let s = b.open();
    s.apply_sessions(&[
        SessionWrite::Snapshot {
            session_id: "s".into(),
            snapshot: "{\"a\":1}".into(),
            game_time_ms: Some(1500),
        },
        SessionWrite::PluginData {
            user: "u".into(),
            plugin_id: "p".into(),
            scope: "set".into(),
            set_id: "set-1".into(),
            value: "[1]".into(),
        },
        SessionWrite::Answer {
            session_id: "s".into(),
            user: "u".into(),
            set_id: "set-1".into(),
            item_id: "q1".into(),
            body: "{}".into(),
            progress: Some("{\"bucket\":1}".into()),
        },
    ])
    .unwrap();
    assert_eq!(s.load_snapshot("s").unwrap().as_deref(), Some("{\"a\":1}"));
    assert_eq!(
        s.load_snapshot_at("s").unwrap(),
        Some(("{\"a\":1}".to_owned(), Some(1500)))
    );
    let d = s.load_plugin_data("u", "p", "set-1").unwrap();
    assert_eq!(d.set.as_deref(), Some("[1]"));
    assert_eq!(d.plugin, None);
    assert_eq!(s.load_plugin_data("u", "p", "set-2").unwrap().set, None);
    assert_eq!(
        s.load_progress("u", "set-1").unwrap(),
        vec![("q1".to_owned(), "{\"bucket\":1}".to_owned())]
    );
    assert_eq!(s.count_answers("s").unwrap(), 1);
    s.apply_sessions(&[SessionWrite::SnapshotDiscarded {
        session_id: "s".into(),
    }])
    .unwrap();
    assert_eq!(s.load_snapshot("s").unwrap(), None);
}

fn a_player_keeps_its_first_token_and_assets_are_read_back<B: Backend>(b: B) {
    let s = b.open();
    let token = |t: &str| SessionWrite::PlayerToken {
        session_id: "s".into(),
        player_id: "p1".into(),
        token: t.into(),
    };
    s.apply_sessions(&[token("first")]).unwrap();
    s.apply_sessions(&[token("second")]).unwrap();
    assert_eq!(
        s.load_player_tokens("s").unwrap(),
        vec![("p1".to_owned(), "first".to_owned())]
    );
    s.apply_sessions(&[SessionWrite::Asset {
        session_id: "s".into(),
        file: "assets/a.png".into(),
        bytes: vec![0, 1, 2, 255],
    }])
    .unwrap();
    assert_eq!(
        s.list_assets("s").unwrap(),
        vec![("assets/a.png".to_owned(), 4)]
    );
    assert_eq!(
        s.load_asset("s", "assets/a.png").unwrap(),
        Some(vec![0, 1, 2, 255])
    );
    assert_eq!(s.load_asset("s", "nope").unwrap(), None);
    assert!(s.load_player_tokens("other").unwrap().is_empty());
}

fn a_removed_session_leaves_its_learners_data<B: Backend>(b: B) {
    let s = b.open();
    let session = |id: &str, at| {
        SessionWrite::Session(crate::sessions::StoredSession {
            id: id.into(),
            host_token: format!("host-{id}"),
            created_at_ms: at,
            spec: "{}".into(),
        })
    };
    s.apply_sessions(&[
        session("b", 2),
        session("a", 1),
        SessionWrite::State {
            session_id: "a".into(),
            state: "{\"phase\":\"lobby\"}".into(),
        },
        SessionWrite::Result {
            session_id: "a".into(),
            result: "{\"won\":true}".into(),
            at_ms: 9,
        },
        SessionWrite::Recording {
            session_id: "a".into(),
            body: "[1]".into(),
            at_ms: 9,
        },
        SessionWrite::RecordingEntries {
            session_id: "a".into(),
            first_seq: 0,
            entries: vec!["{\"e\":0}".into(), "{\"e\":1}".into()],
        },
        SessionWrite::SavedGame {
            session_id: "a".into(),
            body: "{\"s\":1}".into(),
        },
        SessionWrite::PluginData {
            user: "u".into(),
            plugin_id: "p".into(),
            scope: "plugin".into(),
            set_id: String::new(),
            value: "7".into(),
        },
    ])
    .unwrap();
    assert_eq!(
        s.list_session_ids().unwrap(),
        vec!["b", "a"],
        "creation order"
    );
    let a = s.load_session("a").unwrap().unwrap();
    assert_eq!((a.host_token.as_str(), a.created_at_ms), ("host-a", 1));
    assert_eq!(
        s.load_result("a").unwrap().as_deref(),
        Some("{\"won\":true}")
    );
    // A batch appended, and one written again from the same entry (after
    // a refused write) replaces its row.
    for (first_seq, entries) in [(2, vec!["{}"]), (2, vec!["{\"e\":2}", "{\"e\":3}"])] {
        s.apply_sessions(&[SessionWrite::RecordingEntries {
            session_id: "a".into(),
            first_seq,
            entries: entries.into_iter().map(String::from).collect(),
        }])
        .unwrap();
    }
    let rec = s.load_recording("a").unwrap().unwrap();
    assert_eq!(rec.head.as_deref(), Some("[1]"));
    let batches: Vec<(u64, u64, &str)> = rec
        .batches
        .iter()
        .map(|b| (b.first_seq, b.count, b.entries.as_str()))
        .collect();
    assert_eq!(
        batches,
        [(0, 2, "{\"e\":0},{\"e\":1}"), (2, 2, "{\"e\":2},{\"e\":3}")]
    );
    assert_eq!(s.load_recording("b").unwrap(), None);
    assert_eq!(
        s.load_saved_game("a").unwrap().as_deref(),
        Some("{\"s\":1}")
    );
    s.apply_sessions(&[SessionWrite::Removed {
        session_id: "a".into(),
    }])
    .unwrap();
    assert_eq!(s.load_session("a").unwrap(), None);
    assert_eq!(s.load_state("a").unwrap(), None);
    assert_eq!(s.load_result("a").unwrap(), None);
    assert_eq!(s.load_recording("a").unwrap(), None);
    assert_eq!(s.load_saved_game("a").unwrap(), None);
    assert_eq!(s.list_session_ids().unwrap(), vec!["b"]);
    assert_eq!(
        s.load_plugin_data("u", "p", "x").unwrap().plugin.as_deref(),
        Some("7"),
        "plugin data is the learner's"
    );
}

// ggui.

fn id() -> String {
    "s1".to_owned()
}

fn a_ggui_session_comes_back_with_its_ledger_stream_and_counters<B: Backend>(b: B) {
    let store = b.open();
    store
        .ggui_apply(&[
            GguiChange::PutSession {
                session_id: id(),
                record: "{\"a\":1}".into(),
            },
            GguiChange::PutLedger {
                session_id: id(),
                seq: 1,
                event: "e1".into(),
            },
            GguiChange::PutLedger {
                session_id: id(),
                seq: 2,
                event: "e2".into(),
            },
            GguiChange::TrimLedger {
                session_id: id(),
                horizon: 1,
            },
            GguiChange::PutStream {
                session_id: id(),
                seq: 1,
                entry: "x1".into(),
            },
            GguiChange::PutStream {
                session_id: id(),
                seq: 2,
                entry: "x2".into(),
            },
            GguiChange::DropStream {
                session_id: id(),
                seqs: vec![1],
            },
            GguiChange::StreamSeq {
                session_id: id(),
                seq: 5,
            },
            GguiChange::Drained {
                session_id: id(),
                up_to: 2,
            },
            GguiChange::HostContext {
                session_id: id(),
                host_context: "{\"theme\":\"dark\"}".into(),
            },
        ])
        .unwrap();
    drop(store);
    let store = b.open();
    assert_eq!(
        store.ggui_load().unwrap()[0].host_context.as_deref(),
        Some("{\"theme\":\"dark\"}")
    );
    store
        .ggui_apply(&[GguiChange::PutSession {
            session_id: id(),
            record: "{\"a\":2}".into(),
        }])
        .unwrap();
    assert_eq!(
        store.ggui_load().unwrap(),
        vec![GguiStoredSession {
            session_id: id(),
            record: "{\"a\":2}".into(),
            host_context: None,
            ledger: vec!["e2".into()],
            ledger_last: 2,
            stream: vec!["x2".into()],
            stream_seq: 5,
            drained_up_to: 2,
        }]
    );
    store
        .ggui_apply(&[GguiChange::RemoveSession { session_id: id() }])
        .unwrap();
    assert!(store.ggui_load().unwrap().is_empty());
}

fn a_ggui_ledgers_last_sequence_survives_its_entries_and_their_trim<B: Backend>(b: B) {
    let store = b.open();
    let put = |seq: u64| GguiChange::PutLedger {
        session_id: id(),
        seq,
        event: format!("e{seq}"),
    };
    let session = GguiChange::PutSession {
        session_id: id(),
        record: "{}".into(),
    };
    store
        .ggui_apply(&[session, put(1), put(2), put(3)])
        .unwrap();
    let last = |store: &B::Store| store.ggui_load().unwrap()[0].ledger_last;
    // Entries written one by one: the last of them.
    assert_eq!(last(&store), 3);
    // Every entry trimmed: the last one trimmed, not 0.
    let trim = |horizon| GguiChange::TrimLedger {
        session_id: id(),
        horizon,
    };
    store.ggui_apply(&[trim(3)]).unwrap();
    drop(store);
    let store = b.open();
    assert!(store.ggui_load().unwrap()[0].ledger.is_empty());
    assert_eq!(last(&store), 3);
    // A trim past the entries does not raise it past the last written.
    store.ggui_apply(&[put(4), trim(10)]).unwrap();
    assert_eq!(last(&store), 4);
    store.ggui_apply(&[put(5), put(6), trim(5)]).unwrap();
    assert_eq!(last(&store), 6);
    assert_eq!(store.ggui_load().unwrap()[0].ledger, vec!["e6".to_owned()]);
}

fn ggui_counters_never_go_back_and_rows_without_a_record_are_not_loaded<B: Backend>(b: B) {
    let store = b.open();
    store
        .ggui_apply(&[
            GguiChange::StreamSeq {
                session_id: "orphan".into(),
                seq: 3,
            },
            GguiChange::PutSession {
                session_id: id(),
                record: "{}".into(),
            },
            GguiChange::StreamSeq {
                session_id: id(),
                seq: 9,
            },
            GguiChange::StreamSeq {
                session_id: id(),
                seq: 4,
            },
        ])
        .unwrap();
    let loaded = store.ggui_load().unwrap();
    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0].stream_seq, 9);
    // One session read alone is what the whole load has of it.
    assert_eq!(
        store.ggui_load_session(&id()).unwrap().as_ref(),
        Some(&loaded[0])
    );
    assert_eq!(store.ggui_load_session("orphan").unwrap(), None);
    assert_eq!(store.ggui_load_session("nobody").unwrap(), None);
}

// PlayerThree.

fn record(m: &str, kind: &str, body: &str) -> PlayerThreeWrite {
    PlayerThreeWrite::Record {
        match_id: m.into(),
        kind: kind.into(),
        tick: None,
        slot: None,
        keep: 0,
        body: body.into(),
    }
}

fn new_match(id: &str) -> PlayerThreeWrite {
    PlayerThreeWrite::Match {
        id: id.into(),
        game: "ridge".into(),
        operator_token_hash: "op".into(),
        created_at_ms: 5,
    }
}

fn matches_come_back_with_their_records_in_order<B: Backend>(b: B) {
    {
        let s = b.open();
        s.apply_playerthree(&[
            new_match("m1"),
            record("m1", "config", "{\"a\":1}"),
            record("m1", "token", "{\"b\":2}"),
        ])
        .unwrap();
        s.apply_playerthree(&[record("m1", "state", "{\"c\":3}")])
            .unwrap();
    }
    let s = b.open();
    let loaded = s.load_matches().unwrap();
    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0].game, "ridge");
    assert_eq!(loaded[0].operator_token_hash, "op");
    assert_eq!(loaded[0].created_at_ms, 5);
    assert_eq!(
        loaded[0].records,
        vec!["{\"a\":1}", "{\"b\":2}", "{\"c\":3}"]
    );
}

fn one_match_is_loaded_as_all_matches_have_it_and_found_by_its_tokens_hash<B: Backend>(b: B) {
    let s = b.open();
    let hash = |c: char| c.to_string().repeat(64);
    s.apply_playerthree(&[
        new_match("m1"),
        record(
            "m1",
            "token",
            &format!("{{\"tokenHash\":\"{}\"}}", hash('a')),
        ),
        new_match("m2"),
        record("m2", "config", "{}"),
        record(
            "m2",
            "token",
            &format!("{{\"tokenHash\":\"{}\"}}", hash('b')),
        ),
        record("m2", "chat", "{}"),
        record("m2", "state", "{}"),
    ])
    .unwrap();
    let all = s.load_matches().unwrap();
    let one = s.load_match("m2").unwrap().expect("stored");
    assert_eq!(Some(&one), all.iter().find(|m| m.id == "m2"));
    assert_eq!(one.records.len(), 3, "the chat is not read: {one:?}");
    assert_eq!(s.load_match("m3").unwrap(), None);
    assert_eq!(s.match_of_token(&hash('b')).unwrap().as_deref(), Some("m2"));
    assert_eq!(s.match_of_token(&hash('a')).unwrap().as_deref(), Some("m1"));
    assert_eq!(s.match_of_token(&hash('c')).unwrap(), None);
    // Not a hash: never looked up (no pattern reaches the query).
    assert_eq!(s.match_of_token("%").unwrap(), None);
    // One lookup in the token index, not a scan of every record.
    let sql = if B::NAME == "SQLite" {
        crate::playerthree::MATCH_OF_TOKEN_SQL
    } else {
        crate::postgres::playerthree::MATCH_OF_TOKEN_SQL
    };
    let plan = b.plan(sql, &hash('b'));
    assert!(plan.contains("playerthree_records_by_token"), "{plan}");
}

fn a_record_of_no_match_fails_the_whole_batch<B: Backend>(b: B) {
    let s = b.open();
    let r = s.apply_playerthree(&[new_match("m1"), record("nope", "config", "{}")]);
    assert!(r.is_err());
    assert!(s.load_matches().unwrap().is_empty());
}

fn a_removed_match_leaves_no_row<B: Backend>(b: B) {
    let s = b.open();
    for id in ["m1", "m2"] {
        s.apply_playerthree(&[
            new_match(id),
            record(id, "config", "{}"),
            record(id, "state", "{}"),
        ])
        .unwrap();
    }
    s.apply_playerthree(&[PlayerThreeWrite::RemoveMatch { id: "m1".into() }])
        .unwrap();
    let loaded = s.load_matches().unwrap();
    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0].id, "m2");
    assert_eq!(loaded[0].records.len(), 2);
    assert_eq!(
        b.texts("SELECT CAST(COUNT(*) AS TEXT) FROM playerthree_records WHERE match_id = 'm1'"),
        vec!["0"]
    );
}

fn a_record_with_a_slot_replaces_the_one_before_it<B: Backend>(b: B) {
    let s = b.open();
    let policy = |body: &str| PlayerThreeWrite::Record {
        match_id: "m1".into(),
        kind: "policy".into(),
        tick: Some(3),
        slot: Some("policy:red-scout".into()),
        keep: 1,
        body: body.into(),
    };
    s.apply_playerthree(&[new_match("m1"), record("m1", "config", "{}")])
        .unwrap();
    for i in 0..100 {
        s.apply_playerthree(&[policy(&format!("{{\"v\":{i}}}"))])
            .unwrap();
    }
    s.apply_playerthree(&[record("m1", "state", "{}")]).unwrap();
    let loaded = s.load_matches().unwrap();
    assert_eq!(loaded[0].records, vec!["{}", "{\"v\":99}", "{}"]);
}

fn a_slot_keeps_its_newest_records_and_log_kinds_are_not_loaded<B: Backend>(b: B) {
    let s = b.open();
    let chat = |body: &str| PlayerThreeWrite::Record {
        match_id: "m1".into(),
        kind: "chat".into(),
        tick: None,
        slot: Some("chat:red".into()),
        keep: 3,
        body: body.into(),
    };
    let commentary = |body: &str| PlayerThreeWrite::Record {
        match_id: "m1".into(),
        kind: "commentary".into(),
        tick: None,
        slot: Some("commentary:red".into()),
        keep: 2,
        body: body.into(),
    };
    s.apply_playerthree(&[new_match("m1")]).unwrap();
    for i in 0..10 {
        s.apply_playerthree(&[chat(&format!("c{i}")), commentary(&format!("k{i}"))])
            .unwrap();
    }
    assert_eq!(
        b.texts("SELECT body FROM playerthree_records WHERE kind = 'chat' ORDER BY seq"),
        vec!["c7", "c8", "c9"]
    );
    let loaded = s.load_matches().unwrap();
    assert_eq!(loaded[0].records, vec!["k8", "k9"]);
}
