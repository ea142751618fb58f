//! What every protocol's HTTP side shares: which origins may call
//! (with CORS from `tower-http`), errors as JSON responses, and the client's
//! IP address. Nothing here knows a protocol.

pub mod client_ip;
pub mod error;
pub mod ip_rate;
pub mod origins;
pub mod serve;

pub use client_ip::client_ip;
pub use error::{json_response, ApiError};
pub use ip_rate::{PerIpRate, RetryAfter};
pub use origins::AllowedOrigins;
