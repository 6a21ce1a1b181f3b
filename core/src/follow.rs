//! Followers woken connection by connection.
//!
//! A record appended to a stream with thousands of followers wakes them all at once, and
//! each follower's frame goes out through its client connection, whose writer gathers
//! what its followers queue into one write (the gateway's `coalesce`). Woken in the order
//! they began waiting, the followers of each connection are spread over the whole burst:
//! a connection that writes once writes at the end of the burst, so the median reader
//! waits for nearly all of the burst (BENCHMARKS.md, "Live readers").
//!
//! Here a stream wakes its followers connection by connection ([`StreamFollowers`]), and
//! a connection counts the followers woken on it that have not yet read their records
//! ([`ConnectionFollowers::deliveries_pending`]). Its writer holds a flush while that
//! count is above zero and is woken when it falls to zero: each connection writes about
//! once per record, as soon as its own followers are done, and the readers on the first
//! connections have the record while the followers of the last are still being woken.
//!
//! The counts only decide when a connection writes, never whether: a writer that holds
//! a flush also has a deadline (the gateway's release thread), and every count a follower
//! adds is taken back when its wait or its delivery ends, however it ends.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::task::Waker;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What the followers on one client connection share: how many of them were woken by a
/// record and have not yet read it.
#[derive(Default)]
pub struct ConnectionFollowers {
    deliveries: Mutex<Deliveries>,
}

#[derive(Default)]
struct Deliveries {
    /// Followers woken on this connection that have not yet read their records.
    pending: usize,
    /// The connection's writer, holding a flush until `pending` is zero.
    flush: Option<Waker>,
}

impl ConnectionFollowers {
    /// Whether followers woken on this connection are still reading their records; if
    /// so, `flush` is woken when the last of them has (it replaces a waker left before).
    pub fn deliveries_pending(&self, flush: &Waker) -> bool {
        let mut deliveries = self.deliveries.lock();
        if deliveries.pending == 0 {
            return false;
        }
        match &mut deliveries.flush {
            Some(held) if held.will_wake(flush) => {}
            held => *held = Some(flush.clone()),
        }
        true
    }

    fn owe(&self, followers: usize) {
        if followers > 0 {
            self.deliveries.lock().pending += followers;
        }
    }

    fn settle(&self) {
        let flush = {
            let mut deliveries = self.deliveries.lock();
            deliveries.pending = deliveries.pending.saturating_sub(1);
            if deliveries.pending > 0 {
                return;
            }
            deliveries.flush.take()
        };
        if let Some(flush) = flush {
            flush.wake();
        }
    }
}

/// A stream's followers that came on a known connection, grouped by connection.
#[derive(Default)]
pub struct StreamFollowers {
    /// Keyed by the connection's address: a group keeps its connection alive, so the key
    /// is not reused while the group lives.
    groups: Mutex<HashMap<usize, Weak<FollowGroup>>>,
}

impl StreamFollowers {
    /// The group of this stream's followers on `connection`.
    pub fn group(&self, connection: &Arc<ConnectionFollowers>) -> Arc<FollowGroup> {
        let key = Arc::as_ptr(connection) as usize;
        let mut groups = self.groups.lock();
        if let Some(group) = groups.get(&key).and_then(Weak::upgrade) {
            return group;
        }
        let group = Arc::new(FollowGroup {
            connection: connection.clone(),
            notify: Notify::new(),
            waiting: Mutex::default(),
        });
        groups.insert(key, Arc::downgrade(&group));
        group
    }

    /// Wakes every waiting follower, one connection's after another.
    pub fn wake(&self) {
        let live: Vec<Arc<FollowGroup>> = {
            let mut groups = self.groups.lock();
            groups.retain(|_, group| group.strong_count() > 0);
            groups.values().filter_map(Weak::upgrade).collect()
        };
        for group in live {
            group.wake();
        }
    }
}

/// The followers of one stream on one connection.
pub struct FollowGroup {
    connection: Arc<ConnectionFollowers>,
    notify: Notify,
    waiting: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    /// Followers waiting now; a wake-up makes them the connection's pending deliveries.
    followers: usize,
    /// Counts the wake-ups: a follower that began waiting before the current one was
    /// counted as a pending delivery by it.
    round: u64,
}

impl FollowGroup {
    fn wake(&self) {
        {
            let mut waiting = self.waiting.lock();
            self.connection.owe(std::mem::take(&mut waiting.followers));
            waiting.round += 1;
        }
        self.notify.notify_waiters();
    }

    /// Waits for the group's next wake-up, or until `deadline`; whether it came. A woken
    /// follower owes its connection a delivery, settled when `owed` is next emptied.
    /// `ready` is asked after the wait is registered (a wake-up from then on ends it) and
    /// before it sleeps: a follower that has something to read does not wait.
    pub async fn wait(
        self: &Arc<Self>,
        deadline: Option<Instant>,
        ready: impl FnOnce() -> bool,
        owed: &mut Option<OwedDelivery>,
    ) -> bool {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let ticket = {
            let mut waiting = self.waiting.lock();
            waiting.followers += 1;
            WaitTicket {
                group: self.clone(),
                round: waiting.round,
                ended: false,
            }
        };
        if ready() {
            *owed = ticket.end();
            return true;
        }
        let woken = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, notified).await.is_ok(),
            None => {
                notified.await;
                true
            }
        };
        *owed = ticket.end();
        woken
    }
}

/// A follower's wait in its group, counted there until it ends.
struct WaitTicket {
    group: Arc<FollowGroup>,
    round: u64,
    ended: bool,
}

impl WaitTicket {
    /// Ends the wait: the delivery the follower owes if a wake-up counted it.
    fn end(mut self) -> Option<OwedDelivery> {
        self.ended = true;
        self.take_back()
    }

