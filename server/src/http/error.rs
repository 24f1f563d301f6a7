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
