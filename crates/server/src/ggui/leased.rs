//! ggui sessions on a cluster (PostgreSQL): each is served by the node
//! holding its lease, as relay rooms, hosted sessions and matches are.
//!
//! - A session is leased before its creation is answered, and every
//!   write of it carries the lease's generation (the writer is fenced).
//! - An API call for a session this node does not hold takes it over from
//!   the store when its lease is free (restoring it alone into the one
//!   channel), or answers 503 while a live node holds it; the request is
//!   then carried to that node (`cluster::tunnel::http`).
//! - A lost lease drops the session from the channel: its sockets are
//!   closed with 1012 and its long polls end, to come again through any
//!   node. A session that expires lets its lease go.
//!
//! UI sockets (`/ggui/ws`) are admitted by UI tokens, which each node
//! keeps in memory (after a restart the agent mints new ones). On a
//! cluster with NATS a token's text begins with the hex of the node that
//! minted it and a '.': a node that does not know a token carries its
//! socket to that node, which checks the token.

use super::records::restored;
use super::{session_span, Cmd, Ggui};
use crate::cluster::leases::{Restored, TakeOver, Units};
use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use hostwire_store::lease::UnitKind;
use std::sync::Arc;

/// The sessions as the leases see them.
impl Units for Ggui {
    fn lose_unit(&self, key: &str) {
        let id = key.to_owned();
        let tx = self.tx.clone();
        // Queued behind what the channel holds: a full queue is waited for.
        tokio::spawn(async move {
            let _ = tx
                .send(Cmd::Call(Box::new(move |core| core.lose(&id))))
                .await;
        });
    }

    async fn restore_unit(self: Arc<Self>, key: &str) -> Restored {
        self.restore_one(key).await
    }
}

impl super::Core {
    /// Lets go of a session another node now serves.
    fn lose(&mut self, id: &str) {
        if self.unit.channel.drop_session(id) {
            // Long polls end (answered with what they have) and come again.
            self.waiters.remove(id);
            session_span(id).in_scope(|| tracing::warn!("ggui session lost to another node"));
        }
    }
}

impl Ggui {
    /// Reads session `id` from the store into the channel (its lease was
    /// just taken).
    async fn restore_one(&self, id: &str) -> Restored {
        let Some(store) = self.store.clone() else {
            return Restored::Failed;
        };
        let key = id.to_owned();
        let stored = match crate::blocking::spawn(move || store.ggui_load_session(&key)).await {
            Ok(Ok(Some(s))) => s,
            Ok(Ok(None)) => return Restored::Gone,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, session = id, "ggui session not restored: the store failed");
                return Restored::Failed;
            }
            Err(_) => return Restored::Failed,
        };
        let session = match restored(stored) {
            Ok(s) => s,
            Err(e) => {
                session_span(id)
                    .in_scope(|| tracing::warn!(error = %e, "ggui session not restored"));
                return Restored::Failed;
            }
        };
        let sid = id.to_owned();
        let done = self
            .call(move |core| {
                let r = core.unit.channel.restore_session(session);
                core.touch(&sid);
                r
            })
            .await;
        match done {
            Some(Ok(())) => {
                session_span(id).in_scope(|| tracing::info!("ggui session taken over"));
                Restored::Serving
            }
            _ => Restored::Failed,
        }
    }

    /// Whether the channel holds session `id` now.
    async fn holds(&self, id: &str) -> Option<bool> {
        let id = id.to_owned();
        self.call(move |core| core.unit.channel.session_app(&id).is_some())
            .await
    }
}

fn unavailable(message: &str) -> Response {
    super::api::unavailable(message)
}

/// Before every agent call on a cluster: the session is this node's (held,
/// taken over, or leased for its creation), or the call is answered 503
/// (carried to the live owner when there is one).
pub(super) async fn find_session(
    State(ggui): State<Arc<Ggui>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(leases) = ggui.leases.clone() else {
        return next.run(req).await;
    };
    let Some(id) = req
        .uri()
        .path()
        .trim_start_matches('/')
        .split('/')
        .next()
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
    else {
        return next.run(req).await;
    };
    match ggui.holds(&id).await {
        Some(true) => return next.run(req).await,
        Some(false) => {}
        None => return unavailable("the server is shutting down"),
    }
    let store = ggui.store.clone();
    let key = id.clone();
    let stored = match crate::blocking::spawn(move || {
        store.map(|s| s.ggui_load_session(&key).map(|s| s.is_some()))
    })
    .await
    {
        Ok(Some(Ok(s))) => s,
        _ => return unavailable("the session could not be read from the store; try again"),
    };
    if stored {
        return match leases.take_over(UnitKind::GguiSession, &id).await {
            TakeOver::Serving | TakeOver::Gone => next.run(req).await,
            TakeOver::Elsewhere(_) => {
                unavailable("the session is served by another node; try again")
            }
            TakeOver::Failed => unavailable("the session could not be taken over; try again"),
        };
    }
    // A new session is this node's before its creation is answered.
    if req.method() != Method::PUT {
        return next.run(req).await;
    }
    match leases.acquire(UnitKind::GguiSession, &id).await {
        Ok(Ok(_)) => {
            let answer = next.run(req).await;
            if !answer.status().is_success() {
                leases.release(UnitKind::GguiSession, &id).await;
            }
            answer
        }
        Ok(Err(held)) => {
            crate::cluster::tunnel::http::note_owner(&held.owner);
            unavailable("the session is served by another node; try again")
        }
        Err(_) => unavailable("the session could not be leased to this node; try again"),
    }
}

