//! UI tokens: minted by an agent for its session's user interface, each
//! admitting a `/ggui/ws` socket to that one session.

use super::gate::{owned, AgentApp};
use super::{api_error, gone};
use crate::ggui::Ggui;
use crate::http::json_response;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use hostwire_playerthree::tokens::TokenHash;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;

/// UI tokens kept per session; minting past it forgets the oldest.
pub const MAX_UI_TOKENS_PER_SESSION: usize = 64;

/// The UI tokens minted through the agent API, by the hash of their text:
/// each admits a `/ggui/ws` socket to one session of one app. Kept in
/// memory: after a restart the agent mints new ones.
#[derive(Default)]
pub struct UiTokens {
    by_hash: std::sync::Mutex<HashMap<TokenHash, (String, String)>>,
}

impl UiTokens {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TokenHash, (String, String)>> {
        self.by_hash.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new token for `session` of `app`, its text led by `prefix` (on a
    /// cluster: which node minted it, so that any node can carry its
    /// socket there).
    pub(super) fn mint(&self, session: &str, app: &str, prefix: &str) -> String {
        let token = format!("{prefix}{}", hostwire_core::Token::generate().as_str());
        let mut t = self.lock();
        let of_session: Vec<TokenHash> = t
            .iter()
            .filter(|(_, (s, _))| s == session)
            .map(|(h, _)| *h)
            .collect();
        // Oldest first is not known from a map: any one goes (each is
        // equally a credential of the session).
        if of_session.len() >= MAX_UI_TOKENS_PER_SESSION {
            t.remove(&of_session[0]);
        }
        t.insert(TokenHash::of(&token), (session.to_owned(), app.to_owned()));
        token
    }

    /// The session and app a presented UI token is for.
    pub(crate) fn lookup(&self, token: &str) -> Option<(String, String)> {
        self.lock().get(&TokenHash::of(token)).cloned()
    }
}

/// `POST /ggui/sessions/{id}/ui-tokens`: a token for the session's user
/// interface, bound to this session and app: what a `/ggui/ws` socket
/// presents (`Authorization: Bearer` or `?token=`).
pub(super) async fn mint_ui_token(
    State(ggui): State<Arc<Ggui>>,
    Extension(AgentApp(app)): Extension<AgentApp>,
    Path(id): Path<String>,
) -> Response {
    let sid = id.clone();
    let owner = Arc::clone(&app);
    match ggui.call(move |core| owned(core, &owner, &sid)).await {
        None => gone(),
        Some(Err(e)) => api_error(e),
        Some(Ok(())) => {
            let token = ggui.ui_tokens.mint(&id, &app, &ggui.token_prefix());
            json_response(
                StatusCode::CREATED,
                &json!({ "token": token, "sessionId": id }),
            )
        }
    }
}
