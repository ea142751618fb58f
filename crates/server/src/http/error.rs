//! Errors as responses: `{"error": "…"}` with a status, as the protocols'
//! HTTP APIs answer them.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// `application/json; charset=utf-8`, the type of every JSON answer.
pub const JSON_UTF8: HeaderValue = HeaderValue::from_static("application/json; charset=utf-8");

/// A JSON body with a status.
pub fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, JSON_UTF8);
    r
}

/// A page of the server's own: HTML under its own Content Security Policy.
pub fn html_response(body: impl Into<axum::body::Body>, policy: &'static str) -> Response {
    let mut r = Response::new(body.into());
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        axum::http::HeaderValue::from_static(policy),
    );
    r
}

/// An error answer: a status and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: &'static str,
}

impl ApiError {
    pub const fn new(status: StatusCode, message: &'static str) -> Self {
        Self { status, message }
    }
    pub const NOT_FOUND: ApiError = ApiError::new(StatusCode::NOT_FOUND, "Not found");
    pub const METHOD_NOT_ALLOWED: ApiError =
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed");
    pub const ORIGIN_NOT_ALLOWED: ApiError =
        ApiError::new(StatusCode::FORBIDDEN, "Origin not allowed");
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.status, &json!({ "error": self.message }))
    }
}

/// The fallback of an API: an unknown path.
pub async fn not_found() -> ApiError {
    ApiError::NOT_FOUND
}

/// The fallback of a known path: a method it does not answer.
pub async fn method_not_allowed() -> ApiError {
    ApiError::METHOD_NOT_ALLOWED
}
