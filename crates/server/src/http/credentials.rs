//! Credentials, for every protocol: one reading of `Authorization: Bearer`,
//! one constant-time compare, the operator credential, wrong credentials
//! throttled per client IP, and per-IP limits on creations.
//!
//! Every endpoint that checks a credential goes through [`Gate::check`]:
//! an IP that presented too many wrong credentials is answered 429 (with
//! `Retry-After`) before its next one is even compared, so guessing costs
//! time whatever the endpoint.

use super::client_ip::{client_ip, limit_key};
use super::ip_rate::{PerIpRate, RetryAfter};
use super::json_response;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use hostwire_core::{Clock, Token};
use hostwire_memizy::relay::create::RoomCreationLimit;
use serde_json::json;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use subtle::ConstantTimeEq;

/// Wrong credentials one client IP may present per second, after its burst
/// (`WRONG_CREDENTIALS_PER_IP_PER_SECOND`).
pub const WRONG_CREDENTIALS_PER_IP_PER_SECOND: u32 = 1;
/// Wrong credentials one client IP may present at once
/// (`WRONG_CREDENTIAL_BURST_PER_IP`): a person mistyping is never held up.
pub const WRONG_CREDENTIAL_BURST_PER_IP: u32 = 10;
/// Client IPs whose wrong credentials are counted at once.
pub const WRONG_CREDENTIAL_IPS: usize = 65_536;
/// The shortest credential an operator may configure: a guessable one
/// would make the throttle the only defence.
pub const MIN_CREDENTIAL_CHARS: usize = 16;
/// The directory under the data directory where credentials made at first
/// start are kept (mode 0700, each file 0600).
pub const CREDENTIALS_DIR: &str = "credentials";
/// The file of the operator credential made at first start.
pub const OPERATOR_CREDENTIAL_FILE: &str = "operator.token";

/// The bearer token of a request: `Authorization: Bearer <token>`, the
/// scheme matched case-insensitively (RFC 9110 §11.1).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Whether a presented secret is the expected one, in time that depends
/// only on the expected one's length.
pub fn same_secret(given: &str, expected: &str) -> bool {
    given.len() == expected.len() && bool::from(given.as_bytes().ct_eq(expected.as_bytes()))
}

/// The bearer token of a request as an extractor (never refuses: a
/// handler decides what a missing one means).
#[derive(Debug, Clone, Default)]
pub struct Bearer(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for Bearer {
    type Rejection = Infallible;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(Bearer(bearer(&parts.headers).map(str::to_owned)))
    }
}

/// What a request presents, with the layer that judges it: the bearer
/// token, the client IP as limits count it, and the [`Gate`] (from the
/// router's `Extension`). Handlers take this instead of reading headers.
pub struct Presented {
    pub gate: Arc<Gate>,
    pub ip: String,
    pub token: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for Presented {
    type Rejection = Response;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Response> {
        let Some(gate) = parts.extensions.get::<Arc<Gate>>().cloned() else {
            // A router mounted without the layer: a bug, not the client's.
            return Err(json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &json!({ "error": "no credential layer" }),
            ));
        };
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
            .map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |c| c.0);
        Ok(Presented {
            ip: gate.client_key(&parts.headers, peer),
            token: bearer(&parts.headers).map(str::to_owned),
            gate,
        })
    }
}

impl Presented {
    /// [`Gate::check`] of the presented token.
    pub fn check<T>(&self, accept: impl FnOnce(&str) -> Option<T>) -> Result<T, Refused> {
        self.gate.check(&self.ip, self.token.as_deref(), accept)
    }

    /// [`Gate::check_operator`] of the presented token.
    pub fn operator(&self) -> Result<(), Refused> {
        self.gate.check_operator(&self.ip, self.token.as_deref())
    }
}

