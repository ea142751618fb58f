use super::*;
use hostwire_store::{UnitResults, UnitStore};
use std::sync::{Condvar, Mutex};

#[derive(Debug)]
struct W(String, usize);

impl StoreWrite for W {
    fn bytes(&self) -> usize {
        self.1
    }
}

/// A store whose writes wait until it is opened (a stalled disk), and
/// that fails every write of the unit `"bad"`.
#[derive(Default)]
struct Stalled {
    open: Mutex<bool>,
    opened: Condvar,
    written: Mutex<Vec<String>>,
}

impl UnitStore<W> for Stalled {
    fn apply_units(&self, units: &[Unit<'_, W>]) -> UnitResults {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
        hostwire_store::apply_each(units, |ws| {
            if ws.iter().any(|w| w.0 == "bad") {
                return Err(hostwire_store::StoreError::Commit("injected".into()));
            }
            self.written
                .lock()
                .unwrap()
                .extend(ws.iter().map(|w| w.0.clone()));
            Ok(())
        })
    }
}

fn writer(store: &Arc<Stalled>) -> StoreWriter<W> {
    StoreWriter::start(
        Arc::clone(store) as Arc<dyn UnitStore<W>>,
        StoreProtocol::Relay,
        Arc::new(StoreMetrics::default()),
    )
}

#[tokio::test]
async fn a_stalled_store_holds_writers_back_instead_of_queueing_without_bound() {
    let store = Arc::new(Stalled::default());
    let writer = writer(&store);
    // The writer takes one batch and stalls in it; the queue
    // then fills.
    let mut queued = 0u64;
    loop {
        let w = writer.write_behind("a", vec![W(queued.to_string(), 10)]);
        match tokio::time::timeout(std::time::Duration::from_millis(200), w).await {
            Ok(()) => queued += 1,
            Err(_) => break,
        }
        assert!(
            queued <= 2 * STORE_QUEUE as u64 + MAX_BATCH as u64,
            "never held back"
        );
    }
    assert!(queued >= STORE_QUEUE as u64, "held back early: {queued}");
    *store.open.lock().unwrap() = true;
    store.opened.notify_all();
    tokio::time::timeout(std::time::Duration::from_secs(10), writer.flush())
        .await
        .expect("the queue did not drain");
}

#[tokio::test]
async fn the_queue_is_bounded_in_bytes() {
    let store = Arc::new(Stalled::default());
    let writer = writer(&store);
    let big = STORE_QUEUE_BYTES / 4;
    let mut queued = 0;
    loop {
        let w = writer.write_behind("a", vec![W("x".into(), big)]);
        match tokio::time::timeout(std::time::Duration::from_millis(200), w).await {
            Ok(()) => queued += 1,
            Err(_) => break,
        }
        assert!(queued <= 8, "never held back");
    }
    // Four fill the bytes; one more may be in the stalled batch.
    assert!((4..=5).contains(&queued), "{queued}");
    *store.open.lock().unwrap() = true;
    store.opened.notify_all();
    writer.flush().await;
}

/// Records which way each write went and on which thread; refuses the
/// inline way while `busy` (a connection another writer holds).
#[derive(Default)]
struct Recording {
    busy: std::sync::atomic::AtomicBool,
    ways: Mutex<Vec<(&'static str, std::thread::ThreadId, String)>>,
}

impl Recording {
    fn record(&self, way: &'static str, units: &[Unit<'_, W>]) -> UnitResults {
        let mut ways = self.ways.lock().unwrap();
        for u in units {
            ways.push((way, std::thread::current().id(), u.key.to_owned()));
        }
        units.iter().map(|_| Ok(())).collect()
    }
}

impl UnitStore<W> for Recording {
    fn apply_units(&self, units: &[Unit<'_, W>]) -> UnitResults {
        self.record("blocking", units)
    }

    fn try_apply_units_now(&self, units: &[Unit<'_, W>]) -> Option<UnitResults> {
        if self.busy.load(Relaxed) {
            return None;
        }
        Some(self.record("inline", units))
    }
}

#[tokio::test]
async fn a_small_batch_commits_on_the_writers_task_and_a_large_or_blocked_one_off_it() {
    let store = Arc::new(Recording::default());
    let writer = StoreWriter::start(
        Arc::clone(&store) as Arc<dyn UnitStore<W>>,
        StoreProtocol::Ggui,
        Arc::new(StoreMetrics::default()),
    );
    let here = std::thread::current().id();
    assert!(
        writer
            .write_durable("small", vec![W("s".into(), 100)])
            .await
    );
    let big = vec![W("b".into(), INLINE_BATCH_BYTES + 1)];
    assert!(writer.write_durable("big", big).await);
    store.busy.store(true, Relaxed);
    assert!(writer.write_durable("busy", vec![W("x".into(), 100)]).await);
    let ways = store.ways.lock().unwrap().clone();
    assert_eq!(ways.len(), 3, "{ways:?}");
    // The test's runtime has one thread: the writer's task runs on it.
    assert_eq!(
        (ways[0].0, ways[0].1, ways[0].2.as_str()),
        ("inline", here, "small")
    );
    assert_eq!((ways[1].0, ways[1].2.as_str()), ("blocking", "big"));
    assert_ne!(
        ways[1].1, here,
        "a large batch is written off the async threads"
    );
    assert_eq!((ways[2].0, ways[2].2.as_str()), ("blocking", "busy"));
    assert_ne!(ways[2].1, here);
}

/// Refuses every unit not written under generation 7, as PostgreSQL's
/// fence does.
struct FencedAt7;

impl UnitStore<W> for FencedAt7 {
    fn apply_units(&self, units: &[Unit<'_, W>]) -> UnitResults {
        units
            .iter()
            .map(|u| match u.fence {
                Some(7) => Ok(()),
                held => Err(StoreError::Fenced {
                    key: u.key.to_owned(),
                    held: held.unwrap_or(u64::MAX),
                    current: Some(7),
                }),
            })
            .collect()
    }
}

/// Generation 7 for "mine", 3 for "stale", none for the others; the
/// fenced ones reported.
#[derive(Default)]
struct Gens(Mutex<Vec<(String, u64)>>);

impl Fence for Gens {
    fn generation(&self, key: &str) -> Option<u64> {
        match key {
            "mine" => Some(7),
            "stale" => Some(3),
            _ => None,
        }
    }
    fn fenced(&self, key: &str, generation: u64) {
        self.0.lock().unwrap().push((key.to_owned(), generation));
    }
}

#[tokio::test]
async fn units_carry_their_generation_and_a_fenced_one_is_reported_never_written_unchecked() {
    let gens = Arc::new(Gens::default());
    let writer = StoreWriter::start_fenced(
        Arc::new(FencedAt7) as Arc<dyn UnitStore<W>>,
        StoreProtocol::Relay,
        Arc::new(StoreMetrics::default()),
        Some(Arc::clone(&gens) as Arc<dyn Fence>),
    );
    assert!(writer.write_durable("mine", vec![W("a".into(), 1)]).await);
    assert!(!writer.write_durable("stale", vec![W("b".into(), 1)]).await);
    // A unit this node holds no lease for goes under generation 0.
    assert!(!writer.write_durable("lost", vec![W("c".into(), 1)]).await);
    assert_eq!(
        *gens.0.lock().unwrap(),
        vec![("stale".to_owned(), 3), ("lost".to_owned(), NO_GENERATION)]
    );
}

#[tokio::test]
async fn a_failed_unit_fails_itself_and_its_keys_later_units_only() {
    let store = Arc::new(Stalled::default());
    let writer = writer(&store);
    // The writer stalls in a batch of its own; the three after it are
    // the next batch.
    writer.write_behind("z", vec![W("z".into(), 1)]).await;
    tokio::task::yield_now().await;
    let first = writer.queue_acked("a", vec![W("bad".into(), 1)]).await;
    let second = writer.queue_acked("a", vec![W("a2".into(), 1)]).await;
    let other = writer.queue_acked("b", vec![W("b1".into(), 1)]).await;
    *store.open.lock().unwrap() = true;
    store.opened.notify_all();
    assert!(!first.wait().await);
    assert!(!second.wait().await, "a later unit of a failed key");
    assert!(other.wait().await, "another key's unit");
    assert_eq!(
        *store.written.lock().unwrap(),
        vec!["z".to_owned(), "b1".to_owned()]
    );
}

#[tokio::test]
async fn a_lone_small_unit_is_committed_by_its_caller_without_waking_the_writer() {
    let store = Arc::new(Recording::default());
    let writer = StoreWriter::start(
        Arc::clone(&store) as Arc<dyn UnitStore<W>>,
        StoreProtocol::Ggui,
        Arc::new(StoreMetrics::default()),
    );
    // The test's runtime has one thread, and nothing here yields to the
    // writer's task: a unit it had to write would not be answered yet.
    let mut durable = writer.queue_acked("lone", vec![W("l".into(), 100)]).await;
    assert_eq!(durable.poll_now(), Some(true), "answered before any wake");
    let mut durable = writer
        .try_queue_acked("lone", vec![W("m".into(), 100)])
        .expect("room in the queue");
    assert_eq!(durable.poll_now(), Some(true));
    let ways = store.ways.lock().unwrap().clone();
    assert_eq!(ways.len(), 2, "{ways:?}");
    assert!(ways.iter().all(|w| w.0 == "inline"), "{ways:?}");
    // A large one still goes to the writer (and off the async threads).
    let mut big = writer
        .queue_acked("lone", vec![W("b".into(), INLINE_BATCH_BYTES + 1)])
        .await;
    assert_eq!(big.poll_now(), None);
    assert!(big.wait().await);
}

/// Keeps every write's name in the order written; refuses to start at
/// once while `busy`.
#[derive(Default)]
struct InOrder {
    busy: std::sync::atomic::AtomicBool,
    written: Mutex<Vec<String>>,
}

impl UnitStore<W> for InOrder {
    fn apply_units(&self, units: &[Unit<'_, W>]) -> UnitResults {
        let mut written = self.written.lock().unwrap();
        for u in units {
            written.extend(u.writes.iter().map(|w| w.0.clone()));
        }
        units.iter().map(|_| Ok(())).collect()
    }

    fn try_apply_units_now(&self, units: &[Unit<'_, W>]) -> Option<UnitResults> {
        if self.busy.load(Relaxed) {
            return None;
        }
        Some(self.apply_units(units))
    }
}

#[tokio::test]
async fn a_unit_never_overtakes_an_earlier_one_still_with_the_writer() {
    let store = Arc::new(InOrder::default());
    let writer = StoreWriter::start(
        Arc::clone(&store) as Arc<dyn UnitStore<W>>,
        StoreProtocol::Ggui,
        Arc::new(StoreMetrics::default()),
    );
    // The first cannot start at once: it is handed to the writer's task,
    // which has not run yet when the second comes, small and with the
    // store free.
    store.busy.store(true, Relaxed);
    let first = writer.queue_acked("k", vec![W("1".into(), 100)]).await;
    store.busy.store(false, Relaxed);
    let second = writer.queue_acked("k", vec![W("2".into(), 100)]).await;
    assert!(first.wait().await);
    assert!(second.wait().await);
    assert_eq!(*store.written.lock().unwrap(), ["1", "2"]);
}
