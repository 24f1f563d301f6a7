//! `AppError` as an HTTP response: the status from [`AppError::status`] and a stable JSON
//! body `{"error": {"kind": …, …}, "message": "…"}`.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde::Serialize;
use tessera_domain::error::AppError;

#[derive(Debug)]
pub struct ApiError(pub AppError);

impl From<AppError> for ApiError {
    fn from(e: AppError) -> Self {
        ApiError(e)
    }
}

/// The error body every `/api/v1` and `/agent/v1` route uses.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// `{"kind": "not_found"}`, `{"kind": "invalid", "field": …, "message": …}`, …
    #[schema(value_type = Object)]
    pub error: AppError,
    /// A human-readable sentence.
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let retry = match &self.0 {
            AppError::RateLimited { retry_after_secs } => Some(retry_after_secs.to_string()),
            _ => None,
        };
        let body = ErrorBody {
            message: self.0.to_string(),
            error: self.0,
        };
        let mut res = (status, Json(body)).into_response();
        if let Some(v) = retry.and_then(|r| http::HeaderValue::from_str(&r).ok()) {
            res.headers_mut().insert(http::header::RETRY_AFTER, v);
        }
        res
    }
}

/// JSON bodies that fail to parse become `invalid` errors naming what was wrong.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(JsonBody(v)),
            Err(e) => Err(ApiError(AppError::invalid("body", e.body_text()))),
        }
    }
}

/// Path parameters (`{id}`, `{id}/…/{user_id}`) as typed values. A value that does not
/// parse (an id that is not a UUID) names nothing that exists, so it is a 404 like any
/// other missing object, not axum's 400.
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct Path<T>(pub T);

/// Query strings (`?team=…&from=…`) as typed values; one that does not parse is an
/// `invalid` error in the API's JSON shape naming what was wrong, not axum's plain-text 400.
#[derive(axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Query<T>(pub T);

impl From<axum::extract::rejection::QueryRejection> for ApiError {
    fn from(e: axum::extract::rejection::QueryRejection) -> Self {
        ApiError(AppError::invalid("query", e.body_text()))
    }
}

impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(_: axum::extract::rejection::PathRejection) -> Self {
        ApiError(AppError::NotFound)
    }
}

// The error responses routes share, for `responses(…)` in `#[utoipa::path]`: list the
// success response as a tuple, then the error sets the route can answer.

/// 401: no valid session or token.
#[derive(utoipa::IntoResponses)]
#[response(status = 401, description = "Not signed in")]
pub struct Unauthorized(#[allow(dead_code)] ErrorBody);

/// 403: signed in, but the role does not allow it.
#[derive(utoipa::IntoResponses)]
#[response(status = 403, description = "Not allowed")]
pub struct Forbidden(#[allow(dead_code)] ErrorBody);

/// 404: missing, or another team's (the two are indistinguishable).
#[derive(utoipa::IntoResponses)]
#[response(status = 404, description = "Not found (or another team's)")]
pub struct NotFound(#[allow(dead_code)] ErrorBody);

/// 409: conflicts with the current state.
#[derive(utoipa::IntoResponses)]
#[response(status = 409, description = "Conflicts with the current state")]
pub struct Conflict(#[allow(dead_code)] ErrorBody);

/// 422: invalid input; the error names the field.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 422,
    description = "Invalid input (the error names the field)"
)]
pub struct Invalid(#[allow(dead_code)] ErrorBody);
