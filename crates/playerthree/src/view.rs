//! Team view streams: a keyframe, then deltas from the previous version.
//!
//! Each step is built once, serialized once, and shared (`Arc`) by every
//! reader of the team. A reader applies steps with [`apply_view`].

use crate::protocol::{ServerMsg, ViewBody, ViewMessage};
use hostwire_core::delta::{apply, diff, Json};
use std::sync::Arc;

/// One step of a view stream with its wire text, shared by every reader.
#[derive(Debug)]
pub struct ViewFrame {
    pub message: ViewMessage,
    /// The `playerthree:view` message as sent (`op` included).
    pub text: Arc<str>,
}

impl ViewFrame {
    fn new(message: ViewMessage) -> Arc<Self> {
        let text: Arc<str> = ServerMsg::View(message.clone()).to_text().into();
        Arc::new(ViewFrame { message, text })
    }
}

/// The view stream of one team.
#[derive(Debug)]
pub struct ViewStream {
    team: String,
    version: u64,
    current: Option<Json>,
    keyframe: Option<Arc<ViewFrame>>,
}

impl ViewStream {
    pub fn new(team: impl Into<String>) -> Self {
        Self {
            team: team.into(),
            version: 0,
            current: None,
            keyframe: None,
        }
    }

    pub fn team(&self) -> &str {
        &self.team
    }

    /// The version readers hold after the last step (0: nothing yet).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The current view (shared with the stream).
    pub fn current(&self) -> Option<&Json> {
        self.current.as_ref()
    }

    /// Publishes the team's view. The first is a keyframe; later ones are a
    /// delta from the previous version, or nothing when the view did not
    /// change. The stored view is the previous one with the delta applied,
    /// so consecutive versions share every unchanged subtree.
    pub fn publish(&mut self, view: Json) -> Option<Arc<ViewFrame>> {
        let (body, next) = match &self.current {
            None => (ViewBody::Keyframe(view.clone()), view),
            Some(prev) => {
                let d = diff(prev, &view);
                if d.is_empty() {
                    return None;
                }
                // diff(prev, view) applies to prev by construction.
                let next = apply(prev, &d).unwrap_or(view);
                (ViewBody::Delta(d), next)
            }
        };
        self.version += 1;
        self.current = Some(next);
        self.keyframe = None;
        Some(ViewFrame::new(ViewMessage {
            team: self.team.clone(),
            version: self.version,
            body,
        }))
    }

    /// The keyframe of the current version, for a reader that joins now;
    /// built once per version.
    pub fn keyframe(&mut self) -> Option<Arc<ViewFrame>> {
        let current = self.current.as_ref()?;
        if self.keyframe.is_none() {
            self.keyframe = Some(ViewFrame::new(ViewMessage {
                team: self.team.clone(),
                version: self.version,
                body: ViewBody::Keyframe(current.clone()),
            }));
        }
        self.keyframe.clone()
    }
}

/// `ViewState`: a reader's state of one team's view stream.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewState {
    pub version: u64,
    pub view: Json,
}

/// `applyView`: a keyframe replaces the state; a delta applies only to
/// exactly the previous version of the same stream. `None` for a delta
/// without its base (a protocol error: rejoin for a keyframe) or one that
/// does not apply. `state` is not changed; unchanged subtrees are shared.
pub fn apply_view(state: Option<&ViewState>, message: &ViewMessage) -> Option<ViewState> {
    match &message.body {
        ViewBody::Keyframe(view) => Some(ViewState {
            version: message.version,
            view: view.clone(),
        }),
        ViewBody::Delta(d) => {
            let state = state?;
            if message.version == 0 || state.version != message.version - 1 {
                return None;
            }
            let view = apply(&state.view, d).ok()?;
            Some(ViewState {
                version: message.version,
                view,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn a_stream_is_a_keyframe_then_deltas_and_skips_unchanged_views() {
        let mut s = ViewStream::new("red");
        let f1 = s.publish(Json::from(json!({"hp":3,"seen":[]}))).unwrap();
        assert!(matches!(f1.message.body, ViewBody::Keyframe(_)));
        assert!(s.publish(Json::from(json!({"hp":3,"seen":[]}))).is_none());
        let f2 = s.publish(Json::from(json!({"hp":2,"seen":[]}))).unwrap();
        assert_eq!(f2.message.version, 2);
        assert_eq!(
            &*f2.text,
            r#"{"op":"view","team":"red","version":2,"delta":{"hp":[2]}}"#
        );
        let st = apply_view(None, &f1.message).unwrap();
        let st2 = apply_view(Some(&st), &f2.message).unwrap();
        assert_eq!(st2.view, Json::from(json!({"hp":2,"seen":[]})));
        // Shared with the previous state, not copied.
        assert!(st
            .view
            .get("seen")
            .unwrap()
            .ptr_eq(st2.view.get("seen").unwrap()));
        // The joiner's keyframe is built once and shared.
        let k1 = s.keyframe().unwrap();
        let k2 = s.keyframe().unwrap();
        assert!(Arc::ptr_eq(&k1, &k2));
        assert_eq!(apply_view(None, &k1.message).unwrap(), st2);
    }

    fn arb_view() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            any::<i8>().prop_map(serde_json::Value::from),
            "[a-c]{0,2}".prop_map(serde_json::Value::from)
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                prop::collection::btree_map("[a-c]", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn readers_follow_the_stream_and_refuse_deltas_on_the_wrong_version(
            views in prop::collection::vec(arb_view(), 2..8), skip in any::<prop::sample::Index>(),
        ) {
            let mut s = ViewStream::new("t");
            let frames: Vec<_> = views.iter().filter_map(|v| s.publish(Json::from(v))).collect();
            let mut state: Option<ViewState> = None;
            for f in &frames {
                state = apply_view(state.as_ref(), &f.message);
                prop_assert!(state.is_some());
            }
            prop_assert_eq!(&state.as_ref().unwrap().view, s.current().unwrap());
            // Any delta applied to a state other than exactly version - 1 is refused.
            let deltas: Vec<_> = frames.iter().filter(|f| matches!(f.message.body, ViewBody::Delta(_))).collect();
            if !deltas.is_empty() {
                let f = deltas[skip.index(deltas.len())];
                let wrong = [0, f.message.version, f.message.version + 1, f.message.version.saturating_sub(2)];
                for v in wrong {
                    if v + 1 == f.message.version { continue; }
                    let st = ViewState { version: v, view: Json::Null };
                    prop_assert!(apply_view(Some(&st), &f.message).is_none());
                }
                prop_assert!(apply_view(None, &f.message).is_none());
            }
        }
    }
}
