//! The session state machine. Every rule of SPEC 3 to 8 that belongs to
//! the host lives here; the server only moves bytes and rows.

use super::leitner::{AnswerOutcome, ProgressRecord};
use super::*;
use crate::calls::{check_asset_size, check_service_result, decode_host_call_with, HostCall};
use crate::errors::{ProtocolError, ProtocolErrorCode as Code};
use crate::items::{prepare_set_text, PreparedText};
use crate::negotiate::{
    check_manifest_protocol, negotiate_protocol_version, HOST_SUPPORTED_VERSIONS,
};
use crate::settings::resolve_settings;
use foldhash::{HashMap, HashMapExt};
use hostwire_core::rate::{Coalescer, Offer};
use hostwire_core::TokenBucket;
use serde_json::value::RawValue;
use std::collections::{BTreeMap, VecDeque};

/// Answers of one player in this session, set items and generated ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlayerStats {
    pub answers: u64,
    pub correct: u64,
    /// Answers to generated items (counted here, not scheduled).
    pub generated: u64,
}

#[derive(Debug)]
struct PlayerState {
    id: String,
    name: String,
    is_host: bool,
    user: String,
    progress: Map<String, Value>,
    data: PluginDataValues,
    stats: PlayerStats,
    instance: Option<InstanceId>,
}

impl PlayerState {
    fn public(&self) -> Player {
        Player {
            id: self.id.clone(),
            name: self.name.clone(),
            is_host: self.is_host,
            connected: self.instance.is_some(),
        }
    }
}

#[derive(Debug)]
struct Instance {
    view: View,
    address: Address,
    player: Option<String>,
    hello: bool,
    ready: bool,
    attached_at_ms: u64,
    send: TokenBucket,
    answers: TokenBucket,
    assets: TokenBucket,
    errors: TokenBucket,
    service: TokenBucket,
    /// The authority's `send` budget, per recipient (SPEC 8.1).
    send_to: HashMap<Address, TokenBucket>,
    /// The authority's `recordAnswer` budget, per player (SPEC 8.1).
    answers_for: HashMap<String, TokenBucket>,
    /// Calls waiting for a durable write or a service.
    pending: usize,
    /// Plugin API calls queued and not yet polled.
    queued: usize,
}

#[derive(Debug, Clone, Copy)]
struct Waiter {
    instance: InstanceId,
    call: CallId,
    method: &'static str,
}

#[derive(Debug)]
struct DataSlot {
    coalescer: Coalescer<Arc<str>>,
    waiters: Vec<Waiter>,
}

#[derive(Debug)]
struct PendingService {
    waiter: Waiter,
    name: String,
    deadline_ms: u64,
    timeout_ms: u64,
}

/// One Memizy session. See the module documentation for the flow.
#[derive(Debug)]
pub struct Session {
    cfg: SessionConfig,
    seed: String,
    prepared: PreparedText,
    settings: Map<String, Value>,
    settings_valid: bool,
    settings_message: Option<String>,
    services_available: Vec<String>,
    phase: Phase,
    started: bool,
    players: Vec<PlayerState>,
    instances: BTreeMap<InstanceId, Instance>,
    /// Instances attached that have not said `hello`: their deadlines are
    /// walked for only while there are some (`poll_timeout` is asked on
    /// every turn of the session).
    awaiting_hello: usize,
    by_address: HashMap<Address, InstanceId>,
    clock: SessionClock,
    snapshot: Option<Arc<str>>,
    snapshot_slot: Coalescer<Arc<str>>,
    snapshot_waiters: Vec<Waiter>,
    data_slots: HashMap<(String, DataScope), DataSlot>,
    ended: bool,
    result: Option<SessionResult>,
    ready_deadline_ms: Option<u64>,
    authority_away_since_ms: Option<u64>,
    authority_announced_away: bool,
    /// The session is closing every instance: no one is told of the others
    /// leaving (or of the authority going) before its own `sessionEnded`.
    ending: bool,
    finished_close_at_ms: Option<u64>,
    records: HashMap<RecordId, Vec<Waiter>>,
    next_record: RecordId,
    services: HashMap<ServiceCallId, PendingService>,
    next_service: ServiceCallId,
    outputs: VecDeque<Output>,
    slow: Vec<InstanceId>,
    /// Plugin API calls that must follow the reply of the current call.
    after_reply: Vec<(InstanceId, PluginCallOut)>,
}

type CallResult = Result<Option<Reply>, ProtocolError>;

fn err(code: Code, detail: impl std::fmt::Display) -> ProtocolError {
    ProtocolError::new(code, detail)
}

fn bucket(per_second: f64, burst: u32, now: u64) -> TokenBucket {
    TokenBucket::new(per_second, burst, now)
}

