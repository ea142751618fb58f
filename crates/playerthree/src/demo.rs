//! Ridge: the example game that drives hostwire's PlayerThree tests and demo.
//!
//! Two teams (`red`, `blue`) of two units each (a scout who sees 3 cells,
//! a guard who sees 2, by Manhattan distance) on a 9 × 9 grid with a flag in
//! the middle. A unit follows its standing order (`move` north, south, east
//! or west one cell per tick, or `hold`). At the end of each tick, a team
//! with a unit on the flag and no enemy there scores a point. The first
//! team to `WIN_SCORE` wins; at `MAX_TICKS` the higher score wins, or both
//! draw. Fog of war: a team sees enemy units only within sight of one of its
//! own. Deterministic: the same calls at the same ticks give the same game.

use crate::game::{ControlMethod, Game, GameError, Perspective, SeatSpec, Vocabulary};
use crate::protocol::{DetailRequest, Outcome};
use hostwire_core::delta::{Json, JsonMap};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;

pub const GRID: i64 = 9;
pub const FLAG: (i64, i64) = (4, 4);
pub const WIN_SCORE: u64 = 5;
pub const MAX_TICKS: u64 = 60;
pub const TEAMS: [&str; 2] = ["red", "blue"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Unit {
    role: String,
    team: String,
    sight: i64,
    x: i64,
    y: i64,
    order: String,
}

/// The state of one Ridge game.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ridge {
    tick: u64,
    units: Vec<Unit>,
    scores: BTreeMap<String, u64>,
    moves: BTreeMap<String, u64>,
    decided_at: Option<u64>,
}

impl Default for Ridge {
    fn default() -> Self {
        Self::new()
    }
}

fn unit(role: &str, team: &str, sight: i64, x: i64, y: i64) -> Unit {
    Unit {
        role: role.into(),
        team: team.into(),
        sight,
        x,
        y,
        order: "hold".into(),
    }
}

fn o<const N: usize>(members: [(&str, Json); N]) -> Json {
    Json::object(members.into_iter().collect::<JsonMap>())
}

fn n(v: i64) -> Json {
    Json::Number(v.into())
}

impl Ridge {
    pub fn new() -> Self {
        Self {
            tick: 0,
            units: vec![
                unit("red-scout", "red", 3, 0, 0),
                unit("red-guard", "red", 2, 1, 0),
                unit("blue-scout", "blue", 3, 8, 8),
                unit("blue-guard", "blue", 2, 7, 8),
            ],
            scores: TEAMS.iter().map(|t| (t.to_string(), 0)).collect(),
            moves: TEAMS.iter().map(|t| (t.to_string(), 0)).collect(),
            decided_at: None,
        }
    }

    /// A game from [`Game::save`]'s output.
    pub fn restore(state: &Json) -> Result<Self, GameError> {
        serde_json::from_value(state.to_value()).map_err(|e| GameError(format!("state: {e}")))
    }

    fn visible_to(&self, team: &str, u: &Unit) -> bool {
        u.team == team
            || self
                .units
                .iter()
                .filter(|o| o.team == team)
                .any(|o| (o.x - u.x).abs() + (o.y - u.y).abs() <= o.sight)
    }

    fn unit_json(u: &Unit, with_team: bool, with_order: bool) -> Json {
        let mut m = JsonMap::new();
        m.insert("role".into(), Json::string(&u.role));
        if with_team {
            m.insert("team".into(), Json::string(&u.team));
        }
        m.insert("x".into(), n(u.x));
        m.insert("y".into(), n(u.y));
        if with_order {
            m.insert("order".into(), Json::string(&u.order));
        }
        Json::object(m)
    }

    fn scores_json(&self) -> Json {
        Json::object(
            self.scores
                .iter()
                .map(|(t, s)| (t.as_str(), Json::Number((*s).into())))
                .collect(),
        )
    }

    fn phase(&self) -> Json {
        Json::string(if self.decided_at.is_some() {
            "over"
        } else {
            "playing"
        })
    }

    fn flag() -> Json {
        o([("x", n(FLAG.0)), ("y", n(FLAG.1))])
    }
}

impl Game for Ridge {
    fn teams(&self) -> Vec<String> {
        TEAMS.iter().map(|t| t.to_string()).collect()
    }

    fn seats(&self) -> Vec<SeatSpec> {
        self.units
            .iter()
            .map(|u| SeatSpec {
                team: u.team.clone(),
                role: u.role.clone(),
            })
            .collect()
    }

