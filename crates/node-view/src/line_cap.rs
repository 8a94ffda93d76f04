//! A cap on how long a response may run without a newline. kube reads a watch line by line
//! with no limit and a list body whole, so an API server that never ends a line (a broken
//! proxy, a hostile server) would grow the daemon's memory without bound; every response body
//! the daemon's client reads goes through [`LineCapped`], which fails the body instead. One
//! object is at most 1.5 MiB in etcd; the cap leaves room for the largest lists of a node's
//! pods or a cluster's namespaces.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// The most bytes a response may carry without a newline (a watch line, a whole list).
pub const MAX_LINE_BYTES: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
#[error("the API server sent more than {} MiB without ending a line", MAX_LINE_BYTES >> 20)]
pub struct LineTooLong;

/// `inner` with [`MAX_LINE_BYTES`] enforced.
pub struct LineCapped<B> {
    inner: B,
    /// Bytes since the last newline.
    run: usize,
}

impl<B> LineCapped<B> {
    pub fn new(inner: B) -> Self {
        LineCapped { inner, run: 0 }
    }

    /// Counts `data`; whether the run without a newline is still within the cap.
    fn within_cap(&mut self, data: &[u8]) -> bool {
        self.run = match data.iter().rposition(|&b| b == b'\n') {
            Some(at) => data.len() - at - 1,
            None => self.run.saturating_add(data.len()),
        };
        self.run <= MAX_LINE_BYTES
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
        let mut b = LineCapped::new(());
        assert!(b.within_cap(&vec![b'x'; MAX_LINE_BYTES - 1]));
        assert!(b.within_cap(b"y\nzz"));
        assert_eq!(b.run, 2);
        assert!(b.within_cap(&vec![b'x'; MAX_LINE_BYTES - 2]));
        assert!(!b.within_cap(b"x"));
    }
}
