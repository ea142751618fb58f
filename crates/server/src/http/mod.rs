//! What every protocol's HTTP side shares: which origins may call
//! (with CORS from `tower-http`), errors as JSON responses, and the client's
//! IP address, credentials and per-IP creation limits. Nothing here knows
//! a protocol.

pub mod body_budget;
pub mod client_ip;
pub(crate) mod counted;
pub mod credentials;
pub mod error;
pub mod ip_rate;
pub mod origins;
pub mod serve;

pub use body_budget::{body_budget, LARGEST_REQUEST_BODY, REQUEST_BODY_BUDGET_BYTES};
pub use client_ip::client_ip;
pub use credentials::{
    bearer, same_secret, Bearer, CreationLimit, CredentialSettings, Gate, Presented, Refused,
};
pub use error::{html_response, json_response, ApiError};
pub use ip_rate::{PerIpRate, RetryAfter};
pub use origins::AllowedOrigins;
