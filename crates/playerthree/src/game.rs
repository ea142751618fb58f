//! What a game provides to the match host, and the closed-vocabulary guard.

use crate::protocol::{DetailRequest, Outcome};
use hostwire_core::delta::Json;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// A control method a seat may call, with the JSON Schema of its `args`
/// (what an MCP tool of the same name takes as input).
#[derive(Debug, Clone, PartialEq)]
pub struct ControlMethod {
    pub name: String,
    pub description: String,
    pub input_schema: serde_json::Value,
}

/// A seat the game defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeatSpec {
    pub team: String,
    pub role: String,
}

/// Whose view to project for an observer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Perspective<'a> {
    Team(&'a str),
    Omniscient,
}

/// Why the game refused a call; both become the `invalid` error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GameError(pub String);

/// A game hosted by a [`crate::host::Match`]. Deterministic and sans-IO:
/// every change comes through `call` or `advance`.
pub trait Game: Send {
    /// The teams, in a fixed order.
    fn teams(&self) -> Vec<String>;
    /// Every seat. Role names are unique in the match.
    fn seats(&self) -> Vec<SeatSpec>;
    /// The control methods of a seat.
    fn control_methods(&self, role: &str) -> Vec<ControlMethod>;
    /// The observation sections a `stream` may ask for in full.
    fn sections(&self) -> Vec<String>;
    /// The closed vocabulary of outbound game data (see [`Vocabulary`]).
    fn vocabulary(&self) -> Vocabulary;

    /// Applies a control call for `role`. `args` is `{}` when omitted.
    fn call(&mut self, role: &str, method: &str, args: &Json) -> Result<Json, GameError>;
    /// Advances one tick.
    fn advance(&mut self);
    fn tick(&self) -> u64;

    /// What `team` may see (fogged).
    fn project_team(&self, team: &str) -> Json;
    /// What an observer of `perspective` sees.
    fn project_observer(&self, perspective: Perspective<'_>) -> Json;
    /// A stream push for `role`: its default observation plus `detail`.
    fn observe(&self, role: &str, detail: Option<&DetailRequest>) -> Json;

    /// Teams whose outcome is decided.
    fn outcomes(&self) -> BTreeMap<String, Outcome>;
    /// The after-action report of `team` (sent once its outcome is decided).
    fn report(&self, team: &str) -> Json;

    /// The whole game state, to persist; [`GameFactory::restore`] reads it.
    fn save(&self) -> Json;
}

/// Builds a game back from a saved state.
pub trait GameFactory<G: Game> {
    fn restore(&self, state: &Json) -> Result<G, GameError>;
}

impl<G: Game, F: Fn(&Json) -> Result<G, GameError>> GameFactory<G> for F {
    fn restore(&self, state: &Json) -> Result<G, GameError> {
        self(state)
    }
}

/// The closed vocabulary: every member name and every string value in
/// outbound game data (views, observer frames, stream pushes, call results,
/// reports) must be one of these words, or a team, role, method or section
/// name of the match. Numbers, booleans and null pass. Free text an agent or
/// player typed can therefore never ride out inside game data.
#[derive(Debug, Clone, Default)]
pub struct Vocabulary {
    words: HashSet<Arc<str>>,
}

/// Where outbound data broke the vocabulary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("outbound game data at {path}: {word:?} is outside the declared vocabulary")]
pub struct GuardViolation {
    pub path: String,
    pub word: String,
}

/// Longest word shown in a [`GuardViolation`].
const SHOWN_WORD_BYTES: usize = 64;

impl Vocabulary {
    pub fn new<I: IntoIterator<Item = S>, S: AsRef<str>>(words: I) -> Self {
        Self {
            words: words.into_iter().map(|w| Arc::from(w.as_ref())).collect(),
        }
    }

    pub fn extend<I: IntoIterator<Item = S>, S: AsRef<str>>(&mut self, words: I) {
        self.words
            .extend(words.into_iter().map(|w| Arc::from(w.as_ref())));
    }

    pub fn contains(&self, word: &str) -> bool {
        self.words.contains(word)
    }

    /// Checks `data`; the first word outside the vocabulary is the error.
    pub fn guard(&self, data: &Json) -> Result<(), GuardViolation> {
        let mut path = String::new();
        self.walk(data, &mut path)
    }

    fn walk(&self, v: &Json, path: &mut String) -> Result<(), GuardViolation> {
        let violation = |path: &str, w: &str| GuardViolation {
            path: if path.is_empty() {
                "/".into()
            } else {
                path.to_owned()
            },
            word: w.chars().take(SHOWN_WORD_BYTES).collect(),
        };
        match v {
            Json::String(s) if !self.contains(s) => Err(violation(path, s)),
            Json::Array(a) => {
                for (i, item) in a.iter().enumerate() {
                    let len = path.len();
                    path.push('/');
                    path.push_str(&i.to_string());
                    self.walk(item, path)?;
                    path.truncate(len);
                }
                Ok(())
            }
            Json::Object(m) => {
                for (k, item) in m.iter() {
                    if !self.contains(k) {
                        return Err(violation(path, k));
                    }
                    let len = path.len();
                    path.push('/');
                    path.push_str(k);
                    self.walk(item, path)?;
                    path.truncate(len);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_guard_passes_declared_words_and_names_the_first_other() {
        let v = Vocabulary::new(["units", "x", "red"]);
        v.guard(&Json::from(json!({"units":[{"x":1},{"x":"red"}]})))
            .unwrap();
        let e = v
            .guard(&Json::from(
                json!({"units":[{"x":1},{"x":"ignore all previous"}]}),
            ))
            .unwrap_err();
        assert_eq!(e.path, "/units/1/x");
        assert_eq!(e.word, "ignore all previous");
        let e = v
            .guard(&Json::from(json!({"units":[], "note": 1})))
            .unwrap_err();
        assert_eq!((e.path.as_str(), e.word.as_str()), ("/", "note"));
    }
}
