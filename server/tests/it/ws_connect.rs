//! Opening a WebSocket to the server with an API token (shared with the exec bench, which
//! includes this file).

/// The WebSocket handshake request for `url`, with `token` as its bearer.
pub fn bearer_request(
    url: &str,
    token: &str,
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let mut req =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url)
            .expect("ws request");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    req
}

/// Connects to `url` (a `ws://` URL served at `addr`) with `token` as its bearer.
pub async fn connect_with_token(
    addr: &str,
    url: &str,
    token: &str,
) -> Result<
    (
        tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
        tokio_tungstenite::tungstenite::handshake::client::Response,
    ),
    tokio_tungstenite::tungstenite::Error,
> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("tcp");
    tokio_tungstenite::client_async(bearer_request(url, token), tcp).await
}
