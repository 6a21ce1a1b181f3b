//! [`InOrder`]: waits for work already under way that finish in the order they were
//! queued (acknowledgements of a pipeline's appends, a WAL writer's chunks in flight),
//! taken out in that order.
//!
//! `futures`' `FuturesOrdered` does the same job, but having polled every future it holds
//! with none ready, it wakes its own task (so that one busy queue cannot starve the rest
//! of the task). With a single new future pushed per request, that is a yield per
//! request, and Tokio wakes another runtime thread for every one: one RESP connection
//! sending one XADD at a time spent 4.2 context switches per XADD with it, and 2.9
//! without (BENCHMARKS.md). Work that finishes in order needs only its front polled, so
//! this queue polls only the front and never wakes itself.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A FIFO of futures of which only the front is polled. Each future must be one whose
/// work goes on without being polled (a channel's receiving end, a spawned task's
/// handle, a ready value), since those behind the front wait unpolled.
pub struct InOrder<F> {
    queue: VecDeque<F>,
}

impl<F> Default for InOrder<F> {
    fn default() -> Self {
        InOrder {
            queue: VecDeque::new(),
        }
    }
}

impl<F: Future + Unpin> InOrder<F> {
    pub fn push_back(&mut self, future: F) {
        self.queue.push_back(future);
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Drops every queued future.
    pub fn clear(&mut self) {
        self.queue.clear();
    }

    /// The front future's output once it is ready, or `None` if the queue is empty.
    /// Cancel-safe: a future stays queued until its output is taken.
    pub fn pop_front(&mut self) -> PopFront<'_, F> {
        PopFront { queue: self }
    }
}

/// The future returned by [`InOrder::pop_front`].
pub struct PopFront<'a, F> {
    queue: &'a mut InOrder<F>,
}

impl<F: Future + Unpin> Future for PopFront<'_, F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let queue = &mut self.queue.queue;
        let Some(front) = queue.front_mut() else {
            return Poll::Ready(None);
        };
        let output = std::task::ready!(Pin::new(front).poll(cx));
        queue.pop_front();
        Poll::Ready(Some(output))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::future::BoxFuture;
    use futures::FutureExt;

    use super::*;

    #[tokio::test]
    async fn outputs_come_out_in_order_and_survive_a_cancelled_wait() {
        let (first_done, first) = tokio::sync::oneshot::channel::<()>();
        let (second_done, second) = tokio::sync::oneshot::channel::<()>();
        let mut queue: InOrder<BoxFuture<'static, &str>> = InOrder::default();
        queue.push_back(Box::pin(async move {
            first.await.unwrap();
            "first"
        }));
        queue.push_back(Box::pin(async move {
            second.await.unwrap();
            "second"
        }));
        // The second is ready first; nothing comes out before the first.
        second_done.send(()).unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(50), queue.pop_front()).await;
        assert!(
            waited.is_err(),
            "an output came out ahead of the one before it"
        );
        assert_eq!(queue.len(), 2, "a cancelled wait dropped a queued future");
        first_done.send(()).unwrap();
        assert_eq!(queue.pop_front().await, Some("first"));
        assert_eq!(queue.pop_front().await, Some("second"));
        assert!(queue.is_empty());
        assert_eq!(queue.pop_front().await, None);
    }

    /// The reason this type exists: a wait that is not ready must not wake its own task.
    #[test]
    fn a_wait_that_is_not_ready_does_not_wake_its_task() {
        let woken = std::sync::Arc::new(WakeCount::default());
        let waker = std::task::Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let (done, receiver) = tokio::sync::oneshot::channel::<u32>();
        let mut queue = InOrder::default();
        queue.push_back(receiver.map(Result::unwrap));
        for _ in 0..3 {
            assert!(Pin::new(&mut queue.pop_front()).poll(&mut cx).is_pending());
        }
        assert_eq!(woken.count(), 0, "the queue woke its own task");
        done.send(7).unwrap();
        assert_eq!(woken.count(), 1, "the front's waker was not registered");
        assert_eq!(
            Pin::new(&mut queue.pop_front()).poll(&mut cx),
            Poll::Ready(Some(7))
        );
    }

    #[derive(Default)]
    struct WakeCount(std::sync::atomic::AtomicUsize);

    impl WakeCount {
        fn count(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    impl std::task::Wake for WakeCount {
        fn wake(self: std::sync::Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}
