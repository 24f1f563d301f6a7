//! `/verify-email`: where the link of a verification mail lands (docs/notifications.md).
//!
//! The link opens a page with one button rather than verifying on `GET`, so a mail
//! scanner that fetches links does not act for the reader. The button posts the link's
//! `user` and `token` here (same origin, no sign-in needed: the token proves the mailbox).

use crate::AppState;
use crate::notify::mail::escape as escape_html;
use axum::Form;
use axum::Router;
use axum::extract::{Query, State};
use axum::response::Html;
use axum::routing::get;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Link {
    user: tessera_domain::ids::UserId,
    token: String,
}

pub fn router() -> Router<AppState> {
    Router::new().route("/verify-email", get(page).post(verify))
}

fn shell(title: &str, body: &str) -> Html<String> {
    Html(format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · Tessera</title></head><body><main><h1>{}</h1>{body}</main></body></html>",
        escape_html(title),
        escape_html(title)
    ))
}

async fn page(Query(link): Query<Link>) -> Html<String> {
    shell(
        "Verify your email address",
        &format!(
            "<p>Confirm that this address may receive Tessera's notifications.</p>\
             <form method=\"post\" action=\"/verify-email\">\
             <input type=\"hidden\" name=\"user\" value=\"{}\">\
             <input type=\"hidden\" name=\"token\" value=\"{}\">\
             <button type=\"submit\">Verify this address</button></form>",
            link.user,
            escape_html(&link.token)
        ),
    )
}

async fn verify(State(state): State<AppState>, Form(link): Form<Link>) -> Html<String> {
    match state
        .services
        .notifications
        .verify_email(link.user, &link.token)
        .await
    {
        Ok(()) => shell(
            "Address verified",
            "<p>Notifications will be mailed there. <a href=\"/account\">Back to My account</a></p>",
        ),
        Err(e) => shell(
            "This link does not work",
            &format!(
                "<p>{}</p><p><a href=\"/account\">My account</a></p>",
                escape_html(&e.to_string())
            ),
        ),
    }
}
