//! The HTTP API's operations on a running session, carried out by its task:
//! each answered with the session's status once the change is kept.

use super::actor::Actor;
use super::restore::KeptState;
use crate::store_writer::Durable;
use hostwire_core::token::Token;
use hostwire_memizy::session::{Phase, PlayerSpec, SessionError};
use hostwire_memizy::SessionEndReason;
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// An HTTP API operation and where its answer goes.
pub enum Admin {
    Status,
    /// A player and the token its device attaches with.
    AddPlayer(Box<PlayerSpec>, Token),
    Kick(String),
    /// A player's new name (`playersChanged`).
    Rename(String, String),
    /// A new locale or theme (`configChanged`).
    Config(hostwire_memizy::HostConfig),
    Start,
    Pause,
    Resume,
    Save,
    /// The host ends the session: every instance gets
    /// `sessionEnded('closed')`.
    End,
    /// The recording (SPEC 10) as it stands.
    Recording,
    /// `continue`: a started game that is paused (as a continued or
    /// restored one is) or still loading answers its status and every
    /// player's token.
    Continue,
}

pub type AdminReply = oneshot::Sender<Result<Value, (u16, String)>>;

impl Actor {
    pub(super) fn admin(&mut self, op: Admin, reply: AdminReply, now: u64) {
        let r = match op {
            Admin::Status => Ok(self.status()),
            // A change is answered once it is kept.
            Admin::AddPlayer(spec, token) => {
                let id = spec.id.clone();
                match self.s.add_player(*spec, now) {
                    Ok(()) => {
                        self.auth.players.insert(id, token);
                        return self.reply_when_kept(reply, self.status());
                    }
                    Err(e) => Err(session_error(e)),
                }
            }
            Admin::Kick(id) => match self.s.kick_player(&id, now) {
                Ok(()) => {
                    self.auth.players.remove(&id);
                    return self.reply_when_kept(reply, self.status());
                }
                Err(e) => Err(session_error(e)),
            },
            Admin::Rename(id, name) => match self.s.rename_player(&id, &name, now) {
                Ok(()) => return self.reply_when_kept(reply, self.status()),
                Err(e) => Err(session_error(e)),
            },
            Admin::Config(c) => {
                self.s.set_config(c, now);
                return self.reply_when_kept(reply, self.status());
            }
            Admin::Start => match self.s.start_game(now) {
                Ok(()) => return self.reply_when_kept(reply, self.status()),
                Err(e) => Err(session_error(e)),
            },
            Admin::Pause => match self.s.pause(now) {
                Ok(()) => {
                    self.rec.event("pause", self.times(now), None);
                    self.write_recording();
                    return self.reply_when_kept(reply, self.status());
                }
                Err(e) => Err(session_error(e)),
            },
            Admin::Resume => match self.s.resume(now) {
                Ok(()) => {
                    self.rec.event("resume", self.times(now), None);
                    return self.reply_when_kept(reply, self.status());
                }
                Err(e) => Err(session_error(e)),
            },
            Admin::Continue => {
                let paused = self.s.clock().paused_at.is_some();
                match self.s.phase() {
                    Phase::Running if !paused => Err((409, "the session is running".into())),
                    Phase::Running | Phase::Loading | Phase::Countdown { .. } => {
                        let mut v = self.status();
                        let tokens: std::collections::BTreeMap<&str, &str> = self
                            .auth
                            .players
                            .iter()
                            .map(|(p, t)| (p.as_str(), t.as_str()))
                            .collect();
                        v["playerTokens"] = json!(tokens);
                        return self.reply_when_kept(reply, v);
                    }
                    Phase::Lobby => Err((409, "the session is in its lobby: start it".into())),
                    Phase::Finished | Phase::Closed => {
                        Err((409, "the game has ended; it cannot be continued".into()))
                    }
                }
            }
            Admin::End => {
                self.s.close(SessionEndReason::Closed, now);
                Ok(self.status())
            }
            Admin::Recording => {
                Ok(serde_json::from_str(&self.rec.document(self.s.id())).unwrap_or(Value::Null))
            }
            Admin::Save => match self.s.save_game(now) {
                Some((id, saved)) => {
                    let body = json!({"saved": saved});
                    self.saves.insert(id, (reply, body));
                    return;
                }
                None => Err((
                    409,
                    "this game cannot be saved (not started, or ended)".into(),
                )),
            },
        };
        let _ = reply.send(r);
    }

    /// The session's state as a restart brings it back, queued for the
    /// store: `None` when the store queue is full.
    pub(super) fn keep(&self) -> Option<Durable> {
        let w = KeptState::of(&self.s, self.now()).write(self.s.id());
        self.writer.try_queue_acked(self.s.id(), vec![w])
    }

    /// Answers `body` once the session's state after the change is kept
    /// (503 when it could not be: the change is not acknowledged).
    pub(super) fn reply_when_kept(&self, reply: AdminReply, body: Value) {
        let Some(kept) = self.keep() else {
            let _ = reply.send(Err((
                503,
                "the store is behind: the change was not kept; try again".into(),
            )));
            return;
        };
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            let _ = reply.send(if kept.wait().await {
                Ok(body)
            } else {
                Err((503, "the change could not be stored; try again".into()))
            });
        }));
    }

    pub(super) fn status(&self) -> Value {
        let (settings, valid, message) = self.s.settings();
        json!({
            "sessionId": self.s.id(),
            "phase": phase_name(self.s.phase()),
            "players": self.s.players(),
            "settings": settings,
            "settingsValid": valid,
            "settingsMessage": message,
            "clock": self.s.clock(),
            "instances": self.s.instance_count(),
            "result": self.result,
        })
    }
}

fn session_error(e: SessionError) -> (u16, String) {
    let status = match e {
        SessionError::WrongPhase(_) => 409,
        SessionError::UnknownPlayer(_) => 404,
        _ => 400,
    };
    (status, e.to_string())
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Lobby => "lobby",
        Phase::Loading => "loading",
        Phase::Countdown { .. } => "countdown",
        Phase::Running => "running",
        Phase::Finished => "finished",
        Phase::Closed => "closed",
    }
}
