//! A cap on how long a watch may run without a newline. kube reads a watch line by line with
//! no limit, so an API server that never ends a line (a broken proxy, a hostile server) would
//! grow the daemon's memory without bound; the responses to the daemon's watch requests go
//! through [`LineCapped`], which fails the body instead. A watch line is one object (at most
//! 1.5 MiB in etcd). Lists are one line as long as the list and are not capped: a large
//! cluster's namespaces are legitimately more, and a list is bounded by its timeout.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The most bytes a watch response may carry without a newline.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// The layer for kube's client: [`WatchLineCap`] around its service.
#[derive(Clone, Copy, Debug, Default)]
pub struct WatchLineCapLayer;

impl<S> tower::Layer<S> for WatchLineCapLayer {
    type Service = WatchLineCap<S>;
    fn layer(&self, inner: S) -> WatchLineCap<S> {
        WatchLineCap(inner)
    }
}

/// Caps the bodies of responses to watch requests (`watch=true`) at [`MAX_LINE_BYTES`] per line;
/// other responses pass as they are.
#[derive(Clone, Debug)]
pub struct WatchLineCap<S>(S);

type Boxed<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for WatchLineCap<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<LineCapped<ResBody>>;
    type Error = S::Error;
    type Future = Boxed<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true"));
        let response = self.0.call(req);
        Box::pin(async move {
            let cap = watch.then_some(MAX_LINE_BYTES);
            Ok(response.await?.map(|body| LineCapped::new(body, cap)))
        })
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the API server sent more than {} MiB without ending a line", MAX_LINE_BYTES >> 20)]
pub struct LineTooLong;

/// `inner` with at most `cap` bytes between newlines (`None`: as it is).
pub struct LineCapped<B> {
    inner: B,
    cap: Option<usize>,
    /// Bytes since the last newline.
    run: usize,
}

impl<B> LineCapped<B> {
    pub fn new(inner: B, cap: Option<usize>) -> Self {
        LineCapped { inner, cap, run: 0 }
    }

    /// Counts `data`; whether the run without a newline is still within the cap.
    fn within_cap(&mut self, data: &[u8]) -> bool {
        let Some(cap) = self.cap else { return true };
        self.run = match data.iter().rposition(|&b| b == b'\n') {
            Some(at) => data.len() - at - 1,
            None => self.run.saturating_add(data.len()),
        };
        self.run <= cap
    }
}

impl<B> Body for LineCapped<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let Some(data) = frame.data_ref()
            && !self.within_cap(data)
        {
            return Poll::Ready(Some(Err(Box::new(LineTooLong))));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_restarts_at_each_newline() {
        let mut b = LineCapped::new((), Some(MAX_LINE_BYTES));
        assert!(b.within_cap(&vec![b'x'; MAX_LINE_BYTES - 1]));
        assert!(b.within_cap(b"y\nzz"));
        assert_eq!(b.run, 2);
        assert!(b.within_cap(&vec![b'x'; MAX_LINE_BYTES - 2]));
        assert!(!b.within_cap(b"x"));
        let mut list = LineCapped::new((), None);
        assert!(list.within_cap(&vec![b'x'; MAX_LINE_BYTES + 1]));
    }
}
