use super::*;

#[test]
fn at_most_the_bound_of_creations_are_handled_at_once() {
    let sessions = Sessions::new(
        SessionsConfig::default(),
        Arc::new(hostwire_core::ManualClock::new(0)),
        Arc::new(hostwire_store::SqliteStore::in_memory().unwrap()),
        Arc::new(StoreMetrics::default()),
    );
    let held: Vec<_> = (0..CONCURRENT_SESSION_CREATIONS)
        .map(|_| {
            sessions
                .creation_permit()
                .expect("a permit under the bound")
        })
        .collect();
    assert!(
        sessions.creation_permit().is_none(),
        "one more than CONCURRENT_SESSION_CREATIONS is refused"
    );
    drop(held);
    assert!(
        sessions.creation_permit().is_some(),
        "a finished creation frees its permit"
    );
}