impl Session {
    /// A new session in its lobby. The set is prepared once here (display
    /// order from the seed, public items for non-authority instances).
    pub fn new(cfg: SessionConfig, _now_ms: u64) -> Result<Self, SessionError> {
        let mut cfg = cfg;
        cfg.limits = cfg.limits.at_least_minimums();
        if cfg.id.is_empty() {
            return Err(SessionError::Config("the session id is empty".into()));
        }
        // SPEC 4.3: the manifest's protocol is checked before the plugin is
        // loaded, so a plugin this host cannot run is refused at creation,
        // not when the board says hello.
        check_manifest_protocol(HOST_SUPPORTED_VERSIONS, cfg.runtime.protocol).map_err(|e| {
            SessionError::Config(format!("appSpecific.memizy.protocol: {}", e.detail()))
        })?;
        if !cfg.runtime.supports(cfg.mode) {
            return Err(SessionError::Config(format!(
                "the plugin does not support {}",
                crate::settings::mode_name(cfg.mode)
            )));
        }
        match (cfg.mode, cfg.host_as, &cfg.runtime.multiplayer) {
            (Mode::Solo, None, _) => {}
            (Mode::Solo, Some(_), _) => {
                return Err(SessionError::Config("hostAs is null in solo".into()))
            }
            (Mode::Multiplayer, Some(h), Some(mp)) if mp.host_as.contains(&h) => {}
            (Mode::Multiplayer, _, _) => {
                return Err(SessionError::Config(
                    "multiplayer needs a hostAs the plugin declares".into(),
                ))
            }
        }
        let settings = resolve_settings(&cfg.runtime.settings, &cfg.settings, cfg.mode)
            .map_err(|p| SessionError::SettingsInvalid(join_problems(&p)))?;
        let seed = cfg.display_seed.clone().unwrap_or_else(|| cfg.id.clone());
        // SPEC 4.2: only types the plugin declared reach it.
        let types = cfg.item_types.clone();
        let declared = |it: &Value| match &types {
            None => true,
            Some(types) => it
                .get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| types.iter().any(|d| d == "*" || d == t)),
        };
        let prepared = prepare_set_text(&cfg.set, Some(&seed), declared)
            .map_err(|e| SessionError::Config(format!("set.items: {e}")))?;
        // The prepared texts are what is kept: the source is not needed.
        cfg.set.items = Vec::new();
        let services_available = cfg.services.available_to(&cfg.runtime.services);
        let snapshot_slot = Coalescer::per_second(cfg.limits.snapshots_per_second);
        Ok(Self {
            seed,
            prepared,
            settings,
            settings_valid: true,
            settings_message: None,
            services_available,
            phase: Phase::Lobby,
            started: false,
            players: Vec::new(),
            instances: BTreeMap::new(),
            awaiting_hello: 0,
            by_address: HashMap::new(),
            clock: SessionClock {
                offset_ms: cfg.clock_offset_ms,
                paused_ms: 0.0,
                paused_at: None,
            },
            snapshot: None,
            snapshot_slot,
            snapshot_waiters: Vec::new(),
            data_slots: HashMap::new(),
            ended: false,
            result: None,
            ready_deadline_ms: None,
            authority_away_since_ms: None,
            authority_announced_away: false,
            ending: false,
            finished_close_at_ms: None,
            records: HashMap::new(),
            next_record: 1,
            services: HashMap::new(),
            next_service: 1,
            outputs: VecDeque::new(),
            slow: Vec::new(),
            after_reply: Vec::new(),
            cfg,
        })
    }

    /// Continues a saved game (SPEC 3.3): same session and player ids, the
    /// authority recreated from the snapshot without `start()`, the session
    /// running but paused so the time between the lessons does not count.
    /// `players` are the saved players with what the store holds for them.
    pub fn continue_saved(
        mut cfg: SessionConfig,
        saved: &SavedGame,
        players: Vec<PlayerSpec>,
        now_ms: u64,
    ) -> Result<Self, SessionError> {
        if saved.session_id != cfg.id || saved.plugin_id != cfg.plugin_id {
            return Err(SessionError::Config(
                "the saved game belongs to another session or plugin".into(),
            ));
        }
        cfg.mode = saved.mode;
        cfg.host_as = saved.host_as;
        cfg.settings = saved.settings.clone();
        cfg.display_seed = Some(saved.display_seed.clone());
        cfg.set_id = saved.set_id.clone();
        let mut s = Session::new(cfg, now_ms)?;
        for p in &saved.players {
            let spec = players
                .iter()
                .find(|s| s.id == p.id)
                .cloned()
                .unwrap_or_else(|| PlayerSpec {
                    is_host: p.is_host,
                    user: p.user.clone(),
                    ..PlayerSpec::new(p.id.clone(), p.name.clone())
                });
            s.insert_player(spec)?;
        }
        s.snapshot = saved.snapshot.as_deref().map(Arc::from);
        s.started = true;
        s.phase = Phase::Running;
        let t = s.session_time(now_ms);
        s.clock.paused_at = Some(t);
        s.clock.paused_ms = t - saved.game_time_ms;
        s.authority_away_since_ms = Some(now_ms);
        Ok(s)
    }

    // ----- what the server reads -----

    pub fn id(&self) -> &str {
        &self.cfg.id
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn players(&self) -> Vec<Player> {
        self.players.iter().map(PlayerState::public).collect()
    }

    pub fn player_stats(&self, player: &str) -> Option<PlayerStats> {
        self.player(player).map(|p| p.stats)
    }

    /// The learning progress of a player as its next `InitPayload` shows it.
    pub fn progress(&self, player: &str) -> Option<&Map<String, Value>> {
        self.player(player).map(|p| &p.progress)
    }

    pub fn settings(&self) -> (&Map<String, Value>, bool, Option<&str>) {
        (
            &self.settings,
            self.settings_valid,
            self.settings_message.as_deref(),
        )
    }

    pub fn clock(&self) -> SessionClock {
        self.clock
    }

    /// The authority's address (`None` until the host's player exists).
    pub fn authority_address(&self) -> Option<Address> {
        self.authority().map(str::to_owned)
    }

    /// [`Session::authority_address`], borrowed (asked on every `send`).
    pub fn authority(&self) -> Option<&str> {
        match (self.cfg.mode, self.cfg.host_as) {
            (Mode::Multiplayer, Some(HostAs::Presenter)) => Some(BOARD_ADDRESS),
            (Mode::Multiplayer, _) => self
                .players
                .iter()
                .find(|p| p.is_host)
                .map(|p| p.id.as_str()),
            (Mode::Solo, _) => self.players.first().map(|p| p.id.as_str()),
        }
    }

    pub fn result(&self) -> Option<&SessionResult> {
        self.result.as_ref()
    }

    /// The latest snapshot held for a recreated authority.
    pub fn snapshot(&self) -> Option<&str> {
        self.snapshot.as_deref()
    }

    /// Whether an instance is attached (it gets replies and calls).
    pub fn is_attached(&self, instance: InstanceId) -> bool {
        self.instances.contains_key(&instance)
    }

    pub fn instance_count(&self) -> usize {
        self.instances.len()
    }

    /// Outputs not yet polled.
    pub fn queued_outputs(&self) -> usize {
        self.outputs.len()
    }

    pub fn poll_output(&mut self) -> Option<Output> {
        let o = self.outputs.pop_front()?;
        if let Output::Call { instance, .. } = &o {
            if let Some(i) = self.instances.get_mut(instance) {
                i.queued = i.queued.saturating_sub(1);
            }
        }
        Some(o)
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next run.
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut t: Option<u64> = None;
        let mut at = |v: Option<u64>| {
            if let Some(v) = v {
                t = Some(t.map_or(v, |t| t.min(v)));
            }
        };
        if self.phase == Phase::Closed {
            return None;
        }
        debug_assert_eq!(
            self.awaiting_hello,
            self.instances.values().filter(|i| !i.hello).count()
        );
        if self.awaiting_hello > 0 {
            for i in self.instances.values().filter(|i| !i.hello) {
                at(Some(i.attached_at_ms + self.cfg.limits.hello_timeout_ms));
            }
        }
        at(self.snapshot_slot.flush_at_ms());
        for slot in self.data_slots.values() {
            at(slot.coalescer.flush_at_ms());
        }
        for s in self.services.values() {
            at(Some(s.deadline_ms));
        }
        if self.phase != Phase::Lobby {
            at(self
                .authority_away_since_ms
                .map(|s| s + self.cfg.timing.authority_away_ms));
        }
        at(self.finished_close_at_ms);
        // Lifecycle deadlines matter only once the authority can start
        // (asked only in the phases that have one: not on a running
        // game's every turn).
        let lifecycle = match self.phase {
            Phase::Loading => self.ready_deadline_ms,
            Phase::Countdown { ends_at_ms } => Some(ends_at_ms),
            _ => None,
        };
        if lifecycle.is_some() && self.authority_instance().is_some() {
            at(lifecycle);
        }
        t
    }

    // ----- roster and lobby (the host's UI) -----

    /// A player joins (the lobby, or a running game if `lateJoin`).
    pub fn add_player(&mut self, spec: PlayerSpec, now_ms: u64) -> Result<(), SessionError> {
        match self.phase {
            Phase::Closed | Phase::Finished => return Err(SessionError::WrongPhase("joining")),
            Phase::Running if !self.late_join_allowed() => {
                return Err(SessionError::LateJoinNotAllowed)
            }
            _ => {}
        }
        if self.cfg.mode == Mode::Solo && !self.players.is_empty() {
            return Err(SessionError::RosterFull(1));
        }
        if spec.is_host && self.players.iter().any(|p| p.is_host) {
            return Err(SessionError::Config(
                "the session already has a host".into(),
            ));
        }
        self.insert_player(spec)?;
        self.players_changed(now_ms);
        Ok(())
    }

    fn insert_player(&mut self, spec: PlayerSpec) -> Result<(), SessionError> {
        check_name(&spec.name)?;
        if spec.id.is_empty()
            || spec.id.encode_utf16().count() > 128
            || [BOARD_ADDRESS, SETTINGS_ADDRESS, SERVER_ADDRESS].contains(&spec.id.as_str())
        {
            return Err(SessionError::Config(format!(
                "player id {:?} is not a usable address",
                spec.id
            )));
        }
        if self.player(&spec.id).is_some() {
            return Err(SessionError::DuplicatePlayer(spec.id));
        }
        let max = self.max_players();
        if self.players.len() >= max {
            return Err(SessionError::RosterFull(max));
        }
        self.players.push(PlayerState {
            id: spec.id,
            name: spec.name,
            is_host: spec.is_host,
            user: spec.user,
            progress: spec.progress,
            data: spec.data,
            stats: PlayerStats::default(),
            instance: None,
        });
        Ok(())
    }

    pub fn rename_player(&mut self, id: &str, name: &str, now_ms: u64) -> Result<(), SessionError> {
        check_name(name)?;
        let p = self
            .player_mut(id)
            .ok_or_else(|| SessionError::UnknownPlayer(id.into()))?;
        p.name = name.to_owned();
        self.players_changed(now_ms);
        Ok(())
    }

    /// A player leaves for good; its instance is closed with `closed`.
    pub fn remove_player(&mut self, id: &str, now_ms: u64) -> Result<(), SessionError> {
        self.drop_player(id, SessionEndReason::Closed, now_ms)
    }

    /// The host removes a player; its instance is closed with `kicked`.
    pub fn kick_player(&mut self, id: &str, now_ms: u64) -> Result<(), SessionError> {
        self.drop_player(id, SessionEndReason::Kicked, now_ms)
    }

    fn drop_player(
        &mut self,
        id: &str,
        reason: SessionEndReason,
        now_ms: u64,
    ) -> Result<(), SessionError> {
        let idx = self
            .players
            .iter()
            .position(|p| p.id == id)
            .ok_or_else(|| SessionError::UnknownPlayer(id.into()))?;
        if self.players[idx].is_host && self.phase != Phase::Lobby {
            return Err(SessionError::Config(
                "the host's player cannot leave a started game".into(),
            ));
        }
        if let Some(inst) = self.players[idx].instance {
            self.end_instance(inst, reason, now_ms);
        }
        self.players.remove(idx);
        self.players_changed(now_ms);
        self.advance(now_ms);
        Ok(())
    }

    /// Setting values from the host's form (lobby; solo before the start).
    pub fn set_settings(
        &mut self,
        values: &Map<String, Value>,
        _now_ms: u64,
    ) -> Result<(), SessionError> {
        if self.phase != Phase::Lobby {
            return Err(SessionError::WrongPhase("changing settings"));
        }
        let v = resolve_settings(&self.cfg.runtime.settings, values, self.cfg.mode)
            .map_err(|p| SessionError::SettingsInvalid(join_problems(&p)))?;
        self.settings = v;
        self.settings_valid = true;
        self.settings_message = None;
        self.event(SessionEvent::SettingsChanged {
            values: self.settings.clone(),
            valid: true,
            message: None,
        });
        Ok(())
    }

    /// Whether Start is enabled (SPEC 3.3: only while the settings are valid).
    pub fn can_start(&self) -> Result<(), SessionError> {
        if self.phase != Phase::Lobby {
            return Err(SessionError::WrongPhase("starting"));
        }
        if !self.settings_valid {
            return Err(SessionError::SettingsInvalid(
                self.settings_message
                    .clone()
                    .unwrap_or_else(|| "the settings screen reports them invalid".into()),
            ));
        }
        match (self.cfg.mode, &self.cfg.runtime.multiplayer) {
            (Mode::Solo, _) if self.players.len() != 1 => {
                Err(SessionError::NotEnoughPlayers(1, self.players.len()))
            }
            (Mode::Multiplayer, Some(mp)) if self.players.len() < mp.players.min as usize => Err(
                SessionError::NotEnoughPlayers(mp.players.min, self.players.len()),
            ),
            _ if self.authority_address().is_none() => Err(SessionError::Config(
                "the host's player is not in the roster".into(),
            )),
            _ => Ok(()),
        }
    }

    /// Start: lobby → loading. The settings screen is closed; the game
    /// instances may attach.
    pub fn start_game(&mut self, now_ms: u64) -> Result<(), SessionError> {
        self.can_start()?;
        if let Some(&id) = self.by_address.get(SETTINGS_ADDRESS) {
            self.end_instance(id, SessionEndReason::Closed, now_ms);
        }
        self.set_phase(Phase::Loading);
        self.ready_deadline_ms = Some(now_ms + self.cfg.timing.ready_timeout_ms);
        if self.authority_instance().is_none() {
            self.authority_away_since_ms = Some(now_ms);
        }
        self.advance(now_ms);
        Ok(())
    }

    /// The host pauses the game: game time stops everywhere.
    pub fn pause(&mut self, now_ms: u64) -> Result<(), SessionError> {
        if !matches!(self.phase, Phase::Running) || self.clock.paused_at.is_some() {
            return Err(SessionError::WrongPhase("pausing"));
        }
        self.clock.paused_at = Some(self.session_time(now_ms));
        self.clock_changed(now_ms);
        Ok(())
    }

    pub fn resume(&mut self, now_ms: u64) -> Result<(), SessionError> {
        let Some(at) = self.clock.paused_at else {
            return Err(SessionError::WrongPhase("resuming"));
        };
        self.clock.paused_ms += (self.session_time(now_ms) - at).max(0.0);
        self.clock.paused_at = None;
        self.clock_changed(now_ms);
        Ok(())
    }

    /// The host configuration the instances were given (`InitPayload.config`,
    /// then `configChanged`).
    pub fn host_config(&self) -> &HostConfig {
        &self.cfg.config
    }

    /// Locale or theme changed.
    pub fn set_config(&mut self, config: HostConfig, now_ms: u64) {
        self.cfg.config = config;
        let args = args_json(&(&self.cfg.config,));
        self.broadcast("configChanged", args, None);
        self.finish_event(now_ms);
    }

    /// Saves a game that has not ended (SPEC 3.3), and hands it to the
    /// store. `None` when the game has ended or not started.
    pub fn save_game(&mut self, now_ms: u64) -> Option<(RecordId, SavedGame)> {
        if self.ended || !self.started || self.phase == Phase::Closed {
            return None;
        }
        let saved = self.current_game(now_ms);
        let id = self.persist(Record::SavedGame(Box::new(saved.clone())), Vec::new());
        Some((id, saved))
    }

    /// The game as it is now, in any phase, as a saved game holds it
    /// (roster, settings, seed, latest snapshot, game time): what a server
    /// keeps to bring the session back after a restart. Nothing is
    /// persisted.
    pub fn current_game(&self, now_ms: u64) -> SavedGame {
        SavedGame {
            session_id: self.cfg.id.clone(),
            plugin_id: self.cfg.plugin_id.clone(),
            set_id: self.cfg.set_id.clone(),
            mode: self.cfg.mode,
            host_as: self.cfg.host_as,
            settings: self.settings.clone(),
            display_seed: self.seed.clone(),
            players: self
                .players
                .iter()
                .map(|p| SavedPlayer {
                    id: p.id.clone(),
                    name: p.name.clone(),
                    is_host: p.is_host,
                    user: p.user.clone(),
                })
                .collect(),
            snapshot: self.snapshot.as_deref().map(str::to_owned),
            game_time_ms: self.clock.game_time(now_ms as f64),
        }
    }

    /// The settings screen's last report (`updateSettings`'s `valid` and
    /// `message`), as kept across a restart: Start stays disabled while it
    /// says the settings are not valid.
    pub fn restore_settings_report(&mut self, valid: bool, message: Option<String>) {
        self.settings_valid = valid;
        self.settings_message = message;
    }

    /// The host closes the session: every instance gets `sessionEnded`.
    pub fn close(&mut self, reason: SessionEndReason, now_ms: u64) {
        if self.phase == Phase::Closed {
            return;
        }
        let ids: Vec<InstanceId> = self.instances.keys().copied().collect();
        // SPEC 3.3: the instances are closed with `sessionEnded`; one
        // leaving is not news to the others, which are closed too (the SDK
        // would show "waiting for the host" for an instant).
        self.ending = true;
        for id in ids {
            self.end_instance(id, reason.clone(), now_ms);
        }
        self.ending = false;
        // Nothing coalesced is lost: what waits is written now.
        if let Some(s) = self.snapshot_slot.take_pending() {
            let w = std::mem::take(&mut self.snapshot_waiters);
            self.persist_snapshot(s, w);
        }
        let keys: Vec<(String, DataScope)> = self.data_slots.keys().cloned().collect();
        for k in keys {
            if let Some(slot) = self.data_slots.get_mut(&k) {
                if let Some(v) = slot.coalescer.take_pending() {
                    let w = std::mem::take(&mut slot.waiters);
                    self.persist_data(&k.0, k.1, v, w);
                }
            }
        }
        let services: Vec<ServiceCallId> = self.services.keys().copied().collect();
        for id in services {
            self.services.remove(&id);
            self.outputs.push_back(Output::CancelService { id });
        }
        self.set_phase(Phase::Closed);
        self.finish_event(now_ms);
    }

    // ----- instances -----

    /// An instance (an iframe on a device) attaches at `address` in `view`.
    /// A new instance at an address that has one replaces it (a reconnect).
    pub fn attach(
        &mut self,
        instance: InstanceId,
        view: View,
        address: &str,
        now_ms: u64,
    ) -> Result<(), SessionError> {
        if self.instances.contains_key(&instance) {
            return Err(SessionError::DuplicateInstance(instance));
        }
        let bad = |problem| SessionError::BadAttach {
            view: view.as_str(),
            address: address.chars().take(128).collect(),
            problem,
        };
        let player = match (view, self.cfg.mode, self.cfg.host_as) {
            (View::Solo, Mode::Solo, _) | (View::Controller, Mode::Multiplayer, _) => {
                if self.player(address).is_none() {
                    return Err(bad("is not a player of this session"));
                }
                Some(address.to_owned())
            }
            (View::Board, Mode::Multiplayer, Some(HostAs::Presenter)) => {
                if address != BOARD_ADDRESS {
                    return Err(bad("the board's address is \"board\""));
                }
                None
            }
            (View::Settings, Mode::Multiplayer, _)
                if self.cfg.runtime.settings_screen.is_some() =>
            {
                if address != SETTINGS_ADDRESS {
                    return Err(bad("the settings screen's address is \"settings\""));
                }
                None
            }
            _ => return Err(bad("this view does not exist in this session")),
        };
        match (view, self.phase) {
            (_, Phase::Closed) => return Err(SessionError::WrongPhase("attaching")),
            (View::Settings, Phase::Lobby) => {}
            (View::Settings, _) => return Err(bad("the settings screen is for the lobby")),
            (_, Phase::Lobby) => return Err(bad("game instances attach after Start")),
            _ => {}
        }
        if let Some(&old) = self.by_address.get(address) {
            // The 1.0 changelog: the host ends an instance with
            // `sessionEnded` before removing it, a replaced one too.
            self.end_call(old, &SessionEndReason::Closed);
            self.remove_instance(old, Some(CloseReason::Replaced), now_ms);
        }
        if self.instances.len() >= MAX_INSTANCES_PER_SESSION {
            return Err(SessionError::TooManyInstances(MAX_INSTANCES_PER_SESSION));
        }
        let l = self.cfg.limits;
        self.awaiting_hello += 1;
        let replaced = self.instances.insert(
            instance,
            Instance {
                view,
                address: address.to_owned(),
                player: player.clone(),
                hello: false,
                ready: false,
                attached_at_ms: now_ms,
                send: bucket(f64::from(l.messages_per_second), l.message_burst, now_ms),
                answers: bucket(f64::from(l.answers_per_second), l.answer_burst, now_ms),
                assets: bucket(f64::from(l.assets_per_second), l.asset_burst, now_ms),
                errors: bucket(
                    f64::from(l.error_reports_per_second),
                    l.error_report_burst,
                    now_ms,
                ),
                service: bucket(
                    f64::from(l.service_calls_per_minute) / 60.0,
                    l.service_calls_per_minute,
                    now_ms,
                ),
                send_to: HashMap::new(),
                answers_for: HashMap::new(),
                pending: 0,
                queued: 0,
            },
        );
        if replaced.is_some_and(|r| !r.hello) {
            self.awaiting_hello -= 1;
        }
        self.by_address.insert(address.to_owned(), instance);
        if let Some(p) = player {
            if let Some(p) = self.player_mut(&p) {
                p.instance = Some(instance);
            }
            self.players_changed(now_ms);
        }
        self.finish_event(now_ms);
        Ok(())
    }

    /// The instance's connection is gone (the device may come back as a
    /// new instance). Its player stays on the roster, disconnected.
    pub fn detach(&mut self, instance: InstanceId, now_ms: u64) {
        if self.instances.contains_key(&instance) {
            self.remove_instance(instance, None, now_ms);
            self.advance(now_ms);
            self.finish_event(now_ms);
        }
    }

    // ----- the Host API -----

    /// A Host API call of an instance: `args` is the JSON array of its
    /// arguments. The reply comes out as [`Output::Reply`], at once or
    /// when what it waits for (a durable write, a service) is done.
    pub fn handle_call(
        &mut self,
        instance: InstanceId,
        call: CallId,
        method: &str,
        args: &str,
        now_ms: u64,
    ) {
        let result = self.dispatch(instance, call, method, args, now_ms);
        match result {
            Ok(Some(reply)) => self.reply_now(instance, call, Ok(reply)),
            Ok(None) => {}
            Err(e) => self.reply_now(instance, call, Err(e)),
        }
        for (to, c) in std::mem::take(&mut self.after_reply) {
            self.push_call(to, c);
        }
        self.advance(now_ms);
        self.finish_event(now_ms);
    }

    fn dispatch(
        &mut self,
        id: InstanceId,
        call: CallId,
        method: &str,
        args: &str,
        now: u64,
    ) -> CallResult {
        let Some(inst) = self.instances.get(&id) else {
            return Err(err(
                Code::SessionEnded,
                format!("{}: this instance's session has ended", short(method)),
            ));
        };
        if self.phase == Phase::Closed {
            return Err(err(Code::SessionEnded, "the session has ended"));
        }
        let decoded = decode_host_call_with(method, args, &self.cfg.limits)?;
        let method = decoded.method();
        match (&decoded, inst.hello) {
            (HostCall::Hello(_), true) => {
                return Err(ProtocolError::invalid_argument(
                    "hello: called a second time; hello is called once per instance",
                ))
            }
            (HostCall::Hello(_), false) => {}
            (_, false) => {
                return Err(ProtocolError::invalid_argument(format!(
                    "{method}: call hello first"
                )))
            }
            _ => {}
        }
        let is_authority = self.is_authority(inst);
        if decoded.requires_authority() && !is_authority {
            return Err(err(
                Code::NotAuthority,
                format!("{method}: only the authority may call it"),
            ));
        }
        if let Some(views) = decoded.allowed_views() {
            if !views.contains(&inst.view) {
                return Err(err(
                    Code::NotAllowedInView,
                    format!("{method}: not available in view {}", inst.view.as_str()),
                ));
            }
        }
        let may_wait = matches!(
            decoded,
            HostCall::SaveSnapshot(_)
                | HostCall::SaveData { .. }
                | HostCall::RecordAnswer(_)
                | HostCall::Service { .. }
                | HostCall::End(_)
        );
        if may_wait && inst.pending >= self.cfg.bounds.pending_calls_per_instance {
            return Err(err(
                Code::RateLimited,
                format!(
                    "{method}: {} calls of this instance are still waiting for an answer",
                    inst.pending
                ),
            ));
        }
        let waiter = Waiter {
            instance: id,
            call,
            method,
        };
        match decoded {
            HostCall::Hello(h) => self.on_hello(id, &h, now),
            HostCall::Ready => self.on_ready(id, now),
            HostCall::Send(m) => self.on_send(id, &m.to, m.data, now),
            HostCall::SaveSnapshot(s) => self.on_snapshot(waiter, s, now),
            HostCall::RecordAnswer(a) => self.on_answer(waiter, &a, now),
            HostCall::SaveData { scope, value } => self.on_data(waiter, scope, value, now),
            HostCall::UpdateSettings(u) => self.on_update_settings(u),
            HostCall::GetAsset { key, item_id } => self.on_asset(id, key, item_id, now),
            HostCall::End(r) => self.on_end(waiter, r, now),
            HostCall::ReportError(e) => {
                let inst = self.instances.get_mut(&id).expect("checked above");
                // Beyond the rate, reports are dropped without an error (SPEC 8.1).
                if inst.errors.try_take(now) {
                    let address = inst.address.clone();
                    self.event(SessionEvent::ErrorReport {
                        instance: id,
                        address,
                        report: e,
                    });
                }
                Ok(Some(Reply::Done))
            }
            HostCall::Service { name, payload } => self.on_service(waiter, name, payload, now),
        }
    }

    fn on_hello(&mut self, id: InstanceId, h: &Handshake, _now: u64) -> CallResult {
        let negotiated = negotiate_protocol_version(HOST_SUPPORTED_VERSIONS, &h.protocol)?;
        if h.plugin.id != self.cfg.plugin_id {
            return Err(ProtocolError::invalid_argument(format!(
                "hello: handshake.plugin.id {:?} is not the plugin of this session",
                short(&h.plugin.id)
            )));
        }
        let inst = self.instances.get_mut(&id).expect("checked by dispatch");
        if !inst.hello {
            inst.hello = true;
            self.awaiting_hello -= 1;
        }
        let init = self.init_payload(id, negotiated.to_string());
        let inst = &self.instances[&id];
        if !self.is_authority(inst) && self.authority_announced_away {
            // It joined while the authority is away: it learns so at once.
            self.after_reply.push((
                id,
                PluginCallOut {
                    method: "authorityChanged",
                    args: args_json(&(AuthorityStatus { connected: false },)),
                },
            ));
        }
        Ok(Some(Reply::Init(Box::new(init))))
    }

    fn init_payload(&self, id: InstanceId, protocol: String) -> InitPayload {
        let inst = &self.instances[&id];
        let is_authority = self.is_authority(inst);
        let full = self.cfg.mode == Mode::Solo || is_authority;
        let own = matches!(inst.view, View::Solo | View::Controller);
        let player = inst.player.as_deref().and_then(|p| self.player(p));
        InitPayload {
            protocol,
            host: self.cfg.host.clone(),
            oqse_version: crate::types::OQSE_VERSION.to_owned(),
            features: Vec::new(),
            session: SessionInfo {
                id: self.cfg.id.clone(),
                mode: self.cfg.mode,
                host_as: self.cfg.host_as,
                view: inst.view,
                self_address: inst.address.clone(),
                authority: self.authority_address().unwrap_or_default(),
                late_join: self.started,
            },
            players: self.players(),
            set: if full {
                self.prepared.full.clone()
            } else {
                self.prepared.public.clone()
            },
            settings: self.settings.clone(),
            config: self.cfg.config.clone(),
            clock: self.clock,
            services: self.services_available.clone(),
            progress: match (own, player) {
                (true, Some(p)) => p.progress.clone(),
                _ => Map::new(),
            },
            data: match (own, player) {
                (true, Some(p)) => p.data.clone(),
                _ => PluginDataValues {
                    plugin: Value::Null,
                    set: Value::Null,
                },
            },
            snapshot: match (&self.snapshot, is_authority) {
                (Some(s), true) => serde_json::from_str(s).unwrap_or(Value::Null),
                _ => Value::Null,
            },
        }
    }

    fn on_ready(&mut self, id: InstanceId, now: u64) -> CallResult {
        let inst = self.instances.get_mut(&id).expect("checked by dispatch");
        if inst.ready {
            return Ok(Some(Reply::Done));
        }
        inst.ready = true;
        if self.is_authority(&self.instances[&id]) {
            self.authority_reachable(now);
        }
        Ok(Some(Reply::Done))
    }

    fn on_send(
        &mut self,
        id: InstanceId,
        to: &Recipients,
        data: &RawValue,
        now: u64,
    ) -> CallResult {
        let inst = &self.instances[&id];
        let sender = inst.address.as_str();
        let is_authority = self.is_authority(inst);
        // Recipients: instances that said hello; others are dropped (SPEC 6).
        let mut targets: Vec<(Address, Option<InstanceId>)> = Vec::new();
        match to {
            Recipients::Authority => {
                let Some(auth) = self.authority() else {
                    return Err(err(
                        Code::AuthorityUnavailable,
                        "send: there is no authority yet",
                    ));
                };
                if auth != sender {
                    match self.authority_instance() {
                        Some(a) => targets.push((auth.to_owned(), Some(a))),
                        None => {
                            return Err(err(
                                Code::AuthorityUnavailable,
                                "send: the authority is not reachable; the message was not sent",
                            ))
                        }
                    }
                }
            }
            Recipients::All => {
                for (&iid, i) in &self.instances {
                    if iid != id && i.hello {
                        targets.push((i.address.clone(), Some(iid)));
                    }
                }
            }
            Recipients::Addresses(list) => {
                for (n, a) in list.iter().enumerate() {
                    if !self.is_known_address(a) {
                        return Err(ProtocolError::invalid_argument(format!(
                            "send: message.to[{n}] {:?} is not an address of this session",
                            short(a)
                        )));
                    }
                    if a == sender || targets.iter().any(|(t, _)| t == a) {
                        continue;
                    }
                    let inst = self
                        .by_address
                        .get(a)
                        .copied()
                        .filter(|i| self.instances[i].hello);
                    targets.push((a.clone(), inst));
                }
            }
        }
        // The rate: per instance; the authority's per recipient.
        let l = self.cfg.limits;
        let inst = self.instances.get_mut(&id).expect("checked by dispatch");
        if is_authority {
            for (a, _) in &targets {
                let b = inst.send_to.entry(a.clone()).or_insert_with(|| {
                    bucket(f64::from(l.messages_per_second), l.message_burst, now)
                });
                if b.available(now) < 1.0 {
                    return Err(err(
                        Code::RateLimited,
                        format!(
                            "send: more than {} messages per second to {:?}",
                            l.messages_per_second,
                            short(a)
                        ),
                    ));
                }
            }
            for (a, _) in &targets {
                if let Some(b) = inst.send_to.get_mut(a) {
                    b.try_take(now);
                }
            }
        } else if !inst.send.try_take(now) {
            return Err(err(
                Code::RateLimited,
                format!(
                    "send: more than {} messages per second (burst {})",
                    l.messages_per_second, l.message_burst
                ),
            ));
        }
        let live = || targets.iter().filter_map(|(_, i)| *i);
        self.room_for(live().count() + 1, "send")?;
        if live().next().is_some() {
            let sent_at = self.session_time(now);
            let sender = self.instances[&id].address.as_str();
            // `[{"from": …, "data": …, "sentAt": …}]`, written once.
            let mut a = Vec::with_capacity(data.get().len() + sender.len() + 48);
            a.extend_from_slice(b"[{\"from\":");
            let _ = serde_json::to_writer(&mut a, &sender);
            a.extend_from_slice(b",\"data\":");
            a.extend_from_slice(data.get().as_bytes());
            a.extend_from_slice(b",\"sentAt\":");
            let _ = serde_json::to_writer(&mut a, &sent_at);
            a.extend_from_slice(b"}]");
            let args: Arc<str> = Arc::from(std::str::from_utf8(&a).unwrap_or("[]"));
            for t in live() {
                self.push_call(
                    t,
                    PluginCallOut {
                        method: "deliver",
                        args: args.clone(),
                    },
                );
            }
        }
        Ok(Some(Reply::Done))
    }

    fn on_snapshot(&mut self, w: Waiter, snapshot: &RawValue, now: u64) -> CallResult {
        if self.ended {
            // A finished game is not resumed: later snapshots are ignored.
            return Ok(Some(Reply::Done));
        }
        self.room_for_record("saveSnapshot")?;
        let text: Arc<str> = Arc::from(snapshot.get());
        self.snapshot = Some(text.clone());
        self.wait(w);
        match self.snapshot_slot.offer(text, now) {
            Offer::WriteNow(t) => self.persist_snapshot(t, vec![w]),
            Offer::Deferred { .. } => self.snapshot_waiters.push(w),
        }
        Ok(None)
    }

    fn persist_snapshot(&mut self, snapshot: Arc<str>, waiters: Vec<Waiter>) {
        let record = Record::Snapshot {
            session_id: self.cfg.id.clone(),
            snapshot,
        };
        self.persist(record, waiters);
    }

    fn on_data(&mut self, w: Waiter, scope: DataScope, value: &RawValue, now: u64) -> CallResult {
        self.room_for_record("saveData")?;
        let Some(player) = self.instances[&w.instance].player.clone() else {
            return Err(err(
                Code::NotAllowedInView,
                "saveData: this instance has no player",
            ));
        };
        let text: Arc<str> = Arc::from(value.get());
        let parsed: Value = serde_json::from_str(value.get()).unwrap_or(Value::Null);
        if let Some(p) = self.player_mut(&player) {
            match scope {
                DataScope::Plugin => p.data.plugin = parsed,
                DataScope::Set => p.data.set = parsed,
            }
        }
        self.wait(w);
        let per_second = self.cfg.limits.data_writes_per_second;
        let slot = self
            .data_slots
            .entry((player.clone(), scope))
            .or_insert_with(|| DataSlot {
                coalescer: Coalescer::per_second(per_second),
                waiters: Vec::new(),
            });
        match slot.coalescer.offer(text, now) {
            Offer::WriteNow(t) => self.persist_data(&player, scope, t, vec![w]),
            Offer::Deferred { .. } => slot.waiters.push(w),
        }
        Ok(None)
    }

    fn persist_data(&mut self, player: &str, scope: DataScope, value: Arc<str>, w: Vec<Waiter>) {
        let user = self
            .player(player)
            .map_or_else(|| player.to_owned(), |p| p.user.clone());
        let record = Record::PluginData {
            user,
            plugin_id: self.cfg.plugin_id.clone(),
            scope,
            set_id: (scope == DataScope::Set).then(|| self.cfg.set_id.clone()),
            value,
        };
        self.persist(record, w);
    }

    fn on_answer(&mut self, w: Waiter, a: &AnswerRecord<'_>, now: u64) -> CallResult {
        let inst = &self.instances[&w.instance];
        let is_authority = self.is_authority(inst);
        let own = inst.player.clone();
        let target = match (&a.player_id, &own) {
            (Some(p), Some(o)) if p == o => p.clone(),
            (Some(p), _) if is_authority => p.clone(),
            (Some(_), _) => {
                return Err(err(
                    Code::NotAuthority,
                    "recordAnswer: answer.playerId names another player; only the authority records for others",
                ))
            }
            (None, Some(o)) => o.clone(),
            (None, None) => {
                return Err(ProtocolError::invalid_argument(
                    "recordAnswer: answer.playerId is required from an instance without a player",
                ))
            }
        };
        if self.player(&target).is_none() {
            return Err(ProtocolError::invalid_argument(format!(
                "recordAnswer: answer.playerId {:?} is not a player of this session",
                short(&target)
            )));
        }
        let l = self.cfg.limits;
        let inst = self
            .instances
            .get_mut(&w.instance)
            .expect("checked by dispatch");
        let b = if is_authority {
            inst.answers_for
                .entry(target.clone())
                .or_insert_with(|| bucket(f64::from(l.answers_per_second), l.answer_burst, now))
        } else {
            &mut inst.answers
        };
        if !b.try_take(now) {
            return Err(err(
                Code::RateLimited,
                format!(
                    "recordAnswer: more than {} answers per second (burst {}) for {:?}",
                    l.answers_per_second,
                    l.answer_burst,
                    short(&target)
                ),
            ));
        }
        let in_set = self.prepared.item(&a.item_id);
        let generated = in_set.is_none();
        let item: Value = match (in_set, a.item) {
            (Some(item), _) => item,
            (None, Some(item)) => serde_json::from_str(item.get()).unwrap_or(Value::Null),
            (None, None) => {
                return Err(ProtocolError::invalid_argument(format!(
                    "recordAnswer: answer.item is required for {:?}, which is not in the set",
                    short(&a.item_id)
                )))
            }
        };
        self.room_for_record("recordAnswer")?;
        let strings = |key: &str| -> Vec<String> {
            item.get(key)
                .and_then(Value::as_array)
                .map(|v| {
                    v.iter()
                        .filter_map(Value::as_str)
                        .take(64)
                        .map(|s| s.chars().take(200).collect())
                        .collect()
                })
                .unwrap_or_default()
        };
        let (skills, tags) = (strings("skills"), strings("tags"));
        let outcome = AnswerOutcome {
            is_correct: a.is_correct,
            confidence: a.confidence,
            time_spent_ms: a.time_spent_ms,
            hints_used: a.hints_used,
            is_skipped: a.is_skipped.unwrap_or(false),
        };
        let scheduler = self.cfg.scheduler.clone();
        let p = self.player_mut(&target).expect("checked above");
        p.stats.answers += 1;
        p.stats.correct += u64::from(a.is_correct);
        let progress = if generated {
            p.stats.generated += 1;
            None
        } else {
            let previous: Option<ProgressRecord> = p
                .progress
                .get(&a.item_id)
                .and_then(|v| serde_json::from_value(v.clone()).ok());
            let next = scheduler.schedule(previous.as_ref(), &outcome, now);
            if let Ok(v) = serde_json::to_value(&next) {
                p.progress.insert(a.item_id.clone(), v);
            }
            Some(next)
        };
        let user = p.user.clone();
        let write = AnswerWrite {
            session_id: self.cfg.id.clone(),
            plugin_id: self.cfg.plugin_id.clone(),
            set_id: self.cfg.set_id.clone(),
            player_id: target.clone(),
            user,
            item_id: a.item_id.clone(),
            is_correct: a.is_correct,
            is_skipped: outcome.is_skipped,
            generated: progress.is_none(),
            skills,
            tags,
            answer: a.answer.map(|r| r.get().to_owned()),
            answered_at_ms: now,
            progress,
        };
        self.wait(w);
        self.persist(Record::Answer(Box::new(write)), vec![w]);
        Ok(None)
    }

    fn on_update_settings(&mut self, u: SettingsUpdate) -> CallResult {
        let values = resolve_settings(&self.cfg.runtime.settings, &u.values, self.cfg.mode)
            .map_err(|problems| {
                let detail = problems
                    .iter()
                    .map(|p| format!("update.values.{}: {}", short(&p.id), p.message))
                    .collect::<Vec<_>>()
                    .join("; ");
                ProtocolError::invalid_argument(format!("updateSettings: {detail}"))
            })?;
        self.settings = values;
        self.settings_valid = u.valid;
        self.settings_message = u.message.clone();
        self.event(SessionEvent::SettingsChanged {
            values: self.settings.clone(),
            valid: u.valid,
            message: u.message,
        });
        Ok(Some(Reply::Done))
    }

    fn on_asset(
        &mut self,
        id: InstanceId,
        key: String,
        item_id: Option<String>,
        now: u64,
    ) -> CallResult {
        let l = self.cfg.limits;
        let inst = self.instances.get_mut(&id).expect("checked by dispatch");
        if !inst.assets.try_take(now) {
            return Err(err(
                Code::RateLimited,
                format!(
                    "getAsset: more than {} assets per second (burst {})",
                    l.assets_per_second, l.asset_burst
                ),
            ));
        }
        // OQSE asset keys are lowercase; the reference matches them so.
        let key = key.to_lowercase();
        let from_item = item_id
            .as_ref()
            .and_then(|i| self.cfg.assets.items.get(i))
            .and_then(|m| m.get(&key));
        let (size, item) = match (from_item, self.cfg.assets.set.get(&key)) {
            (Some(&s), _) => (s, item_id),
            (None, Some(&s)) => (s, None),
            (None, None) => {
                return Err(err(
                    Code::AssetNotFound,
                    format!(
                        "getAsset: key {:?} is not an asset of the item or the set",
                        short(&key)
                    ),
                ))
            }
        };
        check_asset_size(&key, size, &l)?;
        Ok(Some(Reply::Asset { key, item_id: item }))
    }

    fn on_end(&mut self, w: Waiter, r: SessionResult, now: u64) -> CallResult {
        if self.ended {
            // Only the first end(result) counts (SPEC 5).
            return Ok(Some(Reply::Done));
        }
        self.room_for_record("end")?;
        self.ended = true;
        self.result = Some(r.clone());
        // After end(result) the snapshot is discarded (SPEC 5).
        self.snapshot = None;
        if self.snapshot_slot.take_pending().is_some() {
            for sw in std::mem::take(&mut self.snapshot_waiters) {
                self.reply_waiter(sw, Ok(Reply::Done));
            }
        }
        self.wait(w);
        self.persist(
            Record::Result {
                session_id: self.cfg.id.clone(),
                result: r.clone(),
                at_ms: now,
            },
            vec![w],
        );
        self.persist(
            Record::SnapshotDiscarded {
                session_id: self.cfg.id.clone(),
            },
            Vec::new(),
        );
        self.set_phase(Phase::Finished);
        self.event(SessionEvent::Ended { result: r });
        self.finished_close_at_ms = Some(now + self.cfg.timing.finished_close_ms);
        Ok(None)
    }

    fn on_service(&mut self, w: Waiter, name: String, payload: &RawValue, now: u64) -> CallResult {
        let declared = self.cfg.runtime.services.contains(&name);
        let spec = self.cfg.services.get(&name).copied();
        let Some(spec) = spec.filter(|_| declared) else {
            let why = if declared {
                "this host does not offer it"
            } else {
                "the plugin does not declare it in its manifest"
            };
            return Err(err(
                Code::ServiceUnavailable,
                format!("service: {:?} is not available: {why}", short(&name)),
            ));
        };
        let l = self.cfg.limits;
        let inst = self
            .instances
            .get_mut(&w.instance)
            .expect("checked by dispatch");
        if !inst.service.try_take(now) {
            return Err(err(
                Code::RateLimited,
                format!(
                    "service: more than {} calls per minute",
                    l.service_calls_per_minute
                ),
            ));
        }
        let player = inst.player.clone();
        self.room_for(1, "service")?;
        let id = self.next_service;
        self.next_service += 1;
        let deadline_ms = now.saturating_add(spec.timeout_ms);
        self.wait(w);
        self.services.insert(
            id,
            PendingService {
                waiter: w,
                name: name.clone(),
                deadline_ms,
                timeout_ms: spec.timeout_ms,
            },
        );
        self.outputs.push_back(Output::Service(ServiceRequest {
            id,
            instance: w.instance,
            player,
            name,
            payload: payload.get().into(),
            deadline_ms,
        }));
        Ok(None)
    }

    // ----- answers from the server -----

    /// The store made a record durable (`Ok`) or could not (`Err`): the
    /// calls that wait for it are answered now.
    pub fn record_durable(&mut self, id: RecordId, outcome: Result<(), String>, now_ms: u64) {
        let Some(waiters) = self.records.remove(&id) else {
            return;
        };
        for w in waiters {
            let result = match &outcome {
                Ok(()) => Ok(Reply::Done),
                Err(why) => Err(err(
                    Code::InternalError,
                    format!("{}: could not be stored: {}", w.method, short(why)),
                )),
            };
            self.reply_waiter(w, result);
        }
        self.advance(now_ms);
        self.finish_event(now_ms);
    }

    /// A service answered: `Ok` with its result as JSON text, or its error.
    pub fn service_done(
        &mut self,
        id: ServiceCallId,
        outcome: Result<&str, ProtocolError>,
        now_ms: u64,
    ) {
        let Some(p) = self.services.remove(&id) else {
            return;
        };
        let result = outcome.and_then(|text| {
            let raw: &RawValue = serde_json::from_str(text).map_err(|e| {
                err(
                    Code::InternalError,
                    format!(
                        "service: {:?} returned a result that is not JSON: {e}",
                        p.name
                    ),
                )
            })?;
            check_service_result(raw, &self.cfg.limits)?;
            Ok(Reply::Service(Arc::from(raw.get())))
        });
        self.reply_waiter(p.waiter, result);
        self.advance(now_ms);
        self.finish_event(now_ms);
    }

    /// The instance cancelled its call `call` (worker RPC `cancel`). A
    /// pending `service` call stops (`CancelService`) and the engine will
    /// not answer it: `true`, and the caller answers it `CANCELLED`. Any
    /// other call finishes as it would (its answer is dropped by the
    /// device): `false`.
    pub fn cancel_call(&mut self, instance: InstanceId, call: CallId, now_ms: u64) -> bool {
        let found = self
            .services
            .iter()
            .find(|(_, p)| p.waiter.instance == instance && p.waiter.call == call)
            .map(|(&k, _)| k);
        if let Some(k) = found {
            self.services.remove(&k);
            self.outputs.push_back(Output::CancelService { id: k });
            self.finish_event(now_ms);
        }
        found.is_some()
    }

    /// The server's timer for a service call fired first.
    pub fn service_timed_out(&mut self, id: ServiceCallId, now_ms: u64) {
        if let Some(p) = self.services.remove(&id) {
            self.fail_service(id, p);
        }
        self.advance(now_ms);
        self.finish_event(now_ms);
    }

    fn fail_service(&mut self, id: ServiceCallId, p: PendingService) {
        self.outputs.push_back(Output::CancelService { id });
        let e = err(
            Code::InternalError,
            format!(
                "service: {:?} did not answer within {} ms",
                short(&p.name),
                p.timeout_ms
            ),
        );
        self.reply_waiter(p.waiter, Err(e));
    }

    /// Time passed: deadlines, coalesced writes, the lifecycle.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        if self.phase == Phase::Closed {
            return;
        }
        let late: Vec<InstanceId> = self
            .instances
            .iter()
            .filter(|(_, i)| {
                !i.hello && now_ms >= i.attached_at_ms + self.cfg.limits.hello_timeout_ms
            })
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            self.remove_instance(id, Some(CloseReason::HelloTimeout), now_ms);
        }
        if let Some(s) = self.snapshot_slot.poll(now_ms) {
            let w = std::mem::take(&mut self.snapshot_waiters);
            self.persist_snapshot(s, w);
        }
        let due: Vec<(String, DataScope)> = self
            .data_slots
            .iter()
            .filter(|(_, s)| s.coalescer.flush_at_ms().is_some_and(|t| t <= now_ms))
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            if let Some(slot) = self.data_slots.get_mut(&k) {
                if let Some(v) = slot.coalescer.poll(now_ms) {
                    let w = std::mem::take(&mut slot.waiters);
                    self.persist_data(&k.0, k.1, v, w);
                }
            }
        }
        let expired: Vec<ServiceCallId> = self
            .services
            .iter()
            .filter(|(_, s)| now_ms >= s.deadline_ms)
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            if let Some(p) = self.services.remove(&id) {
                self.fail_service(id, p);
            }
        }
        if self.phase != Phase::Lobby {
            if let Some(since) = self.authority_away_since_ms {
                if now_ms >= since + self.cfg.timing.authority_away_ms {
                    self.close(SessionEndReason::HostLeft, now_ms);
                    return;
                }
            }
        }
        if let Some(t) = self.finished_close_at_ms {
            if now_ms >= t {
                self.close(SessionEndReason::Finished, now_ms);
                return;
            }
        }
        self.advance(now_ms);
        self.finish_event(now_ms);
    }

    // ----- the lifecycle -----

    fn advance(&mut self, now: u64) {
        loop {
            match self.phase {
                Phase::Loading if self.authority_instance().is_some() => {
                    if self.cfg.mode == Mode::Solo {
                        // Solo: start() right after ready(), no countdown.
                        self.start(now);
                    } else if self.all_ready() || self.ready_deadline_ms.is_some_and(|d| now >= d) {
                        let ends_at_ms = now + self.cfg.timing.countdown_ms;
                        self.set_phase(Phase::Countdown { ends_at_ms });
                        self.event(SessionEvent::Countdown { ends_at_ms });
                        continue;
                    }
                }
                Phase::Countdown { ends_at_ms }
                    if now >= ends_at_ms && self.authority_instance().is_some() =>
                {
                    self.start(now);
                }
                _ => {}
            }
            break;
        }
    }

    /// The barrier of SPEC 3.3: every player has a ready instance and every
    /// attached game instance is ready.
    fn all_ready(&self) -> bool {
        self.players.iter().all(|p| {
            p.instance
                .and_then(|i| self.instances.get(&i))
                .is_some_and(|i| i.ready)
        }) && self
            .instances
            .values()
            .filter(|i| i.view != View::Settings)
            .all(|i| i.ready)
    }

    fn start(&mut self, _now: u64) {
        let Some(a) = self.authority_instance() else {
            return;
        };
        if !self.started {
            self.started = true;
            self.push_call(
                a,
                PluginCallOut {
                    method: "start",
                    args: Arc::from("[]"),
                },
            );
        }
        self.set_phase(Phase::Running);
    }

    fn authority_reachable(&mut self, _now: u64) {
        self.authority_away_since_ms = None;
        if self.authority_announced_away {
            self.authority_announced_away = false;
            self.authority_changed(true);
            self.event(SessionEvent::AuthorityBack);
        }
    }

    fn authority_changed(&mut self, connected: bool) {
        let auth = self.authority_address();
        let args = args_json(&(AuthorityStatus { connected },));
        self.broadcast("authorityChanged", args, auth.as_deref());
    }

    // ----- helpers -----

    fn remove_instance(&mut self, id: InstanceId, close: Option<CloseReason>, now: u64) {
        let Some(inst) = self.instances.remove(&id) else {
            return;
        };
        if !inst.hello {
            self.awaiting_hello -= 1;
        }
        if self.by_address.get(&inst.address) == Some(&id) {
            self.by_address.remove(&inst.address);
        }
        if let Some(reason) = close {
            self.outputs.push_back(Output::Close {
                instance: id,
                reason,
            });
        }
        let cancelled: Vec<ServiceCallId> = self
            .services
            .iter()
            .filter(|(_, s)| s.waiter.instance == id)
            .map(|(&k, _)| k)
            .collect();
        for k in cancelled {
            self.services.remove(&k);
            self.outputs.push_back(Output::CancelService { id: k });
        }
        let was_authority = Some(inst.address.as_str()) == self.authority();
        if let Some(p) = &inst.player {
            let replaced = self.by_address.contains_key(&inst.address);
            if let Some(ps) = self.player_mut(p) {
                if ps.instance == Some(id) {
                    ps.instance = None;
                }
            }
            if !replaced && !self.ending {
                self.players_changed(now);
            }
        }
        if was_authority
            && !self.ending
            && !matches!(self.phase, Phase::Lobby | Phase::Closed)
            && self.authority_away_since_ms.is_none()
        {
            self.authority_away_since_ms = Some(now);
            if inst.hello && inst.ready && !self.authority_announced_away {
                self.authority_announced_away = true;
                self.authority_changed(false);
                self.event(SessionEvent::AuthorityAway);
            }
        }
    }

    /// `sessionEnded(reason)`, then the connection is closed.
    fn end_instance(&mut self, id: InstanceId, reason: SessionEndReason, now: u64) {
        self.end_call(id, &reason);
        self.remove_instance(id, Some(CloseReason::SessionEnded(reason)), now);
    }

    /// `sessionEnded(reason)` to an instance that said hello.
    fn end_call(&mut self, id: InstanceId, reason: &SessionEndReason) {
        if self.instances.get(&id).is_some_and(|i| i.hello) {
            let args = args_json(&(reason,));
            self.push_call(
                id,
                PluginCallOut {
                    method: "sessionEnded",
                    args,
                },
            );
        }
    }

    fn players_changed(&mut self, _now: u64) {
        let args = args_json(&(self.players(),));
        self.broadcast("playersChanged", args, None);
    }

    fn clock_changed(&mut self, now: u64) {
        let args = args_json(&(self.clock,));
        self.broadcast("clockChanged", args, None);
        self.finish_event(now);
    }

    /// One Plugin API call to every instance that said hello, except `skip`.
    fn broadcast(&mut self, method: &'static str, args: Arc<str>, skip: Option<&str>) {
        let targets: Vec<InstanceId> = self
            .instances
            .iter()
            .filter(|(_, i)| i.hello && Some(i.address.as_str()) != skip)
            .map(|(&id, _)| id)
            .collect();
        for t in targets {
            self.push_call(
                t,
                PluginCallOut {
                    method,
                    args: args.clone(),
                },
            );
        }
    }

    fn push_call(&mut self, instance: InstanceId, call: PluginCallOut) {
        let bound = self.cfg.bounds.queued_calls_per_instance;
        let Some(i) = self.instances.get_mut(&instance) else {
            return;
        };
        if i.queued >= bound {
            // A consumer that cannot keep up is closed, not buffered.
            if !self.slow.contains(&instance) {
                self.slow.push(instance);
            }
            return;
        }
        i.queued += 1;
        self.outputs.push_back(Output::Call { instance, call });
    }

    fn finish_event(&mut self, now: u64) {
        while let Some(id) = self.slow.pop() {
            // It is treated as disconnected: its messages are dropped.
            self.remove_instance(id, Some(CloseReason::SlowConsumer), now);
        }
    }

    fn reply_now(
        &mut self,
        instance: InstanceId,
        call: CallId,
        result: Result<Reply, ProtocolError>,
    ) {
        if self.instances.contains_key(&instance) || result.is_err() {
            self.outputs.push_back(Output::Reply {
                instance,
                call,
                result,
            });
        }
    }

    fn wait(&mut self, w: Waiter) {
        if let Some(i) = self.instances.get_mut(&w.instance) {
            i.pending += 1;
        }
    }

    fn reply_waiter(&mut self, w: Waiter, result: Result<Reply, ProtocolError>) {
        // Answers for an instance that is gone are dropped.
        if let Some(i) = self.instances.get_mut(&w.instance) {
            i.pending = i.pending.saturating_sub(1);
            self.outputs.push_back(Output::Reply {
                instance: w.instance,
                call: w.call,
                result,
            });
        }
    }

    fn persist(&mut self, record: Record, waiters: Vec<Waiter>) -> RecordId {
        let id = self.next_record;
        self.next_record += 1;
        self.records.insert(id, waiters);
        self.outputs.push_back(Output::Persist { id, record });
        id
    }

    fn room_for(&self, n: usize, method: &str) -> Result<(), ProtocolError> {
        if self.outputs.len() + n > self.cfg.bounds.queued_outputs_per_session {
            return Err(err(
                Code::InternalError,
                format!("{method}: the session is overloaded; try again"),
            ));
        }
        Ok(())
    }

    fn room_for_record(&self, method: &str) -> Result<(), ProtocolError> {
        if self.records.len() >= self.cfg.bounds.records_in_flight {
            return Err(err(
                Code::InternalError,
                format!("{method}: the store is behind; try again"),
            ));
        }
        self.room_for(2, method)
    }

    fn event(&mut self, e: SessionEvent) {
        self.outputs.push_back(Output::Event(e));
    }

    fn set_phase(&mut self, p: Phase) {
        if self.phase != p {
            self.phase = p;
            self.event(SessionEvent::Phase(p));
        }
    }

    fn is_authority(&self, inst: &Instance) -> bool {
        inst.view != View::Settings && self.authority() == Some(inst.address.as_str())
    }

    /// The authority's instance if it is reachable: attached, hello, ready.
    fn authority_instance(&self) -> Option<InstanceId> {
        let id = *self.by_address.get(self.authority()?)?;
        let i = &self.instances[&id];
        (i.hello && i.ready).then_some(id)
    }

    fn is_known_address(&self, a: &str) -> bool {
        match a {
            BOARD_ADDRESS => self.cfg.host_as == Some(HostAs::Presenter),
            SETTINGS_ADDRESS => self.cfg.runtime.settings_screen.is_some(),
            _ => self.player(a).is_some(),
        }
    }

    fn late_join_allowed(&self) -> bool {
        self.cfg
            .runtime
            .multiplayer
            .as_ref()
            .is_some_and(|m| m.late_join)
    }

    fn max_players(&self) -> usize {
        match (self.cfg.mode, &self.cfg.runtime.multiplayer) {
            (Mode::Solo, _) => 1,
            (_, Some(m)) => (m.players.max as usize
                + usize::from(self.cfg.host_as == Some(HostAs::Player)))
            .min(MAX_PLAYERS_PER_SESSION),
            _ => MAX_PLAYERS_PER_SESSION,
        }
    }

    fn session_time(&self, now: u64) -> f64 {
        now as f64 + self.clock.offset_ms
    }

    fn player(&self, id: &str) -> Option<&PlayerState> {
        self.players.iter().find(|p| p.id == id)
    }

    fn player_mut(&mut self, id: &str) -> Option<&mut PlayerState> {
        self.players.iter_mut().find(|p| p.id == id)
    }
}

fn args_json<T: serde::Serialize>(args: &T) -> Arc<str> {
    Arc::from(serde_json::to_string(args).unwrap_or_else(|_| "[]".into()))
}

fn short(s: &str) -> String {
    s.chars().take(64).collect()
}

fn join_problems(p: &[crate::settings::SettingProblem]) -> String {
    p.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn check_name(name: &str) -> Result<(), SessionError> {
    let n = name.trim().encode_utf16().count();
    if n == 0 {
        return Err(SessionError::InvalidName("must not be empty".into()));
    }
    if name.encode_utf16().count() > MAX_PLAYER_NAME_LENGTH {
        return Err(SessionError::InvalidName(format!(
            "must be at most {MAX_PLAYER_NAME_LENGTH} characters"
        )));
    }
    Ok(())
}
