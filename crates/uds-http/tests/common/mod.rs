//! The server both test files run: an echo handler on its own runtime thread.

use uds_http::StatusCode;
use uds_http::server::{self, bind, reply};

/// What `GET /big` answers: far more than a socket buffer holds.
pub const BIG: usize = 8 * 1024 * 1024;

/// Serves an echo handler (`/big`: [`BIG`] bytes) on `path` from a runtime on its own thread.
pub fn echo_server(path: std::path::PathBuf) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let listener = bind(&path).unwrap();
            tx.send(()).unwrap();
            server::serve(listener, "test", 1024, |req| async move {
                if req.uri().path() == "/big" {
                    return reply(StatusCode::OK, vec![b'x'; BIG]);
                }
                let text = format!(
                    "{} {} {}",
                    req.method(),
                    req.uri(),
                    String::from_utf8_lossy(req.body())
                );
                reply(StatusCode::OK, text)
            })
            .await
        })
    });
    rx.recv().unwrap();
}