    fn control_methods(&self, _role: &str) -> Vec<ControlMethod> {
        vec![
            ControlMethod {
                name: "move".into(),
                description: "Walk one cell per tick in a direction until told otherwise.".into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {"dir": {"type": "string", "enum": ["n", "s", "e", "w"]}},
                    "required": ["dir"],
                    "additionalProperties": false
                }),
            },
            ControlMethod {
                name: "hold".into(),
                description: "Stay on the current cell.".into(),
                input_schema: json!({"type": "object", "additionalProperties": false}),
            },
        ]
    }

    fn sections(&self) -> Vec<String> {
        vec!["surroundings".into(), "scores".into()]
    }

    fn vocabulary(&self) -> Vocabulary {
        Vocabulary::new([
            "tick",
            "team",
            "scores",
            "units",
            "enemies",
            "role",
            "x",
            "y",
            "order",
            "flag",
            "phase",
            "playing",
            "over",
            "n",
            "s",
            "e",
            "w",
            "hold",
            "result",
            "win",
            "loss",
            "draw",
            "ticks",
            "moves",
            "ok",
            "red",
            "blue",
            "red-scout",
            "red-guard",
            "blue-scout",
            "blue-guard",
        ])
    }

    fn call(&mut self, role: &str, method: &str, args: &Json) -> Result<Json, GameError> {
        if self.decided_at.is_some() {
            return Err(GameError("the game is over".into()));
        }
        let members = args
            .as_object()
            .ok_or_else(|| GameError("expected an object".into()))?;
        let order = match method {
            "move" => {
                if members.keys().any(|k| &**k != "dir") {
                    return Err(GameError("move takes only dir".into()));
                }
                match args.get("dir").and_then(Json::as_str) {
                    Some(d @ ("n" | "s" | "e" | "w")) => d.to_owned(),
                    _ => return Err(GameError("dir: expected one of n, s, e, w".into())),
                }
            }
            "hold" => {
                if !members.is_empty() {
                    return Err(GameError("hold takes no arguments".into()));
                }
                "hold".to_owned()
            }
            _ => return Err(GameError(format!("no method {method:?}"))),
        };
        let u = self
            .units
            .iter_mut()
            .find(|u| u.role == role)
            .ok_or_else(|| GameError(format!("no unit {role:?}")))?;
        u.order = order.clone();
        Ok(o([
            ("ok", Json::Bool(true)),
            ("order", Json::string(&order)),
        ]))
    }

    fn advance(&mut self) {
        if self.decided_at.is_some() {
            return;
        }
        self.tick += 1;
        for u in &mut self.units {
            let (dx, dy) = match u.order.as_str() {
                "n" => (0, -1),
                "s" => (0, 1),
                "e" => (1, 0),
                "w" => (-1, 0),
                _ => (0, 0),
            };
            let (x, y) = (u.x + dx, u.y + dy);
            if (dx, dy) != (0, 0) && (0..GRID).contains(&x) && (0..GRID).contains(&y) {
                u.x = x;
                u.y = y;
                *self.moves.entry(u.team.clone()).or_default() += 1;
            }
        }
        let on_flag: Vec<&str> = self
            .units
            .iter()
            .filter(|u| (u.x, u.y) == FLAG)
            .map(|u| u.team.as_str())
            .collect();
        if let [first, rest @ ..] = on_flag.as_slice() {
            if rest.iter().all(|t| t == first) {
                *self.scores.entry(first.to_string()).or_default() += 1;
            }
        }
        if self.scores.values().any(|&s| s >= WIN_SCORE) || self.tick >= MAX_TICKS {
            self.decided_at = Some(self.tick);
        }
    }

    fn tick(&self) -> u64 {
        self.tick
    }

    fn project_team(&self, team: &str) -> Json {
        let units = self
            .units
            .iter()
            .filter(|u| u.team == team)
            .map(|u| Self::unit_json(u, false, true))
            .collect();
        let enemies = self
            .units
            .iter()
            .filter(|u| u.team != team && self.visible_to(team, u))
            .map(|u| Self::unit_json(u, false, false))
            .collect();
        o([
            ("tick", Json::Number(self.tick.into())),
            ("team", Json::string(team)),
            ("phase", self.phase()),
            ("scores", self.scores_json()),
            ("flag", Self::flag()),
            ("units", Json::array(units)),
            ("enemies", Json::array(enemies)),
        ])
    }

    fn project_observer(&self, perspective: Perspective<'_>) -> Json {
        match perspective {
            Perspective::Team(t) => self.project_team(t),
            Perspective::Omniscient => o([
                ("tick", Json::Number(self.tick.into())),
                ("phase", self.phase()),
                ("scores", self.scores_json()),
                ("flag", Self::flag()),
                (
                    "units",
                    Json::array(
                        self.units
                            .iter()
                            .map(|u| Self::unit_json(u, true, true))
                            .collect(),
                    ),
                ),
            ]),
        }
    }

    fn observe(&self, role: &str, detail: Option<&DetailRequest>) -> Json {
        let Some(u) = self.units.iter().find(|u| u.role == role) else {
            return Json::Null;
        };
        let wants = |s: &str| match detail {
            Some(DetailRequest::All) => true,
            Some(DetailRequest::Sections(v)) => v.iter().any(|x| x == s),
            None => false,
        };
        let mut m = JsonMap::new();
        m.insert("tick".into(), Json::Number(self.tick.into()));
        m.insert("role".into(), Json::string(&u.role));
        m.insert("x".into(), n(u.x));
        m.insert("y".into(), n(u.y));
        m.insert("order".into(), Json::string(&u.order));
        if wants("surroundings") {
            let near = self
                .units
                .iter()
                .filter(|e| e.team != u.team && (e.x - u.x).abs() + (e.y - u.y).abs() <= u.sight)
                .map(|e| Self::unit_json(e, false, false))
                .collect();
            m.insert("enemies".into(), Json::array(near));
        }
        if wants("scores") {
            m.insert("scores".into(), self.scores_json());
        }
        Json::object(m)
    }

    fn outcomes(&self) -> BTreeMap<String, Outcome> {
        let Some(tick) = self.decided_at else {
            return BTreeMap::new();
        };
        let best = self.scores.values().copied().max().unwrap_or(0);
        let leaders = self.scores.values().filter(|&&s| s == best).count();
        self.scores
            .iter()
            .map(|(t, &s)| {
                let result = if leaders > 1 {
                    "draw"
                } else if s == best {
                    "win"
                } else {
                    "loss"
                };
                (
                    t.clone(),
                    Outcome {
                        result: result.into(),
                        tick,
                    },
                )
            })
            .collect()
    }

    fn report(&self, team: &str) -> Json {
        let result = self
            .outcomes()
            .get(team)
            .map(|o| o.result.clone())
            .unwrap_or_else(|| "draw".into());
        o([
            ("team", Json::string(team)),
            ("result", Json::string(&result)),
            ("scores", self.scores_json()),
            ("ticks", Json::Number(self.tick.into())),
            (
                "moves",
                Json::Number(self.moves.get(team).copied().unwrap_or(0).into()),
            ),
        ])
    }

    fn save(&self) -> Json {
        Json::from(serde_json::to_value(self).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(
        g: &mut Ridge,
        role: &str,
        method: &str,
        args: serde_json::Value,
    ) -> Result<Json, GameError> {
        g.call(role, method, &Json::from(args))
    }

    #[test]
    fn red_takes_the_flag_and_wins() {
        let mut g = Ridge::new();
        call(&mut g, "red-scout", "move", json!({"dir":"e"})).unwrap();
        for _ in 0..4 {
            g.advance();
        }
        call(&mut g, "red-scout", "move", json!({"dir":"s"})).unwrap();
        for _ in 0..4 {
            g.advance();
        }
        call(&mut g, "red-scout", "hold", json!({})).unwrap();
        assert_eq!(g.scores["red"], 1);
        while g.outcomes().is_empty() {
            g.advance();
        }
        assert_eq!(g.outcomes()["red"].result, "win");
        assert_eq!(g.outcomes()["blue"].result, "loss");
        assert_eq!(g.tick(), 12);
        assert!(call(&mut g, "red-scout", "hold", json!({})).is_err());
    }

    #[test]
    fn bad_calls_are_refused_and_state_round_trips() {
        let mut g = Ridge::new();
        assert!(call(&mut g, "red-scout", "move", json!({"dir":"up"})).is_err());
        assert!(call(&mut g, "red-scout", "move", json!({"dir":"n","far":1})).is_err());
        assert!(call(&mut g, "red-scout", "hold", json!({"x":1})).is_err());
        assert!(call(&mut g, "red-scout", "move", json!([])).is_err());
        call(&mut g, "blue-guard", "move", json!({"dir":"n"})).unwrap();
        g.advance();
        let back = Ridge::restore(&g.save()).unwrap();
        assert_eq!(back, g);
    }

    #[test]
    fn fog_hides_enemies_out_of_sight() {
        let mut g = Ridge::new();
        let enemies = |g: &Ridge| {
            g.project_team("red")
                .get("enemies")
                .unwrap()
                .as_array()
                .unwrap()
                .len()
        };
        assert_eq!(enemies(&g), 0);
        call(&mut g, "blue-scout", "move", json!({"dir":"w"})).unwrap();
        call(&mut g, "red-scout", "move", json!({"dir":"s"})).unwrap();
        for _ in 0..8 {
            g.advance();
        }
        // Both scouts end on (0, 8).
        assert!(enemies(&g) >= 1);
        g.vocabulary().guard(&g.project_team("red")).unwrap();
        g.vocabulary()
            .guard(&g.project_observer(Perspective::Omniscient))
            .unwrap();
    }
}