/// The settings of the credential layer.
#[derive(Debug, Clone)]
pub struct CredentialSettings {
    /// The operator credential (`HOSTWIRE_OPERATOR_TOKEN`): creating a
    /// PlayerThree match or a hosted Memizy session needs it. `None`: one
    /// is made for this run (the CLI keeps it in the data directory).
    pub operator_token: Option<String>,
    pub wrong_per_ip_per_second: u32,
    pub wrong_burst_per_ip: u32,
    /// PlayerThree matches one client IP may create per hour.
    pub matches_per_ip_per_hour: u32,
    /// ggui sessions one client IP may create per hour.
    pub ggui_sessions_per_ip_per_hour: u32,
    /// Bytes of request bodies the whole server handles at once
    /// (`REQUEST_BODY_BUDGET_BYTES`, at least `LARGEST_REQUEST_BODY`).
    pub request_body_budget_bytes: usize,
}

/// PlayerThree matches one client IP may create per hour, by default.
pub const MATCHES_PER_IP_PER_HOUR: u32 = 60;
/// ggui sessions one client IP may create per hour, by default (an agent
/// serving many users creates many from one address).
pub const GGUI_SESSIONS_PER_IP_PER_HOUR: u32 = 3_600;

impl Default for CredentialSettings {
    fn default() -> Self {
        Self {
            operator_token: None,
            wrong_per_ip_per_second: WRONG_CREDENTIALS_PER_IP_PER_SECOND,
            wrong_burst_per_ip: WRONG_CREDENTIAL_BURST_PER_IP,
            matches_per_ip_per_hour: MATCHES_PER_IP_PER_HOUR,
            ggui_sessions_per_ip_per_hour: GGUI_SESSIONS_PER_IP_PER_HOUR,
            request_body_budget_bytes: super::REQUEST_BODY_BUDGET_BYTES,
        }
    }
}

/// Creations per client IP in the last hour (the relay's rooms, hosted
/// sessions, PlayerThree matches, ggui sessions: each kind counted apart),
/// swept on each creation so it holds only IPs that created one within the
/// hour.
#[derive(Debug)]
pub struct CreationLimit {
    /// What is created, for the refusal ("rooms", "matches", …).
    what: &'static str,
    /// The setting that raises it.
    setting: &'static str,
    inner: Mutex<RoomCreationLimit>,
}

impl CreationLimit {
    pub fn new(per_hour: u32, what: &'static str, setting: &'static str) -> Self {
        Self {
            what,
            setting,
            inner: Mutex::new(RoomCreationLimit::new(per_hour)),
        }
    }

    /// Counts a creation by `ip` (a [`limit_key`]), or says when it may.
    pub fn try_create(&self, ip: &str, now_ms: u64) -> Result<(), RetryAfter> {
        let mut l = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        l.sweep(now_ms);
        l.create_or_wait(ip, now_ms).map_err(RetryAfter::from_ms)
    }

    /// [`Self::try_create`] with a refusal that answers 429,
    /// `Retry-After`, `{"error"}` naming the setting.
    pub fn admit(&self, ip: &str, now_ms: u64) -> Result<(), TooManyCreations> {
        self.try_create(ip, now_ms)
            .map_err(|retry| TooManyCreations {
                what: self.what,
                setting: self.setting,
                retry,
            })
    }

    pub fn sweep(&self, now_ms: u64) {
        let mut l = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        l.sweep(now_ms);
    }
}

/// A creation refused by its per-IP limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyCreations {
    what: &'static str,
    setting: &'static str,
    pub retry: RetryAfter,
}

impl axum::response::IntoResponse for TooManyCreations {
    fn into_response(self) -> Response {
        let message = format!(
            "Too many {} from this network ({}); try again in {} s.",
            self.what, self.setting, self.retry.seconds
        );
        too_many(&message, self.retry)
    }
}

/// 429 with `Retry-After` and `{"error": message}`.
pub fn too_many(message: &str, retry: RetryAfter) -> Response {
    let mut r = json_response(StatusCode::TOO_MANY_REQUESTS, &json!({ "error": message }));
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry.seconds));
    r
}

/// Why a credential was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// None was presented.
    Missing,
    /// A wrong one was presented (and counted against the IP).
    Wrong,
    /// The IP presented too many wrong ones: not even compared.
    Throttled(RetryAfter),
}

