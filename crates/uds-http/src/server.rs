//! A root-only socket and its accept loop: each request's body is read (bounded) before the
//! handler sees it, and each connection is served in its own task.

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Response, StatusCode};
use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;
use tokio::net::UnixListener;

/// What a handler answers.
pub type Reply = Response<Full<Bytes>>;
/// What a handler gets: the request with its whole body.
pub type Request = hyper::Request<Bytes>;

/// A plain-text answer.
pub fn reply(status: StatusCode, text: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(Full::new(text.into()));
    *r.status_mut() = status;
    r
}

/// A JSON answer (200).
pub fn json(body: Vec<u8>) -> Reply {
    let mut r = reply(StatusCode::OK, body);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// Binds `path` with mode 0600 (`node_fs::prepare_socket`: its directory ours and never a
/// planted link, a stale socket replaced, anything else at the name refused).
/// Must be called inside a tokio runtime.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    node_fs::prepare_socket(path)?;
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Accepts until the task is dropped. `max_body` bounds every request body (larger: 413
/// without calling the handler); `name` labels the logs.
pub async fn serve<H, F>(listener: UnixListener, name: &'static str, max_body: usize, handler: H)
where
    H: Fn(Request) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Reply> + Send + 'static,
{
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(socket = name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let handler = handler.clone();
                async move { Ok::<_, std::convert::Infallible>(read_then(req, max_body, handler).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, svc)
                .await
            {
                tracing::debug!(socket = name, error = %e, "connection ended");
            }
        });
    }
}

async fn read_then<H, F>(req: hyper::Request<Incoming>, max_body: usize, handler: H) -> Reply
where
    H: Fn(Request) -> F,
    F: Future<Output = Reply>,
{
    let (parts, body) = req.into_parts();
    match Limited::new(body, max_body).collect().await {
        Ok(b) => handler(hyper::Request::from_parts(parts, b.to_bytes())).await,
        Err(e) => reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("reading the body: {e}"),
        ),
    }
}