    fn take_back(&self) -> Option<OwedDelivery> {
        let mut waiting = self.group.waiting.lock();
        if waiting.round == self.round {
            waiting.followers -= 1;
            return None;
        }
        Some(OwedDelivery(self.group.connection.clone()))
    }
}

impl Drop for WaitTicket {
    /// A wait given up (its session ended or timed out meanwhile) owes nothing.
    fn drop(&mut self) {
        if !self.ended {
            drop(self.take_back());
        }
    }
}

/// A woken follower's delivery, which its connection's writer waits for: settled when
/// dropped, once the follower has read its records.
pub struct OwedDelivery(Arc<ConnectionFollowers>);

impl Drop for OwedDelivery {
    fn drop(&mut self) {
        self.0.settle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::Wake;

    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn flag() -> (Arc<Flag>, Waker) {
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        (flag.clone(), Waker::from(flag))
    }

    /// Followers woken together are a connection's pending deliveries until each has
    /// read; the writer waiting for them is woken by the last, not before.
    #[tokio::test]
    async fn a_connection_writer_waits_for_every_woken_follower() {
        let stream = Arc::new(StreamFollowers::default());
        let connection = Arc::new(ConnectionFollowers::default());
        let (woke, mut woken) = tokio::sync::mpsc::unbounded_channel::<()>();
        let mut followers = Vec::new();
        let (read_tx, _) = tokio::sync::broadcast::channel::<()>(1);
        for _ in 0..3 {
            let group = stream.group(&connection);
            let woke = woke.clone();
            let mut read = read_tx.subscribe();
            followers.push(tokio::spawn(async move {
                let mut owed = None;
                assert!(group.wait(None, || false, &mut owed).await);
                assert!(owed.is_some(), "a woken follower owes its delivery");
                woke.send(()).unwrap();
                // Reads its records when told to, then settles.
                read.recv().await.unwrap();
                drop(owed);
            }));
        }
        drop(woke);
        let (flush, waker) = flag();
        while waiting_followers(&stream) < 3 {
            tokio::task::yield_now().await;
        }
        assert!(!connection.deliveries_pending(&waker), "nothing woken yet");
        stream.wake();
        for _ in 0..3 {
            woken.recv().await.unwrap();
        }
        assert!(connection.deliveries_pending(&waker));
        read_tx.send(()).unwrap();
        for follower in followers {
            follower.await.unwrap();
        }
        assert!(
            flush.0.load(Ordering::SeqCst),
            "the last delivery woke the writer"
        );
        assert!(!connection.deliveries_pending(&waker));
    }

    fn waiting_followers(stream: &StreamFollowers) -> usize {
        let groups = stream.groups.lock();
        groups
            .values()
            .filter_map(Weak::upgrade)
            .map(|group| group.waiting.lock().followers)
            .sum()
    }

    /// A wait that ends without a wake-up (ready at once, timed out, or dropped) leaves
    /// nothing counted, and a wake-up that counted a follower whose wait was dropped
    /// is settled by the drop.
    #[tokio::test]
    async fn waits_that_end_otherwise_leave_nothing_pending() {
        let stream = StreamFollowers::default();
        let connection = Arc::new(ConnectionFollowers::default());
        let group = stream.group(&connection);
        let (_, waker) = flag();
        let mut owed = None;

        assert!(group.wait(None, || true, &mut owed).await);
        assert!(owed.is_none());
        let soon = Instant::now() + std::time::Duration::from_millis(20);
        assert!(!group.wait(Some(soon), || false, &mut owed).await);
        assert!(owed.is_none());
        {
            let wait = group.wait(None, || false, &mut owed);
            tokio::pin!(wait);
            assert!(futures::poll!(wait.as_mut()).is_pending());
        }
        assert_eq!(group.waiting.lock().followers, 0);

        // Counted by a wake-up, then dropped before it ran: settled at once.
        {
            let wait = group.wait(None, || false, &mut owed);
            tokio::pin!(wait);
            assert!(futures::poll!(wait.as_mut()).is_pending());
            stream.wake();
            assert!(connection.deliveries_pending(&waker));
        }
        assert!(!connection.deliveries_pending(&waker));
        assert!(owed.is_none());
    }

    /// A stream wakes its followers connection by connection, and forgets the groups of
    /// connections whose followers have all gone.
    #[test]
    fn followers_are_woken_grouped_by_connection() {
        let stream = Arc::new(StreamFollowers::default());
        let connections: Vec<Arc<ConnectionFollowers>> = (0..3)
            .map(|_| Arc::new(ConnectionFollowers::default()))
            .collect();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        // Followers begin waiting interleaved: connection 0, 1, 2, 0, 1, 2, ...
        let local = tokio::task::LocalSet::new();
        for i in 0..9 {
            let group = stream.group(&connections[i % 3]);
            let order = order.clone();
            local.spawn_local(async move {
                let mut owed = None;
                group.wait(None, || false, &mut owed).await;
                order.lock().unwrap().push(i % 3);
            });
        }
        runtime.block_on(local.run_until(async {
            while waiting_followers(&stream) < 9 {
                tokio::task::yield_now().await;
            }
            stream.wake();
            while order.lock().unwrap().len() < 9 {
                tokio::task::yield_now().await;
            }
        }));
        let order = order.lock().unwrap().clone();
        let runs = order.windows(2).filter(|pair| pair[0] != pair[1]).count() + 1;
        assert_eq!(
            runs, 3,
            "woken one connection's followers at a time: {order:?}"
        );
        drop(connections);
        stream.wake();
        assert!(stream.groups.lock().is_empty());
    }
}