/// The credential layer every endpoint shares.
pub struct Gate {
    operator_text: String,
    wrong: PerIpRate,
    clock: Arc<dyn Clock>,
    trust_proxy: bool,
    hops: usize,
    /// `POST /playerthree/matches` per client IP.
    pub matches: CreationLimit,
    /// ggui session creations per client IP.
    pub ggui_sessions: CreationLimit,
    /// The server-wide budget of request-body bytes (`body_budget`).
    bodies: Arc<tokio::sync::Semaphore>,
    body_budget_bytes: usize,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").finish_non_exhaustive()
    }
}

impl Gate {
    pub fn new(
        settings: &CredentialSettings,
        clock: Arc<dyn Clock>,
        trust_proxy: bool,
        hops: usize,
    ) -> Gate {
        let operator_text = settings
            .operator_token
            .clone()
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| Token::generate().as_str().to_owned());
        // A budget under the largest body would refuse that route forever;
        // the semaphore's permits are counted in u32.
        let budget = settings
            .request_body_budget_bytes
            .clamp(super::LARGEST_REQUEST_BODY, u32::MAX as usize);
        Gate {
            operator_text,
            wrong: PerIpRate::new(
                settings.wrong_per_ip_per_second,
                settings.wrong_burst_per_ip,
                WRONG_CREDENTIAL_IPS,
            ),
            clock,
            trust_proxy,
            hops: hops.max(1),
            matches: CreationLimit::new(
                settings.matches_per_ip_per_hour,
                "matches",
                "MATCHES_PER_IP_PER_HOUR",
            ),
            ggui_sessions: CreationLimit::new(
                settings.ggui_sessions_per_ip_per_hour,
                "ggui sessions",
                "GGUI_SESSIONS_PER_IP_PER_HOUR",
            ),
            bodies: Arc::new(tokio::sync::Semaphore::new(budget)),
            body_budget_bytes: budget,
        }
    }

    /// The server-wide budget of request-body bytes.
    pub fn bodies(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.bodies
    }

    pub fn body_budget_bytes(&self) -> usize {
        self.body_budget_bytes
    }

    /// The operator credential in force (for the CLI and tests).
    pub fn operator_token(&self) -> &str {
        &self.operator_text
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The client IP of a request as limits count it.
    pub fn client_key(&self, headers: &HeaderMap, peer: SocketAddr) -> String {
        limit_key(&client_ip(headers, peer, self.trust_proxy, self.hops))
    }

    /// Checks a presented credential with `accept` (which compares it with
    /// [`same_secret`] or looks it up by hash). A throttled IP is refused
    /// before `accept` runs; a wrong credential is counted against it.
    pub fn check<T>(
        &self,
        ip: &str,
        given: Option<&str>,
        accept: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T, Refused> {
        let now = self.clock.now_ms();
        if let Err(retry) = self.wrong.peek(ip, now) {
            return Err(Refused::Throttled(retry));
        }
        let Some(given) = given else {
            return Err(Refused::Missing);
        };
        match accept(given) {
            Some(t) => Ok(t),
            None => {
                let _ = self.wrong.try_take(ip, now);
                Err(Refused::Wrong)
            }
        }
    }

    /// [`Self::check`] of the operator credential.
    pub fn check_operator(&self, ip: &str, given: Option<&str>) -> Result<(), Refused> {
        self.check(ip, given, |g| {
            same_secret(g, &self.operator_text).then_some(())
        })
    }

    /// Forgets what has refilled or aged out (the sweep timer calls it).
    pub fn sweep(&self) {
        let now = self.clock.now_ms();
        self.wrong.sweep(now);
        self.matches.sweep(now);
        self.ggui_sessions.sweep(now);
    }
}

impl Refused {
    /// The refusal as `{"error"}` with 401 (and `WWW-Authenticate`) or 429
    /// (and `Retry-After`); `what` names the credential expected.
    pub fn response(self, what: &str) -> Response {
        match self {
            Refused::Throttled(retry) => too_many(
                &format!(
                    "Too many wrong credentials from this network (WRONG_CREDENTIALS_PER_IP_PER_SECOND); try again in {} s.",
                    retry.seconds
                ),
                retry,
            ),
            Refused::Missing | Refused::Wrong => {
                let message = if self == Refused::Missing {
                    format!("Authorization: Bearer <{what}> is required")
                } else {
                    format!("Authorization: not a valid {what}")
                };
                let mut r = json_response(StatusCode::UNAUTHORIZED, &json!({ "error": message }));
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"hostwire\""),
                );
                r
            }
        }
    }
}

