//! Bookings: capacity a team holds for a future window, and the calendar of them.

use super::*;
use chrono::{DateTime, Duration, Utc};
use tessera_domain::booking::{BookingView, NewBooking};

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(super) struct CalendarQuery {
    /// Start of the range (RFC 3339); now when absent.
    from: Option<DateTime<Utc>>,
    /// End of the range (RFC 3339, at most 62 days after `from`); `from` + 7 days when absent.
    to: Option<DateTime<Utc>>,
    /// Only this GPU model's (`H100-80GB`).
    model: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/bookings", tag = "bookings", params(CalendarQuery),
    description = "The booking calendar: every live booking overlapping the range, by start. \
        Another team's booking shows only that the capacity is taken (no id, team, purpose or \
        booker), except to platform admins.",
    responses((status = 200, description = "OK", body = Vec<BookingView>), Invalid))]
pub(super) async fn list_bookings(
    Call(s, p): Call,
    Query(q): Query<CalendarQuery>,
) -> ApiResult<Vec<BookingView>> {
    let from = q.from.unwrap_or_else(Utc::now);
    let to = q.to.unwrap_or(from + Duration::days(7));
    ok(s.allocations
        .bookings(&p, from, to, q.model.as_deref())
        .await)
}

#[utoipa::path(post, path = "/api/v1/bookings", tag = "bookings", request_body = NewBooking,
    description = "Books `count` of `kind` for the team from `starts_at` to `ends_at` (team \
        admins and platform admins). Admitted now against the team's limit for that window and \
        the capacity other bookings hold; refused with the reason (409 when fully booked, 422 \
        naming the field otherwise). Shortly before the start the booking becomes an allocation \
        placed ahead of the queue; work borrowing the capacity is warned through the deadline \
        channel and preempted in time.",
    responses((status = 201, description = "Created", body = BookingView), Forbidden, NotFound, Conflict, Invalid))]
pub(super) async fn create_booking(
    Call(s, p): Call,
    JsonBody(b): JsonBody<NewBooking>,
) -> Created<BookingView> {
    created(s.allocations.book(&p, &b).await)
}

#[utoipa::path(get, path = "/api/v1/bookings/{id}", tag = "bookings",
    description = "One booking of the caller's team; another team's is 404.",
    responses((status = 200, description = "OK", body = BookingView), NotFound))]
pub(super) async fn get_booking(Call(s, p): Call, Path(id): Path<Uuid>) -> ApiResult<BookingView> {
    ok(s.allocations.booking(&p, id).await)
}

#[utoipa::path(post, path = "/api/v1/bookings/{id}/cancel", tag = "bookings",
    description = "Cancels a booking (team admins of its team, platform admins): the capacity is \
        free again, warnings it gave are withdrawn, and its allocation, if it started, released.",
    responses((status = 200, description = "OK", body = BookingView), Forbidden, NotFound, Conflict))]
pub(super) async fn cancel_booking(
    Call(s, p): Call,
    Path(id): Path<Uuid>,
) -> ApiResult<BookingView> {
    ok(s.allocations.cancel_booking(&p, id).await)
}