/// What the store holds, taken over where nobody holds it (a cluster's
/// start-up): the others are left to their owners.
pub(super) fn take_over_stored(ggui: &Arc<Ggui>, ids: Vec<String>) {
    let Some(leases) = ggui.leases.clone() else {
        return;
    };
    tokio::spawn(async move {
        for id in ids {
            leases.take_over(UnitKind::GguiSession, &id).await;
        }
    });
}

/// Lets the leases of expired sessions go.
pub(super) fn release_expired(
    leases: &Option<Arc<crate::cluster::leases::Leases>>,
    ids: &[String],
) {
    let Some(leases) = leases.clone() else {
        return;
    };
    let ids = ids.to_vec();
    tokio::spawn(async move {
        for id in ids {
            leases.release(UnitKind::GguiSession, &id).await;
        }
    });
}

/// The ggui live channel's name on a tunnel between nodes.
const TUNNEL_PROTOCOL: &str = "ggui";

impl Ggui {
    /// Carries UI sockets whose token another node minted there, and
    /// serves the sockets other nodes carry here.
    pub fn use_tunnels(self: &Arc<Self>, tunnels: Arc<crate::cluster::tunnel::Tunnels>) {
        let ggui = Arc::clone(self);
        tunnels.accept(
            TUNNEL_PROTOCOL,
            crate::cluster::tunnel::Acceptor {
                config: Arc::new(super::ws::socket_config(self.config.outbound_queue)),
                run: Box::new(move |c, client| Box::pin(carried(Arc::clone(&ggui), c, client))),
            },
        );
        let _ = self.tunnels.set(tunnels);
    }

    /// What this node's UI tokens begin with: on a cluster with NATS, its
    /// id in hex and a '.'; else nothing.
    pub(super) fn token_prefix(&self) -> String {
        match self.tunnels.get() {
            Some(t) => format!("{}.", crate::cluster::tunnel::hex(t.node())),
            None => String::new(),
        }
    }

    /// The node that minted `token`, when it is another live node's and
    /// this node can carry the socket there.
    pub(super) fn minted_elsewhere(&self, token: &str) -> Option<String> {
        let t = self.tunnels.get()?;
        let (hex, _) = token.split_once('.')?;
        let node = unhex(hex)?;
        (node != t.node()).then_some(node)
    }

    /// Carries a UI socket to the node that minted its token.
    pub(super) async fn carry_ui(
        self: Arc<Self>,
        owner: String,
        token: String,
        c: crate::ws::Connection,
    ) {
        let Some(t) = self.tunnels.get() else { return };
        let route = crate::cluster::tunnel::Route {
            owner: &owner,
            protocol: TUNNEL_PROTOCOL,
            ip: "",
            handshake: &token,
        };
        Arc::clone(t)
            .bridge(route, Vec::new(), c.reader, |out| {
                out.close((
                    crate::ws::CLOSE_TOO_SLOW,
                    "the node of this UI token cannot be reached; try again",
                ))
            })
            .await;
    }
}

fn unhex(s: &str) -> Option<String> {
    if s.is_empty()
        || !s.len().is_multiple_of(2)
        || s.len() > 2 * crate::cluster::peers::MAX_NODE_ID_LEN
    {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// A UI socket another node carried here: its token is checked here,
/// where it was minted.
async fn carried(
    ggui: Arc<Ggui>,
    c: crate::ws::Connection,
    client: crate::cluster::tunnel::Client,
) {
    match ggui.ui_tokens.lookup(&client.handshake) {
        Some(bound) => super::ws::handle_socket(ggui, c, bound).await,
        None => {
            c.out.close((1008, "a UI token of the session is required"));
            c.reader.finish().await;
        }
    }
}