/// A credential kept in a file of the data directory: read when the file
/// exists, else made (`hostwire_core::token`) and written (mode 0600).
/// Returns the credential and the file's path.
pub fn load_or_make(data_dir: &Path, file: &str) -> std::io::Result<(String, PathBuf)> {
    let dir = data_dir.join(CREDENTIALS_DIR);
    std::fs::create_dir_all(&dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let path = dir.join(file);
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => return Ok((text.trim().to_owned(), path)),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let token = Token::generate().as_str().to_owned();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    use std::io::Write;
    let mut f = options.open(&path)?;
    f.write_all(token.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    Ok((token, path))
}

/// A configured credential, refused when it is too short to resist guessing.
pub fn checked_credential(setting: &str, value: &str) -> anyhow::Result<String> {
    let v = value.trim();
    if v.chars().count() < MIN_CREDENTIAL_CHARS {
        anyhow::bail!(
            "{setting}: a credential needs at least {MIN_CREDENTIAL_CHARS} characters (leave it unset to have one made)"
        );
    }
    Ok(v.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostwire_core::ManualClock;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, v.parse().unwrap());
        h
    }

    #[test]
    fn the_scheme_is_case_insensitive_and_the_token_trimmed() {
        assert_eq!(bearer(&headers("Bearer abc")), Some("abc"));
        assert_eq!(bearer(&headers("bearer abc")), Some("abc"));
        assert_eq!(bearer(&headers("BEARER  abc ")), Some("abc"));
        assert_eq!(bearer(&headers("Basic abc")), None);
        assert_eq!(bearer(&headers("Bearer")), None);
        assert_eq!(bearer(&headers("Bearer ")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }

    #[test]
    fn same_secret_needs_every_byte() {
        assert!(same_secret("abcdef", "abcdef"));
        assert!(!same_secret("abcdeg", "abcdef"));
        assert!(!same_secret("abcde", "abcdef"));
        assert!(!same_secret("", "abcdef"));
    }

    #[test]
    fn wrong_credentials_are_throttled_per_ip_and_a_right_one_waits_too() {
        let clock = ManualClock::new(0);
        let settings = CredentialSettings {
            operator_token: Some("operator-credential-0123".into()),
            wrong_per_ip_per_second: 1,
            wrong_burst_per_ip: 3,
            ..Default::default()
        };
        let g = Gate::new(&settings, Arc::new(clock.clone()), false, 1);
        for _ in 0..3 {
            assert_eq!(g.check_operator("a", Some("nope")), Err(Refused::Wrong));
        }
        assert!(matches!(
            g.check_operator("a", Some("operator-credential-0123")),
            Err(Refused::Throttled(_))
        ));
        assert_eq!(
            g.check_operator("b", Some("operator-credential-0123")),
            Ok(())
        );
        assert_eq!(g.check_operator("b", None), Err(Refused::Missing));
        clock.advance_ms(1_000);
        assert_eq!(
            g.check_operator("a", Some("operator-credential-0123")),
            Ok(())
        );
    }

    #[test]
    fn a_credential_made_at_first_start_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (a, path) = load_or_make(dir.path(), "x.token").unwrap();
        let (b, again) = load_or_make(dir.path(), "x.token").unwrap();
        assert_eq!(a, b);
        assert_eq!(path, again);
        assert!(Token::parse(&a).is_some());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
