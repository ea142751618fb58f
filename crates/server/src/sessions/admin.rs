//! The HTTP API's operations on a running session, carried out by its task:
//! each answered with the session's status once the change is kept.

use super::hosted::{Admin, AdminReply, Hosted, Out, Tag};
use hostwire_memizy::session::{Phase, SessionError};
use hostwire_memizy::SessionEndReason;
use serde_json::{json, Value};

impl Hosted {
    pub(super) fn admin(&mut self, op: Admin, reply: AdminReply, now: u64) {
        let r = match op {
            Admin::Status => Ok(self.status()),
            // A change is answered once it is kept.
            Admin::AddPlayer(spec, token) => {
                let id = spec.id.clone();
                match self.d.act(now, |s| s.add_player(*spec, now)) {
                    Ok(()) => {
                        self.auth.players.insert(id, token);
                        return self.reply_when_kept(reply, self.status(), now);
                    }
                    Err(e) => Err(session_error(e)),
                }
            }
            Admin::Kick(id) => match self.d.act(now, |s| s.kick_player(&id, now)) {
                Ok(()) => {
                    self.auth.players.remove(&id);
                    return self.reply_when_kept(reply, self.status(), now);
                }
                Err(e) => Err(session_error(e)),
            },
            Admin::Rename(id, name) => {
                match self.d.act(now, |s| s.rename_player(&id, &name, now)) {
                    Ok(()) => return self.reply_when_kept(reply, self.status(), now),
                    Err(e) => Err(session_error(e)),
                }
            }
            Admin::Config(c) => {
                self.d.act(now, |s| s.set_config(c, now));
                return self.reply_when_kept(reply, self.status(), now);
            }
            Admin::Start => match self.d.act(now, |s| s.start_game(now)) {
                Ok(()) => return self.reply_when_kept(reply, self.status(), now),
                Err(e) => Err(session_error(e)),
            },
            Admin::Pause => match self.d.act(now, |s| s.pause(now)) {
                Ok(()) => {
                    self.rec.event("pause", self.times(now), None);
                    self.write_recording(now);
                    return self.reply_when_kept(reply, self.status(), now);
                }
                Err(e) => Err(session_error(e)),
            },
            Admin::Resume => match self.d.act(now, |s| s.resume(now)) {
                Ok(()) => {
                    self.rec.event("resume", self.times(now), None);
                    return self.reply_when_kept(reply, self.status(), now);
                }
                Err(e) => Err(session_error(e)),
            },
            Admin::Continue => match self.continued() {
                Ok(v) => return self.reply_when_kept(reply, v, now),
                Err(e) => Err(e),
            },
            Admin::End => {
                self.d.act(now, |s| s.close(SessionEndReason::Closed, now));
                Ok(self.status())
            }
            // What is recorded goes to the store; the answer (how many
            // entries were recorded: the store holds at least these) once
            // they and the state after them are kept. The HTTP handler
            // reads the record from the store.
            Admin::Recording => {
                self.write_recording(now);
                let entries = self.rec.count();
                return self.reply_when_kept(reply, json!({ "entries": entries }), now);
            }
            // Answered once the saved game is durable.
            Admin::Save => match self.d.save(Tag::Save(reply), now) {
                Ok(()) => return,
                Err(Tag::Save(reply)) => {
                    let why = "this game cannot be saved (not started, or ended)";
                    let _ = reply.send(Err((409, why.into())));
                    return;
                }
                Err(_) => return,
            },
        };
        self.out.push_back(Out::Reply(reply, r));
    }

    /// `continue`'s answer: the status and every player's token.
    fn continued(&self) -> Result<Value, (u16, String)> {
        let s = self.d.session();
        let paused = s.clock().paused_at.is_some();
        match s.phase() {
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
                Ok(v)
            }
            Phase::Lobby => Err((409, "the session is in its lobby: start it".into())),
            Phase::Finished | Phase::Closed => {
                Err((409, "the game has ended; it cannot be continued".into()))
            }
        }
    }

    /// Answers `body` once the session's state after the change is kept
    /// (503 when it could not be: the change is not acknowledged).
    fn reply_when_kept(&mut self, reply: AdminReply, body: Value, now: u64) {
        self.d.keep_then(Tag::Admin(reply, body), now);
    }

    pub(super) fn status(&self) -> Value {
        let s = self.d.session();
        let (settings, valid, message) = s.settings();
        json!({
            "sessionId": s.id(),
            "phase": phase_name(s.phase()),
            "players": s.players(),
            "settings": settings,
            "settingsValid": valid,
            "settingsMessage": message,
            "clock": s.clock(),
            "instances": s.instance_count(),
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
