//! Where a store call may block its thread.
//!
//! The PostgreSQL store's client is the synchronous `postgres` crate, which
//! drives a small runtime of its own: on a thread that is running an async
//! runtime, tokio panics. A thread of a runtime's blocking pool runs none,
//! but it carries the runtime's handle, so the store cannot tell it from an
//! async worker; told nothing, it runs each call on a thread started for
//! that call (a `clone`, a stack mapped and unmapped, two wakes).
//! [`blocking_section`] tells it: the store writer's batches, the reads and
//! the lease calls of `hostwire serve` run in one.

use std::cell::Cell;

thread_local! {
    static BLOCKING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` as a blocking section: the caller says that this thread is not
/// running an async runtime (a `spawn_blocking` closure, a thread of its
/// own), so a store call in `f` may block it. From an async task it is a
/// bug: the PostgreSQL store's client would panic there.
pub fn blocking_section<T>(f: impl FnOnce() -> T) -> T {
    /// Puts the thread's mark back, unwinding too.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            BLOCKING.set(self.0);
        }
    }
    let _restore = Restore(BLOCKING.replace(true));
    f()
}

/// Whether this thread is in a [`blocking_section`].
pub(crate) fn in_blocking_section() -> bool {
    BLOCKING.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_marks_its_thread_until_it_ends_even_by_a_panic() {
        assert!(!in_blocking_section());
        blocking_section(|| {
            assert!(in_blocking_section());
            blocking_section(|| assert!(in_blocking_section()));
            assert!(in_blocking_section(), "a nested section keeps the mark");
        });
        assert!(!in_blocking_section());
        let panicked = std::panic::catch_unwind(|| blocking_section(|| panic!("inside")));
        assert!(panicked.is_err());
        assert!(!in_blocking_section(), "the mark is put back by an unwind");
        std::thread::spawn(|| assert!(!in_blocking_section()))
            .join()
            .unwrap();
    }
}
